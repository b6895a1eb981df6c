#include "mig/allowlist.h"

#include <algorithm>

#include "fmt/format.h"
#include "mig/preference.h"

namespace dynmig::mig {

const AllowlistEntry* Allowlist::Match(std::string_view nvml_name) const {
  for (const auto& e : entries) {
    for (const auto& m : e.models) {
      if (!m.empty() && nvml_name.find(m) != std::string_view::npos) return &e;
    }
  }
  return nullptr;
}

absl::Status Allowlist::Validate(std::string_view path) const {
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    if (e.models.empty()) {
      return absl::InvalidArgumentError(
          fmt::format("{}[{}].models: at least one GPU model is required", path, i));
    }
    for (size_t j = 0; j < e.models.size(); ++j) {
      if (e.models[j].empty()) {
        return absl::InvalidArgumentError(
            fmt::format("{}[{}].models[{}]: model must not be empty", path, i, j));
      }
    }
    if (e.profiles.empty()) {
      return absl::InvalidArgumentError(
          fmt::format("{}[{}].profiles: at least one MIG profile is required", path, i));
    }
    for (size_t j = 0; j < e.profiles.size(); ++j) {
      auto parsed = ParseProfileName(e.profiles[j]);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(fmt::format("{}[{}].profiles[{}]: {}", path, i, j,
                                                      std::string(parsed.status().message())));
      }
      for (size_t k = 0; k < j; ++k) {
        if (e.profiles[k] == e.profiles[j]) {
          return absl::InvalidArgumentError(fmt::format(
              "{}[{}].profiles[{}]: \"{}\" is listed twice", path, i, j, e.profiles[j]));
        }
      }
    }
  }
  return absl::OkStatus();
}

bool Allowlist::KnowsPreferenceEntry(std::string_view entry) const {
  for (const auto& e : entries) {
    for (const auto& p : e.profiles) {
      if (PreferenceEntryMatches(entry, p)) return true;
    }
  }
  return false;
}

std::vector<std::string> Allowlist::AllProfileNames() const {
  std::vector<std::string> out;
  for (const auto& e : entries) {
    for (const auto& p : e.profiles) {
      if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
    }
  }
  return out;
}

AllowedProfiles ApplyAllowlist(const GpuCapability& cap, const AllowlistEntry& entry) {
  AllowedProfiles out;
  for (const auto& p : cap.profiles) {
    if (std::find(entry.profiles.begin(), entry.profiles.end(), p.name) != entry.profiles.end()) {
      out.profiles.push_back(&p);
    }
  }
  for (const auto& name : entry.profiles) {
    if (cap.FindProfile(name) == nullptr) out.missing.push_back(name);
  }
  return out;
}

}  // namespace dynmig::mig
