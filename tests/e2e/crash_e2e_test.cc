// Crashes, as the chaos soak injects them: a device plugin crashing at each of its crash points
// and the leading one of two scheduler replicas crashing. The crashed part is restarted by the
// local cluster's supervisor; nothing leaks, nothing is double-booked, new pods still run.
#include <string_view>

#include "deviceplugin/plugin_core.h"
#include "e2e_test_util.h"
#include "fmt/format.h"

namespace dynmig::e2e {
namespace {

class CrashE2eTest : public E2eTest {};

TEST_F(CrashE2eTest, ADevicePluginCrashingAtEachPointIsRestartedAndLeaksNothing) {
  Scenario("device-plugin crash points");
  StartCluster();
  for (std::string_view point :
       {deviceplugin::kCrashAfterIntent, deviceplugin::kCrashAfterGpuInstance,
        deviceplugin::kCrashAfterComputeInstance, deviceplugin::kCrashBeforeRollback,
        deviceplugin::kCrashAfterAnnotation}) {
    Step(std::string(point));
    const std::string key = fmt::format("device-plugin crash {}", point);
    const std::string name = fmt::format("crash-{}", point);
    ASSERT_TRUE(cluster_->ArmDevicePluginCrash("node-a", point).ok());
    if (point == deviceplugin::kCrashBeforeRollback) {
      // Reached only when the runtime identity cannot be written: the plugin's pod writes fail.
      kube::FaultSpec f;
      f.user = std::string(local::kDevicePluginUser);
      f.method = "PATCH";
      f.path_prefix = "/api/v1/namespaces/default/pods/" + name;
      f.status = 422;
      f.count = -1;
      cluster_->api().AddFault(f);
    }
    Create(MigPod(name, 4000));
    ASSERT_TRUE(WaitUntil([&] { return cluster_->Crashes()[key] == 1; }))
        << Where() << "the plugin did not crash at " << point;
    cluster_->api().ClearFaults();
    ASSERT_TRUE(WaitUntil([&] { return cluster_->CrashesRestarted(); }))
        << Where() << "the crashed plugin was not restarted";
    EXPECT_TRUE(cluster_->DevicePluginRunning("node-a"));
    // Whatever became of the pod, once deleted nothing of it remains.
    DeletePod(name);
    ASSERT_TRUE(WaitUntil([&] { return Live().empty(); }))
        << Where() << "an instance of " << name << " leaked";
    ASSERT_TRUE(WaitUntil([&] {
      auto node = kube_->GetNode("node-a");
      return node.ok() && !kube::Annotation(*node, protocol::kNodeLockAnnotation).has_value();
    })) << Where()
        << "the node lock was left behind";
  }
  // The restarted plugin allocates as before.
  Step("a pod after the crashes");
  const auto a = RunPod(MigPod("after", 4000));
  ExpectRealized("after", a);
}

TEST_F(CrashE2eTest, TheSchedulerLeaderCrashesAndTheOtherReplicaTakesOver) {
  Scenario("scheduler leader crash");
  StartCluster();
  options_.scheduler_replicas = 2;
  options_.election.lease_duration = absl::Seconds(2);
  options_.election.renew_deadline = absl::Milliseconds(1500);
  options_.election.retry_period = absl::Milliseconds(200);
  RestartWholeCluster();
  Step("a leader is elected");
  ASSERT_TRUE(WaitUntil([&] { return cluster_->SchedulerLeader() >= 0; }));
  RunPod(MigPod("before", 4000));
  auto lease = [&] {
    auto l = kube_->GetLease("dynmig-system", "dynmig-scheduler");
    return l.ok() ? kube::StringAt(*l, "/spec/holderIdentity") : std::string();
  };
  const std::string holder = lease();
  ASSERT_FALSE(holder.empty());

  Step("the leader crashes");
  auto crashed = cluster_->CrashSchedulerLeader();
  ASSERT_TRUE(crashed.ok()) << crashed.status();
  // A crash hands nothing back: the Lease still names the crashed replica until it runs out.
  EXPECT_EQ(lease(), holder);
  EXPECT_EQ(cluster_->Crashes()["scheduler crash"], 1);
  ASSERT_TRUE(WaitUntil([&] { return cluster_->CrashesRestarted(); }));
  ASSERT_TRUE(WaitUntil([&] { return !lease().empty() && lease() != holder; }))
      << Where() << "nobody took the Lease over from " << holder;
  ASSERT_TRUE(WaitUntil([&] { return cluster_->SchedulerLeader() >= 0; }));

  Step("pods schedule under the new leader");
  const auto after = RunPod(MigPod("after", 4000));
  ExpectRealized("after", after);
  const auto before = Allocations(Get("before"));
  ASSERT_FALSE(before.empty());
  EXPECT_FALSE(before[0].gpu_uuid == after.gpu_uuid &&
               before[0].placement.Overlaps(after.placement))
      << Where() << "the new leader reserved slices the running pod holds";
}

}  // namespace
}  // namespace dynmig::e2e
