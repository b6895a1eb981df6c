// PluginCore: creation, start, the node-local state, instance bookkeeping and NVML helpers shared
// by allocation (plugin_allocate.cc), reclamation (plugin_reclaim.cc), recovery
// (plugin_recovery.cc) and publication (plugin_publish.cc). See plugin_core.h.
#include "deviceplugin/plugin_core.h"

#include <algorithm>
#include <map>
#include <set>

#include "common/status_macros.h"
#include "deviceplugin/plugin_internal.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "protocol/annotations.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {
absl::StatusOr<std::unique_ptr<PluginCore>> PluginCore::Create(
    PluginCoreOptions options, nvml::Nvml& nvml, kube::KubeClient& kube, Metrics& metrics,
    EventRecorder& events, PodResourcesSource* pod_resources) {
  if (options.node_name.empty()) {
    return absl::InvalidArgumentError("device plugin: the node name is required (--node)");
  }
  if (options.state_file.empty()) {
    return absl::InvalidArgumentError("device plugin: the state file path is required");
  }
  if (options.resource_name.find('/') == std::string::npos) {
    return absl::InvalidArgumentError(
        fmt::format("device plugin: resource name \"{}\" is not an extended resource (domain/name)",
                    options.resource_name));
  }
  DYNMIG_RETURN_IF_ERROR(options.allowlist.Validate());
  if (options.annotation_attempts < 1) options.annotation_attempts = 1;
  if (options.clock == nullptr) options.clock = &RealClock();
  return std::unique_ptr<PluginCore>(
      new PluginCore(std::move(options), nvml, kube, metrics, events, pod_resources));
}

PluginCore::PluginCore(PluginCoreOptions options, nvml::Nvml& nvml, kube::KubeClient& kube,
                       Metrics& metrics, EventRecorder& events, PodResourcesSource* pod_resources)
    : options_(std::move(options)),
      nvml_(nvml),
      kube_(kube),
      metrics_(metrics),
      events_(events),
      pod_resources_(pod_resources),
      store_(options_.state_file, options_.fsync),
      cdi_(options_.cdi_dir, options_.fsync),
      // ListAndWatch's waits are the transport's: the kubelet at the other end runs on real time
      // whatever clock the core runs on (a simulated one would hold its streams forever).
      devices_(RealClock()),
      publisher_(options_.node_name, kube, metrics, *options_.clock) {}

bool PluginCore::Crash(std::string_view point) const {
  if (options_.crash_point && options_.crash_point(point)) {
    spdlog::error("simulated crash at {}", point);
    return true;
  }
  return false;
}

absl::Status PluginCore::Start() {
  dynmig::MutexLock lock(&ns_.mu);
  if (started_) return absl::FailedPreconditionError("device plugin core already started");
  started_ = true;
  DYNMIG_RETURN_IF_ERROR(LoadStateAndInventory());
  UpdateDevices();
  DYNMIG_RETURN_IF_ERROR(Persist());
  auto pods = ListPods();
  if (!pods.ok()) {
    ns_.recovery_pending = true;
    spdlog::warn(
        "startup: cannot list pods ({}): recovery deferred, nothing is cleaned or destroyed "
        "until the API answers",
        std::string(pods.status().message()));
    UpdateGauges();
    return absl::OkStatus();
  }
  RecoverLocked(*pods);
  UpdateGauges();
  return absl::OkStatus();
}

absl::Status PluginCore::LoadStateAndInventory() {
  auto loaded = store_.Load();
  if (loaded.ok()) {
    ns_.state = std::move(*loaded);
    ledger_.Load(ns_.state.ledger);
  } else if (loaded.status().code() == absl::StatusCode::kDataLoss) {
    auto moved = store_.MoveAside(NowUnix());
    const std::string message = fmt::format(
        "{}; moved to {}: instances are recovered from NVML and pod annotations instead (an "
        "instance no annotation describes is kept on busy GPUs)",
        std::string(loaded.status().message()), moved.ok() ? *moved : std::string("<not moved>"));
    Event(nullptr, "Warning", kReasonReconcileSkipped, message);
  } else {
    return loaded.status();
  }
  DYNMIG_ASSIGN_OR_RETURN(ns_.inventory, DiscoverInventory(nvml_, options_.allowlist));
  if (!nvml_.HasDeviceNodes()) {
    spdlog::info("{}: no device nodes on this host; containers get {} only", nvml_.Description(),
                 "NVIDIA_VISIBLE_DEVICES");
  } else if (auto minors = nvml_.GetMigMinors(); minors.ok()) {
    ns_.minors = std::move(*minors);
  } else {
    ns_.minors_error = std::string(minors.status().message());
    spdlog::warn("MIG capability minors unavailable ({}): Allocate will fail until they are",
                 ns_.minors_error);
  }
  for (const auto& gpu : ns_.inventory.gpus) {
    if (gpu.exposed && !gpu.healthy) {
      Event(nullptr, "Warning", kReasonGpuNotReady,
            fmt::format("GPU {} ({}) is not usable: {}", gpu.info.index, gpu.info.uuid,
                        gpu.unhealthy_reason));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PodMig>> PluginCore::ListPods() {
  kube::ListOptions options;
  options.field_selector = "spec.nodeName=" + options_.node_name;
  auto list = kube_.ListPods(options);
  if (!list.ok()) {
    return absl::UnavailableError(fmt::format("cannot list the pods of node {}: {}",
                                              options_.node_name,
                                              std::string(list.status().message())));
  }
  std::vector<PodMig> pods;
  pods.reserve(list->items.size());
  for (const auto& item : list->items) pods.push_back(AnalyzePod(item));
  return pods;
}

absl::Status PluginCore::Persist() {
  ns_.state.ledger = ledger_.Entries();
  return store_.Save(ns_.state);
}

void PluginCore::PersistOrLog(std::string_view what) {
  if (auto st = Persist(); !st.ok()) {
    spdlog::error("{}: cannot save state: {}", what, std::string(st.message()));
  }
}

void PluginCore::UpdateGauges() {
  publisher_.SetGauges(ns_.state.instances, ns_.recovery_pending);
  UpdateLegacyGauge();
}

bool PluginCore::FirstReport(const std::string& key) { return reported_.insert(key).second; }

void PluginCore::Event(const PodMig* pod, std::string_view type, std::string_view reason,
                       const std::string& message) {
  events_.Record(pod != nullptr ? pod->pod : NodeRef(options_.node_name), type, reason, message);
}

absl::Status PluginCore::DestroyGi(const GpuEntry& gpu, uint32_t gi) {
  auto cis = nvml_.ListComputeInstances(gpu.info.index, gi);
  if (!cis.ok()) {
    if (cis.status().code() == absl::StatusCode::kNotFound) return absl::OkStatus();
    return Annotate(cis.status(), fmt::format("list CIs of GI {} on GPU {}", gi, gpu.info.uuid));
  }
  for (const auto& ci : *cis) {
    auto st = nvml_.DestroyComputeInstance(gpu.info.index, gi, ci.id);
    if (!st.ok() && st.code() != absl::StatusCode::kNotFound) {
      return Annotate(st,
                      fmt::format("destroy CI {} of GI {} on GPU {}", ci.id, gi, gpu.info.uuid));
    }
  }
  auto st = nvml_.DestroyGpuInstance(gpu.info.index, gi);
  if (!st.ok() && st.code() != absl::StatusCode::kNotFound) {
    return Annotate(st, fmt::format("destroy GI {} on GPU {}", gi, gpu.info.uuid));
  }
  return absl::OkStatus();
}

bool PluginCore::GiBusy(const GpuEntry& gpu, uint32_t gi, std::string* why) {
  auto cis = nvml_.ListComputeInstances(gpu.info.index, gi);
  if (!cis.ok()) {
    if (cis.status().code() == absl::StatusCode::kNotFound) return false;
    *why =
        fmt::format("cannot list its compute instances: {}", std::string(cis.status().message()));
    return true;
  }
  for (const auto& ci : *cis) {
    auto procs = nvml_.GetMigDeviceProcesses(gpu.info.index, gi, ci.id);
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

bool PluginCore::GpuHasProcesses(const GpuEntry& gpu, std::string* why) {
  auto procs = nvml_.GetComputeProcesses(gpu.info.index);
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

absl::Status PluginCore::Verify(const GpuEntry& gpu, const nvml::GpuInstanceInfo& gi,
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
  auto cis = nvml_.ListComputeInstances(gpu.info.index, gi.id);
  if (!cis.ok()) return Annotate(cis.status(), fmt::format("list CIs of GI {}", gi.id));
  bool found = false;
  for (const auto& ci : *cis) found = found || ci.id == a.runtime->compute_instance_id;
  if (!found) {
    return absl::FailedPreconditionError(
        fmt::format("GI {} has no compute instance {} (the annotation's computeInstanceID)", gi.id,
                    a.runtime->compute_instance_id));
  }
  auto uuid = nvml_.GetMigDeviceUuid(gpu.info.index, gi.id, a.runtime->compute_instance_id);
  if (!uuid.ok()) return Annotate(uuid.status(), "read the MIG UUID");
  if (*uuid != a.runtime->mig_uuid) {
    return absl::FailedPreconditionError(
        fmt::format("GI {} CI {} has MIG UUID {}, the annotation says {}", gi.id,
                    a.runtime->compute_instance_id, *uuid, a.runtime->mig_uuid));
  }
  return absl::OkStatus();
}

std::vector<ManagedInstance> PluginCore::Managed() const {
  dynmig::MutexLock lock(&ns_.mu);
  return ns_.state.instances;
}

std::vector<Intent> PluginCore::OpenIntents() const {
  dynmig::MutexLock lock(&ns_.mu);
  return ns_.state.intents;
}

std::vector<QuarantinedSlices> PluginCore::Quarantined() const {
  dynmig::MutexLock lock(&ns_.mu);
  return ns_.quarantine;
}

std::vector<protocol::HeldSlices> PluginCore::Held() const {
  dynmig::MutexLock lock(&ns_.mu);
  return ns_.Held();
}

bool PluginCore::recovery_pending() const {
  dynmig::MutexLock lock(&ns_.mu);
  return ns_.recovery_pending;
}

Inventory PluginCore::inventory() const {
  dynmig::MutexLock lock(&ns_.mu);
  return ns_.inventory;
}

}  // namespace dynmig::deviceplugin
