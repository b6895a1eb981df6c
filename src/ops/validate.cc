#include "ops/validate.h"

#include <algorithm>
#include <set>

#include "common/bounded_json.h"
#include "common/strings.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "mig/catalogue.h"
#include "mig/occupancy.h"
#include "mig/planner.h"
#include "ops/checks.h"
#include "ops/handover.h"
#include "protocol/annotations.h"
#include "protocol/node_register.h"
#include "protocol/pod_request.h"

namespace dynmig::ops {

// What a node registers (the register annotation decoded).
struct NodeGpus {
  absl::StatusOr<std::vector<protocol::DeviceInfo>> devices = std::vector<protocol::DeviceInfo>{};
  const protocol::DeviceInfo* Find(const std::string& uuid) const {
    if (!devices.ok()) return nullptr;
    for (const auto& d : *devices) {
      if (d.id == uuid) return &d;
    }
    return nullptr;
  }
};

namespace {

using kube::Object;

std::string PlacementsText(const std::vector<mig::Placement>& ps) {
  std::vector<std::string> parts;
  for (const auto& p : ps) parts.push_back(std::to_string(p.start));
  return fmt::format("starts [{}]", fmt::join(parts, ","));
}

std::string GpuName(const protocol::DeviceInfo& d) {
  return fmt::format("GPU {} ({})", d.index, d.id);
}

std::string AllocName(const protocol::MigAllocation& a) {
  return fmt::format("container {} device {}: {} at {} of {}", a.container_index, a.device_index,
                     a.profile, a.placement.ToString(), a.gpu_uuid);
}

// Compares a registered profile with a reference (NVML or catalogue); mismatch lines.
void CompareProfile(const protocol::MigProfileInfo& reg, uint64_t memory, uint32_t slices,
                    std::vector<mig::Placement> placements, std::vector<std::string>& out,
                    const std::string& where, const std::string& ref) {
  if (reg.memory_mib != memory) {
    out.push_back(fmt::format("{} {}: memory {} MiB registered, {} MiB in {}", where, reg.name,
                              reg.memory_mib, memory, ref));
  }
  if (reg.slice_count != slices) {
    out.push_back(fmt::format("{} {}: slice count {} registered, {} in {}", where, reg.name,
                              reg.slice_count, slices, ref));
  }
  std::vector<mig::Placement> mine = reg.placements;
  std::sort(mine.begin(), mine.end());
  std::sort(placements.begin(), placements.end());
  if (mine != placements) {
    out.push_back(fmt::format("{} {}: placements {} registered, {} in {}", where, reg.name,
                              PlacementsText(mine), PlacementsText(placements), ref));
  }
}

bool AfterAllocate(const Object& pod) {
  const auto phase = kube::Annotation(pod, protocol::kBindPhaseAnnotation);
  return kube::Phase(pod) == "Running" || (phase && *phase == protocol::kBindPhaseSuccess);
}

NodeGpus GpusOf(const Object* node) {
  NodeGpus out;
  if (node == nullptr) {
    out.devices = absl::NotFoundError("the node does not exist");
    return out;
  }
  const auto reg = kube::Annotation(*node, protocol::kNodeRegisterAnnotation);
  if (!reg) {
    out.devices = absl::NotFoundError("the node has no hami.io/node-nvidia-register");
    return out;
  }
  out.devices = protocol::DecodeNodeRegister(*reg);
  return out;
}

size_t InitContainerCount(const Object& pod) {
  const auto spec = pod.find("spec");
  if (spec == pod.end() || !spec->is_object()) return 0;
  const auto init = spec->find("initContainers");
  return (init != spec->end() && init->is_array()) ? init->size() : 0;
}

bool IsActiveMigPod(const Object& pod, const protocol::ResourceNames& resources) {
  if (kube::IsTerminated(pod) || PodNode(pod).empty()) return false;
  return protocol::IsMigPod(pod, resources) ||
         kube::Annotation(pod, protocol::kMigAllocationsAnnotation).has_value();
}

// device-plugin: the node's device plugin is alive: it serves its NVML view (when an endpoint is
// configured) and its last hami.io/node-handshake report is recent (the scheduler's own
// report_timeout). A registration alone proves nothing: it outlives a stopped plugin.
void CheckDevicePlugin(const Object& node, const NodeNvml& nv, bool nvml_configured, absl::Time now,
                       CheckReport& report) {
  const std::string name = kube::Name(node);
  std::vector<std::string> evidence;
  std::vector<std::string> failures;
  const std::string handshake =
      kube::Annotation(node, protocol::kNodeHandshakeAnnotation).value_or("");
  const absl::Duration timeout = scheduler::ClusterStateOptions{}.report_timeout;
  bool reported = false;
  if (!handshake.empty()) {
    if (handshake == "Deleted" || handshake.starts_with("Deleted_")) {
      failures.push_back(fmt::format("the device plugin deregistered ({}={})",
                                     protocol::kNodeHandshakeAnnotation, handshake));
    } else if (auto t = scheduler::ParseHandshakeReported(handshake); t.has_value()) {
      const absl::Duration age = std::max(absl::ZeroDuration(), now - *t);
      const absl::Duration whole = absl::Trunc(age, absl::Seconds(1));
      const std::string age_text =
          whole == absl::ZeroDuration() ? "0s" : absl::FormatDuration(whole);
      if (age > timeout) {
        failures.push_back(fmt::format(
            "the device plugin stopped reporting: last {} {} ago "
            "(the scheduler marks the node unhealthy after {})",
            protocol::kNodeHandshakeAnnotation, age_text, absl::FormatDuration(timeout)));
      } else {
        reported = true;
        evidence.push_back(
            fmt::format("{}: last report {} ago", protocol::kNodeHandshakeAnnotation, age_text));
      }
    } else {
      evidence.push_back(
          fmt::format("{}={} (not a report time)", protocol::kNodeHandshakeAnnotation, handshake));
    }
  }
  bool served = false;
  if (nvml_configured) {
    if (nv.view.ok()) {
      served = true;
      evidence.push_back(
          fmt::format("NVML view served at {} ({} GPUs)", nv.url, nv.view->gpus.size()));
    } else {
      failures.push_back(fmt::format("the device plugin's NVML view is not served: {}",
                                     std::string(nv.view.status().message())));
    }
  }
  if (!failures.empty()) {
    const std::string summary = failures.front();
    failures.erase(failures.begin());
    failures.insert(failures.end(), evidence.begin(), evidence.end());
    if (nvml_configured && !nv.view.ok()) {
      failures.push_back(
          "is the device plugin running on the node? If its port is not reachable from where "
          "validate runs, pass --nvml-endpoint '' (capability is then compared with the "
          "catalogue and liveness judged by hami.io/node-handshake alone)");
    }
    report.Add("device-plugin", name, CheckStatus::kFail, summary, std::move(failures));
  } else if (served || reported) {
    report.Add("device-plugin", name, CheckStatus::kPass,
               served && reported ? "the device plugin serves its NVML view and reports"
               : served           ? "the device plugin serves its NVML view"
                                  : "the device plugin reports (NVML view not checked)",
               std::move(evidence));
  } else {
    evidence.push_back(fmt::format("no NVML endpoint configured and no {} report",
                                   protocol::kNodeHandshakeAnnotation));
    report.Add("device-plugin", name, CheckStatus::kWarn,
               "cannot tell whether the device plugin runs", std::move(evidence));
  }
}

}  // namespace

// What validate's node checks read of one node's registration.
struct ValidateFacts {
  NodeGpus gpus;
  std::string reg;                                    // the register annotation ("" when absent)
  std::vector<const protocol::DeviceInfo*> mig_gpus;  // registered in mode mig
  std::vector<std::string> not_mig;                   // why each other GPU is not
};

// What the per-pod checks read of one pod.
struct PodFacts {
  std::string key;                  // namespace/name
  std::string node;                 // PodNode
  std::vector<std::string> legacy;  // LegacyIdentities
  // A legacy pod the node's NVML view proves to hold its instances (a no-drain handover): what
  // it holds; empty otherwise.
  std::vector<std::string> handed_over;
  bool annotated = false;  // it carries the reservation annotation
  absl::StatusOr<std::vector<protocol::MigAllocation>> allocs =
      std::vector<protocol::MigAllocation>{};
  std::vector<std::string> missing_runtime;  // entries without a runtime identity
  NodeGpus gpus;                             // what its node registers
};

namespace {

ValidateFacts ReadValidateFacts(const Object& node) {
  ValidateFacts f;
  f.gpus = GpusOf(&node);
  f.reg = kube::Annotation(node, protocol::kNodeRegisterAnnotation).value_or("");
  if (!f.gpus.devices.ok()) return f;
  for (const auto& d : *f.gpus.devices) {
    if (d.legacy_mig_template) {
      f.not_mig.push_back(
          fmt::format("{}: legacy migtemplate field (pre-dynamic-MIG device plugin)", GpuName(d)));
    } else if (d.mode.find("mig") != std::string::npos) {
      f.mig_gpus.push_back(&d);
    } else {
      f.not_mig.push_back(fmt::format("{}: mode \"{}\"", GpuName(d), d.mode));
    }
  }
  return f;
}

PodFacts ReadPodFacts(const ClusterSnapshot& snapshot, const Object& pod) {
  PodFacts f;
  f.key = PodKey(pod);
  f.node = PodNode(pod);
  f.legacy = LegacyIdentities(pod);
  const auto annotation = kube::Annotation(pod, protocol::kMigAllocationsAnnotation);
  f.annotated = annotation.has_value();
  if (annotation) f.allocs = protocol::DecodeMigAllocations(*annotation);
  if (f.allocs.ok()) {
    for (const auto& a : *f.allocs) {
      if (!a.runtime) f.missing_runtime.push_back(AllocName(a) + ": no MIG UUID, GI ID or CI ID");
    }
  }
  f.gpus = GpusOf(snapshot.FindNode(f.node));
  return f;
}

}  // namespace

absl::StatusOr<std::map<std::string, std::vector<std::string>>> ParseVisibleDevices(
    std::string_view value) {
  auto parsed = ParseBoundedJson(value, kAnnotationJsonLimits, kVisibleDevicesAnnotation);
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& doc = *parsed;
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: must be a JSON object (container -> devices)", kVisibleDevicesAnnotation));
  }
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& [container, devices] : doc.items()) {
    if (!devices.is_string()) {
      return absl::InvalidArgumentError(fmt::format("{}: container \"{}\": must be a string",
                                                    kVisibleDevicesAnnotation, container));
    }
    auto& list = out[container];
    for (const auto& part : SplitTrimmed(devices.get<std::string>(), ',')) {
      const size_t eq = part.rfind('=');
      list.push_back(eq == std::string::npos ? part : part.substr(eq + 1));
    }
  }
  return out;
}

namespace checks {

bool DevicePluginAlive(const CheckInput& in, CheckReport& report) {
  CheckDevicePlugin(*in.node, *in.nvml, in.nvml_configured, in.snapshot->taken, report);
  return true;
}

bool RegisteredMode(const CheckInput& in, CheckReport& report) {
  const ValidateFacts& f = *in.validate;
  const std::string& name = in.node_name;
  if (!f.gpus.devices.ok()) {
    std::vector<std::string> evidence = protocol::DetectLegacyNodeRegister(f.reg);
    evidence.push_back(std::string(f.gpus.devices.status().message()));
    report.Add("registered-mode", name, CheckStatus::kFail,
               "the node's registration cannot be read", evidence);
    return false;
  }
  if (f.gpus.devices->empty()) {
    report.Add("registered-mode", name, CheckStatus::kFail,
               "the device plugin registers no GPU on this node");
    return false;
  }
  if (!f.not_mig.empty()) {
    report.Add("registered-mode", name, CheckStatus::kFail,
               fmt::format("{} of {} registered GPUs are not in mode mig", f.not_mig.size(),
                           f.gpus.devices->size()),
               f.not_mig);
  } else {
    report.Add("registered-mode", name, CheckStatus::kPass,
               fmt::format("every registered GPU is in mode mig ({} GPUs)", f.mig_gpus.size()));
  }
  return true;
}

bool MigProfiles(const CheckInput& in, CheckReport& report) {
  const auto& mig_gpus = in.validate->mig_gpus;
  std::vector<std::string> empty, counts;
  for (const auto* d : mig_gpus) {
    if (d->mig_profiles.empty()) {
      empty.push_back(GpuName(*d) + ": migProfiles is empty");
    } else {
      std::vector<std::string> names;
      for (const auto& p : d->mig_profiles) names.push_back(p.name);
      counts.push_back(fmt::format("{}: {}", GpuName(*d), fmt::join(names, ", ")));
    }
  }
  if (!empty.empty()) {
    report.Add("mig-profiles", in.node_name, CheckStatus::kFail,
               fmt::format("{} MIG GPUs publish no profile", empty.size()), empty);
  } else if (!mig_gpus.empty()) {
    report.Add("mig-profiles", in.node_name, CheckStatus::kPass,
               "every MIG GPU publishes a non-empty migProfiles", counts);
  }
  return true;
}

bool Capability(const CheckInput& in, CheckReport& report) {
  const auto& mig_gpus = in.validate->mig_gpus;
  const NodeNvml& nv = *in.nvml;
  const std::string& name = in.node_name;
  std::vector<std::string> mismatches, sources;
  bool unverified = false;
  for (const auto* d : mig_gpus) {
    if (d->mig_profiles.empty()) continue;
    const NvmlGpuView* ng = nv.view.ok() ? nv.view->FindGpu(d->id) : nullptr;
    if (ng != nullptr) {
      sources.push_back(fmt::format("{}: NVML view {}", GpuName(*d), nv.url));
      if (ng->mig_enabled.has_value() && !*ng->mig_enabled) {
        mismatches.push_back(fmt::format("{}: NVML reports MIG mode disabled", GpuName(*d)));
      }
      for (const auto& p : d->mig_profiles) {
        const NvmlProfileView* np = ng->FindProfile(p.name);
        if (np == nullptr) {
          mismatches.push_back(
              fmt::format("{} {}: registered, but NVML has no such profile", GpuName(*d), p.name));
          continue;
        }
        CompareProfile(p, np->memory_mib, np->slice_count, np->placements, mismatches, GpuName(*d),
                       "NVML");
      }
      continue;
    }
    const mig::CatalogueModel* model = mig::FindModelByNvmlName(d->type);
    if (model == nullptr) {
      unverified = true;
      sources.push_back(fmt::format("{}: {} is not catalogued and NVML is unreachable{}",
                                    GpuName(*d), d->type,
                                    nv.view.ok() ? " (GPU absent from the view)"
                                                 : ": " + std::string(nv.view.status().message())));
      continue;
    }
    sources.push_back(fmt::format(
        "{}: catalogue entry {} (NVML view unavailable: {})", GpuName(*d), model->names.front(),
        nv.view.ok() ? "GPU absent from the view" : std::string(nv.view.status().message())));
    for (const auto& p : d->mig_profiles) {
      const mig::ProfileSpec* spec = model->capability.FindProfile(p.name);
      if (spec == nullptr) {
        mismatches.push_back(
            fmt::format("{} {}: registered, but the catalogue's {} has no such "
                        "profile",
                        GpuName(*d), p.name, model->names.front()));
        continue;
      }
      CompareProfile(p, spec->memory_mib, spec->compute_slices, spec->placements, mismatches,
                     GpuName(*d), "the catalogue");
    }
  }
  if (!mismatches.empty()) {
    mismatches.insert(mismatches.end(), sources.begin(), sources.end());
    report.Add("capability", name, CheckStatus::kFail,
               fmt::format("{} differences between the registered capability and NVML",
                           mismatches.size() - sources.size()),
               mismatches);
  } else if (unverified) {
    report.Add("capability", name, CheckStatus::kWarn,
               "some GPUs could not be compared (no NVML view, model not catalogued)", sources);
  } else if (!mig_gpus.empty()) {
    const bool all_nvml = std::all_of(sources.begin(), sources.end(), [](const std::string& s) {
      return s.find(": NVML view") != std::string::npos;
    });
    report.Add("capability", name, CheckStatus::kPass,
               all_nvml ? "profile memory, slice count and placements match NVML"
                        : "profile memory, slice count and placements match the catalogue "
                          "(NVML view not used)",
               sources);
  }
  return true;
}

bool AllowlistExposure(const CheckInput& in, CheckReport& report) {
  const auto& mig_gpus = in.validate->mig_gpus;
  const protocol::DeviceConfig& config = *in.config;
  const std::string& config_origin = in.config_origin;
  const std::string& name = in.node_name;
  std::vector<std::string> exposed;
  for (const auto* d : mig_gpus) {
    if (d->mig_profiles.empty()) continue;
    const mig::AllowlistEntry* entry = config.allowlist.Match(d->type);
    if (entry == nullptr) {
      exposed.push_back(
          fmt::format("{}: {} is exposed in MIG mode but no migProfileAllowlist "
                      "entry matches it",
                      GpuName(*d), d->type));
      continue;
    }
    for (const auto& p : d->mig_profiles) {
      if (std::find(entry->profiles.begin(), entry->profiles.end(), p.name) ==
          entry->profiles.end()) {
        exposed.push_back(fmt::format("{}: profile {} is exposed but not allowlisted for {}",
                                      GpuName(*d), p.name, d->type));
      }
    }
  }
  if (!exposed.empty()) {
    exposed.push_back("allowlist from " + config_origin);
    report.Add("allowlist-exposure", name, CheckStatus::kFail,
               "the device plugin exposes models or profiles the allowlist does not permit",
               exposed);
  } else if (!mig_gpus.empty()) {
    report.Add("allowlist-exposure", name, CheckStatus::kPass,
               "only allowlisted models and profiles are exposed",
               {"allowlist from " + config_origin});
  }
  return true;
}

// Records one result of a pod check: under the command's prefix, the pod's node and its key.
void AddPod(const CheckInput& in, CheckReport& report, std::string_view check, CheckStatus status,
            std::string summary, std::vector<std::string> evidence = {}) {
  report.AddFor(in.pod_prefix + std::string(check), in.pod_facts->node, in.pod_facts->key, status,
                std::move(summary), std::move(evidence));
}

bool PodReservation(const CheckInput& in, CheckReport& report) {
  const PodFacts& f = *in.pod_facts;
  if (!f.legacy.empty() && !f.handed_over.empty()) {
    AddPod(in, report, "reservation", CheckStatus::kPass,
           "a legacy pod handed over without draining: the device plugin proves its instances "
           "(it keeps them until the pod ends)",
           f.handed_over);
    return false;
  }
  if (!f.legacy.empty()) {
    AddPod(in, report, "reservation", CheckStatus::kFail,
           "holds legacy GPU-uuid[template-slot] identities (placed by a legacy scheduler)",
           f.legacy);
    return false;
  }
  if (!f.annotated) {
    AddPod(in, report, "reservation", CheckStatus::kFail,
           fmt::format("no {}: the scheduler did not reserve a profile and placement",
                       protocol::kMigAllocationsAnnotation),
           {fmt::format("phase {}, scheduler {}", kube::Phase(*in.pod),
                        kube::StringAt(*in.pod, "/spec/schedulerName"))});
    return false;
  }
  if (!f.allocs.ok()) {
    const std::string msg(f.allocs.status().message());
    if (msg.find("partial runtime identity") != std::string::npos) {
      AddPod(in, report, "reservation", CheckStatus::kPass,
             fmt::format("the scheduler wrote {}", protocol::kMigAllocationsAnnotation));
      AddPod(in, report, "runtime", CheckStatus::kFail,
             "the runtime identity is partial (all of MIG UUID, GI ID and CI ID, or none)", {msg});
      return false;
    }
    AddPod(in, report, "reservation", CheckStatus::kFail,
           fmt::format("{} does not decode", protocol::kMigAllocationsAnnotation), {msg});
    return false;
  }
  if (f.allocs->empty()) {
    AddPod(in, report, "reservation", CheckStatus::kFail,
           fmt::format("{} is empty", protocol::kMigAllocationsAnnotation));
    return false;
  }
  std::vector<std::string> lines;
  for (const auto& a : *f.allocs) lines.push_back(AllocName(a));
  AddPod(in, report, "reservation", CheckStatus::kPass,
         fmt::format("the scheduler wrote {} ({} instance{})", protocol::kMigAllocationsAnnotation,
                     f.allocs->size(), f.allocs->size() == 1 ? "" : "s"),
         lines);
  return true;
}

bool PodProfile(const CheckInput& in, CheckReport& report) {
  const PodFacts& f = *in.pod_facts;
  const std::string& node = f.node;
  const NodeGpus& gpus = f.gpus;
  const auto& allocs = f.allocs;
  auto request = protocol::ParsePodRequest(*in.pod, in.config->resources);
  if (!request.ok()) {
    AddPod(in, report, "profile", CheckStatus::kFail, "the pod's GPU request does not parse",
           {std::string(request.status().message())});
    return true;
  }
  std::vector<std::string> bad, good;
  std::map<int, uint32_t> per_container;
  for (const auto& a : *allocs) {
    ++per_container[a.container_index];
    if (a.container_index < 0 ||
        static_cast<size_t>(a.container_index) >= request->containers.size()) {
      bad.push_back(
          fmt::format("{}: the pod has no container {}", AllocName(a), a.container_index));
      continue;
    }
    const auto& c = request->containers[a.container_index];
    const protocol::DeviceInfo* dev = gpus.Find(a.gpu_uuid);
    if (dev == nullptr) {
      bad.push_back(fmt::format("{}: GPU not registered on {}", AllocName(a), node));
      continue;
    }
    const mig::GpuCapability cap = protocol::ToCapability(*dev);
    const mig::ProfileSpec* spec = cap.FindProfile(a.profile);
    if (spec == nullptr) {
      bad.push_back(
          fmt::format("{}: the GPU does not register profile {}", AllocName(a), a.profile));
      continue;
    }
    const uint64_t want = mig::ResolveMemory(c.memory.mib, c.memory.percent, cap);
    if (spec->SizingMib() < want) {
      bad.push_back(fmt::format("{}: {} covers {} MiB, container \"{}\" asks for {} MiB",
                                AllocName(a), a.profile, spec->SizingMib(), c.name, want));
    } else {
      good.push_back(fmt::format("container \"{}\": {} ({} MiB in NVML) covers {} MiB", c.name,
                                 a.profile, spec->memory_mib, want));
    }
  }
  for (size_t i = 0; i < request->containers.size(); ++i) {
    const auto& c = request->containers[i];
    const uint32_t got = per_container.count(static_cast<int>(i)) ? per_container[i] : 0;
    if (c.count != got) {
      bad.push_back(fmt::format("container \"{}\" asks for {} instance{}, {} reserved", c.name,
                                c.count, c.count == 1 ? "" : "s", got));
    }
  }
  if (bad.empty()) {
    AddPod(in, report, "profile", CheckStatus::kPass,
           "every reserved profile covers its container's memory request", good);
  } else {
    AddPod(in, report, "profile", CheckStatus::kFail, "reserved profiles do not match the request",
           bad);
  }
  return true;
}

bool PodOverlap(const CheckInput& in, CheckReport& report) {
  const PodFacts& f = *in.pod_facts;
  const std::string& key = f.key;
  const std::string& node = f.node;
  const NodeGpus& gpus = f.gpus;
  const auto& allocs = f.allocs;
  const ClusterSnapshot& snapshot = *in.snapshot;
  std::vector<std::string> bad;
  std::map<std::string, mig::Occupancy> others;  // by GPU uuid
  for (const Object* on_node : ActivePodsOn(snapshot, node)) {
    const Object& other = *on_node;
    if (PodKey(other) == key) continue;
    const auto value = kube::Annotation(other, protocol::kMigAllocationsAnnotation);
    if (!value) continue;
    auto theirs = protocol::DecodeMigAllocations(*value);
    if (!theirs.ok()) continue;
    for (const auto& a : *theirs) {
      const protocol::DeviceInfo* dev = gpus.Find(a.gpu_uuid);
      if (dev == nullptr) continue;
      const mig::GpuCapability cap = protocol::ToCapability(*dev);
      // Illegal or mutually overlapping reservations of others are their own findings.
      (void)others[a.gpu_uuid].Reserve(cap, a.profile, a.placement, PodKey(other));
    }
  }
  std::map<std::string, mig::Occupancy> mine;
  for (const auto& a : *allocs) {
    const protocol::DeviceInfo* dev = gpus.Find(a.gpu_uuid);
    if (dev == nullptr) {
      bad.push_back(fmt::format("{}: the node does not register this GPU", AllocName(a)));
      continue;
    }
    const mig::GpuCapability cap = protocol::ToCapability(*dev);
    if (auto st = mine[a.gpu_uuid].Reserve(cap, a.profile, a.placement, key); !st.ok()) {
      bad.push_back(fmt::format("{}: {}", AllocName(a), std::string(st.message())));
      continue;
    }
    for (const auto& r : others[a.gpu_uuid].reservations()) {
      if (r.placement.Overlaps(a.placement)) {
        bad.push_back(fmt::format("{} overlaps {} of {} at {}", AllocName(a), r.profile, r.owner,
                                  r.placement.ToString()));
      }
    }
  }
  if (bad.empty()) {
    AddPod(in, report, "overlap", CheckStatus::kPass,
           "no reservation overlaps another active reservation");
  } else {
    AddPod(in, report, "overlap", CheckStatus::kFail, "reservations overlap or are illegal", bad);
  }
  return true;
}

bool PodRuntime(const CheckInput& in, CheckReport& report) {
  const PodFacts& f = *in.pod_facts;
  const auto& allocs = f.allocs;
  const Object& pod = *in.pod;
  const std::vector<std::string>& missing = f.missing_runtime;
  if (!AfterAllocate(pod)) {
    AddPod(in, report, "runtime", CheckStatus::kSkip,
           fmt::format("not allocated yet (phase {})", kube::Phase(pod)));
  } else if (!missing.empty()) {
    AddPod(in, report, "runtime", CheckStatus::kFail,
           "the pod runs but the device plugin did not record the runtime identity", missing);
  } else {
    std::vector<std::string> ids;
    for (const auto& a : *allocs) {
      ids.push_back(fmt::format("{}: {} GI {} CI {}", AllocName(a), a.runtime->mig_uuid,
                                a.runtime->gpu_instance_id, a.runtime->compute_instance_id));
    }
    AddPod(in, report, "runtime", CheckStatus::kPass,
           "every instance has its MIG UUID, GI ID and CI ID", ids);
  }
  return true;
}

bool PodVisible(const CheckInput& in, CheckReport& report) {
  const PodFacts& f = *in.pod_facts;
  const auto& allocs = f.allocs;
  const Object& pod = *in.pod;
  const auto visible = kube::Annotation(pod, kVisibleDevicesAnnotation);
  if (!visible) {
    AddPod(in, report, "visible", CheckStatus::kSkip,
           fmt::format("no {} record (only the local mode's kubelet writes it): check in "
                       "the container with nvidia-smi -L",
                       kVisibleDevicesAnnotation));
  } else if (auto parsed = ParseVisibleDevices(*visible); !parsed.ok()) {
    AddPod(in, report, "visible", CheckStatus::kFail, "the visible-devices record does not parse",
           {std::string(parsed.status().message())});
  } else {
    const auto containers = IndexedContainers(pod);
    std::vector<std::string> bad, good;
    std::map<int, std::vector<std::string>> expected;
    for (const auto& a : *allocs) {
      if (a.runtime) expected[a.container_index].push_back(a.runtime->mig_uuid);
    }
    for (auto& [index, uuids] : expected) {
      if (index < 0 || static_cast<size_t>(index) >= containers.size()) continue;
      const std::string cname = containers[index]->value("name", "");
      auto it = parsed->find(cname);
      if (it == parsed->end()) {
        // Init containers have finished before the record is written: not in it.
        if (static_cast<size_t>(index) >= InitContainerCount(pod)) {
          bad.push_back(fmt::format("container \"{}\": not in the record", cname));
        }
        continue;
      }
      std::vector<std::string> got;
      for (const auto& u : it->second) {
        if (u.rfind("MIG-", 0) == 0) got.push_back(u);
      }
      std::vector<std::string> want = uuids;
      std::sort(got.begin(), got.end());
      std::sort(want.begin(), want.end());
      if (got == want) {
        good.push_back(fmt::format("container \"{}\": {}", cname, fmt::join(got, ",")));
      } else {
        bad.push_back(
            fmt::format("container \"{}\" sees {}, the annotation says {}", cname,
                        got.empty() ? "no MIG device" : fmt::format("{}", fmt::join(got, ",")),
                        fmt::join(want, ",")));
      }
    }
    if (!bad.empty()) {
      AddPod(in, report, "visible", CheckStatus::kFail,
             "the MIG UUIDs the containers see differ from the annotation", bad);
    } else if (good.empty()) {
      AddPod(in, report, "visible", CheckStatus::kSkip, "no realized instance to compare yet");
    } else {
      AddPod(in, report, "visible", CheckStatus::kPass,
             "the containers see the annotated MIG UUIDs", good);
    }
  }
  return true;
}

bool PodNvml(const CheckInput& in, CheckReport& report) {
  const PodFacts& f = *in.pod_facts;
  const std::string& node = f.node;
  const auto& allocs = f.allocs;
  const std::vector<std::string>& missing = f.missing_runtime;
  const auto& nvml_views = *in.nvml_views;
  const Object& pod = *in.pod;
  auto nv = nvml_views.find(node);
  if (nv == nvml_views.end() || !nv->second.view.ok()) {
    AddPod(in, report, "nvml", CheckStatus::kSkip,
           nv == nvml_views.end() ? "no NVML view of the node"
                                  : fmt::format("NVML view unavailable: {}",
                                                std::string(nv->second.view.status().message())));
  } else if (!missing.empty() || !AfterAllocate(pod)) {
    AddPod(in, report, "nvml", CheckStatus::kSkip, "no runtime identity to look up");
  } else {
    std::vector<std::string> bad, good;
    for (const auto& a : *allocs) {
      const NvmlGpuView* gpu = nullptr;
      const NvmlInstanceView* inst = nv->second.view->FindMigUuid(a.runtime->mig_uuid, &gpu);
      if (inst == nullptr) {
        bad.push_back(
            fmt::format("{}: NVML has no instance {}", AllocName(a), a.runtime->mig_uuid));
        continue;
      }
      std::vector<std::string> diffs;
      if (gpu->uuid != a.gpu_uuid) diffs.push_back("on GPU " + gpu->uuid);
      if (inst->gpu_instance_id != a.runtime->gpu_instance_id) {
        diffs.push_back(fmt::format("GI {}", inst->gpu_instance_id));
      }
      if (inst->placement.size > 0 && inst->placement != a.placement) {
        diffs.push_back("placement " + inst->placement.ToString());
      }
      if (!inst->profile.empty() && inst->profile != a.profile) {
        diffs.push_back("profile " + inst->profile);
      }
      bool ci_ok = false;
      for (const auto& ci : inst->compute_instances) {
        if (ci.mig_uuid == a.runtime->mig_uuid) ci_ok = ci.id == a.runtime->compute_instance_id;
      }
      if (!ci_ok) diffs.push_back("another CI ID");
      if (diffs.empty()) {
        good.push_back(fmt::format("{}: {} is GI {} CI {} in NVML", AllocName(a),
                                   a.runtime->mig_uuid, inst->gpu_instance_id,
                                   a.runtime->compute_instance_id));
      } else {
        bad.push_back(fmt::format("{}: NVML has {} {}", AllocName(a), a.runtime->mig_uuid,
                                  fmt::join(diffs, ", ")));
      }
    }
    if (bad.empty()) {
      AddPod(in, report, "nvml", CheckStatus::kPass, "NVML holds each annotated instance", good);
    } else {
      AddPod(in, report, "nvml", CheckStatus::kFail, "the annotation does not match NVML", bad);
    }
  }
  return true;
}

}  // namespace checks

void ValidateNodes(const ClusterSnapshot& snapshot, const std::vector<const Object*>& nodes,
                   const protocol::DeviceConfig& config, const std::string& config_origin,
                   NvmlSource* nvml, CheckReport& report) {
  std::map<std::string, NodeNvml> views;
  CheckInput in;
  in.snapshot = &snapshot;
  in.config = &config;
  in.config_origin = config_origin;
  in.nvml_configured = nvml != nullptr;
  for (const Object* node : nodes) {
    in.node = node;
    in.node_name = kube::Name(*node);
    NodeNvml& nv = views[in.node_name];
    if (nvml != nullptr) {
      NvmlResult r = FetchNvmlView(*nvml, *node);
      nv.url = r.url;
      nv.view = std::move(r.view);
    } else {
      nv.view = absl::UnavailableError("no NVML endpoint configured");
    }
    const ValidateFacts facts = ReadValidateFacts(*node);
    in.nvml = &nv;
    in.validate = &facts;
    in.pods = ActivePodsOn(snapshot, in.node_name);
    std::optional<HandoverPlan> plan;
    if (nv.view.ok() && !FindLegacyPods(in.pods).empty()) {
      plan = PlanHandover(*node, in.pods, nv, config);
    }
    in.handover = plan ? &*plan : nullptr;
    RunChecks(CheckCommand::kValidate, CheckScope::kNode, in, report);
    in.handover = nullptr;
  }
  in.validate = nullptr;
  in.nvml = nullptr;

  // Pods.
  std::set<std::string> names;
  for (const Object* n : nodes) names.insert(kube::Name(*n));
  for (const auto& pod : snapshot.pods) {
    if (!IsActiveMigPod(pod, config.resources) || !names.count(PodNode(pod))) continue;
    ValidatePod(snapshot, pod, config, views, report);
  }
}

void ValidatePod(const ClusterSnapshot& snapshot, const Object& pod,
                 const protocol::DeviceConfig& config,
                 const std::map<std::string, NodeNvml>& nvml_views, CheckReport& report,
                 const std::string& prefix) {
  PodFacts facts = ReadPodFacts(snapshot, pod);
  const Object* node = snapshot.FindNode(facts.node);
  if (const auto nv = nvml_views.find(facts.node);
      !facts.legacy.empty() && node != nullptr && nv != nvml_views.end() && nv->second.view.ok()) {
    const HandoverPlan plan = PlanHandover(*node, {&pod}, nv->second, config);
    if (plan.legacy_pods.size() == 1 && plan.legacy_pods.front().attributed()) {
      facts.handed_over = plan.legacy_pods.front().found;
    }
  }
  CheckInput in;
  in.snapshot = &snapshot;
  in.config = &config;
  in.node_name = facts.node;
  in.node = snapshot.FindNode(facts.node);
  in.pod = &pod;
  in.pod_facts = &facts;
  in.nvml_views = &nvml_views;
  in.pod_prefix = prefix;
  RunChecks(CheckCommand::kValidate, CheckScope::kPod, in, report);
}

absl::StatusOr<CheckReport> RunValidate(kube::KubeClient& client, NvmlSource* nvml,
                                        const ValidateOptions& options, const Clock& clock) {
  auto snap = TakeSnapshot(client, clock.Now());
  if (!snap.ok()) return snap.status();
  auto source = FindDeviceConfig(client, options.config);
  if (!source.ok()) return source.status();
  const protocol::DeviceConfig config = EffectiveConfig(*source);
  std::string origin = source->origin;
  if (!source->config.ok()) {
    origin += fmt::format(" (unreadable: {}; the built-in default was used)",
                          std::string(source->config.status().message()));
  }
  std::vector<const Object*> nodes;
  if (!options.node.empty()) {
    const Object* n = snap->FindNode(options.node);
    if (n == nullptr)
      return absl::NotFoundError(fmt::format("node \"{}\" not found", options.node));
    nodes.push_back(n);
  } else {
    for (const auto& n : snap->nodes) {
      if (kube::Annotation(n, protocol::kNodeRegisterAnnotation)) nodes.push_back(&n);
    }
  }
  CheckReport report;
  report.command = "validate";
  if (nodes.empty()) {
    report.Add("registered-mode", "", CheckStatus::kFail,
               "no node registers GPUs (hami.io/node-nvidia-register): is the device plugin "
               "running?");
  }
  ValidateNodes(*snap, nodes, config, origin, nvml, report);
  if (options.canary) {
    CanaryOptions canary = options.canary_options;
    if (canary.node.empty()) canary.node = options.node;
    RunCanary(client, nvml, canary, config, clock, report);
  }
  return report;
}

}  // namespace dynmig::ops
