// The Reclaimer's startup recovery (reclaimer.h): open intents, idle GPU cleaning, adoption.
// See plugin_core.h.
#include <algorithm>
#include <map>
#include <set>

#include "common/status_macros.h"
#include "deviceplugin/plugin_internal.h"
#include "deviceplugin/reclaimer.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "protocol/annotations.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {
void Reclaimer::Recover(const std::vector<PodMig>& pods) {
  spdlog::info("recovery: {} pod(s) on node {}, {} managed instance(s), {} open intent(s)",
               pods.size(), ops_.options.node_name, ops_.ns.state.instances.size(),
               ops_.ns.state.intents.size());
  const bool readable = Unreadable(pods).empty();
  BeginHandoverCycle();
  Evidence(pods);  // read at start, so GET /nvml (and `dynmig handover plan`) shows it
  ResolveIntents(pods, readable);
  if (readable) {
    CleanIdleGpus(pods);
  } else {
    spdlog::warn("recovery: some pods' MIG annotations cannot be read: no GPU is cleaned");
  }
  ops_.ns.recovery_pending = false;
  ReconcileReport report;
  // Adoption of every verified allocation; untracked instances on busy GPUs are kept.
  AdoptUntracked(pods, readable, report);
  ops_.PersistOrLog("recovery");
  ops_.UpdateGauges();
  spdlog::info(
      "recovery done: {} managed, {} adopted, {} unverified allocation(s), {} untracked "
      "instance(s), {} open intent(s)",
      ops_.ns.state.instances.size(), report.adopted, report.unverified, report.untracked,
      ops_.ns.state.intents.size());
}

void Reclaimer::ResolveIntents(const std::vector<PodMig>& pods, bool destructive) {
  std::map<std::string, const PodMig*> by_uid;
  for (const auto& p : pods) by_uid[p.uid] = &p;
  const std::vector<Intent> intents = ops_.ns.state.intents;
  std::set<uint64_t> closed;
  for (const auto& intent : intents) {
    auto it = by_uid.find(intent.owner.pod_uid);
    const PodMig* pod = it == by_uid.end() ? nullptr : it->second;
    if (ResolveIntent(intent, pod, destructive)) closed.insert(intent.id);
  }
  if (closed.empty()) return;
  std::erase_if(ops_.ns.state.intents, [&](const Intent& i) { return closed.count(i.id) > 0; });
  ops_.PersistOrLog("recovery");
}

namespace {

// The reservation of the intent's pod container device; nullptr when the pod has none (or none
// that decodes).
const protocol::MigAllocation* ReservationOf(const PodMig* pod, const InstanceOwner& owner) {
  if (pod == nullptr || !pod->allocations.ok()) return nullptr;
  const protocol::MigAllocation* entry = nullptr;
  for (const auto& a : *pod->allocations) {
    if (a.container_index == owner.container_index && a.device_index == owner.device_index) {
      entry = &a;
    }
  }
  return entry;
}

}  // namespace

bool Reclaimer::ResolveIntent(const Intent& intent, const PodMig* pod, bool destructive) {
  const std::string what =
      fmt::format("intent {} ({} at {} of GPU {} for pod {} container {} device {})", intent.id,
                  intent.profile, PlacementText(intent.placement), intent.gpu_uuid,
                  intent.owner.PodKey(), intent.owner.container_index, intent.owner.device_index);
  const GpuEntry* gpu = ops_.ns.inventory.FindByUuid(intent.gpu_uuid);
  const mig::ProfileSpec* profile =
      gpu == nullptr ? nullptr : gpu->capability.FindProfile(intent.profile);
  if (gpu == nullptr || profile == nullptr) {
    spdlog::warn("recovery: {}: the GPU or profile is gone; closed", what);
    return true;
  }
  auto gis = ops_.nvml.ListGpuInstances(gpu->info.index);
  if (!gis.ok()) {
    spdlog::warn("recovery: {}: cannot list GIs ({}); kept open", what,
                 std::string(gis.status().message()));
    return false;
  }
  const nvml::GpuInstanceInfo* gi = nullptr;
  for (const auto& g : *gis) {
    if (g.profile_id == profile->nvml_id && g.placement == intent.placement) gi = &g;
  }
  if (gi == nullptr) {
    spdlog::info("recovery: {}: no instance was created; closed", what);
    return true;
  }
  if (pod != nullptr && !pod->unreadable.empty() && !pod->terminated) {
    if (ops_.FirstReport(fmt::format("intent-unreadable/{}", intent.id))) {
      ops_.Event(pod, "Warning", kReasonAdoptionFailed,
                 fmt::format("{}: GI {} exists but the pod's annotations cannot be read ({}); kept "
                             "until they can",
                             what, gi->id, pod->unreadable));
    }
    return false;
  }
  // Validate: the pod still wants exactly this instance.
  const protocol::MigAllocation* entry = ReservationOf(pod, intent.owner);
  const bool unchanged = entry != nullptr && entry->gpu_uuid == intent.gpu_uuid &&
                         entry->profile == intent.profile && entry->placement == intent.placement;
  if (pod != nullptr && pod->active && unchanged) {
    return CompleteIntent(intent, what, *pod, *entry, *gpu, *profile, gi->id);
  }
  // The pod is gone, finished or deleting, or no longer reserves this: nobody owns the instance.
  const std::string why = pod == nullptr    ? "the pod is gone"
                          : pod->terminated ? "the pod finished"
                          : pod->deleting   ? "the pod is being deleted"
                                            : "the pod's reservation changed";
  if (!destructive) {
    spdlog::info("recovery: {}: {}, kept open while some pod's annotations cannot be read", what,
                 why);
    return false;
  }
  return ReleaseIntent(intent, what, why, pod, *gpu, *profile, gi->id);
}

bool Reclaimer::CompleteIntent(const Intent& intent, const std::string& what, const PodMig& pod,
                               const protocol::MigAllocation& entry, const GpuEntry& gpu,
                               const mig::ProfileSpec& profile, uint32_t gi) {
  // Create: the CI the interrupted Allocate did not get to.
  auto cis = ops_.nvml.ListComputeInstances(gpu.info.index, gi);
  if (!cis.ok()) {
    spdlog::warn("recovery: {}: cannot list CIs ({}); kept open", what,
                 std::string(cis.status().message()));
    return false;
  }
  uint32_t ci_id = 0;
  if (cis->empty()) {
    auto ci = ops_.nvml.CreateComputeInstance(gpu.info.index, gi);
    if (!ci.ok()) {
      spdlog::warn("recovery: {}: cannot create the missing CI ({}); kept open", what,
                   std::string(ci.status().message()));
      return false;
    }
    ci_id = ci->id;
  } else {
    ci_id = cis->front().id;
  }
  auto uuid = ops_.nvml.GetMigDeviceUuid(gpu.info.index, gi, ci_id);
  if (!uuid.ok()) {
    spdlog::warn("recovery: {}: cannot read the MIG UUID ({}); kept open", what,
                 std::string(uuid.status().message()));
    return false;
  }
  const protocol::RuntimeIdentity identity{*uuid, gi, ci_id};
  if (entry.runtime.has_value() && *entry.runtime != identity) {
    // Someone else's identity: keep the instance, never guess.
    if (ops_.FirstReport(fmt::format("intent-conflict/{}", intent.id))) {
      ops_.metrics.AdoptionFailed();
      ops_.Event(
          &pod, "Warning", kReasonAdoptionFailed,
          fmt::format("{}: GI {} exists but the annotation names {} (GI {}, CI {}); kept, not "
                      "adopted",
                      what, gi, entry.runtime->mig_uuid, entry.runtime->gpu_instance_id,
                      entry.runtime->compute_instance_id));
    }
    return true;
  }
  // Publish, then record: Allocate's last steps.
  if (!entry.runtime.has_value()) {
    std::map<int, protocol::RuntimeIdentity> identities{{intent.owner.device_index, identity}};
    auto st = ops_.WriteRuntimeIdentity(pod, intent.owner.container_index, identities,
                                        /*consume=*/false, nullptr);
    if (!st.ok()) {
      spdlog::warn("recovery: {}: cannot write the runtime identity ({}); kept open", what,
                   std::string(st.message()));
      return false;
    }
  }
  RecordAdopted(ops_.NewInstance(intent.owner, intent.gpu_uuid, intent.profile, profile.nvml_id,
                                 intent.placement, gi, ci_id, *uuid, "completed"),
                &pod, "intent",
                fmt::format("completed {} after an interrupted Allocate: MIG device {} (GI {}, CI "
                            "{}) written to {}",
                            what, *uuid, gi, ci_id, protocol::kMigAllocationsAnnotation));
  return true;
}

bool Reclaimer::ReleaseIntent(const Intent& intent, const std::string& what, const std::string& why,
                              const PodMig* pod, const GpuEntry& gpu,
                              const mig::ProfileSpec& profile, uint32_t gi) {
  std::string busy;
  if (ops_.GiBusy(gpu, gi, &busy)) {
    // Track it under the intent's owner: the reconciler reclaims it once the processes stop.
    ManagedInstance m = ops_.NewInstance(intent.owner, intent.gpu_uuid, intent.profile,
                                         profile.nvml_id, intent.placement, gi, 0, "", "intent");
    auto cis = ops_.nvml.ListComputeInstances(gpu.info.index, gi);
    if (cis.ok() && !cis->empty()) {
      m.compute_instance_id = cis->front().id;
      m.mig_uuid = cis->front().mig_uuid;
    }
    // An active pod whose reservation changed does not own it: no uid, so it is reclaimed.
    if (pod != nullptr && pod->active) m.owner.pod_uid.clear();
    ops_.ns.Manage(m);
    spdlog::warn("recovery: {}: {}, but {}; tracked and reclaimed once idle", what, why, busy);
    return true;
  }
  auto st = ops_.DestroyGi(gpu, gi);
  if (!st.ok() && nvml::NvmlReturnOf(st) == nvml::NvmlReturn::kInUse) {
    // Another NVML client holds it: tracked as a pending destroy (retried with backoff), owned by
    // nobody, and the intent is closed.
    ManagedInstance m = ops_.NewInstance(intent.owner, intent.gpu_uuid, intent.profile,
                                         profile.nvml_id, intent.placement, gi, 0, "", "intent");
    m.owner.pod_uid.clear();
    ops_.ns.Manage(m);
    return DeferInUse(m, gpu, st, pod);
  }
  if (!st.ok()) {
    ops_.metrics.DestroyFailed();
    spdlog::warn("recovery: {}: {}, destroy failed ({}); kept open", what, why,
                 std::string(st.message()));
    return false;
  }
  ops_.ns.RemoveManaged(intent.gpu_uuid, gi);
  ops_.metrics.InstanceDestroyed("intent");
  ops_.Event(pod, "Normal", kReasonDestroyed,
             fmt::format("destroyed GI {} of an interrupted Allocate ({}): {}", gi, what, why));
  return true;
}

void Reclaimer::CleanIdleGpus(const std::vector<PodMig>& pods) {
  // Busy: named by a non-terminated pod's annotations, running processes, or an open intent.
  std::set<std::string> referenced;
  bool all_busy = false;
  std::string all_busy_reason;
  for (const auto& p : pods) {
    if (p.terminated) continue;
    if (p.gpus_unknown) {
      all_busy = true;
      all_busy_reason = fmt::format("pod {} has annotations that name no readable GPU", p.key);
    }
    referenced.insert(p.referenced_gpus.begin(), p.referenced_gpus.end());
  }
  for (const auto& i : ops_.ns.state.intents) referenced.insert(i.gpu_uuid);
  for (const auto& gpu : ops_.ns.inventory.gpus) {
    if (!gpu.exposed) continue;
    if (gpu.Whole()) continue;  // a whole GPU (MIG mode off) has no instance to clean
    if (!gpu.info.mig.current) {
      spdlog::warn("recovery: GPU {} ({}) is not cleaned: {}", gpu.info.index, gpu.info.uuid,
                   gpu.unhealthy_reason);
      continue;
    }
    std::string why;
    if (all_busy) {
      why = all_busy_reason;
    } else if (referenced.count(gpu.info.uuid)) {
      why = "a pod references it";
    } else if (!ops_.GpuHasProcesses(gpu, &why)) {
      why = LegacyOnGpu(gpu, pods);  // a legacy instance a container holds, or may hold
    }
    if (!why.empty()) {
      spdlog::info("recovery: GPU {} ({}) is busy ({}): not cleaned", gpu.info.index, gpu.info.uuid,
                   why);
      continue;
    }
    auto gis = ops_.nvml.ListGpuInstances(gpu.info.index);
    if (!gis.ok()) {
      spdlog::warn("recovery: cannot list the GIs of idle GPU {}: {}", gpu.info.uuid,
                   std::string(gis.status().message()));
      continue;
    }
    int destroyed = 0;
    std::vector<std::string> failures;
    for (const auto& gi : *gis) {
      if (const ManagedInstance* m = ops_.ns.FindManagedGi(gpu.info.uuid, gi.id);
          m != nullptr && m->idle && m->placement == gi.placement &&
          m->profile_id == gi.profile_id) {
        continue;  // an idle (warm) instance: kept, the reconciler applies its TTL
      }
      auto st = ops_.DestroyGi(gpu, gi.id);
      if (!st.ok()) {
        ops_.metrics.DestroyFailed();
        failures.push_back(std::string(st.message()));
        continue;
      }
      ++destroyed;
      ops_.metrics.InstanceDestroyed("startup_cleanup");
      if (const ManagedInstance* m = ops_.ns.FindManagedGi(gpu.info.uuid, gi.id);
          m != nullptr && ops_.cdi.enabled()) {
        (void)ops_.cdi.Remove(m->mig_uuid);
      }
      ops_.ns.RemoveManaged(gpu.info.uuid, gi.id);
    }
    if (destroyed > 0) {
      ops_.Event(nullptr, "Normal", kReasonGpuCleaned,
                 fmt::format("GPU {} ({}) is idle: destroyed its {} MIG instance(s) to start clean",
                             gpu.info.index, gpu.info.uuid, destroyed));
    }
    if (!failures.empty()) {
      ops_.Event(
          nullptr, "Warning", kReasonGpuCleaned,
          fmt::format("GPU {} ({}): {} instance(s) could not be destroyed: {}", gpu.info.index,
                      gpu.info.uuid, failures.size(), fmt::join(failures, "; ")));
    }
  }
}

}  // namespace dynmig::deviceplugin
