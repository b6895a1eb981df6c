// `dynmig defrag --for PROFILE`: the fewest pods whose move would let PROFILE fit, across the
// cluster's GPUs (mig::PlanDefrag on the scheduler's view), and whether each of those pods could be
// placed elsewhere right now (the extender's planner on the state left after the move, the freed
// placement taken by the profile). A plan only: nothing is evicted or moved, ever.
//
// Cordoned nodes are left out (kube-scheduler offers them nothing) unless --node names one.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "kube/kube_client.h"
#include "mig/defrag.h"
#include "ops/cluster.h"
#include "ops/picture.h"
#include "ops/report.h"
#include "scheduler/defragmenter.h"

namespace dynmig::ops {

struct DefragOptions {
  std::string profile;  // exact name ("3g.20gb") or slice class ("3g")
  std::string node;     // "" = every node that is not cordoned
  DeviceConfigQuery config;
  size_t alternatives = 2;  // further plans shown after the best one
};

// Where an evicted pod could go.
struct Replacement {
  std::string pod;
  bool placed = false;
  std::string where;  // "node-b: 1g.5gb at slices 2 of GPU-..." when placed
  std::string why_not;
};

// Re-plans `evicted` (pod keys, in order; each sees the earlier ones' new places) on the
// snapshot's non-cordoned nodes, without their current reservations and with `profile` reserved at
// `placement` of `gpu_uuid` on `node`.
std::vector<Replacement> ReplaceEvicted(const ClusterSnapshot& snapshot,
                                        const protocol::DeviceConfig& config,
                                        const std::vector<std::string>& evicted,
                                        const std::string& node, const std::string& gpu_uuid,
                                        const std::string& profile, mig::Placement placement,
                                        absl::Time now);

// Errors: kInvalidArgument (the profile is not a profile name or slice class), kNotFound (--node),
// the client's errors. No GPU can take the profile: answered (json "found": false).
absl::StatusOr<CommandOutput> RunDefrag(kube::KubeClient& client, const DefragOptions& options,
                                        const SlicePainter& painter, absl::Time now);

// The GPUs of the scheduler's view (scheduler/defragmenter.h).
using scheduler::DefragGpus;
using scheduler::DefragInput;

// `dynmig defrag --for PROFILE --pod NS/NAME --apply [--dry-run]`: the scheduler's defragmenter
// (scheduler/defragmenter.h) serves that pending pod once, now, with the same rules, rate limits
// (counted within this run only), reservation and Eviction API; the pod's request must resolve to
// PROFILE (its slice class) on the GPU the plan frees, checked by a silent dry run first. Events
// are recorded on every pod involved. Errors: kInvalidArgument (flags), kNotFound (no such pod),
// kFailedPrecondition (no plan under the rules, with why; or another profile), the client's.
struct DefragApplyOptions {
  std::string profile;
  std::string ns;
  std::string pod;
  bool dry_run = false;
  DeviceConfigQuery config;
  scheduler::DefragFlags flags;  // limits and reservation TTL (mode and timing are ignored)
};
absl::StatusOr<CommandOutput> RunDefragApply(kube::KubeClient& client,
                                             const DefragApplyOptions& options, const Clock& clock);

// "before" and "after" pictures of one plan's GPU.
std::string RenderPlanPictures(const scheduler::GpuReport& gpu, const mig::EvictionPlan& plan,
                               const SlicePainter& painter, const std::string& indent);

}  // namespace dynmig::ops
