// What the stand-in for HAMi's LEGACY device plugin (NvidiaStandin in StandinMode::kHamiLegacy)
// does beyond serving a resource, true to HAMi's plugin before dynamic MIG
// (reference hami-dynamic-mig.md, section 3) where dynmig's handover depends on it:
//
//   ListAndWatch  resource nvidia.com/gpu, socket nvidia-gpu.sock; fake split device ids
//                 "<GPU uuid>-<i>" (i < split count, HAMi's deviceSplitCount, 10 by default) for
//                 every GPU with MIG mode on; all Healthy.
//   Allocate      per container request: the pod being bound on this node is found as HAMi's
//                 plugin found it when no node lock names it (FindHamiPendingPod); the next
//                 container with devices left in hami.io/vgpu-devices-to-allocate is taken; each
//                 of its devices, `GPU-<uuid>[t-s]`, names the MIG device at index s of that GPU
//                 (nvmlDeviceGetMigDeviceHandleByIndex: GI id order, then CI id) once the GPU is
//                 laid out as geometry t of HAMi's knownMigGeometries for its model
//                 (HamiLegacyMigDevice). The answer is NVIDIA_VISIBLE_DEVICES=<MIG UUIDs>; the
//                 pod's to-allocate loses that container's devices and, when none is left,
//                 hami.io/bind-phase becomes success. A failure after the pod was found marks it
//                 bind-phase failed, as HAMi's PodAllocationFailed did.
//
// Where it is not HAMi's plugin: it never reconfigures a GPU (HAMi ran mig-parted apply when the
// GPU's layout was not geometry t; the stand-in refuses instead), it does not take or release
// hami.io/mutex.lock, and it sets no hami-core variables (CUDA_DEVICE_MEMORY_LIMIT ...), which
// MIG mode did not use.
//
// Every annotation it reads is hostile: bounded (kMaxHamiAnnotationBytes,
// kMaxStandinIdsPerContainer devices per container), decoded strictly; a pod whose annotations do
// not hold is skipped with the reason, never patched.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kube/object.h"
#include "mig/legacy.h"
#include "nvml/nvml.h"
#include "protocol/devices.h"

namespace dynmig::deviceplugin {

inline constexpr std::string_view kHamiSocketName = "nvidia-gpu.sock";
inline constexpr int kHamiDefaultSplitCount = 10;
inline constexpr int kHamiMaxSplitCount = 128;
// The largest annotation value the stand-in reads (a to-allocate value of 64 devices is ~7 KiB).
inline constexpr size_t kMaxHamiAnnotationBytes = 16 * 1024;

// The fake split ids of every GPU with MIG mode on, in GPU order: "<uuid>-0" .. "<uuid>-<split-1>".
// NVML errors pass through.
absl::StatusOr<std::vector<std::string>> HamiDeviceIds(nvml::Nvml& nvml, int split_count);

// The pod an Allocate on `node` is for, and the container it allocates.
struct HamiPending {
  std::string ns, name, uid;
  int container = 0;                   // index in to-allocate (init containers first)
  protocol::ContainerDevices devices;  // that container's devices
  protocol::PodDevices rest;           // to-allocate with that container emptied
  bool last = false;                   // no container is left after this one
};

// HAMi's plugin without a node lock owner: among the active pods bound to `node` (spec.nodeName)
// whose hami.io/bind-phase is allocating, hami.io/vgpu-node is `node`, hami.io/bind-time is a
// number and hami.io/vgpu-devices-to-allocate has a container left, the one with the oldest
// bind-time (then namespace/name). kFailedPrecondition when there is none; its message names the
// pods that said allocating on this node but were skipped, and why (at most 8).
absl::StatusOr<HamiPending> FindHamiPendingPod(const std::vector<kube::Object>& pods,
                                               std::string_view node);

struct HamiMigDevice {
  std::string mig_uuid;
  std::string profile;           // the profile of the MIG device at index s
  std::string template_profile;  // the profile of entry s of geometry t, flattened ("" if none)
};

// The MIG device `id` (`GPU-<uuid>[t-s]`) names on this node: the GPU with that UUID must have
// MIG mode on and be laid out as geometry t of the first entry of `geometries` whose model is in
// its name (every instance of the geometry, nothing else); the answer is its MIG device at index
// s. kInvalidArgument: `id` is not of that form or too long; kNotFound: no such GPU, no geometry
// entry for its model, no MIG device at index s; kFailedPrecondition: MIG off, or the layout is
// not geometry t (HAMi's plugin would have re-applied it). NVML errors pass through.
absl::StatusOr<HamiMigDevice> HamiLegacyMigDevice(
    nvml::Nvml& nvml, const std::vector<mig::LegacyGeometryEntry>& geometries, std::string_view id);

}  // namespace dynmig::deviceplugin
