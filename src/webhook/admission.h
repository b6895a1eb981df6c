// The admission webhook (admission.k8s.io/v1 AdmissionReview, one endpoint, mutating and
// validating in one answer) for pods:
//   - mutating: a pod that requests the managed resources (protocol::RequestsGpuResources) gets
//     spec.schedulerName = the dynmig scheduler (a base64 JSONPatch), on CREATE only (the field
//     is immutable afterwards);
//   - validating, on CREATE: the pod's request must parse (protocol::ParsePodRequest's error, which
//     names the container and resource, is the rejection), a MIG pod may not set spec.nodeName
//     (it would bypass the reservation and make the node's GPUs fail closed);
//   - validating, on CREATE and on UPDATE when the value changed: every entry of
//     nvidia.com/mig-profile-preference must name a profile (exact name or slice class) of some
//     allowlist entry; the message names the bad entry and lists the valid choices;
//   - only the system's own identities (annotation_writers) may set, change or remove any of
//     protocol::kSystemPodAnnotations (the reservation hami.io/vgpu-mig-allocations, bind-phase,
//     bind-time, vgpu-node, vgpu-time, the device lists, dynmig.io/visible-devices): CREATE with
//     one present; UPDATE where its value differs from oldObject, removal included. Deleting a
//     pod is not reviewed, so users may still delete their pods.
//   - warnings (kubectl prints them as "Warning: ..."), on CREATE of an admitted MIG pod from the
//     mutating answer only (so they are printed once): per GPU model, when a container's
//     memory request resolves to a profile with less NVML memory than asked, or (NVML matching)
//     to a profile more than twice the request (mig::SizingNote).
// Other resources and operations are allowed unchanged. Pure; thread-safe (const after
// construction).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "mig/allowlist.h"
#include "mig/profile.h"
#include "mig/request.h"
#include "nlohmann/json.hpp"
#include "protocol/pod_request.h"

namespace dynmig::webhook {

inline constexpr std::string_view kDefaultAnnotationWriters =
    "system:serviceaccount:dynmig-system:dynmig-scheduler,"
    "system:serviceaccount:dynmig-system:dynmig-device-plugin";

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
  // The sizing notes of a parsed request, one per model at most.
  std::vector<std::string> SizingWarnings(const mig::PodRequest& request) const;

  AdmissionOptions options_;
};

}  // namespace dynmig::webhook
