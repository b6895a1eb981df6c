// The GPU seam: the narrow subset of NVML that dynmig calls, as value types and absl::Status.
//
// Two implementations: DlopenNvml (dlopen("libnvidia-ml.so.1") at run time, see dlopen_nvml.h) and
// SimNvml (a strict, persistent simulator, see sim_nvml.h). Both pass one conformance suite
// (tests/nvml/nvml_conformance_test.cc).
//
// Identification: GPUs by NVML index (0..DeviceCount()-1), GPU instances (GIs) by GI id (the RM
// swizzId, unique per GPU while the GI exists), compute instances (CIs) by CI id (unique per GI).
// No NVML handle leaves this layer.
//
// Profile INDEX vs profile ID: GetGpuInstanceProfileInfo takes the NVML_GPU_INSTANCE_PROFILE_*
// index (0..kGpuInstanceProfileCount-1) and returns the profile's `id`; every other call takes the
// id. The same index has different ids on different GPU models.
//
// Errors: every failing call returns a status built by NvmlStatus(code, context), so its code keeps
// NVML's meaning (INSUFFICIENT_RESOURCES -> kResourceExhausted, IN_USE -> kFailedPrecondition, ...)
// and its message names the NVML code ("NVML_ERROR_IN_USE") and the operation. NvmlReturnOf()
// recovers the NVML code. The error lists below name NVML codes; an NVML_ERROR_GPU_IS_LOST
// (kUnavailable) or NVML_ERROR_UNINITIALIZED (kFailedPrecondition) can come from any call.
//
// Thread safety: every implementation is thread-safe; all methods may be called concurrently from
// any thread. Mutating calls on the same GPU are serialized by the implementation (NVML itself
// serializes MIG reconfiguration; the simulator holds a lock).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mig/placement.h"
#include "mig/profile.h"
#include "nvml/mig_minors.h"

namespace dynmig::nvml {

// nvmlReturn_t values (nvml.h). Any int is a valid value; unnamed ones map to kUnknown.
enum class NvmlReturn : int {
  kSuccess = 0,
  kUninitialized = 1,
  kInvalidArgument = 2,
  kNotSupported = 3,
  kNoPermission = 4,
  kAlreadyInitialized = 5,
  kNotFound = 6,
  kInsufficientSize = 7,
  kInsufficientPower = 8,
  kDriverNotLoaded = 9,
  kTimeout = 10,
  kIrqIssue = 11,
  kLibraryNotFound = 12,
  kFunctionNotFound = 13,
  kCorruptedInforom = 14,
  kGpuIsLost = 15,
  kResetRequired = 16,
  kOperatingSystem = 17,
  kLibRmVersionMismatch = 18,
  kInUse = 19,
  kMemory = 20,
  kNoData = 21,
  kVgpuEccNotEnabled = 22,
  kInsufficientResources = 23,
  kFreqNotSupported = 24,
  kArgumentVersionMismatch = 25,
  kDeprecated = 26,
  kNotReady = 27,
  kGpuNotFound = 28,
  kInvalidState = 29,
  kUnknown = 999,
};

// "NVML_SUCCESS", "NVML_ERROR_IN_USE", ...; "NVML_ERROR_<n>" for a value nvml.h does not name.
std::string NvmlReturnName(NvmlReturn code);

// Parses "IN_USE", "NVML_ERROR_IN_USE", "in_use" or "19". InvalidArgument names the valid names.
absl::StatusOr<NvmlReturn> ParseNvmlReturn(std::string_view text);

// The one mapping from an NVML return code to a status. kSuccess -> OK. Otherwise:
//   INSUFFICIENT_RESOURCES -> kResourceExhausted   IN_USE -> kFailedPrecondition
//   NOT_FOUND -> kNotFound                         NOT_SUPPORTED -> kUnimplemented
//   NO_PERMISSION -> kPermissionDenied             GPU_IS_LOST -> kUnavailable
//   INVALID_ARGUMENT -> kInvalidArgument
//   UNINITIALIZED, DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND -> kFailedPrecondition
//   anything else -> kUnknown
// The message is "<context>: NVML_ERROR_<NAME> (<description>)" and the status carries the code as
// a payload (see NvmlReturnOf).
absl::Status NvmlStatus(NvmlReturn code, std::string_view context);

// The NVML code a status was built from: the payload NvmlStatus attaches, else an
// "NVML_ERROR_<NAME>" token in the message (so dynmig::Annotate, which drops payloads, keeps it
// recoverable). nullopt for OK and for statuses that did not come from NVML.
std::optional<NvmlReturn> NvmlReturnOf(const absl::Status& status);

// NVML_GPU_INSTANCE_PROFILE_COUNT: profile indices are 0 .. kGpuInstanceProfileCount-1.
inline constexpr uint32_t kGpuInstanceProfileCount = 0x12;
// NVML_COMPUTE_INSTANCE_PROFILE_COUNT.
inline constexpr uint32_t kComputeInstanceProfileCount = 0x9;

// MIG mode as nvmlDeviceGetMigMode reports it.
struct MigModeState {
  bool supported = false;  // false where GetMigMode says NOT_SUPPORTED (no MIG on this GPU)
  bool current = false;    // MIG enabled now
  bool pending = false;    // MIG enabled after the next reset (Ampere); == current elsewhere

  friend bool operator==(const MigModeState&, const MigModeState&) = default;
};

// What nvmlDeviceSetMigMode reports besides its own return code: its `activationStatus`, and the
// mode read back after the call. NVML documents three outcomes:
//   SUCCESS         the requested mode is current now (Hopper and later on an idle GPU);
//   IN_USE          the mode is pending: the driver could not unbind or reset the GPU because
//                   something still holds it; idle it, then reset it (Ampere: the mode waits for
//                   a GPU reset);
//   RESET_REQUIRED  the mode is pending and this host exposes no GPU reset (pass-through VMs):
//                   only a reboot of the host (VM) applies it.
struct MigModeChange {
  NvmlReturn activation = NvmlReturn::kSuccess;
  MigModeState mode;  // after the call

  // Whether the requested mode is in effect now.
  bool Active() const { return activation == NvmlReturn::kSuccess && mode.current == mode.pending; }
  // Whether only a reboot can apply it (a GPU reset cannot).
  bool NeedsReboot() const { return activation == NvmlReturn::kResetRequired; }
};

// One physical GPU.
struct GpuInfo {
  uint32_t index = 0;               // NVML index
  std::string uuid;                 // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  std::string name;                 // nvmlDeviceGetName, e.g. "NVIDIA A100-SXM4-40GB"
  std::string pci_bus_id;           // nvmlPciInfo_t.busId, e.g. "00000000:07:00.0"
  uint32_t pci_device_id = 0;       // (device id << 16) | vendor id, e.g. 0x20B010DE
  uint32_t minor = 0;               // device minor: /dev/nvidia<minor>, gpu<minor> in mig-minors
  uint64_t total_memory_bytes = 0;  // nvmlDeviceGetMemoryInfo().total
  uint64_t total_memory_mib = 0;    // total_memory_bytes / MiB
  MigModeState mig;
};

// nvmlGpuInstanceProfileInfo_t for one profile index.
struct GpuInstanceProfileInfo {
  uint32_t index = 0;           // the NVML_GPU_INSTANCE_PROFILE_* index that was queried
  uint32_t id = 0;              // info.id: pass this to every other GI call
  uint32_t slice_count = 0;     // compute slices (the N of "Ng")
  uint32_t instance_count = 0;  // most GIs of this profile at once
  uint64_t memory_mib = 0;      // info.memorySizeMB
  uint32_t multiprocessor_count = 0;
  uint32_t copy_engines = 0;
  uint32_t decoders = 0;
  uint32_t encoders = 0;
  uint32_t jpegs = 0;
  uint32_t ofas = 0;
};

// nvmlGpuInstanceInfo_t.
struct GpuInstanceInfo {
  uint32_t gpu = 0;          // NVML index of the parent GPU
  uint32_t id = 0;           // GI id (RM swizzId)
  uint32_t profile_id = 0;   // GI profile id (not index)
  mig::Placement placement;  // on the GPU's placement axis; never derive it from the id
};

// nvmlComputeInstanceInfo_t plus the MIG device it stands for.
struct ComputeInstanceInfo {
  uint32_t gpu = 0;
  uint32_t gpu_instance_id = 0;
  uint32_t id = 0;           // CI id, unique within its GI
  uint32_t profile_id = 0;   // CI profile id
  mig::Placement placement;  // in compute slices, within the GI's {0, sliceCount}
  std::string mig_uuid;      // "MIG-<uuid>" of the MIG device (CUDA/NVIDIA_VISIBLE_DEVICES)
};

// One process using a GPU or a MIG device (nvmlProcessInfo_t).
struct ProcessInfo {
  uint32_t pid = 0;
  uint64_t used_memory_mib = 0;                 // 0 when NVML does not know
  std::optional<uint32_t> gpu_instance_id;      // set for processes on a MIG device
  std::optional<uint32_t> compute_instance_id;  // set for processes on a MIG device
};

class Nvml {
 public:
  virtual ~Nvml() = default;

  // "NVML 550.54.15 (libnvidia-ml.so.1)" or "simulator A100-SXM4-40GBx2 (state /tmp/s.json)".
  virtual std::string Description() const = 0;

  // Whether this backend's GPUs and MIG devices exist as device nodes on the host (/dev/nvidia*,
  // /dev/nvidia-caps/*), so that they can be handed to containers. A real driver: yes. The
  // simulator: no (a container runtime fails a container whose device node is missing).
  virtual bool HasDeviceNodes() const { return true; }

  // Number of GPUs (nvmlDeviceGetCount_v2).
  virtual absl::StatusOr<uint32_t> DeviceCount() = 0;

  // Identity, memory and MIG mode of GPU `gpu`. INVALID_ARGUMENT: no such index.
  virtual absl::StatusOr<GpuInfo> GetGpu(uint32_t gpu) = 0;

  // MIG mode of GPU `gpu` (nvmlDeviceGetMigMode). A GPU without MIG (NVML's NOT_SUPPORTED, or a
  // driver without the entry point) is no error: supported = false, current = pending = false.
  // INVALID_ARGUMENT: no such index.
  virtual absl::StatusOr<MigModeState> GetMigMode(uint32_t gpu) = 0;

  // nvmlDeviceSetMigMode(gpu, enabled ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE) and the
  // mode read back. The call itself fails with NOT_SUPPORTED (no MIG on this GPU), IN_USE (GPU
  // instances or compute processes exist: nothing is changed), NO_PERMISSION (not root). When it
  // succeeds, MigModeChange says whether the mode is active or pending, and what applies it.
  // Needs root on a real driver and may unbind or reset the GPU: never call it on a GPU that
  // anything uses (the device plugin calls it only on a GPU it reserved; tests only on the
  // simulator).
  virtual absl::StatusOr<MigModeChange> SetMigMode(uint32_t gpu, bool enabled) = 0;

  // Resets GPU `gpu`, which applies a pending MIG mode (and drops its GPU instances).
  // NVML's public API has no GPU-reset entry point (only clock and counter resets): on a real node
  // the reset is a host action, `nvidia-smi --gpu-reset -i <index>` as root with no process on the
  // GPU, or a reboot. DlopenNvml therefore returns NOT_SUPPORTED naming that action; the simulator
  // models the host action: IN_USE while a process or another client uses the GPU, NOT_SUPPORTED
  // where the host exposes no reset (a reboot is required).
  virtual absl::Status ResetGpu(uint32_t gpu) = 0;

  // Profile info for a profile INDEX (nvmlDeviceGetGpuInstanceProfileInfo).
  // INVALID_ARGUMENT: index >= kGpuInstanceProfileCount or no such GPU (stop enumerating);
  // NOT_SUPPORTED: this GPU has no such profile, or no MIG at all (skip it).
  virtual absl::StatusOr<GpuInstanceProfileInfo> GetGpuInstanceProfileInfo(
      uint32_t gpu, uint32_t profile_index) = 0;

  // Every legal placement of a profile ID, occupied or not, whether or not MIG is enabled
  // (nvmlDeviceGetGpuInstancePossiblePlacements_v2). INVALID_ARGUMENT: unknown profile id;
  // NOT_SUPPORTED: no MIG on this GPU.
  virtual absl::StatusOr<std::vector<mig::Placement>> GetGpuInstancePossiblePlacements(
      uint32_t gpu, uint32_t profile_id) = 0;

  // Creates a GI of profile `profile_id` at `placement`
  // (nvmlDeviceCreateGpuInstanceWithPlacement + nvmlGpuInstanceGetInfo).
  // NOT_SUPPORTED: MIG disabled; INVALID_ARGUMENT: unknown profile id or a placement the profile
  // does not list; INSUFFICIENT_RESOURCES: placement overlaps a GI, or the profile's
  // instanceCount is reached; NO_PERMISSION: not privileged.
  virtual absl::StatusOr<GpuInstanceInfo> CreateGpuInstance(uint32_t gpu, uint32_t profile_id,
                                                            const mig::Placement& placement) = 0;

  // Every GI on the GPU, all profiles, ordered by GI id (nvmlDeviceGetGpuInstances per profile).
  // NOT_SUPPORTED: MIG disabled.
  virtual absl::StatusOr<std::vector<GpuInstanceInfo>> ListGpuInstances(uint32_t gpu) = 0;

  // Destroys GI `gi_id` (nvmlGpuInstanceDestroy). NOT_FOUND: no such GI; IN_USE: it still has
  // CIs or processes; NOT_SUPPORTED: MIG disabled.
  virtual absl::Status DestroyGpuInstance(uint32_t gpu, uint32_t gi_id) = 0;

  // Creates the GI's full compute instance (the CI profile spanning all its compute slices,
  // engine profile SHARED) and returns it with its MIG device UUID
  // (nvmlGpuInstanceCreateComputeInstance + nvmlComputeInstanceGetInfo_v2 + its device's UUID).
  // NOT_FOUND: no such GI; INSUFFICIENT_RESOURCES: the GI's compute slices are taken;
  // NOT_SUPPORTED: MIG disabled.
  virtual absl::StatusOr<ComputeInstanceInfo> CreateComputeInstance(uint32_t gpu,
                                                                    uint32_t gi_id) = 0;

  // The CIs of GI `gi_id`, ordered by CI id. NOT_FOUND: no such GI; NOT_SUPPORTED: MIG disabled.
  virtual absl::StatusOr<std::vector<ComputeInstanceInfo>> ListComputeInstances(uint32_t gpu,
                                                                                uint32_t gi_id) = 0;

  // The MIG device UUID of (gpu, gi, ci). NOT_FOUND: no such GI or CI.
  virtual absl::StatusOr<std::string> GetMigDeviceUuid(uint32_t gpu, uint32_t gi_id,
                                                       uint32_t ci_id) = 0;

  // Destroys CI `ci_id` of GI `gi_id` (nvmlComputeInstanceDestroy). NOT_FOUND: no such GI or CI;
  // IN_USE: a process runs on it; NOT_SUPPORTED: MIG disabled.
  virtual absl::Status DestroyComputeInstance(uint32_t gpu, uint32_t gi_id, uint32_t ci_id) = 0;

  // Compute processes on the GPU (nvmlDeviceGetComputeRunningProcesses_v3): on a MIG GPU, those
  // of every MIG device, with gpu_instance_id/compute_instance_id set (needs root on real NVML).
  virtual absl::StatusOr<std::vector<ProcessInfo>> GetComputeProcesses(uint32_t gpu) = 0;

  // Compute processes on one MIG device. NOT_FOUND: no such GI or CI.
  virtual absl::StatusOr<std::vector<ProcessInfo>> GetMigDeviceProcesses(uint32_t gpu,
                                                                         uint32_t gi_id,
                                                                         uint32_t ci_id) = 0;

  // The MIG capability minors (/proc/driver/nvidia-caps/mig-minors on a real node; the simulator
  // generates them with the driver's formula). NOT_FOUND where the file is missing.
  virtual absl::StatusOr<MigMinors> GetMigMinors() = 0;
};

// The name go-nvlib gives a GI profile: "<slices>g.<GB>gb" plus the suffix of its profile index
// (REV1 "+me", ALL_ME "+me.all", GFX "+gfx", NO_ME "-me"), where GB = round(ceil(8*mem/total)/8 *
// ceil(total/GiB)), halves rounded away from zero. Every catalogued model reproduces its names.
std::string GpuInstanceProfileName(uint32_t profile_index, uint32_t slice_count,
                                   uint64_t memory_mib, uint64_t total_memory_bytes);

// The suffix of a profile index: "", "+me", "+me.all", "+gfx" or "-me".
std::string_view ProfileIndexSuffix(uint32_t profile_index);

// Enumerates every profile GPU `gpu` supports (indices 0.. until INVALID_ARGUMENT, skipping
// NOT_SUPPORTED) with its placements, as mig::ProfileSpec with the go-nvlib name; ordered by
// profile index. Errors from GetGpu/GetGpuInstancePossiblePlacements pass through.
absl::StatusOr<std::vector<mig::ProfileSpec>> DiscoverProfiles(Nvml& nvml, uint32_t gpu);

// DiscoverProfiles plus the GPU's name, memory and axis: what the placement core needs.
// placement_units = max(start+size); compute_slices = max(sliceCount); memory_slices =
// placement_units / smallest placement size. NOT_SUPPORTED (kUnimplemented) where the GPU has no
// MIG profiles.
absl::StatusOr<mig::GpuCapability> DiscoverCapability(Nvml& nvml, uint32_t gpu);

}  // namespace dynmig::nvml
