// Warm instances (reclaimer_warm.cc, nvidia.migWarmInstances): an ended pod's instance is kept
// idle, reused by a reservation that names it exactly, destroyed on TTL, over the cap, or when
// another reservation needs its slices; restarts keep idle instances; nothing leaks, overlaps or
// is destroyed while a pod's annotations cannot be read.
#include <gmock/gmock.h>

#include <atomic>
#include <tuple>

#include "dp_test_util.h"
#include "protocol/idle_instances.h"

namespace dynmig::deviceplugin::testing {
namespace {

class WarmTest : public PluginTest {
 protected:
  // A plugin with warm instances on and the test's clock.
  DevicePlugin* StartWarm(uint32_t max_per_gpu = 2, bool enabled = true,
                          std::function<bool(std::string_view)> crash = {},
                          bool pod_identity = false) {
    return StartPlugin([&](DevicePluginOptions& o) {
      o.metrics_pod_identity = pod_identity;
      o.core.warm.enabled = enabled;
      o.core.warm.ttl = absl::Minutes(5);
      o.core.warm.max_per_gpu = max_per_gpu;
      o.core.clock = &clock_;
      if (crash) o.core.crash_point = crash;
    });
  }
  void Advance(absl::Duration d) { clock_.Advance(d); }

  // A pod allocated, Running, then deleted: its instance is what Reconcile decides about.
  std::string RunAndDelete(const std::string& name, int gpu, const std::string& profile,
                           uint32_t start) {
    CreatePod(name, {{0, 0, gpu, profile, start}});
    auto a = Allocate(name, 0, 1);
    EXPECT_TRUE(a.ok()) << a.status();
    SetPhase(name, "Running");
    const std::string uuid = Allocations(name)[0].runtime->mig_uuid;
    DeletePod(name);
    return uuid;
  }

  std::vector<ManagedInstance> IdleManaged() {
    std::vector<ManagedInstance> out;
    for (const auto& m : plugin_->core().Managed()) {
      if (m.idle) out.push_back(m);
    }
    return out;
  }
  double Metric(std::string_view name, std::string_view label = "", std::string_view value = "") {
    return plugin_->metrics().Value(name, label, value);
  }

  // The plugin's clock: wall time starts at the real time the test's pods and locks are stamped
  // with, and moves only by Advance().
  FakeClock clock_{absl::Now()};
};

TEST_F(WarmTest, AnEndedPodsInstanceIsKeptIdleAndReusedWithoutACreate) {
  StartWarm();
  const std::string uuid = RunAndDelete("a", 0, "1g.5gb", 6);
  const uint32_t gi = GiAt(0, 6)->id;
  auto report = plugin_->core().Reconcile();
  EXPECT_EQ(report.idled, 1);
  EXPECT_EQ(report.destroyed, 0);
  ASSERT_TRUE(GiAt(0, 6).has_value());
  ASSERT_EQ(IdleManaged().size(), 1u);
  EXPECT_TRUE(plugin_->core().Held().empty()) << "idle slices are free, not held";
  EXPECT_TRUE(HasEvent(kReasonIdled, uuid));
  EXPECT_EQ(Metric("dynmig_deviceplugin_idle_instances", "profile", "1g.5gb"), 1);

  // Published for the scheduler, beside HAMi's register (unchanged).
  ASSERT_TRUE(plugin_->core().PublishNode().ok());
  auto published = protocol::DecodeIdleInstances(
      kube::Annotation(*kube_->GetNode(kNode), protocol::kNodeIdleInstancesAnnotation)
          .value_or("missing"));
  ASSERT_TRUE(published.ok()) << published.status();
  ASSERT_EQ(published->size(), 1u);
  EXPECT_EQ((*published)[0].gpu_uuid, GpuUuid(0));
  EXPECT_EQ((*published)[0].profile, "1g.5gb");
  EXPECT_EQ((*published)[0].placement, (mig::Placement{6, 1}));
  EXPECT_FALSE(plugin_->core().IdleChanged());

  // A reservation naming exactly that GPU, profile and placement gets it.
  CreatePod("b", {{0, 0, 0, "1g.5gb", 6}});
  auto b = Allocate("b", 0, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->response.envs().at("NVIDIA_VISIBLE_DEVICES"), uuid);
  auto identity = Allocations("b")[0].runtime;
  ASSERT_TRUE(identity.has_value());
  EXPECT_EQ(identity->mig_uuid, uuid);
  EXPECT_EQ(identity->gpu_instance_id, gi);
  EXPECT_EQ(PodAnnotation("b", protocol::kBindPhaseAnnotation), "success");
  EXPECT_EQ(GiAt(0, 6)->id, gi);
  EXPECT_EQ(TotalGis(), 1u);
  EXPECT_EQ(Metric("dynmig_deviceplugin_instances_created_total"), 1) << "only pod a's";
  EXPECT_EQ(Metric("dynmig_deviceplugin_instances_reused_total", "profile", "1g.5gb"), 1);
  EXPECT_EQ(Metric("dynmig_deviceplugin_idle_instances", "profile", "1g.5gb"), 0);
  EXPECT_TRUE(HasEvent(kReasonReused, uuid));
  auto managed = plugin_->core().Managed();
  ASSERT_EQ(managed.size(), 1u);
  EXPECT_FALSE(managed[0].idle);
  EXPECT_EQ(managed[0].owner.name, "b");
  EXPECT_EQ(managed[0].origin, "reused");
  EXPECT_TRUE(plugin_->core().Idle().empty());
  EXPECT_TRUE(plugin_->core().IdleChanged());

  // While b runs, its instance is b's: a reconcile neither idles nor destroys it.
  SetPhase("b", "Running");
  report = plugin_->core().Reconcile();
  EXPECT_EQ(report.idled + report.destroyed, 0);
  EXPECT_EQ(TotalGis(), 1u);
}

TEST_F(WarmTest, AnIdleInstanceOfAnotherShapeIsDestroyedWhenAReservationNeedsItsSlices) {
  StartWarm();
  RunAndDelete("a", 0, "1g.5gb", 5);
  ASSERT_EQ(plugin_->core().Reconcile().idled, 1);
  // A 3g at 4-7 overlaps the idle 1g at 5: destroyed first, then created as usual.
  CreatePod("b", {{0, 0, 0, "3g.20gb", 4}});
  auto b = Allocate("b", 0, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(GiAt(0, 5).has_value());
  ASSERT_TRUE(GiAt(0, 4).has_value());
  EXPECT_EQ(GiAt(0, 4)->placement, (mig::Placement{4, 4}));
  EXPECT_EQ(TotalGis(), 1u);
  EXPECT_TRUE(IdleManaged().empty());
  EXPECT_EQ(Metric("dynmig_deviceplugin_instances_destroyed_total", "reason", "idle_needed"), 1);
  EXPECT_EQ(Metric("dynmig_deviceplugin_instances_reused_total"), 0);
  // Same GPU, same start, other profile (1g.10gb is 2 slices at 4): not a match either.
  SetPhase("b", "Running");
  DeletePod("b");
  ASSERT_EQ(plugin_->core().Reconcile().idled, 1);
  CreatePod("c", {{0, 0, 0, "2g.10gb", 4}});
  ASSERT_TRUE(Allocate("c", 0, 1).ok());
  EXPECT_EQ(GiAt(0, 4)->placement, (mig::Placement{4, 2}));
  EXPECT_EQ(TotalGis(), 1u);
  EXPECT_EQ(Metric("dynmig_deviceplugin_instances_destroyed_total", "reason", "idle_needed"), 2);
}

TEST_F(WarmTest, TheTtlDestroysIdleInstances) {
  StartWarm();
  RunAndDelete("a", 0, "1g.5gb", 0);
  ASSERT_EQ(plugin_->core().Reconcile().idled, 1);
  Advance(absl::Minutes(4));
  EXPECT_EQ(plugin_->core().Reconcile().destroyed, 0);
  EXPECT_EQ(TotalGis(), 1u);
  Advance(absl::Minutes(1));
  auto report = plugin_->core().Reconcile();
  EXPECT_EQ(report.idle_destroyed, 1);
  EXPECT_EQ(TotalGis(), 0u);
  EXPECT_TRUE(plugin_->core().Managed().empty());
  EXPECT_EQ(Metric("dynmig_deviceplugin_instances_destroyed_total", "reason", "idle_ttl"), 1);
}

// The race between TTL expiry and a reservation naming the idle instance: a bound pod whose
// reservation names it keeps it past the TTL; once destroyed, a reservation naming its placement
// gets a fresh instance there.
TEST_F(WarmTest, ATtlExpiryNeverTakesAnInstanceAReservationNamesAndALateOneCreatesAfresh) {
  StartWarm();
  const std::string uuid = RunAndDelete("a", 0, "1g.5gb", 3);
  ASSERT_EQ(plugin_->core().Reconcile().idled, 1);
  CreatePod("b", {{0, 0, 0, "1g.5gb", 3}});  // bound, not yet allocated
  Advance(absl::Minutes(10));
  EXPECT_EQ(plugin_->core().Reconcile().destroyed, 0);
  ASSERT_EQ(IdleManaged().size(), 1u);
  auto b = Allocate("b", 0, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(Allocations("b")[0].runtime->mig_uuid, uuid);

  // Idle again; expired with no pod naming it; the scheduler had reserved it for c meanwhile.
  SetPhase("b", "Running");
  DeletePod("b");
  ASSERT_EQ(plugin_->core().Reconcile().idled, 1);
  const uint32_t old_gi = GiAt(0, 3)->id;
  Advance(absl::Minutes(6));
  ASSERT_EQ(plugin_->core().Reconcile().idle_destroyed, 1);
  EXPECT_EQ(TotalGis(), 0u);
  CreatePod("c", {{0, 0, 0, "1g.5gb", 3}});
  auto c = Allocate("c", 0, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(GiAt(0, 3).has_value());
  EXPECT_EQ(TotalGis(), 1u);
  EXPECT_EQ(Metric("dynmig_deviceplugin_instances_created_total"), 2);
  EXPECT_EQ(Metric("dynmig_deviceplugin_instances_reused_total"), 1);
  EXPECT_EQ(Metric("dynmig_deviceplugin_instances_destroyed_total", "reason", "idle_ttl"), 1);
  (void)old_gi;
}

TEST_F(WarmTest, EachGpuKeepsAtMostItsCap) {
  StartWarm(/*max_per_gpu=*/1);
  for (const auto& [name, gpu, start] :
       std::vector<std::tuple<std::string, int, uint32_t>>{{"a", 0, 0}, {"b", 0, 1}, {"c", 1, 0}}) {
    CreatePod(name, {{0, 0, gpu, "1g.5gb", start}});
    ASSERT_TRUE(Allocate(name, 0, 1).ok());
    SetPhase(name, "Running");
  }
  for (const char* name : {"a", "b", "c"}) DeletePod(name);
  auto report = plugin_->core().Reconcile();
  EXPECT_EQ(report.idled, 2);
  EXPECT_EQ(report.destroyed, 1);
  EXPECT_EQ(Gis(0).size(), 1u);
  EXPECT_EQ(Gis(1).size(), 1u);
  EXPECT_EQ(IdleManaged().size(), 2u);
}

TEST_F(WarmTest, ARestartKeepsIdleInstancesAndTurningWarmOffDestroysThem) {
  StartWarm();
  const std::string uuid = RunAndDelete("a", 0, "2g.10gb", 2);
  ASSERT_EQ(plugin_->core().Reconcile().idled, 1);
  StopPlugin();

  StartWarm();  // recovery (GPU 0 is referenced by no pod: an "idle GPU") keeps it
  ASSERT_EQ(IdleManaged().size(), 1u);
  EXPECT_EQ(IdleManaged()[0].mig_uuid, uuid);
  EXPECT_TRUE(GiAt(0, 2).has_value());
  EXPECT_EQ(plugin_->core().Idle().size(), 1u);
  CreatePod("b", {{0, 0, 0, "2g.10gb", 2}});
  ASSERT_TRUE(Allocate("b", 0, 1).ok());
  EXPECT_EQ(Allocations("b")[0].runtime->mig_uuid, uuid);
  SetPhase("b", "Running");
  DeletePod("b");
  ASSERT_EQ(plugin_->core().Reconcile().idled, 1);
  StopPlugin();

  StartWarm(2, /*enabled=*/false);  // its first cycle destroys what warm instances kept
  EXPECT_TRUE(plugin_->core().Managed().empty());
  EXPECT_EQ(TotalGis(), 0u);
  EXPECT_EQ(Metric("dynmig_deviceplugin_instances_destroyed_total", "reason", "idle_disabled"), 1);
}

TEST_F(WarmTest, NothingIdleIsDestroyedWhileAPodsAnnotationCannotBeRead) {
  StartWarm();
  RunAndDelete("a", 0, "1g.5gb", 0);
  ASSERT_EQ(plugin_->core().Reconcile().idled, 1);
  CreatePod("broken", {{0, 0, 1, "1g.5gb", 0}}, 1, /*lock=*/false);
  SetAnnotation("broken", protocol::kMigAllocationsAnnotation, "not json");
  Advance(absl::Hours(1));
  auto report = plugin_->core().Reconcile();
  EXPECT_FALSE(report.skipped.empty());
  EXPECT_EQ(report.destroyed, 0);
  EXPECT_EQ(TotalGis(), 1u);
  SetAnnotation("broken", protocol::kMigAllocationsAnnotation, std::nullopt);
  DeletePod("broken");
  EXPECT_EQ(plugin_->core().Reconcile().idle_destroyed, 1);
  EXPECT_EQ(TotalGis(), 0u);
}

// Allocate reuses an idle instance only when NVML still shows it as it was: one whose CI is gone
// is destroyed and created afresh; one a process runs on is refused.
TEST_F(WarmTest, AnIdleInstanceIsVerifiedAgainstNvmlBeforeReuse) {
  StartWarm();
  RunAndDelete("a", 0, "1g.5gb", 0);
  RunAndDelete("b", 0, "1g.5gb", 1);
  plugin_->core().Reconcile();
  ASSERT_EQ(IdleManaged().size(), 2u);
  auto gi0 = GiAt(0, 0);
  auto cis = sim_->ListComputeInstances(0, gi0->id);
  ASSERT_TRUE(cis.ok()) << cis.status();
  const std::vector<nvml::ComputeInstanceInfo> list = *cis;
  for (const auto& ci : list) ASSERT_TRUE(sim_->DestroyComputeInstance(0, gi0->id, ci.id).ok());
  CreatePod("c", {{0, 0, 0, "1g.5gb", 0}});
  auto c = Allocate("c", 0, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Metric("dynmig_deviceplugin_instances_created_total"), 3);
  EXPECT_EQ(Metric("dynmig_deviceplugin_instances_destroyed_total", "reason", "idle_invalid"), 1);
  EXPECT_EQ(Metric("dynmig_deviceplugin_instances_reused_total"), 0);

  const std::string idle_uuid = IdleManaged().at(0).mig_uuid;
  ASSERT_TRUE(sim_->AttachProcess(idle_uuid, 777).ok());
  CreatePod("d", {{0, 0, 0, "1g.5gb", 1}});
  auto d = Allocate("d", 0, 1);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), ::testing::HasSubstr("in use"));
  EXPECT_TRUE(GiAt(0, 1).has_value());
  EXPECT_EQ(TotalGis(), 2u);
}

// A plugin that dies after writing a reused instance's identity into the pod, before saving its
// state: the restart finds the idle instance named by an active pod and gives it to that pod.
TEST_F(WarmTest, ACrashAfterTheReuseAnnotationIsAdoptedOnRestart) {
  std::atomic<bool> crash = false;
  StartWarm(2, true,
            [&](std::string_view point) { return crash && point == kCrashAfterAnnotation; });
  const std::string uuid = RunAndDelete("a", 0, "1g.5gb", 2);
  crash = true;
  ASSERT_EQ(plugin_->core().Reconcile().idled, 1);
  CreatePod("b", {{0, 0, 0, "1g.5gb", 2}});
  auto b = Allocate("b", 0, 1);
  ASSERT_FALSE(b.ok());
  ASSERT_EQ(Allocations("b")[0].runtime->mig_uuid, uuid);
  ASSERT_EQ(IdleManaged().size(), 1u);
  StopPlugin();

  StartWarm();
  auto managed = plugin_->core().Managed();
  ASSERT_EQ(managed.size(), 1u);
  EXPECT_FALSE(managed[0].idle);
  EXPECT_EQ(managed[0].owner.name, "b");
  EXPECT_TRUE(plugin_->core().Idle().empty());
  // b's now: neither the TTL nor a reconcile touches it.
  Advance(absl::Hours(1));
  plugin_->core().Reconcile();
  EXPECT_EQ(TotalGis(), 1u);
}

TEST_F(WarmTest, OffByDefault) {
  StartPlugin();
  RunAndDelete("a", 0, "1g.5gb", 0);
  auto report = plugin_->core().Reconcile();
  EXPECT_EQ(report.idled, 0);
  EXPECT_EQ(report.destroyed, 1);
  EXPECT_EQ(TotalGis(), 0u);
  ASSERT_TRUE(plugin_->core().PublishNode().ok());
  EXPECT_EQ(kube::Annotation(*kube_->GetNode(kNode), protocol::kNodeIdleInstancesAnnotation), "[]");
}

// dynmig_mig_instance_info (metrics.h): one series per live instance naming its pod and container,
// gone once the instance is idle; warm misses count the creates, reused_total the hits.
TEST_F(WarmTest, TheInstanceInfoSeriesFollowsThePodAndWarmHitsAndMissesAreCounted) {
  StartWarm(2, true, {}, /*pod_identity=*/true);
  CreatePod("a", {{0, 0, 0, "1g.5gb", 6}});
  ASSERT_TRUE(Allocate("a", 0, 1).ok());
  const uint32_t gi = GiAt(0, 6)->id;
  const std::string mig_uuid = Allocations("a")[0].runtime->mig_uuid;
  EXPECT_EQ(Metric("dynmig_mig_instance_info", "pod", "a"), 1);
  EXPECT_EQ(Metric("dynmig_mig_instance_info", "mig_uuid", mig_uuid), 1);
  EXPECT_EQ(Metric("dynmig_mig_instance_info", "GPU_I_ID", std::to_string(gi)), 1);
  EXPECT_EQ(Metric("dynmig_deviceplugin_warm_instance_misses_total", "profile", "1g.5gb"), 1);
  const std::string text = plugin_->metrics().Serialize();
  for (const std::string& label : std::vector<std::string>{
           "namespace=\"default\"", "pod=\"a\"", "container=\"c0\"", "node=\"node-a\"",
           "UUID=\"" + GpuUuid(0) + "\"", "gpu_uuid=\"" + GpuUuid(0) + "\"",
           "GPU_I_PROFILE=\"1g.5gb\"", "placement=\"6:1\"", "compute_instance_id=\"0\"",
           "Hostname=\"node-a\"", "gpu=\"0\""}) {
    EXPECT_THAT(text, ::testing::HasSubstr(label));
  }

  // The pod ends: its instance is kept idle, held by no pod: no series (none left stale).
  SetPhase("a", "Running");
  DeletePod("a");
  ASSERT_EQ(plugin_->core().Reconcile().idled, 1);
  EXPECT_EQ(Metric("dynmig_mig_instance_info"), 0);
  EXPECT_THAT(plugin_->metrics().Serialize(),
              ::testing::Not(::testing::HasSubstr("dynmig_mig_instance_info{")));

  // Reused by the next pod: a hit, no new miss, and the series names the new pod.
  CreatePod("b", {{0, 0, 0, "1g.5gb", 6}});
  ASSERT_TRUE(Allocate("b", 0, 1).ok());
  EXPECT_EQ(Metric("dynmig_deviceplugin_instances_reused_total", "profile", "1g.5gb"), 1);
  EXPECT_EQ(Metric("dynmig_deviceplugin_warm_instance_misses_total", "profile", "1g.5gb"), 1);
  EXPECT_EQ(Metric("dynmig_mig_instance_info", "pod", "b"), 1);
  EXPECT_EQ(Metric("dynmig_mig_instance_info", "pod", "a"), 0);
}

TEST_F(WarmTest, WithoutPodIdentityNoSeriesNamesAPodAndWithoutWarmInstancesNoMissIsCounted) {
  StartWarm(2, /*enabled=*/false);
  CreatePod("a", {{0, 0, 0, "1g.5gb", 6}});
  ASSERT_TRUE(Allocate("a", 0, 1).ok());
  const std::string text = plugin_->metrics().Serialize();
  EXPECT_THAT(text, ::testing::Not(::testing::HasSubstr("dynmig_mig_instance_info")));
  EXPECT_THAT(text, ::testing::Not(::testing::HasSubstr("pod=\"a\"")));
  EXPECT_EQ(Metric("dynmig_deviceplugin_warm_instance_misses_total"), 0);
  EXPECT_EQ(Metric("dynmig_deviceplugin_instances_created_total", "profile", "1g.5gb"), 1);
}

}  // namespace
}  // namespace dynmig::deviceplugin::testing
