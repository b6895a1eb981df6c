// Admission webhooks for the in-memory API server: who is calling (UserInfo), which webhooks a
// request matches, and the calls themselves (AdmissionReview admission.k8s.io/v1 over HTTP(S)),
// in kube-apiserver's order: every matching mutating webhook in list order (each sees the object
// the previous ones patched), then every matching validating webhook with the final object.
// Tests and the local mode only; never production.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kube/kube_client.h"
#include "kube/object.h"

namespace dynmig::kube {

// The authenticated caller (request.userInfo of an AdmissionReview).
struct UserInfo {
  std::string username;
  std::vector<std::string> groups;
};

inline constexpr std::string_view kAnonymousUser = "system:anonymous";

// One webhook of a Mutating/ValidatingWebhookConfiguration, reduced to what the in-memory server
// can evaluate. Rules are `apiGroups: ["*"], apiVersions: ["*"]`, `scope: "*"`,
// `admissionReviewVersions: ["v1"]`, `sideEffects: None`, `matchPolicy: Equivalent`,
// `reinvocationPolicy: Never`.
struct AdmissionWebhook {
  std::string name;     // e.g. "mutate.dynmig.io"; appears in error messages
  std::string url;      // full URL with path: "https://127.0.0.1:8443/mutate" (http or https)
  std::string ca_file;  // PEM bundle that verifies an https webhook; "" = the system's CAs
  bool mutating = false;
  // CREATE, UPDATE, DELETE or "*".
  std::vector<std::string> operations = {"CREATE", "UPDATE"};
  // As a rule's `resources`: "pods" (the main resource only), "pods/status" (that subresource),
  // "pods/*" (every subresource), "*" (every main resource), "*/*" (everything). Admitted
  // subresources: status (UPDATE), pods/binding (CREATE; the object is the Binding).
  std::vector<std::string> resources = {"pods"};
  // Requests in these namespaces skip the webhook (a namespaceSelector `kubernetes.io/metadata.name
  // NotIn [...]`). Cluster-scoped objects are never excluded by this.
  std::vector<std::string> excluded_namespaces;
  // Requests by these usernames skip the webhook (stands in for a CEL matchCondition
  // `request.userInfo.username != "..."`).
  std::vector<std::string> excluded_users;
  // failurePolicy: Fail (true) or Ignore (false) when the webhook cannot be called or answers
  // with something invalid.
  bool failure_policy_fail = true;
  absl::Duration timeout = absl::Seconds(10);  // timeoutSeconds
};

// One write as admission sees it.
struct AdmissionAttributes {
  std::string operation;  // CREATE, UPDATE, DELETE
  Resource resource;
  std::string subresource;  // "", "status" or "binding"
  std::string ns;
  std::string name;
  Object object;      // null for DELETE
  Object old_object;  // null for CREATE
  UserInfo user;
  bool dry_run = false;
  Object options;  // CreateOptions / UpdateOptions / PatchOptions / DeleteOptions
};

// Whether `hook` is called for `attrs` (operation, resource/subresource, namespace, user).
bool WebhookMatches(const AdmissionWebhook& hook, const AdmissionAttributes& attrs);

// The AdmissionReview request body sent to a webhook.
Object MakeAdmissionReview(const AdmissionAttributes& attrs, const std::string& uid);

// Runs the matching webhooks of `hooks` on `attrs` and returns the object to store (the input
// object with every mutating webhook's JSONPatch applied; for DELETE the input object, null).
// Errors are ApiError statuses as kube-apiserver words them:
//   denied:  HTTP response.status.code (400 if absent or < 400), message
//            `admission webhook "NAME" denied the request: MESSAGE`;
//   failed call with failure_policy_fail: 500 InternalError
//            `Internal error occurred: failed calling webhook "NAME": REASON`
//            (without it: logged and skipped); a JSONPatch that does not apply: 500.
// `warnings` (optional) collects the webhooks' response.warnings.
absl::StatusOr<Object> RunAdmission(const std::vector<AdmissionWebhook>& hooks,
                                    const AdmissionAttributes& attrs,
                                    std::vector<std::string>* warnings = nullptr);

}  // namespace dynmig::kube
