// The Reclaimer's cycle (reclaimer.h): instances of pods that are no longer active are destroyed,
// live instances that a verified annotation describes are adopted, untracked ones are cleaned only
// on idle GPUs, an orphaned node lock is released. See plugin_core.h and docs/device-plugin.md
// (Reclamation).
#include "deviceplugin/reclaimer.h"

#include <algorithm>
#include <map>
#include <set>

#include "common/status_macros.h"
#include "deviceplugin/plugin_internal.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "protocol/annotations.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {

// A complete annotation (with its runtime identity) that no managed instance realizes yet.
struct Reclaimer::Candidate {
  const PodMig* pod;
  protocol::MigAllocation allocation;
};

ReconcileReport Reclaimer::Reconcile() {
  ReconcileReport report;
  auto pods = ops_.ListPods();
  if (!pods.ok()) {
    report.skipped = std::string(pods.status().message());
    if (ops_.FirstReport("list-failed")) {
      spdlog::warn("reconcile skipped, nothing destroyed: {}", report.skipped);
    }
    return report;
  }
  ops_.ForgetReport("list-failed");
  if (ops_.ns.recovery_pending) Recover(*pods);
  report = Reconcile(*pods);
  ReleaseOrphanedNodeLock(*pods);
  ops_.UpdateGauges();
  return report;
}

std::string Reclaimer::OrphanedBecause(const protocol::NodeLock& lock,
                                       const std::vector<PodMig>& pods) {
  const auto here = std::find_if(
      pods.begin(), pods.end(), [&](const PodMig& p) { return lock.OwnedBy(p.ns, p.name, p.uid); });
  if (here != pods.end()) return here->terminated ? "has finished" : "";
  auto pod = ops_.kube.GetPod(lock.ns, lock.pod);
  if (pod.ok() && !lock.uid.empty() && kube::Uid(*pod) != lock.uid) {
    // Deleted; a pod recreated under its name is another pod, which never holds this lock.
    return fmt::format("no longer exists (pod {}/{} now has uid {})", lock.ns, lock.pod,
                       kube::Uid(*pod));
  }
  if (pod.ok()) {
    const std::string bound = kube::NodeName(*pod);
    if (kube::IsTerminated(*pod)) return "has finished";
    if (!bound.empty() && bound != ops_.options.node_name) {
      return fmt::format("is bound to node {}", bound);
    }
    return "";
  }
  if (pod.status().code() == absl::StatusCode::kNotFound) return "no longer exists";
  return "";
}

void Reclaimer::ReleaseOrphanedNodeLock(const std::vector<PodMig>& pods) {
  auto node = ops_.kube.GetNode(ops_.options.node_name);
  if (!node.ok()) return;
  const auto value = kube::Annotation(*node, protocol::kNodeLockAnnotation);
  const auto lock = NodeLockOf(*node);
  if (!lock.has_value() || lock->pod.empty()) return;  // names no pod: left to its expiry
  const std::string why = OrphanedBecause(*lock, pods);
  if (why.empty()) return;
  kube::KeyPatch patch;
  patch[std::string(protocol::kNodeLockAnnotation)] = std::nullopt;
  auto st =
      ops_.kube.PatchNodeAnnotations(ops_.options.node_name, patch, kube::ResourceVersion(*node));
  if (st.ok()) {
    spdlog::info("released the node lock {} of node {}: pod {} {}", value.value_or(""),
                 ops_.options.node_name, lock->Owner(), why);
  }
}

std::vector<std::string> Reclaimer::Unreadable(const std::vector<PodMig>& pods) {
  std::vector<std::string> unreadable;
  for (const auto& p : pods) {
    if (p.terminated || p.unreadable.empty()) continue;
    unreadable.push_back(fmt::format("{}: {}", p.key, p.unreadable));
    if (ops_.FirstReport("unreadable/" + p.uid + "/" + p.unreadable)) {
      ops_.metrics.AdoptionFailed();
      ops_.Event(
          &p, "Warning", kReasonReconcileSkipped,
          fmt::format("the MIG annotations of pod {} cannot be read ({}): no MIG instance on "
                      "node {} is destroyed until they can",
                      p.key, p.unreadable, ops_.options.node_name));
    }
  }
  return unreadable;
}

ReconcileReport Reclaimer::Reconcile(const std::vector<PodMig>& pods) {
  ReconcileReport report;
  report.listed = true;
  BeginHandoverCycle();
  const std::vector<std::string> unreadable = Unreadable(pods);
  const bool destructive = unreadable.empty();
  if (!destructive) {
    report.skipped = fmt::format("unreadable MIG annotations: {}", fmt::join(unreadable, "; "));
  }

  // Intents left open by a crash or a failed rollback (none is in flight: we hold ops_.ns.mu).
  if (!ops_.ns.state.intents.empty()) ResolveIntents(pods, destructive);

  std::map<std::string, const PodMig*> by_uid;
  for (const auto& p : pods) by_uid[p.uid] = &p;
  bool changed = PruneLedger(pods);  // entries of ended pods
  const std::vector<ManagedInstance> managed = ops_.ns.state.instances;
  ops_.ns.ended_held.clear();
  // Destroys NVML refused with IN_USE, due for a retry.
  if (RetryPendingDestroys(destructive, report)) changed = true;
  for (const auto& m : managed) {
    if (m.destroy_pending()) continue;        // RetryPendingDestroys
    if (m.idle) continue;                     // no pod owns it: SweepIdle decides
    if (m.origin == kOriginLegacy) continue;  // its holders decide: ReconcileLegacy
    auto it = by_uid.find(m.owner.pod_uid);
    const PodMig* owner = it == by_uid.end() ? nullptr : it->second;
    if (owner != nullptr && owner->active) continue;
    if (ReclaimEnded(m, owner, destructive, report)) changed = true;
  }
  if (ReconcileLegacy(pods, destructive, report)) changed = true;
  if (changed) ops_.PersistOrLog("reconcile");
  // Idle (warm) instances: TTL, slices needed by a reservation, cap, warm instances turned off.
  SweepIdle(pods, destructive, report);
  // Then adopt what verified annotations describe, and clean untracked instances of GPUs that
  // became idle (after the sweep, so a GPU freed in this cycle is cleaned in this cycle).
  AdoptUntracked(pods, destructive, report);
  ops_.metrics.SetBusy(report.busy);
  return report;
}

bool Reclaimer::ReclaimEnded(const ManagedInstance& m, const PodMig* owner, bool destructive,
                             ReconcileReport& report) {
  const std::string ended = owner == nullptr    ? "deleted"
                            : owner->terminated ? "finished"
                                                : "deleting";
  auto hold = [&](const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu) {
    ops_.ns.ended_held.push_back({m.gpu_uuid, m.placement, m.profile,
                                  fmt::format("{} of pod {} ({}), not reclaimed yet: {}",
                                              m.mig_uuid, m.owner.PodKey(), ended, why)});
  };
  if (!destructive) {
    hold("reclamation is paused while a pod's MIG annotation cannot be read");
    return false;
  }
  const GpuEntry* gpu = ops_.ns.inventory.FindByUuid(m.gpu_uuid);
  if (gpu == nullptr) return false;
  const std::string busy_key = fmt::format("busy/{}/{}", m.gpu_uuid, m.gpu_instance_id);
  std::string why;
  if (ops_.GiBusy(*gpu, m.gpu_instance_id, &why)) {
    hold(why);
    ++report.busy;
    if (ops_.FirstReport(busy_key)) {
      ops_.Event(owner, "Normal", kReasonReclaimDeferred,
                 fmt::format("MIG device {} (GI {} on GPU {}) of pod {} is not reclaimed yet: {}; "
                             "retried every cycle",
                             m.mig_uuid, m.gpu_instance_id, m.gpu_uuid, m.owner.PodKey(), why));
    }
    return false;
  }
  if (KeepIdle(m)) {
    MarkIdle(m, owner, ended);
    ops_.ForgetReport(busy_key);
    ++report.idled;
    return true;
  }
  auto st = ops_.DestroyGi(*gpu, m.gpu_instance_id);
  if (!st.ok() && DeferInUse(m, *gpu, st, owner)) {
    ++report.destroy_pending;
    ops_.ForgetReport(busy_key);
    return true;  // pending destroy: held through the node state from now on
  }
  if (!st.ok()) {
    hold("destroying it failed: " + std::string(st.message()));
    ++report.destroy_failed;
    ops_.metrics.DestroyFailed();
    spdlog::warn("reclaim of {} (pod {}) failed, retried next cycle: {}", m.mig_uuid,
                 m.owner.PodKey(), std::string(st.message()));
    return false;
  }
  ops_.ns.RemoveManaged(m.gpu_uuid, m.gpu_instance_id);
  ops_.ForgetReport(busy_key);
  if (ops_.cdi.enabled()) {
    if (auto rm = ops_.cdi.Remove(m.mig_uuid); !rm.ok())
      spdlog::warn("{}", std::string(rm.message()));
  }
  ++report.destroyed;
  ops_.metrics.InstanceDestroyed("reclaimed");
  ops_.Event(owner, "Normal", kReasonDestroyed,
             fmt::format("destroyed MIG device {} ({} at {} of GPU {}, GI {}) of pod {} ({})",
                         m.mig_uuid, m.profile, PlacementText(m.placement), m.gpu_uuid,
                         m.gpu_instance_id, m.owner.PodKey(), ended));
  return true;
}

bool Reclaimer::PruneLedger(const std::vector<PodMig>& pods) {
  std::set<std::string> live;
  for (const auto& p : pods) {
    if (!p.terminated) live.insert(p.uid);
  }
  return ops_.ledger.Prune(live);
}

void Reclaimer::Quarantine(const PodMig& p, const protocol::MigAllocation& a,
                           const std::string& reason, ReconcileReport& report) {
  ops_.ns.quarantine.push_back({a.gpu_uuid, a.placement, p.key, reason});
  ++report.unverified;
  if (ops_.FirstReport(fmt::format("unverified/{}/{}/{}/{}", p.uid, a.container_index,
                                   a.device_index, reason))) {
    ops_.metrics.AdoptionFailed();
    ops_.Event(
        &p, "Warning", kReasonAdoptionFailed,
        fmt::format("container {} device {} ({} at {} of GPU {}) cannot be verified: {}; its "
                    "slices are kept out of use and never destroyed while the pod runs",
                    a.container_index, a.device_index, a.profile, PlacementText(a.placement),
                    a.gpu_uuid, reason));
  }
}

void Reclaimer::RecordAdopted(ManagedInstance m, const PodMig* pod, std::string_view how,
                              const std::string& event) {
  ops_.ns.Manage(std::move(m));
  ops_.metrics.InstanceAdopted(how);
  ops_.Event(pod, "Normal", kReasonAdopted, event);
}

bool Reclaimer::ClaimIdle(ManagedInstance& m, const PodMig& p, const protocol::MigAllocation& a) {
  if (!m.idle || !p.active || m.owner.pod_uid == p.uid || m.profile != a.profile ||
      m.gpu_instance_id != a.runtime->gpu_instance_id ||
      m.compute_instance_id != a.runtime->compute_instance_id ||
      m.mig_uuid != a.runtime->mig_uuid) {
    return false;
  }
  // An idle instance this pod's annotation already names (an Allocate that reused it was
  // interrupted after writing the annotation): it is the pod's.
  m.idle = false;
  m.idle_since = 0;
  m.owner = {p.uid, p.ns, p.name, a.container_index, a.device_index};
  m.origin = "reused";
  m.since = ops_.NowUnix();
  ops_.metrics.InstanceAdopted("idle");
  ops_.Event(
      &p, "Normal", kReasonAdopted,
      fmt::format("adopted idle MIG device {} ({} at {} of GPU {}) for container {} device {}: "
                  "the pod's annotation names it",
                  m.mig_uuid, m.profile, PlacementText(m.placement), m.gpu_uuid, a.container_index,
                  a.device_index));
  return true;
}

Reclaimer::Candidates Reclaimer::CollectCandidates(const std::vector<PodMig>& pods,
                                                   ReconcileReport& report, bool& changed) {
  Candidates candidates;
  for (const auto& p : pods) {
    if (!p.allocations.ok()) continue;
    for (const auto& a : *p.allocations) {
      if (!a.runtime.has_value()) {
        if (!p.terminated && p.ContainerAllocated(a.container_index)) {
          Quarantine(p, a,
                     "its container was allocated but the annotation has no runtime identity "
                     "(migUUID, gpuInstanceID, computeInstanceID)",
                     report);
        }
        continue;
      }
      ManagedInstance* m = ops_.ns.FindManaged(a.gpu_uuid, a.placement);
      if (m != nullptr && ClaimIdle(*m, p, a)) {
        changed = true;
        ++report.adopted;
        continue;
      }
      if (m != nullptr) {
        const bool same = m->owner.pod_uid == p.uid && m->profile == a.profile &&
                          m->gpu_instance_id == a.runtime->gpu_instance_id &&
                          m->compute_instance_id == a.runtime->compute_instance_id &&
                          m->mig_uuid == a.runtime->mig_uuid;
        if (!same && !p.terminated) {
          Quarantine(p, a,
                     fmt::format("the instance there is managed for pod {} ({})", m->owner.PodKey(),
                                 m->mig_uuid),
                     report);
        }
        continue;
      }
      const GpuEntry* gpu = ops_.ns.inventory.FindByUuid(a.gpu_uuid);
      if ((gpu == nullptr || !gpu->exposed) && !p.terminated) {
        Quarantine(p, a, "the GPU is not exposed on this node", report);
        continue;
      }
      candidates[{a.gpu_uuid, a.placement.start}] = {&p, a};
    }
  }
  return candidates;
}

bool Reclaimer::ForgetVanished(const GpuEntry& gpu, const std::vector<nvml::GpuInstanceInfo>& gis) {
  // Managed instances NVML no longer shows (GPU reset, destroyed behind our back) are forgotten.
  return std::erase_if(ops_.ns.state.instances, [&](const ManagedInstance& m) {
           if (m.gpu_uuid != gpu.info.uuid) return false;
           for (const auto& gi : gis) {
             if (gi.id == m.gpu_instance_id && gi.placement == m.placement &&
                 (!m.idle || gi.profile_id == m.profile_id)) {
               return false;
             }
           }
           spdlog::warn(
               "managed MIG device {} (GI {} on GPU {}, pod {}) no longer exists: forgotten",
               m.mig_uuid, m.gpu_instance_id, m.gpu_uuid, m.owner.PodKey());
           return true;
         }) > 0;
}

std::vector<nvml::GpuInstanceInfo> Reclaimer::AdoptOnGpu(
    const GpuEntry& gpu, const std::vector<nvml::GpuInstanceInfo>& gis, Candidates& candidates,
    ReconcileReport& report, bool& changed) {
  std::vector<nvml::GpuInstanceInfo> unowned;
  for (const auto& gi : gis) {
    if (const ManagedInstance* m = ops_.ns.FindManagedGi(gpu.info.uuid, gi.id);
        m != nullptr && m->placement == gi.placement) {
      continue;
    }
    bool intended = false;
    for (const auto& i : ops_.ns.state.intents) {
      intended = intended || (i.gpu_uuid == gpu.info.uuid && i.placement == gi.placement);
    }
    if (intended) continue;  // an open intent owns it until resolved
    auto c = candidates.find({gpu.info.uuid, gi.placement.start});
    if (c == candidates.end() || c->second.allocation.placement != gi.placement) {
      unowned.push_back(gi);
      continue;
    }
    const PodMig& p = *c->second.pod;
    const protocol::MigAllocation& a = c->second.allocation;
    // Validate (against NVML), record, publish (the CDI spec): the steps of Allocate.
    if (auto verified = ops_.Verify(gpu, gi, a); !verified.ok()) {
      if (!p.terminated) Quarantine(p, a, std::string(verified.message()), report);
      unowned.push_back(gi);
      continue;
    }
    ManagedInstance m =
        ops_.NewInstance({p.uid, p.ns, p.name, a.container_index, a.device_index}, gpu.info.uuid,
                         a.profile, gi.profile_id, gi.placement, gi.id,
                         a.runtime->compute_instance_id, a.runtime->mig_uuid, "adopted");
    const std::string event = fmt::format(
        "adopted MIG device {} ({} at {} of GPU {}, GI {}, CI {}) for container {} "
        "device {}: verified against NVML",
        m.mig_uuid, m.profile, PlacementText(m.placement), m.gpu_uuid, m.gpu_instance_id,
        m.compute_instance_id, a.container_index, a.device_index);
    const std::string mig_uuid = m.mig_uuid;
    RecordAdopted(std::move(m), &p, "annotation", event);
    changed = true;
    ++report.adopted;
    if (ops_.cdi.enabled()) {
      if (auto nodes = ops_.DeviceNodes(gpu, gi.id, a.runtime->compute_instance_id); nodes.ok()) {
        (void)ops_.cdi.Write(mig_uuid, *nodes);
      }
    }
    candidates.erase(c);
  }
  return unowned;
}

int Reclaimer::KeepOrCleanUntracked(const GpuEntry& gpu,
                                    const std::vector<nvml::GpuInstanceInfo>& unowned, bool idle,
                                    const std::string& why, ReconcileReport& report) {
  int kept = 0;
  for (const auto& gi : unowned) {
    const mig::ProfileSpec* profile = gpu.FindById(gi.profile_id);
    const std::string name =
        profile != nullptr ? profile->name : fmt::format("profile id {}", gi.profile_id);
    if (idle) {
      auto st = ops_.DestroyGi(gpu, gi.id);
      if (st.ok()) {
        ++report.destroyed;
        ops_.metrics.InstanceDestroyed("idle_cleanup");
        ops_.Event(nullptr, "Normal", kReasonGpuCleaned,
                   fmt::format("destroyed untracked GI {} ({} at {}) on idle GPU {}: no pod "
                               "references the GPU and no process runs on it",
                               gi.id, name, PlacementText(gi.placement), gpu.info.uuid));
        continue;
      }
      ops_.metrics.DestroyFailed();
      spdlog::warn("cannot clean untracked GI {} on GPU {}: {}", gi.id, gpu.info.uuid,
                   std::string(st.message()));
    }
    ++kept;
    ops_.ns.untracked_held.push_back(
        {gpu.info.uuid, gi.placement, profile != nullptr ? profile->name : "",
         fmt::format("untracked GI {} ({}): no pod annotation describes it; kept while the GPU "
                     "is busy{}",
                     gi.id, name, why.empty() ? "" : " (" + why + ")")});
    if (ops_.FirstReport(
            fmt::format("untracked/{}/{}/{}", gpu.info.uuid, gi.id, gi.placement.start))) {
      ops_.Event(nullptr, "Warning", kReasonUntracked,
                 fmt::format("GI {} ({} at {}) on GPU {} is not managed by dynmig and no pod "
                             "annotation describes it; kept (the GPU is busy{}), its slices stay "
                             "unusable until the GPU is idle",
                             gi.id, name, PlacementText(gi.placement), gpu.info.uuid,
                             why.empty() ? "" : ": " + why));
    }
  }
  return kept;
}

void Reclaimer::ReportGone(const Candidates& candidates) {
  // Only for active pods: the instance of a pod that is finished or being deleted is gone because
  // it was reclaimed (maybe by this very cycle, e.g. just after a restart adopted it), not lost.
  for (const auto& [key, c] : candidates) {
    if (!c.pod->active) continue;
    const GpuEntry* gpu = ops_.ns.inventory.FindByUuid(c.allocation.gpu_uuid);
    if (gpu == nullptr || !gpu->info.mig.current) continue;
    bool live = false;
    for (const auto& q : ops_.ns.quarantine) {
      live = live || (q.gpu_uuid == c.allocation.gpu_uuid &&
                      q.placement == c.allocation.placement && q.pod == c.pod->key);
    }
    if (live) continue;
    if (ops_.FirstReport(fmt::format("gone/{}/{}/{}", c.pod->uid, c.allocation.container_index,
                                     c.allocation.device_index))) {
      ops_.metrics.AdoptionFailed();
      ops_.Event(c.pod, "Warning", kReasonAdoptionFailed,
                 fmt::format("container {} device {}: MIG device {} ({} at {} of GPU {}) no longer "
                             "exists",
                             c.allocation.container_index, c.allocation.device_index,
                             c.allocation.runtime->mig_uuid, c.allocation.profile,
                             PlacementText(c.allocation.placement), c.allocation.gpu_uuid));
    }
  }
}

void Reclaimer::AdoptUntracked(const std::vector<PodMig>& pods, bool destructive,
                               ReconcileReport& report) {
  ops_.ns.quarantine.clear();
  ops_.ns.untracked_held.clear();
  bool changed = false;
  Candidates candidates = CollectCandidates(pods, report, changed);
  std::set<std::string> referenced;  // GPUs non-terminated pods name
  bool all_busy = false;
  for (const auto& p : pods) {
    if (p.terminated) continue;
    if (p.gpus_unknown) all_busy = true;
    for (const auto& g : p.referenced_gpus) referenced.insert(g);
  }
  int untracked = 0;
  for (const auto& gpu : ops_.ns.inventory.gpus) {
    if (!gpu.exposed || !gpu.info.mig.current) continue;
    auto gis = ops_.nvml.ListGpuInstances(gpu.info.index);
    if (!gis.ok()) {
      spdlog::warn("cannot list the GIs of GPU {}: {}", gpu.info.uuid,
                   std::string(gis.status().message()));
      continue;
    }
    if (ForgetVanished(gpu, *gis)) changed = true;
    // What no annotation describes is attributed first: held and unproven instances are kept.
    const std::vector<nvml::GpuInstanceInfo> unowned =
        AttributeUnowned(gpu, AdoptOnGpu(gpu, *gis, candidates, report, changed), pods, changed);
    if (unowned.empty()) continue;
    // Untracked instances: cleaned only when the whole GPU is idle, otherwise kept and reported.
    std::string why;
    bool idle = destructive && !all_busy && !referenced.count(gpu.info.uuid);
    if (idle) {
      for (const auto& m : ops_.ns.state.instances)
        idle = idle && (m.idle || m.gpu_uuid != gpu.info.uuid);
      for (const auto& i : ops_.ns.state.intents) idle = idle && i.gpu_uuid != gpu.info.uuid;
      for (const auto& q : ops_.ns.quarantine) idle = idle && q.gpu_uuid != gpu.info.uuid;
    }
    if (idle && ops_.GpuHasProcesses(gpu, &why)) idle = false;
    untracked += KeepOrCleanUntracked(gpu, unowned, idle, why, report);
  }
  // Complete annotations whose instance is gone (GPU reset, someone destroyed it).
  ReportGone(candidates);
  report.untracked = untracked;
  ops_.metrics.SetUntracked(untracked);
  ops_.metrics.SetUnverified(report.unverified);
  if (changed) ops_.PersistOrLog("adoption");
}

}  // namespace dynmig::deviceplugin
