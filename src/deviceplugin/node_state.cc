// NodeState: the managed-instance bookkeeping under the node lock. See node_state.h.
#include "deviceplugin/node_state.h"

#include <utility>

#include "fmt/format.h"

namespace dynmig::deviceplugin {

ManagedInstance* NodeState::FindManaged(std::string_view gpu_uuid,
                                        const mig::Placement& placement) {
  for (auto& m : state.instances) {
    if (m.gpu_uuid == gpu_uuid && m.placement == placement) return &m;
  }
  return nullptr;
}

ManagedInstance* NodeState::FindManagedGi(std::string_view gpu_uuid, uint32_t gi) {
  for (auto& m : state.instances) {
    if (m.gpu_uuid == gpu_uuid && m.gpu_instance_id == gi) return &m;
  }
  return nullptr;
}

void NodeState::RemoveManaged(std::string_view gpu_uuid, uint32_t gi) {
  std::erase_if(state.instances, [&](const ManagedInstance& m) {
    return m.gpu_uuid == gpu_uuid && m.gpu_instance_id == gi;
  });
}

void NodeState::Manage(ManagedInstance instance) {
  std::erase_if(state.instances, [&](const ManagedInstance& m) {
    return m.gpu_uuid == instance.gpu_uuid && (m.gpu_instance_id == instance.gpu_instance_id ||
                                               m.placement.Overlaps(instance.placement));
  });
  state.instances.push_back(std::move(instance));
}

std::vector<protocol::HeldSlices> NodeState::Held() const {
  std::vector<protocol::HeldSlices> held = ended_held;
  held.insert(held.end(), untracked_held.begin(), untracked_held.end());
  // Instances whose destroy NVML refused (IN_USE): they physically exist until a retry succeeds.
  for (const auto& m : state.instances) {
    if (!m.destroy_pending()) continue;
    held.push_back(
        {m.gpu_uuid, m.placement, m.profile,
         fmt::format("{} (GI {}) is being destroyed: NVML refused {} time(s), last: {}", m.mig_uuid,
                     m.gpu_instance_id, m.destroy_attempts, m.destroy_error)});
  }
  // Managed legacy instances, from the managed instances themselves: also right after a restart,
  // before any cycle has attributed them again.
  for (const auto& m : state.instances) {
    if (m.idle || m.destroy_pending() || m.origin != kOriginLegacy) continue;
    auto unconfirmed = legacy.unconfirmed.find({m.gpu_uuid, m.gpu_instance_id});
    held.push_back(
        {m.gpu_uuid, m.placement, m.profile,
         unconfirmed == legacy.unconfirmed.end()
             ? HeldReason(m.holders, m.owner)
             : fmt::format("legacy instance {} of {}: its holders cannot be confirmed ({}); kept",
                           m.mig_uuid, m.owner.PodKey(), unconfirmed->second)});
  }
  for (const auto& [key, u] : legacy.untracked) {
    if (u.attribution.kind == AttributionKind::kUnproven) {
      held.push_back({key.first, u.placement, u.profile, u.held_reason});
    }
  }
  return held;
}

std::vector<protocol::IdleInstance> NodeState::Idle() const {
  std::vector<protocol::IdleInstance> out;
  for (const auto& m : state.instances) {
    if (m.idle) out.push_back({m.gpu_uuid, m.profile, m.placement, m.idle_since});
  }
  return out;
}

}  // namespace dynmig::deviceplugin
