// Warm instances end to end in the local mode (scheduler extender, kube-scheduler stand-in, device
// plugin, kubelet stand-in): a deleted pod's instance stays idle and published, the next pod of
// that profile is placed on it and gets it without a create, a pod of another shape over its
// slices gets a new instance, and nothing overlaps or leaks.
#include "deviceplugin/events.h"
#include "e2e/e2e_test_util.h"
#include "protocol/device_config.h"
#include "protocol/idle_instances.h"

namespace dynmig::e2e {
namespace {

TEST_F(E2eTest, WarmInstancesAreReusedAcrossPods) {
  Scenario("warm instances");
  StartCluster("node-a=A100-SXM4-40GBx1", protocol::DefaultDeviceConfigYaml() +
                                              "  migWarmInstances: {ttl: 10m, maxPerGpu: 2}\n");
  auto idle = [&] {
    auto node = kube_->GetNode("node-a");
    EXPECT_TRUE(node.ok()) << Where() << node.status();
    auto decoded = protocol::DecodeIdleInstances(
        kube::Annotation(*node, protocol::kNodeIdleInstancesAnnotation).value_or("[]"));
    EXPECT_TRUE(decoded.ok()) << Where() << decoded.status();
    return decoded.ok() ? *decoded : std::vector<protocol::IdleInstance>{};
  };

  Step("run and delete a 1g pod");
  auto first = RunPod(MigPod("first", 4000));
  ASSERT_TRUE(first.runtime.has_value()) << Where();
  DeletePod("first");
  Step("its instance stays, idle and published");
  ASSERT_TRUE(WaitUntil([&] { return idle().size() == 1; })) << Where();
  EXPECT_EQ(idle()[0].placement, first.placement) << Where();
  EXPECT_EQ(Live().size(), 1u) << Where();

  Step("the next 1g pod is placed on it and reuses it");
  auto second = RunPod(MigPod("second", 4000));
  EXPECT_EQ(second.gpu_uuid, first.gpu_uuid) << Where();
  EXPECT_EQ(second.placement, first.placement) << Where();
  ASSERT_TRUE(second.runtime.has_value()) << Where();
  EXPECT_EQ(second.runtime->gpu_instance_id, first.runtime->gpu_instance_id) << Where();
  ExpectRealized("second", second);
  EXPECT_EQ(Plugin().metrics().Value("dynmig_deviceplugin_instances_reused_total"), 1) << Where();
  EXPECT_EQ(Plugin().metrics().Value("dynmig_deviceplugin_instances_created_total"), 1) << Where();
  ASSERT_TRUE(WaitUntil([&] { return idle().empty(); })) << Where();

  Step("a 7g pod needs every slice: the idle instance goes, nothing overlaps");
  DeletePod("second");
  ASSERT_TRUE(WaitUntil([&] { return idle().size() == 1; })) << Where();
  auto whole = RunPod(MigPod("whole", 39000));
  EXPECT_EQ(whole.profile, "7g.40gb") << Where();
  ExpectRealized("whole", whole);
  EXPECT_EQ(Live().size(), 1u) << Where();
  EXPECT_EQ(Plugin().metrics().Value("dynmig_deviceplugin_instances_destroyed_total", "reason",
                                     "idle_needed"),
            1)
      << Where();

  Step("deleted: only idle, published instances are left");
  DeletePod("whole");
  // (The published set goes [1g] -> [] -> [7g]; a publication may skip the empty one.)
  ASSERT_TRUE(WaitUntil([&] {
    auto now = idle();
    return now.size() == 1 && now[0].profile == "7g.40gb" && Live().size() == 1;
  })) << Where();
}

}  // namespace
}  // namespace dynmig::e2e
