// Device plugin figures: Allocate latency without NVML time (in-memory SimNvml behind a timing
// decorator, in-memory API server over HTTP in a forked child process, as the API server of a
// cluster is another process), through the core and through gRPC from the test kubelet, and a
// reconcile cycle for 8 GPUs x 7 instances. Prints figures; asserts nothing.
//
//   build/bin/bench_deviceplugin [--iterations N]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

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
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {
namespace {

using Clock = std::chrono::steady_clock;

// Forwards every call and adds up the time spent in NVML.
class TimingNvml final : public nvml::Nvml {
 public:
  explicit TimingNvml(nvml::Nvml& inner) : inner_(inner) {}
  template <typename F>
  auto Time(F&& f) {
    const auto start = Clock::now();
    auto result = f();
    ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
    return result;
  }

  double seconds() const { return static_cast<double>(ns_.load()) / 1e9; }
  void Reset() { ns_ = 0; }

  std::string Description() const override { return inner_.Description(); }
  bool HasDeviceNodes() const override { return inner_.HasDeviceNodes(); }
  absl::StatusOr<uint32_t> DeviceCount() override {
    return Time([&] { return inner_.DeviceCount(); });
  }
  absl::StatusOr<nvml::GpuInfo> GetGpu(uint32_t gpu) override {
    return Time([&] { return inner_.GetGpu(gpu); });
  }
  absl::StatusOr<nvml::MigModeState> GetMigMode(uint32_t gpu) override {
    return Time([&] { return inner_.GetMigMode(gpu); });
  }
  absl::StatusOr<nvml::MigModeChange> SetMigMode(uint32_t gpu, bool enabled) override {
    return Time([&] { return inner_.SetMigMode(gpu, enabled); });
  }
  absl::Status ResetGpu(uint32_t gpu) override {
    return Time([&] { return inner_.ResetGpu(gpu); });
  }
  absl::StatusOr<nvml::GpuInstanceProfileInfo> GetGpuInstanceProfileInfo(uint32_t gpu,
                                                                         uint32_t index) override {
    return Time([&] { return inner_.GetGpuInstanceProfileInfo(gpu, index); });
  }
  absl::StatusOr<std::vector<mig::Placement>> GetGpuInstancePossiblePlacements(
      uint32_t gpu, uint32_t id) override {
    return Time([&] { return inner_.GetGpuInstancePossiblePlacements(gpu, id); });
  }
  absl::StatusOr<nvml::GpuInstanceInfo> CreateGpuInstance(uint32_t gpu, uint32_t id,
                                                          const mig::Placement& p) override {
    return Time([&] { return inner_.CreateGpuInstance(gpu, id, p); });
  }
  absl::StatusOr<std::vector<nvml::GpuInstanceInfo>> ListGpuInstances(uint32_t gpu) override {
    return Time([&] { return inner_.ListGpuInstances(gpu); });
  }
  absl::Status DestroyGpuInstance(uint32_t gpu, uint32_t gi) override {
    return Time([&] { return inner_.DestroyGpuInstance(gpu, gi); });
  }
  absl::StatusOr<nvml::ComputeInstanceInfo> CreateComputeInstance(uint32_t gpu,
                                                                  uint32_t gi) override {
    return Time([&] { return inner_.CreateComputeInstance(gpu, gi); });
  }
  absl::StatusOr<std::vector<nvml::ComputeInstanceInfo>> ListComputeInstances(
      uint32_t gpu, uint32_t gi) override {
    return Time([&] { return inner_.ListComputeInstances(gpu, gi); });
  }
  absl::StatusOr<std::string> GetMigDeviceUuid(uint32_t gpu, uint32_t gi, uint32_t ci) override {
    return Time([&] { return inner_.GetMigDeviceUuid(gpu, gi, ci); });
  }
  absl::Status DestroyComputeInstance(uint32_t gpu, uint32_t gi, uint32_t ci) override {
    return Time([&] { return inner_.DestroyComputeInstance(gpu, gi, ci); });
  }
  absl::StatusOr<std::vector<nvml::ProcessInfo>> GetComputeProcesses(uint32_t gpu) override {
    return Time([&] { return inner_.GetComputeProcesses(gpu); });
  }
  absl::StatusOr<std::vector<nvml::ProcessInfo>> GetMigDeviceProcesses(uint32_t gpu, uint32_t gi,
                                                                       uint32_t ci) override {
    return Time([&] { return inner_.GetMigDeviceProcesses(gpu, gi, ci); });
  }
  absl::StatusOr<nvml::MigMinors> GetMigMinors() override {
    return Time([&] { return inner_.GetMigMinors(); });
  }

 private:
  nvml::Nvml& inner_;
  std::atomic<int64_t> ns_{0};
};

constexpr char kNode[] = "bench-node";
constexpr int kGpus = 8;
constexpr int kSlots = 7;

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

std::string Summary(const std::vector<double>& ms) {
  return fmt::format("n={} p50={:.3f} ms p90={:.3f} ms p99={:.3f} ms max={:.3f} ms", ms.size(),
                     Percentile(ms, 0.5), Percentile(ms, 0.9), Percentile(ms, 0.99),
                     Percentile(ms, 1.0));
}

class Bench {
 public:
  Bench() {
    // The API server in a child process: its JSON work is not the plugin's latency.
    int port_pipe[2];
    if (::pipe(port_pipe) != 0 || ::pipe(control_) != 0) std::abort();
    child_ = ::fork();
    if (child_ == 0) {
      ::close(port_pipe[0]);
      ::close(control_[1]);
      kube::InMemoryApiServerOptions server;
      server.gc_interval = absl::Milliseconds(50);
      auto api = kube::InMemoryApiServer::Start(server);
      int port = api.ok() ? (*api)->port() : -1;
      if (::write(port_pipe[1], &port, sizeof(port)) != sizeof(port)) ::_exit(1);
      char c;
      while (::read(control_[0], &c, 1) > 0) {
      }  // until the parent closes its end
      ::_exit(0);
    }
    ::close(port_pipe[1]);
    ::close(control_[0]);
    int port = -1;
    if (::read(port_pipe[0], &port, sizeof(port)) != sizeof(port) || port <= 0) std::abort();
    ::close(port_pipe[0]);
    kube::RestConfig config;
    config.server = fmt::format("http://127.0.0.1:{}", port);
    client_ = std::move(*kube::RestKubeClient::Create(config));
    (void)client_->CreateNode({{"metadata", {{"name", kNode}}}});
    nvml::SimNvmlOptions o;
    o.device_nodes = true;  // answer device nodes as on a real node
    o.spec = fmt::format("A100-SXM4-40GBx{}", kGpus);
    o.seed = kNode;
    sim_ = std::move(*nvml::SimNvml::Create(o));
    timed_ = std::make_unique<TimingNvml>(*sim_);
    const char* shm = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
    dir_ = fmt::format("{}/dpb.{}", shm, ::getpid());
    std::filesystem::create_directories(dir_);
  }
  ~Bench() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    ::close(control_[1]);
    ::waitpid(child_, nullptr, 0);
  }

  std::string Gpu(int i) const { return nvml::SimGpuUuid(kNode, i); }

  // A pod as the scheduler leaves it: one 1g.5gb at (gpu, slot), node lock held for it.
  void CreatePod(const std::string& name, int gpu, int slot) {
    protocol::MigAllocation a;
    a.gpu_uuid = Gpu(gpu);
    a.profile = "1g.5gb";
    a.placement = {static_cast<uint32_t>(slot), 1};
    protocol::PodDevices devices = {{{Gpu(gpu), "NVIDIA A100-SXM4-40GB", 4864, 15}}};
    const std::string encoded = *protocol::EncodePodDevices(devices);
    kube::Object pod = {
        {"metadata",
         {{"name", name},
          {"namespace", "default"},
          {"annotations",
           {{std::string(protocol::kVgpuNodeAnnotation), kNode},
            {std::string(protocol::kDevicesToAllocateAnnotation), encoded},
            {std::string(protocol::kDevicesAllocatedAnnotation), encoded},
            {std::string(protocol::kMigAllocationsAnnotation), protocol::EncodeMigAllocations({a})},
            {std::string(protocol::kBindPhaseAnnotation), "allocating"},
            {std::string(protocol::kBindTimeAnnotation), "1"}}}}},
        {"spec",
         {{"nodeName", kNode},
          {"containers",
           {{{"name", "c0"},
             {"image", "cuda"},
             {"resources", {{"limits", {{std::string(protocol::kResourceCount), "1"}}}}}}}}}},
        {"status", {{"phase", "Pending"}}}};
    (void)client_->CreatePod(pod);
    kube::Object lock = {{"metadata",
                          {{"annotations",
                            {{std::string(protocol::kNodeLockAnnotation),
                              fmt::format("2026-01-01T00:00:00Z,default,{}", name)}}}}}};
    (void)client_->Patch(kube::Resource::kNodes, "", kNode, lock, kube::PatchType::kMerge, "");
  }
  void SetRunning(const std::string& name) {
    (void)client_->PatchPodStatus("default", name, {{"status", {{"phase", "Running"}}}});
  }
  void Delete(const std::string& name) {
    kube::DeleteOptions o;
    o.grace_period_seconds = 0;
    (void)client_->DeletePod("default", name, o);
  }

  PluginCoreOptions CoreOptions(const std::string& state) const {
    PluginCoreOptions o;
    o.node_name = kNode;
    mig::Allowlist allowlist;
    allowlist.entries.push_back({{"A100-SXM4-40GB"}, {"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"}});
    o.allowlist = allowlist;
    o.state_file = dir_ + "/" + state;
    o.fsync = false;
    return o;
  }

  void RunCore(int iterations) {
    Metrics metrics;
    EventRecorder events(*client_, "bench", RealClock());
    auto core = std::move(
        *PluginCore::Create(CoreOptions("core.json"), *timed_, *client_, metrics, events));
    if (auto st = core->Start(); !st.ok()) {
      fmt::print("start failed: {}\n", std::string(st.message()));
      return;
    }
    std::vector<double> total_ms;
    std::vector<double> no_nvml_ms;
    std::vector<double> nvml_ms;
    std::vector<std::string> holder(kGpus * kSlots);
    for (int i = 0; i < iterations + kGpus * kSlots; ++i) {
      const int cell = i % (kGpus * kSlots);
      const int gpu = cell % kGpus;
      const int slot = cell / kGpus;
      // The slot's previous pod finished: Allocate's reconcile reclaims its instance first.
      if (!holder[cell].empty()) Delete(holder[cell]);
      const std::string name = fmt::format("p{}", i);
      CreatePod(name, gpu, slot);
      holder[cell] = name;
      timed_->Reset();
      const auto start = Clock::now();
      auto r = core->Allocate({ReplicaId(Gpu(gpu), 0)});
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      if (!r.ok()) {
        fmt::print("allocate {} failed: {}\n", name, std::string(r.status().message()));
        return;
      }
      SetRunning(name);
      if (i < kGpus * kSlots) continue;  // warm-up: fill the node first
      total_ms.push_back(ms);
      nvml_ms.push_back(timed_->seconds() * 1000);
      no_nvml_ms.push_back(ms - timed_->seconds() * 1000);
    }
    // The API round trips an Allocate makes, alone, for context.
    std::vector<double> list_ms;
    std::vector<double> get_ms;
    std::vector<double> patch_ms;
    kube::ListOptions on_node;
    on_node.field_selector = std::string("spec.nodeName=") + kNode;
    for (int i = 0; i < 200; ++i) {
      const auto t0 = Clock::now();
      (void)client_->ListPods(on_node);
      const auto t1 = Clock::now();
      (void)client_->GetNode(kNode);
      const auto t2 = Clock::now();
      (void)client_->PatchPodAnnotations("default", holder[0], {{"bench", std::to_string(i)}});
      const auto t3 = Clock::now();
      list_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      get_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
      patch_ms.push_back(std::chrono::duration<double, std::milli>(t3 - t2).count());
    }
    fmt::print("API round trips alone (in-memory API server over HTTP, {} pods on the node):\n",
               kGpus * kSlots);
    fmt::print("  list pods      {}\n", Summary(list_ms));
    fmt::print("  get node       {}\n", Summary(get_ms));
    fmt::print("  patch pod      {}\n", Summary(patch_ms));
    fmt::print(
        "Allocate via PluginCore (node with {} running 1g pods on {} GPUs, each Allocate\n"
        "  also reclaims the finished pod that held the slot):\n",
        kGpus * kSlots, kGpus);
    fmt::print("  total          {}\n", Summary(total_ms));
    fmt::print("  NVML (sim)     {}\n", Summary(nvml_ms));
    fmt::print("  without NVML   {}\n", Summary(no_nvml_ms));

    // Reconcile: 8 GPUs x 7 managed instances, all owned by running pods.
    std::vector<double> cycle_ms;
    std::vector<double> cycle_no_nvml_ms;
    for (int i = 0; i < 200; ++i) {
      timed_->Reset();
      const auto start = Clock::now();
      auto report = core->Reconcile();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      if (!report.skipped.empty() || report.destroyed != 0) {
        fmt::print("unexpected reconcile: {} destroyed, {}\n", report.destroyed, report.skipped);
      }
      cycle_ms.push_back(ms);
      cycle_no_nvml_ms.push_back(ms - timed_->seconds() * 1000);
    }
    fmt::print("Reconcile cycle, {} GPUs x {} instances ({} managed), nothing to reclaim:\n", kGpus,
               kSlots, core->Managed().size());
    fmt::print("  total          {}\n", Summary(cycle_ms));
    fmt::print("  without NVML   {}\n", Summary(cycle_no_nvml_ms));

    // Everything finished: one cycle reclaims all 56.
    for (const auto& name : holder) Delete(name);
    timed_->Reset();
    const auto start = Clock::now();
    auto report = core->Reconcile();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    fmt::print("Reconcile cycle reclaiming {} instances: {:.2f} ms ({:.2f} ms in NVML sim)\n",
               report.destroyed, ms, timed_->seconds() * 1000);
  }

  void RunGrpc(int iterations) {
    auto kubelet = std::move(*TestKubelet::Start(dir_ + "/kl"));
    DevicePluginOptions o;
    o.core = CoreOptions("grpc.json");
    o.kubelet_dir = dir_ + "/kl";
    o.reconcile_interval = absl::Hours(1);
    o.register_interval = absl::Hours(1);
    o.kubelet_poll_interval = absl::Milliseconds(50);
    auto plugin = DevicePlugin::Start(std::move(o), *timed_, *client_);
    if (!plugin.ok()) {
      fmt::print("plugin start failed: {}\n", std::string(plugin.status().message()));
      return;
    }
    kubelet->WaitForRegistrations(1, absl::Seconds(10));
    kubelet->WaitForDevices([](const auto& d) { return !d.empty(); }, absl::Seconds(10));
    std::vector<double> total_ms;
    std::vector<double> no_nvml_ms;
    std::vector<std::string> holder(kGpus * kSlots);
    for (int i = 0; i < iterations + kGpus * kSlots; ++i) {
      const int cell = i % (kGpus * kSlots);
      const int gpu = cell % kGpus;
      const int slot = cell / kGpus;
      if (!holder[cell].empty()) Delete(holder[cell]);
      const std::string name = fmt::format("g{}", i);
      CreatePod(name, gpu, slot);
      holder[cell] = name;
      timed_->Reset();
      const auto start = Clock::now();
      auto r = kubelet->Allocate("default/" + name, "c0", {ReplicaId(Gpu(gpu), 0)});
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      if (!r.ok()) {
        fmt::print("grpc allocate {} failed: {}\n", name, std::string(r.status().message()));
        return;
      }
      kubelet->ReleasePod("default/" + name);
      SetRunning(name);
      if (i < kGpus * kSlots) continue;
      total_ms.push_back(ms);
      no_nvml_ms.push_back(ms - timed_->seconds() * 1000);
    }
    fmt::print("Allocate via gRPC from the test kubelet (same node):\n");
    fmt::print("  total          {}\n", Summary(total_ms));
    fmt::print("  without NVML   {}\n", Summary(no_nvml_ms));
    (*plugin)->Stop();
  }

 private:
  pid_t child_ = -1;
  int control_[2] = {-1, -1};
  std::unique_ptr<kube::RestKubeClient> client_;
  std::unique_ptr<nvml::SimNvml> sim_;
  std::unique_ptr<TimingNvml> timed_;
  std::string dir_;
};

}  // namespace
}  // namespace dynmig::deviceplugin

int main(int argc, char** argv) {
  int iterations = 500;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--iterations") iterations = std::atoi(argv[i + 1]);
  }
  spdlog::set_level(spdlog::level::err);
  bool grpc_first = false;
  for (int i = 1; i < argc; ++i) grpc_first = grpc_first || std::string(argv[i]) == "--grpc-first";
  auto core = [&] {
    dynmig::deviceplugin::Bench bench;
    bench.RunCore(iterations);
  };
  auto grpc = [&] {
    dynmig::deviceplugin::Bench bench;
    bench.RunGrpc(iterations / 2);
  };
  if (grpc_first) {
    grpc();
    core();
  } else {
    core();
    grpc();
  }
  return 0;
}
