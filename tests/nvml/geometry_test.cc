// The fixed-geometry applier (nvml/geometry.h) against the simulator.
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

TEST(GeometryParse, AllAndCounts) {
  ASSERT_OK_AND_ASSIGN(GeometrySpec all, ParseGeometry("all-1g.18gb"));
  EXPECT_EQ(all.all_of, "1g.18gb");
  EXPECT_TRUE(all.counts.empty());
  EXPECT_EQ(all.ToString(), "all-1g.18gb");
  ASSERT_OK_AND_ASSIGN(GeometrySpec mixed, ParseGeometry("1g.18gb=1,2g.35gb=3"));
  ASSERT_EQ(mixed.counts.size(), 2u);
  EXPECT_EQ(mixed.counts[1], (std::pair<std::string, uint32_t>{"2g.35gb", 3}));
  EXPECT_EQ(mixed.ToString(), "1g.18gb=1,2g.35gb=3");
}

TEST(GeometryParse, HostileTextIsRefusedWithTheReason) {
  struct Case {
    std::string text;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {"", "empty"},
           {std::string(600, 'x'), "at most 512"},
           {"1g.18gb=1,", "is not <profile>=<count>"},
           {",1g.18gb=1", "is not <profile>=<count>"},
           {"1g.18gb", "is not <profile>=<count>"},
           {"1g.18gb=0", "count 0 is not 1..8"},
           {"1g.18gb=9", "count 9 is not 1..8"},
           {"1g.18gb=-1", "is not a number"},
           {"1g.18gb=4294967297", "is not a number"},
           {"1g.18gb=1x", "is not a number"},
           {"1g.18gb=1,1g.18gb=2", "named twice"},
           {"1g.18gb=5,2g.35gb=4", "9 instances"},
           {"bogus=1", "is not a profile name"},
           {"all-", "is not a profile name"},
           {"all-../../etc", "is not a profile name"},
       }) {
    auto spec = ParseGeometry(c.text);
    ASSERT_FALSE(spec.ok()) << c.text;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(spec.status().message().find(c.says), std::string_view::npos)
        << c.text.substr(0, 40) << ": " << spec.status();
  }
}

TEST(GeometryLegacy, HamiTemplatesBecomeCounts) {
  std::vector<mig::LegacyGeometryEntry> entries = {
      {{"A30"}, {{{"1g.6gb", 25, 6144, 4}}}},
      {{"A100-SXM4-40GB", "A100-PCIE-40GB"},
       {{{"1g.5gb", 14, 5120, 7}},
        {{"1g.5gb", 14, 5120, 1}, {"2g.10gb", 28, 10240, 3}},
        {{"3g.20gb", 42, 20480, 2}}}}};
  ASSERT_OK_AND_ASSIGN(GeometrySpec spec,
                       SelectLegacyGeometry(entries, "NVIDIA A100-SXM4-40GB", 1));
  EXPECT_EQ(spec.ToString(), "1g.5gb=1,2g.10gb=3");
  auto missing = SelectLegacyGeometry(entries, "NVIDIA H100 80GB HBM3", 0);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("H100 80GB HBM3"), std::string_view::npos);
  auto beyond = SelectLegacyGeometry(entries, "NVIDIA A100-SXM4-40GB", 3);
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kInvalidArgument);
  // A template with count 0 or a bad name is refused, naming it.
  auto zero = GeometryFromLegacy({{"1g.5gb", 14, 5120, 0}});
  EXPECT_NE(zero.status().message().find("legacy template 0 (1g.5gb)"), std::string_view::npos)
      << zero.status();
  EXPECT_FALSE(GeometryFromLegacy({}).ok());
  EXPECT_FALSE(GeometryFromLegacy({{"7g.40gb\n", 100, 40960, 1}}).ok());
}

TEST(GeometryApply, All1gOnH100TakesTheDriversObservedSlots) {
  auto sim = Sim("H100 80GBx1");
  ASSERT_OK_AND_ASSIGN(GeometrySpec spec, ParseGeometry("all-1g.10gb"));
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
  ASSERT_OK_AND_ASSIGN(GeometrySpec spec, ParseGeometry("1g.18gb=1,2g.35gb=3"));
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
  ASSERT_OK_AND_ASSIGN(GeometrySpec spec, ParseGeometry("1g.5gb=2,2g.10gb=1,3g.20gb=1"));
  ASSERT_OK_AND_ASSIGN(GeometryResult r, ApplyGeometry(*sim, 0, spec));
  EXPECT_EQ(Layout(r),
            (std::vector<std::pair<uint32_t, uint32_t>>{{0, 2}, {2, 1}, {3, 1}, {4, 4}}));
  EXPECT_EQ(r.orderings_tried, 1u);
  // The 3g.20gb + 4g.20gb pair fits only one way: the 4g (more compute) first, at 0:4.
  auto sim2 = Sim("A100-SXM4-40GBx1");
  ASSERT_OK_AND_ASSIGN(GeometryResult r2,
                       ApplyGeometry(*sim2, 0, *ParseGeometry("3g.20gb=1,4g.20gb=1")));
  EXPECT_EQ(Layout(r2), (std::vector<std::pair<uint32_t, uint32_t>>{{0, 4}, {4, 4}}));
}

TEST(GeometryApply, ApplyingTwiceChangesNothing) {
  auto sim = Sim("H200x1");
  ASSERT_OK_AND_ASSIGN(GeometrySpec spec, ParseGeometry("3g.71gb=2"));
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
  auto r = ApplyGeometry(*sim, 0, *ParseGeometry("all-1g.18gb"));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("GPU 0 already has GPU instances"), std::string_view::npos);
  EXPECT_NE(r.status().message().find("1g.18gb (GI"), std::string_view::npos) << r.status();
  // Same profile and count but the GI has no compute instance: not "exactly" the geometry.
  auto one = ApplyGeometry(*sim, 0, *ParseGeometry("1g.18gb=1"));
  ASSERT_EQ(one.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(one.status().message().find("0 compute instances"), std::string_view::npos);
  ASSERT_OK_AND_ASSIGN(auto listed, sim->ListGpuInstances(0));
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].id, gi.id);
}

TEST(GeometryApply, ErrorsNameTheGpuAndProfile) {
  auto sim = Sim("A100-SXM4-40GBx1");
  auto unknown = ApplyGeometry(*sim, 0, *ParseGeometry("1g.18gb=1"));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("GPU 0 has no MIG profile 1g.18gb; it has 1g.5gb"),
            std::string_view::npos)
      << unknown.status();
  auto too_many = ApplyGeometry(*sim, 0, *ParseGeometry("3g.20gb=3"));
  EXPECT_NE(too_many.status().message().find("3 x 3g.20gb asked, the profile allows 2"),
            std::string_view::npos)
      << too_many.status();
  auto no_fit = ApplyGeometry(*sim, 0, *ParseGeometry("4g.20gb=1,7g.40gb=1"));
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
  auto r = ApplyGeometry(*sim, 0, *ParseGeometry("all-2g.20gb"));
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
  auto r = ApplyGeometry(*sim, 0, *ParseGeometry("all-1g.10gb"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("MIG mode is not enabled"), std::string_view::npos);
}

TEST(GeometryDriverOrder, UpperHalfFirstElsewhere) {
  mig::ProfileSpec two;
  two.placements = {{0, 2}, {2, 2}, {4, 2}};
  std::vector<uint32_t> starts;
  for (const auto& p : DriverPlacementOrder(two, 8)) starts.push_back(p.start);
  EXPECT_EQ(starts, (std::vector<uint32_t>{4, 0, 2}));
  mig::ProfileSpec one;
  one.placements = {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}};
  starts.clear();
  for (const auto& p : DriverPlacementOrder(one, 8)) starts.push_back(p.start);
  EXPECT_EQ(starts, (std::vector<uint32_t>{6, 4, 5, 0, 1, 2, 3}));
}

}  // namespace
}  // namespace dynmig::nvml
