// The MIG profile allowlist (`nvidia.migProfileAllowlist` in HAMi's device-config.yaml): which
// profiles the scheduler may use on which GPU models. Policy only; capability comes from NVML.
// Pure value types; thread-compatible.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "mig/profile.h"

namespace dynmig::mig {

struct AllowlistEntry {
  std::vector<std::string> models;    // substrings of the NVML device name
  std::vector<std::string> profiles;  // exact profile names, in the operator's order
};

struct Allowlist {
  std::vector<AllowlistEntry> entries;

  // The first entry with a model that is a substring of `nvml_name`, or nullptr ("first match
  // wins").
  const AllowlistEntry* Match(std::string_view nvml_name) const;

  // Every entry needs a model and a profile, and every profile a valid name. The error names the
  // field path, e.g. "nvidia.migProfileAllowlist[1].profiles[0]: invalid MIG profile name ...".
  absl::Status Validate(std::string_view path = "nvidia.migProfileAllowlist") const;

  // Whether a preference entry (an exact profile name or a slice class such as "4g") names a
  // profile of some entry, for any model.
  bool KnowsPreferenceEntry(std::string_view entry) const;

  // Every distinct profile name of every entry, in first-seen order (for error messages).
  std::vector<std::string> AllProfileNames() const;
};

// The profiles of `cap` that `entry` allows, in the capability's order, and the allowlisted names
// the GPU does not have (reported by discovery, never silently mapped to another profile).
struct AllowedProfiles {
  std::vector<const ProfileSpec*> profiles;
  std::vector<std::string> missing;
};
AllowedProfiles ApplyAllowlist(const GpuCapability& cap, const AllowlistEntry& entry);

}  // namespace dynmig::mig
