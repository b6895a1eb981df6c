// Handover without draining: live instances dynmig did not create are attributed (handover.h)
// before anything may destroy them. Held ones are managed (origin "legacy") with their holders and
// reclaimed once no container holds them; unproven ones are kept and published; free ones follow
// the untracked rule. The Reclaimer's part; GET /nvml's fields are in plugin_handover.cc. See
// docs/device-plugin.md (Handover).
#include <algorithm>
#include <map>

#include "deviceplugin/plugin_internal.h"
#include "deviceplugin/reclaimer.h"
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

void Reclaimer::BeginHandoverCycle() {
  LegacyState& l = ops_.ns.legacy;
  l.asked = false;
  // A read ahead (OfferEvidence) serves this one cycle whatever its age; any read serves while
  // younger than evidence_max_age.
  l.fresh = l.evidence.has_value() && (l.prefetched || ops_.options.clock->Monotonic() - l.read_at <
                                                           ops_.options.evidence_max_age);
  l.prefetched = false;
  l.untracked.clear();
  l.unconfirmed.clear();
}

bool Reclaimer::WantsEvidence() {
  return ops_.ns.legacy.asked &&
         ops_.options.clock->Monotonic() - ops_.ns.legacy.read_at >= ops_.options.evidence_max_age;
}

HandoverEvidence Reclaimer::ReadEvidenceSources() const {
  HandoverEvidence e;
  e.own_resource = ops_.options.resource_name;
  if (ops_.pod_resources == nullptr) {
    e.pod_resources =
        absl::FailedPreconditionError("the kubelet's PodResources API is not configured");
  } else {
    e.pod_resources = ops_.pod_resources->List();
  }
  if (ops_.options.runtime != nullptr) {
    e.runtime = ops_.options.runtime->List();
    if (e.runtime->ok() && !ops_.options.self_pod.empty()) {
      std::erase_if(**e.runtime,
                    [&](const RuntimeContainer& c) { return c.PodKey() == ops_.options.self_pod; });
    }
  }
  return e;
}

void Reclaimer::OfferEvidence(HandoverEvidence evidence, absl::Duration read_at) {
  LegacyState& l = ops_.ns.legacy;
  if (l.evidence.has_value() && read_at <= l.read_at) return;  // a newer read is in place
  l.evidence = std::move(evidence);
  l.read_at = read_at;
  l.gap_known = false;
  l.prefetched = true;
}

const HandoverEvidence& Reclaimer::Evidence(const std::vector<PodMig>& pods) {
  LegacyState& l = ops_.ns.legacy;
  l.asked = true;
  if (l.fresh && l.evidence.has_value()) {
    if (!l.gap_known) ComputeGap(pods);
    return *l.evidence;
  }
  // The first need (or a cycle no prefetch served): read under the lock.
  const absl::Duration read_at = ops_.options.clock->Monotonic();
  l.evidence = ReadEvidenceSources();
  l.read_at = read_at;
  l.fresh = true;
  l.prefetched = false;
  ComputeGap(pods);
  return *l.evidence;
}

void Reclaimer::ComputeGap(const std::vector<PodMig>& pods) {
  LegacyState& l = ops_.ns.legacy;
  std::vector<LiveInstance> live;
  for (const auto& gpu : ops_.ns.inventory.gpus) {
    if (!gpu.exposed || !gpu.info.mig.current) continue;
    auto gis = ops_.nvml.ListGpuInstances(gpu.info.index);
    if (!gis.ok()) continue;
    for (const auto& gi : *gis) live.push_back(Live(gpu, gi));
  }
  l.gap = EvidenceGap(*l.evidence, pods, live);
  l.gap_known = true;
  if (!l.gap.empty() && ops_.FirstReport("legacy-gap/" + l.gap)) {
    spdlog::warn("handover: no untracked instance can be proven free: {}", l.gap);
  }
}

LiveInstance Reclaimer::Live(const GpuEntry& gpu, const nvml::GpuInstanceInfo& gi) {
  LiveInstance l;
  l.gpu_uuid = gpu.info.uuid;
  l.gpu_index = gpu.info.index;
  l.gi = gi.id;
  l.placement = gi.placement;
  l.profile = ProfileName(gpu, gi.profile_id);
  l.profile_id = gi.profile_id;
  auto cis = ops_.nvml.ListComputeInstances(gpu.info.index, gi.id);
  if (!cis.ok()) {
    l.error = std::string(cis.status().message());
    return l;
  }
  for (const auto& ci : *cis) l.cis.push_back({ci.id, ci.mig_uuid});
  return l;
}

std::vector<nvml::GpuInstanceInfo> Reclaimer::AttributeUnowned(
    const GpuEntry& gpu, const std::vector<nvml::GpuInstanceInfo>& unowned,
    const std::vector<PodMig>& pods, bool& changed) {
  std::vector<nvml::GpuInstanceInfo> free;
  if (unowned.empty()) return free;
  const HandoverEvidence& evidence = Evidence(pods);
  for (const auto& gi : unowned) {
    const LiveInstance live = Live(gpu, gi);
    Attribution a = Attribute(live, evidence, pods, ops_.ns.legacy.gap);
    const std::string what = fmt::format(
        "GI {} ({} at {}) of GPU {}", gi.id,
        live.profile.empty() ? fmt::format("profile id {}", gi.profile_id) : live.profile,
        PlacementText(gi.placement), gpu.info.uuid);
    if (a.kind != AttributionKind::kHeld) {
      LegacyState::Untracked u{std::move(a), gi.placement, live.profile, ""};
      if (u.attribution.kind == AttributionKind::kFree) {
        free.push_back(gi);
      } else {
        u.held_reason = fmt::format("unproven: {}: {}", what, u.attribution.reason);
        if (ops_.FirstReport(fmt::format("legacy-unproven/{}/{}/{}", gpu.info.uuid, gi.id,
                                         gi.placement.start))) {
          ops_.Event(nullptr, "Warning", kReasonLegacyUnproven,
                     fmt::format("{} was not created by dynmig and no container holding it can be "
                                 "proven: {}; kept, never destroyed, attributed again every cycle",
                                 what, u.attribution.reason));
        }
      }
      ops_.ns.legacy.untracked[{gpu.info.uuid, gi.id}] = std::move(u);
      continue;
    }
    const LiveCi first = live.cis.empty() ? LiveCi{} : live.cis.front();
    ManagedInstance m =
        ops_.NewInstance(a.owner, gpu.info.uuid, live.profile, gi.profile_id, gi.placement, gi.id,
                         first.id, first.mig_uuid, kOriginLegacy);
    m.holders = a.holders;
    const std::string reason = HeldReason(a);
    ops_.ns.Manage(std::move(m));
    ops_.metrics.InstanceAdopted(kOriginLegacy);
    changed = true;
    ops_.Event(
        PodWithUid(pods, a.owner.pod_uid), "Normal", kReasonLegacyHeld,
        fmt::format("{} (MIG device {}) is a {}: managed by dynmig from now on, never "
                    "destroyed while a container holds it, reclaimed when every holder has ended",
                    what, first.mig_uuid, reason));
  }
  return free;
}

bool Reclaimer::ReconcileLegacy(const std::vector<PodMig>& pods, bool destructive,
                                ReconcileReport& report) {
  bool changed = false;
  const std::vector<ManagedInstance> managed = ops_.ns.state.instances;
  std::map<std::string, absl::StatusOr<std::vector<nvml::GpuInstanceInfo>>> gis_of;  // by GPU
  for (const auto& m : managed) {
    if (m.idle || m.destroy_pending() || m.origin != kOriginLegacy) continue;
    const GpuEntry* gpu = ops_.ns.inventory.FindByUuid(m.gpu_uuid);
    if (gpu == nullptr || !gpu->info.mig.current) continue;
    auto listed = gis_of.find(m.gpu_uuid);
    if (listed == gis_of.end()) {
      listed = gis_of.emplace(m.gpu_uuid, ops_.nvml.ListGpuInstances(gpu->info.index)).first;
    }
    if (!listed->second.ok()) continue;
    const auto& gis = *listed->second;
    auto gi = std::find_if(gis.begin(), gis.end(), [&](const nvml::GpuInstanceInfo& g) {
      return g.id == m.gpu_instance_id && g.placement == m.placement;
    });
    if (gi == gis.end()) continue;  // vanished: adoption forgets it
    Attribution a = Attribute(Live(*gpu, *gi), Evidence(pods), pods, ops_.ns.legacy.gap);
    const PodMig* active = ActiveHolderPod(m, pods);
    if (a.kind == AttributionKind::kFree && active != nullptr) {
      a.kind = AttributionKind::kUnproven;
      a.reason = fmt::format("no container lists it any more, but pod {} still runs", active->key);
    }
    ManagedInstance* entry = ops_.ns.FindManagedGi(m.gpu_uuid, m.gpu_instance_id);
    if (a.kind == AttributionKind::kHeld) {
      if (entry->holders != a.holders || entry->owner != a.owner) {
        entry->holders = a.holders;
        entry->owner = a.owner;
        changed = true;
      }
    } else if (a.kind == AttributionKind::kUnproven) {
      ops_.ns.legacy.unconfirmed[{m.gpu_uuid, m.gpu_instance_id}] = a.reason;
    } else if (ReclaimEnded(m, PodWithUid(pods, m.owner.pod_uid), destructive, report)) {
      // Reclaimed: destroyed, or kept idle (its holders no longer apply).
      if (ManagedInstance* idle = ops_.ns.FindManagedGi(m.gpu_uuid, m.gpu_instance_id)) {
        idle->holders.clear();
      }
      changed = true;
    }
  }
  return changed;
}

std::string Reclaimer::LegacyOnGpu(const GpuEntry& gpu, const std::vector<PodMig>& pods) {
  for (const auto& m : ops_.ns.state.instances) {
    if (!m.idle && m.origin == kOriginLegacy && m.gpu_uuid == gpu.info.uuid) {
      return fmt::format("its legacy instance {} (GI {}) is held by pod {}", m.mig_uuid,
                         m.gpu_instance_id, m.owner.PodKey());
    }
  }
  auto gis = ops_.nvml.ListGpuInstances(gpu.info.index);
  if (!gis.ok())
    return fmt::format("its GIs cannot be listed ({})", std::string(gis.status().message()));
  for (const auto& gi : *gis) {
    if (const ManagedInstance* m = ops_.ns.FindManagedGi(gpu.info.uuid, gi.id);
        m != nullptr && m->placement == gi.placement) {
      continue;
    }
    const Attribution a = Attribute(Live(gpu, gi), Evidence(pods), pods, ops_.ns.legacy.gap);
    if (a.kind == AttributionKind::kHeld) {
      return fmt::format("GI {} is a {}", gi.id, HeldReason(a));
    }
    if (a.kind == AttributionKind::kUnproven) {
      return fmt::format("no holder of GI {} can be proven ({})", gi.id, a.reason);
    }
  }
  return "";
}

bool Reclaimer::LegacyMayIdle(const ManagedInstance& m) const {
  const GpuEntry* gpu = ops_.ns.inventory.FindByUuid(m.gpu_uuid);
  return gpu != nullptr && !m.profile.empty() && gpu->FindAllowed(m.profile) != nullptr;
}

}  // namespace dynmig::deviceplugin
