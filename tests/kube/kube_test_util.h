// Shared helpers for the kube tests: object builders, a fast server+client pair, and an event
// recorder that tests wait on (bounded) instead of sleeping.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "kube/in_memory_api_server.h"
#include "kube/kube_client.h"
#include "kube/rest_kube_client.h"

namespace dynmig::kube::testing {

inline Object MakePod(const std::string& name, const std::string& ns = "default",
                      const std::string& node = "", Object labels = Object::object()) {
  Object pod = {{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata", {{"name", name}, {"namespace", ns}, {"labels", labels}}},
                {"spec",
                 {{"containers",
                   {{{"name", "main"},
                     {"image", "busybox"},
                     {"resources", {{"limits", {{"nvidia.com/gpu", "1"}}}}}}}}}}};
  if (!node.empty()) pod["spec"]["nodeName"] = node;
  return pod;
}

inline Object MakeNode(const std::string& name, Object labels = Object::object()) {
  return Object{{"apiVersion", "v1"},
                {"kind", "Node"},
                {"metadata", {{"name", name}, {"labels", labels}}},
                {"status",
                 {{"capacity", {{"nvidia.com/gpu", "8"}, {"cpu", "64"}}},
                  {"allocatable", {{"nvidia.com/gpu", "8"}, {"cpu", "64"}}}}}};
}

// Records retry sleeps instead of sleeping.
class SleepRecorder {
 public:
  std::function<void(absl::Duration)> Fn() {
    return [this](absl::Duration d) {
      dynmig::MutexLock lock(&mu_);
      sleeps_.push_back(d);
    };
  }
  std::vector<absl::Duration> Get() const {
    dynmig::MutexLock lock(&mu_);
    return sleeps_;
  }

 private:
  mutable dynmig::Mutex mu_;
  std::vector<absl::Duration> sleeps_ ABSL_GUARDED_BY(mu_);
};

inline InMemoryApiServerOptions FastServerOptions() {
  InMemoryApiServerOptions options;
  options.bookmark_interval = absl::Milliseconds(100);
  options.watch_heartbeat = absl::Milliseconds(200);
  options.gc_interval = absl::Milliseconds(20);
  options.keep_alive_timeout = absl::Seconds(1);
  return options;
}

inline std::unique_ptr<RestKubeClient> MakeClient(const std::string& url,
                                                  SleepRecorder* sleeps = nullptr,
                                                  int max_attempts = 4) {
  RestConfig config;
  config.server = url;
  config.retry.max_attempts = max_attempts;
  config.retry.initial_backoff = absl::Milliseconds(10);
  config.retry.max_backoff = absl::Milliseconds(80);
  config.retry.jitter = 0;
  config.request_timeout = absl::Seconds(20);
  if (sleeps != nullptr) config.retry.sleep = sleeps->Fn();
  auto client = RestKubeClient::Create(config);
  EXPECT_TRUE(client.ok()) << client.status();
  return std::move(*client);
}

// Thread-safe list of watch events (or anything) with a bounded wait for a condition.
template <typename T>
class Recorder {
 public:
  void Add(T item) {
    dynmig::MutexLock lock(&mu_);
    items_.push_back(std::move(item));
    cv_.SignalAll();
  }
  std::vector<T> Get() const {
    dynmig::MutexLock lock(&mu_);
    return items_;
  }
  size_t size() const {
    dynmig::MutexLock lock(&mu_);
    return items_.size();
  }
  // Waits (at most `timeout` of real time: the items come from other threads) until pred(items)
  // holds.
  bool WaitUntil(const std::function<bool(const std::vector<T>&)>& pred,
                 absl::Duration timeout = absl::Seconds(10)) const {
    dynmig::MutexLock lock(&mu_);
    const absl::Time deadline = absl::Now() + timeout;
    while (!pred(items_)) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) return pred(items_);
    }
    return true;
  }
  bool WaitForSize(size_t n, absl::Duration timeout = absl::Seconds(10)) const {
    return WaitUntil([n](const std::vector<T>& v) { return v.size() >= n; }, timeout);
  }

 private:
  mutable dynmig::Mutex mu_;
  mutable dynmig::CondVar cv_;  // signalled on every Add
  std::vector<T> items_ ABSL_GUARDED_BY(mu_);
};

// Polls `pred` until true or the timeout of real time (for state owned by other processes/threads
// without a notification hook). Returns the final value.
inline bool Eventually(const std::function<bool()>& pred,
                       absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return pred();
}

}  // namespace dynmig::kube::testing
