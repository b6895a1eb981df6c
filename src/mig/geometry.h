// Fixed MIG geometries as NVIDIA MIG Manager (mig-parted) and HAMi's legacy templates describe
// them, and where the driver lays them out. Pure (src/mig); nvml/geometry.h applies one to a GPU.
//
// A geometry is a count per profile for one GPU ({"1g.18gb": 1, "2g.35gb": 3}), written
//   "all-<profile>"            every instance the profile allows (its instanceCount), as
//                              mig-parted's all-1g.10gb, all-2g.20gb ... configs,
//   "<profile>=<n>,..."        explicit counts ("1g.18gb=1,2g.35gb=3"),
// or taken from one geometry of HAMi's legacy `knownMigGeometries` (each template's count).
//
// How mig-parted lays a geometry out (pkg/mig/config/config.go): it flattens the geometry into a
// list of instances, largest first, tries orderings of that list (distinct permutations) until one
// succeeds, and per instance calls nvmlDeviceCreateGpuInstance WITHOUT a placement (the driver
// picks the slot, DriverPlacementOrder). LayOutGeometry finds that ordering and its placements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "mig/legacy.h"
#include "mig/placement.h"
#include "mig/profile.h"

namespace dynmig::mig {

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
absl::StatusOr<GeometrySpec> GeometryFromLegacy(const std::vector<LegacyTemplate>& templates);

// The legacy geometry HAMi's scheduler would use for a GPU: the first entry one of whose models is
// a substring of `gpu_name` (as HAMi matched the device type), then its geometry `index`.
// kNotFound names the GPU when no entry matches; kInvalidArgument when `index` is out of range.
absl::StatusOr<GeometrySpec> SelectLegacyGeometry(const std::vector<LegacyGeometryEntry>& entries,
                                                  std::string_view gpu_name, size_t index);

// The order in which the driver's nvmlDeviceCreateGpuInstance (no placement) tries a profile's
// placements on a GPU with `placement_units` units: observed on A100/H100 (mig-facts.md 3.1, 6)
// for 1-unit profiles on 8-unit GPUs, slots 6,4,5,0,1,2,3, and for 3g, 4:4 before 0:4; otherwise
// (inferred, consistent with every observed layout) placements in the upper half first, then
// ascending starts.
std::vector<Placement> DriverPlacementOrder(const ProfileSpec& profile, uint32_t placement_units);

// Where mig-parted's attempts put a geometry: `instances` are the profiles of its instances,
// largest first (mig-parted's flattened order); each distinct ordering of them is tried, every
// instance taking the first free placement of DriverPlacementOrder, until one fits. The winning
// ordering (as indices into `instances`) and each of its instances' placement, or nullopt when
// none of `*tried` orderings fits (at most kMaxGeometryOrderings are tried).
struct GeometryLayout {
  std::vector<size_t> order;
  std::vector<Placement> placements;
};
std::optional<GeometryLayout> LayOutGeometry(const std::vector<const ProfileSpec*>& instances,
                                             uint32_t placement_units, size_t* tried);

}  // namespace dynmig::mig
