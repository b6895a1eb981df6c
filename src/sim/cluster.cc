#include "sim/cluster.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>
#include <map>

#include "common/status_macros.h"
#include "common/strings.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "mig/profile.h"

namespace dynmig::sim {
namespace {

constexpr size_t kMaxEnumerationNodes = 4'000'000;

struct PlacementOption {
  uint32_t local;
  uint32_t profile_index;
  mig::Placement placement;
  mig::SliceMask mask;
};

// Every set of non-overlapping placements of allowlisted profiles, grouped by instance counts.
absl::Status BuildLayoutTable(ModelGroup& g) {
  const auto& cap = g.cap();
  const auto& allowed = g.planner->allowed();
  LayoutTable& t = g.table;
  t.profiles = static_cast<uint32_t>(allowed.size());
  std::vector<PlacementOption> options;
  for (uint32_t a = 0; a < allowed.size(); ++a) {
    for (const auto& pl : cap.profiles[allowed[a]].placements) {
      options.push_back({a, allowed[a], pl, pl.Mask()});
    }
  }
  std::map<std::vector<uint8_t>, int32_t> index;
  std::vector<uint8_t> counts(t.profiles, 0);
  std::vector<mig::PlannedInstance> layout;
  size_t nodes = 0;
  auto record = [&](mig::SliceMask mask) {
    auto [it, inserted] = index.emplace(counts, static_cast<int32_t>(t.counts.size()));
    if (inserted) {
      t.counts.push_back(counts);
      t.layout.push_back(layout);
      t.units.push_back(static_cast<uint32_t>(std::popcount(mask)));
    }
  };
  auto dfs = [&](auto&& self, size_t pos, mig::SliceMask mask) -> void {
    if (++nodes > kMaxEnumerationNodes) return;
    record(mask);
    for (size_t i = pos; i < options.size(); ++i) {
      const auto& o = options[i];
      if ((o.mask & mask) != 0) continue;
      if (counts[o.local] >= cap.profiles[o.profile_index].instance_count) continue;
      ++counts[o.local];
      layout.push_back({o.profile_index, o.placement});
      self(self, i + 1, mask | o.mask);
      layout.pop_back();
      --counts[o.local];
    }
  };
  dfs(dfs, 0, 0);
  if (nodes > kMaxEnumerationNodes) {
    return absl::ResourceExhaustedError(
        fmt::format("{}: too many instance layouts to enumerate with this allowlist", cap.model));
  }
  const size_t states = t.counts.size();
  t.add.assign(states * t.profiles, kNoState);
  t.remove.assign(states * t.profiles, kNoState);
  for (size_t s = 0; s < states; ++s) {
    bool maximal = true;
    for (uint32_t a = 0; a < t.profiles; ++a) {
      std::vector<uint8_t> c = t.counts[s];
      ++c[a];
      auto it = index.find(c);
      if (it != index.end()) {
        t.add[s * t.profiles + a] = it->second;
        maximal = false;
      }
      if (t.counts[s][a] > 0) {
        c[a] -= 2;
        it = index.find(c);
        if (it != index.end()) t.remove[s * t.profiles + a] = it->second;
      }
    }
    if (maximal) t.maximal.push_back(static_cast<uint32_t>(s));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::string, uint32_t>> SplitModelCount(std::string_view piece) {
  // MODELxCOUNT: the count is the run of digits after the last 'x' (model names contain 'X').
  const size_t x = piece.find_last_of("xX");
  std::string_view digits = x == std::string_view::npos ? "" : Trim(piece.substr(x + 1));
  const bool numeric = !digits.empty() && std::all_of(digits.begin(), digits.end(),
                                                      [](char c) { return c >= '0' && c <= '9'; });
  if (!numeric || x == 0) {
    return absl::InvalidArgumentError(fmt::format(
        "--gpus: \"{}\" has no GPU count (expected MODELxCOUNT, e.g. A100-SXM4-40GBx100)", piece));
  }
  uint32_t count = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), count);
  if (ec != std::errc() || ptr != digits.data() + digits.size() || count == 0 ||
      count > 1'000'000) {
    return absl::InvalidArgumentError(fmt::format(
        "--gpus: \"{}\": the GPU count \"{}\" is not a number from 1 to 1000000", piece, digits));
  }
  return std::make_pair(std::string(Trim(piece.substr(0, x))), count);
}

}  // namespace

int32_t LayoutTable::Find(const std::vector<uint8_t>& c) const {
  for (size_t s = 0; s < counts.size(); ++s) {
    if (counts[s] == c) return static_cast<int32_t>(s);
  }
  return kNoState;
}

bool ModelGroup::CanHost(uint32_t percent, mig::SliceMask free) const {
  const auto& lookup = hostable[percent];
  if (!lookup.empty()) return lookup[free] != 0;
  for (uint32_t idx : candidates[percent]) {
    for (const auto& pl : profile(idx).placements) {
      if ((pl.Mask() & ~free) == 0) return true;
    }
  }
  return false;
}

uint32_t ModelGroup::Core(uint32_t profile_index) const {
  if (full_mp == 0) return 0;
  return (profile(profile_index).multiprocessor_count * 100 + full_mp - 1) / full_mp;
}

uint32_t Cluster::AskedUnits(uint32_t count, uint32_t percent) const {
  for (const auto& g : groups) {
    if (!g.candidates[percent].empty()) {
      return count * g.profile(g.candidates[percent].front()).memory_slices;
    }
  }
  return 0;
}

bool Cluster::Servable(uint32_t percent) const {
  return std::any_of(groups.begin(), groups.end(),
                     [&](const ModelGroup& g) { return !g.candidates[percent].empty(); });
}

absl::StatusOr<Cluster> BuildCluster(std::string_view gpus, uint32_t gpus_per_node,
                                     const std::vector<std::string>& allow) {
  if (gpus_per_node == 0 || gpus_per_node > 64) {
    return absl::InvalidArgumentError(
        fmt::format("--gpus-per-node: {} is not from 1 to 64", gpus_per_node));
  }
  const std::vector<std::string> pieces = SplitTrimmed(gpus, ',');
  if (pieces.empty()) return absl::InvalidArgumentError("--gpus: no GPUs given");
  Cluster c;
  c.gpus_per_node = gpus_per_node;
  std::vector<bool> allow_used(allow.size(), false);
  for (const auto& piece : pieces) {
    DYNMIG_ASSIGN_OR_RETURN(auto mc, SplitModelCount(piece));
    auto model = mig::FindModel(mc.first);
    if (!model.ok()) return Annotate(model.status(), "--gpus");
    ModelGroup g;
    g.model = *model;
    g.gpus = mc.second;
    const auto& cap = g.model->capability;
    std::vector<std::string> names;
    for (const auto& p : cap.profiles) {
      if (allow.empty()) {
        auto parsed = mig::ParseProfileName(p.name);
        if (parsed.ok() && parsed->suffix.empty()) names.push_back(p.name);
      } else {
        for (size_t i = 0; i < allow.size(); ++i) {
          if (allow[i] == p.name) {
            names.push_back(p.name);
            allow_used[i] = true;
          }
        }
      }
    }
    if (names.empty()) {
      return absl::InvalidArgumentError(
          fmt::format("--allow: none of the allowed profiles ({}) exists on {}",
                      fmt::join(allow, ", "), cap.model));
    }
    auto planner = mig::GpuPlanner::Create(cap, names);
    if (!planner.ok()) return Annotate(planner.status(), "--gpus");
    g.planner = *planner;
    g.units = g.planner->units();
    if (g.units > mig::kMaxPlacementUnits) {
      return absl::InvalidArgumentError(fmt::format("{}: too many placement units", cap.model));
    }
    g.local.assign(cap.profiles.size(), -1);
    for (size_t a = 0; a < g.planner->allowed().size(); ++a) {
      const uint32_t idx = g.planner->allowed()[a];
      g.local[idx] = static_cast<int32_t>(a);
      g.device_count = std::max(g.device_count, cap.profiles[idx].instance_count);
    }
    for (const auto& p : cap.profiles) g.full_mp = std::max(g.full_mp, p.multiprocessor_count);
    for (uint32_t pct = 1; pct <= 100; ++pct) {
      const uint64_t mem = mig::ResolveMemory(0, pct, cap);
      for (uint32_t idx : g.planner->allowed()) {
        if (cap.profiles[idx].SizingMib() >= mem) g.candidates[pct].push_back(idx);
      }
    }
    if (g.units <= 16) {
      const uint32_t masks = 1u << g.units;
      for (uint32_t pct = 1; pct <= 100; ++pct) {
        auto& table = g.hostable[pct];
        table.assign(masks, 0);
        for (uint32_t idx : g.candidates[pct]) {
          for (const auto& pl : cap.profiles[idx].placements) {
            const mig::SliceMask m = pl.Mask();
            for (uint32_t free = 0; free < masks; ++free) {
              if ((m & ~free) == 0) table[free] = 1;
            }
          }
        }
      }
    }
    DYNMIG_RETURN_IF_ERROR(BuildLayoutTable(g));
    c.groups.push_back(std::move(g));
  }
  for (size_t i = 0; i < allow.size(); ++i) {
    if (!allow_used[i]) {
      return absl::InvalidArgumentError(
          fmt::format("--allow: no GPU model of the cluster has a profile named \"{}\"", allow[i]));
    }
  }
  for (uint32_t gi = 0; gi < c.groups.size(); ++gi) {
    auto& g = c.groups[gi];
    g.first_gpu = c.gpu_count();
    for (uint32_t k = 0; k < g.gpus; ++k) {
      if (k % gpus_per_node == 0) {
        c.node_first_gpu.push_back(c.gpu_count());
        c.node_gpus.push_back(0);
      }
      c.gpu_group.push_back(gi);
      c.gpu_node.push_back(c.node_count() - 1);
      ++c.node_gpus.back();
    }
    c.total_units += uint64_t{g.units} * g.gpus;
  }
  return c;
}

absl::StatusOr<StaticGeometry> MakeStaticGeometry(const ModelGroup& group, std::string_view name) {
  const auto& allowed = group.planner->allowed();
  const auto& model = group.cap().model;
  // The smallest allowlisted profile of a slice class ("2g") or with this exact name.
  auto pick = [&](std::string_view what) -> int32_t {
    for (uint32_t a = 0; a < allowed.size(); ++a) {
      const std::string& pn = group.profile(allowed[a]).name;
      if (pn == what || mig::SliceClass(pn) == what) return static_cast<int32_t>(a);
    }
    return -1;
  };
  StaticGeometry geo;
  geo.name = std::string(name);
  std::vector<uint8_t> counts(allowed.size(), 0);
  int32_t state = kNoState;
  if (name == "all-balanced") {
    std::vector<std::pair<int32_t, uint8_t>> parts;
    for (const auto& [cls, n] : {std::pair<const char*, uint8_t>{"1g", 2}, {"2g", 1}, {"3g", 1}}) {
      const int32_t a = pick(cls);
      if (a >= 0) parts.push_back({a, n});
    }
    while (!parts.empty()) {
      std::fill(counts.begin(), counts.end(), 0);
      for (const auto& [a, n] : parts) counts[a] += n;
      state = group.table.Find(counts);
      if (state != kNoState) break;
      parts.pop_back();
    }
  } else if (name.starts_with("all-") && name.size() > 4) {
    const int32_t a = pick(name.substr(4));
    if (a < 0) {
      return absl::InvalidArgumentError(fmt::format(
          "static:{}: {} has no allowlisted profile \"{}\"", name, model, name.substr(4)));
    }
    while (true) {
      ++counts[a];
      const int32_t next = group.table.Find(counts);
      if (next == kNoState) break;
      state = next;
    }
  } else {
    return absl::InvalidArgumentError(fmt::format(
        "static:{}: unknown geometry (use all-balanced, all-1g, all-2g, all-3g, all-4g, all-7g "
        "or all-<profile>)",
        name));
  }
  if (state == kNoState || group.table.layout[state].empty()) {
    return absl::InvalidArgumentError(
        fmt::format("static:{}: no instance of this geometry fits on {}", name, model));
  }
  geo.instances = group.table.layout[state];
  std::sort(geo.instances.begin(), geo.instances.end(),
            [](const mig::PlannedInstance& x, const mig::PlannedInstance& y) {
              return x.placement.start < y.placement.start;
            });
  geo.leftover_units = group.units - group.table.units[state];
  return geo;
}

}  // namespace dynmig::sim
