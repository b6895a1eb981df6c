// Defragmenter: carries out the defragmentation advisor's plan for a pod that waits only because
// of fragmentation (docs/scheduler.md, "Defragmenter"). Off by default; run by the leader only.
//
// One pass (RunOnce):
//   1. Tidies dynmig.io/defrag-reservation on every node (whatever the mode): an entry is dropped
//      when it expired, its pod is gone (or is another pod of that name: uid), or its pod was
//      placed (spec.nodeName set). An unreadable value is removed.
//   2. Unless off: the pods of our scheduler that wait unplaced for longer than `wait_threshold`
//      (creation time), one MIG instance each, without a reservation in flight, highest priority
//      then longest waiting first (mig::DueWaitingPods). For each, in order, until one plan is
//      carried out: the pod must fit nowhere now; mig::ChooseDefragPlan picks the least disruptive
//      plan under the eviction rules (opt-out, system namespaces, controller, PodDisruptionBudgets)
//      for the profile covering its request; every pod of the plan must fit elsewhere right now
//      with the freed slices taken (PlaceMovedPods), otherwise the cluster lacks the capacity and
//      nothing is done; the rate limits (per node and per namespace per hour) must allow it.
//   3. Dry run: only Events (DefragPlanned on the waiting pod, DefragWouldEvict on each pod of the
//      plan), once per pod per reservation_ttl. On: the freed slices are reserved for the waiting
//      pod on its node first (so nothing else, the evicted pods' replacements included, takes
//      them), then each pod of the plan is evicted through the Eviction API with its uid as
//      precondition (the API server enforces PodDisruptionBudgets). When an eviction is refused
//      the remaining pods are left alone and the reservation is withdrawn. Events on the waiting
//      pod (DefragEvicted, DefragFailed) and on each evicted pod (DefragEvicted).
// At most one plan per pass. Thread-compatible: one caller at a time (the server's loop).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "kube/kube_client.h"
#include "mig/defrag_policy.h"
#include "protocol/defrag.h"
#include "protocol/pod_request.h"
#include "scheduler/cluster_state.h"
#include "scheduler/events.h"
#include "scheduler/metrics.h"

namespace dynmig::scheduler {

enum class DefragMode { kOff, kDryRun, kOn };
// "off", "dry-run", "on"; kInvalidArgument names the choices.
absl::StatusOr<DefragMode> ParseDefragMode(std::string_view text);
std::string_view DefragModeName(DefragMode mode);

// The settings as the command lines give them (`dynmig scheduler --defrag*`, `dynmig local`).
struct DefragFlags {
  std::string mode = "off";
  std::string wait = "5m";
  int64_t per_node_per_hour = 4;
  int64_t per_namespace_per_hour = 4;
  std::string reservation_ttl = "10m";
  std::string interval = "15s";
  int64_t headroom_percent = 1;
};
struct DefragmenterOptions;
// Errors: kInvalidArgument naming the flag (--defrag, --defrag-wait, ...). Limits 0..1000.
absl::Status ApplyDefragFlags(const DefragFlags& flags, DefragmenterOptions& options,
                              absl::Duration& interval);

struct DefragmenterOptions {
  DefragMode mode = DefragMode::kOff;
  absl::Duration wait_threshold = absl::Minutes(5);
  mig::EvictionLimits limits;
  // Moves only while this percent of the schedulable GPUs' slices stay free once the waiting pod
  // runs (mig::HeadroomRefusal); 0: no such rule. 1 by default (docs/simulate.md, "Headroom").
  uint32_t headroom_percent = 1;
  // How long freed slices stay reserved for the waiting pod.
  absl::Duration reservation_ttl = absl::Minutes(10);
  std::string scheduler_name = "dynmig-scheduler";
  protocol::ResourceNames resources;
  mig::DefragRules rules;     // system namespaces (dynmig's own included)
  ClusterStateOptions state;  // for checking where the moved pods would go
};

// The GPUs of the scheduler's view, for mig::PlanDefrag and mig::ChooseDefragPlan, in the node and
// GPU order of `reports` (which must outlive it). Nodes whose name is not in `nodes` are left out
// (empty: none). Slices held by the node or reserved by defragmentation are pinned (no owner).
struct DefragInput {
  std::vector<mig::DefragGpu> gpus;
  std::vector<const GpuReport*> reports;                         // same order as gpus
  std::vector<std::shared_ptr<const mig::GpuPlanner>> planners;  // keeps gpus[i].planner alive
};
DefragInput DefragGpus(const ClusterState& state, const std::vector<NodeReport>& reports,
                       const std::set<std::string>& nodes, absl::Time now);

// Where each moved pod would go now: `nodes` and `pods` are the cluster's objects; the pods in
// `moved` are left out, `profile` is taken at `placement` of `gpu_uuid` on `node`, and each moved
// pod is planned in turn on the nodes in `candidates` (each sees the earlier ones' places).
struct MovedPlacement {
  std::string pod;
  bool placed = false;
  std::string where;
  std::string why_not;
};
std::vector<MovedPlacement> PlaceMovedPods(
    const std::vector<kube::Object>& nodes, const std::vector<kube::Object>& pods,
    const ClusterStateOptions& options, const std::vector<std::string>& moved,
    const std::string& node, const std::string& gpu_uuid, const std::string& profile,
    mig::Placement placement, const std::vector<std::string>& candidates, absl::Time now);

class Defragmenter {
 public:
  // `events` and `metrics` may be null. `state` is the scheduler's (kept current by informers).
  Defragmenter(kube::KubeClient& client, ClusterState& state, const Clock& clock,
               EventRecorder* events, SchedulerMetrics* metrics, DefragmenterOptions options);

  struct Outcome {
    std::string pod;  // the waiting pod served ("" when none)
    bool dry_run = false;
    bool executed = false;  // the plan was carried out (all evictions accepted)
    std::string node, gpu_uuid, profile;
    mig::Placement placement;
    std::vector<std::string> evicted;         // accepted evictions (would-be ones in a dry run)
    std::vector<std::string> failed;          // "ns/name: why" for refused evictions
    std::map<std::string, std::string> left;  // pods of the GPU left alone, with why
    std::vector<std::string> notes;           // why waiting pods were not served
    std::vector<std::string> tidied;          // reservations dropped: "node: pod (why)"
  };
  // One pass (above). Errors: the client's (listing pods or nodes).
  absl::StatusOr<Outcome> RunOnce();

  // Serves one pod now, whatever its wait and the mode's threshold (`dynmig defrag --apply`):
  // the same rules, limits and executor; `dry_run` only plans and records events.
  // kNotFound: no such pod; kFailedPrecondition: it is placed, not one MIG instance, or no plan.
  absl::StatusOr<Outcome> ServePod(const std::string& ns, const std::string& name, bool dry_run);

  const DefragmenterOptions& options() const { return options_; }

 private:
  struct Cluster {
    std::vector<kube::Object> nodes;
    std::vector<kube::Object> pods;
    std::map<std::string, const kube::Object*> by_key;
    std::map<std::string, int64_t> pdb_allowed;
    std::vector<std::pair<std::string, kube::Object>> pdbs;  // key, object
  };
  absl::StatusOr<Cluster> Read();
  // The cluster's PodDisruptionBudgets into `c` (read only once a pod is due: a pass with nothing
  // to serve lists none).
  absl::Status ReadBudgets(Cluster& c);
  void Tidy(const Cluster& c, absl::Time now, Outcome& out);
  // Serve's steps: the plan (null: none, `why` says why); whether the moved pods fit elsewhere
  // and the rate limits allow it; reserving and evicting.
  struct Planned {
    std::vector<std::string> candidates;  // schedulable nodes
    std::vector<NodeReport> reports;      // in.reports points into it
    DefragInput in;
    // Every plan found, best first (fewest pods, then the rules' rank); Admissible sets `best` to
    // the first whose pods can all run elsewhere now.
    std::vector<mig::DefragChoice> choices;
    mig::DefragChoice best;
  };
  std::unique_ptr<Planned> Plan(const Cluster& c, const mig::PodRequest& request, absl::Time now,
                                std::string& why);
  bool Admissible(const Cluster& c, const kube::Object& pod, Planned& p, absl::Time now,
                  std::string& why);
  bool Execute(const Cluster& c, const kube::Object& pod, const mig::DefragGpu& gpu,
               const mig::EvictionPlan& plan, absl::Time now, Outcome& out, std::string& why);
  // Tries the pod; true when a plan was carried out or dry-run (stop the pass).
  bool Serve(const Cluster& c, const kube::Object& pod, const mig::PodRequest& request,
             bool dry_run, absl::Time now, Outcome& out, std::string& why);
  mig::MovablePod Facts(const Cluster& c, const kube::Object& pod) const;
  absl::Status WriteHolds(const std::string& node,
                          const std::vector<protocol::DefragReservation>& holds);
  std::vector<protocol::DefragReservation> HoldsOn(const Cluster& c, const std::string& node) const;
  void Event(const kube::Object& pod, std::string_view type, std::string_view reason,
             std::string message);

  kube::KubeClient& client_;
  ClusterState& state_;
  const Clock& clock_;
  EventRecorder* events_;
  SchedulerMetrics* metrics_;
  const DefragmenterOptions options_;
  std::vector<mig::EvictionRecord> history_;    // the last hour's evictions
  std::map<std::string, absl::Time> dry_runs_;  // pod uid -> last dry-run plan
};

}  // namespace dynmig::scheduler
