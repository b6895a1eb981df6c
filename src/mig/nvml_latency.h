// How long the NVML calls that change a GPU's MIG layout take, per GPU model: the latency model of
// the NVML simulator (SimNvml), the local mode, the burst benchmark and `dynmig simulate`.
//
// Text form (flags --sim-latency / --nvml-latency): comma-separated items, later ones win:
//   none                      every call instant (the default of the tests)
//   realistic                 RealisticNvmlLatency()
//   OP=DURATION               for every model; OP: create-gi, destroy-gi, create-ci, destroy-ci
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
};
inline constexpr size_t kNvmlOpCount = 4;
inline constexpr std::array<std::string_view, kNvmlOpCount> kNvmlOpNames = {
    "create-gi", "destroy-gi", "create-ci", "destroy-ci"};

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
  bool IsZero() const;
  // The text form, "none" when zero ("create-gi=1s,create-ci=500ms,...").
  std::string ToString() const;
};

// The "realistic" preset. The only published figure is HAMi's: about 1.5 s per allocation (GI and
// CI creation) on real GPUs (HAMi PR #2910). Its split, create-gi 1 s and create-ci 500 ms, and the
// destroy times (destroy-ci 200 ms, destroy-gi 300 ms) are assumptions until measured.
NvmlLatency RealisticNvmlLatency();

// InvalidArgument naming the bad item: unknown operation (the valid ones listed), bad or negative
// duration, unknown or ambiguous model (FindModel's message), an empty item.
absl::StatusOr<NvmlLatency> ParseNvmlLatency(std::string_view text);

}  // namespace dynmig::mig
