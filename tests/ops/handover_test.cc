// `dynmig handover plan|check` and the no-drain path of preflight and validate (issue 29), on
// snapshots: a node whose GPU carries legacy instances held by pods of both legacy worlds (NVIDIA's
// device plugin, HAMi's legacy MIG), an unproven and a free instance, and the blockers one by one.
// Also hostile NVML views (wrong types, over-long lists and strings, huge and deep documents).
#include "ops/handover.h"

#include <gmock/gmock.h>

#include <functional>

#include "ops/ops_test_util.h"
#include "protocol/held_slices.h"

namespace dynmig::ops::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kGpu = "GPU-a0";

json Holder(const std::string& name, const std::string& container, const std::string& resource,
            const std::string& source, const std::string& device, const std::string& uid = "") {
  return {{"podUID", uid},          {"namespace", "default"}, {"name", name},
          {"container", container}, {"resource", resource},   {"deviceID", device},
          {"source", source}};
}

class HandoverTest : public OpsTest {
 protected:
  void SetUp() override {
    OpsTest::SetUp();
    AddDeviceConfig();
  }

  // The device plugin's view of node-a after attribution: 1g.5gb@0 held by NVIDIA's pod nv,
  // 1g.5gb@1 held by HAMi's pod hami (runtime evidence), 2g.10gb@2 unproven, 3g.20gb@4 free.
  json View(bool with_unproven = true) {
    json doc = NvmlDoc("node-a", {{kGpu}},
                       {{kGpu, "1g.5gb", 0, 1, 7, 0, "MIG-nv"},
                        {kGpu, "1g.5gb", 1, 1, 8, 0, "MIG-hami"},
                        {kGpu, "2g.10gb", 2, 2, 3, 0, "MIG-unproven"},
                        {kGpu, "3g.20gb", 4, 4, 2, 0, "MIG-free"}});
    json& is = doc["gpus"][0]["instances"];
    is[0]["managed"] = true;
    is[0]["origin"] = "legacy";
    is[0]["holders"] = {Holder("nv", "main", "nvidia.com/mig-1g.5gb", "pod-resources", "MIG-nv")};
    is[1]["managed"] = true;
    is[1]["origin"] = "legacy";
    is[1]["holders"] = {Holder("hami", "workload", "", "runtime", "MIG-hami")};
    is[2]["managed"] = false;
    is[2]["unproven"] = "no container names MIG-unproven and the runtime did not list one";
    is[3]["managed"] = false;
    is[3]["free"] = true;
    if (!with_unproven) is.erase(2);
    doc["evidence"] = {{"podResources", {{"ok", true}}}, {"runtime", {{"ok", true}}}};
    return doc;
  }

  // node-a, cordoned, publishing the kept instances as held (all but the free one by default).
  json NodeA(bool publish_all = true) {
    // The allowlisted profiles only (validate's allowlist-exposure).
    json node =
        Node("node-a", Register({{kGpu}}, {"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}),
             json::object(), /*cordoned=*/true);
    std::vector<protocol::HeldSlices> held = {{kGpu, {0, 1}, "1g.5gb", "legacy instance"},
                                              {kGpu, {2, 2}, "2g.10gb", "unproven: …"}};
    if (publish_all) held.push_back({kGpu, {1, 1}, "1g.5gb", "legacy instance"});
    Annotate(node, protocol::kNodeHeldSlicesAnnotation, protocol::EncodeHeldSlices(held));
    return node;
  }

  static json NvidiaPod(const std::string& name, const std::string& profile = "1g.5gb") {
    json p = Pod(name, "node-a", 0);
    p["spec"]["containers"][0]["name"] = "main";
    p["spec"]["containers"][0]["resources"] = {
        {"limits", {{std::string(protocol::kMigResourcePrefix) + profile, "1"}}}};
    return p;
  }

  static json HamiPod(const std::string& name, const std::string& gpu = kGpu) {
    json p = Pod(name, "node-a", 5000);
    Annotate(p, protocol::kDevicesAllocatedAnnotation,
             gpu + "[1-1],NVIDIA A100-SXM4-40GB,5120,14:;");
    return p;
  }

  // Node, both legacy pods, the view served.
  void Scenario(bool with_unproven = true) {
    Add(NodeA());
    Add(NvidiaPod("nv"));
    Add(HamiPod("hami"));
    nvml_.Set("node-a", View(with_unproven));
  }

  std::vector<std::string> WithNvml(std::vector<std::string> args) {
    args.push_back("--nvml-endpoint");
    args.push_back(nvml_.Template());
    return args;
  }

  static std::vector<std::string> BlockerIds(const json& plan) {
    std::vector<std::string> ids;
    for (const auto& b : plan["blockers"]) ids.push_back(b["id"]);
    return ids;
  }

  FakeNvmlEndpoint nvml_;
};

TEST_F(HandoverTest, PlanShowsEachInstanceItsHoldersAndItsFate) {
  Scenario();
  const json plan = RunJson(WithNvml({"handover", "plan", "--node", "node-a"}), 0);
  ASSERT_EQ(plan["instances"].size(), 4u) << plan.dump(2);
  const json& is = plan["instances"];
  EXPECT_EQ(is[0]["fate"], "held");
  EXPECT_EQ(is[0]["migUUID"], "MIG-nv");
  EXPECT_EQ(is[0]["gpuInstanceID"], 7);
  EXPECT_EQ(is[0]["legacyPods"], json::array({"default/nv"}));
  EXPECT_THAT(is[0]["action"].get<std::string>(), HasSubstr("kept until its holders end"));
  EXPECT_EQ(is[1]["fate"], "held");
  EXPECT_EQ(is[1]["legacyPods"], json::array({"default/hami"}));
  EXPECT_EQ(is[2]["fate"], "unproven");
  EXPECT_THAT(is[2]["action"].get<std::string>(),
              HasSubstr("kept, never destroyed: no container names MIG-unproven"));
  EXPECT_EQ(is[3]["fate"], "free");
  EXPECT_THAT(is[3]["action"].get<std::string>(), HasSubstr("slices become dynamic"));
  EXPECT_EQ(is[3]["publishedHeld"], false);
  // Both legacy pods are proven; only the unproven instance blocks.
  ASSERT_EQ(plan["legacyPods"].size(), 2u);
  for (const auto& p : plan["legacyPods"]) EXPECT_EQ(p["attributed"], true) << p.dump();
  EXPECT_EQ(BlockerIds(plan), std::vector<std::string>{"unproven"}) << plan.dump(2);
  EXPECT_EQ(plan["noDrain"], false);

  auto text = Run(WithNvml({"handover", "plan", "--node", "node-a"}));
  EXPECT_EQ(text.code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("GPU  PROFILE"));
  EXPECT_THAT(text.out, HasSubstr("default/nv (container main, nvidia.com/mig-1g.5gb, "
                                  "pod-resources)"));
  EXPECT_THAT(text.out, HasSubstr("default/hami (HAMi): proven"));
  EXPECT_THAT(text.out, HasSubstr("No-drain handover: BLOCKED (1)"));
  EXPECT_THAT(text.out, HasSubstr("[proof] unproven: 1 instance not proven"));
}

TEST_F(HandoverTest, EverythingProvenMeansNothingBlocksAndCheckPasses) {
  Scenario(/*with_unproven=*/false);
  const json plan = RunJson(WithNvml({"handover", "plan", "--node", "node-a"}), 0);
  EXPECT_TRUE(plan["blockers"].empty()) << plan.dump(2);
  EXPECT_EQ(plan["noDrain"], true);
  const json r = RunJson(WithNvml({"handover", "check", "--node", "node-a"}), 0);
  for (const char* check : {"handover-proof", "handover-overlap", "handover-allocator"}) {
    EXPECT_EQ(Result(r, check, "node-a"), "PASS") << check << "\n" << r.dump(2);
  }
  // Without --node: every GPU node, the same.
  const json all = RunJson(WithNvml({"handover", "check"}), 0);
  EXPECT_EQ(Result(all, "handover-proof", "node-a"), "PASS");
}

TEST_F(HandoverTest, CheckFailsOnAnUnprovenInstanceNamingIt) {
  Scenario();
  const json r = RunJson(WithNvml({"handover", "check", "--node", "node-a"}), 1);
  EXPECT_EQ(Result(r, "handover-proof", "node-a"), "FAIL");
  EXPECT_THAT(Evidence(r, "handover-proof", "node-a"), HasSubstr("MIG-unproven"));
  EXPECT_THAT(Evidence(r, "handover-proof", "node-a"),
              HasSubstr("dynmig handover plan --node node-a"));
  EXPECT_EQ(Result(r, "handover-overlap", "node-a"), "PASS");
  EXPECT_EQ(Result(r, "handover-allocator", "node-a"), "PASS");
}

TEST_F(HandoverTest, OverlapFailsWhenALegacyInstanceIsNotPublishedOrAReservationCoversOne) {
  Add(NodeA(/*publish_all=*/false));
  Add(NvidiaPod("nv"));
  Add(HamiPod("hami"));
  nvml_.Set("node-a", View(false));
  // A dynmig pod whose reservation lies over the free legacy 3g.20gb@4.
  Add(PlacedPod("dyn", "node-a", 19000, {{kGpu, "3g.20gb", 4, 4}}));
  const json r = RunJson(WithNvml({"handover", "check", "--node", "node-a"}), 1);
  EXPECT_EQ(Result(r, "handover-overlap", "node-a"), "FAIL") << r.dump(2);
  const std::string ev = Evidence(r, "handover-overlap", "node-a");
  EXPECT_THAT(ev, HasSubstr("not-published"));
  EXPECT_THAT(ev, HasSubstr("GPU 0 1g.5gb@1+1 (GI 8, MIG-hami)"));
  EXPECT_THAT(ev, HasSubstr("default/dyn reserves GPU-a0 3g.20gb@4+4, over the legacy GPU 0 "
                            "3g.20gb@4+4"));
  EXPECT_EQ(Result(r, "handover-proof", "node-a"), "PASS");
}

TEST_F(HandoverTest, EachLegacyAllocatorStillServingIsABlocker) {
  json node = NodeA();
  node["metadata"]["labels"][std::string(protocol::kMigManagerDeployLabel)] = "true";
  node["status"]["allocatable"] = {{std::string(protocol::kMigResourcePrefix) + "1g.5gb", "2"},
                                   {std::string(protocol::kMigResourcePrefix) + "3g.20gb", "0"}};
  Add(node);
  json plugin = Pod("nvidia-device-plugin-daemonset-x7k2p", "node-a", 0);
  plugin["spec"]["containers"][0] = {{"name", "plugin"},
                                     {"image", "nvcr.io/nvidia/k8s-device-plugin:v0.14.5"}};
  Add(plugin);
  json manager = Pod("nvidia-mig-manager-abcde", "node-a", 0);
  manager["spec"]["containers"][0] = {{"name", "mgr"},
                                      {"image", "nvcr.io/nvidia/cloud-native/k8s-mig-manager"}};
  Add(manager);
  json ours = Pod("dynmig-device-plugin-q", "node-a", 0);
  ours["spec"]["containers"][0] = {{"name", "p"}, {"image", "dynmig/k8s-device-plugin:1"}};
  Add(ours);
  nvml_.Set("node-a", View(false));
  const json plan = RunJson(WithNvml({"handover", "plan", "--node", "node-a"}), 0);
  EXPECT_EQ(BlockerIds(plan), (std::vector<std::string>{"allocatable", "nvidia-device-plugin",
                                                        "mig-manager", "mig-manager-label"}))
      << plan.dump(2);
  const json r = RunJson(WithNvml({"handover", "check", "--node", "node-a"}), 1);
  EXPECT_EQ(Result(r, "handover-allocator", "node-a"), "FAIL");
  const std::string ev = Evidence(r, "handover-allocator", "node-a");
  EXPECT_THAT(ev, HasSubstr("nvidia.com/mig-1g.5gb=2"));
  EXPECT_THAT(ev, Not(HasSubstr("mig-3g.20gb=0")));
  EXPECT_THAT(ev, HasSubstr("nvidia-device-plugin-daemonset-x7k2p"));
  EXPECT_THAT(ev, Not(HasSubstr("dynmig-device-plugin-q")));
  EXPECT_THAT(ev, HasSubstr("nvidia.com/gpu.deploy.mig-manager=true"));
}

// A pod of HAMi's device plugin as HAMi's chart deploys it (charts/hami/templates/device-plugin/
// daemonsetnvidia.yaml): DaemonSet pod labelled app.kubernetes.io/component=hami-device-plugin,
// container device-plugin (projecthami/hami, command nvidia-device-plugin) beside vgpu-monitor.
json HamiPluginPod(const std::string& name, const std::string& node, const std::string& ns) {
  json p = Pod(name, node, 0, "Running", 1, ns);
  p["metadata"]["labels"] = {{"app.kubernetes.io/component", "hami-device-plugin"},
                             {"app.kubernetes.io/name", "hami"},
                             {"app.kubernetes.io/instance", "hami"},
                             {"hami.io/webhook", "ignore"}};
  p["metadata"]["ownerReferences"] = json::array(
      {{{"apiVersion", "apps/v1"}, {"kind", "DaemonSet"}, {"name", "hami-device-plugin"}}});
  p["spec"]["containers"] = json::array(
      {{{"name", "device-plugin"},
        {"image", "projecthami/hami:v2.4.1"},
        {"command",
         {"nvidia-device-plugin", "--config-file=/device-config.yaml", "--mig-strategy=none"}}},
       {{"name", "vgpu-monitor"},
        {"image", "projecthami/hami:v2.4.1"},
        {"command", {"vGPUmonitor"}}}});
  return p;
}

// dynmig's own plugin registers nvidia.com/gpu too, so that count proves nothing; a running pod of
// HAMi's device plugin on the node does, and fails handover-allocator (and so preflight's and
// validate's no-drain path).
TEST_F(HandoverTest, HamisDevicePluginPodOnTheNodeIsABlocker) {
  json node = NodeA();
  node["status"]["allocatable"] = {{"nvidia.com/gpu", "10"}};
  Add(node);
  Add(NvidiaPod("nv"));
  Add(HamiPod("hami"));
  nvml_.Set("node-a", View(false));
  json r = RunJson(WithNvml({"handover", "check", "--node", "node-a"}), 0);
  EXPECT_EQ(Result(r, "handover-allocator", "node-a"), "PASS") << r.dump(2);

  Add(HamiPluginPod("hami-device-plugin-7xk2q", "node-a", "kube-system"));
  const json plan = RunJson(WithNvml({"handover", "plan", "--node", "node-a"}), 0);
  EXPECT_EQ(BlockerIds(plan), std::vector<std::string>{"hami-device-plugin"}) << plan.dump(2);
  EXPECT_EQ(plan["noDrain"], false);
  r = RunJson(WithNvml({"handover", "check", "--node", "node-a"}), 1);
  EXPECT_EQ(Result(r, "handover-allocator", "node-a"), "FAIL") << r.dump(2);
  EXPECT_EQ(Result(r, "handover-proof", "node-a"), "PASS");
  const std::string ev = Evidence(r, "handover-allocator", "node-a");
  EXPECT_THAT(ev, HasSubstr("HAMi's device plugin runs on the node"));
  EXPECT_THAT(ev, HasSubstr("kube-system/hami-device-plugin-7xk2q (Running) (owner DaemonSet "
                            "hami-device-plugin): label "
                            "app.kubernetes.io/component=hami-device-plugin"));
  EXPECT_THAT(ev, HasSubstr("kubectl label node node-a gpu-"));

  // The no-drain path of preflight and validate reads the same plan.
  r = RunJson(WithNvml({"preflight", "--node", "node-a"}), 1);
  EXPECT_EQ(Result(r, "legacy-pods", "node-a"), "FAIL") << r.dump(2);
  EXPECT_THAT(Evidence(r, "legacy-pods", "node-a"),
              HasSubstr("the no-drain handover is blocked: hami-device-plugin"));
  r = RunJson(WithNvml({"validate", "--node", "node-a"}), 1);
  EXPECT_EQ(Result(r, "legacy-pods", "node-a"), "FAIL") << r.dump(2);
}

// Without the chart's label, HAMi's image running the plugin is enough (a hand-written
// DaemonSet, a mirror registry, a digest); the plugin's own pod also matches by the label alone.
TEST(HamiDevicePluginSignalTest, ImageAndCommandOrTheChartLabel) {
  json p = HamiPluginPod("hami-device-plugin-1", "node-a", "kube-system");
  EXPECT_THAT(HamiDevicePluginSignal(p).value_or(""),
              HasSubstr("label app.kubernetes.io/component=hami-device-plugin"));
  p["metadata"]["labels"] = {{"app", "gpu-plugin"}};
  EXPECT_EQ(HamiDevicePluginSignal(p).value_or(""),
            "container device-plugin runs HAMi's device plugin (image projecthami/hami:v2.4.1)");
  for (const char* image :
       {"docker.m.daocloud.io/projecthami/hami:v2.4.1",
        "registry.local:5000/mirror/hami@sha256:0123abcd", "Docker.IO/ProjectHAMi/HAMi",
        "example.com/gpu/hami-device-plugin:v1", "hami"}) {
    p["spec"]["containers"][0]["image"] = image;
    EXPECT_TRUE(HamiDevicePluginSignal(p).has_value()) << image;
  }
  // Named otherwise, running the plugin binary by path.
  p["spec"]["containers"][0]["image"] = "projecthami/hami:v2.3";
  p["spec"]["containers"][0]["name"] = "plugin";
  p["spec"]["containers"][0]["command"] = {"/usr/local/bin/nvidia-device-plugin"};
  EXPECT_THAT(HamiDevicePluginSignal(p).value_or(""), HasSubstr("container plugin"));
  // As an init container too.
  json init = p;
  init["spec"]["initContainers"] = init["spec"]["containers"];
  init["spec"]["containers"] = json::array();
  EXPECT_TRUE(HamiDevicePluginSignal(init).has_value());
}

TEST(HamiDevicePluginSignalTest, HamisOtherPodsDynmigsPluginAndLookalikesAreNotIt) {
  // HAMi's scheduler: same image, command scheduler, component hami-scheduler.
  json sched = Pod("hami-scheduler-5f7c", "node-a", 0, "Running", 1, "kube-system");
  sched["metadata"]["labels"] = {{"app.kubernetes.io/component", "hami-scheduler"}};
  sched["spec"]["containers"] = json::array(
      {{{"name", "kube-scheduler"}, {"image", "registry.k8s.io/kube-scheduler:v1.20.2"}},
       {{"name", "vgpu-scheduler-extender"},
        {"image", "projecthami/hami:v2.4.1"},
        {"command", {"scheduler", "--http_bind=0.0.0.0:443"}}}});
  EXPECT_EQ(HamiDevicePluginSignal(sched), std::nullopt);
  // The vgpu-monitor container alone.
  json monitor = HamiPluginPod("m", "node-a", "kube-system");
  monitor["metadata"]["labels"] = json::object();
  monitor["spec"]["containers"].erase(0);
  EXPECT_EQ(HamiDevicePluginSignal(monitor), std::nullopt);
  // dynmig's own device plugin (deploy/: component device-plugin, dynmig's image).
  json ours = Pod("dynmig-device-plugin-q", "node-a", 0, "Running", 1, "dynmig-system");
  ours["metadata"]["labels"] = {{"app.kubernetes.io/name", "dynmig"},
                                {"app.kubernetes.io/component", "device-plugin"}};
  ours["spec"]["containers"] =
      json::array({{{"name", "device-plugin"}, {"image", "ghcr.io/dynmig/dynmig:0.9"}}});
  EXPECT_EQ(HamiDevicePluginSignal(ours), std::nullopt);
  ours["spec"]["containers"][0]["image"] = "example.com/hami-dynmig:1";  // names dynmig
  EXPECT_EQ(HamiDevicePluginSignal(ours), std::nullopt);
  // Lookalike images and label values.
  json p = HamiPluginPod("x", "node-a", "default");
  p["metadata"]["labels"] = {{"app.kubernetes.io/component", "hami-device-plugin-extra"}};
  for (const char* image : {"example/shami:1", "hamilton/app:2", "nvcr.io/nvidia/k8s-device-plugin",
                            "example/projecthamis/x", "example/hami:1/../x"}) {
    p["spec"]["containers"][0]["image"] = image;
    EXPECT_EQ(HamiDevicePluginSignal(p), std::nullopt) << image;
  }
}

// Every field of a pod is hostile: wrong types are skipped, never thrown on; an overlong image is
// shown bounded.
TEST(HamiDevicePluginSignalTest, WrongTypesAndHugeStrings) {
  json p = HamiPluginPod("x", "node-a", "default");
  p["metadata"]["labels"] = {{"app.kubernetes.io/component", 7}};
  p["spec"]["containers"][0]["image"] = 42;
  EXPECT_EQ(HamiDevicePluginSignal(p), std::nullopt);
  p["spec"]["containers"][0]["image"] = "projecthami/hami";
  p["spec"]["containers"][0]["name"] = json::array();
  p["spec"]["containers"][0]["command"] = "nvidia-device-plugin";  // not a list
  EXPECT_EQ(HamiDevicePluginSignal(p), std::nullopt);
  p["spec"]["containers"][0]["command"] = json::array({json::object()});
  EXPECT_EQ(HamiDevicePluginSignal(p), std::nullopt);
  p["spec"]["containers"] = json::array({"not an object", nullptr});
  EXPECT_EQ(HamiDevicePluginSignal(p), std::nullopt);
  p["spec"] = "nope";
  EXPECT_EQ(HamiDevicePluginSignal(p), std::nullopt);

  json big = HamiPluginPod("x", "node-a", "default");
  big["metadata"]["labels"] = json::object();
  big["spec"]["containers"][0]["image"] = "projecthami/hami:" + std::string(100000, 'v');
  const std::string why = HamiDevicePluginSignal(big).value_or("");
  EXPECT_THAT(why, HasSubstr("(100017 characters)"));
  EXPECT_LT(why.size(), 400u);
}

// Anyone who can create a pod can give it HAMi's labels. Decided: such a pod bound to the node
// blocks (the check only reports; it names the pod, its namespace and owner so the operator sees
// it is not HAMi's), but only a pod the node's kubelet runs (spec.nodeName): a pod elsewhere that
// merely names the node in hami.io/vgpu-node does not, nor one that has ended.
TEST_F(HandoverTest, ATenantsLookalikePodBlocksOnlyWhereItRuns) {
  Add(NodeA());
  Add(Node("node-b", Register({{"GPU-b0"}}, {"1g.5gb"})));
  nvml_.Set("node-a", View(false));
  json elsewhere = HamiPluginPod("fake-b", "node-b", "tenant");
  elsewhere["metadata"].erase("ownerReferences");
  Annotate(elsewhere, protocol::kVgpuNodeAnnotation, "node-a");
  Add(elsewhere);
  json ended = HamiPluginPod("ended", "node-a", "kube-system");
  ended["status"]["phase"] = "Succeeded";
  Add(ended);
  json r = RunJson(WithNvml({"handover", "check", "--node", "node-a"}), 0);
  EXPECT_EQ(Result(r, "handover-allocator", "node-a"), "PASS") << r.dump(2);

  json tenant = HamiPluginPod("fake-a", "node-a", "tenant");
  tenant["metadata"].erase("ownerReferences");
  tenant["spec"]["containers"] =
      json::array({{{"name", "c"}, {"image", "ubuntu:22.04"}, {"command", {"sleep", "1d"}}}});
  Add(tenant);
  r = RunJson(WithNvml({"handover", "check", "--node", "node-a"}), 1);
  EXPECT_EQ(Result(r, "handover-allocator", "node-a"), "FAIL") << r.dump(2);
  const std::string ev = Evidence(r, "handover-allocator", "node-a");
  EXPECT_THAT(ev, HasSubstr("tenant/fake-a (Running) (no owner): label"));
  EXPECT_THAT(ev, Not(HasSubstr("fake-b")));
  EXPECT_THAT(ev, Not(HasSubstr("kube-system/ended")));
}

TEST_F(HandoverTest, TheLegacyRegisterFormatAndALeftoverMigConfigLabelBlock) {
  json node = Node("node-a",
                   R"([{"id":"GPU-a0","count":7,"devmem":40960,"type":"NVIDIA A100-SXM4-40GB",)"
                   R"("mode":"mig","health":true,"migtemplate":[{"name":"1g.5gb","memory":5120,)"
                   R"("count":7}]}])",
                   {{"nvidia.com/mig.config", "all-1g.5gb"}}, true);
  Add(node);
  nvml_.Set("node-a", View(false));
  const json plan = RunJson(WithNvml({"handover", "plan", "--node", "node-a"}), 0);
  const auto ids = BlockerIds(plan);
  EXPECT_THAT(ids, ::testing::Contains("register-format")) << plan.dump(2);
  EXPECT_THAT(ids, ::testing::Contains("mig-manager-label"));
}

TEST_F(HandoverTest, MissingEvidenceBlocksTheProof) {
  Add(NodeA());
  Add(HamiPod("hami"));
  Add(NvidiaPod("nv"));
  // A device plugin too old to publish evidence.
  json old = View(false);
  old.erase("evidence");
  nvml_.Set("node-a", old);
  json plan = RunJson(WithNvml({"handover", "plan", "--node", "node-a"}), 0);
  EXPECT_THAT(BlockerIds(plan), ::testing::Contains("evidence")) << plan.dump(2);
  EXPECT_TRUE(plan["evidence"].is_null());

  // No runtime while a HAMi legacy pod runs: only the runtime proves it.
  json no_runtime = View(false);
  no_runtime["evidence"]["runtime"] = {{"configured", false}};
  nvml_.Set("node-a", no_runtime);
  plan = RunJson(WithNvml({"handover", "plan", "--node", "node-a"}), 0);
  EXPECT_EQ(BlockerIds(plan), std::vector<std::string>{"runtime-evidence"}) << plan.dump(2);
  EXPECT_THAT(plan["blockers"][0].dump(), HasSubstr("HAMi legacy pod default/hami"));

  // PodResources failed.
  json no_pr = View(false);
  no_pr["evidence"]["podResources"] = {{"ok", false}, {"error", "connection refused"}};
  nvml_.Set("node-a", no_pr);
  plan = RunJson(WithNvml({"handover", "plan", "--node", "node-a"}), 0);
  EXPECT_THAT(BlockerIds(plan), ::testing::Contains("pod-resources"));
  EXPECT_THAT(plan["blockers"][0].dump(), HasSubstr("connection refused"));
}

TEST_F(HandoverTest, NoRuntimeIsFineWithoutHamiPods) {
  Add(NodeA());
  Add(NvidiaPod("nv"));
  json view = View(false);
  view["gpus"][0]["instances"][1]["holders"] =
      json::array({Holder("gone", "c", "", "runtime", "MIG-hami")});
  view["evidence"]["runtime"] = {{"configured", false}};
  nvml_.Set("node-a", view);
  const json plan = RunJson(WithNvml({"handover", "plan", "--node", "node-a"}), 0);
  EXPECT_TRUE(plan["blockers"].empty()) << plan.dump(2);
}

TEST_F(HandoverTest, ALegacyPodWhoseInstanceIsNotAmongTheHoldersBlocks) {
  Add(NodeA());
  Add(NvidiaPod("nv"));
  Add(HamiPod("hami"));
  Add(NvidiaPod("nv2", "3g.20gb"));  // asks for a 3g.20gb nobody proves it holds
  json view = View();
  // The holder names hami by a UID that is not the live pod's (a name reused after deletion).
  view["gpus"][0]["instances"][1]["holders"][0]["podUID"] = "uid-of-a-deleted-pod";
  nvml_.Set("node-a", view);
  const json plan = RunJson(WithNvml({"handover", "plan", "--node", "node-a"}), 0);
  EXPECT_THAT(BlockerIds(plan), ::testing::Contains("legacy-pod")) << plan.dump(2);
  std::string missing;
  for (const auto& p : plan["legacyPods"]) {
    if (p["pod"] == "default/nv") {
      EXPECT_EQ(p["attributed"], true);
    }
    for (const auto& m : p["missing"])
      missing += p["pod"].get<std::string>() + ": " + m.get<std::string>() + "\n";
  }
  EXPECT_THAT(missing, HasSubstr("default/hami: GPU-a0[1-1]: 0 of 1 found among the holders "
                                 "(unproven here: GPU 0 2g.10gb@2+2 (GI 3, MIG-unproven))"));
  EXPECT_THAT(missing,
              HasSubstr("default/nv2: container main: nvidia.com/mig-3g.20gb x1: 0 of 1 found"));
}

// Counts are read as the API server serves quantities: "2k" asks for 2,000 devices (not 2), so
// one proven instance is far from enough. (A count that is no quantity never gets past the API
// server.)
TEST_F(HandoverTest, LegacyDeviceCountsAreReadAsQuantities) {
  Add(NodeA());
  json many = NvidiaPod("nv");
  many["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.5gb"] = "2k";
  Add(many);
  nvml_.Set("node-a", View());
  const json plan = RunJson(WithNvml({"handover", "plan", "--node", "node-a"}), 0);
  std::string missing;
  for (const auto& p : plan["legacyPods"]) {
    for (const auto& m : p["missing"]) missing += m.get<std::string>() + "\n";
  }
  EXPECT_THAT(missing, HasSubstr("nvidia.com/mig-1g.5gb x2000: 1 of 2000 found")) << missing;
}

TEST_F(HandoverTest, AnUnreachableViewBlocksAndTheCheckFails) {
  Add(NodeA());
  Add(HamiPod("hami"));
  const json plan = RunJson(WithNvml({"handover", "plan", "--node", "node-a"}), 0);
  EXPECT_EQ(BlockerIds(plan), std::vector<std::string>{"nvml-view"}) << plan.dump(2);
  EXPECT_EQ(plan["view"]["ok"], false);
  const json r = RunJson(WithNvml({"handover", "check", "--node", "node-a"}), 1);
  EXPECT_EQ(Result(r, "handover-proof", "node-a"), "FAIL");
  EXPECT_THAT(Evidence(r, "handover-proof", "node-a"), HasSubstr("HTTP 404"));
}

TEST_F(HandoverTest, UnknownNodeIsBadInput) {
  Add(NodeA());
  auto r = Run(WithNvml({"handover", "plan", "--node", "nope"}));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("dynmig handover plan: node \"nope\" not found"));
  r = Run(WithNvml({"handover", "check", "--node", "nope"}));
  EXPECT_EQ(r.code, 2);
}

// ---- preflight and validate learn the no-drain path ----

TEST_F(HandoverTest, PreflightLetsProvenLegacyPodsStay) {
  Scenario(/*with_unproven=*/false);
  const json r = RunJson(WithNvml({"preflight", "--node", "node-a"}), 0);
  EXPECT_EQ(Result(r, "legacy-pods", "node-a"), "PASS") << r.dump(2);
  EXPECT_THAT(Evidence(r, "legacy-pods", "node-a"), HasSubstr("default/nv holds"));
  EXPECT_THAT(Evidence(r, "legacy-pods", "node-a"), HasSubstr("no drain needed"));
  EXPECT_EQ(Result(r, "gpu-workloads", "node-a"), "PASS") << r.dump(2);
}

TEST_F(HandoverTest, PreflightSaysDrainOnlyWhenTheNoDrainHandoverIsBlocked) {
  Scenario();  // the unproven instance blocks
  json r = RunJson(WithNvml({"preflight", "--node", "node-a"}), 1);
  EXPECT_EQ(Result(r, "legacy-pods", "node-a"), "FAIL");
  std::string ev = Evidence(r, "legacy-pods", "node-a");
  EXPECT_THAT(ev, HasSubstr("default/nv: container main: nvidia.com/mig-1g.5gb x1"));
  EXPECT_THAT(ev, HasSubstr("default/hami: GPU-a0[1-1] (hami.io/vgpu-devices-allocated)"));
  EXPECT_THAT(ev, HasSubstr("the no-drain handover is blocked: unproven"));
  EXPECT_THAT(ev, HasSubstr("dynmig handover plan --node node-a"));
  EXPECT_THAT(ev, HasSubstr("drain these pods"));
  EXPECT_EQ(Result(r, "gpu-workloads", "node-a"), "FAIL");
  EXPECT_THAT(Evidence(r, "gpu-workloads", "node-a"), HasSubstr("default/nv (Running)"));

  // No endpoint: nothing proves them.
  r = RunJson({"preflight", "--node", "node-a", "--nvml-endpoint", ""}, 1);
  EXPECT_THAT(Evidence(r, "legacy-pods", "node-a"),
              HasSubstr("the no-drain handover was not checked"));
}

TEST_F(HandoverTest, ValidateAcceptsANodeWhoseLegacyPodsAreAllAttributed) {
  Scenario(/*with_unproven=*/false);
  json r = RunJson(WithNvml({"validate", "--node", "node-a"}), 0);
  EXPECT_EQ(Result(r, "legacy-pods", "node-a"), "PASS") << r.dump(2);
  EXPECT_EQ(Result(r, "pod-reservation", "default/hami"), "PASS") << r.dump(2);
  EXPECT_THAT(Evidence(r, "pod-reservation", "default/hami"), HasSubstr("MIG-hami"));

  // The HAMi pod's holder gone: validate fails it and the node's legacy-pods.
  json view = View(false);
  view["gpus"][0]["instances"][1]["holders"] =
      json::array({Holder("someone-else", "c", "", "runtime", "MIG-hami")});
  nvml_.Set("node-a", view);
  r = RunJson(WithNvml({"validate", "--node", "node-a"}), 1);
  EXPECT_EQ(Result(r, "legacy-pods", "node-a"), "FAIL");
  EXPECT_EQ(Result(r, "pod-reservation", "default/hami"), "FAIL");
}

TEST_F(HandoverTest, ValidateReportsNoLegacyPodsItemOnANodeWithout) {
  Add(NodeA());
  nvml_.Set("node-a", View(false));
  const json r = RunJson(WithNvml({"validate", "--node", "node-a"}), 0);
  EXPECT_EQ(Result(r, "legacy-pods", "node-a"), "absent") << r.dump(2);
}

// ---- hostile views ----

TEST_F(HandoverTest, AHugeOrDeepViewIsAClearBlockerNotACrash) {
  Add(NodeA());
  // 17 MiB of valid JSON: over the 16 MiB bound of a view.
  json huge = View(false);
  huge["padding"] = std::string(17 * 1024 * 1024, 'x');
  nvml_.Set("node-a", huge);
  json plan = RunJson(WithNvml({"handover", "plan", "--node", "node-a"}), 0);
  EXPECT_EQ(BlockerIds(plan), std::vector<std::string>{"nvml-view"});
  EXPECT_THAT(plan["view"]["error"].get<std::string>(), HasSubstr("exceeds the 16 MiB limit"));

  json deep = json::array();
  for (int i = 0; i < 200; ++i) deep = json::array({deep});
  json nested = View(false);
  nested["gpus"][0]["instances"][0]["holders"][0]["extra"] = deep;
  nvml_.Set("node-a", nested);
  plan = RunJson(WithNvml({"handover", "plan", "--node", "node-a"}), 0);
  EXPECT_THAT(plan["view"]["error"].get<std::string>(), HasSubstr("nesting deeper than 64 levels"));
}

TEST(HandoverViewTest, WrongTypesAreRefusedNamingTheField) {
  auto message = [](const std::function<void(json&)>& spoil) {
    json doc = NvmlDoc("n", {{kGpu}}, {{kGpu, "1g.5gb", 0, 1, 7, 0, "MIG-x"}});
    doc["gpus"][0]["instances"][0]["holders"] = {
        Holder("p", "c", "nvidia.com/mig-1g.5gb", "pod-resources", "MIG-x")};
    doc["evidence"] = {{"podResources", {{"ok", true}}}, {"runtime", {{"ok", true}}}};
    spoil(doc);
    auto v = ParseNvmlView(doc);
    return v.ok() ? std::string("ok") : std::string(v.status().message());
  };
  EXPECT_EQ(message([](json&) {}), "ok");
  EXPECT_EQ(message([](json& d) { d["gpus"][0]["instances"][0]["holders"] = "p"; }),
            "NVML view: gpus[0].instances[0].holders: must be an array");
  EXPECT_EQ(message([](json& d) { d["gpus"][0]["instances"][0]["holders"][0]["podUID"] = 7; }),
            "NVML view: gpus[0].instances[0].holders[0].podUID: must be a string");
  EXPECT_EQ(message([](json& d) { d["gpus"][0]["instances"][0]["holders"][0] = json::object(); }),
            "NVML view: gpus[0].instances[0].holders[0]: must be a holder naming its pod "
            "(podUID or namespace/name)");
  EXPECT_EQ(message([](json& d) { d["gpus"][0]["instances"][0]["managed"] = "yes"; }),
            "NVML view: gpus[0].instances[0].managed: must be true or false");
  EXPECT_EQ(message([](json& d) { d["gpus"][0]["instances"][0]["unproven"] = 1; }),
            "NVML view: gpus[0].instances[0].unproven: must be a string");
  EXPECT_EQ(message([](json& d) { d["evidence"] = "ok"; }),
            "NVML view: evidence: must be an object");
  EXPECT_EQ(message([](json& d) { d["evidence"]["runtime"]["ok"] = "true"; }),
            "NVML view: evidence.runtime.ok: must be true or false");
  EXPECT_EQ(message([](json& d) {
              d["gpus"][0]["instances"][0]["holders"][0]["name"] = std::string(5000, 'n');
            }),
            "NVML view: gpus[0].instances[0].holders[0].name: must be a string of at most 4096 "
            "bytes");
  EXPECT_EQ(message([](json& d) {
              json many = json::array();
              for (int i = 0; i < 257; ++i) many.push_back(Holder("p", "c", "", "runtime", "M"));
              d["gpus"][0]["instances"][0]["holders"] = many;
            }),
            "NVML view: gpus[0].instances[0].holders: must be an array of at most 256 entries");
  EXPECT_EQ(message([](json& d) {
              json gpus = json::array();
              for (int i = 0; i < 65; ++i) gpus.push_back(json::object());
              d["gpus"] = gpus;
            }),
            "NVML view: gpus: must be an array of at most 64 entries");
}

TEST(HandoverViewTest, AttributionFieldsAreRead) {
  json doc = NvmlDoc("n", {{kGpu}}, {{kGpu, "1g.5gb", 0, 1, 7, 0, "MIG-x"}});
  json& i = doc["gpus"][0]["instances"][0];
  i["managed"] = true;
  i["origin"] = "legacy";
  i["idle"] = true;
  i["owner"] = {{"podUID", "u"}, {"namespace", "ns"}, {"name", "p"}};
  i["holders"] = {Holder("p", "c", "r", "runtime", "MIG-x", "u")};
  doc["evidence"] = {{"podResources", {{"ok", false}, {"error", "e"}}},
                     {"runtime", {{"configured", false}}}};
  auto v = ParseNvmlView(doc);
  ASSERT_TRUE(v.ok()) << v.status();
  const NvmlInstanceView& inst = v->gpus[0].instances[0];
  EXPECT_TRUE(inst.legacy());
  EXPECT_TRUE(inst.idle);
  EXPECT_EQ(inst.owner_name, "p");
  ASSERT_EQ(inst.holders.size(), 1u);
  EXPECT_EQ(inst.holders[0].pod_uid, "u");
  EXPECT_EQ(inst.holders[0].source, "runtime");
  ASSERT_TRUE(v->evidence.has_value());
  EXPECT_FALSE(v->evidence->pod_resources.ok);
  EXPECT_EQ(v->evidence->pod_resources.error, "e");
  EXPECT_FALSE(v->evidence->runtime.configured);
  EXPECT_EQ(v->node, "n");
}

}  // namespace
}  // namespace dynmig::ops::testing
