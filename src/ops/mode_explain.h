// `dynmig explain`'s part about GPU mode switches (issue 31, docs/mig-mode.md): for a pending pod
// that needs GPUs in one mode (MIG, or whole-GPU "hami-core"), per GPU of every node whose device
// plugin publishes dynmig.io/gpu-mode in the other mode, why it does not switch for the pod: not
// allowed by the configuration, no MIG, in use, hysteresis until T, needs a reset or a reboot
// (the plugin's word), or that it is switching now ("switching" in the pod's trail) or could
// switch (the leader does once the demand persists). The same eligibility rules as the scheduler's
// mode switcher (mig::GpuEligibility). Reads the snapshot only; bounded by its nodes and the
// annotations' own bounds. Pure; thread-compatible.
#pragma once

#include <string>
#include <string_view>

#include "absl/time/time.h"
#include "mig/mode_planner.h"
#include "nlohmann/json.hpp"
#include "ops/cluster.h"
#include "protocol/gpu_mode.h"

namespace dynmig::ops {

struct ModeSwitchExplanation {
  nlohmann::json json;  // {"enabled":bool,"gpus":[{"node","gpu","index","mode","code","reason"}]}
  std::string text;     // "" when switching is off and no node publishes a GPU mode
};

ModeSwitchExplanation ExplainModeSwitches(const ClusterSnapshot& snap,
                                          const protocol::MigModeSwitching& config,
                                          mig::ModeKind wants, absl::Time now);

}  // namespace dynmig::ops
