#include "mig/defrag.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "fmt/format.h"

namespace dynmig::mig {

int ResolveDefragProfile(const GpuPlanner& planner, std::string_view query) {
  const auto& profiles = planner.capability().profiles;
  if (query.find('.') != std::string_view::npos) {
    const int idx = planner.ProfileIndex(query);
    return (idx >= 0 && planner.IsAllowed(static_cast<uint32_t>(idx))) ? idx : -1;
  }
  for (uint32_t idx : planner.allowed()) {  // default order: smallest of the class first
    if (SliceClass(profiles[idx].name) == query) return static_cast<int>(idx);
  }
  return -1;
}

namespace {

// Why no profile resolves for the query: it exists but is not allowlisted, or the model lacks it.
std::string UnresolvedReason(const GpuPlanner& planner, std::string_view profile_query) {
  const GpuCapability& cap = planner.capability();
  const bool is_class = profile_query.find('.') == std::string_view::npos;
  const int any = is_class ? -1 : planner.ProfileIndex(profile_query);
  bool class_exists = false;
  if (is_class) {
    for (const auto& p : cap.profiles) class_exists |= SliceClass(p.name) == profile_query;
  }
  if (any >= 0 || class_exists) {
    return fmt::format("{} is not allowlisted on {}", profile_query, cap.model);
  }
  return fmt::format("{} offers no {} profile", cap.model, profile_query);
}

// Per owner: its reservations on this GPU, the units they cover, its instances of the profile.
struct OwnerInfo {
  std::vector<const Reservation*> held;
  uint32_t units = 0;
  uint32_t of_profile = 0;
};

// The GPU's reservations grouped by owner, for one target profile; reservations without an owner
// cannot move (pinned).
struct Owners {
  std::map<std::string, OwnerInfo> by_name;
  uint32_t pinned_of_profile = 0;  // instances of the profile that cannot move

  Owners(const std::vector<Reservation>& reservations, const std::string& profile) {
    for (const auto& r : reservations) {
      if (r.owner.empty()) {
        if (r.profile == profile) ++pinned_of_profile;
        continue;
      }
      OwnerInfo& o = by_name[r.owner];
      o.held.push_back(&r);
      o.units += r.placement.size;
      if (r.profile == profile) ++o.of_profile;
    }
  }

  // Adds to `chosen` the owners of other instances of the profile (most instances first, then
  // fewest units, then name) until fewer than `limit` remain. False when the pinned ones alone
  // reach it.
  bool RelieveLimit(std::set<std::string>& chosen, uint32_t limit) const {
    uint32_t remaining = pinned_of_profile;
    for (const auto& [name, o] : by_name) {
      if (!chosen.count(name)) remaining += o.of_profile;
    }
    if (remaining < limit) return true;
    std::vector<std::pair<std::string, const OwnerInfo*>> extra;
    for (const auto& [name, o] : by_name) {
      if (!chosen.count(name) && o.of_profile > 0) extra.emplace_back(name, &o);
    }
    std::sort(extra.begin(), extra.end(), [](const auto& a, const auto& b) {
      if (a.second->of_profile != b.second->of_profile) {
        return a.second->of_profile > b.second->of_profile;
      }
      if (a.second->units != b.second->units) return a.second->units < b.second->units;
      return a.first < b.first;
    });
    for (const auto& [name, o] : extra) {
      if (remaining < limit) break;
      chosen.insert(name);
      remaining -= o->of_profile;
    }
    return remaining < limit;
  }
};

// The owners whose reservations overlap `p`; false when a pinned reservation does.
bool OverlappingOwners(const std::vector<Reservation>& reservations, const Placement& p,
                       std::set<std::string>& chosen) {
  for (const auto& r : reservations) {
    if (!r.placement.Overlaps(p)) continue;
    if (r.owner.empty()) return false;
    chosen.insert(r.owner);
  }
  return true;
}

}  // namespace

absl::StatusOr<EvictionPlan> PlanEviction(const GpuPlanner& planner,
                                          const std::vector<Reservation>& reservations,
                                          std::string_view profile_query, const OwnerJudge* judge) {
  auto usage = planner.UsageOf(reservations);
  if (!usage.ok()) {
    return absl::InvalidArgumentError(fmt::format("the GPU's reservations are inconsistent: {}",
                                                  std::string(usage.status().message())));
  }
  const GpuCapability& cap = planner.capability();
  EvictionPlan result;
  const int idx = ResolveDefragProfile(planner, profile_query);
  if (idx < 0) {
    result.reason = UnresolvedReason(planner, profile_query);
    return result;
  }
  const ProfileSpec& spec = cap.profiles[idx];
  result.profile = spec.name;
  const uint32_t limit =
      spec.instance_count > 0 ? spec.instance_count : static_cast<uint32_t>(spec.placements.size());
  const Owners owners(reservations, spec.name);

  // owners, the judge's rank, units, -score, start
  using Cost = std::tuple<size_t, std::vector<int64_t>, uint32_t, uint64_t, uint32_t>;
  bool found = false;
  Cost best{};
  std::string last_reason;
  for (const Placement& p : spec.placements) {
    std::set<std::string> chosen;
    if (!OverlappingOwners(reservations, p, chosen)) {
      last_reason = fmt::format("reservations that cannot move cover slices {}", p.ToString());
      continue;
    }
    if (!owners.RelieveLimit(chosen, limit)) {
      last_reason = fmt::format(
          "{} is at its limit of {} instances, held by reservations that "
          "cannot move",
          spec.name, limit);
      continue;
    }
    std::vector<int64_t> rank;
    if (judge != nullptr && judge->judge && !chosen.empty()) {
      std::string why;
      auto judged = judge->judge(chosen, why);
      if (!judged.has_value()) {
        last_reason = fmt::format("slices {}: {}", p.ToString(), why);
        continue;
      }
      rank = std::move(*judged);
    }
    uint32_t units = 0;
    SliceMask freed = 0;
    for (const auto& name : chosen) {
      const OwnerInfo& o = owners.by_name.at(name);
      units += o.units;
      for (const Reservation* r : o.held) freed |= r->placement.Mask();
    }
    const SliceMask occupied = ((usage->occupied & ~freed) | p.Mask());
    const uint64_t score = planner.FragmentationScore(FullMask(planner.units()) & ~occupied);
    Cost cost{chosen.size(), rank, units, ~score, p.start};
    if (found && !(cost < best)) continue;
    found = true;
    best = std::move(cost);
    result.placement = p;
    result.owners.assign(chosen.begin(), chosen.end());
  }
  if (!found) {
    result.reason = last_reason.empty()
                        ? fmt::format("{} has no legal placement on {}", spec.name, cap.model)
                        : last_reason;
    return result;
  }
  result.feasible = true;
  result.rank = std::get<1>(best);
  for (const auto& name : result.owners) {
    for (const Reservation* r : owners.by_name.at(name).held) {
      result.moved.push_back(*r);
      result.units_moved += r->placement.size;
    }
  }
  std::sort(result.moved.begin(), result.moved.end(),
            [](const Reservation& a, const Reservation& b) { return a.placement < b.placement; });
  return result;
}

DefragResult PlanDefrag(std::span<const DefragGpu> gpus, std::string_view profile_query) {
  DefragResult result;
  for (size_t i = 0; i < gpus.size(); ++i) {
    const DefragGpu& gpu = gpus[i];
    if (gpu.planner == nullptr) {
      result.skipped.emplace_back(i, "no allowlisted MIG capability");
      continue;
    }
    if (!gpu.healthy) {
      result.skipped.emplace_back(i, "unhealthy: " + gpu.unhealthy_reason);
      continue;
    }
    auto plan = PlanEviction(*gpu.planner, gpu.reservations, profile_query);
    if (!plan.ok()) {
      result.skipped.emplace_back(i, std::string(plan.status().message()));
      continue;
    }
    if (!plan->feasible) {
      result.skipped.emplace_back(i, plan->reason);
      continue;
    }
    result.ranked.push_back({i, std::move(*plan)});
  }
  std::stable_sort(result.ranked.begin(), result.ranked.end(),
                   [](const DefragCandidate& a, const DefragCandidate& b) {
                     if (a.plan.owners.size() != b.plan.owners.size()) {
                       return a.plan.owners.size() < b.plan.owners.size();
                     }
                     return a.plan.units_moved < b.plan.units_moved;
                   });
  return result;
}

}  // namespace dynmig::mig
