// NodeState: the node-local state that Allocate, Reconcile and startup recovery change together
// with NVML (managed instances and open intents, the inventory, quarantined and held slices), and
// the one lock that guards it. PluginCore (plugin_core.h) owns it; the Allocator (allocator.h)
// and the Reclaimer (reclaimer.h) reach it through their shared context (NodeOps, node_ops.h).
// Allocation and reclamation both create and destroy MIG instances, so they share this lock by
// design: an Allocate and a Reconcile never interleave their NVML work, and what one decides from
// the state is still true when it acts on NVML. PluginCore takes it (PluginCore::NodeLock) and
// delegates; the parts only require it. Everything that must not wait for NVML has its own lock
// instead: the ledger (ledger.h), the device list (device_list.h), the publisher (publisher.h)
// and the /nvml snapshot.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "deviceplugin/allocate_plan.h"
#include "deviceplugin/handover.h"
#include "deviceplugin/inventory.h"
#include "deviceplugin/state_store.h"
#include "mig/placement.h"
#include "nvml/nvml.h"
#include "protocol/held_slices.h"
#include "protocol/idle_instances.h"

namespace dynmig::deviceplugin {

struct NodeState {
  // Held for every Allocate, Reconcile and Start, across their NVML calls.
  mutable dynmig::Mutex mu;
  // The state file's content: managed instances, open intents (the ledger has its own lock).
  PluginState state ABSL_GUARDED_BY(mu);
  Inventory inventory ABSL_GUARDED_BY(mu);
  std::optional<nvml::MigMinors> minors ABSL_GUARDED_BY(mu);
  std::string minors_error ABSL_GUARDED_BY(mu);
  std::vector<QuarantinedSlices> quarantine ABSL_GUARDED_BY(mu);
  // Reconcile: managed instances whose owner is not active.
  std::vector<protocol::HeldSlices> ended_held ABSL_GUARDED_BY(mu);
  // Reconcile's adoption: untracked instances kept (busy GPU).
  std::vector<protocol::HeldSlices> untracked_held ABSL_GUARDED_BY(mu);
  bool recovery_pending ABSL_GUARDED_BY(mu) = true;
  // Handover (plugin_handover.cc): the evidence last read and what it proved this cycle.
  LegacyState legacy ABSL_GUARDED_BY(mu);

  ManagedInstance* FindManaged(std::string_view gpu_uuid, const mig::Placement& placement)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  ManagedInstance* FindManagedGi(std::string_view gpu_uuid, uint32_t gi)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void RemoveManaged(std::string_view gpu_uuid, uint32_t gi) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Manages `instance`, replacing a record of the same GI or an overlapping placement.
  void Manage(ManagedInstance instance) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Ended, untracked and legacy (held or unproven) slices together (dynmig.io/mig-held).
  std::vector<protocol::HeldSlices> Held() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The idle (warm) instances (dynmig.io/idle-mig-instances).
  std::vector<protocol::IdleInstance> Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

}  // namespace dynmig::deviceplugin
