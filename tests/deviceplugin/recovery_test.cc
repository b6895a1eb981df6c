// Restarts, crashes, unreadable annotations and an unavailable API: nothing a running pod owns is
// ever destroyed, nothing is lost.
#include <filesystem>
#include <fstream>

#include "dp_test_util.h"

namespace dynmig::deviceplugin::testing {
namespace {

class RecoveryTest : public PluginTest {
 protected:
  // p1: 1g at slice 0 of GPU 0, running, with a process attached.
  std::string RunningPodWithProcess(const std::string& name = "p1", uint32_t start = 0) {
    CreatePod(name, {{0, 0, 0, "1g.5gb", start}});
    auto a = Allocate(name, 0, 1);
    EXPECT_TRUE(a.ok()) << a.status();
    SetPhase(name, "Running");
    const std::string uuid = Allocations(name)[0].runtime->mig_uuid;
    EXPECT_TRUE(sim_->AttachProcess(uuid, 1000 + start).ok());
    return uuid;
  }
  void AddApiFault(const std::string& method, const std::string& prefix, int status = 503,
                   int count = -1) {
    kube::FaultSpec f;
    f.method = method;
    f.path_prefix = prefix;
    f.status = status;
    f.count = count;
    api_->AddFault(f);
  }
};

TEST_F(RecoveryTest, RestartWhileAProcessRunsKeepsAndAdoptsTheInstance) {
  StartPlugin();
  const std::string uuid = RunningPodWithProcess();
  const auto gi = *GiAt(0, 0);
  StopPlugin();

  // Same state file: still managed, nothing destroyed, same UUID.
  StartPlugin();
  EXPECT_EQ(TotalGis(), 1u);
  EXPECT_EQ(GiAt(0, 0)->id, gi.id);
  auto managed = plugin_->core().Managed();
  ASSERT_EQ(managed.size(), 1u);
  EXPECT_EQ(managed[0].mig_uuid, uuid);
  EXPECT_EQ(managed[0].owner.name, "p1");
  StopPlugin();

  // State file lost: the instance is verified against the annotation and adopted.
  std::filesystem::remove_all(dir_.path() + "/state");
  StartPlugin();
  EXPECT_EQ(TotalGis(), 1u);
  managed = plugin_->core().Managed();
  ASSERT_EQ(managed.size(), 1u);
  EXPECT_EQ(managed[0].mig_uuid, uuid);
  EXPECT_EQ(managed[0].origin, "adopted");
  EXPECT_EQ(managed[0].gpu_instance_id, gi.id);
  EXPECT_TRUE(HasEvent(kReasonAdopted, uuid));
  EXPECT_EQ(plugin_->metrics().Value("dynmig_deviceplugin_instances_adopted_total", "origin",
                                     "annotation"),
            1);
  EXPECT_EQ(Allocations("p1")[0].runtime->mig_uuid, uuid);

  // It is still reclaimed normally once the pod is gone and its process ended.
  ASSERT_TRUE(sim_->DetachProcess(uuid, 1000).ok());
  DeletePod("p1");
  EXPECT_EQ(plugin_->core().Reconcile().destroyed, 1);
  EXPECT_EQ(TotalGis(), 0u);
}

// A pod deleted just after a restart: the reconcile that reclaims its adopted instance must not
// then report the instance as gone (issue: spurious "MigAdoptionFailed ... no longer exists").
TEST_F(RecoveryTest, APodDeletedJustAfterARestartIsReclaimedWithoutAnAdoptionWarning) {
  StartPlugin();
  CreatePod("p1", {{0, 0, 0, "1g.5gb", 0}});
  ASSERT_TRUE(Allocate("p1", 0, 1).ok());
  SetPhase("p1", "Running");
  const std::string uuid = Allocations("p1")[0].runtime->mig_uuid;
  StopPlugin();
  std::filesystem::remove_all(dir_.path() + "/state");  // adopted from the annotation
  StartPlugin();
  ASSERT_EQ(plugin_->core().Managed().size(), 1u);
  ASSERT_TRUE(HasEvent(kReasonAdopted, uuid));

  DeletePod("p1", /*grace=*/30);  // terminating: still listed with a deletionTimestamp
  ASSERT_TRUE(kube::IsBeingDeleted(GetPod("p1")));
  EXPECT_EQ(plugin_->core().Reconcile().destroyed, 1);
  EXPECT_EQ(TotalGis(), 0u);
  // Still listed in the next cycles: its instance is gone because it was reclaimed.
  EXPECT_EQ(plugin_->core().Reconcile().destroyed, 0);
  plugin_->events().Flush(absl::Seconds(5));
  EXPECT_TRUE(HasEvent(kReasonDestroyed, uuid));
  EXPECT_FALSE(HasEvent(kReasonAdoptionFailed)) << "spurious adoption warning";
  EXPECT_EQ(plugin_->metrics().Value("dynmig_deviceplugin_adoption_failures_total"), 0);
  EXPECT_TRUE(plugin_->core().Quarantined().empty());
}

// The same warning is still given for a running pod whose instance vanished behind our back.
TEST_F(RecoveryTest, AnActivePodsVanishedInstanceIsReported) {
  StartPlugin();
  CreatePod("p1", {{0, 0, 0, "1g.5gb", 0}});
  ASSERT_TRUE(Allocate("p1", 0, 1).ok());
  SetPhase("p1", "Running");
  const auto gi = *GiAt(0, 0);
  StopPlugin();
  std::filesystem::remove_all(dir_.path() + "/state");
  auto cis = sim_->ListComputeInstances(0, gi.id);
  ASSERT_TRUE(cis.ok());
  for (const auto& ci : *cis) ASSERT_TRUE(sim_->DestroyComputeInstance(0, gi.id, ci.id).ok());
  ASSERT_TRUE(sim_->DestroyGpuInstance(0, gi.id).ok());
  StartPlugin();
  plugin_->events().Flush(absl::Seconds(5));
  EXPECT_TRUE(HasEvent(kReasonAdoptionFailed, "no longer exists"));
}

TEST_F(RecoveryTest, StartupCleansIdleGpusAndKeepsBusyOnes) {
  // Leftovers from before: an idle GPU 1 with two instances; busy GPU 0 (a pod's instance plus an
  // instance nobody describes).
  StartPlugin();
  const std::string uuid = RunningPodWithProcess();
  StopPlugin();
  std::filesystem::remove_all(dir_.path() + "/state");
  CreateRaw(1, "3g.20gb", 4);
  CreateRaw(1, "1g.5gb", 0);
  CreateRaw(0, "2g.10gb", 2);  // untracked, on the busy GPU

  StartPlugin();
  EXPECT_TRUE(Gis(1).empty());
  EXPECT_TRUE(HasEvent(kReasonGpuCleaned, GpuUuid(1)));
  EXPECT_EQ(Gis(0).size(), 2u);
  EXPECT_TRUE(GiAt(0, 2).has_value());
  EXPECT_TRUE(HasEvent(kReasonUntracked, "GPU " + GpuUuid(0)));
  EXPECT_EQ(plugin_->metrics().Value("dynmig_deviceplugin_untracked_instances"), 1);
  EXPECT_EQ(plugin_->metrics().Value("dynmig_deviceplugin_instances_destroyed_total", "reason",
                                     "startup_cleanup"),
            2);
  // The untracked one stays through reconciliation while the GPU is busy.
  EXPECT_EQ(plugin_->core().Reconcile().destroyed, 0);
  EXPECT_TRUE(GiAt(0, 2).has_value());
  ASSERT_EQ(plugin_->core().Managed().size(), 1u);
  EXPECT_EQ(plugin_->core().Managed()[0].mig_uuid, uuid);
  // Its slices are held (the scheduler must not reserve them), the pod's own are not.
  auto held = plugin_->core().Held();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].gpu_uuid, GpuUuid(0));
  EXPECT_EQ(held[0].placement, (mig::Placement{2, 2}));
  EXPECT_NE(held[0].reason.find("untracked"), std::string::npos) << held[0].reason;

  // Once the GPU is idle (pod gone, no process), the untracked instance is cleaned too.
  ASSERT_TRUE(sim_->DetachProcess(uuid, 1000).ok());
  DeletePod("p1");
  auto report = plugin_->core().Reconcile();
  EXPECT_EQ(report.destroyed, 2);
  EXPECT_EQ(TotalGis(), 0u);
  EXPECT_TRUE(plugin_->core().Held().empty());
}

TEST_F(RecoveryTest, PartialRuntimeIdentityDestroysNothingAndIsReported) {
  StartPlugin();
  const std::string uuid = RunningPodWithProcess("p1", 0);
  CreatePod("p2", {{0, 0, 1, "1g.5gb", 0}});
  ASSERT_TRUE(Allocate("p2", 0, 1).ok());
  SetPhase("p2", "Running");
  // p1's annotation loses its computeInstanceID (partial runtime identity).
  std::string value = PodAnnotation("p1", protocol::kMigAllocationsAnnotation);
  const size_t pos = value.find(",\"computeInstanceID\"");
  ASSERT_NE(pos, std::string::npos);
  value = value.substr(0, pos) + "}]";
  SetAnnotation("p1", protocol::kMigAllocationsAnnotation, value);
  // p2 finished: normally reclaimable, but not in a cycle that cannot read p1.
  DeletePod("p2");
  auto report = plugin_->core().Reconcile();
  EXPECT_NE(report.skipped.find("partial runtime identity"), std::string::npos) << report.skipped;
  EXPECT_EQ(report.destroyed, 0);
  EXPECT_EQ(TotalGis(), 2u);
  EXPECT_TRUE(HasEvent(kReasonReconcileSkipped, "default/p1"));
  EXPECT_GE(plugin_->metrics().Value("dynmig_deviceplugin_reconcile_cycles_total", "result",
                                     "skipped_decode"),
            1);

  // A restart that lost its state: nothing is destroyed either (GPU 0 busy by process and pod,
  // GPU 1 has no reference but p1's GPUs are read leniently), and p1 is reported.
  StopPlugin();
  std::filesystem::remove_all(dir_.path() + "/state");
  StartPlugin();
  EXPECT_EQ(TotalGis(), 2u);
  EXPECT_TRUE(GiAt(0, 0).has_value());
  EXPECT_TRUE(HasEvent(kReasonReconcileSkipped, "partial runtime identity"));
  EXPECT_EQ(plugin_->core().Reconcile().destroyed, 0);

  // Repaired annotation: adopted; p2's orphan is then cleaned as the GPU is idle.
  SetAnnotation(
      "p1", protocol::kMigAllocationsAnnotation,
      fmt::format(
          R"J([{{"containerIndex":0,"deviceIndex":0,"gpuUUID":"{}","profile":"1g.5gb","placement":{{"start":0,"size":1}},"migUUID":"{}","gpuInstanceID":{},"computeInstanceID":0}}])J",
          GpuUuid(0), uuid, GiAt(0, 0)->id));
  auto repaired = plugin_->core().Reconcile();
  EXPECT_TRUE(repaired.skipped.empty()) << repaired.skipped;
  EXPECT_EQ(repaired.adopted, 1);
  EXPECT_EQ(repaired.destroyed, 1);
  EXPECT_TRUE(GiAt(0, 0).has_value());
  EXPECT_FALSE(GiAt(1, 0).has_value());
}

TEST_F(RecoveryTest, MissingAnnotationKeepsTheSlicesOutOfUseAndReportsThePod) {
  StartPlugin();
  RunningPodWithProcess("p1", 0);
  StopPlugin();
  std::filesystem::remove_all(dir_.path() + "/state");
  SetAnnotation("p1", protocol::kMigAllocationsAnnotation, std::nullopt);
  StartPlugin();
  EXPECT_EQ(TotalGis(), 1u);
  EXPECT_TRUE(HasEvent(kReasonReconcileSkipped, "hami.io/vgpu-mig-allocations is missing"));
  EXPECT_TRUE(plugin_->core().Managed().empty());
  EXPECT_EQ(plugin_->core().Reconcile().destroyed, 0);
  EXPECT_EQ(TotalGis(), 1u);
}

TEST_F(RecoveryTest, AllocationWithoutRuntimeIdentityIsReportedAndQuarantined) {
  StartPlugin();
  RunningPodWithProcess("p1", 0);
  RunningPodWithProcess("p2", 1);
  StopPlugin();
  std::filesystem::remove_all(dir_.path() + "/state");
  // p1's runtime fields are gone (but its container was allocated): not verifiable.
  auto allocations = Allocations("p1");
  allocations[0].runtime.reset();
  SetAnnotation("p1", protocol::kMigAllocationsAnnotation,
                protocol::EncodeMigAllocations(allocations));
  StartPlugin();
  // Adoption went on with p2 (HAMi would have stopped at p1).
  auto managed = plugin_->core().Managed();
  ASSERT_EQ(managed.size(), 1u);
  EXPECT_EQ(managed[0].owner.name, "p2");
  auto quarantined = plugin_->core().Quarantined();
  ASSERT_EQ(quarantined.size(), 1u);
  EXPECT_EQ(quarantined[0].pod, "default/p1");
  EXPECT_TRUE(HasEvent(kReasonAdoptionFailed, "no runtime identity"));
  EXPECT_GE(plugin_->metrics().Value("dynmig_deviceplugin_adoption_failures_total"), 1);
  EXPECT_EQ(plugin_->metrics().Value("dynmig_deviceplugin_unverified_allocations"), 1);
  EXPECT_EQ(TotalGis(), 2u);

  // A new pod reserved on p1's slice is refused; nothing overlapping is created.
  CreatePod("p3", {{0, 0, 0, "1g.5gb", 0}});
  auto a = Allocate("p3", 0, 1);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("kept out of use for pod default/p1"), std::string::npos)
      << a.status();
  EXPECT_EQ(TotalGis(), 2u);
}

TEST_F(RecoveryTest, AnAnnotationThatDisagreesWithNvmlIsNotAdopted) {
  StartPlugin();
  RunningPodWithProcess("p1", 0);
  StopPlugin();
  std::filesystem::remove_all(dir_.path() + "/state");
  auto allocations = Allocations("p1");
  allocations[0].runtime->mig_uuid = "MIG-00000000-0000-5000-8000-000000000000";
  SetAnnotation("p1", protocol::kMigAllocationsAnnotation,
                protocol::EncodeMigAllocations(allocations));
  StartPlugin();
  EXPECT_TRUE(plugin_->core().Managed().empty());
  EXPECT_TRUE(HasEvent(kReasonAdoptionFailed, "MIG UUID"));
  EXPECT_EQ(plugin_->core().Reconcile().destroyed, 0);
  EXPECT_EQ(TotalGis(), 1u);
}

TEST_F(RecoveryTest, AnUnavailableApiDestroysNothing) {
  StartPlugin();
  RunningPodWithProcess("p1", 0);
  CreatePod("p2", {{0, 0, 0, "1g.5gb", 1}});
  ASSERT_TRUE(Allocate("p2", 0, 1).ok());
  DeletePod("p2");
  AddApiFault("GET", "/api/v1/pods");
  auto report = plugin_->core().Reconcile();
  EXPECT_FALSE(report.listed);
  EXPECT_NE(report.skipped.find("cannot list the pods of node node-a"), std::string::npos)
      << report.skipped;
  EXPECT_EQ(TotalGis(), 2u);
  EXPECT_GE(plugin_->metrics().Value("dynmig_deviceplugin_reconcile_cycles_total", "result",
                                     "skipped_list"),
            1);
  // Allocate cannot run either, and creates nothing.
  CreatePod("p3", {{0, 0, 1, "1g.5gb", 0}});
  auto a = Allocate("p3", 0, 1);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Gis(1).empty());

  api_->ClearFaults();
  EXPECT_EQ(plugin_->core().Reconcile().destroyed, 1);
  EXPECT_EQ(TotalGis(), 1u);
}

TEST_F(RecoveryTest, AStartWithoutTheApiDefersRecoveryAndDestroysNothing) {
  CreateRaw(1, "7g.40gb", 0);  // leftover on an idle GPU
  AddApiFault("GET", "/api/v1/pods");
  StartPlugin();
  EXPECT_TRUE(plugin_->core().recovery_pending());
  EXPECT_EQ(plugin_->metrics().Value("dynmig_deviceplugin_recovery_pending"), 1);
  EXPECT_EQ(TotalGis(), 1u);
  EXPECT_EQ(plugin_->core().Reconcile().destroyed, 0);
  EXPECT_EQ(TotalGis(), 1u);

  api_->ClearFaults();
  plugin_->core().Reconcile();
  EXPECT_FALSE(plugin_->core().recovery_pending());
  EXPECT_EQ(TotalGis(), 0u);
  EXPECT_TRUE(HasEvent(kReasonGpuCleaned));
}

TEST_F(RecoveryTest, ACrashBetweenCreationAndTheAnnotationIsCompletedOnTheNextStart) {
  StartPlugin([](DevicePluginOptions& o) {
    o.core.crash_point = [](std::string_view p) { return p == kCrashBeforeRollback; };
  });
  CreatePod("p", {{0, 0, 0, "2g.10gb", 4}});
  AddApiFault("PATCH", "/api/v1/namespaces/default/pods/p", 500);
  auto a = Allocate("p", 0, 1);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kAborted);
  const auto gi = GiAt(0, 4);
  ASSERT_TRUE(gi.has_value());
  ASSERT_EQ(plugin_->core().OpenIntents().size(), 1u);
  EXPECT_FALSE(Allocations("p")[0].runtime.has_value());
  StopPlugin();
  api_->ClearFaults();

  StartPlugin();  // a fresh plugin on the same state file
  EXPECT_TRUE(plugin_->core().OpenIntents().empty());
  EXPECT_EQ(GiAt(0, 4)->id, gi->id);
  auto allocations = Allocations("p");
  ASSERT_TRUE(allocations[0].runtime.has_value());
  EXPECT_EQ(allocations[0].runtime->gpu_instance_id, gi->id);
  auto cis = sim_->ListComputeInstances(0, gi->id);
  EXPECT_EQ(allocations[0].runtime->mig_uuid, cis->front().mig_uuid);
  auto managed = plugin_->core().Managed();
  ASSERT_EQ(managed.size(), 1u);
  EXPECT_EQ(managed[0].origin, "completed");
  EXPECT_EQ(
      plugin_->metrics().Value("dynmig_deviceplugin_instances_adopted_total", "origin", "intent"),
      1);
}

TEST_F(RecoveryTest, ACrashedAllocateOfADeletedPodIsDestroyedOnTheNextStart) {
  StartPlugin([](DevicePluginOptions& o) {
    o.core.crash_point = [](std::string_view p) { return p == kCrashBeforeRollback; };
  });
  RunningPodWithProcess("keep", 0);  // another pod's instance on the same GPU must survive
  CreatePod("p", {{0, 0, 0, "3g.20gb", 4}});
  AddApiFault("PATCH", "/api/v1/namespaces/default/pods/p", 500);
  ASSERT_FALSE(Allocate("p", 0, 1).ok());
  ASSERT_TRUE(GiAt(0, 4).has_value());
  StopPlugin();
  api_->ClearFaults();
  DeletePod("p");

  StartPlugin();
  EXPECT_TRUE(plugin_->core().OpenIntents().empty());
  EXPECT_FALSE(GiAt(0, 4).has_value());
  EXPECT_TRUE(GiAt(0, 0).has_value());
  EXPECT_EQ(
      plugin_->metrics().Value("dynmig_deviceplugin_instances_destroyed_total", "reason", "intent"),
      1);
}

TEST_F(RecoveryTest, ACrashAfterTheGpuInstanceIsCompletedWithItsComputeInstance) {
  StartPlugin([](DevicePluginOptions& o) {
    o.core.crash_point = [](std::string_view p) { return p == kCrashAfterGpuInstance; };
  });
  CreatePod("p", {{0, 0, 1, "1g.5gb", 6}});
  ASSERT_FALSE(Allocate("p", 0, 1).ok());
  const auto gi = GiAt(1, 6);
  ASSERT_TRUE(gi.has_value());
  EXPECT_TRUE(sim_->ListComputeInstances(1, gi->id)->empty());
  StopPlugin();

  StartPlugin();
  auto cis = sim_->ListComputeInstances(1, gi->id);
  ASSERT_EQ(cis->size(), 1u);
  auto allocations = Allocations("p");
  ASSERT_TRUE(allocations[0].runtime.has_value());
  EXPECT_EQ(allocations[0].runtime->mig_uuid, cis->front().mig_uuid);
  EXPECT_TRUE(plugin_->core().OpenIntents().empty());
}

TEST_F(RecoveryTest, ACorruptStateFileIsMovedAsideAndRecoveredFromTheAnnotations) {
  StartPlugin();
  const std::string uuid = RunningPodWithProcess();
  StopPlugin();
  {
    std::ofstream out(dir_.path() + "/state/state.json");
    out << "{not json";
  }
  StartPlugin();
  auto managed = plugin_->core().Managed();
  ASSERT_EQ(managed.size(), 1u);
  EXPECT_EQ(managed[0].mig_uuid, uuid);
  bool moved = false;
  for (const auto& e : std::filesystem::directory_iterator(dir_.path() + "/state")) {
    moved = moved || e.path().filename().string().starts_with("state.json.corrupt-");
  }
  EXPECT_TRUE(moved);
}

}  // namespace
}  // namespace dynmig::deviceplugin::testing
