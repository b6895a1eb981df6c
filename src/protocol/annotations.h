// The names of HAMi's wire contract: Pod and Node annotations, labels and extended resources.
//
// dynmig speaks HAMi's protocol unchanged, so every key here is spelled exactly as HAMi spells it.
// docs/protocol.md describes each value's format and who writes it.
#pragma once

#include <string_view>

namespace dynmig::protocol {

// --- Pod annotations written by the scheduler extender and the device plugin -----------------

// JSON list of MIG reservations (profile + placement per container device), completed with the
// runtime identity (MIG UUID, GI ID, CI ID) by the device plugin. See mig_allocations.h.
inline constexpr std::string_view kMigAllocationsAnnotation = "hami.io/vgpu-mig-allocations";
// `UUID,Type,Usedmem,Usedcores:` per device, `;` after each container; erased container by
// container by the device plugin. See devices.h.
inline constexpr std::string_view kDevicesToAllocateAnnotation = "hami.io/vgpu-devices-to-allocate";
// Same encoding, never erased: the scheduler's source of truth when it rebuilds occupancy.
inline constexpr std::string_view kDevicesAllocatedAnnotation = "hami.io/vgpu-devices-allocated";
// The node chosen at filter time (also set as a Pod label with the same key).
inline constexpr std::string_view kVgpuNodeAnnotation = "hami.io/vgpu-node";
// Unix seconds of the filter decision.
inline constexpr std::string_view kVgpuTimeAnnotation = "hami.io/vgpu-time";
// "allocating" (bind), then "success" / "failed" (device plugin).
inline constexpr std::string_view kBindPhaseAnnotation = "hami.io/bind-phase";
// Unix seconds of the bind.
inline constexpr std::string_view kBindTimeAnnotation = "hami.io/bind-time";

// JSON object container -> the devices its runtime was given, written by the local mode's kubelet
// stand-in (src/local/node_agent); a real cluster has no equivalent.
inline constexpr std::string_view kVisibleDevicesAnnotation = "dynmig.io/visible-devices";

// Every pod annotation above that the system writes (scheduler extender, device plugin, the local
// mode's kubelet stand-in). The validating webhook lets only the configured identities add, change
// or remove any of them: the device plugin picks the pod of an Allocate and recovery, `explain`,
// `validate` and metrics read their story from them. (kRoutingPodAnnotations, below, lists the
// user-set ones that are fixed at creation.)
inline constexpr std::string_view kSystemPodAnnotations[] = {
    kMigAllocationsAnnotation, kDevicesToAllocateAnnotation, kDevicesAllocatedAnnotation,
    kVgpuNodeAnnotation,       kVgpuTimeAnnotation,          kBindPhaseAnnotation,
    kBindTimeAnnotation,       kVisibleDevicesAnnotation,
};

inline constexpr std::string_view kBindPhaseAllocating = "allocating";
inline constexpr std::string_view kBindPhaseSuccess = "success";
inline constexpr std::string_view kBindPhaseFailed = "failed";

// The label that mirrors kVgpuNodeAnnotation.
inline constexpr std::string_view kVgpuNodeLabel = "hami.io/vgpu-node";

// --- Pod annotations set by users --------------------------------------------------------------

// "mig" / "hami-core" / "mps": substring-matched against the device's mode. Absent: any mode.
inline constexpr std::string_view kVgpuModeAnnotation = "nvidia.com/vgpu-mode";
// Ordered, comma-separated exact profile names or slice classes ("4g,3g.20gb").
inline constexpr std::string_view kMigProfilePreferenceAnnotation =
    "nvidia.com/mig-profile-preference";
// "binpack" / "spread" (HAMi also knows "topology-aware", "mutex", "numa").
inline constexpr std::string_view kGpuSchedulerPolicyAnnotation = "hami.io/gpu-scheduler-policy";
// "binpack" / "spread".
inline constexpr std::string_view kNodeSchedulerPolicyAnnotation = "hami.io/node-scheduler-policy";
// Comma lists of physical GPU UUIDs.
inline constexpr std::string_view kUseGpuUuidAnnotation = "nvidia.com/use-gpuuuid";
inline constexpr std::string_view kNoUseGpuUuidAnnotation = "nvidia.com/nouse-gpuuuid";
// Comma lists of GPU model substrings.
inline constexpr std::string_view kUseGpuTypeAnnotation = "nvidia.com/use-gputype";
inline constexpr std::string_view kNoUseGpuTypeAnnotation = "nvidia.com/nouse-gputype";

// Every user-set pod annotation above: they decide whether a pod is dynmig's, which GPUs and
// profiles it may get and how it is placed. The validating webhook lets nobody add, change or
// remove any of them on a pod that requests the managed resources once it exists (fixed at
// creation), so a pod cannot leave or change its routing after its reservation was made.
inline constexpr std::string_view kRoutingPodAnnotations[] = {
    kVgpuModeAnnotation,           kUseGpuTypeAnnotation,          kNoUseGpuTypeAnnotation,
    kUseGpuUuidAnnotation,         kNoUseGpuUuidAnnotation,        kMigProfilePreferenceAnnotation,
    kGpuSchedulerPolicyAnnotation, kNodeSchedulerPolicyAnnotation,
};

inline constexpr std::string_view kVgpuModeMig = "mig";
inline constexpr std::string_view kVgpuModeHamiCore = "hami-core";
inline constexpr std::string_view kVgpuModeMps = "mps";

inline constexpr std::string_view kPolicyBinpack = "binpack";
inline constexpr std::string_view kPolicySpread = "spread";

// --- Node annotations --------------------------------------------------------------------------

// JSON array of DeviceInfo published by the device plugin. See node_register.h.
inline constexpr std::string_view kNodeRegisterAnnotation = "hami.io/node-nvidia-register";
// `Requesting_<YYYY-MM-DD HH:MM:SS>` written by the scheduler's health check.
inline constexpr std::string_view kNodeHandshakeAnnotation = "hami.io/node-handshake";
// Per-node bind lock: `<RFC3339 time>,<namespace>,<pod>`.
inline constexpr std::string_view kNodeLockAnnotation = "hami.io/mutex.lock";
// Comma list of GPU UUIDs excluded from new allocations (operator-set).
inline constexpr std::string_view kDeviceCordonAnnotation = "hami.io/device-cordon";

// --- Extended resources (HAMi defaults; configurable in device-config.yaml) -------------------

// Number of MIG instances (vGPUs) per container.
inline constexpr std::string_view kResourceCount = "nvidia.com/gpu";
// Memory per instance, MiB.
inline constexpr std::string_view kResourceMemory = "nvidia.com/gpumem";
// Memory per instance as a percentage of the GPU (1..100).
inline constexpr std::string_view kResourceMemoryPercentage = "nvidia.com/gpumem-percentage";
// Percent of the GPU's SMs; not used to choose a MIG profile.
inline constexpr std::string_view kResourceCores = "nvidia.com/gpucores";
// Every resource, label and annotation key of NVIDIA's components starts with this.
inline constexpr std::string_view kNvidiaKeyPrefix = "nvidia.com/";
// HAMi's annotation keys start with this.
inline constexpr std::string_view kHamiKeyPrefix = "hami.io/";
// The MIG resources of NVIDIA's device plugin (mixed strategy): nvidia.com/mig-1g.10gb, ...
inline constexpr std::string_view kMigResourcePrefix = "nvidia.com/mig-";

// --- Node labels of NVIDIA's GPU Operator and MIG Manager (read by preflight, rollback, inventory)
// -----

// The MIG Manager's wanted geometry (a name in its config) and its progress (pending, success,
// failed).
inline constexpr std::string_view kMigConfigLabel = "nvidia.com/mig.config";
inline constexpr std::string_view kMigConfigStateLabel = "nvidia.com/mig.config.state";
// "false" stops the GPU Operator from running the MIG Manager on the node.
inline constexpr std::string_view kMigManagerDeployLabel = "nvidia.com/gpu.deploy.mig-manager";
// The MIG labels (nvidia.com/mig.config, .state, nvidia.com/mig.strategy, ...) start with this.
inline constexpr std::string_view kMigLabelPrefix = "nvidia.com/mig";
// The GPU Feature Discovery labels (nvidia.com/gpu.product, .count, ...) start with this.
inline constexpr std::string_view kGpuLabelPrefix = "nvidia.com/gpu";

// --- dynmig's own keys
// ----------------------------------------------------------------------------

// Node label that marks a node whose GPUs dynmig serves (deploy/ selects the device plugin with
// it).
inline constexpr std::string_view kMigServiceLabel = "dynmig.io/mig";
// Pod label on the scheduler extender replicas: "leader" on the one that holds the lease (its
// Service selects it).
inline constexpr std::string_view kRoleLabel = "dynmig.io/role";
// Node label the scheduler's leader sets (to the unix time in milliseconds) when MIG capacity
// frees on the node while MIG pods are pending: kube-scheduler retries its unschedulable pods on
// a Node label change, not on an annotation change (scheduler/requeuer.h).
inline constexpr std::string_view kCapacityFreedLabel = "dynmig.io/capacity-freed";
// The CDI kind of dynmig's MIG devices: the device plugin answers "dynmig.io/mig=<MIG UUID>".
inline constexpr std::string_view kCdiKind = "dynmig.io/mig";

}  // namespace dynmig::protocol
