// Handover without draining: what GET /nvml shows of the attribution of legacy instances (the
// Reclaimer's part is reclaimer_handover.cc). See docs/device-plugin.md (Handover).
#include "deviceplugin/plugin_core.h"
#include "deviceplugin/plugin_internal.h"

namespace dynmig::deviceplugin {

void PluginCore::AddHandoverView(const GpuEntry& gpu, const nvml::GpuInstanceInfo& gi,
                                 nlohmann::json& item) const {
  const ManagedInstance* m = nullptr;
  for (const auto& i : ns_.state.instances) {
    if (i.gpu_uuid == gpu.info.uuid && i.gpu_instance_id == gi.id) m = &i;
  }
  if (m != nullptr) {
    if (m->origin != kOriginLegacy || m->idle) return;
    item["holders"] = HoldersJson(m->holders);
    return;
  }
  auto it = ns_.legacy.untracked.find({gpu.info.uuid, gi.id});
  if (it == ns_.legacy.untracked.end()) return;
  if (it->second.attribution.kind == AttributionKind::kFree) {
    item["free"] = true;
  } else if (it->second.attribution.kind == AttributionKind::kUnproven) {
    item["unproven"] = it->second.attribution.reason;
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

}  // namespace dynmig::deviceplugin
