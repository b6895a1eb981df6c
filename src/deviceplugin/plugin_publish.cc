// Publication: the kubelet's device list (ListAndWatch, DeviceList), GPU health, the snapshot the
// Publisher writes to the node, the /nvml view. See plugin_core.h.
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
void PluginCore::UpdateDevices() {
  std::vector<v1beta1::Device> devices;
  for (const auto& gpu : ns_.inventory.gpus) {
    if (!gpu.exposed) continue;
    ops_.metrics.SetGpuHealthy(gpu.info.uuid, gpu.healthy);
    // A whole GPU is one device ID; a MIG GPU one per instance it can hold.
    for (uint32_t r = 0; r < gpu.DeviceCount(); ++r) {
      v1beta1::Device d;
      d.set_id(ReplicaId(gpu.info.uuid, r));
      d.set_health(gpu.healthy ? "Healthy" : "Unhealthy");
      devices.push_back(std::move(d));
    }
  }
  devices_.Set(std::move(devices));
}

v1beta1::DevicePluginOptions PluginCore::PluginOptions() const {
  v1beta1::DevicePluginOptions o;
  o.set_pre_start_required(true);  // PreStartContainer proves whom the devices went to
  o.set_get_preferred_allocation_available(true);
  return o;
}

std::vector<v1beta1::Device> PluginCore::Devices(uint64_t* generation) const {
  return devices_.Get(generation);
}

uint64_t PluginCore::WaitForDeviceChange(uint64_t seen, absl::Duration timeout) const {
  return devices_.WaitForChange(seen, timeout);
}

void PluginCore::CloseDeviceWatches() { devices_.Close(); }

bool PluginCore::RefreshDevices() {
  NodeLock lock(this);
  std::vector<bool> before;
  for (const auto& g : ns_.inventory.gpus) before.push_back(g.healthy);
  // A GPU whose discovery failed at start is discovered once NVML answers.
  const bool discovered =
      RetryDiscovery(ops_.nvml, options_.allowlist, ns_.inventory, whole_policy_);
  if (!RefreshHealth(ops_.nvml, ns_.inventory) && !discovered) return false;
  for (size_t i = 0; i < ns_.inventory.gpus.size(); ++i) {
    const auto& g = ns_.inventory.gpus[i];
    if (g.exposed && !g.healthy && before[i]) {
      ops_.Event(nullptr, "Warning", kReasonGpuNotReady,
                 fmt::format("GPU {} ({}) became unhealthy: {}", g.info.index, g.info.uuid,
                             g.unhealthy_reason));
    }
  }
  if (switcher_.configured()) switcher_.ApplyHealth();  // a GPU mid-switch takes nothing
  UpdateDevices();
  return true;
}

NodeSnapshot PluginCore::SnapshotLocked() const {
  NodeSnapshot snapshot{ns_.inventory.RegisterDevices(), ns_.Held(), ns_.Idle(), std::nullopt};
  if (switcher_.configured()) snapshot.modes = switcher_.Statuses();
  return snapshot;
}

absl::Status PluginCore::PublishNode() {
  dynmig::MutexLock order(&publish_mu_);
  NodeSnapshot snapshot;
  {
    NodeLock lock(this);
    snapshot = SnapshotLocked();
  }
  return publisher_.Publish(std::move(snapshot));
}

nlohmann::json PluginCore::NvmlView() {
  if (ns_.mu.TryLock()) {
    bool old = false;
    {
      dynmig::MutexLock view(&view_mu_);
      old = view_.is_null() || options_.clock->Monotonic() - view_taken_ >= kViewMinAge;
    }
    if (old) RefreshViewLocked();
    ns_.mu.Unlock();
  }
  dynmig::MutexLock view(&view_mu_);
  nlohmann::json out = view_;
  out["snapshotAt"] = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", view_at_, absl::UTCTimeZone());
  return out;
}

void PluginCore::RefreshViewLocked() {
  nlohmann::json fresh = NvmlViewLocked();
  dynmig::MutexLock view(&view_mu_);
  view_ = std::move(fresh);
  view_at_ = ops_.Now();
  view_taken_ = options_.clock->Monotonic();
}

nlohmann::json PluginCore::NvmlViewLocked() {
  using Json = nlohmann::json;
  auto placement = [](const mig::Placement& p) {
    return Json{{"start", p.start}, {"size", p.size}};
  };
  auto owner = [](const InstanceOwner& o) {
    return Json{{"podUID", o.pod_uid},
                {"namespace", o.ns},
                {"name", o.name},
                {"containerIndex", o.container_index},
                {"deviceIndex", o.device_index}};
  };
  Json gpus = Json::array();
  for (const auto& g : ns_.inventory.gpus) {
    Json profiles = Json::array();
    for (const auto& p : g.capability.profiles) {
      Json pl = Json::array();
      for (const auto& x : p.placements) pl.push_back(placement(x));
      profiles.push_back({{"name", p.name},
                          {"id", p.nvml_id},
                          {"index", p.nvml_index},
                          {"memoryMiB", p.memory_mib},
                          {"sliceCount", p.compute_slices},
                          {"instanceCount", p.instance_count},
                          {"placements", pl},
                          {"allowed", g.FindAllowed(p.name) != nullptr}});
    }
    Json instances = Json::array();
    std::string instances_error;
    if (g.info.mig.current) {
      auto gis = ops_.nvml.ListGpuInstances(g.info.index);
      if (gis.ok()) {
        for (const auto& gi : *gis) {
          Json cis = Json::array();
          if (auto list = ops_.nvml.ListComputeInstances(g.info.index, gi.id); list.ok()) {
            for (const auto& ci : *list) cis.push_back({{"id", ci.id}, {"migUUID", ci.mig_uuid}});
          }
          const mig::ProfileSpec* p = g.FindById(gi.profile_id);
          Json item = {{"gpuInstanceID", gi.id},
                       {"profileId", gi.profile_id},
                       {"profile", p != nullptr ? p->name : ""},
                       {"placement", placement(gi.placement)},
                       {"computeInstances", cis},
                       {"managed", false}};
          if (const ManagedInstance* m = ns_.FindManagedGi(g.info.uuid, gi.id)) {
            item["managed"] = true;
            item["origin"] = m->origin;
            item["owner"] = owner(m->owner);
            if (m->idle) {
              item["idle"] = true;
              item["idleSince"] = m->idle_since;
            }
          }
          AddHandoverView(g, gi, item);
          instances.push_back(std::move(item));
        }
      } else {
        instances_error = std::string(gis.status().message());
      }
    }
    Json allowed = Json::array();
    for (const auto& p : g.allowed) allowed.push_back(p.name);
    Json gpu = {{"index", g.info.index},
                {"uuid", g.info.uuid},
                {"name", g.info.name},
                {"pciBusId", g.info.pci_bus_id},
                {"minor", g.info.minor},
                {"memoryMiB", g.info.total_memory_mib},
                {"migMode",
                 {{"supported", g.info.mig.supported},
                  {"current", g.info.mig.current},
                  {"pending", g.info.mig.pending}}},
                {"mode", g.Mode().has_value() ? std::string(protocol::GpuModeName(*g.Mode()))
                                              : std::string()},
                {"exposed", g.exposed},
                {"healthy", g.healthy},
                {"replicas", g.replicas},
                {"allowedProfiles", allowed},
                {"missingProfiles", g.missing_profiles},
                {"profiles", profiles},
                {"instances", instances}};
    if (!g.not_exposed_reason.empty()) gpu["notExposedReason"] = g.not_exposed_reason;
    if (!g.unhealthy_reason.empty()) gpu["unhealthyReason"] = g.unhealthy_reason;
    if (!instances_error.empty()) gpu["instancesError"] = instances_error;
    gpus.push_back(std::move(gpu));
  }
  Json intents = Json::array();
  for (const auto& i : ns_.state.intents) {
    intents.push_back({{"id", i.id},
                       {"gpuUUID", i.gpu_uuid},
                       {"profile", i.profile},
                       {"placement", placement(i.placement)},
                       {"owner", owner(i.owner)}});
  }
  Json quarantined = Json::array();
  for (const auto& q : ns_.quarantine) {
    quarantined.push_back({{"gpuUUID", q.gpu_uuid},
                           {"placement", placement(q.placement)},
                           {"pod", q.pod},
                           {"reason", q.reason}});
  }
  return Json{{"node", options_.node_name},
              {"nvml", ops_.nvml.Description()},
              {"recoveryPending", ns_.recovery_pending},
              {"evidence", EvidenceView()},
              {"gpus", gpus},
              {"intents", intents},
              {"quarantined", quarantined}};
}

}  // namespace dynmig::deviceplugin
