// ModeSwitcher: the scheduler leader's loop that decides when an idle GPU changes mode between MIG
// and whole-GPU ("hami-core") and asks the device plugin to carry it out (issue 31 phase 2,
// docs/mig-mode.md, docs/scheduler.md "Mode switcher"). Off unless device-config.yaml's
// `nvidia.migModeSwitching` is present and enabled: then nothing is ever written.
//
// One pass (RunOnce), over the Nodes and Pods listed from the API server:
//   1. Tidies each node's dynmig.io/gpu-mode-request against the device plugin's
//      dynmig.io/gpu-mode: a request its status answers (protocol::StatusAnswers: steady in the
//      requested mode, or refused) is removed; one unanswered for longer than `answer_timeout` is
//      withdrawn (the plugin is gone or never took it); an unreadable value is removed (the
//      plugin never acts on it). Refusals and timeouts are counted by reason, recorded as Events
//      on the pods the request was for, and the refused GPU (after a timeout: every GPU of the
//      node) is not asked again for minModeDuration (and not at all while the plugin says it is
//      not switchable).
//   2. Builds the planner's input (mig/mode_planner.h): per GPU the plugin reports, its mode,
//      switchability and since, whether the configuration allows it (MaySwitch with the node's
//      labels), whether it is idle (no reservation, held or warm slice in the scheduler's view, no
//      pod's device annotations naming it) and whether a request holds it; the demand: this
//      scheduler's unplaced pods, oldest first, at most `max_pods`: whole-GPU pods that no idle
//      whole GPU of a node fits, MIG pods that no node's MIG GPUs fit now (mig::PlanPod).
//   3. mig::PlanModeSwitches; each switch is written as a request under the node lock
//      (hami.io/mutex.lock, as a bind takes it, so no bind is in flight on the node), after
//      checking again that the scheduler's view has no reservation on the GPU; an Event on each
//      pod the switch is for ("GPU 1 (GPU-…) of node-a switches to MIG mode for this pod").
// The last pass's per-GPU verdicts are kept for `dynmig explain` and the layout.
// Thread-compatible for RunOnce (one loop); Verdicts() may be called from any thread.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "kube/kube_client.h"
#include "mig/mode_planner.h"
#include "protocol/gpu_mode.h"
#include "protocol/gpu_mode_switch.h"
#include "protocol/pod_request.h"
#include "scheduler/cluster_state.h"
#include "scheduler/events.h"
#include "scheduler/metrics.h"

namespace dynmig::scheduler {

struct ModeSwitcherOptions {
  // How often the leader's loop runs a pass (`--mode-switch-interval`); zero: no loop.
  absl::Duration interval = absl::Seconds(2);
  protocol::MigModeSwitching config;  // nvidia.migModeSwitching; disabled: RunOnce does nothing
  std::string scheduler_name = "dynmig-scheduler";
  protocol::ResourceNames resources;
  // A request the device plugin has not answered after this long is withdrawn.
  absl::Duration answer_timeout = absl::Minutes(5);
  // The node lock's owner while a request is written: <lock_namespace>/dynmig-mode-switch.
  std::string lock_namespace = "dynmig-system";
  size_t max_pods = mig::kMaxModeDemands;  // pending pods examined per pass
};

// "needs-reboot", "needs-reset" or "refused" for a plugin's refusal reason; "timeout".
std::string RefusalCode(std::string_view reason);

class ModeSwitcher {
 public:
  // `events` and `metrics` may be null. `client`, `state`, `clock` must outlive it.
  ModeSwitcher(kube::KubeClient& client, const ClusterState& state, const Clock& clock,
               EventRecorder* events, SchedulerMetrics* metrics, ModeSwitcherOptions options);

  struct Outcome {
    std::vector<std::string> requested;  // "node-a: GPU-… to hami-core"
    std::vector<std::string> removed;    // answered requests removed: "node-a: GPU-… (done)"
    std::vector<std::string> withdrawn;  // unanswered past the timeout
    std::vector<std::string> refused;    // "node-a: GPU-…: reason"
    std::vector<std::string> errors;     // failed writes, unreadable annotations
    mig::ModePlan plan;
  };
  // One pass (above). Errors: the client's (listing nodes or pods).
  absl::StatusOr<Outcome> RunOnce();

  // The last pass's per-GPU verdicts (why each GPU did or did not switch).
  std::vector<mig::ModeGpuVerdict> Verdicts() const ABSL_LOCKS_EXCLUDED(mu_);

  const ModeSwitcherOptions& options() const { return options_; }

 private:
  struct Cluster;
  void Tidy(Cluster& c, absl::Time now, Outcome& out);
  mig::ModePlanInput BuildInput(const Cluster& c, absl::Time now) const;
  void Demand(const Cluster& c, absl::Time now, mig::ModePlanInput& in) const;
  // Rewrites the node's dynmig.io/gpu-mode-request under its lock: `change` edits the requests read
  // there (an unreadable value reads as none) and may refuse (its status is the error).
  absl::Status WriteUnderLock(
      const std::string& node,
      const std::function<absl::Status(std::vector<protocol::GpuModeRequest>& requests)>& change,
      absl::Time now);
  void Request(const Cluster& c, const mig::ModeSwitchDecision& d, absl::Time now, Outcome& out);
  void EventOnPods(const Cluster& c, const std::vector<std::string>& pods, std::string_view type,
                   std::string_view reason, const std::string& message);

  kube::KubeClient& client_;
  const ClusterState& state_;
  const Clock& clock_;
  EventRecorder* events_;
  SchedulerMetrics* metrics_;
  const ModeSwitcherOptions options_;

  std::set<std::string> seen_;  // the planner's demand keys of the last pass
  // "<gpu uuid>@<at>" -> the pods a request was written for (events on its answer).
  std::map<std::string, std::vector<std::string>> requested_for_;
  std::map<std::string, absl::Time> refused_at_;  // GPU UUID -> last refusal or timeout
  // Node -> when a request there went unanswered: its plugin seems gone; no request there for
  // minModeDuration.
  std::map<std::string, absl::Time> silent_at_;

  mutable dynmig::Mutex mu_;
  std::vector<mig::ModeGpuVerdict> verdicts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dynmig::scheduler
