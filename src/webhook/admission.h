// The admission webhook (admission.k8s.io/v1 AdmissionReview, one endpoint, mutating and
// validating in one answer) for pods and their bindings. "GPU pod" below: a pod that requests the
// managed resources (protocol::RequestsGpuResources), whatever its nvidia.com/vgpu-mode or other
// annotations say; every GPU pod is dynmig's to place.
//   - mutating: a GPU pod gets spec.schedulerName = the dynmig scheduler (a base64 JSONPatch), on
//     CREATE only (the field is immutable afterwards);
//   - validating, on CREATE of a GPU pod: the pod's request must parse (protocol::ParsePodRequest's
//     error, which names the container and resource, is the rejection); no container may ask for
//     more nvidia.com/gpu instances than one node of the cluster can hold
//     (max_instances_per_node, kMaxInstancesCeiling when unknown), nor all containers together;
//     no instance may ask for more than kMaxMemoryMibPerInstance; spec.nodeName may not be set
//     (it would bypass the reservation and the node lock); and the validating answer (mutate
//     false) refuses a spec.schedulerName other than the dynmig scheduler's (a mutating webhook
//     bypassed, reordered or overridden);
//   - validating, on CREATE and on UPDATE when the value changed: every entry of
//     nvidia.com/mig-profile-preference must name a profile (exact name or slice class) of some
//     allowlist entry; the message names the bad entry and lists the valid choices;
//   - validating, on UPDATE of a GPU pod: nobody may add, change or remove any of
//     protocol::kRoutingPodAnnotations (vgpu-mode, use/nouse-gputype, use/nouse-gpuuuid, the
//     preference, the scheduler policies): they are fixed at creation;
//   - only the system's own identities (annotation_writers) may set, change or remove any of
//     protocol::kSystemPodAnnotations (the reservation hami.io/vgpu-mig-allocations, bind-phase,
//     bind-time, vgpu-node, vgpu-time, the device lists, dynmig.io/visible-devices): CREATE with
//     one present; UPDATE where its value differs from oldObject, removal included; a Binding
//     carrying one (the API server copies a Binding's annotations onto the pod). Deleting a pod is
//     not reviewed, so users may still delete their pods.
//   - bindings (CREATE of pods/binding, or of the legacy bindings resource): only `binders` may
//     bind a GPU pod; the pod is read through pod_lookup, and a binding whose pod cannot be read is
//     refused (fail closed). Bindings of other pods pass unchanged.
//   - validating, on CREATE of a whole-GPU pod while whole_gpu_pods is on: the request must parse
//     as a whole-GPU request (protocol::ParseWholeGpuRequest's error is the rejection);
//   - warnings (kubectl prints them as "Warning: ..."), on CREATE of an admitted MIG pod from the
//     mutating answer only (so they are printed once): per GPU model, when a container's
//     memory request resolves to a profile with less NVML memory than asked, or (NVML matching)
//     to a profile more than twice the request (mig::SizingNote).
// Other resources and operations are allowed unchanged. Thread-safe (const after construction;
// the injected functions must be thread-safe).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "mig/allowlist.h"
#include "mig/profile.h"
#include "mig/request.h"
#include "nlohmann/json.hpp"
#include "protocol/node_register.h"
#include "protocol/pod_request.h"

namespace dynmig::webhook {

inline constexpr std::string_view kDefaultAnnotationWriters =
    "system:serviceaccount:dynmig-system:dynmig-scheduler,"
    "system:serviceaccount:dynmig-system:dynmig-device-plugin";

inline constexpr std::string_view kDefaultBinders =
    "system:serviceaccount:dynmig-system:dynmig-scheduler";

// The most nvidia.com/gpu instances a pod may ask for (per container and in all) when the
// cluster's node capacity is unknown, and the most max_instances_per_node may raise it to.
inline constexpr int kMaxInstancesCeiling = 1024;
// The most memory one instance may ask for (nvidia.com/gpumem, MiB): 1 TiB, above any GPU.
inline constexpr uint64_t kMaxMemoryMibPerInstance = uint64_t{1} << 20;

struct AdmissionOptions {
  std::string scheduler_name = "dynmig-scheduler";
  mig::Allowlist allowlist;
  protocol::ResourceNames resources;
  // How memory requests are sized (device-config.yaml nvidia.migMemoryMatch); the sizing
  // warnings follow it.
  mig::MemoryMatch memory_match = mig::MemoryMatch::kNominal;
  // The NVML names of the GPU models in the cluster. Sizing warnings are given for the
  // catalogued models among them, and an unknown preference lists the profiles of their allowlist
  // entries; when unset or empty, every catalogued model the allowlist names.
  std::function<std::vector<std::string>()> cluster_models;
  // Usernames (userInfo.username) allowed to write protocol::kSystemPodAnnotations.
  std::vector<std::string> annotation_writers = {
      "system:serviceaccount:dynmig-system:dynmig-scheduler",
      "system:serviceaccount:dynmig-system:dynmig-device-plugin"};
  // Usernames allowed to bind GPU pods (pods/binding): the extender's identity.
  std::vector<std::string> binders = {std::string(kDefaultBinders)};
  // Reads a pod (namespace, name) for the review of its binding. Unset, or an error: the binding
  // is refused, naming the error.
  std::function<absl::StatusOr<nlohmann::json>(const std::string& ns, const std::string& name)>
      pod_lookup;
  // The most MIG instances one node of the cluster could hold (NodeInstanceCapacity of its
  // largest node). Unset or <= 0 (unknown): kMaxInstancesCeiling; never above it.
  std::function<int()> max_instances_per_node;
  // Whole-GPU pods (nvidia.com/vgpu-mode: hami-core) are placed by the scheduler
  // (device-config.yaml nvidia.migModeSwitching enabled): their request must then also parse as
  // one (protocol::ParseWholeGpuRequest: gpumem-percentage 100, at most 16 GPUs per container, some
  // container asks for a GPU). Off: admitted as before (routed to the scheduler, which leaves
  // them pending as not MIG pods).
  bool whole_gpu_pods = false;
};

// The valid values of nvidia.com/mig-profile-preference entries: every profile name of the
// allowlist, then every slice class ("1g", "4g", ...), in first-seen order.
std::vector<std::string> PreferenceChoices(const mig::Allowlist& allowlist);

// OK when every entry of the annotation value names a profile of some allowlist entry.
// kInvalidArgument naming the first bad entry, suggesting the closest valid choice when it looks
// like a typo of one ("did you mean \"4g\"?"), and listing the valid choices, or saying that the
// value is empty. With `pod`, the list holds only what could run it: the allowlist entries its
// nvidia.com/use-gputype / nouse-gputype leave, and their profiles whose nominal memory covers its
// largest per-instance memory request (the whole list when nothing would). With
// `present_models` (the NVML names of the cluster's MIG GPUs), only the allowlist entries of those
// models are listed and suggested (all of them when none matches); a preference naming a profile
// of another allowlisted model is still valid.
absl::Status ValidatePreference(std::string_view value, const mig::Allowlist& allowlist,
                                const nlohmann::json* pod = nullptr,
                                const protocol::ResourceNames& resources = {},
                                const std::vector<std::string>& present_models = {});

// The most MIG instances the GPUs of one node's register could hold for the scheduler: per GPU in
// MIG mode whose model the allowlist names, mig::MostInstances of its allowlisted profiles (the
// planner's own bound); other GPUs hold none (dynmig places only MIG pods).
int NodeInstanceCapacity(const std::vector<protocol::DeviceInfo>& gpus,
                         const mig::Allowlist& allowlist);

// The largest NodeInstanceCapacity among the nodes, fed with each node's
// hami.io/node-nvidia-register value (a node informer's handlers): what max_instances_per_node
// reads. A register that does not decode holds nothing. Thread-safe.
class NodeCapacityIndex {
 public:
  explicit NodeCapacityIndex(mig::Allowlist allowlist) : allowlist_(std::move(allowlist)) {}
  // The register is decoded again only when its value changed.
  void Upsert(const std::string& node, std::string_view register_value) ABSL_LOCKS_EXCLUDED(mu_);
  void Remove(const std::string& node) ABSL_LOCKS_EXCLUDED(mu_);
  // 0 when no node holds any MIG instance.
  int Max() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    size_t hash = 0;
    int capacity = 0;
  };
  const mig::Allowlist allowlist_;
  mutable dynmig::Mutex mu_;
  std::map<std::string, Entry> nodes_ ABSL_GUARDED_BY(mu_);
  std::multiset<int> capacities_ ABSL_GUARDED_BY(mu_);
};

class AdmissionHandler {
 public:
  explicit AdmissionHandler(AdmissionOptions options);

  // The AdmissionReview answer for a request body: same apiVersion as the request (v1, or
  // v1beta1), the request's uid, allowed, and a patch or a status. A body that is not an
  // AdmissionReview is answered with allowed=false and status code 400 naming the problem.
  // `mutate` false answers as a validating webhook: the same checks, never a patch (the API
  // server refuses a patch from a validating webhook).
  std::string Review(std::string_view body, bool mutate = true) const;
  nlohmann::json ReviewJson(const nlohmann::json& review, bool mutate = true) const;

  const AdmissionOptions& options() const { return options_; }

 private:
  // Fills response.allowed/status/patch for a pod request.
  void ReviewPod(const nlohmann::json& request, bool mutate, nlohmann::json& response) const;
  // The checks of a GPU pod's CREATE (request, placement, scheduler name) and its patch.
  void ReviewGpuPodCreate(const nlohmann::json& object, const std::string& pod, bool mutate,
                          nlohmann::json& response) const;
  // Fills response.allowed/status for a Binding (pods/binding or bindings).
  void ReviewBinding(const nlohmann::json& request, nlohmann::json& response) const;
  // The refusal of a request asking more instances than a node holds; "" when within bounds.
  std::string InstanceBoundError(const mig::PodRequest& request) const;
  // The sizing notes of a parsed request, one per model at most.
  std::vector<std::string> SizingWarnings(const mig::PodRequest& request) const;

  AdmissionOptions options_;
};

}  // namespace dynmig::webhook
