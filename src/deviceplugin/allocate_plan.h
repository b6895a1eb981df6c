// Allocate's validation step: a pure function from a pod container's typed reservation and the
// node's view (inventory, managed instances, quarantined slices) to the plan Allocate carries out,
// or the refusal naming what is wrong. No NVML, no API, no clock: it is unit-tested on plain values
// (tests/deviceplugin/plan_test.cc). What only NVML can confirm (no unmanaged GI overlaps, an idle
// instance still verifies) is the allocator's next step. Thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "deviceplugin/inventory.h"
#include "deviceplugin/pods.h"
#include "deviceplugin/state_store.h"
#include "mig/placement.h"
#include "protocol/mig_allocations.h"

namespace dynmig::deviceplugin {

// Slices kept out of use: a non-terminated pod's allocation that could not be verified.
struct QuarantinedSlices {
  std::string gpu_uuid;
  mig::Placement placement;
  std::string pod;  // namespace/name
  std::string reason;
};

// What validation reads of the node. The references must outlive the plan (it points into them).
struct NodeView {
  std::string_view node_name;
  const Inventory& inventory;
  const std::vector<ManagedInstance>& instances;  // managed, idle ones included
  const std::vector<QuarantinedSlices>& quarantine;
};

// One reservation of the container, validated.
struct PlannedDevice {
  protocol::MigAllocation allocation;
  const GpuEntry* gpu = nullptr;              // in NodeView::inventory
  const mig::ProfileSpec* profile = nullptr;  // allowlisted, `allocation.placement` is legal
  std::optional<ManagedInstance> reuse;       // an instance the device gets without a create
  bool from_idle = false;                     // `reuse` is an idle (warm) instance taken over
  uint64_t intent = 0;                        // the recorded intent (0: none, `reuse` is set)
};

// What one Allocate does: container `container` of the pod gets `devices` (by device index).
struct AllocationPlan {
  int container = -1;
  std::vector<PlannedDevice> devices;
  std::vector<uint64_t> intents;  // recorded before any creation
};

// The validation's answer: a plan, or a refusal (`reason` is the metrics label).
struct PlanResult {
  AllocationPlan plan;
  std::string reason;  // "" when valid
  absl::Status status;
  bool ok() const { return status.ok(); }
};

// Validates container `container` of `pod` for a kubelet request of `device_count` devices:
// no legacy identity, one decodable reservation per listed device on the same GPU, each GPU
// exposed and healthy, each profile allowlisted at a legal placement, no overlap within the
// container, with quarantined slices, or with a managed instance other than the device's own (an
// exact idle instance is reused; an app container shares an earlier init container's instance
// only at exactly the same profile and placement).
PlanResult ValidateAllocation(const PodMig& pod, int container, size_t device_count,
                              const NodeView& node);

// A whole-GPU pod's container (PodMig::whole_gpu), validated: the whole GPUs it gets, by device
// index.
struct WholeGpuPlan {
  int container = -1;
  std::vector<const GpuEntry*> gpus;  // in NodeView::inventory
};

struct WholeGpuPlanResult {
  WholeGpuPlan plan;
  std::string reason;  // "" when valid; the metrics label otherwise
  absl::Status status;
  bool ok() const { return status.ok(); }
};

// Validates container `container` of whole-GPU pod `pod` for a kubelet request of `device_count`
// devices: no MIG reservation (a pod gets whole GPUs or MIG devices, never both), one
// hami.io/vgpu-devices-to-allocate entry per device, each naming a GPU of this node published
// whole (MIG mode off) and healthy, none twice, with cores 100 and at most the GPU's memory; and no
// GPU held by another pod that has not terminated: one the ledger (`ledger`, served Allocates) says
// it got, or one another whole-GPU pod bound here (`pods`, not failed) names. Each refusal names
// the pod, container, device and GPU.
WholeGpuPlanResult ValidateWholeGpu(const PodMig& pod, int container, size_t device_count,
                                    const NodeView& node, const std::vector<PodMig>& pods,
                                    const std::vector<LedgerEntry>& ledger);

}  // namespace dynmig::deviceplugin
