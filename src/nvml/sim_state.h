// Internal to the simulator: its state, the JSON form of the state file and the pure operations
// on it. Every operation validates before it mutates, so a failing call changes nothing.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mig/catalogue.h"
#include "mig/placement.h"
#include "nvml/nvml.h"
#include "nvml/sim_nvml.h"

namespace dynmig::nvml::sim {

inline constexpr int kStateVersion = 1;

struct CiState {
  uint32_t id = 0;
  uint32_t profile_id = 0;
  mig::Placement placement;  // compute slices within the GI
  std::string uuid;
};

struct GiState {
  uint32_t id = 0;
  uint32_t profile_id = 0;
  mig::Placement placement;
  std::vector<CiState> cis;  // ordered by id
};

struct ProcState {
  uint32_t pid = 0;
  uint64_t used_memory_mib = 0;
  std::optional<uint32_t> gi;  // unset: on the whole GPU
  std::optional<uint32_t> ci;
};

// Another NVML client (DCGM, a monitoring agent) holding a GPU instance open: the driver then
// refuses nvmlGpuInstanceDestroy with NVML_ERROR_IN_USE until it lets go, and no NVML call names
// it (it is not a compute process).
struct HolderState {
  uint32_t gi = 0;
  std::string name;  // for the simulator's own listing only

  friend bool operator==(const HolderState&, const HolderState&) = default;
};

struct GpuState {
  const mig::CatalogueModel* model = nullptr;
  std::string uuid;
  std::string pci_bus_id;
  uint32_t minor = 0;
  bool mig_current = true;
  bool mig_pending = true;
  bool swapped_halves = false;
  // The host exposes no GPU reset (pass-through VM): a MIG mode change stays pending, with
  // activation NVML_ERROR_RESET_REQUIRED, until RebootHost; ResetGpu is NOT_SUPPORTED.
  bool reboot_required = false;
  std::vector<GiState> gis;  // ordered by id
  std::vector<ProcState> processes;
  std::vector<HolderState> holders;  // at most kMaxHoldersPerGpu
};

struct State {
  std::string spec;
  std::string seed;
  std::vector<GpuState> gpus;
  std::vector<SimFault> faults;
  std::map<std::string, int64_t, std::less<>> latency_ms;
};

absl::StatusOr<State> NewState(std::string_view spec, std::string_view seed,
                               const std::vector<uint32_t>& swapped_halves_gpus);
std::string ToJson(const State& state);
// `source` names the file in errors.
absl::StatusOr<State> FromJson(std::string_view text, std::string_view source);

bool IsKnownOperation(std::string_view op);

// Pure operations. Each returns an NvmlStatus-built error that names the operation.
absl::StatusOr<GpuInfo> GetGpu(const State& s, uint32_t gpu);
absl::StatusOr<GpuInstanceProfileInfo> GetProfileInfo(const State& s, uint32_t gpu,
                                                      uint32_t profile_index);
absl::StatusOr<std::vector<mig::Placement>> GetPlacements(const State& s, uint32_t gpu,
                                                          uint32_t profile_id);
absl::StatusOr<GpuInstanceInfo> CreateGi(State& s, uint32_t gpu, uint32_t profile_id,
                                         const mig::Placement& placement);
absl::StatusOr<std::vector<GpuInstanceInfo>> ListGis(const State& s, uint32_t gpu);
absl::Status DestroyGi(State& s, uint32_t gpu, uint32_t gi_id);
// slices == 0: the GI's full CI.
absl::StatusOr<ComputeInstanceInfo> CreateCi(State& s, uint32_t gpu, uint32_t gi_id,
                                             uint32_t slices);
absl::StatusOr<std::vector<ComputeInstanceInfo>> ListCis(const State& s, uint32_t gpu,
                                                         uint32_t gi_id);
absl::StatusOr<std::string> MigUuid(const State& s, uint32_t gpu, uint32_t gi_id, uint32_t ci_id);
absl::Status DestroyCi(State& s, uint32_t gpu, uint32_t gi_id, uint32_t ci_id);
absl::StatusOr<std::vector<ProcessInfo>> Processes(const State& s, uint32_t gpu,
                                                   std::optional<uint32_t> gi_id,
                                                   std::optional<uint32_t> ci_id);
// Whether the GPU's model has MIG at all (a non-MIG model has no profiles).
bool HasMig(const GpuState& g);
absl::StatusOr<MigModeState> GetMigMode(const State& s, uint32_t gpu);
absl::StatusOr<MigModeChange> SetMigMode(State& s, uint32_t gpu, bool enabled);
absl::Status ResetGpu(State& s, uint32_t gpu);
// Every GPU as after a reboot: processes, holders and GPU instances gone, pending modes applied.
absl::Status RebootHost(State& s);
absl::Status SetRebootRequired(State& s, uint32_t gpu, bool required);
absl::Status Attach(State& s, std::string_view uuid, uint32_t pid, uint64_t used_memory_mib);
absl::Status Detach(State& s, std::string_view uuid, uint32_t pid);
// An external client holds GI `gi_id` open (idempotent per name). NOT_FOUND: no such GI;
// INVALID_ARGUMENT: a name that is not 1..64 of [A-Za-z0-9._-], or more than kMaxHoldersPerGpu.
absl::Status Hold(State& s, uint32_t gpu, uint32_t gi_id, std::string_view name);
// Lets go of GI `gi_id`: the holder `name`, or every holder when name is empty. NOT_FOUND: no
// such holder.
absl::Status Release(State& s, uint32_t gpu, uint32_t gi_id, std::string_view name);
inline constexpr size_t kMaxHoldersPerGpu = 16;
inline constexpr size_t kMaxHolderName = 64;

// The GI id of a placement on this GPU (identity or swapped-halves layout); nullopt where the
// model's table lacks it.
std::optional<uint32_t> GpuInstanceIdFor(const GpuState& g, const mig::Placement& placement);

}  // namespace dynmig::nvml::sim
