// PluginCore's MIG mode switch step (plugin_core.h SwitchModes, mode_switch.h): the switching
// phase is published before the switch is carried out, and the outcome after it.
#include <string>
#include <vector>

#include "deviceplugin/plugin_core.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {

bool PluginCore::SwitchModes() {
  if (!switcher_.configured()) return false;
  std::vector<protocol::GpuModeRequest> todo;
  bool changed = false;
  {
    NodeLock lock(this);
    if (ns_.recovery_pending) return false;  // nothing is switched before recovery ran
    changed = switcher_.Begin(todo);
    if (!todo.empty()) UpdateDevices();
  }
  if (!changed) return false;
  // "switching" (and the GPU unhealthy) reaches the Node before the GPU is touched.
  if (auto st = PublishNode(); !st.ok()) spdlog::warn("{}", std::string(st.message()));
  if (todo.empty()) return true;
  {
    NodeLock lock(this);
    if (!switcher_.Carry(todo)) return true;  // a crash point: nothing after it runs
    RefreshHealth(ops_.nvml, ns_.inventory);
    switcher_.ApplyHealth();
    UpdateDevices();
    ops_.UpdateGauges();
    RefreshViewLocked();
  }
  if (auto st = PublishNode(); !st.ok()) spdlog::warn("{}", std::string(st.message()));
  return true;
}

std::vector<protocol::GpuModeStatus> PluginCore::ModeStatuses() {
  NodeLock lock(this);
  if (!switcher_.configured()) return {};
  return switcher_.Statuses();
}

}  // namespace dynmig::deviceplugin
