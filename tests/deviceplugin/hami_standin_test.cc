// The stand-in for HAMi's legacy device plugin (NvidiaStandin, StandinMode::kHamiLegacy): the
// pod it finds, the MIG device a `GPU-<uuid>[t-s]` id names, and the whole Allocate over real
// gRPC with the test kubelet and the in-memory API server; every annotation it reads is attacked.
#include "deviceplugin/hami_standin.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "common/clock.h"
#include "deviceplugin/dp_test_util.h"
#include "deviceplugin/nvidia_standin.h"
#include "deviceplugin/test_kubelet.h"
#include "kube/in_memory_api_server.h"
#include "kube/rest_kube_client.h"
#include "mig/geometry.h"
#include "nvml/geometry.h"
#include "nvml/sim_nvml.h"
#include "protocol/annotations.h"

namespace dynmig::deviceplugin {
namespace {

using testing::kNode;
using testing::TempDir;

constexpr char kGpuResource[] = "nvidia.com/gpu";

// HAMi's default knownMigGeometries entry of the A100 40GB.
std::vector<mig::LegacyGeometryEntry> HamiA100Geometries() {
  mig::LegacyGeometryEntry e;
  e.models = {"A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"};
  e.geometries = {{{"1g.5gb", 14, 5120, 7}},
                  {{"1g.5gb", 14, 5120, 1}, {"2g.10gb", 28, 10240, 3}},
                  {{"3g.20gb", 42, 20480, 2}},
                  {{"7g.40gb", 100, 40960, 1}}};
  return {e};
}

kube::Object HamiPod(const std::string& name, const std::map<std::string, std::string>& ann,
                     const std::string& node = kNode) {
  kube::Object pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", name}, {"namespace", "default"}, {"uid", name + "-uid"}}},
      {"spec", {{"nodeName", node}, {"containers", {{{"name", "main"}, {"image", "busybox"}}}}}}};
  for (const auto& [k, v] : ann) pod["metadata"]["annotations"][k] = v;
  return pod;
}

std::map<std::string, std::string> Allocating(const std::string& to_allocate,
                                              const std::string& bind_time = "100") {
  return {{std::string(protocol::kBindPhaseAnnotation), "allocating"},
          {std::string(protocol::kVgpuNodeAnnotation), kNode},
          {std::string(protocol::kBindTimeAnnotation), bind_time},
          {std::string(protocol::kDevicesToAllocateAnnotation), to_allocate}};
}

TEST(HamiPendingPod, OldestAllocatingPodOfTheNodeAndItsNextContainer) {
  const std::string dev = "GPU-a[0-1],NVIDIA A100-SXM4-40GB,4864,14:";
  std::vector<kube::Object> pods = {
      HamiPod("newer", Allocating(dev + ";", "200")),
      HamiPod("older", Allocating(";" + dev + ";" + dev + ";", "150")),
      HamiPod("done", {{std::string(protocol::kBindPhaseAnnotation), "success"}}),
  };
  auto p = FindHamiPendingPod(pods, kNode);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->name, "older");
  EXPECT_EQ(p->uid, "older-uid");
  EXPECT_EQ(p->container, 1);  // the first container without devices is skipped
  ASSERT_EQ(p->devices.size(), 1u);
  EXPECT_EQ(p->devices[0].uuid, "GPU-a[0-1]");
  EXPECT_FALSE(p->last);
  ASSERT_EQ(p->rest.size(), 3u);
  EXPECT_TRUE(p->rest[1].empty());
  EXPECT_EQ(p->rest[2].size(), 1u);
  // Equal bind times: namespace/name decides.
  pods[1] = HamiPod("alpha", Allocating(dev + ";", "200"));
  p = FindHamiPendingPod(pods, kNode);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->name, "alpha");
  EXPECT_TRUE(p->last);
}

TEST(HamiPendingPod, HostileAnnotationsAreSkippedWithTheReason) {
  const std::string dev = "GPU-a[0-1],NVIDIA A100-SXM4-40GB,4864,14:";
  auto other_node = Allocating(dev + ";");
  other_node[std::string(protocol::kVgpuNodeAnnotation)] = "node-b";
  auto too_many = std::string();
  for (size_t i = 0; i <= kMaxStandinIdsPerContainer; ++i) too_many += dev;
  auto no_time = Allocating(dev + ";");
  no_time.erase(std::string(protocol::kBindTimeAnnotation));
  std::vector<kube::Object> pods = {
      HamiPod("elsewhere", other_node),  // not ours: ignored silently
      HamiPod("spec-elsewhere", Allocating(dev + ";"), "node-b"),
      HamiPod("no-time", no_time),
      HamiPod("bad-time", Allocating(dev + ";", "-5")),
      HamiPod("huge", Allocating(std::string(kMaxHamiAnnotationBytes + 1, 'x'))),
      HamiPod("garbled", Allocating("GPU-a,1,2:;")),
      HamiPod("too-many", Allocating(too_many + ";")),
      HamiPod("nothing-left", Allocating(";;")),
  };
  auto p = FindHamiPendingPod(pods, kNode);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition) << p.status();
  const std::string msg(p.status().message());
  EXPECT_NE(msg.find("no pod is being allocated on node node-a"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("default/elsewhere"), std::string::npos) << msg;
  for (const char* want :
       {"default/spec-elsewhere: it is not bound to node-a",
        "default/no-time: no hami.io/bind-time",
        "default/bad-time: hami.io/bind-time \"-5\" is not a number",
        "default/huge: hami.io/vgpu-devices-to-allocate is 16385 bytes; at most 16384",
        "default/garbled: hami.io/vgpu-devices-to-allocate: container 0 device 0",
        "default/too-many: hami.io/vgpu-devices-to-allocate: container 0 lists 65 devices",
        "default/nothing-left: hami.io/vgpu-devices-to-allocate has no container left"}) {
    EXPECT_NE(msg.find(want), std::string::npos) << want << "\n" << msg;
  }
  // A pod being deleted is skipped too.
  pods = {HamiPod("deleting", Allocating(dev + ";"))};
  pods[0]["metadata"]["deletionTimestamp"] = "2026-12-04T00:00:00Z";
  p = FindHamiPendingPod(pods, kNode);
  EXPECT_NE(std::string(p.status().message()).find("terminated or being deleted"),
            std::string::npos)
      << p.status();
}

TEST(HamiPendingPod, ManySkippedPodsAreCountedNotListed) {
  std::vector<kube::Object> pods;
  for (int i = 0; i < 50; ++i) pods.push_back(HamiPod("p" + std::to_string(i), Allocating(";")));
  auto p = FindHamiPendingPod(pods, kNode);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(std::string(p.status().message()).find("and 42 more"), std::string::npos) << p.status();
}

class HamiSimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    nvml::SimNvmlOptions o;
    o.spec = "A100-SXM4-40GBx1";
    o.state_file = dir_.path() + "/gpu.json";
    o.seed = kNode;
    o.fsync = false;
    auto sim = nvml::SimNvml::Create(std::move(o));
    ASSERT_TRUE(sim.ok()) << sim.status();
    sim_ = std::move(*sim);
    auto gpu = sim_->GetGpu(0);
    ASSERT_TRUE(gpu.ok());
    gpu_uuid_ = gpu->uuid;
  }

  // Lays out HAMi's geometry `t`; the MIG UUIDs in the driver's MIG device index order.
  std::vector<std::string> Apply(size_t t) {
    auto spec = mig::SelectLegacyGeometry(HamiA100Geometries(), "NVIDIA A100-SXM4-40GB", t);
    EXPECT_TRUE(spec.ok()) << spec.status();
    auto r = nvml::ApplyGeometry(*sim_, 0, *spec);
    EXPECT_TRUE(r.ok()) << r.status();
    auto gis = sim_->ListGpuInstances(0);
    EXPECT_TRUE(gis.ok());
    std::sort(gis->begin(), gis->end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    std::vector<std::string> out;
    for (const auto& gi : *gis) {
      auto cis = sim_->ListComputeInstances(0, gi.id);
      EXPECT_TRUE(cis.ok());
      for (const auto& ci : *cis) out.push_back(ci.mig_uuid);
    }
    return out;
  }

  TempDir dir_;
  std::unique_ptr<nvml::SimNvml> sim_;
  std::string gpu_uuid_;
};

TEST_F(HamiSimTest, SlotIsTheMigDeviceIndexOfTheTemplatesLayout) {
  const auto devices = Apply(1);  // 1 x 1g.5gb + 3 x 2g.10gb
  ASSERT_EQ(devices.size(), 4u);
  for (uint32_t s = 0; s < 4; ++s) {
    auto m =
        HamiLegacyMigDevice(*sim_, HamiA100Geometries(), fmt::format("{}[1-{}]", gpu_uuid_, s));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->mig_uuid, devices[s]);
    EXPECT_EQ(m->template_profile, s == 0 ? "1g.5gb" : "2g.10gb");
  }
  // GI ids order the devices: the 2g instances (lower GI ids) come before the 1g one, so HAMi's
  // slot 0 (the template's 1g) is a 2g device, exactly as nvmlDeviceGetMigDeviceHandleByIndex(0).
  auto m = HamiLegacyMigDevice(*sim_, HamiA100Geometries(), gpu_uuid_ + "[1-0]");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->profile, "2g.10gb");
}

TEST_F(HamiSimTest, HostileOrStaleIdsAreRefusedNamingWhy) {
  Apply(0);  // 7 x 1g.5gb
  auto code = [&](const std::string& id) {
    return HamiLegacyMigDevice(*sim_, HamiA100Geometries(), id).status().code();
  };
  EXPECT_TRUE(HamiLegacyMigDevice(*sim_, HamiA100Geometries(), gpu_uuid_ + "[0-6]").ok());
  EXPECT_EQ(code(gpu_uuid_), absl::StatusCode::kInvalidArgument);  // no [t-s]
  EXPECT_EQ(code(gpu_uuid_ + "[0-x]"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(gpu_uuid_ + "[0-99999999999]"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(std::string(300, 'G') + "[0-1]"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code("GPU-00000000-0000-0000-0000-000000000000[0-1]"), absl::StatusCode::kNotFound);
  EXPECT_EQ(code(gpu_uuid_ + "[0-7]"), absl::StatusCode::kNotFound);         // 7 devices: 0..6
  EXPECT_EQ(code(gpu_uuid_ + "[4-0]"), absl::StatusCode::kInvalidArgument);  // no template 4
  auto st = HamiLegacyMigDevice(*sim_, HamiA100Geometries(), gpu_uuid_ + "[2-0]").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(st.message()).find("{1g.5gb=7}, not as legacy geometry 2 (3g.20gb=2)"),
            std::string::npos)
      << st;
  // A model no entry names.
  auto other = HamiA100Geometries();
  other[0].models = {"H100"};
  EXPECT_EQ(HamiLegacyMigDevice(*sim_, other, gpu_uuid_ + "[0-1]").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(HamiSimTest, SplitIdsOfMigGpusOnly) {
  auto ids = HamiDeviceIds(*sim_, 3);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<std::string>{gpu_uuid_ + "-0", gpu_uuid_ + "-1", gpu_uuid_ + "-2"}));
}

// The whole plugin: the kubelet's Allocate of nvidia.com/gpu finds the pod through the API.
class HamiStandinTest : public HamiSimTest {
 protected:
  void SetUp() override {
    HamiSimTest::SetUp();
    auto api = kube::InMemoryApiServer::Start({});
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = std::move(*api);
    kube::RestConfig config;
    config.server = api_->url();
    auto client = kube::RestKubeClient::Create(config);
    ASSERT_TRUE(client.ok()) << client.status();
    kube_ = std::move(*client);
    auto kubelet = TestKubelet::Start(dir_.path() + "/dp");
    ASSERT_TRUE(kubelet.ok()) << kubelet.status();
    kubelet_ = std::move(*kubelet);
  }
  void TearDown() override {
    if (standin_) standin_->Stop();
    if (kubelet_) kubelet_->Stop();
    if (api_) api_->Stop();
  }

  void StartStandin() {
    NvidiaStandinOptions o;
    o.mode = StandinMode::kHamiLegacy;
    o.kubelet_dir = kubelet_->dir();
    o.refresh_interval = absl::Milliseconds(50);
    o.kubelet_poll_interval = absl::Milliseconds(50);
    o.node = kNode;
    o.kube = kube_.get();
    o.split_count = 4;
    o.legacy_geometries = HamiA100Geometries();
    auto s = NvidiaStandin::Start(o, *sim_, RealClock());
    ASSERT_TRUE(s.ok()) << s.status();
    standin_ = std::move(*s);
    ASSERT_TRUE(standin_->WaitForRegistrations(1, absl::Seconds(10)));
    ASSERT_TRUE(kubelet_->WaitForDevices([](const auto& d) { return d.size() == 4; },
                                         absl::Seconds(10), kGpuResource));
  }

  std::string Ann(const std::string& pod, std::string_view key) {
    auto p = kube_->GetPod("default", pod);
    EXPECT_TRUE(p.ok()) << p.status();
    return kube::Annotation(*p, key).value_or("<none>");
  }

  std::unique_ptr<kube::InMemoryApiServer> api_;
  std::unique_ptr<kube::RestKubeClient> kube_;
  std::unique_ptr<TestKubelet> kubelet_;
  std::unique_ptr<NvidiaStandin> standin_;
};

TEST_F(HamiStandinTest, AllocateGivesTheSlotsMigDeviceAndWritesBackSuccess) {
  const auto devices = Apply(0);
  StartStandin();
  auto info = kubelet_->plugin(kGpuResource);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->endpoint, "nvidia-gpu.sock");
  EXPECT_EQ(standin_->resource(standin_->profiles().at(0)), kGpuResource);
  const std::string dev = gpu_uuid_ + "[0-3],NVIDIA A100-SXM4-40GB,4864,14:";
  ASSERT_TRUE(kube_->CreatePod(HamiPod("hami-a", Allocating(dev + ";"))).ok());
  auto a = kubelet_->Allocate("default/hami-a", "main", {gpu_uuid_ + "-1"}, kGpuResource);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->envs().at("NVIDIA_VISIBLE_DEVICES"), devices[3]);
  EXPECT_EQ(a->envs_size(), 1);
  EXPECT_EQ(Ann("hami-a", protocol::kBindPhaseAnnotation), "success");
  EXPECT_EQ(Ann("hami-a", protocol::kDevicesToAllocateAnnotation), ";");
  // Nothing is left to allocate on the node now.
  auto again = kubelet_->Allocate("default/hami-b", "main", {gpu_uuid_ + "-2"}, kGpuResource);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
}

TEST_F(HamiStandinTest, AMismatchOrAStaleSlotFailsThePodAndGivesNothing) {
  Apply(0);
  StartStandin();
  const std::string dev = gpu_uuid_ + "[0-1],NVIDIA A100-SXM4-40GB,4864,14:";
  // Two devices in the annotation, one from the kubelet: HAMi's "device number not matched".
  ASSERT_TRUE(kube_->CreatePod(HamiPod("two", Allocating(dev + dev + ";"))).ok());
  auto a = kubelet_->Allocate("default/two", "main", {gpu_uuid_ + "-0"}, kGpuResource);
  ASSERT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
  EXPECT_NE(std::string(a.status().message()).find("device number not matched"), std::string::npos);
  EXPECT_EQ(Ann("two", protocol::kBindPhaseAnnotation), "failed");
  EXPECT_EQ(Ann("two", protocol::kDevicesToAllocateAnnotation), dev + dev + ";");
  // A template the GPU is not laid out as.
  const std::string stale = gpu_uuid_ + "[3-0],NVIDIA A100-SXM4-40GB,40000,100:";
  ASSERT_TRUE(kube_->CreatePod(HamiPod("stale", Allocating(stale + ";"))).ok());
  a = kubelet_->Allocate("default/stale", "main", {gpu_uuid_ + "-0"}, kGpuResource);
  ASSERT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition) << a.status();
  EXPECT_EQ(Ann("stale", protocol::kBindPhaseAnnotation), "failed");
  // An id the plugin never advertised is refused before any pod is looked at.
  ASSERT_TRUE(kube_->CreatePod(HamiPod("ok", Allocating(dev + ";"))).ok());
  a = kubelet_->Allocate("default/ok", "main", {"GPU-forged-0"}, kGpuResource);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
  EXPECT_EQ(Ann("ok", protocol::kBindPhaseAnnotation), "allocating");
}

TEST_F(HamiStandinTest, NeedsTheApiTheNodeAndGeometries) {
  NvidiaStandinOptions o;
  o.mode = StandinMode::kHamiLegacy;
  o.kubelet_dir = kubelet_->dir();
  EXPECT_EQ(NvidiaStandin::Start(o, *sim_, RealClock()).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.node = kNode;
  o.kube = kube_.get();
  EXPECT_EQ(NvidiaStandin::Start(o, *sim_, RealClock()).status().code(),
            absl::StatusCode::kInvalidArgument);  // no geometries
  o.legacy_geometries = HamiA100Geometries();
  o.split_count = 0;
  EXPECT_EQ(NvidiaStandin::Start(o, *sim_, RealClock()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dynmig::deviceplugin
