// `dynmig gpu cordon|uncordon --node N --gpu UUID|INDEX [--reason TEXT]`: the per-GPU cordon,
// written as HAMi's hami.io/device-cordon node annotation (a comma list of GPU UUIDs, read live by
// the scheduler: a cordoned GPU takes no new reservation, instances already on it stay) plus
// dynmig.io/device-cordon-reasons (why and by whom, shown by `dynmig explain`). See
// protocol/device_cordon.h and docs/operations.md (Per-GPU cordon).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "kube/kube_client.h"
#include "ops/report.h"

namespace dynmig::ops {

struct GpuCordonOptions {
  std::string node;
  std::string gpu;  // a GPU UUID, or its NVML index on the node ("0")
  bool cordon = true;
  std::string reason;  // optional, cordon only
  std::string by;      // who asks ($USER), recorded with the reason
};

// Resolves the GPU from the node's hami.io/node-nvidia-register annotation (uncordon also accepts
// a UUID the node no longer registers that the cordon list still holds), then updates both
// annotations under the node's resourceVersion (retried on a conflict). Cordoning a cordoned GPU,
// or uncordoning one that is not, changes nothing and says so.
// json: {"node","gpu","index","cordoned":bool,"changed":bool,"cordonedGpus":[...]}.
// Errors: kNotFound (no such node, or a GPU the node does not register), kInvalidArgument (a bad
// reason, or an existing annotation that does not parse: named, left as it is), kFailedPrecondition
// (the node registers no GPUs), the client's.
absl::StatusOr<CommandOutput> RunGpuCordon(kube::KubeClient& client,
                                           const GpuCordonOptions& options);

}  // namespace dynmig::ops
