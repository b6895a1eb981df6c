#include "ops/defrag_plan.h"
#include "ops/ops_test_util.h"

namespace dynmig::ops::testing {
namespace {

const std::vector<std::string> kProfiles = {"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"};

class DefragCmdTest : public OpsTest {
 protected:
  void SetUp() override {
    OpsTest::SetUp();
    AddDeviceConfig();
    Add(Node("node-a", Register({{"GPU-a0"}}, kProfiles)));
    Add(PlacedPod("small-a", "node-a", 4000,
                  {{"GPU-a0", "1g.5gb", 1, 1, Runtime{"MIG-sa", 9, 0}}}));
    Add(PlacedPod("small-b", "node-a", 4000,
                  {{"GPU-a0", "1g.5gb", 5, 1, Runtime{"MIG-sb", 13, 0}}}));
    Add(Node("node-b", Register({{"GPU-b0"}}, kProfiles)));
    Add(PlacedPod("big-c", "node-b", 19000, {{"GPU-b0", "3g.20gb", 0, 4, Runtime{"MIG-c", 1, 0}}}));
    Add(PlacedPod("big-d", "node-b", 19000, {{"GPU-b0", "3g.20gb", 4, 4, Runtime{"MIG-d", 2, 0}}}));
  }
  size_t PodCount() {
    auto pods = server_->store().List(kube::Resource::kPods, {});
    return pods.ok() ? pods->items.size() : 0;
  }
};

TEST_F(DefragCmdTest, FragmentedGpuNeedsOnePodMoved) {
  const json r = RunJson({"defrag", "--for", "3g.20gb"}, 0);
  EXPECT_EQ(r["found"], true);
  EXPECT_EQ(r["executed"], false);
  ASSERT_FALSE(r["plans"].empty());
  const json& best = r["plans"][0];
  EXPECT_EQ(best["node"], "node-a");
  EXPECT_EQ(best["podsToMove"], 1);
  EXPECT_EQ(best["unitsMoved"], 1);
  EXPECT_EQ(best["fitsNow"], false);
  EXPECT_EQ(best["allMovedPodsFitElsewhere"], true) << best.dump(2);
  EXPECT_EQ(best["moves"][0]["pod"], "default/small-b");
  EXPECT_EQ(best["placement"]["start"], 4);
  // node-b would need both 3g pods moved: second.
  ASSERT_GE(r["plans"].size(), 2u);
  EXPECT_EQ(r["plans"][1]["node"], "node-b");
  EXPECT_EQ(r["plans"][1]["podsToMove"], 1);
  EXPECT_EQ(r["plans"][1]["unitsMoved"], 4);
  EXPECT_EQ(PodCount(), 4u);  // nothing moved

  auto text = Run({"defrag", "--for", "3g"});
  EXPECT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("Best plan: free slices 4-7 of node-a GPU 0 (GPU-a0) for 3g.20gb by "
                          "moving 1 pod (1 slice)"),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("default/small-b  1g.5gb at 5"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("Nothing was moved"), std::string::npos);
}

TEST_F(DefragCmdTest, MovedPodsThatFitNowhereAreSaid) {
  const json r = RunJson({"defrag", "--for", "7g.40gb", "--node", "node-b"}, 0);
  ASSERT_EQ(r["found"], true);
  const json& best = r["plans"][0];
  EXPECT_EQ(best["podsToMove"], 2);
  EXPECT_EQ(best["allMovedPodsFitElsewhere"], false);
  for (const auto& m : best["moves"]) {
    EXPECT_EQ(m["canBeReplaced"], false);
    EXPECT_NE(m["whyNot"].get<std::string>().find("nowhere right now"), std::string::npos)
        << m.dump();
  }
}

TEST_F(DefragCmdTest, FitsNowNeedsNothing) {
  Add(Node("node-c", Register({{"GPU-c0"}}, kProfiles)));
  const json r = RunJson({"defrag", "--for", "3g.20gb"}, 0);
  EXPECT_EQ(r["plans"][0]["node"], "node-c");
  EXPECT_EQ(r["plans"][0]["fitsNow"], true);
  auto text = Run({"defrag", "--for", "3g.20gb"});
  EXPECT_NE(text.out.find("3g.20gb fits now on node-c GPU 0 (GPU-c0) at slices"), std::string::npos)
      << text.out;
}

TEST_F(DefragCmdTest, CordonedNodesAreLeftOut) {
  Add(Node("node-c", Register({{"GPU-c0"}}, kProfiles), json::object(), /*cordoned=*/true));
  const json r = RunJson({"defrag", "--for", "3g.20gb"}, 0);
  EXPECT_EQ(r["plans"][0]["node"], "node-a");
  // Named explicitly, it is considered.
  const json c = RunJson({"defrag", "--for", "3g.20gb", "--node", "node-c"}, 0);
  EXPECT_EQ(c["plans"][0]["fitsNow"], true);
}

TEST_F(DefragCmdTest, ProfileNoGpuOffers) {
  const json r = RunJson({"defrag", "--for", "1g.10gb"}, 0);
  EXPECT_EQ(r["found"], false);
  ASSERT_EQ(r["skipped"].size(), 2u);
  EXPECT_EQ(r["skipped"][0]["reason"], "NVIDIA A100-SXM4-40GB offers no 1g.10gb profile");
  auto text = Run({"defrag", "--for", "1g.10gb"});
  EXPECT_NE(text.out.find("No GPU can take 1g.10gb, even after moving pods"), std::string::npos);
}

TEST_F(DefragCmdTest, BadInput) {
  auto bad = Run({"defrag", "--for", "banana"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("neither a profile name"), std::string::npos) << bad.err;
  auto bad_name = Run({"defrag", "--for", "3g.20"});
  EXPECT_EQ(bad_name.code, 2) << bad_name.err;
  EXPECT_EQ(Run({"defrag", "--for", "3g", "--node", "node-z"}).code, 2);
  EXPECT_EQ(Run({"defrag"}).code, 2);  // --for is required
}

}  // namespace
}  // namespace dynmig::ops::testing

namespace dynmig::ops::testing {
namespace {

class DefragApplyTest : public DefragCmdTest {
 protected:
  void AddWaiting() {
    json p = Pod("wants3g", "", 19000, "Pending");
    p["spec"]["schedulerName"] = "dynmig-scheduler";
    Add(p);
  }
  void AddControlled(const std::string& name, uint32_t start) {
    json p = PlacedPod(name, "node-a", 4000, {{"GPU-a0", "1g.5gb", start, 1, std::nullopt}});
    p["metadata"]["ownerReferences"] = json::array({{{"apiVersion", "apps/v1"},
                                                     {"kind", "ReplicaSet"},
                                                     {"name", "rs"},
                                                     {"uid", "rs-1"},
                                                     {"controller", true}}});
    Add(p);
  }
  bool Exists(const std::string& name) {
    auto p = server_->store().Get(kube::Resource::kPods, "default", name);
    return p.ok() && !kube::IsBeingDeleted(*p);
  }
};

TEST_F(DefragApplyTest, WithoutAControllerNothingIsEvicted) {
  AddWaiting();
  auto r = Run({"defrag", "--for", "3g", "--pod", "wants3g", "--apply"});
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.err.find("no controller owns it"), std::string::npos) << r.err << r.out;
  EXPECT_TRUE(Exists("small-a"));
  EXPECT_TRUE(Exists("small-b"));
  // --apply without --pod is refused.
  auto bad = Run({"defrag", "--for", "3g", "--apply"});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--pod"), std::string::npos) << bad.err;
}

TEST_F(DefragApplyTest, ApplyEvictsThePlanReservesAndExplainShowsTheTrail) {
  // Replace the fixture's small pods with controlled ones at the same slices.
  kube::DeleteOptions at_once;
  at_once.grace_period_seconds = 0;
  ASSERT_TRUE(server_->store().Delete(kube::Resource::kPods, "default", "small-a", at_once).ok());
  ASSERT_TRUE(server_->store().Delete(kube::Resource::kPods, "default", "small-b", at_once).ok());
  AddControlled("ctl-a", 1);
  AddControlled("ctl-b", 5);
  AddWaiting();
  const json dry = RunJson({"defrag", "--for", "3g", "--pod", "wants3g", "--dry-run"}, 0);
  EXPECT_EQ(dry["evicted"], json::array({"default/ctl-b"})) << dry.dump(2);
  EXPECT_TRUE(Exists("ctl-b"));
  // Another profile than the pod's request: refused before anything is done.
  auto other = Run({"defrag", "--for", "7g", "--pod", "wants3g", "--apply"});
  EXPECT_NE(other.code, 0);
  EXPECT_NE(other.err.find("would get 3g.20gb"), std::string::npos) << other.err;
  const json r = RunJson({"defrag", "--for", "3g", "--pod", "wants3g", "--apply"}, 0);
  EXPECT_EQ(r["executed"], true) << r.dump(2);
  EXPECT_EQ(r["evicted"], json::array({"default/ctl-b"}));
  EXPECT_EQ(r["gpu"], "GPU-a0");
  EXPECT_EQ(r["placement"]["start"], 4);
  EXPECT_FALSE(Exists("ctl-b"));
  EXPECT_TRUE(Exists("ctl-a"));
  auto node = server_->store().Get(kube::Resource::kNodes, "", "node-a");
  ASSERT_TRUE(node.ok());
  auto hold = kube::Annotation(*node, protocol::kNodeDefragReservationAnnotation);
  ASSERT_TRUE(hold.has_value());
  EXPECT_NE(hold->find("default/wants3g"), std::string::npos) << *hold;
  auto explain = Run({"explain", "wants3g"});
  EXPECT_NE(explain.out.find("waiting: defragmentation of GPU-a0 on node-a evicted default/ctl-b; "
                             "reserved slices 4-7 (3g.20gb) until"),
            std::string::npos)
      << explain.out;
  // A second --apply for the same pod is refused: a plan is in flight.
  auto again = Run({"defrag", "--for", "3g", "--pod", "wants3g", "--apply"});
  EXPECT_NE(again.code, 0);
  EXPECT_NE(again.err.find("reserved by defragmentation already"), std::string::npos) << again.err;
}

}  // namespace
}  // namespace dynmig::ops::testing
