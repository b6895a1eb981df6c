// What a pod asks of the planner: per container, how many MIG instances and how much memory each,
// plus the pod-level hints HAMi users set as annotations. Built by protocol/pod_request from the
// pod's container limits and annotations. Pure value types.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mig/preference.h"

namespace dynmig::mig {

// Memory of one instance: MiB, or a percentage of the GPU. A whole-GPU request (percent 100, or
// neither set) resolves to the GPU's full-GPU profile.
struct MemoryRequest {
  uint64_t mib = 0;      // nvidia.com/gpumem
  uint32_t percent = 0;  // nvidia.com/gpumem-percentage (1..100); used when mib == 0
};

struct ContainerRequest {
  std::string name;
  bool init = false;   // an init container (listed first in the container index)
  uint32_t count = 0;  // nvidia.com/gpu: MIG instances wanted; 0 = no GPU for this container
  MemoryRequest memory;
};

enum class GpuPolicy { kBinpack, kSpread };   // hami.io/gpu-scheduler-policy
enum class NodePolicy { kBinpack, kSpread };  // hami.io/node-scheduler-policy

// GPU selection hints (HAMi annotations).
struct GpuFilter {
  std::vector<std::string> use_uuids;    // nvidia.com/use-gpuuuid
  std::vector<std::string> nouse_uuids;  // nvidia.com/nouse-gpuuuid
  std::vector<std::string> use_types;    // nvidia.com/use-gputype (substrings of the model)
  std::vector<std::string> nouse_types;  // nvidia.com/nouse-gputype
  std::string vgpu_mode;                 // nvidia.com/vgpu-mode; empty = any
};

struct PodRequest {
  std::vector<ContainerRequest> containers;  // init containers first, then app containers
  Preference preference;
  GpuFilter filter;
  // Binpack by default (HAMi defaults to spread): for MIG, filling the fullest GPU that fits is
  // best-fit, which `dynmig simulate` shows admits more than spreading (docs/design/0001).
  GpuPolicy gpu_policy = GpuPolicy::kBinpack;
  NodePolicy node_policy = NodePolicy::kBinpack;

  bool WantsGpu() const {
    for (const auto& c : containers) {
      if (c.count > 0) return true;
    }
    return false;
  }
};

// Everything of a request that the planner reads, as text: two requests with the same key get
// the same plan on the same node view (the scheduler caches plans per node under it). Container
// names are left out (the planner never reads them), so pods of different workloads with the same
// shape share a key. A field added to these structs that the planner reads belongs here too.
std::string PlanKey(const PodRequest& request);

// Bounds on the lists a request carries (the scheduler refuses longer ones before planning). The
// planner reads each of them per GPU, so without a bound a pod's annotations (up to 256 KiB) would
// decide how long a filter takes. Meaningful
// lists are far shorter: the catalogue has 62 profile names and 8 slice classes, 24 models.
inline constexpr size_t kMaxPreferenceEntries = 128;  // nvidia.com/mig-profile-preference
inline constexpr size_t kMaxGpuTypeEntries = 64;      // nvidia.com/use-gputype, nouse-gputype
inline constexpr size_t kMaxGpuUuidEntries = 256;     // nvidia.com/use-gpuuuid, nouse-gpuuuid

}  // namespace dynmig::mig
