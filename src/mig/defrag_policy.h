// The defragmenter's rules (docs/scheduler.md, "Defragmenter"): which pods it may evict, which
// plan it chooses, which waiting pod it serves first, and its rate limits. Pure: the scheduler's
// defragmenter (scheduler/defragmenter.h) and `dynmig defrag --apply` gather the facts from the
// API objects and apply these rules; tests check them one by one.
//
// A pod is never evicted when (EvictionRefusal):
//   - it opted out (dynmig.io/defrag: never) or its dynmig.io/defrag value is unreadable;
//   - it runs in a system namespace (kube-system, kube-public, kube-node-lease, dynmig's own);
//   - no controller owns it (nothing would recreate it);
//   - it is terminating already;
//   - a PodDisruptionBudget that selects it allows no disruption now, or more than one selects it
//     (the Eviction API refuses such a pod).
// A plan (the pods one placement would move, mig::PlanEviction) is refused when it takes more pods
// of one PodDisruptionBudget than the budget allows. Among the plans left: the fewest pods, then
// the lowest highest priority among them, then the youngest oldest pod (the plan whose pods have
// run the shortest), then the most pods that opted in (dynmig.io/defrag: allow), then the fewest
// slices moved.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "mig/defrag.h"
#include "mig/request.h"

namespace dynmig::mig {

// What the rules need to know of one pod holding slices.
struct MovablePod {
  std::string key;  // namespace/name
  std::string ns;
  int32_t priority = 0;
  int64_t created = 0;  // unix seconds
  bool opted_in = false;
  bool opted_out = false;
  std::string opt_error;  // dynmig.io/defrag could not be read ("" when fine or absent)
  bool has_controller = false;
  bool terminating = false;
  std::vector<std::string> pdbs;  // keys (namespace/name) of the budgets that select it
};

struct DefragRules {
  std::set<std::string> system_namespaces = {"kube-system", "kube-public", "kube-node-lease",
                                             "dynmig-system"};
  // Budget key -> status.disruptionsAllowed now.
  std::map<std::string, int64_t> pdb_allowed;
};

// "" when the pod may be evicted, else why not (for events and the plan's text).
std::string EvictionRefusal(const MovablePod& pod, const DefragRules& rules);

// The first allowlisted profile (in the planner's default order) whose sizing memory covers the
// request's per-instance memory; -1 when none.
int CoveringProfile(const GpuPlanner& planner, const MemoryRequest& memory);

// The chosen plan of a defragmentation: where, what moves, and why other pods were left alone.
struct DefragChoice {
  size_t gpu = 0;  // index into the input GPUs
  EvictionPlan plan;
  std::map<std::string, std::string> refused;  // pods of that GPU left in place, with the reason
};

// Plans ChooseDefragPlan returns beyond the best one (one per further GPU): the caller tries them
// in order when the best plan's pods cannot run elsewhere (simulated: trying only the best plan
// closes about 75 % of the gap, trying further plans over 97 %; docs/simulate.md).
inline constexpr size_t kMaxDefragAlternatives = 16;

struct DefragDecision {
  std::optional<DefragChoice> choice;  // nullopt: no plan under the rules
  // Further plans, on other GPUs, in the same order as the choice (at most
  // kMaxDefragAlternatives).
  std::vector<DefragChoice> alternatives;
  // Why no plan (or why each GPU offered none), for events and explain.
  std::vector<std::string> reasons;
};

// The least disruptive plan that frees one instance of `profile_query` on one GPU, under the
// rules. `pods` holds the facts of every pod that has reservations on the GPUs (a reservation
// whose owner is missing from `pods` is treated as pinned). When the profile fits now on some GPU
// there is no plan at all (nothing to move: the waiting pod does not wait because of
// fragmentation).
DefragDecision ChooseDefragPlan(std::span<const DefragGpu> gpus, std::string_view profile_query,
                                const std::map<std::string, MovablePod>& pods,
                                const DefragRules& rules);

// A pod waiting for slices.
struct WaitingPod {
  std::string key;
  int32_t priority = 0;
  int64_t pending_since = 0;  // unix seconds (creation, or its last unschedulable condition)
};

// Indices of the pods that have waited at least `threshold_s` at `now`, served first: the highest
// priority, then the longest waiting, then by key.
std::vector<size_t> DueWaitingPods(std::span<const WaitingPod> pods, int64_t now,
                                   int64_t threshold_s);

// Evictions already made, for the rate limits.
struct EvictionRecord {
  int64_t at = 0;  // unix seconds
  std::string node;
  std::string ns;
};
struct EvictionLimits {
  int64_t per_node_per_hour = 4;       // 0: no evictions at all
  int64_t per_namespace_per_hour = 4;  // 0: no evictions at all
};

// Trunk reservation for moves (--defrag-headroom): "" when, once a pod asking `asked` units runs,
// at least `percent` of the `total` placement units of the schedulable GPUs stay free (`used`
// units are reserved or held now; the moved pods take as many elsewhere as they free); else how
// far from it the cluster is. `percent` 0: no such rule. KeepsHeadroom: the same test without the
// message (the simulator's loop).
bool KeepsHeadroom(uint64_t total, uint64_t used, uint64_t asked, uint32_t percent);
std::string HeadroomRefusal(uint64_t total, uint64_t used, uint64_t asked, uint32_t percent);

// "" when evicting `pods` (namespace of each) on `node` at `now` stays within the limits counting
// the records of the last hour, else which limit it would break.
std::string RateLimitRefusal(std::span<const EvictionRecord> history, int64_t now,
                             const EvictionLimits& limits, const std::string& node,
                             std::span<const std::string> namespaces);

}  // namespace dynmig::mig
