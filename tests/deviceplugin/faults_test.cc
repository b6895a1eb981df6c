// A failure at each step of Allocate: nothing leaked, nothing overlapping, the pod marked failed.
#include "dp_test_util.h"

namespace dynmig::deviceplugin::testing {
namespace {

struct StepFault {
  std::string op;
  uint32_t nth;  // which call fails: 2 = the second device of the container
};

void PrintTo(const StepFault& f, std::ostream* os) { *os << f.op << " call " << f.nth; }

class NvmlFaultTest : public PluginTest, public ::testing::WithParamInterface<StepFault> {};

TEST_P(NvmlFaultTest, RollsBackEverythingThisCallCreated) {
  StartPlugin();
  // Another pod's instance on the same GPU must survive the rollback.
  CreatePod("other", {{0, 0, 0, "1g.5gb", 6}});
  ASSERT_TRUE(Allocate("other", 0, 1).ok());
  SetPhase("other", "Running");

  CreatePod("p", {{0, 0, 0, "1g.5gb", 0}, {0, 1, 0, "2g.10gb", 2}, {0, 2, 0, "1g.5gb", 4}});
  nvml::SimFault fault;
  fault.op = GetParam().op;
  fault.nth = GetParam().nth;
  fault.code = nvml::NvmlReturn::kUnknown;
  DP_ASSERT_OK(sim_->InjectFault(fault));
  auto a = Allocate("p", 0, 3);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("injected fault"), std::string::npos) << a.status();
  EXPECT_NE(a.status().message().find("pod default/p container 0"), std::string::npos)
      << a.status();

  // Only the other pod's instance is left; no intent stays open; the pod is failed.
  EXPECT_EQ(TotalGis(), 1u);
  EXPECT_TRUE(GiAt(0, 6).has_value());
  EXPECT_TRUE(plugin_->core().OpenIntents().empty());
  EXPECT_EQ(plugin_->core().Managed().size(), 1u);
  EXPECT_EQ(PodAnnotation("p", protocol::kBindPhaseAnnotation), "failed");
  EXPECT_FALSE(NodeLock().has_value());
  for (const auto& alloc : Allocations("p")) EXPECT_FALSE(alloc.runtime.has_value());
  EXPECT_TRUE(HasEvent(kReasonFailed, "injected fault"));
  EXPECT_EQ(plugin_->metrics().Value("dynmig_deviceplugin_allocations_total", "result", "failed"),
            1);
  EXPECT_GE(plugin_->metrics().Value("dynmig_deviceplugin_instances_destroyed_total", "reason",
                                     "rollback"),
            GetParam().nth - 1);

  // The placements are free again: a new pod gets exactly them.
  DP_ASSERT_OK(sim_->ClearFaults());
  CreatePod("q", {{0, 0, 0, "1g.5gb", 0}, {0, 1, 0, "2g.10gb", 2}, {0, 2, 0, "1g.5gb", 4}});
  auto b = Allocate("q", 0, 3);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(TotalGis(), 4u);
}

INSTANTIATE_TEST_SUITE_P(
    EachStep, NvmlFaultTest,
    ::testing::Values(StepFault{"CreateGpuInstance", 1}, StepFault{"CreateGpuInstance", 3},
                      StepFault{"CreateComputeInstance", 1}, StepFault{"CreateComputeInstance", 2},
                      StepFault{"GetMigDeviceUuid", 1}, StepFault{"GetMigDeviceUuid", 3}),
    [](const ::testing::TestParamInfo<StepFault>& param_info) {
      return param_info.param.op + "_" + std::to_string(param_info.param.nth);
    });

class AnnotationFaultTest : public PluginTest {};

TEST_F(AnnotationFaultTest, AFailedAnnotationWriteRollsBackTheInstances) {
  StartPlugin();
  CreatePod("p", {{0, 0, 1, "3g.20gb", 0}, {0, 1, 1, "3g.20gb", 4}});
  // Every optimistic-concurrency attempt conflicts.
  kube::FaultSpec f;
  f.method = "PATCH";
  f.path_prefix = "/api/v1/namespaces/default/pods/p";
  f.status = 409;
  f.count = plugin_->core().options().annotation_attempts;
  api_->AddFault(f);
  auto a = Allocate("p", 0, 2);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(a.status().message().find("still conflicted after 5 attempts"), std::string::npos)
      << a.status();
  EXPECT_EQ(TotalGis(), 0u);
  EXPECT_TRUE(plugin_->core().OpenIntents().empty());
  EXPECT_TRUE(plugin_->core().Managed().empty());
  EXPECT_EQ(PodAnnotation("p", protocol::kBindPhaseAnnotation), "failed");
  EXPECT_EQ(plugin_->metrics().Value("dynmig_deviceplugin_instances_destroyed_total", "reason",
                                     "rollback"),
            2);
}

TEST_F(AnnotationFaultTest, AConflictIsRetriedOnAFreshReadWithoutTouchingOtherEntries) {
  StartPlugin();
  CreatePod("p", {{0, 0, 0, "1g.5gb", 1}, {1, 0, 0, "1g.5gb", 2}}, 2);
  // One conflict: a concurrent writer. The plugin re-reads and succeeds.
  kube::FaultSpec f;
  f.method = "PATCH";
  f.path_prefix = "/api/v1/namespaces/default/pods/p";
  f.status = 409;
  f.count = 1;
  api_->AddFault(f);
  auto a = Allocate("p", 0, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  auto allocations = Allocations("p");
  ASSERT_EQ(allocations.size(), 2u);
  EXPECT_TRUE(allocations[0].runtime.has_value());
  EXPECT_FALSE(allocations[1].runtime.has_value());  // container 1 not allocated yet
  EXPECT_EQ(PodAnnotation("p", protocol::kBindPhaseAnnotation), "allocating");
  ASSERT_TRUE(Allocate("p", 1, 1).ok());
  EXPECT_EQ(PodAnnotation("p", protocol::kBindPhaseAnnotation), "success");
}

TEST_F(AnnotationFaultTest, AReservationChangedMeanwhileIsNotOverwritten) {
  // While Allocate creates the instance, someone moves the reservation to slice 2: the write
  // conflicts, the fresh read shows the change, and the instance is rolled back.
  StartPlugin([this](DevicePluginOptions& o) {
    o.core.crash_point = [this](std::string_view point) {
      if (point == kCrashAfterComputeInstance) {
        auto moved = Allocations("p");
        moved[0].placement.start = 2;
        SetAnnotation("p", protocol::kMigAllocationsAnnotation,
                      protocol::EncodeMigAllocations(moved));
      }
      return false;
    };
  });
  CreatePod("p", {{0, 0, 0, "1g.5gb", 1}});
  auto a = Allocate("p", 0, 1);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(a.status().message().find("changed while it was realized"), std::string::npos)
      << a.status();
  EXPECT_EQ(TotalGis(), 0u);
  auto allocations = Allocations("p");
  EXPECT_FALSE(allocations[0].runtime.has_value());
  EXPECT_EQ(allocations[0].placement.start, 2u);
}

}  // namespace
}  // namespace dynmig::deviceplugin::testing
