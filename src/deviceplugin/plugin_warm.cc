// Warm instances (lazy reclamation, device-config.yaml nvidia.migWarmInstances): the instance of
// a pod that ended is kept idle for reuse; idle instances are destroyed on TTL, when a reservation
// needs their slices, over the per-GPU cap, or when warm instances are turned off. See
// plugin_core.h and docs/device-plugin.md (Warm instances).
#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "common/status_macros.h"
#include "deviceplugin/plugin_core.h"
#include "deviceplugin/plugin_internal.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {

bool PluginCore::KeepIdle(const ManagedInstance& m) const {
  if (!options_.warm.enabled || m.mig_uuid.empty()) return false;
  if (m.origin == kOriginLegacy && !LegacyMayIdle(m)) return false;
  uint32_t idle = 0;
  for (const auto& other : ns_.state.instances) {
    if (other.idle && other.gpu_uuid == m.gpu_uuid) ++idle;
  }
  return idle < options_.warm.max_per_gpu;
}

void PluginCore::MarkIdle(const ManagedInstance& m, const PodMig* owner, const std::string& ended) {
  ManagedInstance* entry = ns_.FindManagedGi(m.gpu_uuid, m.gpu_instance_id);
  if (entry == nullptr) return;
  entry->idle = true;
  entry->idle_since = NowUnix();
  metrics_.InstanceIdled(m.profile);
  Event(
      owner, "Normal", kReasonIdled,
      fmt::format("kept MIG device {} ({} at {} of GPU {}, GI {}) of pod {} ({}) idle for reuse "
                  "for up to {}",
                  m.mig_uuid, m.profile, PlacementText(m.placement), m.gpu_uuid, m.gpu_instance_id,
                  m.owner.PodKey(), ended, absl::FormatDuration(options_.warm.ttl)));
}

void PluginCore::SweepIdle(const std::vector<PodMig>& pods, bool destructive,
                           ReconcileReport& report) {
  // What the active pods reserve and this plugin has not realized yet.
  struct Pending {
    std::string gpu_uuid;
    std::string profile;
    mig::Placement placement;
    std::string pod;
  };
  std::vector<Pending> pending;
  for (const auto& p : pods) {
    if (!p.active || !p.allocations.ok()) continue;
    for (const auto& a : *p.allocations) {
      if (!a.runtime.has_value()) pending.push_back({a.gpu_uuid, a.profile, a.placement, p.key});
    }
  }
  const int64_t now = NowUnix();
  const int64_t ttl = absl::ToInt64Seconds(options_.warm.ttl);
  // Newest first, so that the cap keeps the most recently idled ones.
  std::vector<ManagedInstance> idle;
  for (const auto& m : ns_.state.instances) {
    if (m.idle) idle.push_back(m);
  }
  std::sort(idle.begin(), idle.end(), [](const ManagedInstance& a, const ManagedInstance& b) {
    return std::tie(b.idle_since, a.gpu_instance_id) < std::tie(a.idle_since, b.gpu_instance_id);
  });
  std::map<std::string, uint32_t> kept;  // per GPU
  bool changed = false;
  for (const auto& m : idle) {
    bool claimed = false;
    std::string needed_by;
    for (const auto& r : pending) {
      if (r.gpu_uuid != m.gpu_uuid || !r.placement.Overlaps(m.placement)) continue;
      if (r.placement == m.placement && r.profile == m.profile) {
        claimed = true;
      } else if (needed_by.empty()) {
        needed_by =
            fmt::format("pod {} reserves {} at {}", r.pod, r.profile, PlacementText(r.placement));
      }
    }
    std::string reason, why;
    if (!needed_by.empty()) {
      reason = "idle_needed";
      why = "its slices are needed: " + needed_by;
    } else if (!options_.warm.enabled) {
      reason = "idle_disabled";
      why = "warm instances are off";
    } else if (!claimed && now - m.idle_since >= ttl) {
      reason = "idle_ttl";
      why = fmt::format("idle for {}s, the TTL is {}", now - m.idle_since,
                        absl::FormatDuration(options_.warm.ttl));
    } else if (!claimed && kept[m.gpu_uuid] >= options_.warm.max_per_gpu) {
      reason = "idle_cap";
      why = fmt::format("its GPU keeps at most {} idle instance(s)", options_.warm.max_per_gpu);
    }
    if (reason.empty()) {
      ++kept[m.gpu_uuid];
      continue;
    }
    if (!destructive) {
      ++kept[m.gpu_uuid];
      continue;  // nothing is destroyed while a pod's annotations cannot be read
    }
    const GpuEntry* gpu = ns_.inventory.FindByUuid(m.gpu_uuid);
    if (gpu == nullptr) continue;
    std::string busy;
    if (GiBusy(*gpu, m.gpu_instance_id, &busy)) {
      ++kept[m.gpu_uuid];
      if (FirstReport(fmt::format("idle-busy/{}/{}", m.gpu_uuid, m.gpu_instance_id))) {
        Event(nullptr, "Warning", kReasonReclaimDeferred,
              fmt::format("idle MIG device {} (GI {} on GPU {}) is not destroyed ({}): {}",
                          m.mig_uuid, m.gpu_instance_id, m.gpu_uuid, why, busy));
      }
      continue;
    }
    if (auto st = DestroyGi(*gpu, m.gpu_instance_id); !st.ok()) {
      ++kept[m.gpu_uuid];
      ++report.destroy_failed;
      metrics_.DestroyFailed();
      spdlog::warn("cannot destroy idle MIG device {} ({}): {}", m.mig_uuid, why,
                   std::string(st.message()));
      continue;
    }
    ns_.RemoveManaged(m.gpu_uuid, m.gpu_instance_id);
    reported_.erase(fmt::format("idle-busy/{}/{}", m.gpu_uuid, m.gpu_instance_id));
    if (cdi_.enabled()) {
      if (auto rm = cdi_.Remove(m.mig_uuid); !rm.ok())
        spdlog::warn("{}", std::string(rm.message()));
    }
    changed = true;
    ++report.destroyed;
    ++report.idle_destroyed;
    metrics_.InstanceDestroyed(reason);
    Event(nullptr, "Normal", kReasonDestroyed,
          fmt::format("destroyed idle MIG device {} ({} at {} of GPU {}, GI {}): {}", m.mig_uuid,
                      m.profile, PlacementText(m.placement), m.gpu_uuid, m.gpu_instance_id, why));
  }
  if (changed) {
    if (auto st = Persist(); !st.ok())
      spdlog::error("cannot save state: {}", std::string(st.message()));
  }
}

absl::Status PluginCore::VerifyIdle(const GpuEntry& gpu, const ManagedInstance& m,
                                    const nvml::GpuInstanceInfo& gi) {
  if (gi.id != m.gpu_instance_id || gi.placement != m.placement) {
    return absl::FailedPreconditionError(fmt::format(
        "the GI at {} is GI {}, not GI {}", PlacementText(gi.placement), gi.id, m.gpu_instance_id));
  }
  if (gi.profile_id != m.profile_id) {
    return absl::FailedPreconditionError(
        fmt::format("GI {} has profile id {}, the idle instance was {} (id {})", gi.id,
                    gi.profile_id, m.profile, m.profile_id));
  }
  auto cis = nvml_.ListComputeInstances(gpu.info.index, gi.id);
  if (!cis.ok()) return Annotate(cis.status(), fmt::format("list CIs of GI {}", gi.id));
  bool found = false;
  for (const auto& ci : *cis) found = found || ci.id == m.compute_instance_id;
  if (!found) {
    return absl::FailedPreconditionError(
        fmt::format("GI {} has no compute instance {}", gi.id, m.compute_instance_id));
  }
  auto uuid = nvml_.GetMigDeviceUuid(gpu.info.index, gi.id, m.compute_instance_id);
  if (!uuid.ok()) return Annotate(uuid.status(), "read the MIG UUID");
  if (*uuid != m.mig_uuid) {
    return absl::FailedPreconditionError(fmt::format("GI {} CI {} has MIG UUID {}, not {}", gi.id,
                                                     m.compute_instance_id, *uuid, m.mig_uuid));
  }
  std::string busy;
  if (GiBusy(gpu, gi.id, &busy)) return absl::FailedPreconditionError(busy);
  return absl::OkStatus();
}

std::vector<protocol::IdleInstance> PluginCore::Idle() const {
  dynmig::MutexLock lock(&ns_.mu);
  return ns_.Idle();
}

bool PluginCore::IdleChanged() const {
  std::vector<protocol::IdleInstance> idle;
  {
    dynmig::MutexLock lock(&ns_.mu);
    idle = ns_.Idle();
  }
  return publisher_.IdleChanged(idle);
}

}  // namespace dynmig::deviceplugin
