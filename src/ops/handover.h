// `dynmig handover plan|check`: handing a live node over to dynamic MIG without draining it
// (issue 29).
//
// One snapshot (the Node, its active pods, the device config, and the device plugin's NVML view
// of the node with its attribution of legacy instances) gives a HandoverPlan:
//   - per GPU, every instance (profile, placement, GI/CI, MIG UUID), who holds it (the view's
//     `holders`, and the legacy pods that reference it) and what will happen to it: dynmig's own;
//     a legacy instance kept until its holders end, then reclaimed (or kept warm); free (no
//     holder: cleaned once its GPU is idle, its slices become dynamic); unproven (kept, never
//     destroyed, with the reason);
//   - the node's legacy pods: HAMi's (`GPU-<uuid>[t-s]` ids in hami.io/vgpu-devices-allocated or
//     -to-allocate) and NVIDIA's device plugin's (requests of `nvidia.com/mig-<profile>`), each
//     with the instances the view proves it holds, or what is missing;
//   - what blocks a no-drain handover, each blocker under the check that reports it:
//       proof      no NVML view; a view without `evidence` (a device plugin too old to attribute);
//                  PodResources unreadable; runtime evidence missing while HAMi legacy pods run
//                  (they are proven only by the runtime); an unproven (or unattributed) instance;
//                  a legacy pod whose instance is not found among the holders
//       overlap    a legacy-held or unproven instance the node does not publish in
//                  dynmig.io/mig-held (the scheduler could reserve its slices); an active dynmig
//                  reservation overlapping a live legacy instance
//       allocator  the legacy allocator still serves: Node allocatable `nvidia.com/mig-*` > 0; a
//                  running NVIDIA device-plugin or MIG Manager pod on the node; MIG Manager's
//                  deploy label present and not "false" (or absent while nvidia.com/mig.config
//                  is set); a pod of HAMi's device plugin bound to the node (spec.nodeName; any
//                  HAMi version: it serves nvidia.com/gpu beside dynmig's); hami.io/node-nvidia-
//                  register in the legacy template format
// `handover check` runs three named checks (checks.h, CheckCommand::kHandover) over the plan:
// `handover-proof`, `handover-overlap`, `handover-allocator`. Preflight's and validate's
// `legacy-pods` check reads the same plan.
// Pure apart from RunHandoverPlan/RunHandoverCheck (which read the cluster); thread-compatible.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kube/kube_client.h"
#include "nlohmann/json.hpp"
#include "ops/cluster.h"
#include "ops/nvml_view.h"
#include "ops/report.h"
#include "protocol/device_config.h"

namespace dynmig::ops {

struct NodeNvml;  // validate.h

// What happens to one instance at the handover.
enum class InstanceFate {
  kDynmig,        // dynmig created it for a pod (managed, not legacy)
  kHeld,          // a legacy instance with holders: kept until they end, then reclaimed
  kIdle,          // a managed legacy instance whose holders ended, kept idle (warm)
  kUnproven,      // kept, never destroyed: the plugin could not prove who holds it
  kFree,          // no holder, evidence complete: cleaned once its GPU is idle
  kUnattributed,  // unmanaged and neither free nor unproven: the plugin did not attribute it
};
const char* InstanceFateName(InstanceFate fate);  // "dynmig", "held", "idle", "unproven", ...

struct HandoverInstance {
  uint32_t gpu_index = 0;
  std::string gpu_uuid;
  NvmlInstanceView instance;
  InstanceFate fate = InstanceFate::kUnattributed;
  std::vector<std::string> legacy_pods;  // keys of the legacy pods proven to hold it
  std::string action;                    // what will happen, for people
  bool published_held = false;           // in the node's dynmig.io/mig-held
};

// A pod of a legacy allocator on the node.
struct LegacyPod {
  enum class Kind { kHami, kNvidia };
  const kube::Object* pod = nullptr;
  std::string key;  // namespace/name
  Kind kind = Kind::kHami;
  // What it was given: HAMi "GPU-…[t-s]" ids; NVIDIA "container c: nvidia.com/mig-1g.5gb x1".
  std::vector<std::string> devices;
  std::vector<std::string> found;    // the instances proven to be its own
  std::vector<std::string> missing;  // what could not be found among the holders
  bool attributed() const { return missing.empty(); }
};

enum class BlockerCheck { kProof, kOverlap, kAllocator };

struct HandoverBlocker {
  BlockerCheck check = BlockerCheck::kProof;
  std::string id;  // "nvml-view", "evidence", "unproven", "legacy-pod", "allocatable", ...
  std::string summary;
  std::vector<std::string> evidence;
};

struct HandoverPlan {
  std::string node;
  std::string url;          // where the view came from ("" when none was fetched)
  absl::Status view_error;  // OK when the view was read
  std::optional<NvmlEvidence> evidence;
  std::vector<HandoverInstance> instances;  // by GPU index, then start
  std::vector<LegacyPod> legacy_pods;
  std::vector<HandoverBlocker> blockers;

  bool blocked() const { return !blockers.empty(); }
  std::vector<const HandoverBlocker*> BlockersOf(BlockerCheck check) const;
  // The one-line reason the no-drain handover is blocked ("" when it is not).
  std::string BlockedSummary() const;
  nlohmann::json ToJson() const;
  std::string ToText() const;
};

// The node's legacy pods among `pods` (active pods on the node), without attribution.
std::vector<LegacyPod> FindLegacyPods(const std::vector<const kube::Object*>& pods);

// A running NVIDIA device-plugin pod: its name or an image contains "nvidia-device-plugin" or
// "k8s-device-plugin", and nothing of it mentions "dynmig".
bool IsNvidiaDevicePluginPod(const kube::Object& pod);

// Why `pod` is a pod of HAMi's device plugin, or nullopt. Either signal suffices:
//   - the label app.kubernetes.io/component=hami-device-plugin, which HAMi's chart puts on its
//     device-plugin DaemonSet's pods (exact value);
//   - a container (init or not) whose image is HAMi's (the repository's last path component is
//     "hami" or starts with "hami-", or the path has a "projecthami" component) and which runs
//     the plugin (it is named "device-plugin", or its command's first word is
//     nvidia-device-plugin), and whose image does not mention "dynmig".
// HAMi's scheduler (same image, command `scheduler`) and its vgpu-monitor are not the plugin. The
// reason names the signal, the container and its image (at most 256 characters of it). Anyone
// who can create a pod can make one match: the check only reports, so such a pod makes
// handover-allocator FAIL naming it (namespace/name, owner), never anything worse.
std::optional<std::string> HamiDevicePluginSignal(const kube::Object& pod);

// The plan of one node. `nvml` is the node's NVML view as fetched (an error when none could be
// read); `config` gives the allowlist and warm-instance settings for the actions.
HandoverPlan PlanHandover(const kube::Object& node, const std::vector<const kube::Object*>& pods,
                          const NodeNvml& nvml, const protocol::DeviceConfig& config);

struct HandoverOptions {
  std::string node;  // plan: required; check: "" = every GPU node
  DeviceConfigQuery config;
};

// `dynmig handover plan --node N`. Errors: kInvalidArgument (no node), kNotFound (no such node),
// the client's errors. The view's own errors are blockers in the plan, not errors.
absl::StatusOr<CommandOutput> RunHandoverPlan(kube::KubeClient& client, NvmlSource* nvml,
                                              const HandoverOptions& options, absl::Time now);

// `dynmig handover check [--node N]`: handover-proof, handover-overlap, handover-allocator per
// node. Errors as RunHandoverPlan.
absl::StatusOr<CheckReport> RunHandoverCheck(kube::KubeClient& client, NvmlSource* nvml,
                                             const HandoverOptions& options, absl::Time now);

}  // namespace dynmig::ops
