// NodeState: the managed-instance bookkeeping under the node lock. See node_state.h.
#include "deviceplugin/node_state.h"

#include <algorithm>
#include <utility>

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
  held.insert(held.end(), legacy.held.begin(), legacy.held.end());
  // Every managed legacy instance from the state itself too: this cycle's list is empty after a
  // restart until the first reconcile, and a publish in between must not offer its slices.
  for (const auto& m : state.instances) {
    if (m.idle || m.origin != kOriginLegacy) continue;
    const bool listed = std::any_of(held.begin(), held.end(), [&](const protocol::HeldSlices& h) {
      return h.gpu_uuid == m.gpu_uuid && h.placement == m.placement;
    });
    if (!listed) {
      held.push_back({m.gpu_uuid, m.placement, m.profile,
                      "legacy instance " + m.mig_uuid + " of " + m.owner.PodKey()});
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
