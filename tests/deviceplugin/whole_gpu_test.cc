// Whole GPUs (issue 31 phase 2, docs/mig-mode.md): a GPU whose MIG mode is off is published as a
// "hami-core" device with one device ID when nvidia.migModeSwitching allows it, and a whole-GPU
// pod's Allocate gets its UUID. Without the key the register is what it always was. Every
// refusal leaves NVML and the GPU as they were.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "deviceplugin/allocate_plan.h"
#include "deviceplugin/state_store.h"
#include "dp_test_util.h"
#include "protocol/gpu_mode.h"
#include "protocol/node_register.h"

namespace dynmig::deviceplugin::testing {
namespace {

constexpr uint64_t kA100MemoryMib = 40960;

std::vector<std::string> DevicePaths(const v1beta1::ContainerAllocateResponse& r) {
  std::vector<std::string> out;
  for (const auto& d : r.devices()) out.push_back(d.host_path());
  return out;
}

class WholeGpuTest : public PluginTest {
 protected:
  void SetUp() override {
    PluginTest::SetUp();
    if (sim_ == nullptr) return;
    // GPU 1 leaves MIG mode: an Ampere GPU applies it at the next GPU reset.
    ASSERT_TRUE(sim_->SetMigMode(1, false).ok());
    ASSERT_TRUE(sim_->ResetGpu(1).ok());
  }

  static void Switching(DevicePluginOptions& o) { o.core.mig_mode_switching.enabled = true; }

  // Starts the plugin without the bench's wait for every device to be healthy (GPU 1, MIG off,
  // is an unhealthy MIG GPU when it may not be whole), after one cycle and one publish.
  void StartWithUnhealthyGpu(const std::function<void(DevicePluginOptions&)>& tweak = {}) {
    StopPlugin();
    plugin_sim_ = OpenSim("", plugin_device_nodes_);
    DevicePluginOptions o = Options();
    if (tweak) tweak(o);
    auto plugin = DevicePlugin::Start(std::move(o), *plugin_sim_, *plugin_kube_, pod_resources_);
    ASSERT_TRUE(plugin.ok()) << plugin.status();
    plugin_ = std::move(*plugin);
    ASSERT_TRUE(kubelet_->WaitForRegistrations(++expected_registrations_, absl::Seconds(10)));
    ASSERT_TRUE(plugin_->RunCycle());
    ASSERT_TRUE(plugin_->core().PublishNode().ok());
  }

  std::vector<protocol::DeviceInfo> Register() {
    auto node = kube_->GetNode(kNode);
    EXPECT_TRUE(node.ok()) << node.status();
    auto devices = protocol::DecodeNodeRegister(
        kube::Annotation(*node, protocol::kNodeRegisterAnnotation).value_or(""));
    EXPECT_TRUE(devices.ok()) << devices.status();
    return devices.ok() ? *devices : std::vector<protocol::DeviceInfo>{};
  }
  std::string RegisterText() {
    auto node = kube_->GetNode(kNode);
    EXPECT_TRUE(node.ok()) << node.status();
    return kube::Annotation(*node, protocol::kNodeRegisterAnnotation).value_or("");
  }
  // The kubelet's device IDs of GPU `gpu`.
  std::vector<std::string> DeviceIdsOf(int gpu) { return IdsOf(kubelet_->devices(), gpu); }
  std::vector<std::string> IdsOf(const std::vector<v1beta1::Device>& devices, int gpu) {
    std::vector<std::string> out;
    for (const auto& d : devices) {
      if (GpuOfReplicaId(d.id()) == GpuUuid(gpu)) out.push_back(d.id());
    }
    return out;
  }

  // A whole-GPU pod as the scheduler leaves it after bind (docs/mig-mode.md's contract):
  // nvidia.com/vgpu-mode hami-core, one devices-to-allocate entry per GPU, no MIG reservation.
  kube::Object CreateWholePod(const std::string& name, const std::vector<std::string>& gpus,
                              bool lock = true,
                              const std::function<void(kube::Object&)>& tweak = {}) {
    protocol::PodDevices devices(1);
    for (const auto& g : gpus) {
      devices[0].push_back({g, kA100, static_cast<int32_t>(kA100MemoryMib), 100});
    }
    const std::string encoded = *protocol::EncodePodDevices(devices);
    const int64_t now = absl::ToUnixSeconds(absl::Now()) + (++pods_created_);
    kube::Object annotations = {
        {std::string(protocol::kVgpuModeAnnotation), std::string(protocol::kVgpuModeHamiCore)},
        {std::string(protocol::kVgpuNodeAnnotation), kNode},
        {std::string(protocol::kVgpuTimeAnnotation), std::to_string(now)},
        {std::string(protocol::kDevicesToAllocateAnnotation), encoded},
        {std::string(protocol::kDevicesAllocatedAnnotation), encoded},
        {std::string(protocol::kBindPhaseAnnotation), "allocating"},
        {std::string(protocol::kBindTimeAnnotation), std::to_string(now)}};
    kube::Object container = {
        {"name", "c0"},
        {"image", "cuda"},
        {"resources", {{"limits", {{"nvidia.com/gpu", std::to_string(gpus.size())}}}}}};
    kube::Object pod = {
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", {{"name", name}, {"namespace", "default"}, {"annotations", annotations}}},
        {"spec", {{"nodeName", kNode}, {"containers", kube::Object::array({container})}}},
        {"status", {{"phase", "Pending"}}}};
    if (tweak) tweak(pod);
    auto created = kube_->CreatePod(pod);
    EXPECT_TRUE(created.ok()) << created.status();
    if (lock) LockNodeFor(name, created.ok() ? kube::Uid(*created) : "");
    return created.ok() ? *created : kube::Object{};
  }

  // Nothing was created, destroyed or handed out: no GI on GPU 0, GPU 1 still whole (MIG off).
  void ExpectNothingTouched() {
    EXPECT_TRUE(Gis(0).empty());  // NVML lists no GI on GPU 1 while its MIG mode is off
    auto mode = sim_->GetMigMode(1);
    ASSERT_TRUE(mode.ok());
    EXPECT_FALSE(mode->current);
    EXPECT_FALSE(mode->pending);
  }
};

TEST_F(WholeGpuTest, WithoutTheKeyTheRegisterIsExactlyTodays) {
  StartWithUnhealthyGpu();
  // Today's register: both GPUs as MIG GPUs, GPU 1 unhealthy (MIG mode disabled).
  const auto* model = *mig::FindModel("A100-SXM4-40GB");
  std::vector<const mig::ProfileSpec*> allowed;
  const mig::Allowlist allowlist = TestAllowlist();
  for (const auto& name : allowlist.entries[0].profiles) {
    allowed.push_back(model->capability.FindProfile(name));
  }
  const std::string expected = protocol::EncodeNodeRegister(
      {protocol::MigDeviceInfo({GpuUuid(0), 0, 0, true}, model->capability, allowed),
       protocol::MigDeviceInfo({GpuUuid(1), 1, 0, false}, model->capability, allowed)});
  EXPECT_EQ(RegisterText(), expected);
  // 1g.5gb's instance count, as before.
  EXPECT_TRUE(kubelet_->WaitForDevices([&](const auto& d) { return IdsOf(d, 1).size() == 7; },
                                       absl::Seconds(10)));
  EXPECT_FALSE(plugin_->core().inventory().gpus[1].Whole());
}

TEST_F(WholeGpuTest, WithSwitchingAGpuWithMigOffIsPublishedWholeWithOneDeviceId) {
  ASSERT_NE(StartPlugin(Switching), nullptr);
  ASSERT_TRUE(plugin_->core().PublishNode().ok());
  const auto devices = Register();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].mode, "mig");
  EXPECT_EQ(protocol::DeviceGpuMode(devices[1]), protocol::GpuMode::kWholeGpu);
  EXPECT_EQ(devices[1],
            protocol::WholeGpuDeviceInfo({GpuUuid(1), 1, 0, true}, kA100, kA100MemoryMib));
  EXPECT_EQ(DeviceIdsOf(1), std::vector<std::string>{GpuUuid(1) + "::0"});
  EXPECT_EQ(DeviceIdsOf(0).size(), 7u);
  // GET /nvml says the mode.
  const nlohmann::json view = plugin_->core().NvmlView();
  EXPECT_EQ(view["gpus"][0]["mode"], "mig");
  EXPECT_EQ(view["gpus"][1]["mode"], "hami-core");
}

TEST_F(WholeGpuTest, ARuleThatDoesNotMatchKeepsTheGpuAMigGpu) {
  StartWithUnhealthyGpu([](DevicePluginOptions& o) {
    Switching(o);
    o.core.mig_mode_switching.rules.push_back({{"H100"}, {}});
  });
  EXPECT_FALSE(plugin_->core().inventory().gpus[1].Whole());
  const auto devices = Register();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[1].mode, "mig");
  EXPECT_FALSE(devices[1].health);
}

TEST_F(WholeGpuTest, AModeChangeIsPublishedInTheCycleItHappensAndPendingIsUnhealthy) {
  // Both GPUs in MIG mode at start.
  ASSERT_TRUE(sim_->SetMigMode(1, true).ok());
  ASSERT_TRUE(sim_->ResetGpu(1).ok());
  ASSERT_NE(StartPlugin(Switching), nullptr);
  ASSERT_EQ(DeviceIdsOf(1).size(), 7u);
  // MIG off requested on the Ampere GPU: pending until a reset. Published unhealthy at once.
  ASSERT_TRUE(sim_->SetMigMode(1, false).ok());
  ASSERT_TRUE(plugin_->RunCycle());
  std::vector<protocol::DeviceInfo> devices = Register();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[1].mode, "mig");
  EXPECT_FALSE(devices[1].health);
  EXPECT_NE(plugin_->core().inventory().gpus[1].unhealthy_reason.find("pending"),
            std::string::npos);
  // The reset applies it: whole, healthy, one device ID, in that cycle.
  ASSERT_TRUE(sim_->ResetGpu(1).ok());
  ASSERT_TRUE(plugin_->RunCycle());
  devices = Register();
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[1].mode, "hami-core");
  EXPECT_TRUE(devices[1].health);
  EXPECT_TRUE(kubelet_->WaitForDevices([&](const auto& d) { return IdsOf(d, 1).size() == 1; },
                                       absl::Seconds(10)));
  // And back to MIG: published as a MIG GPU again in the cycle it changes.
  ASSERT_TRUE(sim_->SetMigMode(1, true).ok());
  ASSERT_TRUE(plugin_->RunCycle());
  devices = Register();
  EXPECT_EQ(devices[1].mode, "hami-core");
  EXPECT_FALSE(devices[1].health);  // pending enable
  ASSERT_TRUE(sim_->ResetGpu(1).ok());
  ASSERT_TRUE(plugin_->RunCycle());
  devices = Register();
  EXPECT_EQ(devices[1].mode, "mig");
  EXPECT_TRUE(devices[1].health);
}

TEST_F(WholeGpuTest, AWholeGpuPodGetsTheGpuAndPreStartProvesIt) {
  ASSERT_NE(StartPlugin(Switching), nullptr);
  CreateWholePod("w", {GpuUuid(1)});
  auto a = Allocate("w", 0, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->response.envs().at("NVIDIA_VISIBLE_DEVICES"), GpuUuid(1));
  auto minor = sim_->GetGpu(1);
  ASSERT_TRUE(minor.ok());
  EXPECT_EQ(DevicePaths(a->response),
            (std::vector<std::string>{fmt::format("/dev/nvidia{}", minor->minor), "/dev/nvidiactl",
                                      "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}));
  // The reservation consumed, bind-phase success, no MIG reservation written, the lock released.
  EXPECT_EQ(PodAnnotation("w", protocol::kBindPhaseAnnotation), "success");
  auto remaining =
      protocol::DecodePodDevices(PodAnnotation("w", protocol::kDevicesToAllocateAnnotation));
  ASSERT_TRUE(remaining.ok());
  for (const auto& c : *remaining) EXPECT_TRUE(c.empty());
  EXPECT_FALSE(kube::Annotation(GetPod("w"), protocol::kMigAllocationsAnnotation).has_value());
  EXPECT_FALSE(NodeLock().has_value());
  EXPECT_TRUE(HasEvent(kReasonWholeGpuAllocated, GpuUuid(1)));
  ExpectNothingTouched();
  // The ledger: whom the GPU went to; PreStartContainer proves it.
  const auto ledger = plugin_->core().Ledger();
  ASSERT_EQ(ledger.size(), 1u);
  EXPECT_EQ(ledger[0].gpu_uuids, std::vector<std::string>{GpuUuid(1)});
  EXPECT_TRUE(ledger[0].mig_uuids.empty());
  DP_ASSERT_OK(kubelet_->PreStart("default/w", "c0"));
}

TEST_F(WholeGpuTest, TheSimulatorAnswersEnvironmentOnly) {
  plugin_device_nodes_ = false;
  ASSERT_NE(StartPlugin(Switching), nullptr);
  CreateWholePod("w", {GpuUuid(1)});
  auto a = Allocate("w", 0, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->response.envs().at("NVIDIA_VISIBLE_DEVICES"), GpuUuid(1));
  EXPECT_TRUE(a->response.devices().empty());
}

TEST_F(WholeGpuTest, AnEndedPodFreesTheGpuWithoutDestroyingAnythingAndARestartKeepsAHeldOne) {
  ASSERT_NE(StartPlugin(Switching), nullptr);
  CreateWholePod("w1", {GpuUuid(1)});
  ASSERT_TRUE(Allocate("w1", 0, 1).ok());
  SetPhase("w1", "Running");
  // A restart: the pod's GPU is nothing to reclaim, and it is still held.
  ASSERT_NE(StartPlugin(Switching), nullptr);
  plugin_->core().Reconcile();
  ExpectNothingTouched();
  DP_ASSERT_OK(kubelet_->PreStart("default/w1", "c0"));
  CreateWholePod("w2", {GpuUuid(1)});
  auto refused = Allocate("w2", 0, 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("held by pod default/w1"), std::string::npos)
      << refused.status();
  EXPECT_EQ(PodAnnotation("w2", protocol::kBindPhaseAnnotation), "failed");
  // w1 ends: nothing is destroyed, the ledger forgets it, and the GPU serves the next pod.
  SetPhase("w1", "Succeeded");
  DeletePod("w1");
  plugin_->core().Reconcile();
  ExpectNothingTouched();
  EXPECT_TRUE(plugin_->core().Ledger().empty());
  DeletePod("w2");
  CreateWholePod("w3", {GpuUuid(1)});
  auto a = Allocate("w3", 0, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->response.envs().at("NVIDIA_VISIBLE_DEVICES"), GpuUuid(1));
}

// Each hostile or mistaken reservation is refused with a message naming what is wrong; nothing is
// created, destroyed or handed out.
TEST_F(WholeGpuTest, RefusesHostileAndMixedReservations) {
  ASSERT_NE(StartPlugin(Switching), nullptr);
  struct Case {
    std::string name;
    std::vector<std::string> gpus;
    std::function<void(kube::Object&)> tweak;
    std::string says;
  };
  auto set = [](std::string_view key, std::string value) {
    return [key = std::string(key), value](kube::Object& pod) {
      pod["metadata"]["annotations"][key] = value;
    };
  };
  const std::vector<Case> cases = {
      {"other-node", {"GPU-00000000-0000-0000-0000-00000000beef"}, {}, "no such GPU is published"},
      {"mig-gpu", {GpuUuid(0)}, {}, "is a MIG GPU"},
      {"twice", {GpuUuid(1), GpuUuid(1)}, {}, "names that GPU twice"},
      {"cores",
       {GpuUuid(1)},
       set(protocol::kDevicesToAllocateAnnotation, GpuUuid(1) + ",x,40960,15:;"),
       "cores 15"},
      {"memory",
       {GpuUuid(1)},
       set(protocol::kDevicesToAllocateAnnotation, GpuUuid(1) + ",x,2147483647,100:;"),
       "2147483647 MiB"},
      {"mixed", {GpuUuid(1)}, set(protocol::kMigAllocationsAnnotation, "[]"), "never both"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    CreateWholePod(c.name, c.gpus, /*lock=*/true, c.tweak);
    auto a = Allocate(c.name, 0, static_cast<int>(c.gpus.size()));
    ASSERT_FALSE(a.ok());
    EXPECT_NE(a.status().message().find(c.says), std::string::npos) << a.status();
    EXPECT_EQ(PodAnnotation(c.name, protocol::kBindPhaseAnnotation), "failed");
    ExpectNothingTouched();
    DeletePod(c.name);
  }
  // An undecodable reservation is no pending pod at all.
  CreateWholePod("garbage", {GpuUuid(1)}, true,
                 set(protocol::kDevicesToAllocateAnnotation, std::string(5000, ',')));
  EXPECT_FALSE(Allocate("garbage", 0, 1).ok());
  ExpectNothingTouched();
  EXPECT_TRUE(plugin_->core().Ledger().empty());
}

TEST_F(WholeGpuTest, ATenantPodThatIsNotTheLockOwnerGetsNothing) {
  ASSERT_NE(StartPlugin(Switching), nullptr);
  // The scheduler's pod holds the lock; a tenant hand-writes the same reservation on its own pod.
  CreateWholePod("owner", {GpuUuid(1)});
  CreateWholePod("tenant", {GpuUuid(1)}, /*lock=*/false);
  auto a = Allocate("tenant", 0, 1);
  ASSERT_FALSE(a.ok());
  ExpectNothingTouched();
  EXPECT_TRUE(plugin_->core().Ledger().empty());
  EXPECT_EQ(PodAnnotation("tenant", protocol::kBindPhaseAnnotation), "allocating");
}

TEST_F(WholeGpuTest, AMigPodNamingAWholeGpuIsRefused) {
  ASSERT_NE(StartPlugin(Switching), nullptr);
  CreatePod("m", {{0, 0, 1, "1g.5gb", 0}});
  auto a = Allocate("m", 0, 1);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("published whole"), std::string::npos) << a.status();
  ExpectNothingTouched();
}

// ValidateWholeGpu on plain values: who holds a GPU. A pod that has terminated holds nothing, even
// while its ledger entry waits for the next reconcile; one that has not (Running, or being deleted
// with its processes still up) holds it.
TEST(WholeGpuPlanTest, OnlyAPodThatHasNotTerminatedHoldsItsGpu) {
  Inventory inventory;
  GpuEntry g;
  g.info.uuid = "GPU-w";
  g.info.name = kA100;
  g.info.total_memory_mib = kA100MemoryMib;
  g.info.mig = {.supported = true, .current = false, .pending = false};
  g.exposed = g.may_be_whole = g.healthy = true;
  inventory.gpus.push_back(g);
  const std::vector<ManagedInstance> instances;
  const std::vector<QuarantinedSlices> quarantine;
  const NodeView view{kNode, inventory, instances, quarantine};
  auto make = [](std::string uid, std::string name, std::string bind_phase) {
    PodMig p;
    p.uid = std::move(uid);
    p.ns = "default";
    p.name = std::move(name);
    p.key = "default/" + p.name;
    p.active = true;
    p.whole_gpu = true;
    p.vgpu_node = kNode;
    p.bind_phase = std::move(bind_phase);
    p.has_to_allocate = true;
    p.to_allocate = protocol::PodDevices{{{"GPU-w", kA100, 40960, 100}}};
    p.referenced_gpus = {"GPU-w"};
    return p;
  };
  const PodMig me = make("uid-me", "me", "allocating");
  PodMig old = make("uid-old", "old", "success");
  old.to_allocate = protocol::PodDevices{{}};
  const std::vector<LedgerEntry> ledger = {
      {{"GPU-w::0"}, "uid-old", "default", "old", "main", 0, false, {}, 1, {"GPU-w"}}};
  // Running: held.
  auto r = ValidateWholeGpu(me, 0, 1, view, {me, old}, ledger);
  EXPECT_EQ(r.reason, "placement_busy");
  EXPECT_NE(std::string(r.status.message()).find("held by pod default/old"), std::string::npos);
  // Being deleted (processes may still run): still held.
  old.active = false;
  old.deleting = true;
  EXPECT_EQ(ValidateWholeGpu(me, 0, 1, view, {me, old}, ledger).reason, "placement_busy");
  // Terminated: free, although the ledger still has its entry.
  old.terminated = true;
  r = ValidateWholeGpu(me, 0, 1, view, {me, old}, ledger);
  ASSERT_TRUE(r.ok()) << r.status;
  ASSERT_EQ(r.plan.gpus.size(), 1u);
  EXPECT_EQ(r.plan.gpus[0]->info.uuid, "GPU-w");
  // A failed bind holds nothing either; a pending MIG mode change makes the GPU no whole GPU.
  PodMig failed = make("uid-f", "f", "failed");
  EXPECT_TRUE(ValidateWholeGpu(me, 0, 1, view, {me, failed}, {}).ok());
  inventory.gpus[0].info.mig.pending = true;
  inventory.gpus[0].healthy = false;
  EXPECT_EQ(ValidateWholeGpu(me, 0, 1, view, {me}, {}).reason, "gpu_unhealthy");
  // The kubelet asking for another count than the reservation lists is refused.
  EXPECT_EQ(ValidateWholeGpu(me, 0, 2, view, {me}, {}).reason, "device_count");
}

TEST(WholeGpuLedgerTest, TheStateFileKeepsTheWholeGpusOnlyWhenThereAreAny) {
  PluginState state;
  state.ledger.push_back({{"GPU-a::0"}, "uid", "ns", "p", "main", 0, false, {}, 5, {"GPU-a"}});
  state.ledger.push_back({{"GPU-b::0"}, "uid2", "ns", "q", "main", 0, false, {"MIG-1"}, 6, {}});
  const std::string text = EncodeState(state);
  EXPECT_EQ(text.find("gpuUUIDs"), text.rfind("gpuUUIDs"));  // once: the MIG entry has none
  auto back = DecodeState(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, state);
  // A hostile value is refused, naming the field.
  nlohmann::json doc = nlohmann::json::parse(text);
  doc["ledger"][0]["gpuUUIDs"] = 7;
  auto bad = DecodeState(doc.dump());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("gpuUUIDs"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace dynmig::deviceplugin::testing
