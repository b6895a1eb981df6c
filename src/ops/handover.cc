#include "ops/handover.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "common/quantity.h"
#include "common/strings.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "ops/checks.h"
#include "ops/preflight.h"
#include "ops/validate.h"
#include "protocol/annotations.h"
#include "protocol/devices.h"
#include "protocol/held_slices.h"
#include "protocol/mig_allocations.h"
#include "protocol/node_register.h"

namespace dynmig::ops {
namespace {

using kube::Object;
using nlohmann::json;

constexpr std::string_view kOriginLegacy = "legacy";

// One device a legacy pod was given, to be found among the view's holders.
struct Want {
  std::string what;       // as LegacyPod::devices shows it
  std::string gpu_uuid;   // HAMi: the identity's GPU
  std::string container;  // NVIDIA: the container that requested it
  std::string resource;   // NVIDIA: nvidia.com/mig-<profile>
  std::string profile;    // NVIDIA: <profile>
  uint64_t count = 1;
};

std::string PlacementText(const mig::Placement& p) { return fmt::format("{}+{}", p.start, p.size); }

std::string InstanceName(const HandoverInstance& i) {
  return fmt::format("GPU {} {}@{} (GI {}, {})", i.gpu_index, i.instance.profile,
                     PlacementText(i.instance.placement), i.instance.gpu_instance_id,
                     i.instance.mig_uuid().empty() ? "no MIG UUID" : i.instance.mig_uuid());
}

std::string HolderText(const NvmlHolder& h) {
  std::string who = h.name.empty() ? "pod UID " + h.pod_uid : h.ns + "/" + h.name;
  std::vector<std::string> parts;
  if (!h.container.empty()) parts.push_back("container " + h.container);
  if (!h.resource.empty()) parts.push_back(h.resource);
  if (!h.source.empty()) parts.push_back(h.source);
  return parts.empty() ? who : fmt::format("{} ({})", who, fmt::join(parts, ", "));
}

bool HolderIsPod(const NvmlHolder& h, const Object& pod) {
  const std::string uid = kube::Uid(pod);
  if (!h.pod_uid.empty() && !uid.empty()) return h.pod_uid == uid;
  return !h.name.empty() && h.ns == kube::Namespace(pod) && h.name == kube::Name(pod);
}

// The HAMi legacy ids of a pod, each once ("GPU-…[t-s]").
std::vector<std::string> HamiIds(const Object& pod) {
  std::vector<std::string> out;
  for (const auto& line : LegacyIdentities(pod)) {
    const size_t cut = line.rfind(" (");
    std::string id = cut == std::string::npos ? line : line.substr(0, cut);
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(std::move(id));
  }
  return out;
}

// A device count as the API server serves it (a number, or a quantity such as "2" or "1k").
uint64_t QuantityCount(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_string()) {
    auto q = ParseQuantity(v.get_ref<const std::string&>());
    if (q.ok()) {
      if (auto n = q->AsInt64(); n.has_value() && *n >= 0) return static_cast<uint64_t>(*n);
    }
  }
  return 1;  // unreadable: at least one device is asked for
}

// NVIDIA device-plugin requests (nvidia.com/mig-<profile>) of each container.
std::vector<Want> NvidiaWants(const Object& pod) {
  std::vector<Want> out;
  for (const Object* c : IndexedContainers(pod)) {
    if (!c->is_object()) continue;
    const std::string name = c->value("name", "");
    const auto res = c->find("resources");
    if (res == c->end() || !res->is_object()) continue;
    std::set<std::string> seen;
    for (const char* section : {"limits", "requests"}) {
      const auto list = res->find(section);
      if (list == res->end() || !list->is_object()) continue;
      for (const auto& [key, value] : list->items()) {
        auto profile = protocol::MigResourceProfile(key);
        if (!profile.has_value() || !seen.insert(key).second) continue;
        Want w;
        w.container = name;
        w.resource = key;
        w.profile = std::move(*profile);
        w.count = QuantityCount(value);
        w.what = fmt::format("container {}: {} x{}", name, key, w.count);
        out.push_back(std::move(w));
      }
    }
  }
  return out;
}

std::vector<Want> WantsOf(const Object& pod) {
  std::vector<Want> wants;
  for (const auto& id : HamiIds(pod)) {
    auto parsed = protocol::ParseLegacyMigIdentity(id);
    Want w;
    w.what = id;
    w.gpu_uuid = parsed ? parsed->gpu_uuid : "";
    wants.push_back(std::move(w));
  }
  for (auto& w : NvidiaWants(pod)) wants.push_back(std::move(w));
  return wants;
}

std::string ReclaimText(const NvmlGpuView& gpu, const NvmlInstanceView& inst,
                        const protocol::DeviceConfig& config) {
  const mig::AllowlistEntry* entry = config.allowlist.Match(gpu.name);
  const bool allowed = entry != nullptr && std::find(entry->profiles.begin(), entry->profiles.end(),
                                                     inst.profile) != entry->profiles.end();
  if (config.warm_instances.enabled && allowed) {
    return fmt::format(
        "then kept idle as a warm instance ({} is allowlisted, warm instances are "
        "on) or reclaimed",
        inst.profile);
  }
  return fmt::format(
      "then reclaimed once no process runs on it (destroyed; {})",
      allowed ? "warm instances are off" : inst.profile + " is not allowlisted here");
}

HandoverInstance Classify(const NvmlGpuView& gpu, const NvmlInstanceView& inst,
                          const protocol::DeviceConfig& config) {
  HandoverInstance h;
  h.gpu_index = gpu.index;
  h.gpu_uuid = gpu.uuid;
  h.instance = inst;
  if (inst.managed && inst.origin != kOriginLegacy) {
    h.fate = InstanceFate::kDynmig;
    h.action = inst.owner_name.empty()
                   ? "dynmig's own instance"
                   : fmt::format("dynmig's instance of {}/{}", inst.owner_ns, inst.owner_name);
  } else if (inst.managed && !inst.holders.empty()) {
    h.fate = InstanceFate::kHeld;
    h.action = "kept until its holders end, " + ReclaimText(gpu, inst, config);
  } else if (inst.managed && inst.idle) {
    h.fate = InstanceFate::kIdle;
    h.action = "its holders ended: kept idle as a warm instance";
  } else if (inst.managed) {
    h.fate = InstanceFate::kHeld;
    h.action = "its holders ended: reclaimed once no process runs on it";
  } else if (inst.unproven) {
    h.fate = InstanceFate::kUnproven;
    h.action = "kept, never destroyed: " + *inst.unproven;
  } else if (inst.free) {
    h.fate = InstanceFate::kFree;
    h.action = "no holder: cleaned once its GPU is idle; its slices become dynamic";
  } else {
    h.fate = InstanceFate::kUnattributed;
    h.action = "kept: the device plugin did not attribute it (too old, or not reconciled yet)";
  }
  return h;
}

// Finds each want of `lp` among the held instances (each instance counts once per pod).
void Attribute(LegacyPod& lp, const std::vector<Want>& wants,
               std::vector<HandoverInstance>& instances) {
  std::set<size_t> used;
  for (const Want& w : wants) {
    uint64_t found = 0;
    for (size_t i = 0; i < instances.size() && found < w.count; ++i) {
      HandoverInstance& inst = instances[i];
      if (inst.fate != InstanceFate::kHeld || used.count(i)) continue;
      if (!w.gpu_uuid.empty() && inst.gpu_uuid != w.gpu_uuid) continue;
      const bool match = std::any_of(
          inst.instance.holders.begin(), inst.instance.holders.end(), [&](const NvmlHolder& h) {
            if (!HolderIsPod(h, *lp.pod)) return false;
            if (w.resource.empty()) return true;
            const bool container = h.container.empty() || h.container == w.container;
            return container && (h.resource == w.resource || inst.instance.profile == w.profile);
          });
      if (!match) continue;
      used.insert(i);
      ++found;
      lp.found.push_back(fmt::format("{}: {}", w.what, InstanceName(inst)));
      if (std::find(inst.legacy_pods.begin(), inst.legacy_pods.end(), lp.key) ==
          inst.legacy_pods.end()) {
        inst.legacy_pods.push_back(lp.key);
      }
    }
    if (found >= w.count) continue;
    std::string line =
        w.gpu_uuid.empty() && w.resource.empty()
            ? fmt::format("{}: not a GPU-uuid[t-s] identity naming a GPU", w.what)
            : fmt::format("{}: {} of {} found among the holders", w.what, found, w.count);
    std::vector<std::string> unproven;
    for (const auto& inst : instances) {
      const bool here = w.gpu_uuid.empty() || inst.gpu_uuid == w.gpu_uuid;
      if (here &&
          (inst.fate == InstanceFate::kUnproven || inst.fate == InstanceFate::kUnattributed)) {
        unproven.push_back(InstanceName(inst));
      }
    }
    if (!unproven.empty()) line += fmt::format(" (unproven here: {})", fmt::join(unproven, "; "));
    lp.missing.push_back(std::move(line));
  }
}

void AddBlocker(HandoverPlan& plan, BlockerCheck check, std::string id, std::string summary,
                std::vector<std::string> evidence = {}) {
  plan.blockers.push_back({check, std::move(id), std::move(summary), std::move(evidence)});
}

// proof: the view, its evidence, every instance attributed, every legacy pod found.
void ProofBlockers(HandoverPlan& plan) {
  if (!plan.view_error.ok()) {
    AddBlocker(plan, BlockerCheck::kProof, "nvml-view",
               "no NVML view of the node: dynmig's device plugin must serve it to prove the "
               "legacy instances",
               {std::string(plan.view_error.message())});
    return;
  }
  if (!plan.evidence) {
    AddBlocker(plan, BlockerCheck::kProof, "evidence",
               "the device plugin's view has no `evidence`: it is too old to attribute legacy "
               "instances (upgrade it)");
  } else {
    const NvmlEvidence& e = *plan.evidence;
    if (!e.pod_resources.ok) {
      AddBlocker(plan, BlockerCheck::kProof, "pod-resources",
                 "the kubelet's PodResources API did not answer: every untracked instance is "
                 "unproven",
                 {e.pod_resources.error.empty() ? "no error given" : e.pod_resources.error});
    }
    const bool hami =
        std::any_of(plan.legacy_pods.begin(), plan.legacy_pods.end(),
                    [](const LegacyPod& p) { return p.kind == LegacyPod::Kind::kHami; });
    if (!e.runtime.ok && hami) {
      std::vector<std::string> ev = {e.runtime.configured
                                         ? "runtime: " + e.runtime.error
                                         : "runtime: not configured (device plugin --cri-socket)"};
      for (const auto& p : plan.legacy_pods) {
        if (p.kind == LegacyPod::Kind::kHami) ev.push_back("HAMi legacy pod " + p.key);
      }
      AddBlocker(plan, BlockerCheck::kProof, "runtime-evidence",
                 "HAMi legacy pods run, and only the container runtime proves their instances: "
                 "the runtime's evidence is missing",
                 std::move(ev));
    }
  }
  std::vector<std::string> unproven;
  for (const auto& i : plan.instances) {
    if (i.fate == InstanceFate::kUnproven || i.fate == InstanceFate::kUnattributed) {
      unproven.push_back(fmt::format("{}: {}", InstanceName(i), i.action));
    }
  }
  if (!unproven.empty()) {
    const size_t n = unproven.size();
    AddBlocker(
        plan, BlockerCheck::kProof, "unproven",
        fmt::format("{} instance{} not proven (kept, never destroyed)", n, n == 1 ? "" : "s"),
        std::move(unproven));
  }
  std::vector<std::string> missing;
  for (const auto& p : plan.legacy_pods) {
    for (const auto& m : p.missing) missing.push_back(p.key + ": " + m);
  }
  if (!missing.empty()) {
    AddBlocker(plan, BlockerCheck::kProof, "legacy-pod",
               "a legacy pod's instance is not found among the holders the view proves",
               std::move(missing));
  }
}

// overlap: every kept legacy instance published as held; no reservation overlapping one.
void OverlapBlockers(HandoverPlan& plan, const Object& node,
                     const std::vector<const Object*>& pods) {
  if (!plan.view_error.ok()) return;
  const auto held_value = kube::Annotation(node, protocol::kNodeHeldSlicesAnnotation);
  auto held =
      held_value
          ? protocol::DecodeHeldSlices(*held_value)
          : absl::StatusOr<std::vector<protocol::HeldSlices>>(std::vector<protocol::HeldSlices>{});
  if (!held.ok()) {
    AddBlocker(plan, BlockerCheck::kOverlap, "mig-held",
               fmt::format("{} does not decode: the scheduler cannot see the held slices",
                           protocol::kNodeHeldSlicesAnnotation),
               {std::string(held.status().message())});
  }
  std::vector<std::string> unpublished;
  for (auto& i : plan.instances) {
    if (held.ok()) {
      i.published_held = std::any_of(held->begin(), held->end(), [&](const auto& h) {
        return h.gpu_uuid == i.gpu_uuid && h.placement == i.instance.placement;
      });
    }
    const bool kept = i.fate == InstanceFate::kHeld || i.fate == InstanceFate::kUnproven ||
                      i.fate == InstanceFate::kUnattributed;
    if (held.ok() && kept && !i.published_held) unpublished.push_back(InstanceName(i));
  }
  if (!unpublished.empty()) {
    AddBlocker(plan, BlockerCheck::kOverlap, "not-published",
               fmt::format("legacy instances missing from {}: the scheduler may reserve their "
                           "slices",
                           protocol::kNodeHeldSlicesAnnotation),
               std::move(unpublished));
  }
  std::vector<std::string> overlaps;
  for (const Object* p : pods) {
    const auto value = kube::Annotation(*p, protocol::kMigAllocationsAnnotation);
    if (!value) continue;
    auto allocs = protocol::DecodeMigAllocations(*value);
    if (!allocs.ok()) continue;  // validate's pod-reservation reports it
    for (const auto& a : *allocs) {
      for (const auto& i : plan.instances) {
        if (i.fate == InstanceFate::kDynmig || i.gpu_uuid != a.gpu_uuid ||
            !i.instance.placement.Overlaps(a.placement)) {
          continue;
        }
        overlaps.push_back(fmt::format("{} reserves {} {}@{}, over the legacy {}", PodKey(*p),
                                       a.gpu_uuid, a.profile, PlacementText(a.placement),
                                       InstanceName(i)));
      }
    }
  }
  if (!overlaps.empty()) {
    AddBlocker(plan, BlockerCheck::kOverlap, "reservation",
               "an active dynmig reservation overlaps a live legacy instance", std::move(overlaps));
  }
}

constexpr std::string_view kHamiComponentLabel = "app.kubernetes.io/component";
constexpr std::string_view kHamiDevicePluginComponent = "hami-device-plugin";
constexpr size_t kMaxShown = 256;  // characters of a pod's own string shown in evidence

std::string Bounded(std::string_view s) {
  if (s.size() <= kMaxShown) return std::string(s);
  return fmt::format("{}... ({} characters)", s.substr(0, kMaxShown), s.size());
}

// HAMi's image: the repository (without registry port, tag or digest) has a "projecthami" path
// component, or its last component is "hami" or starts with "hami-" (case-insensitive).
bool IsHamiImage(std::string_view ref) {
  ref = ref.substr(0, ref.find('@'));
  const size_t slash = ref.rfind('/');
  if (const size_t colon = ref.rfind(':');
      colon != std::string_view::npos && (slash == std::string_view::npos || colon > slash)) {
    ref = ref.substr(0, colon);
  }
  std::string lower(ref);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  std::string_view path = lower;
  std::string_view last;
  while (true) {
    const size_t pos = path.find('/');
    last = path.substr(0, pos);
    if (last == "projecthami") return true;
    if (pos == std::string_view::npos) break;
    path.remove_prefix(pos + 1);
  }
  return last == "hami" || last.starts_with("hami-");
}

// " (owner DaemonSet hami-device-plugin)" from the first owner reference, or "".
std::string OwnerText(const Object& pod) {
  const auto meta = pod.find("metadata");
  if (meta == pod.end() || !meta->is_object()) return "";
  const auto refs = meta->find("ownerReferences");
  if (refs == meta->end() || !refs->is_array() || refs->empty() || !refs->front().is_object()) {
    return " (no owner)";
  }
  const json& ref = refs->front();
  auto field = [&](const char* key) {
    const auto it = ref.find(key);
    return it != ref.end() && it->is_string() ? Bounded(it->get_ref<const std::string&>())
                                              : std::string("?");
  };
  return fmt::format(" (owner {} {})", field("kind"), field("name"));
}

// allocator: nothing of the legacy allocators still serves the node.
void AllocatorBlockers(HandoverPlan& plan, const Object& node,
                       const std::vector<const Object*>& pods) {
  std::vector<std::string> allocatable;
  const auto status = node.find("status");
  const json none = json::object();
  for (const auto& [k, v] : NvidiaResources(status != node.end() ? *status : none, "allocatable")) {
    if (protocol::MigResourceProfile(k).has_value() && v != "0") {
      allocatable.push_back(fmt::format("{}={}", k, v));
    }
  }
  if (!allocatable.empty()) {
    allocatable.push_back(
        "NVIDIA's device plugin still advertises MIG resources: stop it on this node");
    AddBlocker(
        plan, BlockerCheck::kAllocator, "allocatable",
        fmt::format("the node's allocatable still has {}* resources", protocol::kMigResourcePrefix),
        std::move(allocatable));
  }
  std::vector<std::string> plugins, managers;
  for (const Object* p : pods) {
    if (IsNvidiaDevicePluginPod(*p)) plugins.push_back(PodLine(*p));
    if (IsMigManagerPod(*p)) managers.push_back(PodLine(*p));
  }
  if (!plugins.empty()) {
    AddBlocker(plan, BlockerCheck::kAllocator, "nvidia-device-plugin",
               "NVIDIA's device plugin runs on the node (new legacy allocations can happen)",
               std::move(plugins));
  }
  if (!managers.empty()) {
    AddBlocker(plan, BlockerCheck::kAllocator, "mig-manager", "NVIDIA MIG Manager runs on the node",
               std::move(managers));
  }
  // HAMi's plugin: only pods the kubelet of this node runs (spec.nodeName), not pods that merely
  // name the node in hami.io/vgpu-node (anyone can write that annotation on any pod).
  std::vector<std::string> hami;
  for (const Object* p : pods) {
    if (kube::NodeName(*p) != plan.node) continue;
    if (auto why = HamiDevicePluginSignal(*p)) {
      hami.push_back(fmt::format("{}{}: {}", PodLine(*p), OwnerText(*p), *why));
    }
  }
  if (!hami.empty()) {
    hami.push_back(fmt::format(
        "take the node out of HAMi's device-plugin DaemonSet (HAMi's chart selects nodes by "
        "devicePlugin.nvidiaNodeSelector, gpu=on by default: kubectl label node {} gpu-) and wait "
        "for its pod to end; a pod listed here that is not HAMi's carries its labels or image",
        plan.node));
    AddBlocker(plan, BlockerCheck::kAllocator, "hami-device-plugin",
               "HAMi's device plugin runs on the node (it serves nvidia.com/gpu: new legacy "
               "allocations can happen)",
               std::move(hami));
  }
  const auto deploy = kube::Label(node, protocol::kMigManagerDeployLabel);
  const auto config = kube::Label(node, protocol::kMigConfigLabel);
  if (deploy && *deploy != "false") {
    AddBlocker(plan, BlockerCheck::kAllocator, "mig-manager-label",
               fmt::format("{}={}: the GPU Operator would run MIG Manager here (set it to false)",
                           protocol::kMigManagerDeployLabel, *deploy));
  } else if (!deploy && config) {
    AddBlocker(plan, BlockerCheck::kAllocator, "mig-manager-label",
               fmt::format("{}={} and no {}=false: MIG Manager would reapply the geometry",
                           protocol::kMigConfigLabel, *config, protocol::kMigManagerDeployLabel));
  }
  if (const auto reg = kube::Annotation(node, protocol::kNodeRegisterAnnotation)) {
    if (auto findings = protocol::DetectLegacyNodeRegister(*reg); !findings.empty()) {
      AddBlocker(plan, BlockerCheck::kAllocator, "register-format",
                 fmt::format("{} is in the legacy template format: HAMi's legacy device plugin "
                             "still serves the node",
                             protocol::kNodeRegisterAnnotation),
                 std::move(findings));
    }
  }
}

const char* BlockerCheckName(BlockerCheck c) {
  switch (c) {
    case BlockerCheck::kProof:
      return "proof";
    case BlockerCheck::kOverlap:
      return "overlap";
    case BlockerCheck::kAllocator:
      return "allocator";
  }
  return "?";
}

json EvidenceJson(const NvmlEvidenceSource& e) {
  if (!e.configured) return {{"configured", false}};
  json j = {{"ok", e.ok}};
  if (!e.error.empty()) j["error"] = e.error;
  return j;
}

std::string EvidenceText(const NvmlEvidenceSource& e) {
  if (!e.configured) return "not configured";
  return e.ok ? "ok" : "failed: " + e.error;
}

json InstanceJson(const HandoverInstance& i) {
  json holders = json::array();
  for (const auto& h : i.instance.holders) {
    holders.push_back({{"podUID", h.pod_uid},
                       {"namespace", h.ns},
                       {"name", h.name},
                       {"container", h.container},
                       {"resource", h.resource},
                       {"deviceID", h.device_id},
                       {"source", h.source}});
  }
  json j = {
      {"gpuIndex", i.gpu_index},
      {"gpuUUID", i.gpu_uuid},
      {"profile", i.instance.profile},
      {"placement", {{"start", i.instance.placement.start}, {"size", i.instance.placement.size}}},
      {"gpuInstanceID", i.instance.gpu_instance_id},
      {"migUUID", i.instance.mig_uuid()},
      {"fate", InstanceFateName(i.fate)},
      {"holders", holders},
      {"legacyPods", i.legacy_pods},
      {"action", i.action},
      {"publishedHeld", i.published_held}};
  if (!i.instance.compute_instances.empty()) {
    j["computeInstanceID"] = i.instance.compute_instances.front().id;
  }
  if (i.instance.unproven) j["unproven"] = *i.instance.unproven;
  return j;
}

}  // namespace

const char* InstanceFateName(InstanceFate fate) {
  switch (fate) {
    case InstanceFate::kDynmig:
      return "dynmig";
    case InstanceFate::kHeld:
      return "held";
    case InstanceFate::kIdle:
      return "idle";
    case InstanceFate::kUnproven:
      return "unproven";
    case InstanceFate::kFree:
      return "free";
    case InstanceFate::kUnattributed:
      return "unattributed";
  }
  return "?";
}

bool IsNvidiaDevicePluginPod(const Object& pod) {
  auto mentions = [](std::string_view s) {
    return ContainsIgnoreCase(s, "nvidia-device-plugin") ||
           ContainsIgnoreCase(s, "k8s-device-plugin");
  };
  bool plugin = mentions(kube::Name(pod));
  bool dynmig = ContainsIgnoreCase(kube::Name(pod), "dynmig");
  for (const Object* c : IndexedContainers(pod)) {
    if (!c->is_object()) continue;
    const std::string image = c->value("image", "");
    plugin = plugin || mentions(image);
    dynmig = dynmig || ContainsIgnoreCase(image, "dynmig");
  }
  return plugin && !dynmig;
}

std::optional<std::string> HamiDevicePluginSignal(const Object& pod) {
  if (kube::Label(pod, kHamiComponentLabel) == kHamiDevicePluginComponent) {
    return fmt::format("label {}={}", kHamiComponentLabel, kHamiDevicePluginComponent);
  }
  for (const Object* c : IndexedContainers(pod)) {
    if (!c->is_object()) continue;
    const auto image = c->find("image");
    if (image == c->end() || !image->is_string()) continue;
    const std::string& ref = image->get_ref<const std::string&>();
    if (!IsHamiImage(ref) || ContainsIgnoreCase(ref, "dynmig")) continue;
    const auto name = c->find("name");
    const std::string cname = name != c->end() && name->is_string() ? name->get<std::string>() : "";
    bool runs_plugin = cname == "device-plugin";
    if (const auto cmd = c->find("command"); !runs_plugin && cmd != c->end() && cmd->is_array() &&
                                             !cmd->empty() && cmd->front().is_string()) {
      const std::string& first = cmd->front().get_ref<const std::string&>();
      const std::string_view base = std::string_view(first).substr(first.rfind('/') + 1);
      runs_plugin = base == "nvidia-device-plugin";
    }
    if (runs_plugin) {
      return fmt::format("container {} runs HAMi's device plugin (image {})", Bounded(cname),
                         Bounded(ref));
    }
  }
  return std::nullopt;
}

std::vector<LegacyPod> FindLegacyPods(const std::vector<const Object*>& pods) {
  std::vector<LegacyPod> out;
  for (const Object* p : pods) {
    const std::vector<Want> wants = WantsOf(*p);
    if (wants.empty()) continue;
    LegacyPod lp;
    lp.pod = p;
    lp.key = PodKey(*p);
    lp.kind = wants.front().resource.empty() ? LegacyPod::Kind::kHami : LegacyPod::Kind::kNvidia;
    for (const auto& w : wants) lp.devices.push_back(w.what);
    out.push_back(std::move(lp));
  }
  return out;
}

HandoverPlan PlanHandover(const Object& node, const std::vector<const Object*>& pods,
                          const NodeNvml& nvml, const protocol::DeviceConfig& config) {
  HandoverPlan plan;
  plan.node = kube::Name(node);
  plan.url = nvml.url;
  plan.legacy_pods = FindLegacyPods(pods);
  if (!nvml.view.ok()) {
    plan.view_error = nvml.view.status();
  } else {
    plan.evidence = nvml.view->evidence;
    for (const auto& g : nvml.view->gpus) {
      for (const auto& inst : g.instances) plan.instances.push_back(Classify(g, inst, config));
    }
    std::stable_sort(plan.instances.begin(), plan.instances.end(),
                     [](const auto& a, const auto& b) {
                       return std::pair(a.gpu_index, a.instance.placement.start) <
                              std::pair(b.gpu_index, b.instance.placement.start);
                     });
  }
  for (auto& lp : plan.legacy_pods) Attribute(lp, WantsOf(*lp.pod), plan.instances);
  ProofBlockers(plan);
  OverlapBlockers(plan, node, pods);
  AllocatorBlockers(plan, node, pods);
  return plan;
}

std::vector<const HandoverBlocker*> HandoverPlan::BlockersOf(BlockerCheck check) const {
  std::vector<const HandoverBlocker*> out;
  for (const auto& b : blockers) {
    if (b.check == check) out.push_back(&b);
  }
  return out;
}

std::string HandoverPlan::BlockedSummary() const {
  std::vector<std::string> ids;
  for (const auto& b : blockers) ids.push_back(b.id + ": " + b.summary);
  return fmt::format("{}", fmt::join(ids, "; "));
}

json HandoverPlan::ToJson() const {
  json view = {{"url", url}, {"ok", view_error.ok()}};
  if (!view_error.ok()) view["error"] = std::string(view_error.message());
  json j = {{"node", node}, {"view", view}, {"noDrain", !blocked()}};
  if (evidence) {
    j["evidence"] = {{"podResources", EvidenceJson(evidence->pod_resources)},
                     {"runtime", EvidenceJson(evidence->runtime)}};
  } else {
    j["evidence"] = nullptr;
  }
  j["instances"] = json::array();
  for (const auto& i : instances) j["instances"].push_back(InstanceJson(i));
  j["legacyPods"] = json::array();
  for (const auto& p : legacy_pods) {
    j["legacyPods"].push_back({{"pod", p.key},
                               {"kind", p.kind == LegacyPod::Kind::kHami ? "hami" : "nvidia"},
                               {"devices", p.devices},
                               {"found", p.found},
                               {"missing", p.missing},
                               {"attributed", p.attributed()}});
  }
  j["blockers"] = json::array();
  for (const auto& b : blockers) {
    j["blockers"].push_back({{"check", BlockerCheckName(b.check)},
                             {"id", b.id},
                             {"summary", b.summary},
                             {"evidence", b.evidence}});
  }
  return j;
}

std::string HandoverPlan::ToText() const {
  std::string out = fmt::format("dynmig handover plan: node {}\n", node);
  if (!url.empty()) out += fmt::format("NVML view: {}\n", url);
  if (!view_error.ok()) {
    out += fmt::format("  unreadable: {}\n", std::string(view_error.message()));
  } else if (evidence) {
    out += fmt::format("Evidence: PodResources {}; runtime {}\n",
                       EvidenceText(evidence->pod_resources), EvidenceText(evidence->runtime));
  } else {
    out += "Evidence: none reported (a device plugin too old to attribute legacy instances)\n";
  }
  out += "\n";
  if (view_error.ok()) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& i : instances) {
      std::vector<std::string> holders;
      for (const auto& h : i.instance.holders) holders.push_back(HolderText(h));
      const auto& ci = i.instance.compute_instances;
      rows.push_back(
          {std::to_string(i.gpu_index), i.instance.profile, PlacementText(i.instance.placement),
           fmt::format("{}/{}", i.instance.gpu_instance_id,
                       ci.empty() ? std::string("-") : std::to_string(ci.front().id)),
           i.instance.mig_uuid().empty() ? "-" : i.instance.mig_uuid(), InstanceFateName(i.fate),
           holders.empty() ? "-" : fmt::format("{}", fmt::join(holders, "; ")), i.action});
    }
    if (rows.empty()) {
      out += "No GPU instance on the node.\n";
    } else {
      out += RenderTable(
          {"GPU", "PROFILE", "PLACEMENT", "GI/CI", "MIG UUID", "FATE", "HOLDERS", "WHAT HAPPENS"},
          rows);
    }
  }
  out += fmt::format("\nLegacy pods ({}):\n", legacy_pods.size());
  for (const auto& p : legacy_pods) {
    out += fmt::format("  {} ({}): {}\n", p.key,
                       p.kind == LegacyPod::Kind::kHami ? "HAMi" : "NVIDIA device plugin",
                       p.attributed() ? "proven" : "NOT PROVEN");
    for (const auto& f : p.found) out += "      holds " + f + "\n";
    for (const auto& m : p.missing) out += "      missing " + m + "\n";
  }
  if (!blocked()) {
    out += "\nNo-drain handover: nothing blocks it (confirm with dynmig handover check --node " +
           node + ")\n";
    return out;
  }
  out += fmt::format("\nNo-drain handover: BLOCKED ({}); drain the node instead, or clear:\n",
                     blockers.size());
  for (const auto& b : blockers) {
    out += fmt::format("  [{}] {}: {}\n", BlockerCheckName(b.check), b.id, b.summary);
    for (const auto& e : b.evidence) out += "      - " + e + "\n";
  }
  return out;
}

namespace {

struct NodePlanInputs {
  ClusterSnapshot snapshot;
  protocol::DeviceConfig config;
};

absl::StatusOr<NodePlanInputs> ReadInputs(kube::KubeClient& client, const HandoverOptions& options,
                                          absl::Time now) {
  NodePlanInputs in;
  auto snap = TakeSnapshot(client, now);
  if (!snap.ok()) return snap.status();
  in.snapshot = std::move(*snap);
  auto source = FindDeviceConfig(client, options.config);
  if (!source.ok()) return source.status();
  in.config = EffectiveConfig(*source);
  return in;
}

HandoverPlan PlanNode(const NodePlanInputs& in, const Object& node, NvmlSource* nvml) {
  NodeNvml nv;
  if (nvml != nullptr) {
    NvmlResult r = FetchNvmlView(*nvml, node);
    nv.url = r.url;
    nv.view = std::move(r.view);
  } else {
    nv.view = absl::UnavailableError("no NVML endpoint configured (--nvml-endpoint)");
  }
  return PlanHandover(node, ActivePodsOn(in.snapshot, kube::Name(node)), nv, in.config);
}

}  // namespace

absl::StatusOr<CommandOutput> RunHandoverPlan(kube::KubeClient& client, NvmlSource* nvml,
                                              const HandoverOptions& options, absl::Time now) {
  if (options.node.empty()) return absl::InvalidArgumentError("--node: name the node to hand over");
  auto in = ReadInputs(client, options, now);
  if (!in.ok()) return in.status();
  const Object* node = in->snapshot.FindNode(options.node);
  if (node == nullptr)
    return absl::NotFoundError(fmt::format("node \"{}\" not found", options.node));
  const HandoverPlan plan = PlanNode(*in, *node, nvml);
  return CommandOutput{plan.ToJson(), plan.ToText()};
}

absl::StatusOr<CheckReport> RunHandoverCheck(kube::KubeClient& client, NvmlSource* nvml,
                                             const HandoverOptions& options, absl::Time now) {
  auto in = ReadInputs(client, options, now);
  if (!in.ok()) return in.status();
  std::vector<const Object*> nodes;
  if (!options.node.empty()) {
    const Object* n = in->snapshot.FindNode(options.node);
    if (n == nullptr)
      return absl::NotFoundError(fmt::format("node \"{}\" not found", options.node));
    nodes.push_back(n);
  } else {
    for (const auto& n : in->snapshot.nodes) {
      if (IsGpuNode(n)) nodes.push_back(&n);
    }
  }
  CheckReport report;
  report.command = "handover check";
  if (nodes.empty()) {
    report.Add("gpu-nodes", "", CheckStatus::kWarn, "no GPU node found; name one with --node");
  }
  CheckInput input;
  input.snapshot = &in->snapshot;
  input.config = &in->config;
  for (const Object* node : nodes) {
    const HandoverPlan plan = PlanNode(*in, *node, nvml);
    input.node = node;
    input.node_name = kube::Name(*node);
    input.pods = ActivePodsOn(in->snapshot, input.node_name);
    input.handover = &plan;
    RunChecks(CheckCommand::kHandover, CheckScope::kNode, input, report);
  }
  return report;
}

namespace checks {
namespace {

void AddHandoverCheck(const CheckInput& in, CheckReport& report, std::string_view id,
                      BlockerCheck which, std::string pass) {
  const auto blockers = in.handover->BlockersOf(which);
  if (blockers.empty()) {
    report.Add(std::string(id), in.node_name, CheckStatus::kPass, std::move(pass));
    return;
  }
  std::vector<std::string> evidence;
  std::vector<std::string> ids;
  for (const HandoverBlocker* b : blockers) {
    ids.push_back(b->id);
    evidence.push_back(b->id + ": " + b->summary);
    for (const auto& e : b->evidence) evidence.push_back("  " + e);
  }
  evidence.push_back(fmt::format("details: dynmig handover plan --node {}", in.node_name));
  report.Add(std::string(id), in.node_name, CheckStatus::kFail,
             fmt::format("blocked: {}", fmt::join(ids, ", ")), std::move(evidence));
}

}  // namespace

bool HandoverProof(const CheckInput& in, CheckReport& report) {
  size_t held = 0;
  for (const auto& i : in.handover->instances) held += i.fate == InstanceFate::kHeld ? 1 : 0;
  AddHandoverCheck(in, report, "handover-proof", BlockerCheck::kProof,
                   fmt::format("every instance is attributed ({} legacy-held) and each of the {} "
                               "legacy pods holds a proven instance",
                               held, in.handover->legacy_pods.size()));
  return true;
}

bool HandoverOverlap(const CheckInput& in, CheckReport& report) {
  AddHandoverCheck(in, report, "handover-overlap", BlockerCheck::kOverlap,
                   fmt::format("every kept legacy instance is published in {} and no reservation "
                               "overlaps one",
                               protocol::kNodeHeldSlicesAnnotation));
  return true;
}

bool HandoverAllocator(const CheckInput& in, CheckReport& report) {
  AddHandoverCheck(in, report, "handover-allocator", BlockerCheck::kAllocator,
                   "no legacy allocator serves the node (no MIG resources allocatable, no NVIDIA "
                   "or HAMi device plugin or MIG Manager pod, current register format)");
  return true;
}

namespace {

// preflight's and validate's `legacy-pods`: the node's legacy pods, and whether the no-drain
// handover proves them (in.handover); `always`: a PASS item when there are none too.
void ReportLegacyPods(const CheckInput& in, CheckReport& report, bool always) {
  const std::vector<LegacyPod> pods = FindLegacyPods(in.pods);
  if (pods.empty()) {
    if (always) {
      report.Add("legacy-pods", in.node_name, CheckStatus::kPass,
                 "no active pod holds a legacy GPU-uuid[template-slot] identity or an NVIDIA "
                 "device-plugin MIG resource");
    }
    return;
  }
  const std::string n = fmt::format("{} legacy pod{}", pods.size(), pods.size() == 1 ? "" : "s");
  if (in.handover != nullptr && !in.handover->blocked()) {
    std::vector<std::string> evidence;
    for (const auto& p : in.handover->legacy_pods) {
      for (const auto& f : p.found) evidence.push_back(p.key + " holds " + f);
    }
    evidence.push_back(fmt::format(
        "no drain needed: they keep running and their instances are reclaimed when they end; "
        "confirm with dynmig handover check --node {}",
        in.node_name));
    report.Add("legacy-pods", in.node_name, CheckStatus::kPass,
               n + " on the node, each proven to hold its instance (no-drain handover)",
               std::move(evidence));
    return;
  }
  std::vector<std::string> evidence;
  for (const auto& p : pods) {
    if (p.kind == LegacyPod::Kind::kHami) {
      for (const auto& id : LegacyIdentities(*p.pod)) evidence.push_back(p.key + ": " + id);
    } else {
      for (const auto& d : p.devices) evidence.push_back(p.key + ": " + d);
    }
  }
  evidence.push_back(in.handover != nullptr
                         ? "the no-drain handover is blocked: " + in.handover->BlockedSummary()
                         : "the no-drain handover was not checked: no NVML view endpoint "
                           "(--nvml-endpoint)");
  evidence.push_back(fmt::format(
      "drain these pods (kubectl drain {} --ignore-daemonsets), or clear what blocks handing "
      "them over without draining: dynmig handover plan --node {}",
      in.node_name, in.node_name));
  report.Add("legacy-pods", in.node_name, CheckStatus::kFail,
             n + " on the node that a no-drain handover does not prove", std::move(evidence));
}

}  // namespace

bool LegacyPods(const CheckInput& in, CheckReport& report) {
  ReportLegacyPods(in, report, /*always=*/true);
  return true;
}

bool LegacyPodsHandedOver(const CheckInput& in, CheckReport& report) {
  ReportLegacyPods(in, report, /*always=*/false);
  return true;
}

}  // namespace checks
}  // namespace dynmig::ops
