// What kube-scheduler does with an extender, for the local mode and the end-to-end tests: watch
// pending pods of our scheduler name, call the extender's filter over HTTP with the candidate
// node names (nodeCacheCapable), then its bind verb, exactly as the KubeSchedulerConfiguration in
// deploy/ tells kube-scheduler to, over HTTPS with the tlsConfig's CA and client certificate. Pods
// the extender rejects stay Pending with kube-scheduler's PodScheduled=False condition and a
// FailedScheduling event carrying the reasons; they are retried when nodes or pods change and
// periodically.
//
// Not a scheduler: no resource fit, affinity or scoring beyond what the extender decides; nodes
// that are cordoned (spec.unschedulable) are skipped. Thread-safe; owns one thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "kube/informer.h"
#include "kube/kube_client.h"
#include "local/scheduler_config.h"

namespace dynmig::local {

struct SchedulerLoopOptions {
  SchedulerConfig config;
  std::string extender_url;  // overrides config.extender.url_prefix ("http://127.0.0.1:PORT")
  // Overrides config.extender.tls (the local mode's own CA and client certificate).
  std::optional<ExtenderTlsConfig> tls;
  absl::Duration retry_interval = absl::Seconds(2);
  std::function<void(const std::string&)> log;  // one line per decision; may be empty
};

class SchedulerLoop {
 public:
  SchedulerLoop(kube::KubeClient& client, SchedulerLoopOptions options);
  ~SchedulerLoop();  // Stop()

  void Start();
  void Stop();

  // One pass over the pending pods (the thread calls it; tests may too). Returns pods bound.
  int SchedulePending();

 private:
  struct Outcome;
  Outcome ScheduleOne(const kube::Object& pod, const std::vector<std::string>& nodes);
  bool UsesManagedResources(const kube::Object& pod) const;
  const ExtenderTlsConfig& Tls() const;
  void MarkUnschedulable(const kube::Object& pod, const std::string& message);
  void Log(const std::string& line) const;

  kube::KubeClient& client_;
  const SchedulerLoopOptions options_;
  kube::Informer pods_;
  kube::Informer nodes_;
  std::map<std::string, std::string> last_message_;  // pod key -> last unschedulable message
  std::set<std::string> assumed_bound_;              // uids bound but not yet seen bound
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool dirty_ = true;
  std::thread thread_;
};

}  // namespace dynmig::local
