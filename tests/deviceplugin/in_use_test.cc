// Destroys NVML refuses with NVML_ERROR_IN_USE (reclaimer_destroy.cc): another NVML client (DCGM)
// holds the instance open. The instance stays recorded as a pending destroy (across restarts), its
// slices stay held, the refusal is counted and reported, the destroy is retried with backoff on
// the plugin's clock, and once the holder lets go it is destroyed and its slices freed.
#include "dp_test_util.h"

namespace dynmig::deviceplugin::testing {
namespace {

class InUseTest : public PluginTest {
 protected:
  DevicePlugin* StartWithClock() {
    return StartPlugin([&](DevicePluginOptions& o) {
      o.core.clock = &clock_;
      o.core.destroy_retry_initial = absl::Seconds(10);
      o.core.destroy_retry_max = absl::Seconds(40);
    });
  }
  const ManagedInstance* Pending() {
    managed_ = plugin_->core().Managed();
    for (const auto& m : managed_) {
      if (m.destroy_pending()) return &m;
    }
    return nullptr;
  }
  double Metric(std::string_view name, std::string_view label = "", std::string_view value = "") {
    return plugin_->metrics().Value(name, label, value);
  }

  FakeClock clock_{absl::Now()};
  std::vector<ManagedInstance> managed_;
};

TEST_F(InUseTest, ARefusedDestroyIsHeldRetriedWithBackoffAcrossRestartsAndFreedOnRelease) {
  StartWithClock();
  CreatePod("a", {{0, 0, 0, "3g.20gb", 4}});
  ASSERT_TRUE(Allocate("a", 0, 1).ok());
  SetPhase("a", "Running");
  const uint32_t gi = GiAt(0, 4)->id;
  const std::string gpu_uuid = Allocations("a")[0].gpu_uuid;
  ASSERT_TRUE(sim_->HoldGpuInstance(0, gi, "dcgm").ok());
  DeletePod("a");

  auto report = plugin_->core().Reconcile();
  EXPECT_EQ(report.destroyed, 0);
  EXPECT_EQ(report.destroy_pending, 1);
  EXPECT_TRUE(GiAt(0, 4).has_value()) << "NVML refused: the instance still exists";
  const ManagedInstance* p = Pending();
  ASSERT_NE(p, nullptr) << "never forgotten";
  EXPECT_EQ(p->destroy_attempts, 1);
  EXPECT_NE(p->destroy_error.find("NVML_ERROR_IN_USE"), std::string::npos) << p->destroy_error;
  EXPECT_EQ(p->destroy_next_ms, absl::ToUnixMillis(clock_.Now() + absl::Seconds(10)));
  EXPECT_TRUE(HasEvent(kReasonDestroyInUse, "another NVML client"));
  EXPECT_EQ(Metric("dynmig_deviceplugin_destroy_retries_total", "reason", "in_use"), 1);
  EXPECT_EQ(Metric("dynmig_deviceplugin_destroy_pending_instances"), 1);
  // Its slices stay held, and it is no idle instance to give out.
  auto held = plugin_->core().Held();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].gpu_uuid, gpu_uuid);
  EXPECT_EQ(held[0].placement, (mig::Placement{4, 4}));
  EXPECT_NE(held[0].reason.find("being destroyed"), std::string::npos) << held[0].reason;
  EXPECT_TRUE(plugin_->core().Idle().empty());

  // Backoff: not due before 10 s, then 20 s, then capped at 40 s.
  plugin_->core().Reconcile();
  EXPECT_EQ(Pending()->destroy_attempts, 1);
  clock_.Advance(absl::Seconds(10));
  plugin_->core().Reconcile();
  EXPECT_EQ(Pending()->destroy_attempts, 2);
  clock_.Advance(absl::Seconds(19));
  plugin_->core().Reconcile();
  EXPECT_EQ(Pending()->destroy_attempts, 2);
  clock_.Advance(absl::Seconds(1));
  plugin_->core().Reconcile();
  EXPECT_EQ(Pending()->destroy_attempts, 3);
  EXPECT_EQ(Pending()->destroy_next_ms, absl::ToUnixMillis(clock_.Now() + absl::Seconds(40)));
  clock_.Advance(absl::Seconds(40));
  plugin_->core().Reconcile();
  EXPECT_EQ(Pending()->destroy_next_ms, absl::ToUnixMillis(clock_.Now() + absl::Seconds(40)));
  EXPECT_EQ(Metric("dynmig_deviceplugin_destroy_retries_total", "reason", "in_use"), 4);
  EXPECT_EQ(Metric("dynmig_deviceplugin_instances_destroyed_total", "reason", "in_use_retry"), 0);

  // A restart reads the pending destroy back from the state file: still held, same schedule.
  StartWithClock();
  ASSERT_NE(Pending(), nullptr);
  EXPECT_EQ(Pending()->destroy_attempts, 4);
  EXPECT_EQ(plugin_->core().Held().size(), 1u);
  EXPECT_TRUE(GiAt(0, 4).has_value());

  // The holder lets go: the next due retry destroys it and frees the slices.
  ASSERT_TRUE(sim_->ReleaseGpuInstance(0, gi, "dcgm").ok());
  clock_.Advance(absl::Seconds(40));
  report = plugin_->core().Reconcile();
  EXPECT_EQ(report.destroyed, 1);
  EXPECT_EQ(report.destroy_pending, 0);
  EXPECT_FALSE(GiAt(0, 4).has_value());
  EXPECT_EQ(TotalGis(), 0u);
  EXPECT_EQ(Pending(), nullptr);
  EXPECT_TRUE(plugin_->core().Managed().empty());
  EXPECT_TRUE(plugin_->core().Held().empty());
  EXPECT_TRUE(HasEvent(kReasonDestroyed, "after NVML refused 4 time(s)"));
  EXPECT_EQ(Metric("dynmig_deviceplugin_destroy_pending_instances"), 0);
  EXPECT_EQ(Metric("dynmig_deviceplugin_instances_destroyed_total", "reason", "in_use_retry"), 1);

  // The freed slices take a new pod at once.
  CreatePod("b", {{0, 0, 0, "3g.20gb", 4}});
  auto b = Allocate("b", 0, 1);
  ASSERT_TRUE(b.ok()) << b.status();
}

// The loop publishes held slices in the cycle that holds them, not at the next periodic publish
// (30 s by default, an hour here): until then the scheduler would count the slices of the ended
// pod as free and place a pod there whose Allocate must be refused. Freed again: published at once.
TEST_F(InUseTest, HeldSlicesArePublishedInTheCycleThatHoldsThem) {
  StartPlugin([&](DevicePluginOptions& o) {
    o.core.clock = &clock_;
    o.core.destroy_retry_initial = absl::Seconds(10);
    o.register_interval = absl::Hours(1);
  });
  auto held_on_node = [&] {
    auto node = kube_->GetNode(kNode);
    EXPECT_TRUE(node.ok());
    auto held = protocol::DecodeHeldSlices(
        kube::Annotation(*node, protocol::kNodeHeldSlicesAnnotation).value_or("missing"));
    EXPECT_TRUE(held.ok()) << held.status();
    return held.ok() ? *held : std::vector<protocol::HeldSlices>{};
  };
  CreatePod("a", {{0, 0, 0, "3g.20gb", 4}});
  ASSERT_TRUE(Allocate("a", 0, 1).ok());
  SetPhase("a", "Running");
  ASSERT_TRUE(plugin_->RunCycle());
  EXPECT_TRUE(held_on_node().empty());
  const uint32_t gi = GiAt(0, 4)->id;
  ASSERT_TRUE(sim_->HoldGpuInstance(0, gi, "dcgm").ok());
  DeletePod("a");
  ASSERT_TRUE(plugin_->RunCycle());
  auto held = held_on_node();
  ASSERT_EQ(held.size(), 1u) << "the refused destroy's slices are on the Node after this cycle";
  EXPECT_EQ(held[0].placement, (mig::Placement{4, 4}));
  // The holder lets go; the retry destroys it and the same cycle publishes the slices free.
  ASSERT_TRUE(sim_->ReleaseGpuInstance(0, gi, "dcgm").ok());
  clock_.Advance(absl::Seconds(10));
  ASSERT_TRUE(plugin_->RunCycle());
  EXPECT_FALSE(GiAt(0, 4).has_value());
  EXPECT_TRUE(held_on_node().empty());
}

TEST_F(InUseTest, ARefusedDestroyOfAnIdleInstanceIsNoLongerGivenOut) {
  StartPlugin([&](DevicePluginOptions& o) {
    o.core.clock = &clock_;
    o.core.warm.enabled = true;
    o.core.warm.ttl = absl::Minutes(5);
    o.core.warm.max_per_gpu = 2;
  });
  CreatePod("a", {{0, 0, 0, "1g.5gb", 2}});
  ASSERT_TRUE(Allocate("a", 0, 1).ok());
  SetPhase("a", "Running");
  DeletePod("a");
  plugin_->core().Reconcile();
  ASSERT_EQ(plugin_->core().Idle().size(), 1u);
  ASSERT_TRUE(sim_->HoldGpuInstance(0, GiAt(0, 2)->id, "dcgm").ok());
  clock_.Advance(absl::Minutes(6));  // past the TTL: the sweep destroys it, NVML refuses
  auto report = plugin_->core().Reconcile();
  EXPECT_EQ(report.idle_destroyed, 0);
  EXPECT_TRUE(plugin_->core().Idle().empty()) << "a pending destroy is no idle instance";
  ASSERT_NE(Pending(), nullptr);
  EXPECT_FALSE(Pending()->idle);
  ASSERT_EQ(plugin_->core().Held().size(), 1u);
  EXPECT_EQ(plugin_->core().Held()[0].placement, (mig::Placement{2, 1}));
  ASSERT_TRUE(sim_->ReleaseGpuInstance(0, GiAt(0, 2)->id, "").ok());
  clock_.Advance(absl::Seconds(2));
  plugin_->core().Reconcile();
  EXPECT_EQ(TotalGis(), 0u);
  EXPECT_TRUE(plugin_->core().Managed().empty());
}

// The readiness rule: the answer and the runtime identity wait until NVML lists the new instance.
TEST_F(InUseTest, ANewInstanceIsAnsweredOnlyOnceNvmlListsIt) {
  StartPlugin([](DevicePluginOptions& o) {
    o.core.ready_timeout = absl::Seconds(5);
    o.core.ready_poll = absl::Milliseconds(5);
  });
  CreatePod("a", {{0, 0, 0, "1g.5gb", 0}});
  nvml::SimFault fault;  // the first three listings do not show it yet
  fault.op = "ListComputeInstances";
  fault.times = 3;
  fault.code = nvml::NvmlReturn::kNotFound;
  DP_ASSERT_OK(sim_->InjectFault(fault));
  auto a = Allocate("a", 0, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  const auto left = sim_->Faults();
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_TRUE(left->empty()) << "Allocate polled the listing until it showed the instance";
  ASSERT_TRUE(Allocations("a")[0].runtime.has_value());

  // Never listed within the bound: the Allocate fails, names what is missing, and rolls back.
  StartPlugin([](DevicePluginOptions& o) {
    o.core.ready_timeout = absl::Milliseconds(100);
    o.core.ready_poll = absl::Milliseconds(5);
  });
  CreatePod("b", {{0, 0, 0, "1g.5gb", 1}});
  fault.times = 0;
  fault.gpu = 0;
  DP_ASSERT_OK(sim_->InjectFault(fault));
  auto b = Allocate("b", 0, 1);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("NVML does not list the new MIG device"), std::string::npos)
      << b.status();
  DP_ASSERT_OK(sim_->ClearFaults());
  DeletePod("b");
  plugin_->core().Reconcile();  // the rollback's open intent is resolved once NVML answers
  EXPECT_FALSE(GiAt(0, 1).has_value());
  EXPECT_TRUE(GiAt(0, 0).has_value());
  EXPECT_TRUE(plugin_->core().OpenIntents().empty());
}

TEST(PendingDestroyStateTest, RoundTripsAndRejectsMalformedRecords) {
  PluginState state;
  ManagedInstance m;
  m.gpu_uuid = "GPU-a";
  m.profile = "1g.5gb";
  m.mig_uuid = "MIG-1";
  m.origin = "created";
  m.destroy_attempts = 3;
  m.destroy_since = 1800000000;
  m.destroy_next_ms = 1800000040000;
  m.destroy_error = "destroy GI 13 on GPU GPU-a: NVML_ERROR_IN_USE";
  state.instances.push_back(m);
  auto decoded = DecodeState(EncodeState(state));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, state);
  const std::string head =
      R"({"version":1,"nextIntentId":1,"intents":[],"instances":[{"gpuUUID":"GPU-a",
      "profile":"1g.5gb","profileId":19,"placement":{"start":0,"size":1},"gpuInstanceID":13,
      "computeInstanceID":0,"migUUID":"MIG-1","origin":"created","since":1,
      "owner":{"podUID":"u","namespace":"n","name":"p","containerIndex":0,"deviceIndex":0},)";
  for (const char* bad : {
           R"("destroyPending":{"attempts":0,"since":1,"nextAttemptMs":1,"error":""}}]})",
           R"("destroyPending":{"attempts":-5,"since":1,"nextAttemptMs":1,"error":""}}]})",
           R"("destroyPending":{"attempts":"many","since":1,"nextAttemptMs":1,"error":""}}]})",
           R"("destroyPending":{"attempts":1,"since":1,"error":""}}]})",
           R"("destroyPending":[1]}]})",
       }) {
    auto r = DecodeState(head + bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find("destroyPending"), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace dynmig::deviceplugin::testing
