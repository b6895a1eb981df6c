// `dynmig validate`: the migration guide's validation checklist, each item PASS/FAIL with evidence.
//
// Node capability (every node with hami.io/node-nvidia-register, or --node):
//   legacy-pods          only on a node with legacy pods (HAMi GPU-uuid[t-s] ids, NVIDIA
//                        nvidia.com/mig-* requests): PASS when the no-drain handover plan
//                        (handover.h) has nothing blocking, FAIL with its blockers otherwise
//   device-plugin        the plugin is alive: its NVML view endpoint answers (when configured)
//                        and its hami.io/node-handshake report is younger than the scheduler's
//                        report timeout (3m); a stale or Deleted handshake or an unreachable
//                        endpoint: FAIL (the registration outlives a stopped plugin); neither an
//                        endpoint nor a handshake: WARN
//   registered-mode      every registered GPU is in mode "mig" (legacy format: FAIL)
//   mig-profiles         every MIG GPU has a non-empty migProfiles
//   capability           each registered profile's memory, slice count and placements equal
//                        NVML's: the node's NVML view endpoint when reachable, else the catalogue
//                        entry of the model (the item says which); neither: WARN
//   allowlist-exposure   no GPU of a model without an allowlist entry, and no profile outside its
//                        entry, is exposed
// Per active MIG pod on those nodes (IsMigPod or carrying a reservation, not terminated):
//   pod-reservation      the scheduler wrote hami.io/vgpu-mig-allocations and it decodes; no
//                        legacy identities, unless the node's NVML view proves the pod holds its
//                        instances (a legacy pod handed over without draining: PASS, and the
//                        pod's other checks do not apply)
//   pod-profile          each reserved profile's memory covers the container's request, and each
//                        container got as many instances as it asked for
//   pod-overlap          no reservation overlaps another active reservation (or is illegal, or
//                        names a GPU the node does not register)
//   pod-runtime          after Allocate (pod Running, or bind-phase success) every entry has its
//                        MIG UUID, GI ID and CI ID; pending pods: SKIP
//   pod-visible          when dynmig.io/visible-devices is present, each container's MIG UUIDs
//                        equal the annotation's; else SKIP
//   pod-nvml             with the NVML view: each MIG UUID exists on that GPU with that GI and
//                        placement; unreachable: SKIP
// With --canary, the canary's lifecycle follows (canary.h).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kube/kube_client.h"
#include "ops/canary.h"
#include "ops/cluster.h"
#include "ops/nvml_view.h"
#include "ops/report.h"

namespace dynmig::ops {

struct ValidateOptions {
  std::string node;  // "" = every registered node
  DeviceConfigQuery config;
  bool canary = false;
  CanaryOptions canary_options;
};

// `nvml` may be null (no endpoint: capability is compared with the catalogue, pod-nvml skipped).
// The snapshot is taken at clock.Now(); the canary waits on `clock`.
// Errors: kNotFound (no such node; a named config missing), the client's errors.
absl::StatusOr<CheckReport> RunValidate(kube::KubeClient& client, NvmlSource* nvml,
                                        const ValidateOptions& options, const Clock& clock);

// The static checks alone, on a snapshot (the canary reuses them on its own pod).
void ValidateNodes(const ClusterSnapshot& snapshot, const std::vector<const kube::Object*>& nodes,
                   const protocol::DeviceConfig& config, const std::string& config_origin,
                   NvmlSource* nvml, CheckReport& report);

// Per-pod checks of one pod. `nvml_views` by node name (absent or error: skipped).
struct NodeNvml {
  std::string url;
  absl::StatusOr<NvmlView> view = absl::UnavailableError("not fetched");
};
void ValidatePod(const ClusterSnapshot& snapshot, const kube::Object& pod,
                 const protocol::DeviceConfig& config,
                 const std::map<std::string, NodeNvml>& nvml_views, CheckReport& report,
                 const std::string& check_prefix = "pod-");

// MIG UUIDs in a dynmig.io/visible-devices value, by container name. Errors: not a JSON object of
// strings.
absl::StatusOr<std::map<std::string, std::vector<std::string>>> ParseVisibleDevices(
    std::string_view value);

}  // namespace dynmig::ops
