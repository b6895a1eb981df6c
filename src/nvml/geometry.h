// The fixed-geometry applier: lays a GPU out as NVIDIA MIG Manager (mig-parted) does
// (mig/geometry.h: the geometry, its text, and where the driver puts each instance), so tests, the
// local mode and the real-cluster suite can build the "legacy world" dynmig takes over.
//
// mig-parted creates each instance WITHOUT a placement (the driver picks the slot). The Nvml seam
// only creates at a placement, so the applier asks mig::LayOutGeometry for the ordering and slots
// the driver would give before it touches NVML, then creates those instances and their full compute
// instances. A GPU that already has instances is refused unless they are exactly the geometry (then
// nothing changes: applying twice is a no-op); a failure midway destroys what this call created.
// Errors name the GPU and the profile. Thread-compatible (the Nvml is thread-safe).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mig/geometry.h"
#include "mig/placement.h"
#include "mig/profile.h"
#include "nvml/nvml.h"

namespace dynmig::nvml {

// One instance of an applied geometry.
struct GeometryInstance {
  std::string profile;
  uint32_t gi_id = 0;
  uint32_t ci_id = 0;
  mig::Placement placement;
  std::string mig_uuid;
};

struct GeometryResult {
  uint32_t gpu = 0;
  std::string gpu_name;
  bool unchanged = false;  // the GPU already had exactly this geometry: nothing was created
  size_t orderings_tried = 0;
  std::vector<GeometryInstance> instances;  // ordered by placement start
};

// Applies `spec` to GPU `gpu`. Errors (nothing is left changed by this call):
//   kInvalidArgument     a profile the GPU does not have (the message lists those it has), or a
//                        count over the profile's instanceCount;
//   kFailedPrecondition  MIG is not enabled, or the GPU has other instances than the geometry
//                        (listed; they are never touched);
//   kResourceExhausted   no ordering fits the GPU (e.g. 4g + 4g);
//   NVML's code          a create failed (the message names the profile and placement).
absl::StatusOr<GeometryResult> ApplyGeometry(Nvml& nvml, uint32_t gpu,
                                             const mig::GeometrySpec& spec);

}  // namespace dynmig::nvml
