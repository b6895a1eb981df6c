// `dynmig chaos`: the whole local system (LocalCluster) under a seeded random workload with
// injected faults and restarts, while the promise is checked continuously against NVML and the
// API:
//   - no two live instances on a GPU overlap;
//   - a pod that stays Running across a check has every instance its annotation names, on the GPU
//     and slices it names, and its containers see only MIG devices of its annotation;
//   - no two pods' reservations (hami.io/vgpu-mig-allocations) share a slice.
// Then quiescence: faults off, every part running, every pod deleted; within a bounded time no
// instance, pod, node lock or held slice may remain.
//
// Actions, drawn from the seed (it fixes every random choice, and the kind of action of every
// step; the components' thread timing still differs between runs, so a replay is close, not
// exact): create a pod (1 or 2 instances, sizes from 1g to 7g by memory or percentage, a
// preference sometimes, two containers or an init container sometimes, short jobs, names reused
// as a StatefulSet does), delete a pod at whatever phase it is in, an NVML error on the nth call
// of an NVML operation on a node (the checker's own NVML reads count too, as another nvidia-smi
// would), an API error (500, 503, 409, 429 with Retry-After) for a component's requests, an API
// timeout (a request held past the components' 3 s client timeout, then carried out), a cut of
// every open watch (informers re-watch) or a cut after compacting the history (410 Gone: they
// relist), an API outage (every request of everyone answered 503 for 2-5 s), a device plugin
// armed to crash at one of its crash points (deviceplugin/plugin_core.h; the supervisor restarts
// it), a crash of the leading scheduler replica (two replicas under leader election; its Lease is
// not handed back), a step of the scheduler's clock (past the 30 s reservation TTL, half of it,
// back, or behind), a restart of a device plugin or of both scheduler replicas; with `handover`,
// a restart of the handed-over node's kubelet stand-in too.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace dynmig::local {

struct ChaosOptions {
  uint64_t seed = 1;
  absl::Duration duration = absl::Seconds(90);  // of the random phase; quiescence comes after
  std::string nodes = "node-a=A100-SXM4-40GBx2,node-b=H100 80GBx1";
  // Required: a new directory (removed at the end) or an empty one; a non-empty one is refused.
  std::string state_dir;
  absl::Duration step = absl::Milliseconds(200);  // between actions
  absl::Duration quiesce_timeout = absl::Seconds(60);
  size_t max_pods = 10;  // creates are skipped while this many pods exist
  // Handover without draining (issue 29): the first node starts with a legacy world (this fixed
  // geometry on its GPUs, NVIDIA's device-plugin stand-in, dynmig's plugin held back), one legacy
  // pod per instance runs (nvidia.com/mig-<profile>), then the stand-in stops and dynmig's plugin
  // takes the node over; the random phase also restarts that node's kubelet stand-in. Checked
  // besides: a legacy pod Running across a check keeps its instance, and no reservation overlaps
  // it. Legacy pods are deleted like any pod (their instances must then be reclaimed).
  bool handover = false;
  std::string handover_geometry = "1g.5gb=2,2g.10gb=1";
  // MIG mode switches (issue 31): nvidia.migModeSwitching on for every GPU; the random phase also
  // writes dynmig.io/gpu-mode-request for a random GPU (to mig or hami-core, as `dynmig gpu mode`
  // does) and arms the device plugins' switch crash points (before/after SetMigMode, before the
  // reset, before the set-back, before publishing). Checked besides: a pod Running across a check
  // is on a GPU whose MIG mode is on (never switched under it), and no live instance is on a GPU
  // with MIG off; at quiescence no GPU is left with a pending mode.
  bool mode_switches = false;
  // Progress and every violation, one line each. May be empty.
  std::function<void(const std::string&)> log;
  // The components' event lines (LocalClusterOptions::log), for debugging a seed. May be empty.
  std::function<void(const std::string&)> component_log;
};

struct ChaosViolation {
  uint64_t seed = 0;
  int64_t step = 0;  // -1: quiescence
  std::string what;
};

struct ChaosReport {
  uint64_t seed = 0;
  int64_t steps = 0;
  // "create", "nvml-fault CreateGpuInstance", "api-timeout", "device-plugin crash after-intent",
  // "scheduler crash", "clock-jump forward", ...
  std::map<std::string, int64_t> actions;
  int64_t pods_created = 0;
  int64_t pods_running_seen = 0;  // distinct pod UIDs seen Running
  int64_t checks = 0;             // invariant checks run
  absl::Duration quiesce_time;
  std::vector<ChaosViolation> violations;

  bool ok() const { return violations.empty(); }
  // The sum of the actions whose name starts with `prefix` ("nvml-fault", "clock-jump", ...).
  int64_t Total(std::string_view prefix) const;
  // Several lines: what was done, what was checked, every violation with its seed and step.
  std::string Summary() const;
};

// Runs the soak on `clock` (its steps, its quiescence deadline; the scheduler's clock is `clock`
// with the offset the clock jumps step). Errors: the cluster did not start (bad nodes, ports),
// state_dir is unset or not empty; violations are in the report, not errors.
absl::StatusOr<ChaosReport> RunChaos(const ChaosOptions& options, const Clock& clock);

}  // namespace dynmig::local
