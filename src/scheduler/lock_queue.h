// The binds of one scheduler process that wait for a node's lock (node_lock.h), first come first
// served. A burst sends many pods to the same node (binpack), and each bind needs the node's lock
// until the device plugin's Allocate has identified the pod; a bind that bounces off the lock
// costs its pod kube-scheduler's backoff or, in v1.20, its unschedulable queue (about a minute),
// because the lock's release (a Node annotation) is not an event that requeues a pod.
//
// So binds queue here instead of polling the API each: only the bind at the head of a node's queue
// reads the Node, when the node informer reports a change of that Node (NodeChanged) or, as a
// fallback for a missed event, every `poll` doubling up to `max_poll`. When it takes the lock it
// leaves and the next becomes the head. A bind waits at most `wait` (keep it well inside the
// extender's httpTimeout: the bind still writes the reservation and the Binding afterwards), then
// fails, naming the holder and how many binds were waiting for the same node. At most
// `max_waiters` binds wait at once in the process (each holds an HTTP thread); a bind beyond that
// fails at once.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "kube/kube_client.h"
#include "scheduler/node_lock.h"

namespace dynmig::scheduler {

struct NodeLockQueueOptions {
  absl::Duration wait = absl::Seconds(75);
  // The head's re-reads of the Node without a change reported (a missed watch event).
  absl::Duration poll = absl::Milliseconds(100);
  absl::Duration max_poll = absl::Seconds(1);
  int max_waiters = 96;
};

class NodeLockQueue {
 public:
  explicit NodeLockQueue(NodeLockQueueOptions options = {});
  ~NodeLockQueue();  // Stop()
  NodeLockQueue(const NodeLockQueue&) = delete;
  NodeLockQueue& operator=(const NodeLockQueue&) = delete;

  // Takes the lock of `node` for `owner` (AcquireNodeLock with `lock.wait` ignored: the queue
  // waits); the lock records `clock`'s time when it is taken. The wait and the polls run on
  // `clock`'s monotonic time (in production the real time that bounds the bind's HTTP call).
  // Errors: those of
  // AcquireNodeLock; kFailedPrecondition when the lock is still held after `wait`, or too many
  // binds wait already; kCancelled after Stop().
  absl::Status Acquire(kube::KubeClient& client, std::string_view node, const LockOwner& owner,
                       const Clock& clock, const NodeLockOptions& lock = {})
      ABSL_LOCKS_EXCLUDED(mu_);

  // The node informer saw `node` change (its lock may be gone): wake the head of its queue.
  void NodeChanged(std::string_view node) ABSL_LOCKS_EXCLUDED(mu_);

  // Fails every waiting bind (kCancelled) and every later one. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Binds waiting now, for `node` and in all.
  int Waiting(std::string_view node) const ABSL_LOCKS_EXCLUDED(mu_);
  int Waiting() const ABSL_LOCKS_EXCLUDED(mu_);

  const NodeLockQueueOptions& options() const { return options_; }

 private:
  struct NodeQueue {
    std::deque<uint64_t> tickets;  // front: the head, the one bind that reads the Node
    uint64_t changes = 0;          // NodeChanged calls so far
  };
  void Leave(const std::string& node, uint64_t ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const NodeLockQueueOptions options_;
  mutable dynmig::Mutex mu_;
  dynmig::CondVar cv_;
  std::map<std::string, NodeQueue, std::less<>> queues_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dynmig::scheduler
