#include "sim/cluster.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sim/bound.h"
#include "sim_test_util.h"

namespace dynmig::sim {
namespace {

using testing::A100;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Names(const ModelGroup& g, const std::vector<uint32_t>& idx) {
  std::vector<std::string> out;
  for (uint32_t i : idx) out.push_back(g.profile(i).name);
  return out;
}

TEST(BuildCluster, DefaultAllowlistIsBaseProfiles) {
  Cluster c = A100(20);
  ASSERT_EQ(c.groups.size(), 1u);
  const ModelGroup& g = c.groups[0];
  EXPECT_THAT(Names(g, g.planner->allowed()),
              ElementsAre("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"));
  EXPECT_EQ(c.gpu_count(), 20u);
  EXPECT_EQ(c.node_count(), 3u);  // 8 + 8 + 4
  EXPECT_EQ(c.node_gpus[2], 4u);
  EXPECT_EQ(c.total_units, 160u);
  EXPECT_EQ(g.profile(g.candidates[testing::k1g5].front()).name, "1g.5gb");
  EXPECT_EQ(g.profile(g.candidates[testing::k1g10].front()).name, "1g.10gb");
  EXPECT_EQ(g.profile(g.candidates[testing::k3g20].front()).name, "3g.20gb");
  EXPECT_EQ(g.profile(g.candidates[46].front()).name, "3g.20gb");
  EXPECT_EQ(g.profile(g.candidates[81].front()).name, "7g.40gb");
  EXPECT_THAT(Names(g, g.candidates[100]), ElementsAre("7g.40gb"));
  EXPECT_EQ(c.AskedUnits(2, 100), 16u);
  EXPECT_EQ(c.AskedUnits(1, testing::k1g10), 2u);
}

TEST(BuildCluster, MixedModelsAndAllow) {
  auto c = BuildCluster("A100-SXM4-40GBx3, H100 80GB HBM3x2", 2, {"1g.10gb", "3g.40gb", "7g.80gb"});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->groups.size(), 2u);
  EXPECT_THAT(Names(c->groups[0], c->groups[0].planner->allowed()), ElementsAre("1g.10gb"));
  EXPECT_THAT(Names(c->groups[1], c->groups[1].planner->allowed()),
              ElementsAre("1g.10gb", "3g.40gb", "7g.80gb"));
  EXPECT_EQ(c->node_count(), 3u);  // 2 + 1 A100, 2 H100: nodes never mix models
  EXPECT_EQ(c->gpu_group[3], 1u);
  EXPECT_TRUE(c->groups[0].candidates[100].empty());
  EXPECT_TRUE(c->Servable(100));  // the H100s take whole-GPU pods
}

TEST(BuildCluster, Errors) {
  auto no_count = BuildCluster("A100-SXM4-40GB", 8, {});
  ASSERT_FALSE(no_count.ok());
  EXPECT_THAT(std::string(no_count.status().message()), HasSubstr("has no GPU count"));
  auto unknown = BuildCluster("Z9000x4", 8, {});
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("unknown GPU model \"Z9000\""));
  auto allow = BuildCluster("A100-SXM4-40GBx4", 8, {"9g.99gb"});
  ASSERT_FALSE(allow.ok());
  EXPECT_THAT(std::string(allow.status().message()), HasSubstr("--allow"));
  auto zero = BuildCluster("A100-SXM4-40GBx0", 8, {});
  ASSERT_FALSE(zero.ok());
  EXPECT_THAT(std::string(zero.status().message()), HasSubstr("not a number from 1 to 1000000"));
}

TEST(LayoutTable, FeasibleMultisetsOfA100) {
  Cluster c = A100(1);
  const ModelGroup& g = c.groups[0];
  const LayoutTable& t = g.table;
  // Local indices follow allowed(): 1g.5gb, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb.
  EXPECT_NE(t.Find({7, 0, 0, 0, 0, 0}), kNoState);
  EXPECT_EQ(t.Find({8, 0, 0, 0, 0, 0}), kNoState);  // 1g.5gb never uses slice 7
  EXPECT_NE(t.Find({6, 1, 0, 0, 0, 0}), kNoState);  // ... 1g.10gb at 6 does
  EXPECT_NE(t.Find({0, 2, 0, 1, 0, 0}), kNoState);  // 2 x 1g.10gb + 3g.20gb
  EXPECT_NE(t.Find({0, 0, 0, 1, 1, 0}), kNoState);  // 4g at 0, 3g at 4
  EXPECT_EQ(t.Find({0, 0, 0, 0, 2, 0}), kNoState);  // one 4g.20gb per GPU
  EXPECT_NE(t.Find({0, 0, 0, 2, 0, 0}), kNoState);
  EXPECT_EQ(t.Find({1, 0, 0, 0, 0, 1}), kNoState);
  const int32_t empty = t.Find({0, 0, 0, 0, 0, 0});
  EXPECT_EQ(empty, 0);
  EXPECT_EQ(t.Add(empty, 5), t.Find({0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(t.Add(t.Find({0, 0, 0, 0, 0, 1}), 0), kNoState);
  EXPECT_EQ(t.Remove(t.Find({0, 2, 0, 1, 0, 0}), 1), t.Find({0, 1, 0, 1, 0, 0}));
  for (uint32_t s : t.maximal) {
    for (uint32_t a = 0; a < t.profiles; ++a)
      EXPECT_EQ(t.Add(static_cast<int32_t>(s), a), kNoState);
  }
}

TEST(StaticGeometry, MigManagerGeometries) {
  Cluster c = A100(1);
  const ModelGroup& g = c.groups[0];
  auto names = [&](const StaticGeometry& geo) {
    std::vector<std::string> out;
    for (const auto& i : geo.instances) {
      out.push_back(fmt::format("{}@{}", g.profile(i.profile_index).name, i.placement.start));
    }
    return out;
  };
  auto balanced = MakeStaticGeometry(g, "all-balanced");
  ASSERT_TRUE(balanced.ok()) << balanced.status();
  std::vector<std::string> b = names(*balanced);
  std::sort(b.begin(), b.end());
  EXPECT_EQ(b.size(), 4u);
  EXPECT_EQ(std::count_if(b.begin(), b.end(),
                          [](const std::string& s) { return s.starts_with("1g.5gb"); }),
            2);
  EXPECT_EQ(std::count_if(b.begin(), b.end(),
                          [](const std::string& s) { return s.starts_with("2g.10gb"); }),
            1);
  EXPECT_EQ(std::count_if(b.begin(), b.end(),
                          [](const std::string& s) { return s.starts_with("3g.20gb"); }),
            1);
  EXPECT_EQ(balanced->leftover_units, 0u);
  auto one = MakeStaticGeometry(g, "all-1g");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->instances.size(), 7u);
  EXPECT_EQ(one->leftover_units, 1u);
  auto three = MakeStaticGeometry(g, "all-3g");
  ASSERT_TRUE(three.ok());
  EXPECT_THAT(names(*three), ElementsAre("3g.20gb@0", "3g.20gb@4"));
  auto two = MakeStaticGeometry(g, "all-2g");
  ASSERT_TRUE(two.ok());
  EXPECT_THAT(names(*two), ElementsAre("2g.10gb@0", "2g.10gb@2", "2g.10gb@4"));
  auto seven = MakeStaticGeometry(g, "all-7g");
  ASSERT_TRUE(seven.ok());
  EXPECT_THAT(names(*seven), ElementsAre("7g.40gb@0"));
  auto bad = MakeStaticGeometry(g, "all-9g");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("has no allowlisted profile \"9g\""));
  auto weird = MakeStaticGeometry(g, "mixed");
  ASSERT_FALSE(weird.ok());
  EXPECT_THAT(std::string(weird.status().message()), HasSubstr("unknown geometry"));
}

TEST(CoveringLp, KnownOptima) {
  // y1 covers 2 of row 0, y2 covers row 1: y1 >= 1.5, y2 >= 1.
  EXPECT_NEAR(CoveringLp({{2, 0}, {0, 1}}, {3, 1}), 2.5, 1e-9);
  // One column covering both rows.
  EXPECT_NEAR(CoveringLp({{2, 1}, {1, 0}}, {4, 1}), 2.0, 1e-9);
  EXPECT_NEAR(CoveringLp({{1}, {0}}, {0, 0}), 0.0, 1e-9);
  EXPECT_TRUE(std::isinf(CoveringLp({{1}, {0}}, {1, 1})));
}

TEST(FillBound, SevenSmallInstancesPerGpu) {
  Cluster c = A100(1);
  std::vector<testing::P> ps;
  for (int i = 0; i < 9; ++i) ps.push_back({static_cast<double>(i), 100, testing::k1g5});
  auto pods = testing::MakePods(c, ps);
  auto b = ComputeFillBound(c, pods);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->pods, 7u);  // at most 7 instances per A100, even with upsizing
  EXPECT_EQ(b->units, 7u);
  EXPECT_EQ(b->lp_gpus_all, 2u);
}

TEST(FillBound, MixOnTwoGpus) {
  Cluster c = A100(2);
  // 3g + 3g + 7g + 1g: the 7g needs a GPU of its own; the two 3g fill the other.
  auto pods = testing::MakePods(c, {{0, 9, testing::k3g20},
                                    {1, 9, testing::kWhole},
                                    {2, 9, testing::k3g20},
                                    {3, 9, testing::k1g5}});
  auto b = ComputeFillBound(c, pods);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->pods, 3u);
  EXPECT_DOUBLE_EQ(b->filled, 1.0);

  auto mixed = BuildCluster("A100-SXM4-40GBx1,H100 80GB HBM3x1", 8, {});
  ASSERT_TRUE(mixed.ok());
  auto none = ComputeFillBound(*mixed, testing::MakePods(*mixed, {{0, 1, 50}}));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace dynmig::sim
