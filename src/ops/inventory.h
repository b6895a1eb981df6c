// `dynmig inventory --out DIR`: the backup the migration guide asks for before anything changes
// (step 1 of both procedures), one JSON file per item plus a readable summary:
//
//   DIR/configmaps/<ns>_<name>.json    the scheduler device ConfigMap(s): every ConfigMap with a
//                                      `device-config.yaml` key (or the one named), and MIG
//                                      Manager configs (a data value holding `mig-configs:`)
//   DIR/nodes/<node>.json              per GPU node: its hami.io/* annotations (the register
//                                      annotation included, with its legacy-format findings), every
//                                      nvidia.com/mig* label (mig.config, mig.config.state, ...),
//                                      nvidia.com/gpu.* labels, cordon state, addresses, the
//                                      nvidia.com/* resources of status.capacity and .allocatable,
//                                      its idle (warm) instances (dynmig.io/idle-mig-instances)
//   DIR/mig-pods.json                  every active MIG pod: node, phase, bind phase, its
//                                      allocations (decoded, or the raw value and the error), its
//                                      legacy GPU-uuid[t-s] identities, device lists, requests
//   DIR/nvml/<node>.json               the node's NVML view from the device plugin endpoint, or
//                                      {"reachable": false, "url", "error"}: never aborts the
//                                      backup
//   DIR/summary.txt                    what was saved and what to look at
//
// DIR must not exist or be empty, unless `force` (then files are overwritten; others are kept).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kube/kube_client.h"
#include "ops/cluster.h"
#include "ops/nvml_view.h"
#include "ops/report.h"

namespace dynmig::ops {

struct InventoryOptions {
  std::string out_dir;
  bool force = false;
  DeviceConfigQuery config;  // only configmap_ns / configmap_name are used
};

// The name a backup file gets for an object name: [A-Za-z0-9._-] kept, anything else '_'.
std::string BackupFileName(std::string_view name);

// json: {"dir", "files": [...], "nodes", "migPods", "legacyPods", "configMaps", "nvmlReachable",
// "nvmlUnreachable"}; text: the summary.
// Errors: kFailedPrecondition (DIR exists and is not empty, without force), kInvalidArgument (no
// DIR), kPermissionDenied / kInternal (cannot write), the client's errors.
absl::StatusOr<CommandOutput> RunInventory(kube::KubeClient& client, NvmlSource* nvml,
                                           const InventoryOptions& options, absl::Time now);

}  // namespace dynmig::ops
