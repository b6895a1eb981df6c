// `dynmig gpu mode --node N --gpu UUID|INDEX --to mig|hami-core [--reason TEXT]`: an operator asks
// the device plugin of node N to switch one GPU's MIG mode, by writing one entry of the Node
// annotation dynmig.io/gpu-mode-request (by "operator:<user>"; protocol/gpu_mode_switch.h,
// docs/mig-mode.md); `dynmig gpu mode --node N` shows every GPU's mode status
// (dynmig.io/gpu-mode, written by the device plugin) and any request for it. See
// docs/operations.md (MIG mode switches).
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kube/kube_client.h"
#include "ops/report.h"
#include "protocol/gpu_mode.h"

namespace dynmig::ops {

struct GpuModeOptions {
  std::string node;
  std::string gpu;                      // a GPU UUID or its NVML index on the node; "" = show
  std::optional<protocol::GpuMode> to;  // unset: show
  std::string reason;                   // optional, for people
  std::string by;                       // who asks ($USER): recorded as "operator:<by>"
  absl::Time now;                       // the request's `at` (milliseconds)
};

// Show: json {"node","gpus":[{"index","gpu","status":{...}|null,"request":{...}|null,
// "held":bool}]}.
// Request: resolves the GPU from hami.io/node-nvidia-register, reads the device plugin's status
// (the GPU must have one, and be switchable), replaces this GPU's entry of the request annotation
// (the others are kept) and writes it under the node's resourceVersion, only while no pod holds
// the node lock (hami.io/mutex.lock younger than 5 minutes): one patch that a concurrent lock
// taken by the scheduler makes conflict (retried). Nothing is written when the GPU already is in
// that mode with no request. json: {"node","gpu","index","to","at","changed"}.
// Errors: kNotFound (no such node or GPU), kInvalidArgument (a bad reason, an existing request
// annotation that does not decode: named, left as it is), kFailedPrecondition (no status
// published: switching not configured there; the GPU not switchable; the node locked by a pod),
// the client's.
absl::StatusOr<CommandOutput> RunGpuMode(kube::KubeClient& client, const GpuModeOptions& options);

}  // namespace dynmig::ops
