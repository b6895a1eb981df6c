// The ledger of served Allocates (device IDs -> pod UID, namespace, name, container, MIG UUIDs):
// written by Allocate's commit, pruned by reconciliation, read by PreStartContainer's proof. Its
// own lock, so that PreStartContainer never waits for an Allocate's or a Reconcile's NVML work; it
// is persisted with the rest of the state (NodeOps::Persist, node_ops.h, copies Entries() into
// each state write).
// Thread-safe.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "deviceplugin/state_store.h"

namespace dynmig::deviceplugin {

class Ledger {
 public:
  // Replaces every entry (the state file's, at start).
  void Load(std::vector<LedgerEntry> entries) ABSL_LOCKS_EXCLUDED(mu_);
  // Adds `entry`, replacing one with the same device IDs: the kubelet hands a device to one live
  // container at a time, so such an entry is an ended pod's (or this container's own earlier
  // Allocate).
  void Record(LedgerEntry entry) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the entries whose pod UID is not in `live`; whether any was.
  bool Prune(const std::set<std::string>& live) ABSL_LOCKS_EXCLUDED(mu_);
  // The entry for exactly `device_key` (identity.h DeviceKey); nullopt when none.
  std::optional<LedgerEntry> Find(const std::vector<std::string>& device_key) const
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<LedgerEntry> Entries() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable dynmig::Mutex mu_;
  std::vector<LedgerEntry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dynmig::deviceplugin
