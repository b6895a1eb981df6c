#include "ops/cluster.h"

#include "ops/nvml_view.h"
#include "ops/ops_test_util.h"
#include "ops/report.h"

namespace dynmig::ops::testing {
namespace {

using ClusterTest = OpsTest;

TEST_F(ClusterTest, ConfigMapsThroughTheRestClient) {
  json cm = ConfigMap("hami", "hami-scheduler-device", kDeviceConfig);
  auto created = client_->Create(kube::Resource::kConfigMaps, cm);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ((*created)["kind"], "ConfigMap");
  EXPECT_FALSE(kube::ResourceVersion(*created).empty());
  auto got = client_->Get(kube::Resource::kConfigMaps, "hami", "hami-scheduler-device");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)["data"]["device-config.yaml"], kDeviceConfig);
  ASSERT_TRUE(client_->Create(kube::Resource::kConfigMaps, ConfigMap("other", "x", "a: 1")).ok());
  auto all = client_->List(kube::Resource::kConfigMaps, {});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->items.size(), 2u);
  auto one_ns = client_->List(kube::Resource::kConfigMaps, {.ns = "hami"});
  ASSERT_TRUE(one_ns.ok());
  ASSERT_EQ(one_ns->items.size(), 1u);
  EXPECT_EQ(one_ns->items[0]["kind"], "ConfigMap");
  json changed = *got;
  changed["data"]["device-config.yaml"] = "nvidia: {}\n";
  ASSERT_TRUE(client_->Update(kube::Resource::kConfigMaps, changed, "").ok());
  EXPECT_EQ(client_->Create(kube::Resource::kConfigMaps, cm).status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(client_->Delete(kube::Resource::kNamespaces, "", "other", {}).ok());
  EXPECT_EQ(client_->Get(kube::Resource::kConfigMaps, "other", "x").status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(
      client_->Delete(kube::Resource::kConfigMaps, "hami", "hami-scheduler-device", {}).ok());
  EXPECT_EQ(
      client_->Get(kube::Resource::kConfigMaps, "hami", "hami-scheduler-device").status().code(),
      absl::StatusCode::kNotFound);
  // Discovery lists them (kubectl needs it).
  httplib::Client http(server_->url());
  auto res = http.Get("/api/v1");
  ASSERT_TRUE(res);
  EXPECT_NE(res->body.find("\"configmaps\""), std::string::npos);
}

TEST_F(ClusterTest, FindsTheDeviceConfig) {
  auto none = FindDeviceConfig(*client_, {});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->found);
  ASSERT_TRUE(none->config.ok());
  EXPECT_FALSE(none->config->allowlist.entries.empty());  // the built-in default

  Add(ConfigMap("hami", "hami-scheduler-device", kDeviceConfig));
  auto one = FindDeviceConfig(*client_, {});
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(one->found);
  EXPECT_EQ(one->origin, "ConfigMap hami/hami-scheduler-device");
  ASSERT_TRUE(one->config.ok());
  EXPECT_EQ(one->config->allowlist.entries.size(), 2u);

  // A second one not named *-scheduler-device: the conventional name wins.
  Add(ConfigMap("test", "copy", kLegacyConfig));
  auto preferred = FindDeviceConfig(*client_, {});
  ASSERT_TRUE(preferred.ok());
  EXPECT_EQ(preferred->origin, "ConfigMap hami/hami-scheduler-device");
  // Two conventional names: ambiguous.
  Add(ConfigMap("test", "other-scheduler-device", kLegacyConfig));
  auto ambiguous = FindDeviceConfig(*client_, {});
  EXPECT_EQ(ambiguous.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(ambiguous.status().message().find(
                "several ConfigMaps hold a device-config.yaml key (hami/hami-scheduler-device"),
            std::string::npos)
      << ambiguous.status();
  auto named = FindDeviceConfig(*client_, {"", "test", "copy"});
  ASSERT_TRUE(named.ok());
  ASSERT_TRUE(named->config.ok());
  EXPECT_EQ(named->config->legacy_geometries.size(), 1u);
  EXPECT_EQ(FindDeviceConfig(*client_, {"", "test", "nope"}).status().code(),
            absl::StatusCode::kNotFound);
  // A broken config is kept as the error; the effective config is the default.
  Add(ConfigMap("broken", "broken-scheduler-device", "nvidia: [1, 2"));
  auto broken = FindDeviceConfig(*client_, {"", "broken", "broken-scheduler-device"});
  ASSERT_TRUE(broken.ok());
  EXPECT_FALSE(broken->config.ok());
  EXPECT_NE(broken->config.status().message().find("ConfigMap broken/broken-scheduler-device"),
            std::string::npos);
  EXPECT_FALSE(EffectiveConfig(*broken).allowlist.entries.empty());
  // A file wins over everything.
  const std::string file = (dir_ / "c.yaml").string();
  std::ofstream(file) << kDeviceConfig;
  auto from_file = FindDeviceConfig(*client_, {file, "", ""});
  ASSERT_TRUE(from_file.ok());
  EXPECT_EQ(from_file->origin, "file " + file);
  EXPECT_EQ(FindDeviceConfig(*client_, {file + ".missing", "", ""}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ClusterHelpersTest, PodsAndNodes) {
  json pod = Pod("p", "node-a", 4000);
  Annotate(pod, protocol::kDevicesAllocatedAnnotation,
           "GPU-a[0-1],NVIDIA A100-SXM4-40GB,4864,15:GPU-b,NVIDIA A100-SXM4-40GB,4864,15:;");
  Annotate(pod, protocol::kDevicesToAllocateAnnotation,
           "GPU-a[0-1],NVIDIA A100-SXM4-40GB,4864,15:;");
  EXPECT_EQ(LegacyIdentities(pod),
            (std::vector<std::string>{"GPU-a[0-1] (hami.io/vgpu-devices-allocated)",
                                      "GPU-a[0-1] (hami.io/vgpu-devices-to-allocate)"}));
  EXPECT_EQ(PodNode(pod), "node-a");
  Annotate(pod, protocol::kVgpuNodeAnnotation, "node-b");
  EXPECT_EQ(PodNode(pod), "node-b");
  EXPECT_EQ(PodKey(pod), "default/p");

  json node = Node("n", "");
  EXPECT_EQ(NodeAddress(node), "127.0.0.1");
  node["status"]["addresses"] = json::array({{{"type", "Hostname"}, {"address", "n.local"}}});
  EXPECT_EQ(NodeAddress(node), "n.local");
  node["status"].erase("addresses");
  EXPECT_EQ(NodeAddress(node), "n");
  EXPECT_TRUE(IsGpuNode(node));  // nvidia.com/gpu capacity
  node["status"].erase("capacity");
  EXPECT_FALSE(IsGpuNode(node));
  node["metadata"]["labels"]["nvidia.com/mig.config"] = "all-disabled";
  EXPECT_TRUE(IsGpuNode(node));
  EXPECT_EQ(MigLabels(node).size(), 1u);
  EXPECT_FALSE(IsCordoned(node));
  node["spec"]["unschedulable"] = true;
  EXPECT_TRUE(IsCordoned(node));
}

TEST(NvmlViewTest, ParsesTheDevicePluginDocument) {
  const json doc = NvmlDoc("n", {{"GPU-a"}}, {{"GPU-a", "3g.20gb", 4, 4, 2, 0, "MIG-x"}});
  auto view = ParseNvmlView(doc);
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_EQ(view->gpus.size(), 1u);
  const NvmlGpuView& g = view->gpus[0];
  EXPECT_EQ(g.uuid, "GPU-a");
  EXPECT_EQ(g.mig_enabled, true);
  ASSERT_NE(g.FindProfile("1g.5gb"), nullptr);
  EXPECT_EQ(g.FindProfile("1g.5gb")->memory_mib, 4864u);
  EXPECT_EQ(g.FindProfile("1g.5gb")->placements.size(), 7u);
  const NvmlGpuView* where = nullptr;
  const NvmlInstanceView* inst = view->FindMigUuid("MIG-x", &where);
  ASSERT_NE(inst, nullptr);
  EXPECT_EQ(where, &g);
  EXPECT_EQ(inst->gpu_instance_id, 2u);
  EXPECT_EQ(inst->placement, (mig::Placement{4, 4}));
  EXPECT_EQ(view->FindMigUuid("MIG-y"), nullptr);
}

TEST(NvmlViewTest, AcceptsTheNvmlCommandShapes) {
  const json doc = json::parse(R"({"gpus":[{"index":1,"uuid":"GPU-b","migEnabled":false,
      "profiles":[{"name":"1g.5gb","memoryMB":4864,"sliceCount":1,"placements":[{"start":0,"size":1}]}],
      "gpuInstances":[{"id":7,"profile":"1g.5gb","placement":{"start":0,"size":1},
                       "computeInstances":[{"id":0,"migUUID":"MIG-z"}]}]}]})");
  auto view = ParseNvmlView(doc);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->gpus[0].mig_enabled, false);
  EXPECT_EQ(view->gpus[0].profiles[0].memory_mib, 4864u);
  EXPECT_EQ(view->gpus[0].instances[0].gpu_instance_id, 7u);
  EXPECT_EQ(view->gpus[0].instances[0].compute_instances[0].mig_uuid, "MIG-z");
}

TEST(NvmlViewTest, ErrorsNameTheField) {
  EXPECT_EQ(ParseNvmlView(json::array()).status().message(),
            "NVML view: document: must be a JSON object");
  EXPECT_EQ(ParseNvmlView(json::object()).status().message(), "NVML view: gpus: must be an array");
  EXPECT_EQ(ParseNvmlView(json::parse(R"({"gpus":[{"profiles":[{"memoryMiB":"lots"}]}]})"))
                .status()
                .message(),
            "NVML view: gpus[0].profiles[0].memoryMiB: must be a non-negative integer");
  EXPECT_EQ(
      ParseNvmlView(
          json::parse(R"({"gpus":[{"instances":[{"placement":{"start":30,"size":4}}]}]})"))
          .status()
          .message(),
      "NVML view: gpus[0].instances[0].placement: must be a placement inside the 32-unit axis");
}

TEST(NvmlViewTest, HttpSourceTemplatesAndUnreachable) {
  HttpNvmlSource source("http://{node}:1/nvml?node={name}", absl::Milliseconds(500));
  const json node = Node("node-a", "");
  EXPECT_EQ(source.Describe(node), "http://127.0.0.1:1/nvml?node=node-a");
  auto r = FetchNvmlView(source, node);
  EXPECT_EQ(r.url, "http://127.0.0.1:1/nvml?node=node-a");
  EXPECT_EQ(r.document.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.document.status().message().find("GET http://127.0.0.1:1/nvml?node=node-a"),
            std::string::npos);
  EXPECT_FALSE(r.view.ok());
}

TEST(NvmlViewTest, HttpSourceFetchesAndRejectsNonJson) {
  httplib::Server server;
  server.Get("/ok", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"gpus":[]})", "application/json");
  });
  server.Get("/bad", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("<html>", "text/html");
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  std::thread t([&] { server.listen_after_bind(); });
  while (!server.is_running()) std::this_thread::yield();
  const json node = Node("n", "");
  HttpNvmlSource ok(fmt::format("http://{{node}}:{}/ok", port));
  auto good = FetchNvmlView(ok, node);
  EXPECT_TRUE(good.view.ok()) << good.view.status();
  HttpNvmlSource bad(fmt::format("http://{{node}}:{}/bad", port));
  EXPECT_EQ(bad.Fetch(node).status().code(), absl::StatusCode::kDataLoss);
  server.stop();
  t.join();
}

TEST(ReportTest, TextJsonAndYaml) {
  CheckReport r;
  r.command = "preflight";
  r.Add("cordoned", "node-a", CheckStatus::kFail, "the node is schedulable",
        {"kubectl cordon node-a"});
  r.AddFor("pod-runtime", "node-a", "default/p", CheckStatus::kPass, "ok");
  r.Add("device-config", "", CheckStatus::kWarn, "none found");
  const std::string text = r.ToText();
  EXPECT_NE(text.find("FAIL    node-a  cordoned       the node is schedulable\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("          - kubectl cordon node-a\n"), std::string::npos) << text;
  EXPECT_NE(text.find("pod-runtime    default/p: ok"), std::string::npos) << text;
  EXPECT_NE(text.find("WARN    -       device-config"), std::string::npos) << text;
  EXPECT_NE(text.find("preflight: 1 passed, 1 failed, 1 warnings, 0 skipped: FAILED"),
            std::string::npos);
  const json j = r.ToJson();
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["items"][1]["subject"], "default/p");
  const std::string yaml = JsonToYaml(j);
  EXPECT_NE(yaml.find("ok: false"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("result: \"FAIL\""), std::string::npos) << yaml;
  EXPECT_EQ(ParseOutputFormat("yaml").value(), OutputFormat::kYaml);
  EXPECT_FALSE(ParseOutputFormat("xml").ok());
  EXPECT_EQ(RenderTable({"A", "LONGER"}, {{"xx", "y"}, {"z", ""}}), "A   LONGER\nxx  y\nz\n");
}

}  // namespace
}  // namespace dynmig::ops::testing
