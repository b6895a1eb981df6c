// The Reclaimer's warm instances (lazy reclamation, device-config.yaml nvidia.migWarmInstances):
// the instance of a pod that ended is kept idle for reuse; idle instances are destroyed on TTL,
// when a reservation needs their slices, over the per-GPU cap, or when warm instances are turned
// off. See reclaimer.h, plugin_core.h and docs/device-plugin.md (Warm instances).
#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "common/status_macros.h"
#include "deviceplugin/plugin_internal.h"
#include "deviceplugin/reclaimer.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {

bool Reclaimer::KeepIdle(const ManagedInstance& m) const {
  if (!ops_.options.warm.enabled || m.mig_uuid.empty()) return false;
  if (m.origin == kOriginLegacy && !LegacyMayIdle(m)) return false;
  uint32_t idle = 0;
  for (const auto& other : ops_.ns.state.instances) {
    if (other.idle && other.gpu_uuid == m.gpu_uuid) ++idle;
  }
  return idle < ops_.options.warm.max_per_gpu;
}

void Reclaimer::MarkIdle(const ManagedInstance& m, const PodMig* owner, const std::string& ended) {
  ManagedInstance* entry = ops_.ns.FindManagedGi(m.gpu_uuid, m.gpu_instance_id);
  if (entry == nullptr) return;
  entry->idle = true;
  entry->idle_since = ops_.NowUnix();
  ops_.metrics.InstanceIdled(m.profile);
  ops_.Event(
      owner, "Normal", kReasonIdled,
      fmt::format("kept MIG device {} ({} at {} of GPU {}, GI {}) of pod {} ({}) idle for reuse "
                  "for up to {}",
                  m.mig_uuid, m.profile, PlacementText(m.placement), m.gpu_uuid, m.gpu_instance_id,
                  m.owner.PodKey(), ended, absl::FormatDuration(ops_.options.warm.ttl)));
}

void Reclaimer::SweepIdle(const std::vector<PodMig>& pods, bool destructive,
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
  const int64_t now = ops_.NowUnix();
  const int64_t ttl = absl::ToInt64Seconds(ops_.options.warm.ttl);
  // Newest first, so that the cap keeps the most recently idled ones.
  std::vector<ManagedInstance> idle;
  for (const auto& m : ops_.ns.state.instances) {
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
    } else if (!ops_.options.warm.enabled) {
      reason = "idle_disabled";
      why = "warm instances are off";
    } else if (!claimed && now - m.idle_since >= ttl) {
      reason = "idle_ttl";
      why = fmt::format("idle for {}s, the TTL is {}", now - m.idle_since,
                        absl::FormatDuration(ops_.options.warm.ttl));
    } else if (!claimed && kept[m.gpu_uuid] >= ops_.options.warm.max_per_gpu) {
      reason = "idle_cap";
      why = fmt::format("its GPU keeps at most {} idle instance(s)", ops_.options.warm.max_per_gpu);
    }
    if (reason.empty()) {
      ++kept[m.gpu_uuid];
      continue;
    }
    if (!destructive) {
      ++kept[m.gpu_uuid];
      continue;  // nothing is destroyed while a pod's annotations cannot be read
    }
    const GpuEntry* gpu = ops_.ns.inventory.FindByUuid(m.gpu_uuid);
    if (gpu == nullptr) continue;
    std::string busy;
    if (ops_.GiBusy(*gpu, m.gpu_instance_id, &busy)) {
      ++kept[m.gpu_uuid];
      if (ops_.FirstReport(fmt::format("idle-busy/{}/{}", m.gpu_uuid, m.gpu_instance_id))) {
        ops_.Event(nullptr, "Warning", kReasonReclaimDeferred,
                   fmt::format("idle MIG device {} (GI {} on GPU {}) is not destroyed ({}): {}",
                               m.mig_uuid, m.gpu_instance_id, m.gpu_uuid, why, busy));
      }
      continue;
    }
    if (auto st = ops_.DestroyGi(*gpu, m.gpu_instance_id); !st.ok()) {
      if (DeferInUse(m, *gpu, st, nullptr)) {
        ++report.destroy_pending;
        changed = true;  // no longer idle: pending destroy, its slices held
        continue;
      }
      ++kept[m.gpu_uuid];
      ++report.destroy_failed;
      ops_.metrics.DestroyFailed();
      spdlog::warn("cannot destroy idle MIG device {} ({}): {}", m.mig_uuid, why,
                   std::string(st.message()));
      continue;
    }
    ops_.ns.RemoveManaged(m.gpu_uuid, m.gpu_instance_id);
    ops_.ForgetReport(fmt::format("idle-busy/{}/{}", m.gpu_uuid, m.gpu_instance_id));
    if (ops_.cdi.enabled()) {
      if (auto rm = ops_.cdi.Remove(m.mig_uuid); !rm.ok())
        spdlog::warn("{}", std::string(rm.message()));
    }
    changed = true;
    ++report.destroyed;
    ++report.idle_destroyed;
    ops_.metrics.InstanceDestroyed(reason);
    ops_.Event(
        nullptr, "Normal", kReasonDestroyed,
        fmt::format("destroyed idle MIG device {} ({} at {} of GPU {}, GI {}): {}", m.mig_uuid,
                    m.profile, PlacementText(m.placement), m.gpu_uuid, m.gpu_instance_id, why));
  }
  if (changed) {
    if (auto st = ops_.Persist(); !st.ok())
      spdlog::error("cannot save state: {}", std::string(st.message()));
  }
}

}  // namespace dynmig::deviceplugin
