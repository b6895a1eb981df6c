// Handover without draining, in the device plugin: a GPU with a fixed geometry made before the
// plugin starts (instances created directly through the simulated NVML), legacy holders proven by
// a fake PodResources source and a fake container runtime.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "dp_test_util.h"

namespace dynmig::deviceplugin::testing {
namespace {

constexpr char kMigResource[] = "nvidia.com/mig-1g.5gb";

// The test kubelet's PodResources plus pods of another device plugin (NVIDIA's, mixed strategy),
// or an error.
class FakePodResources final : public PodResourcesSource {
 public:
  explicit FakePodResources(TestKubelet* kubelet) : kubelet_(kubelet) {}
  absl::StatusOr<PodResourcesList> List() override {
    dynmig::MutexLock lock(&mu_);
    ++lists_;
    entered_ = true;
    mu_.Await(dynmig::Condition(&open_));
    if (!error_.ok()) return error_;
    PodResourcesList out = kubelet_->PodResources();
    for (const auto& [name, pod] : extra_) out.push_back(pod);
    return out;
  }
  std::string Describe() const override { return "fake PodResources"; }
  void Hold(const std::string& pod, const std::string& mig_uuid) {
    dynmig::MutexLock lock(&mu_);
    extra_[pod] = {"default", pod, {{"main", {{kMigResource, {mig_uuid}}}}}};
  }
  void Forget(const std::string& pod) {
    dynmig::MutexLock lock(&mu_);
    extra_.erase(pod);
  }
  int lists() {
    dynmig::MutexLock lock(&mu_);
    return lists_;
  }
  void Fail(absl::Status error) {
    dynmig::MutexLock lock(&mu_);
    error_ = std::move(error);
  }
  // List waits while blocked (a slow kubelet).
  void Block() {
    dynmig::MutexLock lock(&mu_);
    open_ = false;
    entered_ = false;
  }
  bool AwaitEntered(absl::Duration timeout) {
    dynmig::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(dynmig::Condition(&entered_), timeout);
  }
  void Unblock() {
    dynmig::MutexLock lock(&mu_);
    open_ = true;
  }

 private:
  TestKubelet* kubelet_;
  dynmig::Mutex mu_;
  std::map<std::string, PodResourcesPod> extra_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  int lists_ ABSL_GUARDED_BY(mu_) = 0;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  bool entered_ ABSL_GUARDED_BY(mu_) = false;
};

class FakeRuntime final : public ContainerRuntimeSource {
 public:
  absl::StatusOr<std::vector<RuntimeContainer>> List() override {
    dynmig::MutexLock lock(&mu_);
    return containers_;
  }
  std::string Describe() const override { return "fake runtime"; }
  void Set(std::vector<RuntimeContainer> containers) {
    dynmig::MutexLock lock(&mu_);
    containers_ = std::move(containers);
  }

 private:
  dynmig::Mutex mu_;
  std::vector<RuntimeContainer> containers_ ABSL_GUARDED_BY(mu_);
};

class LegacyTest : public PluginTest {
 protected:
  void SetUp() override {
    PluginTest::SetUp();
    pod_resources_fake_ = std::make_unique<FakePodResources>(kubelet_.get());
    pod_resources_ = pod_resources_fake_.get();
  }

  // A running pod of another device plugin (no HAMi annotation).
  std::string CreatePlainPod(const std::string& name,
                             const std::function<void(kube::Object&)>& tweak = {}) {
    kube::Object pod = {
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", {{"name", name}, {"namespace", "default"}}},
        {"spec", {{"nodeName", kNode}, {"containers", {{{"name", "main"}, {"image", "cuda"}}}}}},
        {"status", {{"phase", "Running"}}}};
    if (tweak) tweak(pod);
    auto created = kube_->CreatePod(pod);
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? kube::Uid(*created) : "";
  }

  std::optional<ManagedInstance> ManagedAt(int gpu, uint32_t start) {
    for (const auto& m : plugin_->core().Managed()) {
      if (m.gpu_uuid == GpuUuid(gpu) && m.placement.start == start) return m;
    }
    return std::nullopt;
  }

  bool HeldSaying(std::string_view text) {
    for (const auto& h : plugin_->core().Held()) {
      if (h.reason.find(text) != std::string::npos) return true;
    }
    return false;
  }

  // The /nvml item of the GI at `start` on `gpu`.
  nlohmann::json ViewItem(int gpu, uint32_t start) {
    const nlohmann::json view = plugin_->core().NvmlView();
    for (const auto& g : view["gpus"]) {
      if (g["index"] != gpu) continue;
      for (const auto& i : g["instances"]) {
        if (i["placement"]["start"] == start) return i;
      }
    }
    return {};
  }

  std::unique_ptr<FakePodResources> pod_resources_fake_;
  FakeRuntime runtime_;
};

TEST_F(LegacyTest, HeldInstanceSurvivesStartReconcileRestartAndAnIdleGpu) {
  // GPU 0: mig-parted's geometry, one instance held by NVIDIA's plugin's pod; GPU 1: a free one.
  const auto held = CreateRaw(0, "1g.5gb", 0);
  CreateRaw(1, "1g.5gb", 6);
  const std::string uid = CreatePlainPod("nv");
  pod_resources_fake_->Hold("nv", held.mig_uuid);
  ASSERT_NE(StartPlugin(), nullptr);

  auto m = ManagedAt(0, 0);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->origin, "legacy");
  EXPECT_EQ(m->mig_uuid, held.mig_uuid);
  EXPECT_EQ(m->owner.pod_uid, uid);
  ASSERT_EQ(m->holders.size(), 1u);
  EXPECT_EQ(m->holders[0].resource, kMigResource);
  EXPECT_EQ(m->holders[0].source, "pod-resources");
  EXPECT_TRUE(GiAt(0, 0).has_value());
  EXPECT_TRUE(Gis(1).empty()) << "the free instance of the idle GPU is cleaned as before";
  EXPECT_TRUE(HeldSaying("legacy instance of default/nv (container main, nvidia.com/mig-1g.5gb)"));
  EXPECT_TRUE(HasEvent(kReasonLegacyHeld, held.mig_uuid));
  EXPECT_EQ(plugin_->metrics().Value("dynmig_deviceplugin_legacy_instances", "state", "held"), 1);

  const nlohmann::json item = ViewItem(0, 0);
  EXPECT_EQ(item["origin"], "legacy");
  ASSERT_EQ(item["holders"].size(), 1u);
  EXPECT_EQ(item["holders"][0]["podUID"], uid);
  EXPECT_EQ(item["holders"][0]["deviceID"], held.mig_uuid);
  const nlohmann::json evidence = plugin_->core().NvmlView()["evidence"];
  EXPECT_EQ(evidence["podResources"]["ok"], true);
  EXPECT_EQ(evidence["runtime"]["configured"], false);

  for (int i = 0; i < 3; ++i) plugin_->core().Reconcile();
  EXPECT_TRUE(GiAt(0, 0).has_value());
  ASSERT_TRUE(ManagedAt(0, 0).has_value());

  // A new plugin process over the same state file: still held, holders from the state file.
  ASSERT_NE(StartPlugin(), nullptr);
  m = ManagedAt(0, 0);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->origin, "legacy");
  EXPECT_EQ(m->holders.size(), 1u);
  EXPECT_TRUE(GiAt(0, 0).has_value());
  EXPECT_TRUE(HeldSaying("legacy instance of default/nv"));
}

TEST_F(LegacyTest, DeletingTheHolderFreesExactlyItsInstance) {
  const auto a = CreateRaw(0, "1g.5gb", 0);
  const auto b = CreateRaw(0, "1g.5gb", 1);
  CreatePlainPod("nv-a");
  CreatePlainPod("nv-b");
  pod_resources_fake_->Hold("nv-a", a.mig_uuid);
  pod_resources_fake_->Hold("nv-b", b.mig_uuid);
  ASSERT_NE(StartPlugin(), nullptr);
  ASSERT_TRUE(ManagedAt(0, 0).has_value());
  ASSERT_TRUE(ManagedAt(0, 1).has_value());

  // The kubelet still lists nv-a while the API says it runs: nothing changes.
  plugin_->core().Reconcile();
  EXPECT_TRUE(GiAt(0, 0).has_value());

  DeletePod("nv-a");
  pod_resources_fake_->Forget("nv-a");
  plugin_->core().Reconcile();
  EXPECT_FALSE(GiAt(0, 0).has_value());
  EXPECT_FALSE(ManagedAt(0, 0).has_value());
  EXPECT_TRUE(GiAt(0, 1).has_value());
  EXPECT_TRUE(ManagedAt(0, 1).has_value());
  EXPECT_FALSE(HeldSaying("default/nv-a"));
  EXPECT_TRUE(HeldSaying("default/nv-b"));
}

TEST_F(LegacyTest, KubeletForgettingARunningHolderDestroysNothing) {
  const auto a = CreateRaw(0, "1g.5gb", 0);
  CreatePlainPod("nv");
  pod_resources_fake_->Hold("nv", a.mig_uuid);
  ASSERT_NE(StartPlugin(), nullptr);
  ASSERT_TRUE(ManagedAt(0, 0).has_value());
  pod_resources_fake_->Forget("nv");  // e.g. a kubelet that lost its checkpoint
  plugin_->core().Reconcile();
  EXPECT_TRUE(GiAt(0, 0).has_value());
  EXPECT_TRUE(HeldSaying("still runs"));
}

TEST_F(LegacyTest, UnprovenInstanceIsKeptForeverWhilePodResourcesIsDown) {
  const auto a = CreateRaw(0, "1g.5gb", 0);
  pod_resources_fake_->Fail(absl::UnavailableError("kubelet socket gone"));
  ASSERT_NE(StartPlugin(), nullptr);
  for (int i = 0; i < 3; ++i) plugin_->core().Reconcile();
  EXPECT_TRUE(GiAt(0, 0).has_value()) << "an idle GPU is not cleaned while PodResources is down";
  EXPECT_FALSE(ManagedAt(0, 0).has_value());
  EXPECT_TRUE(HeldSaying("unproven: "));
  EXPECT_TRUE(HasEvent(kReasonLegacyUnproven, "kubelet socket gone"));
  EXPECT_EQ(plugin_->metrics().Value("dynmig_deviceplugin_legacy_instances", "state", "unproven"),
            1);
  const nlohmann::json item = ViewItem(0, 0);
  EXPECT_NE(item.value("unproven", "").find("kubelet socket gone"), std::string::npos) << item;
  EXPECT_EQ(plugin_->core().NvmlView()["evidence"]["podResources"]["ok"], false);

  // PodResources back, no holder, the GPU idle: free, cleaned by the untracked rule.
  pod_resources_fake_->Fail(absl::OkStatus());
  plugin_->core().Reconcile();
  EXPECT_FALSE(GiAt(0, 0).has_value());
  (void)a;
}

TEST_F(LegacyTest, HamiLegacyPodIsProvenOnlyByTheRuntime) {
  const auto a = CreateRaw(0, "1g.5gb", 0);
  const auto free = CreateRaw(0, "1g.5gb", 1);
  // HAMi's legacy MIG pod on GPU 0: template/slot ids; no reservation.
  const std::string legacy_id = GpuUuid(0) + "[1-0]";
  const std::string encoded = *protocol::EncodePodDevices({{{legacy_id, kA100, 4864, 15}}});
  const std::string uid = CreatePlainPod("hami", [&](kube::Object& pod) {
    pod["metadata"]["annotations"] = {{std::string(protocol::kDevicesAllocatedAnnotation), encoded},
                                      {std::string(protocol::kVgpuNodeAnnotation), kNode},
                                      {std::string(protocol::kBindPhaseAnnotation), "success"}};
  });
  ASSERT_NE(StartPlugin(), nullptr);  // no runtime configured
  plugin_->core().Reconcile();
  EXPECT_TRUE(GiAt(0, 0).has_value());
  EXPECT_TRUE(GiAt(0, 1).has_value());
  EXPECT_FALSE(ManagedAt(0, 0).has_value());
  const nlohmann::json item = ViewItem(0, 0);
  EXPECT_NE(item.value("unproven", "").find("default/hami"), std::string::npos) << item;
  // A HAMi legacy pod does not pause reclamation.
  EXPECT_TRUE(plugin_->core().Reconcile().skipped.empty());

  // With the runtime: its container holds GI of slot 0 (the legacy MIG form).
  RuntimeContainer c;
  c.id = "ctr-1";
  c.pod_uid = uid;
  c.pod_namespace = "default";
  c.pod_name = "hami";
  c.container = "main";
  c.state = RuntimeContainerState::kRunning;
  c.devices = {fmt::format("MIG-{}/{}/{}", GpuUuid(0), a.gpu_instance_id, a.id)};
  runtime_.Set({c});
  ASSERT_NE(StartPlugin([&](DevicePluginOptions& o) { o.core.runtime = &runtime_; }), nullptr);
  auto m = ManagedAt(0, 0);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->owner.pod_uid, uid);
  ASSERT_EQ(m->holders.size(), 1u);
  EXPECT_EQ(m->holders[0].source, "runtime");
  EXPECT_EQ(plugin_->core().NvmlView()["evidence"]["runtime"]["ok"], true);
  // The other one is free now (kept: the GPU is busy), not unproven.
  EXPECT_EQ(ViewItem(0, 1).value("free", false), true) << ViewItem(0, 1);
  EXPECT_TRUE(GiAt(0, 1).has_value());
  (void)free;
}

TEST_F(LegacyTest, DynamicAllocateUsesTheFreeSlicesBesideLegacyInstances) {
  const auto a = CreateRaw(0, "1g.5gb", 0);
  CreatePlainPod("nv");
  pod_resources_fake_->Hold("nv", a.mig_uuid);
  ASSERT_NE(StartPlugin(), nullptr);
  CreatePod("dyn", {{0, 0, 0, "1g.5gb", 1}});
  auto alloc = Allocate("dyn", 0, 1);
  ASSERT_TRUE(alloc.ok()) << alloc.status();
  EXPECT_TRUE(GiAt(0, 1).has_value());
  EXPECT_TRUE(GiAt(0, 0).has_value());
  plugin_->core().Reconcile();
  EXPECT_TRUE(GiAt(0, 0).has_value());
  auto legacy = ManagedAt(0, 0);
  ASSERT_TRUE(legacy.has_value());
  EXPECT_EQ(legacy->origin, "legacy");
  // A dynamic pod whose reservation overlaps the legacy instance is refused, nothing destroyed.
  CreatePod("thief", {{0, 0, 0, "2g.10gb", 0}});
  EXPECT_FALSE(Allocate("thief", 0, 1).ok());
  EXPECT_TRUE(GiAt(0, 0).has_value());
}

TEST_F(LegacyTest, EndedLegacyInstanceIsKeptWarmOnlyWhenAllowlisted) {
  const auto a = CreateRaw(0, "1g.5gb", 0);
  const auto b = CreateRaw(0, "2g.10gb", 2);
  CreatePlainPod("nv-a");
  CreatePlainPod("nv-b");
  pod_resources_fake_->Hold("nv-a", a.mig_uuid);
  pod_resources_fake_->Hold("nv-b", b.mig_uuid);
  ASSERT_NE(StartPlugin([](DevicePluginOptions& o) {
              o.core.warm.enabled = true;
              o.core.allowlist.entries[0].profiles = {"1g.5gb", "3g.20gb", "7g.40gb"};
            }),
            nullptr);
  DeletePod("nv-a");
  DeletePod("nv-b");
  pod_resources_fake_->Forget("nv-a");
  pod_resources_fake_->Forget("nv-b");
  plugin_->core().Reconcile();
  auto idle = ManagedAt(0, 0);
  ASSERT_TRUE(idle.has_value());
  EXPECT_TRUE(idle->idle);
  EXPECT_TRUE(idle->holders.empty());
  EXPECT_FALSE(GiAt(0, 2).has_value()) << "2g.10gb is not allowlisted: destroyed";
}

TEST_F(LegacyTest, EvidenceIsReusedWithinItsMaxAge) {
  const auto a = CreateRaw(0, "1g.5gb", 0);
  CreatePlainPod("nv");
  pod_resources_fake_->Hold("nv", a.mig_uuid);
  ASSERT_NE(StartPlugin([](DevicePluginOptions& o) { o.core.evidence_max_age = absl::Hours(1); }),
            nullptr);
  const int lists = pod_resources_fake_->lists();
  EXPECT_GE(lists, 1);
  DeletePod("nv");
  pod_resources_fake_->Forget("nv");
  for (int i = 0; i < 3; ++i) plugin_->core().Reconcile();
  EXPECT_EQ(pod_resources_fake_->lists(), lists);
  EXPECT_TRUE(GiAt(0, 0).has_value()) << "stale evidence only keeps an instance longer";
  // Read every cycle (max age 0): the deleted holder's instance is reclaimed.
  ASSERT_NE(StartPlugin(), nullptr);
  plugin_->core().Reconcile();
  EXPECT_FALSE(GiAt(0, 0).has_value());
}

TEST_F(LegacyTest, EvidenceIsReadOutsideTheNodeLock) {
  const auto a = CreateRaw(0, "1g.5gb", 0);
  CreatePlainPod("nv");
  pod_resources_fake_->Hold("nv", a.mig_uuid);
  ASSERT_NE(StartPlugin(), nullptr);  // evidence_max_age 0: read every cycle
  plugin_->core().Reconcile();        // a cycle that needed the evidence
  const int lists = pod_resources_fake_->lists();
  pod_resources_fake_->Block();
  std::thread cycle([&] { plugin_->core().Reconcile(); });
  ASSERT_TRUE(pod_resources_fake_->AwaitEntered(absl::Seconds(30)));
  // While the kubelet is slow to answer, the node lock is free: its users (Allocate, GET /nvml,
  // ListAndWatch) go on.
  auto managed = std::async(std::launch::async, [&] { return plugin_->core().Managed(); });
  const bool free = managed.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  pod_resources_fake_->Unblock();
  cycle.join();
  EXPECT_TRUE(free) << "the node lock was held while the evidence was read";
  EXPECT_EQ(managed.get().size(), 1u);
  // The cycle used the read it prefetched: one read, and the holder still proven.
  EXPECT_EQ(pod_resources_fake_->lists(), lists + 1);
  ASSERT_TRUE(ManagedAt(0, 0).has_value());
  EXPECT_EQ(ManagedAt(0, 0)->holders.size(), 1u);
  // A cycle that needs no evidence reads none ahead: with the holder gone the instance is
  // reclaimed, and the cycles after it read nothing.
  DeletePod("nv");
  pod_resources_fake_->Forget("nv");
  plugin_->core().Reconcile();
  EXPECT_FALSE(GiAt(0, 0).has_value());
  plugin_->core().Reconcile();
  const int after = pod_resources_fake_->lists();
  plugin_->core().Reconcile();
  plugin_->core().Reconcile();
  EXPECT_EQ(pod_resources_fake_->lists(), after);
}

TEST_F(LegacyTest, OldStateFileWithoutHoldersLoads) {
  auto state = DecodeState(R"({"version":1,"nextIntentId":1,"instances":[{"gpuUUID":"GPU-1",
      "profile":"1g.5gb","profileId":19,"placement":{"start":0,"size":1},"gpuInstanceID":9,
      "computeInstanceID":0,"migUUID":"MIG-1","origin":"created","since":1,"owner":{"podUID":"u",
      "namespace":"default","name":"p","containerIndex":0,"deviceIndex":0}}],"intents":[]})");
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_TRUE(state->instances[0].holders.empty());
  state->instances[0].origin = "legacy";
  state->instances[0].holders = {{"u", "default", "p", "main", kMigResource, "MIG-1", "runtime"}};
  auto again = DecodeState(EncodeState(*state));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *state);
  // Hostile: holders of the wrong shape are a clear error.
  EXPECT_FALSE(DecodeState(R"({"version":1,"nextIntentId":1,"instances":[{"gpuUUID":"GPU-1",
      "profile":"1g.5gb","profileId":19,"placement":{"start":0,"size":1},"gpuInstanceID":9,
      "computeInstanceID":0,"migUUID":"MIG-1","origin":"legacy","since":1,"owner":{"podUID":"u",
      "namespace":"default","name":"p","containerIndex":0,"deviceIndex":0},"holders":[7]}],
      "intents":[]})")
                   .ok());
}

// The device plugin's own container says NVIDIA_VISIBLE_DEVICES=all (deploy/: the toolkit gives it
// NVML that way): with --self-pod it holds nothing, so an ended pod's legacy instance is still
// reclaimed; without it, "all" would hold every legacy instance forever.
TEST_F(LegacyTest, OwnPodIsNeverAHolder) {
  const auto a = CreateRaw(0, "1g.5gb", 0);
  CreatePlainPod("nv");
  pod_resources_fake_->Hold("nv", a.mig_uuid);
  RuntimeContainer self;
  self.id = "ctr-self";
  self.pod_uid = "uid-self";
  self.pod_namespace = "dynmig-system";
  self.pod_name = "dynmig-device-plugin-x";
  self.container = "device-plugin";
  self.state = RuntimeContainerState::kRunning;
  self.devices = {"all"};
  runtime_.Set({self});
  ASSERT_NE(StartPlugin([&](DevicePluginOptions& o) {
              o.core.runtime = &runtime_;
              o.core.self_pod = "dynmig-system/dynmig-device-plugin-x";
            }),
            nullptr);
  auto m = ManagedAt(0, 0);
  ASSERT_TRUE(m.has_value());
  ASSERT_EQ(m->holders.size(), 1u) << "only nv holds it";
  EXPECT_EQ(m->holders[0].name, "nv");

  DeletePod("nv");
  pod_resources_fake_->Forget("nv");
  plugin_->core().Reconcile();
  EXPECT_FALSE(GiAt(0, 0).has_value()) << "reclaimed: the plugin's own \"all\" holds nothing";

  // Another pod of the same namespace with "all" is a holder: only the plugin's own pod is left
  // out.
  const auto b = CreateRaw(0, "1g.5gb", 1);
  RuntimeContainer other = self;
  other.id = "ctr-other";
  other.pod_uid = "uid-other";
  other.pod_name = "dynmig-device-plugin-y";
  runtime_.Set({self, other});
  plugin_->core().Reconcile();
  plugin_->core().Reconcile();
  EXPECT_TRUE(GiAt(0, 1).has_value());
  auto held = ManagedAt(0, 1);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->holders.size(), 1u);
  EXPECT_EQ(held->holders[0].name, "dynmig-device-plugin-y");
  (void)b;
}

}  // namespace
}  // namespace dynmig::deviceplugin::testing
