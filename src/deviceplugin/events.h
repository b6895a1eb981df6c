// Kubernetes Events about MIG instances (created, destroyed, adopted, refused, ...), sent from a
// background thread so that an API hiccup never slows Allocate. The queue is bounded: when full,
// the oldest event is dropped (and counted). Every event is also logged. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "kube/kube_client.h"
#include "kube/object.h"

namespace dynmig::deviceplugin {

// Event reasons.
inline constexpr std::string_view kReasonCreated = "MigInstanceCreated";
inline constexpr std::string_view kReasonDestroyed = "MigInstanceDestroyed";
inline constexpr std::string_view kReasonAdopted = "MigInstanceAdopted";
inline constexpr std::string_view kReasonRefused = "MigAllocationRefused";
inline constexpr std::string_view kReasonFailed = "MigAllocationFailed";
inline constexpr std::string_view kReasonAdoptionFailed = "MigAdoptionFailed";
inline constexpr std::string_view kReasonUntracked = "MigInstanceUntracked";
inline constexpr std::string_view kReasonGpuNotReady = "MigGpuNotReady";
inline constexpr std::string_view kReasonGpuCleaned = "MigGpuCleaned";
inline constexpr std::string_view kReasonReclaimDeferred = "MigReclaimDeferred";
// NVML refused to destroy an instance with NVML_ERROR_IN_USE (another client holds it open): it
// stays held and the destroy is retried with backoff.
inline constexpr std::string_view kReasonDestroyInUse = "MigDestroyInUse";
inline constexpr std::string_view kReasonReconcileSkipped = "MigReconcileSkipped";
// A pod says hami.io/bind-phase=allocating on this node, but the node lock or its reservation does
// not confirm it: it is not taken as the pod of an Allocate.
inline constexpr std::string_view kReasonBindMismatch = "MigBindMismatch";
// The devices the kubelet is about to start a container with (PreStartContainer), or an Allocate,
// cannot be proven to be the reserved pod's: that container does not start (identity.h).
inline constexpr std::string_view kReasonIdentityMismatch = "MigIdentityMismatch";
// Warm instances: an ended pod's instance kept idle for reuse, and an idle instance given to a pod.
inline constexpr std::string_view kReasonIdled = "MigInstanceIdle";
inline constexpr std::string_view kReasonReused = "MigInstanceReused";
// Handover (handover.h): a live instance dynmig did not create is held by this pod's container
// (Normal, on the holder pod, once), or no holder can be proven and the evidence is incomplete
// (Warning, on the node, once per instance): kept, never destroyed.
inline constexpr std::string_view kReasonLegacyHeld = "MigLegacyInstanceHeld";
inline constexpr std::string_view kReasonLegacyUnproven = "MigLegacyInstanceUnproven";
// A whole-GPU pod's container got its whole GPU(s) (docs/mig-mode.md): nothing was created.
inline constexpr std::string_view kReasonWholeGpuAllocated = "WholeGpuAllocated";

struct RecordedEvent {
  std::string object;  // "Pod default/p" or "Node n"
  std::string type;    // Normal / Warning
  std::string reason;
  std::string message;
};

class EventRecorder {
 public:
  // `kube` and `clock` (event timestamps, Flush's timeout) must outlive the recorder.
  EventRecorder(kube::KubeClient& kube, std::string component, const Clock& clock,
                size_t max_queue = 1000);
  ~EventRecorder();  // sends what is queued (bounded wait), then stops
  EventRecorder(const EventRecorder&) = delete;
  EventRecorder& operator=(const EventRecorder&) = delete;

  // Queues an Event about `involved` (a Pod or Node object; kind, name, namespace, uid used).
  void Record(const kube::Object& involved, std::string_view type, std::string_view reason,
              std::string_view message);
  // Waits until every queued event was sent (or failed); false on timeout.
  bool Flush(absl::Duration timeout);
  // The last events recorded (at most 512), oldest first.
  std::vector<RecordedEvent> Recent() const;
  // Whether some recorded event has this reason and, when given, a message containing `text`.
  bool Has(std::string_view reason, std::string_view text = "") const;
  uint64_t dropped() const;
  uint64_t failed() const;

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  kube::KubeClient& kube_;
  const std::string component_;
  const Clock& clock_;
  const size_t max_queue_;
  mutable dynmig::Mutex mu_;
  dynmig::CondVar cv_;       // signalled when an event is queued or the recorder stops
  dynmig::CondVar idle_cv_;  // signalled when the queue drains
  std::deque<kube::Object> queue_ ABSL_GUARDED_BY(mu_);
  std::deque<RecordedEvent> recent_ ABSL_GUARDED_BY(mu_);
  bool sending_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

// A minimal object reference for events about the node.
kube::Object NodeRef(std::string_view node_name);

}  // namespace dynmig::deviceplugin
