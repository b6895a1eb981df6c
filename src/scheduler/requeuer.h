// Requeuer: tells kube-scheduler to try its pending MIG pods again when MIG capacity frees.
//
// kube-scheduler keeps a pod the extender refused among its unschedulable pods until a cluster
// event that may help: a node added, a node's allocatable, labels, taints, conditions or
// unschedulable changed, an assigned pod deleted, the pod itself changed; otherwise until its
// periodic flush (60 s in v1.20, 5 minutes in current releases). MIG capacity frees through
// events it does not act on: the device plugin destroys an instance and rewrites annotations
// (held slices, idle instances), an operator lifts a GPU cordon (an annotation), a defragmentation
// reservation becomes usable, a reservation expires, or the pod deletion reached kube-scheduler
// before it reached this scheduler's cache (the retry it caused was refused). Each of those left
// a waiting pod idle for up to the flush period.
//
// The cluster state compares each node's occupancy whenever it rebuilds the node's view
// (ClusterState::Occupancy, CapacityGrew). Each pass (on the leader, every
// RequeueOptions::interval) asks it which nodes' capacity grew since the last pass
// (ClusterState::FreedSince: a GPU's occupied slices lost one, a GPU or the node became
// schedulable, a GPU or node appeared, fewer defragmentation holds are blocked); they are due;
// while MIG pods are pending, a due node gets the label dynmig.io/capacity-freed set to the time in
// unix milliseconds: a Node label change, which kube-scheduler answers by moving its unschedulable
// pods back to its active queue (or its backoff queue when their backoff has not ended). Nothing is
// written while no MIG pod is pending. A node is labelled at most once per `min_gap`, so pods
// created and deleted in a loop cause at most one Node write per node per min_gap; a failed write
// is retried by the next pass.
//
// Not thread-safe: one loop calls RunOnce.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "kube/kube_client.h"
#include "scheduler/cluster_state.h"

namespace dynmig::scheduler {

struct RequeueOptions {
  // How often the leader compares occupancy; zero: no loop (tests call RunOnce).
  absl::Duration interval = absl::Seconds(1);
  // The least time between two labels of one node.
  absl::Duration min_gap = absl::Seconds(1);
};

class Requeuer {
 public:
  // `client`, `state` and `clock` must outlive the requeuer.
  Requeuer(kube::KubeClient& client, const ClusterState& state, const Clock& clock,
           RequeueOptions options)
      : client_(client), state_(state), clock_(clock), options_(options) {}

  struct Outcome {
    std::vector<std::string> labelled;  // nodes labelled by this pass
    std::vector<std::string> errors;    // failed writes (the node stays due)
  };
  // One pass; `pending`: how many MIG pods are pending now.
  Outcome RunOnce(size_t pending);

  // Nodes whose capacity grew and that were not labelled yet (rate limit, failed write).
  const std::set<std::string>& due() const { return due_; }

 private:
  kube::KubeClient& client_;
  const ClusterState& state_;
  const Clock& clock_;
  const RequeueOptions options_;

  bool has_baseline_ = false;
  uint64_t seq_ = 0;  // ClusterState::FreedSince's position
  std::set<std::string> due_;
  std::map<std::string, absl::Time> labelled_at_;
};

}  // namespace dynmig::scheduler
