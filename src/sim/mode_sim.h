// Per-GPU MIG mode in `dynmig simulate` (issue 31): a mixed workload of whole-GPU pods and MIG
// pods on GPUs that are each in MIG mode or whole ("hami-core"), comparing fixed pools with
// switching on demand. docs/simulate.md, "MIG mode switching".
//
//   pools:K              the first K GPUs (node order) are whole for good, the rest MIG; nothing
//                        ever switches (an operator's fixed split)
//   dynmig:mode-switch   every GPU starts in MIG mode; the scheduler's switch decision
//                        (mig::PlanModeSwitches, the same pure core as the scheduler's leader
//                        loop) turns idle GPUs whole or back to MIG as the waiting pods ask;
//                        options joined with '+': min-DURATION (minModeDuration, 10s..24h,
//                        default 10m), interval-DURATION (the loop's period, 1s..10m, default 2s)
//
// A whole-GPU pod (TracePod::whole) takes `count` whole-mode GPUs of one node, one pod per GPU; a
// MIG pod takes instances of MIG-mode GPUs by the production planner ("dynmig" policy of
// sim/policies.h), which sees a GPU outside MIG mode (or switching) as fully occupied. A switch
// takes NvmlLatency::MigModeSwitch(model, needs_reset) (Ampere needs a reset, Hopper and later
// do not), during which the GPU takes nothing. Pods wait (FIFO with backfill, as --mode queue);
// the switch rounds run when something changed while pods wait, at most once per interval, and
// again one interval later while a demand is unconfirmed or at a GPU's hysteresis expiry (the
// only moments a round every interval could decide differently).
// Every change is checked: a whole GPU holds one pod and no instance, no pod lands on a GPU
// outside its mode or switching, only an idle GPU past its minModeDuration switches, fixed pools
// never switch. A violation is an error (the run stops). Pure; thread-compatible.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "mig/nvml_latency.h"
#include "sim/cluster.h"
#include "sim/trace.h"

namespace dynmig::sim {

struct ModePolicySpec {
  std::string name;
  bool switching = false;   // dynmig:mode-switch; else fixed pools
  uint32_t whole_gpus = 0;  // fixed pools: the first K GPUs are whole
  absl::Duration min_mode_duration = absl::Minutes(10);
  absl::Duration interval = absl::Seconds(2);
};

// Whether `spec` names a policy of this simulation ("pools:..." or "dynmig:mode-switch...").
bool IsModePolicy(std::string_view spec);
// kInvalidArgument naming what is wrong (unknown option, duration out of range, K above the
// cluster's GPUs or not a number).
absl::StatusOr<ModePolicySpec> ParseModePolicy(std::string_view spec, const Cluster& cluster);
// --pools: "K1,K2,..." or "sweep" (every K from 0 to the GPU count in steps of a node) or
// "sweep:STEP"; the "pools:K" policies, at most 1,000 of them.
absl::StatusOr<std::vector<std::string>> ExpandPools(std::string_view pools,
                                                     const Cluster& cluster);

struct ModeSimOptions {
  mig::NvmlLatency nvml_latency;         // switch times (set-mig-mode, reset-gpu)
  std::function<void(double)> progress;  // fraction done, 0..1
};

struct ModePolicyResult {
  std::string name;
  bool switching = false;
  uint32_t whole_gpus_at_start = 0;
  uint64_t accepted = 0;  // started before the end of the horizon
  uint64_t whole_accepted = 0;
  uint64_t mig_accepted = 0;
  double accepted_count = 0;     // accepted / pods
  double accepted_gpu_time = 0;  // GPUs x lifetime of accepted pods over all pods' (a MIG pod's
                                 // GPUs: its asked slices over a GPU's)
  double whole_gpu_time = 0;     // the same over whole-GPU pods only
  double mig_gpu_time = 0;       // over MIG pods only
  double pending_p50 = 0;        // seconds from arrival to start; never started: to the end
  double pending_p99 = 0;
  double pending_mean = 0;
  uint64_t never_started = 0;
  uint64_t switches_to_whole = 0;
  uint64_t switches_to_mig = 0;
  double switch_gpu_hours = 0;  // GPU-hours spent switching (taking nothing)
  double mean_whole_gpus = 0;   // time-averaged GPUs in whole mode (switching to it included)
  uint64_t rounds = 0;          // switch decision rounds run
  double seconds = 0;           // this policy's run on the given clock
};

struct ModeSimResult {
  std::string trace;
  std::string cluster;
  uint64_t gpus = 0;
  uint32_t gpus_per_node = 0;
  uint64_t pods = 0;  // simulated: whole_pods + mig_pods
  uint64_t whole_pods = 0;
  uint64_t mig_pods = 0;
  uint64_t unservable = 0;  // skipped: no profile covers them, or more whole GPUs than a node has
  uint64_t cpu_only = 0;
  double start = 0, end = 0;
  std::string nvml_latency;
  std::vector<std::string> switch_times;  // per model: "A100-SXM4-40GB 12s (reset)"
  std::vector<ModePolicyResult> policies;
  int best_pools = -1;  // index of the fixed pools with the most accepted GPU-time (ties: count)
};

absl::StatusOr<ModeSimResult> SimulateModes(const Trace& trace, const Cluster& cluster,
                                            const std::vector<std::string>& policies,
                                            const ModeSimOptions& options, const Clock& clock);

std::string FormatModeText(const ModeSimResult& result);
std::string FormatModeJson(const ModeSimResult& result);
std::string FormatModeCsv(const ModeSimResult& result);

}  // namespace dynmig::sim
