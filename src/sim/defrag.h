// The moves of "dynmig:defrag": which running pods the defragmenter evicts so that a pod that fits
// nowhere now fits, by the defragmenter's rules on the pure planner
// mig::PlanDefrag (the fewest pods on one GPU; then, among plans of that size, the most pods that
// opted in, the youngest pods, the fewest slices moved; never an opted-out pod, a pod already
// terminating, or slices reserved for another waiting pod; within each node's eviction budget).
// One instance: a pod asking for several instances is not served by moves. Pure;
// thread-compatible.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "mig/placement.h"
#include "sim/cluster.h"
#include "sim/policies.h"

namespace dynmig::sim {

// Slices held for a waiting pod (a move in progress): nobody may be moved into them.
struct HeldSlices {
  uint32_t gpu = 0;
  uint32_t profile = 0;
  mig::Placement placement;
};

struct MoveInput {
  const Cluster* cluster = nullptr;
  const std::vector<SimPod>* pods = nullptr;
  std::vector<LiveInstance> live;                 // every live instance (Policy::Snapshot)
  std::span<const uint8_t> pinned;                // per pod: may not move now (already terminating)
  std::span<const double> started;                // per pod: when it last started running
  std::vector<HeldSlices> held;                   // reservations of moves in progress
  std::function<uint32_t(uint32_t node)> budget;  // evictions the node may still take
  // A plan is considered only if this allows it (the rules on its size; cheap); null: any plan.
  std::function<bool(const struct MovePlan&)> allow;
  // A plan is taken only if this accepts it (e.g. every moved pod fits elsewhere at once); null:
  // any plan.
  std::function<bool(const struct MovePlan&)> accept;
  uint32_t tries = 0;  // `accept` is asked about this many allowed plans at most; 0: all
};

struct MovePlan {
  uint32_t gpu = 0;
  uint32_t profile = 0;  // index into the GPU model's capability profiles
  mig::Placement placement;
  std::vector<uint32_t> evict;  // pods to evict, ascending; empty: it fits there now
};

// The least disruptive allowed move that frees a placement of the smallest covering profile of
// `pod` (one instance); nullopt when none is allowed. `accept` is asked about the best `tries`
// allowed plans at most (every one when 0).
std::optional<MovePlan> PlanMove(const MoveInput& in, uint32_t pod);

}  // namespace dynmig::sim
