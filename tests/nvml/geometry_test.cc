// The fixed-geometry applier (nvml/geometry.h) against the simulator; the geometry itself is
// tests/mig/geometry_test.cc.
#include "nvml/geometry.h"

#include <gtest/gtest.h>

#include <set>

#include "nvml/nvml_test_util.h"
#include "nvml/sim_nvml.h"

namespace dynmig::nvml {
namespace {

std::unique_ptr<SimNvml> Sim(const std::string& spec) {
  auto sim = SimNvml::Create(testing::SimOptions(spec));
  EXPECT_TRUE(sim.ok()) << sim.status();
  return sim.ok() ? std::move(*sim) : nullptr;
}

std::vector<std::pair<uint32_t, uint32_t>> Layout(const GeometryResult& r) {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (const auto& i : r.instances) out.emplace_back(i.placement.start, i.placement.size);
  return out;
}

TEST(GeometryApply, All1gOnH100TakesTheDriversObservedSlots) {
  auto sim = Sim("H100 80GBx1");
  ASSERT_OK_AND_ASSIGN(mig::GeometrySpec spec, mig::ParseGeometry("all-1g.10gb"));
  ASSERT_OK_AND_ASSIGN(GeometryResult r, ApplyGeometry(*sim, 0, spec));
  EXPECT_FALSE(r.unchanged);
  EXPECT_EQ(r.orderings_tried, 1u);
  ASSERT_EQ(r.instances.size(), 7u);
  // The driver's auto placement created them at 6,4,5,0,1,2,3: GI 13,11,12,7,8,9,10.
  std::set<uint32_t> gis;
  for (const auto& i : r.instances) {
    EXPECT_EQ(i.profile, "1g.10gb");
    EXPECT_EQ(i.placement.size, 1u);
    EXPECT_EQ(i.mig_uuid.rfind("MIG-", 0), 0u);
    gis.insert(i.gi_id);
  }
  EXPECT_EQ(gis, (std::set<uint32_t>{7, 8, 9, 10, 11, 12, 13}));
  ASSERT_OK_AND_ASSIGN(auto listed, sim->ListGpuInstances(0));
  EXPECT_EQ(listed.size(), 7u);
  for (const auto& gi : listed) {
    ASSERT_OK_AND_ASSIGN(auto cis, sim->ListComputeInstances(0, gi.id));
    EXPECT_EQ(cis.size(), 1u) << "every GI gets its full compute instance";
  }
}

TEST(GeometryApply, MixedH200IsLaidOutLargestFirst) {
  auto sim = Sim("H200x2");
  ASSERT_OK_AND_ASSIGN(mig::GeometrySpec spec, mig::ParseGeometry("1g.18gb=1,2g.35gb=3"));
  ASSERT_OK_AND_ASSIGN(GeometryResult r, ApplyGeometry(*sim, 1, spec));
  EXPECT_EQ(Layout(r),
            (std::vector<std::pair<uint32_t, uint32_t>>{{0, 2}, {2, 2}, {4, 2}, {6, 1}}));
  EXPECT_EQ(r.instances.back().profile, "1g.18gb");
  ASSERT_OK_AND_ASSIGN(auto other, sim->ListGpuInstances(0));
  EXPECT_TRUE(other.empty()) << "only the named GPU changes";
}

TEST(GeometryApply, TriesOrderingsAsMigPartedDoes) {
  // The User Guide's A100 example: 1g,1g,2g,3g in this order fails (the 1g land at 6 and 4);
  // mig-parted's largest-first ordering puts the 3g at 4:4 first and everything fits.
  auto sim = Sim("A100-SXM4-40GBx1");
  ASSERT_OK_AND_ASSIGN(mig::GeometrySpec spec, mig::ParseGeometry("1g.5gb=2,2g.10gb=1,3g.20gb=1"));
  ASSERT_OK_AND_ASSIGN(GeometryResult r, ApplyGeometry(*sim, 0, spec));
  EXPECT_EQ(Layout(r),
            (std::vector<std::pair<uint32_t, uint32_t>>{{0, 2}, {2, 1}, {3, 1}, {4, 4}}));
  EXPECT_EQ(r.orderings_tried, 1u);
  // The 3g.20gb + 4g.20gb pair fits only one way: the 4g (more compute) first, at 0:4.
  auto sim2 = Sim("A100-SXM4-40GBx1");
  ASSERT_OK_AND_ASSIGN(GeometryResult r2,
                       ApplyGeometry(*sim2, 0, *mig::ParseGeometry("3g.20gb=1,4g.20gb=1")));
  EXPECT_EQ(Layout(r2), (std::vector<std::pair<uint32_t, uint32_t>>{{0, 4}, {4, 4}}));
}

TEST(GeometryApply, ApplyingTwiceChangesNothing) {
  auto sim = Sim("H200x1");
  ASSERT_OK_AND_ASSIGN(mig::GeometrySpec spec, mig::ParseGeometry("3g.71gb=2"));
  ASSERT_OK_AND_ASSIGN(GeometryResult first, ApplyGeometry(*sim, 0, spec));
  ASSERT_OK_AND_ASSIGN(GeometryResult again, ApplyGeometry(*sim, 0, spec));
  EXPECT_TRUE(again.unchanged);
  ASSERT_EQ(again.instances.size(), 2u);
  EXPECT_EQ(again.instances[0].mig_uuid, first.instances[0].mig_uuid);
  EXPECT_EQ(again.instances[1].mig_uuid, first.instances[1].mig_uuid);
}

TEST(GeometryApply, RefusesAGpuWithOtherInstancesAndTouchesNothing) {
  auto sim = Sim("H200x1");
  ASSERT_OK_AND_ASSIGN(auto gi, sim->CreateGpuInstance(0, 19, {3, 1}));  // 1g.18gb by hand
  auto r = ApplyGeometry(*sim, 0, *mig::ParseGeometry("all-1g.18gb"));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("GPU 0 already has GPU instances"), std::string_view::npos);
  EXPECT_NE(r.status().message().find("1g.18gb (GI"), std::string_view::npos) << r.status();
  // Same profile and count but the GI has no compute instance: not "exactly" the geometry.
  auto one = ApplyGeometry(*sim, 0, *mig::ParseGeometry("1g.18gb=1"));
  ASSERT_EQ(one.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(one.status().message().find("0 compute instances"), std::string_view::npos);
  ASSERT_OK_AND_ASSIGN(auto listed, sim->ListGpuInstances(0));
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].id, gi.id);
}

TEST(GeometryApply, ErrorsNameTheGpuAndProfile) {
  auto sim = Sim("A100-SXM4-40GBx1");
  auto unknown = ApplyGeometry(*sim, 0, *mig::ParseGeometry("1g.18gb=1"));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("GPU 0 has no MIG profile 1g.18gb; it has 1g.5gb"),
            std::string_view::npos)
      << unknown.status();
  auto too_many = ApplyGeometry(*sim, 0, *mig::ParseGeometry("3g.20gb=3"));
  EXPECT_NE(too_many.status().message().find("3 x 3g.20gb asked, the profile allows 2"),
            std::string_view::npos)
      << too_many.status();
  auto no_fit = ApplyGeometry(*sim, 0, *mig::ParseGeometry("4g.20gb=1,7g.40gb=1"));
  EXPECT_EQ(no_fit.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(no_fit.status().message().find("does not fit in any of 2 orderings"),
            std::string_view::npos)
      << no_fit.status();
  ASSERT_OK_AND_ASSIGN(auto listed, sim->ListGpuInstances(0));
  EXPECT_TRUE(listed.empty());
}

TEST(GeometryApply, ANvmlFailureMidwayLeavesNothingBehind) {
  auto sim = Sim("H100 80GBx1");
  ASSERT_OK(sim->InjectFault(
      testing::Fault("CreateComputeInstance", 3, NvmlReturn::kInsufficientResources)));
  auto r = ApplyGeometry(*sim, 0, *mig::ParseGeometry("all-2g.20gb"));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(testing::IsNvmlError(r, NvmlReturn::kInsufficientResources));
  EXPECT_NE(r.status().message().find("GPU 0: cannot create 2g.20gb at"), std::string_view::npos)
      << r.status();
  ASSERT_OK_AND_ASSIGN(auto listed, sim->ListGpuInstances(0));
  EXPECT_TRUE(listed.empty()) << "the two instances made before the failure are destroyed";
}

TEST(GeometryApply, MigDisabledIsRefused) {
  auto sim = Sim("H100 80GBx1");
  ASSERT_OK(sim->SetMigMode(0, false));
  auto r = ApplyGeometry(*sim, 0, *mig::ParseGeometry("all-1g.10gb"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("MIG mode is not enabled"), std::string_view::npos);
}

}  // namespace
}  // namespace dynmig::nvml
