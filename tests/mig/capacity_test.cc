#include "mig/capacity.h"

#include "test_util.h"

namespace dynmig::mig::testing {
namespace {

// One rule for every "how many instances fit" question: the planner's bound and MostInstances
// (what the admission webhook uses) agree on every catalogued model and allowlist shape.
TEST(CapacityTest, MostInstancesIsThePlannersBound) {
  EXPECT_EQ(MostInstances(Model("A100-SXM4-40GB"), {"1g.5gb", "2g.10gb", "7g.40gb"}), 7u);
  EXPECT_EQ(MostInstances(Model("A100-SXM4-40GB"), {"3g.20gb", "7g.40gb"}), 2u);
  EXPECT_EQ(MostInstances(Model("A100-SXM4-40GB"), {"7g.40gb", "no-such-profile"}), 1u);
  EXPECT_EQ(MostInstances(Model("A100-SXM4-40GB"), {}), 0u);
  for (const auto& m : Catalogue()) {
    std::vector<std::string> all, large;
    for (const auto& p : m.capability.profiles) {
      all.push_back(p.name);
      if (p.compute_slices >= 3) large.push_back(p.name);
    }
    for (const auto* allowed : {&all, &large}) {
      SCOPED_TRACE(m.names.front());
      auto planner = GpuPlanner::Create(m.capability, *allowed);
      ASSERT_TRUE(planner.ok()) << planner.status();
      EXPECT_EQ(MostInstances(m.capability, *allowed), (*planner)->max_instances());
    }
  }
}

TEST(CapacityTest, DisjointPlacementsSkipsOccupiedUnits) {
  const std::vector<Placement> by_end = {{0, 1}, {1, 1}, {0, 2}, {2, 2}, {0, 4}};
  EXPECT_EQ(DisjointPlacements(by_end), 3u);          // 0, 1, 2-3
  EXPECT_EQ(DisjointPlacements(by_end, 0b0001), 2u);  // 1, 2-3
  EXPECT_EQ(DisjointPlacements(by_end, 0b1111), 0u);
}

}  // namespace
}  // namespace dynmig::mig::testing
