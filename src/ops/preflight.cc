#include "ops/preflight.h"

#include "common/strings.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "protocol/annotations.h"
#include "protocol/node_register.h"
#include "protocol/pod_request.h"

namespace dynmig::ops {
namespace {

using kube::Object;

// Names and images of every container (init containers included).
std::vector<std::pair<std::string, std::string>> ContainerNamesAndImages(const Object& pod) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Object* c : IndexedContainers(pod)) {
    if (!c->is_object()) continue;
    out.emplace_back(c->value("name", ""), c->value("image", ""));
  }
  return out;
}

void CheckDeviceConfig(const absl::StatusOr<DeviceConfigSource>& source, CheckReport& report) {
  if (!source.ok()) {
    if (source.status().code() == absl::StatusCode::kFailedPrecondition) {
      report.Add("device-config", "", CheckStatus::kWarn, std::string(source.status().message()));
      return;
    }
    report.Add(
        "device-config", "", CheckStatus::kFail,
        fmt::format("cannot read the device config: {}", std::string(source.status().message())));
    return;
  }
  if (!source->found) {
    report.Add("device-config", "", CheckStatus::kWarn,
               "no scheduler device config found (no ConfigMap in any namespace has a "
               "device-config.yaml key); pass --device-config FILE to check one",
               {"the built-in default allowlist would apply: dynmig config default prints it"});
    return;
  }
  if (!source->config.ok()) {
    report.Add("device-config", "", CheckStatus::kFail,
               fmt::format("{} does not parse", source->origin),
               {std::string(source->config.status().message())});
    return;
  }
  const protocol::DeviceConfig& cfg = *source->config;
  if (!cfg.legacy_geometries.empty()) {
    std::vector<std::string> evidence;
    for (size_t i = 0; i < cfg.legacy_geometries.size(); ++i) {
      const auto& e = cfg.legacy_geometries[i];
      evidence.push_back(fmt::format("nvidia.knownMigGeometries[{}]: models {} with {} geometries",
                                     i, fmt::join(e.models, ", "), e.geometries.size()));
    }
    evidence.push_back(
        "convert it: dynmig config migrate --in OLD.yaml --out NEW.yaml, then update the "
        "ConfigMap");
    report.Add("device-config", "", CheckStatus::kFail,
               fmt::format("{} still holds knownMigGeometries ({} entries)", source->origin,
                           cfg.legacy_geometries.size()),
               std::move(evidence));
    return;
  }
  if (cfg.allowlist.entries.empty()) {
    report.Add("device-config", "", CheckStatus::kFail,
               fmt::format("{} has no migProfileAllowlist: no MIG profile would be offered",
                           source->origin));
    return;
  }
  std::vector<std::string> evidence;
  for (const auto& e : cfg.allowlist.entries) {
    evidence.push_back(
        fmt::format("{}: {}", fmt::join(e.models, ", "), fmt::join(e.profiles, ", ")));
  }
  report.Add("device-config", "", CheckStatus::kPass,
             fmt::format("{} has a migProfileAllowlist ({} entries) and no knownMigGeometries",
                         source->origin, cfg.allowlist.entries.size()),
             std::move(evidence));
}

}  // namespace

bool IsLegacySchedulerPod(const Object& pod) {
  if (IsTerminated(pod)) return false;
  auto mentions = [](std::string_view s) {
    return ContainsIgnoreCase(s, "hami-scheduler") || ContainsIgnoreCase(s, "vgpu-scheduler");
  };
  bool legacy = mentions(kube::Name(pod));
  bool dynmig = ContainsIgnoreCase(kube::Name(pod), "dynmig");
  for (const auto& [name, image] : ContainerNamesAndImages(pod)) {
    legacy = legacy || mentions(name) || mentions(image);
    dynmig = dynmig || ContainsIgnoreCase(image, "dynmig");
  }
  for (const auto& [k, v] : kube::Labels(pod)) {
    dynmig = dynmig || ContainsIgnoreCase(v, "dynmig");
  }
  return legacy && !dynmig;
}

bool IsMigManagerPod(const Object& pod) {
  if (ContainsIgnoreCase(kube::Name(pod), "mig-manager")) return true;
  for (const auto& [name, image] : ContainerNamesAndImages(pod)) {
    if (ContainsIgnoreCase(image, "mig-manager")) return true;
  }
  return false;
}

absl::StatusOr<CheckReport> RunPreflight(kube::KubeClient& client, const PreflightOptions& options,
                                         absl::Time now) {
  auto snap = TakeSnapshot(client, now);
  if (!snap.ok()) return snap.status();
  const auto config = FindDeviceConfig(client, options.config);
  const bool named = !options.config.file.empty() || !options.config.configmap_name.empty();
  if (!config.ok() && named) return config.status();
  std::vector<const Object*> nodes;
  if (!options.node.empty()) {
    const Object* n = snap->FindNode(options.node);
    if (n == nullptr)
      return absl::NotFoundError(fmt::format("node \"{}\" not found", options.node));
    nodes.push_back(n);
  } else {
    for (const auto& n : snap->nodes) {
      if (IsGpuNode(n)) nodes.push_back(&n);
    }
  }
  CheckReport report;
  report.command = "preflight";
  if (nodes.empty()) {
    report.Add("gpu-nodes", "", CheckStatus::kWarn,
               "no GPU node found (no node has the register annotation, an nvidia.com/mig* label "
               "or nvidia.com/gpu capacity); name one with --node");
  }
  protocol::ResourceNames resources;
  for (const Object* node : nodes) {
    const std::string name = kube::Name(*node);
    std::vector<const Object*> on_node;
    for (const auto& p : snap->pods) {
      if (!IsTerminated(p) && PodNode(p) == name) on_node.push_back(&p);
    }

    // Legacy pods.
    std::vector<std::string> legacy;
    for (const Object* p : on_node) {
      for (const auto& id : LegacyIdentities(*p)) legacy.push_back(PodKey(*p) + ": " + id);
    }
    if (legacy.empty()) {
      report.Add("legacy-pods", name, CheckStatus::kPass,
                 "no active pod holds a legacy GPU-uuid[template-slot] identity");
    } else {
      legacy.push_back(
          "legacy identities cannot be adopted (the index does not prove a "
          "placement): drain these pods");
      report.Add("legacy-pods", name, CheckStatus::kFail,
                 fmt::format("{} legacy MIG identities on active pods", legacy.size() - 1),
                 std::move(legacy));
    }

    // Register format.
    const auto reg = kube::Annotation(*node, protocol::kNodeRegisterAnnotation);
    if (!reg) {
      report.Add("register-format", name, CheckStatus::kPass,
                 "no hami.io/node-nvidia-register annotation (no HAMi device plugin registered)");
    } else if (auto findings = protocol::DetectLegacyNodeRegister(*reg); !findings.empty()) {
      findings.push_back(
          "a legacy device plugin still publishes this node: upgrade it (step 6) "
          "after the scheduler");
      report.Add("register-format", name, CheckStatus::kFail,
                 "hami.io/node-nvidia-register is in the legacy template format",
                 std::move(findings));
    } else {
      auto decoded = protocol::DecodeNodeRegister(*reg);
      report.Add("register-format", name, CheckStatus::kPass,
                 decoded.ok() ? fmt::format("hami.io/node-nvidia-register is in the current format "
                                            "({} devices)",
                                            decoded->size())
                              : "hami.io/node-nvidia-register is in the current format");
    }

    // MIG Manager.
    const auto labels = MigLabels(*node);
    const auto deploy = kube::Label(*node, "nvidia.com/gpu.deploy.mig-manager");
    std::vector<std::string> evidence;
    for (const auto& [k, v] : labels) evidence.push_back(fmt::format("label {}={}", k, v));
    if (deploy)
      evidence.push_back(fmt::format("label nvidia.com/gpu.deploy.mig-manager={}", *deploy));
    std::vector<std::string> managers;
    for (const Object* p : on_node) {
      if (IsMigManagerPod(*p)) managers.push_back(PodLine(*p));
    }
    for (const auto& m : managers) evidence.push_back("MIG Manager pod running here: " + m);
    const bool has_config_label = labels.count("nvidia.com/mig.config") > 0;
    const bool disabled = deploy && *deploy == "false";
    if (!managers.empty()) {
      evidence.push_back(
          "stop MIG Manager reconciliation on this node (GPU Operator: label "
          "nvidia.com/gpu.deploy.mig-manager=false); deleting its pod once is not "
          "enough");
      report.Add("mig-manager", name, CheckStatus::kFail,
                 "NVIDIA MIG Manager is running on the node", std::move(evidence));
    } else if (has_config_label && !disabled) {
      evidence.push_back(
          "MIG Manager would reapply this geometry when it runs: disable it here "
          "(nvidia.com/gpu.deploy.mig-manager=false) and remove the label");
      report.Add("mig-manager", name, CheckStatus::kFail,
                 fmt::format("nvidia.com/mig.config={} and MIG Manager is not disabled on the node",
                             labels.at("nvidia.com/mig.config")),
                 std::move(evidence));
    } else if (has_config_label) {
      report.Add("mig-manager", name, CheckStatus::kWarn,
                 "MIG Manager is disabled here, but the nvidia.com/mig.config label is left behind "
                 "(remove it so nothing reapplies the geometry)",
                 std::move(evidence));
    } else {
      report.Add("mig-manager", name, CheckStatus::kPass,
                 "no MIG Manager pod on the node and no nvidia.com/mig.config label",
                 std::move(evidence));
    }

    // Cordon.
    if (IsCordoned(*node)) {
      report.Add("cordoned", name, CheckStatus::kPass, "the node is cordoned (spec.unschedulable)");
    } else {
      report.Add("cordoned", name, CheckStatus::kFail,
                 "the node is schedulable: new legacy allocations can still land on it",
                 {fmt::format("kubectl cordon {}", name)});
    }

    // GPU workloads.
    std::vector<std::string> workloads;
    for (const Object* p : on_node) {
      if (protocol::RequestsGpuResources(*p, resources) ||
          kube::Annotation(*p, protocol::kMigAllocationsAnnotation) ||
          kube::Annotation(*p, protocol::kDevicesAllocatedAnnotation)) {
        workloads.push_back(PodLine(*p));
      }
    }
    if (workloads.empty()) {
      report.Add("gpu-workloads", name, CheckStatus::kPass, "no active GPU workload on the node");
    } else {
      const size_t n = workloads.size();
      workloads.push_back(fmt::format(
          "drain them: kubectl drain {} --ignore-daemonsets (confirm no GPU process must be "
          "preserved)",
          name));
      report.Add("gpu-workloads", name, CheckStatus::kFail,
                 fmt::format("{} active GPU workload{} on the node", n, n == 1 ? "" : "s"),
                 std::move(workloads));
    }
  }

  // Cluster-wide: legacy scheduler.
  std::vector<std::string> schedulers;
  for (const auto& p : snap->pods) {
    if (!IsLegacySchedulerPod(p)) continue;
    std::vector<std::string> images;
    for (const auto& [n, image] : ContainerNamesAndImages(p)) images.push_back(image);
    schedulers.push_back(fmt::format("{} images {}", PodLine(p), fmt::join(images, ", ")));
  }
  if (schedulers.empty()) {
    report.Add("legacy-scheduler", "", CheckStatus::kPass,
               "no legacy HAMi scheduler pod is running (heuristic: names and images containing "
               "hami-scheduler or vgpu-scheduler, not dynmig)");
  } else {
    schedulers.push_back(
        "upgrade the scheduler (step 5) before any device plugin: a legacy "
        "scheduler writes template/slot identities the current plugin refuses");
    report.Add("legacy-scheduler", "", CheckStatus::kFail,
               fmt::format("{} legacy scheduler pod{} still serving", schedulers.size() - 1,
                           schedulers.size() == 2 ? "" : "s"),
               std::move(schedulers));
  }
  CheckDeviceConfig(config, report);
  return report;
}

}  // namespace dynmig::ops
