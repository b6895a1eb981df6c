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
