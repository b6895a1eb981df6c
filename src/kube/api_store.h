// ApiStore: the object store and API semantics behind InMemoryApiServer (no HTTP here).
//
// Holds pods, nodes, events, leases, namespaces, configmaps and PodDisruptionBudgets with a global,
// monotonically increasing resourceVersion (one per write), a bounded history of watch events,
// optimistic concurrency (409 on a stale resourceVersion), graceful pod deletion, binding,
// selectors and consistent paginated lists (a `continue` token pages through a snapshot taken by
// the first page).
//
// PodDisruptionBudgets are stored once (as policy/v1) and served in both group versions: every
// method given Resource::kPodDisruptionBudgetsV1beta1 reads and writes the same objects, with
// apiVersion policy/v1beta1 on the way in and out. Evict() is the pods/eviction subresource with
// the apiserver's budget rules; the disruption controller's part (a budget's status) is computed
// by the store itself, at once, when a budget is created or a pod is evicted.
//
// Errors are absl::Status values made by ApiError(): KubeHttpCode()/KubeReason() give the HTTP
// code and reason the API server would send, message() is the API's message.
// Thread-safe: all methods may be called concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "kube/kube_client.h"
#include "kube/object.h"
#include "kube/selector.h"

namespace dynmig::kube {

// An immutable stored version of an object and its serialization (with kind/apiVersion).
struct StoredObject {
  Object object;
  std::string json;
};
using StoredPtr = std::shared_ptr<const StoredObject>;

struct StoreEvent {
  WatchEventType type;
  StoredPtr object;
};

// The payload of an eviction's 429 that carries the refusal's cause (the budget, how many healthy
// pods it needs and has), sent as the Status's details.causes[0].message.
inline constexpr char kEvictionCausePayload[] = "dynmig.kube/eviction-cause";

struct ApiStoreOptions {
  // Watch events kept for resuming watches; older resourceVersions get 410 Expired.
  size_t watch_history = 10000;
  // Source of "now" (creationTimestamp, deletionTimestamp, graceful deletion deadlines, the
  // lifetime of `continue` tokens). nullptr: RealClock(), or the server's clock for the store an
  // InMemoryApiServer creates.
  const Clock* clock = nullptr;
  absl::Duration continue_ttl = absl::Minutes(5);  // how long a list `continue` token lives
  size_t max_continuations = 64;                   // snapshots kept for paginated lists
};

// Decodes every resource quantity of a Pod (containers' and init containers' limits and requests,
// overhead) or Node (capacity, allocatable) and writes it in the API server's canonical form
// (8000 -> "8k"), as kube-apiserver does before admission and storage. A value that is not a
// quantity is a 400 BadRequest naming it. Other resources are left as they are.
absl::Status CanonicalizeQuantities(Resource resource, Object* obj);

struct ListQuery {
  std::string ns{};  // "" = all namespaces
  std::string label_selector{};
  std::string field_selector{};
  int64_t limit = 0;  // 0 = everything
  std::string continue_token{};
};

class ApiStore {
 public:
  explicit ApiStore(ApiStoreOptions options = {});
  ~ApiStore();
  ApiStore(const ApiStore&) = delete;
  ApiStore& operator=(const ApiStore&) = delete;

  // `ns` is the namespace from the URL ("" for cluster-scoped resources). With `dry_run` the
  // writes below are checked and return what they would store, but change nothing (dryRun=All).
  absl::StatusOr<Object> Create(Resource resource, std::string_view ns, const Object& obj,
                                bool dry_run = false);
  absl::StatusOr<Object> Get(Resource resource, std::string_view ns, std::string_view name) const;

  struct ListResult {
    std::vector<StoredPtr> items;
    int64_t resource_version = 0;
    std::string continue_token;  // "" when this is the last page
    int64_t remaining = 0;       // items after this page
  };
  absl::StatusOr<ListResult> List(Resource resource, const ListQuery& query);

  // PUT. `subresource` "" or "status".
  absl::StatusOr<Object> Update(Resource resource, std::string_view ns, std::string_view name,
                                const Object& obj, std::string_view subresource,
                                bool dry_run = false);
  absl::StatusOr<Object> Patch(Resource resource, std::string_view ns, std::string_view name,
                               const Object& patch, PatchType type, std::string_view subresource,
                               bool dry_run = false);
  // Patch with an admission step between computing the patched object and storing it:
  // `admit(current, patched)` returns the object to store (or an error, returned as is). It runs
  // without the store lock. If the object changed meanwhile and the patch did not pin a
  // resourceVersion, the patch is recomputed on the new version and admitted again (up to 5
  // times, as the API server's patch retry loop does).
  using AdmitFn =
      std::function<absl::StatusOr<Object>(const Object& current, const Object& patched)>;
  absl::StatusOr<Object> PatchWithAdmission(Resource resource, std::string_view ns,
                                            std::string_view name, const Object& patch,
                                            PatchType type, std::string_view subresource,
                                            const AdmitFn& admit, bool dry_run = false);
  absl::StatusOr<Object> Delete(Resource resource, std::string_view ns, std::string_view name,
                                const DeleteOptions& options, bool dry_run = false);
  // POST pods/{name}/binding with a Binding object. Returns a Status (Success) object.
  absl::StatusOr<Object> Bind(std::string_view ns, std::string_view name, const Object& binding);

  // POST pods/{name}/eviction (the Eviction's deleteOptions as `options`). Returns the Success
  // Status (code 201) when the pod was deleted or is being deleted. Refusals as the apiserver's:
  // 429 TooManyRequests while the matching budget allows no disruption, 500 when more than one
  // budget matches, 404, 409 (uid precondition). See docs/kube.md.
  absl::StatusOr<Object> Evict(std::string_view ns, std::string_view name,
                               const DeleteOptions& options, bool dry_run = false);

  // Removes pods whose graceful deletion period has passed. Returns how many were removed.
  int CollectGarbage();
  // Drops the watch history: every watch from an older resourceVersion now gets 410.
  void CompactHistory();
  int64_t resource_version() const;

  // A watch cursor over the history, filtered to one resource/namespace/selectors.
  class Watch {
   public:
    ~Watch();
    // Events present when the watch started from resourceVersion ""/"0" (ADDED each).
    std::vector<StoreEvent> TakeInitialEvents();
    // Waits up to `max_wait` of `clock`'s time (the caller's timers; a FakeClock's wait ends when
    // events arrive or its time passes) for events after the cursor and returns the matching ones
    // (maybe none). A MODIFIED that makes an object start/stop matching becomes ADDED/DELETED.
    // kOutOfRange (410) when the events after the cursor were evicted; kCancelled when the watch
    // was cut (CutWatches) or the store is shutting down.
    absl::StatusOr<std::vector<StoreEvent>> Next(const Clock& clock, absl::Duration max_wait,
                                                 size_t max_events);
    int64_t cursor() const { return cursor_; }
    Resource resource() const { return served_; }  // as requested (the served version)

   private:
    friend class ApiStore;
    Watch(ApiStore* store, Resource resource, std::string ns, LabelSelector labels,
          FieldSelector fields, int64_t cursor, uint64_t cut_generation);
    bool Matches(const Object& obj) const;

    ApiStore* store_;
    Resource resource_;  // as stored
    Resource served_;
    std::string ns_;
    LabelSelector labels_;
    FieldSelector fields_;
    int64_t cursor_;
    uint64_t cut_generation_;
    std::vector<StoreEvent> initial_;
  };

  // `resource_version` "" or "0": initial ADDED events for the current state, then changes.
  // Otherwise changes after that version (410 when it is older than the history, or newer than
  // the store's current version, e.g. after a restart that lost state).
  absl::StatusOr<std::unique_ptr<Watch>> StartWatch(Resource resource, const ListQuery& query,
                                                    std::string_view resource_version);
  // Ends every open watch (their Next() returns kCancelled). Returns how many there were.
  int CutWatches();
  // Wakes and ends all watches for good (server shutdown).
  void Shutdown();
  size_t open_watches() const;

 private:
  struct HistoryEvent {
    int64_t rv;
    Resource resource;
    WatchEventType type;
    StoredPtr object;
    StoredPtr previous;  // MODIFIED only
  };
  struct Snapshot {
    absl::Time created;
    int64_t rv;
    std::vector<StoredPtr> items;
  };
  using ObjectMap = std::map<std::string, StoredPtr, std::less<>>;

  absl::Time Now() const { return clock_.Now(); }
  ObjectMap& Objects(Resource r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return objects_[static_cast<size_t>(r)];
  }
  const ObjectMap& Objects(Resource r) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return objects_[static_cast<size_t>(r)];
  }
  std::string NewUid() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // List of a stored resource (List maps the served one).
  absl::StatusOr<ListResult> ListStored(Resource resource, const ListQuery& query)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Writes `obj` (new version) under `key`; appends a history event.
  StoredPtr CommitLocked(Resource resource, const std::string& key, Object obj,
                         const StoredPtr& previous) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  StoredPtr RemoveLocked(Resource resource, const std::string& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the oldest history events beyond options_.watch_history.
  void TrimHistoryLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EnsureNamespaceLocked(std::string_view ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Object> CreateLocked(Resource resource, std::string_view ns, const Object& obj,
                                      bool dry_run = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Object> UpdateLocked(Resource resource, std::string_view ns, std::string_view name,
                                      Object obj, std::string_view subresource, bool from_patch,
                                      bool dry_run = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The current object (a copy) and the patch applied to it.
  absl::StatusOr<std::pair<Object, Object>> PatchedLocked(Resource resource, std::string_view ns,
                                                          std::string_view name,
                                                          const Object& patch, PatchType type)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Object> DeleteLocked(Resource resource, std::string_view ns, std::string_view name,
                                      const DeleteOptions& options, bool dry_run = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The budget's status as the disruption controller would write it now (expected pods, healthy
  // pods, disruptionsAllowed; disruptedPods kept while their pods are not yet being deleted and
  // younger than two minutes).
  Object PdbStatusLocked(const Object& pdb) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  ApiStoreOptions options_;
  const Clock& clock_;
  mutable dynmig::Mutex mu_;
  dynmig::CondVar changed_;  // signalled on every write, compaction, cut and shutdown
  std::array<ObjectMap, kNumResources> objects_ ABSL_GUARDED_BY(mu_);
  int64_t rv_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t min_cursor_ ABSL_GUARDED_BY(mu_) = 0;  // watches can resume from any cursor >= this
  std::deque<HistoryEvent> history_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Time> pending_deletions_ ABSL_GUARDED_BY(mu_);  // pod key -> deadline
  std::map<uint64_t, Snapshot> snapshots_ ABSL_GUARDED_BY(mu_);
  uint64_t next_snapshot_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t cut_generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  size_t open_watches_ ABSL_GUARDED_BY(mu_) = 0;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dynmig::kube
