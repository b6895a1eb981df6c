// Allocate as a pipeline: which pod a kubelet Allocate is for (identify), its reservations
// validated into a plan (allocate_plan.h), confirmed against NVML, the intents recorded, GI + CI
// created at exactly the reserved placements (rolled back on failure), the runtime identity
// written back and the kubelet answered (publish). See plugin_core.h and docs/device-plugin.md
// (Allocate).
#include <algorithm>
#include <map>
#include <set>

#include "common/status_macros.h"
#include "deviceplugin/plugin_core.h"
#include "deviceplugin/plugin_internal.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "protocol/annotations.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {

// A GI this Allocate call created (rolled back on failure).
struct PluginCore::Created {
  const GpuEntry* gpu = nullptr;
  uint32_t gi = 0;
  std::string mig_uuid;
};

absl::StatusOr<v1beta1::ContainerAllocateResponse> PluginCore::Allocate(
    const std::vector<std::string>& device_ids) {
  const absl::Duration start = options_.clock->Monotonic();
  std::string result = "failed";
  absl::StatusOr<v1beta1::ContainerAllocateResponse> out;
  {
    dynmig::MutexLock lock(&ns_.mu);
    out = AllocateLocked(device_ids, &result);
    UpdateGauges();
    RefreshViewLocked();
  }
  const double seconds = absl::ToDoubleSeconds(options_.clock->Monotonic() - start);
  metrics_.AllocateDone(out.ok() ? "success" : result, seconds);
  if (!out.ok())
    spdlog::warn("Allocate {}: {}", fmt::join(device_ids, ","),
                 std::string(out.status().message()));
  return out;
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> PluginCore::AllocateLocked(
    const std::vector<std::string>& device_ids, std::string* result) {
  DYNMIG_RETURN_IF_ERROR(CheckDeviceIds(device_ids));
  DYNMIG_ASSIGN_OR_RETURN(std::vector<PodMig> pods, ListPods());
  if (ns_.recovery_pending) RecoverLocked(pods);
  // Free what finished pods hold first, so their placements can be reused at once.
  ReconcileLocked(pods);

  DYNMIG_ASSIGN_OR_RETURN(const PodMig pod, IdentifyPod(pods, device_ids.size(), result));
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

absl::Status PluginCore::CheckDeviceIds(const std::vector<std::string>& device_ids) const {
  if (device_ids.empty()) {
    return absl::InvalidArgumentError("Allocate called without device ids");
  }
  for (const auto& id : device_ids) {
    const std::string gpu = GpuOfReplicaId(id);
    const GpuEntry* entry = gpu.empty() ? nullptr : ns_.inventory.FindByUuid(gpu);
    if (entry == nullptr || !entry->exposed) {
      return absl::InvalidArgumentError(
          fmt::format("device id \"{}\" is not one this plugin advertises", id));
    }
  }
  return absl::OkStatus();
}

std::optional<protocol::NodeLock> PluginCore::ReadNodeLock() {
  alloc_.node.reset();
  auto node = kube_.GetNode(options_.node_name);
  if (!node.ok()) return std::nullopt;
  std::optional<protocol::NodeLock> lock = NodeLockOf(*node);
  alloc_.node = std::move(*node);
  return lock;
}

absl::StatusOr<PodMig> PluginCore::IdentifyPod(const std::vector<PodMig>& pods, size_t device_count,
                                               std::string* result) {
  alloc_.lock_released = false;
  const std::optional<protocol::NodeLock> lock = ReadNodeLock();
  const PendingPod pending = FindPendingPod(pods, options_.node_name, lock, InProgress());
  for (const auto& m : pending.mismatches) {
    if (FirstReport(fmt::format("mismatch/{}/{}", m.pod->uid, m.why))) {
      Event(m.pod, "Warning", kReasonBindMismatch,
            fmt::format("pod {} says {}={} on node {}, but {}: it is not taken as the pod of a "
                        "kubelet Allocate",
                        m.pod->key, protocol::kBindPhaseAnnotation, m.pod->bind_phase,
                        options_.node_name, m.why));
    }
  }
  if (pending.pod == nullptr) {
    *result = "refused";
    metrics_.Refused("no_pending_pod");
    std::string why = fmt::format(
        "no pod on node {} is confirmed waiting for {} device(s): a pending pod needs the node "
        "lock ({}), {}=allocating, {}={}, a reservation ({}) and devices left in {}",
        options_.node_name, device_count, protocol::kNodeLockAnnotation,
        protocol::kBindPhaseAnnotation, protocol::kVgpuNodeAnnotation, options_.node_name,
        protocol::kMigAllocationsAnnotation, protocol::kDevicesToAllocateAnnotation);
    for (const auto& m : pending.mismatches) why += fmt::format("; {}: {}", m.pod->key, m.why);
    return absl::FailedPreconditionError(why);
  }
  if (auto known = KubeletKnows(*pending.pod); !known.ok()) {
    // Not the owner's Allocate: refused without touching the owner (its bind and lock stay).
    *result = "refused";
    metrics_.Refused("owner_unknown_to_kubelet");
    Event(pending.pod, "Warning", kReasonIdentityMismatch, std::string(known.message()));
    return known;
  }
  const PodMig& pod = *pending.pod;
  // The pod is identified: the node lock has done its job. Release it now, before any NVML work,
  // so that the next bind to this node need not wait for this one's instances. The pod's later
  // containers are found as the allocation in progress.
  alloc_.in_progress = AllocatorState::InProgressPod{pod.uid, Now()};
  if (lock.has_value() && lock->OwnedBy(pod.ns, pod.name, pod.uid)) {
    ReleaseNodeLock(pod, alloc_.node);
  } else {
    alloc_.lock_released = true;  // not this pod's (released by its first container's Allocate)
  }
  return pod;
}

NodeView PluginCore::View() const {
  return NodeView{options_.node_name, ns_.inventory, ns_.state.instances, ns_.quarantine};
}

absl::Status PluginCore::ConfirmAgainstNvml(const PodMig& pod, AllocationPlan& plan,
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

absl::Status PluginCore::ConfirmDevice(const PodMig& pod, int container, const std::string& what,
                                       PlannedDevice& d, std::string* result) {
  const protocol::MigAllocation& a = d.allocation;
  auto gis = nvml_.ListGpuInstances(d.gpu->info.index);
  if (!gis.ok()) {
    Event(&pod, "Warning", kReasonFailed, std::string(gis.status().message()));
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
    ns_.RemoveManaged(a.gpu_uuid, d.reuse->gpu_instance_id);  // vanished: create it again
    d.reuse.reset();
    d.from_idle = false;
  }
  if (!d.from_idle) return absl::OkStatus();
  return TakeOverIdle(pod, container, what, *live, d, result);
}

absl::Status PluginCore::TakeOverIdle(const PodMig& pod, int container, const std::string& what,
                                      const nvml::GpuInstanceInfo& live, PlannedDevice& d,
                                      std::string* result) {
  // Verified against NVML before it is given to the pod; one that does not verify is destroyed
  // (when nothing runs on it) and the pod gets a new instance.
  auto verified = VerifyIdle(*d.gpu, *d.reuse, live);
  if (verified.ok()) {
    d.reuse->idle = false;
    d.reuse->idle_since = 0;
    d.reuse->owner = {pod.uid, pod.ns, pod.name, container, d.allocation.device_index};
    d.reuse->origin = "reused";
    d.reuse->since = NowUnix();
    return absl::OkStatus();
  }
  std::string busy;
  if (GiBusy(*d.gpu, d.reuse->gpu_instance_id, &busy)) {
    return Refuse(
        pod, "placement_busy",
        absl::FailedPreconditionError(fmt::format("{}: the idle MIG device {} there is in use ({})",
                                                  what, d.reuse->mig_uuid, busy)),
        result);
  }
  if (auto st = DestroyGi(*d.gpu, d.reuse->gpu_instance_id); !st.ok()) {
    metrics_.DestroyFailed();
    Event(&pod, "Warning", kReasonFailed, std::string(st.message()));
    FailPod(pod);
    return Annotate(st, what);
  }
  spdlog::warn("{}: idle MIG device {} does not verify ({}): destroyed, creating anew", what,
               d.reuse->mig_uuid, std::string(verified.message()));
  metrics_.InstanceDestroyed("idle_invalid");
  ns_.RemoveManaged(d.allocation.gpu_uuid, d.reuse->gpu_instance_id);
  PersistOrLog("state");
  d.reuse.reset();
  d.from_idle = false;
  return absl::OkStatus();
}

absl::Status PluginCore::RecordIntents(const PodMig& pod, AllocationPlan& plan) {
  for (auto& d : plan.devices) {
    if (d.reuse.has_value()) continue;
    Intent intent;
    intent.id = ns_.state.next_intent_id++;
    intent.owner = {pod.uid, pod.ns, pod.name, plan.container, d.allocation.device_index};
    intent.gpu_uuid = d.allocation.gpu_uuid;
    intent.profile = d.allocation.profile;
    intent.placement = d.allocation.placement;
    intent.created = NowUnix();
    d.intent = intent.id;
    plan.intents.push_back(intent.id);
    ns_.state.intents.push_back(std::move(intent));
  }
  if (plan.intents.empty()) return absl::OkStatus();
  auto st = Persist();
  if (st.ok()) return absl::OkStatus();
  std::erase_if(ns_.state.intents, [&](const Intent& i) {
    return std::find(plan.intents.begin(), plan.intents.end(), i.id) != plan.intents.end();
  });
  Event(&pod, "Warning", kReasonFailed, std::string(st.message()));
  FailPod(pod);
  return Annotate(st, "record the allocation intent");
}

absl::Status PluginCore::Abort(const PodMig& pod, const AllocationPlan& plan,
                               std::vector<Created>& created, const absl::Status& st,
                               std::string_view step) {
  const absl::Status annotated =
      Annotate(st, fmt::format("pod {} container {}: {}", pod.key, plan.container, step));
  Rollback(created, plan.intents);
  Event(&pod, "Warning", kReasonFailed, std::string(annotated.message()));
  FailPod(pod);
  return annotated;
}

absl::StatusOr<std::vector<ManagedInstance>> PluginCore::CreateInstances(
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
    auto gi = nvml_.CreateGpuInstance(d.gpu->info.index, d.profile->nvml_id, a.placement);
    if (!gi.ok()) return Abort(pod, plan, created, gi.status(), "create GI " + what);
    created.push_back({d.gpu, gi->id, ""});
    if (Crash(kCrashAfterGpuInstance)) return absl::AbortedError("simulated crash after the GI");
    auto ci = nvml_.CreateComputeInstance(d.gpu->info.index, gi->id);
    if (!ci.ok()) {
      return Abort(pod, plan, created, ci.status(),
                   fmt::format("create the CI of GI {} ({})", gi->id, what));
    }
    if (Crash(kCrashAfterComputeInstance)) {
      return absl::AbortedError("simulated crash after the CI");
    }
    auto uuid = nvml_.GetMigDeviceUuid(d.gpu->info.index, gi->id, ci->id);
    if (!uuid.ok()) {
      return Abort(pod, plan, created, uuid.status(),
                   fmt::format("read the MIG UUID of GI {} CI {}", gi->id, ci->id));
    }
    created.back().mig_uuid = *uuid;
    instances.push_back(NewInstance({pod.uid, pod.ns, pod.name, plan.container, a.device_index},
                                    a.gpu_uuid, a.profile, d.profile->nvml_id, a.placement, gi->id,
                                    ci->id, *uuid, "created"));
  }
  return instances;
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> PluginCore::Publish(
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
  auto written = WriteRuntimeIdentity(pod, plan.container, identities, /*consume=*/true, &done);
  if (!written.ok()) {
    if (Crash(kCrashBeforeRollback)) return absl::AbortedError("simulated crash before rollback");
    return Abort(pod, plan, created, written,
                 fmt::format("write {}", protocol::kMigAllocationsAnnotation));
  }
  if (Crash(kCrashAfterAnnotation)) {
    return absl::AbortedError("simulated crash after the annotation");
  }
  Commit(device_ids, pod, plan, instances);
  if (done) alloc_.in_progress.reset();
  *result = "success";
  return answer;
}

void PluginCore::Commit(const std::vector<std::string>& device_ids, const PodMig& pod,
                        const AllocationPlan& plan, const std::vector<ManagedInstance>& instances) {
  // Managed instances, closed intents and the ledger entry in one write.
  for (const auto& m : instances) ns_.Manage(m);
  RecordLedger(device_ids, pod, plan.container, instances);
  std::erase_if(ns_.state.intents, [&](const Intent& i) {
    return std::find(plan.intents.begin(), plan.intents.end(), i.id) != plan.intents.end();
  });
  // On failure the annotation holds the identity: the next start adopts the instances from it.
  PersistOrLog(fmt::format("allocating pod {}", pod.key));
  for (size_t k = 0; k < instances.size(); ++k) {
    const auto& m = instances[k];
    if (plan.devices[k].from_idle) {
      metrics_.InstanceReused(m.profile);
      Event(&pod, "Normal", kReasonReused,
            fmt::format("reused idle MIG device {} ({} at {} of GPU {}, GI {}, CI {}) for "
                        "container {} device {}: verified against NVML, nothing created",
                        m.mig_uuid, m.profile, PlacementText(m.placement), m.gpu_uuid,
                        m.gpu_instance_id, m.compute_instance_id, plan.container,
                        m.owner.device_index));
    }
    if (plan.devices[k].reuse.has_value()) continue;
    metrics_.InstanceCreated(m.profile);
    Event(&pod, "Normal", kReasonCreated,
          fmt::format("created MIG device {} ({} at {} of GPU {}, GI {}, CI {}) for container {} "
                      "device {}",
                      m.mig_uuid, m.profile, PlacementText(m.placement), m.gpu_uuid,
                      m.gpu_instance_id, m.compute_instance_id, plan.container,
                      m.owner.device_index));
  }
}

ManagedInstance PluginCore::NewInstance(const InstanceOwner& owner, std::string_view gpu_uuid,
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
  if (alloc_.in_progress.has_value() && alloc_.in_progress->uid == pod.uid) {
    alloc_.in_progress.reset();
  }
  if (!alloc_.lock_released) ReleaseNodeLock(pod, alloc_.node);
}

std::string PluginCore::InProgress() const {
  if (!alloc_.in_progress.has_value() || Now() - alloc_.in_progress->since > kInProgressWindow) {
    return "";
  }
  return alloc_.in_progress->uid;
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
    const auto lock = NodeLockOf(*node);
    if (!lock.has_value() || !lock->OwnedBy(pod.ns, pod.name, pod.uid)) {  // not ours
      alloc_.lock_released = true;
      return;
    }
    kube::KeyPatch patch;
    patch[std::string(protocol::kNodeLockAnnotation)] = std::nullopt;
    auto st = kube_.PatchNodeAnnotations(options_.node_name, patch, kube::ResourceVersion(*node));
    if (st.ok()) {
      alloc_.lock_released = true;
      alloc_.node = *st;
      return;
    }
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
      for (const auto& intent : ns_.state.intents) {
        if (intent.gpu_uuid == c.gpu->info.uuid && intent.placement == gi.placement) {
          keep.insert(intent.id);
        }
      }
    }
  }
  std::erase_if(ns_.state.intents, [&](const Intent& i) {
    return std::find(intents.begin(), intents.end(), i.id) != intents.end() && !keep.count(i.id);
  });
  if (auto st = Persist(); !st.ok())
    spdlog::error("rollback: cannot save state: {}", std::string(st.message()));
  created.clear();
}

absl::StatusOr<std::vector<protocol::MigAllocation>> PluginCore::WithIdentities(
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

absl::StatusOr<std::vector<std::string>> PluginCore::DeviceNodes(const GpuEntry& gpu, uint32_t gi,
                                                                 uint32_t ci) {
  // Simulated devices have no device node on the host: the container gets the environment only
  // (a runtime fails a container whose device node does not exist).
  if (!nvml_.HasDeviceNodes()) return std::vector<std::string>{};
  if (!ns_.minors.has_value()) {
    auto minors = nvml_.GetMigMinors();
    if (!minors.ok()) {
      return absl::FailedPreconditionError(fmt::format(
          "the MIG capability minors are unavailable: {}", std::string(minors.status().message())));
    }
    ns_.minors = std::move(*minors);
  }
  auto nodes = ns_.minors->DeviceNodes(gpu.info.minor, gi, ci);
  if (!nodes.ok()) return nodes.status();
  return nodes->All();
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> PluginCore::Answer(
    const std::vector<ManagedInstance>& instances) {
  v1beta1::ContainerAllocateResponse response;
  std::vector<std::string> uuids;
  std::vector<std::string> paths;
  std::set<std::string> seen;
  for (const auto& m : instances) {
    const GpuEntry* gpu = ns_.inventory.FindByUuid(m.gpu_uuid);
    if (gpu == nullptr) {
      return absl::InternalError(fmt::format("GPU {} vanished from the inventory", m.gpu_uuid));
    }
    auto nodes = DeviceNodes(*gpu, m.gpu_instance_id, m.compute_instance_id);
    if (!nodes.ok()) {
      return Annotate(nodes.status(), fmt::format("device nodes of {}", m.mig_uuid));
    }
    uuids.push_back(m.mig_uuid);
    if (cdi_.enabled()) {
      if (auto st = cdi_.Write(m.mig_uuid, *nodes); !st.ok()) return st;
      response.add_cdi_devices()->set_name(CdiWriter::QualifiedName(m.mig_uuid));
      continue;
    }
    for (const auto& p : *nodes) {
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
    dynmig::MutexLock lock(&ns_.mu);
    auto pods = ListPods();
    if (pods.ok()) {
      std::optional<protocol::NodeLock> node_lock;
      if (auto node = kube_.GetNode(options_.node_name); node.ok()) node_lock = NodeLockOf(*node);
      if (const PodMig* pod =
              FindPendingPod(*pods, options_.node_name, node_lock, InProgress()).pod) {
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

}  // namespace dynmig::deviceplugin
