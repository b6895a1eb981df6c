// Allocate's validation step. See allocate_plan.h.
#include "deviceplugin/allocate_plan.h"

#include <algorithm>
#include <map>
#include <set>

#include "deviceplugin/plugin_internal.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "protocol/annotations.h"
#include "protocol/gpu_mode.h"

namespace dynmig::deviceplugin {
namespace {

constexpr std::string_view kMigrationHint =
    "dynmig does not adopt or convert legacy MIG allocations, because a template/slot index does "
    "not prove a physical placement. Migrate this node as docs/device-plugin.md describes: cordon "
    "it, drain the legacy MIG pods, migrate the device config (dynmig config migrate), upgrade "
    "the scheduler, then the device plugin, and uncordon.";

std::string LegalPlacements(const mig::ProfileSpec& p) {
  std::vector<std::string> out;
  for (const auto& pl : p.placements) out.push_back(std::to_string(pl.start));
  return fmt::format("legal starts: {}", fmt::join(out, ","));
}

PlanResult Refused(std::string_view reason, absl::Status status) {
  PlanResult out;
  out.reason = std::string(reason);
  out.status = std::move(status);
  return out;
}

// The container's reservations, by device index, after the checks that need only the pod: no
// legacy identity, as many reservations as listed devices and kubelet device IDs.
PlanResult ContainerReservations(const PodMig& pod, int container, size_t device_count,
                                 std::vector<protocol::MigAllocation>& mine) {
  const protocol::ContainerDevices& devices = (*pod.to_allocate)[container];
  for (const auto& d : devices) {
    if (protocol::IsLegacyMigIdentity(d.uuid)) {
      return Refused("legacy", absl::FailedPreconditionError(fmt::format(
                                   "pod {} container {} carries the legacy MIG device identity "
                                   "\"{}\" (GPU-uuid[template-slot]) written by a "
                                   "pre-dynamic-MIG scheduler. {}",
                                   pod.key, container, d.uuid, kMigrationHint)));
    }
  }
  if (devices.size() != device_count) {
    return Refused("device_count", absl::FailedPreconditionError(fmt::format(
                                       "pod {} container {}: the kubelet asks for {} device(s) but "
                                       "{} lists {}",
                                       pod.key, container, device_count,
                                       protocol::kDevicesToAllocateAnnotation, devices.size())));
  }
  if (!pod.allocations.ok()) {
    return Refused("bad_reservation", absl::FailedPreconditionError(fmt::format(
                                          "pod {}: {} cannot be decoded: {}", pod.key,
                                          protocol::kMigAllocationsAnnotation,
                                          std::string(pod.allocations.status().message()))));
  }
  for (const auto& a : *pod.allocations) {
    if (a.container_index == container) mine.push_back(a);
  }
  std::sort(mine.begin(), mine.end(),
            [](const auto& a, const auto& b) { return a.device_index < b.device_index; });
  if (mine.size() != devices.size()) {
    return Refused("reservation_mismatch",
                   absl::FailedPreconditionError(fmt::format(
                       "pod {} container {}: {} lists {} device(s) but {} has {} reservation(s) "
                       "for it",
                       pod.key, container, protocol::kDevicesToAllocateAnnotation, devices.size(),
                       protocol::kMigAllocationsAnnotation, mine.size())));
  }
  return {};
}

// The checks of one reservation against the GPU it names: exposed, healthy, profile allowlisted,
// placement legal. Fills the device's GPU and profile.
PlanResult CheckGpuAndProfile(const std::string& what, const NodeView& node, PlannedDevice& d) {
  const protocol::MigAllocation& a = d.allocation;
  d.gpu = node.inventory.FindByUuid(a.gpu_uuid);
  if (d.gpu == nullptr || !d.gpu->exposed) {
    return Refused("unknown_gpu",
                   absl::FailedPreconditionError(fmt::format(
                       "{}: that GPU is not exposed on node {}", what, node.node_name)));
  }
  if (!d.gpu->healthy) {
    return Refused("gpu_unhealthy",
                   absl::UnavailableError(
                       fmt::format("{}: the GPU is unhealthy: {}", what, d.gpu->unhealthy_reason)));
  }
  if (d.gpu->Mode() != protocol::GpuMode::kMig) {
    return Refused("gpu_mode", absl::FailedPreconditionError(fmt::format(
                                   "{}: GPU {} is published whole (mode hami-core, MIG mode off) "
                                   "on node {}: a MIG reservation cannot name it",
                                   what, a.gpu_uuid, node.node_name)));
  }
  d.profile = d.gpu->FindAllowed(a.profile);
  if (d.profile == nullptr) {
    return Refused("profile_not_allowed", absl::FailedPreconditionError(fmt::format(
                                              "{}: profile {} is not an allowlisted profile of {}",
                                              what, a.profile, d.gpu->info.name)));
  }
  if (!d.profile->IsLegal(a.placement)) {
    return Refused("illegal_placement",
                   absl::InvalidArgumentError(
                       fmt::format("{}: not a legal placement of {} on {} ({})", what, a.profile,
                                   d.gpu->info.name, LegalPlacements(*d.profile))));
  }
  return {};
}

// The reservation against the container's other devices and the quarantined slices.
PlanResult CheckOverlaps(const std::string& what, const PodMig& pod, const NodeView& node,
                         const std::vector<PlannedDevice>& planned, const PlannedDevice& d) {
  const protocol::MigAllocation& a = d.allocation;
  for (const auto& other : planned) {
    if (other.allocation.gpu_uuid == a.gpu_uuid &&
        other.allocation.placement.Overlaps(a.placement)) {
      return Refused(
          "overlapping_reservation",
          absl::FailedPreconditionError(fmt::format(
              "{}: overlaps device {} of the same container at {}", what,
              other.allocation.device_index, PlacementText(other.allocation.placement))));
    }
  }
  for (const auto& q : node.quarantine) {
    if (q.gpu_uuid == a.gpu_uuid && q.placement.Overlaps(a.placement) && q.pod != pod.key) {
      return Refused("quarantined", absl::FailedPreconditionError(fmt::format(
                                        "{}: overlaps {} kept out of use for pod {} ({})", what,
                                        PlacementText(q.placement), q.pod, q.reason)));
    }
  }
  return {};
}

// The reservation against the managed instances: the device's own instance (or an exact idle
// one, or an earlier init container's) is reused; any other overlap refuses.
PlanResult MatchManaged(const std::string& what, const PodMig& pod, int container,
                        const NodeView& node, PlannedDevice& d) {
  const protocol::MigAllocation& a = d.allocation;
  for (const auto& m : node.instances) {
    if (m.gpu_uuid != a.gpu_uuid || !m.placement.Overlaps(a.placement)) continue;
    const bool exact = m.placement == a.placement && m.profile == a.profile;
    if (m.idle) {
      if (exact) {
        d.reuse = m;
        d.from_idle = true;
        continue;
      }
      // Reconcile destroys an idle instance whose slices an active pod reserves; it is still
      // here when that was not allowed or failed.
      return Refused(
          "placement_busy",
          absl::FailedPreconditionError(fmt::format(
              "{}: overlaps idle MIG device {} (GI {}, {} at {}) that could not be "
              "destroyed yet (see the node's events); retried by the kubelet",
              what, m.mig_uuid, m.gpu_instance_id, m.profile, PlacementText(m.placement))));
    }
    const bool same_pod = m.owner.pod_uid == pod.uid;
    const bool same_device =
        same_pod && m.owner.container_index == container && m.owner.device_index == a.device_index;
    // The kubelet allocates every container at admission, init containers first, and runs init
    // containers to completion before the app containers: an app container may share an init
    // container's instance when it reserved exactly the same profile and placement.
    const bool shared_init = same_pod && exact && m.owner.container_index < pod.init_containers &&
                             m.owner.container_index < container;
    if (exact && (same_device || shared_init)) {
      d.reuse = m;
      continue;
    }
    const std::string hint = same_pod ? fmt::format(
                                            " (container {} of the same pod: containers of one "
                                            "pod may share an instance only with the same "
                                            "profile and placement)",
                                            m.owner.container_index)
                                      : ", not reclaimed yet";
    return Refused("placement_busy",
                   absl::FailedPreconditionError(fmt::format(
                       "{}: overlaps GI {} ({} at {}) of pod {}{}", what, m.gpu_instance_id,
                       m.profile, PlacementText(m.placement), m.owner.PodKey(), hint)));
  }
  return {};
}

}  // namespace

PlanResult ValidateAllocation(const PodMig& pod, int container, size_t device_count,
                              const NodeView& node) {
  if (container < 0 || !pod.to_allocate.ok() ||
      static_cast<size_t>(container) >= pod.to_allocate->size()) {
    return Refused("device_count", absl::FailedPreconditionError(fmt::format(
                                       "pod {} has no container {} left in {}", pod.key, container,
                                       protocol::kDevicesToAllocateAnnotation)));
  }
  std::vector<protocol::MigAllocation> mine;
  if (PlanResult r = ContainerReservations(pod, container, device_count, mine); !r.ok()) return r;
  const protocol::ContainerDevices& devices = (*pod.to_allocate)[container];
  PlanResult out;
  out.plan.container = container;
  for (size_t k = 0; k < mine.size(); ++k) {
    PlannedDevice d;
    d.allocation = mine[k];
    const protocol::MigAllocation& a = d.allocation;
    const std::string what =
        fmt::format("pod {} container {} device {} ({} at {} of GPU {})", pod.key, container,
                    a.device_index, a.profile, PlacementText(a.placement), a.gpu_uuid);
    if (a.gpu_uuid != devices[k].uuid) {
      return Refused("reservation_mismatch",
                     absl::FailedPreconditionError(fmt::format(
                         "{}: the reservation names GPU {} but {} device {} is GPU {}", what,
                         a.gpu_uuid, protocol::kDevicesToAllocateAnnotation, k, devices[k].uuid)));
    }
    if (PlanResult r = CheckGpuAndProfile(what, node, d); !r.ok()) return r;
    if (PlanResult r = CheckOverlaps(what, pod, node, out.plan.devices, d); !r.ok()) return r;
    if (PlanResult r = MatchManaged(what, pod, container, node, d); !r.ok()) return r;
    out.plan.devices.push_back(std::move(d));
  }
  return out;
}

WholeGpuPlanResult ValidateWholeGpu(const PodMig& pod, int container, size_t device_count,
                                    const NodeView& node, const std::vector<PodMig>& pods,
                                    const std::vector<LedgerEntry>& ledger) {
  WholeGpuPlanResult out;
  auto refused = [&](std::string_view reason, absl::Status status) {
    out.reason = std::string(reason);
    out.status = std::move(status);
    return out;
  };
  if (pod.has_allocations) {
    return refused("mixed_reservation",
                   absl::FailedPreconditionError(fmt::format(
                       "pod {} asks for whole GPUs ({}: {}) but carries MIG reservations ({}): a "
                       "pod gets whole GPUs or MIG devices, never both",
                       pod.key, protocol::kVgpuModeAnnotation, protocol::kVgpuModeHamiCore,
                       protocol::kMigAllocationsAnnotation)));
  }
  if (container < 0 || !pod.to_allocate.ok() ||
      static_cast<size_t>(container) >= pod.to_allocate->size()) {
    return refused("device_count", absl::FailedPreconditionError(fmt::format(
                                       "pod {} has no container {} left in {}", pod.key, container,
                                       protocol::kDevicesToAllocateAnnotation)));
  }
  const protocol::ContainerDevices& devices = (*pod.to_allocate)[container];
  if (devices.size() != device_count) {
    return refused("device_count", absl::FailedPreconditionError(fmt::format(
                                       "pod {} container {}: the kubelet asks for {} device(s) but "
                                       "{} lists {}",
                                       pod.key, container, device_count,
                                       protocol::kDevicesToAllocateAnnotation, devices.size())));
  }
  // Who holds each GPU already: a served Allocate of another pod that has not ended (the ledger),
  // or another non-terminated whole-GPU pod bound here whose reservation names it.
  std::map<std::string, std::string, std::less<>> held;
  std::set<std::string, std::less<>> live;
  for (const auto& p : pods) {
    if (!p.terminated) live.insert(p.uid);
  }
  for (const auto& e : ledger) {
    if (e.pod_uid == pod.uid || !live.count(e.pod_uid)) continue;
    for (const auto& g : e.gpu_uuids) held.emplace(g, e.PodKey());
  }
  for (const auto& p : pods) {
    if (p.uid == pod.uid || p.terminated || !p.whole_gpu || p.vgpu_node != node.node_name ||
        p.bind_phase == protocol::kBindPhaseFailed) {
      continue;
    }
    for (const auto& g : p.referenced_gpus) held.emplace(g, p.key);
  }
  out.plan.container = container;
  std::set<std::string, std::less<>> seen;
  for (size_t k = 0; k < devices.size(); ++k) {
    const protocol::ContainerDevice& d = devices[k];
    const std::string what =
        fmt::format("pod {} container {} device {} (whole GPU {})", pod.key, container, k, d.uuid);
    const GpuEntry* gpu = node.inventory.FindByUuid(d.uuid);
    if (gpu == nullptr || !gpu->exposed) {
      return refused("unknown_gpu",
                     absl::FailedPreconditionError(fmt::format(
                         "{}: no such GPU is published on node {}", what, node.node_name)));
    }
    if (!gpu->Whole()) {
      return refused("gpu_mode", absl::FailedPreconditionError(fmt::format(
                                     "{}: the GPU is a MIG GPU on node {} (its MIG mode is on), "
                                     "not a whole GPU: a whole-GPU pod cannot name it",
                                     what, node.node_name)));
    }
    if (!gpu->healthy) {
      return refused("gpu_unhealthy",
                     absl::UnavailableError(
                         fmt::format("{}: the GPU is unhealthy: {}", what, gpu->unhealthy_reason)));
    }
    if (!seen.insert(d.uuid).second) {
      return refused("overlapping_reservation",
                     absl::FailedPreconditionError(
                         fmt::format("{}: the container names that GPU twice", what)));
    }
    if (d.used_cores != 100 || d.used_mem_mib < 0 ||
        static_cast<uint64_t>(d.used_mem_mib) > gpu->info.total_memory_mib) {
      return refused("bad_reservation",
                     absl::InvalidArgumentError(fmt::format(
                         "{}: a whole GPU is reserved with cores 100 and at most its {} MiB, not "
                         "cores {} and {} MiB",
                         what, gpu->info.total_memory_mib, d.used_cores, d.used_mem_mib)));
    }
    if (auto h = held.find(d.uuid); h != held.end()) {
      return refused("placement_busy",
                     absl::FailedPreconditionError(fmt::format(
                         "{}: the GPU is held by pod {}, which has not ended", what, h->second)));
    }
    // Another container of this pod that got it (a whole GPU goes to one container).
    for (const auto& e : ledger) {
      if (e.pod_uid != pod.uid || e.container_index == container) continue;
      if (std::find(e.gpu_uuids.begin(), e.gpu_uuids.end(), d.uuid) != e.gpu_uuids.end()) {
        return refused("placement_busy", absl::FailedPreconditionError(fmt::format(
                                             "{}: container {} of the same pod already has it",
                                             what, e.container_index)));
      }
    }
    out.plan.gpus.push_back(gpu);
  }
  return out;
}

}  // namespace dynmig::deviceplugin
