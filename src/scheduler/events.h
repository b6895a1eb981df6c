// EventRecorder: Kubernetes Events about pods (MigReserved, MigPending, ...), written on a worker
// thread so that a filter never waits for the API server. Repeats of the same pod, reason and
// message within `dedupe_window` are dropped (kube-scheduler retries a pending pod often); when
// the queue is full new events are dropped and counted. The last `max_recent` events queued are
// also kept in memory, newest first, for the live page (server.h GET /live). Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "kube/kube_client.h"

namespace dynmig::scheduler {

struct EventRecorderOptions {
  std::string component = "dynmig-scheduler";
  size_t max_queue = 4096;
  absl::Duration dedupe_window = absl::Minutes(10);
  size_t max_recent = 100;  // events kept for Recent()
};

// An event as the live page lists it.
struct RecentEvent {
  absl::Time time;
  std::string type;    // Normal or Warning
  std::string reason;  // MigReserved, MigPending, ...
  std::string pod;     // namespace/name
  std::string message;
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
              std::string message) ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until every queued event was written (or failed); false on timeout (of the clock's
  // monotonic time). For tests.
  bool Flush(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  // The last options.max_recent events queued (dedupe and a full queue drop them here too), newest
  // first.
  std::vector<RecentEvent> Recent() const ABSL_LOCKS_EXCLUDED(mu_);

  int64_t written() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t dropped() const ABSL_LOCKS_EXCLUDED(mu_);  // queue full or write failed

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  kube::KubeClient& client_;
  const Clock& clock_;
  const EventRecorderOptions options_;

  mutable dynmig::Mutex mu_;
  dynmig::CondVar cv_;
  dynmig::CondVar idle_cv_;
  std::deque<kube::Object> queue_ ABSL_GUARDED_BY(mu_);
  // pod|reason|message -> last recorded
  std::map<std::string, absl::Time> recent_ ABSL_GUARDED_BY(mu_);
  std::deque<RecentEvent> shown_ ABSL_GUARDED_BY(mu_);  // newest first, at most max_recent
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace dynmig::scheduler
