// The device plugin test bench: a file-backed SimNvml (the plugin and the test each open it, like
// two processes), the in-memory API server over HTTP, the test kubelet over real gRPC, and the
// plugin started in-process. Pods are created as the scheduler leaves them after bind.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "deviceplugin/device_plugin.h"
#include "deviceplugin/test_kubelet.h"
#include "fmt/format.h"
#include "kube/in_memory_api_server.h"
#include "kube/rest_kube_client.h"
#include "mig/catalogue.h"
#include "nvml/sim_nvml.h"
#include "protocol/annotations.h"
#include "protocol/devices.h"
#include "protocol/mig_allocations.h"

// Accepts an absl::Status or an absl::StatusOr.
#define DP_ASSERT_OK(expr)                                                               \
  do {                                                                                   \
    const ::absl::Status dp_status_ = ::dynmig::deviceplugin::testing::DpStatusOf(expr); \
    ASSERT_TRUE(dp_status_.ok()) << dp_status_;                                          \
  } while (false)

namespace dynmig::deviceplugin::testing {

inline absl::Status DpStatusOf(const absl::Status& s) { return s; }
template <typename T>
absl::Status DpStatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

inline constexpr char kNode[] = "node-a";
inline constexpr char kA100[] = "NVIDIA A100-SXM4-40GB";

// A short directory under /tmp (unix socket paths hold at most 107 bytes), removed at the end.
class TempDir {
 public:
  TempDir() {
    char buf[] = "/tmp/dpt.XXXXXX";
    const char* made = ::mkdtemp(buf);
    path_ = made != nullptr ? made : "/tmp/dpt.fallback";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline mig::Allowlist TestAllowlist() {
  mig::Allowlist a;
  a.entries.push_back({{"A100-SXM4-40GB"}, {"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}});
  return a;
}

// One reservation the "scheduler" made.
struct Res {
  int container = 0;
  int device = 0;
  int gpu = 0;
  std::string profile;
  uint32_t start = 0;
};

class PluginTest : public ::testing::Test {
 protected:
  virtual std::string Spec() const { return "A100-SXM4-40GBx2"; }

  void SetUp() override {
    kube::InMemoryApiServerOptions server;
    server.bookmark_interval = absl::Milliseconds(100);
    server.watch_heartbeat = absl::Milliseconds(200);
    server.gc_interval = absl::Milliseconds(20);
    server.keep_alive_timeout = absl::Seconds(1);
    auto api = kube::InMemoryApiServer::Start(server);
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = std::move(*api);
    kube_ = Client();
    plugin_kube_ = Client();
    kube::Object node = {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", kNode}}}};
    ASSERT_TRUE(kube_->CreateNode(node).ok());
    sim_state_ = dir_.path() + "/gpu.json";
    sim_ = OpenSim(Spec());
    ASSERT_NE(sim_, nullptr);
    kubelet_dir_ = dir_.path() + "/kl";
    auto kubelet = TestKubelet::Start(kubelet_dir_);
    ASSERT_TRUE(kubelet.ok()) << kubelet.status();
    kubelet_ = std::move(*kubelet);
  }

  void TearDown() override {
    StopPlugin();
    if (kubelet_) kubelet_->Stop();
    if (api_) api_->Stop();
  }

  std::unique_ptr<kube::RestKubeClient> Client() {
    kube::RestConfig config;
    config.server = api_->url();
    config.retry.max_attempts = 2;
    config.retry.initial_backoff = absl::Milliseconds(1);
    config.retry.max_backoff = absl::Milliseconds(5);
    config.retry.jitter = 0;
    config.request_timeout = absl::Seconds(20);
    auto client = kube::RestKubeClient::Create(config);
    EXPECT_TRUE(client.ok()) << client.status();
    return std::move(*client);
  }

  std::unique_ptr<nvml::SimNvml> OpenSim(const std::string& spec, bool device_nodes = false) {
    nvml::SimNvmlOptions o;
    o.spec = spec;
    o.device_nodes = device_nodes;
    o.state_file = sim_state_;
    o.seed = kNode;
    o.fsync = false;
    auto sim = nvml::SimNvml::Create(std::move(o));
    EXPECT_TRUE(sim.ok()) << sim.status();
    return sim.ok() ? std::move(*sim) : nullptr;
  }

  DevicePluginOptions Options() {
    DevicePluginOptions o;
    o.core.node_name = kNode;
    o.core.allowlist = TestAllowlist();
    o.core.fsync = false;
    o.core.evidence_max_age = absl::ZeroDuration();  // tests change the evidence between cycles
    o.kubelet_dir = kubelet_dir_;
    o.core.state_file = dir_.path() + "/state/state.json";
    o.reconcile_interval = absl::Hours(1);  // tests drive reconciliation
    o.register_interval = absl::Hours(1);
    o.kubelet_poll_interval = absl::Milliseconds(20);
    o.metrics_listen = "127.0.0.1:0";
    return o;
  }

  // Starts a fresh plugin "process" (its own SimNvml on the shared state file, its own client).
  DevicePlugin* StartPlugin(const std::function<void(DevicePluginOptions&)>& tweak = {}) {
    StopPlugin();
    plugin_sim_ = OpenSim("", plugin_device_nodes_);
    DevicePluginOptions o = Options();
    if (tweak) tweak(o);
    auto plugin = DevicePlugin::Start(std::move(o), *plugin_sim_, *plugin_kube_, pod_resources_);
    EXPECT_TRUE(plugin.ok()) << plugin.status();
    if (!plugin.ok()) return nullptr;
    plugin_ = std::move(*plugin);
    // The background loop runs one cycle at start, then sleeps for reconcile_interval (an hour
    // here). Wait for that first cycle, so that it cannot race a test's own Reconcile() calls.
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (plugin_->cycles() < 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    EXPECT_GE(plugin_->cycles(), 1u) << "the plugin's first background cycle did not complete";
    EXPECT_TRUE(kubelet_->WaitForRegistrations(++expected_registrations_, absl::Seconds(10)));
    EXPECT_TRUE(kubelet_->WaitForDevices(
        [](const auto& devices) {
          if (devices.empty()) return false;
          for (const auto& d : devices) {
            if (d.health() != "Healthy") return false;
          }
          return true;
        },
        absl::Seconds(10)));
    return plugin_.get();
  }

  void StopPlugin() {
    if (plugin_) {
      plugin_->events().Flush(absl::Seconds(5));
      plugin_->Stop();
      plugin_.reset();
    }
    plugin_sim_.reset();
  }

  std::string GpuUuid(int index) { return nvml::SimGpuUuid(kNode, index); }

  static uint32_t SizeOf(const std::string& profile) {
    const auto* model = *mig::FindModel("A100-SXM4-40GB");
    const mig::ProfileSpec* p = model->capability.FindProfile(profile);
    return p == nullptr || p->placements.empty() ? 0 : p->placements.front().size;
  }
  static uint64_t MemoryOf(const std::string& profile) {
    const auto* model = *mig::FindModel("A100-SXM4-40GB");
    const mig::ProfileSpec* p = model->capability.FindProfile(profile);
    return p == nullptr ? 0 : p->memory_mib;
  }

  // A pod as the scheduler leaves it after bind: reservations, device lists, bind-phase
  // allocating, bound to the node, the node lock held for it (when `lock`).
  kube::Object CreatePod(const std::string& name, const std::vector<Res>& reservations,
                         int containers = 1, bool lock = true,
                         const std::function<void(kube::Object&)>& tweak = {}) {
    std::vector<protocol::MigAllocation> allocations;
    protocol::PodDevices devices(containers);
    kube::Object spec_containers = kube::Object::array();
    for (int c = 0; c < containers; ++c) {
      int count = 0;
      for (const auto& r : reservations) count += r.container == c ? 1 : 0;
      kube::Object container = {{"name", fmt::format("c{}", c)}, {"image", "cuda"}};
      if (count > 0) {
        container["resources"] = {{"limits", {{"nvidia.com/gpu", std::to_string(count)}}}};
      }
      spec_containers.push_back(container);
    }
    std::vector<Res> sorted = reservations;
    std::sort(sorted.begin(), sorted.end(), [](const Res& a, const Res& b) {
      return std::tie(a.container, a.device) < std::tie(b.container, b.device);
    });
    for (const auto& r : sorted) {
      protocol::MigAllocation a;
      a.container_index = r.container;
      a.device_index = r.device;
      a.gpu_uuid = GpuUuid(r.gpu);
      a.profile = r.profile;
      a.placement = {r.start, SizeOf(r.profile)};
      allocations.push_back(a);
      devices[r.container].push_back(
          {GpuUuid(r.gpu), kA100, static_cast<int32_t>(MemoryOf(r.profile)), 15});
    }
    const std::string encoded = *protocol::EncodePodDevices(devices);
    const int64_t now = absl::ToUnixSeconds(absl::Now()) + (++pods_created_);
    kube::Object annotations = {{std::string(protocol::kVgpuNodeAnnotation), kNode},
                                {std::string(protocol::kVgpuTimeAnnotation), std::to_string(now)},
                                {std::string(protocol::kDevicesToAllocateAnnotation), encoded},
                                {std::string(protocol::kDevicesAllocatedAnnotation), encoded},
                                {std::string(protocol::kMigAllocationsAnnotation),
                                 protocol::EncodeMigAllocations(allocations)},
                                {std::string(protocol::kBindPhaseAnnotation), "allocating"},
                                {std::string(protocol::kBindTimeAnnotation), std::to_string(now)}};
    kube::Object pod = {
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", {{"name", name}, {"namespace", "default"}, {"annotations", annotations}}},
        {"spec", {{"nodeName", kNode}, {"containers", spec_containers}}},
        {"status", {{"phase", "Pending"}}}};
    if (tweak) tweak(pod);
    auto created = kube_->CreatePod(pod);
    EXPECT_TRUE(created.ok()) << created.status();
    if (lock) LockNodeFor(name, created.ok() ? kube::Uid(*created) : "");
    return created.ok() ? *created : kube::Object{};
  }

  // The lock as the scheduler writes it (with the pod's UID), or HAMi's form without one.
  void LockNodeFor(const std::string& name, const std::string& uid = "") {
    kube::KeyPatch patch;
    patch[std::string(protocol::kNodeLockAnnotation)] =
        protocol::FormatNodeLock({absl::Now(), "default", name, uid});
    ASSERT_TRUE(kube_->PatchNodeAnnotations(kNode, patch).ok());
  }

  std::optional<std::string> NodeLock() {
    auto node = kube_->GetNode(kNode);
    EXPECT_TRUE(node.ok());
    return kube::Annotation(*node, protocol::kNodeLockAnnotation);
  }

  kube::Object GetPod(const std::string& name) {
    auto pod = kube_->GetPod("default", name);
    EXPECT_TRUE(pod.ok()) << pod.status();
    return pod.ok() ? *pod : kube::Object{};
  }
  std::string PodAnnotation(const std::string& name, std::string_view key) {
    return kube::Annotation(GetPod(name), key).value_or("");
  }
  std::vector<protocol::MigAllocation> Allocations(const std::string& name) {
    auto a =
        protocol::DecodeMigAllocations(PodAnnotation(name, protocol::kMigAllocationsAnnotation));
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? *a : std::vector<protocol::MigAllocation>{};
  }
  void SetAnnotation(const std::string& name, std::string_view key,
                     std::optional<std::string> value) {
    kube::KeyPatch patch;
    patch[std::string(key)] = std::move(value);
    ASSERT_TRUE(kube_->PatchPodAnnotations("default", name, patch).ok());
  }
  void SetPhase(const std::string& name, const std::string& phase) {
    ASSERT_TRUE(kube_->PatchPodStatus("default", name, {{"status", {{"phase", phase}}}}).ok());
  }
  void DeletePod(const std::string& name, std::optional<int64_t> grace = 0) {
    kube::DeleteOptions o;
    o.grace_period_seconds = grace;
    ASSERT_TRUE(kube_->DeletePod("default", name, o).ok());
    kubelet_->ReleasePod("default/" + name);
  }

  // The kubelet's Allocate for the pod's container (count = its devices).
  absl::StatusOr<KubeletAllocation> Allocate(const std::string& name, int container, int count) {
    return kubelet_->AllocateCount("default/" + name, fmt::format("c{}", container), count);
  }

  std::vector<nvml::GpuInstanceInfo> Gis(uint32_t gpu) {
    auto gis = sim_->ListGpuInstances(gpu);
    EXPECT_TRUE(gis.ok()) << gis.status();
    return gis.ok() ? *gis : std::vector<nvml::GpuInstanceInfo>{};
  }
  size_t TotalGis() {
    size_t n = 0;
    for (uint32_t g = 0; g < *sim_->DeviceCount(); ++g) n += Gis(g).size();
    return n;
  }
  std::optional<nvml::GpuInstanceInfo> GiAt(uint32_t gpu, uint32_t start) {
    for (const auto& gi : Gis(gpu)) {
      if (gi.placement.start == start) return gi;
    }
    return std::nullopt;
  }
  // Creates an instance behind the plugin's back (another tool, or a crashed older plugin).
  nvml::ComputeInstanceInfo CreateRaw(uint32_t gpu, const std::string& profile, uint32_t start) {
    const auto* model = *mig::FindModel("A100-SXM4-40GB");
    const mig::ProfileSpec* p = model->capability.FindProfile(profile);
    auto gi = sim_->CreateGpuInstance(gpu, p->nvml_id, {start, p->placements.front().size});
    EXPECT_TRUE(gi.ok()) << gi.status();
    auto ci = sim_->CreateComputeInstance(gpu, gi->id);
    EXPECT_TRUE(ci.ok()) << ci.status();
    return *ci;
  }

  bool HasEvent(std::string_view reason, std::string_view text = "") {
    if (plugin_ == nullptr) return false;
    return plugin_->events().Has(reason, text);
  }

  TempDir dir_;
  std::string sim_state_;
  std::string kubelet_dir_;
  std::unique_ptr<kube::InMemoryApiServer> api_;
  std::unique_ptr<kube::RestKubeClient> kube_;
  std::unique_ptr<kube::RestKubeClient> plugin_kube_;
  std::unique_ptr<nvml::SimNvml> sim_;
  std::unique_ptr<nvml::SimNvml> plugin_sim_;
  std::unique_ptr<TestKubelet> kubelet_;
  std::unique_ptr<DevicePlugin> plugin_;
  // Whether the plugin's simulator claims device nodes (as a real driver has); false: as
  // `--sim` on a node without GPUs.
  bool plugin_device_nodes_ = true;
  // The plugin's PodResources source; null: the test kubelet's over gRPC.
  PodResourcesSource* pod_resources_ = nullptr;
  int expected_registrations_ = 0;
  int pods_created_ = 0;
};

}  // namespace dynmig::deviceplugin::testing
