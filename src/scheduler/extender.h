// Extender: the decisions behind the scheduler extender's HTTP verbs, over a KubeClient and the
// ClusterState that informers keep current. No HTTP here (server.h serves it).
//
// Filter: a pod that already holds a reservation gets its reserved node back (idempotent retries).
// Otherwise the pod's request is parsed (errors name the container and resource) and
// ClusterState::PlanAndReserve picks node, GPU, profile and placement and records the reservation
// in memory at once (it counts for every later filter). The filter writes nothing to the pod: an
// update of a pod kube-scheduler is still deciding requeues it ("pod ... is in the cache, so can't
// be assumed"). The answer names the chosen node alone, with FailedNodes only for nodes that can
// never run the pod; when nothing fits, every candidate with its reason.
//
// Both verbs first pass BindGuard (bind_guard.h): only MIG pods of our scheduler name are filtered
// or bound, a bind needs the pod's uid and a live reservation of ours on its node. Refusals answer
// Error and record a Warning event (MigFilterRefused, MigBindRefused) on the pod.
//
// Bind: claims the in-memory reservation (a replica without one, after a restart or a change of
// leader, refuses in BindGuard: kube-scheduler schedules the pod again), takes the node lock
// (node_lock.h; queued first come first served behind other binds to the node, lock_queue.h, for a
// bounded time), then writes the
// reservation (hami.io/vgpu-node, -time, -devices-to-allocate, -devices-allocated,
// -mig-allocations, the hami.io/vgpu-node label) together with hami.io/bind-phase=allocating and
// hami.io/bind-time in one merge patch carrying the pod's resourceVersion (kube-scheduler ignores
// annotation-only updates of a pod it has assumed), and POSTs the Binding. On a conflict the pod is
// read again: our reservation already there is success; another reservation, a binding or a new uid
// is an error; a change of anything else is retried on the new version. Any failure releases the
// lock and marks bind-phase=failed; the in-memory reservation stays for the retry.
//
// Whole-GPU pods (whole_gpu_pods on): the same, with ClusterState::PlanAndReserveWhole choosing
// the node and GPUs; the reservation is the device lists alone (one
// `GPU-<uuid>,<type>,<devmem>,100` device per GPU, no hami.io/vgpu-mig-allocations), realized when
// the device plugin has erased every container's entry from hami.io/vgpu-devices-to-allocate.
// Events MigReserved / MigPending say "whole GPU".
//
// Expiry (ExpireReservations, run periodically by the leader): reservations that the device plugin
// has not realized (no runtime identity) reservation_ttl after hami.io/vgpu-time are released:
//   - unbound pods: the reservation annotations and label are removed (merge patch with the pod's
//     resourceVersion) and the assumption is forgotten; kube-scheduler schedules the pod again;
//   - reservations that never reached the pod (assumption only, or the pod is gone): forgotten;
//   - bound pods with hami.io/bind-phase=failed: the device plugin created nothing for the
//     unrealized entries, so they stop counting (ClusterState::ReleaseUnrealized); realized
//     entries count until the pod terminates;
//   - bound pods still allocating (or without a bind-phase): kept; the device plugin may be
//     creating the instance right now, and releasing could hand out a live placement.
//
// Thread-safe: filters and binds for different pods run concurrently.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "kube/kube_client.h"
#include "protocol/pod_request.h"
#include "scheduler/bind_guard.h"
#include "scheduler/cluster_state.h"
#include "scheduler/events.h"
#include "scheduler/extender_api.h"
#include "scheduler/lock_queue.h"
#include "scheduler/metrics.h"
#include "scheduler/node_lock.h"

namespace dynmig::scheduler {

struct ExtenderOptions {
  protocol::ResourceNames resources;
  absl::Duration reservation_ttl = absl::Minutes(10);
  // The node lock's expiry and conflict retries (its `wait` is unused: binds wait in lock_queue).
  NodeLockOptions node_lock;
  // A bind that finds the node locked by another pod's bind queues for it (lock_queue.h), first
  // come first served, up to 75 s (`dynmig scheduler --node-lock-wait`): inside kube-scheduler's
  // extender httpTimeout (90 s in deploy/scheduler/kube-scheduler-config.yaml), which also covers
  // the writes after the lock. A node holds at most 56 MIG instances (8 GPUs x 7), and a real
  // kubelet takes 0.5-1 s from bind to Allocate, the lock held all along: the whole burst fits.
  NodeLockQueueOptions lock_queue;
  int patch_attempts = 3;  // reservation writes retried after unrelated changes of the pod
  // Pods whose spec.schedulerName is this are ours (bind_guard.h); others are refused.
  std::string scheduler_name = "dynmig-scheduler";
  // True when only authenticated callers (kube-scheduler's client certificate) reach /filter: the
  // request's Pod is then kube-scheduler's view. False: before reserving, the filter reads the pod
  // from the API and checks that one (a forged Pod in the body reserves nothing).
  bool trusted_callers = false;
  // Whole-GPU pods (protocol::IsWholeGpuPod) are placed too, on GPUs in whole-GPU mode
  // (ClusterState::PlanAndReserveWhole): device-config.yaml nvidia.migModeSwitching enabled. Off,
  // they are refused as before (not MIG pods).
  bool whole_gpu_pods = false;
  // Where the reservation this extender holds for a pod is found; empty = in memory (made by a
  // filter, not yet written), else the pod's annotations.
  ReservationLookup reservation_lookup;
};

// The annotation keys a reservation consists of (cleared together on release).
std::vector<std::string> ReservationAnnotationKeys();

class Extender {
 public:
  // `events` and `metrics` may be null.
  Extender(kube::KubeClient& client, ClusterState& state, const Clock& clock, EventRecorder* events,
           SchedulerMetrics* metrics, ExtenderOptions options);

  // Returns "" when this replica may write, else the Error every filter and bind answers (not
  // the leader, caches not synced). REQUIRES: set before serving.
  void SetGate(std::function<std::string()> gate) { gate_ = std::move(gate); }

  // The HTTP bodies: request JSON in, response JSON out; errors are in the "Error" field.
  std::string HandleFilter(std::string_view body);
  std::string HandleBind(std::string_view body);

  ExtenderFilterResult Filter(const ExtenderArgs& args);
  // "" when bound, else the error.
  std::string Bind(const ExtenderBindingArgs& args);

  struct ExpiryResult {
    std::vector<std::string> released;  // pod keys whose reservation was released
    std::vector<std::string> kept;      // expired but kept (bound, allocation in progress)
    std::vector<std::string> errors;    // "ns/name: message"
  };
  // One expiry pass (see above). Does nothing when the gate is closed.
  ExpiryResult ExpireReservations();

  // The node informer saw `node` change: a bind queued for its lock looks again.
  void NodeChanged(std::string_view node) { lock_queue_.NodeChanged(node); }
  // Fails the binds waiting for node locks (shutdown).
  void StopWaiting() { lock_queue_.Stop(); }
  const NodeLockQueue& lock_queue() const { return lock_queue_; }

 private:
  std::string Gate() const { return gate_ ? gate_() : ""; }
  // A filter's outcome in the metrics; the request's pod, pending (reason `why`,
  // dynmig_scheduler_pending_pods; `detail` the full message for the live page) or not (reserved,
  // passed through), in the pending-pod gauges.
  void CountFilter(std::string_view outcome, const kube::Object& pod, std::string_view why,
                   absl::Duration took, std::string_view detail = "");
  // A bind succeeded at `now`: the pod is no longer pending, and its wait since creation is
  // observed per profile of its reservation (`written`, or the one the pod carries).
  void ObserveBound(const kube::Object& pod, const std::string& key,
                    const std::optional<Reservation>& written, absl::Time now);
  // Filter's end for a whole-GPU pod (whole_gpu_pods on): ParseWholeGpuRequest, then
  // ClusterState::PlanAndReserveWhole; `result` carries the candidates' answer so far.
  ExtenderFilterResult FilterWhole(const kube::Object& pod, const std::string& key,
                                   const std::vector<std::string>& candidates,
                                   ExtenderFilterResult result, absl::Duration started);
  // The reservation an earlier filter of `key` made and keeps in memory, unless it was made for an
  // earlier pod of that name (another uid): then it is forgotten.
  std::optional<ClusterState::AssumedInfo> AssumedFor(const std::string& key,
                                                      const kube::Object& pod);
  // BindGuard's filter check on the request's pod; with untrusted callers also on the pod read
  // from the API, which is then returned (nullopt: use the request's pod).
  absl::StatusOr<std::optional<kube::Object>> VerifyFilterPod(const kube::Object& pod,
                                                              const std::string& ns,
                                                              const std::string& name);
  // Writes the reservation on the pod (with `also`, more annotations, in the same patch).
  absl::Status WriteReservation(const kube::Object& pod, const Reservation& r, absl::Time now,
                                const kube::KeyPatch& also = {});
  // The reservation a bind of `pod` to `node` writes: the in-memory one (claimed for the bind);
  // nullopt when the pod carries it already. Errors say why the bind is refused.
  absl::StatusOr<std::optional<Reservation>> ReservationForBind(const kube::Object& pod,
                                                                const std::string& node,
                                                                absl::Time now);
  absl::Status ClearReservation(const kube::Object& pod);
  // BindGuard's default lookup: the in-memory reservation of the pod (same uid), else the one its
  // annotations carry.
  std::optional<HeldReservation> HeldBy(const kube::Object& pod) const;
  void Event(const kube::Object& pod, std::string_view type, std::string_view reason,
             std::string message);

  kube::KubeClient& client_;
  ClusterState& state_;
  const Clock& clock_;
  EventRecorder* events_;
  SchedulerMetrics* metrics_;
  const ExtenderOptions options_;
  const BindGuard guard_;
  std::function<std::string()> gate_;
  NodeNamesCache node_names_;
  NodeLockQueue lock_queue_;  // the last NodeNames list, recognised without parsing it again
};

}  // namespace dynmig::scheduler
