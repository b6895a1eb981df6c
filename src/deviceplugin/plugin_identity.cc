// Whom the plugin serves: the ledger of served Allocates, the check of the lock owner before an
// Allocate is served, and PreStartContainer's proof (identity.h). See plugin_core.h.
#include <algorithm>

#include "deviceplugin/identity.h"
#include "deviceplugin/plugin_core.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {
namespace {

// The name of container `index` (init containers first, then app containers), and whether it is
// an init container; "" when the spec has no such container.
std::pair<std::string, bool> ContainerName(const kube::Object& pod, int index) {
  auto spec = pod.find("spec");
  if (spec == pod.end() || !spec->is_object()) return {"", false};
  for (const char* list : {"initContainers", "containers"}) {
    auto l = spec->find(list);
    if (l == spec->end() || !l->is_array()) continue;
    if (index < static_cast<int>(l->size())) {
      const auto& c = (*l)[index];
      const bool init = std::string_view(list) == "initContainers";
      if (!c.is_object() || !c.contains("name") || !c["name"].is_string()) return {"", init};
      return {c["name"].get<std::string>(), init};
    }
    index -= static_cast<int>(l->size());
  }
  return {"", false};
}

}  // namespace

void PluginCore::RecordLedger(const std::vector<std::string>& device_ids, const PodMig& pod,
                              int container, const std::vector<ManagedInstance>& instances) {
  LedgerEntry e;
  e.device_ids = DeviceKey(device_ids);
  e.pod_uid = pod.uid;
  e.ns = pod.ns;
  e.name = pod.name;
  std::tie(e.container, e.init_container) = ContainerName(pod.pod, container);
  e.container_index = container;
  for (const auto& m : instances) e.mig_uuids.push_back(m.mig_uuid);
  e.since = NowUnix();
  ledger_.Record(std::move(e));
}

bool PluginCore::PruneLedger(const std::vector<PodMig>& pods) {
  std::set<std::string> live;
  for (const auto& p : pods) {
    if (!p.terminated) live.insert(p.uid);
  }
  return ledger_.Prune(live);
}

std::vector<LedgerEntry> PluginCore::Ledger() const { return ledger_.Entries(); }

absl::Status PluginCore::KubeletKnows(const PodMig& pod) {
  if (pod_resources_ == nullptr) return absl::OkStatus();
  auto listed = pod_resources_->List();
  if (!listed.ok()) {
    spdlog::warn(
        "cannot check that the kubelet knows pod {} before serving it ({}); "
        "PreStartContainer will prove it",
        pod.key, std::string(listed.status().message()));
    return absl::OkStatus();
  }
  for (const auto& p : *listed) {
    if (p.ns == pod.ns && p.name == pod.name) return absl::OkStatus();
  }
  return absl::FailedPreconditionError(fmt::format(
      "this Allocate is not for pod {}, which holds the node lock: the kubelet ({}) does not list "
      "it, and the kubelet always knows the pod it admits; refused, the lock is kept for its "
      "owner (a pod that reached node {} around the scheduler asked for its devices?)",
      pod.key, pod_resources_->Describe(), options_.node_name));
}

absl::Status PluginCore::PreStartContainer(const std::vector<std::string>& device_ids) {
  const std::optional<LedgerEntry> entry = ledger_.Find(DeviceKey(device_ids));
  const absl::StatusOr<PodResourcesList> kubelet =
      pod_resources_ != nullptr
          ? pod_resources_->List()
          : absl::FailedPreconditionError("no PodResources endpoint is configured");
  absl::StatusOr<std::vector<PodMig>> pods = ListPods();
  const IdentityVerdict verdict =
      CheckIdentity(device_ids, entry ? &*entry : nullptr, kubelet, options_.resource_name, pods);
  if (verdict.ok()) {
    spdlog::info("PreStartContainer {}: proven to be pod {} container {}",
                 fmt::join(device_ids, ","), entry->PodKey(), entry->container);
    return absl::OkStatus();
  }
  metrics_.PreStartRefused(verdict.reason);
  const std::string message =
      fmt::format("the container does not start: {} (nothing was destroyed)", verdict.message);
  spdlog::warn("PreStartContainer refused ({}): {}", verdict.reason, message);
  if (pods.ok()) {
    for (const auto& key : verdict.pods) {
      for (const auto& p : *pods) {
        if (p.key == key) Event(&p, "Warning", kReasonIdentityMismatch, message);
      }
    }
  }
  if (verdict.reason == kIdentityKubeletUnreachable || verdict.reason == kIdentityApiUnreachable) {
    return absl::UnavailableError(message);
  }
  return absl::FailedPreconditionError(message);
}

}  // namespace dynmig::deviceplugin
