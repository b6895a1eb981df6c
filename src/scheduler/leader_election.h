// Leader election on a coordination.k8s.io/v1 Lease, client-go's algorithm: read the Lease; if
// another replica holds it and its record changed less than leaseDurationSeconds ago (judged by
// our own clock at the time we observed the change, so clock skew between replicas does not
// matter), stay a follower; otherwise take or renew it with an update that carries the Lease's
// resourceVersion (a conflict means another replica won the race). A leader that has not renewed
// within renew_deadline stops acting as leader (renew_deadline < lease_duration, so it stops
// before anyone else can take over). On a clean stop the leader hands the Lease back.
//
// Time comes from the injected Clock; the loop thread (Start) waits retry_period of real time
// between rounds. Tests drive rounds with TryAcquireOrRenew() and move a FakeClock instead.
// Thread-safe.
#pragma once

#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "kube/kube_client.h"
#include "nlohmann/json.hpp"

namespace dynmig::scheduler {

struct LeaderElectionOptions {
  std::string lease_namespace = "dynmig-system";
  std::string lease_name = "dynmig-scheduler";
  std::string identity;  // unique per replica, e.g. "<pod name>_<random>"
  absl::Duration lease_duration = absl::Seconds(15);
  absl::Duration renew_deadline = absl::Seconds(10);
  absl::Duration retry_period = absl::Seconds(2);
};

class LeaderElector {
 public:
  // `leading`: the new state; `previous_holder`: the identity that held the Lease before we took
  // it ("" when none or when we stop leading).
  using Callback = std::function<void(bool leading, const std::string& previous_holder)>;

  LeaderElector(kube::KubeClient& client, const Clock& clock, LeaderElectionOptions options);
  ~LeaderElector();  // Stop()
  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

  // Called on every transition, on the thread that ran the round. REQUIRES: before the first
  // round.
  void OnChange(Callback callback);

  // One round: create, take over or renew the Lease. Returns IsLeader() after it. API errors
  // leave the state as it was (a leader keeps leading until its renew deadline passes).
  bool TryAcquireOrRenew() ABSL_LOCKS_EXCLUDED(round_mu_, mu_);

  // Leading, and the last successful renewal is younger than renew_deadline.
  bool IsLeader() const ABSL_LOCKS_EXCLUDED(mu_);
  // The holder identity last observed on the Lease ("" before the first round).
  std::string holder() const ABSL_LOCKS_EXCLUDED(mu_);
  const LeaderElectionOptions& options() const { return options_; }

  // Runs rounds every retry_period on a thread until Stop(). Idempotent.
  void Start() ABSL_LOCKS_EXCLUDED(loop_mu_);
  // Stops the loop; a leader releases the Lease (empty holder, leaseDurationSeconds 1) so a
  // follower takes over at once. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(loop_mu_, round_mu_);
  // Releases the Lease if this replica holds it. Errors: the client's.
  absl::Status Release() ABSL_LOCKS_EXCLUDED(round_mu_, mu_);

 private:
  void SetLeading(bool leading, absl::Time renewed, const std::string& previous_holder)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(round_mu_) ABSL_LOCKS_EXCLUDED(mu_);

  kube::KubeClient& client_;
  const Clock& clock_;
  const LeaderElectionOptions options_;
  Callback callback_;

  dynmig::Mutex round_mu_;  // one round (or release) at a time; callbacks run under it
  mutable dynmig::Mutex mu_ ABSL_ACQUIRED_AFTER(round_mu_);
  bool leading_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_renew_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  nlohmann::json observed_spec_ ABSL_GUARDED_BY(mu_);
  absl::Time observed_time_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::string holder_ ABSL_GUARDED_BY(mu_);

  dynmig::Mutex loop_mu_;
  dynmig::CondVar loop_cv_;
  bool stopping_ ABSL_GUARDED_BY(loop_mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(loop_mu_);
};

}  // namespace dynmig::scheduler
