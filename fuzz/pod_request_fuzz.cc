// Pod requests: any JSON document (a pod, or not) is parsed or refused without crashing, and the
// pod predicates agree (a MIG or whole-GPU pod requests GPU resources; no pod is both; a parsed
// whole-GPU request is a whole-GPU pod).
#include "common/bounded_json.h"
#include "fuzz/fuzz_util.h"
#include "nlohmann/json.hpp"
#include "protocol/gpu_mode.h"
#include "protocol/pod_request.h"

namespace dynmig::fuzz {

int FuzzPodRequest(const uint8_t* data, size_t size) {
  // Pods reach these functions only through the bounded parsers (API responses, webhook bodies).
  const auto parsed = ParseBoundedJson(AsText(data, size), kKubeObjectJsonLimits, "pod");
  if (!parsed.ok()) return 0;
  const nlohmann::json& pod = *parsed;
  std::vector<std::string> warnings;
  (void)protocol::ParsePodRequest(pod, {}, &warnings);
  const bool requests = protocol::RequestsGpuResources(pod);
  const bool mig = protocol::IsMigPod(pod);
  Check(!mig || requests, "IsMigPod without RequestsGpuResources");
  const bool whole = protocol::IsWholeGpuPod(pod);
  Check(!whole || requests, "IsWholeGpuPod without RequestsGpuResources");
  Check(!(whole && mig), "a pod both MIG and whole-GPU");
  const auto whole_request = protocol::ParseWholeGpuRequest(pod);
  Check(!whole_request.ok() || (whole && whole_request->TotalGpus() > 0),
        "a whole-GPU request parsed from a pod that is not a whole-GPU pod");
  (void)protocol::PodAnnotation(pod, "nvidia.com/mig-profile-preference");
  return 0;
}

}  // namespace dynmig::fuzz
