// A GPU's mode in HAMi's terms, per GPU (issue 31): "mig" (MIG mode on: dynmig cuts it into
// instances) or "hami-core" (MIG mode off: the GPU is handed out whole). This file holds the wire
// and config side of that: the `nvidia.migModeSwitching` section of device-config.yaml (which
// GPUs may change mode), the node annotation's device of a whole GPU, and a pod's whole-GPU
// request. docs/mig-mode.md describes the design. Pure; thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "protocol/node_register.h"
#include "protocol/pod_request.h"

namespace dynmig::protocol {

enum class GpuMode : uint8_t {
  kMig = 0,       // "mig": MIG mode on, instances per pod
  kWholeGpu = 1,  // "hami-core": MIG mode off, one pod gets the whole GPU
};

// "mig" / "hami-core": the `mode` of HAMi's DeviceInfo and the value of nvidia.com/vgpu-mode.
std::string_view GpuModeName(GpuMode mode);
// The inverse of GpuModeName: "mig" or "hami-core" exactly; nullopt for anything else.
std::optional<GpuMode> GpuModeFromName(std::string_view name);

// --- device-config.yaml: nvidia.migModeSwitching ---------------------------------------------

// One rule: the GPUs whose NVML name contains one of `models` (every model when empty) on the
// nodes whose labels include every pair of `node_selector` (every node when empty).
struct MigModeSwitchRule {
  std::vector<std::string> models;
  std::vector<std::pair<std::string, std::string>> node_selector;

  friend bool operator==(const MigModeSwitchRule&, const MigModeSwitchRule&) = default;
};

// Which GPUs dynmig may switch between MIG mode and whole-GPU mode, and how eagerly. Off unless
// the key is present (and `enabled` is not false): then every GPU stays in MIG mode and is never
// switched, exactly as before the feature.
//   nvidia:
//     migModeSwitching:
//       enabled: true              # default true once the key is present
//       minModeDuration: 10m       # hysteresis: a GPU keeps a mode at least this long (10s..24h)
//       rules:                     # a GPU may switch when one rule matches; absent: every GPU
//         - models: ["H100", "H200"]                    # NVML name substrings; absent: all
//           nodeSelector: {dynmig.io/gpu-mode: flex}    # node labels, all must match; absent: all
struct MigModeSwitching {
  static constexpr absl::Duration kMinMinModeDuration = absl::Seconds(10);
  static constexpr absl::Duration kMaxMinModeDuration = absl::Hours(24);
  static constexpr size_t kMaxRules = 64;
  static constexpr size_t kMaxModels = 64;          // per rule
  static constexpr size_t kMaxSelectorLabels = 16;  // per rule
  static constexpr size_t kMaxModelLength = 96;     // NVML names are at most 96 bytes

  // The key is in the file at all (even with `enabled: false`): the device plugin then publishes
  // dynmig.io/gpu-mode; absent, nothing about modes is written (today's node annotations).
  bool present = false;
  bool enabled = false;
  absl::Duration min_mode_duration = absl::Minutes(10);
  std::vector<MigModeSwitchRule> rules;  // empty: every GPU on every node

  // Whether a GPU named `nvml_name` on a node with `node_labels` may change mode. Always false
  // while switching is off; a GPU without MIG never switches (the caller knows that from NVML).
  bool MaySwitch(std::string_view nvml_name,
                 const std::map<std::string, std::string, std::less<>>& node_labels) const;

  friend bool operator==(const MigModeSwitching&, const MigModeSwitching&) = default;
};

// Kubernetes label syntax, for nodeSelector: a key is [prefix/]name, prefix a DNS subdomain of at
// most 253 characters, name 1..63 of [A-Za-z0-9_.-] starting and ending alphanumeric; a value is
// empty or such a name. The error names what is wrong (no path: the caller adds it).
absl::Status ValidateLabelKey(std::string_view key);
absl::Status ValidateLabelValue(std::string_view value);

// --- hami.io/node-nvidia-register: a whole GPU -----------------------------------------------

// A GPU in whole-GPU mode as the device plugin publishes it, as HAMi's device plugin does for a
// GPU outside MIG mode: mode "hami-core", devmem = its memory, devcore 100, count 1 (dynmig hands
// it to one pod at a time: no HAMi-core sharing), no migProfiles.
DeviceInfo WholeGpuDeviceInfo(const DeviceIdentity& identity, std::string_view nvml_name,
                              uint64_t total_memory_mib);

// The mode a published device is in: kMig for "mig", kWholeGpu for "hami-core"; nullopt for
// anything else ("mps", empty, unknown), which dynmig does not place on.
std::optional<GpuMode> DeviceGpuMode(const DeviceInfo& device);

// --- A pod's whole-GPU request ------------------------------------------------------------------

// What a HAMi user writes for a whole GPU, not a MIG slice: the annotation
// `nvidia.com/vgpu-mode: hami-core` (HAMi's scheduler places such a pod only on a device whose
// mode contains it, i.e. a GPU outside MIG mode) and `nvidia.com/gpu: N` per container. Without
// the annotation a pod stays a MIG pod, as today.
struct WholeGpuContainer {
  std::string name;
  bool init = false;
  uint32_t count = 0;           // whole GPUs
  uint64_t min_memory_mib = 0;  // nvidia.com/gpumem, when given: the GPU must have at least this
};

struct WholeGpuRequest {
  std::vector<WholeGpuContainer> containers;  // init containers first, as in ParsePodRequest
  uint32_t TotalGpus() const;
};

// The pod's nvidia.com/vgpu-mode, classified: kMig when absent, empty or naming "mig"; kWholeGpu
// when it is "hami-core" (case-sensitive, as HAMi writes it); nullopt for other modes ("mps").
// InvalidArgument: longer than 64 characters, or naming both "mig" and "hami-core".
absl::StatusOr<std::optional<GpuMode>> PodGpuMode(const nlohmann::json& pod);

// Whether the pod asks for the managed resources with nvidia.com/vgpu-mode "hami-core".
bool IsWholeGpuPod(const nlohmann::json& pod, const ResourceNames& names = {});

// Parses a whole-GPU pod's request (ParsePodRequest's rules for the quantities, bounds and
// messages), then: nvidia.com/gpumem-percentage must be 100 when given and nvidia.com/gpumem is a
// lower bound on the GPU's memory (a whole GPU is never shared; a share of a GPU needs HAMi-core,
// which dynmig does not provide), at most kMaxWholeGpusPerContainer GPUs per container, and at
// least one container wants a GPU. InvalidArgument names the container and resource, or the
// annotation (a pod that is not a whole-GPU pod).
inline constexpr uint32_t kMaxWholeGpusPerContainer = 16;
absl::StatusOr<WholeGpuRequest> ParseWholeGpuRequest(const nlohmann::json& pod,
                                                     const ResourceNames& names = {});

}  // namespace dynmig::protocol
