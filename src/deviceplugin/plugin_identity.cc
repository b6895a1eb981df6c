// PreStartContainer's proof of whom the plugin served (identity.h): the ledger entry the
// Allocator recorded, the kubelet's PodResources and the API must agree. See plugin_core.h.
#include <algorithm>

#include "deviceplugin/identity.h"
#include "deviceplugin/plugin_core.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {
std::vector<LedgerEntry> PluginCore::Ledger() const { return ledger_.Entries(); }

absl::Status PluginCore::PreStartContainer(const std::vector<std::string>& device_ids) {
  const std::optional<LedgerEntry> entry = ledger_.Find(DeviceKey(device_ids));
  const absl::StatusOr<PodResourcesList> kubelet =
      ops_.pod_resources != nullptr
          ? ops_.pod_resources->List()
          : absl::FailedPreconditionError("no PodResources endpoint is configured");
  absl::StatusOr<std::vector<PodMig>> pods = ops_.ListPods();
  const IdentityVerdict verdict =
      CheckIdentity(device_ids, entry ? &*entry : nullptr, kubelet, options_.resource_name, pods);
  if (verdict.ok()) {
    spdlog::info("PreStartContainer {}: proven to be pod {} container {}",
                 fmt::join(device_ids, ","), entry->PodKey(), entry->container);
    return absl::OkStatus();
  }
  ops_.metrics.PreStartRefused(verdict.reason);
  const std::string message =
      fmt::format("the container does not start: {} (nothing was destroyed)", verdict.message);
  spdlog::warn("PreStartContainer refused ({}): {}", verdict.reason, message);
  if (pods.ok()) {
    for (const auto& key : verdict.pods) {
      for (const auto& p : *pods) {
        if (p.key == key) ops_.Event(&p, "Warning", kReasonIdentityMismatch, message);
      }
    }
  }
  if (verdict.reason == kIdentityKubeletUnreachable || verdict.reason == kIdentityApiUnreachable) {
    return absl::UnavailableError(message);
  }
  return absl::FailedPreconditionError(message);
}

}  // namespace dynmig::deviceplugin
