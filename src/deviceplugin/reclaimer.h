// Reclaimer: everything that frees, adopts or recovers MIG instances (see plugin_core.h for what
// Reconcile and startup recovery promise):
//
//   Reconcile   the periodic cycle (reclaimer.cc): instances of pods that are no longer active
//               destroyed (or kept warm, reclaimer_warm.cc), live instances a verified
//               annotation describes adopted, untracked ones cleaned only on idle GPUs, the
//               ledger entries of ended pods dropped, an orphaned node lock released. Allocate
//               runs it first, so that what finished pods hold is free at once.
//   Recover     startup recovery (reclaimer_recovery.cc): open intents completed or released,
//               idle GPUs cleaned, every verified allocation adopted.
//
// Recovery and adoption are Allocate's record and publish steps run from another entry: they
// build the record with NodeOps::NewInstance, publish with NodeOps::WriteRuntimeIdentity and
// DeviceNodes (the CDI spec), and destroy nothing on doubt. The node state they change is the
// context's (node_ops.h), under NodeState::mu like every NVML change. Not thread-safe by itself:
// every method requires the node state's lock.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/mutex.h"
#include "deviceplugin/handover.h"
#include "deviceplugin/inventory.h"
#include "deviceplugin/node_ops.h"
#include "deviceplugin/pods.h"
#include "deviceplugin/state_store.h"
#include "mig/profile.h"
#include "nvml/nvml.h"
#include "protocol/annotations.h"

namespace dynmig::deviceplugin {

struct ReconcileReport {
  bool listed = false;
  std::string skipped;  // why nothing was destroyed ("" = destruction was allowed)
  int destroyed = 0;    // managed instances of finished pods, and untracked ones on idle GPUs
  int busy = 0;         // reclaimable, but processes still run: retried next cycle
  int destroy_failed = 0;
  int adopted = 0;
  int untracked = 0;        // live instances kept without an owner (busy GPU)
  int unverified = 0;       // allocations of non-terminated pods that could not be verified
  int idled = 0;            // instances of ended pods kept idle (warm instances)
  int idle_destroyed = 0;   // idle instances destroyed (TTL, slices needed, cap, turned off)
  int destroy_pending = 0;  // instances whose destroy NVML refused (IN_USE), retried with backoff
};

class Reclaimer {
 public:
  // `ops` must outlive the reclaimer.
  explicit Reclaimer(NodeOps& ops) : ops_(ops) {}
  Reclaimer(const Reclaimer&) = delete;
  Reclaimer& operator=(const Reclaimer&) = delete;

  // The node state's lock, as the analysis names it for this reclaimer.
  dynmig::Mutex& mu() const ABSL_LOCK_RETURNED(ops_.ns.mu) { return ops_.ns.mu; }

  // The periodic cycle: lists the node's pods (report.listed false when they cannot be: nothing
  // is done), recovers when recovery is pending, reconciles, releases an orphaned node lock.
  ReconcileReport Reconcile() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // One reconciliation over the node's `pods` (the cycle's, and Allocate's before it serves).
  ReconcileReport Reconcile(const std::vector<PodMig>& pods)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Startup recovery over the node's `pods` (Start, or the first cycle or Allocate once the API
  // answers); clears recovery_pending.
  void Recover(const std::vector<PodMig>& pods) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);

  // Handover evidence read WITHOUT the node lock, so that the kubelet's and the runtime's answers
  // (each bounded by its deadline, the runtime's List by its budget) never hold Allocate up:
  //   if (core.WantsEvidence()) { auto e = ReadEvidenceSources(); <lock>; OfferEvidence(e, t); }
  // Reading early is safe: a legacy allocator is gone, so no container gains a legacy instance
  // after the read, and one that ended after it still counts as a holder (kept one cycle more).
  // Whether the last cycle needed evidence (instances to attribute or legacy ones to confirm) and
  // what it has is older than options.evidence_max_age.
  bool WantsEvidence() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Reads PodResources and the runtime (the device plugin's own pod left out). No lock.
  HandoverEvidence ReadEvidenceSources() const;
  // Installs evidence read at monotonic `read_at`; the next cycle uses it while fresh.
  void OfferEvidence(HandoverEvidence evidence, absl::Duration read_at)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);

 private:
  struct Candidate;
  using Candidates = std::map<std::pair<std::string, uint32_t>, Candidate>;  // (gpu, start)

  // ---- recovery (reclaimer_recovery.cc) ----
  // Completes or destroys (only when `destructive`) instances of intents left open.
  void ResolveIntents(const std::vector<PodMig>& pods, bool destructive)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // One open intent; whether it is closed.
  bool ResolveIntent(const Intent& intent, const PodMig* pod, bool destructive)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // The intent's pod still reserves exactly its instance (`entry`): the missing CI is created,
  // the runtime identity published and the instance recorded. Whether the intent is closed.
  bool CompleteIntent(const Intent& intent, const std::string& what, const PodMig& pod,
                      const protocol::MigAllocation& entry, const GpuEntry& gpu,
                      const mig::ProfileSpec& profile, uint32_t gi)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Nobody owns the intent's instance (`why`): destroyed, or tracked for reclamation while
  // processes run on it. Whether the intent is closed.
  bool ReleaseIntent(const Intent& intent, const std::string& what, const std::string& why,
                     const PodMig* pod, const GpuEntry& gpu, const mig::ProfileSpec& profile,
                     uint32_t gi) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  void CleanIdleGpus(const std::vector<PodMig>& pods) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);

  // ---- reclamation and adoption (reclaimer.cc) ----
  // Reclaims managed instance `m`, whose owner is no longer active (`ended` says how); whether
  // the state changed.
  bool ReclaimEnded(const ManagedInstance& m, const PodMig* owner, bool destructive,
                    ReconcileReport& report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // The non-terminated pods whose MIG annotations cannot be read ("ns/name: why"), each reported
  // once (event and log). Non-empty: nothing may be destroyed.
  std::vector<std::string> Unreadable(const std::vector<PodMig>& pods)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Drops the ledger entries whose pod is not among the non-terminated `pods`; true when any was.
  bool PruneLedger(const std::vector<PodMig>& pods);
  void AdoptUntracked(const std::vector<PodMig>& pods, bool destructive, ReconcileReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // The complete annotations by GPU and placement that no managed instance realizes (adoption
  // candidates); quarantines what cannot be verified; claims idle instances an annotation names.
  // Sets `changed` when the state changed.
  Candidates CollectCandidates(const std::vector<PodMig>& pods, ReconcileReport& report,
                               bool& changed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Idle instance `m` that the annotation `a` of active pod `p` names exactly becomes the pod's.
  bool ClaimIdle(ManagedInstance& m, const PodMig& p, const protocol::MigAllocation& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  void Quarantine(const PodMig& p, const protocol::MigAllocation& a, const std::string& reason,
                  ReconcileReport& report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Forgets the managed instances of `gpu` that NVML (`gis`) no longer shows; whether any was.
  bool ForgetVanished(const GpuEntry& gpu, const std::vector<nvml::GpuInstanceInfo>& gis)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Adopts the GIs of `gpu` that a candidate describes and NVML verifies; returns the GIs nobody
  // owns. Sets `changed` when the state changed.
  std::vector<nvml::GpuInstanceInfo> AdoptOnGpu(const GpuEntry& gpu,
                                                const std::vector<nvml::GpuInstanceInfo>& gis,
                                                Candidates& candidates, ReconcileReport& report,
                                                bool& changed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Untracked GIs of `gpu`: destroyed when `idle` (the whole GPU is), kept and reported
  // otherwise. Returns how many are kept.
  int KeepOrCleanUntracked(const GpuEntry& gpu, const std::vector<nvml::GpuInstanceInfo>& unowned,
                           bool idle, const std::string& why, ReconcileReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Reports the candidates of active pods whose instance is gone.
  void ReportGone(const Candidates& candidates) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Recovery and adoption's record step: `m` (built by NewInstance) is managed, counted as
  // adopted (`how`) and announced with `event`.
  void RecordAdopted(ManagedInstance m, const PodMig* pod, std::string_view how,
                     const std::string& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Removes hami.io/mutex.lock (under the node's resourceVersion) when the pod it names is gone,
  // has finished or is bound to another node: a bind that failed half-way (a crashed scheduler)
  // or a pod deleted before its Allocate leaves such a lock. A pod not bound yet keeps it (its
  // bind may be in progress).
  void ReleaseOrphanedNodeLock(const std::vector<PodMig>& pods);
  // Why the lock's pod will never reach Allocate here ("" when it may).
  std::string OrphanedBecause(const protocol::NodeLock& lock, const std::vector<PodMig>& pods);

  // ---- handover of legacy instances (reclaimer_handover.cc, handover.h) ----
  // Starts a cycle's attribution: the evidence is read again when next asked for, unless the last
  // read is younger than options.evidence_max_age.
  void BeginHandoverCycle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // This cycle's evidence (the kubelet's PodResources, the runtime), read once per cycle, or the
  // one OfferEvidence installed while it is younger than options.evidence_max_age.
  const HandoverEvidence& Evidence(const std::vector<PodMig>& pods)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // EvidenceGap of the installed evidence over this cycle's live instances (logged once).
  void ComputeGap(const std::vector<PodMig>& pods) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // The live instance of GI `gi` of `gpu` (its CIs and MIG UUIDs).
  LiveInstance Live(const GpuEntry& gpu, const nvml::GpuInstanceInfo& gi);
  // Attributes the GIs of `gpu` no pod annotation describes: held ones become managed (origin
  // "legacy"), unproven ones are kept and published; returns the free ones (the untracked rule).
  std::vector<nvml::GpuInstanceInfo> AttributeUnowned(
      const GpuEntry& gpu, const std::vector<nvml::GpuInstanceInfo>& unowned,
      const std::vector<PodMig>& pods, bool& changed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Re-attributes every managed legacy instance: held ones record their holders, unproven ones
  // are kept, ones no container holds any more are reclaimed (ReclaimEnded). Whether the state
  // changed.
  bool ReconcileLegacy(const std::vector<PodMig>& pods, bool destructive, ReconcileReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Why startup's idle-GPU cleanup must spare `gpu` ("" when nothing legacy is on it): a managed
  // legacy instance, or a live untracked one that is held or unproven.
  std::string LegacyOnGpu(const GpuEntry& gpu, const std::vector<PodMig>& pods)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Whether ended legacy instance `m` may be kept idle: its profile is allowlisted on its GPU.
  bool LegacyMayIdle(const ManagedInstance& m) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);

  // ---- destroys NVML refuses with IN_USE (reclaimer_destroy.cc) ----
  // When `st` (a failed DestroyGi of managed instance `m`) is NVML_ERROR_IN_USE: `m` becomes a
  // pending destroy (never given out again, its slices held, the state saved by the caller), its
  // next attempt scheduled with backoff, the refusal counted and, the first time, reported with
  // an event on `owner` (the node when null) naming the holder when NVML can tell. Whether it was.
  bool DeferInUse(const ManagedInstance& m, const GpuEntry& gpu, const absl::Status& st,
                  const PodMig* owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Retries the pending destroys that are due (none unless `destructive`); whether the state
  // changed.
  bool RetryPendingDestroys(bool destructive, ReconcileReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Who holds GI `gi` as far as NVML can tell: the processes on it, or that NVML names none.
  std::string HolderOf(const GpuEntry& gpu, uint32_t gi);

  // ---- warm instances (reclaimer_warm.cc) ----
  // Whether the ended instance `m` is kept idle rather than destroyed: warm instances on, its CI
  // known, its GPU under the cap.
  bool KeepIdle(const ManagedInstance& m) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Marks managed instance `m` (its pod ended, no process) idle.
  void MarkIdle(const ManagedInstance& m, const PodMig* owner, const std::string& ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Destroys idle instances past their TTL, overlapping an active pod's unrealized reservation,
  // over the cap or with warm instances off; keeps those an unrealized reservation names exactly.
  // Destroys nothing unless `destructive`.
  void SweepIdle(const std::vector<PodMig>& pods, bool destructive, ReconcileReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);

  NodeOps& ops_;
};

}  // namespace dynmig::deviceplugin
