// Kubernetes API objects as nlohmann::json, plus small typed accessors.
//
// Objects are the real API JSON (a Pod is what `kubectl get pod -o json` prints). The accessors
// never throw: a missing or wrongly typed field reads as empty.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/bounded_json.h"
#include "nlohmann/json.hpp"

namespace dynmig::kube {

using Object = nlohmann::json;
using ObjectPtr = std::shared_ptr<const Object>;

// The resources the system uses. Each maps to one REST collection.
// PodDisruptionBudgets are one resource served in two group versions: kPodDisruptionBudgets is
// policy/v1 (Kubernetes 1.21+), kPodDisruptionBudgetsV1beta1 policy/v1beta1 (up to 1.24; the only
// one of v1.20). ListPodDisruptionBudgets (kube_client.h) picks the one the server serves.
// ReplicaSets (apps/v1) are served by the in-memory API server for the local mode's ReplicaSet
// controller (local/replicaset_controller.h); dynmig's components never read them.
enum class Resource {
  kPods,
  kNodes,
  kEvents,
  kLeases,
  kNamespaces,
  kConfigMaps,
  kPodDisruptionBudgets,
  kPodDisruptionBudgetsV1beta1,
  kReplicaSets,
};
inline constexpr size_t kNumResources = 9;

struct ResourceInfo {
  Resource resource;
  std::string_view group;        // "" for core, "coordination.k8s.io"
  std::string_view version;      // "v1"
  std::string_view api_version;  // "v1", "coordination.k8s.io/v1"
  std::string_view prefix;       // "/api/v1", "/apis/coordination.k8s.io/v1"
  std::string_view plural;       // "pods"
  std::string_view singular;     // "pod"
  std::string_view kind;         // "Pod"
  std::string_view list_kind;    // "PodList"
  std::string_view short_names;  // "po" (comma separated)
  bool namespaced;
};

const ResourceInfo& InfoFor(Resource resource);
std::string_view ResourceName(Resource resource);  // plural, e.g. "pods"

// metadata accessors ("" when absent).
std::string Name(const Object& obj);
std::string Namespace(const Object& obj);
std::string ResourceVersion(const Object& obj);
std::string Uid(const Object& obj);
std::string Kind(const Object& obj);
std::map<std::string, std::string> Annotations(const Object& obj);
std::map<std::string, std::string> Labels(const Object& obj);
std::optional<std::string> Annotation(const Object& obj, std::string_view key);
std::optional<std::string> Label(const Object& obj, std::string_view key);
// metadata.deletionTimestamp (RFC 3339) when the object is being deleted.
std::optional<std::string> DeletionTimestamp(const Object& obj);
bool IsBeingDeleted(const Object& obj);

// Pod accessors.
std::string NodeName(const Object& pod);  // spec.nodeName
std::string Phase(const Object& pod);     // status.phase
// The pod has ended: status.phase Succeeded or Failed (its containers will not run again). The one
// test of it.
bool IsTerminated(const Object& pod);

// "namespace/name" for namespaced objects, "name" for cluster-scoped ones (no metadata.namespace).
std::string ObjectKey(const Object& obj);
std::string ObjectKey(std::string_view ns, std::string_view name);

// Kubernetes object names: a lowercase RFC 1123 subdomain (most objects: at most 253 characters
// of [a-z0-9.-], alphanumeric at both ends) and label (namespaces: at most 63, no '.').
bool IsDnsSubdomain(std::string_view name);
bool IsDnsLabel(std::string_view name);

// Reads a nested string field by JSON pointer ("/spec/nodeName"); "" when absent or not a string.
std::string StringAt(const Object& obj, std::string_view json_pointer);

// Numeric resourceVersion (0 when absent or not a number). Our server uses decimal numbers; a real
// server's RVs are opaque but are also decimal etcd revisions in practice. Only compare RVs of the
// same resource with this.
int64_t ResourceVersionNumber(const Object& obj);

// Times in the API's formats.
std::string Rfc3339(absl::Time t);    // RFC 3339, seconds: 2026-01-02T03:04:05Z
std::string MicroTime(absl::Time t);  // RFC 3339, 6 fractional digits (Lease MicroTime)
absl::StatusOr<absl::Time> ParseRfc3339(std::string_view rfc3339);

// Parses JSON text into an Object within `limits` (by default one object or watch event of the
// API server: kKubeObjectJsonLimits). kDataLoss with `what` and the parser's message on bad input,
// or naming the limit it exceeds.
absl::StatusOr<Object> ParseObject(std::string_view text, std::string_view what,
                                   const JsonLimits& limits = kKubeObjectJsonLimits);

// Builds a core/v1 Event about `involved` (a Pod or Node object): type "Normal" or "Warning".
Object NewEvent(const Object& involved, std::string_view type, std::string_view reason,
                std::string_view message, std::string_view component, absl::Time now);

}  // namespace dynmig::kube
