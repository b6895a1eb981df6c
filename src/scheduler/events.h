// EventRecorder: Kubernetes Events about pods (MigReserved, MigPending, ...), written on a worker
// thread so that a filter never waits for the API server. Repeats of the same pod, reason and
// message within `dedupe_window` are dropped (kube-scheduler retries a pending pod often); when
// the queue is full new events are dropped and counted. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "absl/time/time.h"
#include "common/clock.h"
#include "kube/kube_client.h"

namespace dynmig::scheduler {

struct EventRecorderOptions {
  std::string component = "dynmig-scheduler";
  size_t max_queue = 4096;
  absl::Duration dedupe_window = absl::Minutes(10);
};

class EventRecorder {
 public:
  EventRecorder(kube::KubeClient& client, const Clock& clock, EventRecorderOptions options = {});
  ~EventRecorder();  // stops; events still queued are dropped (Flush first to keep them)
  EventRecorder(const EventRecorder&) = delete;
  EventRecorder& operator=(const EventRecorder&) = delete;

  // Queues an Event about `pod` (only its kind, namespace, name, uid and resourceVersion are
  // used). `type` is "Normal" or "Warning". Messages are cut to 1024 bytes.
  void Record(const kube::Object& pod, std::string_view type, std::string_view reason,
              std::string message);

  // Waits until every queued event was written (or failed); false on timeout. For tests.
  bool Flush(absl::Duration timeout);

  int64_t written() const;
  int64_t dropped() const;  // queue full or write failed

 private:
  void Run();

  kube::KubeClient& client_;
  const Clock& clock_;
  const EventRecorderOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<kube::Object> queue_;
  std::map<std::string, absl::Time> recent_;  // pod|reason|message -> last recorded
  bool busy_ = false;
  bool stopping_ = false;
  int64_t written_ = 0;
  int64_t dropped_ = 0;
  std::thread thread_;
};

}  // namespace dynmig::scheduler
