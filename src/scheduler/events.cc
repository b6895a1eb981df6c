#include "scheduler/events.h"

#include "kube/object.h"
#include "spdlog/spdlog.h"

namespace dynmig::scheduler {

EventRecorder::EventRecorder(kube::KubeClient& client, const Clock& clock,
                             EventRecorderOptions options)
    : client_(client), clock_(clock), options_(std::move(options)) {
  thread_ = std::thread([this] { Run(); });
}

EventRecorder::~EventRecorder() {
  {
    dynmig::MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

void EventRecorder::Record(const kube::Object& pod, std::string_view type, std::string_view reason,
                           std::string message) {
  constexpr size_t kMaxMessage = 1024;
  if (message.size() > kMaxMessage) {
    message.resize(kMaxMessage - 3);
    message += "...";
  }
  const std::string ns = kube::Namespace(pod).empty() ? "default" : kube::Namespace(pod);
  const absl::Time now = clock_.Now();
  kube::Object involved = {{"kind", "Pod"},
                           {"apiVersion", "v1"},
                           {"metadata", {{"name", kube::Name(pod)}, {"namespace", ns}}}};
  if (!kube::Uid(pod).empty()) involved["metadata"]["uid"] = kube::Uid(pod);
  if (!kube::ResourceVersion(pod).empty()) {
    involved["metadata"]["resourceVersion"] = kube::ResourceVersion(pod);
  }
  const std::string key = ns + "/" + kube::Name(pod) + "|" + std::string(reason) + "|" + message;
  {
    dynmig::MutexLock lock(&mu_);
    if (auto it = recent_.find(key);
        it != recent_.end() && now - it->second < options_.dedupe_window) {
      return;
    }
    if (recent_.size() > 10000) {
      for (auto it = recent_.begin(); it != recent_.end();) {
        it = now - it->second >= options_.dedupe_window ? recent_.erase(it) : std::next(it);
      }
    }
    if (queue_.size() >= options_.max_queue) {
      ++dropped_;
      return;
    }
    recent_[key] = now;
    if (options_.max_recent > 0) {
      shown_.push_front(RecentEvent{.time = now,
                                    .type = std::string(type),
                                    .reason = std::string(reason),
                                    .pod = ns + "/" + kube::Name(pod),
                                    .message = message});
      if (shown_.size() > options_.max_recent) shown_.pop_back();
    }
    queue_.push_back(kube::NewEvent(involved, type, reason, message, options_.component, now));
  }
  cv_.Signal();
}

void EventRecorder::Run() {
  dynmig::MutexLock lock(&mu_);
  while (true) {
    while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
    if (stopping_) {
      // Do not hold a shutdown up on a slow API server: what is still queued is dropped.
      dropped_ += static_cast<int64_t>(queue_.size());
      queue_.clear();
      break;
    }
    kube::Object event = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    mu_.Unlock();
    auto created = client_.CreateEvent(event);
    mu_.Lock();
    busy_ = false;
    if (created.ok()) {
      ++written_;
    } else {
      ++dropped_;
      spdlog::debug("event {} not written: {}", event.value("reason", std::string()),
                    std::string(created.status().message()));
    }
    if (queue_.empty()) idle_cv_.SignalAll();
  }
  idle_cv_.SignalAll();
}

bool EventRecorder::Flush(absl::Duration timeout) {
  dynmig::MutexLock lock(&mu_);
  return clock_.WaitFor(idle_cv_, mu_, timeout, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && !busy_;
  });
}

std::vector<RecentEvent> EventRecorder::Recent() const {
  dynmig::MutexLock lock(&mu_);
  return {shown_.begin(), shown_.end()};
}

int64_t EventRecorder::written() const {
  dynmig::MutexLock lock(&mu_);
  return written_;
}

int64_t EventRecorder::dropped() const {
  dynmig::MutexLock lock(&mu_);
  return dropped_;
}

}  // namespace dynmig::scheduler
