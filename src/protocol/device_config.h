// HAMi's `device-config.yaml` (ConfigMap `<release>-scheduler-device`), the `nvidia:` section:
// the MIG profile allowlist, the legacy geometries (read so they can be migrated), and the extended
// resource names. Unknown keys and other vendors' sections are ignored. Pure; thread-compatible.
//
//   nvidia:
//     resourceCountName: nvidia.com/gpu
//     migMemoryMatch: nominal            # or nvml
//     migProfileAllowlist:
//       - models: ["A100-SXM4-40GB", "A100-PCIE-40GB"]
//         profiles: ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]
//     migWarmInstances: {ttl: 5m, maxPerGpu: 2}   # optional: keep ended pods' instances idle
//     migModeSwitching: {enabled: true, rules: [{models: [H100]}]}   # optional: MIG mode per GPU
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "mig/allowlist.h"
#include "mig/legacy.h"
#include "protocol/gpu_mode.h"
#include "protocol/pod_request.h"

namespace dynmig::protocol {

// nvidia.migWarmInstances (lazy reclamation): the MIG instance of a pod that ended stays idle on
// its GPU, for reuse by a later pod that reserves exactly its GPU, profile and placement (no NVML
// create). An idle instance is destroyed after `ttl`, as soon as another reservation needs its
// slices, or when its GPU already keeps `max_per_gpu` idle instances. Off unless the key is present
// (and `enabled` is not false).
struct WarmInstances {
  static constexpr absl::Duration kMinTtl = absl::Seconds(1);
  static constexpr absl::Duration kMaxTtl = absl::Hours(24);
  static constexpr uint32_t kMaxPerGpuLimit = 64;

  bool enabled = false;
  absl::Duration ttl = absl::Minutes(5);  // nvidia.migWarmInstances.ttl, kMinTtl..kMaxTtl
  uint32_t max_per_gpu = 2;               // nvidia.migWarmInstances.maxPerGpu, 1..kMaxPerGpuLimit

  friend bool operator==(const WarmInstances&, const WarmInstances&) = default;
};

struct DeviceConfig {
  mig::Allowlist allowlist;                                 // nvidia.migProfileAllowlist
  std::vector<mig::LegacyGeometryEntry> legacy_geometries;  // nvidia.knownMigGeometries
  ResourceNames
      resources;  // nvidia.resource{Count,Memory,MemoryPercentage,Core}Name, defaultGPUNum
  // nvidia.migMemoryMatch: "nominal" (default: 20000 MiB fits 3g.20gb, 20 GB x 1024) or "nvml"
  // (never less than NVML's memory: 20000 MiB needs 7g.40gb on an A100-40GB, whose 3g.20gb has
  // 19968 MiB).
  mig::MemoryMatch memory_match = mig::MemoryMatch::kNominal;
  WarmInstances warm_instances;  // nvidia.migWarmInstances (off by default)
  // nvidia.migModeSwitching (off by default: every GPU stays in MIG mode, never switched).
  MigModeSwitching mig_mode_switching;
  // Notes that do not make the file invalid: legacy geometries present (not used: run
  // `dynmig config migrate`), no allowlist (no MIG profile will be offered).
  std::vector<std::string> warnings;
};

// Parses and validates the YAML text. Errors (kInvalidArgument) name the field path:
// "device-config.yaml: invalid YAML at line 3, column 5: ..." for syntax;
// "nvidia: section is missing" / "nvidia: must be a mapping";
// "nvidia.migProfileAllowlist[1].profiles[0]: invalid MIG profile name ..." (mig::Allowlist rules);
// "nvidia.knownMigGeometries[0].allowedGeometries[1][0].memory: must be a non-negative integer";
// "nvidia.resourceCountName: must be a non-empty string";
// "nvidia.migWarmInstances.ttl: must be a duration such as 90s, 5m or 1h, got \"soon\"";
// "nvidia.migModeSwitching.rules[0].nodeSelector: label key \"-x\": ...".
// yaml-cpp exceptions never escape.
// allowedGeometries elements may be a list of templates (HAMi) or a mapping with a `geometries`
// list (volcano-vgpu's grouped form).
absl::StatusOr<DeviceConfig> ParseDeviceConfig(std::string_view yaml);

// Reads the file and parses it; a file that cannot be read is kNotFound / kPermissionDenied /
// kInvalidArgument naming the path.
absl::StatusOr<DeviceConfig> LoadDeviceConfig(const std::string& path);

// The allowlist every catalogued model gets by default: one entry per catalogued model, its board
// names without the "NVIDIA " prefix as models, its profiles without variant suffixes ordered by
// size. Entries are ordered so that first-match-wins picks each board's own entry (an entry whose
// model is a substring of another model's board name, such as "H200" in "GH200 120GB", comes after
// that model's entry).
mig::Allowlist DefaultAllowlist();

// A complete device-config.yaml with the HAMi resource names and DefaultAllowlist(), for deploy
// manifests and `dynmig config default`. ParseDeviceConfig accepts it.
std::string DefaultDeviceConfigYaml();

// The result of converting a device config's legacy geometries (`dynmig config migrate`).
struct ConfigMigration {
  std::string yaml;                 // the migrated document (the input unchanged if !changed)
  std::vector<std::string> report;  // what was converted, dropped and merged, one line each
  bool changed = false;
};

// Converts `nvidia.knownMigGeometries` to `nvidia.migProfileAllowlist`
// (mig::ConvertLegacyGeometries) and removes the legacy key, keeping every other key and section
// (the allowlist takes the legacy key's place). When the file already has an allowlist, its entries
// are kept as they are (they are the operator's current policy) and a converted entry is appended
// only for the models the allowlist does not name yet; the report says which entries were kept,
// appended or skipped. YAML comments are not preserved (reported when the input has any). Errors:
// the input does not parse or validate (ParseDeviceConfig's errors), several YAML documents in one
// file.
absl::StatusOr<ConfigMigration> MigrateDeviceConfig(std::string_view yaml);

}  // namespace dynmig::protocol
