// Allocation: which pod a kubelet Allocate is for, its reservations validated, GI + CI created at
// exactly the reserved placements, the runtime identity written back, the answer. See
// plugin_core.h and docs/device-plugin.md (Allocate).
#include <algorithm>
#include <chrono>
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
namespace {

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

// One reservation of the container being allocated, validated.
struct PluginCore::Plan {
  protocol::MigAllocation allocation;
  const GpuEntry* gpu = nullptr;
  const mig::ProfileSpec* profile = nullptr;
  std::optional<ManagedInstance> reuse;  // an instance this pod container device already has
  bool from_idle = false;                // `reuse` is an idle (warm) instance taken over
  uint64_t intent = 0;
};

// A GI this Allocate call created (rolled back on failure).
struct PluginCore::Created {
  const GpuEntry* gpu = nullptr;
  uint32_t gi = 0;
  std::string mig_uuid;
};

absl::StatusOr<v1beta1::ContainerAllocateResponse> PluginCore::Allocate(
    const std::vector<std::string>& device_ids) {
  const auto start = std::chrono::steady_clock::now();
  std::string result = "failed";
  absl::StatusOr<v1beta1::ContainerAllocateResponse> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = AllocateLocked(device_ids, &result);
    UpdateGauges();
    RefreshViewLocked();
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
  if (in_progress_.has_value() && in_progress_->uid == pod.uid) in_progress_.reset();
  if (!lock_released_) ReleaseNodeLock(pod, node_);
}

std::string PluginCore::InProgress() const {
  if (!in_progress_.has_value() || Now() - in_progress_->since > kInProgressWindow) return "";
  return in_progress_->uid;
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
      lock_released_ = true;
      return;
    }
    kube::KeyPatch patch;
    patch[std::string(protocol::kNodeLockAnnotation)] = std::nullopt;
    auto st = kube_.PatchNodeAnnotations(options_.node_name, patch, kube::ResourceVersion(*node));
    if (st.ok()) {
      lock_released_ = true;
      node_ = *st;
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

  std::optional<protocol::NodeLock> lock;
  node_.reset();
  lock_released_ = false;
  if (auto node = kube_.GetNode(options_.node_name); node.ok()) {
    lock = NodeLockOf(*node);
    node_ = std::move(*node);
  }
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
        options_.node_name, device_ids.size(), protocol::kNodeLockAnnotation,
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
  const PodMig pod = *pending.pod;
  // The pod is identified: the node lock has done its job. Release it now, before any NVML work,
  // so that the next bind to this node need not wait for this one's instances. The pod's later
  // containers are found as the allocation in progress.
  in_progress_ = InProgressPod{pod.uid, Now()};
  if (lock.has_value() && lock->OwnedBy(pod.ns, pod.name, pod.uid)) {
    ReleaseNodeLock(pod, node_);
  } else {
    lock_released_ = true;  // not this pod's (released by its first container's Allocate)
  }
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
      const bool exact = m.placement == a.placement && m.profile == a.profile;
      if (m.idle) {
        if (exact) {
          plan.reuse = m;
          plan.from_idle = true;
          continue;
        }
        // Reconcile (just above) destroys an idle instance whose slices an active pod reserves;
        // it is still here when that was not allowed or failed.
        return Refuse(
            pod, "placement_busy",
            absl::FailedPreconditionError(fmt::format(
                "{}: overlaps idle MIG device {} (GI {}, {} at {}) that could not be "
                "destroyed yet (see the node's events); retried by the kubelet",
                what, m.mig_uuid, m.gpu_instance_id, m.profile, PlacementText(m.placement))),
            result);
      }
      const bool same_pod = m.owner.pod_uid == pod.uid;
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
      plan.from_idle = false;
    }
    if (plan.from_idle) {
      // Verified against NVML before it is given to the pod; one that does not verify is
      // destroyed (when nothing runs on it) and the pod gets a new instance.
      const nvml::GpuInstanceInfo* live = nullptr;
      for (const auto& gi : *gis) {
        if (gi.id == plan.reuse->gpu_instance_id) live = &gi;
      }
      auto verified = VerifyIdle(*plan.gpu, *plan.reuse, *live);
      if (!verified.ok()) {
        std::string busy;
        if (GiBusy(*plan.gpu, plan.reuse->gpu_instance_id, &busy)) {
          return Refuse(pod, "placement_busy",
                        absl::FailedPreconditionError(
                            fmt::format("{}: the idle MIG device {} there is in use ({})", what,
                                        plan.reuse->mig_uuid, busy)),
                        result);
        }
        if (auto st = DestroyGi(*plan.gpu, plan.reuse->gpu_instance_id); !st.ok()) {
          metrics_.DestroyFailed();
          Event(&pod, "Warning", kReasonFailed, std::string(st.message()));
          FailPod(pod);
          return Annotate(st, what);
        }
        spdlog::warn("{}: idle MIG device {} does not verify ({}): destroyed, creating anew", what,
                     plan.reuse->mig_uuid, std::string(verified.message()));
        metrics_.InstanceDestroyed("idle_invalid");
        RemoveManaged(a.gpu_uuid, plan.reuse->gpu_instance_id);
        if (auto st = Persist(); !st.ok())
          spdlog::error("cannot save state: {}", std::string(st.message()));
        plan.reuse.reset();
        plan.from_idle = false;
      } else {
        plan.reuse->idle = false;
        plan.reuse->idle_since = 0;
        plan.reuse->owner = {pod.uid, pod.ns, pod.name, container, a.device_index};
        plan.reuse->origin = "reused";
        plan.reuse->since = NowUnix();
      }
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

  // Commit: managed instances, closed intents and the ledger entry in one write.
  for (const auto& m : instances) Manage(m);
  RecordLedger(device_ids, pod, container, instances);
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
    if (plans[k].from_idle) {
      metrics_.InstanceReused(m.profile);
      Event(&pod, "Normal", kReasonReused,
            fmt::format("reused idle MIG device {} ({} at {} of GPU {}, GI {}, CI {}) for "
                        "container {} device {}: verified against NVML, nothing created",
                        m.mig_uuid, m.profile, PlacementText(m.placement), m.gpu_uuid,
                        m.gpu_instance_id, m.compute_instance_id, container, m.owner.device_index));
    }
    if (plans[k].reuse.has_value()) continue;
    metrics_.InstanceCreated(m.profile);
    Event(&pod, "Normal", kReasonCreated,
          fmt::format("created MIG device {} ({} at {} of GPU {}, GI {}, CI {}) for container {} "
                      "device {}",
                      m.mig_uuid, m.profile, PlacementText(m.placement), m.gpu_uuid,
                      m.gpu_instance_id, m.compute_instance_id, container, m.owner.device_index));
  }
  if (done) in_progress_.reset();
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

absl::StatusOr<std::vector<std::string>> PluginCore::DeviceNodes(const GpuEntry& gpu, uint32_t gi,
                                                                 uint32_t ci) {
  // Simulated devices have no device node on the host: the container gets the environment only
  // (a runtime fails a container whose device node does not exist).
  if (!nvml_.HasDeviceNodes()) return std::vector<std::string>{};
  if (!minors_.has_value()) {
    auto minors = nvml_.GetMigMinors();
    if (!minors.ok()) {
      return absl::FailedPreconditionError(fmt::format(
          "the MIG capability minors are unavailable: {}", std::string(minors.status().message())));
    }
    minors_ = std::move(*minors);
  }
  auto nodes = minors_->DeviceNodes(gpu.info.minor, gi, ci);
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
    const GpuEntry* gpu = inventory_.FindByUuid(m.gpu_uuid);
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
    std::lock_guard<std::mutex> lock(mu_);
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
