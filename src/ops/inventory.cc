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

namespace {

// The backup directory being written: every file written, by path relative to it.
struct BackupWriter {
  fs::path dir;
  std::vector<std::string> files;

  absl::Status Write(const std::string& rel, const json& doc) {
    auto st = WriteFile(dir / rel, doc.dump(2) + "\n");
    if (st.ok()) files.push_back(rel);
    return st;
  }
};

// --out must not exist, or be an empty directory (any directory with force).
absl::Status CheckOutDir(const InventoryOptions& options) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("--out: a directory is required");
  const fs::path dir(options.out_dir);
  std::error_code ec;
  if (!fs::exists(dir, ec)) return absl::OkStatus();
  if (!fs::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(
        fmt::format("--out {}: exists and is not a directory", options.out_dir));
  }
  if (!fs::is_empty(dir, ec) && !options.force) {
    return absl::FailedPreconditionError(fmt::format(
        "--out {}: the directory is not empty; choose a new one or pass --force to overwrite",
        options.out_dir));
  }
  return absl::OkStatus();
}

// The ConfigMaps to save: the named device config ConfigMap (or every one with a
// device-config.yaml key) and every MIG Manager config.
absl::StatusOr<std::vector<Object>> BackedUpConfigMaps(kube::KubeClient& client,
                                                       const DeviceConfigQuery& query) {
  std::vector<Object> configmaps;
  if (!query.configmap_name.empty()) {
    const std::string ns = query.configmap_ns.empty() ? "kube-system" : query.configmap_ns;
    auto cm = client.Get(kube::Resource::kConfigMaps, ns, query.configmap_name);
    if (!cm.ok()) {
      return absl::Status(cm.status().code(),
                          fmt::format("device config ConfigMap {}/{}: {}", ns, query.configmap_name,
                                      std::string(cm.status().message())));
    }
    configmaps.push_back(*cm);
  }
  auto listed = client.List(kube::Resource::kConfigMaps, {.ns = "", .limit = 500});
  if (!listed.ok()) return listed.status();
  for (const auto& cm : listed->items) {
    const auto data = cm.find("data");
    const bool device_config = query.configmap_name.empty() && data != cm.end() &&
                               data->is_object() && data->contains(std::string(kDeviceConfigKey));
    if (device_config || IsMigManagerConfig(cm)) configmaps.push_back(cm);
  }
  return configmaps;
}

// A device config that still holds HAMi's knownMigGeometries.
bool HoldsLegacyGeometries(const Object& cm) {
  const auto data = cm.find("data");
  if (data == cm.end() || !data->contains(std::string(kDeviceConfigKey))) return false;
  const auto& v = (*data)[std::string(kDeviceConfigKey)];
  return v.is_string() && v.get<std::string>().find("knownMigGeometries") != std::string::npos;
}

// Writes configmaps/<ns>_<name>.json for each; their keys and summary lines.
absl::Status WriteConfigMaps(const std::vector<Object>& configmaps, BackupWriter& out,
                             std::vector<std::string>& names, std::vector<std::string>& summary) {
  for (const auto& cm : configmaps) {
    const std::string rel =
        fmt::format("configmaps/{}_{}.json", BackupFileName(kube::Namespace(cm)),
                    BackupFileName(kube::Name(cm)));
    if (std::find(out.files.begin(), out.files.end(), rel) != out.files.end()) continue;
    if (auto st = out.Write(rel, cm); !st.ok()) return st;
    names.push_back(kube::ObjectKey(cm));
    summary.push_back(fmt::format("  ConfigMap {}{}{}", kube::ObjectKey(cm),
                                  IsMigManagerConfig(cm) ? " (MIG Manager config)" : "",
                                  HoldsLegacyGeometries(cm) ? " (holds knownMigGeometries)" : ""));
  }
  if (configmaps.empty()) {
    summary.push_back("  no ConfigMap with a device-config.yaml key or MIG Manager config found");
  }
  return absl::OkStatus();
}

// The register annotation in the node record: its legacy findings and devices, or the error.
// Returns the summary's note.
std::string RecordRegister(const Object& node, json& rec) {
  auto reg = kube::Annotation(node, protocol::kNodeRegisterAnnotation);
  if (!reg) return "no register annotation";
  const auto legacy = protocol::DetectLegacyNodeRegister(*reg);
  rec["registerLegacyFormat"] = legacy;
  if (!legacy.empty()) return "legacy register format";
  auto devices = protocol::DecodeNodeRegister(*reg);
  if (!devices.ok()) {
    rec["registerError"] = std::string(devices.status().message());
    return "unreadable register annotation";
  }
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
  return fmt::format("{} registered GPUs", devices->size());
}

// Idle (warm) instances the device plugin keeps, in the node record; the summary's addition.
std::string RecordIdleInstances(const Object& node, json& rec) {
  auto idle = kube::Annotation(node, protocol::kNodeIdleInstancesAnnotation);
  if (!idle) return "";
  rec["idleMigInstancesAnnotation"] = *idle;
  auto decoded = protocol::DecodeIdleInstances(*idle);
  if (!decoded.ok()) {
    rec["idleMigInstancesError"] = std::string(decoded.status().message());
    return "";
  }
  json list = json::array();
  for (const auto& i : *decoded) {
    list.push_back({{"gpuUUID", i.gpu_uuid},
                    {"profile", i.profile},
                    {"placement", {{"start", i.placement.start}, {"size", i.placement.size}}},
                    {"idleSince", i.idle_since}});
  }
  rec["idleMigInstances"] = list;
  return decoded->empty() ? "" : fmt::format(", {} idle instance(s)", decoded->size());
}

// nodes/<node>.json: what a rollback needs of the node. `note` gets the register summary.
json NodeRecord(const Object& node, std::string& note) {
  json annotations = json::object();
  for (const auto& [k, v] : kube::Annotations(node)) {
    if (k.rfind(protocol::kHamiKeyPrefix, 0) == 0) annotations[k] = v;
  }
  json labels = json::object();
  for (const auto& [k, v] : kube::Labels(node)) {
    if (k.rfind(protocol::kMigLabelPrefix, 0) == 0 || k.rfind(protocol::kGpuLabelPrefix, 0) == 0) {
      labels[k] = v;
    }
  }
  json rec = {{"name", kube::Name(node)},
              {"cordoned", IsCordoned(node)},
              {"address", NodeAddress(node)},
              {"annotations", annotations},
              {"labels", labels}};
  // The GPU resources the kubelet reports (nvidia.com/*): what a rollback must see registered
  // again.
  const auto status = node.find("status");
  const json no_status = json::object();
  const json& st = status != node.end() && status->is_object() ? *status : no_status;
  for (const char* field : {"capacity", "allocatable"}) rec[field] = NvidiaResources(st, field);
  note = RecordRegister(node, rec);
  note += RecordIdleInstances(node, rec);
  return rec;
}

// What the node backups add up to.
struct NodesBackup {
  size_t gpu_nodes = 0, reachable = 0;
  std::vector<std::string> unreachable;
  std::vector<std::string> lines;
};

// nvml/<node>.json: the node's NVML view, or why it was unreachable. Returns the summary's note.
absl::StatusOr<std::string> WriteNvml(NvmlSource& nvml, const Object& node, absl::Time now,
                                      BackupWriter& out, NodesBackup& nodes) {
  const std::string name = kube::Name(node);
  NvmlResult r = FetchNvmlView(nvml, node);
  json doc = {{"node", name}, {"url", r.url}, {"fetchedAt", kube::Rfc3339(now)}};
  std::string note;
  if (r.document.ok()) {
    doc["reachable"] = true;
    doc["view"] = *r.document;
    if (!r.view.ok()) doc["parseError"] = std::string(r.view.status().message());
    ++nodes.reachable;
    note = "NVML view saved";
  } else {
    doc["reachable"] = false;
    doc["error"] = std::string(r.document.status().message());
    nodes.unreachable.push_back(name);
    note = fmt::format("NVML view UNREACHABLE ({})", std::string(r.document.status().message()));
  }
  if (auto st = out.Write(fmt::format("nvml/{}.json", BackupFileName(name)), doc); !st.ok()) {
    return st;
  }
  return note;
}

absl::StatusOr<NodesBackup> WriteNodes(const ClusterSnapshot& snap, NvmlSource* nvml,
                                       absl::Time now, BackupWriter& out) {
  NodesBackup nodes;
  for (const auto& node : snap.nodes) {
    if (!IsGpuNode(node)) continue;
    ++nodes.gpu_nodes;
    const std::string name = kube::Name(node);
    std::string register_note;
    const json rec = NodeRecord(node, register_note);
    if (auto st = out.Write(fmt::format("nodes/{}.json", BackupFileName(name)), rec); !st.ok()) {
      return st;
    }
    std::string nvml_note = "NVML view not fetched (no endpoint)";
    if (nvml != nullptr) {
      auto note = WriteNvml(*nvml, node, now, out, nodes);
      if (!note.ok()) return note.status();
      nvml_note = *note;
    }
    const auto mig_labels = MigLabels(node);
    const auto config = mig_labels.find(std::string(protocol::kMigConfigLabel));
    nodes.lines.push_back(fmt::format(
        "  {}{}: {}; {}{}", name, IsCordoned(node) ? " (cordoned)" : "", register_note, nvml_note,
        config != mig_labels.end()
            ? fmt::format("; {}={}", protocol::kMigConfigLabel, config->second)
            : ""));
  }
  return nodes;
}

// What the pod backup adds up to.
struct PodsBackup {
  json pods = json::array();
  size_t legacy = 0;
  std::vector<std::string> lines;
};

// mig-pods.json: every active MIG pod (requesting MIG, holding a reservation or legacy identities).
absl::StatusOr<PodsBackup> WritePods(const ClusterSnapshot& snap, absl::Time now,
                                     BackupWriter& out) {
  const protocol::ResourceNames resources;
  PodsBackup b;
  for (const auto& pod : snap.pods) {
    if (kube::IsTerminated(pod)) continue;
    const bool mig = protocol::IsMigPod(pod, resources) ||
                     kube::Annotation(pod, protocol::kMigAllocationsAnnotation) ||
                     !LegacyIdentities(pod).empty();
    if (!mig) continue;
    json rec = PodRecord(pod, resources);
    if (!rec["legacyIdentities"].empty()) ++b.legacy;
    b.lines.push_back(fmt::format("  {} on {} ({}){}", PodKey(pod),
                                  PodNode(pod).empty() ? "no node" : PodNode(pod), kube::Phase(pod),
                                  rec["legacyIdentities"].empty() ? "" : ": LEGACY identity"));
    b.pods.push_back(std::move(rec));
  }
  if (auto st = out.Write("mig-pods.json", {{"takenAt", kube::Rfc3339(now)}, {"pods", b.pods}});
      !st.ok()) {
    return st;
  }
  return b;
}

std::string SummaryText(absl::Time now, size_t configmaps, const std::vector<std::string>& summary,
                        const NodesBackup& nodes, const PodsBackup& pods) {
  std::string text = fmt::format("dynmig inventory, {}\n\n", kube::Rfc3339(now));
  text += fmt::format("Device config and MIG Manager ConfigMaps ({}):\n", configmaps);
  for (const auto& l : summary) text += l + "\n";
  text += fmt::format("\nGPU nodes ({}):\n", nodes.gpu_nodes);
  for (const auto& l : nodes.lines) text += l + "\n";
  text += fmt::format("\nActive MIG pods ({}, {} with legacy identities):\n", pods.pods.size(),
                      pods.legacy);
  for (const auto& l : pods.lines) text += l + "\n";
  if (!nodes.unreachable.empty()) {
    text += fmt::format(
        "\nNVML views unreachable on {} node(s): {}. Save `nvidia-smi -L` there by hand.\n",
        nodes.unreachable.size(), fmt::join(nodes.unreachable, ", "));
  }
  text += "\nConfirm that every pod above can be recreated before draining.\n";
  return text;
}

}  // namespace

absl::StatusOr<CommandOutput> RunInventory(kube::KubeClient& client, NvmlSource* nvml,
                                           const InventoryOptions& options, absl::Time now) {
  if (auto st = CheckOutDir(options); !st.ok()) return st;
  auto snap = TakeSnapshot(client, now);
  if (!snap.ok()) return snap.status();
  BackupWriter out{fs::path(options.out_dir), {}};

  auto configmaps = BackedUpConfigMaps(client, options.config);
  if (!configmaps.ok()) return configmaps.status();
  std::vector<std::string> cm_names, summary;
  if (auto st = WriteConfigMaps(*configmaps, out, cm_names, summary); !st.ok()) return st;
  auto nodes = WriteNodes(*snap, nvml, now, out);
  if (!nodes.ok()) return nodes.status();
  auto pods = WritePods(*snap, now, out);
  if (!pods.ok()) return pods.status();

  const std::string text = SummaryText(now, configmaps->size(), summary, *nodes, *pods);
  if (auto st = WriteFile(out.dir / "summary.txt", text); !st.ok()) return st;
  out.files.push_back("summary.txt");

  CommandOutput result;
  result.text = text + fmt::format("\nWrote {} files to {}\n", out.files.size(), options.out_dir);
  result.json = {{"dir", options.out_dir},
                 {"files", out.files},
                 {"configMaps", cm_names},
                 {"nodes", nodes->gpu_nodes},
                 {"migPods", pods->pods.size()},
                 {"legacyPods", pods->legacy},
                 {"nvmlReachable", nodes->reachable},
                 {"nvmlUnreachable", nodes->unreachable}};
  return result;
}

}  // namespace dynmig::ops
