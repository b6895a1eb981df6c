// HAMi's per-node bind lock, the Node annotation `hami.io/mutex.lock` = `<RFC3339
// time>,<namespace>, <pod>`. The scheduler takes it at bind (so at most one pod per node is between
// bind and the device plugin's Allocate, which has no pod identity) and the device plugin releases
// it after Allocate. Taken with a merge patch that carries the Node's resourceVersion (optimistic
// lock); a lock older than the expiry (5 min, HAMi's HAMI_NODELOCK_EXPIRE default) is stale and is
// taken over. Thread-safe (stateless functions over a thread-safe KubeClient).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kube/kube_client.h"

namespace dynmig::scheduler {

inline constexpr absl::Duration kDefaultNodeLockExpiry = absl::Minutes(5);

struct NodeLockValue {
  absl::Time time;
  std::string ns;   // empty in HAMi's older time-only form
  std::string pod;  // idem
};

// "2026-01-02T03:04:05Z,default,my-pod".
std::string FormatNodeLock(const NodeLockValue& value);
// Accepts `<time>,<ns>,<pod>` and the older `<time>` form. kInvalidArgument otherwise.
absl::StatusOr<NodeLockValue> ParseNodeLock(std::string_view value);

struct NodeLockOptions {
  absl::Duration expiry = kDefaultNodeLockExpiry;
  int attempts = 5;  // tries when the Node changed between our read and our patch (409)
};

// Takes the lock of `node` for pod ns/name at `now`. OK when taken, or when this pod already
// holds it (refreshed). Errors: kFailedPrecondition "node N is locked by ns/pod since T" while
// another pod holds a lock younger than the expiry (waiting for it is NodeLockQueue's, in
// lock_queue.h); kAborted when the Node kept changing under us; the client's errors (kNotFound
// for a missing node, ...). A stale or unreadable lock is taken over.
absl::Status AcquireNodeLock(kube::KubeClient& client, std::string_view node, std::string_view ns,
                             std::string_view pod, absl::Time now,
                             const NodeLockOptions& options = {});

// Removes the lock when pod ns/name holds it; OK when it is absent or held by another pod (left
// alone). Errors: the client's.
absl::Status ReleaseNodeLock(kube::KubeClient& client, std::string_view node, std::string_view ns,
                             std::string_view pod, const NodeLockOptions& options = {});

}  // namespace dynmig::scheduler
