// Issue 27's attacks by tenants, replayed on the local mode (the in-memory API server calls the
// webhooks as kube-apiserver does, pods/binding included): each is refused at admission with a
// message that says why, and another tenant's MIG pod still runs on the node.
//   1. a pod asking nvidia.com/gpu: 50000 (it kept the planner busy for minutes);
//   3. a hami-core pod placed with spec.nodeName, or bound through pods/binding by a tenant (it
//      reached the node without a reservation and could be served another pod's instance);
//   4. nvidia.com/vgpu-mode removed from a hami-core gpu: 0 pod placed on the node (it became a MIG
//      pod without a reservation and the node failed closed).
#include "e2e_test_util.h"

namespace dynmig::e2e {
namespace {

constexpr char kTenantA[] = "tenant-a";
constexpr char kTenantB[] = "tenant-b";

class AttackE2eTest : public E2eTest {
 protected:
  void SetUp() override { users_ = {kTenantA, kTenantB}; }

  std::unique_ptr<kube::KubeClient> As(const std::string& user) {
    auto client = cluster_->Client(user);
    EXPECT_TRUE(client.ok()) << Where() << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  // Creates the pod as `tenant`; the API server's refusal, or OK.
  absl::Status CreateAs(kube::KubeClient& tenant, const json& pod) {
    return tenant.CreatePod(pod).status();
  }

  // Tenant B's canary: a MIG pod that must still run on node-a.
  void CanaryRuns(kube::KubeClient& tenant_b, const std::string& name) {
    Step(name + ": another tenant's MIG pod still runs");
    ASSERT_TRUE(CreateAs(tenant_b, MigPod(name, 4000)).ok()) << Where();
    const auto a = WaitRunning(name);
    ExpectRealized(name, a);
  }
};

TEST_F(AttackE2eTest, AHugeInstanceCountIsRefusedAndMigPodsStillSchedule) {
  Scenario("issue 27 #1: nvidia.com/gpu 50000");
  StartCluster("node-a=A100-SXM4-40GBx1");
  auto tenant_a = As(kTenantA);
  auto tenant_b = As(kTenantB);
  ASSERT_TRUE(tenant_a && tenant_b) << Where();
  Step("tenant A asks for 50000 instances of 1000 MiB");
  json huge = MigPod("huge", 1000);
  huge["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 50000;
  const absl::Status refused = CreateAs(*tenant_a, huge);
  ASSERT_FALSE(refused.ok()) << Where() << "admitted";
  EXPECT_NE(refused.message().find("container \"workload\" (containers[0]): nvidia.com/gpu: 50000 "
                                   "is more than 7, the most MIG instances one node of this "
                                   "cluster can hold"),
            std::string::npos)
      << Where() << refused;
  EXPECT_TRUE(absl::IsNotFound(kube_->GetPod("default", "huge").status())) << Where();
  Step("as many as the node holds are admitted (here too large to fit: Pending)");
  json seven = MigPod("seven", 40000);
  seven["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 7;
  EXPECT_TRUE(CreateAs(*tenant_a, seven).ok()) << Where();
  DeletePod("seven");
  CanaryRuns(*tenant_b, "canary");
}

TEST_F(AttackE2eTest, OnlyDynmigPlacesGpuPodsWhateverTheirMode) {
  Scenario("issue 27 #3: a hami-core pod placed by hand");
  StartCluster("node-a=A100-SXM4-40GBx1");
  auto tenant_a = As(kTenantA);
  auto tenant_b = As(kTenantB);
  ASSERT_TRUE(tenant_a && tenant_b) << Where();
  Step("tenant B's MIG pod runs");
  ASSERT_TRUE(CreateAs(*tenant_b, MigPod("victim", 4000)).ok()) << Where();
  const auto victim = WaitRunning("victim");

  Step("tenant A creates a hami-core pod with spec.nodeName");
  json thief = MigPod("thief", 4000);
  thief["metadata"]["annotations"][std::string(protocol::kVgpuModeAnnotation)] = "hami-core";
  thief["spec"]["nodeName"] = "node-a";
  absl::Status refused = CreateAs(*tenant_a, thief);
  ASSERT_FALSE(refused.ok()) << Where() << "admitted";
  EXPECT_NE(refused.message().find("spec.nodeName is set (node-a): a pod that requests "
                                   "nvidia.com/gpu"),
            std::string::npos)
      << Where() << refused;
  EXPECT_TRUE(absl::IsNotFound(kube_->GetPod("default", "thief").status())) << Where();

  Step("tenant A binds such a pod itself (pods/binding)");
  thief["spec"].erase("nodeName");
  auto created = tenant_a->CreatePod(thief);
  ASSERT_TRUE(created.ok()) << Where() << created.status();
  EXPECT_EQ(kube::StringAt(*created, "/spec/schedulerName"), "dynmig-scheduler") << Where();
  refused = tenant_a->BindPod("default", "thief", "node-a", kube::Uid(*created));
  ASSERT_FALSE(refused.ok()) << Where() << "bound";
  EXPECT_NE(refused.message().find("may bind a pod that requests nvidia.com/gpu"),
            std::string::npos)
      << Where() << refused;
  EXPECT_NE(refused.message().find("user \"tenant-a\" may not bind it to node node-a"),
            std::string::npos)
      << Where() << refused;
  EXPECT_EQ(kube::NodeName(Get("thief")), "") << Where() << "the pod was bound";

  Step("a pod without GPUs is bound by whoever may bind");
  json plain = {{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata", {{"name", "plain"}, {"namespace", "default"}}},
                {"spec",
                 {{"schedulerName", "nobody"},
                  {"containers", json::array({{{"name", "c"}, {"image", "ubuntu:22.04"}}})}}}};
  auto plain_created = tenant_a->CreatePod(plain);
  ASSERT_TRUE(plain_created.ok()) << Where() << plain_created.status();
  const absl::Status bound =
      tenant_a->BindPod("default", "plain", "node-a", kube::Uid(*plain_created));
  EXPECT_TRUE(bound.ok()) << Where() << bound;
  EXPECT_EQ(kube::NodeName(Get("plain")), "node-a") << Where();

  Step("the victim keeps its instance");
  EXPECT_EQ(Allocations(Get("victim")).front(), victim) << Where();
  ExpectRealized("victim", victim);
}

// The attack: a pod with nvidia.com/gpu: 0 in another mode placed with spec.nodeName, then its
// nvidia.com/vgpu-mode removed, which made it a MIG pod without a reservation and failed the
// node's MIG GPUs closed. Placing it is refused now; a pod placed before (made through the store,
// as one admitted by an older dynmig) cannot lose its annotation.
TEST_F(AttackE2eTest, RoutingAnnotationsCannotBeRemovedFromABoundPod) {
  Scenario("issue 27 #4: vgpu-mode removed from a bound gpu:0 pod");
  StartCluster("node-a=A100-SXM4-40GBx1");
  auto tenant_a = As(kTenantA);
  auto tenant_b = As(kTenantB);
  ASSERT_TRUE(tenant_a && tenant_b) << Where();
  const std::string mode(protocol::kVgpuModeAnnotation);
  json zero = MigPod("plain0", 4000);
  zero["metadata"]["annotations"][mode] = "hami-core";
  zero["spec"]["containers"][0]["resources"]["limits"] = {{"nvidia.com/gpu", 0}};
  zero["spec"]["nodeName"] = "node-a";
  Step("tenant A places a hami-core pod with nvidia.com/gpu: 0 on node-a");
  const absl::Status refused = CreateAs(*tenant_a, zero);
  ASSERT_FALSE(refused.ok()) << Where() << "admitted";
  EXPECT_NE(refused.message().find("spec.nodeName is set (node-a)"), std::string::npos)
      << Where() << refused;

  Step("such a pod admitted before: its vgpu-mode cannot be removed");
  auto stored = cluster_->api().store().Create(kube::Resource::kPods, "default", zero);
  ASSERT_TRUE(stored.ok()) << Where() << stored.status();
  auto edit = tenant_a->PatchPodAnnotations("default", "plain0", {{mode, std::nullopt}});
  ASSERT_FALSE(edit.ok()) << Where() << "the removal was accepted";
  EXPECT_NE(edit.status().message().find("nvidia.com/vgpu-mode is fixed at creation for a pod "
                                         "that requests nvidia.com/gpu"),
            std::string::npos)
      << Where() << edit.status();
  EXPECT_EQ(kube::Annotation(Get("plain0"), mode), "hami-core") << Where();
  Step("nor changed to mig");
  edit = tenant_a->PatchPodAnnotations("default", "plain0", {{mode, "mig"}});
  ASSERT_FALSE(edit.ok()) << Where() << "the change was accepted";
  EXPECT_EQ(kube::Annotation(Get("plain0"), mode), "hami-core") << Where();

  CanaryRuns(*tenant_b, "canary");
}

}  // namespace
}  // namespace dynmig::e2e
