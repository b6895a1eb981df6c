// HAMi's per-node bind lock, the Node annotation `hami.io/mutex.lock` (codec:
// protocol/node_lock.h). The scheduler takes it at bind (so at most one pod per node is between
// bind and the device plugin's Allocate, which has no pod identity) and the device plugin releases
// it after Allocate. Taken with a merge patch that carries the Node's resourceVersion (optimistic
// lock); a lock older than the expiry (5 min, HAMi's HAMI_NODELOCK_EXPIRE default) is stale and is
// taken over. Thread-safe (stateless functions over a thread-safe KubeClient).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kube/kube_client.h"
#include "protocol/node_lock.h"

namespace dynmig::scheduler {

inline constexpr absl::Duration kDefaultNodeLockExpiry = absl::Minutes(5);

// The pod a lock is taken for. The UID is recorded in the lock (protocol/node_lock.h), so that a
// pod deleted and recreated under the same name is not taken for the owner.
struct LockOwner {
  std::string_view ns;
  std::string_view pod;
  std::string_view uid;
};

struct NodeLockOptions {
  absl::Duration expiry = kDefaultNodeLockExpiry;
  int attempts = 5;  // tries when the Node changed between our read and our patch (409)
};

// Takes the lock of `node` for `owner` at `now`. OK when taken, or when this pod (same UID)
// already holds it (refreshed). Errors: kFailedPrecondition "node N is locked by ns/pod since T"
// while another pod holds a lock younger than the expiry (waiting for it is NodeLockQueue's, in
// lock_queue.h); kAborted when the Node kept changing under us; the client's errors (kNotFound
// for a missing node, ...). A stale or unreadable lock is taken over.
absl::Status AcquireNodeLock(kube::KubeClient& client, std::string_view node,
                             const LockOwner& owner, absl::Time now,
                             const NodeLockOptions& options = {});

// Removes the lock when `owner` holds it (protocol::NodeLock::OwnedBy); OK when it is absent or
// held by another pod (left alone). Errors: the client's.
absl::Status ReleaseNodeLock(kube::KubeClient& client, std::string_view node,
                             const LockOwner& owner, const NodeLockOptions& options = {});

}  // namespace dynmig::scheduler
