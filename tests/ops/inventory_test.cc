#include "ops/inventory.h"

#include "ops/ops_test_util.h"

namespace dynmig::ops::testing {
namespace {

json ReadJson(const std::filesystem::path& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in.good()) << p;
  return json::parse(in);
}

std::string ReadText(const std::filesystem::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class InventoryTest : public OpsTest {
 protected:
  void SetUp() override {
    OpsTest::SetUp();
    AddDeviceConfig(kLegacyConfig);
    json mm = {{"apiVersion", "v1"},
               {"kind", "ConfigMap"},
               {"metadata", {{"name", "default-mig-parted-config"}, {"namespace", "gpu-operator"}}},
               {"data",
                {{"config.yaml",
                  "version: v1\nmig-configs:\n  all-1g.5gb:\n    - devices: all\n      "
                  "mig-enabled: true\n      mig-devices:\n        1g.5gb: 7\n"}}}};
    Add(mm);
    Add({{"apiVersion", "v1"},
         {"kind", "ConfigMap"},
         {"metadata", {{"name", "unrelated"}, {"namespace", "default"}}},
         {"data", {{"app.conf", "debug=true"}}}});
    Add(Node("node-a", Register({{"GPU-a0"}}),
             {{"nvidia.com/mig.config", "all-1g.5gb"},
              {"nvidia.com/mig.config.state", "success"},
              {"nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"},
              {"kubernetes.io/os", "linux"}}));
    Add(Node("node-b", Register({{"GPU-b0"}}), json::object(), /*cordoned=*/true));
    json cpu = Node("cpu-1", "");
    cpu["status"].erase("capacity");
    Add(cpu);
    Add(PlacedPod("train", "node-a", 4000, {{"GPU-a0", "1g.5gb", 0, 1, Runtime{"MIG-t", 7, 0}}}));
    json legacy = Pod("old", "node-b", 4000);
    Annotate(legacy, protocol::kDevicesAllocatedAnnotation,
             "GPU-b0[1-2],NVIDIA A100-SXM4-40GB,5120,14:;");
    Add(legacy);
    json web = Pod("web", "node-a", 0);
    web["spec"]["containers"][0]["resources"] = json::object();
    Add(web);
    Add(PlacedPod("finished", "node-a", 4000, {{"GPU-a0", "1g.5gb", 1, 1}}, "Succeeded"));
    nvml_.Set("node-a",
              NvmlDoc("node-a", {{"GPU-a0"}}, {{"GPU-a0", "1g.5gb", 0, 1, 7, 0, "MIG-t"}}));
  }
  FakeNvmlEndpoint nvml_;
};

TEST_F(InventoryTest, BacksUpEverythingTheGuideAsksFor) {
  const auto out = dir_ / "backup";
  const json r = RunJson({"inventory", "--out", out.string(), "--nvml-endpoint", nvml_.Template(),
                          "--nvml-timeout", "2s"},
                         0);
  EXPECT_EQ(r["nodes"], 2);
  EXPECT_EQ(r["migPods"], 2);
  EXPECT_EQ(r["legacyPods"], 1);
  EXPECT_EQ(r["nvmlReachable"], 1);
  EXPECT_EQ(r["nvmlUnreachable"], json::array({"node-b"}));
  EXPECT_EQ(r["configMaps"], json::array({"gpu-operator/default-mig-parted-config",
                                          "kube-system/hami-scheduler-device"}));

  const json cm = ReadJson(out / "configmaps/kube-system_hami-scheduler-device.json");
  EXPECT_NE(cm["data"]["device-config.yaml"].get<std::string>().find("knownMigGeometries"),
            std::string::npos);
  EXPECT_TRUE(
      std::filesystem::exists(out / "configmaps/gpu-operator_default-mig-parted-config.json"));
  EXPECT_FALSE(std::filesystem::exists(out / "configmaps/default_unrelated.json"));

  const json node = ReadJson(out / "nodes/node-a.json");
  EXPECT_EQ(node["labels"]["nvidia.com/mig.config"], "all-1g.5gb");
  EXPECT_EQ(node["labels"]["nvidia.com/mig.config.state"], "success");
  EXPECT_EQ(node["labels"]["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-40GB");
  EXPECT_FALSE(node["labels"].contains("kubernetes.io/os"));
  EXPECT_TRUE(node["annotations"].contains("hami.io/node-nvidia-register"));
  EXPECT_EQ(node["registerDevices"][0]["uuid"], "GPU-a0");
  EXPECT_FALSE(std::filesystem::exists(out / "nodes/cpu-1.json"));
  EXPECT_EQ(ReadJson(out / "nodes/node-b.json")["cordoned"], true);

  const json pods = ReadJson(out / "mig-pods.json")["pods"];
  ASSERT_EQ(pods.size(), 2u);
  EXPECT_EQ(pods[0]["name"], "old");
  EXPECT_EQ(pods[0]["legacyIdentities"][0], "GPU-b0[1-2] (hami.io/vgpu-devices-allocated)");
  EXPECT_EQ(pods[1]["name"], "train");
  EXPECT_EQ(pods[1]["allocations"][0]["migUUID"], "MIG-t");
  EXPECT_EQ(pods[1]["node"], "node-a");
  EXPECT_EQ(pods[1]["requests"][0]["memoryMiB"], 4000);

  const json nv_a = ReadJson(out / "nvml/node-a.json");
  EXPECT_EQ(nv_a["reachable"], true);
  EXPECT_EQ(nv_a["view"]["gpus"][0]["uuid"], "GPU-a0");
  const json nv_b = ReadJson(out / "nvml/node-b.json");
  EXPECT_EQ(nv_b["reachable"], false);
  EXPECT_NE(nv_b["error"].get<std::string>().find("HTTP 404"), std::string::npos);

  const std::string summary = ReadText(out / "summary.txt");
  EXPECT_NE(summary.find("ConfigMap kube-system/hami-scheduler-device (holds knownMigGeometries)"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("node-b (cordoned): 1 registered GPUs; NVML view UNREACHABLE"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("default/old on node-b (Running): LEGACY identity"), std::string::npos)
      << summary;
  EXPECT_NE(summary.find("nvidia.com/mig.config=all-1g.5gb"), std::string::npos) << summary;
}

TEST_F(InventoryTest, IdleInstancesAreSaved) {
  json c = Node("node-c", Register({{"GPU-c0"}}));
  c["metadata"]["annotations"][std::string(protocol::kNodeIdleInstancesAnnotation)] =
      R"([{"gpuUUID":"GPU-c0","profile":"1g.5gb","placement":{"start":6,"size":1},)"
      R"("idleSince":1800000000}])";
  Add(c);
  const auto out = dir_ / "backup";
  RunJson({"inventory", "--out", out.string()}, 0);
  const json node = ReadJson(out / "nodes/node-c.json");
  ASSERT_EQ(node["idleMigInstances"].size(), 1u);
  EXPECT_EQ(node["idleMigInstances"][0]["profile"], "1g.5gb");
  EXPECT_EQ(node["idleMigInstances"][0]["placement"]["start"], 6);
  EXPECT_NE(ReadText(out / "summary.txt").find("node-c: 1 registered GPUs, 1 idle instance(s)"),
            std::string::npos)
      << ReadText(out / "summary.txt");
}

TEST_F(InventoryTest, NeverOverwritesWithoutForce) {
  const auto out = dir_ / "backup";
  ASSERT_EQ(Run({"inventory", "--out", out.string(), "--nvml-endpoint", ""}).code, 0);
  auto again = Run({"inventory", "--out", out.string(), "--nvml-endpoint", ""});
  EXPECT_EQ(again.code, 2);
  EXPECT_NE(again.err.find("the directory is not empty"), std::string::npos) << again.err;
  EXPECT_EQ(Run({"inventory", "--out", out.string(), "--nvml-endpoint", "", "--force"}).code, 0);
  // An empty existing directory is fine.
  std::filesystem::create_directories(dir_ / "empty");
  EXPECT_EQ(Run({"inventory", "--out", (dir_ / "empty").string(), "--nvml-endpoint", ""}).code, 0);
  EXPECT_EQ(Run({"inventory"}).code, 2);  // --out is required
}

TEST_F(InventoryTest, NamedConfigMap) {
  const auto out = dir_ / "named";
  const json r = RunJson(
      {"inventory", "--out", out.string(), "--nvml-endpoint", "", "--device-config-namespace",
       "kube-system", "--device-config-name", "hami-scheduler-device"},
      0);
  EXPECT_EQ(r["configMaps"][0], "kube-system/hami-scheduler-device");
  auto missing = Run({"inventory", "--out", (dir_ / "m").string(), "--device-config-name", "nope"});
  EXPECT_EQ(missing.code, 2) << missing.err;
}

}  // namespace
}  // namespace dynmig::ops::testing
