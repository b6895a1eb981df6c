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
//   dynmig_scheduler_unauthenticated_total{path="/filter|/bind|/layout"}
//   dynmig_scheduler_defrag_evictions_total{result="evicted|not-found|refused-by-pdb|error"}
//   dynmig_scheduler_defrag_plans_total{outcome="executed|dry-run|no-plan|rate-limited|failed"}
//   dynmig_scheduler_defrag_reservations_active   dynmig.io/defrag-reservation entries in force
//   dynmig_scheduler_filter_duration_seconds, dynmig_scheduler_bind_duration_seconds (histograms)
//
// No series carries a pod or namespace name (reasons are codes; the full reasons, which name pods,
// are on the authenticated /layout and in the pods' events), so /metrics needs no authentication:
// it shows node names, GPU and MIG UUIDs, profiles, placements and counts, no workload identity.
//
// Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "scheduler/cluster_state.h"

namespace prometheus {
class Registry;
class Counter;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace dynmig::scheduler {

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
  // A /filter or /bind refused for want of a valid client certificate.
  void CountUnauthenticated(std::string_view path);

  // The exposition text: the registry's metrics plus the state-derived gauges of `nodes` and the
  // binds waiting for node locks.
  std::string Render(const std::vector<NodeReport>& nodes, bool leader,
                     int binds_waiting = 0) const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* filter_total_;
  prometheus::Family<prometheus::Counter>* expiries_total_;
  prometheus::Family<prometheus::Counter>* bind_total_;
  prometheus::Family<prometheus::Counter>* unauthenticated_total_;
  prometheus::Family<prometheus::Counter>* defrag_evictions_total_;
  prometheus::Family<prometheus::Counter>* defrag_plans_total_;
  prometheus::Counter* reservations_total_;
  prometheus::Histogram* filter_latency_;
  prometheus::Histogram* bind_latency_;
};

}  // namespace dynmig::scheduler
