// NodeOps: the context and the steps the Allocator and the Reclaimer share. See node_ops.h.
#include "deviceplugin/node_ops.h"

#include <algorithm>
#include <utility>

#include "common/status_macros.h"
#include "deviceplugin/plugin_internal.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {

NodeOps::NodeOps(const PluginCoreOptions& core_options, nvml::Nvml& nvml_api,
                 kube::KubeClient& kube_client, Metrics& node_metrics, EventRecorder& events,
                 PodResourcesSource* kubelet_pods, NodeState& node_state, Ledger& served,
                 Publisher& publisher)
    : options(core_options),
      nvml(nvml_api),
      kube(kube_client),
      metrics(node_metrics),
      pod_resources(kubelet_pods),
      store(core_options.state_file, core_options.fsync),
      cdi(core_options.cdi_dir, core_options.fsync),
      ns(node_state),
      ledger(served),
      events_(events),
      publisher_(publisher) {}

absl::StatusOr<std::vector<PodMig>> NodeOps::ListPods() {
  kube::ListOptions list_options;
  list_options.field_selector = "spec.nodeName=" + options.node_name;
  auto list = kube.ListPods(list_options);
  if (!list.ok()) {
    return absl::UnavailableError(fmt::format("cannot list the pods of node {}: {}",
                                              options.node_name,
                                              std::string(list.status().message())));
  }
  std::vector<PodMig> pods;
  pods.reserve(list->items.size());
  for (const auto& item : list->items) pods.push_back(AnalyzePod(item));
  return pods;
}

absl::Status NodeOps::Persist() {
  ns.state.ledger = ledger.Entries();
  return store.Save(ns.state);
}

void NodeOps::PersistOrLog(std::string_view what) {
  if (auto st = Persist(); !st.ok()) {
    spdlog::error("{}: cannot save state: {}", what, std::string(st.message()));
  }
}

void NodeOps::UpdateGauges() {
  publisher_.SetGauges(ns.state.instances, ns.recovery_pending);
  if (metrics.pod_identity()) {
    metrics.SetInstances(
        LiveInstanceInfos(ns.state.instances, ledger.Entries(), ns.inventory, options.node_name));
  }
  metrics.SetDestroyPending(static_cast<double>(
      std::count_if(ns.state.instances.begin(), ns.state.instances.end(),
                    [](const ManagedInstance& m) { return m.destroy_pending(); })));
  UpdateLegacyGauge();
}

bool NodeOps::FirstReport(const std::string& key) { return reported_.insert(key).second; }

void NodeOps::ForgetReport(const std::string& key) { reported_.erase(key); }

void NodeOps::Event(const PodMig* pod, std::string_view type, std::string_view reason,
                    const std::string& message) {
  events_.Record(pod != nullptr ? pod->pod : NodeRef(options.node_name), type, reason, message);
}

absl::Status NodeOps::DestroyGi(const GpuEntry& gpu, uint32_t gi) {
  auto cis = nvml.ListComputeInstances(gpu.info.index, gi);
  if (!cis.ok()) {
    if (cis.status().code() == absl::StatusCode::kNotFound) return absl::OkStatus();
    return Annotate(cis.status(), fmt::format("list CIs of GI {} on GPU {}", gi, gpu.info.uuid));
  }
  for (const auto& ci : *cis) {
    auto st = nvml.DestroyComputeInstance(gpu.info.index, gi, ci.id);
    if (!st.ok() && st.code() != absl::StatusCode::kNotFound) {
      return Annotate(st,
                      fmt::format("destroy CI {} of GI {} on GPU {}", ci.id, gi, gpu.info.uuid));
    }
  }
  auto st = nvml.DestroyGpuInstance(gpu.info.index, gi);
  if (!st.ok() && st.code() != absl::StatusCode::kNotFound) {
    return Annotate(st, fmt::format("destroy GI {} on GPU {}", gi, gpu.info.uuid));
  }
  return absl::OkStatus();
}

bool NodeOps::GiBusy(const GpuEntry& gpu, uint32_t gi, std::string* why) {
  auto cis = nvml.ListComputeInstances(gpu.info.index, gi);
  if (!cis.ok()) {
    if (cis.status().code() == absl::StatusCode::kNotFound) return false;
    *why =
        fmt::format("cannot list its compute instances: {}", std::string(cis.status().message()));
    return true;
  }
  for (const auto& ci : *cis) {
    auto procs = nvml.GetMigDeviceProcesses(gpu.info.index, gi, ci.id);
    if (!procs.ok()) {
      if (procs.status().code() == absl::StatusCode::kNotFound) continue;
      *why = fmt::format("cannot list its processes: {}", std::string(procs.status().message()));
      return true;
    }
    if (!procs->empty()) {
      std::vector<uint32_t> pids;
      for (const auto& p : *procs) pids.push_back(p.pid);
      *why = fmt::format("process(es) {} still run on it", fmt::join(pids, ","));
      return true;
    }
  }
  return false;
}

bool NodeOps::GpuHasProcesses(const GpuEntry& gpu, std::string* why) {
  auto procs = nvml.GetComputeProcesses(gpu.info.index);
  if (!procs.ok()) {
    *why = fmt::format("its processes cannot be listed: {}", std::string(procs.status().message()));
    return true;
  }
  if (!procs->empty()) {
    *why = fmt::format("{} process(es) run on it", procs->size());
    return true;
  }
  return false;
}

absl::Status NodeOps::Verify(const GpuEntry& gpu, const nvml::GpuInstanceInfo& gi,
                             const protocol::MigAllocation& a) {
  const mig::ProfileSpec* profile = gpu.capability.FindProfile(a.profile);
  if (profile == nullptr) {
    return absl::FailedPreconditionError(
        fmt::format("profile {} does not exist on {}", a.profile, gpu.info.name));
  }
  if (gi.profile_id != profile->nvml_id) {
    const mig::ProfileSpec* actual = gpu.FindById(gi.profile_id);
    return absl::FailedPreconditionError(
        fmt::format("GI {} at {} has profile {} (id {}), the annotation says {} (id {})", gi.id,
                    PlacementText(gi.placement), actual != nullptr ? actual->name : "?",
                    gi.profile_id, a.profile, profile->nvml_id));
  }
  if (gi.placement != a.placement) {
    return absl::FailedPreconditionError(fmt::format("GI {} is at {}, the annotation says {}",
                                                     gi.id, PlacementText(gi.placement),
                                                     PlacementText(a.placement)));
  }
  if (gi.id != a.runtime->gpu_instance_id) {
    return absl::FailedPreconditionError(
        fmt::format("the GI at {} has id {}, the annotation says gpuInstanceID {}",
                    PlacementText(gi.placement), gi.id, a.runtime->gpu_instance_id));
  }
  auto cis = nvml.ListComputeInstances(gpu.info.index, gi.id);
  if (!cis.ok()) return Annotate(cis.status(), fmt::format("list CIs of GI {}", gi.id));
  bool found = false;
  for (const auto& ci : *cis) found = found || ci.id == a.runtime->compute_instance_id;
  if (!found) {
    return absl::FailedPreconditionError(
        fmt::format("GI {} has no compute instance {} (the annotation's computeInstanceID)", gi.id,
                    a.runtime->compute_instance_id));
  }
  auto uuid = nvml.GetMigDeviceUuid(gpu.info.index, gi.id, a.runtime->compute_instance_id);
  if (!uuid.ok()) return Annotate(uuid.status(), "read the MIG UUID");
  if (*uuid != a.runtime->mig_uuid) {
    return absl::FailedPreconditionError(
        fmt::format("GI {} CI {} has MIG UUID {}, the annotation says {}", gi.id,
                    a.runtime->compute_instance_id, *uuid, a.runtime->mig_uuid));
  }
  return absl::OkStatus();
}

ManagedInstance NodeOps::NewInstance(const InstanceOwner& owner, std::string_view gpu_uuid,
                                     std::string_view profile, uint32_t profile_id,
                                     const mig::Placement& placement, uint32_t gi, uint32_t ci,
                                     std::string_view mig_uuid, std::string_view origin) const {
  ManagedInstance m;
  m.gpu_uuid = std::string(gpu_uuid);
  m.profile = std::string(profile);
  m.profile_id = profile_id;
  m.placement = placement;
  m.gpu_instance_id = gi;
  m.compute_instance_id = ci;
  m.mig_uuid = std::string(mig_uuid);
  m.owner = owner;
  m.origin = std::string(origin);
  m.since = NowUnix();
  return m;
}

absl::StatusOr<std::vector<protocol::MigAllocation>> NodeOps::WithIdentities(
    const PodMig& pod, const kube::Object& current, int container,
    const std::map<int, protocol::RuntimeIdentity>& entries, bool& already) {
  auto allocations = protocol::DecodeMigAllocations(
      kube::Annotation(current, protocol::kMigAllocationsAnnotation).value_or(""));
  if (!allocations.ok()) {
    return absl::FailedPreconditionError(fmt::format("pod {}: {} cannot be decoded: {}", pod.key,
                                                     protocol::kMigAllocationsAnnotation,
                                                     std::string(allocations.status().message())));
  }
  already = true;
  for (const auto& [device, identity] : entries) {
    const int wanted_device = device;  // clang 14 cannot capture a structured binding
    auto it = std::find_if(allocations->begin(), allocations->end(), [&](const auto& a) {
      return a.container_index == container && a.device_index == wanted_device;
    });
    if (it == allocations->end()) {
      return absl::FailedPreconditionError(
          fmt::format("pod {}: the reservation of container {} device {} disappeared", pod.key,
                      container, device));
    }
    if (it->runtime.has_value() && *it->runtime != identity) {
      return absl::FailedPreconditionError(
          fmt::format("pod {} container {} device {} already carries another runtime identity ({})",
                      pod.key, container, device, it->runtime->mig_uuid));
    }
    already = already && it->runtime.has_value();
    it->runtime = identity;
  }
  // The reservations this call realized must be the ones the pod still holds.
  for (const auto& a : *allocations) {
    if (a.container_index != container || !entries.count(a.device_index)) continue;
    const protocol::MigAllocation* original = nullptr;
    if (pod.allocations.ok()) {
      for (const auto& o : *pod.allocations) {
        if (original == nullptr && o.container_index == container &&
            o.device_index == a.device_index) {
          original = &o;
        }
      }
    }
    if (original != nullptr &&
        (original->gpu_uuid != a.gpu_uuid || original->profile != a.profile ||
         original->placement != a.placement)) {
      return absl::FailedPreconditionError(fmt::format(
          "pod {}: the reservation of container {} device {} changed while it was realized",
          pod.key, container, a.device_index));
    }
  }
  return allocations;
}

absl::StatusOr<kube::Object> NodeOps::PodForAttempt(const PodMig& pod, int attempt) {
  kube::Object current = pod.pod;
  if (attempt > 0) {
    auto fresh = kube.GetPod(pod.ns, pod.name);
    if (!fresh.ok()) return Annotate(fresh.status(), fmt::format("re-read pod {}", pod.key));
    current = std::move(*fresh);
  }
  if (kube::Uid(current) != pod.uid) {
    return absl::AbortedError(
        fmt::format("pod {} was replaced (uid {} -> {})", pod.key, pod.uid, kube::Uid(current)));
  }
  if (!IsActive(current)) {
    return absl::FailedPreconditionError(fmt::format("pod {} is terminating or finished", pod.key));
  }
  return current;
}

absl::Status NodeOps::WriteRuntimeIdentity(const PodMig& pod, int container,
                                           const std::map<int, protocol::RuntimeIdentity>& entries,
                                           bool consume, bool* done) {
  for (int attempt = 0; attempt < options.annotation_attempts; ++attempt) {
    DYNMIG_ASSIGN_OR_RETURN(const kube::Object current, PodForAttempt(pod, attempt));
    bool already = false;
    DYNMIG_ASSIGN_OR_RETURN(auto allocations,
                            WithIdentities(pod, current, container, entries, already));
    kube::KeyPatch patch;
    patch[std::string(protocol::kMigAllocationsAnnotation)] =
        protocol::EncodeMigAllocations(allocations);
    bool remaining = false;
    if (consume) {
      auto devices = protocol::DecodePodDevices(
          kube::Annotation(current, protocol::kDevicesToAllocateAnnotation).value_or(""));
      if (!devices.ok()) {
        return absl::FailedPreconditionError(fmt::format(
            "pod {}: {} cannot be decoded: {}", pod.key, protocol::kDevicesToAllocateAnnotation,
            std::string(devices.status().message())));
      }
      const bool consumed =
          static_cast<size_t>(container) >= devices->size() || (*devices)[container].empty();
      if (consumed) {
        if (already) {  // an earlier attempt of this write went through
          for (const auto& c : *devices) remaining = remaining || !c.empty();
          *done = !remaining;
          return absl::OkStatus();
        }
        return absl::FailedPreconditionError(fmt::format(
            "pod {}: container {} was allocated by another call meanwhile", pod.key, container));
      }
      (*devices)[container].clear();
      for (const auto& c : *devices) remaining = remaining || !c.empty();
      auto encoded = protocol::EncodePodDevices(*devices);
      if (!encoded.ok()) return encoded.status();
      patch[std::string(protocol::kDevicesToAllocateAnnotation)] = *encoded;
      if (!remaining) {
        patch[std::string(protocol::kBindPhaseAnnotation)] =
            std::string(protocol::kBindPhaseSuccess);
      }
    }
    auto st = kube.PatchPodAnnotations(pod.ns, pod.name, patch, kube::ResourceVersion(current));
    if (st.ok()) {
      if (done != nullptr) *done = !remaining;
      return absl::OkStatus();
    }
    if (st.status().code() != absl::StatusCode::kAborted) {
      return Annotate(st.status(), fmt::format("patch pod {}", pod.key));
    }
    spdlog::info("pod {} changed while writing its runtime identity (attempt {}): re-reading",
                 pod.key, attempt + 1);
  }
  return absl::AbortedError(
      fmt::format("pod {}: the annotation write still conflicted after {} "
                  "attempts",
                  pod.key, options.annotation_attempts));
}

absl::StatusOr<std::vector<std::string>> NodeOps::DeviceNodes(const GpuEntry& gpu, uint32_t gi,
                                                              uint32_t ci) {
  // Simulated devices have no device node on the host: the container gets the environment only
  // (a runtime fails a container whose device node does not exist).
  if (!nvml.HasDeviceNodes()) return std::vector<std::string>{};
  if (!ns.minors.has_value()) {
    auto minors = nvml.GetMigMinors();
    if (!minors.ok()) {
      return absl::FailedPreconditionError(fmt::format(
          "the MIG capability minors are unavailable: {}", std::string(minors.status().message())));
    }
    ns.minors = std::move(*minors);
  }
  auto nodes = ns.minors->DeviceNodes(gpu.info.minor, gi, ci);
  if (!nodes.ok()) return nodes.status();
  return nodes->All();
}

absl::Status NodeOps::VerifyIdle(const GpuEntry& gpu, const ManagedInstance& m,
                                 const nvml::GpuInstanceInfo& gi) {
  if (gi.id != m.gpu_instance_id || gi.placement != m.placement) {
    return absl::FailedPreconditionError(fmt::format(
        "the GI at {} is GI {}, not GI {}", PlacementText(gi.placement), gi.id, m.gpu_instance_id));
  }
  if (gi.profile_id != m.profile_id) {
    return absl::FailedPreconditionError(
        fmt::format("GI {} has profile id {}, the idle instance was {} (id {})", gi.id,
                    gi.profile_id, m.profile, m.profile_id));
  }
  auto cis = nvml.ListComputeInstances(gpu.info.index, gi.id);
  if (!cis.ok()) return Annotate(cis.status(), fmt::format("list CIs of GI {}", gi.id));
  bool found = false;
  for (const auto& ci : *cis) found = found || ci.id == m.compute_instance_id;
  if (!found) {
    return absl::FailedPreconditionError(
        fmt::format("GI {} has no compute instance {}", gi.id, m.compute_instance_id));
  }
  auto uuid = nvml.GetMigDeviceUuid(gpu.info.index, gi.id, m.compute_instance_id);
  if (!uuid.ok()) return Annotate(uuid.status(), "read the MIG UUID");
  if (*uuid != m.mig_uuid) {
    return absl::FailedPreconditionError(fmt::format("GI {} CI {} has MIG UUID {}, not {}", gi.id,
                                                     m.compute_instance_id, *uuid, m.mig_uuid));
  }
  std::string busy;
  if (GiBusy(gpu, gi.id, &busy)) return absl::FailedPreconditionError(busy);
  return absl::OkStatus();
}

void NodeOps::UpdateLegacyGauge() {
  int held = 0;
  for (const auto& m : ns.state.instances) held += !m.idle && m.origin == kOriginLegacy ? 1 : 0;
  const int unconfirmed = static_cast<int>(ns.legacy.unconfirmed.size());
  int unproven = unconfirmed;
  int free = 0;
  for (const auto& [key, u] : ns.legacy.untracked) {
    unproven += u.attribution.kind == AttributionKind::kUnproven ? 1 : 0;
    free += u.attribution.kind == AttributionKind::kFree ? 1 : 0;
  }
  metrics.SetLegacyInstances(held - unconfirmed, unproven, free);
}

}  // namespace dynmig::deviceplugin
