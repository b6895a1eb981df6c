// ReplicaSetController: the part of kube-controller-manager the local mode stands in for, so that
// a pod of a ReplicaSet that is evicted (dynmig's defragmenter) or deleted comes back, as in a
// cluster (docs/local.md).
//
// One pass (Reconcile), per apps/v1 ReplicaSet: its pods are the pods of its namespace whose
// controller ownerReference carries its uid; active ones are neither being deleted nor Succeeded
// or Failed (a terminating pod no longer counts, so its replacement is made at once, as the real
// controller does). Fewer active than spec.replicas: new pods from spec.template (generateName
// "<name>-", the template's labels and annotations, an ownerReference with controller and
// blockOwnerDeletion), at most kBurstReplicas per ReplicaSet and pass (kube-controller-manager's
// --burst-replicas default) and never more than `max_replicas` active per ReplicaSet (a bound of
// this double: the real controller would go on). More: the surplus is deleted, unscheduled pods
// first, then the newest. status.replicas, readyReplicas and observedGeneration are written when
// they change. The garbage collector's part: a pod whose controller is a ReplicaSet this
// controller has seen and that is gone is deleted (background propagation).
// Thread-safe: Start/Stop from one owner; Reconcile may also be called by hand (tests).
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "kube/kube_client.h"

namespace dynmig::local {

inline constexpr int64_t kBurstReplicas = 500;

struct ReplicaSetControllerOptions {
  absl::Duration interval = absl::Milliseconds(500);
  int64_t max_replicas = 1000;
  std::function<void(const std::string&)> log;  // may be empty
};

class ReplicaSetController {
 public:
  // `client` and `clock` must outlive the controller.
  ReplicaSetController(kube::KubeClient& client, const Clock& clock,
                       ReplicaSetControllerOptions options = {});
  ~ReplicaSetController();  // Stop()

  void Start();
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  struct Pass {
    int created = 0;
    int deleted = 0;    // surplus pods
    int collected = 0;  // pods of ReplicaSets that are gone
  };
  // Errors: the client's (listing).
  absl::StatusOr<Pass> Reconcile() ABSL_LOCKS_EXCLUDED(seen_mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  void Log(const std::string& line) const;

  kube::KubeClient& client_;
  const Clock& clock_;
  const ReplicaSetControllerOptions options_;
  dynmig::Mutex seen_mu_;                                 // one Reconcile at a time
  std::set<std::string> seen_ ABSL_GUARDED_BY(seen_mu_);  // uids of ReplicaSets seen
  dynmig::Mutex mu_;
  dynmig::CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace dynmig::local
