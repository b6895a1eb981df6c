// The Allocator (allocator.h): which pod a kubelet Allocate is for (identify), its reservations
// validated into a plan (allocate_plan.h), confirmed against NVML, the intents recorded, GI + CI
// created at exactly the reserved placements (rolled back on failure), the runtime identity
// written back, the ledger entry recorded and the kubelet answered (publish). See plugin_core.h
// and docs/device-plugin.md (Allocate).
#include "deviceplugin/allocator.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "common/status_macros.h"
#include "deviceplugin/identity.h"
#include "deviceplugin/plugin_internal.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "protocol/annotations.h"
#include "protocol/devices.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {
namespace {

// The name of container `index` (init containers first, then app containers), and whether it is
// an init container; "" when the spec has no such container.
std::pair<std::string, bool> ContainerName(const kube::Object& pod, int index) {
  auto spec = pod.find("spec");
  if (spec == pod.end() || !spec->is_object()) return {"", false};
  for (const char* list : {"initContainers", "containers"}) {
    auto l = spec->find(list);
    if (l == spec->end() || !l->is_array()) continue;
    if (index < static_cast<int>(l->size())) {
      const auto& c = (*l)[index];
      const bool init = std::string_view(list) == "initContainers";
      if (!c.is_object() || !c.contains("name") || !c["name"].is_string()) return {"", init};
      return {c["name"].get<std::string>(), init};
    }
    index -= static_cast<int>(l->size());
  }
  return {"", false};
}

}  // namespace

// A GI this Allocate call created (rolled back on failure).
struct Allocator::Created {
  const GpuEntry* gpu = nullptr;
  uint32_t gi = 0;
  std::string mig_uuid;
};

bool Allocator::Crash(std::string_view point) const {
  if (ops_.options.crash_point && ops_.options.crash_point(point)) {
    spdlog::error("simulated crash at {}", point);
    return true;
  }
  return false;
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> Allocator::Allocate(
    const std::vector<std::string>& device_ids, const std::vector<PodMig>& pods,
    std::string* result) {
  DYNMIG_ASSIGN_OR_RETURN(const PodMig pod, IdentifyPod(pods, device_ids.size(), result));
  if (pod.whole_gpu) return AllocateWhole(device_ids, pod, pods, result);
  PlanResult validated = ValidateAllocation(pod, pod.NextContainer(), device_ids.size(), View());
  if (!validated.ok()) return Refuse(pod, validated.reason, validated.status, result);
  AllocationPlan plan = std::move(validated.plan);
  DYNMIG_RETURN_IF_ERROR(ConfirmAgainstNvml(pod, plan, result));
  DYNMIG_RETURN_IF_ERROR(RecordIntents(pod, plan));
  if (Crash(kCrashAfterIntent)) return absl::AbortedError("simulated crash after the intent");
  std::vector<Created> created;
  DYNMIG_ASSIGN_OR_RETURN(const std::vector<ManagedInstance> instances,
                          CreateInstances(pod, plan, created));
  return Publish(device_ids, pod, plan, instances, created, result);
}

absl::Status Allocator::CheckDeviceIds(const std::vector<std::string>& device_ids) const {
  if (device_ids.empty()) {
    return absl::InvalidArgumentError("Allocate called without device ids");
  }
  for (const auto& id : device_ids) {
    const std::string gpu = GpuOfReplicaId(id);
    const GpuEntry* entry = gpu.empty() ? nullptr : ops_.ns.inventory.FindByUuid(gpu);
    if (entry == nullptr || entry->DeviceCount() == 0) {
      return absl::InvalidArgumentError(
          fmt::format("device id \"{}\" is not one this plugin advertises", id));
    }
  }
  return absl::OkStatus();
}

std::optional<protocol::NodeLock> Allocator::ReadNodeLock() {
  state_.node.reset();
  auto node = ops_.kube.GetNode(ops_.options.node_name);
  if (!node.ok()) return std::nullopt;
  std::optional<protocol::NodeLock> lock = NodeLockOf(*node);
  state_.node = std::move(*node);
  return lock;
}

absl::StatusOr<PodMig> Allocator::IdentifyPod(const std::vector<PodMig>& pods, size_t device_count,
                                              std::string* result) {
  state_.lock_released = false;
  const std::optional<protocol::NodeLock> lock = ReadNodeLock();
  const PendingPod pending = FindPendingPod(pods, ops_.options.node_name, lock, InProgress());
  for (const auto& m : pending.mismatches) {
    if (ops_.FirstReport(fmt::format("mismatch/{}/{}", m.pod->uid, m.why))) {
      ops_.Event(
          m.pod, "Warning", kReasonBindMismatch,
          fmt::format("pod {} says {}={} on node {}, but {}: it is not taken as the pod of a "
                      "kubelet Allocate",
                      m.pod->key, protocol::kBindPhaseAnnotation, m.pod->bind_phase,
                      ops_.options.node_name, m.why));
    }
  }
  if (pending.pod == nullptr) {
    *result = "refused";
    ops_.metrics.Refused("no_pending_pod");
    std::string why = fmt::format(
        "no pod on node {} is confirmed waiting for {} device(s): a pending pod needs the node "
        "lock ({}), {}=allocating, {}={}, a reservation ({}) and devices left in {}",
        ops_.options.node_name, device_count, protocol::kNodeLockAnnotation,
        protocol::kBindPhaseAnnotation, protocol::kVgpuNodeAnnotation, ops_.options.node_name,
        protocol::kMigAllocationsAnnotation, protocol::kDevicesToAllocateAnnotation);
    for (const auto& m : pending.mismatches) why += fmt::format("; {}: {}", m.pod->key, m.why);
    return absl::FailedPreconditionError(why);
  }
  if (auto known = KubeletKnows(*pending.pod); !known.ok()) {
    // Not the owner's Allocate: refused without touching the owner (its bind and lock stay).
    *result = "refused";
    ops_.metrics.Refused("owner_unknown_to_kubelet");
    ops_.Event(pending.pod, "Warning", kReasonIdentityMismatch, std::string(known.message()));
    return known;
  }
  const PodMig& pod = *pending.pod;
  // The pod is identified: the node lock has done its job. Release it now, before any NVML work,
  // so that the next bind to this node need not wait for this one's instances. The pod's later
  // containers are found as the allocation in progress.
  state_.in_progress = AllocatorState::InProgressPod{pod.uid, ops_.Now()};
  if (lock.has_value() && lock->OwnedBy(pod.ns, pod.name, pod.uid)) {
    ReleaseNodeLock(pod, state_.node);
  } else {
    state_.lock_released = true;  // not this pod's (released by its first container's Allocate)
  }
  return pod;
}

NodeView Allocator::View() const {
  return NodeView{ops_.options.node_name, ops_.ns.inventory, ops_.ns.state.instances,
                  ops_.ns.quarantine};
}

absl::Status Allocator::ConfirmAgainstNvml(const PodMig& pod, AllocationPlan& plan,
                                           std::string* result) {
  for (auto& d : plan.devices) {
    const protocol::MigAllocation& a = d.allocation;
    const std::string what =
        fmt::format("pod {} container {} device {} ({} at {} of GPU {})", pod.key, plan.container,
                    a.device_index, a.profile, PlacementText(a.placement), a.gpu_uuid);
    DYNMIG_RETURN_IF_ERROR(ConfirmDevice(pod, plan.container, what, d, result));
  }
  return absl::OkStatus();
}

absl::Status Allocator::ConfirmDevice(const PodMig& pod, int container, const std::string& what,
                                      PlannedDevice& d, std::string* result) {
  const protocol::MigAllocation& a = d.allocation;
  auto gis = ops_.nvml.ListGpuInstances(d.gpu->info.index);
  if (!gis.ok()) {
    ops_.Event(&pod, "Warning", kReasonFailed, std::string(gis.status().message()));
    FailPod(pod);
    return Annotate(gis.status(), what);
  }
  const nvml::GpuInstanceInfo* live = nullptr;  // the reused instance's GI
  for (const auto& gi : *gis) {
    if (!gi.placement.Overlaps(a.placement)) continue;
    if (d.reuse.has_value() && gi.id == d.reuse->gpu_instance_id && gi.placement == a.placement) {
      live = &gi;
      continue;
    }
    const mig::ProfileSpec* p = d.gpu->FindById(gi.profile_id);
    return Refuse(pod, "placement_busy",
                  absl::FailedPreconditionError(fmt::format(
                      "{}: overlaps GI {} ({} at {}) that dynmig does not manage", what, gi.id,
                      p != nullptr ? p->name : fmt::format("profile id {}", gi.profile_id),
                      PlacementText(gi.placement))),
                  result);
  }
  if (d.reuse.has_value() && live == nullptr) {
    ops_.ns.RemoveManaged(a.gpu_uuid, d.reuse->gpu_instance_id);  // vanished: create it again
    d.reuse.reset();
    d.from_idle = false;
  }
  if (!d.from_idle) return absl::OkStatus();
  return TakeOverIdle(pod, container, what, *live, d, result);
}

absl::Status Allocator::TakeOverIdle(const PodMig& pod, int container, const std::string& what,
                                     const nvml::GpuInstanceInfo& live, PlannedDevice& d,
                                     std::string* result) {
  // Verified against NVML before it is given to the pod; one that does not verify is destroyed
  // (when nothing runs on it) and the pod gets a new instance.
  auto verified = ops_.VerifyIdle(*d.gpu, *d.reuse, live);
  if (verified.ok()) {
    d.reuse->idle = false;
    d.reuse->idle_since = 0;
    d.reuse->owner = {pod.uid, pod.ns, pod.name, container, d.allocation.device_index};
    d.reuse->origin = "reused";
    d.reuse->since = ops_.NowUnix();
    return absl::OkStatus();
  }
  std::string busy;
  if (ops_.GiBusy(*d.gpu, d.reuse->gpu_instance_id, &busy)) {
    return Refuse(
        pod, "placement_busy",
        absl::FailedPreconditionError(fmt::format("{}: the idle MIG device {} there is in use ({})",
                                                  what, d.reuse->mig_uuid, busy)),
        result);
  }
  if (auto st = ops_.DestroyGi(*d.gpu, d.reuse->gpu_instance_id); !st.ok()) {
    ops_.metrics.DestroyFailed();
    ops_.Event(&pod, "Warning", kReasonFailed, std::string(st.message()));
    FailPod(pod);
    return Annotate(st, what);
  }
  spdlog::warn("{}: idle MIG device {} does not verify ({}): destroyed, creating anew", what,
               d.reuse->mig_uuid, std::string(verified.message()));
  ops_.metrics.InstanceDestroyed("idle_invalid");
  ops_.ns.RemoveManaged(d.allocation.gpu_uuid, d.reuse->gpu_instance_id);
  ops_.PersistOrLog("state");
  d.reuse.reset();
  d.from_idle = false;
  return absl::OkStatus();
}

absl::Status Allocator::RecordIntents(const PodMig& pod, AllocationPlan& plan) {
  for (auto& d : plan.devices) {
    if (d.reuse.has_value()) continue;
    Intent intent;
    intent.id = ops_.ns.state.next_intent_id++;
    intent.owner = {pod.uid, pod.ns, pod.name, plan.container, d.allocation.device_index};
    intent.gpu_uuid = d.allocation.gpu_uuid;
    intent.profile = d.allocation.profile;
    intent.placement = d.allocation.placement;
    intent.created = ops_.NowUnix();
    d.intent = intent.id;
    plan.intents.push_back(intent.id);
    ops_.ns.state.intents.push_back(std::move(intent));
  }
  if (plan.intents.empty()) return absl::OkStatus();
  auto st = ops_.Persist();
  if (st.ok()) return absl::OkStatus();
  std::erase_if(ops_.ns.state.intents, [&](const Intent& i) {
    return std::find(plan.intents.begin(), plan.intents.end(), i.id) != plan.intents.end();
  });
  ops_.Event(&pod, "Warning", kReasonFailed, std::string(st.message()));
  FailPod(pod);
  return Annotate(st, "record the allocation intent");
}

absl::Status Allocator::Abort(const PodMig& pod, const AllocationPlan& plan,
                              std::vector<Created>& created, const absl::Status& st,
                              std::string_view step) {
  const absl::Status annotated =
      Annotate(st, fmt::format("pod {} container {}: {}", pod.key, plan.container, step));
  Rollback(created, plan.intents);
  ops_.Event(&pod, "Warning", kReasonFailed, std::string(annotated.message()));
  FailPod(pod);
  return annotated;
}

absl::StatusOr<std::vector<ManagedInstance>> Allocator::CreateInstances(
    const PodMig& pod, const AllocationPlan& plan, std::vector<Created>& created) {
  std::vector<ManagedInstance> instances;
  for (const auto& d : plan.devices) {
    const protocol::MigAllocation& a = d.allocation;
    if (d.reuse.has_value()) {
      instances.push_back(*d.reuse);
      continue;
    }
    const std::string what =
        fmt::format("{} at {} of GPU {}", a.profile, PlacementText(a.placement), a.gpu_uuid);
    auto gi = ops_.nvml.CreateGpuInstance(d.gpu->info.index, d.profile->nvml_id, a.placement);
    if (!gi.ok()) return Abort(pod, plan, created, gi.status(), "create GI " + what);
    created.push_back({d.gpu, gi->id, ""});
    if (Crash(kCrashAfterGpuInstance)) return absl::AbortedError("simulated crash after the GI");
    auto ci = ops_.nvml.CreateComputeInstance(d.gpu->info.index, gi->id);
    if (!ci.ok()) {
      return Abort(pod, plan, created, ci.status(),
                   fmt::format("create the CI of GI {} ({})", gi->id, what));
    }
    if (Crash(kCrashAfterComputeInstance)) {
      return absl::AbortedError("simulated crash after the CI");
    }
    auto uuid = ops_.nvml.GetMigDeviceUuid(d.gpu->info.index, gi->id, ci->id);
    if (!uuid.ok()) {
      return Abort(pod, plan, created, uuid.status(),
                   fmt::format("read the MIG UUID of GI {} CI {}", gi->id, ci->id));
    }
    created.back().mig_uuid = *uuid;
    if (auto listed = WaitListed(*d.gpu, gi->id, ci->id, *uuid); !listed.ok()) {
      return Abort(pod, plan, created, listed, "wait for NVML to list " + what);
    }
    instances.push_back(ops_.NewInstance(
        {pod.uid, pod.ns, pod.name, plan.container, a.device_index}, a.gpu_uuid, a.profile,
        d.profile->nvml_id, a.placement, gi->id, ci->id, *uuid, "created"));
  }
  return instances;
}

absl::Status Allocator::WaitListed(const GpuEntry& gpu, uint32_t gi, uint32_t ci,
                                   const std::string& mig_uuid) {
  const absl::Duration deadline = ops_.Monotonic() + ops_.options.ready_timeout;
  for (int polls = 1;; ++polls) {
    std::string missing;
    auto gis = ops_.nvml.ListGpuInstances(gpu.info.index);
    if (!gis.ok()) {
      missing = fmt::format("listing GIs: {}", std::string(gis.status().message()));
    } else if (std::none_of(gis->begin(), gis->end(),
                            [&](const nvml::GpuInstanceInfo& g) { return g.id == gi; })) {
      missing = fmt::format("GI {} is not listed", gi);
    } else {
      auto cis = ops_.nvml.ListComputeInstances(gpu.info.index, gi);
      if (!cis.ok()) {
        missing = fmt::format("listing its CIs: {}", std::string(cis.status().message()));
      } else if (std::none_of(cis->begin(), cis->end(), [&](const nvml::ComputeInstanceInfo& c) {
                   return c.id == ci && c.mig_uuid == mig_uuid;
                 })) {
        missing = fmt::format("CI {} with {} is not listed", ci, mig_uuid);
      }
    }
    if (missing.empty()) {
      if (polls > 1) {
        spdlog::info("MIG device {} listed by NVML after {} polls", mig_uuid, polls);
      }
      return absl::OkStatus();
    }
    if (ops_.Monotonic() >= deadline) {
      return absl::DeadlineExceededError(fmt::format(
          "NVML does not list the new MIG device {} (GI {}, CI {} on GPU {}) {} after creating it: "
          "{}",
          mig_uuid, gi, ci, gpu.info.uuid, absl::FormatDuration(ops_.options.ready_timeout),
          missing));
    }
    ops_.options.clock->SleepFor(ops_.options.ready_poll);
  }
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> Allocator::Publish(
    const std::vector<std::string>& device_ids, const PodMig& pod, const AllocationPlan& plan,
    const std::vector<ManagedInstance>& instances, std::vector<Created>& created,
    std::string* result) {
  auto answer = Answer(instances);
  if (!answer.ok()) {
    return Abort(pod, plan, created, answer.status(), "prepare the container's devices");
  }
  // The runtime identity, under the pod's resourceVersion.
  std::map<int, protocol::RuntimeIdentity> identities;
  for (size_t k = 0; k < instances.size(); ++k) {  // instances[k] realizes plan.devices[k]
    const auto& m = instances[k];
    identities[plan.devices[k].allocation.device_index] = {m.mig_uuid, m.gpu_instance_id,
                                                           m.compute_instance_id};
  }
  bool done = false;
  auto written =
      ops_.WriteRuntimeIdentity(pod, plan.container, identities, /*consume=*/true, &done);
  if (!written.ok()) {
    if (Crash(kCrashBeforeRollback)) return absl::AbortedError("simulated crash before rollback");
    return Abort(pod, plan, created, written,
                 fmt::format("write {}", protocol::kMigAllocationsAnnotation));
  }
  if (Crash(kCrashAfterAnnotation)) {
    return absl::AbortedError("simulated crash after the annotation");
  }
  Commit(device_ids, pod, plan, instances);
  if (done) state_.in_progress.reset();
  *result = "success";
  return answer;
}

void Allocator::Commit(const std::vector<std::string>& device_ids, const PodMig& pod,
                       const AllocationPlan& plan, const std::vector<ManagedInstance>& instances) {
  // Managed instances, closed intents and the ledger entry in one write.
  for (const auto& m : instances) ops_.ns.Manage(m);
  RecordLedger(device_ids, pod, plan.container, instances);
  std::erase_if(ops_.ns.state.intents, [&](const Intent& i) {
    return std::find(plan.intents.begin(), plan.intents.end(), i.id) != plan.intents.end();
  });
  // On failure the annotation holds the identity: the next start adopts the instances from it.
  ops_.PersistOrLog(fmt::format("allocating pod {}", pod.key));
  for (size_t k = 0; k < instances.size(); ++k) {
    const auto& m = instances[k];
    if (plan.devices[k].from_idle) {
      ops_.metrics.InstanceReused(m.profile);
      ops_.Event(&pod, "Normal", kReasonReused,
                 fmt::format("reused idle MIG device {} ({} at {} of GPU {}, GI {}, CI {}) for "
                             "container {} device {}: verified against NVML, nothing created",
                             m.mig_uuid, m.profile, PlacementText(m.placement), m.gpu_uuid,
                             m.gpu_instance_id, m.compute_instance_id, plan.container,
                             m.owner.device_index));
    }
    if (plan.devices[k].reuse.has_value()) continue;
    ops_.metrics.InstanceCreated(m.profile);
    if (ops_.options.warm.enabled) ops_.metrics.WarmMiss(m.profile);
    ops_.Event(&pod, "Normal", kReasonCreated,
               fmt::format(
                   "created MIG device {} ({} at {} of GPU {}, GI {}, CI {}) for container {} "
                   "device {}",
                   m.mig_uuid, m.profile, PlacementText(m.placement), m.gpu_uuid, m.gpu_instance_id,
                   m.compute_instance_id, plan.container, m.owner.device_index));
  }
}

void Allocator::RecordLedger(const std::vector<std::string>& device_ids, const PodMig& pod,
                             int container, const std::vector<ManagedInstance>& instances,
                             const std::vector<std::string>& whole_gpus) {
  LedgerEntry e;
  e.device_ids = DeviceKey(device_ids);
  e.pod_uid = pod.uid;
  e.ns = pod.ns;
  e.name = pod.name;
  std::tie(e.container, e.init_container) = ContainerName(pod.pod, container);
  e.container_index = container;
  for (const auto& m : instances) e.mig_uuids.push_back(m.mig_uuid);
  e.gpu_uuids = whole_gpus;
  e.since = ops_.NowUnix();
  ops_.ledger.Record(std::move(e));
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> Allocator::Answer(
    const std::vector<ManagedInstance>& instances) {
  v1beta1::ContainerAllocateResponse response;
  std::vector<std::string> uuids;
  std::vector<std::string> paths;
  std::set<std::string> seen;
  for (const auto& m : instances) {
    const GpuEntry* gpu = ops_.ns.inventory.FindByUuid(m.gpu_uuid);
    if (gpu == nullptr) {
      return absl::InternalError(fmt::format("GPU {} vanished from the inventory", m.gpu_uuid));
    }
    auto nodes = ops_.DeviceNodes(*gpu, m.gpu_instance_id, m.compute_instance_id);
    if (!nodes.ok()) {
      return Annotate(nodes.status(), fmt::format("device nodes of {}", m.mig_uuid));
    }
    uuids.push_back(m.mig_uuid);
    if (ops_.cdi.enabled()) {
      if (auto st = ops_.cdi.Write(m.mig_uuid, *nodes); !st.ok()) return st;
      response.add_cdi_devices()->set_name(CdiWriter::QualifiedName(m.mig_uuid));
      continue;
    }
    for (const auto& p : *nodes) {
      if (seen.insert(p).second) paths.push_back(p);
    }
  }
  if (!ops_.cdi.enabled()) SetVisibleDevices(uuids, paths, response);
  return response;
}

void Allocator::SetVisibleDevices(const std::vector<std::string>& uuids,
                                  const std::vector<std::string>& paths,
                                  v1beta1::ContainerAllocateResponse& response) {
  (*response.mutable_envs())[std::string(protocol::kVisibleDevicesEnv)] =
      fmt::format("{}", fmt::join(uuids, ","));
  for (const auto& p : paths) {
    v1beta1::DeviceSpec* spec = response.add_devices();
    spec->set_container_path(p);
    spec->set_host_path(p);
    spec->set_permissions("rw");
  }
}

absl::Status Allocator::Refuse(const PodMig& pod, std::string_view reason, absl::Status status,
                               std::string* result) {
  *result = "refused";
  ops_.metrics.Refused(reason);
  ops_.Event(&pod, "Warning", kReasonRefused, std::string(status.message()));
  FailPod(pod);
  return status;
}

void Allocator::FailPod(const PodMig& pod) {
  kube::KeyPatch patch;
  patch[std::string(protocol::kBindPhaseAnnotation)] = std::string(protocol::kBindPhaseFailed);
  auto st = ops_.kube.PatchPodAnnotations(pod.ns, pod.name, patch);
  if (!st.ok()) {
    spdlog::warn("cannot set {}=failed on pod {}: {}", protocol::kBindPhaseAnnotation, pod.key,
                 std::string(st.status().message()));
  }
  if (state_.in_progress.has_value() && state_.in_progress->uid == pod.uid) {
    state_.in_progress.reset();
  }
  if (!state_.lock_released) ReleaseNodeLock(pod, state_.node);
}

std::string Allocator::InProgress() const {
  if (!state_.in_progress.has_value() ||
      ops_.Now() - state_.in_progress->since > kInProgressWindow) {
    return "";
  }
  return state_.in_progress->uid;
}

void Allocator::ReleaseNodeLock(const PodMig& pod, std::optional<kube::Object> node) {
  for (int attempt = 0; attempt < ops_.options.annotation_attempts; ++attempt) {
    if (!node.has_value()) {
      auto fresh = ops_.kube.GetNode(ops_.options.node_name);
      if (!fresh.ok()) {
        spdlog::warn("cannot read node {} to release its lock: {}", ops_.options.node_name,
                     std::string(fresh.status().message()));
        return;
      }
      node = std::move(*fresh);
    }
    const auto lock = NodeLockOf(*node);
    if (!lock.has_value() || !lock->OwnedBy(pod.ns, pod.name, pod.uid)) {  // not ours
      state_.lock_released = true;
      return;
    }
    kube::KeyPatch patch;
    patch[std::string(protocol::kNodeLockAnnotation)] = std::nullopt;
    auto st =
        ops_.kube.PatchNodeAnnotations(ops_.options.node_name, patch, kube::ResourceVersion(*node));
    if (st.ok()) {
      state_.lock_released = true;
      state_.node = *st;
      return;
    }
    if (st.status().code() != absl::StatusCode::kAborted) {
      spdlog::warn("cannot release the node lock of {}: {}", ops_.options.node_name,
                   std::string(st.status().message()));
      return;
    }
    node.reset();  // changed meanwhile: re-read
  }
}

void Allocator::Rollback(std::vector<Created>& created, const std::vector<uint64_t>& intents) {
  for (auto it = created.rbegin(); it != created.rend(); ++it) {
    auto st = ops_.DestroyGi(*it->gpu, it->gi);
    if (st.ok()) {
      ops_.metrics.InstanceDestroyed("rollback");
      spdlog::info("rollback: destroyed GI {} on GPU {}", it->gi, it->gpu->info.uuid);
      if (ops_.cdi.enabled() && !it->mig_uuid.empty()) (void)ops_.cdi.Remove(it->mig_uuid);
      continue;
    }
    // Keep it tracked: the open intent stays, and the next start or reconcile resolves it.
    ops_.metrics.DestroyFailed();
    spdlog::error("rollback: cannot destroy GI {} on GPU {}: {} (kept tracked)", it->gi,
                  it->gpu->info.uuid, std::string(st.message()));
    continue;
  }
  // Close the intents of instances that are gone; keep those whose instance survived.
  std::set<uint64_t> keep;
  for (const auto& c : created) {
    auto gis = ops_.nvml.ListGpuInstances(c.gpu->info.index);
    if (!gis.ok()) continue;
    for (const auto& gi : *gis) {
      if (gi.id != c.gi) continue;
      for (const auto& intent : ops_.ns.state.intents) {
        if (intent.gpu_uuid == c.gpu->info.uuid && intent.placement == gi.placement) {
          keep.insert(intent.id);
        }
      }
    }
  }
  std::erase_if(ops_.ns.state.intents, [&](const Intent& i) {
    return std::find(intents.begin(), intents.end(), i.id) != intents.end() && !keep.count(i.id);
  });
  if (auto st = ops_.Persist(); !st.ok())
    spdlog::error("rollback: cannot save state: {}", std::string(st.message()));
  created.clear();
}

absl::Status Allocator::KubeletKnows(const PodMig& pod) {
  if (ops_.pod_resources == nullptr) return absl::OkStatus();
  auto listed = ops_.pod_resources->List();
  if (!listed.ok()) {
    spdlog::warn(
        "cannot check that the kubelet knows pod {} before serving it ({}); "
        "PreStartContainer will prove it",
        pod.key, std::string(listed.status().message()));
    return absl::OkStatus();
  }
  for (const auto& p : *listed) {
    if (p.ns == pod.ns && p.name == pod.name) return absl::OkStatus();
  }
  return absl::FailedPreconditionError(fmt::format(
      "this Allocate is not for pod {}, which holds the node lock: the kubelet ({}) does not list "
      "it, and the kubelet always knows the pod it admits; refused, the lock is kept for its "
      "owner (a pod that reached node {} around the scheduler asked for its devices?)",
      pod.key, ops_.pod_resources->Describe(), ops_.options.node_name));
}

std::vector<std::string> Allocator::ReservedGpus() {
  std::vector<std::string> wanted_gpus;
  auto pods = ops_.ListPods();
  if (pods.ok()) {
    std::optional<protocol::NodeLock> node_lock;
    if (auto node = ops_.kube.GetNode(ops_.options.node_name); node.ok()) {
      node_lock = NodeLockOf(*node);
    }
    if (const PodMig* pod =
            FindPendingPod(*pods, ops_.options.node_name, node_lock, InProgress()).pod) {
      for (const auto& d : (*pod->to_allocate)[pod->NextContainer()]) {
        wanted_gpus.push_back(d.uuid);
      }
    }
  }
  return wanted_gpus;
}

v1beta1::ContainerPreferredAllocationResponse Allocator::Prefer(
    const v1beta1::ContainerPreferredAllocationRequest& request,
    const std::vector<std::string>& reserved_gpus) {
  const size_t size = request.allocation_size() > 0 ? request.allocation_size() : 0;
  std::vector<std::string> chosen;
  auto take = [&](const std::string& id) {
    if (chosen.size() < size && std::find(chosen.begin(), chosen.end(), id) == chosen.end()) {
      chosen.push_back(id);
    }
  };
  for (const auto& id : request.must_include_deviceids()) take(id);
  // One replica of each reserved GPU per reserved device (must-include ones count).
  std::map<std::string, int> need;
  for (const auto& g : reserved_gpus) ++need[g];
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

}  // namespace dynmig::deviceplugin
