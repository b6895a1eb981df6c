#include "scheduler/lock_queue.h"

#include <algorithm>

#include "fmt/format.h"

namespace dynmig::scheduler {

NodeLockQueue::NodeLockQueue(NodeLockQueueOptions options) : options_(options) {}

NodeLockQueue::~NodeLockQueue() { Stop(); }

void NodeLockQueue::Stop() {
  dynmig::MutexLock lock(&mu_);
  stopped_ = true;
  cv_.SignalAll();
}

void NodeLockQueue::NodeChanged(std::string_view node) {
  dynmig::MutexLock lock(&mu_);
  auto it = queues_.find(node);
  if (it == queues_.end()) return;
  ++it->second.changes;
  cv_.SignalAll();
}

int NodeLockQueue::Waiting(std::string_view node) const {
  dynmig::MutexLock lock(&mu_);
  auto it = queues_.find(node);
  return it == queues_.end() ? 0 : static_cast<int>(it->second.tickets.size());
}

int NodeLockQueue::Waiting() const {
  dynmig::MutexLock lock(&mu_);
  return waiting_;
}

void NodeLockQueue::Leave(const std::string& node, uint64_t ticket) {
  auto it = queues_.find(node);
  if (it == queues_.end()) return;
  auto& tickets = it->second.tickets;
  tickets.erase(std::remove(tickets.begin(), tickets.end(), ticket), tickets.end());
  --waiting_;
  if (tickets.empty()) queues_.erase(it);
  cv_.SignalAll();  // the next one may be the head now
}

absl::Status NodeLockQueue::Acquire(kube::KubeClient& client, std::string_view node_view,
                                    const LockOwner& owner, const Clock& clock,
                                    const NodeLockOptions& lock_options) {
  const std::string node(node_view);
  const absl::Duration deadline = clock.Monotonic() + options_.wait;

  dynmig::MutexLock lock(&mu_);
  if (stopped_) return absl::CancelledError(fmt::format("lock node {}: shutting down", node));
  if (waiting_ >= options_.max_waiters) {
    return absl::FailedPreconditionError(fmt::format(
        "lock node {}: {} binds already wait for node locks in this scheduler (at most {})", node,
        waiting_, options_.max_waiters));
  }
  const uint64_t ticket = next_ticket_++;
  // Stays in the map (at the same address) while this bind is in it: Leave() erases it only
  // once empty, and `q` is not used after Leave().
  NodeQueue& q = queues_[node];
  q.tickets.push_back(ticket);
  ++waiting_;
  absl::Duration poll = options_.poll;
  const int ahead_at_start = static_cast<int>(q.tickets.size()) - 1;
  absl::Status last = absl::OkStatus();
  while (true) {
    // Wait to be the head (the binds ahead leave when they took the lock or gave up).
    clock.WaitUntil(cv_, mu_, deadline, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopped_ || q.tickets.front() == ticket;
    });
    if (stopped_) {
      Leave(node, ticket);
      return absl::CancelledError(fmt::format("lock node {}: shutting down", node));
    }
    if (q.tickets.front() != ticket) {  // the deadline, still behind others
      const int ahead = static_cast<int>(std::find(q.tickets.begin(), q.tickets.end(), ticket) -
                                         q.tickets.begin());
      Leave(node, ticket);
      return absl::FailedPreconditionError(
          fmt::format("lock node {}: waited {} behind other binds to the node ({} ahead of this "
                      "one when it came, {} still ahead)",
                      node, absl::FormatDuration(options_.wait), ahead_at_start, ahead));
    }
    const uint64_t seen = q.changes;
    mu_.Unlock();
    last = AcquireNodeLock(client, node, owner, clock.Now(), lock_options);
    mu_.Lock();
    if (last.code() != absl::StatusCode::kFailedPrecondition) {  // taken, or a real error
      Leave(node, ticket);
      return last;
    }
    // Still held: wait for the node to change (or poll), unless the time is up.
    const absl::Duration now = clock.Monotonic();
    if (now >= deadline) break;
    const absl::Duration wake = std::min(deadline, now + poll);
    clock.WaitUntil(cv_, mu_, wake, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopped_ || q.changes != seen;
    });
    if (q.changes == seen) poll = std::min(poll * 2, options_.max_poll);
  }
  Leave(node, ticket);
  return absl::FailedPreconditionError(fmt::format(
      "{}; waited {} for it ({} binds to the node were ahead of this one when it came)",
      std::string(last.message()), absl::FormatDuration(options_.wait), ahead_at_start));
}

}  // namespace dynmig::scheduler
