// The `hami.io/vgpu-mig-allocations` Pod annotation: one entry per MIG instance of the Pod.
//
// The scheduler writes the reservation (container, device, parent GPU, profile, placement); the
// device plugin adds the runtime identity (MIG UUID, GI ID, CI ID) once it has created the
// instance. This annotation is the durable contract used to rebuild occupancy, adopt instances
// after a restart and reclaim them, so decoding is strict: anything malformed is an error, never a
// guess. Pure; thread-compatible.
//
// Wire form (HAMi field names; runtime fields omitted until known, IDs may be 0):
//   [{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-...","profile":"2g.10gb",
//     "placement":{"start":2,"size":2},"migUUID":"MIG-...","gpuInstanceID":4,
//     "computeInstanceID":0}]
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "mig/placement.h"

namespace dynmig::protocol {

// What the device plugin records after creating the instance. All three or none.
struct RuntimeIdentity {
  std::string mig_uuid;              // "MIG-..."
  uint32_t gpu_instance_id = 0;      // GI ID
  uint32_t compute_instance_id = 0;  // CI ID (0 is a real ID)

  friend bool operator==(const RuntimeIdentity&, const RuntimeIdentity&) = default;
};

struct MigAllocation {
  int container_index = 0;  // index into init containers ++ containers
  int device_index = 0;     // index inside that container's device list
  std::string gpu_uuid;     // the physical (parent) GPU
  std::string profile;      // exact profile name, e.g. "2g.10gb"
  mig::Placement placement;
  std::optional<RuntimeIdentity> runtime;

  friend bool operator==(const MigAllocation&, const MigAllocation&) = default;
};

// Decodes the annotation value. An empty string is an empty list. Errors (kInvalidArgument) name
// the entry index and field: not a JSON array, an entry that is not an object, a field of the
// wrong JSON type (floats are not integers), containerIndex or deviceIndex missing or negative,
// gpuUUID or profile missing or empty, a profile that is not a valid profile name, a placement
// missing or with size 0 or beyond the 32-unit axis, a partial runtime identity ("partial runtime
// identity" listing the fields present and missing), a duplicate (containerIndex, deviceIndex).
// Unknown fields are ignored; JSON null counts as absent.
absl::StatusOr<std::vector<MigAllocation>> DecodeMigAllocations(std::string_view value);

// The GPUs an allocations value names, read leniently (for a value DecodeMigAllocations refuses):
// every string gpuUUID of an object entry. `complete` is false when some entry names no GPU (not
// an object, gpuUUID missing or not a string) or the value is no JSON array at all (invalid JSON,
// or beyond the annotation limits of 256 KiB and 8 levels of nesting).
struct ReferencedGpuSet {
  std::set<std::string> gpu_uuids;
  bool complete = true;
};
ReferencedGpuSet ReferencedGpus(std::string_view value);

// Encodes in HAMi's compact form and field order; runtime fields only when present.
// An empty list encodes as "[]".
std::string EncodeMigAllocations(const std::vector<MigAllocation>& allocations);

// Whether the allocation carries its complete runtime identity (HAMi's "RuntimeReady").
inline bool RuntimeReady(const MigAllocation& a) { return a.runtime.has_value(); }

}  // namespace dynmig::protocol
