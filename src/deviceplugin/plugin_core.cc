// PluginCore, the facade (plugin_core.h): creation, start, the entries that take the node
// state's lock and delegate to the Reclaimer (reclaimer.h) and the Allocator (allocator.h), and
// the observers.
#include "deviceplugin/plugin_core.h"

#include <string_view>
#include <utility>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "kube/object.h"
#include "protocol/annotations.h"
#include "protocol/devices.h"
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
      // ListAndWatch's waits are the transport's: the kubelet at the other end runs on real time
      // whatever clock the core runs on (a simulated one would hold its streams forever).
      devices_(RealClock()),
      publisher_(options_.node_name, kube, metrics, *options_.clock),
      ops_(options_, nvml, kube, metrics, events, pod_resources, ns_, ledger_, publisher_),
      reclaimer_(ops_),
      allocator_(ops_),
      switcher_(ops_) {}

absl::Status PluginCore::Start() {
  NodeLock lock(this);
  if (started_) return absl::FailedPreconditionError("device plugin core already started");
  started_ = true;
  DYNMIG_RETURN_IF_ERROR(LoadStateAndInventory());
  if (switcher_.configured()) {
    // Open switch intents are resumed or rolled back from what NVML shows (mode_switch.h).
    switcher_.Recover();
    RefreshHealth(ops_.nvml, ns_.inventory);
    switcher_.ApplyHealth();
  }
  UpdateDevices();
  DYNMIG_RETURN_IF_ERROR(ops_.Persist());
  auto pods = ops_.ListPods();
  if (!pods.ok()) {
    ns_.recovery_pending = true;
    spdlog::warn(
        "startup: cannot list pods ({}): recovery deferred, nothing is cleaned or destroyed "
        "until the API answers",
        std::string(pods.status().message()));
    ops_.UpdateGauges();
    return absl::OkStatus();
  }
  reclaimer_.Recover(*pods);
  ops_.UpdateGauges();
  return absl::OkStatus();
}

absl::Status PluginCore::LoadStateAndInventory() {
  auto loaded = ops_.store.Load();
  if (loaded.ok()) {
    ns_.state = std::move(*loaded);
    ledger_.Load(ns_.state.ledger);
  } else if (loaded.status().code() == absl::StatusCode::kDataLoss) {
    auto moved = ops_.store.MoveAside(ops_.NowUnix());
    const std::string message = fmt::format(
        "{}; moved to {}: instances are recovered from NVML and pod annotations instead (an "
        "instance no annotation describes is kept on busy GPUs)",
        std::string(loaded.status().message()), moved.ok() ? *moved : std::string("<not moved>"));
    ops_.Event(nullptr, "Warning", kReasonReconcileSkipped, message);
  } else {
    return loaded.status();
  }
  whole_policy_.switching = options_.mig_mode_switching;
  if (whole_policy_.switching.enabled) {
    // The rules' nodeSelector matches the node's labels; unreadable: no label matches.
    if (auto node = ops_.kube.GetNode(options_.node_name); node.ok()) {
      for (auto& [key, value] : kube::Labels(*node)) whole_policy_.node_labels.emplace(key, value);
    } else {
      spdlog::warn(
          "cannot read the labels of node {} ({}): no migModeSwitching rule with a "
          "nodeSelector matches it",
          options_.node_name, std::string(node.status().message()));
    }
  }
  DYNMIG_ASSIGN_OR_RETURN(ns_.inventory,
                          DiscoverInventory(ops_.nvml, options_.allowlist, whole_policy_));
  if (!ops_.nvml.HasDeviceNodes()) {
    spdlog::info("{}: no device nodes on this host; containers get {} only",
                 ops_.nvml.Description(), protocol::kVisibleDevicesEnv);
  } else if (auto minors = ops_.nvml.GetMigMinors(); minors.ok()) {
    ns_.minors = std::move(*minors);
  } else {
    ns_.minors_error = std::string(minors.status().message());
    spdlog::warn("MIG capability minors unavailable ({}): Allocate will fail until they are",
                 ns_.minors_error);
  }
  for (const auto& gpu : ns_.inventory.gpus) {
    if (gpu.exposed && !gpu.healthy) {
      ops_.Event(nullptr, "Warning", kReasonGpuNotReady,
                 fmt::format("GPU {} ({}) is not usable: {}", gpu.info.index, gpu.info.uuid,
                             gpu.unhealthy_reason));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> PluginCore::Allocate(
    const std::vector<std::string>& device_ids) {
  const absl::Duration start = options_.clock->Monotonic();
  std::string result = "failed";
  absl::StatusOr<v1beta1::ContainerAllocateResponse> out;
  PrefetchEvidence();
  {
    NodeLock lock(this);
    out = AllocateLocked(device_ids, &result);
    ops_.UpdateGauges();
    RefreshViewLocked();
  }
  const double seconds = absl::ToDoubleSeconds(options_.clock->Monotonic() - start);
  ops_.metrics.AllocateDone(out.ok() ? "success" : result, seconds);
  if (!out.ok())
    spdlog::warn("Allocate {}: {}", fmt::join(device_ids, ","),
                 std::string(out.status().message()));
  return out;
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> PluginCore::AllocateLocked(
    const std::vector<std::string>& device_ids, std::string* result) {
  DYNMIG_RETURN_IF_ERROR(allocator_.CheckDeviceIds(device_ids));
  DYNMIG_ASSIGN_OR_RETURN(std::vector<PodMig> pods, ops_.ListPods());
  if (ns_.recovery_pending) reclaimer_.Recover(pods);
  // Free what finished pods hold first, so their placements can be reused at once.
  reclaimer_.Reconcile(pods);
  return allocator_.Allocate(device_ids, pods, result);
}

void PluginCore::PrefetchEvidence() {
  {
    NodeLock lock(this);
    if (!reclaimer_.WantsEvidence()) return;
  }
  const absl::Duration read_at = options_.clock->Monotonic();
  HandoverEvidence evidence = reclaimer_.ReadEvidenceSources();
  NodeLock lock(this);
  reclaimer_.OfferEvidence(std::move(evidence), read_at);
}

ReconcileReport PluginCore::Reconcile() {
  const absl::Duration start = options_.clock->Monotonic();
  PrefetchEvidence();
  NodeLock lock(this);
  ReconcileReport report = reclaimer_.Reconcile();
  const std::string_view outcome = !report.listed           ? "skipped_list"
                                   : report.skipped.empty() ? "ok"
                                                            : "skipped_decode";
  ops_.metrics.ReconcileDone(outcome, absl::ToDoubleSeconds(options_.clock->Monotonic() - start));
  return report;
}

v1beta1::ContainerPreferredAllocationResponse PluginCore::PreferredAllocation(
    const v1beta1::ContainerPreferredAllocationRequest& request) {
  std::vector<std::string> reserved_gpus;
  {
    NodeLock lock(this);
    reserved_gpus = allocator_.ReservedGpus();
  }
  return Allocator::Prefer(request, reserved_gpus);
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

std::vector<protocol::IdleInstance> PluginCore::Idle() const {
  dynmig::MutexLock lock(&ns_.mu);
  return ns_.Idle();
}

bool PluginCore::IdleChanged() const {
  std::vector<protocol::IdleInstance> idle;
  {
    dynmig::MutexLock lock(&ns_.mu);
    idle = ns_.Idle();
  }
  return publisher_.IdleChanged(idle);
}

bool PluginCore::HeldChanged() const {
  std::vector<protocol::HeldSlices> held;
  {
    dynmig::MutexLock lock(&ns_.mu);
    held = ns_.Held();
  }
  return publisher_.HeldChanged(held);
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
