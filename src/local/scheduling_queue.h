// kube-scheduler v1.20's scheduling queue (pkg/scheduler/internal/queue), for the local mode's
// kube-scheduler stand-in, so that the local mode retries pods when and only when a cluster does:
//
// - activeQ: pods to try, by priority then the time they were queued. Pop counts an attempt and
//   a scheduling cycle.
// - a failed attempt (unschedulable, extender error, bind rejected) goes to the unschedulable
//   pods, or to backoffQ when a move request came since the last Pop (the cluster changed while
//   the pod was tried).
// - backoffQ: waits the pod's backoff, initial_backoff doubling per attempt up to max_backoff,
//   counted from the failure; FlushBackoffCompleted (every second in kube-scheduler) moves pods
//   whose backoff ended to activeQ.
// - unschedulable pods stay until MoveAll (a relevant cluster event: a node added, a node's
//   allocatable, labels, taints, conditions or unschedulable changed, an assigned pod deleted; or
//   any node update while no pod is unschedulable), an update of the pod itself other than its
//   status, or FlushUnschedulableLeftover (every 30 s) finds them there longer than
//   unschedulable_timeout (60 s). Moved pods still in backoff go to backoffQ.
//
// Times are passed in (no clock, no thread): the stand-in calls it under its own lock and drives
// the flushes. Pods are keyed by "namespace/name".
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace dynmig::local {

struct SchedulingQueueTiming {
  absl::Duration initial_backoff = absl::Seconds(1);         // podInitialBackoffSeconds
  absl::Duration max_backoff = absl::Seconds(10);            // podMaxBackoffSeconds
  absl::Duration backoff_flush = absl::Seconds(1);           // flushBackoffQCompleted period
  absl::Duration unschedulable_flush = absl::Seconds(30);    // flushUnschedulableQLeftover period
  absl::Duration unschedulable_timeout = absl::Seconds(60);  // unschedulableQTimeInterval

  // Every value divided by `factor` (tests: the same behaviour, faster).
  SchedulingQueueTiming Scaled(double factor) const;
};

class SchedulingQueue {
 public:
  enum class Where { kNone, kActive, kBackoff, kUnschedulable };

  explicit SchedulingQueue(SchedulingQueueTiming timing) : timing_(timing) {}

  // A new pending pod (informer add): activeQ.
  void Add(const std::string& key, int32_t priority, absl::Time now);
  // The pending pod changed. spec_changed: more than its status and resourceVersion. In activeQ:
  // stays; in backoffQ: to activeQ; unschedulable: to activeQ when spec_changed; in no queue (being
  // tried, or unknown): to activeQ.
  void Update(const std::string& key, int32_t priority, bool spec_changed, absl::Time now);
  // The pod was deleted or bound: out of every queue.
  void Delete(const std::string& key);
  // A relevant cluster event: every unschedulable pod to backoffQ (still backing off) or activeQ.
  void MoveAll(absl::Time now);
  // The head of activeQ, or nullopt when it is empty.
  std::optional<std::string> Pop();
  // The attempt that Pop started failed.
  void AddUnschedulable(const std::string& key, int32_t priority, absl::Time now);
  void FlushBackoffCompleted(absl::Time now);
  void FlushUnschedulableLeftover(absl::Time now);

  size_t ActiveCount() const { return active_.size(); }
  size_t UnschedulableCount() const;
  Where Find(const std::string& key) const;
  int Attempts(const std::string& key) const;
  // When the pod's backoff ends (its last failure plus its backoff).
  absl::Time BackoffEnds(const std::string& key) const;
  const SchedulingQueueTiming& timing() const { return timing_; }

 private:
  struct Info {
    int32_t priority = 0;
    absl::Time timestamp;  // queued, or failed last
    int attempts = 0;
    uint64_t seq = 0;  // FIFO among equal priority and timestamp
    Where where = Where::kNone;
  };
  absl::Duration Backoff(const Info& info) const;
  void ToActive(const std::string& key, Info& info);
  void MoveToActiveOrBackoff(const std::string& key, Info& info, absl::Time now);

  const SchedulingQueueTiming timing_;
  std::map<std::string, Info> pods_;  // every pod the queue knows (in a queue or being tried)
  std::vector<std::string> active_;   // keys in activeQ (ordered at Pop)
  int64_t scheduling_cycle_ = 0;
  int64_t move_request_cycle_ = -1;
  uint64_t next_seq_ = 0;
};

}  // namespace dynmig::local
