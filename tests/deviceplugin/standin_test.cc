// The doubles of the legacy world: NVIDIA's device plugin in the mixed strategy (NvidiaStandin)
// and the container runtime's CRI (TestRuntime), both over real gRPC, with the test kubelet.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <set>

#include "common/clock.h"
#include "cri/v1/api.grpc.pb.h"
#include "cri/v1alpha2/api.grpc.pb.h"
#include "deviceplugin/dp_test_util.h"
#include "deviceplugin/nvidia_standin.h"
#include "deviceplugin/test_kubelet.h"
#include "deviceplugin/test_runtime.h"
#include "nlohmann/json.hpp"
#include "nvml/geometry.h"
#include "nvml/sim_nvml.h"

namespace dynmig::deviceplugin {
namespace {

using testing::TempDir;

constexpr char kMig1g[] = "nvidia.com/mig-1g.18gb";
constexpr char kMig2g[] = "nvidia.com/mig-2g.35gb";

std::unique_ptr<nvml::SimNvml> H200(const std::string& state) {
  nvml::SimNvmlOptions o;
  o.spec = "H200x2";
  o.state_file = state;
  o.fsync = false;
  auto sim = nvml::SimNvml::Create(std::move(o));
  EXPECT_TRUE(sim.ok()) << sim.status();
  return sim.ok() ? std::move(*sim) : nullptr;
}

class StandinTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sim_ = H200(dir_.path() + "/gpus.json");
    ASSERT_NE(sim_, nullptr);
    auto g = nvml::ApplyGeometry(*sim_, 0, *mig::ParseGeometry("1g.18gb=1,2g.35gb=3"));
    ASSERT_TRUE(g.ok()) << g.status();
    geometry_ = *g;
    auto kubelet = TestKubelet::Start(dir_.path() + "/dp");
    ASSERT_TRUE(kubelet.ok()) << kubelet.status();
    kubelet_ = std::move(*kubelet);
  }

  std::unique_ptr<NvidiaStandin> StartStandin() {
    NvidiaStandinOptions o;
    o.kubelet_dir = kubelet_->dir();
    o.refresh_interval = absl::Milliseconds(50);
    o.kubelet_poll_interval = absl::Milliseconds(50);
    auto s = NvidiaStandin::Start(o, *sim_, RealClock());
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  std::string Uuid(const std::string& profile, size_t n = 0) const {
    size_t seen = 0;
    for (const auto& i : geometry_.instances) {
      if (i.profile == profile && seen++ == n) return i.mig_uuid;
    }
    return "";
  }

  TempDir dir_;
  std::unique_ptr<nvml::SimNvml> sim_;
  nvml::GeometryResult geometry_;
  std::unique_ptr<TestKubelet> kubelet_;
};

TEST_F(StandinTest, OneResourcePerProfileWithMigUuids) {
  auto standin = StartStandin();
  ASSERT_NE(standin, nullptr);
  EXPECT_EQ(standin->profiles(), (std::vector<std::string>{"1g.18gb", "2g.35gb"}));
  ASSERT_TRUE(standin->WaitForRegistrations(1, absl::Seconds(10)));
  ASSERT_TRUE(kubelet_->WaitForDevices([](const auto& d) { return d.size() == 3; },
                                       absl::Seconds(10), kMig2g));
  auto info = kubelet_->plugin(kMig1g);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->endpoint, "nvidia-mig-1g.18gb.sock");
  EXPECT_FALSE(info->options.pre_start_required());
  EXPECT_FALSE(info->options.get_preferred_allocation_available());
  std::set<std::string> ids2;
  for (const auto& d : kubelet_->devices(kMig2g)) {
    EXPECT_EQ(d.health(), "Healthy");
    ids2.insert(d.id());
  }
  EXPECT_EQ(ids2,
            (std::set<std::string>{Uuid("2g.35gb", 0), Uuid("2g.35gb", 1), Uuid("2g.35gb", 2)}));
  // GPU 1 has no instance: its profiles are not advertised.
  EXPECT_FALSE(kubelet_->plugin("nvidia.com/mig-7g.141gb").has_value());
}

TEST_F(StandinTest, AllocateAnswersNvidiaVisibleDevicesOnly) {
  auto standin = StartStandin();
  ASSERT_NE(standin, nullptr);
  ASSERT_TRUE(standin->WaitForRegistrations(1, absl::Seconds(10)));
  ASSERT_TRUE(kubelet_->WaitForDevices([](const auto& d) { return d.size() == 3; },
                                       absl::Seconds(10), kMig2g));
  auto a = kubelet_->Allocate("default/legacy", "main", {Uuid("2g.35gb", 2), Uuid("2g.35gb", 0)},
                              kMig2g);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->envs().at("NVIDIA_VISIBLE_DEVICES"), Uuid("2g.35gb", 2) + "," + Uuid("2g.35gb", 0));
  EXPECT_EQ(a->envs_size(), 1);
  EXPECT_EQ(a->devices_size(), 0);
  EXPECT_EQ(a->mounts_size(), 0);
  EXPECT_EQ(a->cdi_devices_size(), 0);
  // PodResources proves the holder by MIG UUID.
  bool found = false;
  for (const auto& pod : kubelet_->PodResources()) {
    if (pod.name != "legacy") continue;
    found = true;
    EXPECT_EQ(pod.containers.at(0).devices.at(kMig2g).size(), 2u);
  }
  EXPECT_TRUE(found);
}

TEST_F(StandinTest, UnknownOrHostileDeviceIdsAreInvalidArgument) {
  auto standin = StartStandin();
  ASSERT_NE(standin, nullptr);
  ASSERT_TRUE(standin->WaitForRegistrations(1, absl::Seconds(10)));
  ASSERT_TRUE(kubelet_->WaitForDevices([](const auto& d) { return d.size() == 1; },
                                       absl::Seconds(10), kMig1g));
  // Another profile's device, a made-up id, and a huge id: refused, each named.
  auto wrong = kubelet_->Allocate("default/x", "c", {Uuid("2g.35gb"), "MIG-bogus"}, kMig1g);
  ASSERT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("invalid allocation request for "
                                          "'nvidia.com/mig-1g.18gb': unknown device: " +
                                          Uuid("2g.35gb") + ", MIG-bogus"),
            std::string_view::npos)
      << wrong.status();
  auto huge = kubelet_->Allocate("default/x", "c", {std::string(100000, 'A')}, kMig1g);
  ASSERT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("(100000 bytes)"), std::string_view::npos);
  EXPECT_LT(huge.status().message().size(), 400u) << "the answer does not echo the whole id";
  std::vector<std::string> many(65, Uuid("1g.18gb"));
  auto flood = kubelet_->Allocate("default/x", "c", many, kMig1g);
  EXPECT_NE(flood.status().message().find("65 devices; at most 64"), std::string_view::npos);
}

TEST_F(StandinTest, ListAndWatchFollowsNvml) {
  auto standin = StartStandin();
  ASSERT_NE(standin, nullptr);
  ASSERT_TRUE(kubelet_->WaitForDevices([](const auto& d) { return d.size() == 3; },
                                       absl::Seconds(10), kMig2g));
  // Another process destroys one 2g instance: the list shrinks.
  const auto& victim = geometry_.instances.front();
  ASSERT_EQ(victim.profile, "2g.35gb");
  auto other = H200(dir_.path() + "/gpus.json");
  ASSERT_TRUE(other->DestroyComputeInstance(0, victim.gi_id, victim.ci_id).ok());
  ASSERT_TRUE(other->DestroyGpuInstance(0, victim.gi_id).ok());
  ASSERT_TRUE(kubelet_->WaitForDevices([](const auto& d) { return d.size() == 2; },
                                       absl::Seconds(10), kMig2g));
  auto gone = kubelet_->Allocate("default/x", "c", {victim.mig_uuid}, kMig2g);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(StandinTest, StopMakesThePluginGoAwayAndKubeletRestartReregisters) {
  auto standin = StartStandin();
  ASSERT_NE(standin, nullptr);
  ASSERT_TRUE(standin->WaitForRegistrations(1, absl::Seconds(10)));
  ASSERT_TRUE(kubelet_->Restart().ok());
  ASSERT_TRUE(standin->WaitForRegistrations(2, absl::Seconds(10)));
  EXPECT_TRUE(std::filesystem::exists(standin->socket_path("1g.18gb")));
  ASSERT_TRUE(kubelet_->WaitForDevices([](const auto& d) { return d.size() == 1; },
                                       absl::Seconds(10), kMig1g));
  standin->Stop();
  EXPECT_FALSE(std::filesystem::exists(standin->socket_path("1g.18gb")));
  EXPECT_FALSE(std::filesystem::exists(standin->socket_path("2g.35gb")));
  // The kubelet sees the stream end: the devices turn Unhealthy.
  EXPECT_TRUE(kubelet_->WaitForDevices(
      [](const auto& d) { return !d.empty() && d[0].health() == "Unhealthy"; }, absl::Seconds(10),
      kMig1g));
}

TEST_F(StandinTest, NoMigDeviceIsRefused) {
  auto empty = H200("");
  NvidiaStandinOptions o;
  o.kubelet_dir = kubelet_->dir();
  auto s = NvidiaStandin::Start(o, *empty, RealClock());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
}

// --- TestRuntime ----------------------------------------------------------------------------

template <typename Stub>
std::unique_ptr<Stub> Dial(const std::string& socket) {
  return std::make_unique<Stub>(
      grpc::CreateChannel("unix://" + socket, grpc::InsecureChannelCredentials()));
}

TEST(TestRuntime, ServesBothVersionsWithContainerdShapedVerboseInfo) {
  TempDir dir;
  auto runtime = TestRuntime::Start(dir.path() + "/containerd/containerd.sock");
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  TestRuntimeContainer c;
  c.pod_uid = "uid-1";
  c.pod_name = "legacy";
  c.pod_namespace = "ml";
  c.name = "main";
  c.env = {"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=MIG-a,MIG-b"};
  const std::string id = (*runtime)->AddContainer(c);
  EXPECT_EQ(id.size(), 64u);

  auto v1 = Dial<runtime::v1::RuntimeService::Stub>((*runtime)->socket_path());
  grpc::ClientContext ctx;
  runtime::v1::ListContainersRequest list;
  runtime::v1::ListContainersResponse listed;
  ASSERT_TRUE(v1->ListContainers(&ctx, list, &listed).ok());
  ASSERT_EQ(listed.containers_size(), 1);
  EXPECT_EQ(listed.containers(0).labels().at("io.kubernetes.pod.uid"), "uid-1");
  EXPECT_EQ(listed.containers(0).labels().at("io.kubernetes.container.name"), "main");
  EXPECT_EQ(listed.containers(0).state(), runtime::v1::CONTAINER_RUNNING);

  grpc::ClientContext ctx2;
  runtime::v1::ContainerStatusRequest sreq;
  sreq.set_container_id(id);
  sreq.set_verbose(true);
  runtime::v1::ContainerStatusResponse status;
  ASSERT_TRUE(v1->ContainerStatus(&ctx2, sreq, &status).ok());
  auto info = nlohmann::json::parse(status.info().at("info"));
  EXPECT_EQ(info["runtimeSpec"]["process"]["env"][1], "NVIDIA_VISIBLE_DEVICES=MIG-a,MIG-b");
  EXPECT_EQ(info["sandboxID"].get<std::string>().size(), 64u);
  EXPECT_EQ(info["runtimeType"], "io.containerd.runc.v2");

  // runtime.v1alpha2 answers the same table; an unknown id is NotFound.
  auto v1a2 = Dial<runtime::v1alpha2::RuntimeService::Stub>((*runtime)->socket_path());
  grpc::ClientContext ctx3;
  runtime::v1alpha2::ContainerStatusRequest sreq2;
  sreq2.set_container_id("nope");
  runtime::v1alpha2::ContainerStatusResponse status2;
  EXPECT_EQ(v1a2->ContainerStatus(&ctx3, sreq2, &status2).error_code(), grpc::NOT_FOUND);
  grpc::ClientContext ctx4;
  runtime::v1alpha2::ListContainersRequest list2;
  list2.mutable_filter()->mutable_state()->set_state(runtime::v1alpha2::CONTAINER_EXITED);
  runtime::v1alpha2::ListContainersResponse listed2;
  ASSERT_TRUE(v1a2->ListContainers(&ctx4, list2, &listed2).ok());
  EXPECT_EQ(listed2.containers_size(), 0) << "the state filter applies";
}

TEST(TestRuntime, KnobsMakeItHostile) {
  TempDir dir;
  auto runtime = TestRuntime::Start(dir.path() + "/cri.sock");
  ASSERT_TRUE(runtime.ok());
  TestRuntimeContainer c;
  c.pod_name = "p";
  c.pod_namespace = "default";
  c.name = "c";
  const std::string id = (*runtime)->AddContainer(c);
  (*runtime)->SetRawInfo(id, "{\"runtimeSpec\": [[[[");
  (*runtime)->SetV1Unimplemented(true);
  auto v1 = Dial<runtime::v1::RuntimeService::Stub>((*runtime)->socket_path());
  grpc::ClientContext ctx;
  runtime::v1::ListContainersResponse listed;
  EXPECT_EQ(v1->ListContainers(&ctx, {}, &listed).error_code(), grpc::UNIMPLEMENTED);
  auto v1a2 = Dial<runtime::v1alpha2::RuntimeService::Stub>((*runtime)->socket_path());
  grpc::ClientContext ctx2;
  runtime::v1alpha2::ContainerStatusRequest sreq;
  sreq.set_container_id(id);
  sreq.set_verbose(true);
  runtime::v1alpha2::ContainerStatusResponse status;
  ASSERT_TRUE(v1a2->ContainerStatus(&ctx2, sreq, &status).ok());
  EXPECT_EQ(status.info().at("info"), "{\"runtimeSpec\": [[[[");
  (*runtime)->FailNext(1, grpc::UNAVAILABLE, "containerd is restarting");
  grpc::ClientContext ctx3;
  runtime::v1alpha2::ListContainersResponse listed2;
  auto st = v1a2->ListContainers(&ctx3, {}, &listed2);
  EXPECT_EQ(st.error_code(), grpc::UNAVAILABLE);
  EXPECT_EQ(st.error_message(), "containerd is restarting");
}

TEST_F(StandinTest, KubeletFillsTheRuntimeFromEveryAllocateAnswer) {
  auto runtime = TestRuntime::Start(dir_.path() + "/containerd.sock");
  ASSERT_TRUE(runtime.ok());
  kubelet_->AttachRuntime(runtime->get());
  auto standin = StartStandin();
  ASSERT_NE(standin, nullptr);
  ASSERT_TRUE(standin->WaitForRegistrations(1, absl::Seconds(10)));
  ASSERT_TRUE(kubelet_->WaitForDevices([](const auto& d) { return d.size() == 1; },
                                       absl::Seconds(10), kMig1g));
  ASSERT_TRUE(kubelet_->WaitForDevices([](const auto& d) { return d.size() == 3; },
                                       absl::Seconds(10), kMig2g));
  kubelet_->SetPodUid("ml/legacy", "0b7c-uid");
  ASSERT_TRUE(kubelet_->Allocate("ml/legacy", "main", {Uuid("1g.18gb")}, kMig1g).ok());
  // A second resource for the same container: the first NVIDIA_VISIBLE_DEVICES is kept, as the
  // kubelet's device manager skips an env an earlier resource set.
  ASSERT_TRUE(kubelet_->Allocate("ml/legacy", "main", {Uuid("2g.35gb")}, kMig2g).ok());
  auto c = (*runtime)->Find("ml/legacy", "main");
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->pod_uid, "0b7c-uid");
  EXPECT_EQ(c->state, TestRuntimeState::kRunning);
  EXPECT_EQ(std::count(c->env.begin(), c->env.end(), "NVIDIA_VISIBLE_DEVICES=" + Uuid("1g.18gb")),
            1);
  EXPECT_EQ((*runtime)->containers().size(), 1u);
  kubelet_->ReleasePod("ml/legacy");
  ASSERT_EQ((*runtime)->containers().size(), 1u);
  EXPECT_EQ((*runtime)->containers()[0].state, TestRuntimeState::kExited);
  kubelet_->AttachRuntime(nullptr);
}

}  // namespace
}  // namespace dynmig::deviceplugin
