#include "ops/preflight.h"

#include "ops/ops_test_util.h"

namespace dynmig::ops::testing {
namespace {

class PreflightTest : public OpsTest {
 protected:
  // A node ready for handover: cordoned, current register format, no MIG Manager, no workloads.
  void ReadyNode(const std::string& name = "node-a", json labels = json::object()) {
    Add(Node(name, Register({{"GPU-" + name + "-0"}}), labels, /*cordoned=*/true));
  }
};

TEST_F(PreflightTest, HandoverReadyNodePasses) {
  ReadyNode();
  AddDeviceConfig();
  const json r = RunJson({"preflight", "--node", "node-a"}, 0);
  EXPECT_EQ(r["ok"], true);
  EXPECT_EQ(r["summary"]["fail"], 0);
  for (const char* check : {"legacy-pods", "register-format", "mig-manager", "cordoned",
                            "gpu-workloads", "legacy-scheduler", "device-config"}) {
    EXPECT_EQ(Result(r, check), "PASS") << check << "\n" << r.dump(2);
  }
  // The readable form.
  auto text = Run({"preflight", "--node", "node-a"});
  EXPECT_EQ(text.code, 0);
  EXPECT_NE(text.out.find("RESULT  NODE"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("preflight: 7 passed, 0 failed"), std::string::npos) << text.out;
}

TEST_F(PreflightTest, LegacyPodBlocks) {
  ReadyNode();
  AddDeviceConfig();
  json legacy = Pod("old-train", "node-a", 4000);
  Annotate(legacy, protocol::kDevicesAllocatedAnnotation,
           "GPU-node-a-0[1-2],NVIDIA A100-SXM4-40GB,5120,14:;");
  Add(legacy);
  const json r = RunJson({"preflight", "--node", "node-a"}, 1);
  EXPECT_EQ(Result(r, "legacy-pods"), "FAIL");
  EXPECT_NE(Evidence(r, "legacy-pods")
                .find("default/old-train: GPU-node-a-0[1-2] "
                      "(hami.io/vgpu-devices-allocated)"),
            std::string::npos)
      << Evidence(r, "legacy-pods");
  EXPECT_EQ(Result(r, "gpu-workloads"), "FAIL");
}

TEST_F(PreflightTest, LegacyIdentityInUndecodableListIsFound) {
  ReadyNode();
  AddDeviceConfig();
  json legacy = Pod("odd", "node-a", 4000);
  Annotate(legacy, protocol::kDevicesToAllocateAnnotation, "GPU-x[0-3],garbage:;");
  Add(legacy);
  const json r = RunJson({"preflight", "--node", "node-a"}, 1);
  EXPECT_NE(Evidence(r, "legacy-pods").find("GPU-x[0-3]"), std::string::npos);
}

TEST_F(PreflightTest, LegacyRegisterFormatBlocks) {
  Add(Node("node-a",
           R"([{"id":"GPU-a","count":7,"devmem":40960,"type":"NVIDIA A100-SXM4-40GB","mode":"mig",)"
           R"("health":true,"migtemplate":[{"name":"1g.5gb","memory":5120,"count":7}]}])",
           json::object(), true));
  AddDeviceConfig();
  const json r = RunJson({"preflight", "--node", "node-a"}, 1);
  EXPECT_EQ(Result(r, "register-format"), "FAIL");
  EXPECT_NE(Evidence(r, "register-format").find("migtemplate"), std::string::npos)
      << Evidence(r, "register-format");
}

TEST_F(PreflightTest, MigManagerLabelsBlock) {
  ReadyNode("node-a", {{"nvidia.com/mig.config", "all-1g.5gb"},
                       {"nvidia.com/mig.config.state", "success"},
                       {"nvidia.com/mig.strategy", "mixed"}});
  AddDeviceConfig();
  const json r = RunJson({"preflight", "--node", "node-a"}, 1);
  EXPECT_EQ(Result(r, "mig-manager"), "FAIL");
  const std::string ev = Evidence(r, "mig-manager");
  EXPECT_NE(ev.find("nvidia.com/mig.config=all-1g.5gb and MIG Manager is not disabled"),
            std::string::npos)
      << ev;
  EXPECT_NE(ev.find("label nvidia.com/mig.config.state=success"), std::string::npos) << ev;
  EXPECT_NE(ev.find("label nvidia.com/mig.strategy=mixed"), std::string::npos) << ev;
}

TEST_F(PreflightTest, DisabledMigManagerWithLeftoverLabelWarns) {
  ReadyNode("node-a", {{"nvidia.com/mig.config", "all-1g.5gb"},
                       {"nvidia.com/gpu.deploy.mig-manager", "false"}});
  AddDeviceConfig();
  const json r = RunJson({"preflight", "--node", "node-a"}, 0);
  EXPECT_EQ(Result(r, "mig-manager"), "WARN");
}

TEST_F(PreflightTest, RunningMigManagerPodBlocks) {
  ReadyNode("node-a", {{"nvidia.com/gpu.deploy.mig-manager", "false"}});
  AddDeviceConfig();
  json mm = Pod("nvidia-mig-manager-x7k2p", "node-a", 0);
  mm["metadata"]["namespace"] = "gpu-operator";
  mm["spec"]["containers"][0]["image"] = "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.6.0";
  mm["spec"]["containers"][0]["resources"] = json::object();
  Add(mm);
  const json r = RunJson({"preflight", "--node", "node-a"}, 1);
  EXPECT_EQ(Result(r, "mig-manager"), "FAIL");
  EXPECT_NE(Evidence(r, "mig-manager").find("gpu-operator/nvidia-mig-manager-x7k2p (Running)"),
            std::string::npos)
      << Evidence(r, "mig-manager");
  EXPECT_EQ(Result(r, "gpu-workloads"), "PASS");  // it asks for no GPU
}

TEST_F(PreflightTest, UncordonedNodeBlocks) {
  Add(Node("node-a", Register({{"GPU-a"}})));
  AddDeviceConfig();
  const json r = RunJson({"preflight", "--node", "node-a"}, 1);
  EXPECT_EQ(Result(r, "cordoned"), "FAIL");
  EXPECT_NE(Evidence(r, "cordoned").find("kubectl cordon node-a"), std::string::npos);
}

TEST_F(PreflightTest, RunningGpuWorkloadBlocks) {
  ReadyNode();
  AddDeviceConfig();
  Add(PlacedPod("infer", "node-a", 4000,
                {{"GPU-node-a-0", "1g.5gb", 0, 1, Runtime{"MIG-1", 7, 0}}}));
  Add(Pod("done", "node-a", 4000, "Succeeded"));  // terminated: not a workload
  const json r = RunJson({"preflight", "--node", "node-a"}, 1);
  EXPECT_EQ(Result(r, "gpu-workloads"), "FAIL");
  const std::string ev = Evidence(r, "gpu-workloads");
  EXPECT_NE(ev.find("1 active GPU workload on the node"), std::string::npos) << ev;
  EXPECT_NE(ev.find("default/infer (Running)"), std::string::npos) << ev;
  EXPECT_EQ(ev.find("default/done"), std::string::npos) << ev;
}

TEST_F(PreflightTest, LegacySchedulerStillServingBlocks) {
  ReadyNode();
  AddDeviceConfig();
  json legacy = Pod("hami-scheduler-7d9f8-abcde", "", 0, "Running", 1, "kube-system");
  legacy["spec"]["containers"][0]["image"] = "projecthami/hami:v2.4.1";
  legacy["spec"]["containers"][0]["resources"] = json::object();
  Add(legacy);
  json ours = Pod("hami-scheduler-5c6d7-zzzzz", "", 0, "Running", 1, "kube-system");
  ours["spec"]["containers"][0]["image"] = "registry.example/dynmig:0.1.0";
  ours["spec"]["containers"][0]["resources"] = json::object();
  Add(ours);
  const json r = RunJson({"preflight", "--node", "node-a"}, 1);
  EXPECT_EQ(Result(r, "legacy-scheduler"), "FAIL");
  const std::string ev = Evidence(r, "legacy-scheduler");
  EXPECT_NE(ev.find("kube-system/hami-scheduler-7d9f8-abcde"), std::string::npos) << ev;
  EXPECT_EQ(ev.find("zzzzz"), std::string::npos) << ev;
}

TEST(LegacySchedulerHeuristicTest, NamesImagesAndExclusions) {
  auto pod = [](const std::string& name, const std::string& cname, const std::string& image) {
    json p = Pod(name, "", 0, "Running", 1, "kube-system");
    p["spec"]["containers"][0]["name"] = cname;
    p["spec"]["containers"][0]["image"] = image;
    return p;
  };
  EXPECT_TRUE(
      IsLegacySchedulerPod(pod("sched-0", "vgpu-scheduler-extender", "projecthami/hami:v2.3")));
  EXPECT_TRUE(IsLegacySchedulerPod(pod("x", "x", "4paradigm/k8s-vgpu-scheduler:v2.2")));
  EXPECT_FALSE(IsLegacySchedulerPod(pod("hami-scheduler-0", "ext", "ghcr.io/acme/dynmig:1")));
  EXPECT_FALSE(IsLegacySchedulerPod(pod("web", "web", "nginx")));
  json finished = pod("hami-scheduler-old", "x", "projecthami/hami:v2.4");
  finished["status"]["phase"] = "Succeeded";
  EXPECT_FALSE(IsLegacySchedulerPod(finished));
}

TEST_F(PreflightTest, KnownMigGeometriesInTheConfigMapBlock) {
  ReadyNode();
  AddDeviceConfig(kLegacyConfig);
  const json r = RunJson({"preflight", "--node", "node-a"}, 1);
  EXPECT_EQ(Result(r, "device-config"), "FAIL");
  const std::string ev = Evidence(r, "device-config");
  EXPECT_NE(ev.find("ConfigMap kube-system/hami-scheduler-device still holds knownMigGeometries"),
            std::string::npos)
      << ev;
  EXPECT_NE(ev.find("dynmig config migrate"), std::string::npos) << ev;
}

TEST_F(PreflightTest, KnownMigGeometriesInAFileBlock) {
  ReadyNode();
  AddDeviceConfig();  // the cluster's is fine; the file given wins
  const std::string file = (dir_ / "old.yaml").string();
  std::ofstream(file) << kLegacyConfig;
  const json r = RunJson({"preflight", "--node", "node-a", "--device-config", file}, 1);
  EXPECT_EQ(Result(r, "device-config"), "FAIL");
  EXPECT_NE(Evidence(r, "device-config").find("file " + file), std::string::npos);
}

TEST_F(PreflightTest, MissingConfigWarns) {
  ReadyNode();
  const json r = RunJson({"preflight", "--node", "node-a"}, 0);
  EXPECT_EQ(Result(r, "device-config"), "WARN");
}

TEST_F(PreflightTest, BadInputExitsTwo) {
  ReadyNode();
  auto unknown = Run({"preflight", "--node", "node-x"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.err.find("node \"node-x\" not found"), std::string::npos) << unknown.err;
  auto missing = Run({"preflight", "--device-config", (dir_ / "nope.yaml").string()});
  EXPECT_EQ(missing.code, 2) << missing.err;
  auto format = Run({"preflight", "-o", "xml"});
  EXPECT_EQ(format.code, 2);
  EXPECT_NE(format.err.find("unknown output format \"xml\""), std::string::npos);
}

TEST_F(PreflightTest, EveryGpuNodeByDefaultAndYamlOutput) {
  ReadyNode("node-a");
  Add(Node("node-b", Register({{"GPU-b"}})));  // not cordoned
  Add(Node("cpu-1", "", json::object()));
  // cpu-1 has GPU capacity in the builder; remove it to make it a CPU node.
  auto cpu = server_->store().Get(kube::Resource::kNodes, "", "cpu-1");
  ASSERT_TRUE(cpu.ok());
  json plain = *cpu;
  plain["status"].erase("capacity");
  ASSERT_TRUE(server_->store().Update(kube::Resource::kNodes, "", "cpu-1", plain, "status").ok());
  AddDeviceConfig();
  auto r = Run({"preflight", "-o", "yaml"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.out.find("command: \"preflight\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("node: \"node-b\""), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("cpu-1"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace dynmig::ops::testing
