// The migration guide's two rollback procedures against the whole system (a LocalCluster: API
// server with webhooks, scheduler extender, device plugins on simulated GPUs behind a kubelet),
// with `dynmig inventory` and `dynmig rollback plan|check|apply` run in process exactly as an
// operator types them. The test plays the parts outside dynmig: the node's state before the
// migration (the legacy device plugin's registration, the fixed geometry, MIG Manager's labels),
// the DaemonSet controller (the device plugin stops when the node loses dynmig.io/mig=enabled),
// and the legacy controller coming back.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "cli/cli.h"
#include "cli/cli_test_util.h"
#include "e2e/e2e_test_util.h"
#include "fmt/format.h"
#include "nvml/nvml.h"
#include "protocol/device_config.h"
#include "protocol/node_register.h"

namespace dynmig::e2e {
namespace {

using ::testing::HasSubstr;

using cli::testing::CliResult;

constexpr const char* kRollbackLegacyConfig = R"(nvidia:
  resourceCountName: nvidia.com/gpu
  knownMigGeometries:
    - models: ["A100-SXM4-40GB"]
      allowedGeometries:
        - - name: 4g.20gb
            core: 57
            memory: 20480
            count: 1
          - name: 3g.20gb
            core: 42
            memory: 20480
            count: 1
)";

class RollbackE2eTest : public E2eTest {
 protected:
  std::string backup() const { return (dir_ / "backup").string(); }

  CliResult Dynmig(std::vector<std::string> args) { return cli::testing::RunDynmig(args); }
  // `dynmig rollback VERB --kubeconfig K --nvml-endpoint T --node node-a --backup B ARGS...`
  CliResult Rollback(const std::string& verb, std::vector<std::string> args = {}) {
    std::vector<std::string> argv = {"rollback",        verb,
                                     "--kubeconfig",    cluster_->kubeconfig_path(),
                                     "--nvml-endpoint", cluster_->nvml_endpoint_template(),
                                     "--nvml-timeout",  "2s",
                                     "--node",          "node-a",
                                     "--backup",        backup()};
    argv.insert(argv.end(), args.begin(), args.end());
    return Dynmig(argv);
  }
  json RollbackJson(const std::string& verb, std::vector<std::string> args, int want_code) {
    args.push_back("-o");
    args.push_back("json");
    CliResult r = Rollback(verb, args);
    EXPECT_EQ(r.code, want_code) << Where() << "dynmig rollback " << verb << ":\n"
                                 << r.out << r.err;
    json doc = json::parse(r.out, nullptr, false);
    EXPECT_FALSE(doc.is_discarded()) << Where() << "not JSON:\n" << r.out << r.err;
    return doc.is_discarded() ? json() : doc;
  }
  static std::string Result(const json& report, const std::string& check) {
    for (const auto& i : report["items"]) {
      if (i["check"] == check) return i["result"];
    }
    return "absent";
  }
  static std::string Evidence(const json& report, const std::string& check) {
    for (const auto& i : report["items"]) {
      if (i["check"] != check) continue;
      std::string s = i["summary"].get<std::string>();
      for (const auto& e : i["evidence"]) s += "\n" + e.get<std::string>();
      return s;
    }
    return "";
  }

  void PatchNode(const json& patch, const std::string& subresource = "") {
    auto patched = kube_->Patch(kube::Resource::kNodes, "", "node-a", patch,
                                kube::PatchType::kMerge, subresource);
    ASSERT_TRUE(patched.ok()) << Where() << patched.status();
  }
  void SetDeviceConfig(const std::string& yaml) {
    auto patched =
        kube_->Patch(kube::Resource::kConfigMaps, std::string(local::kSystemNamespace),
                     std::string(local::kDeviceConfigMap),
                     {{"data", {{"device-config.yaml", yaml}}}}, kube::PatchType::kMerge, "");
    ASSERT_TRUE(patched.ok()) << Where() << patched.status();
  }
  std::string DeviceConfigNow() {
    auto cm = kube_->Get(kube::Resource::kConfigMaps, std::string(local::kSystemNamespace),
                         std::string(local::kDeviceConfigMap));
    EXPECT_TRUE(cm.ok()) << Where() << cm.status();
    return cm.ok() ? (*cm)["data"].value("device-config.yaml", "") : "";
  }
  // kubectl label node node-a dynmig.io/mig- ; the DaemonSet controller then removes its pod.
  void StopMigService() {
    PatchNode({{"metadata", {{"labels", {{"dynmig.io/mig", nullptr}}}}}});
    ASSERT_TRUE(cluster_->StopDevicePlugin("node-a").ok()) << Where();
  }
  // The fixed geometry through NVML: 4g.20gb at 0-3, 3g.20gb at 4-7.
  void CreateFixedGeometry() {
    auto nv = cluster_->OpenNvml("node-a");
    ASSERT_TRUE(nv.ok()) << Where() << nv.status();
    auto profiles = nvml::DiscoverProfiles(**nv, 0);
    ASSERT_TRUE(profiles.ok()) << Where() << profiles.status();
    for (const auto& [name, start] : {std::pair{"4g.20gb", 0u}, {"3g.20gb", 4u}}) {
      uint32_t id = 0;
      for (const auto& p : *profiles) {
        if (p.name == name) id = p.nvml_id;
      }
      auto gi = (*nv)->CreateGpuInstance(0, id, {start, 4});
      ASSERT_TRUE(gi.ok()) << Where() << name << ": " << gi.status();
      ASSERT_TRUE((*nv)->CreateComputeInstance(0, gi->id).ok()) << Where();
    }
  }
  std::string LegacyRegister(const std::string& gpu) {
    return R"([{"id":")" + gpu +
           R"(","count":7,"devmem":40960,"type":"NVIDIA A100-SXM4-40GB","mode":"mig",)"
           R"("health":true,"migtemplate":[{"name":"4g.20gb","memory":20480,"count":1},)"
           R"({"name":"3g.20gb","memory":20480,"count":1}]}])";
  }
  std::string GpuUuid() {
    auto live = cluster_->OpenNvml("node-a");
    EXPECT_TRUE(live.ok()) << live.status();
    auto info = (*live)->GetGpu(0);
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->uuid : "";
  }
};

// Before production workloads resume: the canary ran, validation failed; roll back to HAMi's
// knownMigGeometries and the fixed geometry the node had.
TEST_F(RollbackE2eTest, BeforeProductionResumesRestoresHamisConfigAndTheFixedGeometry) {
  Scenario("rollback before production");
  StartCluster("node-a=A100-SXM4-40GBx1");
  const std::string dynmig_config = DeviceConfigNow();
  const std::string gpu = GpuUuid();
  const std::string state = cluster_->nvml_state_file("node-a");

  Step("the node before the migration: HAMi's legacy plugin, its config and fixed geometry");
  ASSERT_TRUE(cluster_->StopDevicePlugin("node-a").ok());
  CreateFixedGeometry();
  SetDeviceConfig(kRollbackLegacyConfig);
  PatchNode({{"metadata",
              {{"labels", {{"dynmig.io/mig", nullptr}}},
               {"annotations",
                {{std::string(protocol::kNodeRegisterAnnotation), LegacyRegister(gpu)}}}}}});
  Step("save the geometry on the node, then the inventory backup");
  CliResult geometry_out = Dynmig({"nvml", "--state", state, "instances", "-o", "json"});
  ASSERT_EQ(geometry_out.code, 0) << Where() << geometry_out.err;
  const std::string geometry = (dir_ / "geometry.json").string();
  std::ofstream(geometry) << geometry_out.out;
  CliResult inv =
      Dynmig({"inventory", "--kubeconfig", cluster_->kubeconfig_path(), "--nvml-endpoint",
              cluster_->nvml_endpoint_template(), "--nvml-timeout", "2s", "--out", backup()});
  ASSERT_EQ(inv.code, 0) << Where() << inv.out << inv.err;

  Step("the migration: dynmig's config, dynmig's device plugin (it cleans the GPU)");
  SetDeviceConfig(dynmig_config);
  PatchNode({{"metadata", {{"labels", {{"dynmig.io/mig", "enabled"}}}}}});
  ASSERT_TRUE(cluster_->StartDevicePlugin("node-a").ok());
  ASSERT_TRUE(WaitUntil([&] { return Live().empty(); })) << Where() << "the GPU was not cleaned";
  ASSERT_TRUE(WaitUntil([&] {
    auto n = kube_->GetNode("node-a");
    return n.ok() && protocol::DetectLegacyNodeRegister(
                         kube::Annotation(*n, protocol::kNodeRegisterAnnotation).value_or("x"))
                         .empty();
  })) << Where();
  Step("the canary runs (and, for this story, validation fails)");
  RunPod(MigPod("mig-canary", 4500));
  DeletePod("mig-canary");
  ASSERT_TRUE(WaitUntil([&] { return Live().empty(); })) << Where();
  PatchNode({{"spec", {{"unschedulable", true}}}});

  const std::vector<std::string> nvml = {"--geometry", geometry, "--sim-state", state};
  Step("plan: the canary case, nothing to drain");
  json plan = RollbackJson("plan", nvml, 0);
  EXPECT_EQ(plan["case"], "before-production") << Where() << plan.dump(2);
  ASSERT_EQ(plan["steps"].size(), 7u) << Where();
  EXPECT_THAT(plan["steps"][1]["why"].get<std::string>(), HasSubstr("nothing to drain"));
  EXPECT_THAT(plan["steps"][5]["why"].get<std::string>(),
              HasSubstr(fmt::format("GPU 0 ({0}): 4g.20gb at slices 0-3; GPU 0 ({0}): 3g.20gb at "
                                    "slices 4-7",
                                    gpu)));

  Step("check refuses while dynmig's device plugin serves the node");
  json r = RollbackJson("check", nvml, 1);
  EXPECT_EQ(Result(r, "cordoned"), "PASS") << Where();
  EXPECT_EQ(Result(r, "mig-service"), "FAIL") << Where() << r.dump(2);
  EXPECT_EQ(Result(r, "device-plugin"), "FAIL") << Where();
  EXPECT_THAT(Evidence(r, "device-plugin"), HasSubstr("its NVML view still answers")) << Where();
  EXPECT_THAT(r["verdict"].get<std::string>(), HasSubstr("rollback refused")) << Where();
  CliResult refused = Rollback("apply", {"--geometry", geometry, "--sim-state", state});
  EXPECT_EQ(refused.code, 1) << Where() << refused.out << refused.err;
  EXPECT_THAT(refused.out, HasSubstr("nothing was changed")) << Where();
  EXPECT_EQ(DeviceConfigNow(), dynmig_config) << Where();
  EXPECT_TRUE(Live().empty()) << Where();

  Step("stop dynmig's MIG service on the node: safe to restore");
  // The plugin publishes the end of its holds (dynmig.io/mig-held) a cycle after the instances
  // went (a slow run stopped it before that, and the check refused): wait, as an operator would.
  ASSERT_TRUE(WaitUntil([&] {
    auto n = kube_->GetNode("node-a");
    const std::string held =
        n.ok() ? kube::Annotation(*n, protocol::kNodeHeldSlicesAnnotation).value_or("") : "?";
    return held.empty() || held == "[]";
  })) << Where();
  StopMigService();
  r = RollbackJson("check", nvml, 1);
  EXPECT_EQ(r["refused"], json::array()) << Where() << r.dump(2);
  EXPECT_THAT(r["verdict"].get<std::string>(),
              HasSubstr("not restored yet: legacy-config, geometry, legacy-registration"))
      << Where();

  Step("apply: the backup's ConfigMap and the fixed geometry through NVML");
  json applied = RollbackJson("apply", nvml, 0);
  const std::string changes = applied["changes"].dump();
  EXPECT_THAT(changes, HasSubstr("ConfigMap dynmig-system/dynmig-device-config: restored "
                                 "device-config.yaml from the backup"))
      << Where() << applied.dump(2);
  EXPECT_THAT(changes, HasSubstr("4g.20gb at slices 0-3: created")) << Where();
  EXPECT_THAT(changes, HasSubstr("3g.20gb at slices 4-7: created")) << Where();
  EXPECT_EQ(DeviceConfigNow(), kRollbackLegacyConfig) << Where();
  const auto live = Live();
  ASSERT_EQ(live.size(), 2u) << Where();
  EXPECT_EQ(live[0].placement.size, 4u) << Where();

  Step("the legacy device plugin has not registered yet: not ready to uncordon");
  r = RollbackJson("check", nvml, 1);
  EXPECT_EQ(Result(r, "legacy-config"), "PASS") << Where() << r.dump(2);
  EXPECT_EQ(Result(r, "geometry"), "PASS") << Where();
  EXPECT_EQ(Result(r, "instances"), "PASS") << Where();
  EXPECT_EQ(Result(r, "legacy-registration"), "FAIL") << Where();
  EXPECT_THAT(Evidence(r, "legacy-registration"), HasSubstr("in dynmig's format")) << Where();

  Step("HAMi's legacy plugin registers: restored");
  PatchNode({{"metadata",
              {{"annotations",
                {{std::string(protocol::kNodeRegisterAnnotation), LegacyRegister(gpu)}}}}}});
  r = RollbackJson("check", nvml, 0);
  EXPECT_EQ(r["verdict"], "restored: the node may be uncordoned") << Where() << r.dump(2);
}

// After dynamic MIG pods have run: drain them while dynmig's plugin still runs, stop it, give the
// node back to MIG Manager.
TEST_F(RollbackE2eTest, AfterDynamicPodsRanDrainsThemAndHandsTheNodeBackToMigManager) {
  Scenario("rollback after dynamic pods");
  StartCluster("node-a=A100-SXM4-40GBx1");
  const std::string state = cluster_->nvml_state_file("node-a");

  auto n0 = kube_->GetNode("node-a");
  ASSERT_TRUE(n0.ok()) << n0.status();
  const std::string gpus = (*n0)["status"]["capacity"].value("nvidia.com/gpu", "0");
  Step("the node before the migration: MIG Manager and the GPU Operator's device plugin");
  ASSERT_TRUE(cluster_->StopDevicePlugin("node-a").ok());
  PatchNode({{"metadata",
              {{"labels",
                {{"dynmig.io/mig", nullptr},
                 {"nvidia.com/mig.config", "all-balanced"},
                 {"nvidia.com/mig.config.state", "success"},
                 {"nvidia.com/gpu.deploy.mig-manager", "true"}}},
               {"annotations",
                {{std::string(protocol::kNodeRegisterAnnotation), nullptr},
                 {std::string(protocol::kNodeHandshakeAnnotation), nullptr}}}}}});
  PatchNode({{"status",
              {{"capacity", {{"nvidia.com/gpu", "0"}, {"nvidia.com/mig-1g.5gb", "2"}}},
               {"allocatable", {{"nvidia.com/gpu", "0"}, {"nvidia.com/mig-1g.5gb", "2"}}}}}},
            "status");
  CliResult inv = Dynmig({"inventory", "--kubeconfig", cluster_->kubeconfig_path(),
                          "--nvml-endpoint", "", "--out", backup()});
  ASSERT_EQ(inv.code, 0) << Where() << inv.out << inv.err;

  Step("the migration: MIG Manager off, dynmig on; dynamic pods run");
  PatchNode({{"metadata",
              {{"labels",
                {{"dynmig.io/mig", "enabled"},
                 {"nvidia.com/mig.config", nullptr},
                 {"nvidia.com/mig.config.state", nullptr},
                 {"nvidia.com/gpu.deploy.mig-manager", "false"}}}}}});
  PatchNode({{"status",
              {{"capacity", {{"nvidia.com/gpu", gpus}, {"nvidia.com/mig-1g.5gb", nullptr}}},
               {"allocatable", {{"nvidia.com/gpu", gpus}, {"nvidia.com/mig-1g.5gb", nullptr}}}}}},
            "status");
  ASSERT_TRUE(cluster_->StartDevicePlugin("node-a").ok());
  RunPod(MigPod("train", 19000));
  RunPod(MigPod("infer", 4000));
  ASSERT_EQ(Live().size(), 2u) << Where();

  Step("plan: dynamic pods have run, drain them first");
  json plan = RollbackJson("plan", {"--sim-state", state}, 0);
  EXPECT_EQ(plan["case"], "after-dynamic-pods") << Where() << plan.dump(2);
  EXPECT_THAT(plan["steps"][5]["why"].get<std::string>(),
              HasSubstr("MIG Manager applies nvidia.com/mig.config=all-balanced"))
      << Where();

  Step("check refuses: schedulable, pods, reservations, instances, the service");
  json r = RollbackJson("check", {"--sim-state", state}, 1);
  for (const char* check :
       {"cordoned", "dynamic-pods", "reservations", "mig-service", "device-plugin", "instances"}) {
    EXPECT_EQ(Result(r, check), "FAIL") << Where() << check << "\n" << r.dump(2);
  }
  EXPECT_THAT(Evidence(r, "dynamic-pods"), HasSubstr("default/train (Running)")) << Where();
  EXPECT_THAT(Evidence(r, "reservations"), HasSubstr("default/infer: 1g.5gb at slices")) << Where();

  Step("cordon, drain while the plugin runs: it reclaims the instances");
  PatchNode({{"spec", {{"unschedulable", true}}}});
  DeletePod("train");
  DeletePod("infer");
  ASSERT_TRUE(WaitUntil([&] { return Live().empty(); })) << Where() << "instances not reclaimed";
  r = RollbackJson("check", {"--sim-state", state}, 1);
  for (const char* check : {"cordoned", "dynamic-pods", "reservations", "instances"}) {
    EXPECT_EQ(Result(r, check), "PASS") << Where() << check << "\n" << r.dump(2);
  }
  EXPECT_EQ(Result(r, "mig-service"), "FAIL") << Where();

  Step("stop dynmig's MIG service; apply hands the node back to MIG Manager");
  StopMigService();
  json applied = RollbackJson("apply", {"--sim-state", state}, 0);
  const std::string changes = applied["changes"].dump();
  EXPECT_THAT(changes, HasSubstr("label nvidia.com/mig.config=all-balanced (was absent)"))
      << Where() << applied.dump(2);
  EXPECT_THAT(changes, HasSubstr("label nvidia.com/gpu.deploy.mig-manager=true (was false)"))
      << Where();
  EXPECT_THAT(changes, HasSubstr("removed dynmig's annotation hami.io/node-nvidia-register"))
      << Where();
  EXPECT_THAT(applied["notDone"].dump(), HasSubstr("MIG Manager applies")) << Where();

  Step("MIG Manager and the GPU Operator's plugin come back: restored");
  r = RollbackJson("check", {"--sim-state", state}, 1);
  EXPECT_EQ(Result(r, "geometry"), "FAIL") << Where() << r.dump(2);
  EXPECT_EQ(Result(r, "legacy-registration"), "FAIL") << Where();
  EXPECT_THAT(Evidence(r, "legacy-registration"),
              HasSubstr("nvidia.com/mig-1g.5gb: backup 2, now absent"))
      << Where();
  PatchNode({{"metadata", {{"labels", {{"nvidia.com/mig.config.state", "success"}}}}}});
  PatchNode({{"status",
              {{"capacity", {{"nvidia.com/mig-1g.5gb", "2"}}},
               {"allocatable", {{"nvidia.com/mig-1g.5gb", "2"}}}}}},
            "status");
  r = RollbackJson("check", {"--sim-state", state}, 0);
  EXPECT_EQ(r["verdict"], "restored: the node may be uncordoned") << Where() << r.dump(2);
}

}  // namespace
}  // namespace dynmig::e2e
