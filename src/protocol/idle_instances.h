// The `dynmig.io/idle-mig-instances` Node annotation: the warm MIG instances of a node's GPUs
// (device-config.yaml nvidia.migWarmInstances), published by the device plugin. An idle instance
// belongs to no pod; its slices are free for any reservation (the device plugin destroys it when
// a reservation needs them), and a reservation naming exactly its GPU, profile and placement gets
// it without an NVML create. The scheduler prefers such a placement when it is otherwise as good.
// A JSON array, sorted by GPU and start:
//   [{"gpuUUID":"GPU-…","placement":{"size":1,"start":6},"profile":"1g.5gb","idleSince":1800000000}]
// An absent annotation or "[]" means none. dynmig's own key: HAMi's node register is unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "mig/placement.h"

namespace dynmig::protocol {

inline constexpr std::string_view kNodeIdleInstancesAnnotation = "dynmig.io/idle-mig-instances";

struct IdleInstance {
  std::string gpu_uuid;
  std::string profile;  // exact profile name
  mig::Placement placement;
  int64_t idle_since = 0;  // unix seconds

  friend bool operator==(const IdleInstance&, const IdleInstance&) = default;
};

// Strict: kInvalidArgument naming the element and field
// ("dynmig.io/idle-mig-instances[0].profile: missing") for anything that is not an array of such
// objects, an empty GPU UUID or profile, or a placement of size 0 or beyond 64 units.
absl::StatusOr<std::vector<IdleInstance>> DecodeIdleInstances(std::string_view value);

// Sorted by GPU UUID, then start; duplicates (same GPU and placement) dropped.
std::string EncodeIdleInstances(std::vector<IdleInstance> idle);

}  // namespace dynmig::protocol
