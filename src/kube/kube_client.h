// KubeClient: the one narrow seam between dynmig and the Kubernetes API.
//
// Objects are the real API JSON (nlohmann::json, see object.h). Every object a client returns
// carries `kind` and `apiVersion` (list items included). Implementations are thread-safe: any
// method may be called from any thread concurrently.
//
// Errors (see api_status.h for the full mapping): kNotFound (404), kAborted (409 Conflict: stale
// resourceVersion precondition, binding conflicts), kAlreadyExists (409 AlreadyExists on create,
// and BindPod on a pod that is already bound), kOutOfRange (410: resourceVersion or continue token
// expired; relist), kUnavailable (429/5xx after retries, connection failures),
// kDeadlineExceeded (request timeout), kPermissionDenied (403), kUnauthenticated (401),
// kInvalidArgument (400/422, and bad arguments caught before sending), kDataLoss (a malformed or
// truncated response). Messages carry the API's own Status message.
//
// EvictPod (the Eviction API, pods/{name}/eviction) has its own meanings, see there: OK (evicted),
// kNotFound, kResourceExhausted (a PodDisruptionBudget allows no disruption now: HTTP 429, never
// retried), kFailedPrecondition (more than one PodDisruptionBudget matches the pod: HTTP 500 with
// the apiserver's "more than one PodDisruptionBudget" message), kAborted (uid precondition, 409).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kube/object.h"

namespace dynmig::kube {

struct ListOptions {
  // Namespace to list/watch; "" means all namespaces. Ignored for cluster-scoped resources.
  std::string ns{};
  std::string field_selector{};  // e.g. "spec.nodeName=node-1,status.phase!=Succeeded"
  std::string label_selector{};  // e.g. "app=web,tier in (a,b),!canary"
  // List: "" = most recent. Watch: deliver changes after this version; "" or "0" first deliver
  // ADDED events for every current object.
  std::string resource_version{};
  // List page size; the client follows `continue` tokens until done. 0 = one request.
  int64_t limit = 0;
  // Watch only: the server ends the stream after this many seconds (0 = server default). The
  // stream then ends with OK status and the caller re-watches from the last resourceVersion.
  int64_t timeout_seconds = 0;
  bool allow_bookmarks = true;  // watch only
};

struct ObjectList {
  std::vector<Object> items;       // each with kind/apiVersion filled in
  std::string resource_version{};  // the list's metadata.resourceVersion: watch from here
};

struct DeleteOptions {
  // Pods: seconds until the kubelet must have stopped it; 0 deletes at once. Unset = the pod's
  // spec.terminationGracePeriodSeconds (30 by default).
  std::optional<int64_t> grace_period_seconds{};
  std::string precondition_uid{};               // 409 (kAborted) if the object's uid differs
  std::string precondition_resource_version{};  // 409 (kAborted) if the object's RV differs
};

// The Eviction API's options (they travel as the Eviction's deleteOptions).
struct EvictOptions {
  // As DeleteOptions: unset = the pod's spec.terminationGracePeriodSeconds; 0 deletes at once.
  std::optional<int64_t> grace_period_seconds{};
  std::string precondition_uid{};  // 409 (kAborted) if the pod's uid differs
  // dryRun=All: the apiserver runs every check (the budgets included) and changes nothing, not
  // even the budget's disruptionsAllowed.
  bool dry_run = false;
};

enum class PatchType {
  kMerge,           // application/merge-patch+json (RFC 7386; null deletes a key)
  kStrategicMerge,  // application/strategic-merge-patch+json
  kJson,            // application/json-patch+json (RFC 6902 array)
};

// Annotation/label edits for a merge patch: a value sets the key, nullopt removes it.
using KeyPatch = std::map<std::string, std::optional<std::string>>;

struct MetadataPatch {
  KeyPatch annotations{};
  KeyPatch labels{};
  // When set, sent as metadata.resourceVersion: the server applies the patch only if the object
  // still has this version, else kAborted (409 Conflict). This is the optimistic lock HAMi's node
  // lock uses.
  std::string resource_version{};
};

enum class WatchEventType { kAdded, kModified, kDeleted, kBookmark, kError };
std::string_view WatchEventTypeName(WatchEventType type);  // "ADDED", ...

struct WatchEvent {
  WatchEventType type;
  // The object (with kind/apiVersion). kBookmark: only metadata.resourceVersion is meaningful.
  // kError: a Status object.
  Object object;
};

// Called on the watch's own thread, one event at a time, in order. It must not destroy the
// WatchStream it belongs to (calling Stop() from inside is fine).
using WatchHandler = std::function<void(const WatchEvent&)>;

// A running watch. Destroying it stops it and waits for its thread.
class WatchStream {
 public:
  virtual ~WatchStream() = default;

  // Ends the stream promptly (well under a second) from any thread. Once it returns (when called
  // from another thread) the handler is not running and will not be called again. Idempotent.
  virtual void Stop() = 0;

  // Blocks until the stream has ended and returns why:
  //   OK           the server ended the stream normally (timeoutSeconds); re-watch from
  //                last_resource_version()
  //   kCancelled   Stop() was called
  //   kOutOfRange  the server sent an ERROR event with code 410 (resourceVersion too old):
  //                relist, then watch from the list's resourceVersion
  //   kUnavailable the connection dropped or the stream was cut mid-transfer
  //   kDataLoss    the server sent a malformed event (the stream is abandoned; relist)
  //   other        an ERROR event with another code, mapped as in api_status.h
  virtual absl::Status Wait() = 0;

  // Like Wait() with a bound; nullopt when the stream is still running after `timeout`.
  virtual std::optional<absl::Status> WaitFor(absl::Duration timeout) = 0;

  // The resourceVersion of the last event delivered (bookmarks included), or the starting one.
  virtual std::string last_resource_version() const = 0;
};

class KubeClient {
 public:
  virtual ~KubeClient() = default;

  // ---- Generic operations (the whole virtual surface; fakes implement these). ----
  // `ns` is ignored for cluster-scoped resources (nodes, namespaces).

  virtual absl::StatusOr<Object> Get(Resource resource, std::string_view ns,
                                     std::string_view name) = 0;
  virtual absl::StatusOr<ObjectList> List(Resource resource, const ListOptions& options) = 0;
  // List, handing the items to `page` one page (options.limit items; 0 = one request) at a time
  // as they arrive, so that a large list is never held in full; `page` may move the items out.
  // An error from `page` ends the list with that error. Returns the list's resourceVersion. The
  // default calls List and hands over all its items as one page.
  virtual absl::StatusOr<std::string> ListPages(
      Resource resource, const ListOptions& options,
      const std::function<absl::Status(std::vector<Object>& items)>& page);
  // The HTTP response status is checked before returning: a 410 on the request itself gives
  // kOutOfRange here; later failures end the stream (see WatchStream::Wait).
  virtual absl::StatusOr<std::unique_ptr<WatchStream>> Watch(Resource resource,
                                                             const ListOptions& options,
                                                             WatchHandler handler) = 0;
  // Namespace from obj.metadata.namespace; when unset (namespaced resources), the client's
  // default namespace (RestConfig::ns, normally "default").
  virtual absl::StatusOr<Object> Create(Resource resource, const Object& obj) = 0;
  // PUT of the whole object. If obj carries metadata.resourceVersion, a stale one gives kAborted.
  // `subresource` "" or "status" (nodes, pods). Writes to the main resource of pods/nodes do not
  // change status, writes to "status" change only status (API server semantics).
  virtual absl::StatusOr<Object> Update(Resource resource, const Object& obj,
                                        std::string_view subresource) = 0;
  // A patch that sets metadata.resourceVersion is a precondition (stale: kAborted).
  virtual absl::StatusOr<Object> Patch(Resource resource, std::string_view ns,
                                       std::string_view name, const Object& patch, PatchType type,
                                       std::string_view subresource) = 0;
  // Returns the object as the server returned it: for a pod under graceful deletion it still
  // exists, with metadata.deletionTimestamp set; otherwise it is gone.
  virtual absl::StatusOr<Object> Delete(Resource resource, std::string_view ns,
                                        std::string_view name, const DeleteOptions& options) = 0;
  // POST pods/{name}/binding. kAlreadyExists when the pod already has a node (the message names
  // it), kAborted for other conflicts (pod being deleted, uid precondition), kNotFound.
  virtual absl::Status BindPod(std::string_view ns, std::string_view pod_name,
                               std::string_view node_name, std::string_view pod_uid) = 0;
  // POST pods/{name}/eviction: deletes the pod unless that would break a PodDisruptionBudget
  // (the apiserver decides; a pod that is not Running, or already being deleted, is evicted
  // without looking at budgets). The Eviction is policy/v1 where the server serves it (1.22+),
  // else policy/v1beta1 (v1.20). Returns:
  //   OK                  accepted: the pod is deleted or being deleted (graceful deletion)
  //   kNotFound           no such pod
  //   kResourceExhausted  a budget allows no disruption now (HTTP 429 TooManyRequests); not
  //                       retried here: the caller decides when to try again. The message carries
  //                       the apiserver's ("Cannot evict pod as it would violate the pod's
  //                       disruption budget." and, on newer servers, the budget's name)
  //   kFailedPrecondition more than one budget matches the pod (HTTP 500: "This pod has more than
  //                       one PodDisruptionBudget, which the eviction subresource does not
  //                       support.")
  //   kAborted            options.precondition_uid differs from the pod's uid (409 Conflict)
  //   others              as the mapping above (kInvalidArgument, kUnavailable, ...)
  virtual absl::Status EvictPod(std::string_view ns, std::string_view pod_name,
                                const EvictOptions& options) = 0;

  // ---- Typed conveniences (non-virtual, built on the above). ----

  absl::StatusOr<Object> GetPod(std::string_view ns, std::string_view name);
  absl::StatusOr<ObjectList> ListPods(const ListOptions& options);
  absl::StatusOr<std::unique_ptr<WatchStream>> WatchPods(const ListOptions& options,
                                                         WatchHandler handler);
  absl::StatusOr<Object> CreatePod(const Object& pod);
  absl::StatusOr<Object> DeletePod(std::string_view ns, std::string_view name,
                                   const DeleteOptions& options = {});
  absl::StatusOr<Object> PatchPodMetadata(std::string_view ns, std::string_view name,
                                          const MetadataPatch& patch);
  absl::StatusOr<Object> PatchPodAnnotations(std::string_view ns, std::string_view name,
                                             const KeyPatch& annotations,
                                             std::string_view resource_version = "");
  absl::StatusOr<Object> PatchPodStatus(std::string_view ns, std::string_view name,
                                        const Object& merge_patch);

  absl::StatusOr<Object> GetNode(std::string_view name);
  absl::StatusOr<ObjectList> ListNodes(const ListOptions& options = {});
  absl::StatusOr<std::unique_ptr<WatchStream>> WatchNodes(const ListOptions& options,
                                                          WatchHandler handler);
  absl::StatusOr<Object> CreateNode(const Object& node);
  absl::StatusOr<Object> UpdateNode(const Object& node);
  absl::StatusOr<Object> UpdateNodeStatus(const Object& node);
  absl::StatusOr<Object> PatchNodeMetadata(std::string_view name, const MetadataPatch& patch);
  absl::StatusOr<Object> PatchNodeAnnotations(std::string_view name, const KeyPatch& annotations,
                                              std::string_view resource_version = "");
  absl::StatusOr<Object> PatchNodeStatus(std::string_view name, const Object& merge_patch);
  absl::StatusOr<Object> DeleteNode(std::string_view name);

  absl::StatusOr<Object> CreateEvent(const Object& event);

  // PodDisruptionBudgets of `ns` ("" = all namespaces), each with kind and apiVersion as served:
  // policy/v1 where the server serves it, else (a 404 for the group version) policy/v1beta1.
  absl::StatusOr<ObjectList> ListPodDisruptionBudgets(std::string_view ns);

  absl::StatusOr<Object> GetLease(std::string_view ns, std::string_view name);
  absl::StatusOr<Object> CreateLease(const Object& lease);
  absl::StatusOr<Object> UpdateLease(const Object& lease);  // stale RV: kAborted
};

// The merge patch body PatchPodMetadata/PatchNodeMetadata send.
Object MetadataMergePatch(const MetadataPatch& patch);

}  // namespace dynmig::kube
