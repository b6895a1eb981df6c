// What kube-scheduler does with an extender, for the local mode and the end-to-end tests: watch
// pending pods of our scheduler name, call the extender's filter over HTTP with the candidate
// node names (nodeCacheCapable), then its bind verb, exactly as the KubeSchedulerConfiguration in
// deploy/ tells kube-scheduler to, over HTTPS with the tlsConfig's CA and client certificate.
// Pods the extender rejects stay Pending with kube-scheduler's
// PodScheduled=False condition and a FailedScheduling event carrying the reasons.
//
// Retries follow kube-scheduler v1.20 (SchedulingQueue): one pod at a time is tried; binding runs
// apart from it (several binds in flight), a failed pod waits in backoff (1 s doubling to 10 s) or
// among the unschedulable pods until a cluster event that may help (a node added; a node's
// allocatable, labels, taints, conditions or unschedulable changed; any node update while no pod
// is unschedulable; an assigned pod deleted; the pod's own spec or metadata changed) or the
// periodic flush (pods unschedulable for over 60 s, checked every 30 s). A Node annotation change
// is not such an event. The timing is injectable (tests shrink it); the default is
// kube-scheduler's.
//
// Not a scheduler: no resource fit, inter-pod affinity or scoring beyond what the extender
// decides; kube-scheduler's own node filters are applied (cordon unless tolerated, nodeSelector,
// required node affinity). With default_scheduler it also schedules pods of schedulerName
// "default-scheduler" (no extender, the first node that passes), as a cluster's default
// kube-scheduler does for pods without GPUs. The queue's times, backoffs and periodic flushes run
// on the injected clock. Thread-safe; owns one thread plus one per bind in flight.
#pragma once

#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "kube/informer.h"
#include "kube/kube_client.h"
#include "local/scheduler_config.h"
#include "local/scheduling_queue.h"

namespace dynmig::local {

struct SchedulerLoopOptions {
  SchedulerConfig config;
  std::string extender_url;  // overrides config.extender.url_prefix ("http://127.0.0.1:PORT")
  // When set, asked before each extender call and preferred when it answers non-empty (a
  // Service in front of several scheduler replicas routes to the leader).
  std::function<std::string()> extender_url_source;
  // Overrides config.extender.tls (the local mode's own CA and client certificate).
  std::optional<ExtenderTlsConfig> tls;
  SchedulingQueueTiming timing;  // kube-scheduler v1.20's
  bool default_scheduler = false;
  // Tests: one line per cluster event the queue handled and whether it requeued pods, e.g.
  // "node node-a added: requeue", "node node-a updated: no requeue", "pod default/p deleted:
  // requeue". May be empty.
  std::function<void(const std::string&)> observe;
  std::function<void(const std::string&)> log;  // one line per decision; may be empty
};

class SchedulerLoop {
 public:
  // `client` and `clock` must outlive the loop.
  SchedulerLoop(kube::KubeClient& client, const Clock& clock, SchedulerLoopOptions options);
  ~SchedulerLoop();  // Stop()

  void Start();
  // Stops the loop and waits for the binds in flight.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Where a pending pod ("namespace/name") waits now (tests).
  SchedulingQueue::Where QueueOf(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  int Attempts(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Binder;
  bool Responsible(const kube::Object& pod) const;
  bool Pending(const kube::Object& pod) const;
  void OnPodAdd(const kube::Object& pod) ABSL_LOCKS_EXCLUDED(mu_);
  void OnPodUpdate(const kube::Object& old_pod, const kube::Object& new_pod)
      ABSL_LOCKS_EXCLUDED(mu_);
  void OnPodDelete(const kube::Object& pod) ABSL_LOCKS_EXCLUDED(mu_);
  void OnNodeUpdate(const kube::Object& old_node, const kube::Object& new_node)
      ABSL_LOCKS_EXCLUDED(mu_);
  void MoveAll() ABSL_LOCKS_EXCLUDED(mu_);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // One scheduling cycle of the pod, in kube-scheduler's steps (below).
  void ScheduleOne(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // The pod is assumed already (its bind is in flight): true when this attempt ends here.
  bool AlreadyAssumed(const std::string& key, const kube::Object& pod) ABSL_LOCKS_EXCLUDED(mu_);
  // The pod's resourceVersion on the API server now ("" when it cannot be read).
  std::string ResourceVersionNow(const kube::Object& pod);
  // kube-scheduler's own filters (cordon unless tolerated, nodeSelector, required node affinity):
  // the nodes that pass; none: the attempt failed.
  std::vector<std::string> FeasibleNodes(const std::string& key, const kube::Object& pod);
  // The extender's filter over `nodes`: the node chosen, or nullopt when the attempt failed.
  std::optional<std::string> FilterByExtender(const std::string& key, const kube::Object& pod,
                                              const std::vector<std::string>& nodes);
  // Assumes the pod on `node` and binds it apart from the loop (kube-scheduler's binding cycle).
  void AssumeAndBind(kube::ObjectPtr pod, const std::string& node, bool extender,
                     const std::string& updated_in_cycle) ABSL_LOCKS_EXCLUDED(mu_);
  // updated_in_cycle: "A -> B", the pod's resourceVersions when its cycle started and when it
  // was assumed, if they differ (reported after the bind as kube-scheduler's requeued copy would).
  void Bind(kube::ObjectPtr pod, std::string node, bool extender, std::string updated_in_cycle)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The attempt failed: the pod goes back to the queue (if it still waits) and its condition and
  // a FailedScheduling event say why.
  void Failed(const std::string& key, const std::string& reason, const std::string& message)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool UsesManagedResources(const kube::Object& pod) const;
  const ExtenderTlsConfig& Tls() const;
  std::string ExtenderBase() const;
  void Log(const std::string& line) const;
  void ReapBinders(bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  kube::KubeClient& client_;
  const Clock& clock_;
  const SchedulerLoopOptions options_;
  kube::Informer pods_;
  kube::Informer nodes_;
  dynmig::Mutex mu_;
  dynmig::CondVar cv_;  // signalled when the queue changes or the loop is to stop
  SchedulingQueue queue_ ABSL_GUARDED_BY(mu_);
  // uids bound or being bound, not yet seen bound -> whether the pod was updated during its cycle
  // (its binder reports that; the requeued copy then fails quietly).
  std::map<std::string, bool> assumed_ ABSL_GUARDED_BY(mu_);
  std::list<std::unique_ptr<Binder>> binders_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace dynmig::local
