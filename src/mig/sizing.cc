#include "mig/sizing.h"

#include <algorithm>

#include "fmt/format.h"

namespace dynmig::mig {
namespace {

bool Allowed(const std::vector<std::string>& allowed, const std::string& name) {
  return std::find(allowed.begin(), allowed.end(), name) != allowed.end();
}

}  // namespace

std::string ModelDisplayName(std::string_view nvml_name) {
  constexpr std::string_view kPrefix = "NVIDIA ";
  if (nvml_name.starts_with(kPrefix)) nvml_name.remove_prefix(kPrefix.size());
  return std::string(nvml_name);
}

const ProfileSpec* ResolveProfile(const GpuCapability& cap, const std::vector<std::string>& allowed,
                                  uint64_t request_mib, const Preference& preference,
                                  MemoryMatch match) {
  std::vector<const ProfileSpec*> covering;
  for (const auto& p : cap.profiles) {
    if (Allowed(allowed, p.name) && SizingMemory(p, match) >= request_mib) covering.push_back(&p);
  }
  std::sort(covering.begin(), covering.end(), [&](const ProfileSpec* a, const ProfileSpec* b) {
    if (SizingMemory(*a, match) != SizingMemory(*b, match))
      return SizingMemory(*a, match) < SizingMemory(*b, match);
    return DefaultProfileLess(*a, *b);
  });
  for (const auto& entry : preference.entries) {
    for (const ProfileSpec* p : covering) {
      if (PreferenceEntryMatches(entry, p->name)) return p;
    }
  }
  return covering.empty() ? nullptr : covering.front();
}

std::optional<std::string> SizingNote(const GpuCapability& cap,
                                      const std::vector<std::string>& allowed, uint64_t request_mib,
                                      const Preference& preference, MemoryMatch match,
                                      std::string_view resource) {
  if (request_mib == 0) return std::nullopt;
  const ProfileSpec* chosen = ResolveProfile(cap, allowed, request_mib, preference, match);
  if (chosen == nullptr) return std::nullopt;
  const std::string model = ModelDisplayName(cap.model);
  if (chosen->memory_mib < request_mib) {
    return fmt::format("{} has {} MiB on {}, {} MiB less than {} {}", chosen->name,
                       chosen->memory_mib, model, request_mib - chosen->memory_mib, resource,
                       request_mib);
  }
  if (match == MemoryMatch::kNvml && chosen->memory_mib > 2 * request_mib) {
    // The profile nominal matching would have given, when NVML's memory is what rules it out.
    const ProfileSpec* nominal =
        ResolveProfile(cap, allowed, request_mib, preference, MemoryMatch::kNominal);
    if (nominal != nullptr && nominal != chosen && nominal->memory_mib < request_mib) {
      return fmt::format("{} MiB needs {} on {}; {} has {}", request_mib, chosen->name, model,
                         nominal->name, nominal->memory_mib);
    }
    return fmt::format("{} MiB needs {} on {} ({} MiB)", request_mib, chosen->name, model,
                       chosen->memory_mib);
  }
  return std::nullopt;
}

}  // namespace dynmig::mig
