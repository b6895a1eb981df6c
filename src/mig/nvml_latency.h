// How long the NVML calls that change a GPU's MIG layout take, per GPU model: the latency model of
// the NVML simulator (SimNvml), the local mode, the burst benchmark and `dynmig simulate`.
//
// Text form (flags --sim-latency / --nvml-latency): comma-separated items, later ones win:
//   none                      every call instant (the default of the tests)
//   realistic                 RealisticNvmlLatency()
//   OP=DURATION               for every model; OP: create-gi, destroy-gi, create-ci, destroy-ci,
//                             set-mig-mode, reset-gpu
//   MODEL:OP=DURATION         for one catalogue model (mig::FindModel), e.g. "A30:create-gi=80ms"
// DURATION as absl::ParseDuration reads it ("250ms", "1.5s", "0").
//
// Pure; immutable values.
#pragma once

#include <array>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dynmig::mig {

enum class NvmlOp : uint8_t {
  kCreateGpuInstance = 0,
  kDestroyGpuInstance = 1,
  kCreateComputeInstance = 2,
  kDestroyComputeInstance = 3,
  kSetMigMode = 4,  // nvmlDeviceSetMigMode (on Hopper and later it applies the mode)
  kResetGpu = 5,    // the host's GPU reset that applies a pending mode (Ampere)
};
inline constexpr size_t kNvmlOpCount = 6;
inline constexpr std::array<std::string_view, kNvmlOpCount> kNvmlOpNames = {
    "create-gi", "destroy-gi", "create-ci", "destroy-ci", "set-mig-mode", "reset-gpu"};

struct NvmlLatency {
  std::array<absl::Duration, kNvmlOpCount> all{};  // every model
  // Overrides by catalogue model name (CatalogueModel::capability.model).
  std::map<std::string, std::array<std::optional<absl::Duration>, kNvmlOpCount>, std::less<>>
      by_model;

  absl::Duration Of(NvmlOp op, std::string_view model) const;
  // Creating one instance: a GPU instance and its compute instance.
  absl::Duration Create(std::string_view model) const {
    return Of(NvmlOp::kCreateGpuInstance, model) + Of(NvmlOp::kCreateComputeInstance, model);
  }
  // Destroying one: the compute instance, then its GPU instance.
  absl::Duration Destroy(std::string_view model) const {
    return Of(NvmlOp::kDestroyComputeInstance, model) + Of(NvmlOp::kDestroyGpuInstance, model);
  }
  // Changing a GPU's MIG mode: SetMigMode, plus the GPU reset on a model whose change waits for
  // one (`needs_reset`: Ampere).
  absl::Duration MigModeSwitch(std::string_view model, bool needs_reset) const {
    return Of(NvmlOp::kSetMigMode, model) +
           (needs_reset ? Of(NvmlOp::kResetGpu, model) : absl::ZeroDuration());
  }
  bool IsZero() const;
  // The text form, "none" when zero ("create-gi=1s,create-ci=500ms,...").
  std::string ToString() const;
};

// The "realistic" preset. The only published figure is HAMi's: about 1.5 s per allocation (GI and
// CI creation) on real GPUs (HAMi PR #2910). Its split, create-gi 1 s and create-ci 500 ms, and the
// destroy times (destroy-ci 200 ms, destroy-gi 300 ms) are assumptions until measured. No public
// figure exists for MIG mode changes either: set-mig-mode 2 s (the driver tears down and rebuilds
// the GPU's MIG state) and reset-gpu 10 s (a GPU reset re-initialises the whole board, as
// `nvidia-smi --gpu-reset` does) are estimates, so a switch takes about 2 s on Hopper and later
// and about 12 s on Ampere, where the mode waits for a reset.
NvmlLatency RealisticNvmlLatency();

// InvalidArgument naming the bad item: unknown operation (the valid ones listed), bad or negative
// duration, unknown or ambiguous model (FindModel's message), an empty item.
absl::StatusOr<NvmlLatency> ParseNvmlLatency(std::string_view text);

}  // namespace dynmig::mig
