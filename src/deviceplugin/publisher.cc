// Publisher: the node annotations and the instance gauges. See publisher.h.
#include "deviceplugin/publisher.h"

#include <map>
#include <utility>

#include "fmt/format.h"
#include "kube/object.h"
#include "protocol/annotations.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {

absl::Status Publisher::Publish(NodeSnapshot snapshot) {
  const std::string value = protocol::EncodeNodeRegister(snapshot.devices);
  const std::string held_value = protocol::EncodeHeldSlices(std::move(snapshot.held));
  const std::string idle_value = protocol::EncodeIdleInstances(std::move(snapshot.idle));
  bool changed = false;
  {
    dynmig::MutexLock lock(&mu_);
    changed = value != last_register_;
  }
  // Every key every time: the register also comes back after the node object was recreated.
  kube::KeyPatch patch;
  patch[std::string(protocol::kNodeHandshakeAnnotation)] =
      "Reported_" + kube::Rfc3339(clock_.Now());
  patch[std::string(protocol::kNodeRegisterAnnotation)] = value;
  patch[std::string(protocol::kNodeHeldSlicesAnnotation)] = held_value;
  patch[std::string(protocol::kNodeIdleInstancesAnnotation)] = idle_value;
  if (snapshot.modes.has_value()) {
    patch[std::string(protocol::kGpuModeStatusAnnotation)] =
        protocol::EncodeGpuModeStatuses(std::move(*snapshot.modes));
  } else {
    // Switching not configured: a status a configured plugin left is removed (the scheduler then
    // knows no request is carried out here); a no-op where there was none.
    patch[std::string(protocol::kGpuModeStatusAnnotation)] = std::nullopt;
  }
  auto st = kube_.PatchNodeAnnotations(node_name_, patch);
  metrics_.NodePublished(st.ok());
  if (!st.ok()) {
    return absl::Status(st.status().code(),
                        fmt::format("cannot publish the devices of node {}: {}", node_name_,
                                    std::string(st.status().message())));
  }
  if (changed) {
    spdlog::info("published {} on node {}: {}", protocol::kNodeRegisterAnnotation, node_name_,
                 value);
  }
  dynmig::MutexLock lock(&mu_);
  last_register_ = value;
  last_idle_ = idle_value;
  last_held_ = held_value;
  return absl::OkStatus();
}

bool Publisher::IdleChanged(const std::vector<protocol::IdleInstance>& idle) const {
  const std::string value = protocol::EncodeIdleInstances(idle);
  dynmig::MutexLock lock(&mu_);
  return value != last_idle_;
}

bool Publisher::HeldChanged(const std::vector<protocol::HeldSlices>& held) const {
  const std::string value = protocol::EncodeHeldSlices(held);
  dynmig::MutexLock lock(&mu_);
  return value != last_held_;
}

std::vector<InstanceInfo> LiveInstanceInfos(const std::vector<ManagedInstance>& instances,
                                            const std::vector<LedgerEntry>& ledger,
                                            const Inventory& inventory, std::string_view node) {
  std::map<std::string, const LedgerEntry*> by_mig_uuid;
  for (const auto& e : ledger) {
    for (const auto& u : e.mig_uuids) by_mig_uuid[u] = &e;
  }
  std::map<std::string, uint32_t> gpu_index;
  for (const auto& g : inventory.gpus) gpu_index[g.info.uuid] = g.info.index;
  std::vector<InstanceInfo> out;
  for (const auto& m : instances) {
    // Idle (warm) and destroy-pending instances belong to no running pod.
    if (m.idle || m.destroy_pending() || m.owner.name.empty()) continue;
    InstanceInfo i;
    i.ns = m.owner.ns;
    i.pod = m.owner.name;
    if (auto e = by_mig_uuid.find(m.mig_uuid); !m.mig_uuid.empty() && e != by_mig_uuid.end() &&
                                               e->second->ns == m.owner.ns &&
                                               e->second->name == m.owner.name) {
      i.container = e->second->container;
    } else if (!m.holders.empty()) {
      i.container = m.holders.front().container;
    }
    i.node = std::string(node);
    i.gpu_uuid = m.gpu_uuid;
    if (auto g = gpu_index.find(m.gpu_uuid); g != gpu_index.end()) i.gpu_index = g->second;
    i.gpu_instance_id = m.gpu_instance_id;
    i.compute_instance_id = m.compute_instance_id;
    i.mig_uuid = m.mig_uuid;
    i.profile = m.profile;
    i.placement = fmt::format("{}:{}", m.placement.start, m.placement.size);
    out.push_back(std::move(i));
  }
  return out;
}

void Publisher::SetGauges(const std::vector<ManagedInstance>& instances, bool recovery_pending) {
  metrics_.SetManaged(static_cast<double>(instances.size()));
  std::map<std::pair<std::string, std::string>, int> idle;
  for (const auto& m : instances) {
    if (m.idle) ++idle[{m.gpu_uuid, m.profile}];
  }
  metrics_.SetIdle(idle);
  metrics_.SetRecoveryPending(recovery_pending);
}

}  // namespace dynmig::deviceplugin
