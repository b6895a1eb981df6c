#include "ops/cluster.h"

#include <algorithm>
#include <regex>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "protocol/annotations.h"
#include "protocol/devices.h"

namespace dynmig::ops {
namespace {

using kube::Object;

bool ByKey(const Object& a, const Object& b) { return kube::ObjectKey(a) < kube::ObjectKey(b); }

}  // namespace

const kube::Object* ClusterSnapshot::FindNode(std::string_view name) const {
  for (const auto& n : nodes) {
    if (kube::Name(n) == name) return &n;
  }
  return nullptr;
}

const kube::Object* ClusterSnapshot::FindPod(std::string_view ns, std::string_view name) const {
  for (const auto& p : pods) {
    if (kube::Name(p) == name && kube::Namespace(p) == ns) return &p;
  }
  return nullptr;
}

absl::StatusOr<ClusterSnapshot> TakeSnapshot(kube::KubeClient& client, absl::Time now) {
  ClusterSnapshot snap;
  snap.taken = now;
  auto nodes = client.ListNodes({.limit = 500});
  if (!nodes.ok()) return Annotate(nodes.status(), "list nodes");
  auto pods = client.ListPods({.limit = 500});
  if (!pods.ok()) return Annotate(pods.status(), "list pods");
  snap.nodes = std::move(nodes->items);
  snap.pods = std::move(pods->items);
  std::sort(snap.nodes.begin(), snap.nodes.end(), ByKey);
  std::sort(snap.pods.begin(), snap.pods.end(), ByKey);
  return snap;
}

std::string PodNode(const kube::Object& pod) {
  auto node = kube::Annotation(pod, protocol::kVgpuNodeAnnotation);
  if (node && !node->empty()) return *node;
  return kube::NodeName(pod);
}

std::string PodLine(const kube::Object& pod) {
  std::string phase = kube::Phase(pod);
  if (phase.empty()) phase = "Unknown";
  if (kube::IsBeingDeleted(pod)) phase += ", terminating";
  return fmt::format("{} ({})", PodKey(pod), phase);
}

std::string PodKey(const kube::Object& pod) {
  return fmt::format("{}/{}", kube::Namespace(pod), kube::Name(pod));
}

std::vector<std::string> LegacyIdentities(const kube::Object& pod) {
  std::vector<std::string> out;
  for (std::string_view key :
       {protocol::kDevicesAllocatedAnnotation, protocol::kDevicesToAllocateAnnotation}) {
    auto value = kube::Annotation(pod, key);
    if (!value || value->empty()) continue;
    std::vector<std::string> ids;
    auto devices = protocol::DecodePodDevices(*value);
    if (devices.ok()) {
      for (const auto& ctr : *devices) {
        for (const auto& d : ctr) ids.push_back(d.uuid);
      }
    } else {
      // Not decodable: look for the legacy shape in the raw text.
      static const std::regex kLegacy(R"(GPU-[^,:;\[\]\s]+\[\d+-\d+\])");
      for (std::sregex_iterator it(value->begin(), value->end(), kLegacy), end; it != end; ++it) {
        ids.push_back(it->str());
      }
    }
    for (const auto& id : ids) {
      if (!protocol::IsLegacyMigIdentity(id)) continue;
      const std::string entry = fmt::format("{} ({})", id, key);
      if (std::find(out.begin(), out.end(), entry) == out.end()) out.push_back(entry);
    }
  }
  return out;
}

std::vector<const kube::Object*> IndexedContainers(const kube::Object& pod) {
  std::vector<const kube::Object*> out;
  const auto spec = pod.find("spec");
  if (spec == pod.end() || !spec->is_object()) return out;
  for (const char* list : {"initContainers", "containers"}) {
    const auto it = spec->find(list);
    if (it == spec->end() || !it->is_array()) continue;
    for (const auto& c : *it) out.push_back(&c);
  }
  return out;
}

bool IsGpuNode(const kube::Object& node) {
  if (kube::Annotation(node, protocol::kNodeRegisterAnnotation)) return true;
  if (!MigLabels(node).empty()) return true;
  const auto status = node.find("status");
  if (status == node.end() || !status->is_object()) return false;
  for (const char* field : {"capacity", "allocatable"}) {
    const auto resources = status->find(field);
    if (resources != status->end() && resources->is_object() &&
        resources->contains(std::string(protocol::kResourceCount))) {
      return true;
    }
  }
  return false;
}

std::string NodeAddress(const kube::Object& node) {
  std::string hostname;
  const auto status = node.find("status");
  if (status != node.end() && status->is_object()) {
    const auto addrs = status->find("addresses");
    if (addrs != status->end() && addrs->is_array()) {
      for (const auto& a : *addrs) {
        if (!a.is_object()) continue;
        const std::string type = a.value("type", "");
        const std::string address = a.value("address", "");
        if (type == "InternalIP" && !address.empty()) return address;
        if (type == "Hostname" && hostname.empty()) hostname = address;
      }
    }
  }
  return hostname.empty() ? kube::Name(node) : hostname;
}

bool IsCordoned(const kube::Object& node) {
  const auto spec = node.find("spec");
  if (spec == node.end() || !spec->is_object()) return false;
  const auto u = spec->find("unschedulable");
  return u != spec->end() && u->is_boolean() && u->get<bool>();
}

std::map<std::string, std::string> MigLabels(const kube::Object& node) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : kube::Labels(node)) {
    if (k.rfind(protocol::kMigLabelPrefix, 0) == 0) out.emplace(k, v);
  }
  return out;
}

std::map<std::string, std::string> NvidiaResources(const nlohmann::json& obj, const char* field) {
  std::map<std::string, std::string> out;
  const auto it = obj.find(field);
  if (it == obj.end() || !it->is_object()) return out;
  for (const auto& [k, v] : it->items()) {
    if (k.rfind(protocol::kNvidiaKeyPrefix, 0) == 0 && v.is_string()) out[k] = v.get<std::string>();
  }
  return out;
}

absl::StatusOr<DeviceConfigSource> FindDeviceConfig(kube::KubeClient& client,
                                                    const DeviceConfigQuery& query) {
  DeviceConfigSource src;
  if (!query.file.empty()) {
    src.origin = "file " + query.file;
    src.found = true;
    src.config = protocol::LoadDeviceConfig(query.file);
    if (!src.config.ok() && (src.config.status().code() == absl::StatusCode::kNotFound ||
                             src.config.status().code() == absl::StatusCode::kPermissionDenied)) {
      return src.config.status();
    }
    return src;
  }
  auto use = [&](const Object& cm) -> absl::StatusOr<DeviceConfigSource> {
    src.origin = fmt::format("ConfigMap {}", kube::ObjectKey(cm));
    src.found = true;
    src.configmap = cm;
    const auto data = cm.find("data");
    if (data == cm.end() || !data->is_object() || !data->contains(std::string(kDeviceConfigKey)) ||
        !(*data)[std::string(kDeviceConfigKey)].is_string()) {
      return absl::NotFoundError(fmt::format("{} has no {} key", src.origin, kDeviceConfigKey));
    }
    src.yaml = (*data)[std::string(kDeviceConfigKey)].get<std::string>();
    auto parsed = protocol::ParseDeviceConfig(src.yaml);
    if (parsed.ok()) {
      src.config = std::move(*parsed);
    } else {
      src.config = Annotate(parsed.status(), src.origin);
    }
    return src;
  };
  if (!query.configmap_name.empty()) {
    const std::string ns = query.configmap_ns.empty() ? "kube-system" : query.configmap_ns;
    auto cm = client.Get(kube::Resource::kConfigMaps, ns, query.configmap_name);
    if (!cm.ok()) {
      return Annotate(cm.status(),
                      fmt::format("device config ConfigMap {}/{}", ns, query.configmap_name));
    }
    return use(*cm);
  }
  auto list = client.List(kube::Resource::kConfigMaps, {.ns = query.configmap_ns, .limit = 500});
  if (!list.ok()) return Annotate(list.status(), "list configmaps");
  std::vector<const Object*> candidates;
  for (const auto& cm : list->items) {
    const auto data = cm.find("data");
    if (data != cm.end() && data->is_object() && data->contains(std::string(kDeviceConfigKey))) {
      candidates.push_back(&cm);
    }
  }
  if (candidates.size() > 1) {
    std::vector<const Object*> preferred;
    for (const Object* cm : candidates) {
      const std::string name = kube::Name(*cm);
      if (name.size() >= 17 && name.ends_with("-scheduler-device")) preferred.push_back(cm);
    }
    if (preferred.size() == 1) candidates = preferred;
  }
  if (candidates.size() > 1) {
    std::vector<std::string> names;
    for (const Object* cm : candidates) names.push_back(kube::ObjectKey(*cm));
    return absl::FailedPreconditionError(fmt::format(
        "several ConfigMaps hold a {} key ({}): name one with --device-config-namespace and "
        "--device-config-name",
        kDeviceConfigKey, fmt::join(names, ", ")));
  }
  if (candidates.size() == 1) return use(*candidates[0]);
  src.origin = "built-in default (no ConfigMap with a device-config.yaml key found)";
  src.found = false;
  src.config = protocol::ParseDeviceConfig(protocol::DefaultDeviceConfigYaml());
  return src;
}

protocol::DeviceConfig EffectiveConfig(const DeviceConfigSource& source) {
  if (source.config.ok()) return *source.config;
  auto def = protocol::ParseDeviceConfig(protocol::DefaultDeviceConfigYaml());
  return def.ok() ? *def : protocol::DeviceConfig{};
}

std::unique_ptr<scheduler::ClusterState> BuildClusterState(const ClusterSnapshot& snapshot,
                                                           const protocol::DeviceConfig& config,
                                                           const std::string& skip_pod) {
  auto state = std::make_unique<scheduler::ClusterState>(scheduler::ClusterStateOptions{
      config.allowlist, config.resources, absl::Minutes(3), config.memory_match});
  for (const auto& n : snapshot.nodes) state->UpsertNode(n);
  for (const auto& p : snapshot.pods) {
    if (!skip_pod.empty() && PodKey(p) == skip_pod) continue;
    state->UpsertPod(p);
  }
  return state;
}

}  // namespace dynmig::ops
