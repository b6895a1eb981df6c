#include "mig/planner.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <numeric>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "mig/capacity.h"

namespace dynmig::mig {
namespace {

constexpr size_t kMaxSearchNodes = 1'000'000;

void AppendNumber(std::string& out, uint32_t n) {
  char digits[10];
  const auto end = std::to_chars(digits, digits + sizeof(digits), n).ptr;
  out.append(digits, end);
}

// "0-2,5" for the set units of `free` below `units` ("none" when there are none), appended to
// `out` without temporaries (a reason is written on every explained miss).
void AppendSliceList(std::string& out, SliceMask free, uint32_t units) {
  bool any = false;
  uint32_t i = 0;
  while (i < units) {
    if (((free >> i) & 1u) == 0) {
      ++i;
      continue;
    }
    uint32_t j = i;
    while (j + 1 < units && ((free >> (j + 1)) & 1u)) ++j;
    if (any) out += ',';
    any = true;
    AppendNumber(out, i);
    if (i != j) {
      out += '-';
      AppendNumber(out, j);
    }
    i = j + 1;
  }
  if (!any) out += "none";
}

}  // namespace

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kFits:
      return "fits";
    case Verdict::kFragmented:
      return "fragmented";
    case Verdict::kCapacityExhausted:
      return "capacity-exhausted";
    case Verdict::kNoProfileBigEnough:
      return "no-profile-big-enough";
    case Verdict::kNotAllowlisted:
      return "not-allowlisted";
    case Verdict::kFiltered:
      return "filtered";
    case Verdict::kGpuUnhealthy:
      return "gpu-unhealthy";
    case Verdict::kNoMigGpu:
      return "no-mig-gpu";
    case Verdict::kNodeUnhealthy:
      return "node-unhealthy";
  }
  return "unknown";
}

uint64_t ResolveMemory(uint64_t mib, uint32_t percent, const GpuCapability& cap) {
  if (mib > 0) return mib;
  const uint32_t pct = (percent == 0 || percent > 100) ? 100 : percent;
  const uint64_t full = cap.FullProfileMemory();
  return (full * pct + 99) / 100;
}

namespace {

// The capability's placement axis, checked: every placement within it, no more units or profiles
// than the planner's masks and counters hold, no empty placement.
absl::Status ValidateCapability(GpuCapability& capability) {
  uint32_t units = 0;
  for (const auto& p : capability.profiles) {
    for (const auto& pl : p.placements) units = std::max(units, pl.end());
  }
  if (capability.placement_units == 0) capability.placement_units = units;
  if (capability.placement_units < units) {
    return absl::InvalidArgumentError(
        fmt::format("{}: a placement ends at unit {}, beyond the {}-unit axis", capability.model,
                    units, capability.placement_units));
  }
  if (capability.placement_units > kMaxPlacementUnits) {
    return absl::InvalidArgumentError(fmt::format("{}: {} placement units (at most {} supported)",
                                                  capability.model, capability.placement_units,
                                                  kMaxPlacementUnits));
  }
  if (capability.profiles.size() > kMaxProfilesPerGpu) {
    return absl::InvalidArgumentError(fmt::format("{}: {} profiles (at most {} supported)",
                                                  capability.model, capability.profiles.size(),
                                                  kMaxProfilesPerGpu));
  }
  for (const auto& p : capability.profiles) {
    for (const auto& pl : p.placements) {
      if (pl.size == 0) {
        return absl::InvalidArgumentError(
            fmt::format("{}: profile {} has a placement of size 0", capability.model, p.name));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const GpuPlanner>> GpuPlanner::Create(
    GpuCapability capability, const std::vector<std::string>& allowed_names) {
  if (absl::Status valid = ValidateCapability(capability); !valid.ok()) return valid;
  std::shared_ptr<GpuPlanner> planner(new GpuPlanner());
  planner->capability_ = std::move(capability);
  planner->ResolveAllowed(allowed_names);
  planner->BuildClasses();
  planner->BuildScoreTables();
  planner->BuildInstanceBounds();
  planner->BuildSingleTable();
  return std::shared_ptr<const GpuPlanner>(std::move(planner));
}

void GpuPlanner::ResolveAllowed(const std::vector<std::string>& allowed_names) {
  const auto& profiles = capability_.profiles;
  allowed_flag_.assign(profiles.size(), false);
  for (uint32_t i = 0; i < profiles.size(); ++i) {
    if (std::find(allowed_names.begin(), allowed_names.end(), profiles[i].name) !=
            allowed_names.end() &&
        !profiles[i].placements.empty()) {
      allowed_.push_back(i);
      allowed_flag_[i] = true;
    }
  }
  std::sort(allowed_.begin(), allowed_.end(),
            [&](uint32_t a, uint32_t b) { return DefaultProfileLess(profiles[a], profiles[b]); });
  // Sizing memory by default-order position: what every decision compares a request with, read
  // from here instead of from the profile names.
  for (uint32_t idx : allowed_) allowed_memory_.push_back(profiles[idx].SizingMib());
}

void GpuPlanner::BuildClasses() {
  // Placement classes: allowlisted profiles with identical placement lists count once. Profiles
  // that the default order reaches (the first of each memory size) rank above those only a
  // preference reaches (4g.20gb behind 3g.20gb): protecting a placement nobody asks for by
  // default costs admissions (docs/design/0001-placement.md).
  const auto& profiles = capability_.profiles;
  uint64_t prev_memory = 0;
  bool first = true;
  for (size_t j = 0; j < allowed_.size(); ++j) {
    const auto& p = profiles[allowed_[j]];
    const bool reachable = first || allowed_memory_[j] > prev_memory;
    first = false;
    prev_memory = std::max(prev_memory, allowed_memory_[j]);
    std::vector<SliceMask> masks;
    for (const auto& pl : p.placements) masks.push_back(pl.Mask());
    std::sort(masks.begin(), masks.end());
    const uint32_t cap = std::min<uint32_t>(p.instance_count, masks.size());
    auto it = std::find_if(classes_.begin(), classes_.end(),
                           [&](const PlacementClass& c) { return c.masks == masks; });
    if (it == classes_.end()) {
      classes_.push_back({std::move(masks), cap, reachable});
    } else {
      it->cap = std::max(it->cap, cap);
      it->reachable = it->reachable || reachable;
    }
  }
  std::sort(classes_.begin(), classes_.end(), [](const PlacementClass& a, const PlacementClass& b) {
    if (a.reachable != b.reachable) return a.reachable;
    const int sa = std::popcount(a.masks.front());
    const int sb = std::popcount(b.masks.front());
    if (sa != sb) return sa > sb;
    if (a.masks.size() != b.masks.size()) return a.masks.size() < b.masks.size();
    return a.masks < b.masks;
  });
  // Within a class, masks in ascending start order for the greedy count.
  for (auto& c : classes_) {
    std::sort(c.masks.begin(), c.masks.end(),
              [](SliceMask a, SliceMask b) { return std::countr_zero(a) < std::countr_zero(b); });
  }
}

void GpuPlanner::BuildScoreTables() {
  const uint32_t units_axis = capability_.placement_units;
  if (units_axis > 16) return;
  const size_t n = size_t{1} << units_axis;
  // Ascending masks: Coverage(m) only reads smaller masks, already in the table.
  coverage_table_.reserve(n);
  for (size_t m = 0; m < n; ++m) {
    coverage_table_.push_back(static_cast<uint8_t>(Coverage(static_cast<SliceMask>(m))));
  }
  score_table_.resize(n);
  for (size_t m = 0; m < n; ++m) score_table_[m] = ComputeScore(static_cast<SliceMask>(m));
}

void GpuPlanner::BuildInstanceBounds() {
  const auto& profiles = capability_.profiles;
  for (uint32_t idx : allowed_) {
    for (const auto& pl : profiles[idx].placements) by_end_.push_back(pl);
  }
  std::sort(by_end_.begin(), by_end_.end(),
            [](const Placement& a, const Placement& b) { return a.end() < b.end(); });
  max_instances_ = MaxInstances(0);
  for (uint32_t idx : allowed_) {
    const auto& spec = profiles[idx];
    if (spec.instance_count < spec.placements.size()) count_limited_.push_back(idx);
  }
}

void GpuPlanner::BuildSingleTable() {
  const uint32_t units_axis = capability_.placement_units;
  if (units_axis > 16 || allowed_.empty()) return;
  const size_t n = size_t{1} << units_axis;
  const size_t k = allowed_.size();
  single_table_.resize(n * k);
  const GpuUsage empty;
  for (size_t m = 0; m < n; ++m) {
    for (size_t lo = 0; lo < k; ++lo) {
      PlannedInstance inst;
      if (SinglePlan(static_cast<SliceMask>(m), lo, empty, inst)) {
        single_table_[m * k + lo] = {1, static_cast<uint8_t>(inst.profile_index),
                                     static_cast<uint8_t>(inst.placement.start),
                                     static_cast<uint8_t>(inst.placement.size)};
      }
    }
  }
}

bool GpuPlanner::SinglePlan(SliceMask occupied, size_t first, const GpuUsage& usage,
                            PlannedInstance& out) const {
  // The first candidate (smallest profile) with a free placement wins; among its placements the
  // best fragmentation score, then the lowest start (NVML's order).
  const SliceMask full = FullMask(capability_.placement_units);
  for (size_t j = first; j < allowed_.size(); ++j) {
    const uint32_t idx = allowed_[j];
    const auto& spec = capability_.profiles[idx];
    if (usage.counts[idx] >= spec.instance_count) continue;
    bool found = false;
    uint64_t best_score = 0;
    for (const auto& pl : spec.placements) {
      const SliceMask m = pl.Mask();
      if (m & occupied) continue;
      const uint64_t score = FragmentationScore(full & ~(occupied | m));
      if (!found || score > best_score) {
        found = true;
        best_score = score;
        out = {idx, pl};
      }
    }
    if (found) return true;
  }
  return false;
}

GpuPlanner::SingleAnswer GpuPlanner::LookupSingle(const GpuUsage& usage, uint64_t memory_mib,
                                                  PlannedInstance& out, size_t& first) const {
  if (single_table_.empty()) return SingleAnswer::kNotApplicable;
  first = static_cast<size_t>(
      std::lower_bound(allowed_memory_.begin(), allowed_memory_.end(), memory_mib) -
      allowed_memory_.begin());
  if (first >= allowed_.size()) return SingleAnswer::kNoProfile;
  for (uint32_t idx : count_limited_) {
    if (usage.counts[idx] >= capability_.profiles[idx].instance_count) {
      return SingleAnswer::kNotApplicable;
    }
  }
  const SliceMask occupied = usage.occupied & FullMask(capability_.placement_units);
  const Single& s = single_table_[occupied * allowed_.size() + first];
  if (!s.ok) return SingleAnswer::kNoFit;
  out = {s.profile_index, Placement{s.start, s.size}};
  return SingleAnswer::kFits;
}

bool GpuPlanner::PlanSingle(const GpuUsage& usage, uint64_t memory_mib,
                            PlannedInstance& out) const {
  size_t first = 0;
  return LookupSingle(usage, memory_mib, out, first) == SingleAnswer::kFits;
}

Verdict GpuPlanner::SingleMissVerdict(const GpuUsage& usage, size_t first) const {
  // Explain's verdict for one instance whose candidates are allowed_[first..], without building
  // the candidate list.
  const SliceMask free = FullMask(capability_.placement_units) & ~usage.occupied;
  const uint32_t free_units = std::popcount(free);
  const uint32_t need = capability_.profiles[allowed_[first]].memory_slices;
  if (free_units < need) return Verdict::kCapacityExhausted;
  for (size_t j = first; j < allowed_.size(); ++j) {
    const uint32_t idx = allowed_[j];
    if (usage.counts[idx] < capability_.profiles[idx].instance_count) return Verdict::kFragmented;
  }
  return Verdict::kCapacityExhausted;  // every candidate at its instance limit
}

GpuPlan GpuPlanner::PlanWithoutTable(const GpuUsage& usage, uint64_t memory_mib) const {
  GpuPlan plan;
  std::vector<std::vector<uint32_t>> defaults(1);
  DefaultCandidates(memory_mib, defaults[0]);
  const uint64_t m[1] = {memory_mib};
  if (defaults[0].empty() || allowed_.empty()) return Plan(usage, m, {});
  if (SearchJoint(usage, defaults, plan.instances)) return plan;
  return Explain(usage, m, defaults, true);
}

uint32_t GpuPlanner::MaxInstances(SliceMask occupied) const {
  return DisjointPlacements(by_end_, occupied);
}

bool GpuPlanner::IsAllowed(uint32_t profile_index) const {
  return profile_index < allowed_flag_.size() && allowed_flag_[profile_index];
}

int GpuPlanner::ProfileIndex(std::string_view name) const {
  for (size_t i = 0; i < capability_.profiles.size(); ++i) {
    if (capability_.profiles[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

uint32_t GpuPlanner::Coverage(SliceMask free) const {
  // The most units that placements of default-reachable profiles can still fill. Placements
  // that start at the lowest free unit, or skipping it, cover every case.
  if (free == 0) return 0;
  if (!coverage_table_.empty() && free < coverage_table_.size()) return coverage_table_[free];
  const int low = std::countr_zero(free);
  const SliceMask rest = free & (free - 1);
  uint32_t best = Coverage(rest);
  for (const auto& c : classes_) {
    if (!c.reachable) continue;
    for (SliceMask m : c.masks) {
      if (std::countr_zero(m) == low && (m & free) == m) {
        best = std::max<uint32_t>(best, std::popcount(m) + Coverage(free & ~m));
      }
    }
  }
  return best;
}

uint64_t GpuPlanner::ComputeScore(SliceMask free) const {
  // 1. coverage: units still usable by the profiles requests resolve to (wasted units count
  //    against a choice, e.g. a 1g at slice 6 strands slice 7);
  // 2. the longest run of free units;
  // 3. per placement class, largest first, how many instances still fit (lexicographic).
  // All placements of one profile have the same size, so picking the earliest-starting placement
  // that fits is an optimal count of disjoint placements (interval scheduling).
  const uint32_t units = capability_.placement_units;
  uint32_t run = 0, longest = 0;
  for (uint32_t i = 0; i < units; ++i) {
    run = ((free >> i) & 1u) ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  uint64_t score = (uint64_t{std::min<uint32_t>(Coverage(free), 31)} << 5) | std::min(longest, 31u);
  size_t used = 0;
  for (const auto& c : classes_) {
    if (used == 13) break;
    SliceMask avail = free;
    uint32_t count = 0;
    for (SliceMask m : c.masks) {
      if (count >= c.cap) break;
      if ((m & avail) == m) {
        avail &= ~m;
        ++count;
      }
    }
    score = (score << 4) | std::min<uint32_t>(count, 15);
    ++used;
  }
  return score << (4 * (13 - used));
}

uint64_t GpuPlanner::FragmentationScore(SliceMask free) const {
  free &= FullMask(capability_.placement_units);
  if (!score_table_.empty()) return score_table_[free];
  return ComputeScore(free);
}

void GpuPlanner::DefaultCandidates(uint64_t memory, std::vector<uint32_t>& out) const {
  out.clear();
  for (size_t j = 0; j < allowed_.size(); ++j) {
    if (allowed_memory_[j] >= memory) out.push_back(allowed_[j]);
  }
}

void GpuPlanner::PreferredCandidates(uint64_t memory, const Preference& preference,
                                     std::vector<uint32_t>& out) const {
  out.clear();
  for (const auto& entry : preference.entries) {
    for (size_t j = 0; j < allowed_.size(); ++j) {
      const uint32_t idx = allowed_[j];
      const auto& p = capability_.profiles[idx];
      if (allowed_memory_[j] < memory || !PreferenceEntryMatches(entry, p.name)) continue;
      if (std::find(out.begin(), out.end(), idx) == out.end()) out.push_back(idx);
    }
  }
}

absl::StatusOr<GpuUsage> GpuPlanner::UsageOf(const std::vector<Reservation>& reservations) const {
  GpuUsage usage;
  for (const auto& r : reservations) {
    const int idx = ProfileIndex(r.profile);
    if (idx < 0) {
      return absl::InvalidArgumentError(
          fmt::format("{} has no MIG profile \"{}\"", capability_.model, r.profile));
    }
    const auto& spec = capability_.profiles[idx];
    if (!spec.IsLegal(r.placement)) {
      return absl::InvalidArgumentError(
          fmt::format("{} at start {} (size {}) is not a legal placement on {}", r.profile,
                      r.placement.start, r.placement.size, capability_.model));
    }
    if ((usage.occupied & r.placement.Mask()) != 0) {
      return absl::AlreadyExistsError(fmt::format("{} at slices {} overlaps another reservation",
                                                  r.profile, r.placement.ToString()));
    }
    if (usage.counts[idx] >= spec.instance_count) {
      return absl::ResourceExhaustedError(fmt::format("{} allows at most {} instance(s) of {}",
                                                      capability_.model, spec.instance_count,
                                                      r.profile));
    }
    usage.occupied |= r.placement.Mask();
    ++usage.counts[idx];
  }
  return usage;
}

// Depth-first search over one option per instance, minimizing the sum of candidate ranks, then
// maximizing the fragmentation score of what stays free.
struct GpuPlanner::Search {
  const GpuPlanner& planner;
  std::vector<std::vector<Option>> options;  // in search order
  std::vector<bool> symmetric;               // same candidates as the previous in search order
  std::vector<uint32_t> min_footprint_suffix;
  SliceMask full = 0;
  std::array<uint8_t, kMaxProfilesPerGpu> counts{};
  std::vector<size_t> picks;
  std::vector<size_t> best;
  uint32_t best_rank = UINT32_MAX;
  uint64_t best_score = 0;
  size_t nodes = 0;
  uint32_t best_idle = 0;  // picks on idle instances (warm instances), the last criterion
  uint32_t idle_hits = 0;

  void Run(size_t depth, SliceMask occupied, uint32_t rank_sum) {
    if (++nodes > kMaxSearchNodes) return;
    if (rank_sum > best_rank) return;
    if (depth == options.size()) {
      const uint64_t score = planner.FragmentationScore(full & ~occupied);
      if (rank_sum < best_rank || score > best_score ||
          (score == best_score && idle_hits > best_idle)) {
        best_rank = rank_sum;
        best_score = score;
        best_idle = idle_hits;
        best = picks;
      }
      return;
    }
    if (static_cast<uint32_t>(std::popcount(full & ~occupied)) < min_footprint_suffix[depth]) {
      return;
    }
    const auto& opts = options[depth];
    const size_t first = (depth > 0 && symmetric[depth]) ? picks[depth - 1] + 1 : 0;
    for (size_t k = first; k < opts.size(); ++k) {
      const Option& o = opts[k];
      if ((o.mask & occupied) != 0) continue;
      const auto& spec = planner.capability_.profiles[o.profile_index];
      if (counts[o.profile_index] >= spec.instance_count) continue;
      if (rank_sum + o.rank > best_rank) continue;
      ++counts[o.profile_index];
      picks[depth] = k;
      idle_hits += o.idle ? 1 : 0;
      Run(depth + 1, occupied | o.mask, rank_sum + o.rank);
      idle_hits -= o.idle ? 1 : 0;
      --counts[o.profile_index];
    }
  }
};

bool GpuPlanner::SearchJoint(const GpuUsage& usage,
                             const std::vector<std::vector<uint32_t>>& candidates,
                             std::vector<PlannedInstance>& out,
                             std::span<const PlannedInstance> idle) const {
  auto is_idle = [&](uint32_t idx, const Placement& pl) {
    for (const auto& i : idle) {
      if (i.profile_index == idx && i.placement == pl) return true;
    }
    return false;
  };
  const size_t n = candidates.size();
  const SliceMask full = FullMask(capability_.placement_units);
  std::vector<std::vector<Option>> opts(n);
  for (size_t i = 0; i < n; ++i) {
    for (size_t r = 0; r < candidates[i].size(); ++r) {
      const uint32_t idx = candidates[i][r];
      const auto& spec = capability_.profiles[idx];
      if (usage.counts[idx] >= spec.instance_count) continue;
      for (const auto& pl : spec.placements) {
        const SliceMask m = pl.Mask();
        if ((m & usage.occupied) == 0) {
          opts[i].push_back(
              {idx, static_cast<uint8_t>(std::min<size_t>(r, 255)), pl, m, is_idle(idx, pl)});
        }
      }
    }
    if (opts[i].empty()) return false;
  }

  if (n == 1) {
    // Fast path: the lowest rank with a free placement, then the best score, then lowest start.
    const Option* best = nullptr;
    uint64_t best_score = 0;
    for (const Option& o : opts[0]) {
      if (best != nullptr && o.rank > best->rank) break;
      const uint64_t score = FragmentationScore(full & ~(usage.occupied | o.mask));
      if (best == nullptr || score > best_score || (score == best_score && o.idle && !best->idle)) {
        best = &o;
        best_score = score;
      }
    }
    out.assign(1, {best->profile_index, best->placement});
    return true;
  }

  // Most constrained first; identical candidate lists adjacent so symmetry can be broken.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  auto footprint = [&](size_t i) {
    uint32_t f = UINT32_MAX;
    for (uint32_t idx : candidates[i]) f = std::min(f, capability_.profiles[idx].memory_slices);
    return f;
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (opts[a].size() != opts[b].size()) return opts[a].size() < opts[b].size();
    const uint32_t fa = footprint(a), fb = footprint(b);
    if (fa != fb) return fa > fb;
    return candidates[a] < candidates[b];
  });
  Search search{*this, {}, {}, {}, full, usage.counts, {}, {}, UINT32_MAX, 0, 0, 0, 0};
  search.options.reserve(n);
  for (size_t d = 0; d < n; ++d) {
    search.options.push_back(std::move(opts[order[d]]));
    search.symmetric.push_back(d > 0 && candidates[order[d]] == candidates[order[d - 1]]);
  }
  search.min_footprint_suffix.assign(n + 1, 0);
  for (size_t d = n; d-- > 0;) {
    search.min_footprint_suffix[d] = search.min_footprint_suffix[d + 1] + footprint(order[d]);
  }
  search.picks.assign(n, 0);
  search.Run(0, usage.occupied, 0);
  if (search.best.empty()) return false;
  out.assign(n, {});
  for (size_t d = 0; d < n; ++d) {
    const Option& o = search.options[d][search.best[d]];
    out[order[d]] = {o.profile_index, o.placement};
  }
  return true;
}

GpuPlan GpuPlanner::Explain(const GpuUsage& usage, std::span<const uint64_t> memories_mib,
                            const std::vector<std::vector<uint32_t>>& defaults,
                            bool explain) const {
  GpuPlan plan;
  const SliceMask full = FullMask(capability_.placement_units);
  const SliceMask free = full & ~usage.occupied;
  const uint32_t free_units = std::popcount(free);
  uint32_t need = 0;
  for (size_t i = 0; i < memories_mib.size(); ++i) {
    need += capability_.profiles[defaults[i].front()].memory_slices;
  }
  bool limited = false;
  if (free_units >= need) {
    // Enough slices: either fragmentation or an instance limit (e.g. one +me per GPU).
    for (size_t i = 0; i < memories_mib.size() && !limited; ++i) {
      limited = true;
      for (uint32_t idx : defaults[i]) {
        if (usage.counts[idx] < capability_.profiles[idx].instance_count) limited = false;
      }
    }
  }
  plan.verdict =
      (free_units < need || limited) ? Verdict::kCapacityExhausted : Verdict::kFragmented;
  if (!explain) return plan;
  std::vector<std::string> smallest;
  for (size_t i = 0; i < memories_mib.size(); ++i) {
    smallest.push_back(capability_.profiles[defaults[i].front()].name);
  }
  const std::string what =
      memories_mib.size() == 1
          ? smallest.front()
          : fmt::format("{} instances ({})", memories_mib.size(), fmt::join(smallest, ", "));
  plan.reason = MissReason(free, need, limited, what);
  return plan;
}

std::string GpuPlanner::MissReason(SliceMask free, uint32_t need, bool limited,
                                   std::string_view what) const {
  const uint32_t free_units = std::popcount(free);
  // Appended piece by piece: this text is written on every explained miss.
  std::string reason;
  reason.reserve(128);
  if (free_units < need) {
    reason += "capacity exhausted: ";
    reason += what;
    reason += " needs ";
    AppendNumber(reason, need);
    reason += " free slice(s), ";
    AppendNumber(reason, free_units);
    reason += " free (slices ";
    AppendSliceList(reason, free, capability_.placement_units);
    reason += ')';
  } else if (limited) {
    reason += "capacity exhausted: instance limit reached for ";
    reason += what;
  } else {
    reason += "fragmented: ";
    AppendNumber(reason, free_units);
    reason += " slice(s) free (slices ";
    AppendSliceList(reason, free, capability_.placement_units);
    reason += ") but no legal non-overlapping placement for ";
    reason += what;
  }
  return reason;
}

GpuPlan GpuPlanner::ExplainSingleMiss(const GpuUsage& usage, size_t first, bool explain) const {
  GpuPlan plan;
  plan.verdict = SingleMissVerdict(usage, first);
  if (!explain) return plan;
  const SliceMask free = FullMask(capability_.placement_units) & ~usage.occupied;
  const ProfileSpec& smallest = capability_.profiles[allowed_[first]];
  const bool limited = plan.verdict == Verdict::kCapacityExhausted &&
                       static_cast<uint32_t>(std::popcount(free)) >= smallest.memory_slices;
  plan.reason = MissReason(free, smallest.memory_slices, limited, smallest.name);
  return plan;
}

GpuPlan GpuPlanner::Plan(const GpuUsage& usage, std::span<const uint64_t> memories_mib,
                         const Preference& preference, bool explain,
                         std::span<const PlannedInstance> idle) const {
  GpuPlan plan;
  const size_t n = memories_mib.size();
  if (n == 0) return plan;
  if (n == 1 && preference.empty() && idle.empty()) {
    // The table answers; a miss needs no search either (the table equals the search whenever it
    // applies): its verdict and reason come from the usage alone.
    PlannedInstance inst;
    size_t first = 0;
    switch (LookupSingle(usage, memories_mib[0], inst, first)) {
      case SingleAnswer::kFits:
        plan.instances.push_back(inst);
        return plan;
      case SingleAnswer::kNoFit:
        return ExplainSingleMiss(usage, first, explain);
      case SingleAnswer::kNoProfile:
        if (explain) break;
        plan.verdict = Verdict::kNoProfileBigEnough;
        return plan;
      case SingleAnswer::kNotApplicable:
        break;  // the general path decides
    }
  }
  if (allowed_.empty()) {
    plan.verdict = Verdict::kNotAllowlisted;
    if (explain) plan.reason = fmt::format("no allowlisted MIG profile for {}", capability_.model);
    return plan;
  }
  if (n > max_instances_) {
    // Never fits, whatever is free: refused before any per-instance work.
    plan.verdict = Verdict::kCapacityExhausted;
    if (explain) {
      plan.reason = fmt::format(
          "capacity exhausted: {} instances asked; {} holds at most {} MIG instances of its "
          "allowlisted profiles",
          n, capability_.model, max_instances_);
    }
    return plan;
  }
  std::vector<std::vector<uint32_t>> defaults(n);
  for (size_t i = 0; i < n; ++i) {
    DefaultCandidates(memories_mib[i], defaults[i]);
    if (defaults[i].empty()) {
      plan.verdict = Verdict::kNoProfileBigEnough;
      if (!explain) return plan;
      const auto& largest =
          *std::max_element(allowed_.begin(), allowed_.end(), [&](uint32_t a, uint32_t b) {
            return capability_.profiles[a].SizingMib() < capability_.profiles[b].SizingMib();
          });
      const auto& big = capability_.profiles[largest];
      plan.verdict = Verdict::kNoProfileBigEnough;
      plan.reason = fmt::format(
          "no allowlisted profile on {} covers {} MiB; the largest is {} ({} MiB{})",
          capability_.model, memories_mib[i], big.name, big.SizingMib(),
          big.SizingMib() == big.memory_mib ? "" : fmt::format(", {} MiB in NVML", big.memory_mib));
      return plan;
    }
  }
  if (!preference.empty()) {
    std::vector<std::vector<uint32_t>> preferred(n);
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      PreferredCandidates(memories_mib[i], preference, preferred[i]);
      if (preferred[i].empty()) {
        preferred[i] = defaults[i];
      } else {
        any = true;
      }
    }
    if (any && SearchJoint(usage, preferred, plan.instances, idle)) {
      plan.used_preference = true;
      return plan;
    }
  }
  if (SearchJoint(usage, defaults, plan.instances, idle)) return plan;
  plan.instances.clear();
  return Explain(usage, memories_mib, defaults, explain);
}

}  // namespace dynmig::mig
