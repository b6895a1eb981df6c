// `dynmig rollback plan|check|apply` against the in-memory API server, a fake device-plugin NVML
// endpoint, and the NVML simulator standing for the node's GPUs.
#include "ops/rollback.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nvml/sim_nvml.h"
#include "ops/ops_test_util.h"
#include "protocol/held_slices.h"

namespace dynmig::ops::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kGpu = "GPU-11111111-2222-3333-4444-555555555555";

class RollbackTest : public OpsTest {
 protected:
  // The cluster as dynmig left it on node-a after a migration from MIG Manager (all-1g.5gb) and
  // HAMi's legacy device config: a backup taken before, then dynmig's config and labels.
  void SetUpMigrated() {
    // Before the migration: the legacy config, MIG Manager's labels, no HAMi registration.
    Add(ConfigMap("kube-system", "hami-scheduler-device", kLegacyConfig));
    json node = Node("node-a", "",
                     {{"nvidia.com/mig.config", "all-1g.5gb"},
                      {"nvidia.com/mig.config.state", "success"},
                      {"nvidia.com/gpu.deploy.mig-manager", "true"}});
    Add(node);
    auto inv = Run({"inventory", "--out", backup(), "--nvml-endpoint", ""});
    ASSERT_EQ(inv.code, 0) << inv.out << inv.err;
    // The migration: dynmig's config, MIG Manager off, dynmig's plugin registered.
    Put(kube::Resource::kConfigMaps, "kube-system", "hami-scheduler-device",
        {{"data", {{"device-config.yaml", kDeviceConfig}}}});
    Put(kube::Resource::kNodes, "", "node-a",
        {{"metadata",
          {{"labels",
            {{"nvidia.com/mig.config", nullptr},
             {"nvidia.com/mig.config.state", nullptr},
             {"nvidia.com/gpu.deploy.mig-manager", "false"},
             {"dynmig.io/mig", "enabled"}}},
           {"annotations",
            {{std::string(protocol::kNodeRegisterAnnotation), Register({{kGpu}})},
             {std::string(protocol::kNodeHandshakeAnnotation),
              "Reported_2026-12-01 10:00:00"}}}}}});
  }
  void Put(kube::Resource r, const std::string& ns, const std::string& name, const json& patch) {
    auto patched = client_->Patch(r, ns, name, patch, kube::PatchType::kMerge, "");
    ASSERT_TRUE(patched.ok()) << patched.status();
  }
  void Cordon() {
    Put(kube::Resource::kNodes, "", "node-a", {{"spec", {{"unschedulable", true}}}});
  }
  std::string backup() const { return (dir_ / "backup").string(); }
  std::string sim_state() const { return (dir_ / "gpus.json").string(); }
  std::unique_ptr<nvml::SimNvml> Sim() {
    nvml::SimNvmlOptions o;
    o.spec = "A100-SXM4-40GBx1";
    o.state_file = sim_state();
    o.fsync = false;
    auto sim = nvml::SimNvml::Create(std::move(o));
    EXPECT_TRUE(sim.ok()) << sim.status();
    return sim.ok() ? std::move(*sim) : nullptr;
  }
  // The fixed geometry saved on the node before the migration (`dynmig nvml instances -o json`).
  std::string Geometry() {
    const std::string path = (dir_ / "geometry.json").string();
    std::ofstream(path) << R"({"gpus":[{"index":0,"name":"NVIDIA A100-SXM4-40GB","migEnabled":true,
      "gpuInstances":[{"id":1,"profile":"4g.20gb","placement":{"start":0,"size":4}},
                      {"id":2,"profile":"3g.20gb","placement":{"start":4,"size":4}}]}]})";
    return path;
  }
  std::vector<std::string> Args(const std::string& verb, std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {"rollback", verb,     "--node",          "node-a",
                                  "--backup", backup(), "--nvml-endpoint", ""};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::string DeviceConfigNow() {
    auto cm = client_->Get(kube::Resource::kConfigMaps, "kube-system", "hami-scheduler-device");
    EXPECT_TRUE(cm.ok()) << cm.status();
    return cm.ok() ? (*cm)["data"].value("device-config.yaml", "") : "";
  }
};

TEST_F(RollbackTest, BadInputIsRefusedWithAClearErrorAndChangesNothing) {
  SetUpMigrated();
  Cordon();
  auto r = Run({"rollback", "check", "--node", "node-a", "--backup", (dir_ / "nope").string()});
  EXPECT_EQ(r.code, cli::kExitBadInput) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("no such directory"));
  r = Run({"rollback", "apply", "--node", "node-a", "--backup", dir_.string()});
  EXPECT_EQ(r.code, cli::kExitBadInput);
  EXPECT_THAT(r.err, HasSubstr("not a dynmig inventory directory"));
  r = Run({"rollback", "plan", "--node", "node-b", "--backup", backup()});
  EXPECT_EQ(r.code, cli::kExitBadInput);
  EXPECT_THAT(r.err, HasSubstr("holds no record of node \"node-b\" (it has: node-a)"));
  // A garbled geometry file; several instance sources.
  std::ofstream(dir_ / "geo.json") << R"({"gpus": 3})";
  r = Run(Args("apply", {"--geometry", (dir_ / "geo.json").string()}));
  EXPECT_EQ(r.code, cli::kExitBadInput) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("--geometry " + (dir_ / "geo.json").string() +
                               ": NVML view: gpus: "
                               "must be an array"));
  r = Run(Args("check", {"--sim-state", sim_state(), "--instances", "x.json"}));
  EXPECT_EQ(r.code, cli::kExitBadInput);
  EXPECT_THAT(r.err, HasSubstr("pass one"));
  // A damaged node record.
  std::ofstream(std::filesystem::path(backup()) / "nodes" / "node-a.json") << "{\"name\": ";
  r = Run(Args("apply", {"--sim-state", sim_state()}));
  EXPECT_EQ(r.code, cli::kExitBadInput) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("node-a.json is not JSON"));
  EXPECT_EQ(DeviceConfigNow(), kDeviceConfig) << "bad input changed the ConfigMap";
}

TEST_F(RollbackTest, UnknownNodeInTheClusterIsBadInput) {
  SetUpMigrated();
  ASSERT_TRUE(client_->Delete(kube::Resource::kNodes, "", "node-a", {}).ok());
  auto r = Run(Args("check", {"--instances", Geometry()}));
  EXPECT_EQ(r.code, cli::kExitBadInput) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("node \"node-a\" not found"));
}

TEST_F(RollbackTest, CheckRefusesWhileAnythingDynamicRemainsAndApplyChangesNothing) {
  SetUpMigrated();
  // A running dynamic-MIG pod with its reservation, dynmig's device plugin pod, a node lock, a
  // held instance, the plugin's NVML view answering, and an instance outside the saved geometry.
  Add(PlacedPod("train", "node-a", 9000, {{kGpu, "2g.10gb", 0, 2, Runtime{"MIG-aaaa", 3, 0}}}));
  json plugin = Pod("dynmig-device-plugin-x7k2p", "node-a", 0);
  plugin["spec"]["containers"][0]["resources"] = json::object();
  plugin["metadata"]["labels"] = {{"app.kubernetes.io/name", "dynmig"},
                                  {"app.kubernetes.io/component", "device-plugin"}};
  plugin["metadata"]["namespace"] = "dynmig-system";
  Add(plugin);
  Put(kube::Resource::kNodes, "", "node-a",
      {{"metadata",
        {{"annotations",
          {{std::string(protocol::kNodeLockAnnotation), "2026-12-01T10:00:00Z,default,train"},
           {std::string(protocol::kNodeHeldSlicesAnnotation),
            R"([{"gpuUUID":")" + std::string(kGpu) +
                R"(","placement":{"start":6,"size":1},"profile":"1g.5gb","reason":"processes"}])"}}}}}});
  FakeNvmlEndpoint endpoint;
  endpoint.Set("node-a", NvmlDoc("node-a", {{kGpu}}, {{kGpu, "2g.10gb", 0, 2, 3, 0, "MIG-aaaa"}}));
  const std::string instances = (dir_ / "now.json").string();
  std::ofstream(instances)
      << NvmlDoc("node-a", {{kGpu}}, {{kGpu, "2g.10gb", 0, 2, 3, 0, "MIG-aaaa"}}).dump();

  std::vector<std::string> args = {"rollback",   "check",    "--node",          "node-a",
                                   "--backup",   backup(),   "--nvml-endpoint", endpoint.Template(),
                                   "--geometry", Geometry(), "--instances",     instances};
  json r = RunJson(args, 1);
  for (const char* check : {"cordoned", "dynamic-pods", "reservations", "mig-service",
                            "device-plugin", "node-lock", "instances"}) {
    EXPECT_EQ(Result(r, check, "node-a"), "FAIL") << check << "\n" << r.dump(2);
  }
  EXPECT_THAT(Evidence(r, "dynamic-pods"), HasSubstr("default/train (Running)"));
  EXPECT_THAT(Evidence(r, "reservations"),
              HasSubstr(fmt::format("default/train: 2g.10gb at slices 0-1 of {} (MIG-aaaa, GI 3, "
                                    "CI 0)",
                                    kGpu)));
  EXPECT_THAT(Evidence(r, "mig-service"), HasSubstr("kubectl label node node-a dynmig.io/mig-"));
  EXPECT_THAT(Evidence(r, "device-plugin"), HasSubstr("dynmig device-plugin pod on the node: "
                                                      "dynmig-system/dynmig-device-plugin-x7k2p"));
  EXPECT_THAT(Evidence(r, "device-plugin"), HasSubstr("its NVML view still answers"));
  EXPECT_THAT(Evidence(r, "node-lock"), HasSubstr("2026-12-01T10:00:00Z,default,train"));
  EXPECT_THAT(Evidence(r, "instances"),
              HasSubstr("not in the saved geometry: GPU 0 (" + std::string(kGpu) +
                        "): 2g.10gb at slices 0-1 (GI 3, CI 0 MIG-aaaa)"));
  EXPECT_THAT(Evidence(r, "instances"), HasSubstr("dynmig.io/mig-held holds 1g.5gb at slices 6"));
  EXPECT_THAT(r["verdict"].get<std::string>(), HasSubstr("rollback refused: cordoned: "));
  EXPECT_EQ(r["refused"].size(), 7u);

  // The table says the same; apply refuses and changes nothing.
  auto text = Run(args);
  EXPECT_EQ(text.code, 1) << text.out << text.err;
  EXPECT_THAT(text.out, HasSubstr("FAIL    node-a  node-lock"));
  EXPECT_THAT(text.out, HasSubstr("rollback refused:"));
  std::vector<std::string> apply_args = args;
  apply_args[1] = "apply";
  apply_args.resize(apply_args.size() - 2);  // apply takes NVML, not --instances
  auto applied = Run(apply_args);
  EXPECT_EQ(applied.code, 1) << applied.out << applied.err;
  EXPECT_THAT(applied.out, HasSubstr("rollback apply: nothing was changed"));
  EXPECT_EQ(DeviceConfigNow(), kDeviceConfig);

  // Each condition cleared: the safety items pass; what is left is the restoration.
  Cordon();
  ASSERT_TRUE(
      client_->Delete(kube::Resource::kPods, "default", "train", {.grace_period_seconds = 0}).ok());
  ASSERT_TRUE(client_
                  ->Delete(kube::Resource::kPods, "dynmig-system", "dynmig-device-plugin-x7k2p",
                           {.grace_period_seconds = 0})
                  .ok());
  endpoint.Remove("node-a");
  Put(kube::Resource::kNodes, "", "node-a",
      {{"metadata",
        {{"labels", {{"dynmig.io/mig", nullptr}}},
         {"annotations",
          {{std::string(protocol::kNodeLockAnnotation), nullptr},
           {std::string(protocol::kNodeHeldSlicesAnnotation), "[]"}}}}}});
  std::ofstream(instances) << NvmlDoc("node-a", {{kGpu}}).dump();
  r = RunJson(args, 1);
  EXPECT_EQ(r["refused"], json::array()) << r.dump(2);
  EXPECT_THAT(r["verdict"].get<std::string>(),
              HasSubstr("safe to restore: nothing dynamic remains; not restored yet: "
                        "legacy-config, mig-manager-labels, geometry, legacy-registration"));
  EXPECT_THAT(Evidence(r, "device-plugin"), HasSubstr("not answering"));
  EXPECT_THAT(Evidence(r, "legacy-config"),
              HasSubstr("ConfigMap kube-system/hami-scheduler-device: differs from the backup in "
                        "device-config.yaml"));
  EXPECT_THAT(Evidence(r, "geometry"), HasSubstr("missing: GPU 0: 4g.20gb at slices 0-3"));
}

TEST_F(RollbackTest, ApplyRestoresConfigLabelsAndGeometryAndSaysWhatChanged) {
  SetUpMigrated();
  Cordon();
  Put(kube::Resource::kNodes, "", "node-a",
      {{"metadata", {{"labels", {{"dynmig.io/mig", nullptr}}}}}});
  auto sim = Sim();
  ASSERT_NE(sim, nullptr);
  const std::string geometry = Geometry();
  const std::vector<std::string> extra = {"--geometry", geometry, "--sim-state", sim_state()};

  // A dynamic instance left on the GPU (no pod): refused.
  auto profiles = nvml::DiscoverProfiles(*sim, 0);
  ASSERT_TRUE(profiles.ok()) << profiles.status();
  uint32_t small = 0;
  for (const auto& p : *profiles) {
    if (p.name == "1g.5gb") small = p.nvml_id;
  }
  auto gi = sim->CreateGpuInstance(0, small, {6, 1});
  ASSERT_TRUE(gi.ok()) << gi.status();
  ASSERT_TRUE(sim->CreateComputeInstance(0, gi->id).ok());
  auto refused = Run(Args("apply", extra));
  EXPECT_EQ(refused.code, 1) << refused.out << refused.err;
  EXPECT_THAT(refused.out, HasSubstr("not in the saved geometry: GPU 0"));
  EXPECT_THAT(refused.out, HasSubstr("1g.5gb at slices 6"));
  ASSERT_TRUE(sim->DestroyComputeInstance(0, gi->id, 0).ok());
  ASSERT_TRUE(sim->DestroyGpuInstance(0, gi->id).ok());

  // Plan: the before-production case, every step with its command and proof.
  auto plan = Run(Args("plan", extra));
  EXPECT_EQ(plan.code, 0) << plan.out << plan.err;
  EXPECT_THAT(plan.out, HasSubstr("no dynamic-MIG pod on the node now: the canary case"));
  EXPECT_THAT(plan.out, HasSubstr("1. Keep the node cordoned"));
  EXPECT_THAT(plan.out, HasSubstr("$ kubectl label node node-a dynmig.io/mig-"));
  EXPECT_THAT(plan.out, HasSubstr("proof: cordoned (PASS now)"));
  EXPECT_THAT(plan.out, HasSubstr("ConfigMap kube-system/hami-scheduler-device; MIG Manager's node "
                                  "labels"));
  EXPECT_THAT(plan.out, HasSubstr("2 instance(s) from file " + geometry +
                                  ": GPU 0: 4g.20gb at slices 0-3; GPU 0: 3g.20gb at slices 4-7"));
  EXPECT_THAT(plan.out, HasSubstr("proof: geometry (FAIL now)"));
  EXPECT_THAT(plan.out, HasSubstr("$ kubectl uncordon node-a"));

  auto applied = RunJson(Args("apply", extra), 0);
  const std::string changes = applied["changes"].dump();
  EXPECT_THAT(changes, HasSubstr("ConfigMap kube-system/hami-scheduler-device: restored "
                                 "device-config.yaml from the backup"));
  EXPECT_THAT(changes,
              HasSubstr("node node-a: label nvidia.com/mig.config=all-1g.5gb (was absent)"));
  EXPECT_THAT(changes,
              HasSubstr("node node-a: label nvidia.com/gpu.deploy.mig-manager=true (was false)"));
  EXPECT_THAT(changes, HasSubstr("removed dynmig's annotation hami.io/node-nvidia-register"));
  EXPECT_THAT(changes, HasSubstr("GPU 0 (GPU-"));
  EXPECT_THAT(changes, HasSubstr("4g.20gb at slices 0-3: created (GI "));
  EXPECT_THAT(changes, HasSubstr("3g.20gb at slices 4-7: created (GI "));
  EXPECT_EQ(applied["changes"].size(), 7u) << applied.dump(2);
  EXPECT_EQ(DeviceConfigNow(), kLegacyConfig);
  auto node = client_->GetNode("node-a");
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(kube::Label(*node, "nvidia.com/mig.config").value_or(""), "all-1g.5gb");
  EXPECT_FALSE(kube::Annotation(*node, protocol::kNodeRegisterAnnotation).has_value());
  auto gis = Sim()->ListGpuInstances(0);
  ASSERT_TRUE(gis.ok());
  EXPECT_EQ(gis->size(), 2u);

  // A second apply changes nothing; the check now passes every item.
  auto again = RunJson(Args("apply", extra), 0);
  EXPECT_EQ(again["changes"], json::array()) << again.dump(2);
  json r = RunJson(Args("check", extra), 0);
  EXPECT_EQ(r["verdict"], "restored: the node may be uncordoned") << r.dump(2);
  EXPECT_THAT(Evidence(r, "geometry"), HasSubstr("the saved geometry is in place: 2 instance(s)"));
  EXPECT_THAT(Evidence(r, "instances"), HasSubstr("only the saved geometry's instances (2)"));
  EXPECT_THAT(Evidence(r, "legacy-registration"), HasSubstr("nvidia.com/gpu: backup 7, now 7"));
  EXPECT_THAT(Evidence(r, "legacy-registration"), HasSubstr("kubectl uncordon node-a"));
  auto yaml =
      Run(Args("check", {"--geometry", geometry, "--sim-state", sim_state(), "-o", "yaml"}));
  EXPECT_EQ(yaml.code, 0);
  EXPECT_THAT(yaml.out, HasSubstr("verdict: \"restored: the node may be uncordoned\""));
}

TEST_F(RollbackTest, AHamiNodeNeedsTheLegacyRegistrationBack) {
  // Before: HAMi's legacy device plugin published the template format.
  Add(ConfigMap("kube-system", "hami-scheduler-device", kLegacyConfig));
  const std::string legacy_register =
      R"([{"id":")" + std::string(kGpu) +
      R"(","count":7,"devmem":40960,"type":"NVIDIA A100-SXM4-40GB","mode":"mig","health":true,)"
      R"("migtemplate":[{"name":"1g.5gb","memory":5120,"count":7}]}])";
  Add(Node("node-a", legacy_register, json::object(), true));
  ASSERT_EQ(Run({"inventory", "--out", backup(), "--nvml-endpoint", ""}).code, 0);
  // dynmig's plugin published the current format, then stopped.
  Put(kube::Resource::kNodes, "", "node-a",
      {{"metadata",
        {{"annotations",
          {{std::string(protocol::kNodeRegisterAnnotation), Register({{kGpu}})}}}}}});
  const std::string instances = (dir_ / "now.json").string();
  std::ofstream(instances) << NvmlDoc("node-a", {{kGpu}}).dump();
  json r = RunJson(Args("check", {"--instances", instances}), 1);
  EXPECT_EQ(Result(r, "legacy-registration", "node-a"), "FAIL");
  EXPECT_THAT(Evidence(r, "legacy-registration"),
              HasSubstr("is in dynmig's format, the backup's was the legacy template format"));
  EXPECT_EQ(Result(r, "geometry", "node-a"), "FAIL");
  EXPECT_THAT(Evidence(r, "geometry"), HasSubstr("pass --geometry FILE"));
  EXPECT_EQ(Result(r, "mig-manager-labels", "node-a"), "absent");
  // The legacy plugin registers again.
  Put(kube::Resource::kNodes, "", "node-a",
      {{"metadata",
        {{"annotations", {{std::string(protocol::kNodeRegisterAnnotation), legacy_register}}}}}});
  r = RunJson(Args("check", {"--instances", instances}), 1);
  EXPECT_EQ(Result(r, "legacy-registration", "node-a"), "PASS") << r.dump(2);
  EXPECT_THAT(Evidence(r, "legacy-registration"), HasSubstr("legacy template format, as in the "
                                                            "backup"));
}

TEST_F(RollbackTest, PlanAfterDynamicPodsStartsWithTheDrain) {
  SetUpMigrated();
  Add(PlacedPod("train", "node-a", 9000, {{kGpu, "2g.10gb", 0, 2, Runtime{"MIG-aaaa", 3, 0}}}));
  json plan = RunJson(Args("plan", {"--geometry", Geometry()}), 0);
  EXPECT_EQ(plan["case"], "after-dynamic-pods");
  ASSERT_EQ(plan["steps"].size(), 7u);
  EXPECT_EQ(plan["steps"][1]["title"], "Drain the dynamic-MIG pods (after dynamic pods have run)");
  EXPECT_THAT(plan["steps"][1]["why"].get<std::string>(),
              HasSubstr("drain them while dynmig's device plugin still runs"));
  EXPECT_EQ(plan["steps"][1]["proves"][0], json({{"check", "dynamic-pods"}, {"now", "FAIL"}}));
  EXPECT_THAT(plan["steps"][1]["commands"][0].get<std::string>(),
              HasSubstr("kubectl drain node-a --ignore-daemonsets"));
  EXPECT_THAT(plan["verdict"].get<std::string>(), HasSubstr("rollback refused"));
}

}  // namespace
}  // namespace dynmig::ops::testing
