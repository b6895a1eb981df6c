// `dynmig rollback plan|check|apply`: the migration guide's rollback of one node, from dynamic MIG
// back to the fixed geometry it had (HAMi's knownMigGeometries or NVIDIA MIG Manager), using the
// backup `dynmig inventory --out DIR` wrote before the migration.
//
// The two procedures of the guide share these steps (the second adds the drain):
//   1 keep the node cordoned                                       proof: cordoned
//   2 drain the dynamic-MIG pods while dynmig's device plugin still
//     runs (so it reclaims their instances)                        proof: dynamic-pods,
//                                                                    reservations, instances
//   3 stop dynmig's MIG service on the node (remove the DaemonSet's
//     node label, dynmig.io/mig=enabled)                           proof: mig-service,
//                                                                    device-plugin, node-lock
//   4 restore the legacy configuration (the backup's ConfigMaps;
//     MIG Manager's node labels)                                   proof: legacy-config,
//                                                                    mig-manager-labels
//   5 reapply the saved fixed geometry (NVML on the node, or MIG
//     Manager through its label)                                   proof: geometry
//   6 start the legacy device plugin, verify its registration,
//     uncordon                                                     proof: legacy-registration
//
// `check` runs every proof. The proofs of steps 1-3 are the safety items: while one of them FAILs
// (a dynamic-MIG pod, reservation, instance or node lock remains, dynmig's device plugin still
// runs, the node is schedulable) the rollback is refused and `apply` changes nothing. `apply`
// then restores what dynmig can restore (ConfigMaps, MIG Manager labels, dynmig's registration
// annotations when the backup had none, the geometry through NVML when it has NVML access) and
// lists each change.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kube/kube_client.h"
#include "nlohmann/json.hpp"
#include "nvml/nvml.h"
#include "ops/nvml_view.h"
#include "ops/report.h"

namespace dynmig::ops {

// The value of protocol::kMigServiceLabel that dynmig's device-plugin DaemonSet selects
// (deploy/base/device-plugin).
inline constexpr std::string_view kMigServiceLabelValue = "enabled";

// What the backup holds about one node.
struct RollbackBackup {
  std::string dir;
  std::string node;
  nlohmann::json node_record;            // nodes/<node>.json
  std::vector<kube::Object> configmaps;  // configmaps/*.json
  // The fixed geometry to reapply: per GPU its instances (profile, placement). From --geometry
  // FILE, else the backup's nvml/<node>.json when it was reachable and held instances.
  std::optional<NvmlView> geometry;
  std::string geometry_origin;
  // MIG Manager's nvidia.com/mig.config of the node, "" when none.
  std::string mig_config;
};

// Reads DIR (an inventory directory) for `node`. `geometry_file` ("" = none) is a JSON document as
// `dynmig nvml instances -o json` prints it, or an NVML view. Errors (nothing is changed):
// kInvalidArgument (DIR missing or not an inventory directory, a file that is not JSON or has the
// wrong shape; the message names the file), kNotFound (no record of the node; names those there).
absl::StatusOr<RollbackBackup> LoadRollbackBackup(const std::string& dir, const std::string& node,
                                                  const std::string& geometry_file = "");

// A node's GPUs and instances read through NVML (profile names as go-nvlib names them).
absl::StatusOr<NvmlView> ReadNvmlInstances(nvml::Nvml& nvml);

struct RollbackOptions {
  std::string node;
  std::string backup_dir;
  std::string geometry_file;
  // Where the node's instances are read now, for the instance and geometry proofs (at most one):
  // NVML (on the node, or the simulator), or a file (`dynmig nvml instances -o json` taken there).
  nvml::Nvml* nvml = nullptr;
  std::string instances_file;
  // dynmig's device-plugin NVML endpoint: when it answers, the plugin still runs. May be null.
  NvmlSource* endpoint = nullptr;
};

// The steps for this node, each with its commands and the check items that prove it.
// json: {"node", "backup", "case": "before-production"|"after-dynamic-pods", "steps": [{"step",
// "title", "why", "commands", "proves", "now"}]}. Errors: as LoadRollbackBackup; kNotFound (node
// not in the cluster); the client's errors.
absl::StatusOr<CommandOutput> RunRollbackPlan(kube::KubeClient& client,
                                              const RollbackOptions& options, absl::Time now);

// Every proof. The report's items are in step order; `refused` lists the safety items that FAILed.
struct RollbackCheck {
  CheckReport report;
  std::vector<std::string> refused;  // "check: summary" of each failed safety item
  std::vector<std::string> to_do;    // failed restoration items
  nlohmann::json ToJson() const;     // the report's JSON plus "refused", "toDo", "verdict"
  std::string ToText() const;        // the table, then the verdict
  std::string Verdict() const;
};
absl::StatusOr<RollbackCheck> RunRollbackCheck(kube::KubeClient& client,
                                               const RollbackOptions& options, absl::Time now);

// Runs the check; refuses while a safety item FAILs (refused = true: nothing was changed, the
// output holds the check) or restores and says what changed. json: {"node", "applied", "refused",
// "changes": [...], "unchanged": [...], "notDone": [...]}. Errors: as RunRollbackCheck; a write
// that fails (the message lists the changes made before it).
struct RollbackApply {
  CommandOutput output;
  bool refused = false;
};
absl::StatusOr<RollbackApply> RunRollbackApply(kube::KubeClient& client,
                                               const RollbackOptions& options, absl::Time now);

}  // namespace dynmig::ops
