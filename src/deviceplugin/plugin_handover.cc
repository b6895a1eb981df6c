// Handover without draining: live instances dynmig did not create are attributed (handover.h)
// before anything may destroy them. Held ones are managed (origin "legacy") with their holders and
// reclaimed once no container holds them; unproven ones are kept and published; free ones follow
// the untracked rule. See plugin_core.h and docs/device-plugin.md (Handover).
#include <algorithm>

#include "deviceplugin/plugin_core.h"
#include "deviceplugin/plugin_internal.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {
namespace {

const PodMig* PodWithUid(const std::vector<PodMig>& pods, std::string_view uid) {
  if (uid.empty()) return nullptr;
  for (const auto& p : pods) {
    if (p.uid == uid) return &p;
  }
  return nullptr;
}

// An active pod among the recorded holders of `m` (the kubelet or the runtime stopped listing it
// while the API says it runs: kept, never reclaimed on that doubt).
const PodMig* ActiveHolderPod(const ManagedInstance& m, const std::vector<PodMig>& pods) {
  for (const auto& h : m.holders) {
    const PodMig* p = PodWithUid(pods, h.pod_uid);
    if (p != nullptr && p->active) return p;
  }
  const PodMig* owner = PodWithUid(pods, m.owner.pod_uid);
  return owner != nullptr && owner->active ? owner : nullptr;
}

std::string ProfileName(const GpuEntry& gpu, uint32_t profile_id) {
  const mig::ProfileSpec* p = gpu.FindById(profile_id);
  return p != nullptr ? p->name : "";
}

}  // namespace

void PluginCore::BeginHandoverCycle() {
  LegacyState& l = ns_.legacy;
  l.fresh =
      l.evidence.has_value() && options_.clock->Monotonic() - l.read_at < options_.evidence_max_age;
  l.untracked.clear();
  l.held.clear();
  l.held_count = 0;
  l.unconfirmed = 0;
}

const HandoverEvidence& PluginCore::Evidence(const std::vector<PodMig>& pods) {
  LegacyState& l = ns_.legacy;
  if (l.fresh && l.evidence.has_value()) return *l.evidence;
  HandoverEvidence e;
  e.own_resource = options_.resource_name;
  if (pod_resources_ == nullptr) {
    e.pod_resources =
        absl::FailedPreconditionError("the kubelet's PodResources API is not configured");
  } else {
    e.pod_resources = pod_resources_->List();
  }
  if (options_.runtime != nullptr) e.runtime = options_.runtime->List();
  std::vector<LiveInstance> live;
  for (const auto& gpu : ns_.inventory.gpus) {
    if (!gpu.exposed || !gpu.info.mig.current) continue;
    auto gis = nvml_.ListGpuInstances(gpu.info.index);
    if (!gis.ok()) continue;
    for (const auto& gi : *gis) live.push_back(Live(gpu, gi));
  }
  l.gap = EvidenceGap(e, pods, live);
  l.evidence = std::move(e);
  l.fresh = true;
  l.read_at = options_.clock->Monotonic();
  if (!l.gap.empty() && FirstReport("legacy-gap/" + l.gap)) {
    spdlog::warn("handover: no untracked instance can be proven free: {}", l.gap);
  }
  return *l.evidence;
}

LiveInstance PluginCore::Live(const GpuEntry& gpu, const nvml::GpuInstanceInfo& gi) {
  LiveInstance l;
  l.gpu_uuid = gpu.info.uuid;
  l.gpu_index = gpu.info.index;
  l.gi = gi.id;
  l.placement = gi.placement;
  l.profile = ProfileName(gpu, gi.profile_id);
  l.profile_id = gi.profile_id;
  auto cis = nvml_.ListComputeInstances(gpu.info.index, gi.id);
  if (!cis.ok()) {
    l.error = std::string(cis.status().message());
    return l;
  }
  for (const auto& ci : *cis) l.cis.push_back({ci.id, ci.mig_uuid});
  return l;
}

std::vector<nvml::GpuInstanceInfo> PluginCore::AttributeUnowned(
    const GpuEntry& gpu, const std::vector<nvml::GpuInstanceInfo>& unowned,
    const std::vector<PodMig>& pods, bool& changed) {
  std::vector<nvml::GpuInstanceInfo> free;
  if (unowned.empty()) return free;
  const HandoverEvidence& evidence = Evidence(pods);
  for (const auto& gi : unowned) {
    const LiveInstance live = Live(gpu, gi);
    Attribution a = Attribute(live, evidence, pods, ns_.legacy.gap);
    const std::string what = fmt::format(
        "GI {} ({} at {}) of GPU {}", gi.id,
        live.profile.empty() ? fmt::format("profile id {}", gi.profile_id) : live.profile,
        PlacementText(gi.placement), gpu.info.uuid);
    if (a.kind != AttributionKind::kHeld) {
      if (a.kind == AttributionKind::kFree) {
        free.push_back(gi);
      } else {
        ns_.legacy.held.push_back({gpu.info.uuid, gi.placement, live.profile,
                                   fmt::format("unproven: {}: {}", what, a.reason)});
        if (FirstReport(fmt::format("legacy-unproven/{}/{}/{}", gpu.info.uuid, gi.id,
                                    gi.placement.start))) {
          Event(nullptr, "Warning", kReasonLegacyUnproven,
                fmt::format("{} was not created by dynmig and no container holding it can be "
                            "proven: {}; kept, never destroyed, attributed again every cycle",
                            what, a.reason));
        }
      }
      ns_.legacy.untracked[{gpu.info.uuid, gi.id}] = std::move(a);
      continue;
    }
    const LiveCi first = live.cis.empty() ? LiveCi{} : live.cis.front();
    ManagedInstance m = NewInstance(a.owner, gpu.info.uuid, live.profile, gi.profile_id,
                                    gi.placement, gi.id, first.id, first.mig_uuid, kOriginLegacy);
    m.holders = a.holders;
    const std::string reason = HeldReason(a);
    ns_.Manage(std::move(m));
    metrics_.InstanceAdopted(kOriginLegacy);
    changed = true;
    ++ns_.legacy.held_count;
    ns_.legacy.held.push_back({gpu.info.uuid, gi.placement, live.profile, reason});
    Event(PodWithUid(pods, a.owner.pod_uid), "Normal", kReasonLegacyHeld,
          fmt::format("{} (MIG device {}) is a {}: managed by dynmig from now on, never "
                      "destroyed while a container holds it, reclaimed when every holder has ended",
                      what, first.mig_uuid, reason));
  }
  return free;
}

bool PluginCore::ReconcileLegacy(const std::vector<PodMig>& pods, bool destructive,
                                 ReconcileReport& report) {
  bool changed = false;
  const std::vector<ManagedInstance> managed = ns_.state.instances;
  for (const auto& m : managed) {
    if (m.idle || m.origin != kOriginLegacy) continue;
    const GpuEntry* gpu = ns_.inventory.FindByUuid(m.gpu_uuid);
    if (gpu == nullptr || !gpu->info.mig.current) continue;
    auto gis = nvml_.ListGpuInstances(gpu->info.index);
    if (!gis.ok()) continue;
    auto gi = std::find_if(gis->begin(), gis->end(), [&](const nvml::GpuInstanceInfo& g) {
      return g.id == m.gpu_instance_id && g.placement == m.placement;
    });
    if (gi == gis->end()) continue;  // vanished: adoption forgets it
    Attribution a = Attribute(Live(*gpu, *gi), Evidence(pods), pods, ns_.legacy.gap);
    const PodMig* active = ActiveHolderPod(m, pods);
    if (a.kind == AttributionKind::kFree && active != nullptr) {
      a.kind = AttributionKind::kUnproven;
      a.reason = fmt::format("no container lists it any more, but pod {} still runs", active->key);
    }
    ManagedInstance* entry = ns_.FindManagedGi(m.gpu_uuid, m.gpu_instance_id);
    if (a.kind == AttributionKind::kHeld) {
      if (entry->holders != a.holders || entry->owner != a.owner) {
        entry->holders = a.holders;
        entry->owner = a.owner;
        changed = true;
      }
      ++ns_.legacy.held_count;
      ns_.legacy.held.push_back({m.gpu_uuid, m.placement, m.profile, HeldReason(a)});
    } else if (a.kind == AttributionKind::kUnproven) {
      ++ns_.legacy.unconfirmed;
      ns_.legacy.held.push_back(
          {m.gpu_uuid, m.placement, m.profile,
           fmt::format("legacy instance {} of {}: its holders cannot be confirmed ({}); kept",
                       m.mig_uuid, m.owner.PodKey(), a.reason)});
    } else if (ReclaimEnded(m, PodWithUid(pods, m.owner.pod_uid), destructive, report)) {
      // Reclaimed: destroyed, or kept idle (its holders no longer apply).
      if (ManagedInstance* idle = ns_.FindManagedGi(m.gpu_uuid, m.gpu_instance_id)) {
        idle->holders.clear();
      }
      changed = true;
    }
  }
  return changed;
}

std::string PluginCore::LegacyOnGpu(const GpuEntry& gpu, const std::vector<PodMig>& pods) {
  for (const auto& m : ns_.state.instances) {
    if (!m.idle && m.origin == kOriginLegacy && m.gpu_uuid == gpu.info.uuid) {
      return fmt::format("its legacy instance {} (GI {}) is held by pod {}", m.mig_uuid,
                         m.gpu_instance_id, m.owner.PodKey());
    }
  }
  auto gis = nvml_.ListGpuInstances(gpu.info.index);
  if (!gis.ok())
    return fmt::format("its GIs cannot be listed ({})", std::string(gis.status().message()));
  for (const auto& gi : *gis) {
    if (const ManagedInstance* m = ns_.FindManagedGi(gpu.info.uuid, gi.id);
        m != nullptr && m->placement == gi.placement) {
      continue;
    }
    const Attribution a = Attribute(Live(gpu, gi), Evidence(pods), pods, ns_.legacy.gap);
    if (a.kind == AttributionKind::kHeld) {
      return fmt::format("GI {} is a {}", gi.id, HeldReason(a));
    }
    if (a.kind == AttributionKind::kUnproven) {
      return fmt::format("no holder of GI {} can be proven ({})", gi.id, a.reason);
    }
  }
  return "";
}

bool PluginCore::LegacyMayIdle(const ManagedInstance& m) const {
  const GpuEntry* gpu = ns_.inventory.FindByUuid(m.gpu_uuid);
  return gpu != nullptr && !m.profile.empty() && gpu->FindAllowed(m.profile) != nullptr;
}

void PluginCore::AddHandoverView(const GpuEntry& gpu, const nvml::GpuInstanceInfo& gi,
                                 nlohmann::json& item) const {
  const ManagedInstance* m = nullptr;
  for (const auto& i : ns_.state.instances) {
    if (i.gpu_uuid == gpu.info.uuid && i.gpu_instance_id == gi.id) m = &i;
  }
  if (m != nullptr) {
    if (m->origin != kOriginLegacy || m->idle) return;
    nlohmann::json holders = nlohmann::json::array();
    for (const auto& h : m->holders) {
      holders.push_back({{"podUID", h.pod_uid},
                         {"namespace", h.ns},
                         {"name", h.name},
                         {"container", h.container},
                         {"resource", h.resource},
                         {"deviceID", h.device_id},
                         {"source", h.source}});
    }
    item["holders"] = std::move(holders);
    return;
  }
  auto it = ns_.legacy.untracked.find({gpu.info.uuid, gi.id});
  if (it == ns_.legacy.untracked.end()) return;
  if (it->second.kind == AttributionKind::kFree) {
    item["free"] = true;
  } else if (it->second.kind == AttributionKind::kUnproven) {
    item["unproven"] = it->second.reason;
  }
}

nlohmann::json PluginCore::EvidenceView() const {
  using Json = nlohmann::json;
  const std::optional<HandoverEvidence>& e = ns_.legacy.evidence;
  Json pod_resources = {{"ok", false}, {"error", "not read yet"}};
  Json runtime = options_.runtime == nullptr ? Json{{"configured", false}}
                                             : Json{{"ok", false}, {"error", "not read yet"}};
  if (e.has_value()) {
    pod_resources =
        e->pod_resources.ok()
            ? Json{{"ok", true}}
            : Json{{"ok", false}, {"error", std::string(e->pod_resources.status().message())}};
    if (e->runtime.has_value()) {
      runtime = e->runtime->ok()
                    ? Json{{"ok", true}}
                    : Json{{"ok", false}, {"error", std::string(e->runtime->status().message())}};
    }
  }
  return Json{{"podResources", pod_resources}, {"runtime", runtime}};
}

void PluginCore::UpdateLegacyGauge() {
  int unproven = ns_.legacy.unconfirmed;
  int free = 0;
  for (const auto& [key, a] : ns_.legacy.untracked) {
    unproven += a.kind == AttributionKind::kUnproven ? 1 : 0;
    free += a.kind == AttributionKind::kFree ? 1 : 0;
  }
  metrics_.SetLegacyInstances(ns_.legacy.held_count, unproven, free);
}

}  // namespace dynmig::deviceplugin
