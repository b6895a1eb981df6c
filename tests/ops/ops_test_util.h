// Shared fixture of the ops tests: an in-memory API server (real HTTP) with a kubeconfig file for
// the CLI, object builders producing what the device plugin and scheduler write (register
// annotations from catalogue models, MIG allocations with or without runtime identity), and a
// fake NVML view endpoint served over HTTP.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "cli/cli_test_util.h"
#include "common/mutex.h"
#include "fmt/format.h"
#include "kube/in_memory_api_server.h"
#include "kube/rest_kube_client.h"
#include "mig/catalogue.h"
#include "protocol/annotations.h"
#include "protocol/devices.h"
#include "protocol/mig_allocations.h"
#include "protocol/node_register.h"

namespace dynmig::ops::testing {

using nlohmann::json;

struct Gpu {
  std::string uuid;
  std::string model = "A100-SXM4-40GB";
  bool health = true;
};

// The register annotation a device plugin publishes for these GPUs: every base profile (no
// +me/-me/+gfx variant) of each catalogued model, or only `profiles` when given.
inline std::string Register(const std::vector<Gpu>& gpus,
                            const std::vector<std::string>& profiles = {}) {
  std::vector<protocol::DeviceInfo> infos;
  uint32_t index = 0;
  for (const auto& g : gpus) {
    auto model = mig::FindModel(g.model);
    EXPECT_TRUE(model.ok()) << model.status();
    const auto& cap = (*model)->capability;
    std::vector<const mig::ProfileSpec*> allowed;
    for (const auto& p : cap.profiles) {
      const bool base = p.name.find_first_of("+-") == std::string::npos;
      const bool listed =
          profiles.empty() || std::find(profiles.begin(), profiles.end(), p.name) != profiles.end();
      if (base && listed) allowed.push_back(&p);
    }
    infos.push_back(protocol::MigDeviceInfo({g.uuid, index++, 0, g.health}, cap, allowed));
  }
  return protocol::EncodeNodeRegister(infos);
}

inline json Node(const std::string& name, const std::string& register_value,
                 json labels = json::object(), bool cordoned = false) {
  json n = {{"apiVersion", "v1"},
            {"kind", "Node"},
            {"metadata", {{"name", name}, {"labels", labels}, {"annotations", json::object()}}},
            {"spec", json::object()},
            {"status",
             {{"addresses", json::array({{{"type", "InternalIP"}, {"address", "127.0.0.1"}},
                                         {{"type", "Hostname"}, {"address", name}}})},
              {"capacity", {{"nvidia.com/gpu", "7"}}}}}};
  if (!register_value.empty()) {
    n["metadata"]["annotations"][std::string(protocol::kNodeRegisterAnnotation)] = register_value;
  }
  if (cordoned) n["spec"]["unschedulable"] = true;
  return n;
}

struct Runtime {
  std::string mig_uuid;
  uint32_t gi = 0;
  uint32_t ci = 0;
};

struct Alloc {
  std::string gpu;
  std::string profile;
  uint32_t start = 0;
  uint32_t size = 1;
  std::optional<Runtime> runtime{};
  int container = 0;
  int device = 0;
};

inline std::string Allocations(const std::vector<Alloc>& allocs) {
  std::vector<protocol::MigAllocation> out;
  for (const auto& a : allocs) {
    protocol::MigAllocation m;
    m.container_index = a.container;
    m.device_index = a.device;
    m.gpu_uuid = a.gpu;
    m.profile = a.profile;
    m.placement = {a.start, a.size};
    if (a.runtime)
      m.runtime = protocol::RuntimeIdentity{a.runtime->mig_uuid, a.runtime->gi, a.runtime->ci};
    out.push_back(m);
  }
  return protocol::EncodeMigAllocations(out);
}

// A MIG pod (one container "workload", `count` x `gpumem` MiB) on `node` (empty: unscheduled).
inline json Pod(const std::string& name, const std::string& node, uint64_t gpumem,
                const std::string& phase = "Running", uint32_t count = 1,
                const std::string& ns = "default") {
  json p = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", name}, {"namespace", ns}, {"annotations", json::object()}}},
      {"spec",
       {{"containers", json::array({{{"name", "workload"},
                                     {"image", "ubuntu:22.04"},
                                     {"resources",
                                      {{"limits",
                                        {{"nvidia.com/gpu", std::to_string(count)},
                                         {"nvidia.com/gpumem", std::to_string(gpumem)}}}}}}})}}},
      {"status", {{"phase", phase}}}};
  if (!node.empty()) p["spec"]["nodeName"] = node;
  return p;
}

inline json& Annotate(json& obj, std::string_view key, const std::string& value) {
  obj["metadata"]["annotations"][std::string(key)] = value;
  return obj;
}

// A whole-GPU pod (nvidia.com/vgpu-mode: hami-core, one GPU) on `node` (empty: unscheduled).
inline json WholeGpuPod(const std::string& name, const std::string& node) {
  json p = Pod(name, node, 0, node.empty() ? "Pending" : "Running");
  p["spec"]["containers"][0]["resources"]["limits"].erase("nvidia.com/gpumem");
  Annotate(p, protocol::kVgpuModeAnnotation, "hami-core");
  return p;
}

// A whole-GPU pod bound to `node` and given the whole GPU of `devices` (HAMi's device list, e.g.
// "GPU-w1,NVIDIA H100 80GB HBM3,81559,100:;"), its reservation realized.
inline json PlacedWholeGpuPod(const std::string& name, const std::string& node,
                              const std::string& devices) {
  json p = WholeGpuPod(name, node);
  Annotate(p, protocol::kVgpuNodeAnnotation, node);
  Annotate(p, protocol::kBindPhaseAnnotation, "success");
  Annotate(p, protocol::kDevicesAllocatedAnnotation, devices);
  Annotate(p, protocol::kDevicesToAllocateAnnotation, ";");
  return p;
}

// A pod the scheduler placed (and the device plugin realized when the allocations carry runtime
// identities): allocations, vgpu-node, devices-allocated, bind-phase.
inline json PlacedPod(const std::string& name, const std::string& node, uint64_t gpumem,
                      const std::vector<Alloc>& allocs, const std::string& phase = "Running") {
  json p = Pod(name, node, gpumem, phase, static_cast<uint32_t>(allocs.size()));
  Annotate(p, protocol::kMigAllocationsAnnotation, Allocations(allocs));
  Annotate(p, protocol::kVgpuNodeAnnotation, node);
  Annotate(p, protocol::kBindPhaseAnnotation,
           phase == "Running" ? "success" : std::string(protocol::kBindPhaseAllocating));
  return p;
}

inline json ConfigMap(const std::string& ns, const std::string& name, const std::string& yaml) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"namespace", ns}}},
          {"data", {{"device-config.yaml", yaml}}}};
}

inline const char* kDeviceConfig = R"(nvidia:
  resourceCountName: nvidia.com/gpu
  resourceMemoryName: nvidia.com/gpumem
  migProfileAllowlist:
    - models: ["A100-SXM4-40GB"]
      profiles: ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
    - models: ["H100 80GB HBM3"]
      profiles: ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]
)";

inline const char* kLegacyConfig = R"(nvidia:
  resourceCountName: nvidia.com/gpu
  knownMigGeometries:
    - models: ["A100-SXM4-40GB"]
      allowedGeometries:
        - - name: 1g.5gb
            core: 14
            memory: 5120
            count: 7
        - - name: 2g.10gb
            core: 28
            memory: 10240
            count: 3
)";

// The NVML view document of GPUs, as the device plugin's /nvml serves it, with instances.
struct NvmlInstance {
  std::string gpu;
  std::string profile;
  uint32_t start;
  uint32_t size;
  uint32_t gi;
  uint32_t ci;
  std::string mig_uuid;
};
inline json NvmlDoc(const std::string& node, const std::vector<Gpu>& gpus,
                    const std::vector<NvmlInstance>& instances = {}) {
  json jgpus = json::array();
  uint32_t index = 0;
  for (const auto& g : gpus) {
    const auto& cap = (*mig::FindModel(g.model))->capability;
    json profiles = json::array();
    for (const auto& p : cap.profiles) {
      json pl = json::array();
      for (const auto& x : p.placements) pl.push_back({{"start", x.start}, {"size", x.size}});
      profiles.push_back({{"name", p.name},
                          {"memoryMiB", p.memory_mib},
                          {"sliceCount", p.compute_slices},
                          {"instanceCount", p.instance_count},
                          {"placements", pl}});
    }
    json insts = json::array();
    for (const auto& i : instances) {
      if (i.gpu != g.uuid) continue;
      insts.push_back(
          {{"gpuInstanceID", i.gi},
           {"profile", i.profile},
           {"placement", {{"start", i.start}, {"size", i.size}}},
           {"computeInstances", json::array({{{"id", i.ci}, {"migUUID", i.mig_uuid}}})}});
    }
    jgpus.push_back({{"index", index++},
                     {"uuid", g.uuid},
                     {"name", cap.model},
                     {"memoryMiB", cap.total_memory_mib},
                     {"migMode", {{"supported", true}, {"current", true}, {"pending", true}}},
                     {"profiles", profiles},
                     {"instances", insts}});
  }
  return {{"node", node}, {"gpus", jgpus}};
}

// Serves GET /nvml/<node name> from a map; unknown nodes get 404 (unreachable).
class FakeNvmlEndpoint {
 public:
  FakeNvmlEndpoint() {
    server_.Get(R"(/nvml/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
      dynmig::MutexLock lock(&mu_);
      auto it = docs_.find(req.matches[1]);
      if (it == docs_.end()) {
        res.status = 404;
        return;
      }
      res.set_content(it->second.dump(), "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::yield();
  }
  ~FakeNvmlEndpoint() {
    server_.stop();
    thread_.join();
  }
  void Set(const std::string& node, json doc) {
    dynmig::MutexLock lock(&mu_);
    docs_[node] = std::move(doc);
  }
  void Remove(const std::string& node) {
    dynmig::MutexLock lock(&mu_);
    docs_.erase(node);
  }
  std::string Template() const { return fmt::format("http://127.0.0.1:{}/nvml/{{name}}", port_); }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  dynmig::Mutex mu_;
  std::map<std::string, json> docs_ ABSL_GUARDED_BY(mu_);
};

class OpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kube::InMemoryApiServerOptions options;
    options.gc_interval = absl::Milliseconds(20);
    options.keep_alive_timeout = absl::Seconds(1);
    auto server = kube::InMemoryApiServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    dir_ = std::filesystem::temp_directory_path() /
           fmt::format("dynmig-ops-{}-{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    kubeconfig_ = (dir_ / "kubeconfig").string();
    std::ofstream(kubeconfig_) << fmt::format(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n"
        "contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n"
        "users:\n- name: u\n  user: {{}}\n",
        server_->url());
    kube::RestConfig config;
    config.server = server_->url();
    config.retry.max_attempts = 1;
    client_ = std::move(*kube::RestKubeClient::Create(config));
  }
  void TearDown() override {
    client_.reset();
    server_->Stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void Add(const json& obj) {
    const std::string kind = obj.value("kind", "");
    kube::Resource r = kind == "Node"        ? kube::Resource::kNodes
                       : kind == "ConfigMap" ? kube::Resource::kConfigMaps
                                             : kube::Resource::kPods;
    const std::string ns =
        r == kube::Resource::kNodes ? "" : obj["metadata"].value("namespace", "default");
    auto created = server_->store().Create(r, ns, obj);
    ASSERT_TRUE(created.ok()) << created.status();
  }
  void AddDeviceConfig(const std::string& yaml = kDeviceConfig) {
    Add(ConfigMap("kube-system", "hami-scheduler-device", yaml));
  }

  // dynmig <args> --kubeconfig <ours>.
  cli::testing::CliResult Run(std::vector<std::string> args) {
    args.push_back("--kubeconfig");
    args.push_back(kubeconfig_);
    return cli::testing::RunDynmig(args);
  }
  json RunJson(std::vector<std::string> args, int want_code) {
    args.push_back("-o");
    args.push_back("json");
    auto r = Run(args);
    EXPECT_EQ(r.code, want_code) << r.out << r.err;
    try {
      return json::parse(r.out);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not JSON: " << r.out << r.err;
      return json();
    }
  }

  std::unique_ptr<kube::InMemoryApiServer> server_;
  std::unique_ptr<kube::RestKubeClient> client_;
  std::filesystem::path dir_;
  std::string kubeconfig_;
};

// The items of a JSON check report with this check (and node/subject when given).
inline std::vector<json> Items(const json& report, const std::string& check,
                               const std::string& subject = "") {
  std::vector<json> out;
  for (const auto& i : report["items"]) {
    if (i["check"] == check && (subject.empty() || i["subject"] == subject)) out.push_back(i);
  }
  return out;
}

inline std::string Result(const json& report, const std::string& check,
                          const std::string& node_or_subject = "") {
  for (const auto& i : report["items"]) {
    if (i["check"] != check) continue;
    if (!node_or_subject.empty() && i["node"] != node_or_subject &&
        i["subject"] != node_or_subject) {
      continue;
    }
    return i["result"];
  }
  return "absent";
}

inline std::string Evidence(const json& report, const std::string& check,
                            const std::string& node_or_subject = "") {
  for (const auto& i : report["items"]) {
    if (i["check"] != check) continue;
    if (!node_or_subject.empty() && i["node"] != node_or_subject &&
        i["subject"] != node_or_subject) {
      continue;
    }
    std::string s = i["summary"].get<std::string>();
    for (const auto& e : i["evidence"]) s += "\n" + e.get<std::string>();
    return s;
  }
  return "";
}

}  // namespace dynmig::ops::testing
