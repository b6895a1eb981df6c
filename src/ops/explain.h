// `dynmig explain [-n NS] POD`: why a pod is pending, or where it was placed.
//
// Placed (it carries hami.io/vgpu-mig-allocations): the node, GPU, profile, placement and runtime
// identity of each instance, and the GPU's picture with the pod's slices highlighted.
//
// Pending: the extender's own planner (scheduler::ClusterState rebuilt from the cluster without
// this pod, then mig::PlanPodOnNode per node) gives each node's and GPU's verdict and reason, with
// each GPU's free slices drawn; where it would be placed now if anywhere (and, then, that the wait
// is outside the extender: cordoned nodes, other predicates, the pod's PodScheduled condition);
// and what would make it fit: the largest per-instance memory with which the same pod would fit
// now, the profiles (as nvidia.com/mig-profile-preference values) that cover the request and have a
// free placement now, and on the closest GPUs the pods holding the blocking slices (the defrag
// analysis, for one instance of the first container's profile) and whether they could go
// elsewhere.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kube/kube_client.h"
#include "ops/cluster.h"
#include "ops/picture.h"
#include "ops/report.h"

namespace dynmig::ops {

struct ExplainOptions {
  std::string ns = "default";
  std::string pod;
  DeviceConfigQuery config;
  size_t closest_gpus = 3;  // GPUs shown in the blocking-pods analysis
};

// A whole-GPU pod (nvidia.com/vgpu-mode: hami-core): "whole-gpu-off" while
// nvidia.migModeSwitching is off; placed: its node and whole GPUs (each served by the device plugin
// or not yet); pending: each node's reason from ClusterState::PlanAndReserveWhole ("no whole GPU
// free for the pod (needs 1, 0 free): 1 GPU in MIG mode, 1 whole GPU in use by ns/p").
//
// json "status": "placed" | "pending" | "fits-now" | "not-mig" | "invalid-request" | "terminated"
// | "whole-gpu-off"; for whole-GPU pods also "mode": "hami-core".
// Errors: kNotFound (no such pod), the client's errors.
absl::StatusOr<CommandOutput> RunExplain(kube::KubeClient& client, const ExplainOptions& options,
                                         const SlicePainter& painter, absl::Time now);

}  // namespace dynmig::ops
