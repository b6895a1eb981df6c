// The fixed-geometry applier: lays a GPU out as NVIDIA MIG Manager (mig-parted) does, so tests,
// the local mode and the real-cluster suite can build the "legacy world" dynmig takes over.
//
// A geometry is a count per profile for one GPU ({"1g.18gb": 1, "2g.35gb": 3}), written
//   "all-<profile>"            every instance the profile allows (its instanceCount), as
//                              mig-parted's all-1g.10gb, all-2g.20gb ... configs,
//   "<profile>=<n>,..."        explicit counts ("1g.18gb=1,2g.35gb=3"),
// or taken from one geometry of HAMi's legacy `knownMigGeometries` (each template's count).
//
// How mig-parted applies a geometry (pkg/mig/config/config.go): it flattens the geometry into a
// list of instances, tries orderings of that list (distinct permutations) until one succeeds, and
// per instance calls nvmlDeviceCreateGpuInstance WITHOUT a placement (the driver picks the slot),
// then the full compute instance. The Nvml seam only creates at a placement, so the applier picks
// the slot the driver would (DriverPlacementOrder) and finds the first ordering that fits in memory
// before it touches NVML; the instances it then creates are the ones mig-parted's winning
// ordering leaves. A GPU that already has instances is refused unless they are exactly the
// geometry (then nothing changes: applying twice is a no-op); a failure midway destroys what this
// call created. Errors name the GPU and the profile. Thread-compatible (the Nvml is thread-safe).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mig/legacy.h"
#include "mig/placement.h"
#include "mig/profile.h"
#include "nvml/nvml.h"

namespace dynmig::nvml {

// Bounds on hostile geometry text.
inline constexpr size_t kMaxGeometryText = 512;
inline constexpr size_t kMaxGeometryProfiles = 8;     // distinct profiles in one geometry
inline constexpr uint32_t kMaxGeometryInstances = 8;  // a GPU holds at most 8 GPU instances
// Orderings tried before giving up (mig-parted tries every distinct one; 8 instances have at most
// 8! = 40320, a GPU's geometries far fewer distinct ones).
inline constexpr size_t kMaxGeometryOrderings = 40320;

struct GeometrySpec {
  // "all-<profile>": every instance of this profile. Exclusive with `counts`.
  std::string all_of;
  // Profile name and count, in the order written (names unique, counts >= 1).
  std::vector<std::pair<std::string, uint32_t>> counts;

  // "all-1g.18gb" or "1g.18gb=1,2g.35gb=3".
  std::string ToString() const;
};

// Parses "all-<profile>" or "<profile>=<n>[,<profile>=<n>...]". kInvalidArgument names what is
// wrong: text too long, an empty item, a name that is not a profile name (mig::ParseProfileName's
// reason), a count that is not 1..8, a profile named twice, more than 8 profiles or instances.
absl::StatusOr<GeometrySpec> ParseGeometry(std::string_view text);

// One geometry of HAMi's legacy configuration (a `knownMigGeometries` entry's allowedGeometries
// item): its templates' names and counts. kInvalidArgument as ParseGeometry (a template with count
// 0 or a bad name), naming the template.
absl::StatusOr<GeometrySpec> GeometryFromLegacy(const std::vector<mig::LegacyTemplate>& templates);

// The legacy geometry HAMi's scheduler would use for a GPU: the first entry one of whose models is
// a substring of `gpu_name` (as HAMi matched the device type), then its geometry `index`.
// kNotFound names the GPU when no entry matches; kInvalidArgument when `index` is out of range.
absl::StatusOr<GeometrySpec> SelectLegacyGeometry(
    const std::vector<mig::LegacyGeometryEntry>& entries, std::string_view gpu_name, size_t index);

// The order in which the driver's nvmlDeviceCreateGpuInstance (no placement) tries a profile's
// placements on a GPU with `placement_units` units: observed on A100/H100 (mig-facts.md 3.1, 6)
// for 1-unit profiles on 8-unit GPUs, slots 6,4,5,0,1,2,3, and for 3g, 4:4 before 0:4; otherwise
// (inferred, consistent with every observed layout) placements in the upper half first, then
// ascending starts.
std::vector<mig::Placement> DriverPlacementOrder(const mig::ProfileSpec& profile,
                                                 uint32_t placement_units);

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
absl::StatusOr<GeometryResult> ApplyGeometry(Nvml& nvml, uint32_t gpu, const GeometrySpec& spec);

}  // namespace dynmig::nvml
