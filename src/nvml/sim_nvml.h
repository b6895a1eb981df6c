// SimNvml: a strict, persistent NVML simulator for every catalogued GPU model.
//
// Strict like hardware (mig-facts.md section 7): MIG mode must be on to create, list or destroy
// instances; only a profile's listed placements are legal (else NVML_ERROR_INVALID_ARGUMENT); an
// overlap or a full instanceCount is NVML_ERROR_INSUFFICIENT_RESOURCES; GI ids come from the
// model's swizzId table (optionally the swapped-halves layout some boards report); CI ids are the
// lowest free 0..7; destroying a GI with CIs, or a CI (GI) with an attached process, is
// NVML_ERROR_IN_USE; MIG UUIDs are "MIG-" + a version-5 UUID derived from (GPU UUID, GI id, CI id),
// so they are stable across destroy and re-create. Ampere GPUs keep a MIG mode change pending until
// ResetGpu; later architectures apply it at once.
//
// Persistent: with a state file, the whole state (GPUs, instances, processes, faults) lives in that
// JSON file. Every mutating call takes an exclusive flock on "<state>.lock", reloads, applies and
// saves atomically (write "<state>.tmp.<pid>", fsync, rename, fsync the directory); reads reload
// when the file changed. So a restarted process sees the same instances and concurrent processes
// never lose an update. Without a state file the state is in memory.
//
// Fault injection: InjectFault makes the nth call of an operation (counted from injection, across
// every process sharing the state file) fail with an NVML code; SetLatency delays every call of an
// operation. Both are stored in the state file. Operation names are kSimOperations.
//
// Latency model (SimNvmlOptions::latency, not stored): creating and destroying GPU and compute
// instances takes the model's time for the GPU's catalogue model. Such calls on one GPU run one
// at a time (an assumption: the driver applies one MIG reconfiguration of a GPU at a time); calls
// on different GPUs overlap.
//
// Delays (injected latency and the latency model) are sleeps on SimNvmlOptions::clock, so a test
// with a FakeClock decides when they end.
//
// Thread-safe: calls on one object are serialized by a mutex; objects and processes sharing a
// state file are serialized by the file lock.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "mig/catalogue.h"
#include "mig/nvml_latency.h"
#include "nvml/nvml.h"

namespace dynmig::nvml {

namespace sim {
struct State;
}  // namespace sim

// The operations faults and latency apply to: the Nvml methods, by name.
inline constexpr std::string_view kSimOperations[] = {
    "DeviceCount",
    "GetGpu",
    "GetGpuInstanceProfileInfo",
    "GetGpuInstancePossiblePlacements",
    "CreateGpuInstance",
    "ListGpuInstances",
    "DestroyGpuInstance",
    "CreateComputeInstance",
    "ListComputeInstances",
    "GetMigDeviceUuid",
    "DestroyComputeInstance",
    "GetComputeProcesses",
    "GetMigDeviceProcesses",
    "GetMigMinors",
    "GetMigMode",
    "SetMigMode",
    "ResetGpu",
};

// A scripted failure: calls nth .. nth+times-1 of `op` (counting from 1 at injection; only calls
// on `gpu` when set) fail with `code` and change nothing. times == 0: every call from the nth on.
struct SimFault {
  std::string op;
  uint32_t nth = 1;
  uint32_t times = 1;
  NvmlReturn code = NvmlReturn::kUnknown;
  std::optional<uint32_t> gpu;
  uint32_t calls = 0;  // calls of `op` seen since injection (kept in the state)
};

// Another NVML client holding GPU instance `gi` of GPU `gpu` open (SimNvml::HoldGpuInstance).
struct SimHolder {
  uint32_t gpu = 0;
  uint32_t gi = 0;
  std::string name;  // "dcgm", ...: the simulator's label; NVML itself never names the holder
};

struct SimNvmlOptions {
  // "A100-SXM4-40GBx2,H100 80GBx1": comma-separated MODEL[xCOUNT], MODEL matched with
  // mig::FindModel, COUNT (default 1) after the last 'x'. May be empty when state_file exists.
  std::string spec;
  // JSON state file; empty = in memory. Created from `spec` when missing, with any missing parent
  // directories.
  std::string state_file;
  // Seeds the GPU UUIDs (use the node name so that nodes differ). Used when creating the state.
  std::string seed = "dynmig-sim";
  // GPUs (by index) that report GI ids in the swapped-halves layout. Used when creating the state.
  std::vector<uint32_t> swapped_halves_gpus;
  // GPUs (by index) on a host without GPU reset (SetRebootRequired). Used when creating the state.
  std::vector<uint32_t> reboot_required_gpus;
  // The clock the delays sleep on (injected latency, the latency model); must outlive the
  // simulator. null = RealClock().
  const Clock* clock = &RealClock();
  // fsync the state file and its directory on every save (crash safety). Tests that create
  // thousands of instances turn it off; the rename keeps every save atomic either way.
  bool fsync = true;
  // Whether HasDeviceNodes() claims the device nodes of the driver's layout (/dev/nvidia<minor>,
  // /dev/nvidia-caps/nvidia-cap<n>) for the simulated devices. Off by default: they do not exist on
  // the host. Tests of the answer's device list turn it on.
  bool device_nodes = false;
  // How long GI/CI creation and destruction, MIG mode changes and GPU resets take, per model
  // (mig/nvml_latency.h). Zero: instant.
  mig::NvmlLatency latency;
};

// Simulated GPUs without MIG, for nodes that mix them with MIG GPUs: "Tesla T4" and "NVIDIA L4"
// (spec names "T4", "L4"). NVML on them: GetMigMode says unsupported, SetMigMode and the GPU
// instance calls are NOT_SUPPORTED, no profile exists. Not in mig::Catalogue() (MIG models only).
const std::vector<mig::CatalogueModel>& NonMigSimModels();
// The non-MIG model a spec name means ("T4", "Tesla T4", "nvidia l4"), or nullptr.
const mig::CatalogueModel* FindNonMigSimModel(std::string_view query);

// Parses a spec into one catalogue model per GPU, in order. A name that is no catalogue model may
// be a non-MIG model (NonMigSimModels). InvalidArgument names a bad count,
// an empty spec or more than 32 GPUs; unknown or ambiguous models keep FindModel's error.
absl::StatusOr<std::vector<const mig::CatalogueModel*>> ParseSimSpec(std::string_view spec);

// Deterministic identities of simulated GPUs.
std::string SimGpuUuid(std::string_view seed, uint32_t index);  // "GPU-xxxxxxxx-..."
std::string SimPciBusId(uint32_t index);                        // "00000000:07:00.0"
// "MIG-" + version-5 UUID of (GPU UUID, GI id, CI id).
std::string SimMigUuid(std::string_view gpu_uuid, uint32_t gi_id, uint32_t ci_id);

class SimNvml final : public Nvml {
 public:
  // Loads the state file, or creates it (and its directory must exist) from options.spec.
  // InvalidArgument: bad spec, or neither spec nor an existing state file; FailedPrecondition: the
  // state file holds other GPUs than the spec, or cannot be parsed (its path and reason named).
  static absl::StatusOr<std::unique_ptr<SimNvml>> Create(SimNvmlOptions options);
  ~SimNvml() override;

  SimNvml(const SimNvml&) = delete;
  SimNvml& operator=(const SimNvml&) = delete;

  // Nvml
  std::string Description() const override;
  bool HasDeviceNodes() const override { return options_.device_nodes; }
  absl::StatusOr<uint32_t> DeviceCount() override;
  absl::StatusOr<GpuInfo> GetGpu(uint32_t gpu) override;
  absl::StatusOr<MigModeState> GetMigMode(uint32_t gpu) override;
  // nvmlDeviceSetMigMode as the driver does it: NOT_SUPPORTED on a GPU without MIG; IN_USE while
  // the GPU has GPU instances or processes (nothing changes). Otherwise the mode becomes pending
  // and the activation says what applies it: SUCCESS where it is current now (Hopper and later,
  // or the mode it already had), IN_USE on Ampere (a GPU reset: ResetGpu), RESET_REQUIRED on a
  // reboot-required GPU (SetRebootRequired: only RebootHost). Takes the model's set-mig-mode time
  // (SimNvmlOptions::latency) on the clock.
  absl::StatusOr<MigModeChange> SetMigMode(uint32_t gpu, bool enabled) override;
  // The host's GPU reset: applies a pending MIG mode and drops every GI. IN_USE while processes
  // run or another client holds a GI; NOT_SUPPORTED on a reboot-required GPU. Takes the model's
  // reset-gpu time on the clock.
  absl::Status ResetGpu(uint32_t gpu) override;
  absl::StatusOr<GpuInstanceProfileInfo> GetGpuInstanceProfileInfo(uint32_t gpu,
                                                                   uint32_t profile_index) override;
  absl::StatusOr<std::vector<mig::Placement>> GetGpuInstancePossiblePlacements(
      uint32_t gpu, uint32_t profile_id) override;
  absl::StatusOr<GpuInstanceInfo> CreateGpuInstance(uint32_t gpu, uint32_t profile_id,
                                                    const mig::Placement& placement) override;
  absl::StatusOr<std::vector<GpuInstanceInfo>> ListGpuInstances(uint32_t gpu) override;
  absl::Status DestroyGpuInstance(uint32_t gpu, uint32_t gi_id) override;
  absl::StatusOr<ComputeInstanceInfo> CreateComputeInstance(uint32_t gpu, uint32_t gi_id) override;
  absl::StatusOr<std::vector<ComputeInstanceInfo>> ListComputeInstances(uint32_t gpu,
                                                                        uint32_t gi_id) override;
  absl::StatusOr<std::string> GetMigDeviceUuid(uint32_t gpu, uint32_t gi_id,
                                               uint32_t ci_id) override;
  absl::Status DestroyComputeInstance(uint32_t gpu, uint32_t gi_id, uint32_t ci_id) override;
  absl::StatusOr<std::vector<ProcessInfo>> GetComputeProcesses(uint32_t gpu) override;
  absl::StatusOr<std::vector<ProcessInfo>> GetMigDeviceProcesses(uint32_t gpu, uint32_t gi_id,
                                                                 uint32_t ci_id) override;
  absl::StatusOr<MigMinors> GetMigMinors() override;

  // Test helpers (also `dynmig nvml --sim ...` subcommands).

  // The host reboots: every process, holder and GPU instance is gone, every pending MIG mode is
  // applied (the reboot-required GPUs' included).
  absl::Status RebootHost();
  // Marks GPU `gpu` as on a host that exposes no GPU reset (pass-through VM), or clears the mark.
  // Stored in the state file. INVALID_ARGUMENT: no such GPU.
  absl::Status SetRebootRequired(uint32_t gpu, bool required);
  // Attaches a process (standing for CUDA work) to a MIG device or a whole GPU, by UUID.
  // NOT_FOUND: no such UUID. Attaching the same pid again updates its memory.
  absl::Status AttachProcess(std::string_view uuid, uint32_t pid, uint64_t used_memory_mib = 0);
  // NOT_FOUND: no such UUID, or the pid is not attached there.
  absl::Status DetachProcess(std::string_view uuid, uint32_t pid);
  // An external client (DCGM, a monitoring agent: `holder`) opens GI `gi` and keeps it open:
  // DestroyGpuInstance (and ResetGpu) then fail with NVML_ERROR_IN_USE, "in use by another
  // client", as the driver does on H100/H200, until ReleaseGpuInstance. No NVML call lists the
  // holder (it runs no compute process). Stored in the state file, so another process (`dynmig
  // nvml --state F hold`) can inject it. NOT_FOUND: no such GI; INVALID_ARGUMENT: a holder name
  // that is not 1..64 of [A-Za-z0-9._-], or 16 holders on the GPU already.
  absl::Status HoldGpuInstance(uint32_t gpu, uint32_t gi, std::string_view holder);
  // The holder lets go (every holder of the GI when `holder` is empty). NOT_FOUND: none held it.
  absl::Status ReleaseGpuInstance(uint32_t gpu, uint32_t gi, std::string_view holder);
  // Every holder, by GPU.
  absl::StatusOr<std::vector<SimHolder>> Holders();
  // Creates a CI of `slices` compute slices (CI profile id = NVML CI profile index) in a GI:
  // NOT_SUPPORTED for a CI size the GI does not offer, INSUFFICIENT_RESOURCES when no range of
  // compute slices is free. Counts as a CreateComputeInstance call.
  absl::StatusOr<ComputeInstanceInfo> CreateComputeInstanceWithSlices(uint32_t gpu, uint32_t gi_id,
                                                                      uint32_t slices);
  // InvalidArgument: unknown op (the message lists kSimOperations), nth == 0, or code SUCCESS.
  absl::Status InjectFault(SimFault fault);
  // Delays every call of `op`; zero removes the delay.
  absl::Status SetLatency(std::string_view op, std::chrono::milliseconds latency);
  // Removes every fault and latency.
  absl::Status ClearFaults();
  // Pending faults, with their call counters.
  absl::StatusOr<std::vector<SimFault>> Faults();

  // The spec this simulator was created with (from the state file when options.spec was empty).
  std::string spec() const;
  const std::string& state_file() const { return options_.state_file; }

 private:
  explicit SimNvml(SimNvmlOptions options);

  struct FileStamp {
    uint64_t generation = 0;
    uint64_t inode = 0;
    int64_t size = -1;
    int64_t mtime_ns = 0;
    int64_t ctime_ns = 0;
    bool operator==(const FileStamp&) const = default;
  };

  absl::Status Init() ABSL_LOCKS_EXCLUDED(mu_);
  // Reloads the state file if it changed (or always, with force).
  absl::Status Refresh(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes state atomically and bumps the generation. The file lock must be held too.
  absl::Status Save(const sim::State& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<FileStamp> CurrentStamp();

  // Runs one operation: latency (sleeping on the clock, holding the GPU's reconfiguration lock
  // when the latency model applies), then Apply.
  template <typename T>
  absl::StatusOr<T> Call(std::string_view op, std::optional<uint32_t> gpu, bool mutating,
                         std::string_view context,
                         const std::function<absl::StatusOr<T>(sim::State&)>& fn)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The operation after its delay: fault counting, then fn on the state (a copy for mutations,
  // committed and saved only when fn succeeds).
  template <typename T>
  absl::StatusOr<T> Apply(std::string_view op, std::optional<uint32_t> gpu, bool mutating,
                          std::string_view context,
                          const std::function<absl::StatusOr<T>(sim::State&)>& fn)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Counts this call of `op` against the faults that apply to it (`counted`: whether faults are
  // counted now; a file-backed state counts only under the file lock). Returns the code of a
  // fault that fires; sets `changed` when a counter moved.
  std::optional<NvmlReturn> CountFaults(std::string_view op, std::optional<uint32_t> gpu,
                                        bool counted, bool& changed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CallStatus(std::string_view op, std::optional<uint32_t> gpu,
                          std::string_view context,
                          const std::function<absl::Status(sim::State&)>& fn);

  SimNvmlOptions options_;
  const Clock& clock_;
  mutable dynmig::Mutex mu_;
  std::unique_ptr<sim::State> state_ ABSL_GUARDED_BY(mu_) ABSL_PT_GUARDED_BY(mu_);
  FileStamp stamp_ ABSL_GUARDED_BY(mu_);  // of the loaded file
  int lock_fd_ = -1;  // "<state>.lock", opened by Init, open for the object's lifetime
  // One MIG reconfiguration per GPU at a time, while the latency model delays it. Acquired
  // before mu_.
  std::array<dynmig::Mutex, 32> gpu_mu_;
};

}  // namespace dynmig::nvml
