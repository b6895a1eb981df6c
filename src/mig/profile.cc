#include "mig/profile.h"

#include <algorithm>
#include <charconv>

#include "absl/status/status.h"
#include "fmt/format.h"

namespace dynmig::mig {
namespace {

bool ParseUint(std::string_view s, uint32_t& out) {
  if (s.empty()) return false;
  const auto* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && ptr == end;
}

constexpr std::string_view kSuffixes[] = {"+me.all", "+me", "-me", "+gfx"};

}  // namespace

absl::StatusOr<ProfileName> ParseProfileName(std::string_view name) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        fmt::format("invalid MIG profile name \"{}\": {} (expected <c>g.<m>gb with an optional "
                    "+me, +me.all, -me or +gfx suffix, e.g. \"3g.20gb\")",
                    name, why));
  };
  const size_t dot = name.find('.');
  if (dot == std::string_view::npos) return bad("no '.' between slices and memory");
  std::string_view slices = name.substr(0, dot);
  std::string_view rest = name.substr(dot + 1);
  if (slices.size() < 2 || slices.back() != 'g') return bad("slice part must end in 'g'");
  ProfileName out;
  if (!ParseUint(slices.substr(0, slices.size() - 1), out.compute_slices) ||
      out.compute_slices == 0) {
    return bad("slice count must be a positive number");
  }
  for (std::string_view suffix : kSuffixes) {
    if (rest.size() > suffix.size() && rest.substr(rest.size() - suffix.size()) == suffix) {
      out.suffix = std::string(suffix);
      rest.remove_suffix(suffix.size());
      break;
    }
  }
  if (rest.size() < 3 || rest.substr(rest.size() - 2) != "gb") {
    return bad("memory part must end in 'gb'");
  }
  if (!ParseUint(rest.substr(0, rest.size() - 2), out.memory_gb) || out.memory_gb == 0) {
    return bad("memory must be a positive number of GB");
  }
  return out;
}

std::string_view SliceClass(std::string_view name) {
  const size_t dot = name.find('.');
  if (dot == std::string_view::npos || dot == 0) return name;
  return name.substr(0, dot);
}

std::string_view MemoryMatchName(MemoryMatch m) {
  return m == MemoryMatch::kNvml ? "nvml" : "nominal";
}

uint64_t NominalMemoryMib(std::string_view profile_name) {
  auto parsed = ParseProfileName(profile_name);
  return parsed.ok() ? uint64_t{parsed->memory_gb} * 1024 : 0;
}

uint64_t SizingMemory(const ProfileSpec& p, MemoryMatch match) {
  if (match == MemoryMatch::kNvml) return p.memory_mib;
  const uint64_t nominal = NominalMemoryMib(p.name);
  return nominal != 0 ? nominal : p.memory_mib;
}

uint64_t ProfileSpec::SizingMib() const {
  return sizing_mib != 0 ? sizing_mib : SizingMemory(*this, MemoryMatch::kNominal);
}

void ApplyMemoryMatch(GpuCapability& cap, MemoryMatch match) {
  for (auto& p : cap.profiles) p.sizing_mib = match == MemoryMatch::kNvml ? p.memory_mib : 0;
}

bool ProfileSpec::IsLegal(const Placement& p) const {
  return std::find(placements.begin(), placements.end(), p) != placements.end();
}

const ProfileSpec* GpuCapability::FindProfile(std::string_view name) const {
  for (const auto& p : profiles) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

uint64_t GpuCapability::FullProfileMemory() const {
  uint64_t best = 0;
  for (const auto& p : profiles) best = std::max(best, p.memory_mib);
  return best;
}

bool DefaultProfileLess(const ProfileSpec& a, const ProfileSpec& b) {
  if (a.SizingMib() != b.SizingMib()) return a.SizingMib() < b.SizingMib();
  if (a.memory_mib != b.memory_mib) return a.memory_mib < b.memory_mib;
  if (a.compute_slices != b.compute_slices) return a.compute_slices < b.compute_slices;
  if (a.memory_slices != b.memory_slices) return a.memory_slices < b.memory_slices;
  const bool a_variant = a.name.find_first_of("+-") != std::string::npos;
  const bool b_variant = b.name.find_first_of("+-") != std::string::npos;
  if (a_variant != b_variant) return !a_variant;
  return a.name < b.name;
}

}  // namespace dynmig::mig
