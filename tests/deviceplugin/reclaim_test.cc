// Reclamation (reclaimer.cc): instances of pods that ended are destroyed, busy ones are kept
// and published as held, freed placements are reusable at once.
#include "dp_test_util.h"

namespace dynmig::deviceplugin::testing {
namespace {

class ReclaimTest : public PluginTest {};

TEST_F(ReclaimTest, AFreedPlacementIsReusedAtOnceBecauseAllocateReconcilesFirst) {
  StartPlugin();
  CreatePod("a", {{0, 0, 0, "3g.20gb", 4}});
  ASSERT_TRUE(Allocate("a", 0, 1).ok());
  SetPhase("a", "Running");
  const uint32_t old_gi = GiAt(0, 4)->id;
  SetPhase("a", "Succeeded");  // finished, not yet deleted

  // A 1g at slice 5 overlaps the finished pod's 3g: Allocate reclaims it first.
  CreatePod("b", {{0, 0, 0, "1g.5gb", 5}});
  auto b = Allocate("b", 0, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(GiAt(0, 4).has_value());
  ASSERT_TRUE(GiAt(0, 5).has_value());
  EXPECT_EQ(TotalGis(), 1u);

  // The same placement again after a delete gets a new instance of the new pod.
  DeletePod("b");
  CreatePod("c", {{0, 0, 0, "1g.5gb", 5}});
  auto c = Allocate("c", 0, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  auto managed = plugin_->core().Managed();
  ASSERT_EQ(managed.size(), 1u);
  EXPECT_EQ(managed[0].owner.name, "c");
  EXPECT_NE(GiAt(0, 5)->id, old_gi);
}

TEST_F(ReclaimTest, ATerminatingPodKeepsItsBusyInstanceWithoutBlockingOthers) {
  StartPlugin();
  CreatePod("busy", {{0, 0, 0, "1g.5gb", 0}});
  ASSERT_TRUE(Allocate("busy", 0, 1).ok());
  SetPhase("busy", "Running");
  CreatePod("done", {{0, 0, 0, "1g.5gb", 1}});
  ASSERT_TRUE(Allocate("done", 0, 1).ok());
  SetPhase("done", "Running");
  const std::string busy_uuid = Allocations("busy")[0].runtime->mig_uuid;
  ASSERT_TRUE(sim_->AttachProcess(busy_uuid, 4242).ok());

  DeletePod("busy", /*grace=*/300);  // terminating: deletionTimestamp set, still listed
  ASSERT_TRUE(kube::IsBeingDeleted(GetPod("busy")));
  DeletePod("done");
  auto report = plugin_->core().Reconcile();
  EXPECT_EQ(report.busy, 1);
  EXPECT_EQ(report.destroyed, 1);
  EXPECT_TRUE(GiAt(0, 0).has_value());
  EXPECT_FALSE(GiAt(0, 1).has_value());
  EXPECT_TRUE(HasEvent(kReasonReclaimDeferred, "4242"));
  EXPECT_EQ(plugin_->metrics().Value("dynmig_deviceplugin_busy_instances"), 1);
  // Its slices are published as held, so that the scheduler does not reserve them meanwhile.
  auto held = plugin_->core().Held();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].gpu_uuid, Allocations("busy")[0].gpu_uuid);
  EXPECT_EQ(held[0].placement, (mig::Placement{0, 1}));
  EXPECT_NE(held[0].reason.find("default/busy"), std::string::npos) << held[0].reason;
  ASSERT_TRUE(plugin_->core().PublishNode().ok());
  auto node = kube_->GetNode(kNode);
  ASSERT_TRUE(node.ok());
  auto published = protocol::DecodeHeldSlices(
      kube::Annotation(*node, protocol::kNodeHeldSlicesAnnotation).value_or("missing"));
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_EQ(*published, held);

  // The process ends: the next cycle reclaims it, and nothing is held any more.
  ASSERT_TRUE(sim_->DetachProcess(busy_uuid, 4242).ok());
  report = plugin_->core().Reconcile();
  EXPECT_EQ(report.destroyed, 1);
  EXPECT_EQ(TotalGis(), 0u);
  EXPECT_TRUE(plugin_->core().Held().empty());
  ASSERT_TRUE(plugin_->core().PublishNode().ok());
  EXPECT_EQ(kube::Annotation(*kube_->GetNode(kNode), protocol::kNodeHeldSlicesAnnotation), "[]");
}

// Found by the chaos soak: a pod bound and then deleted before its Allocate (or a bind cut short by
// a crashed scheduler) left hami.io/mutex.lock behind, and the node took no bind until the lock's
// 5-minute expiry. The reconcile releases a lock whose pod will never reach Allocate here, and
// only such a lock.
TEST_F(ReclaimTest, ANodeLockOfAPodThatWillNeverBeAllocatedIsReleased) {
  StartPlugin();
  // Deleted before its Allocate.
  CreatePod("gone", {{0, 0, 0, "1g.5gb", 0}});
  DeletePod("gone");
  ASSERT_TRUE(NodeLock().has_value());
  plugin_->core().Reconcile();
  EXPECT_FALSE(NodeLock().has_value());

  // Finished.
  CreatePod("done", {{0, 0, 0, "1g.5gb", 0}});
  SetPhase("done", "Failed");
  plugin_->core().Reconcile();
  EXPECT_FALSE(NodeLock().has_value());

  // Bound to another node.
  CreatePod("elsewhere", {{0, 0, 0, "1g.5gb", 0}}, 1, /*lock=*/false,
            [](kube::Object& pod) { pod["spec"]["nodeName"] = "other-node"; });
  LockNodeFor("elsewhere");
  plugin_->core().Reconcile();
  EXPECT_FALSE(NodeLock().has_value());

  // Kept: a pod not bound yet (its bind may be in progress) and a pod of this node waiting for
  // its Allocate.
  kube::Object unbound = {{"apiVersion", "v1"},
                          {"kind", "Pod"},
                          {"metadata", {{"name", "binding"}, {"namespace", "default"}}},
                          {"spec", {{"containers", {{{"name", "c"}, {"image", "cuda"}}}}}}};
  ASSERT_TRUE(kube_->CreatePod(unbound).ok());
  LockNodeFor("binding");
  plugin_->core().Reconcile();
  EXPECT_NE(NodeLock().value_or("").find("default,binding"), std::string::npos);
  CreatePod("waiting", {{0, 0, 0, "1g.5gb", 1}});
  plugin_->core().Reconcile();
  EXPECT_NE(NodeLock().value_or("").find("default,waiting"), std::string::npos);
  // Its Allocate still goes through.
  EXPECT_TRUE(Allocate("waiting", 0, 1).ok());
}

// Issue 27: the lock names the owner's UID. A bound pod force-deleted and recreated under the same
// name (unschedulable, never bound) used to keep the node locked until the lock's expiry, again at
// every expiry; the recreated pod is another pod: the lock is released, and the recreated pod's
// claims never take an Allocate.
TEST_F(ReclaimTest, ANodeLockIsReleasedWhenItsOwnerUidIsGoneWhateverTheName) {
  StartPlugin();
  const kube::Object first = CreatePod("reborn", {{0, 0, 0, "1g.5gb", 0}});
  const std::string first_uid = kube::Uid(first);
  ASSERT_NE(NodeLock().value_or("").find(first_uid), std::string::npos);
  DeletePod("reborn");
  kube::Object again = {{"apiVersion", "v1"},
                        {"kind", "Pod"},
                        {"metadata", {{"name", "reborn"}, {"namespace", "default"}}},
                        {"spec", {{"containers", {{{"name", "c"}, {"image", "cuda"}}}}}}};
  auto recreated = kube_->CreatePod(again);
  ASSERT_TRUE(recreated.ok());
  ASSERT_NE(kube::Uid(*recreated), first_uid);
  plugin_->core().Reconcile();
  EXPECT_FALSE(NodeLock().has_value());

  // A pod recreated under the name with the same claims as the owner (bind-phase allocating, a
  // reservation, bound here) is still not the owner of a lock that names the old UID.
  CreatePod("twin", {{0, 0, 0, "1g.5gb", 0}}, 1, /*lock=*/false);
  LockNodeFor("twin", "uid-of-a-deleted-twin");
  auto a = Allocate("twin", 0, 1);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("names default/twin (uid uid-of-a-deleted-twin)"),
            std::string::npos)
      << a.status();
  EXPECT_EQ(TotalGis(), 0u);
  plugin_->core().Reconcile();  // the owner UID is gone: released
  EXPECT_FALSE(NodeLock().has_value());
}

}  // namespace
}  // namespace dynmig::deviceplugin::testing
