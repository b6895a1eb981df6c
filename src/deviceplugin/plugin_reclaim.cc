// Reclamation: instances of pods that are no longer active are destroyed, live instances that a
// verified annotation describes are adopted, untracked ones are cleaned only on idle GPUs. See
// plugin_core.h and docs/device-plugin.md (Reclamation).
#include <algorithm>
#include <map>
#include <set>

#include "common/status_macros.h"
#include "deviceplugin/plugin_core.h"
#include "deviceplugin/plugin_internal.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "protocol/annotations.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {

// A complete annotation (with its runtime identity) that no managed instance realizes yet.
struct PluginCore::Candidate {
  const PodMig* pod;
  protocol::MigAllocation allocation;
};

ReconcileReport PluginCore::Reconcile() {
  const absl::Duration start = options_.clock->Monotonic();
  auto seconds = [&] { return absl::ToDoubleSeconds(options_.clock->Monotonic() - start); };
  dynmig::MutexLock lock(&ns_.mu);
  ReconcileReport report;
  auto pods = ListPods();
  if (!pods.ok()) {
    report.skipped = std::string(pods.status().message());
    if (FirstReport("list-failed")) {
      spdlog::warn("reconcile skipped, nothing destroyed: {}", report.skipped);
    }
    metrics_.ReconcileDone("skipped_list", seconds());
    return report;
  }
  reported_.erase("list-failed");
  if (ns_.recovery_pending) RecoverLocked(*pods);
  report = ReconcileLocked(*pods);
  ReleaseOrphanedNodeLock(*pods);
  UpdateGauges();
  metrics_.ReconcileDone(report.skipped.empty() ? "ok" : "skipped_decode", seconds());
  return report;
}

std::string PluginCore::OrphanedBecause(const protocol::NodeLock& lock,
                                        const std::vector<PodMig>& pods) {
  const auto here = std::find_if(
      pods.begin(), pods.end(), [&](const PodMig& p) { return lock.OwnedBy(p.ns, p.name, p.uid); });
  if (here != pods.end()) return here->terminated ? "has finished" : "";
  auto pod = kube_.GetPod(lock.ns, lock.pod);
  if (pod.ok() && !lock.uid.empty() && kube::Uid(*pod) != lock.uid) {
    // Deleted; a pod recreated under its name is another pod, which never holds this lock.
    return fmt::format("no longer exists (pod {}/{} now has uid {})", lock.ns, lock.pod,
                       kube::Uid(*pod));
  }
  if (pod.ok()) {
    const std::string bound = kube::NodeName(*pod);
    if (kube::IsTerminated(*pod)) return "has finished";
    if (!bound.empty() && bound != options_.node_name) {
      return fmt::format("is bound to node {}", bound);
    }
    return "";
  }
  if (pod.status().code() == absl::StatusCode::kNotFound) return "no longer exists";
  return "";
}

void PluginCore::ReleaseOrphanedNodeLock(const std::vector<PodMig>& pods) {
  auto node = kube_.GetNode(options_.node_name);
  if (!node.ok()) return;
  const auto value = kube::Annotation(*node, protocol::kNodeLockAnnotation);
  const auto lock = NodeLockOf(*node);
  if (!lock.has_value() || lock->pod.empty()) return;  // names no pod: left to its expiry
  const std::string why = OrphanedBecause(*lock, pods);
  if (why.empty()) return;
  kube::KeyPatch patch;
  patch[std::string(protocol::kNodeLockAnnotation)] = std::nullopt;
  auto st = kube_.PatchNodeAnnotations(options_.node_name, patch, kube::ResourceVersion(*node));
  if (st.ok()) {
    spdlog::info("released the node lock {} of node {}: pod {} {}", value.value_or(""),
                 options_.node_name, lock->Owner(), why);
  }
}

std::vector<std::string> PluginCore::Unreadable(const std::vector<PodMig>& pods) {
  std::vector<std::string> unreadable;
  for (const auto& p : pods) {
    if (p.terminated || p.unreadable.empty()) continue;
    unreadable.push_back(fmt::format("{}: {}", p.key, p.unreadable));
    if (FirstReport("unreadable/" + p.uid + "/" + p.unreadable)) {
      metrics_.AdoptionFailed();
      Event(&p, "Warning", kReasonReconcileSkipped,
            fmt::format("the MIG annotations of pod {} cannot be read ({}): no MIG instance on "
                        "node {} is destroyed until they can",
                        p.key, p.unreadable, options_.node_name));
    }
  }
  return unreadable;
}

ReconcileReport PluginCore::ReconcileLocked(const std::vector<PodMig>& pods) {
  ReconcileReport report;
  report.listed = true;
  BeginHandoverCycle();
  const std::vector<std::string> unreadable = Unreadable(pods);
  const bool destructive = unreadable.empty();
  if (!destructive) {
    report.skipped = fmt::format("unreadable MIG annotations: {}", fmt::join(unreadable, "; "));
  }

  // Intents left open by a crash or a failed rollback (none is in flight: we hold ns_.mu).
  if (!ns_.state.intents.empty()) ResolveIntents(pods, destructive);

  std::map<std::string, const PodMig*> by_uid;
  for (const auto& p : pods) by_uid[p.uid] = &p;
  bool changed = PruneLedger(pods);  // entries of ended pods
  const std::vector<ManagedInstance> managed = ns_.state.instances;
  ns_.ended_held.clear();
  for (const auto& m : managed) {
    if (m.idle) continue;                     // no pod owns it: SweepIdle decides
    if (m.origin == kOriginLegacy) continue;  // its holders decide: ReconcileLegacy
    auto it = by_uid.find(m.owner.pod_uid);
    const PodMig* owner = it == by_uid.end() ? nullptr : it->second;
    if (owner != nullptr && owner->active) continue;
    if (ReclaimEnded(m, owner, destructive, report)) changed = true;
  }
  if (ReconcileLegacy(pods, destructive, report)) changed = true;
  if (changed) PersistOrLog("reconcile");
  // Idle (warm) instances: TTL, slices needed by a reservation, cap, warm instances turned off.
  SweepIdle(pods, destructive, report);
  // Then adopt what verified annotations describe, and clean untracked instances of GPUs that
  // became idle (after the sweep, so a GPU freed in this cycle is cleaned in this cycle).
  AdoptUntracked(pods, destructive, report);
  metrics_.SetBusy(report.busy);
  return report;
}

bool PluginCore::ReclaimEnded(const ManagedInstance& m, const PodMig* owner, bool destructive,
                              ReconcileReport& report) {
  const std::string ended = owner == nullptr    ? "deleted"
                            : owner->terminated ? "finished"
                                                : "deleting";
  auto hold = [&](const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_.mu) {
    ns_.ended_held.push_back({m.gpu_uuid, m.placement, m.profile,
                              fmt::format("{} of pod {} ({}), not reclaimed yet: {}", m.mig_uuid,
                                          m.owner.PodKey(), ended, why)});
  };
  if (!destructive) {
    hold("reclamation is paused while a pod's MIG annotation cannot be read");
    return false;
  }
  const GpuEntry* gpu = ns_.inventory.FindByUuid(m.gpu_uuid);
  if (gpu == nullptr) return false;
  const std::string busy_key = fmt::format("busy/{}/{}", m.gpu_uuid, m.gpu_instance_id);
  std::string why;
  if (GiBusy(*gpu, m.gpu_instance_id, &why)) {
    hold(why);
    ++report.busy;
    if (FirstReport(busy_key)) {
      Event(owner, "Normal", kReasonReclaimDeferred,
            fmt::format("MIG device {} (GI {} on GPU {}) of pod {} is not reclaimed yet: {}; "
                        "retried every cycle",
                        m.mig_uuid, m.gpu_instance_id, m.gpu_uuid, m.owner.PodKey(), why));
    }
    return false;
  }
  if (KeepIdle(m)) {
    MarkIdle(m, owner, ended);
    reported_.erase(busy_key);
    ++report.idled;
    return true;
  }
  auto st = DestroyGi(*gpu, m.gpu_instance_id);
  if (!st.ok()) {
    hold("destroying it failed: " + std::string(st.message()));
    ++report.destroy_failed;
    metrics_.DestroyFailed();
    spdlog::warn("reclaim of {} (pod {}) failed, retried next cycle: {}", m.mig_uuid,
                 m.owner.PodKey(), std::string(st.message()));
    return false;
  }
  ns_.RemoveManaged(m.gpu_uuid, m.gpu_instance_id);
  reported_.erase(busy_key);
  if (cdi_.enabled()) {
    if (auto rm = cdi_.Remove(m.mig_uuid); !rm.ok()) spdlog::warn("{}", std::string(rm.message()));
  }
  ++report.destroyed;
  metrics_.InstanceDestroyed("reclaimed");
  Event(owner, "Normal", kReasonDestroyed,
        fmt::format("destroyed MIG device {} ({} at {} of GPU {}, GI {}) of pod {} ({})",
                    m.mig_uuid, m.profile, PlacementText(m.placement), m.gpu_uuid,
                    m.gpu_instance_id, m.owner.PodKey(), ended));
  return true;
}

void PluginCore::Quarantine(const PodMig& p, const protocol::MigAllocation& a,
                            const std::string& reason, ReconcileReport& report) {
  ns_.quarantine.push_back({a.gpu_uuid, a.placement, p.key, reason});
  ++report.unverified;
  if (FirstReport(fmt::format("unverified/{}/{}/{}/{}", p.uid, a.container_index, a.device_index,
                              reason))) {
    metrics_.AdoptionFailed();
    Event(&p, "Warning", kReasonAdoptionFailed,
          fmt::format("container {} device {} ({} at {} of GPU {}) cannot be verified: {}; its "
                      "slices are kept out of use and never destroyed while the pod runs",
                      a.container_index, a.device_index, a.profile, PlacementText(a.placement),
                      a.gpu_uuid, reason));
  }
}

void PluginCore::RecordAdopted(ManagedInstance m, const PodMig* pod, std::string_view how,
                               const std::string& event) {
  ns_.Manage(std::move(m));
  metrics_.InstanceAdopted(how);
  Event(pod, "Normal", kReasonAdopted, event);
}

bool PluginCore::ClaimIdle(ManagedInstance& m, const PodMig& p, const protocol::MigAllocation& a) {
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
  m.since = NowUnix();
  metrics_.InstanceAdopted("idle");
  Event(&p, "Normal", kReasonAdopted,
        fmt::format("adopted idle MIG device {} ({} at {} of GPU {}) for container {} device {}: "
                    "the pod's annotation names it",
                    m.mig_uuid, m.profile, PlacementText(m.placement), m.gpu_uuid,
                    a.container_index, a.device_index));
  return true;
}

PluginCore::Candidates PluginCore::CollectCandidates(const std::vector<PodMig>& pods,
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
      ManagedInstance* m = ns_.FindManaged(a.gpu_uuid, a.placement);
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
      const GpuEntry* gpu = ns_.inventory.FindByUuid(a.gpu_uuid);
      if ((gpu == nullptr || !gpu->exposed) && !p.terminated) {
        Quarantine(p, a, "the GPU is not exposed on this node", report);
        continue;
      }
      candidates[{a.gpu_uuid, a.placement.start}] = {&p, a};
    }
  }
  return candidates;
}

bool PluginCore::ForgetVanished(const GpuEntry& gpu,
                                const std::vector<nvml::GpuInstanceInfo>& gis) {
  // Managed instances NVML no longer shows (GPU reset, destroyed behind our back) are forgotten.
  return std::erase_if(ns_.state.instances, [&](const ManagedInstance& m) {
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

std::vector<nvml::GpuInstanceInfo> PluginCore::AdoptOnGpu(
    const GpuEntry& gpu, const std::vector<nvml::GpuInstanceInfo>& gis, Candidates& candidates,
    ReconcileReport& report, bool& changed) {
  std::vector<nvml::GpuInstanceInfo> unowned;
  for (const auto& gi : gis) {
    if (const ManagedInstance* m = ns_.FindManagedGi(gpu.info.uuid, gi.id);
        m != nullptr && m->placement == gi.placement) {
      continue;
    }
    bool intended = false;
    for (const auto& i : ns_.state.intents) {
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
    if (auto verified = Verify(gpu, gi, a); !verified.ok()) {
      if (!p.terminated) Quarantine(p, a, std::string(verified.message()), report);
      unowned.push_back(gi);
      continue;
    }
    ManagedInstance m = NewInstance({p.uid, p.ns, p.name, a.container_index, a.device_index},
                                    gpu.info.uuid, a.profile, gi.profile_id, gi.placement, gi.id,
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
    if (cdi_.enabled()) {
      if (auto nodes = DeviceNodes(gpu, gi.id, a.runtime->compute_instance_id); nodes.ok()) {
        (void)cdi_.Write(mig_uuid, *nodes);
      }
    }
    candidates.erase(c);
  }
  return unowned;
}

int PluginCore::KeepOrCleanUntracked(const GpuEntry& gpu,
                                     const std::vector<nvml::GpuInstanceInfo>& unowned, bool idle,
                                     const std::string& why, ReconcileReport& report) {
  int kept = 0;
  for (const auto& gi : unowned) {
    const mig::ProfileSpec* profile = gpu.FindById(gi.profile_id);
    const std::string name =
        profile != nullptr ? profile->name : fmt::format("profile id {}", gi.profile_id);
    if (idle) {
      auto st = DestroyGi(gpu, gi.id);
      if (st.ok()) {
        ++report.destroyed;
        metrics_.InstanceDestroyed("idle_cleanup");
        Event(nullptr, "Normal", kReasonGpuCleaned,
              fmt::format("destroyed untracked GI {} ({} at {}) on idle GPU {}: no pod "
                          "references the GPU and no process runs on it",
                          gi.id, name, PlacementText(gi.placement), gpu.info.uuid));
        continue;
      }
      metrics_.DestroyFailed();
      spdlog::warn("cannot clean untracked GI {} on GPU {}: {}", gi.id, gpu.info.uuid,
                   std::string(st.message()));
    }
    ++kept;
    ns_.untracked_held.push_back(
        {gpu.info.uuid, gi.placement, profile != nullptr ? profile->name : "",
         fmt::format("untracked GI {} ({}): no pod annotation describes it; kept while the GPU "
                     "is busy{}",
                     gi.id, name, why.empty() ? "" : " (" + why + ")")});
    if (FirstReport(fmt::format("untracked/{}/{}/{}", gpu.info.uuid, gi.id, gi.placement.start))) {
      Event(nullptr, "Warning", kReasonUntracked,
            fmt::format("GI {} ({} at {}) on GPU {} is not managed by dynmig and no pod "
                        "annotation describes it; kept (the GPU is busy{}), its slices stay "
                        "unusable until the GPU is idle",
                        gi.id, name, PlacementText(gi.placement), gpu.info.uuid,
                        why.empty() ? "" : ": " + why));
    }
  }
  return kept;
}

void PluginCore::ReportGone(const Candidates& candidates) {
  // Only for active pods: the instance of a pod that is finished or being deleted is gone because
  // it was reclaimed (maybe by this very cycle, e.g. just after a restart adopted it), not lost.
  for (const auto& [key, c] : candidates) {
    if (!c.pod->active) continue;
    const GpuEntry* gpu = ns_.inventory.FindByUuid(c.allocation.gpu_uuid);
    if (gpu == nullptr || !gpu->info.mig.current) continue;
    bool live = false;
    for (const auto& q : ns_.quarantine) {
      live = live || (q.gpu_uuid == c.allocation.gpu_uuid &&
                      q.placement == c.allocation.placement && q.pod == c.pod->key);
    }
    if (live) continue;
    if (FirstReport(fmt::format("gone/{}/{}/{}", c.pod->uid, c.allocation.container_index,
                                c.allocation.device_index))) {
      metrics_.AdoptionFailed();
      Event(c.pod, "Warning", kReasonAdoptionFailed,
            fmt::format("container {} device {}: MIG device {} ({} at {} of GPU {}) no longer "
                        "exists",
                        c.allocation.container_index, c.allocation.device_index,
                        c.allocation.runtime->mig_uuid, c.allocation.profile,
                        PlacementText(c.allocation.placement), c.allocation.gpu_uuid));
    }
  }
}

void PluginCore::AdoptUntracked(const std::vector<PodMig>& pods, bool destructive,
                                ReconcileReport& report) {
  ns_.quarantine.clear();
  ns_.untracked_held.clear();
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
  for (const auto& gpu : ns_.inventory.gpus) {
    if (!gpu.exposed || !gpu.info.mig.current) continue;
    auto gis = nvml_.ListGpuInstances(gpu.info.index);
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
      for (const auto& m : ns_.state.instances)
        idle = idle && (m.idle || m.gpu_uuid != gpu.info.uuid);
      for (const auto& i : ns_.state.intents) idle = idle && i.gpu_uuid != gpu.info.uuid;
      for (const auto& q : ns_.quarantine) idle = idle && q.gpu_uuid != gpu.info.uuid;
    }
    if (idle && GpuHasProcesses(gpu, &why)) idle = false;
    untracked += KeepOrCleanUntracked(gpu, unowned, idle, why, report);
  }
  // Complete annotations whose instance is gone (GPU reset, someone destroyed it).
  ReportGone(candidates);
  report.untracked = untracked;
  metrics_.SetUntracked(untracked);
  metrics_.SetUnverified(report.unverified);
  if (changed) PersistOrLog("adoption");
}

}  // namespace dynmig::deviceplugin
