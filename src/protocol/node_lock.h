// HAMi's per-node bind lock, the Node annotation `hami.io/mutex.lock`: the one codec.
//
// The scheduler takes it at bind so that at most one pod per node is between bind and the device
// plugin's Allocate (which carries no pod identity); the device plugin releases it once it has
// identified the pod. HAMi writes `<RFC3339 time>,<namespace>,<pod>` (older HAMi: `<time>` alone).
// dynmig appends the owner's UID, `<time>,<namespace>,<pod>,<uid>`, so that a pod deleted and
// recreated under the same name is not taken for the owner: names are reused, UIDs are not.
// Both forms are read; a lock without a UID is matched by namespace and name only.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dynmig::protocol {

// A lock value longer than this is refused (the real ones are about 100 bytes: a time, a
// namespace and a pod name of at most 253 bytes each, a 36-byte UID).
inline constexpr size_t kMaxNodeLockBytes = 1024;

struct NodeLock {
  absl::Time time;
  std::string ns;   // empty in the time-only form
  std::string pod;  // idem
  std::string uid;  // empty in HAMi's forms

  // Whether the lock names this pod: namespace and name agree, and so does the UID when the lock
  // carries one (a pod recreated under the owner's name is not the owner).
  bool OwnedBy(std::string_view pod_ns, std::string_view pod_name, std::string_view pod_uid) const;
  // "ns/pod" (with " (uid U)" when known), "?" for an anonymous lock.
  std::string Owner() const;
};

// "2026-01-02T03:04:05Z,default,my-pod,0d6f...". The UID is left out when empty (HAMi's form).
std::string FormatNodeLock(const NodeLock& lock);

// Accepts `<time>`, `<time>,<ns>,<pod>` and `<time>,<ns>,<pod>,<uid>`. kInvalidArgument naming the
// annotation otherwise (not an RFC 3339 time, a wrong number of fields, an empty namespace or pod
// in the named forms, a comma inside a field, or longer than kMaxNodeLockBytes).
absl::StatusOr<NodeLock> ParseNodeLock(std::string_view value);

}  // namespace dynmig::protocol
