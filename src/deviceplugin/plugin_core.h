// PluginCore: everything the device plugin decides, without the gRPC transport. It is the only
// code that creates or destroys MIG instances, and it must never destroy an instance a running pod
// owns, never create an overlapping one, and never lose track of one.
//
//   Start()       state file, NVML discovery, then startup recovery: open intents resolved, idle
//                 GPUs cleaned, every pod's allocation verified against NVML and adopted (a pod
//                 that cannot be verified is reported and its slices are kept out of use; adoption
//                 goes on with the next allocation). If the API cannot be read, recovery waits:
//                 nothing is destroyed until it can.
//   Allocate()    one kubelet container request: the pending pod (confirmed by the node lock,
//                 bind-phase, vgpu-node and its reservation together; the lock is released as soon
//                 as the pod is identified, before any NVML work), its next container's
//                 reservations, GI + CI at exactly the reserved placements (an intent is persisted
//                 first), the runtime identity written into hami.io/vgpu-mig-allocations under a
//                 resourceVersion precondition, the answer (NVIDIA_VISIBLE_DEVICES + device nodes,
//                 or CDI names). On failure only what this call created is destroyed.
//                 Before the node lock's owner is served, the kubelet (PodResources) must list it:
//                 the kubelet knows the pod it admits before it calls Allocate, so an Allocate
//                 while it does not is another pod's (one that reached the node around the
//                 scheduler) and is refused, keeping the lock for the owner. Every served
//                 Allocate is recorded in the ledger (device IDs -> pod UID, namespace, name,
//                 container, MIG UUIDs), persisted in the state file.
//   PreStartContainer()  the kubelet calls it before every start of a container that got this
//                 plugin's devices (GetDevicePluginOptions says pre_start_required): the ledger
//                 entry for exactly these device IDs, the kubelet's PodResources (which container
//                 holds exactly them) and the API (that pod's UID) must agree (identity.h
//                 CheckIdentity). Anything else fails that container's start (fail closed: it
//                 gets nothing), with a Warning event MigIdentityMismatch on the pods concerned and
//                 dynmig_deviceplugin_prestart_refusals_total{reason}; nothing is destroyed.
//   Reconcile()   destroys CI then GI of every managed instance whose owner pod is no longer active
//                 (processes still running: retried next cycle, others go on); adopts live
//                 instances that a pod's verified annotation describes; cleans untracked instances
//                 only on idle GPUs. Nothing is destroyed in a cycle where pods cannot be listed or
//                 a non-terminated pod's MIG annotations cannot be read.
//                 Releases a node lock whose pod will never reach Allocate here (deleted,
//                 finished, or bound to another node), so the node does not wait out its expiry.
//                 Drops the ledger entries of pods that ended.
//   PublishNode() hami.io/node-nvidia-register + hami.io/node-handshake "Reported_<RFC3339>",
//                 dynmig.io/mig-held and dynmig.io/idle-mig-instances: a NodeSnapshot taken under
//                 the node state's lock, written by the Publisher (publisher.h) after it is
//                 released.
//
// Warm instances (options.warm, off by default): Reconcile keeps the instance of an ended pod idle
// (recorded in the state file) while its GPU has fewer than maxPerGpu idle ones; an idle instance
// is destroyed after its TTL (unless an active pod's reservation names it exactly), as soon as an
// active pod's reservation overlaps it otherwise, when warm instances are turned off, or over the
// cap. Allocate gives an idle instance that a reservation names exactly (GPU, profile, placement)
// to the pod after verifying it against NVML (GI, profile, CI, MIG UUID, no process), without
// creating anything; when it is gone or does not verify, Allocate creates afresh. Recovery keeps
// idle instances that NVML still shows (never cleans them as untracked).
//
// PluginCore is the facade over its parts, each with the state and the lock it owns:
//
//   NodeState   (node_state.h) managed instances, intents, inventory, quarantined and held
//               slices, and NodeState::mu, held across every NVML change: allocation and
//               reclamation share it by design.
//   NodeOps     (node_ops.h) the context the Allocator and the Reclaimer share: options, seams,
//               the state file and CDI writers, and the steps both run (persist, the instance
//               record, the runtime identity, device nodes, NVML destroy and verify, events).
//   Allocator   (allocator.h, allocator.cc, allocate_plan.h) the Allocate pipeline and its own
//               state (the node as read, the node lock released, the pod in progress):
//               IdentifyPod (the node lock's owner or the pod in progress, proven by the kubelet's
//               PodResources) -> ValidateAllocation (pure: the typed reservation + the node's view
//               -> an AllocationPlan or a refusal) -> ConfirmAgainstNvml -> RecordIntents (the
//               state file) -> CreateInstances (rolled back on failure) -> Publish (the runtime
//               identity, the commit, the kubelet's answer).
//   Reclaimer   (reclaimer.h; reclaimer.cc, reclaimer_warm.cc, reclaimer_recovery.cc)
//               reconciliation, reclamation, adoption, warm instances, startup recovery, the
//               orphaned node lock. Recovery (intent completion) and adoption run Allocate's
//               record and publish steps (NodeOps::NewInstance, WriteRuntimeIdentity,
//               DeviceNodes) from their own entry; both destroy nothing on doubt.
//   Ledger      (ledger.h) the served Allocates, its own lock: PreStartContainer
//               (plugin_identity.cc, identity.h) never waits on NVML.
//   DeviceList  (device_list.h) the kubelet's device list, its own lock: ListAndWatch never waits
//               on NVML.
//   Publisher   (publisher.h) the node annotations and gauges, its own lock: written from a
//               NodeSnapshot taken under NodeState::mu, after it is released (plugin_publish.cc).
//
// The public methods take the locks and delegate: Start() and Reconcile() to the Reclaimer,
// Allocate() to the Reclaimer (what ended pods hold is freed first) then the Allocator. Sources:
// plugin_core.cc (creation, start, the entries, observers), plugin_publish.cc, plugin_identity.cc,
// and the parts' own.
//
// Thread-safe: mutating operations are serialized by NodeState::mu (every member it guards says
// so). The /nvml snapshot has its own view_mu_, and the ledger, the device list and the publisher
// their own locks, so PreStartContainer and ListAndWatch never wait on NVML and a node patch never
// holds NodeState::mu. The analysis knows NodeState::mu by one name in each object (ns_.mu here,
// ns.mu in the context, ops_.ns.mu in the parts: it does not follow references); NodeLock takes it
// under all of them at once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "deviceplugin/allocate_plan.h"
#include "deviceplugin/allocator.h"
#include "deviceplugin/cdi.h"
#include "deviceplugin/device_list.h"
#include "deviceplugin/events.h"
#include "deviceplugin/inventory.h"
#include "deviceplugin/ledger.h"
#include "deviceplugin/metrics.h"
#include "deviceplugin/mode_switch.h"
#include "deviceplugin/node_ops.h"
#include "deviceplugin/node_state.h"
#include "deviceplugin/plugin_options.h"
#include "deviceplugin/pod_resources.h"
#include "deviceplugin/pods.h"
#include "deviceplugin/publisher.h"
#include "deviceplugin/reclaimer.h"
#include "deviceplugin/state_store.h"
#include "deviceplugin/v1beta1/api.pb.h"
#include "kube/kube_client.h"
#include "mig/allowlist.h"
#include "nlohmann/json.hpp"
#include "nvml/nvml.h"
#include "protocol/annotations.h"
#include "protocol/device_config.h"
#include "protocol/held_slices.h"
#include "protocol/idle_instances.h"

namespace dynmig::deviceplugin {

class PluginCore {
 public:
  // `nvml`, `kube`, `metrics`, `events` and `pod_resources` must outlive the core. Without
  // `pod_resources` (the kubelet's PodResources API) no PreStartContainer is proven (every one is
  // refused) and Allocate skips its check of the lock owner. kInvalidArgument: node name or state
  // file missing, or an invalid allowlist.
  static absl::StatusOr<std::unique_ptr<PluginCore>> Create(
      PluginCoreOptions options, nvml::Nvml& nvml, kube::KubeClient& kube, Metrics& metrics,
      EventRecorder& events, PodResourcesSource* pod_resources = nullptr);
  PluginCore(const PluginCore&) = delete;
  PluginCore& operator=(const PluginCore&) = delete;

  // Once, before serving. Errors: NVML cannot count GPUs; the state file cannot be written. An
  // unreadable API is not an error: recovery is deferred (recovery_pending()).
  absl::Status Start();

  // ---- kubelet ----
  v1beta1::DevicePluginOptions PluginOptions() const;
  // The advertised devices: per exposed GPU "<uuid>::0".."<uuid>::<n-1>", n = its largest
  // instance count; Unhealthy while the GPU is. `generation` (optional) receives the list's
  // generation.
  std::vector<v1beta1::Device> Devices(uint64_t* generation = nullptr) const;
  // Waits until the device list's generation differs from `seen` (or `timeout` of real time, or
  // CloseDeviceWatches()); returns the current generation.
  uint64_t WaitForDeviceChange(uint64_t seen, absl::Duration timeout) const;
  // Ends every WaitForDeviceChange at once, now and later (the transport is shutting down).
  void CloseDeviceWatches();
  // One container's Allocate. Errors: kInvalidArgument (unknown device ids), kUnavailable (pods
  // cannot be listed), kFailedPrecondition (no pending pod; refused reservation, legacy pod,
  // placement busy), NVML's codes when creation fails, kAborted (annotation conflicts persisted).
  absl::StatusOr<v1beta1::ContainerAllocateResponse> Allocate(
      const std::vector<std::string>& device_ids);
  // Whether the container about to start with `device_ids` is the pod container they were served
  // for (see the header comment). kFailedPrecondition naming what differs; kUnavailable when the
  // kubelet's PodResources or the API cannot be read.
  absl::Status PreStartContainer(const std::vector<std::string>& device_ids);
  // Prefers replicas of the GPUs the pending pod's next container reserved.
  v1beta1::ContainerPreferredAllocationResponse PreferredAllocation(
      const v1beta1::ContainerPreferredAllocationRequest& request);

  // ---- periodic ----
  ReconcileReport Reconcile();
  // Writes hami.io/node-nvidia-register and hami.io/node-handshake ("Reported_<RFC3339 now>") in
  // one patch.
  absl::Status PublishNode() ABSL_LOCKS_EXCLUDED(publish_mu_);
  // Re-reads GPU health; updates the device list and returns whether anything changed.
  bool RefreshDevices();
  // MIG mode switches (mode_switch.h; only with nvidia.migModeSwitching configured): reads the
  // node's dynmig.io/gpu-mode-request, publishes the GPUs it switches as "switching" (unhealthy),
  // carries the switches out under the node state's lock, publishes the outcome. Returns whether
  // it published. Sources: plugin_mode_switch.cc.
  bool SwitchModes() ABSL_LOCKS_EXCLUDED(publish_mu_, ns_.mu);
  // The statuses dynmig.io/gpu-mode carries (empty when switching is not configured).
  std::vector<protocol::GpuModeStatus> ModeStatuses();

  // ---- observers ----
  // The node's NVML view as JSON (GET /nvml): GPUs, profiles, instances with their owners, intents,
  // quarantined slices, and `snapshotAt` (RFC 3339). Never waits for Allocate or Reconcile: when
  // the core is busy (or the last snapshot is younger than kViewMinAge) it answers the last
  // snapshot, which every Allocate, Reconcile and Start refresh on their way out.
  nlohmann::json NvmlView();
  static constexpr absl::Duration kViewMinAge = absl::Milliseconds(200);
  std::vector<ManagedInstance> Managed() const;
  std::vector<Intent> OpenIntents() const;
  std::vector<LedgerEntry> Ledger() const;
  std::vector<QuarantinedSlices> Quarantined() const;
  // Slices live instances hold that no active pod's reservation names (published as
  // dynmig.io/mig-held so the scheduler does not reserve them): instances of ended pods not
  // reclaimed yet, and untracked instances kept on busy GPUs.
  std::vector<protocol::HeldSlices> Held() const;
  // The idle (warm) instances, as published in dynmig.io/idle-mig-instances.
  std::vector<protocol::IdleInstance> Idle() const;
  // Whether the idle instances changed since the last successful PublishNode.
  bool IdleChanged() const;
  // Whether the held slices (dynmig.io/mig-held) differ from those last published.
  bool HeldChanged() const;
  bool recovery_pending() const;
  Inventory inventory() const;
  const PluginCoreOptions& options() const { return options_; }

 private:
  PluginCore(PluginCoreOptions options, nvml::Nvml& nvml, kube::KubeClient& kube, Metrics& metrics,
             EventRecorder& events, PodResourcesSource* pod_resources);

  class NodeLock;

  // Reads the handover evidence outside the node lock when the last cycles needed it and it is
  // stale, and offers it to the reclaimer (Reclaimer::ReadEvidenceSources).
  void PrefetchEvidence() ABSL_LOCKS_EXCLUDED(ns_.mu);

  // Allocate under the node state's lock: the reclaimer frees what ended pods hold (recovering
  // first when recovery is pending), then the allocator's pipeline runs.
  absl::StatusOr<v1beta1::ContainerAllocateResponse> AllocateLocked(
      const std::vector<std::string>& device_ids, std::string* result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu, allocator_.mu(), reclaimer_.mu());
  nlohmann::json NvmlViewLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  void RefreshViewLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  void UpdateDevices() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Handover (plugin_handover.cc): the fields of one instance item of GET /nvml, and its top-level
  // "evidence".
  void AddHandoverView(const GpuEntry& gpu, const nvml::GpuInstanceInfo& gi,
                       nlohmann::json& item) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  nlohmann::json EvidenceView() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // What PublishNode writes, as the state is now.
  NodeSnapshot SnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu, switcher_.mu());
  // Start(): the state file (moved aside when corrupt) and the NVML inventory.
  absl::Status LoadStateAndInventory() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);

  const PluginCoreOptions options_;

  // The node-local state NVML work changes and its lock (node_state.h), held by every Allocate,
  // Reconcile and Start across their NVML calls: allocation and reclamation share it by design.
  // The members below it are guarded by it too (taken before view_mu_ and the components' own
  // locks).
  NodeState ns_;
  bool started_ ABSL_GUARDED_BY(ns_.mu) = false;
  // Which GPUs may be whole: the options' switching and the node's labels, read at Start.
  WholeGpuPolicy whole_policy_ ABSL_GUARDED_BY(ns_.mu);

  // The ledger of served Allocates (PreStartContainer never waits for ns_.mu). ns_.state.ledger is
  // its copy in the state file, refreshed by every state write.
  deviceplugin::Ledger ledger_;
  // The advertised devices (ListAndWatch never waits for ns_.mu).
  DeviceList devices_;
  // The node annotations and gauges, written from snapshots taken under ns_.mu (a node patch never
  // holds ns_.mu).
  Publisher publisher_;

  // The context the parts share, and the parts.
  NodeOps ops_;
  Reclaimer reclaimer_;
  Allocator allocator_;
  ModeSwitcher switcher_;

  // The last NvmlView snapshot and when it was taken (written under ns_.mu too, taken inside it).
  mutable dynmig::Mutex view_mu_ ABSL_ACQUIRED_AFTER(ns_.mu);
  nlohmann::json view_ ABSL_GUARDED_BY(view_mu_);
  absl::Time view_at_ ABSL_GUARDED_BY(view_mu_) = absl::InfinitePast();  // wall time, shown
  // Monotonic time of the snapshot, for kViewMinAge.
  absl::Duration view_taken_ ABSL_GUARDED_BY(view_mu_) = -absl::InfiniteDuration();

  // Serializes PublishNode from its snapshot to the end of its patch, so an older snapshot never
  // lands on the Node after a newer one (the reconcile loop and Start both publish).
  dynmig::Mutex publish_mu_ ABSL_ACQUIRED_BEFORE(ns_.mu);
};

// NodeState::mu, held for a scope under every name the analysis knows it by: ns_.mu (PluginCore's
// own), ops_.ns.mu (the context's) and the parts' mu(). One mutex, locked once; the analysis does
// not follow references, so without this it would take them for four.
class ABSL_SCOPED_LOCKABLE PluginCore::NodeLock {
 public:
  explicit NodeLock(PluginCore* core)
      ABSL_EXCLUSIVE_LOCK_FUNCTION(core->ns_.mu, core->ops_.ns.mu, core->allocator_.mu(),
                                   core->reclaimer_.mu(), core->switcher_.mu())
      : mu_(&core->ns_.mu) {
    mu_->Lock();
  }
  ~NodeLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  NodeLock(const NodeLock&) = delete;
  NodeLock& operator=(const NodeLock&) = delete;

 private:
  dynmig::Mutex* const mu_;
};

}  // namespace dynmig::deviceplugin
