#include "nvml/geometry.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>

#include "fmt/format.h"
#include "fmt/ranges.h"

namespace dynmig::nvml {
namespace {

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

absl::StatusOr<Resolved> Resolve(Nvml& nvml, uint32_t gpu, const mig::GeometrySpec& spec) {
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

absl::Status Create(Nvml& nvml, uint32_t gpu, const std::vector<const mig::ProfileSpec*>& instances,
                    const mig::GeometryLayout& layout, GeometryResult& out) {
  const std::vector<mig::Placement>& where = layout.placements;
  std::vector<GeometryInstance> created;
  for (size_t k = 0; k < layout.order.size(); ++k) {
    const mig::ProfileSpec& p = *instances[layout.order[k]];
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

absl::StatusOr<GeometryResult> ApplyGeometry(Nvml& nvml, uint32_t gpu,
                                             const mig::GeometrySpec& spec) {
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
    std::vector<const mig::ProfileSpec*> instances;
    for (size_t i : r->items) instances.push_back(&r->profiles[i]);
    auto layout = mig::LayOutGeometry(instances, r->units, &out.orderings_tried);
    if (!layout) {
      return absl::ResourceExhaustedError(
          fmt::format("GPU {} ({}): geometry {} does not fit in any of {} orderings", gpu,
                      info->name, spec.ToString(), out.orderings_tried));
    }
    if (auto st = Create(nvml, gpu, instances, *layout, out); !st.ok()) return st;
  }
  std::sort(out.instances.begin(), out.instances.end(),
            [](const GeometryInstance& a, const GeometryInstance& b) {
              return a.placement.start < b.placement.start;
            });
  return out;
}

}  // namespace dynmig::nvml
