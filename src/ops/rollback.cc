#include "ops/rollback.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "common/bounded_json.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "ops/checks.h"
#include "ops/cluster.h"
#include "ops/inventory.h"
#include "protocol/annotations.h"
#include "protocol/held_slices.h"
#include "protocol/mig_allocations.h"
#include "protocol/node_register.h"
#include "protocol/pod_request.h"

namespace dynmig::ops {

// The node's instances now, from the option given; nullopt + why when there is none.
struct CurrentInstances {
  std::optional<NvmlView> view;
  std::string origin;
  std::string error;
};

namespace {

namespace fs = std::filesystem;
using kube::Object;
using nlohmann::json;

// The safety items: while one FAILs the rollback is refused.
constexpr std::array<std::string_view, 7> kSafetyChecks = {
    "cordoned",      "dynamic-pods", "reservations", "mig-service",
    "device-plugin", "node-lock",    "instances"};

absl::StatusOr<json> ReadJsonFile(const fs::path& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::InvalidArgumentError(fmt::format("{}: cannot read {}", what, path.string()));
  std::stringstream ss;
  ss << f.rdbuf();
  // A backup holds every pod and node of the cluster: the limits of an API server response.
  auto doc = ParseBoundedJson(ss.str(), kKubeResponseJsonLimits, path.string());
  if (!doc.ok()) {
    return absl::InvalidArgumentError(fmt::format("{}: {} is not JSON (a damaged backup?): {}",
                                                  what, path.string(),
                                                  std::string(doc.status().message())));
  }
  return doc;
}

std::string Place(const mig::Placement& p) {
  return p.size <= 1 ? fmt::format("{}", p.start)
                     : fmt::format("{}-{}", p.start, p.start + p.size - 1);
}

std::string GpuName(const NvmlGpuView& g) {
  return g.uuid.empty() ? fmt::format("GPU {}", g.index)
                        : fmt::format("GPU {} ({})", g.index, g.uuid);
}

std::string InstanceLine(const NvmlGpuView& g, const NvmlInstanceView& i) {
  std::string ids = fmt::format("GI {}", i.gpu_instance_id);
  for (const auto& ci : i.compute_instances) {
    ids += fmt::format(", CI {}{}", ci.id, ci.mig_uuid.empty() ? "" : " " + ci.mig_uuid);
  }
  return fmt::format("{}: {} at slices {} ({})", GpuName(g), i.profile, Place(i.placement), ids);
}

// The saved GPU that stands for `current`: same UUID when both know it, else same index.
const NvmlGpuView* SavedGpu(const NvmlView& saved, const NvmlGpuView& current) {
  for (const auto& g : saved.gpus) {
    if (!g.uuid.empty() && !current.uuid.empty()) {
      if (g.uuid == current.uuid) return &g;
    } else if (g.index == current.index) {
      return &g;
    }
  }
  return nullptr;
}

bool SameInstance(const NvmlInstanceView& a, const NvmlInstanceView& b) {
  return a.profile == b.profile && a.placement.start == b.placement.start &&
         a.placement.size == b.placement.size;
}

struct GeometryDiff {
  std::vector<std::string> extra;    // instances now that the saved geometry does not have
  std::vector<std::string> missing;  // saved instances not there now
  size_t matched = 0;
};

GeometryDiff Compare(const NvmlView* saved, const NvmlView& now) {
  GeometryDiff d;
  for (const auto& g : now.gpus) {
    const NvmlGpuView* s = saved == nullptr ? nullptr : SavedGpu(*saved, g);
    for (const auto& i : g.instances) {
      bool found = false;
      if (s != nullptr) {
        for (const auto& si : s->instances) found = found || SameInstance(si, i);
      }
      if (found) {
        ++d.matched;
      } else {
        d.extra.push_back(InstanceLine(g, i));
      }
    }
  }
  if (saved != nullptr) {
    for (const auto& s : saved->gpus) {
      const NvmlGpuView* g = nullptr;
      for (const auto& n : now.gpus) {
        if (SavedGpu(*saved, n) == &s) g = &n;
      }
      for (const auto& si : s.instances) {
        bool found = false;
        if (g != nullptr) {
          for (const auto& i : g->instances) found = found || SameInstance(si, i);
        }
        if (!found) {
          d.missing.push_back(
              fmt::format("{}: {} at slices {}", GpuName(s), si.profile, Place(si.placement)));
        }
      }
    }
  }
  return d;
}

size_t InstanceCount(const NvmlView& v) {
  size_t n = 0;
  for (const auto& g : v.gpus) n += g.instances.size();
  return n;
}

bool IsDevicePluginPod(const Object& pod) {
  const auto labels = kube::Labels(pod);
  auto label = [&](const char* k) {
    auto it = labels.find(k);
    return it == labels.end() ? std::string() : it->second;
  };
  if (label("app.kubernetes.io/name") == "dynmig" &&
      label("app.kubernetes.io/component") == "device-plugin") {
    return true;
  }
  return kube::Name(pod).rfind("dynmig-device-plugin", 0) == 0;
}

std::map<std::string, std::string> StringMap(const json& obj, const char* field) {
  std::map<std::string, std::string> out;
  const auto it = obj.find(field);
  if (it == obj.end() || !it->is_object()) return out;
  for (const auto& [k, v] : it->items()) {
    if (v.is_string()) out[k] = v.get<std::string>();
  }
  return out;
}

std::optional<std::string> MapValue(const std::map<std::string, std::string>& m,
                                    std::string_view key) {
  auto it = m.find(std::string(key));
  if (it == m.end()) return std::nullopt;
  return it->second;
}

// Labels `apply` restores: MIG Manager's geometry and whether it runs on the node. Only for a node
// MIG Manager managed (the backup has one of them).
std::vector<std::string_view> RestoredLabels(const RollbackBackup& b) {
  const auto labels = StringMap(b.node_record, "labels");
  if (!MapValue(labels, protocol::kMigConfigLabel) &&
      !MapValue(labels, protocol::kMigManagerDeployLabel))
    return {};
  return {protocol::kMigConfigLabel, protocol::kMigManagerDeployLabel};
}

std::string Show(const std::optional<std::string>& v) { return v ? "=" + *v : " absent"; }

bool BackupHasRegister(const RollbackBackup& b) {
  const auto it = b.node_record.find("annotations");
  return it != b.node_record.end() && it->is_object() &&
         it->contains(std::string(protocol::kNodeRegisterAnnotation));
}

json ConfigMapData(const Object& cm) {
  const auto it = cm.find("data");
  return it != cm.end() && it->is_object() ? *it : json::object();
}

CurrentInstances ReadCurrent(const RollbackOptions& o) {
  CurrentInstances c;
  if (o.nvml != nullptr) {
    c.origin = "NVML " + o.nvml->Description();
    auto v = ReadNvmlInstances(*o.nvml);
    if (v.ok()) {
      c.view = std::move(*v);
    } else {
      c.error = fmt::format("{}: {}", c.origin, std::string(v.status().message()));
    }
    return c;
  }
  if (!o.instances_file.empty()) {
    c.origin = "file " + o.instances_file;
    auto doc = ReadJsonFile(o.instances_file, "--instances");
    if (!doc.ok()) {
      c.error = std::string(doc.status().message());
      return c;
    }
    auto v = ParseNvmlView(*doc);
    if (v.ok()) {
      c.view = std::move(*v);
    } else {
      c.error =
          fmt::format("--instances {}: {}", o.instances_file, std::string(v.status().message()));
    }
    return c;
  }
  c.error =
      "no view of the node's MIG instances: run this on the node with --on-node (NVML), or pass "
      "--instances FILE (`dynmig nvml instances -o json` taken on the node)";
  return c;
}

}  // namespace

absl::StatusOr<RollbackBackup> LoadRollbackBackup(const std::string& dir, const std::string& node,
                                                  const std::string& geometry_file) {
  if (dir.empty()) {
    return absl::InvalidArgumentError(
        "--backup: the directory `dynmig inventory --out DIR` wrote is required");
  }
  std::error_code ec;
  const fs::path root(dir);
  if (!fs::is_directory(root, ec)) {
    return absl::InvalidArgumentError(fmt::format(
        "--backup {}: no such directory (give the directory `dynmig inventory --out DIR` wrote)",
        dir));
  }
  if (!fs::is_directory(root / "nodes", ec) || !fs::exists(root / "mig-pods.json", ec)) {
    return absl::InvalidArgumentError(fmt::format(
        "--backup {}: not a dynmig inventory directory (no nodes/ or mig-pods.json)", dir));
  }
  RollbackBackup b;
  b.dir = dir;
  b.node = node;
  const fs::path node_file = root / "nodes" / (BackupFileName(node) + ".json");
  if (!fs::exists(node_file, ec)) {
    std::vector<std::string> have;
    for (const auto& e : fs::directory_iterator(root / "nodes", ec)) {
      if (e.path().extension() == ".json") have.push_back(e.path().stem().string());
    }
    std::sort(have.begin(), have.end());
    return absl::NotFoundError(
        fmt::format("--backup {}: holds no record of node \"{}\" (it has: {})", dir, node,
                    have.empty() ? "none" : fmt::format("{}", fmt::join(have, ", "))));
  }
  auto rec = ReadJsonFile(node_file, "--backup");
  if (!rec.ok()) return rec.status();
  if (!rec->is_object() || rec->value("name", "") != node || !(*rec)["labels"].is_object() ||
      !(*rec)["annotations"].is_object()) {
    return absl::InvalidArgumentError(fmt::format(
        "--backup: {} is not the node record inventory writes (name, labels, annotations)",
        node_file.string()));
  }
  b.node_record = std::move(*rec);
  if (auto v = MapValue(StringMap(b.node_record, "labels"), protocol::kMigConfigLabel))
    b.mig_config = *v;

  if (fs::is_directory(root / "configmaps", ec)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(root / "configmaps", ec)) {
      if (e.path().extension() == ".json") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      auto cm = ReadJsonFile(f, "--backup");
      if (!cm.ok()) return cm.status();
      if (!cm->is_object() || kube::Name(*cm).empty() || !cm->contains("data") ||
          !(*cm)["data"].is_object()) {
        return absl::InvalidArgumentError(
            fmt::format("--backup: {} is not a ConfigMap (metadata.name and data)", f.string()));
      }
      b.configmaps.push_back(std::move(*cm));
    }
  }

  if (!geometry_file.empty()) {
    auto doc = ReadJsonFile(geometry_file, "--geometry");
    if (!doc.ok()) return doc.status();
    auto view = ParseNvmlView(*doc);
    if (!view.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("--geometry {}: {}", geometry_file, std::string(view.status().message())));
    }
    b.geometry = std::move(*view);
    b.geometry_origin = "file " + geometry_file;
  } else if (const fs::path nvml_file = root / "nvml" / (BackupFileName(node) + ".json");
             fs::exists(nvml_file, ec)) {
    auto doc = ReadJsonFile(nvml_file, "--backup");
    if (!doc.ok()) return doc.status();
    if (doc->is_object() && doc->value("reachable", false) && doc->contains("view")) {
      auto view = ParseNvmlView((*doc)["view"]);
      if (!view.ok()) {
        return absl::InvalidArgumentError(fmt::format("--backup: {}: {}", nvml_file.string(),
                                                      std::string(view.status().message())));
      }
      if (InstanceCount(*view) > 0) {
        b.geometry = std::move(*view);
        b.geometry_origin = "the backup's NVML view (" + nvml_file.string() + ")";
      }
    }
  }
  return b;
}

absl::StatusOr<NvmlView> ReadNvmlInstances(nvml::Nvml& nvml) {
  auto count = nvml.DeviceCount();
  if (!count.ok()) return count.status();
  NvmlView view;
  for (uint32_t i = 0; i < *count; ++i) {
    auto info = nvml.GetGpu(i);
    if (!info.ok()) return info.status();
    NvmlGpuView g;
    g.index = i;
    g.uuid = info->uuid;
    g.name = info->name;
    g.memory_mib = info->total_memory_mib;
    g.mig_enabled = info->mig.current;
    if (info->mig.current) {
      auto profiles = nvml::DiscoverProfiles(nvml, i);
      if (!profiles.ok()) return profiles.status();
      auto gis = nvml.ListGpuInstances(i);
      if (!gis.ok()) return gis.status();
      for (const auto& gi : *gis) {
        NvmlInstanceView inst;
        inst.gpu_instance_id = gi.id;
        inst.placement = gi.placement;
        inst.profile = fmt::format("profile-id-{}", gi.profile_id);
        for (const auto& p : *profiles) {
          if (p.nvml_id == gi.profile_id) inst.profile = p.name;
        }
        auto cis = nvml.ListComputeInstances(i, gi.id);
        if (!cis.ok()) return cis.status();
        for (const auto& ci : *cis) inst.compute_instances.push_back({ci.id, ci.mig_uuid});
        g.instances.push_back(std::move(inst));
      }
    }
    view.gpus.push_back(std::move(g));
  }
  return view;
}

// What `rollback check` reads beside the snapshot, once, before its checks run.
struct RollbackFacts {
  const RollbackBackup* backup = nullptr;
  CurrentInstances current;
  // dynmig's device-plugin NVML endpoint probed (null endpoint: not probed).
  std::optional<NvmlResult> endpoint;
  // The backup's ConfigMaps as the cluster has them now (nullopt: missing).
  std::vector<std::optional<Object>> configmaps;
};

namespace {

// Reads what the checks need beyond the snapshot. Errors: a ConfigMap read that fails other than
// kNotFound.
absl::StatusOr<RollbackFacts> ReadRollbackFacts(kube::KubeClient& client,
                                                const RollbackOptions& options,
                                                const RollbackBackup& backup, const Object& node) {
  RollbackFacts f;
  f.backup = &backup;
  f.current = ReadCurrent(options);
  if (options.endpoint != nullptr) f.endpoint = FetchNvmlView(*options.endpoint, node);
  for (const auto& cm : backup.configmaps) {
    auto now_cm = client.Get(kube::Resource::kConfigMaps, kube::Namespace(cm), kube::Name(cm));
    if (!now_cm.ok()) {
      if (!absl::IsNotFound(now_cm.status())) return now_cm.status();
      f.configmaps.push_back(std::nullopt);
    } else {
      f.configmaps.push_back(std::move(*now_cm));
    }
  }
  return f;
}

// A reservation of a dynamic-MIG pod, as the reservations proof lists it.
std::string ReservationLine(const Object& pod, const protocol::MigAllocation& a) {
  return fmt::format(
      "{}: {} at slices {} of {}{}", PodKey(pod), a.profile, Place(a.placement), a.gpu_uuid,
      a.runtime ? fmt::format(" ({}, GI {}, CI {})", a.runtime->mig_uuid,
                              a.runtime->gpu_instance_id, a.runtime->compute_instance_id)
                : "");
}

// The node's active dynamic-MIG pods: they carry a reservation, or request MIG without holding
// legacy identities alone.
std::vector<const Object*> DynamicPodsOf(const CheckInput& in) {
  const protocol::ResourceNames resources;
  std::vector<const Object*> out;
  for (const Object* p : in.pods) {
    const bool allocs = kube::Annotation(*p, protocol::kMigAllocationsAnnotation).has_value();
    const bool legacy_only = !LegacyIdentities(*p).empty() && !allocs;
    if (legacy_only || (!allocs && !protocol::IsMigPod(*p, resources))) continue;
    out.push_back(p);
  }
  return out;
}

// The held-slices evidence of the instances proof; true when the node publishes held slices.
bool HeldSlicesEvidence(const Object& node, std::vector<std::string>& evidence) {
  auto held = kube::Annotation(node, protocol::kNodeHeldSlicesAnnotation);
  if (!held || held->empty() || *held == "[]") return false;
  auto decoded = protocol::DecodeHeldSlices(*held);
  if (decoded.ok()) {
    for (const auto& h : *decoded) {
      evidence.push_back(fmt::format("{} holds {} at slices {} of {}: {}",
                                     protocol::kNodeHeldSlicesAnnotation, h.profile,
                                     Place(h.placement), h.gpu_uuid, h.reason));
    }
  } else {
    evidence.push_back(fmt::format("{}={}", protocol::kNodeHeldSlicesAnnotation, *held));
  }
  return true;
}

// The legacy-registration proof's comparison of GPU resources with the backup's.
void CompareGpuResources(const CheckInput& in, std::vector<std::string>& evidence,
                         std::vector<std::string>& problems) {
  const RollbackBackup& backup = *in.rollback->backup;
  const auto status_it = in.node->find("status");
  const json status =
      status_it != in.node->end() && status_it->is_object() ? *status_it : json::object();
  auto have = NvidiaResources(status, "allocatable");
  if (have.empty()) have = NvidiaResources(status, "capacity");
  auto want = NvidiaResources(backup.node_record, "allocatable");
  if (want.empty()) want = NvidiaResources(backup.node_record, "capacity");
  if (want.empty()) {
    bool any = false;
    for (const auto& [k, v] : have) {
      any = any || (v != "0" && (k == protocol::kResourceCount ||
                                 k.rfind(protocol::kMigResourcePrefix, 0) == 0));
    }
    if (!any) {
      problems.push_back(fmt::format("no {} or {}* resource is allocatable",
                                     protocol::kResourceCount, protocol::kMigResourcePrefix));
    }
    evidence.push_back(fmt::format(
        "the backup records no GPU resources (an older inventory): any {} or {}* resource counts",
        protocol::kResourceCount, protocol::kMigResourcePrefix));
  }
  for (const auto& [k, v] : want) {
    if (v == "0") continue;
    const auto now_v = MapValue(have, k);
    if (!now_v || *now_v == "0") {
      problems.push_back(fmt::format("{}: backup {}, now {}", k, v, now_v.value_or("absent")));
    } else {
      evidence.push_back(fmt::format("{}: backup {}, now {}", k, v, *now_v));
    }
  }
}

// The legacy-registration proof's look at the register annotation against the backup's.
void CompareRegister(const CheckInput& in, std::vector<std::string>& evidence,
                     std::vector<std::string>& problems) {
  const RollbackBackup& backup = *in.rollback->backup;
  const auto reg = kube::Annotation(*in.node, protocol::kNodeRegisterAnnotation);
  const json saved_findings = backup.node_record.value("registerLegacyFormat", json::array());
  if (!BackupHasRegister(backup)) {
    if (reg) {
      problems.push_back(fmt::format(
          "{} is still on the node: the backup had none, so it is dynmig's (dynmig rollback "
          "apply removes it)",
          protocol::kNodeRegisterAnnotation));
    }
  } else if (!reg) {
    problems.push_back(fmt::format("{} is absent: the legacy device plugin has not registered",
                                   protocol::kNodeRegisterAnnotation));
  } else if (saved_findings.is_array() && !saved_findings.empty()) {
    if (protocol::DetectLegacyNodeRegister(*reg).empty()) {
      problems.push_back(fmt::format(
          "{} is in dynmig's format, the backup's was the legacy template format: the legacy "
          "device plugin has not registered yet",
          protocol::kNodeRegisterAnnotation));
    } else {
      evidence.push_back(fmt::format("{} is in the legacy template format, as in the backup",
                                     protocol::kNodeRegisterAnnotation));
    }
  } else {
    evidence.push_back(fmt::format("{} present", protocol::kNodeRegisterAnnotation));
  }
}

}  // namespace

namespace checks {

bool DynamicPods(const CheckInput& in, CheckReport& report) {
  std::vector<std::string> pods;
  for (const Object* p : DynamicPodsOf(in)) pods.push_back(PodLine(*p));
  if (pods.empty()) {
    report.Add("dynamic-pods", in.node_name, CheckStatus::kPass,
               "no active dynamic-MIG pod on the node");
    return true;
  }
  const size_t n = pods.size();
  pods.push_back(fmt::format(
      "drain them while dynmig's device plugin still runs (it reclaims their instances): "
      "kubectl drain {} --ignore-daemonsets --delete-emptydir-data",
      in.node_name));
  report.Add("dynamic-pods", in.node_name, CheckStatus::kFail,
             fmt::format("{} active dynamic-MIG pod{} on the node", n, n == 1 ? "" : "s"),
             std::move(pods));
  return true;
}

bool Reservations(const CheckInput& in, CheckReport& report) {
  std::vector<std::string> reservations;
  for (const Object* p : DynamicPodsOf(in)) {
    const auto allocs = kube::Annotation(*p, protocol::kMigAllocationsAnnotation);
    if (!allocs) continue;
    auto decoded = protocol::DecodeMigAllocations(*allocs);
    if (!decoded.ok()) {
      reservations.push_back(fmt::format("{}: unreadable {} ({})", PodKey(*p),
                                         protocol::kMigAllocationsAnnotation,
                                         std::string(decoded.status().message())));
      continue;
    }
    for (const auto& a : *decoded) reservations.push_back(ReservationLine(*p, a));
  }
  if (reservations.empty()) {
    report.Add("reservations", in.node_name, CheckStatus::kPass,
               fmt::format("no pod holds a {} reservation on the node",
                           protocol::kMigAllocationsAnnotation));
    return true;
  }
  const size_t n = reservations.size();
  report.Add("reservations", in.node_name, CheckStatus::kFail,
             fmt::format("{} dynamic-MIG reservation{} on the node", n, n == 1 ? "" : "s"),
             std::move(reservations));
  return true;
}

bool MigService(const CheckInput& in, CheckReport& report) {
  const auto service = kube::Label(*in.node, protocol::kMigServiceLabel);
  if (service && *service == kMigServiceLabelValue) {
    report.Add(
        "mig-service", in.node_name, CheckStatus::kFail,
        fmt::format("the node still carries {}={}: dynmig's device-plugin DaemonSet keeps "
                    "serving it",
                    protocol::kMigServiceLabel, kMigServiceLabelValue),
        {fmt::format("kubectl label node {} {}-", in.node_name, protocol::kMigServiceLabel)});
  } else {
    report.Add("mig-service", in.node_name, CheckStatus::kPass,
               fmt::format("the node does not carry {}={} (the device-plugin DaemonSet leaves it)",
                           protocol::kMigServiceLabel, kMigServiceLabelValue));
  }
  return true;
}

bool DevicePluginStopped(const CheckInput& in, CheckReport& report) {
  const std::string& name = in.node_name;
  const Object* node = in.node;
  std::vector<std::string> running, evidence;
  for (const auto& p : in.snapshot->pods) {
    if (!kube::IsTerminated(p) && kube::NodeName(p) == name && IsDevicePluginPod(p)) {
      running.push_back("dynmig device-plugin pod on the node: " + PodLine(p));
    }
  }
  if (const auto& nv = in.rollback->endpoint) {
    if (nv->document.ok()) {
      running.push_back(
          fmt::format("its NVML view still answers at {}: the plugin still runs", nv->url));
    } else {
      evidence.push_back(fmt::format("NVML view at {}: not answering ({})", nv->url,
                                     std::string(nv->document.status().message())));
    }
  } else {
    evidence.push_back("NVML view endpoint not probed (--nvml-endpoint '')");
  }
  if (auto hs = kube::Annotation(*node, protocol::kNodeHandshakeAnnotation)) {
    evidence.push_back(fmt::format("{}: {}", protocol::kNodeHandshakeAnnotation, *hs));
  }
  if (running.empty()) {
    report.Add("device-plugin", name, CheckStatus::kPass,
               "dynmig's device plugin does not run on the node", std::move(evidence));
  } else {
    for (auto& e : evidence) running.push_back(std::move(e));
    report.Add("device-plugin", name, CheckStatus::kFail,
               "dynmig's device plugin still runs on the node", std::move(running));
  }
  return true;
}

bool NodeLock(const CheckInput& in, CheckReport& report) {
  if (auto lock = kube::Annotation(*in.node, protocol::kNodeLockAnnotation)) {
    report.Add(
        "node-lock", in.node_name, CheckStatus::kFail,
        fmt::format("the node lock {} is held: a bind is in progress",
                    protocol::kNodeLockAnnotation),
        {fmt::format("{}={}", protocol::kNodeLockAnnotation, *lock),
         "wait for the bind to finish (the scheduler releases a stale lock after its timeout)"});
  } else {
    report.Add("node-lock", in.node_name, CheckStatus::kPass,
               fmt::format("no node lock ({})", protocol::kNodeLockAnnotation));
  }
  return true;
}

// Nothing beyond the saved geometry, and nothing dynmig still holds.
bool Instances(const CheckInput& in, CheckReport& report) {
  const std::string& name = in.node_name;
  const Object* node = in.node;
  const RollbackBackup* backup = in.rollback->backup;
  const CurrentInstances& current = in.rollback->current;
  std::vector<std::string> evidence;
  bool fail = HeldSlicesEvidence(*node, evidence);
  // Once MIG Manager has its labels back (apply restores them only after this proof passed),
  // the instances on the GPUs are the geometry it applies.
  const bool mig_manager_back =
      !backup->geometry && !backup->mig_config.empty() &&
      kube::Label(*node, protocol::kMigConfigLabel) == backup->mig_config &&
      kube::Label(*node, protocol::kMigManagerDeployLabel) != "false";
  if (current.view && mig_manager_back && !fail) {
    report.Add("instances", name, CheckStatus::kPass,
               fmt::format("MIG Manager owns the node's GPUs again ({}={}): their {} instance(s) "
                           "are its geometry ({})",
                           protocol::kMigConfigLabel, backup->mig_config,
                           InstanceCount(*current.view), current.origin));
    return true;
  }
  if (!current.view) {
    evidence.insert(evidence.begin(), current.error);
    report.Add("instances", name, CheckStatus::kFail,
               "cannot prove that no dynamic-MIG instance remains", std::move(evidence));
    return true;
  }
  const GeometryDiff d = Compare(backup->geometry ? &*backup->geometry : nullptr, *current.view);
  for (const auto& e : d.extra) evidence.push_back("not in the saved geometry: " + e);
  fail = fail || !d.extra.empty();
  if (!fail) {
    report.Add("instances", name, CheckStatus::kPass,
               d.matched == 0
                   ? fmt::format("no MIG instance on the node's GPUs ({})", current.origin)
                   : fmt::format("only the saved geometry's instances ({}) on the "
                                 "node's GPUs ({})",
                                 d.matched, current.origin));
    return true;
  }
  evidence.push_back(
      "a dynamic-MIG instance outlived its pod: delete its pods while dynmig's device "
      "plugin runs, or destroy it on the node (dynmig nvml destroy) once no process uses it");
  // Refused for what the node publishes as held when NVML shows nothing extra: say so.
  report.Add("instances", name, CheckStatus::kFail,
             d.extra.empty() ? fmt::format("the node still publishes slices dynmig holds ({}; {})",
                                           protocol::kNodeHeldSlicesAnnotation, current.origin)
                             : fmt::format("{} dynamic-MIG instance{} remain{} ({})",
                                           d.extra.size(), d.extra.size() == 1 ? "" : "s",
                                           d.extra.size() == 1 ? "s" : "", current.origin),
             std::move(evidence));
  return true;
}

bool LegacyConfig(const CheckInput& in, CheckReport& report) {
  const RollbackBackup& backup = *in.rollback->backup;
  const std::string& name = in.node_name;
  if (backup.configmaps.empty()) {
    report.Add("legacy-config", name, CheckStatus::kWarn,
               "the backup holds no device ConfigMap or MIG Manager config: nothing to restore");
    return true;
  }
  std::vector<std::string> restored, differ;
  for (size_t i = 0; i < backup.configmaps.size(); ++i) {
    const Object& cm = backup.configmaps[i];
    const std::string key = kube::ObjectKey(cm);
    const std::optional<Object>& now_cm = in.rollback->configmaps[i];
    if (!now_cm) {
      differ.push_back(fmt::format("ConfigMap {}: missing", key));
      continue;
    }
    const json want = ConfigMapData(cm), have = ConfigMapData(*now_cm);
    if (want == have) {
      restored.push_back(fmt::format("ConfigMap {}: equals the backup", key));
      continue;
    }
    std::vector<std::string> keys;
    for (const auto& [k, v] : want.items()) {
      if (!have.contains(k) || have[k] != v) keys.push_back(k);
    }
    for (const auto& [k, v] : have.items()) {
      if (!want.contains(k)) keys.push_back(k + " (not in the backup)");
    }
    differ.push_back(
        fmt::format("ConfigMap {}: differs from the backup in {}", key, fmt::join(keys, ", ")));
  }
  if (differ.empty()) {
    const size_t n = restored.size();
    report.Add("legacy-config", name, CheckStatus::kPass,
               fmt::format("the backup's {} ConfigMap(s) are restored", n), std::move(restored));
    return true;
  }
  for (auto& e : restored) differ.push_back(std::move(e));
  differ.push_back("dynmig rollback apply restores them from the backup");
  report.Add("legacy-config", name, CheckStatus::kFail, "the legacy configuration is not restored",
             std::move(differ));
  return true;
}

bool MigManagerLabels(const CheckInput& in, CheckReport& report) {
  const RollbackBackup* backup = in.rollback->backup;
  const Object* node = in.node;
  CheckReport& r = report;
  const std::string& name = in.node_name;
  if (const auto keys = RestoredLabels(*backup); !keys.empty()) {
    const auto saved = StringMap(backup->node_record, "labels");
    std::vector<std::string> evidence;
    bool ok = true;
    for (auto k : keys) {
      const auto want = MapValue(saved, k);
      const auto have = kube::Label(*node, k);
      ok = ok && want == have;
      evidence.push_back(fmt::format("{}{} (backup: {}{})", k, Show(have), k, Show(want)));
    }
    r.Add("mig-manager-labels", name, ok ? CheckStatus::kPass : CheckStatus::kFail,
          ok ? "MIG Manager's labels are as the backup has them"
             : "MIG Manager's labels differ from the backup (dynmig rollback apply restores them)",
          std::move(evidence));
  }
  return true;
}

bool Geometry(const CheckInput& in, CheckReport& report) {
  const RollbackBackup* backup = in.rollback->backup;
  const CurrentInstances& current = in.rollback->current;
  const Object* node = in.node;
  CheckReport& r = report;
  const std::string& name = in.node_name;
  if (backup->geometry) {
    if (!current.view) {
      r.Add("geometry", name, CheckStatus::kFail,
            fmt::format("cannot see whether the saved geometry ({} instances, {}) is back",
                        InstanceCount(*backup->geometry), backup->geometry_origin),
            {current.error});
    } else {
      const GeometryDiff d = Compare(&*backup->geometry, *current.view);
      if (d.missing.empty()) {
        r.Add("geometry", name, CheckStatus::kPass,
              fmt::format("the saved geometry is in place: {} instance(s) ({})", d.matched,
                          backup->geometry_origin));
      } else {
        std::vector<std::string> evidence;
        for (const auto& m : d.missing) evidence.push_back("missing: " + m);
        evidence.push_back(
            "dynmig rollback apply --on-node (on the node) recreates them through NVML");
        r.Add("geometry", name, CheckStatus::kFail,
              fmt::format("{} of the saved geometry's {} instance(s) are not there ({})",
                          d.missing.size(), InstanceCount(*backup->geometry),
                          backup->geometry_origin),
              std::move(evidence));
      }
    }
  } else if (!backup->mig_config.empty()) {
    const auto have = kube::Label(*node, protocol::kMigConfigLabel);
    const auto state = kube::Label(*node, protocol::kMigConfigStateLabel);
    std::vector<std::string> evidence = {
        fmt::format("{}{} (backup: {})", protocol::kMigConfigLabel, Show(have), backup->mig_config),
        fmt::format("{}{}", protocol::kMigConfigStateLabel, Show(state))};
    if (have == backup->mig_config && state == "success") {
      r.Add("geometry", name, CheckStatus::kPass,
            fmt::format("MIG Manager applied {} (state success)", backup->mig_config),
            std::move(evidence));
    } else {
      r.Add("geometry", name, CheckStatus::kFail,
            fmt::format("MIG Manager has not applied {} yet", backup->mig_config),
            std::move(evidence));
    }
  } else {
    r.Add("geometry", name, CheckStatus::kFail,
          "the backup holds no fixed geometry for the node (its NVML view was unreachable and it "
          "had no nvidia.com/mig.config)",
          {"pass --geometry FILE: `dynmig nvml instances -o json` (or nvidia-smi's layout turned "
           "into that shape) saved on the node before the migration"});
  }
  return true;
}

bool LegacyRegistration(const CheckInput& in, CheckReport& report) {
  std::vector<std::string> evidence, problems;
  CompareGpuResources(in, evidence, problems);
  CompareRegister(in, evidence, problems);
  if (auto hs = kube::Annotation(*in.node, protocol::kNodeHandshakeAnnotation)) {
    evidence.push_back(fmt::format("{}: {}", protocol::kNodeHandshakeAnnotation, *hs));
  }
  if (problems.empty()) {
    evidence.push_back(fmt::format("uncordon: kubectl uncordon {}", in.node_name));
    report.Add("legacy-registration", in.node_name, CheckStatus::kPass,
               "the legacy device resources are registered as in the backup", std::move(evidence));
    return true;
  }
  for (auto& e : evidence) problems.push_back(std::move(e));
  problems.push_back(
      "start the legacy device plugin (HAMi's, or the GPU Operator's with MIG Manager) and "
      "check again before uncordoning");
  report.Add("legacy-registration", in.node_name, CheckStatus::kFail,
             "the legacy device resources are not registered yet", std::move(problems));
  return true;
}

}  // namespace checks

absl::StatusOr<RollbackCheck> RunRollbackCheck(kube::KubeClient& client,
                                               const RollbackOptions& options, absl::Time now) {
  if (options.node.empty()) return absl::InvalidArgumentError("--node: a node name is required");
  auto backup = LoadRollbackBackup(options.backup_dir, options.node, options.geometry_file);
  if (!backup.ok()) return backup.status();
  auto snap = TakeSnapshot(client, now);
  if (!snap.ok()) return snap.status();
  const Object* node = snap->FindNode(options.node);
  if (node == nullptr) {
    return absl::NotFoundError(fmt::format("node \"{}\" not found", options.node));
  }
  auto facts = ReadRollbackFacts(client, options, *backup, *node);
  if (!facts.ok()) return facts.status();
  CheckInput in;
  in.snapshot = &*snap;
  in.node = node;
  in.node_name = options.node;
  in.pods = ActivePodsOn(*snap, options.node);
  in.schedulable_risk = "new pods can land on it mid-rollback";
  in.rollback = &*facts;
  RollbackCheck out;
  out.report.command = "rollback check";
  RunChecks(CheckCommand::kRollback, CheckScope::kNode, in, out.report);
  for (const auto& i : out.report.items) {
    if (i.status != CheckStatus::kFail) continue;
    if (std::find(kSafetyChecks.begin(), kSafetyChecks.end(), i.check) != kSafetyChecks.end()) {
      out.refused.push_back(fmt::format("{}: {}", i.check, i.summary));
    } else {
      out.to_do.push_back(i.check);
    }
  }
  return out;
}

std::string RollbackCheck::Verdict() const {
  if (!refused.empty()) {
    return fmt::format("rollback refused: {}", fmt::join(refused, "; "));
  }
  if (!to_do.empty()) {
    return fmt::format(
        "safe to restore: nothing dynamic remains; not restored yet: {} (dynmig rollback apply "
        "restores what dynmig can)",
        fmt::join(to_do, ", "));
  }
  return "restored: the node may be uncordoned";
}

nlohmann::json RollbackCheck::ToJson() const {
  json j = report.ToJson();
  j["refused"] = refused;
  j["toDo"] = to_do;
  j["verdict"] = Verdict();
  return j;
}

std::string RollbackCheck::ToText() const { return report.ToText() + Verdict() + "\n"; }

// ---- plan -----------------------------------------------------------------------------------

namespace {

// One step of the rollback plan: what to do, why, how, and the proofs that it was done.
struct PlanStep {
  std::string title, why;
  std::vector<std::string> commands;
  std::vector<std::string> proves;
};

// The step that reapplies the saved fixed geometry (NVML, or MIG Manager through its label).
PlanStep GeometryStep(const RollbackBackup& backup, const std::string& common) {
  const RollbackBackup* b = &backup;
  std::string geometry_why;
  std::vector<std::string> geometry_cmds;
  if (b->geometry) {
    std::vector<std::string> inst;
    for (const auto& g : b->geometry->gpus) {
      for (const auto& i : g.instances) {
        inst.push_back(
            fmt::format("{}: {} at slices {}", GpuName(g), i.profile, Place(i.placement)));
      }
    }
    geometry_why = fmt::format("{} instance(s) from {}: {}", inst.size(), b->geometry_origin,
                               fmt::join(inst, "; "));
    geometry_cmds.push_back(
        fmt::format("dynmig rollback apply {} --on-node   # on the node", common));
  } else if (!b->mig_config.empty()) {
    geometry_why = fmt::format(
        "MIG Manager applies nvidia.com/mig.config={} once its label is back and it is enabled",
        b->mig_config);
    geometry_cmds.push_back(fmt::format("dynmig rollback apply {}   # sets the labels", common));
  } else {
    geometry_why =
        "the backup holds no fixed geometry: give it with --geometry FILE (`dynmig nvml instances "
        "-o json` saved on the node before the migration)";
  }
  return {"Reapply the saved fixed geometry", geometry_why, geometry_cmds, {"geometry"}};
}

// The guide's steps for node `n` (`after`: dynamic-MIG pods have run on it).
std::vector<PlanStep> PlanSteps(const RollbackBackup& backup, const std::string& n,
                                const std::string& common, bool after) {
  const RollbackBackup* b = &backup;
  std::vector<PlanStep> steps;
  steps.push_back({"Keep the node cordoned",
                   "nothing new may land on it while its MIG controller changes",
                   {fmt::format("kubectl cordon {}", n)},
                   {"cordoned"}});
  steps.push_back(
      {"Drain the dynamic-MIG pods (after dynamic pods have run)",
       after ? "dynamic-MIG pods or reservations are on the node now; drain them while dynmig's "
               "device plugin still runs so it reclaims their instances (the legacy "
               "implementation cannot inherit them)"
             : "no dynamic-MIG pod is on the node now (before production workloads resumed): "
               "nothing to drain",
       {fmt::format("kubectl drain {} --ignore-daemonsets --delete-emptydir-data", n)},
       {"dynamic-pods", "reservations", "instances"}});
  steps.push_back(
      {"Stop dynmig's MIG service on the node",
       fmt::format("the device-plugin DaemonSet selects {}={}; without the label its pod leaves "
                   "the node and nothing of dynmig creates or destroys instances there",
                   protocol::kMigServiceLabel, kMigServiceLabelValue),
       {fmt::format("kubectl label node {} {}-", n, protocol::kMigServiceLabel),
        fmt::format(
            "kubectl -n dynmig-system get pods -l app.kubernetes.io/component=device-plugin "
            "--field-selector spec.nodeName={}   # until none",
            n)},
       {"mig-service", "device-plugin", "node-lock"}});
  steps.push_back({"Prove that nothing dynamic remains",
                   "every safety item must PASS before anything is restored",
                   {fmt::format("dynmig rollback check {} --on-node   # on the node (NVML); "
                                "elsewhere: --instances FILE",
                                common)},
                   {"cordoned", "dynamic-pods", "reservations", "mig-service", "device-plugin",
                    "node-lock", "instances"}});
  std::vector<std::string> cms;
  for (const auto& cm : b->configmaps) cms.push_back("ConfigMap " + kube::ObjectKey(cm));
  std::vector<std::string> restore_proves = {"legacy-config"};
  if (!RestoredLabels(backup).empty()) restore_proves.push_back("mig-manager-labels");
  steps.push_back(
      {"Restore the legacy configuration",
       cms.empty()
           ? "the backup holds no ConfigMap to restore"
           : fmt::format("from the backup: {}{}", fmt::join(cms, ", "),
                         RestoredLabels(backup).empty() ? "" : "; MIG Manager's node labels"),
       {fmt::format("dynmig rollback apply {}", common)},
       restore_proves});
  steps.push_back(GeometryStep(backup, common));
  steps.push_back(
      {"Start the legacy controller and verify its registration, then uncordon",
       "the legacy device plugin (HAMi's, or the GPU Operator's with MIG Manager) registers the "
       "device resources the backup recorded; only then may pods land",
       {"start the legacy device plugin as before the migration (do not roll dynmig's binaries "
        "back in place: the legacy one cannot inherit dynmig's state)",
        fmt::format("dynmig rollback check {}", common), fmt::format("kubectl uncordon {}", n)},
       {"legacy-registration"}});
  return steps;
}

// The plan as JSON and text, each step with the current result of its proofs.
CommandOutput RenderPlan(const std::vector<PlanStep>& steps, const RollbackCheck& check,
                         const RollbackOptions& options, bool after) {
  const std::string& n = options.node;
  auto result = [&](const std::string& id) -> std::string {
    auto items = check.report.Find(id, n);
    return items.empty() ? "-" : CheckStatusName(items.front()->status);
  };
  CommandOutput out;
  out.json = {{"node", n},
              {"backup", options.backup_dir},
              {"case", after ? "after-dynamic-pods" : "before-production"},
              {"steps", json::array()}};
  std::string text = fmt::format("Rollback of node {} to its fixed MIG geometry (backup {}); {}.\n",
                                 n, options.backup_dir,
                                 after ? "dynamic-MIG pods have run: drain them first"
                                       : "no dynamic-MIG pod on the node now: the canary case");
  for (size_t i = 0; i < steps.size(); ++i) {
    const PlanStep& s = steps[i];
    json proves = json::array();
    std::vector<std::string> proof_text;
    for (const auto& p : s.proves) {
      proves.push_back({{"check", p}, {"now", result(p)}});
      proof_text.push_back(fmt::format("{} ({} now)", p, result(p)));
    }
    out.json["steps"].push_back({{"step", i + 1},
                                 {"title", s.title},
                                 {"why", s.why},
                                 {"commands", s.commands},
                                 {"proves", proves}});
    text += fmt::format("\n{}. {}\n   {}\n", i + 1, s.title, s.why);
    for (const auto& c : s.commands) text += "   $ " + c + "\n";
    text += fmt::format("   proof: {}\n", fmt::join(proof_text, ", "));
  }
  text += fmt::format("\nNow: {}\n", check.Verdict());
  out.json["verdict"] = check.Verdict();
  out.text = std::move(text);
  return out;
}

}  // namespace

absl::StatusOr<CommandOutput> RunRollbackPlan(kube::KubeClient& client,
                                              const RollbackOptions& options, absl::Time now) {
  auto check = RunRollbackCheck(client, options, now);
  if (!check.ok()) return check.status();
  auto backup = LoadRollbackBackup(options.backup_dir, options.node, options.geometry_file);
  if (!backup.ok()) return backup.status();
  const std::string& n = options.node;
  const std::string common =
      fmt::format("--node {} --backup {}{}", n, options.backup_dir,
                  options.geometry_file.empty() ? "" : " --geometry " + options.geometry_file);
  const auto dyn = check->report.Find("dynamic-pods", n);
  const auto res = check->report.Find("reservations", n);
  const bool after = (!dyn.empty() && dyn.front()->status == CheckStatus::kFail) ||
                     (!res.empty() && res.front()->status == CheckStatus::kFail);
  return RenderPlan(PlanSteps(*backup, n, common, after), *check, options, after);
}

// ---- apply ----------------------------------------------------------------------------------

namespace {

// What `rollback apply` changed, left as it was, and leaves to the operator.
struct ApplyLog {
  std::vector<std::string> changes, unchanged, not_done;

  // A failed write or read, with the changes made before it.
  absl::Status Failed(const absl::Status& st, const std::string& what) const {
    return absl::Status(
        st.code(),
        fmt::format("{}: {}; changes made before it: {}", what, std::string(st.message()),
                    changes.empty() ? "none" : fmt::format("{}", fmt::join(changes, "; "))));
  }
};

// The backup's ConfigMaps: created when missing, their data restored when it differs.
absl::Status RestoreConfigMaps(kube::KubeClient& client, const RollbackBackup& backup,
                               ApplyLog& log) {
  for (const auto& cm : backup.configmaps) {
    const std::string key = kube::ObjectKey(cm);
    const json want = ConfigMapData(cm);
    auto have = client.Get(kube::Resource::kConfigMaps, kube::Namespace(cm), kube::Name(cm));
    if (!have.ok() && !absl::IsNotFound(have.status()))
      return log.Failed(have.status(), "read " + key);
    if (!have.ok()) {
      json obj = {{"apiVersion", "v1"},
                  {"kind", "ConfigMap"},
                  {"metadata", {{"name", kube::Name(cm)}, {"namespace", kube::Namespace(cm)}}},
                  {"data", want}};
      if (const auto labels = kube::Labels(cm); !labels.empty()) obj["metadata"]["labels"] = labels;
      auto created = client.Create(kube::Resource::kConfigMaps, obj);
      if (!created.ok()) return log.Failed(created.status(), "create " + key);
      std::vector<std::string> keys;
      for (const auto& [k, v] : want.items()) keys.push_back(k);
      log.changes.push_back(fmt::format("ConfigMap {}: created from the backup (keys {})", key,
                                        fmt::join(keys, ", ")));
      continue;
    }
    const json cur = ConfigMapData(*have);
    if (cur == want) {
      log.unchanged.push_back(fmt::format("ConfigMap {}: already as in the backup", key));
      continue;
    }
    json patch = json::object();
    std::vector<std::string> set, removed;
    for (const auto& [k, v] : want.items()) {
      if (!cur.contains(k) || cur[k] != v) {
        patch[k] = v;
        set.push_back(k);
      }
    }
    for (const auto& [k, v] : cur.items()) {
      if (!want.contains(k)) {
        patch[k] = nullptr;
        removed.push_back(k);
      }
    }
    auto patched = client.Patch(kube::Resource::kConfigMaps, kube::Namespace(cm), kube::Name(cm),
                                {{"data", patch}}, kube::PatchType::kMerge, "");
    if (!patched.ok()) return log.Failed(patched.status(), "update " + key);
    log.changes.push_back(
        fmt::format("ConfigMap {}: restored {} from the backup{}", key, fmt::join(set, ", "),
                    removed.empty() ? "" : fmt::format("; removed {}", fmt::join(removed, ", "))));
  }
  return absl::OkStatus();
}

// MIG Manager's labels as the backup has them; dynmig's registration annotations removed when the
// backup had no HAMi registration.
absl::Status RestoreNodeMetadata(kube::KubeClient& client, const RollbackBackup& backup,
                                 const std::string& n, ApplyLog& log) {
  auto node = client.GetNode(n);
  if (!node.ok()) return log.Failed(node.status(), "read node " + n);
  kube::MetadataPatch patch;
  const auto saved_labels = StringMap(backup.node_record, "labels");
  for (auto k : RestoredLabels(backup)) {
    const auto want = MapValue(saved_labels, k);
    const auto have = kube::Label(*node, k);
    if (want == have) {
      log.unchanged.push_back(fmt::format("node {}: label {}{}", n, k, Show(have)));
      continue;
    }
    patch.labels[std::string(k)] = want;
    log.changes.push_back(fmt::format("node {}: label {}{} (was {})", n, k,
                                      want ? "=" + *want : " removed", have.value_or("absent")));
  }
  if (!BackupHasRegister(backup)) {
    for (std::string_view k :
         {protocol::kNodeRegisterAnnotation, protocol::kNodeHandshakeAnnotation,
          protocol::kNodeHeldSlicesAnnotation}) {
      if (!kube::Annotation(*node, k)) continue;
      patch.annotations[std::string(k)] = std::nullopt;
      log.changes.push_back(fmt::format(
          "node {}: removed dynmig's annotation {} (the backup had no HAMi registration)", n, k));
    }
  }
  if (!patch.labels.empty() || !patch.annotations.empty()) {
    auto patched = client.PatchNodeMetadata(n, patch);
    if (!patched.ok()) return log.Failed(patched.status(), "patch node " + n);
  }
  return absl::OkStatus();
}

// Recreates, through NVML, each instance of the saved geometry the node lacks.
absl::Status ReapplyGeometry(nvml::Nvml& nv, const RollbackBackup& backup, ApplyLog& log) {
  auto current = ReadNvmlInstances(nv);
  if (!current.ok()) return log.Failed(current.status(), "read the node's MIG instances");
  for (const auto& saved_gpu : backup.geometry->gpus) {
    const NvmlGpuView* gpu = nullptr;
    for (const auto& g : current->gpus) {
      if (SavedGpu(*backup.geometry, g) == &saved_gpu) gpu = &g;
    }
    if (gpu == nullptr) {
      return log.Failed(absl::FailedPreconditionError(
                            fmt::format("{} of the saved geometry is not on this node ({})",
                                        GpuName(saved_gpu), nv.Description())),
                        "reapply the geometry");
    }
    if (!gpu->mig_enabled.value_or(false) && !saved_gpu.instances.empty()) {
      return log.Failed(absl::FailedPreconditionError(fmt::format(
                            "MIG mode is disabled on {}: enable it first (nvidia-smi -i {} -mig 1)",
                            GpuName(*gpu), gpu->index)),
                        "reapply the geometry");
    }
    std::vector<mig::ProfileSpec> profiles;
    if (!saved_gpu.instances.empty()) {
      auto p = nvml::DiscoverProfiles(nv, gpu->index);
      if (!p.ok()) return log.Failed(p.status(), "read the profiles of " + GpuName(*gpu));
      profiles = std::move(*p);
    }
    for (const auto& si : saved_gpu.instances) {
      bool present = false;
      for (const auto& i : gpu->instances) present = present || SameInstance(si, i);
      const std::string what =
          fmt::format("{}: {} at slices {}", GpuName(*gpu), si.profile, Place(si.placement));
      if (present) {
        log.unchanged.push_back(what + ": already there");
        continue;
      }
      const mig::ProfileSpec* spec = nullptr;
      for (const auto& p : profiles) {
        if (p.name == si.profile) spec = &p;
      }
      if (spec == nullptr) {
        return log.Failed(absl::FailedPreconditionError(
                              fmt::format("{} has no profile {}", GpuName(*gpu), si.profile)),
                          "reapply " + what);
      }
      auto gi = nv.CreateGpuInstance(gpu->index, spec->nvml_id, si.placement);
      if (!gi.ok()) return log.Failed(gi.status(), "create " + what);
      auto ci = nv.CreateComputeInstance(gpu->index, gi->id);
      if (!ci.ok())
        return log.Failed(ci.status(),
                          fmt::format("create the CI of {} (GI {} was created)", what, gi->id));
      log.changes.push_back(
          fmt::format("{}: created (GI {}, CI {}, {})", what, gi->id, ci->id, ci->mig_uuid));
    }
  }
  return absl::OkStatus();
}

// What dynmig leaves to the operator once the restorable is restored.
void NotDone(const RollbackBackup& backup, bool has_nvml, const std::string& n, ApplyLog& log) {
  if (backup.geometry && has_nvml) {
    // Reapplied through NVML.
  } else if (backup.geometry) {
    log.not_done.push_back(fmt::format(
        "the fixed geometry ({} instance(s), {}) was not reapplied: no NVML access here; run "
        "`dynmig rollback apply --node {} --backup {} --on-node` on the node",
        InstanceCount(*backup.geometry), backup.geometry_origin, n, backup.dir));
  } else if (!backup.mig_config.empty()) {
    log.not_done.push_back(
        fmt::format("MIG Manager applies {}={} when it runs on the node (watch {} become success)",
                    protocol::kMigConfigLabel, backup.mig_config, protocol::kMigConfigStateLabel));
  } else {
    log.not_done.push_back(
        "no fixed geometry to reapply: the backup has none (pass --geometry FILE)");
  }
  log.not_done.push_back(fmt::format(
      "start the legacy device plugin, then `dynmig rollback check --node {} --backup {}` until "
      "legacy-registration PASSes, then kubectl uncordon {}",
      n, backup.dir, n));
}

}  // namespace

absl::StatusOr<RollbackApply> RunRollbackApply(kube::KubeClient& client,
                                               const RollbackOptions& options, absl::Time now) {
  auto check = RunRollbackCheck(client, options, now);
  if (!check.ok()) return check.status();
  RollbackApply out;
  if (!check->refused.empty()) {
    out.refused = true;
    out.output.json = check->ToJson();
    out.output.json["applied"] = false;
    out.output.text =
        check->ToText() + "rollback apply: nothing was changed (every safety item must PASS)\n";
    return out;
  }
  auto backup = LoadRollbackBackup(options.backup_dir, options.node, options.geometry_file);
  if (!backup.ok()) return backup.status();
  const std::string& n = options.node;
  ApplyLog log;
  if (auto st = RestoreConfigMaps(client, *backup, log); !st.ok()) return st;
  if (auto st = RestoreNodeMetadata(client, *backup, n, log); !st.ok()) return st;
  if (backup->geometry && options.nvml != nullptr) {
    if (auto st = ReapplyGeometry(*options.nvml, *backup, log); !st.ok()) return st;
  }
  NotDone(*backup, options.nvml != nullptr, n, log);

  std::string text =
      fmt::format("rollback apply on node {}: {} change(s)\n", n, log.changes.size());
  for (const auto& c : log.changes) text += "  changed: " + c + "\n";
  for (const auto& u : log.unchanged) text += "  unchanged: " + u + "\n";
  for (const auto& d : log.not_done) text += "  not done by dynmig: " + d + "\n";
  out.output.text = std::move(text);
  out.output.json = {{"node", n},
                     {"applied", true},
                     {"refused", false},
                     {"changes", log.changes},
                     {"unchanged", log.unchanged},
                     {"notDone", log.not_done}};
  return out;
}

}  // namespace dynmig::ops
