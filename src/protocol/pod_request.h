// From a Kubernetes Pod (the API object as JSON) to what it asks of the planner (mig::PodRequest),
// following HAMi: container index = init containers first, then containers; per container the
// count (`nvidia.com/gpu`), memory per instance in MiB (`nvidia.com/gpumem`) or as a percentage
// (`nvidia.com/gpumem-percentage`); pod-level hints from annotations. Pure; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mig/request.h"
#include "nlohmann/json.hpp"
#include "protocol/annotations.h"

namespace dynmig::protocol {

// The extended resource names (device-config.yaml `nvidia.resource*Name`), HAMi defaults.
struct ResourceNames {
  std::string count = std::string(kResourceCount);
  std::string memory = std::string(kResourceMemory);
  std::string memory_percentage = std::string(kResourceMemoryPercentage);
  std::string cores = std::string(kResourceCores);
  // The count a container gets when it asks for memory, percentage or cores without a count
  // (`nvidia.defaultGPUNum`; HAMi's webhook adds it).
  uint32_t default_count = 1;

  friend bool operator==(const ResourceNames&, const ResourceNames&) = default;
};

// Builds the request of `pod`. Per container, each resource is read from `limits`, else from
// `requests`. Values are JSON numbers or Kubernetes quantity strings that are whole numbers in
// decimal form: "8000", "8k" (how the API server serves 8000), "8e3". Binary suffixes ("8Gi": these
// resources count MiB, instances and percents, not bytes) and fractions ("0.5", "500m") are refused
// with what to write instead.
// Rules:
//   - count >= 0; memory >= 0 MiB (0 = unset: the whole GPU); percentage in 1..100; cores in
//     0..100 (validated, not used to choose a profile);
//   - memory, percentage or cores without a count: count = names.default_count;
//   - a count of 0 together with memory or percentage is an error;
//   - memory and percentage together: memory wins (HAMi), both are kept in MemoryRequest.
// Annotations: nvidia.com/mig-profile-preference (ParsePreference; validated against the
// allowlist by the webhook, not here); hami.io/gpu-scheduler-policy: a comma chain of at most one
// of binpack/spread (default binpack: best fit for MIG; HAMi defaults to spread) plus HAMi policies
// dynmig does not implement for MIG (topology-aware, mutex, numa), which are ignored with a
// warning; anything else is an error; hami.io/node-scheduler-policy: binpack (default) or spread,
// anything else is an error; use/nouse GPU UUID and type: comma lists, trimmed;
// nvidia.com/vgpu-mode: trimmed. Errors are kInvalidArgument and name the container and resource,
// e.g. `container "workload" (containers[0]): nvidia.com/gpumem: "8Gi" has a binary suffix; it
// counts MiB: write 8192 for 8Gi`, or
// the annotation. `warnings`, when not null, receives the ignored-policy notes.
absl::StatusOr<mig::PodRequest> ParsePodRequest(const nlohmann::json& pod,
                                                const ResourceNames& names = {},
                                                std::vector<std::string>* warnings = nullptr);

// Whether any container (init or app) names one of the managed resources (count, memory,
// percentage, cores) in its limits or requests, whatever the value.
bool RequestsGpuResources(const nlohmann::json& pod, const ResourceNames& names = {});

// Whether the pod is one dynmig serves in MIG mode: it requests the managed resources and its
// nvidia.com/vgpu-mode is absent, empty or contains "mig" (HAMi's substring match).
bool IsMigPod(const nlohmann::json& pod, const ResourceNames& names = {});

// The pod's annotation `key`, or "" when absent or not a string.
std::string PodAnnotation(const nlohmann::json& pod, std::string_view key);

}  // namespace dynmig::protocol
