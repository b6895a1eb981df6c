#include "ops/checks.h"

#include "fmt/format.h"

namespace dynmig::ops {
namespace {

constexpr unsigned kForPreflight = static_cast<unsigned>(CheckCommand::kPreflight);
constexpr unsigned kForValidate = static_cast<unsigned>(CheckCommand::kValidate);
constexpr unsigned kForRollback = static_cast<unsigned>(CheckCommand::kRollback);
constexpr unsigned kForHandover = static_cast<unsigned>(CheckCommand::kHandover);

constexpr Check kChecks[] = {
    // preflight, per node; `cordoned` also opens rollback's proofs (step 1).
    {"legacy-pods", kForPreflight, CheckScope::kNode,
     "active pods of a legacy allocator (GPU-uuid[t-s] identities, NVIDIA device-plugin MIG "
     "requests) "
     "and, with the NVML view, whether a no-drain handover proves them",
     CheckStatus::kFail, checks::LegacyPods},
    {"register-format", kForPreflight, CheckScope::kNode, "the node's register annotation",
     CheckStatus::kFail, checks::RegisterFormat},
    {"mig-manager", kForPreflight, CheckScope::kNode, "MIG Manager's pods and labels on the node",
     CheckStatus::kFail, checks::MigManager},
    {"cordoned", kForPreflight | kForRollback, CheckScope::kNode, "spec.unschedulable",
     CheckStatus::kFail, checks::Cordoned},
    {"gpu-workloads", kForPreflight, CheckScope::kNode,
     "active pods requesting GPU resources or holding devices", CheckStatus::kFail,
     checks::GpuWorkloads},
    // preflight, cluster-wide.
    {"legacy-scheduler", kForPreflight, CheckScope::kCluster, "active pods' names and images",
     CheckStatus::kFail, checks::LegacyScheduler},
    {"device-config", kForPreflight, CheckScope::kCluster, "the scheduler's device config",
     CheckStatus::kFail, checks::DeviceConfigCheck},

    // validate, per registered node.
    {"legacy-pods", kForValidate, CheckScope::kNode,
     "legacy pods on the node (reported only when there are some): each proven to hold its "
     "instance in the NVML view",
     CheckStatus::kFail, checks::LegacyPodsHandedOver},
    {"device-plugin", kForValidate, CheckScope::kNode,
     "the NVML view endpoint and the handshake annotation", CheckStatus::kFail,
     checks::DevicePluginAlive},
    {"registered-mode", kForValidate, CheckScope::kNode, "each registered GPU's mode",
     CheckStatus::kFail, checks::RegisteredMode},
    {"mig-profiles", kForValidate, CheckScope::kNode, "each MIG GPU's registered profiles",
     CheckStatus::kFail, checks::MigProfiles},
    {"capability", kForValidate, CheckScope::kNode,
     "registered profiles against NVML or the catalogue", CheckStatus::kFail, checks::Capability},
    {"allowlist-exposure", kForValidate, CheckScope::kNode,
     "registered models and profiles against the allowlist", CheckStatus::kFail,
     checks::AllowlistExposure},
    // validate, per active MIG pod (the canary too, as "canary-…").
    {"reservation", kForValidate, CheckScope::kPod, "the pod's reservation annotation",
     CheckStatus::kFail, checks::PodReservation},
    {"profile", kForValidate, CheckScope::kPod, "reserved profiles against the pod's request",
     CheckStatus::kFail, checks::PodProfile},
    {"overlap", kForValidate, CheckScope::kPod,
     "the reservation against the node's other reservations", CheckStatus::kFail,
     checks::PodOverlap},
    {"runtime", kForValidate, CheckScope::kPod, "the runtime identity of each reserved instance",
     CheckStatus::kFail, checks::PodRuntime},
    {"visible", kForValidate, CheckScope::kPod, "the devices each container sees",
     CheckStatus::kFail, checks::PodVisible},
    {"nvml", kForValidate, CheckScope::kPod, "NVML's instances against the reservation",
     CheckStatus::kFail, checks::PodNvml},

    // rollback check, after `cordoned`: steps 2-6 of the rollback.
    {"dynamic-pods", kForRollback, CheckScope::kNode, "active dynamic-MIG pods on the node",
     CheckStatus::kFail, checks::DynamicPods},
    {"reservations", kForRollback, CheckScope::kNode, "reservations of the node's active pods",
     CheckStatus::kFail, checks::Reservations},
    {"mig-service", kForRollback, CheckScope::kNode, "dynmig's MIG service label",
     CheckStatus::kFail, checks::MigService},
    {"device-plugin", kForRollback, CheckScope::kNode,
     "dynmig device-plugin pods and the NVML view endpoint", CheckStatus::kFail,
     checks::DevicePluginStopped},
    {"node-lock", kForRollback, CheckScope::kNode, "the node lock annotation", CheckStatus::kFail,
     checks::NodeLock},
    {"instances", kForRollback, CheckScope::kNode,
     "the node's MIG instances and the slices it publishes as held", CheckStatus::kFail,
     checks::Instances},
    {"legacy-config", kForRollback, CheckScope::kNode,
     "the backup's ConfigMaps against the cluster's", CheckStatus::kFail, checks::LegacyConfig},
    {"mig-manager-labels", kForRollback, CheckScope::kNode,
     "MIG Manager's node labels against the backup", CheckStatus::kFail, checks::MigManagerLabels},
    {"geometry", kForRollback, CheckScope::kNode,
     "the saved fixed geometry against the node's instances", CheckStatus::kFail, checks::Geometry},
    {"legacy-registration", kForRollback, CheckScope::kNode,
     "the node's GPU resources and register annotation", CheckStatus::kFail,
     checks::LegacyRegistration},

    // handover check, per node: the no-drain handover plan's blockers (handover.h).
    {"handover-proof", kForHandover, CheckScope::kNode,
     "the NVML view's evidence and attribution; each legacy pod among the holders",
     CheckStatus::kFail, checks::HandoverProof},
    {"handover-overlap", kForHandover, CheckScope::kNode,
     "kept legacy instances against the published held slices and the node's reservations",
     CheckStatus::kFail, checks::HandoverOverlap},
    {"handover-allocator", kForHandover, CheckScope::kNode,
     "MIG resources allocatable, NVIDIA device-plugin and MIG Manager pods and labels, the "
     "register format",
     CheckStatus::kFail, checks::HandoverAllocator},
};

}  // namespace

std::span<const Check> CheckRegistry() { return kChecks; }

void RunChecks(CheckCommand command, CheckScope scope, const CheckInput& in, CheckReport& report) {
  for (const Check& c : kChecks) {
    if ((c.commands & static_cast<unsigned>(command)) == 0 || c.scope != scope) continue;
    if (!c.run(in, report)) return;
  }
}

std::vector<const kube::Object*> ActivePodsOn(const ClusterSnapshot& snapshot,
                                              std::string_view node) {
  std::vector<const kube::Object*> out;
  for (const auto& p : snapshot.pods) {
    if (!kube::IsTerminated(p) && PodNode(p) == node) out.push_back(&p);
  }
  return out;
}

namespace checks {

bool Cordoned(const CheckInput& in, CheckReport& report) {
  if (IsCordoned(*in.node)) {
    report.Add("cordoned", in.node_name, CheckStatus::kPass,
               "the node is cordoned (spec.unschedulable)");
  } else {
    report.Add("cordoned", in.node_name, CheckStatus::kFail,
               fmt::format("the node is schedulable: {}", in.schedulable_risk),
               {fmt::format("kubectl cordon {}", in.node_name)});
  }
  return true;
}

}  // namespace checks
}  // namespace dynmig::ops
