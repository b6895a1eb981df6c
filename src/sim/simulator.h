// The event-driven simulation behind `dynmig simulate`: every policy on the same pods, one after
// the other, on its own copy of the cluster state.
//
// Time to Running: a started pod's wait (queue mode) plus the NVML time of the reconfigurations its
// placement needed (GI and CI created, and destroyed when a policy moves instances), from the
// latency model of the GPU model it landed on. A policy that places a pod on an existing instance
// (static geometries, an idle warm instance) adds none; destroying the idle instances a placement
// overlaps adds their destroy time. The NVML time of different pods is not queued behind each
// other.
//
// Modes: reject (a pod that does not fit is lost), queue (it waits; FIFO with backfill: arrivals
// are tried at once, waiting pods are retried in order on every departure), fill (arrivals only,
// no departures, until the first rejection). Departures at the same instant as arrivals go first.
// Pure (the optional progress callback aside; `clock` only times each policy's run, for
// PolicyResult::seconds); thread-compatible.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "mig/nvml_latency.h"
#include "sim/bound.h"
#include "sim/cluster.h"
#include "sim/policies.h"
#include "sim/trace.h"

namespace dynmig::sim {

enum class Mode { kReject, kQueue, kFill };
const char* ModeName(Mode m);

struct SimOptions {
  Mode mode = Mode::kReject;
  uint32_t samples = 240;                 // points of the utilization time series
  uint32_t fragmentation_samples = 4000;  // arrivals at which fragmentation is measured (at most)
  std::function<void(double)> progress;   // fraction done, 0..1, called now and then
  mig::NvmlLatency nvml_latency;          // instant by default
  WarmConfig warm;                        // for the policies with warm instances ("dynmig:warm")
};

struct PolicyResult {
  std::string name;
  uint64_t pods = 0;
  uint64_t accepted = 0;             // placed (reject), started by the end (queue), before the
                                     // first rejection (fill)
  double accepted_count = 0;         // accepted / pods
  double accepted_slice_time = 0;    // asked units x duration of accepted pods over all pods'
  std::optional<double> gap_closed;  // (this - hami-v2.10) / (repack - hami-v2.10)
  double mean_utilization = 0;       // time-averaged used units / capacity
  double peak_utilization = 0;
  double fragmentation = 0;  // mean over arrivals: free units that cannot host the arriving
                             // request, over free units
  double pending_p50 = 0;    // seconds (queue mode); pods never started count their wait
  double pending_p99 = 0;    // until the end
  double pending_mean = 0;
  uint64_t never_started = 0;  // queue mode: still waiting at the end
  double running_p50 = 0;      // seconds from arrival to Running, started pods (reject, queue)
  double running_p99 = 0;
  double running_mean = 0;
  double nvml_mean = 0;  // of which NVML reconfiguration, mean over started pods
  uint64_t creates = 0;  // GPU instances created (static: none after setup)
  uint64_t destroys = 0;
  WarmStats warm;  // warm instances (warm.enabled: the policy models them)
  // Moves (dynmig:defrag; 0 for the others): pods evicted, waiting pods served by a move, evicted
  // pods running again, evicted pods still waiting at the end of the horizon.
  uint64_t evictions = 0;
  uint64_t moves = 0;
  uint64_t restarts = 0;
  uint64_t evicted_waiting = 0;
  double evictions_per_accepted() const {
    return accepted == 0 ? 0.0 : static_cast<double>(evictions) / static_cast<double>(accepted);
  }
  double filled = 0;                          // fill mode: asked units accepted / capacity
  std::vector<uint64_t> rejected_by_profile;  // by SimResult::profiles: pods not accepted
  std::vector<double> utilization;            // at SimResult::sample_x
  double seconds = 0;                         // time of this policy's run (Simulate's clock)
};

struct SimResult {
  std::string trace;
  std::string cluster;  // "A100-SXM4-40GB x 1000"
  Mode mode = Mode::kReject;
  uint64_t gpus = 0;
  uint64_t capacity_units = 0;
  uint64_t pods = 0;        // GPU pods simulated
  uint64_t unservable = 0;  // skipped: no allowlisted profile of any model covers them
  uint64_t cpu_only = 0;
  double start = 0, end = 0;
  std::vector<std::string> profiles;  // smallest covering profile of the pods (first model)
  std::vector<uint64_t> pods_by_profile;
  std::string sample_axis;  // "seconds" or "arrivals"
  std::vector<double> sample_x;
  std::vector<PolicyResult> policies;
  bool has_gap = false;            // both hami-v2.10 and repack ran
  double gap_span = 0;             // repack - hami-v2.10 (slice-time; filled in fill mode)
  std::optional<FillBound> bound;  // fill mode, one model
  std::string bound_note;          // why there is no bound
  std::string nvml_latency;        // the latency model, as text ("none", "create-gi=1s,...")
  std::optional<WarmConfig> warm;  // when a policy has warm instances
};

absl::StatusOr<SimResult> Simulate(const Trace& trace, const Cluster& cluster,
                                   const std::vector<std::string>& policies,
                                   const SimOptions& options, const Clock& clock);

}  // namespace dynmig::sim
