#include "deviceplugin/plugin_core.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "protocol/annotations.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {

// One reservation of the container being allocated, validated.
struct PluginCore::Plan {
  protocol::MigAllocation allocation;
  const GpuEntry* gpu = nullptr;
  const mig::ProfileSpec* profile = nullptr;
  std::optional<ManagedInstance> reuse;  // an instance this pod container device already has
  uint64_t intent = 0;
};

// A GI this Allocate call created (rolled back on failure).
struct PluginCore::Created {
  const GpuEntry* gpu = nullptr;
  uint32_t gi = 0;
  std::string mig_uuid;
};

namespace {

std::string PlacementText(const mig::Placement& p) {
  return fmt::format("slices {} (start {}, size {})", p.ToString(), p.start, p.size);
}

std::string LegalPlacements(const mig::ProfileSpec& p) {
  std::vector<std::string> out;
  for (const auto& pl : p.placements) out.push_back(std::to_string(pl.start));
  return fmt::format("legal starts: {}", fmt::join(out, ","));
}

constexpr std::string_view kMigrationHint =
    "dynmig does not adopt or convert legacy MIG allocations, because a template/slot index does "
    "not prove a physical placement. Migrate this node as docs/device-plugin.md describes: cordon "
    "it, drain the legacy MIG pods, migrate the device config (dynmig config migrate), upgrade "
    "the scheduler, then the device plugin, and uncordon.";

}  // namespace

absl::StatusOr<std::unique_ptr<PluginCore>> PluginCore::Create(PluginCoreOptions options,
                                                               nvml::Nvml& nvml,
                                                               kube::KubeClient& kube,
                                                               Metrics& metrics,
                                                               EventRecorder& events) {
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
  if (!options.clock) options.clock = [] { return absl::Now(); };
  return std::unique_ptr<PluginCore>(
      new PluginCore(std::move(options), nvml, kube, metrics, events));
}

PluginCore::PluginCore(PluginCoreOptions options, nvml::Nvml& nvml, kube::KubeClient& kube,
                       Metrics& metrics, EventRecorder& events)
    : options_(std::move(options)),
      nvml_(nvml),
      kube_(kube),
      metrics_(metrics),
      events_(events),
      store_(options_.state_file, options_.fsync),
      cdi_(options_.cdi_dir, options_.fsync) {}

bool PluginCore::Crash(std::string_view point) const {
  if (options_.crash_point && options_.crash_point(point)) {
    spdlog::error("simulated crash at {}", point);
    return true;
  }
  return false;
}

absl::Status PluginCore::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_) return absl::FailedPreconditionError("device plugin core already started");
  started_ = true;
  auto loaded = store_.Load();
  if (loaded.ok()) {
    state_ = std::move(*loaded);
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
  DYNMIG_ASSIGN_OR_RETURN(inventory_, DiscoverInventory(nvml_, options_.allowlist));
  auto minors = nvml_.GetMigMinors();
  if (minors.ok()) {
    minors_ = std::move(*minors);
  } else {
    minors_error_ = std::string(minors.status().message());
    spdlog::warn("MIG capability minors unavailable ({}): Allocate will fail until they are",
                 minors_error_);
  }
  for (const auto& gpu : inventory_.gpus) {
    if (gpu.exposed && !gpu.healthy) {
      Event(nullptr, "Warning", kReasonGpuNotReady,
            fmt::format("GPU {} ({}) is not usable: {}", gpu.info.index, gpu.info.uuid,
                        gpu.unhealthy_reason));
    }
  }
  UpdateDevices();
  DYNMIG_RETURN_IF_ERROR(Persist());
  auto pods = ListPods();
  if (!pods.ok()) {
    recovery_pending_ = true;
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

absl::Status PluginCore::Persist() { return store_.Save(state_); }

void PluginCore::UpdateDevices() {
  std::vector<v1beta1::Device> devices;
  for (const auto& gpu : inventory_.gpus) {
    if (!gpu.exposed) continue;
    metrics_.SetGpuHealthy(gpu.info.uuid, gpu.healthy);
    for (uint32_t r = 0; r < gpu.replicas; ++r) {
      v1beta1::Device d;
      d.set_id(ReplicaId(gpu.info.uuid, r));
      d.set_health(gpu.healthy ? "Healthy" : "Unhealthy");
      devices.push_back(std::move(d));
    }
  }
  {
    std::lock_guard<std::mutex> lock(devices_mu_);
    bool same = devices.size() == devices_.size();
    for (size_t i = 0; same && i < devices.size(); ++i) {
      same = devices[i].id() == devices_[i].id() && devices[i].health() == devices_[i].health();
    }
    if (same && devices_generation_ > 0) return;
    devices_ = std::move(devices);
    ++devices_generation_;
  }
  devices_cv_.notify_all();
}

void PluginCore::UpdateGauges() {
  metrics_.SetManaged(static_cast<double>(state_.instances.size()));
  metrics_.SetRecoveryPending(recovery_pending_);
}

v1beta1::DevicePluginOptions PluginCore::PluginOptions() const {
  v1beta1::DevicePluginOptions o;
  o.set_pre_start_required(false);
  o.set_get_preferred_allocation_available(true);
  return o;
}

std::vector<v1beta1::Device> PluginCore::Devices(uint64_t* generation) const {
  std::lock_guard<std::mutex> lock(devices_mu_);
  if (generation != nullptr) *generation = devices_generation_;
  return devices_;
}

uint64_t PluginCore::WaitForDeviceChange(uint64_t seen, absl::Duration timeout) const {
  std::unique_lock<std::mutex> lock(devices_mu_);
  devices_cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                       [&] { return devices_generation_ != seen; });
  return devices_generation_;
}

bool PluginCore::RefreshDevices() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<bool> before;
  for (const auto& g : inventory_.gpus) before.push_back(g.healthy);
  if (!RefreshHealth(nvml_, inventory_)) return false;
  for (size_t i = 0; i < inventory_.gpus.size(); ++i) {
    const auto& g = inventory_.gpus[i];
    if (g.exposed && !g.healthy && before[i]) {
      Event(nullptr, "Warning", kReasonGpuNotReady,
            fmt::format("GPU {} ({}) became unhealthy: {}", g.info.index, g.info.uuid,
                        g.unhealthy_reason));
    }
  }
  UpdateDevices();
  return true;
}

absl::Status PluginCore::PublishNode() {
  std::string value;
  std::string held_value;
  bool changed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    value = protocol::EncodeNodeRegister(inventory_.RegisterDevices());
    changed = value != last_register_;
    std::vector<protocol::HeldSlices> held = ended_held_;
    held.insert(held.end(), untracked_held_.begin(), untracked_held_.end());
    held_value = protocol::EncodeHeldSlices(std::move(held));
  }
  // Both keys every time: the register also comes back after the node object was recreated.
  kube::KeyPatch patch;
  patch[std::string(protocol::kNodeHandshakeAnnotation)] = "Reported_" + kube::Rfc3339(Now());
  patch[std::string(protocol::kNodeRegisterAnnotation)] = value;
  patch[std::string(protocol::kNodeHeldSlicesAnnotation)] = held_value;
  auto st = kube_.PatchNodeAnnotations(options_.node_name, patch);
  metrics_.NodePublished(st.ok());
  if (!st.ok()) {
    return absl::Status(st.status().code(),
                        fmt::format("cannot publish the devices of node {}: {}", options_.node_name,
                                    std::string(st.status().message())));
  }
  if (changed) {
    spdlog::info("published {} on node {}: {}", protocol::kNodeRegisterAnnotation,
                 options_.node_name, value);
  }
  std::lock_guard<std::mutex> lock(mu_);
  last_register_ = value;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Instances

ManagedInstance* PluginCore::FindManaged(std::string_view gpu_uuid,
                                         const mig::Placement& placement) {
  for (auto& m : state_.instances) {
    if (m.gpu_uuid == gpu_uuid && m.placement == placement) return &m;
  }
  return nullptr;
}

ManagedInstance* PluginCore::FindManagedGi(std::string_view gpu_uuid, uint32_t gi) {
  for (auto& m : state_.instances) {
    if (m.gpu_uuid == gpu_uuid && m.gpu_instance_id == gi) return &m;
  }
  return nullptr;
}

void PluginCore::RemoveManaged(std::string_view gpu_uuid, uint32_t gi) {
  std::erase_if(state_.instances, [&](const ManagedInstance& m) {
    return m.gpu_uuid == gpu_uuid && m.gpu_instance_id == gi;
  });
}

void PluginCore::Manage(ManagedInstance instance) {
  std::erase_if(state_.instances, [&](const ManagedInstance& m) {
    return m.gpu_uuid == instance.gpu_uuid && (m.gpu_instance_id == instance.gpu_instance_id ||
                                               m.placement.Overlaps(instance.placement));
  });
  state_.instances.push_back(std::move(instance));
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

// ---------------------------------------------------------------------------------------------
// Allocate

absl::StatusOr<v1beta1::ContainerAllocateResponse> PluginCore::Allocate(
    const std::vector<std::string>& device_ids) {
  const auto start = std::chrono::steady_clock::now();
  std::string result = "failed";
  absl::StatusOr<v1beta1::ContainerAllocateResponse> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = AllocateLocked(device_ids, &result);
    UpdateGauges();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  metrics_.AllocateDone(out.ok() ? "success" : result, seconds);
  if (!out.ok())
    spdlog::warn("Allocate {}: {}", fmt::join(device_ids, ","),
                 std::string(out.status().message()));
  return out;
}

absl::Status PluginCore::Refuse(const PodMig& pod, std::string_view reason, absl::Status status,
                                std::string* result) {
  *result = "refused";
  metrics_.Refused(reason);
  Event(&pod, "Warning", kReasonRefused, std::string(status.message()));
  FailPod(pod);
  return status;
}

void PluginCore::FailPod(const PodMig& pod) {
  kube::KeyPatch patch;
  patch[std::string(protocol::kBindPhaseAnnotation)] = std::string(protocol::kBindPhaseFailed);
  auto st = kube_.PatchPodAnnotations(pod.ns, pod.name, patch);
  if (!st.ok()) {
    spdlog::warn("cannot set {}=failed on pod {}: {}", protocol::kBindPhaseAnnotation, pod.key,
                 std::string(st.status().message()));
  }
  ReleaseNodeLock(pod, node_);
}

void PluginCore::ReleaseNodeLock(const PodMig& pod, std::optional<kube::Object> node) {
  for (int attempt = 0; attempt < options_.annotation_attempts; ++attempt) {
    if (!node.has_value()) {
      auto fresh = kube_.GetNode(options_.node_name);
      if (!fresh.ok()) {
        spdlog::warn("cannot read node {} to release its lock: {}", options_.node_name,
                     std::string(fresh.status().message()));
        return;
      }
      node = std::move(*fresh);
    }
    auto value = kube::Annotation(*node, protocol::kNodeLockAnnotation);
    if (!value.has_value()) return;
    auto lock = ParseNodeLock(*value);
    if (!lock.has_value() || lock->ns != pod.ns || lock->name != pod.name) return;  // not ours
    kube::KeyPatch patch;
    patch[std::string(protocol::kNodeLockAnnotation)] = std::nullopt;
    auto st = kube_.PatchNodeAnnotations(options_.node_name, patch, kube::ResourceVersion(*node));
    if (st.ok()) return;
    if (st.status().code() != absl::StatusCode::kAborted) {
      spdlog::warn("cannot release the node lock of {}: {}", options_.node_name,
                   std::string(st.status().message()));
      return;
    }
    node.reset();  // changed meanwhile: re-read
  }
}

void PluginCore::Rollback(std::vector<Created>& created, const std::vector<uint64_t>& intents) {
  for (auto it = created.rbegin(); it != created.rend(); ++it) {
    auto st = DestroyGi(*it->gpu, it->gi);
    if (st.ok()) {
      metrics_.InstanceDestroyed("rollback");
      spdlog::info("rollback: destroyed GI {} on GPU {}", it->gi, it->gpu->info.uuid);
      if (cdi_.enabled() && !it->mig_uuid.empty()) (void)cdi_.Remove(it->mig_uuid);
      continue;
    }
    // Keep it tracked: the open intent stays, and the next start or reconcile resolves it.
    metrics_.DestroyFailed();
    spdlog::error("rollback: cannot destroy GI {} on GPU {}: {} (kept tracked)", it->gi,
                  it->gpu->info.uuid, std::string(st.message()));
    continue;
  }
  // Close the intents of instances that are gone; keep those whose instance survived.
  std::set<uint64_t> keep;
  for (const auto& c : created) {
    auto gis = nvml_.ListGpuInstances(c.gpu->info.index);
    if (!gis.ok()) continue;
    for (const auto& gi : *gis) {
      if (gi.id != c.gi) continue;
      for (const auto& intent : state_.intents) {
        if (intent.gpu_uuid == c.gpu->info.uuid && intent.placement == gi.placement) {
          keep.insert(intent.id);
        }
      }
    }
  }
  std::erase_if(state_.intents, [&](const Intent& i) {
    return std::find(intents.begin(), intents.end(), i.id) != intents.end() && !keep.count(i.id);
  });
  if (auto st = Persist(); !st.ok())
    spdlog::error("rollback: cannot save state: {}", std::string(st.message()));
  created.clear();
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> PluginCore::AllocateLocked(
    const std::vector<std::string>& device_ids, std::string* result) {
  if (device_ids.empty()) {
    return absl::InvalidArgumentError("Allocate called without device ids");
  }
  for (const auto& id : device_ids) {
    const std::string gpu = GpuOfReplicaId(id);
    const GpuEntry* entry = gpu.empty() ? nullptr : inventory_.FindByUuid(gpu);
    if (entry == nullptr || !entry->exposed) {
      return absl::InvalidArgumentError(
          fmt::format("device id \"{}\" is not one this plugin advertises", id));
    }
  }
  DYNMIG_ASSIGN_OR_RETURN(std::vector<PodMig> pods, ListPods());
  if (recovery_pending_) RecoverLocked(pods);
  // Free what finished pods hold first, so their placements can be reused at once.
  ReconcileLocked(pods);

  std::optional<NodeLock> lock;
  node_.reset();
  if (auto node = kube_.GetNode(options_.node_name); node.ok()) {
    if (auto v = kube::Annotation(*node, protocol::kNodeLockAnnotation)) lock = ParseNodeLock(*v);
    node_ = std::move(*node);
  }
  const PodMig* found = FindPendingPod(pods, options_.node_name, lock);
  if (found == nullptr) {
    *result = "refused";
    metrics_.Refused("no_pending_pod");
    return absl::FailedPreconditionError(fmt::format(
        "no pod on node {} is waiting for {} device(s): no node lock owner with devices left in "
        "{} and no pod with {}=allocating",
        options_.node_name, device_ids.size(), protocol::kDevicesToAllocateAnnotation,
        protocol::kBindPhaseAnnotation));
  }
  const PodMig pod = *found;
  const int container = pod.NextContainer();
  const protocol::ContainerDevices& devices = (*pod.to_allocate)[container];

  for (const auto& d : devices) {
    if (protocol::IsLegacyMigIdentity(d.uuid)) {
      return Refuse(pod, "legacy",
                    absl::FailedPreconditionError(fmt::format(
                        "pod {} container {} carries the legacy MIG device identity \"{}\" "
                        "(GPU-uuid[template-slot]) written by a pre-dynamic-MIG scheduler. {}",
                        pod.key, container, d.uuid, kMigrationHint)),
                    result);
    }
  }
  if (devices.size() != device_ids.size()) {
    return Refuse(
        pod, "device_count",
        absl::FailedPreconditionError(fmt::format(
            "pod {} container {}: the kubelet asks for {} device(s) but {} lists {}", pod.key,
            container, device_ids.size(), protocol::kDevicesToAllocateAnnotation, devices.size())),
        result);
  }
  if (!pod.allocations.ok()) {
    return Refuse(
        pod, "bad_reservation",
        absl::FailedPreconditionError(fmt::format("pod {}: {} cannot be decoded: {}", pod.key,
                                                  protocol::kMigAllocationsAnnotation,
                                                  std::string(pod.allocations.status().message()))),
        result);
  }
  std::vector<protocol::MigAllocation> mine;
  for (const auto& a : *pod.allocations) {
    if (a.container_index == container) mine.push_back(a);
  }
  std::sort(mine.begin(), mine.end(),
            [](const auto& a, const auto& b) { return a.device_index < b.device_index; });
  if (mine.size() != devices.size()) {
    return Refuse(pod, "reservation_mismatch",
                  absl::FailedPreconditionError(fmt::format(
                      "pod {} container {}: {} lists {} device(s) but {} has {} reservation(s) "
                      "for it",
                      pod.key, container, protocol::kDevicesToAllocateAnnotation, devices.size(),
                      protocol::kMigAllocationsAnnotation, mine.size())),
                  result);
  }

  // Validate every reservation before touching NVML.
  int init_containers = 0;
  if (auto spec = pod.pod.find("spec"); spec != pod.pod.end() && spec->is_object()) {
    if (auto init = spec->find("initContainers"); init != spec->end() && init->is_array()) {
      init_containers = static_cast<int>(init->size());
    }
  }
  std::vector<Plan> plans;
  for (size_t k = 0; k < mine.size(); ++k) {
    const protocol::MigAllocation& a = mine[k];
    const std::string what =
        fmt::format("pod {} container {} device {} ({} at {} of GPU {})", pod.key, container,
                    a.device_index, a.profile, PlacementText(a.placement), a.gpu_uuid);
    if (a.gpu_uuid != devices[k].uuid) {
      return Refuse(pod, "reservation_mismatch",
                    absl::FailedPreconditionError(fmt::format(
                        "{}: the reservation names GPU {} but {} device {} is GPU {}", what,
                        a.gpu_uuid, protocol::kDevicesToAllocateAnnotation, k, devices[k].uuid)),
                    result);
    }
    Plan plan;
    plan.allocation = a;
    plan.gpu = inventory_.FindByUuid(a.gpu_uuid);
    if (plan.gpu == nullptr || !plan.gpu->exposed) {
      return Refuse(pod, "unknown_gpu",
                    absl::FailedPreconditionError(fmt::format(
                        "{}: that GPU is not exposed on node {}", what, options_.node_name)),
                    result);
    }
    if (!plan.gpu->healthy) {
      return Refuse(pod, "gpu_unhealthy",
                    absl::UnavailableError(fmt::format("{}: the GPU is unhealthy: {}", what,
                                                       plan.gpu->unhealthy_reason)),
                    result);
    }
    plan.profile = plan.gpu->FindAllowed(a.profile);
    if (plan.profile == nullptr) {
      return Refuse(pod, "profile_not_allowed",
                    absl::FailedPreconditionError(
                        fmt::format("{}: profile {} is not an allowlisted profile of {}", what,
                                    a.profile, plan.gpu->info.name)),
                    result);
    }
    if (!plan.profile->IsLegal(a.placement)) {
      return Refuse(pod, "illegal_placement",
                    absl::InvalidArgumentError(
                        fmt::format("{}: not a legal placement of {} on {} ({})", what, a.profile,
                                    plan.gpu->info.name, LegalPlacements(*plan.profile))),
                    result);
    }
    for (const auto& other : plans) {
      if (other.allocation.gpu_uuid == a.gpu_uuid &&
          other.allocation.placement.Overlaps(a.placement)) {
        return Refuse(
            pod, "overlapping_reservation",
            absl::FailedPreconditionError(fmt::format(
                "{}: overlaps device {} of the same container at {}", what,
                other.allocation.device_index, PlacementText(other.allocation.placement))),
            result);
      }
    }
    for (const auto& q : quarantine_) {
      if (q.gpu_uuid == a.gpu_uuid && q.placement.Overlaps(a.placement) && q.pod != pod.key) {
        return Refuse(pod, "quarantined",
                      absl::FailedPreconditionError(
                          fmt::format("{}: overlaps {} kept out of use for pod {} ({})", what,
                                      PlacementText(q.placement), q.pod, q.reason)),
                      result);
      }
    }
    for (const auto& m : state_.instances) {
      if (m.gpu_uuid != a.gpu_uuid || !m.placement.Overlaps(a.placement)) continue;
      const bool same_pod = m.owner.pod_uid == pod.uid;
      const bool exact = m.placement == a.placement && m.profile == a.profile;
      const bool same_device = same_pod && m.owner.container_index == container &&
                               m.owner.device_index == a.device_index;
      // The kubelet allocates every container at admission, init containers first, and runs
      // init containers to completion before the app containers: an app container may share an
      // init container's instance when it reserved exactly the same profile and placement.
      const bool shared_init = same_pod && exact && m.owner.container_index < init_containers &&
                               m.owner.container_index < container;
      if (exact && (same_device || shared_init)) {
        plan.reuse = m;
        continue;
      }
      const std::string hint =
          same_pod ? fmt::format(
                         " (container {} of the same pod: containers of one pod may "
                         "share an instance only with the same profile and placement)",
                         m.owner.container_index)
                   : ", not reclaimed yet";
      return Refuse(pod, "placement_busy",
                    absl::FailedPreconditionError(fmt::format(
                        "{}: overlaps GI {} ({} at {}) of pod {}{}", what, m.gpu_instance_id,
                        m.profile, PlacementText(m.placement), m.owner.PodKey(), hint)),
                    result);
    }
    auto gis = nvml_.ListGpuInstances(plan.gpu->info.index);
    if (!gis.ok()) {
      Event(&pod, "Warning", kReasonFailed, std::string(gis.status().message()));
      FailPod(pod);
      return Annotate(gis.status(), what);
    }
    bool alive = false;
    for (const auto& gi : *gis) {
      if (!gi.placement.Overlaps(a.placement)) continue;
      if (plan.reuse.has_value() && gi.id == plan.reuse->gpu_instance_id &&
          gi.placement == a.placement) {
        alive = true;
        continue;
      }
      const mig::ProfileSpec* p = plan.gpu->FindById(gi.profile_id);
      return Refuse(pod, "placement_busy",
                    absl::FailedPreconditionError(fmt::format(
                        "{}: overlaps GI {} ({} at {}) that dynmig does not manage", what, gi.id,
                        p != nullptr ? p->name : fmt::format("profile id {}", gi.profile_id),
                        PlacementText(gi.placement))),
                    result);
    }
    if (plan.reuse.has_value() && !alive) {
      RemoveManaged(a.gpu_uuid, plan.reuse->gpu_instance_id);  // vanished: create it again
      plan.reuse.reset();
    }
    plans.push_back(std::move(plan));
  }

  // Intents before any creation, so a crash in between is resolved without guessing.
  std::vector<uint64_t> intents;
  for (auto& plan : plans) {
    if (plan.reuse.has_value()) continue;
    Intent intent;
    intent.id = state_.next_intent_id++;
    intent.owner = {pod.uid, pod.ns, pod.name, container, plan.allocation.device_index};
    intent.gpu_uuid = plan.allocation.gpu_uuid;
    intent.profile = plan.allocation.profile;
    intent.placement = plan.allocation.placement;
    intent.created = NowUnix();
    plan.intent = intent.id;
    intents.push_back(intent.id);
    state_.intents.push_back(std::move(intent));
  }
  if (!intents.empty()) {
    if (auto st = Persist(); !st.ok()) {
      std::erase_if(state_.intents, [&](const Intent& i) {
        return std::find(intents.begin(), intents.end(), i.id) != intents.end();
      });
      Event(&pod, "Warning", kReasonFailed, std::string(st.message()));
      FailPod(pod);
      return Annotate(st, "record the allocation intent");
    }
  }
  if (Crash(kCrashAfterIntent)) return absl::AbortedError("simulated crash after the intent");

  // Create.
  std::vector<Created> created;
  std::vector<ManagedInstance> instances;
  auto fail = [&](const absl::Status& st, std::string_view step) -> absl::Status {
    const absl::Status annotated =
        Annotate(st, fmt::format("pod {} container {}: {}", pod.key, container, step));
    Rollback(created, intents);
    Event(&pod, "Warning", kReasonFailed, std::string(annotated.message()));
    FailPod(pod);
    return annotated;
  };
  for (const auto& plan : plans) {
    const protocol::MigAllocation& a = plan.allocation;
    if (plan.reuse.has_value()) {
      instances.push_back(*plan.reuse);
      continue;
    }
    const std::string what =
        fmt::format("{} at {} of GPU {}", a.profile, PlacementText(a.placement), a.gpu_uuid);
    auto gi = nvml_.CreateGpuInstance(plan.gpu->info.index, plan.profile->nvml_id, a.placement);
    if (!gi.ok()) return fail(gi.status(), "create GI " + what);
    created.push_back({plan.gpu, gi->id, ""});
    if (Crash(kCrashAfterGpuInstance)) return absl::AbortedError("simulated crash after the GI");
    auto ci = nvml_.CreateComputeInstance(plan.gpu->info.index, gi->id);
    if (!ci.ok())
      return fail(ci.status(), fmt::format("create the CI of GI {} ({})", gi->id, what));
    if (Crash(kCrashAfterComputeInstance)) {
      return absl::AbortedError("simulated crash after the CI");
    }
    auto uuid = nvml_.GetMigDeviceUuid(plan.gpu->info.index, gi->id, ci->id);
    if (!uuid.ok()) {
      return fail(uuid.status(), fmt::format("read the MIG UUID of GI {} CI {}", gi->id, ci->id));
    }
    created.back().mig_uuid = *uuid;
    ManagedInstance m;
    m.gpu_uuid = a.gpu_uuid;
    m.profile = a.profile;
    m.profile_id = plan.profile->nvml_id;
    m.placement = a.placement;
    m.gpu_instance_id = gi->id;
    m.compute_instance_id = ci->id;
    m.mig_uuid = *uuid;
    m.owner = {pod.uid, pod.ns, pod.name, container, a.device_index};
    m.origin = "created";
    m.since = NowUnix();
    instances.push_back(std::move(m));
  }

  auto answer = Answer(instances);
  if (!answer.ok()) return fail(answer.status(), "prepare the container's devices");

  // The runtime identity, under the pod's resourceVersion.
  std::map<int, protocol::RuntimeIdentity> identities;
  for (size_t k = 0; k < instances.size(); ++k) {  // instances[k] realizes plans[k]
    const auto& m = instances[k];
    identities[plans[k].allocation.device_index] = {m.mig_uuid, m.gpu_instance_id,
                                                    m.compute_instance_id};
  }
  bool done = false;
  auto written = WriteRuntimeIdentity(pod, container, identities, /*consume=*/true, &done);
  if (!written.ok()) {
    if (Crash(kCrashBeforeRollback)) return absl::AbortedError("simulated crash before rollback");
    return fail(written, fmt::format("write {}", protocol::kMigAllocationsAnnotation));
  }
  if (Crash(kCrashAfterAnnotation)) {
    return absl::AbortedError("simulated crash after the annotation");
  }

  // Commit: managed instances and closed intents in one write.
  for (const auto& m : instances) Manage(m);
  std::erase_if(state_.intents, [&](const Intent& i) {
    return std::find(intents.begin(), intents.end(), i.id) != intents.end();
  });
  if (auto st = Persist(); !st.ok()) {
    // The annotation holds the identity: the next start adopts the instances from it.
    spdlog::error("cannot save state after allocating pod {}: {}", pod.key,
                  std::string(st.message()));
  }
  for (size_t k = 0; k < instances.size(); ++k) {
    const auto& m = instances[k];
    if (plans[k].reuse.has_value()) continue;
    metrics_.InstanceCreated(m.profile);
    Event(&pod, "Normal", kReasonCreated,
          fmt::format("created MIG device {} ({} at {} of GPU {}, GI {}, CI {}) for container {} "
                      "device {}",
                      m.mig_uuid, m.profile, PlacementText(m.placement), m.gpu_uuid,
                      m.gpu_instance_id, m.compute_instance_id, container, m.owner.device_index));
  }
  if (done) ReleaseNodeLock(pod, node_);
  *result = "success";
  return answer;
}

absl::Status PluginCore::WriteRuntimeIdentity(
    const PodMig& pod, int container, const std::map<int, protocol::RuntimeIdentity>& entries,
    bool consume, bool* done) {
  kube::Object current = pod.pod;
  for (int attempt = 0; attempt < options_.annotation_attempts; ++attempt) {
    if (attempt > 0) {
      auto fresh = kube_.GetPod(pod.ns, pod.name);
      if (!fresh.ok()) return Annotate(fresh.status(), fmt::format("re-read pod {}", pod.key));
      current = std::move(*fresh);
    }
    if (kube::Uid(current) != pod.uid) {
      return absl::AbortedError(
          fmt::format("pod {} was replaced (uid {} -> {})", pod.key, pod.uid, kube::Uid(current)));
    }
    if (!IsActive(current)) {
      return absl::FailedPreconditionError(
          fmt::format("pod {} is terminating or finished", pod.key));
    }
    auto allocations = protocol::DecodeMigAllocations(
        kube::Annotation(current, protocol::kMigAllocationsAnnotation).value_or(""));
    if (!allocations.ok()) {
      return absl::FailedPreconditionError(fmt::format(
          "pod {}: {} cannot be decoded: {}", pod.key, protocol::kMigAllocationsAnnotation,
          std::string(allocations.status().message())));
    }
    bool already = true;
    for (const auto& [device, identity] : entries) {
      auto it = std::find_if(allocations->begin(), allocations->end(), [&](const auto& a) {
        return a.container_index == container && a.device_index == device;
      });
      if (it == allocations->end()) {
        return absl::FailedPreconditionError(
            fmt::format("pod {}: the reservation of container {} device {} disappeared", pod.key,
                        container, device));
      }
      if (it->runtime.has_value() && *it->runtime != identity) {
        return absl::FailedPreconditionError(fmt::format(
            "pod {} container {} device {} already carries another runtime identity ({})", pod.key,
            container, device, it->runtime->mig_uuid));
      }
      already = already && it->runtime.has_value();
      it->runtime = identity;
    }
    // The reservations this call realized must be the ones the pod still holds.
    for (const auto& a : *allocations) {
      if (a.container_index != container || !entries.count(a.device_index)) continue;
      const auto* original = [&]() -> const protocol::MigAllocation* {
        if (!pod.allocations.ok()) return nullptr;
        for (const auto& o : *pod.allocations) {
          if (o.container_index == container && o.device_index == a.device_index) return &o;
        }
        return nullptr;
      }();
      if (original != nullptr &&
          (original->gpu_uuid != a.gpu_uuid || original->profile != a.profile ||
           original->placement != a.placement)) {
        return absl::FailedPreconditionError(fmt::format(
            "pod {}: the reservation of container {} device {} changed while it was realized",
            pod.key, container, a.device_index));
      }
    }
    kube::KeyPatch patch;
    patch[std::string(protocol::kMigAllocationsAnnotation)] =
        protocol::EncodeMigAllocations(*allocations);
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
    auto st = kube_.PatchPodAnnotations(pod.ns, pod.name, patch, kube::ResourceVersion(current));
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
                  pod.key, options_.annotation_attempts));
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> PluginCore::Answer(
    const std::vector<ManagedInstance>& instances) {
  if (!minors_.has_value()) {
    auto minors = nvml_.GetMigMinors();
    if (!minors.ok()) {
      return absl::FailedPreconditionError(fmt::format(
          "the MIG capability minors are unavailable: {}", std::string(minors.status().message())));
    }
    minors_ = std::move(*minors);
  }
  v1beta1::ContainerAllocateResponse response;
  std::vector<std::string> uuids;
  std::vector<std::string> paths;
  std::set<std::string> seen;
  for (const auto& m : instances) {
    const GpuEntry* gpu = inventory_.FindByUuid(m.gpu_uuid);
    if (gpu == nullptr) {
      return absl::InternalError(fmt::format("GPU {} vanished from the inventory", m.gpu_uuid));
    }
    auto nodes = minors_->DeviceNodes(gpu->info.minor, m.gpu_instance_id, m.compute_instance_id);
    if (!nodes.ok()) {
      return Annotate(nodes.status(), fmt::format("device nodes of {}", m.mig_uuid));
    }
    uuids.push_back(m.mig_uuid);
    const std::vector<std::string> all = nodes->All();
    if (cdi_.enabled()) {
      if (auto st = cdi_.Write(m.mig_uuid, all); !st.ok()) return st;
      response.add_cdi_devices()->set_name(CdiWriter::QualifiedName(m.mig_uuid));
      continue;
    }
    for (const auto& p : all) {
      if (seen.insert(p).second) paths.push_back(p);
    }
  }
  if (!cdi_.enabled()) {
    (*response.mutable_envs())["NVIDIA_VISIBLE_DEVICES"] = fmt::format("{}", fmt::join(uuids, ","));
    for (const auto& p : paths) {
      v1beta1::DeviceSpec* spec = response.add_devices();
      spec->set_container_path(p);
      spec->set_host_path(p);
      spec->set_permissions("rw");
    }
  }
  return response;
}

v1beta1::ContainerPreferredAllocationResponse PluginCore::PreferredAllocation(
    const v1beta1::ContainerPreferredAllocationRequest& request) {
  const size_t size = request.allocation_size() > 0 ? request.allocation_size() : 0;
  std::vector<std::string> chosen;
  auto take = [&](const std::string& id) {
    if (chosen.size() < size && std::find(chosen.begin(), chosen.end(), id) == chosen.end()) {
      chosen.push_back(id);
    }
  };
  for (const auto& id : request.must_include_deviceids()) take(id);
  std::vector<std::string> wanted_gpus;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto pods = ListPods();
    if (pods.ok()) {
      std::optional<NodeLock> node_lock;
      if (auto node = kube_.GetNode(options_.node_name); node.ok()) {
        if (auto v = kube::Annotation(*node, protocol::kNodeLockAnnotation)) {
          node_lock = ParseNodeLock(*v);
        }
      }
      if (const PodMig* pod = FindPendingPod(*pods, options_.node_name, node_lock)) {
        for (const auto& d : (*pod->to_allocate)[pod->NextContainer()]) {
          wanted_gpus.push_back(d.uuid);
        }
      }
    }
  }
  // One replica of each reserved GPU per reserved device (must-include ones count).
  std::map<std::string, int> need;
  for (const auto& g : wanted_gpus) ++need[g];
  for (const auto& id : chosen) {
    auto it = need.find(GpuOfReplicaId(id));
    if (it != need.end() && it->second > 0) --it->second;
  }
  for (const auto& id : request.available_deviceids()) {
    auto it = need.find(GpuOfReplicaId(id));
    if (it == need.end() || it->second == 0) continue;
    const size_t before = chosen.size();
    take(id);
    if (chosen.size() > before) --it->second;
  }
  for (const auto& id : request.available_deviceids()) take(id);
  v1beta1::ContainerPreferredAllocationResponse response;
  for (const auto& id : chosen) response.add_deviceids(id);
  return response;
}

// ---------------------------------------------------------------------------------------------
// Reconcile

ReconcileReport PluginCore::Reconcile() {
  const auto start = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  ReconcileReport report;
  auto pods = ListPods();
  if (!pods.ok()) {
    report.skipped = std::string(pods.status().message());
    if (FirstReport("list-failed")) {
      spdlog::warn("reconcile skipped, nothing destroyed: {}", report.skipped);
    }
    metrics_.ReconcileDone(
        "skipped_list",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return report;
  }
  reported_.erase("list-failed");
  if (recovery_pending_) RecoverLocked(*pods);
  report = ReconcileLocked(*pods);
  UpdateGauges();
  metrics_.ReconcileDone(
      report.skipped.empty() ? "ok" : "skipped_decode",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return report;
}

std::vector<std::string> PluginCore::Unreadable(const std::vector<PodMig>& pods) {
  std::vector<std::string> unreadable;
  for (const auto& p : pods) {
    if (p.terminated || p.unreadable.empty()) continue;
    unreadable.push_back(fmt::format("{}: {}", p.key, p.unreadable));
    if (FirstReport("unreadable/" + p.uid + "/" + p.unreadable)) {
      metrics_.AdoptionFailed();
      Event(&p, "Warning", kReasonReconcileSkipped,
            fmt::format("the MIG annotations of pod {} cannot be read ({}): no MIG instance on "
                        "node {} is destroyed until they can",
                        p.key, p.unreadable, options_.node_name));
    }
  }
  return unreadable;
}

ReconcileReport PluginCore::ReconcileLocked(const std::vector<PodMig>& pods) {
  ReconcileReport report;
  report.listed = true;
  const std::vector<std::string> unreadable = Unreadable(pods);
  const bool destructive = unreadable.empty();
  if (!destructive) {
    report.skipped = fmt::format("unreadable MIG annotations: {}", fmt::join(unreadable, "; "));
  }

  // Intents left open by a crash or a failed rollback (none is in flight: we hold mu_).
  if (!state_.intents.empty()) ResolveIntents(pods, destructive);

  std::map<std::string, const PodMig*> by_uid;
  for (const auto& p : pods) by_uid[p.uid] = &p;
  bool changed = false;
  const std::vector<ManagedInstance> managed = state_.instances;
  ended_held_.clear();
  for (const auto& m : managed) {
    auto it = by_uid.find(m.owner.pod_uid);
    const PodMig* owner = it == by_uid.end() ? nullptr : it->second;
    if (owner != nullptr && owner->active) continue;
    const std::string ended = owner == nullptr    ? "deleted"
                              : owner->terminated ? "finished"
                                                  : "deleting";
    auto hold = [&](const std::string& why) {
      ended_held_.push_back({m.gpu_uuid, m.placement, m.profile,
                             fmt::format("{} of pod {} ({}), not reclaimed yet: {}", m.mig_uuid,
                                         m.owner.PodKey(), ended, why)});
    };
    if (!destructive) {
      hold("reclamation is paused while a pod's MIG annotation cannot be read");
      continue;
    }
    const GpuEntry* gpu = inventory_.FindByUuid(m.gpu_uuid);
    if (gpu == nullptr) continue;
    std::string why;
    if (GiBusy(*gpu, m.gpu_instance_id, &why)) {
      hold(why);
      ++report.busy;
      if (FirstReport(fmt::format("busy/{}/{}", m.gpu_uuid, m.gpu_instance_id))) {
        Event(owner, "Normal", kReasonReclaimDeferred,
              fmt::format("MIG device {} (GI {} on GPU {}) of pod {} is not reclaimed yet: {}; "
                          "retried every cycle",
                          m.mig_uuid, m.gpu_instance_id, m.gpu_uuid, m.owner.PodKey(), why));
      }
      continue;
    }
    auto st = DestroyGi(*gpu, m.gpu_instance_id);
    if (!st.ok()) {
      hold("destroying it failed: " + std::string(st.message()));
      ++report.destroy_failed;
      metrics_.DestroyFailed();
      spdlog::warn("reclaim of {} (pod {}) failed, retried next cycle: {}", m.mig_uuid,
                   m.owner.PodKey(), std::string(st.message()));
      continue;
    }
    RemoveManaged(m.gpu_uuid, m.gpu_instance_id);
    reported_.erase(fmt::format("busy/{}/{}", m.gpu_uuid, m.gpu_instance_id));
    if (cdi_.enabled()) {
      if (auto rm = cdi_.Remove(m.mig_uuid); !rm.ok())
        spdlog::warn("{}", std::string(rm.message()));
    }
    changed = true;
    ++report.destroyed;
    metrics_.InstanceDestroyed("reclaimed");
    Event(owner, "Normal", kReasonDestroyed,
          fmt::format("destroyed MIG device {} ({} at {} of GPU {}, GI {}) of pod {} ({})",
                      m.mig_uuid, m.profile, PlacementText(m.placement), m.gpu_uuid,
                      m.gpu_instance_id, m.owner.PodKey(), ended));
  }
  if (changed) {
    if (auto st = Persist(); !st.ok())
      spdlog::error("cannot save state: {}", std::string(st.message()));
  }
  // Then adopt what verified annotations describe, and clean untracked instances of GPUs that
  // became idle (after the sweep, so a GPU freed in this cycle is cleaned in this cycle).
  AdoptUntracked(pods, destructive, report);
  metrics_.SetBusy(report.busy);
  return report;
}

void PluginCore::AdoptUntracked(const std::vector<PodMig>& pods, bool destructive,
                                ReconcileReport& report) {
  quarantine_.clear();
  untracked_held_.clear();
  // Complete annotations by GPU and placement, and allocations that cannot be verified.
  struct Candidate {
    const PodMig* pod;
    protocol::MigAllocation allocation;
  };
  std::map<std::pair<std::string, uint32_t>, Candidate> candidates;  // (gpu, start)
  auto quarantine = [&](const PodMig& p, const protocol::MigAllocation& a,
                        const std::string& reason) {
    quarantine_.push_back({a.gpu_uuid, a.placement, p.key, reason});
    ++report.unverified;
    if (FirstReport(fmt::format("unverified/{}/{}/{}/{}", p.uid, a.container_index, a.device_index,
                                reason))) {
      metrics_.AdoptionFailed();
      Event(&p, "Warning", kReasonAdoptionFailed,
            fmt::format("container {} device {} ({} at {} of GPU {}) cannot be verified: {}; its "
                        "slices are kept out of use and never destroyed while the pod runs",
                        a.container_index, a.device_index, a.profile, PlacementText(a.placement),
                        a.gpu_uuid, reason));
    }
  };
  for (const auto& p : pods) {
    if (!p.allocations.ok()) continue;
    for (const auto& a : *p.allocations) {
      if (a.runtime.has_value()) {
        const ManagedInstance* m = FindManaged(a.gpu_uuid, a.placement);
        if (m != nullptr) {
          const bool same = m->owner.pod_uid == p.uid && m->profile == a.profile &&
                            m->gpu_instance_id == a.runtime->gpu_instance_id &&
                            m->compute_instance_id == a.runtime->compute_instance_id &&
                            m->mig_uuid == a.runtime->mig_uuid;
          if (!same && !p.terminated) {
            quarantine(p, a,
                       fmt::format("the instance there is managed for pod {} ({})",
                                   m->owner.PodKey(), m->mig_uuid));
          }
          continue;
        }
        const GpuEntry* gpu = inventory_.FindByUuid(a.gpu_uuid);
        if ((gpu == nullptr || !gpu->exposed) && !p.terminated) {
          quarantine(p, a, "the GPU is not exposed on this node");
          continue;
        }
        candidates[{a.gpu_uuid, a.placement.start}] = {&p, a};
      } else if (!p.terminated && p.ContainerAllocated(a.container_index)) {
        quarantine(p, a,
                   "its container was allocated but the annotation has no runtime identity "
                   "(migUUID, gpuInstanceID, computeInstanceID)");
      }
    }
  }
  bool changed = false;
  std::set<std::string> referenced;  // GPUs non-terminated pods name
  bool all_busy = false;
  for (const auto& p : pods) {
    if (p.terminated) continue;
    if (p.gpus_unknown) all_busy = true;
    for (const auto& g : p.referenced_gpus) referenced.insert(g);
  }
  int untracked = 0;
  for (const auto& gpu : inventory_.gpus) {
    if (!gpu.exposed || !gpu.info.mig.current) continue;
    auto gis = nvml_.ListGpuInstances(gpu.info.index);
    if (!gis.ok()) {
      spdlog::warn("cannot list the GIs of GPU {}: {}", gpu.info.uuid,
                   std::string(gis.status().message()));
      continue;
    }
    // Managed instances NVML no longer shows (GPU reset, destroyed behind our back) are forgotten.
    const size_t before = state_.instances.size();
    std::erase_if(state_.instances, [&](const ManagedInstance& m) {
      if (m.gpu_uuid != gpu.info.uuid) return false;
      for (const auto& gi : *gis) {
        if (gi.id == m.gpu_instance_id && gi.placement == m.placement) return false;
      }
      spdlog::warn("managed MIG device {} (GI {} on GPU {}, pod {}) no longer exists: forgotten",
                   m.mig_uuid, m.gpu_instance_id, m.gpu_uuid, m.owner.PodKey());
      return true;
    });
    changed = changed || state_.instances.size() != before;
    std::vector<nvml::GpuInstanceInfo> unowned;
    for (const auto& gi : *gis) {
      if (const ManagedInstance* m = FindManagedGi(gpu.info.uuid, gi.id);
          m != nullptr && m->placement == gi.placement) {
        continue;
      }
      bool intended = false;
      for (const auto& i : state_.intents) {
        intended = intended || (i.gpu_uuid == gpu.info.uuid && i.placement == gi.placement);
      }
      if (intended) continue;  // an open intent owns it until resolved
      auto c = candidates.find({gpu.info.uuid, gi.placement.start});
      if (c != candidates.end() && c->second.allocation.placement == gi.placement) {
        const PodMig& p = *c->second.pod;
        const protocol::MigAllocation& a = c->second.allocation;
        auto verified = Verify(gpu, gi, a);
        if (verified.ok()) {
          ManagedInstance m;
          m.gpu_uuid = gpu.info.uuid;
          m.profile = a.profile;
          m.profile_id = gi.profile_id;
          m.placement = gi.placement;
          m.gpu_instance_id = gi.id;
          m.compute_instance_id = a.runtime->compute_instance_id;
          m.mig_uuid = a.runtime->mig_uuid;
          m.owner = {p.uid, p.ns, p.name, a.container_index, a.device_index};
          m.origin = "adopted";
          m.since = NowUnix();
          Manage(m);
          changed = true;
          ++report.adopted;
          metrics_.InstanceAdopted("annotation");
          Event(&p, "Normal", kReasonAdopted,
                fmt::format("adopted MIG device {} ({} at {} of GPU {}, GI {}, CI {}) for "
                            "container {} device {}: verified against NVML",
                            m.mig_uuid, m.profile, PlacementText(m.placement), m.gpu_uuid,
                            m.gpu_instance_id, m.compute_instance_id, a.container_index,
                            a.device_index));
          if (cdi_.enabled() && minors_.has_value()) {
            if (auto nodes =
                    minors_->DeviceNodes(gpu.info.minor, gi.id, a.runtime->compute_instance_id);
                nodes.ok()) {
              (void)cdi_.Write(m.mig_uuid, nodes->All());
            }
          }
          candidates.erase(c);
          continue;
        }
        if (!p.terminated) quarantine(p, a, std::string(verified.message()));
      }
      unowned.push_back(gi);
    }
    if (unowned.empty()) continue;
    // Untracked instances: cleaned only when the whole GPU is idle, otherwise kept and reported.
    std::string why;
    bool idle = destructive && !all_busy && !referenced.count(gpu.info.uuid);
    if (idle) {
      for (const auto& m : state_.instances) idle = idle && m.gpu_uuid != gpu.info.uuid;
      for (const auto& i : state_.intents) idle = idle && i.gpu_uuid != gpu.info.uuid;
      for (const auto& q : quarantine_) idle = idle && q.gpu_uuid != gpu.info.uuid;
    }
    if (idle && GpuHasProcesses(gpu, &why)) idle = false;
    for (const auto& gi : unowned) {
      const mig::ProfileSpec* profile = gpu.FindById(gi.profile_id);
      const std::string name =
          profile != nullptr ? profile->name : fmt::format("profile id {}", gi.profile_id);
      if (idle) {
        auto st = DestroyGi(gpu, gi.id);
        if (st.ok()) {
          ++report.destroyed;
          metrics_.InstanceDestroyed("idle_cleanup");
          Event(nullptr, "Normal", kReasonGpuCleaned,
                fmt::format("destroyed untracked GI {} ({} at {}) on idle GPU {}: no pod "
                            "references the GPU and no process runs on it",
                            gi.id, name, PlacementText(gi.placement), gpu.info.uuid));
          continue;
        }
        metrics_.DestroyFailed();
        spdlog::warn("cannot clean untracked GI {} on GPU {}: {}", gi.id, gpu.info.uuid,
                     std::string(st.message()));
      }
      ++untracked;
      untracked_held_.push_back(
          {gpu.info.uuid, gi.placement, profile != nullptr ? profile->name : "",
           fmt::format("untracked GI {} ({}): no pod annotation describes it; kept while the GPU "
                       "is busy{}",
                       gi.id, name, why.empty() ? "" : " (" + why + ")")});
      if (FirstReport(
              fmt::format("untracked/{}/{}/{}", gpu.info.uuid, gi.id, gi.placement.start))) {
        Event(nullptr, "Warning", kReasonUntracked,
              fmt::format("GI {} ({} at {}) on GPU {} is not managed by dynmig and no pod "
                          "annotation describes it; kept (the GPU is busy{}), its slices stay "
                          "unusable until the GPU is idle",
                          gi.id, name, PlacementText(gi.placement), gpu.info.uuid,
                          why.empty() ? "" : ": " + why));
      }
    }
  }
  // Complete annotations whose instance is gone (GPU reset, someone destroyed it).
  for (const auto& [key, c] : candidates) {
    if (c.pod->terminated) continue;
    const GpuEntry* gpu = inventory_.FindByUuid(c.allocation.gpu_uuid);
    if (gpu == nullptr || !gpu->info.mig.current) continue;
    bool live = false;
    for (const auto& q : quarantine_) {
      live = live || (q.gpu_uuid == c.allocation.gpu_uuid &&
                      q.placement == c.allocation.placement && q.pod == c.pod->key);
    }
    if (live) continue;
    if (FirstReport(fmt::format("gone/{}/{}/{}", c.pod->uid, c.allocation.container_index,
                                c.allocation.device_index))) {
      metrics_.AdoptionFailed();
      Event(c.pod, "Warning", kReasonAdoptionFailed,
            fmt::format("container {} device {}: MIG device {} ({} at {} of GPU {}) no longer "
                        "exists",
                        c.allocation.container_index, c.allocation.device_index,
                        c.allocation.runtime->mig_uuid, c.allocation.profile,
                        PlacementText(c.allocation.placement), c.allocation.gpu_uuid));
    }
  }
  report.untracked = untracked;
  metrics_.SetUntracked(untracked);
  metrics_.SetUnverified(report.unverified);
  if (changed) {
    if (auto st = Persist(); !st.ok())
      spdlog::error("cannot save state: {}", std::string(st.message()));
  }
}

// ---------------------------------------------------------------------------------------------
// Observers

std::vector<ManagedInstance> PluginCore::Managed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.instances;
}

std::vector<Intent> PluginCore::OpenIntents() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.intents;
}

std::vector<QuarantinedSlices> PluginCore::Quarantined() const {
  std::lock_guard<std::mutex> lock(mu_);
  return quarantine_;
}

std::vector<protocol::HeldSlices> PluginCore::Held() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<protocol::HeldSlices> held = ended_held_;
  held.insert(held.end(), untracked_held_.begin(), untracked_held_.end());
  return held;
}

bool PluginCore::recovery_pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return recovery_pending_;
}

Inventory PluginCore::inventory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inventory_;
}

nlohmann::json PluginCore::NvmlView() {
  using Json = nlohmann::json;
  std::lock_guard<std::mutex> lock(mu_);
  auto placement = [](const mig::Placement& p) {
    return Json{{"start", p.start}, {"size", p.size}};
  };
  auto owner = [](const InstanceOwner& o) {
    return Json{{"podUID", o.pod_uid},
                {"namespace", o.ns},
                {"name", o.name},
                {"containerIndex", o.container_index},
                {"deviceIndex", o.device_index}};
  };
  Json gpus = Json::array();
  for (const auto& g : inventory_.gpus) {
    Json profiles = Json::array();
    for (const auto& p : g.capability.profiles) {
      Json pl = Json::array();
      for (const auto& x : p.placements) pl.push_back(placement(x));
      profiles.push_back({{"name", p.name},
                          {"id", p.nvml_id},
                          {"index", p.nvml_index},
                          {"memoryMiB", p.memory_mib},
                          {"sliceCount", p.compute_slices},
                          {"instanceCount", p.instance_count},
                          {"placements", pl},
                          {"allowed", g.FindAllowed(p.name) != nullptr}});
    }
    Json instances = Json::array();
    std::string instances_error;
    if (g.info.mig.current) {
      auto gis = nvml_.ListGpuInstances(g.info.index);
      if (gis.ok()) {
        for (const auto& gi : *gis) {
          Json cis = Json::array();
          if (auto list = nvml_.ListComputeInstances(g.info.index, gi.id); list.ok()) {
            for (const auto& ci : *list) cis.push_back({{"id", ci.id}, {"migUUID", ci.mig_uuid}});
          }
          const mig::ProfileSpec* p = g.FindById(gi.profile_id);
          Json item = {{"gpuInstanceID", gi.id},
                       {"profileId", gi.profile_id},
                       {"profile", p != nullptr ? p->name : ""},
                       {"placement", placement(gi.placement)},
                       {"computeInstances", cis},
                       {"managed", false}};
          if (const ManagedInstance* m = FindManagedGi(g.info.uuid, gi.id)) {
            item["managed"] = true;
            item["origin"] = m->origin;
            item["owner"] = owner(m->owner);
          }
          instances.push_back(std::move(item));
        }
      } else {
        instances_error = std::string(gis.status().message());
      }
    }
    Json allowed = Json::array();
    for (const auto& p : g.allowed) allowed.push_back(p.name);
    Json gpu = {{"index", g.info.index},
                {"uuid", g.info.uuid},
                {"name", g.info.name},
                {"pciBusId", g.info.pci_bus_id},
                {"minor", g.info.minor},
                {"memoryMiB", g.info.total_memory_mib},
                {"migMode",
                 {{"supported", g.info.mig.supported},
                  {"current", g.info.mig.current},
                  {"pending", g.info.mig.pending}}},
                {"exposed", g.exposed},
                {"healthy", g.healthy},
                {"replicas", g.replicas},
                {"allowedProfiles", allowed},
                {"missingProfiles", g.missing_profiles},
                {"profiles", profiles},
                {"instances", instances}};
    if (!g.not_exposed_reason.empty()) gpu["notExposedReason"] = g.not_exposed_reason;
    if (!g.unhealthy_reason.empty()) gpu["unhealthyReason"] = g.unhealthy_reason;
    if (!instances_error.empty()) gpu["instancesError"] = instances_error;
    gpus.push_back(std::move(gpu));
  }
  Json intents = Json::array();
  for (const auto& i : state_.intents) {
    intents.push_back({{"id", i.id},
                       {"gpuUUID", i.gpu_uuid},
                       {"profile", i.profile},
                       {"placement", placement(i.placement)},
                       {"owner", owner(i.owner)}});
  }
  Json quarantined = Json::array();
  for (const auto& q : quarantine_) {
    quarantined.push_back({{"gpuUUID", q.gpu_uuid},
                           {"placement", placement(q.placement)},
                           {"pod", q.pod},
                           {"reason", q.reason}});
  }
  return Json{{"node", options_.node_name},
              {"nvml", nvml_.Description()},
              {"recoveryPending", recovery_pending_},
              {"gpus", gpus},
              {"intents", intents},
              {"quarantined", quarantined}};
}

}  // namespace dynmig::deviceplugin
