// The end-to-end fixture: a whole LocalCluster (API server over HTTP, scheduler extender and
// webhooks, device plugins over gRPC on simulated GPUs, kubelet and kube-scheduler stand-ins) per
// test, and helpers that act as a user would (create, delete, wait) and as an operator would look
// (annotations, NVML, the scheduler's layout). Failure messages carry the current scenario step
// (Step()).
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "deviceplugin/device_plugin.h"
#include "kube/object.h"
#include "local/local_cluster.h"
#include "local/node_agent.h"
#include "protocol/annotations.h"
#include "protocol/mig_allocations.h"
#include "scheduler/server.h"
#include "spdlog/spdlog.h"

namespace dynmig::e2e {

using nlohmann::json;

// A TCP port free on 127.0.0.1 now (the kernel's choice), for the device plugins' listeners.
inline int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

inline json MigPod(const std::string& name, int64_t gpumem_mib, const std::string& preference = "",
                   const std::string& command = "sleep 3600", int gpus = 1) {
  json annotations = {{"nvidia.com/vgpu-mode", "mig"}};
  if (!preference.empty()) annotations["nvidia.com/mig-profile-preference"] = preference;
  return {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", name}, {"namespace", "default"}, {"annotations", annotations}}},
      {"spec",
       {{"restartPolicy", "Never"},
        {"containers",
         json::array(
             {{{"name", "workload"},
               {"image", "ubuntu:22.04"},
               {"command", json::array({"bash", "-c", command})},
               {"resources",
                {{"limits", {{"nvidia.com/gpu", gpus}, {"nvidia.com/gpumem", gpumem_mib}}}}}}})}}}};
}

// Runs a shell command; its exit status and combined output.
inline std::pair<int, std::string> RunCommand(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while (p != nullptr && (n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = p != nullptr ? ::pclose(p) : -1;
  return {rc, out};
}

class E2eTest : public ::testing::Test {
 protected:
  // Starts a cluster with these nodes ("node-a=A100-SXM4-40GBx1") and device config ("" = the
  // default allowlist).
  void StartCluster(const std::string& nodes = "node-a=A100-SXM4-40GBx1",
                    const std::string& device_config = "") {
    Step("start the local cluster with " + nodes);
    spdlog::set_level(spdlog::level::warn);  // the component log below is kept for failures
    dir_ = std::filesystem::temp_directory_path() /
           ("dynmig-e2e-" + std::to_string(::getpid()) + "-" + std::to_string(++counter_));
    std::filesystem::remove_all(dir_);
    local::LocalClusterOptions o;
    o.api_port = 0;
    auto parsed = local::ParseNodes(nodes);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    o.nodes = *parsed;
    o.state_dir = dir_.string();
    o.device_config_yaml = device_config;
    // Addresses and port of this process only (tests run in parallel processes).
    o.node_address_prefix = "127.1." + std::to_string(::getpid() % 250) + ".";
    o.nvml_port = FreePort();
    o.reconcile_interval = absl::Milliseconds(300);
    o.register_interval = absl::Seconds(1);
    // kube-scheduler's retry behaviour twenty times faster (the suite waits 20 s at most; a cluster
    // requeues a pod unschedulable for 60 s, checked every 30 s, and the device plugin's
    // reclamation is announced by a Node annotation, which requeues nothing).
    o.scheduler_timing = local::SchedulingQueueTiming{}.Scaled(20);
    o.kubelet_admission_delay = kubelet_admission_delay_;
    o.users = users_;
    o.log = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(log_mu_);
      log_.push_back(line);
    };
    options_ = o;
    Launch();
  }

  // Stops the whole local cluster and starts it again on the same state directory (the API
  // objects are gone, the GPUs' state is kept), as `dynmig local` run twice.
  void RestartWholeCluster() {
    kube_.reset();
    cluster_->Stop();
    cluster_.reset();
    Launch();
  }

  void Launch() {
    auto cluster = local::LocalCluster::Start(options_);
    ASSERT_TRUE(cluster.ok()) << Where() << cluster.status();
    cluster_ = std::move(*cluster);
    auto client = cluster_->Client(local::kAdminUser);
    ASSERT_TRUE(client.ok()) << client.status();
    kube_ = std::move(*client);
  }

  void TearDown() override {
    kube_.reset();
    if (cluster_) cluster_->Stop();
    cluster_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
    if (HasFailure()) {
      std::lock_guard<std::mutex> lock(log_mu_);
      std::string tail;
      for (size_t i = log_.size() > 40 ? log_.size() - 40 : 0; i < log_.size(); ++i)
        tail += "  " + log_[i] + "\n";
      std::cerr << "last component log lines:\n" << tail;
    }
  }

  // Names the step failures are reported in.
  void Step(const std::string& step) { step_ = step; }
  std::string Where() const { return "[" + scenario_ + ", step: " + step_ + "] "; }
  void Scenario(const std::string& s) { scenario_ = s; }

  template <typename F>
  bool WaitUntil(F pred, absl::Duration timeout = absl::Seconds(20)) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    return pred();
  }
  // Whether `pred` holds at every poll for `duration`: a state that must stay as it is while the
  // other parts run (a Pending pod stays Pending).
  template <typename F>
  bool HoldsFor(F pred, absl::Duration duration) {
    const absl::Time end = absl::Now() + duration;
    while (absl::Now() < end) {
      if (!pred()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    return pred();
  }

  json Get(const std::string& name) {
    auto pod = kube_->GetPod("default", name);
    return pod.ok() ? *pod : json();
  }
  std::string Phase(const std::string& name) {
    json pod = Get(name);
    return pod.is_null() ? "" : kube::Phase(pod);
  }

  void Create(const json& pod) {
    auto created = kube_->CreatePod(pod);
    ASSERT_TRUE(created.ok()) << Where() << "creating " << kube::Name(pod) << ": "
                              << created.status();
  }

  // Creates the pod and waits for Running; returns its first allocation.
  protocol::MigAllocation RunPod(const json& pod) {
    const std::string name = kube::Name(pod);
    auto created = kube_->CreatePod(pod);
    EXPECT_TRUE(created.ok()) << Where() << "creating " << name << ": " << created.status();
    if (!created.ok()) return {};
    return WaitRunning(name);
  }

  protocol::MigAllocation WaitRunning(const std::string& name) {
    const bool running = WaitUntil([&] { return Phase(name) == "Running"; });
    json pod = Get(name);
    EXPECT_TRUE(running) << Where() << name << " is not Running: " << pod.dump();
    auto allocs = Allocations(pod);
    EXPECT_FALSE(allocs.empty()) << Where() << name << " has no reservation";
    return allocs.empty() ? protocol::MigAllocation{} : allocs.front();
  }

  std::vector<protocol::MigAllocation> Allocations(const json& pod) {
    if (pod.is_null()) return {};
    auto value = kube::Annotation(pod, protocol::kMigAllocationsAnnotation);
    if (!value) return {};
    auto decoded = protocol::DecodeMigAllocations(*value);
    EXPECT_TRUE(decoded.ok()) << Where() << decoded.status();
    return decoded.ok() ? *decoded : std::vector<protocol::MigAllocation>{};
  }

  // Deletes as a user does and waits until the kubelet confirmed it.
  void DeletePod(const std::string& name) {
    auto deleted = kube_->DeletePod("default", name);
    ASSERT_TRUE(deleted.ok() || absl::IsNotFound(deleted.status()))
        << Where() << "deleting " << name << ": " << deleted.status();
    ASSERT_TRUE(WaitUntil([&] {
      return absl::IsNotFound(kube_->GetPod("default", name).status());
    })) << Where()
        << name << " was not removed";
  }

  // The Warning events about pod `name` ("reason: message"), as `kubectl describe` lists them.
  std::vector<std::string> Warnings(const std::string& name) {
    std::vector<std::string> out;
    auto events = kube_->List(kube::Resource::kEvents, {});
    EXPECT_TRUE(events.ok()) << Where() << events.status();
    if (!events.ok()) return out;
    for (const auto& e : events->items) {
      if (kube::StringAt(e, "/involvedObject/name") == name && e.value("type", "") == "Warning") {
        out.push_back(e.value("reason", "") + ": " + e.value("message", ""));
      }
    }
    return out;
  }

  // PodScheduled=False message, "" while none.
  std::string Unschedulable(const std::string& name) {
    json pod = Get(name);
    if (pod.is_null() || !pod.contains("status") || !pod["status"].contains("conditions"))
      return "";
    for (const auto& c : pod["status"]["conditions"]) {
      if (c.value("type", "") == "PodScheduled" && c.value("status", "") == "False")
        return c.value("message", "Unschedulable");
    }
    return "";
  }

  std::vector<local::LiveInstance> Live(const std::string& node = "node-a") {
    auto live = cluster_->Instances(node);
    EXPECT_TRUE(live.ok()) << Where() << live.status();
    return live.ok() ? *live : std::vector<local::LiveInstance>{};
  }
  const local::LiveInstance* FindLive(const std::vector<local::LiveInstance>& live,
                                      const std::string& mig_uuid) {
    for (const auto& li : live) {
      if (li.mig_uuid == mig_uuid) return &li;
    }
    return nullptr;
  }

  // The allocation is realized: runtime identity present and equal to NVML's instance, and the
  // container saw that MIG UUID.
  void ExpectRealized(const std::string& name, const protocol::MigAllocation& a,
                      const std::string& node = "node-a") {
    ASSERT_TRUE(a.runtime.has_value())
        << Where() << name << ": no MIG UUID/GI/CI in the annotation";
    auto live = Live(node);
    const local::LiveInstance* li = FindLive(live, a.runtime->mig_uuid);
    ASSERT_NE(li, nullptr) << Where() << name << ": NVML has no " << a.runtime->mig_uuid;
    EXPECT_EQ(li->gpu_uuid, a.gpu_uuid) << Where() << name;
    EXPECT_EQ(li->placement, a.placement) << Where() << name;
    EXPECT_EQ(li->gi_id, a.runtime->gpu_instance_id) << Where() << name;
    EXPECT_EQ(li->ci_id, a.runtime->compute_instance_id) << Where() << name;
    EXPECT_GE(li->processes, 1u) << Where() << name << ": no workload process on its device";
    auto visible = kube::Annotation(Get(name), local::kVisibleDevicesAnnotation);
    ASSERT_TRUE(visible.has_value()) << Where() << name << ": the kubelet recorded no devices";
    EXPECT_NE(visible->find(a.runtime->mig_uuid), std::string::npos)
        << Where() << name << ": the container sees " << *visible;
  }

  deviceplugin::DevicePlugin& Plugin(const std::string& node = "node-a") {
    deviceplugin::DevicePlugin* p = cluster_->device_plugin(node);
    EXPECT_NE(p, nullptr) << Where() << "no device plugin on " << node;
    return *p;
  }

  // Set before StartCluster: the kubelet stand-ins' delay from bind to Allocate.
  absl::Duration kubelet_admission_delay_ = absl::ZeroDuration();
  // Set before StartCluster: more identities (tenants) for cluster_->Client(user).
  std::vector<std::string> users_;
  std::filesystem::path dir_;
  local::LocalClusterOptions options_;
  std::unique_ptr<local::LocalCluster> cluster_;
  std::unique_ptr<kube::KubeClient> kube_;
  std::string scenario_ = "setup";
  std::string step_ = "start";
  std::mutex log_mu_;
  std::vector<std::string> log_;
  static inline int counter_ = 0;
};

}  // namespace dynmig::e2e
