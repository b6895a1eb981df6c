#include "ops/preflight.h"

#include "common/strings.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "ops/checks.h"
#include "ops/handover.h"
#include "ops/validate.h"
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

}  // namespace

bool IsLegacySchedulerPod(const Object& pod) {
  if (kube::IsTerminated(pod)) return false;
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

namespace checks {

bool RegisterFormat(const CheckInput& in, CheckReport& report) {
  const auto reg = kube::Annotation(*in.node, protocol::kNodeRegisterAnnotation);
  if (!reg) {
    report.Add("register-format", in.node_name, CheckStatus::kPass,
               fmt::format("no {} annotation (no HAMi device plugin registered)",
                           protocol::kNodeRegisterAnnotation));
  } else if (auto findings = protocol::DetectLegacyNodeRegister(*reg); !findings.empty()) {
    findings.push_back(
        "a legacy device plugin still publishes this node: upgrade it (step 6) "
        "after the scheduler");
    report.Add(
        "register-format", in.node_name, CheckStatus::kFail,
        fmt::format("{} is in the legacy template format", protocol::kNodeRegisterAnnotation),
        std::move(findings));
  } else {
    auto decoded = protocol::DecodeNodeRegister(*reg);
    report.Add("register-format", in.node_name, CheckStatus::kPass,
               decoded.ok()
                   ? fmt::format("{} is in the current format ({} devices)",
                                 protocol::kNodeRegisterAnnotation, decoded->size())
                   : fmt::format("{} is in the current format", protocol::kNodeRegisterAnnotation));
  }
  return true;
}

bool MigManager(const CheckInput& in, CheckReport& report) {
  const std::string& name = in.node_name;
  const auto labels = MigLabels(*in.node);
  const auto deploy = kube::Label(*in.node, protocol::kMigManagerDeployLabel);
  std::vector<std::string> evidence;
  for (const auto& [k, v] : labels) evidence.push_back(fmt::format("label {}={}", k, v));
  if (deploy) {
    evidence.push_back(fmt::format("label {}={}", protocol::kMigManagerDeployLabel, *deploy));
  }
  std::vector<std::string> managers;
  for (const Object* p : in.pods) {
    if (IsMigManagerPod(*p)) managers.push_back(PodLine(*p));
  }
  for (const auto& m : managers) evidence.push_back("MIG Manager pod running here: " + m);
  const auto config = labels.find(std::string(protocol::kMigConfigLabel));
  const bool disabled = deploy && *deploy == "false";
  if (!managers.empty()) {
    evidence.push_back(
        fmt::format("stop MIG Manager reconciliation on this node (GPU Operator: label "
                    "{}=false); deleting its pod once is not enough",
                    protocol::kMigManagerDeployLabel));
    report.Add("mig-manager", name, CheckStatus::kFail, "NVIDIA MIG Manager is running on the node",
               std::move(evidence));
  } else if (config != labels.end() && !disabled) {
    evidence.push_back(
        fmt::format("MIG Manager would reapply this geometry when it runs: disable it here "
                    "({}=false) and remove the label",
                    protocol::kMigManagerDeployLabel));
    report.Add("mig-manager", name, CheckStatus::kFail,
               fmt::format("{}={} and MIG Manager is not disabled on the node",
                           protocol::kMigConfigLabel, config->second),
               std::move(evidence));
  } else if (config != labels.end()) {
    report.Add("mig-manager", name, CheckStatus::kWarn,
               fmt::format("MIG Manager is disabled here, but the {} label is left behind "
                           "(remove it so nothing reapplies the geometry)",
                           protocol::kMigConfigLabel),
               std::move(evidence));
  } else {
    report.Add(
        "mig-manager", name, CheckStatus::kPass,
        fmt::format("no MIG Manager pod on the node and no {} label", protocol::kMigConfigLabel),
        std::move(evidence));
  }
  return true;
}

bool GpuWorkloads(const CheckInput& in, CheckReport& report) {
  const protocol::ResourceNames resources;
  // Legacy pods a no-drain handover proves stay: they are not workloads to drain.
  std::set<const Object*> handed_over;
  if (in.handover != nullptr && !in.handover->blocked()) {
    for (const auto& p : in.handover->legacy_pods) handed_over.insert(p.pod);
  }
  std::set<const Object*> legacy;  // both legacy worlds (NVIDIA's MIG resources are not HAMi's)
  for (const auto& p : FindLegacyPods(in.pods)) legacy.insert(p.pod);
  std::vector<std::string> workloads;
  for (const Object* p : in.pods) {
    if (handed_over.count(p)) continue;
    if (protocol::RequestsGpuResources(*p, resources) || legacy.count(p) ||
        kube::Annotation(*p, protocol::kMigAllocationsAnnotation) ||
        kube::Annotation(*p, protocol::kDevicesAllocatedAnnotation)) {
      workloads.push_back(PodLine(*p));
    }
  }
  if (workloads.empty()) {
    report.Add("gpu-workloads", in.node_name, CheckStatus::kPass,
               handed_over.empty()
                   ? "no active GPU workload on the node"
                   : fmt::format("no active GPU workload on the node beside the {} legacy pods "
                                 "the no-drain handover proves",
                                 handed_over.size()));
    return true;
  }
  const size_t n = workloads.size();
  workloads.push_back(fmt::format(
      "drain them: kubectl drain {} --ignore-daemonsets (confirm no GPU process must be "
      "preserved)",
      in.node_name));
  report.Add("gpu-workloads", in.node_name, CheckStatus::kFail,
             fmt::format("{} active GPU workload{} on the node", n, n == 1 ? "" : "s"),
             std::move(workloads));
  return true;
}

bool LegacyScheduler(const CheckInput& in, CheckReport& report) {
  std::vector<std::string> schedulers;
  for (const auto& p : in.snapshot->pods) {
    if (!IsLegacySchedulerPod(p)) continue;
    std::vector<std::string> images;
    for (const auto& [n, image] : ContainerNamesAndImages(p)) images.push_back(image);
    schedulers.push_back(fmt::format("{} images {}", PodLine(p), fmt::join(images, ", ")));
  }
  if (schedulers.empty()) {
    report.Add("legacy-scheduler", "", CheckStatus::kPass,
               "no legacy HAMi scheduler pod is running (heuristic: names and images containing "
               "hami-scheduler or vgpu-scheduler, not dynmig)");
    return true;
  }
  schedulers.push_back(
      "upgrade the scheduler (step 5) before any device plugin: a legacy "
      "scheduler writes template/slot identities the current plugin refuses");
  report.Add("legacy-scheduler", "", CheckStatus::kFail,
             fmt::format("{} legacy scheduler pod{} still serving", schedulers.size() - 1,
                         schedulers.size() == 2 ? "" : "s"),
             std::move(schedulers));
  return true;
}

bool DeviceConfigCheck(const CheckInput& in, CheckReport& report) {
  const absl::StatusOr<DeviceConfigSource>& source = *in.config_source;
  if (!source.ok()) {
    if (source.status().code() == absl::StatusCode::kFailedPrecondition) {
      report.Add("device-config", "", CheckStatus::kWarn, std::string(source.status().message()));
      return true;
    }
    report.Add(
        "device-config", "", CheckStatus::kFail,
        fmt::format("cannot read the device config: {}", std::string(source.status().message())));
    return true;
  }
  if (!source->found) {
    report.Add("device-config", "", CheckStatus::kWarn,
               "no scheduler device config found (no ConfigMap in any namespace has a "
               "device-config.yaml key); pass --device-config FILE to check one",
               {"the built-in default allowlist would apply: dynmig config default prints it"});
    return true;
  }
  if (!source->config.ok()) {
    report.Add("device-config", "", CheckStatus::kFail,
               fmt::format("{} does not parse", source->origin),
               {std::string(source->config.status().message())});
    return true;
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
    return true;
  }
  if (cfg.allowlist.entries.empty()) {
    report.Add("device-config", "", CheckStatus::kFail,
               fmt::format("{} has no migProfileAllowlist: no MIG profile would be offered",
                           source->origin));
    return true;
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
  return true;
}

}  // namespace checks

absl::StatusOr<CheckReport> RunPreflight(kube::KubeClient& client, NvmlSource* nvml,
                                         const PreflightOptions& options, absl::Time now) {
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
               fmt::format("no GPU node found (no node has the register annotation, an {}* label "
                           "or {} capacity); name one with --node",
                           protocol::kMigLabelPrefix, protocol::kResourceCount));
  }
  CheckInput in;
  in.snapshot = &*snap;
  in.config_source = &config;
  in.schedulable_risk = "new legacy allocations can still land on it";
  const protocol::DeviceConfig effective =
      config.ok() ? EffectiveConfig(*config) : protocol::DeviceConfig{};
  for (const Object* node : nodes) {
    in.node = node;
    in.node_name = kube::Name(*node);
    in.pods = ActivePodsOn(*snap, in.node_name);
    // The no-drain handover plan, read only where legacy pods run (no endpoint: none).
    std::optional<HandoverPlan> plan;
    if (nvml != nullptr && !FindLegacyPods(in.pods).empty()) {
      NodeNvml nv;
      NvmlResult r = FetchNvmlView(*nvml, *node);
      nv.url = r.url;
      nv.view = std::move(r.view);
      plan = PlanHandover(*node, in.pods, nv, effective);
    }
    in.handover = plan ? &*plan : nullptr;
    RunChecks(CheckCommand::kPreflight, CheckScope::kNode, in, report);
    in.handover = nullptr;
  }
  RunChecks(CheckCommand::kPreflight, CheckScope::kCluster, in, report);
  return report;
}

}  // namespace dynmig::ops
