// The named checks of `preflight`, `validate`, `rollback check` and `handover check`, in one
// registry.
//
// A command reads the cluster once (a ClusterSnapshot, plus what it reads beside it: the device
// config, NVML views, a backup) into a CheckInput, then runs the registry's entries that serve it,
// node by node and once cluster-wide, in registry order. Each entry says what it looks at and the
// worst status it reports; its function adds the findings (PASS/WARN/FAIL/SKIP with evidence) to
// the report under the entry's id. A check shared by several commands (`cordoned`) is one entry
// serving each of them.
//
// A check returns false when the checks after it about the same subject have nothing to look at
// (validate's `registered-mode` when the registration cannot be read, `pod-reservation` when the
// pod holds no usable reservation); the runner then stops for that subject.
// Pure (the inputs are read before the checks run); thread-compatible.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kube/kube_client.h"
#include "ops/cluster.h"
#include "ops/report.h"
#include "protocol/device_config.h"
#include "protocol/mig_allocations.h"
#include "protocol/node_register.h"

namespace dynmig::ops {

struct NodeNvml;       // validate.h
struct HandoverPlan;   // handover.h
struct RollbackFacts;  // rollback.cc
struct ValidateFacts;  // validate.cc
struct PodFacts;       // validate.cc

// The commands that run checks; an entry serves one or several of them.
enum class CheckCommand : unsigned {
  kPreflight = 1u << 0,
  kValidate = 1u << 1,
  kRollback = 1u << 2,
  kHandover = 1u << 3,
};
constexpr unsigned operator|(CheckCommand a, CheckCommand b) {
  return static_cast<unsigned>(a) | static_cast<unsigned>(b);
}

// What a check is about: the cluster as a whole, one node, or one pod.
enum class CheckScope { kCluster, kNode, kPod };

// What the checks read. The command fills the parts its checks need; the rest stays empty.
struct CheckInput {
  const ClusterSnapshot* snapshot = nullptr;

  // kNode and kPod: the node, its name, and its active pods (not terminated, PodNode == name).
  const kube::Object* node = nullptr;
  std::string node_name;
  std::vector<const kube::Object*> pods;

  // `cordoned`: what may happen while the node is schedulable (the FAIL summary's second half).
  std::string_view schedulable_risk;

  // preflight: the device config as FindDeviceConfig answered.
  const absl::StatusOr<DeviceConfigSource>* config_source = nullptr;

  // validate: the effective config and where it came from, the node's NVML view and what the
  // registration holds.
  const protocol::DeviceConfig* config = nullptr;
  std::string config_origin;
  const NodeNvml* nvml = nullptr;
  bool nvml_configured = false;
  const ValidateFacts* validate = nullptr;

  // kPod (validate and the canary): the pod, what its reservation decodes to, the NVML views by
  // node, and the prefix of the check ids ("pod-", "canary-").
  const kube::Object* pod = nullptr;
  const PodFacts* pod_facts = nullptr;
  const std::map<std::string, NodeNvml>* nvml_views = nullptr;
  std::string pod_prefix = "pod-";

  // rollback: the backup, the node's instances now, and what was read beside the snapshot.
  const RollbackFacts* rollback = nullptr;

  // handover check (always), preflight and validate (when the node has legacy pods and its NVML
  // view was read, else null): the node's no-drain handover plan.
  const HandoverPlan* handover = nullptr;
};

// One named check.
struct Check {
  std::string_view id;  // the report's check id ("pod-…" checks: the suffix after the prefix)
  unsigned commands;    // CheckCommand bits it serves
  CheckScope scope;
  std::string_view looks_at;  // what it reads
  CheckStatus severity;       // the worst status it reports
  bool (*run)(const CheckInput& in, CheckReport& report);
};

// Every check, in the order the commands run them.
std::span<const Check> CheckRegistry();

// Runs the entries serving `command` with `scope`, in registry order, until one returns false.
void RunChecks(CheckCommand command, CheckScope scope, const CheckInput& in, CheckReport& report);

// The node's active pods: not terminated, PodNode == name (snapshot order).
std::vector<const kube::Object*> ActivePodsOn(const ClusterSnapshot& snapshot,
                                              std::string_view node);

// --- the check functions, by command (defined in checks.cc, preflight.cc, validate.cc,
// rollback.cc, handover.cc)

namespace checks {

bool Cordoned(const CheckInput& in, CheckReport& report);

bool LegacyPods(const CheckInput& in, CheckReport& report);
bool LegacyPodsHandedOver(const CheckInput& in, CheckReport& report);
bool RegisterFormat(const CheckInput& in, CheckReport& report);
bool MigManager(const CheckInput& in, CheckReport& report);
bool GpuWorkloads(const CheckInput& in, CheckReport& report);
bool LegacyScheduler(const CheckInput& in, CheckReport& report);
bool DeviceConfigCheck(const CheckInput& in, CheckReport& report);

bool DevicePluginAlive(const CheckInput& in, CheckReport& report);
bool RegisteredMode(const CheckInput& in, CheckReport& report);
bool MigProfiles(const CheckInput& in, CheckReport& report);
bool Capability(const CheckInput& in, CheckReport& report);
bool AllowlistExposure(const CheckInput& in, CheckReport& report);
bool PodReservation(const CheckInput& in, CheckReport& report);
bool PodProfile(const CheckInput& in, CheckReport& report);
bool PodOverlap(const CheckInput& in, CheckReport& report);
bool PodRuntime(const CheckInput& in, CheckReport& report);
bool PodVisible(const CheckInput& in, CheckReport& report);
bool PodNvml(const CheckInput& in, CheckReport& report);

bool DynamicPods(const CheckInput& in, CheckReport& report);
bool Reservations(const CheckInput& in, CheckReport& report);
bool MigService(const CheckInput& in, CheckReport& report);
bool DevicePluginStopped(const CheckInput& in, CheckReport& report);
bool NodeLock(const CheckInput& in, CheckReport& report);
bool Instances(const CheckInput& in, CheckReport& report);
bool LegacyConfig(const CheckInput& in, CheckReport& report);
bool MigManagerLabels(const CheckInput& in, CheckReport& report);
bool Geometry(const CheckInput& in, CheckReport& report);
bool LegacyRegistration(const CheckInput& in, CheckReport& report);

bool HandoverProof(const CheckInput& in, CheckReport& report);
bool HandoverOverlap(const CheckInput& in, CheckReport& report);
bool HandoverAllocator(const CheckInput& in, CheckReport& report);

}  // namespace checks

}  // namespace dynmig::ops
