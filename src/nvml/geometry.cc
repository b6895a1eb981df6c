#include "nvml/geometry.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <map>
#include <optional>
#include <set>

#include "fmt/format.h"
#include "fmt/ranges.h"

namespace dynmig::nvml {
namespace {

absl::Status Invalid(std::string_view what) {
  return absl::InvalidArgumentError(fmt::format("geometry: {}", what));
}

// Checks one (name, count) pair and appends it.
absl::Status AddCount(GeometrySpec& spec, std::string_view name, uint32_t count) {
  if (auto parsed = mig::ParseProfileName(name); !parsed.ok()) {
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

uint32_t PlacementUnits(const std::vector<mig::ProfileSpec>& profiles) {
  uint32_t units = 0;
  for (const auto& p : profiles) {
    for (const auto& pl : p.placements) units = std::max(units, pl.end());
  }
  return units;
}

// The resolved geometry of one GPU: one entry per instance, largest profile first (mig-parted's
// flattened order), as indices into `profiles`.
struct Resolved {
  std::vector<mig::ProfileSpec> profiles;
  std::vector<size_t> items;
  uint32_t units = 0;
};

absl::StatusOr<Resolved> Resolve(Nvml& nvml, uint32_t gpu, const GeometrySpec& spec) {
  Resolved r;
  auto profiles = DiscoverProfiles(nvml, gpu);
  if (!profiles.ok()) {
    return absl::Status(profiles.status().code(),
                        fmt::format("GPU {}: {}", gpu, std::string(profiles.status().message())));
  }
  r.profiles = std::move(*profiles);
  r.units = PlacementUnits(r.profiles);
  auto find = [&](const std::string& name) -> std::optional<size_t> {
    for (size_t i = 0; i < r.profiles.size(); ++i) {
      if (r.profiles[i].name == name) return i;
    }
    return std::nullopt;
  };
  std::vector<std::pair<std::string, uint32_t>> counts = spec.counts;
  if (!spec.all_of.empty()) counts = {{spec.all_of, 0}};
  for (auto& [name, count] : counts) {
    const auto i = find(name);
    if (!i) {
      std::vector<std::string> names;
      for (const auto& p : r.profiles) names.push_back(p.name);
      return absl::InvalidArgumentError(fmt::format("GPU {} has no MIG profile {}; it has {}", gpu,
                                                    name, fmt::join(names, ", ")));
    }
    const mig::ProfileSpec& p = r.profiles[*i];
    if (count == 0) count = p.instance_count;  // all-<profile>
    if (count > p.instance_count) {
      return absl::InvalidArgumentError(fmt::format("GPU {}: {} x {} asked, the profile allows {}",
                                                    gpu, count, name, p.instance_count));
    }
    for (uint32_t k = 0; k < count; ++k) r.items.push_back(*i);
  }
  std::sort(r.items.begin(), r.items.end(), [&](size_t a, size_t b) {
    const auto& x = r.profiles[a];
    const auto& y = r.profiles[b];
    if (x.memory_slices != y.memory_slices) return x.memory_slices > y.memory_slices;
    if (x.compute_slices != y.compute_slices) return x.compute_slices > y.compute_slices;
    return a < b;
  });
  return r;
}

// Where one ordering puts each instance, picking as the driver does; nullopt when one does not fit.
std::optional<std::vector<mig::Placement>> Fit(const Resolved& r,
                                               const std::vector<size_t>& ordering) {
  std::vector<mig::Placement> taken;
  for (size_t item : ordering) {
    bool placed = false;
    for (const auto& pl : DriverPlacementOrder(r.profiles[item], r.units)) {
      const bool free = std::none_of(taken.begin(), taken.end(),
                                     [&](const mig::Placement& t) { return t.Overlaps(pl); });
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

std::string Describe(const std::vector<GpuInstanceInfo>& gis,
                     const std::vector<mig::ProfileSpec>& profiles) {
  std::vector<std::string> parts;
  for (const auto& gi : gis) {
    std::string name = fmt::format("profile {}", gi.profile_id);
    for (const auto& p : profiles) {
      if (p.nvml_id == gi.profile_id) name = p.name;
    }
    parts.push_back(
        fmt::format("{} (GI {} at {}:{})", name, gi.id, gi.placement.start, gi.placement.size));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

// The GPU's existing instances: exactly the geometry (filled into `out`), or an error.
absl::Status CompareExisting(Nvml& nvml, uint32_t gpu, const Resolved& r,
                             const std::vector<GpuInstanceInfo>& gis, GeometryResult& out) {
  std::multiset<uint32_t> want, have;
  for (size_t i : r.items) want.insert(r.profiles[i].nvml_id);
  for (const auto& gi : gis) have.insert(gi.profile_id);
  const std::string listed = Describe(gis, r.profiles);
  auto differ = [&](std::string_view why) {
    return absl::FailedPreconditionError(fmt::format(
        "GPU {} already has GPU instances that are not this geometry ({}): {}; refusing to "
        "change them",
        gpu, why, listed));
  };
  if (want != have) return differ("other profiles or counts");
  for (const auto& gi : gis) {
    auto cis = nvml.ListComputeInstances(gpu, gi.id);
    if (!cis.ok()) return cis.status();
    if (cis->size() != 1) {
      return differ(fmt::format("GI {} has {} compute instances, not 1", gi.id, cis->size()));
    }
    GeometryInstance inst{"", gi.id, (*cis)[0].id, gi.placement, (*cis)[0].mig_uuid};
    for (const auto& p : r.profiles) {
      if (p.nvml_id == gi.profile_id) inst.profile = p.name;
    }
    out.instances.push_back(std::move(inst));
  }
  out.unchanged = true;
  return absl::OkStatus();
}

// Destroys what this call created, newest first (compute instance, then GPU instance).
void Undo(Nvml& nvml, uint32_t gpu, const std::vector<GeometryInstance>& created) {
  for (auto it = created.rbegin(); it != created.rend(); ++it) {
    if (it->ci_id != UINT32_MAX) (void)nvml.DestroyComputeInstance(gpu, it->gi_id, it->ci_id);
    (void)nvml.DestroyGpuInstance(gpu, it->gi_id);
  }
}

absl::Status Create(Nvml& nvml, uint32_t gpu, const Resolved& r, const std::vector<size_t>& order,
                    const std::vector<mig::Placement>& where, GeometryResult& out) {
  std::vector<GeometryInstance> created;
  for (size_t k = 0; k < order.size(); ++k) {
    const mig::ProfileSpec& p = r.profiles[order[k]];
    const std::string what = fmt::format("GPU {}: cannot create {} at {}:{}", gpu, p.name,
                                         where[k].start, where[k].size);
    auto gi = nvml.CreateGpuInstance(gpu, p.nvml_id, where[k]);
    if (!gi.ok()) {
      Undo(nvml, gpu, created);
      return absl::Status(gi.status().code(),
                          fmt::format("{}: {}", what, std::string(gi.status().message())));
    }
    created.push_back({p.name, gi->id, UINT32_MAX, gi->placement, ""});
    auto ci = nvml.CreateComputeInstance(gpu, gi->id);
    if (!ci.ok()) {
      Undo(nvml, gpu, created);
      return absl::Status(ci.status().code(), fmt::format("{} (its compute instance): {}", what,
                                                          std::string(ci.status().message())));
    }
    created.back().ci_id = ci->id;
    created.back().mig_uuid = ci->mig_uuid;
  }
  out.instances = std::move(created);
  return absl::OkStatus();
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
    if (auto parsed = mig::ParseProfileName(name); !parsed.ok()) {
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

absl::StatusOr<GeometrySpec> GeometryFromLegacy(const std::vector<mig::LegacyTemplate>& templates) {
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

absl::StatusOr<GeometrySpec> SelectLegacyGeometry(
    const std::vector<mig::LegacyGeometryEntry>& entries, std::string_view gpu_name, size_t index) {
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

std::vector<mig::Placement> DriverPlacementOrder(const mig::ProfileSpec& profile,
                                                 uint32_t placement_units) {
  std::vector<mig::Placement> out = profile.placements;
  auto rank = [&](const mig::Placement& p) -> uint32_t {
    if (placement_units == 8 && p.size == 1) {
      static constexpr uint32_t kObserved[] = {6, 4, 5, 0, 1, 2, 3};  // mig-facts.md 3.1
      const auto* it = std::find(std::begin(kObserved), std::end(kObserved), p.start);
      return static_cast<uint32_t>(it - std::begin(kObserved));
    }
    const bool upper = p.start >= placement_units / 2;
    return (upper ? 0 : placement_units) + p.start;
  };
  std::stable_sort(out.begin(), out.end(), [&](const mig::Placement& a, const mig::Placement& b) {
    return rank(a) < rank(b);
  });
  return out;
}

absl::StatusOr<GeometryResult> ApplyGeometry(Nvml& nvml, uint32_t gpu, const GeometrySpec& spec) {
  auto info = nvml.GetGpu(gpu);
  if (!info.ok()) return info.status();
  GeometryResult out;
  out.gpu = gpu;
  out.gpu_name = info->name;
  if (!info->mig.current) {
    return absl::FailedPreconditionError(
        fmt::format("GPU {} ({}): MIG mode is not enabled", gpu, info->name));
  }
  auto r = Resolve(nvml, gpu, spec);
  if (!r.ok()) return r.status();
  auto gis = nvml.ListGpuInstances(gpu);
  if (!gis.ok()) return gis.status();
  if (!gis->empty()) {
    if (auto st = CompareExisting(nvml, gpu, *r, *gis, out); !st.ok()) return st;
  } else {
    std::vector<size_t> order = r->items;
    std::optional<std::vector<mig::Placement>> where;
    // Distinct orderings, from the flattened (largest-first) one, as mig-parted iterates them.
    std::map<size_t, size_t> rank;  // profile -> its first position in the flattened order
    for (size_t k = 0; k < order.size(); ++k) rank.emplace(order[k], k);
    auto less = [&](size_t a, size_t b) { return rank[a] < rank[b]; };
    do {
      ++out.orderings_tried;
      where = Fit(*r, order);
    } while (!where && out.orderings_tried < kMaxGeometryOrderings &&
             std::next_permutation(order.begin(), order.end(), less));
    if (!where) {
      return absl::ResourceExhaustedError(
          fmt::format("GPU {} ({}): geometry {} does not fit in any of {} orderings", gpu,
                      info->name, spec.ToString(), out.orderings_tried));
    }
    if (auto st = Create(nvml, gpu, *r, order, *where, out); !st.ok()) return st;
  }
  std::sort(out.instances.begin(), out.instances.end(),
            [](const GeometryInstance& a, const GeometryInstance& b) {
              return a.placement.start < b.placement.start;
            });
  return out;
}

}  // namespace dynmig::nvml
