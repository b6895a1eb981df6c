// Publisher: the node annotations and the instance gauges. See publisher.h.
#include "deviceplugin/publisher.h"

#include <map>
#include <utility>

#include "fmt/format.h"
#include "kube/object.h"
#include "protocol/annotations.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {

absl::Status Publisher::Publish(NodeSnapshot snapshot) {
  const std::string value = protocol::EncodeNodeRegister(snapshot.devices);
  const std::string held_value = protocol::EncodeHeldSlices(std::move(snapshot.held));
  const std::string idle_value = protocol::EncodeIdleInstances(std::move(snapshot.idle));
  bool changed = false;
  {
    dynmig::MutexLock lock(&mu_);
    changed = value != last_register_;
  }
  // Every key every time: the register also comes back after the node object was recreated.
  kube::KeyPatch patch;
  patch[std::string(protocol::kNodeHandshakeAnnotation)] =
      "Reported_" + kube::Rfc3339(clock_.Now());
  patch[std::string(protocol::kNodeRegisterAnnotation)] = value;
  patch[std::string(protocol::kNodeHeldSlicesAnnotation)] = held_value;
  patch[std::string(protocol::kNodeIdleInstancesAnnotation)] = idle_value;
  auto st = kube_.PatchNodeAnnotations(node_name_, patch);
  metrics_.NodePublished(st.ok());
  if (!st.ok()) {
    return absl::Status(st.status().code(),
                        fmt::format("cannot publish the devices of node {}: {}", node_name_,
                                    std::string(st.status().message())));
  }
  if (changed) {
    spdlog::info("published {} on node {}: {}", protocol::kNodeRegisterAnnotation, node_name_,
                 value);
  }
  dynmig::MutexLock lock(&mu_);
  last_register_ = value;
  last_idle_ = idle_value;
  return absl::OkStatus();
}

bool Publisher::IdleChanged(const std::vector<protocol::IdleInstance>& idle) const {
  const std::string value = protocol::EncodeIdleInstances(idle);
  dynmig::MutexLock lock(&mu_);
  return value != last_idle_;
}

void Publisher::SetGauges(const std::vector<ManagedInstance>& instances, bool recovery_pending) {
  metrics_.SetManaged(static_cast<double>(instances.size()));
  std::map<std::pair<std::string, std::string>, int> idle;
  for (const auto& m : instances) {
    if (m.idle) ++idle[{m.gpu_uuid, m.profile}];
  }
  metrics_.SetIdle(idle);
  metrics_.SetRecoveryPending(recovery_pending);
}

}  // namespace dynmig::deviceplugin
