// The scheduler's Prometheus metrics, rendered as text by our own HTTP server (prometheus-cpp's
// registry and TextSerializer; not its Exposer).
//
//   hami_node_gpu_mig_instance_info{node,device_uuid,device_index,mig_uuid,profile,
//       gpu_instance_id,compute_instance_id,placement_start,placement_size} 1
//       one per reservation the device plugin has realized (runtime identity known); HAMi's name
//   dynmig_scheduler_gpu_fail_closed{node,device_uuid,device_index,reason} 1
//       GPUs kept out of scheduling (unreadable or conflicting reservations, cordoned, unhealthy);
//       reason is GpuReport::unhealthy_code
//   dynmig_scheduler_node_unhealthy{node,reason} 1     reason: NodeReport::unhealthy_code
//   dynmig_scheduler_reserved_instances{state="assumed|reserved|ready"}
//   dynmig_scheduler_leader 0|1
//   dynmig_scheduler_binds_waiting_for_node_lock   binds queued for a node's lock now
//   (lock_queue.h)
//   dynmig_scheduler_filter_total{outcome="reserved|already-reserved|pending|passthrough|error"}
//   dynmig_scheduler_reservations_total, dynmig_scheduler_reservation_expiries_total{action}
//   dynmig_scheduler_bind_total{outcome="bound|error"}
//   dynmig_scheduler_unauthenticated_total{path="/filter|/bind|/layout|/live|other"}  (/live: the
//       page and its parts)
//   dynmig_scheduler_defrag_evictions_total{result="evicted|not-found|refused-by-pdb|error"}
//   dynmig_scheduler_defrag_plans_total{outcome="executed|dry-run|no-plan|rate-limited|failed"}
//   dynmig_scheduler_defrag_reservations_active   dynmig.io/defrag-reservation entries in force
//   dynmig_scheduler_mode_switch_requests_total{node,to="mig|hami-core"}   GPU mode switches asked
//   dynmig_scheduler_mode_switch_refusals_total{node,reason="needs-reboot|needs-reset|refused|
//       timeout"}   requests the device plugin refused, or withdrawn unanswered (mode_switcher.h)
//   dynmig_scheduler_mode_switch_seconds_total{node}   seconds GPUs spent switching mode
//   dynmig_scheduler_filter_duration_seconds, dynmig_scheduler_bind_duration_seconds (histograms)
//   dynmig_scheduler_pod_wait_seconds{profile}   histogram: a MIG pod's creation to its successful
//       bind, once per profile the pod holds (the bind is the scheduler's last step; what follows,
//       image pull and container start, is the node's and not a wait for MIG capacity)
//   dynmig_scheduler_pending_pods{reason}        MIG pods whose last filter left them pending, by
//       the planner's best verdict (mig::VerdictName: fragmented, capacity-exhausted,
//       no-profile-big-enough, not-allowlisted, filtered, gpu-unhealthy, no-mig-gpu,
//       node-unhealthy; the classification `dynmig explain` shows), or no-candidates
//       (kube-scheduler offered no node), binding (its reservation is being bound),
//       waiting-for-node-lock (binds queued for a node's lock)
//   dynmig_scheduler_pending_oldest_seconds{reason}  how long the oldest of them has been pending
//   dynmig_scheduler_gpu_slices{node,device_uuid,device_index}, ..._gpu_free_slices{...},
//   ..._gpu_largest_free_run_slices{...}           per allowlisted GPU: its slices, those no
//       reservation or held instance covers, and the longest run of adjacent free slices
//   dynmig_scheduler_whole_gpu_in_use{node,device_uuid,device_index} 0|1   per GPU in whole-GPU
//       mode (MIG off): whether a pod holds or is reserved it (whole GPUs fail closed with the
//       others in dynmig_scheduler_gpu_fail_closed)
//   dynmig_scheduler_node_lock_held_seconds{node}  how long a node's bind lock has been held
//
// No series carries a pod or namespace name (reasons are codes; the full reasons, which name pods,
// are on the authenticated /layout and in the pods' events), so /metrics needs no authentication:
// it shows node names, GPU and MIG UUIDs, profiles, placements and counts, no workload identity.
//
// Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "scheduler/cluster_state.h"

namespace prometheus {
class Registry;
class Counter;
class Histogram;
struct MetricFamily;
template <typename T>
class Family;
}  // namespace prometheus

namespace dynmig::scheduler {

// A pod the last filter left pending, as the live page lists it.
struct PendingPod {
  std::string pod;     // namespace/name
  std::string reason;  // the code dynmig_scheduler_pending_pods counts it under
  std::string detail;  // the filter's message (its MigPending event), may be empty
  absl::Time since;    // first seen pending
};

class SchedulerMetrics {
 public:
  SchedulerMetrics();
  ~SchedulerMetrics();
  SchedulerMetrics(const SchedulerMetrics&) = delete;
  SchedulerMetrics& operator=(const SchedulerMetrics&) = delete;

  // outcome: "reserved", "already-reserved", "pending", "passthrough" or "error".
  void ObserveFilter(std::string_view outcome, absl::Duration latency);
  void ObserveBind(bool ok, absl::Duration latency);
  // action: "released" (unbound pod), "forgotten" (assumption without annotation),
  // "bind-failed" (bound pod whose Allocate failed).
  void CountExpiry(std::string_view action);
  // The defragmenter (defragmenter.h): one eviction's result, one plan's outcome.
  void CountDefragEviction(std::string_view result);
  void CountDefragPlan(std::string_view outcome);
  // The mode switcher (mode_switcher.h): a request written; a refusal or timeout by code; the
  // seconds a GPU of `node` spent switching.
  void CountModeSwitchRequest(const std::string& node, std::string_view to);
  void CountModeSwitchRefusal(const std::string& node, std::string_view reason);
  void AddModeSwitchSeconds(const std::string& node, double seconds);
  // A /filter or /bind refused for want of a valid client certificate.
  void CountUnauthenticated(std::string_view path);

  // A MIG pod bound after `waited` (its creation to now), once per distinct profile it holds.
  void ObserveWait(const std::vector<std::string>& profiles, absl::Duration waited);

  // The pending-pod gauges. PodPending: the filter of `pod_key` left it pending for `reason` at
  // `now` (its first pending time is kept while it stays pending). PodDone: it was reserved,
  // bound, deleted or is not a MIG pod. An entry not refreshed for kPendingTtl is dropped (a pod
  // deleted while no watch event reached us; kube-scheduler retries pending pods well within).
  // At most kMaxPendingPods are tracked. `detail` (cut to kMaxPendingDetail bytes) is the
  // filter's full reason, shown on the live page.
  static constexpr absl::Duration kPendingTtl = absl::Minutes(15);
  static constexpr size_t kMaxPendingPods = 100000;
  static constexpr size_t kMaxPendingDetail = 1024;
  void PodPending(const std::string& pod_key, std::string_view reason, absl::Time now,
                  std::string_view detail = {}) ABSL_LOCKS_EXCLUDED(pending_mu_);
  void PodDone(const std::string& pod_key) ABSL_LOCKS_EXCLUDED(pending_mu_);
  // How many MIG pods are pending at `now` (entries refreshed within kPendingTtl).
  size_t PendingCount(absl::Time now) const ABSL_LOCKS_EXCLUDED(pending_mu_);
  // The pending pods not expired at `now`, longest waiting first, at most `limit`; `total` (if
  // set) gets how many there are.
  std::vector<PendingPod> PendingPods(absl::Time now, size_t limit, size_t* total = nullptr) const
      ABSL_LOCKS_EXCLUDED(pending_mu_);

  // The exposition text: the registry's metrics plus the state-derived gauges of `nodes`, the
  // pending pods and the binds waiting for node locks, aged at `now`.
  std::string Render(const std::vector<NodeReport>& nodes, bool leader, int binds_waiting,
                     absl::Time now) const ABSL_LOCKS_EXCLUDED(pending_mu_);

 private:
  // dynmig_scheduler_pending_pods and _pending_oldest_seconds at `now` (dropping expired entries).
  std::vector<prometheus::MetricFamily> PendingFamilies(int binds_waiting, absl::Time now) const
      ABSL_LOCKS_EXCLUDED(pending_mu_);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* filter_total_;
  prometheus::Family<prometheus::Counter>* expiries_total_;
  prometheus::Family<prometheus::Counter>* bind_total_;
  prometheus::Family<prometheus::Counter>* unauthenticated_total_;
  prometheus::Family<prometheus::Counter>* defrag_evictions_total_;
  prometheus::Family<prometheus::Counter>* defrag_plans_total_;
  prometheus::Family<prometheus::Counter>* mode_switch_requests_total_;
  prometheus::Family<prometheus::Counter>* mode_switch_refusals_total_;
  prometheus::Family<prometheus::Counter>* mode_switch_seconds_total_;
  prometheus::Counter* reservations_total_;
  prometheus::Histogram* filter_latency_;
  prometheus::Histogram* bind_latency_;
  prometheus::Family<prometheus::Histogram>* pod_wait_;

  struct Pending {
    std::string reason;
    std::string detail;
    absl::Time since;      // first seen pending
    absl::Time last_seen;  // last filter that left it pending
  };
  mutable dynmig::Mutex pending_mu_;
  mutable std::map<std::string, Pending> pending_ ABSL_GUARDED_BY(pending_mu_);
};

}  // namespace dynmig::scheduler
