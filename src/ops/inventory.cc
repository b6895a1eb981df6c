#include "ops/inventory.h"

#include <filesystem>
#include <fstream>
#include <system_error>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "protocol/annotations.h"
#include "protocol/idle_instances.h"
#include "protocol/mig_allocations.h"
#include "protocol/node_register.h"
#include "protocol/pod_request.h"

namespace dynmig::ops {

std::string BackupFileName(std::string_view s) {
  std::string out;
  for (char c : s) {
    out +=
        (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_') ? c : '_';
  }
  return out.empty() ? "_" : out;
}

namespace {

namespace fs = std::filesystem;
using kube::Object;
using nlohmann::json;

absl::Status WriteFile(const fs::path& path, const std::string& content) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) {
    return absl::PermissionDeniedError(
        fmt::format("cannot create {}: {}", path.parent_path().string(), ec.message()));
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << content;
  f.close();
  if (!f) return absl::InternalError(fmt::format("cannot write {}", path.string()));
  return absl::OkStatus();
}

bool IsMigManagerConfig(const Object& cm) {
  const auto data = cm.find("data");
  if (data == cm.end() || !data->is_object()) return false;
  for (const auto& [k, v] : data->items()) {
    if (v.is_string() && v.get<std::string>().find("mig-configs:") != std::string::npos) {
      return true;
    }
  }
  return false;
}

json PodRecord(const Object& pod, const protocol::ResourceNames& resources) {
  json rec = {{"namespace", kube::Namespace(pod)},
              {"name", kube::Name(pod)},
              {"uid", kube::Uid(pod)},
              {"node", PodNode(pod)},
              {"phase", kube::Phase(pod)},
              {"bindPhase", kube::Annotation(pod, protocol::kBindPhaseAnnotation).value_or("")},
              {"legacyIdentities", LegacyIdentities(pod)}};
  if (auto v = kube::Annotation(pod, protocol::kMigAllocationsAnnotation)) {
    rec["allocationsRaw"] = *v;
    auto allocs = protocol::DecodeMigAllocations(*v);
    if (allocs.ok()) {
      rec["allocations"] = json::parse(protocol::EncodeMigAllocations(*allocs));
    } else {
      rec["allocationsError"] = std::string(allocs.status().message());
    }
  }
  for (auto [key, field] :
       {std::pair{protocol::kDevicesAllocatedAnnotation, "devicesAllocated"},
        std::pair{protocol::kDevicesToAllocateAnnotation, "devicesToAllocate"}}) {
    if (auto v = kube::Annotation(pod, key)) rec[field] = *v;
  }
  if (auto v = kube::Annotation(pod, kVisibleDevicesAnnotation)) rec["visibleDevices"] = *v;
  auto request = protocol::ParsePodRequest(pod, resources);
  if (request.ok()) {
    json cs = json::array();
    for (const auto& c : request->containers) {
      if (c.count == 0) continue;
      cs.push_back({{"name", c.name},
                    {"count", c.count},
                    {"memoryMiB", c.memory.mib},
                    {"memoryPercent", c.memory.percent}});
    }
    rec["requests"] = cs;
  } else {
    rec["requestError"] = std::string(request.status().message());
  }
  return rec;
}

}  // namespace

absl::StatusOr<CommandOutput> RunInventory(kube::KubeClient& client, NvmlSource* nvml,
                                           const InventoryOptions& options, absl::Time now) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("--out: a directory is required");
  const fs::path dir(options.out_dir);
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) {
      return absl::FailedPreconditionError(
          fmt::format("--out {}: exists and is not a directory", options.out_dir));
    }
    if (!fs::is_empty(dir, ec) && !options.force) {
      return absl::FailedPreconditionError(fmt::format(
          "--out {}: the directory is not empty; choose a new one or pass --force to overwrite",
          options.out_dir));
    }
  }
  auto snap = TakeSnapshot(client, now);
  if (!snap.ok()) return snap.status();

  std::vector<std::string> files;
  std::vector<std::string> summary;
  auto write = [&](const std::string& rel, const json& doc) -> absl::Status {
    auto st = WriteFile(dir / rel, doc.dump(2) + "\n");
    if (st.ok()) files.push_back(rel);
    return st;
  };

  // ConfigMaps.
  std::vector<Object> configmaps;
  std::vector<std::string> cm_names;
  if (!options.config.configmap_name.empty()) {
    const std::string ns =
        options.config.configmap_ns.empty() ? "kube-system" : options.config.configmap_ns;
    auto cm = client.Get(kube::Resource::kConfigMaps, ns, options.config.configmap_name);
    if (!cm.ok()) {
      return absl::Status(cm.status().code(), fmt::format("device config ConfigMap {}/{}: {}", ns,
                                                          options.config.configmap_name,
                                                          std::string(cm.status().message())));
    }
    configmaps.push_back(*cm);
  }
  auto listed = client.List(kube::Resource::kConfigMaps, {.ns = "", .limit = 500});
  if (!listed.ok()) return listed.status();
  for (const auto& cm : listed->items) {
    const auto data = cm.find("data");
    const bool device_config = options.config.configmap_name.empty() && data != cm.end() &&
                               data->is_object() && data->contains(std::string(kDeviceConfigKey));
    if (device_config || IsMigManagerConfig(cm)) configmaps.push_back(cm);
  }
  for (const auto& cm : configmaps) {
    const std::string rel =
        fmt::format("configmaps/{}_{}.json", BackupFileName(kube::Namespace(cm)),
                    BackupFileName(kube::Name(cm)));
    if (std::find(files.begin(), files.end(), rel) != files.end()) continue;
    if (auto st = write(rel, cm); !st.ok()) return st;
    const bool legacy = [&] {
      const auto data = cm.find("data");
      if (data == cm.end() || !data->contains(std::string(kDeviceConfigKey))) return false;
      const auto& v = (*data)[std::string(kDeviceConfigKey)];
      return v.is_string() && v.get<std::string>().find("knownMigGeometries") != std::string::npos;
    }();
    cm_names.push_back(kube::ObjectKey(cm));
    summary.push_back(fmt::format("  ConfigMap {}{}{}", kube::ObjectKey(cm),
                                  IsMigManagerConfig(cm) ? " (MIG Manager config)" : "",
                                  legacy ? " (holds knownMigGeometries)" : ""));
  }
  if (configmaps.empty()) {
    summary.push_back("  no ConfigMap with a device-config.yaml key or MIG Manager config found");
  }

  // Nodes and their NVML views.
  size_t gpu_nodes = 0, reachable = 0;
  std::vector<std::string> unreachable;
  std::vector<std::string> node_lines;
  for (const auto& node : snap->nodes) {
    if (!IsGpuNode(node)) continue;
    ++gpu_nodes;
    const std::string name = kube::Name(node);
    json annotations = json::object();
    for (const auto& [k, v] : kube::Annotations(node)) {
      if (k.rfind("hami.io/", 0) == 0) annotations[k] = v;
    }
    json labels = json::object();
    for (const auto& [k, v] : kube::Labels(node)) {
      if (k.rfind("nvidia.com/mig", 0) == 0 || k.rfind("nvidia.com/gpu", 0) == 0) labels[k] = v;
    }
    json rec = {{"name", name},
                {"cordoned", IsCordoned(node)},
                {"address", NodeAddress(node)},
                {"annotations", annotations},
                {"labels", labels}};
    // The GPU resources the kubelet reports (nvidia.com/*): what a rollback must see registered
    // again.
    for (const char* field : {"capacity", "allocatable"}) {
      json resources = json::object();
      const auto status = node.find("status");
      if (status != node.end() && status->is_object() && status->contains(field) &&
          (*status)[field].is_object()) {
        for (const auto& [k, v] : (*status)[field].items()) {
          if (k.rfind("nvidia.com/", 0) == 0 && v.is_string()) resources[k] = v;
        }
      }
      rec[field] = resources;
    }
    std::string register_note = "no register annotation";
    if (auto reg = kube::Annotation(node, protocol::kNodeRegisterAnnotation)) {
      const auto legacy = protocol::DetectLegacyNodeRegister(*reg);
      rec["registerLegacyFormat"] = legacy;
      if (!legacy.empty()) {
        register_note = "legacy register format";
      } else if (auto devices = protocol::DecodeNodeRegister(*reg); devices.ok()) {
        json devs = json::array();
        for (const auto& d : *devices) {
          std::vector<std::string> profiles;
          for (const auto& p : d.mig_profiles) profiles.push_back(p.name);
          devs.push_back({{"uuid", d.id},
                          {"index", d.index},
                          {"type", d.type},
                          {"mode", d.mode},
                          {"health", d.health},
                          {"migProfiles", profiles}});
        }
        rec["registerDevices"] = devs;
        register_note = fmt::format("{} registered GPUs", devices->size());
      } else {
        rec["registerError"] = std::string(devices.status().message());
        register_note = "unreadable register annotation";
      }
    }
    // Idle (warm) instances the device plugin keeps (dynmig.io/idle-mig-instances).
    if (auto idle = kube::Annotation(node, protocol::kNodeIdleInstancesAnnotation)) {
      rec["idleMigInstancesAnnotation"] = *idle;
      if (auto decoded = protocol::DecodeIdleInstances(*idle); decoded.ok()) {
        if (!decoded->empty())
          register_note += fmt::format(", {} idle instance(s)", decoded->size());
        json list = json::array();
        for (const auto& i : *decoded) {
          list.push_back({{"gpuUUID", i.gpu_uuid},
                          {"profile", i.profile},
                          {"placement", {{"start", i.placement.start}, {"size", i.placement.size}}},
                          {"idleSince", i.idle_since}});
        }
        rec["idleMigInstances"] = list;
      } else {
        rec["idleMigInstancesError"] = std::string(decoded.status().message());
      }
    }
    if (auto st = write(fmt::format("nodes/{}.json", BackupFileName(name)), rec); !st.ok())
      return st;

    std::string nvml_note = "NVML view not fetched (no endpoint)";
    if (nvml != nullptr) {
      NvmlResult r = FetchNvmlView(*nvml, node);
      json doc = {{"node", name}, {"url", r.url}, {"fetchedAt", kube::Rfc3339(now)}};
      if (r.document.ok()) {
        doc["reachable"] = true;
        doc["view"] = *r.document;
        if (!r.view.ok()) doc["parseError"] = std::string(r.view.status().message());
        ++reachable;
        nvml_note = "NVML view saved";
      } else {
        doc["reachable"] = false;
        doc["error"] = std::string(r.document.status().message());
        unreachable.push_back(name);
        nvml_note =
            fmt::format("NVML view UNREACHABLE ({})", std::string(r.document.status().message()));
      }
      if (auto st = write(fmt::format("nvml/{}.json", BackupFileName(name)), doc); !st.ok())
        return st;
    }
    const auto mig_labels = MigLabels(node);
    node_lines.push_back(fmt::format(
        "  {}{}: {}; {}{}", name, IsCordoned(node) ? " (cordoned)" : "", register_note, nvml_note,
        mig_labels.count("nvidia.com/mig.config")
            ? fmt::format("; nvidia.com/mig.config={}", mig_labels.at("nvidia.com/mig.config"))
            : ""));
  }

  // Active MIG pods.
  const protocol::ResourceNames resources;
  json pods = json::array();
  size_t legacy_pods = 0;
  std::vector<std::string> pod_lines;
  for (const auto& pod : snap->pods) {
    if (IsTerminated(pod)) continue;
    const bool mig = protocol::IsMigPod(pod, resources) ||
                     kube::Annotation(pod, protocol::kMigAllocationsAnnotation) ||
                     !LegacyIdentities(pod).empty();
    if (!mig) continue;
    json rec = PodRecord(pod, resources);
    if (!rec["legacyIdentities"].empty()) ++legacy_pods;
    pod_lines.push_back(fmt::format(
        "  {} on {} ({}){}", PodKey(pod), PodNode(pod).empty() ? "no node" : PodNode(pod),
        kube::Phase(pod), rec["legacyIdentities"].empty() ? "" : ": LEGACY identity"));
    pods.push_back(std::move(rec));
  }
  if (auto st = write("mig-pods.json", {{"takenAt", kube::Rfc3339(now)}, {"pods", pods}});
      !st.ok()) {
    return st;
  }

  std::string text = fmt::format("dynmig inventory, {}\n\n", kube::Rfc3339(now));
  text += fmt::format("Device config and MIG Manager ConfigMaps ({}):\n", configmaps.size());
  for (const auto& l : summary) text += l + "\n";
  text += fmt::format("\nGPU nodes ({}):\n", gpu_nodes);
  for (const auto& l : node_lines) text += l + "\n";
  text +=
      fmt::format("\nActive MIG pods ({}, {} with legacy identities):\n", pods.size(), legacy_pods);
  for (const auto& l : pod_lines) text += l + "\n";
  if (!unreachable.empty()) {
    text += fmt::format(
        "\nNVML views unreachable on {} node(s): {}. Save `nvidia-smi -L` there by hand.\n",
        unreachable.size(), fmt::join(unreachable, ", "));
  }
  text += "\nConfirm that every pod above can be recreated before draining.\n";
  if (auto st = WriteFile(dir / "summary.txt", text); !st.ok()) return st;
  files.push_back("summary.txt");

  CommandOutput out;
  out.text = text + fmt::format("\nWrote {} files to {}\n", files.size(), options.out_dir);
  out.json = {{"dir", options.out_dir},     {"files", files},
              {"configMaps", cm_names},     {"nodes", gpu_nodes},
              {"migPods", pods.size()},     {"legacyPods", legacy_pods},
              {"nvmlReachable", reachable}, {"nvmlUnreachable", unreachable}};
  return out;
}

}  // namespace dynmig::ops
