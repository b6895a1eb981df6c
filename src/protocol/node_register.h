// The `hami.io/node-nvidia-register` Node annotation: the device plugin's list of GPUs and, for
// MIG-mode GPUs, the allowlisted profiles with the capability NVML reported (memory, compute share,
// slice count, legal placements).
//
// Wire form (HAMi's DeviceInfo, every field omitempty; the migProfiles entries are always full):
//   [{"id":"GPU-...","count":7,"devmem":40960,"devcore":100,"type":"NVIDIA A100-SXM4-40GB",
//     "mode":"mig","health":true,"migProfiles":[{"name":"1g.5gb","memoryMB":4864,"core":15,
//     "sliceCount":1,"placements":[{"start":0,"size":1},...]}]}]
// Pure; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "mig/placement.h"
#include "mig/profile.h"

namespace dynmig::protocol {

// One published profile (HAMi's MigProfile; the instance count is not on the wire).
struct MigProfileInfo {
  std::string name;
  uint64_t memory_mib = 0;   // "memoryMB": NVML memorySizeMB
  uint32_t core = 0;         // "core": ceil(SM x 100 / full-GPU SM)
  uint32_t slice_count = 0;  // "sliceCount": compute slices
  std::vector<mig::Placement> placements;

  friend bool operator==(const MigProfileInfo&, const MigProfileInfo&) = default;
};

// One GPU of the node (HAMi's DeviceInfo).
struct DeviceInfo {
  std::string id;  // physical GPU UUID
  uint32_t index = 0;
  uint32_t count = 0;       // vGPU slots; in MIG mode the max instance count of the profiles
  uint64_t devmem_mib = 0;  // "devmem"
  uint32_t devcore = 0;     // "devcore": 100 in MIG mode
  std::string type;         // NVML device name
  int32_t numa = 0;
  std::string mode;  // "mig" / "hami-core" / "mps"
  bool health = false;
  std::vector<MigProfileInfo> mig_profiles;
  // Decoded only: the device carried the legacy "migtemplate" field. Never encoded.
  bool legacy_mig_template = false;

  friend bool operator==(const DeviceInfo&, const DeviceInfo&) = default;
};

// Decodes the annotation. Unknown fields are ignored, omitted fields take their zero value. An
// empty string is an empty list. Errors (kInvalidArgument) name the device index and field: not
// a JSON array (the legacy colon-separated format included), a field of the wrong type or out of
// range, a profile without a name, a placement with size 0 or beyond the 32-unit axis.
absl::StatusOr<std::vector<DeviceInfo>> DecodeNodeRegister(std::string_view value);

// Encodes in HAMi's compact form: device fields omitted when zero/empty/false (Go's omitempty),
// every migProfiles entry in full, e.g.
// {"name":"1g.5gb","memoryMB":4864,"core":15,"sliceCount":1,"placements":[{"start":6,"size":1}]}.
std::string EncodeNodeRegister(const std::vector<DeviceInfo>& devices);
std::string EncodeMigProfile(const MigProfileInfo& profile);

// DeviceInfo -> capability. model = type, total memory = devmem, profiles from migProfiles (name,
// memory, compute slices = sliceCount, memory slices = placement size, placements without
// zero-size rows), placement_units = max start+size. Fields not on the wire (instance count,
// NVML index/ID, SM and engine counts, the GPU's slice totals) come from the catalogue when the
// type is a catalogued NVML name that has the profile with the same slice count; otherwise the
// instance count is the number of placements and the GPU's memory slices are placement_units.
mig::GpuCapability ToCapability(const DeviceInfo& device);

// Identity of a GPU, for the fields of DeviceInfo that capability does not carry.
struct DeviceIdentity {
  std::string uuid;
  uint32_t index = 0;
  int32_t numa = 0;
  bool health = true;
};

// HAMi's core share of a profile: ceil(SM x 100 / full-GPU SM), where the full-GPU SM count is the
// largest of the capability's profiles (A100: 1g = 15, 2g = 29, 7g = 100). Without SM counts
// (zero), ceil(compute slices x 100 / the GPU's compute slices).
uint32_t ProfileCore(const mig::GpuCapability& cap, const mig::ProfileSpec& profile);

// capability + allowed profiles -> DeviceInfo as the device plugin publishes it in MIG mode:
// mode "mig", devcore 100, devmem = total memory MiB, count = max instance count of the allowed
// profiles, migProfiles in the order given.
DeviceInfo MigDeviceInfo(const DeviceIdentity& identity, const mig::GpuCapability& cap,
                         const std::vector<const mig::ProfileSpec*>& allowed);

// Why a device is in the legacy (pre-dynamic-MIG) format, or nullopt: it carries "migtemplate", or
// it is in MIG mode without migProfiles.
std::optional<std::string> LegacyFormatReason(const DeviceInfo& device);

// Every legacy-format finding of a raw annotation value, one line each ("device 0 (GPU-...): MIG
// mode without migProfiles ..."); a value that is not JSON (HAMi's old colon-separated list) is
// one finding. Empty: the current format (or an empty annotation).
std::vector<std::string> DetectLegacyNodeRegister(std::string_view value);

}  // namespace dynmig::protocol
