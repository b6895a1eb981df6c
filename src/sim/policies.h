// Placement policies compared by `dynmig simulate`, all on the same compact cluster state.
//
//   dynmig               the production planner: mig::PlanPod / mig::PlanPodOnNode over NodeViews,
//                        exactly as the scheduler extender calls it (default pod annotations:
//                        GPU spread, node binpack); "dynmig:gpu-binpack", "dynmig:node-spread"
//                        (joined with '+') change the pod's policies; "binds-in-flight-N" marks
//                        the nodes of the last N placements as having a bind in flight (a burst:
//                        the planner chooses them last among equally good nodes); "warm" keeps
//                        the instances of ended pods idle for reuse as the device plugin does
//                        with nvidia.migWarmInstances (WarmConfig: TTL, per-GPU cap), and gives
//                        the planner each GPU's idle instances;
//   hami-v2.10           HAMi v2.10's documented order: node binpack by HAMi's node score, GPUs in
//                        spread order, smallest covering profile with a free placement, placements
//                        by start descending for 1g./3g. profiles and ascending otherwise, first
//                        non-overlapping one wins;
//   first-fit            first GPU (node order) where a covering profile fits, lowest free start;
//   best-fit             the GPU with the fewest free slices where it fits, lowest free start;
//   static:all-<x>       fixed geometries as NVIDIA MIG Manager applies them: a pod takes an idle
//                        pre-made instance of a covering profile (smallest first);
//   hami-newest          HAMi's placement after PR #2855: the same node and GPU order as
//                        hami-v2.10, but per GPU the free placement of the smallest covering
//                        profile that leaves the largest free run, then the most legal
//                        placements free, then the lowest start;
//   repack               a GPU accepts any multiset of instances with SOME legal layout (running
//                        instances move freely inside their GPU); best-fit GPU choice.
// "dynmig:defrag" (DefragConfig) is dynmig plus the defragmenter: the simulator evicts running
// pods so that a pod that fits nowhere now fits, when the evicted pods fit elsewhere at once
// (sim/defrag.h).
// Every policy checks its invariants on every change (legal placements, no overlap, instance
// limits) and reports a violation as an error that aborts the run. Thread-compatible.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "protocol/device_config.h"
#include "sim/cluster.h"
#include "sim/trace.h"

namespace dynmig::sim {

// A pod as the simulator runs it.
struct SimPod {
  double arrival = 0;
  double departure = 0;
  uint32_t count = 1;
  uint32_t percent = 100;
  uint32_t cls = 0;          // request class: index of (count, percent) among the trace's pods
  uint32_t inst_offset = 0;  // first of its `count` slots in per-instance storage
  uint32_t asked_units = 0;  // Cluster::AskedUnits(count, percent)
  uint32_t line = 0;
  DefragChoice defrag = DefragChoice::kDefault;  // may the defragmenter move it
};

// One live GPU instance, for checks and dumps.
struct LiveInstance {
  uint32_t pod = 0;
  uint32_t gpu = 0;
  uint32_t profile = 0;  // index into the GPU model's capability profiles
  mig::Placement placement;
};

// Warm instances (the device plugin's nvidia.migWarmInstances) for the policies that model them;
// defaults and limits are device-config.yaml's (protocol::WarmInstances).
struct WarmConfig {
  // An instance idle this long is destroyed.
  absl::Duration ttl = protocol::WarmInstances{}.ttl;
  // Idle instances a GPU keeps; beyond, the ended pod's instance is destroyed as without warm
  // instances.
  uint32_t max_per_gpu = protocol::WarmInstances{}.max_per_gpu;
};
// "TTL,MAX_PER_GPU" (e.g. "5m,2"; the limits of device-config.yaml).
absl::StatusOr<WarmConfig> ParseWarmConfig(std::string_view text);
std::string WarmConfigText(const WarmConfig& warm);  // "5m,2"

// The defragmenter of "dynmig:defrag" (options in the policy spec, docs/simulate.md). Limits:
// ParseDefragOption.
struct DefragConfig {
  double wait_s = 60;          // a pod waits this long for fragmentation before pods are moved
  double grace_s = 30;         // an evicted pod terminates this long after its eviction
  double restart_s = 120;      // an evicted pod, placed again, runs this long later
  uint32_t per_node_hour = 4;  // evictions per node in any hour
  // When a waiting pod is looked at for moves (the trigger).
  enum class Trigger {
    // It fits nowhere now: any GPU's plan may serve it, provided its evicted pods are placed
    // elsewhere at once (the scheduler's defragmenter, Defragmenter::Serve). The default.
    kWaiting,
    // Only the planner's per-GPU verdict "fragmented" (some GPU has the free slices, no legal
    // placement of them is free; what `dynmig explain` says): "per-gpu", for comparison.
    kFragmented,
    // "fragmented", or some node has the pod's slices free in total over its GPUs:
    // "node-total", for comparison.
    kNodeTotal,
  };
  Trigger trigger = Trigger::kWaiting;
  // The plans (best first, by the defragmenter's order) whose evicted pods are tried elsewhere;
  // the first whose pods all fit is taken. 0: every plan (the default); "tries-N" for N.
  uint32_t plans_tried = 0;
  // A plan may evict at most this many pods ("evict-N"; 0: no cap).
  uint32_t max_evicted = 0;
  // Moves only when every evicted pod would be placed again at once ("any-move" turns it off).
  bool moved_must_fit = true;
  // No move while a pod asking for more instances than the waiting one waits ("big-first"), for
  // comparison (docs/simulate.md).
  bool bigger_first = false;
  // Moves only while the cluster keeps this share of its placement units free once the waiting pod
  // runs ("headroom-N", N percent; "headroom-0": no such rule): trunk reservation, the small pods'
  // room kept under load. The scheduler's --defrag-headroom, with its default.
  uint32_t headroom_pct = 1;
  // An oracle, for comparison ("gain"): a move only when the waiting pod's slice-time (asked
  // slices x lifetime) exceeds what the evicted pods lose (asked slices x (grace + restart), at
  // most their time left). The simulator knows lifetimes; the scheduler's defragmenter does not.
  bool gain = false;
};
// Applies one "dynmig:" option of the defragmenter with a value ("wait-90s", "grace-30s",
// "restart-2m", "rate-4", "tries-8", "evict-2", "headroom-10"); false when `opt` is not one;
// kInvalidArgument when its value is bad.
absl::StatusOr<bool> ParseDefragOption(std::string_view opt, DefragConfig& config);

// What warm instances did in one run (all zero for a policy without them).
struct WarmStats {
  bool enabled = false;
  uint64_t kept = 0;              // instances of ended pods kept idle
  uint64_t reused = 0;            // idle instances a pod was placed on exactly (nothing created)
  uint64_t destroyed_ttl = 0;     // idle instances destroyed after the TTL
  uint64_t destroyed_cap = 0;     // ended pods' instances destroyed because the GPU was at its cap
  uint64_t destroyed_needed = 0;  // idle instances destroyed because a placement overlapped them
  uint64_t idle_at_end = 0;       // still idle at the end of the horizon
};

class Policy {
 public:
  virtual ~Policy() = default;
  const std::string& name() const { return name_; }

  // Places `pod` on any node (node < 0) or only on `node`. false: it does not fit. An error means
  // an invariant broke (the simulation must stop).
  virtual absl::StatusOr<bool> Place(uint32_t pod, int32_t node) = 0;
  // Releases a placed pod's instances.
  virtual absl::Status Remove(uint32_t pod) = 0;
  // Over all GPUs: `free` placement units, and `stranded` free units that cannot host a request
  // of `percent` (no covering profile could be placed there).
  virtual void Fragmentation(uint32_t percent, uint64_t& free, uint64_t& stranded) const = 0;
  // The node a placed pod runs on.
  virtual uint32_t NodeOf(uint32_t pod) const = 0;
  // Every live instance (slow; for tests and dumps).
  virtual std::vector<LiveInstance> Snapshot() const = 0;
  // The GPUs of a placed pod's instances, one per instance (empty when it is not placed or the
  // policy does not say).
  virtual std::vector<uint32_t> GpusOf(uint32_t /*pod*/) const { return {}; }
  // Every idle (warm) instance; `pod` is the last pod that had it (tests and dumps).
  virtual std::vector<LiveInstance> IdleSnapshot() const { return {}; }
  // Simulated time moves to `seconds` (never backwards): warm instances idle past their TTL are
  // destroyed. Called before every event.
  virtual void AdvanceTo(double /*seconds*/) {}
  const WarmStats& warm() const { return warm_; }

  // The defragmenter (null: the policy does not move pods).
  virtual const DefragConfig* defrag() const { return nullptr; }
  // Whether the defragmenter looks for a move for `pod` now, by its trigger
  // (DefragConfig::trigger): it fits nowhere now, and for the comparison triggers only because of
  // fragmentation.
  virtual bool MayMoveFor(uint32_t /*pod*/) { return false; }
  // Places a one-instance pod exactly there (a move's freed slices). An error when that breaks
  // an invariant or the policy cannot.
  virtual absl::Status PlaceExactly(uint32_t pod, uint32_t gpu, uint32_t profile,
                                    mig::Placement placement);
  // Reserves `placement` of `gpu` for `pod`: no other pod may be placed over it until Unreserve.
  virtual absl::Status Reserve(uint32_t pod, uint32_t gpu, mig::Placement placement);
  virtual void Unreserve(uint32_t /*gpu*/, mig::Placement /*placement*/) {}
  // Whether the pods `evict`, evicted so that `placement` of `gpu` is free (and reserved), would
  // each be placed again at once by this policy (one after the other; nothing changes here).
  virtual bool MovedPodsFit(const std::vector<uint32_t>& /*evict*/, uint32_t /*gpu*/,
                            mig::Placement /*placement*/) {
    return false;
  }

  uint64_t used_units() const { return used_units_; }
  uint64_t creates() const { return creates_; }    // GPU instances created
  uint64_t destroys() const { return destroys_; }  // GPU instances destroyed

 protected:
  Policy(std::string name, const Cluster& cluster, const std::vector<SimPod>& pods)
      : name_(std::move(name)), cluster_(cluster), pods_(pods) {}
  absl::Status Violation(uint32_t pod, const std::string& what) const;

  std::string name_;
  const Cluster& cluster_;
  const std::vector<SimPod>& pods_;
  uint64_t used_units_ = 0;
  uint64_t creates_ = 0;
  uint64_t destroys_ = 0;
  WarmStats warm_;
};

// The policy names MakePolicy knows, in the default order.
std::vector<std::string> DefaultPolicies();

// `pods` must outlive the policy; instance slots are sized from it. `warm` configures the
// policies with warm instances ("dynmig:warm").
absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(std::string_view spec, const Cluster& cluster,
                                                   const std::vector<SimPod>& pods,
                                                   const WarmConfig& warm = {});

}  // namespace dynmig::sim
