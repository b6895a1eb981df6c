// `dynmig preflight`: can a node be handed over to dynamic MIG, and what blocks it.
//
// Per node (every GPU node, or --node):
//   legacy-pods        FAIL: active pods of a legacy allocator (a `GPU-<uuid>[<t>-<s>]` identity
//                      in hami.io/vgpu-devices-allocated or -to-allocate, or a request of NVIDIA's
//                      `nvidia.com/mig-<profile>`) that a no-drain handover does not prove: the
//                      node's NVML view (`nvml`, read only for nodes with legacy pods) is
//                      unreadable, or its handover plan is blocked (handover.h). Drain them, or
//                      clear the blockers (`dynmig handover plan`). PASS when the plan proves
//                      every one of them: they stay.
//   register-format    FAIL: hami.io/node-nvidia-register in the legacy template format
//   mig-manager        FAIL: NVIDIA MIG Manager may still own the node: a running mig-manager pod
//                      on it, or an nvidia.com/mig.config label while nvidia.com/gpu.deploy.
//                      mig-manager is not "false"; WARN: the label is left behind on a node where
//                      MIG Manager is disabled and not running
//   cordoned           FAIL: the node is schedulable (cordon it first)
//   gpu-workloads      FAIL: active pods on the node that request GPU resources (HAMi's or
//                      NVIDIA's MIG resources), other than legacy pods the no-drain handover
//                      proves (drain them)
// Cluster-wide:
//   legacy-scheduler   FAIL: a legacy scheduler still serves: an active pod whose name, container
//                      names or images contain "hami-scheduler" or "vgpu-scheduler" (HAMi's
//                      deployment, its extender container, the old 4paradigm image) and nothing of
//                      which (name, labels, images) mentions "dynmig". Deployments are not read:
//                      a Deployment serves through its pods, and one scaled to zero serves nothing.
//   device-config      FAIL: the scheduler config still holds knownMigGeometries (run `dynmig
//                      config migrate`), has no migProfileAllowlist, or does not parse; WARN: none
//                      was found
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kube/kube_client.h"
#include "ops/cluster.h"
#include "ops/nvml_view.h"
#include "ops/report.h"

namespace dynmig::ops {

struct PreflightOptions {
  std::string node;  // "" = every GPU node
  DeviceConfigQuery config;
};

// `nvml` may be null (legacy pods then always FAIL `legacy-pods`: nothing proves them).
// Errors: kNotFound (no such node, or a named config that does not exist), the client's errors.
absl::StatusOr<CheckReport> RunPreflight(kube::KubeClient& client, NvmlSource* nvml,
                                         const PreflightOptions& options, absl::Time now);

// The legacy-scheduler heuristic, for one pod (see above).
bool IsLegacySchedulerPod(const kube::Object& pod);
// A MIG Manager pod: its name or an image contains "mig-manager".
bool IsMigManagerPod(const kube::Object& pod);

}  // namespace dynmig::ops
