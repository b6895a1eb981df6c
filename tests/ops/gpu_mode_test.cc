// `dynmig gpu mode` (ops/gpu_mode) against the in-memory API server: the status table, a request
// written beside the others, and every refusal (no status, not switchable, node locked, bad
// input, an existing request that does not decode) changing nothing.
#include "ops/gpu_mode.h"

#include "ops/ops_test_util.h"
#include "protocol/gpu_mode_switch.h"
#include "protocol/node_lock.h"

namespace dynmig::ops::testing {
namespace {

using protocol::GpuMode;
using protocol::GpuModePhase;
using protocol::GpuModeRequest;
using protocol::GpuModeStatus;

class GpuModeTest : public OpsTest {
 protected:
  void SetUp() override {
    OpsTest::SetUp();
    AddDeviceConfig();
    json node = Node("node-a", Register({{"GPU-a0"}, {"GPU-a1"}}));
    GpuModeStatus s0{"GPU-a0",      GpuMode::kMig,         true, true,
                     1764820000000, GpuModePhase::kSteady, 0,    ""};
    GpuModeStatus s1{"GPU-a1",      GpuMode::kMig,          true, false,
                     1764820000000, GpuModePhase::kRefused, 5,    "needs a reboot"};
    node["metadata"]["annotations"][std::string(protocol::kGpuModeStatusAnnotation)] =
        protocol::EncodeGpuModeStatuses({s0, s1});
    Add(node);
  }
  std::optional<std::string> NodeAnnotation(std::string_view key) {
    auto node = client_->GetNode("node-a");
    EXPECT_TRUE(node.ok()) << node.status();
    return kube::Annotation(*node, key);
  }
  void Annotate(std::string_view key, const std::string& value) {
    kube::KeyPatch patch;
    patch[std::string(key)] = value;
    ASSERT_TRUE(client_->PatchNodeAnnotations("node-a", patch).ok());
  }
};

TEST_F(GpuModeTest, ShowsStatusesAndWritesOneRequest) {
  auto r = Run({"gpu", "mode", "--node", "node-a"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("GPU 0 GPU-a0: mig, switchable"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GPU 1 GPU-a1: mig, not switchable"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("needs a reboot"), std::string::npos) << r.out;

  r = Run({"gpu", "mode", "--node", "node-a", "--gpu", "0", "--to", "hami-core", "--reason",
           "training job", "--by", "alice"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("asked to switch to hami-core"), std::string::npos) << r.out;
  auto value = NodeAnnotation(protocol::kGpuModeRequestAnnotation);
  ASSERT_TRUE(value.has_value());
  auto requests = protocol::DecodeGpuModeRequests(*value);
  ASSERT_TRUE(requests.ok()) << requests.status();
  ASSERT_EQ(requests->size(), 1u);
  EXPECT_EQ((*requests)[0].gpu_uuid, "GPU-a0");
  EXPECT_EQ((*requests)[0].to, GpuMode::kWholeGpu);
  EXPECT_EQ((*requests)[0].by, "operator:alice");
  EXPECT_EQ((*requests)[0].reason, "training job");
  EXPECT_GT((*requests)[0].at_ms, 0);

  // Shown as held until the plugin answers it; a second request replaces the first, later.
  r = Run({"gpu", "mode", "--node", "node-a"});
  EXPECT_NE(r.out.find("not answered yet"), std::string::npos) << r.out;
  const json j = RunJson(
      {"gpu", "mode", "--node", "node-a", "--gpu", "GPU-a0", "--to", "mig", "--by", "bob"}, 0);
  EXPECT_EQ(j["changed"], true);
  requests = protocol::DecodeGpuModeRequests(*NodeAnnotation(protocol::kGpuModeRequestAnnotation));
  ASSERT_TRUE(requests.ok());
  ASSERT_EQ(requests->size(), 1u);
  EXPECT_EQ((*requests)[0].to, GpuMode::kMig);
  EXPECT_GT(j["at"].get<int64_t>(), 0);
}

TEST_F(GpuModeTest, RefusalsNameTheCauseAndWriteNothing) {
  struct Case {
    std::vector<std::string> args;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"--gpu", "1", "--to", "hami-core"}, "is not switchable: needs a reboot"},
      {{"--gpu", "7", "--to", "hami-core"}, "registers no GPU \"7\""},
      {{"--gpu", "0", "--to", "off"}, "--to: must be mig or hami-core"},
      {{"--gpu", "0"}, "--gpu and --to go together"},
      {{"--gpu", "0", "--to", "hami-core", "--reason", std::string(300, 'x')},
       "--reason: 300 characters"},
      {{"--gpu", "0", "--to", "hami-core", "--reason", "a\nb"}, "--reason: control characters"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"gpu", "mode", "--node", "node-a"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    auto r = Run(args);
    EXPECT_EQ(r.code, 2) << c.error;
    EXPECT_NE(r.err.find(c.error), std::string::npos) << r.err;
    EXPECT_FALSE(NodeAnnotation(protocol::kGpuModeRequestAnnotation).has_value()) << c.error;
  }
  // Already in that mode with no request: nothing to write.
  auto r = Run({"gpu", "mode", "--node", "node-a", "--gpu", "0", "--to", "mig"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("already is in mode mig"), std::string::npos) << r.out;
  EXPECT_FALSE(NodeAnnotation(protocol::kGpuModeRequestAnnotation).has_value());

  // A pod holds the node lock: wait.
  Annotate(protocol::kNodeLockAnnotation,
           protocol::FormatNodeLock({absl::Now(), "default", "p", ""}));
  r = Run({"gpu", "mode", "--node", "node-a", "--gpu", "0", "--to", "hami-core"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("is locked by default/p"), std::string::npos) << r.err;
  EXPECT_FALSE(NodeAnnotation(protocol::kGpuModeRequestAnnotation).has_value());

  // An existing request that does not decode is named and left as it is.
  Annotate(protocol::kGpuModeRequestAnnotation, "{garbage");
  r = Run({"gpu", "mode", "--node", "node-a"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("dynmig.io/gpu-mode-request"), std::string::npos) << r.err;
  EXPECT_EQ(NodeAnnotation(protocol::kGpuModeRequestAnnotation), "{garbage");

  // No status at all: switching is not configured on the node.
  Add(Node("node-b", Register({{"GPU-b0"}})));
  r = Run({"gpu", "mode", "--node", "node-b", "--gpu", "0", "--to", "hami-core"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("publishes no dynmig.io/gpu-mode"), std::string::npos) << r.err;
  r = Run({"gpu", "mode", "--node", "nowhere"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("not found"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dynmig::ops::testing
