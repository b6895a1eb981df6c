#include "ops/explain.h"

#include <regex>

#include "ops/ops_test_util.h"
#include "protocol/gpu_mode.h"
#include "protocol/gpu_mode_switch.h"

namespace dynmig::ops::testing {
namespace {

const std::vector<std::string> kExplainProfiles = {"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb",
                                                   "7g.40gb"};

class ExplainTest : public OpsTest {
 protected:
  void SetUp() override {
    OpsTest::SetUp();
    AddDeviceConfig();
    // node-a: 1g at 1 and 1g at 5, six slices free but both 3g placements cut.
    Add(Node("node-a", Register({{"GPU-a0"}}, kExplainProfiles)));
    Add(PlacedPod("small-a", "node-a", 4000,
                  {{"GPU-a0", "1g.5gb", 1, 1, Runtime{"MIG-sa", 9, 0}}}));
    Add(PlacedPod("small-b", "node-a", 4000,
                  {{"GPU-a0", "1g.5gb", 5, 1, Runtime{"MIG-sb", 13, 0}}}));
    // node-b: full.
    Add(Node("node-b", Register({{"GPU-b0"}}, kExplainProfiles)));
    Add(PlacedPod("big-c", "node-b", 19000, {{"GPU-b0", "3g.20gb", 0, 4, Runtime{"MIG-c", 1, 0}}}));
    Add(PlacedPod("big-d", "node-b", 19000, {{"GPU-b0", "3g.20gb", 4, 4, Runtime{"MIG-d", 2, 0}}}));
  }
};

TEST_F(ExplainTest, PendingPodGetsVerdictsSuggestionsAndBlockingPods) {
  Add(Pod("wants-3g", "", 19000, "Pending"));
  const json r = RunJson({"explain", "wants-3g"}, 0);
  EXPECT_EQ(r["status"], "pending") << r.dump(2);
  ASSERT_EQ(r["nodes"].size(), 2u);
  EXPECT_EQ(r["nodes"][0]["verdict"], "fragmented");
  EXPECT_EQ(r["nodes"][1]["verdict"], "capacity-exhausted");
  EXPECT_NE(r["nodes"][0]["gpus"][0]["reason"].get<std::string>().find("fragmented"),
            std::string::npos);
  const json& s = r["suggestions"];
  EXPECT_EQ(s["largestMemoryMiB"], 10240);  // nominal sizing: 2g.10gb covers 10 x 1024
  EXPECT_EQ(s["largestMemoryProfile"], "2g.10gb");
  EXPECT_TRUE(s["preferences"].empty());
  ASSERT_FALSE(s["blocking"].empty());
  const json& b = s["blocking"][0];
  EXPECT_EQ(b["node"], "node-a");
  EXPECT_EQ(b["profile"], "3g.20gb");
  ASSERT_EQ(b["pods"].size(), 1u);
  EXPECT_EQ(b["moves"][0]["canBeReplaced"], true) << b.dump(2);
  EXPECT_NE(b["moves"][0]["replacement"].get<std::string>().find("on node-a"), std::string::npos);

  auto text = Run({"explain", "wants-3g"});
  EXPECT_EQ(text.code, 0);
  EXPECT_NE(text.out.find("Asks for container \"workload\": 1 x 19000 MiB"), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("node-a: fragmented"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("at most 10240 MiB per instance"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("before"), std::string::npos) << text.out;
  EXPECT_TRUE(std::regex_search(text.out, std::regex(R"(after +.*\{ +3g\.20gb +\})"))) << text.out;
}

TEST_F(ExplainTest, PlacedPodShowsItsInstances) {
  const json r = RunJson({"explain", "small-a"}, 0);
  EXPECT_EQ(r["status"], "placed");
  EXPECT_EQ(r["node"], "node-a");
  EXPECT_EQ(r["allocations"][0]["migUUID"], "MIG-sa");
  auto text = Run({"explain", "-n", "default", "small-a"});
  EXPECT_NE(text.out.find("Placed on node-a (bind-phase success)"), std::string::npos) << text.out;
  EXPECT_NE(
      text.out.find("1g.5gb (4864 MiB in NVML) at slices 1 of GPU 0 (GPU-a0), MIG-sa (GI 9, CI 0)"),
      std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("{small-a}"), std::string::npos) << text.out;  // highlighted
}

TEST_F(ExplainTest, PodThatFitsNowIsWaitingOutsideTheExtender) {
  json p = Pod("wants-1g", "", 4000, "Pending");
  p["status"]["conditions"] = {{{"type", "PodScheduled"},
                                {"status", "False"},
                                {"reason", "Unschedulable"},
                                {"message", "0/2 nodes are available"}}};
  Add(p);
  const json r = RunJson({"explain", "wants-1g"}, 0);
  EXPECT_EQ(r["status"], "fits-now");
  EXPECT_EQ(r["wouldPlaceOn"], "node-a");
  EXPECT_EQ(r["podScheduledCondition"], "Unschedulable: 0/2 nodes are available");
  ASSERT_FALSE(r["suggestions"]["preferences"].empty());
  EXPECT_EQ(r["suggestions"]["preferences"][0]["preference"], "1g");
}

TEST_F(ExplainTest, CordonedNodesAreNotOffered) {
  Add(Node("node-c", Register({{"GPU-c0"}}, kExplainProfiles), json::object(), /*cordoned=*/true));
  Add(Pod("wants-7g", "", 40000, "Pending"));
  const json r = RunJson({"explain", "wants-7g"}, 0);
  EXPECT_EQ(r["status"], "pending");
  EXPECT_EQ(r["nodes"][2]["name"], "node-c");
  EXPECT_EQ(r["nodes"][2]["cordoned"], true);
  EXPECT_EQ(r["nodes"][2]["verdict"], "fits");
  auto text = Run({"explain", "wants-7g"});
  EXPECT_NE(text.out.find("node-c: fits (cordoned: kube-scheduler does not offer it)"),
            std::string::npos)
      << text.out;
}

TEST_F(ExplainTest, NoProfileBigEnough) {
  Add(Pod("huge", "", 50000, "Pending"));
  const json r = RunJson({"explain", "huge"}, 0);
  EXPECT_EQ(r["nodes"][0]["verdict"], "no-profile-big-enough");
  EXPECT_TRUE(r["suggestions"]["blocking"].empty());
}

TEST_F(ExplainTest, NotMigAndInvalidRequests) {
  json web = Pod("web", "", 0, "Pending");
  web["spec"]["containers"][0]["resources"] = json::object();
  Add(web);
  EXPECT_EQ(RunJson({"explain", "web"}, 0)["status"], "not-mig");
  json bad = Pod("bad", "", 0, "Pending");
  bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "8Gi";
  Add(bad);
  const json r = RunJson({"explain", "bad"}, 0);
  EXPECT_EQ(r["status"], "invalid-request");
  EXPECT_NE(r["error"].get<std::string>().find("\"8Gi\" has a binary suffix"), std::string::npos);
  auto missing = Run({"explain", "-n", "other", "nope"});
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("pod \"nope\" not found in namespace \"other\""), std::string::npos);
}

// Whole-GPU pods (nvidia.com/vgpu-mode: hami-core): where they are, or why they wait.
class WholeExplainTest : public OpsTest {
 protected:
  void SetUp() override {
    OpsTest::SetUp();
    std::string reg = Register({{"GPU-m0"}});
    auto infos = protocol::DecodeNodeRegister(reg);
    ASSERT_TRUE(infos.ok());
    infos->push_back(
        protocol::WholeGpuDeviceInfo({"GPU-w1", 1, 0, true}, "NVIDIA H100 80GB HBM3", 81559));
    Add(Node("node-w", protocol::EncodeNodeRegister(*infos)));
  }
};

TEST_F(WholeExplainTest, SaysWhereAWholeGpuPodIsAndWhyAnotherWaits) {
  AddDeviceConfig(std::string(kDeviceConfig) + "  migModeSwitching: {enabled: true}\n");
  Add(PlacedWholeGpuPod("holder", "node-w", "GPU-w1,NVIDIA H100 80GB HBM3,81559,100:;"));
  Add(WholeGpuPod("waits", ""));
  json r = RunJson({"explain", "waits"}, 0);
  EXPECT_EQ(r["status"], "pending") << r.dump(2);
  EXPECT_EQ(r["mode"], "hami-core");
  EXPECT_EQ(r["nodes"]["node-w"],
            "no whole GPU free for the pod (needs 1, 0 free): 1 GPU in MIG mode, 1 whole GPU in "
            "use by default/holder");
  auto text = Run({"explain", "waits"});
  EXPECT_NE(text.out.find("Asks for workload: 1 whole GPU"), std::string::npos) << text.out;
  r = RunJson({"explain", "holder"}, 0);
  EXPECT_EQ(r["status"], "placed") << r.dump(2);
  EXPECT_EQ(r["node"], "node-w");
  EXPECT_EQ(r["gpus"][0]["gpu"], "GPU-w1");
  EXPECT_EQ(r["gpus"][0]["allocated"], true);
  text = Run({"explain", "holder"});
  EXPECT_NE(text.out.find("container 0: whole GPU GPU-w1 (NVIDIA H100 80GB HBM3, 81559 MiB)\n"),
            std::string::npos)
      << text.out;
  // The holder ends: the waiting pod would fit now.
  ASSERT_TRUE(
      client_->PatchPodStatus("default", "holder", {{"status", {{"phase", "Succeeded"}}}}).ok());
  r = RunJson({"explain", "waits"}, 0);
  EXPECT_EQ(r["status"], "fits-now") << r.dump(2);
  EXPECT_EQ(r["wouldPlace"], "whole GPU GPU-w1 on node-w");
}

TEST_F(WholeExplainTest, SaysWhyTheGpuInMigModeDoesNotSwitchForIt) {
  AddDeviceConfig(std::string(kDeviceConfig) + "  migModeSwitching: {enabled: true}\n");
  Add(PlacedWholeGpuPod("holder", "node-w", "GPU-w1,NVIDIA H100 80GB HBM3,81559,100:;"));
  Add(WholeGpuPod("waits", ""));
  // The device plugin refused GPU-m0's last switch: its host needs a reboot.
  protocol::GpuModeStatus m0;
  m0.gpu_uuid = "GPU-m0";
  m0.mode = protocol::GpuMode::kMig;
  m0.mig_capable = true;
  m0.switchable = false;
  m0.phase = protocol::GpuModePhase::kRefused;
  m0.reason = "needs a reboot (not switchable until the device plugin restarts)";
  protocol::GpuModeStatus w1;
  w1.gpu_uuid = "GPU-w1";
  w1.mode = protocol::GpuMode::kWholeGpu;
  w1.mig_capable = true;
  w1.switchable = true;
  kube::KeyPatch patch;
  patch[std::string(protocol::kGpuModeStatusAnnotation)] =
      protocol::EncodeGpuModeStatuses({m0, w1});
  ASSERT_TRUE(client_->PatchNodeAnnotations("node-w", patch).ok());
  json r = RunJson({"explain", "waits"}, 0);
  EXPECT_EQ(r["status"], "pending") << r.dump(2);
  ASSERT_TRUE(r.contains("modeSwitching")) << r.dump(2);
  ASSERT_EQ(r["modeSwitching"]["gpus"].size(), 1u) << r.dump(2);  // GPU-w1 is whole already
  EXPECT_NE(r["modeSwitching"]["gpus"][0].dump().find("needs a reboot"), std::string::npos)
      << r.dump(2);
  auto text = Run({"explain", "waits"});
  EXPECT_NE(text.out.find("needs a reboot"), std::string::npos) << text.out;
}

TEST_F(WholeExplainTest, OffWithoutMigModeSwitchingAndInvalidRequestsSaySo) {
  AddDeviceConfig();
  Add(WholeGpuPod("waits", ""));
  json r = RunJson({"explain", "waits"}, 0);
  EXPECT_EQ(r["status"], "whole-gpu-off") << r.dump(2);
  EXPECT_NE(Run({"explain", "waits"}).out.find("only while nvidia.migModeSwitching is enabled"),
            std::string::npos);
  ASSERT_TRUE(
      client_->Delete(kube::Resource::kConfigMaps, "kube-system", "hami-scheduler-device", {})
          .ok());
  AddDeviceConfig(std::string(kDeviceConfig) + "  migModeSwitching: {enabled: true}\n");
  json bad = WholeGpuPod("bad", "");
  bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"] = "50";
  Add(bad);
  r = RunJson({"explain", "bad"}, 0);
  EXPECT_EQ(r["status"], "invalid-request");
  EXPECT_NE(r["error"].get<std::string>().find("asks for a share of a GPU"), std::string::npos);
}

}  // namespace
}  // namespace dynmig::ops::testing
