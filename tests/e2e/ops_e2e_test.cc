// The migration commands against the whole system: each test starts a LocalCluster (API server
// with webhooks and identities, scheduler extender, device plugins on simulated GPUs behind a
// kubelet over gRPC) and runs `dynmig inventory|preflight|validate|explain|layout|defrag` in
// process exactly as an operator types them (--kubeconfig, --nvml-endpoint), on a healthy cluster
// and on each blocking condition of the migration guide.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <set>
#include <sstream>

#include "cli/cli.h"
#include "cli/cli_test_util.h"
#include "e2e/e2e_test_util.h"
#include "fmt/format.h"
#include "kube/api_store.h"
#include "protocol/device_config.h"
#include "protocol/held_slices.h"
#include "protocol/node_register.h"

namespace dynmig::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using cli::testing::CliResult;

// What HAMi's legacy scheduler writes: a template/slot identity instead of a reservation.
constexpr const char* kLegacyConfig = R"(nvidia:
  resourceCountName: nvidia.com/gpu
  knownMigGeometries:
    - models: ["A100-SXM4-40GB"]
      allowedGeometries:
        - - name: 1g.5gb
            core: 14
            memory: 5120
            count: 7
)";

class OpsE2eTest : public E2eTest {
 protected:
  // `dynmig <command> --kubeconfig K <args...>`; inventory and validate also get the local
  // cluster's NVML endpoint template unless the args name one.
  CliResult Cli(const std::string& command, std::vector<std::string> args = {}) {
    std::vector<std::string> argv = {command, "--kubeconfig", cluster_->kubeconfig_path()};
    const bool names_endpoint =
        std::find(args.begin(), args.end(), "--nvml-endpoint") != args.end();
    if ((command == "inventory" || command == "validate") && !names_endpoint) {
      argv.push_back("--nvml-endpoint");
      argv.push_back(cluster_->nvml_endpoint_template());
    }
    argv.insert(argv.end(), args.begin(), args.end());
    return cli::testing::RunDynmig(argv);
  }
  // The same with -o json, checking the exit code.
  json CliJson(const std::string& command, std::vector<std::string> args, int want_code) {
    args.push_back("-o");
    args.push_back("json");
    CliResult r = Cli(command, args);
    EXPECT_EQ(r.code, want_code) << Where() << "dynmig " << command << ":\n" << r.out << r.err;
    json doc = json::parse(r.out, nullptr, false);
    EXPECT_FALSE(doc.is_discarded()) << Where() << "not JSON:\n" << r.out << r.err;
    return doc.is_discarded() ? json() : doc;
  }

  // The result of a check item (about a node or a subject), "absent" when there is none.
  static std::string Result(const json& report, const std::string& check,
                            const std::string& node_or_subject = "") {
    const json* item = Item(report, check, node_or_subject);
    return item == nullptr ? "absent" : (*item)["result"].get<std::string>();
  }
  // Summary and evidence of that item, one per line.
  static std::string Evidence(const json& report, const std::string& check,
                              const std::string& node_or_subject = "") {
    const json* item = Item(report, check, node_or_subject);
    if (item == nullptr) return "";
    std::string s = (*item)["summary"].get<std::string>();
    for (const auto& e : (*item)["evidence"]) s += "\n" + e.get<std::string>();
    return s;
  }
  static const json* Item(const json& report, const std::string& check,
                          const std::string& node_or_subject) {
    if (!report.contains("items")) return nullptr;
    for (const auto& i : report["items"]) {
      if (i["check"] != check) continue;
      if (!node_or_subject.empty() && i["node"] != node_or_subject &&
          i["subject"] != node_or_subject) {
        continue;
      }
      return &i;
    }
    return nullptr;
  }
  // Every item that FAILed, "check node subject" each, for messages and exact comparisons.
  static std::set<std::string> Failed(const json& report) {
    std::set<std::string> out;
    if (!report.contains("items")) return out;
    for (const auto& i : report["items"]) {
      if (i["result"] == "FAIL") {
        out.insert(i["check"].get<std::string>() +
                   (i["node"] == "" ? "" : " " + i["node"].get<std::string>()));
      }
    }
    return out;
  }

  void Cordon(const std::string& node, bool on = true) {
    auto patched = kube_->Patch(kube::Resource::kNodes, "", node,
                                {{"spec", {{"unschedulable", on ? json(true) : json(nullptr)}}}},
                                kube::PatchType::kMerge, "");
    ASSERT_TRUE(patched.ok()) << Where() << patched.status();
  }
  void Label(const std::string& node, const kube::KeyPatch& labels) {
    kube::MetadataPatch patch;
    patch.labels = labels;
    auto patched = kube_->PatchNodeMetadata(node, patch);
    ASSERT_TRUE(patched.ok()) << Where() << patched.status();
  }
  void SetDeviceConfig(const std::string& yaml) {
    auto patched =
        kube_->Patch(kube::Resource::kConfigMaps, std::string(local::kSystemNamespace),
                     std::string(local::kDeviceConfigMap),
                     {{"data", {{"device-config.yaml", yaml}}}}, kube::PatchType::kMerge, "");
    ASSERT_TRUE(patched.ok()) << Where() << patched.status();
  }
  // Writes an object past the admission webhooks, as an older component left it (the store is
  // the API server's own; its watchers see the write).
  void Backdoor(const json& pod) {
    auto created = cluster_->api().store().Create(kube::Resource::kPods, kube::Namespace(pod), pod);
    ASSERT_TRUE(created.ok()) << Where() << created.status();
  }
  void ForceDelete(const std::string& ns, const std::string& name) {
    kube::DeleteOptions del;
    del.grace_period_seconds = 0;
    auto st = kube_->DeletePod(ns, name, del);
    ASSERT_TRUE(st.ok() || absl::IsNotFound(st.status())) << Where() << st.status();
    ASSERT_TRUE(WaitUntil([&] { return absl::IsNotFound(kube_->GetPod(ns, name).status()); }))
        << Where() << ns << "/" << name << " was not removed";
  }
  // Entries of the node's published dynmig.io/mig-held (slices live instances hold without an
  // active reservation); -1 when the node or the annotation cannot be read.
  int HeldSlices(const std::string& node) {
    auto obj = kube_->GetNode(node);
    if (!obj.ok()) return -1;
    const std::string value =
        kube::Annotation(*obj, protocol::kNodeHeldSlicesAnnotation).value_or("");
    if (value.empty()) return 0;
    auto held = protocol::DecodeHeldSlices(value);
    return held.ok() ? static_cast<int>(held->size()) : -1;
  }
  std::string GpuUuid(const std::string& node, size_t index = 0) {
    auto obj = kube_->GetNode(node);
    EXPECT_TRUE(obj.ok()) << obj.status();
    if (!obj.ok()) return "";
    auto devices = protocol::DecodeNodeRegister(
        kube::Annotation(*obj, protocol::kNodeRegisterAnnotation).value_or(""));
    EXPECT_TRUE(devices.ok()) << devices.status();
    return devices.ok() && devices->size() > index ? (*devices)[index].id : "";
  }
  json ReadJson(const std::filesystem::path& path) {
    std::ifstream f(path);
    EXPECT_TRUE(f.good()) << Where() << "no file " << path;
    std::stringstream ss;
    ss << f.rdbuf();
    json doc = json::parse(ss.str(), nullptr, false);
    EXPECT_FALSE(doc.is_discarded()) << Where() << path << " is not JSON";
    return doc;
  }
  static std::string ReadText(const std::filesystem::path& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

  // The steps of the preflight scenario (PreflightPassesOnlyOnADrainedCordonedNodeAndNames...),
  // each from a cordoned, drained node-a that passes, back to one.
  void PreflightLegacyPodAndRegisterFormat(const std::vector<std::string>& node_a);
  void PreflightMigManager(const std::vector<std::string>& node_a);
  void PreflightDeviceConfigAndLegacyScheduler(const std::vector<std::string>& node_a);
};

// A pod as HAMi's legacy scheduler left it: Running on the node with a GPU-uuid[t-s] identity.
json LegacyPod(const std::string& name, const std::string& node, const std::string& gpu_uuid) {
  json pod = MigPod(name, 5000);
  pod["metadata"]["annotations"][std::string(protocol::kDevicesAllocatedAnnotation)] =
      gpu_uuid + "[1-2],NVIDIA A100-SXM4-40GB,5120,14:;";
  pod["spec"]["nodeName"] = node;
  pod["spec"]["schedulerName"] = "hami-scheduler";
  pod["status"] = {{"phase", "Running"}};
  return pod;
}

// ---- inventory ------------------------------------------------------------------------------

TEST_F(OpsE2eTest, InventorySavesConfigMapNodesPodsAndEachNodesNvmlView) {
  Scenario("inventory");
  StartCluster("node-a=A100-SXM4-40GBx1");
  Label("node-a",
        {{"nvidia.com/mig.config", "all-1g.5gb"}, {"nvidia.com/mig.config.state", "success"}});
  Step("run a 3g pod");
  const auto train = RunPod(MigPod("train", 19000));
  ASSERT_TRUE(train.runtime.has_value()) << Where();
  const std::string mig_uuid = train.runtime->mig_uuid;

  Step("inventory --out DIR");
  const auto dir = dir_ / "backup";
  const json summary = CliJson("inventory", {"--out", dir.string()}, 0);
  EXPECT_EQ(summary["nodes"], 1) << Where() << summary.dump(2);
  EXPECT_EQ(summary["migPods"], 1) << Where();
  EXPECT_EQ(summary["legacyPods"], 0) << Where();
  EXPECT_EQ(summary["nvmlReachable"], 1) << Where();
  EXPECT_EQ(summary["nvmlUnreachable"], json::array()) << Where();
  EXPECT_EQ(summary["configMaps"], json::array({"dynmig-system/dynmig-device-config"})) << Where();

  Step("the device ConfigMap");
  const json cm = ReadJson(dir / "configmaps" / "dynmig-system_dynmig-device-config.json");
  EXPECT_THAT(cm["data"].value("device-config.yaml", ""), HasSubstr("migProfileAllowlist"))
      << Where();

  Step("the node's annotations and MIG labels");
  const json node = ReadJson(dir / "nodes" / "node-a.json");
  EXPECT_EQ(node["labels"].value("nvidia.com/mig.config", ""), "all-1g.5gb") << Where();
  EXPECT_EQ(node["labels"].value("nvidia.com/mig.config.state", ""), "success") << Where();
  EXPECT_TRUE(node["annotations"].contains(std::string(protocol::kNodeRegisterAnnotation)))
      << Where() << node.dump(2);
  EXPECT_TRUE(node["annotations"].contains(std::string(protocol::kNodeHandshakeAnnotation)))
      << Where() << node.dump(2);
  ASSERT_EQ(node["registerDevices"].size(), 1u) << Where() << node.dump(2);
  EXPECT_EQ(node["registerDevices"][0]["uuid"], train.gpu_uuid) << Where();
  EXPECT_EQ(node["registerDevices"][0]["mode"], "mig") << Where();
  EXPECT_THAT(node["registerDevices"][0]["migProfiles"].dump(), HasSubstr("\"3g.20gb\""))
      << Where();
  EXPECT_EQ(node["address"], cluster_->node_address("node-a")) << Where();

  Step("the active MIG pods with their identities");
  const json pods = ReadJson(dir / "mig-pods.json");
  ASSERT_EQ(pods["pods"].size(), 1u) << Where() << pods.dump(2);
  const json& p = pods["pods"][0];
  EXPECT_EQ(p["name"], "train") << Where();
  EXPECT_EQ(p["node"], "node-a") << Where();
  EXPECT_EQ(p["phase"], "Running") << Where();
  ASSERT_EQ(p["allocations"].size(), 1u) << Where() << p.dump(2);
  EXPECT_EQ(p["allocations"][0]["profile"], "3g.20gb") << Where();
  EXPECT_EQ(p["allocations"][0]["migUUID"], mig_uuid) << Where();
  EXPECT_EQ(p["allocations"][0]["gpuUUID"], train.gpu_uuid) << Where();
  EXPECT_THAT(p.value("visibleDevices", ""), HasSubstr(mig_uuid)) << Where();

  Step("the node's NVML view, fetched from its device plugin");
  const json view = ReadJson(dir / "nvml" / "node-a.json");
  EXPECT_EQ(view["reachable"], true) << Where() << view.dump(2);
  EXPECT_EQ(view["url"], fmt::format("http://{}:{}/nvml", cluster_->node_address("node-a"),
                                     cluster_->options().nvml_port))
      << Where();
  EXPECT_THAT(view["view"].dump(), HasSubstr(mig_uuid)) << Where() << "NVML has no instance";
  EXPECT_THAT(view["view"].dump(), HasSubstr(train.gpu_uuid)) << Where();

  const std::string text = ReadText(dir / "summary.txt");
  EXPECT_THAT(text, HasSubstr("default/train on node-a (Running)")) << Where() << text;
  EXPECT_THAT(text, HasSubstr("nvidia.com/mig.config=all-1g.5gb")) << Where() << text;
  EXPECT_THAT(text, HasSubstr("ConfigMap dynmig-system/dynmig-device-config")) << Where();

  Step("a second backup into the same directory is refused");
  CliResult again = Cli("inventory", {"--out", dir.string()});
  EXPECT_EQ(again.code, cli::kExitBadInput) << Where() << again.out << again.err;
  EXPECT_THAT(again.err, HasSubstr("not empty")) << Where();

  Step("with the device plugin stopped, the backup still completes and says what is missing");
  ASSERT_TRUE(cluster_->StopDevicePlugin("node-a").ok());
  const auto dir2 = dir_ / "backup2";
  CliResult stopped = Cli("inventory", {"--out", dir2.string(), "--nvml-timeout", "2s"});
  EXPECT_EQ(stopped.code, 0) << Where() << stopped.out << stopped.err;
  EXPECT_THAT(stopped.out, HasSubstr("NVML views unreachable on 1 node(s): node-a")) << Where();
  EXPECT_EQ(ReadJson(dir2 / "nvml" / "node-a.json")["reachable"], false) << Where();
  EXPECT_EQ(ReadJson(dir2 / "mig-pods.json")["pods"].size(), 1u) << Where();
}

// ---- preflight ------------------------------------------------------------------------------

void OpsE2eTest::PreflightLegacyPodAndRegisterFormat(const std::vector<std::string>& node_a) {
  json r;
  Step("a legacy pod (GPU-uuid[t-s]) on the node");
  const std::string gpu = GpuUuid("node-a");
  Backdoor(LegacyPod("old-train", "node-a", gpu));
  r = CliJson("preflight", node_a, 1);
  EXPECT_EQ(Failed(r), (std::set<std::string>{"legacy-pods node-a", "gpu-workloads node-a"}))
      << Where() << r.dump(2);
  EXPECT_THAT(Evidence(r, "legacy-pods", "node-a"),
              HasSubstr("default/old-train: " + gpu + "[1-2] (hami.io/vgpu-devices-allocated)"))
      << Where() << Evidence(r, "legacy-pods", "node-a");
  EXPECT_THAT(Evidence(r, "legacy-pods", "node-a"), HasSubstr("drain these pods")) << Where();
  ForceDelete("default", "old-train");

  Step("the node publishes the legacy template format (an old device plugin)");
  ASSERT_TRUE(cluster_->StopDevicePlugin("node-a").ok());
  ASSERT_TRUE(
      kube_
          ->PatchNodeAnnotations(
              "node-a", {{std::string(protocol::kNodeRegisterAnnotation),
                          R"([{"id":")" + gpu +
                              R"(","count":7,"devmem":40960,"type":"NVIDIA A100-SXM4-40GB",)"
                              R"("mode":"mig","health":true,"migtemplate":[{"name":"1g.5gb",)"
                              R"("memory":5120,"count":7}]}])"}})
          .ok());
  r = CliJson("preflight", node_a, 1);
  EXPECT_EQ(Failed(r), (std::set<std::string>{"register-format node-a"})) << Where() << r.dump(2);
  EXPECT_THAT(Evidence(r, "register-format", "node-a"), HasSubstr("legacy template format"))
      << Where();
  EXPECT_THAT(Evidence(r, "register-format", "node-a"), HasSubstr("migtemplate")) << Where();
  Step("the current device plugin publishes the current format again");
  ASSERT_TRUE(cluster_->StartDevicePlugin("node-a").ok());
  EXPECT_TRUE(WaitUntil([&] { return Cli("preflight", node_a).code == 0; }))
      << Where() << Cli("preflight", node_a).out;
}

void OpsE2eTest::PreflightMigManager(const std::vector<std::string>& node_a) {
  json r;
  Step("MIG Manager still owns the node (nvidia.com/mig.config, .state)");
  Label("node-a",
        {{"nvidia.com/mig.config", "all-1g.5gb"}, {"nvidia.com/mig.config.state", "success"}});
  r = CliJson("preflight", node_a, 1);
  EXPECT_EQ(Failed(r), (std::set<std::string>{"mig-manager node-a"})) << Where() << r.dump(2);
  EXPECT_THAT(Evidence(r, "mig-manager", "node-a"),
              HasSubstr("nvidia.com/mig.config=all-1g.5gb and MIG Manager is not disabled"))
      << Where();
  EXPECT_THAT(Evidence(r, "mig-manager", "node-a"),
              HasSubstr("label nvidia.com/mig.config.state=success"))
      << Where();
  Step("a running MIG Manager pod blocks even when disabled by label");
  Label("node-a", {{"nvidia.com/gpu.deploy.mig-manager", "false"}});
  json manager = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", "nvidia-mig-manager-x7k2p"}, {"namespace", "gpu-operator"}}},
      {"spec",
       {{"nodeName", "node-a"},
        {"containers",
         json::array({{{"name", "nvidia-mig-manager"},
                       {"image", "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.6.0"}}})}}},
      {"status", {{"phase", "Running"}}}};
  Backdoor(manager);
  r = CliJson("preflight", node_a, 1);
  EXPECT_EQ(Result(r, "mig-manager", "node-a"), "FAIL") << Where();
  EXPECT_THAT(Evidence(r, "mig-manager", "node-a"),
              HasSubstr("MIG Manager pod running here: gpu-operator/nvidia-mig-manager-x7k2p"))
      << Where() << Evidence(r, "mig-manager", "node-a");
  ForceDelete("gpu-operator", "nvidia-mig-manager-x7k2p");
  Step("disabled, with the label left behind: a warning, not a blocker");
  r = CliJson("preflight", node_a, 0);
  EXPECT_EQ(Result(r, "mig-manager", "node-a"), "WARN") << Where() << r.dump(2);
  Label("node-a",
        {{"nvidia.com/mig.config", std::nullopt}, {"nvidia.com/mig.config.state", std::nullopt}});
  r = CliJson("preflight", node_a, 0);
  EXPECT_EQ(Result(r, "mig-manager", "node-a"), "PASS") << Where();
}

void OpsE2eTest::PreflightDeviceConfigAndLegacyScheduler(const std::vector<std::string>& node_a) {
  json r;
  Step("the device config still holds knownMigGeometries");
  const std::string current = protocol::DefaultDeviceConfigYaml();
  SetDeviceConfig(kLegacyConfig);
  r = CliJson("preflight", node_a, 1);
  EXPECT_EQ(Failed(r), (std::set<std::string>{"device-config"})) << Where() << r.dump(2);
  EXPECT_THAT(Evidence(r, "device-config"),
              HasSubstr("ConfigMap dynmig-system/dynmig-device-config still holds "
                        "knownMigGeometries (1 entries)"))
      << Where() << Evidence(r, "device-config");
  EXPECT_THAT(Evidence(r, "device-config"), HasSubstr("dynmig config migrate")) << Where();
  SetDeviceConfig(current);

  Step("a legacy HAMi scheduler still serves");
  json hami = {{"apiVersion", "v1"},
               {"kind", "Pod"},
               {"metadata", {{"name", "hami-scheduler-7d9f8-abcde"}, {"namespace", "kube-system"}}},
               {"spec",
                {{"nodeName", "node-a"},
                 {"containers", json::array({{{"name", "vgpu-scheduler-extender"},
                                              {"image", "projecthami/hami:v2.4.1"}}})}}},
               {"status", {{"phase", "Running"}}}};
  Backdoor(hami);
  r = CliJson("preflight", node_a, 1);
  EXPECT_EQ(Failed(r), (std::set<std::string>{"legacy-scheduler"})) << Where() << r.dump(2);
  EXPECT_THAT(Evidence(r, "legacy-scheduler"),
              HasSubstr("kube-system/hami-scheduler-7d9f8-abcde (Running) images "
                        "projecthami/hami:v2.4.1"))
      << Where() << Evidence(r, "legacy-scheduler");
  ForceDelete("kube-system", "hami-scheduler-7d9f8-abcde");

  Step("everything cleared: the node passes again; an unknown node is bad input");
  r = CliJson("preflight", node_a, 0);
  EXPECT_TRUE(Failed(r).empty()) << Where() << r.dump(2);
  CliResult unknown = Cli("preflight", {"--node", "node-z"});
  EXPECT_EQ(unknown.code, cli::kExitBadInput) << Where() << unknown.err;
  EXPECT_THAT(unknown.err, HasSubstr("node \"node-z\" not found")) << Where();
}

TEST_F(OpsE2eTest, PreflightPassesOnlyOnADrainedCordonedNodeAndNamesEachBlocker) {
  Scenario("preflight");
  StartCluster("node-a=A100-SXM4-40GBx1");
  const std::vector<std::string> node_a = {"--node", "node-a"};

  Step("a schedulable node running a GPU workload");
  RunPod(MigPod("busy", 4000));
  json r = CliJson("preflight", node_a, 1);
  EXPECT_EQ(Failed(r), (std::set<std::string>{"cordoned node-a", "gpu-workloads node-a"}))
      << Where() << r.dump(2);
  EXPECT_THAT(Evidence(r, "cordoned", "node-a"), HasSubstr("kubectl cordon node-a")) << Where();
  EXPECT_THAT(Evidence(r, "gpu-workloads", "node-a"), HasSubstr("default/busy (Running)"))
      << Where();
  EXPECT_THAT(Evidence(r, "gpu-workloads", "node-a"), HasSubstr("kubectl drain node-a")) << Where();
  for (const char* check : {"legacy-pods", "register-format", "mig-manager"}) {
    EXPECT_EQ(Result(r, check, "node-a"), "PASS") << Where() << check;
  }
  EXPECT_EQ(Result(r, "legacy-scheduler"), "PASS") << Where();
  EXPECT_EQ(Result(r, "device-config"), "PASS") << Where();
  EXPECT_THAT(Evidence(r, "device-config"),
              HasSubstr("ConfigMap dynmig-system/dynmig-device-config has a "
                        "migProfileAllowlist"))
      << Where();

  Step("cordon and drain: the node can be handed over");
  Cordon("node-a");
  DeletePod("busy");
  CliResult ok = Cli("preflight", node_a);
  EXPECT_EQ(ok.code, 0) << Where() << ok.out << ok.err;
  EXPECT_THAT(ok.out, Not(HasSubstr("FAIL"))) << Where() << ok.out;
  EXPECT_THAT(ok.out, HasSubstr("the node is cordoned")) << Where() << ok.out;

  ASSERT_NO_FATAL_FAILURE(PreflightLegacyPodAndRegisterFormat(node_a));
  ASSERT_NO_FATAL_FAILURE(PreflightMigManager(node_a));
  ASSERT_NO_FATAL_FAILURE(PreflightDeviceConfigAndLegacyScheduler(node_a));
}

// ---- validate -------------------------------------------------------------------------------

TEST_F(OpsE2eTest, ValidatePassesOnAHealthyClusterAndTheCanaryRunsItsWholeLifecycle) {
  Scenario("validate (healthy)");
  StartCluster("node-a=A100-SXM4-40GBx1");
  Step("a running pod");
  const auto train = RunPod(MigPod("train", 19000));
  ASSERT_TRUE(train.runtime.has_value()) << Where();

  Step("validate");
  json r = CliJson("validate", {}, 0);
  for (const char* check :
       {"device-plugin", "registered-mode", "mig-profiles", "capability", "allowlist-exposure"}) {
    EXPECT_EQ(Result(r, check, "node-a"), "PASS") << Where() << check << "\n" << r.dump(2);
  }
  EXPECT_THAT(Evidence(r, "capability", "node-a"),
              HasSubstr("profile memory, slice count and placements match NVML"))
      << Where();
  EXPECT_THAT(Evidence(r, "device-plugin", "node-a"), HasSubstr("NVML view served at http://"))
      << Where();
  for (const char* check : {"pod-reservation", "pod-profile", "pod-overlap", "pod-runtime",
                            "pod-visible", "pod-nvml"}) {
    EXPECT_EQ(Result(r, check, "default/train"), "PASS") << Where() << check << "\n"
                                                         << Evidence(r, check, "default/train");
  }
  EXPECT_THAT(Evidence(r, "pod-nvml", "default/train"), HasSubstr(train.runtime->mig_uuid))
      << Where();

  Step("validate --canary");
  r = CliJson("validate",
              {"--node", "node-a", "--canary", "--timeout", "20s", "--canary-poll", "50ms"}, 0);
  for (const char* check :
       {"canary-create", "canary-running", "canary-reservation", "canary-profile", "canary-overlap",
        "canary-runtime", "canary-visible", "canary-nvml", "canary-delete", "canary-released",
        "canary-reclaimed"}) {
    EXPECT_EQ(Result(r, check, "default/mig-canary"), "PASS")
        << Where() << check << ": " << Evidence(r, check, "default/mig-canary") << "\n"
        << r.dump(2);
  }
  EXPECT_THAT(Evidence(r, "canary-running", "default/mig-canary"), HasSubstr("Running on node-a"))
      << Where();
  EXPECT_THAT(Evidence(r, "canary-reclaimed", "default/mig-canary"),
              HasSubstr("NVML no longer has MIG-"))
      << Where();
  EXPECT_EQ(Result(r, "canary-cleanup", "default/mig-canary"), "absent") << Where();
  Step("the canary is gone, its instance released, the other pod untouched");
  EXPECT_TRUE(absl::IsNotFound(kube_->GetPod("default", "mig-canary").status())) << Where();
  auto live = Live();
  ASSERT_EQ(live.size(), 1u) << Where();
  EXPECT_EQ(live[0].mig_uuid, train.runtime->mig_uuid) << Where();
  EXPECT_EQ(Phase("train"), "Running") << Where();

  Step("the text output: a table with a verdict, the canary's steps on stderr");
  CliResult text = Cli("validate", {"--canary", "--timeout", "20s", "--canary-poll", "50ms"});
  EXPECT_EQ(text.code, 0) << Where() << text.out << text.err;
  EXPECT_THAT(text.out, HasSubstr("canary-reclaimed")) << Where() << text.out;
  EXPECT_THAT(text.out, Not(HasSubstr("FAIL"))) << Where() << text.out;
  EXPECT_THAT(text.err, HasSubstr("created default/mig-canary")) << Where() << text.err;
  EXPECT_THAT(text.err, HasSubstr("running on node-a")) << Where() << text.err;
}

// Step 8 of the guide as it is done: the node stays cordoned while its canary runs (the canary
// tolerates the cordon and is pinned to the node); other pods are kept off it.
TEST_F(OpsE2eTest, TheCanaryRunsOnTheCordonedNodeUnderValidation) {
  Scenario("validate --canary on a cordoned node");
  StartCluster("node-a=A100-SXM4-40GBx1,node-b=A100-SXM4-40GBx1");
  Cordon("node-a");
  Step("an ordinary pod goes to node-b");
  RunPod(MigPod("ordinary", 4000));
  EXPECT_EQ(kube::NodeName(Get("ordinary")), "node-b") << Where();
  Step("validate --node node-a --canary");
  json r = CliJson(
      "validate", {"--node", "node-a", "--canary", "--timeout", "20s", "--canary-poll", "50ms"}, 0);
  EXPECT_EQ(Result(r, "canary-running", "default/mig-canary"), "PASS") << Where() << r.dump(2);
  EXPECT_THAT(Evidence(r, "canary-running", "default/mig-canary"), HasSubstr("Running on node-a"))
      << Where();
  EXPECT_EQ(Result(r, "canary-reclaimed", "default/mig-canary"), "PASS") << Where();
}

TEST_F(OpsE2eTest, ValidateFailsWithEvidenceWhenTheDevicePluginIsStopped) {
  Scenario("validate (device plugin stopped)");
  StartCluster("node-a=A100-SXM4-40GBx1");
  ASSERT_TRUE(cluster_->StopDevicePlugin("node-a").ok());
  Step("validate: the registration outlives the plugin, the NVML view does not");
  json r = CliJson("validate", {"--nvml-timeout", "2s"}, 1);
  EXPECT_EQ(Failed(r), (std::set<std::string>{"device-plugin node-a"})) << Where() << r.dump(2);
  const std::string ev = Evidence(r, "device-plugin", "node-a");
  EXPECT_THAT(ev, HasSubstr("the device plugin's NVML view is not served")) << Where() << ev;
  EXPECT_THAT(ev, HasSubstr(fmt::format("http://{}:{}/nvml", cluster_->node_address("node-a"),
                                        cluster_->options().nvml_port)))
      << Where() << ev;
  EXPECT_THAT(ev, HasSubstr("is the device plugin running on the node?")) << Where() << ev;
  // The capability is still compared, with the catalogue, and says why.
  EXPECT_EQ(Result(r, "capability", "node-a"), "PASS") << Where();
  EXPECT_THAT(Evidence(r, "capability", "node-a"), HasSubstr("NVML view unavailable")) << Where();

  Step("validate --canary: the pod cannot get its device");
  r = CliJson("validate",
              {"--canary", "--timeout", "5s", "--canary-poll", "50ms", "--nvml-timeout", "2s"}, 1);
  EXPECT_EQ(Result(r, "canary-create", "default/mig-canary"), "PASS") << Where();
  EXPECT_EQ(Result(r, "canary-running", "default/mig-canary"), "FAIL") << Where() << r.dump(2);
  EXPECT_THAT(Evidence(r, "canary-running", "default/mig-canary"), HasSubstr("phase ")) << Where();
  EXPECT_EQ(Result(r, "canary-cleanup", "default/mig-canary"), "PASS")
      << Where() << Evidence(r, "canary-cleanup", "default/mig-canary");
  EXPECT_TRUE(absl::IsNotFound(kube_->GetPod("default", "mig-canary").status())) << Where();

  Step("started again: validate passes");
  ASSERT_TRUE(cluster_->StartDevicePlugin("node-a").ok());
  EXPECT_TRUE(WaitUntil([&] { return Cli("validate").code == 0; }))
      << Where() << Cli("validate").out;
}

TEST_F(OpsE2eTest, ValidateFailsWhenANodePublishesNoMigProfiles) {
  Scenario("validate (no migProfiles)");
  StartCluster("node-a=A100-SXM4-40GBx1,node-b=H100 80GBx1");
  Step("node-b's registration loses its profiles (a device plugin that discovered none)");
  ASSERT_TRUE(cluster_->StopDevicePlugin("node-b").ok());
  auto node = kube_->GetNode("node-b");
  ASSERT_TRUE(node.ok());
  auto devices = protocol::DecodeNodeRegister(
      kube::Annotation(*node, protocol::kNodeRegisterAnnotation).value_or(""));
  ASSERT_TRUE(devices.ok()) << devices.status();
  for (auto& d : *devices) d.mig_profiles.clear();
  ASSERT_TRUE(kube_
                  ->PatchNodeAnnotations("node-b", {{std::string(protocol::kNodeRegisterAnnotation),
                                                     protocol::EncodeNodeRegister(*devices)}})
                  .ok());
  json r = CliJson("validate", {"--nvml-endpoint", ""}, 1);
  EXPECT_EQ(Failed(r), (std::set<std::string>{"mig-profiles node-b"})) << Where() << r.dump(2);
  EXPECT_THAT(Evidence(r, "mig-profiles", "node-b"),
              HasSubstr("GPU 0 (" + (*devices)[0].id + "): migProfiles is empty"))
      << Where() << Evidence(r, "mig-profiles", "node-b");
  EXPECT_EQ(Result(r, "mig-profiles", "node-a"), "PASS") << Where();
  Step("--node node-a validates only node-a");
  r = CliJson("validate", {"--node", "node-a"}, 0);
  EXPECT_EQ(Result(r, "mig-profiles", "node-b"), "absent") << Where();
}

// ---- explain, layout, defrag ----------------------------------------------------------------

// A100-40GB with 1g pods at slices 0, 2, 4 and 6 (1, 3 and 5 free): a 2g pod has no room.
class OpsFragmentedGpuTest : public OpsE2eTest {
 protected:
  void Fragment() {
    StartCluster("node-a=A100-SXM4-40GBx1");
    for (int i = 0; i < 7; ++i) {
      Step(fmt::format("fill with 1g pod p{}", i));
      auto a = RunPod(MigPod(fmt::format("p{}", i), 4000));
      start_of_[fmt::format("p{}", i)] = a.placement.start;
    }
    // Keep the pods on even slices.
    for (const auto& [name, start] : std::map<std::string, uint32_t>(start_of_)) {
      if (start % 2 == 1) {
        Step("delete " + name);
        DeletePod(name);
        start_of_.erase(name);
      }
    }
    ASSERT_EQ(start_of_.size(), 4u) << Where();
    ASSERT_TRUE(WaitUntil([&] { return Live().size() == 4; })) << Where();
    // The deleted pods' slices are free once the node has published that (an instance reclaimed
    // a moment ago may still be listed as held by the node until the next publication).
    ASSERT_TRUE(WaitUntil([&] { return HeldSlices("node-a") == 0; }))
        << Where() << "dynmig.io/mig-held still lists " << HeldSlices("node-a");
    Step("a 2g pod waits");
    Create(MigPod("wants-2g", 9000));
    ASSERT_TRUE(WaitUntil([&] { return !Unschedulable("wants-2g").empty(); }))
        << Where() << Get("wants-2g").dump();
  }
  std::map<std::string, uint32_t> start_of_;  // pod name -> its slice
};

TEST_F(OpsFragmentedGpuTest, OpsExplainSaysWhereARunningPodIsAndWhyAPendingPodWaits) {
  Scenario("explain");
  Fragment();
  const std::string gpu = GpuUuid("node-a");

  Step("explain a running pod");
  const std::string placed = start_of_.begin()->first;
  json r = CliJson("explain", {placed}, 0);
  EXPECT_EQ(r["status"], "placed") << Where() << r.dump(2);
  CliResult text = Cli("explain", {placed});
  EXPECT_EQ(text.code, 0) << Where() << text.err;
  EXPECT_THAT(text.out, HasSubstr("Placed on node-a (bind-phase success)")) << Where() << text.out;
  EXPECT_THAT(text.out, HasSubstr("1g.5gb")) << Where() << text.out;
  EXPECT_THAT(text.out, HasSubstr(gpu)) << Where() << text.out;
  const auto alloc = Allocations(Get(placed));
  ASSERT_EQ(alloc.size(), 1u) << Where();
  ASSERT_TRUE(alloc[0].runtime.has_value()) << Where();
  EXPECT_THAT(text.out, HasSubstr(alloc[0].runtime->mig_uuid)) << Where() << text.out;

  Step("explain the pending 2g pod");
  r = CliJson("explain", {"wants-2g"}, 0);
  EXPECT_EQ(r["status"], "pending") << Where() << r.dump(2);
  text = Cli("explain", {"wants-2g"});
  EXPECT_EQ(text.code, 0) << Where() << text.err;
  const std::string& why = text.out;
  EXPECT_THAT(why, HasSubstr("Pod default/wants-2g: phase Pending")) << Where() << why;
  // Per GPU: the reason and the free slices.
  EXPECT_THAT(why, HasSubstr("GPU 0 (" + gpu +
                             ", NVIDIA A100-SXM4-40GB): fragmented: 4 slice(s) "
                             "free (slices 1,3,5,7) but no legal non-overlapping placement for "
                             "2g.10gb"))
      << Where() << why;
  EXPECT_THAT(why, Not(HasSubstr("fragmented: fragmented"))) << Where() << why;
  // What would make it fit now: a request a free 1g slice covers.
  EXPECT_THAT(why, HasSubstr("at most 5120 MiB per instance (same counts) would fit now (1g.5gb "
                             "on node-a)"))
      << Where() << why;
  // Who holds the blocking slices: one of the pods on even slices, and where it could go.
  bool names_holder = false;
  for (const auto& [name, start] : start_of_) {
    names_holder =
        names_holder || why.find("moving default/" + name + " frees slices") != std::string::npos;
  }
  EXPECT_TRUE(names_holder) << Where() << why;
  ASSERT_TRUE(r.contains("nodes")) << Where();
  EXPECT_EQ(r["nodes"][0]["verdict"], "fragmented") << Where() << r.dump(2);

  Step("an unknown pod is bad input");
  CliResult missing = Cli("explain", {"nope"});
  EXPECT_EQ(missing.code, cli::kExitBadInput) << Where() << missing.err;
}

TEST_F(OpsFragmentedGpuTest, OpsDefragNamesTheFewestPodsToMove) {
  Scenario("defrag");
  Fragment();
  Step("defrag --for 2g.10gb");
  json r = CliJson("defrag", {"--for", "2g.10gb"}, 0);
  ASSERT_EQ(r["found"], true) << Where() << r.dump(2);
  EXPECT_EQ(r["executed"], false) << Where();
  ASSERT_FALSE(r["plans"].empty()) << Where() << r.dump(2);
  const json& best = r["plans"][0];
  EXPECT_EQ(best["profile"], "2g.10gb") << Where();
  EXPECT_EQ(best["podsToMove"], 1) << Where() << best.dump(2);  // one 1g pod is enough
  EXPECT_EQ(best["allMovedPodsFitElsewhere"], true) << Where() << best.dump(2);
  ASSERT_EQ(best["moves"].size(), 1u) << Where();
  const std::string moved = best["moves"][0]["pod"];
  ASSERT_EQ(moved.rfind("default/", 0), 0u) << Where() << moved;
  ASSERT_TRUE(start_of_.count(moved.substr(8))) << Where() << moved << " is not a running pod";
  const uint32_t held = start_of_.at(moved.substr(8));
  const uint32_t freed = best["placement"]["start"];
  EXPECT_TRUE(freed <= held && held < freed + 2)
      << Where() << "the freed 2g placement at " << freed << " does not include " << held;
  EXPECT_EQ(best["moves"][0]["canBeReplaced"], true) << Where();
  CliResult text = Cli("defrag", {"--for", "2g"});
  EXPECT_EQ(text.code, 0) << Where() << text.err;
  EXPECT_THAT(text.out, HasSubstr("for 2g.10gb by moving 1 pod (1 slice)")) << Where() << text.out;
  EXPECT_THAT(text.out, HasSubstr(moved)) << Where() << text.out;
  EXPECT_THAT(text.out, HasSubstr("every moved pod fits elsewhere right now")) << Where();
  EXPECT_THAT(text.out, HasSubstr("Nothing was moved")) << Where();
  Step("defrag --for 7g: all four pods must go, and nowhere else can take them");
  r = CliJson("defrag", {"--for", "7g"}, 0);
  ASSERT_EQ(r["found"], true) << Where() << r.dump(2);
  EXPECT_EQ(r["plans"][0]["profile"], "7g.40gb") << Where();
  EXPECT_EQ(r["plans"][0]["podsToMove"], 4) << Where();
  EXPECT_EQ(r["plans"][0]["allMovedPodsFitElsewhere"], false) << Where();
  Step("nothing was moved");
  EXPECT_EQ(Live().size(), 4u) << Where();
  for (const auto& [name, start] : start_of_) EXPECT_EQ(Phase(name), "Running") << Where() << name;
  Step("a profile no GPU has is answered; a word that is no profile is bad input");
  r = CliJson("defrag", {"--for", "5g.99gb"}, 0);
  EXPECT_EQ(r["found"], false) << Where() << r.dump(2);
  CliResult bad = Cli("defrag", {"--for", "big"});
  EXPECT_EQ(bad.code, cli::kExitBadInput) << Where() << bad.err;
  EXPECT_THAT(bad.err, HasSubstr("is neither a profile name (3g.20gb) nor a slice class (3g)"))
      << Where();
}

TEST_F(OpsE2eTest, LayoutDrawsEveryGpuAsTextJsonAndHtmlAndTheSchedulerServesTheSamePage) {
  Scenario("layout");
  StartCluster("node-a=A100-SXM4-40GBx1,node-b=H100 80GBx1");
  Step("pods on both nodes");
  const auto a = RunPod(MigPod("train-a", 19000));
  const auto b = RunPod(MigPod("infer-b", 45000));  // more than an A100-40GB has: node-b
  ASSERT_TRUE(a.runtime && b.runtime) << Where();
  const std::string gpu_a = GpuUuid("node-a"), gpu_b = GpuUuid("node-b");

  Step("layout (text)");
  CliResult text = Cli("layout");
  EXPECT_EQ(text.code, 0) << Where() << text.err;
  for (const std::string& s : {std::string("node-a"), std::string("node-b"), gpu_a, gpu_b,
                               std::string("train-a"), std::string("infer-b")}) {
    EXPECT_THAT(text.out, HasSubstr(s)) << Where() << text.out;
  }
  EXPECT_THAT(text.out, HasSubstr(a.runtime->mig_uuid)) << Where() << text.out;

  Step("layout -o json");
  json doc = CliJson("layout", {}, 0);
  std::map<std::string, json> reservations;  // pod -> reservation
  for (const auto& n : doc["nodes"]) {
    for (const auto& g : n["gpus"]) {
      for (const auto& res : g["reservations"]) reservations[res["pod"]] = res;
    }
  }
  ASSERT_EQ(reservations.size(), 2u) << Where() << doc.dump(2);
  EXPECT_EQ(reservations["default/train-a"]["migUUID"], a.runtime->mig_uuid) << Where();
  EXPECT_EQ(reservations["default/train-a"]["profile"], a.profile) << Where();
  EXPECT_EQ(reservations["default/train-a"]["placement"]["start"], a.placement.start) << Where();
  EXPECT_EQ(reservations["default/infer-b"]["migUUID"], b.runtime->mig_uuid) << Where();

  Step("layout --node node-b --html FILE");
  const auto page_path = dir_ / "layout.html";
  CliResult html = Cli("layout", {"--node", "node-b", "--html", page_path.string()});
  EXPECT_EQ(html.code, 0) << Where() << html.err;
  EXPECT_THAT(html.err, HasSubstr("wrote " + page_path.string())) << Where();
  const std::string page = ReadText(page_path);
  EXPECT_THAT(page, HasSubstr("<!DOCTYPE html>")) << Where();
  EXPECT_THAT(page, HasSubstr("data-gpu=\"" + gpu_b + "\"")) << Where();
  EXPECT_THAT(page, HasSubstr("data-pod=\"default/infer-b\"")) << Where();
  EXPECT_THAT(page, Not(HasSubstr(gpu_a))) << Where();
  EXPECT_THAT(html.out, Not(HasSubstr("train-a"))) << Where() << html.out;
  CliResult unknown = Cli("layout", {"--node", "node-z"});
  EXPECT_EQ(unknown.code, cli::kExitBadInput) << Where() << unknown.err;

  Step("GET /layout on the scheduler");
  const std::string url = cluster_->scheduler_url();
  httplib::Client http(url);
  http.set_ca_cert_path(cluster_->tls().ca_file);  // the local mode serves HTTPS
  auto served = http.Get("/layout");
  ASSERT_TRUE(served) << Where() << url;
  EXPECT_EQ(served->status, 200) << Where() << served->body;
  EXPECT_THAT(served->get_header_value("Content-Type"), HasSubstr("text/html")) << Where();
  for (const std::string& s : {"data-gpu=\"" + gpu_a + "\"", "data-gpu=\"" + gpu_b + "\"",
                               std::string("data-pod=\"default/train-a\""),
                               std::string("data-pod=\"default/infer-b\""), a.runtime->mig_uuid}) {
    EXPECT_THAT(served->body, HasSubstr(s)) << Where();
  }
  auto served_json = http.Get("/layout?format=json&node=node-a");
  ASSERT_TRUE(served_json) << Where();
  EXPECT_EQ(served_json->status, 200) << Where() << served_json->body;
  const json sj = json::parse(served_json->body, nullptr, false);
  ASSERT_EQ(sj["nodes"].size(), 1u) << Where() << served_json->body;
  const json cli_a = CliJson("layout", {"--node", "node-a"}, 0);
  // The scheduler's live view and the command's rebuilt one agree on who holds what.
  EXPECT_EQ(sj["nodes"][0]["gpus"][0]["reservations"], cli_a["nodes"][0]["gpus"][0]["reservations"])
      << Where() << served_json->body << "\n"
      << cli_a.dump(2);
  auto none = http.Get("/layout?node=node-z");
  ASSERT_TRUE(none) << Where();
  EXPECT_EQ(none->status, 404) << Where();
}

}  // namespace
}  // namespace dynmig::e2e
