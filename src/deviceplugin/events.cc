#include "deviceplugin/events.h"

#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {

kube::Object NodeRef(std::string_view node_name) {
  return kube::Object{
      {"kind", "Node"}, {"apiVersion", "v1"}, {"metadata", {{"name", std::string(node_name)}}}};
}

EventRecorder::EventRecorder(kube::KubeClient& kube, std::string component, const Clock& clock,
                             size_t max_queue)
    : kube_(kube),
      component_(std::move(component)),
      clock_(clock),
      max_queue_(max_queue == 0 ? 1 : max_queue),
      thread_([this] { Run(); }) {}

EventRecorder::~EventRecorder() {
  Flush(absl::Seconds(2));
  {
    dynmig::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  thread_.join();
}

void EventRecorder::Record(const kube::Object& involved, std::string_view type,
                           std::string_view reason, std::string_view message) {
  const std::string kind = kube::Kind(involved);
  const std::string what =
      kube::Namespace(involved).empty()
          ? fmt::format("{} {}", kind, kube::Name(involved))
          : fmt::format("{} {}/{}", kind, kube::Namespace(involved), kube::Name(involved));
  if (type == "Warning") {
    spdlog::warn("event {} on {}: {}", reason, what, message);
  } else {
    spdlog::info("event {} on {}: {}", reason, what, message);
  }
  kube::Object ref = involved;
  if (!ref.contains("kind") || !ref["kind"].is_string()) ref["kind"] = kind;
  kube::Object event = kube::NewEvent(ref, type, reason, message, component_, clock_.Now());
  dynmig::MutexLock lock(&mu_);
  recent_.push_back({what, std::string(type), std::string(reason), std::string(message)});
  while (recent_.size() > 512) recent_.pop_front();
  if (queue_.size() >= max_queue_) {
    queue_.pop_front();
    ++dropped_;
  }
  queue_.push_back(std::move(event));
  cv_.SignalAll();
}

bool EventRecorder::Flush(absl::Duration timeout) {
  dynmig::MutexLock lock(&mu_);
  return clock_.WaitFor(idle_cv_, mu_, timeout, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && !sending_;
  });
}

std::vector<RecordedEvent> EventRecorder::Recent() const {
  dynmig::MutexLock lock(&mu_);
  return {recent_.begin(), recent_.end()};
}

bool EventRecorder::Has(std::string_view reason, std::string_view text) const {
  dynmig::MutexLock lock(&mu_);
  for (const auto& e : recent_) {
    if (e.reason == reason && e.message.find(text) != std::string::npos) return true;
  }
  return false;
}

uint64_t EventRecorder::dropped() const {
  dynmig::MutexLock lock(&mu_);
  return dropped_;
}

uint64_t EventRecorder::failed() const {
  dynmig::MutexLock lock(&mu_);
  return failed_;
}

void EventRecorder::Run() {
  while (true) {
    kube::Object event;
    {
      dynmig::MutexLock lock(&mu_);
      while (!stop_ && queue_.empty()) cv_.Wait(&mu_);
      if (stop_) return;  // the destructor already gave the queue a bounded chance
      event = std::move(queue_.front());
      queue_.pop_front();
      sending_ = true;
    }
    auto created = kube_.CreateEvent(event);
    if (!created.ok()) {
      spdlog::debug("event {} not sent: {}", event.value("reason", ""),
                    std::string(created.status().message()));
    }
    dynmig::MutexLock lock(&mu_);
    if (!created.ok()) ++failed_;
    sending_ = false;
    if (queue_.empty()) idle_cv_.SignalAll();
  }
}

}  // namespace dynmig::deviceplugin
