#include "local/scheduling_queue.h"

#include <algorithm>

namespace dynmig::local {

SchedulingQueueTiming SchedulingQueueTiming::Scaled(double factor) const {
  SchedulingQueueTiming t = *this;
  for (absl::Duration* d : {&t.initial_backoff, &t.max_backoff, &t.backoff_flush,
                            &t.unschedulable_flush, &t.unschedulable_timeout}) {
    *d = *d / factor;
  }
  return t;
}

absl::Duration SchedulingQueue::Backoff(const Info& info) const {
  // kube-scheduler's calculateBackoffDuration: initial, doubled per attempt after the first.
  absl::Duration d = timing_.initial_backoff;
  for (int i = 1; i < info.attempts; ++i) {
    d *= 2;
    if (d > timing_.max_backoff) return timing_.max_backoff;
  }
  return d;
}

void SchedulingQueue::ToActive(const std::string& key, Info& info) {
  if (info.where != Where::kActive) active_.push_back(key);
  info.where = Where::kActive;
  info.seq = next_seq_++;
}

void SchedulingQueue::MoveToActiveOrBackoff(const std::string& key, Info& info, absl::Time now) {
  if (info.timestamp + Backoff(info) > now) {
    info.where = Where::kBackoff;
  } else {
    ToActive(key, info);
  }
}

void SchedulingQueue::Add(const std::string& key, int32_t priority, absl::Time now) {
  Info& info = pods_[key];
  info.priority = priority;
  info.timestamp = now;
  ToActive(key, info);
}

void SchedulingQueue::Update(const std::string& key, int32_t priority, bool spec_changed,
                             absl::Time now) {
  auto it = pods_.find(key);
  if (it == pods_.end()) {
    Add(key, priority, now);
    return;
  }
  Info& info = it->second;
  info.priority = priority;
  switch (info.where) {
    case Where::kActive:
      return;
    case Where::kBackoff:
      ToActive(key, info);
      return;
    case Where::kUnschedulable:
      if (spec_changed) ToActive(key, info);
      return;
    case Where::kNone:  // being tried: queued again (kube-scheduler's Update does the same)
      ToActive(key, info);
      return;
  }
}

void SchedulingQueue::Delete(const std::string& key) {
  auto it = pods_.find(key);
  if (it == pods_.end()) return;
  if (it->second.where == Where::kActive) std::erase(active_, key);
  pods_.erase(it);
}

void SchedulingQueue::MoveAll(absl::Time now) {
  for (auto& [key, info] : pods_) {
    if (info.where == Where::kUnschedulable) MoveToActiveOrBackoff(key, info, now);
  }
  move_request_cycle_ = scheduling_cycle_;
}

std::optional<std::string> SchedulingQueue::Pop() {
  if (active_.empty()) return std::nullopt;
  auto best = active_.begin();
  for (auto it = active_.begin(); it != active_.end(); ++it) {
    const Info& a = pods_.at(*it);
    const Info& b = pods_.at(*best);
    if (a.priority != b.priority
            ? a.priority > b.priority
            : (a.timestamp != b.timestamp ? a.timestamp < b.timestamp : a.seq < b.seq)) {
      best = it;
    }
  }
  std::string key = *best;
  active_.erase(best);
  Info& info = pods_.at(key);
  info.where = Where::kNone;
  ++info.attempts;
  ++scheduling_cycle_;
  return key;
}

void SchedulingQueue::AddUnschedulable(const std::string& key, int32_t priority, absl::Time now) {
  Info& info = pods_[key];
  if (info.where != Where::kNone) return;  // queued again meanwhile (updated while tried)
  info.priority = priority;
  if (info.attempts == 0) info.attempts = 1;
  info.timestamp = now;
  // A move request since the attempt began: the cluster changed while the pod was tried.
  info.where = move_request_cycle_ >= scheduling_cycle_ ? Where::kBackoff : Where::kUnschedulable;
}

void SchedulingQueue::FlushBackoffCompleted(absl::Time now) {
  for (auto& [key, info] : pods_) {
    if (info.where == Where::kBackoff && info.timestamp + Backoff(info) <= now) ToActive(key, info);
  }
}

void SchedulingQueue::FlushUnschedulableLeftover(absl::Time now) {
  bool moved = false;
  for (auto& [key, info] : pods_) {
    if (info.where == Where::kUnschedulable &&
        now - info.timestamp > timing_.unschedulable_timeout) {
      MoveToActiveOrBackoff(key, info, now);
      moved = true;
    }
  }
  // kube-scheduler's leftover flush is a move request too (movePodsToActiveOrBackoffQueue).
  if (moved) move_request_cycle_ = scheduling_cycle_;
}

size_t SchedulingQueue::UnschedulableCount() const {
  size_t n = 0;
  for (const auto& [key, info] : pods_) n += info.where == Where::kUnschedulable ? 1 : 0;
  return n;
}

SchedulingQueue::Where SchedulingQueue::Find(const std::string& key) const {
  auto it = pods_.find(key);
  return it == pods_.end() ? Where::kNone : it->second.where;
}

int SchedulingQueue::Attempts(const std::string& key) const {
  auto it = pods_.find(key);
  return it == pods_.end() ? 0 : it->second.attempts;
}

absl::Time SchedulingQueue::BackoffEnds(const std::string& key) const {
  auto it = pods_.find(key);
  return it == pods_.end() ? absl::InfinitePast() : it->second.timestamp + Backoff(it->second);
}

}  // namespace dynmig::local
