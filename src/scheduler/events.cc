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
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
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
    std::lock_guard<std::mutex> lock(mu_);
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
    queue_.push_back(kube::NewEvent(involved, type, reason, message, options_.component, now));
  }
  cv_.notify_one();
}

void EventRecorder::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) {
      // Do not hold a shutdown up on a slow API server: what is still queued is dropped.
      dropped_ += static_cast<int64_t>(queue_.size());
      queue_.clear();
      break;
    }
    kube::Object event = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    auto created = client_.CreateEvent(event);
    lock.lock();
    busy_ = false;
    if (created.ok()) {
      ++written_;
    } else {
      ++dropped_;
      spdlog::debug("event {} not written: {}", event.value("reason", std::string()),
                    std::string(created.status().message()));
    }
    if (queue_.empty()) idle_cv_.notify_all();
  }
  idle_cv_.notify_all();
}

bool EventRecorder::Flush(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                           [this] { return queue_.empty() && !busy_; });
}

int64_t EventRecorder::written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return written_;
}

int64_t EventRecorder::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

}  // namespace dynmig::scheduler
