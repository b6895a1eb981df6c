#include "mig/geometry.h"

#include <algorithm>
#include <charconv>
#include <map>

#include "fmt/format.h"
#include "fmt/ranges.h"

namespace dynmig::mig {
namespace {

absl::Status Invalid(std::string_view what) {
  return absl::InvalidArgumentError(fmt::format("geometry: {}", what));
}

// Checks one (name, count) pair and appends it.
absl::Status AddCount(GeometrySpec& spec, std::string_view name, uint32_t count) {
  if (auto parsed = ParseProfileName(name); !parsed.ok()) {
    return Invalid(fmt::format("\"{}\" is not a profile name: {}", name,
                               std::string(parsed.status().message())));
  }
  if (count < 1 || count > kMaxGeometryInstances) {
    return Invalid(fmt::format("{}: count {} is not 1..{}", name, count, kMaxGeometryInstances));
  }
  for (const auto& [n, c] : spec.counts) {
    if (n == name) return Invalid(fmt::format("{} is named twice", name));
  }
  if (spec.counts.size() >= kMaxGeometryProfiles) {
    return Invalid(fmt::format("more than {} profiles", kMaxGeometryProfiles));
  }
  uint32_t total = count;
  for (const auto& [n, c] : spec.counts) total += c;
  if (total > kMaxGeometryInstances) {
    return Invalid(
        fmt::format("{} instances; a GPU holds at most {}", total, kMaxGeometryInstances));
  }
  spec.counts.emplace_back(std::string(name), count);
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> ParseCount(std::string_view item, std::string_view text) {
  uint32_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    return Invalid(fmt::format("\"{}\": the count \"{}\" is not a number", item, text));
  }
  return value;
}

// Where one ordering puts each instance, picking as the driver does; nullopt when one does not fit.
std::optional<std::vector<Placement>> Fit(const std::vector<const ProfileSpec*>& instances,
                                          const std::vector<size_t>& ordering, uint32_t units) {
  std::vector<Placement> taken;
  for (size_t item : ordering) {
    bool placed = false;
    for (const auto& pl : DriverPlacementOrder(*instances[item], units)) {
      const bool free = std::none_of(taken.begin(), taken.end(),
                                     [&](const Placement& t) { return t.Overlaps(pl); });
      if (free) {
        taken.push_back(pl);
        placed = true;
        break;
      }
    }
    if (!placed) return std::nullopt;
  }
  return taken;
}

}  // namespace

std::string GeometrySpec::ToString() const {
  if (!all_of.empty()) return "all-" + all_of;
  std::vector<std::string> parts;
  for (const auto& [name, count] : counts) parts.push_back(fmt::format("{}={}", name, count));
  return fmt::format("{}", fmt::join(parts, ","));
}

absl::StatusOr<GeometrySpec> ParseGeometry(std::string_view text) {
  if (text.size() > kMaxGeometryText) {
    return Invalid(fmt::format("{} bytes; at most {}", text.size(), kMaxGeometryText));
  }
  if (text.empty()) return Invalid("empty (use all-<profile> or <profile>=<n>,...)");
  GeometrySpec spec;
  if (text.starts_with("all-")) {
    const std::string_view name = text.substr(4);
    if (auto parsed = ParseProfileName(name); !parsed.ok()) {
      return Invalid(fmt::format("\"{}\" is not a profile name: {}", name,
                                 std::string(parsed.status().message())));
    }
    spec.all_of = std::string(name);
    return spec;
  }
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item = text.substr(pos, comma - pos);
    const size_t eq = item.find('=');
    if (item.empty() || eq == std::string_view::npos) {
      return Invalid(fmt::format("\"{}\" is not <profile>=<count>", item));
    }
    auto count = ParseCount(item, item.substr(eq + 1));
    if (!count.ok()) return count.status();
    if (auto st = AddCount(spec, item.substr(0, eq), *count); !st.ok()) return st;
    pos = comma + 1;
  }
  return spec;
}

absl::StatusOr<GeometrySpec> GeometryFromLegacy(const std::vector<LegacyTemplate>& templates) {
  if (templates.empty()) return Invalid("the legacy geometry has no template");
  GeometrySpec spec;
  for (size_t i = 0; i < templates.size(); ++i) {
    const auto& t = templates[i];
    if (auto st = AddCount(spec, t.name, t.count); !st.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("legacy template {} ({}): {}", i, t.name, std::string(st.message())));
    }
  }
  return spec;
}

absl::StatusOr<GeometrySpec> SelectLegacyGeometry(const std::vector<LegacyGeometryEntry>& entries,
                                                  std::string_view gpu_name, size_t index) {
  for (size_t e = 0; e < entries.size(); ++e) {
    const auto& entry = entries[e];
    const bool match = std::any_of(entry.models.begin(), entry.models.end(), [&](const auto& m) {
      return !m.empty() && gpu_name.find(m) != std::string_view::npos;
    });
    if (!match) continue;
    if (index >= entry.geometries.size()) {
      return absl::InvalidArgumentError(
          fmt::format("knownMigGeometries[{}] (models {}) has {} geometries; there is no {}", e,
                      fmt::join(entry.models, ", "), entry.geometries.size(), index));
    }
    auto spec = GeometryFromLegacy(entry.geometries[index]);
    if (!spec.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("knownMigGeometries[{}].allowedGeometries[{}]: {}", e, index,
                      std::string(spec.status().message())));
    }
    return spec;
  }
  return absl::NotFoundError(
      fmt::format("no knownMigGeometries entry names a model of GPU \"{}\"", gpu_name));
}

std::vector<Placement> DriverPlacementOrder(const ProfileSpec& profile, uint32_t placement_units) {
  std::vector<Placement> out = profile.placements;
  auto rank = [&](const Placement& p) -> uint32_t {
    if (placement_units == 8 && p.size == 1) {
      static constexpr uint32_t kObserved[] = {6, 4, 5, 0, 1, 2, 3};  // mig-facts.md 3.1
      const auto* it = std::find(std::begin(kObserved), std::end(kObserved), p.start);
      return static_cast<uint32_t>(it - std::begin(kObserved));
    }
    const bool upper = p.start >= placement_units / 2;
    return (upper ? 0 : placement_units) + p.start;
  };
  std::stable_sort(out.begin(), out.end(),
                   [&](const Placement& a, const Placement& b) { return rank(a) < rank(b); });
  return out;
}

std::optional<GeometryLayout> LayOutGeometry(const std::vector<const ProfileSpec*>& instances,
                                             uint32_t placement_units, size_t* tried) {
  // Distinct orderings, from the flattened (largest-first) one, as mig-parted iterates them: two
  // instances of one profile are the same item, so each instance is named by the first position of
  // its profile, and next_permutation from that sorted start visits each distinct ordering once.
  GeometryLayout out;
  std::map<const ProfileSpec*, size_t> first;  // profile -> its first position
  for (size_t k = 0; k < instances.size(); ++k) {
    out.order.push_back(first.emplace(instances[k], k).first->second);
  }
  std::sort(out.order.begin(), out.order.end());
  *tried = 0;
  std::optional<std::vector<Placement>> where;
  do {
    ++*tried;
    where = Fit(instances, out.order, placement_units);
  } while (!where && *tried < kMaxGeometryOrderings &&
           std::next_permutation(out.order.begin(), out.order.end()));
  if (!where) return std::nullopt;
  out.placements = std::move(*where);
  return out;
}

}  // namespace dynmig::mig
