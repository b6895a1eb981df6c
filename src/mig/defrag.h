// Defragmentation analysis: the fewest reservation owners (pods) that would have to move so that
// one instance of a profile fits, on one GPU and across GPUs. Analysis only: nothing here moves
// anything (the defragmenter, scheduler/defragmenter.h, carries plans out).
//
// On one GPU, an instance of the profile fits at a legal placement P when no reservation overlaps
// P and the profile's instance limit leaves room. For each legal P the owners that must go are
// forced: every owner with a reservation overlapping P (a pod moves as a whole, so all its
// reservations on the GPU leave with it), plus, when the profile is at its instance limit, owners
// of other instances of that profile (the ones holding the most instances first). The answer is the
// placement with the fewest owners; ties go to the fewest placement units moved, then to the best
// fragmentation score of what is left free, then to the lowest start. The owner count is exact;
// with an instance limit to relieve, the units tie-break is best effort (greedy).
//
// Reservations with an empty owner are pinned: they cannot move (their slices never count as
// freeable). Pure; thread-compatible.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "mig/occupancy.h"
#include "mig/planner.h"

namespace dynmig::mig {

// What must leave one GPU so that one instance of `profile` fits there.
struct EvictionPlan {
  bool feasible = false;
  std::string profile;              // the exact profile name on this GPU
  Placement placement;              // where the instance would go
  std::vector<std::string> owners;  // owners that must move, sorted
  std::vector<Reservation> moved;   // their reservations on this GPU, by start
  uint32_t units_moved = 0;         // placement units those reservations cover
  std::vector<int64_t> rank;        // the OwnerJudge's rank of the owners (empty without one)
  std::string reason;               // why it is infeasible (empty when feasible)

  bool fits_now() const { return feasible && owners.empty(); }
};

// The profile `query` names on this GPU: an exact allowlisted profile name, or a slice class
// ("3g": the first allowlisted profile of that class in the default order). -1 when none.
int ResolveDefragProfile(const GpuPlanner& planner, std::string_view query);

// Judges one set of owners a placement would move (the defragmenter's rules, defrag_policy.h):
// nullopt refuses the set (the placement is skipped; `why` says why), else a rank compared after
// the owner count and before the units moved (lower is better).
struct OwnerJudge {
  std::function<std::optional<std::vector<int64_t>>(const std::set<std::string>& owners,
                                                    std::string& why)>
      judge;
};

// The minimal eviction on one GPU. An infeasible plan says why: the GPU has no such profile, the
// profile is not allowlisted there, or pinned reservations block every placement. Errors:
// kInvalidArgument when `reservations` are not a valid usage of the GPU (unknown profile, illegal
// placement, overlap): such a GPU is unhealthy, the scheduler does not place on it. With `judge`,
// sets of owners it refuses are skipped and its rank breaks ties between equal owner counts.
absl::StatusOr<EvictionPlan> PlanEviction(const GpuPlanner& planner,
                                          const std::vector<Reservation>& reservations,
                                          std::string_view profile_query,
                                          const OwnerJudge* judge = nullptr);

// One GPU of the cluster for the cross-GPU analysis.
struct DefragGpu {
  std::string node;
  std::string uuid;
  uint32_t index = 0;
  const GpuPlanner* planner = nullptr;  // null: no allowlisted MIG capability
  bool healthy = true;
  std::string unhealthy_reason;
  std::vector<Reservation> reservations;
};

struct DefragCandidate {
  size_t gpu = 0;  // index into the input
  EvictionPlan plan;
};

struct DefragResult {
  // Feasible plans, best first: fewest owners, then fewest units moved, then input order.
  std::vector<DefragCandidate> ranked;
  // GPUs that cannot take the profile even after evictions, with the reason.
  std::vector<std::pair<size_t, std::string>> skipped;

  const DefragCandidate* best() const { return ranked.empty() ? nullptr : &ranked.front(); }
};

// Runs PlanEviction on every healthy GPU and ranks the feasible plans.
DefragResult PlanDefrag(std::span<const DefragGpu> gpus, std::string_view profile_query);

}  // namespace dynmig::mig
