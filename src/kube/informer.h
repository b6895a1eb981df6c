// Informer: a list+watch cache of one resource (pods or nodes, optionally filtered) with
// add/update/delete handlers and consistent reads.
//
// It lists, then watches from the list's resourceVersion; when a watch ends it re-watches from the
// last resourceVersion seen (bookmarks included), so dropped connections and API server restarts
// neither miss nor duplicate events. On 410 Expired (or a malformed stream) it relists and diffs
// the new list against the cache, emitting exactly the adds, updates (resourceVersion changed)
// and deletes needed. Failures back off exponentially (min_backoff..max_backoff).
//
// Handlers run on the informer's threads, one at a time, in event order, after the cache has been
// updated (a Get() from a handler sees the new state). They must not call Stop().
// Reads (Get/List/HasSynced) are thread-safe and never block on the network.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "kube/kube_client.h"

namespace dynmig::kube {

struct InformerHandlers {
  std::function<void(const Object& obj)> on_add;
  std::function<void(const Object& old_obj, const Object& new_obj)> on_update;
  // The last state known (for a relist diff, the cached one).
  std::function<void(const Object& obj)> on_delete;
};

struct InformerOptions {
  // Namespace and selectors of what to cache (resource_version, limit, timeout are ignored).
  ListOptions filter;
  int64_t page_size = 500;  // list page size (0 = one request)
  int64_t watch_timeout_seconds = 300;
  absl::Duration min_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(30);
  // What the cache keeps of each object (client-go's SetTransform, for the cached copy only).
  // Unset: the objects as received. Set, the informer caches cache_transform(obj) while
  // handlers still receive the full object on add and as on_update's new object; Get/List,
  // on_update's old object and a relist's on_delete see the transformed copy (a watch's DELETED
  // event hands on_delete the object the server sent). The result must keep metadata.name,
  // .namespace and .resourceVersion: keys and relist diffs use them (MetadataOnly keeps just
  // those, uid and the kind). With a transform a relist also applies the list page by page, as
  // client-go's DeltaFIFO does: each page's adds and updates go into the cache and to the
  // handlers as the page arrives (a Get() from a handler sees its object's new state, but until
  // the relist ends the cache may mix the old list with the new), then the deletes of what the
  // list no longer holds. So a large list is never held in full.
  std::function<Object(const Object& obj)> cache_transform{};
  // The time of WaitForSync's timeout and of the backoff between failed lists and watches.
  const Clock* clock = &RealClock();
};

// apiVersion, kind and metadata.{name, namespace, uid, resourceVersion} of `obj`: a cache
// transform for informers whose handlers keep what they need themselves.
Object MetadataOnly(const Object& obj);

class Informer {
 public:
  Informer(KubeClient& client, Resource resource, InformerOptions options = {});
  ~Informer();  // Stop()
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  // REQUIRES: before Start().
  void AddHandlers(InformerHandlers handlers);
  // Starts the list+watch thread. Idempotent.
  void Start() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the thread and the current watch promptly; no handler runs after it returns.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // True once the first list has been applied.
  bool HasSynced() const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until synced; false on timeout (of options.clock's time).
  bool WaitForSync(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

  // The cached object by key ("namespace/name", or "name" for cluster-scoped), or nullptr.
  ObjectPtr Get(std::string_view key) const;
  ObjectPtr Get(std::string_view ns, std::string_view name) const;
  // All cached objects, sorted by key (a consistent snapshot).
  std::vector<ObjectPtr> List() const;
  std::vector<ObjectPtr> List(const std::function<bool(const Object&)>& predicate) const;
  size_t size() const;

  // The resourceVersion the cache reflects.
  std::string resource_version() const;
  struct Stats {
    int64_t lists = 0;    // successful (re)lists
    int64_t watches = 0;  // watches started
    int64_t expired = 0;  // 410s (relists forced)
    int64_t errors = 0;   // failed lists/watches
    int64_t events = 0;   // watch events applied
  };
  Stats stats() const;
  absl::Status last_error() const;

 private:
  void Run();
  absl::Status Relist();
  absl::Status RelistByPage();                // with a cache_transform
  ObjectPtr Cached(const Object& obj) const;  // the copy the cache keeps
  void ApplyEvent(const WatchEvent& event);
  // Waits `*backoff` (or until Stop()), then doubles it up to max_backoff. false when stopping.
  bool SleepBackoff(absl::Duration* backoff) ABSL_LOCKS_EXCLUDED(mu_);

  KubeClient& client_;
  const Resource resource_;
  const InformerOptions options_;
  std::vector<InformerHandlers> handlers_;

  mutable dynmig::Mutex mu_;
  mutable dynmig::CondVar cv_;  // signalled when synced_ or stopping_ becomes true
  std::map<std::string, ObjectPtr, std::less<>> cache_ ABSL_GUARDED_BY(mu_);
  std::string rv_ ABSL_GUARDED_BY(mu_);
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<WatchStream> watch_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace dynmig::kube
