// When an idle GPU should change mode between MIG ("mig") and whole-GPU ("hami-core"): the pure
// decision of issue 31 phase 2, step 3 (docs/mig-mode.md). The scheduler's leader feeds it one
// round at a time (scheduler/mode_switcher.h); `dynmig simulate` can feed it the same way. No I/O,
// no clock: `now` is an input. Pure; thread-compatible.
//
// Inputs, per node: its GPUs (mode, MIG capability, the device plugin's `switchable`, since when
// it is in its mode, whether it is idle and whether a switch is under way) and whether the
// operator's configuration allows each to switch (MigModeSwitching::MaySwitch). Cluster-wide:
// the demand, i.e. the pending pods that no GPU of their mode fits now (whole-GPU pods and MIG
// pods, with what they need), and which of those demands were already seen in the previous round.
//
// The rules, in order:
//   1. A GPU may switch only when the configuration allows it, it has MIG (a GPU without MIG is
//      whole for good), the device plugin says it is switchable (a switch that needs a reboot or a
//      reset the node cannot do makes it not switchable), it is idle (no reservation, instance,
//      held or warm slice), no switch is under way on it, and it has kept its mode at least
//      `min_mode_duration` (hysteresis: since + min_mode_duration <= now).
//   2. A demand counts only when it was seen in the previous round too (one pod appearing once
//      does not flap a GPU); `PlanModeSwitches` returns the keys to pass as `seen` next round.
//   3. Switches under way count as supply: a GPU already switching to the wanted mode serves the
//      demand it was asked for, so no second GPU is switched for it.
//   4. Never switch away the last GPU of a mode that a pending pod needs (any demand of that mode,
//      confirmed or not), counting the GPUs in that mode or switching to it, cluster-wide.
//   5. At most one switch per node per round; each demand is served by at most one switch per
//      round. A whole-GPU pod is served on one node only, one whose whole GPUs (idle, switching to
//      whole, or candidates to switch) can reach what it needs; a pod that wants more whole GPUs
//      than any node can offer is never served (no switch for it). A MIG GPU offers `mig_slots`
//      instances (its model's count of the smallest profile): pods are counted against that.
//   6. Preference among the candidates of a node: a GPU that switches without a reset (Hopper and
//      later: SwitchesWithoutReset), then the one that has kept its mode longest, then the lowest
//      index. Among nodes for a demand: the one needing the fewest further switches, then a node
//      whose best candidate needs no reset, then name order.
// Work is bounded: at most kMaxModeDemands demands are considered (the rest are reported as
// skipped), each looks at every node once, and each node at its GPUs once.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace dynmig::mig {

enum class ModeKind : uint8_t {
  kMig = 0,    // MIG mode on ("mig")
  kWhole = 1,  // MIG mode off, the GPU handed out whole ("hami-core")
};
std::string_view ModeKindName(ModeKind mode);  // "mig" / "hami-core"

// Whether a GPU of this NVML name applies a MIG mode change without a GPU reset (Hopper and
// later: H100, H200, H20, H800, GH200, B200, GB200, B100, RTX PRO 6000 Blackwell). Ampere (A100,
// A30) keeps the change pending until a reset.
bool SwitchesWithoutReset(std::string_view nvml_name);

struct ModeGpu {
  std::string uuid;
  uint32_t index = 0;
  std::string model;  // NVML name
  ModeKind mode = ModeKind::kMig;
  bool mig_capable = true;
  bool may_switch = false;            // the configuration allows it (MaySwitch)
  bool switchable = false;            // the device plugin's word (dynmig.io/gpu-mode)
  std::string not_switchable_reason;  // the plugin's reason when not switchable
  int64_t since_ms = 0;               // when it entered its mode
  bool idle = false;                  // no reservation, instance, held or warm slice
  std::string busy_reason;            // why not idle ("" when idle)
  bool switching = false;             // a request it has not answered yet
  ModeKind switching_to = ModeKind::kMig;
  uint64_t memory_mib = 0;  // for whole-GPU pods that ask a memory floor
  uint32_t mig_slots = 7;   // instances of the smallest profile it offers in MIG mode
};

struct ModeNode {
  std::string name;
  std::vector<ModeGpu> gpus;
};

// A pending pod that no GPU of its mode fits now.
struct ModeDemand {
  std::string pod;  // namespace/name (the key carried from round to round, with the mode)
  ModeKind wants = ModeKind::kMig;
  uint32_t gpus = 1;            // whole GPUs on one node (kWhole); MIG instances (kMig)
  uint64_t min_memory_mib = 0;  // whole GPUs: the floor each must have
};

inline constexpr size_t kMaxModeDemands = 1024;

struct ModePlanInput {
  std::vector<ModeNode> nodes;
  std::vector<ModeDemand> demand;  // in the order to serve (oldest first)
  int64_t now_ms = 0;
  int64_t min_mode_duration_ms = 10 * 60 * 1000;
  std::set<std::string> seen;  // DemandKey()s of the previous round
};

// "mig:ns/name" / "hami-core:ns/name".
std::string DemandKey(const ModeDemand& demand);

struct ModeSwitchDecision {
  std::string node;
  std::string gpu_uuid;
  uint32_t index = 0;
  ModeKind to = ModeKind::kMig;
  std::vector<std::string> pods;  // the demands it serves
  std::string reason;             // for people: "2 MIG pods wait (default/a, ...)"
};

// Why a GPU did not switch this round (`dynmig explain`, metrics). Codes: not-allowed (config),
// no-mig, not-switchable (the plugin's reason: needs a reset/reboot), in-use, switching,
// hysteresis (until_ms), last-of-mode, no-demand (nothing waits that it could serve),
// demand-unconfirmed (the demand is new this round), node-busy (another switch on the node this
// round), not-needed (the demand is served elsewhere), switch (chosen).
struct ModeGpuVerdict {
  std::string node;
  std::string gpu_uuid;
  uint32_t index = 0;
  std::string code;
  std::string detail;
  int64_t until_ms = 0;  // hysteresis: when it may switch
};

struct ModePlan {
  std::vector<ModeSwitchDecision> switches;
  std::vector<ModeGpuVerdict> verdicts;  // one per GPU of the input, in input order
  std::set<std::string> seen;            // pass as ModePlanInput::seen next round
  size_t skipped_demands = 0;            // beyond kMaxModeDemands
};

// The rules above. Deterministic: the same input gives the same plan.
ModePlan PlanModeSwitches(const ModePlanInput& input);

// The reasons a GPU could not switch now, whatever the demand (rule 1): empty code when it could.
ModeGpuVerdict GpuEligibility(const ModeNode& node, const ModeGpu& gpu, int64_t now_ms,
                              int64_t min_mode_duration_ms);

}  // namespace dynmig::mig
