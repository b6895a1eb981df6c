// `dynmig gpu cordon|uncordon` (ops/gpu_cordon) against the in-memory API server, and `dynmig
// explain` saying when a pod waits for a cordoned GPU.
#include "ops/gpu_cordon.h"

#include "ops/ops_test_util.h"
#include "protocol/device_cordon.h"

namespace dynmig::ops::testing {
namespace {

class GpuCordonTest : public OpsTest {
 protected:
  void SetUp() override {
    OpsTest::SetUp();
    AddDeviceConfig();
    Add(Node("node-a", Register({{"GPU-a0"}, {"GPU-a1"}})));
  }
  std::optional<std::string> NodeAnnotation(std::string_view key) {
    auto node = client_->GetNode("node-a");
    EXPECT_TRUE(node.ok()) << node.status();
    return kube::Annotation(*node, key);
  }
};

TEST_F(GpuCordonTest, CordonsByIndexOrUuidWithAReasonAndUncordons) {
  auto r = Run(
      {"gpu", "cordon", "--node", "node-a", "--gpu", "1", "--reason", "bad ECC", "--by", "alice"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("GPU 1 (GPU-a1) of node node-a cordoned (bad ECC (by alice))"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(NodeAnnotation(protocol::kDeviceCordonAnnotation), "GPU-a1");
  EXPECT_EQ(NodeAnnotation(protocol::kDeviceCordonReasonsAnnotation),
            R"j({"GPU-a1":"bad ECC (by alice)"})j");
  r = Run({"gpu", "cordon", "--node", "node-a", "--gpu", "GPU-a1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("already cordoned"), std::string::npos) << r.out;
  const json j =
      RunJson({"gpu", "cordon", "--node", "node-a", "--gpu", "GPU-a0", "--by", "bob"}, 0);
  EXPECT_EQ(j["changed"], true);
  EXPECT_EQ(j["index"], 0);
  EXPECT_EQ(NodeAnnotation(protocol::kDeviceCordonAnnotation), "GPU-a0,GPU-a1");

  r = Run({"gpu", "uncordon", "--node", "node-a", "--gpu", "1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("uncordoned"), std::string::npos) << r.out;
  EXPECT_EQ(NodeAnnotation(protocol::kDeviceCordonAnnotation), "GPU-a0");
  EXPECT_EQ(NodeAnnotation(protocol::kDeviceCordonReasonsAnnotation), R"({"GPU-a0":"by bob"})");
  ASSERT_EQ(Run({"gpu", "uncordon", "--node", "node-a", "--gpu", "GPU-a0"}).code, 0);
  EXPECT_FALSE(NodeAnnotation(protocol::kDeviceCordonAnnotation).has_value());
  EXPECT_FALSE(NodeAnnotation(protocol::kDeviceCordonReasonsAnnotation).has_value());
  r = Run({"gpu", "uncordon", "--node", "node-a", "--gpu", "GPU-a0"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("already not cordoned"), std::string::npos) << r.out;
}

TEST_F(GpuCordonTest, BadInputIsRefusedNamingItAndChangesNothing) {
  auto r = Run({"gpu", "cordon", "--node", "node-a", "--gpu", "7"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("registers no GPU \"7\" (it has: 0 GPU-a0, 1 GPU-a1)"), std::string::npos)
      << r.err;
  r = Run({"gpu", "cordon", "--node", "node-a", "--gpu", "GPU-" + std::string(5000, 'x')});
  EXPECT_EQ(r.code, 2);
  EXPECT_LT(r.err.size(), 400u) << "the bad value is shortened";
  r = Run({"gpu", "cordon", "--node", "nope", "--gpu", "0"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("node \"nope\" not found"), std::string::npos) << r.err;
  r = Run({"gpu", "cordon", "--node", "node-a", "--gpu", "0", "--reason", "two\nlines"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--reason: control character"), std::string::npos) << r.err;
  r = Run({"gpu", "cordon", "--node", "node-a", "--gpu", "0", "--reason", std::string(300, 'r')});
  EXPECT_EQ(r.code, 2);
  EXPECT_FALSE(NodeAnnotation(protocol::kDeviceCordonAnnotation).has_value());

  // A hand-written value that does not parse is named and left alone.
  ASSERT_TRUE(client_
                  ->PatchNodeAnnotations("node-a", {{std::string(protocol::kDeviceCordonAnnotation),
                                                     "GPU-a0,bad uuid"}})
                  .ok());
  r = Run({"gpu", "cordon", "--node", "node-a", "--gpu", "1"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("hami.io/device-cordon: entry 1"), std::string::npos) << r.err;
  EXPECT_EQ(NodeAnnotation(protocol::kDeviceCordonAnnotation), "GPU-a0,bad uuid");

  // Uncordon takes a UUID the node no longer registers but the list still holds.
  ASSERT_TRUE(client_
                  ->PatchNodeAnnotations(
                      "node-a", {{std::string(protocol::kDeviceCordonAnnotation), "GPU-gone"}})
                  .ok());
  r = Run({"gpu", "uncordon", "--node", "node-a", "--gpu", "GPU-gone"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(NodeAnnotation(protocol::kDeviceCordonAnnotation).has_value());
}

TEST_F(GpuCordonTest, ExplainSaysAPodWaitsForACordonedGpu) {
  // GPU-a1 is full; GPU-a0 would take the 7g but is cordoned.
  Add(PlacedPod("full", "node-a", 40000, {{"GPU-a1", "7g.40gb", 0, 8, Runtime{"MIG-f", 0, 0}}}));
  ASSERT_EQ(Run({"gpu", "cordon", "--node", "node-a", "--gpu", "0", "--reason", "bad ECC", "--by",
                 "alice"})
                .code,
            0);
  Add(Pod("wants-7g", "", 40000, "Pending"));
  const json r = RunJson({"explain", "wants-7g"}, 0);
  EXPECT_EQ(r["status"], "pending") << r.dump(2);
  ASSERT_EQ(r["cordonedGpus"].size(), 1u) << r.dump(2);
  EXPECT_EQ(r["cordonedGpus"][0]["gpu"], "GPU-a0");
  EXPECT_EQ(r["cordonedGpus"][0]["node"], "node-a");
  auto text = Run({"explain", "wants-7g"});
  EXPECT_NE(text.out.find("waiting: GPU 0 (GPU-a0) of node node-a is cordoned "
                          "(hami.io/device-cordon): bad ECC (by alice)"),
            std::string::npos)
      << text.out;
  // Uncordoned, it fits now; nothing is said about a cordon.
  ASSERT_EQ(Run({"gpu", "uncordon", "--node", "node-a", "--gpu", "0"}).code, 0);
  const json after = RunJson({"explain", "wants-7g"}, 0);
  EXPECT_EQ(after["status"], "fits-now");
  EXPECT_FALSE(after.contains("cordonedGpus"));
}

}  // namespace
}  // namespace dynmig::ops::testing
