// What the ops commands read from the cluster: one snapshot of nodes and pods, the scheduler's
// device config (`device-config.yaml` in a ConfigMap, or a file), and the scheduler's own view of
// MIG capacity rebuilt from them (scheduler::ClusterState, the same code the extender runs).
//
// Also the small helpers every command shares: which node a pod is on, which MIG identities it
// carries (current or legacy), which nodes are GPU nodes. (kube::IsTerminated says whether a pod
// has ended.)
// Thread-compatible.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kube/kube_client.h"
#include "nlohmann/json.hpp"
#include "protocol/annotations.h"
#include "protocol/device_config.h"
#include "protocol/mig_allocations.h"
#include "scheduler/cluster_state.h"

namespace dynmig::ops {

// The container runtime's view the local mode's kubelet records on a pod: JSON object container
// name -> NVIDIA_VISIBLE_DEVICES value (MIG UUIDs, or CDI names ending in "=MIG-..."). Written by
// src/local/node_agent (kVisibleDevicesAnnotation there); a real cluster has no equivalent.
inline constexpr std::string_view kVisibleDevicesAnnotation = protocol::kVisibleDevicesAnnotation;
// The key of HAMi's scheduler device ConfigMap (`<release>-scheduler-device`).
inline constexpr std::string_view kDeviceConfigKey = "device-config.yaml";

struct ClusterSnapshot {
  std::vector<kube::Object> nodes;  // sorted by name
  std::vector<kube::Object> pods;   // sorted by namespace/name
  absl::Time taken;

  const kube::Object* FindNode(std::string_view name) const;
  const kube::Object* FindPod(std::string_view ns, std::string_view name) const;
};

// Lists every node and pod. Errors: the client's, annotated with what was listed.
absl::StatusOr<ClusterSnapshot> TakeSnapshot(kube::KubeClient& client, absl::Time now);

// --- pods -----------------------------------------------------------------------------------

// hami.io/vgpu-node, else spec.nodeName; "" when unscheduled.
std::string PodNode(const kube::Object& pod);
// "namespace/name".
std::string PodKey(const kube::Object& pod);
// "namespace/name (Phase)", ", terminating" added while it is being deleted.
std::string PodLine(const kube::Object& pod);
// Every legacy `GPU-<uuid>[<t>-<s>]` id in hami.io/vgpu-devices-allocated and -to-allocate, as
// "<id> (<annotation>)". Unreadable device lists are searched as plain text.
std::vector<std::string> LegacyIdentities(const kube::Object& pod);
// The pod's containers as the protocol indexes them: init containers, then containers.
std::vector<const kube::Object*> IndexedContainers(const kube::Object& pod);

// --- nodes ----------------------------------------------------------------------------------

// A node the migration concerns: it carries the register annotation, an nvidia.com/mig* label,
// or nvidia.com/gpu capacity.
bool IsGpuNode(const kube::Object& node);
// status.addresses: InternalIP, else Hostname, else the node name.
std::string NodeAddress(const kube::Object& node);
bool IsCordoned(const kube::Object& node);  // spec.unschedulable
// Labels starting with protocol::kMigLabelPrefix (nvidia.com/mig.config, .state, mig.strategy,
// ...).
std::map<std::string, std::string> MigLabels(const kube::Object& node);
// The string values under `field` of `obj` whose keys start with protocol::kNvidiaKeyPrefix: the
// GPU resources of a node's status ("capacity", "allocatable") or of a backup's node record.
std::map<std::string, std::string> NvidiaResources(const nlohmann::json& obj, const char* field);

// --- device config --------------------------------------------------------------------------

struct DeviceConfigSource {
  std::string origin;  // "file F", "ConfigMap ns/name", "built-in default"
  std::string yaml;    // the text ("" for the built-in default)
  std::optional<kube::Object> configmap;
  absl::StatusOr<protocol::DeviceConfig> config = protocol::DeviceConfig{};
  bool found = false;  // false: no file given and no ConfigMap found (the default is used)
};

struct DeviceConfigQuery {
  std::string file;            // --device-config FILE (wins)
  std::string configmap_ns;    // --device-config-namespace
  std::string configmap_name;  // --device-config-name
};

// Finds the scheduler's device config: the file when given; else the named ConfigMap; else the
// one ConfigMap (any namespace) holding a `device-config.yaml` key (several: the ones named
// `*-scheduler-device` win; still several is kFailedPrecondition naming them). Nothing found:
// found = false and the built-in default allowlist (protocol::DefaultDeviceConfigYaml). A config
// that does not parse is kept in `config` as the error. Errors: a named ConfigMap or file that
// cannot be read (kNotFound ...), several candidates, list failures.
absl::StatusOr<DeviceConfigSource> FindDeviceConfig(kube::KubeClient& client,
                                                    const DeviceConfigQuery& query);

// --- the scheduler's view -------------------------------------------------------------------

// A ClusterState fed with every node and pod of the snapshot, with the config's allowlist and
// resource names (the built-in default when the config is an error).
std::unique_ptr<scheduler::ClusterState> BuildClusterState(const ClusterSnapshot& snapshot,
                                                           const protocol::DeviceConfig& config,
                                                           const std::string& skip_pod = "");

// The effective config: the parsed one, or the built-in default when it is an error.
protocol::DeviceConfig EffectiveConfig(const DeviceConfigSource& source);

}  // namespace dynmig::ops
