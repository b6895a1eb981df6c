// `dynmig validate --canary`: runs the migration guide's canary pod through its whole lifecycle
// and reports each step (items "canary-<step>" in the validate report):
//
//   canary-create     create `mig-canary` (nvidia.com/vgpu-mode: mig, 1 GPU, gpumem 4500 MiB,
//                     `sleep 3600`, restartPolicy Never; it tolerates the unschedulable taint so
//                     it can run on the cordoned node under validation, and is pinned to --node
//                     by node affinity on metadata.name). A pod of that name that already exists is
//                     never touched: FAIL.
//   canary-running    wait (bounded) until Running; Failed or timeout: FAIL with the pod's
//                     conditions and status message; Running on another node than --node: FAIL
//   canary-reservation / -profile / -overlap / -runtime / -visible / -nvml
//                     validate's per-pod checks on the canary
//   canary-delete     delete it and wait until it is gone
//   canary-released   no active pod holds a reservation naming the canary, and with the NVML
//                     view: wait (bounded) until its MIG instance is gone (the device plugin
//                     reclaimed the GI/CI)
//   canary-cleanup    after a failure: the canary was deleted (force, grace 0)
//
// Why 4500 MiB and not the guide's 8000: NVML reports MIG memory below the nominal profile name
// (1g.5gb has 4864 MiB on an A100-40GB), and a profile covers a request only when its NVML memory
// is at least the request; 4500 resolves to the smallest profile on A100/A30/H100-class GPUs.
//
// Only the Kubernetes API (and the NVML view endpoint) is used, so the same flow runs against a
// real cluster, the local mode, or a test's in-memory API server with a fake kubelet. Waits poll
// the API with `poll` between reads, bounded by `timeout` each, on the clock RunCanary is given.
#pragma once

#include <functional>
#include <string>

#include "absl/time/time.h"
#include "common/clock.h"
#include "kube/kube_client.h"
#include "ops/nvml_view.h"
#include "ops/report.h"
#include "protocol/device_config.h"

namespace dynmig::ops {

struct CanaryOptions {
  std::string ns = "default";
  std::string name = "mig-canary";
  std::string node;  // pin to this node ("" = wherever the scheduler puts it)
  std::string image = "ubuntu:22.04";
  uint64_t gpumem_mib = 4500;
  std::string scheduler_name;  // "" = left to the admission webhook / default scheduler
  absl::Duration timeout = absl::Minutes(2);
  absl::Duration poll = absl::Milliseconds(500);
  int64_t delete_grace_seconds = 5;
  std::function<void(const std::string&)> progress;  // one line per step as it happens; optional
};

// The canary pod object.
kube::Object CanaryPod(const CanaryOptions& options, const protocol::ResourceNames& resources);

// Runs the lifecycle, appending items (and a step log in report.notes) to `report`. Waits and the
// step log's times use `clock` (monotonic time; the snapshots are taken at its wall time).
void RunCanary(kube::KubeClient& client, NvmlSource* nvml, const CanaryOptions& options,
               const protocol::DeviceConfig& config, const Clock& clock, CheckReport& report);

}  // namespace dynmig::ops
