// The `dynmig.io/mig-held` Node annotation: slices of a node's GPUs that live GPU instances hold
// although no active pod's reservation names them, published by the device plugin so that the
// scheduler never reserves them (HAMi's scheduler does, and the pod then fails at Allocate):
//   - an instance of a pod that ended, not reclaimed yet because processes still run on it;
//   - an untracked instance (created outside dynmig, or of a pod whose annotation was lost),
//     kept because its GPU is busy;
//   - an instance kept while reclamation is paused (a pod's annotation cannot be read).
// A JSON array, sorted by GPU and start:
//   [{"gpuUUID":"GPU-…","placement":{"size":4,"start":4},"profile":"3g.20gb","reason":"…"}]
// An absent annotation means none (older device plugins); "[]" means none.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "mig/placement.h"

namespace dynmig::protocol {

inline constexpr std::string_view kNodeHeldSlicesAnnotation = "dynmig.io/mig-held";

struct HeldSlices {
  std::string gpu_uuid;
  mig::Placement placement;
  std::string profile;  // the instance's exact profile name, "" when unknown
  std::string reason;   // for people: why the slices are held

  friend bool operator==(const HeldSlices&, const HeldSlices&) = default;
};

// Strict: kInvalidArgument naming the element and field ("dynmig.io/mig-held[1].placement.size:
// ...") for anything that is not an array of such objects, an empty GPU UUID, or a placement of
// size 0 or beyond 64 units.
absl::StatusOr<std::vector<HeldSlices>> DecodeHeldSlices(std::string_view value);

// Sorted by GPU UUID, then start; duplicates dropped.
std::string EncodeHeldSlices(std::vector<HeldSlices> held);

}  // namespace dynmig::protocol
