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
// Allocate is a pipeline of named steps, each with one owner: IdentifyPod (the node lock's owner
// or the pod in progress, proven by the kubelet's PodResources) -> ValidateAllocation (pure,
// allocate_plan.h: the typed reservation + the node's view -> an AllocationPlan or a refusal) ->
// ConfirmAgainstNvml -> RecordIntents (the state file) -> CreateInstances (rolled back on failure)
// -> Publish (the runtime identity, the commit, the kubelet's answer). Recovery (intent
// completion) and adoption run the same record and publish steps (NewInstance, RecordAdopted,
// WriteRuntimeIdentity) from their own entry; both destroy nothing on doubt.
//
// Sources: plugin_core.cc (start, state, shared helpers), plugin_allocate.cc, allocate_plan.cc,
// plugin_reclaim.cc, plugin_warm.cc, plugin_recovery.cc, plugin_publish.cc, plugin_identity.cc
// (PreStart), ledger.cc, device_list.cc, publisher.cc.
//
// Thread-safe: mutating operations are serialized by the node state's lock (NodeState::mu,
// node_state.h: managed instances, intents, inventory, quarantined and held slices; every member
// it guards says so). Allocate and Reconcile both change NVML, so they share that lock by design.
// The /nvml snapshot has its own view_mu_, and the ledger (Ledger), the device list (DeviceList)
// and the publisher (Publisher) their own locks, so PreStartContainer and ListAndWatch never wait
// on NVML and a node patch never holds the node state's lock.
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
#include "deviceplugin/cdi.h"
#include "deviceplugin/device_list.h"
#include "deviceplugin/events.h"
#include "deviceplugin/handover.h"
#include "deviceplugin/inventory.h"
#include "deviceplugin/ledger.h"
#include "deviceplugin/metrics.h"
#include "deviceplugin/node_state.h"
#include "deviceplugin/pod_resources.h"
#include "deviceplugin/pods.h"
#include "deviceplugin/publisher.h"
#include "deviceplugin/runtime_source.h"
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

// Crash points (testing): PluginCoreOptions::crash_point is asked at each; `true` makes Allocate
// return kAborted at once, leaving NVML, the API and the state file exactly as they are, as a
// crash would.
inline constexpr std::string_view kCrashAfterIntent = "after-intent";
inline constexpr std::string_view kCrashAfterGpuInstance = "after-gpu-instance";
inline constexpr std::string_view kCrashAfterComputeInstance = "after-compute-instance";
inline constexpr std::string_view kCrashBeforeRollback = "before-rollback";
inline constexpr std::string_view kCrashAfterAnnotation = "after-annotation";

// How long after identifying a pod (and releasing its node lock) a later Allocate is taken for the
// same pod while it has containers left: the kubelet allocates a pod's containers one after the
// other in one admission pass.
inline constexpr absl::Duration kInProgressWindow = absl::Seconds(30);

struct PluginCoreOptions {
  std::string node_name;
  std::string resource_name = std::string(protocol::kResourceCount);
  mig::Allowlist allowlist;
  // The node-local state file (managed instances, intents). Required.
  std::string state_file;
  // fsync the state file and CDI specs on every write (off only for benchmarks on tmpfs).
  bool fsync = true;
  // When set, Allocate writes a CDI spec per MIG device here and answers with CDI names.
  std::string cdi_dir;
  // Warm instances (device-config.yaml nvidia.migWarmInstances): an ended pod's instance is kept
  // idle for reuse. Off by default.
  protocol::WarmInstances warm;
  // Attempts of the optimistic-concurrency loop that writes the pod annotation.
  int annotation_attempts = 5;
  // Wall time (timestamps, TTLs, the in-progress window) and monotonic time (durations); must
  // outlive the core. null = RealClock() (DevicePlugin passes its own clock when this is unset).
  // The device list's waits (WaitForDeviceChange) run on real time: they pace a gRPC stream whose
  // peer, the kubelet, does.
  const Clock* clock = nullptr;
  // The container runtime (CRI), handover's second source of evidence (handover.h); must outlive
  // the core. null = not configured: instances only the runtime could prove stay unproven.
  ContainerRuntimeSource* runtime = nullptr;
  // How long handover's evidence (PodResources and the runtime: up to 1024 ContainerStatus calls)
  // is reused by later cycles: the Allocates of one kubelet admission burst each run a cycle, and
  // must not each list every container. Stale evidence can only keep an instance longer, or miss
  // a holder that a legacy allocator (stopped for handover) created in that window. 0 = read
  // every cycle.
  absl::Duration evidence_max_age = absl::Seconds(2);
  std::function<bool(std::string_view point)> crash_point;  // testing only
  std::string component = "dynmig-device-plugin";
};

struct ReconcileReport {
  bool listed = false;
  std::string skipped;  // why nothing was destroyed ("" = destruction was allowed)
  int destroyed = 0;    // managed instances of finished pods, and untracked ones on idle GPUs
  int busy = 0;         // reclaimable, but processes still run: retried next cycle
  int destroy_failed = 0;
  int adopted = 0;
  int untracked = 0;       // live instances kept without an owner (busy GPU)
  int unverified = 0;      // allocations of non-terminated pods that could not be verified
  int idled = 0;           // instances of ended pods kept idle (warm instances)
  int idle_destroyed = 0;  // idle instances destroyed (TTL, slices needed, cap, turned off)
};

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
  bool recovery_pending() const;
  Inventory inventory() const;
  const PluginCoreOptions& options() const { return options_; }

 private:
  PluginCore(PluginCoreOptions options, nvml::Nvml& nvml, kube::KubeClient& kube, Metrics& metrics,
             EventRecorder& events, PodResourcesSource* pod_resources);

  struct Created;

  absl::Time Now() const { return options_.clock->Now(); }
  int64_t NowUnix() const { return absl::ToUnixSeconds(Now()); }
  bool Crash(std::string_view point) const;

  // The node's pods from the API (needs no lock).
  absl::StatusOr<std::vector<PodMig>> ListPods();
  nlohmann::json NvmlViewLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  void RefreshViewLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  absl::Status Persist() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Persist(), logging a failure with `what` (a state the next start recovers from anyway).
  void PersistOrLog(std::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  void UpdateDevices() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  void UpdateGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // What PublishNode writes, as the state is now.
  NodeSnapshot SnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Start(): the state file (moved aside when corrupt) and the NVML inventory.
  absl::Status LoadStateAndInventory() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);

  // ---- recovery (plugin_recovery.cc) ----
  void RecoverLocked(const std::vector<PodMig>& pods) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Completes or destroys (only when `destructive`) instances of intents left open.
  void ResolveIntents(const std::vector<PodMig>& pods, bool destructive)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // One open intent; whether it is closed.
  bool ResolveIntent(const Intent& intent, const PodMig* pod, bool destructive)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // The intent's pod still reserves exactly its instance (`entry`): the missing CI is created,
  // the runtime identity published and the instance recorded. Whether the intent is closed.
  bool CompleteIntent(const Intent& intent, const std::string& what, const PodMig& pod,
                      const protocol::MigAllocation& entry, const GpuEntry& gpu,
                      const mig::ProfileSpec& profile, uint32_t gi)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Nobody owns the intent's instance (`why`): destroyed, or tracked for reclamation while
  // processes run on it. Whether the intent is closed.
  bool ReleaseIntent(const Intent& intent, const std::string& what, const std::string& why,
                     const PodMig* pod, const GpuEntry& gpu, const mig::ProfileSpec& profile,
                     uint32_t gi) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  void CleanIdleGpus(const std::vector<PodMig>& pods) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);

  // ---- reclamation and adoption (plugin_reclaim.cc) ----
  ReconcileReport ReconcileLocked(const std::vector<PodMig>& pods)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Reclaims managed instance `m`, whose owner is no longer active (`ended` says how); whether
  // the state changed.
  bool ReclaimEnded(const ManagedInstance& m, const PodMig* owner, bool destructive,
                    ReconcileReport& report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // The non-terminated pods whose MIG annotations cannot be read ("ns/name: why"), each reported
  // once (event and log). Non-empty: nothing may be destroyed.
  std::vector<std::string> Unreadable(const std::vector<PodMig>& pods)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  struct Candidate;
  using Candidates = std::map<std::pair<std::string, uint32_t>, Candidate>;  // (gpu, start)
  void AdoptUntracked(const std::vector<PodMig>& pods, bool destructive, ReconcileReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // The complete annotations by GPU and placement that no managed instance realizes (adoption
  // candidates); quarantines what cannot be verified; claims idle instances an annotation names.
  // Sets `changed` when the state changed.
  Candidates CollectCandidates(const std::vector<PodMig>& pods, ReconcileReport& report,
                               bool& changed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Idle instance `m` that the annotation `a` of active pod `p` names exactly becomes the pod's.
  bool ClaimIdle(ManagedInstance& m, const PodMig& p, const protocol::MigAllocation& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  void Quarantine(const PodMig& p, const protocol::MigAllocation& a, const std::string& reason,
                  ReconcileReport& report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Forgets the managed instances of `gpu` that NVML (`gis`) no longer shows; whether any was.
  bool ForgetVanished(const GpuEntry& gpu, const std::vector<nvml::GpuInstanceInfo>& gis)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Adopts the GIs of `gpu` that a candidate describes and NVML verifies; returns the GIs nobody
  // owns. Sets `changed` when the state changed.
  std::vector<nvml::GpuInstanceInfo> AdoptOnGpu(const GpuEntry& gpu,
                                                const std::vector<nvml::GpuInstanceInfo>& gis,
                                                Candidates& candidates, ReconcileReport& report,
                                                bool& changed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Untracked GIs of `gpu`: destroyed when `idle` (the whole GPU is), kept and reported
  // otherwise. Returns how many are kept.
  int KeepOrCleanUntracked(const GpuEntry& gpu, const std::vector<nvml::GpuInstanceInfo>& unowned,
                           bool idle, const std::string& why, ReconcileReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Reports the candidates of active pods whose instance is gone.
  void ReportGone(const Candidates& candidates) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Reclaim/recovery/adoption's record step: `m` (built by NewInstance) is managed, counted as
  // adopted (`how`) and announced with `event`.
  void RecordAdopted(ManagedInstance m, const PodMig* pod, std::string_view how,
                     const std::string& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);

  // ---- handover of legacy instances (plugin_handover.cc, handover.h) ----
  // Starts a cycle's attribution: the evidence is read again when next asked for, unless the last
  // read is younger than options.evidence_max_age.
  void BeginHandoverCycle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // This cycle's evidence (the kubelet's PodResources, the runtime), read once per cycle.
  const HandoverEvidence& Evidence(const std::vector<PodMig>& pods)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // The live instance of GI `gi` of `gpu` (its first CI and MIG UUID, when it has one).
  LiveInstance Live(const GpuEntry& gpu, const nvml::GpuInstanceInfo& gi)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Attributes the GIs of `gpu` no pod annotation describes: held ones become managed (origin
  // "legacy"), unproven ones are kept and published; returns the free ones (the untracked rule).
  std::vector<nvml::GpuInstanceInfo> AttributeUnowned(
      const GpuEntry& gpu, const std::vector<nvml::GpuInstanceInfo>& unowned,
      const std::vector<PodMig>& pods, bool& changed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Re-attributes every managed legacy instance: held ones record their holders, unproven ones
  // are kept, ones no container holds any more are reclaimed (ReclaimEnded). Whether the state
  // changed.
  bool ReconcileLegacy(const std::vector<PodMig>& pods, bool destructive, ReconcileReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Why startup's idle-GPU cleanup must spare `gpu` ("" when nothing legacy is on it): a managed
  // legacy instance, or a live untracked one that is held or unproven.
  std::string LegacyOnGpu(const GpuEntry& gpu, const std::vector<PodMig>& pods)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Whether ended legacy instance `m` may be kept idle: its profile is allowlisted on its GPU.
  bool LegacyMayIdle(const ManagedInstance& m) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // The handover fields of one instance item of GET /nvml, and the top-level "evidence".
  void AddHandoverView(const GpuEntry& gpu, const nvml::GpuInstanceInfo& gi,
                       nlohmann::json& item) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  nlohmann::json EvidenceView() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  void UpdateLegacyGauge() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);

  // ---- warm instances (plugin_warm.cc) ----
  // Whether the ended instance `m` is kept idle rather than destroyed: warm instances on, its CI
  // known, its GPU under the cap.
  bool KeepIdle(const ManagedInstance& m) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Marks managed instance `m` (its pod ended, no process) idle.
  void MarkIdle(const ManagedInstance& m, const PodMig* owner, const std::string& ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Destroys idle instances past their TTL, overlapping an active pod's unrealized reservation,
  // over the cap or with warm instances off; keeps those an unrealized reservation names exactly.
  // Destroys nothing unless `destructive`.
  void SweepIdle(const std::vector<PodMig>& pods, bool destructive, ReconcileReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Whether idle instance `m` is still exactly what NVML shows at GI `gi`, with its CI and MIG
  // UUID, and no process runs on it. The error says what differs.
  absl::Status VerifyIdle(const GpuEntry& gpu, const ManagedInstance& m,
                          const nvml::GpuInstanceInfo& gi);

  // ---- Allocate, a pipeline (plugin_allocate.cc): identify -> validate -> confirm against
  // NVML -> record the intents -> create (rolled back on failure) -> publish ----
  absl::StatusOr<v1beta1::ContainerAllocateResponse> AllocateLocked(
      const std::vector<std::string>& device_ids, std::string* result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // kInvalidArgument unless every ID is a replica of an exposed GPU.
  absl::Status CheckDeviceIds(const std::vector<std::string>& device_ids) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Step 1: the pod this Allocate is for, proven: the node lock's owner (or the pod in progress)
  // that the kubelet's PodResources lists. Releases the node lock once the pod is identified.
  absl::StatusOr<PodMig> IdentifyPod(const std::vector<PodMig>& pods, size_t device_count,
                                     std::string* result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // The node (read into alloc_.node) and its lock; nullopt when unreadable or absent.
  std::optional<protocol::NodeLock> ReadNodeLock() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Step 2 is ValidateAllocation (allocate_plan.h) over View().
  NodeView View() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Step 3: what only NVML can confirm: no GI the plan does not reuse overlaps a reservation; a
  // reused instance still exists (else it is created again); an idle one still verifies (else
  // it is destroyed when idle, and created again).
  absl::Status ConfirmAgainstNvml(const PodMig& pod, AllocationPlan& plan, std::string* result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  absl::Status ConfirmDevice(const PodMig& pod, int container, const std::string& what,
                             PlannedDevice& d, std::string* result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // An idle instance the plan reuses: verified (then handed to the pod), or destroyed so that
  // the device is created afresh.
  absl::Status TakeOverIdle(const PodMig& pod, int container, const std::string& what,
                            const nvml::GpuInstanceInfo& live, PlannedDevice& d,
                            std::string* result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Step 4: an intent per device to create, persisted before any creation, so that a crash in
  // between is resolved without guessing.
  absl::Status RecordIntents(const PodMig& pod, AllocationPlan& plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Step 5: GI + CI at each planned placement (reused instances as they are). On failure
  // everything in `created` is rolled back by the caller (Abort).
  absl::StatusOr<std::vector<ManagedInstance>> CreateInstances(const PodMig& pod,
                                                               const AllocationPlan& plan,
                                                               std::vector<Created>& created)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Step 6: the answer, the runtime identity written under the pod's resourceVersion, then the
  // commit (managed instances, closed intents, the ledger entry, in one write).
  absl::StatusOr<v1beta1::ContainerAllocateResponse> Publish(
      const std::vector<std::string>& device_ids, const PodMig& pod, const AllocationPlan& plan,
      const std::vector<ManagedInstance>& instances, std::vector<Created>& created,
      std::string* result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  void Commit(const std::vector<std::string>& device_ids, const PodMig& pod,
              const AllocationPlan& plan, const std::vector<ManagedInstance>& instances)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // A failed step after the intents: rolls back what this call created, reports, fails the pod.
  absl::Status Abort(const PodMig& pod, const AllocationPlan& plan, std::vector<Created>& created,
                     const absl::Status& st, std::string_view step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // The instance record every step builds (Allocate, intent completion, adoption).
  ManagedInstance NewInstance(const InstanceOwner& owner, std::string_view gpu_uuid,
                              std::string_view profile, uint32_t profile_id,
                              const mig::Placement& placement, uint32_t gi, uint32_t ci,
                              std::string_view mig_uuid, std::string_view origin) const;

  // The ledger (ledger_, plugin_identity.cc). Records that `device_ids` were served for container
  // `container` of `pod` with `instances` (replacing an entry with the same IDs).
  void RecordLedger(const std::vector<std::string>& device_ids, const PodMig& pod, int container,
                    const std::vector<ManagedInstance>& instances)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Drops the entries whose pod is not among the non-terminated `pods`; true when any was.
  bool PruneLedger(const std::vector<PodMig>& pods) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Allocate's check of the pod it is about to serve: kFailedPrecondition when the kubelet's
  // PodResources answers and does not list `pod` (this Allocate is another pod's). OK when it
  // lists it, and when PodResources cannot be read (PreStartContainer then fails closed).
  absl::Status KubeletKnows(const PodMig& pod);
  absl::Status Refuse(const PodMig& pod, std::string_view reason, absl::Status status,
                      std::string* result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // bind-phase failed; releases the node lock unless this Allocate already did.
  void FailPod(const PodMig& pod) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Removes hami.io/mutex.lock when `pod` holds it, under the node's resourceVersion. `node` is a
  // recent read of the node (saves a GET; re-read on conflict). Sets alloc_.lock_released once the
  // lock is no longer the pod's.
  void ReleaseNodeLock(const PodMig& pod, std::optional<kube::Object> node = std::nullopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Reconcile: removes hami.io/mutex.lock (under the node's resourceVersion) when the pod it names
  // is gone, has finished or is bound to another node: a bind that failed half-way (a crashed
  // scheduler) or a pod deleted before its Allocate leaves such a lock. A pod not bound yet keeps
  // it (its bind may be in progress).
  void ReleaseOrphanedNodeLock(const std::vector<PodMig>& pods);
  // Why the lock's pod will never reach Allocate here ("" when it may).
  std::string OrphanedBecause(const protocol::NodeLock& lock, const std::vector<PodMig>& pods);
  // The uid of the allocation in progress (within kInProgressWindow), or "".
  std::string InProgress() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  void Rollback(std::vector<Created>& created, const std::vector<uint64_t>& intents)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // Publish step shared by Allocate and intent completion: writes the runtime identity of
  // `entries` (device index -> identity) of container `container` into the pod's annotation;
  // with `consume`, also erases the container from hami.io/vgpu-devices-to-allocate and sets
  // bind-phase success when none is left (`done`).
  absl::Status WriteRuntimeIdentity(const PodMig& pod, int container,
                                    const std::map<int, protocol::RuntimeIdentity>& entries,
                                    bool consume, bool* done);
  // The reservations of `current` with `entries` written in; kFailedPrecondition when one
  // disappeared, carries another identity or changed since `pod` was read. `already`: every
  // entry was written before.
  absl::StatusOr<std::vector<protocol::MigAllocation>> WithIdentities(
      const PodMig& pod, const kube::Object& current, int container,
      const std::map<int, protocol::RuntimeIdentity>& entries, bool& already);
  absl::StatusOr<v1beta1::ContainerAllocateResponse> Answer(
      const std::vector<ManagedInstance>& instances) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  // The device nodes a container needs for MIG device (gi, ci) of `gpu`: none when the NVML
  // backend has no device nodes on the host (simulated GPUs).
  absl::StatusOr<std::vector<std::string>> DeviceNodes(const GpuEntry& gpu, uint32_t gi,
                                                       uint32_t ci)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);

  // NVML helpers.
  // Destroys every CI of GI `gi`, then the GI. A GI that is already gone is OK.
  absl::Status DestroyGi(const GpuEntry& gpu, uint32_t gi);
  // Whether processes run on GI `gi`; a failing query counts as busy (`why` says which).
  bool GiBusy(const GpuEntry& gpu, uint32_t gi, std::string* why);
  // Whether the GPU runs processes (a failing query counts as busy).
  bool GpuHasProcesses(const GpuEntry& gpu, std::string* why);
  // Verifies a complete allocation against a live GI: profile, placement, GI id, CI id, MIG UUID.
  absl::Status Verify(const GpuEntry& gpu, const nvml::GpuInstanceInfo& gi,
                      const protocol::MigAllocation& allocation);

  // Reports once per key (events and warnings that would repeat every cycle).
  bool FirstReport(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu);
  void Event(const PodMig* pod, std::string_view type, std::string_view reason,
             const std::string& message);

  const PluginCoreOptions options_;
  nvml::Nvml& nvml_;
  kube::KubeClient& kube_;
  Metrics& metrics_;
  EventRecorder& events_;
  PodResourcesSource* const pod_resources_;  // may be null
  const StateStore store_;
  const CdiWriter cdi_;

  // The node-local state NVML work changes and its lock (node_state.h), held by every Allocate,
  // Reconcile and Start across their NVML calls: allocation and reclamation share it by design.
  // The members below it are guarded by it too (taken before view_mu_ and the components' own
  // locks).
  NodeState ns_;
  // Reports made once (FirstReport).
  std::set<std::string> reported_ ABSL_GUARDED_BY(ns_.mu);
  // The allocator's own state: what an Allocate carries between its steps, and the pod whose
  // containers it is serving. Guarded by the node state's lock like the rest of Allocate.
  struct AllocatorState {
    // The node as read by the current Allocate.
    std::optional<kube::Object> node;
    // The current Allocate released its pod's node lock.
    bool lock_released = false;
    // The pod this process identified last and has not finished (in memory only: a restart
    // breaks the kubelet's admission pass anyway).
    struct InProgressPod {
      std::string uid;
      absl::Time since;
    };
    std::optional<InProgressPod> in_progress;
  };
  AllocatorState alloc_ ABSL_GUARDED_BY(ns_.mu);
  bool started_ ABSL_GUARDED_BY(ns_.mu) = false;

  // The last NvmlView snapshot and when it was taken (written under ns_.mu too, taken inside it).
  mutable dynmig::Mutex view_mu_ ABSL_ACQUIRED_AFTER(ns_.mu);
  nlohmann::json view_ ABSL_GUARDED_BY(view_mu_);
  absl::Time view_at_ ABSL_GUARDED_BY(view_mu_) = absl::InfinitePast();  // wall time, shown
  // Monotonic time of the snapshot, for kViewMinAge.
  absl::Duration view_taken_ ABSL_GUARDED_BY(view_mu_) = -absl::InfiniteDuration();

  // The ledger of served Allocates (PreStartContainer never waits for ns_.mu). ns_.state.ledger is
  // its copy in the state file, refreshed by Persist().
  deviceplugin::Ledger ledger_;
  // The advertised devices (ListAndWatch never waits for ns_.mu).
  DeviceList devices_;
  // The node annotations and gauges, written from snapshots taken under ns_.mu (a node patch never
  // holds ns_.mu).
  Publisher publisher_;
  // Serializes PublishNode from its snapshot to the end of its patch, so an older snapshot never
  // lands on the Node after a newer one (the reconcile loop and Start both publish).
  dynmig::Mutex publish_mu_ ABSL_ACQUIRED_BEFORE(ns_.mu);
};

}  // namespace dynmig::deviceplugin
