#include "mig/defrag.h"

#include <gtest/gtest.h>

#include <bit>
#include <random>

#include "mig/test_util.h"

namespace dynmig::mig {
namespace {

using testing::MakePlanner;

const std::vector<std::string> kA100Allow = {"1g.5gb",  "1g.5gb+me", "2g.10gb",
                                             "3g.20gb", "4g.20gb",   "7g.40gb"};

Reservation R(const GpuPlanner& planner, const std::string& profile, uint32_t start,
              const std::string& owner) {
  const int idx = planner.ProfileIndex(profile);
  EXPECT_GE(idx, 0) << profile;
  return {profile, {start, planner.capability().profiles[idx].memory_slices}, owner};
}

TEST(DefragTest, FitsNowNeedsNoEviction) {
  auto planner = MakePlanner("A100-SXM4-40GB", kA100Allow);
  auto plan = PlanEviction(*planner, {R(*planner, "1g.5gb", 0, "default/a")}, "3g.20gb");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->feasible);
  EXPECT_TRUE(plan->fits_now());
  EXPECT_EQ(plan->placement, (Placement{4, 4}));
  EXPECT_EQ(plan->units_moved, 0u);
}

TEST(DefragTest, FragmentedGpuNeedsOneOwner) {
  auto planner = MakePlanner("A100-SXM4-40GB", kA100Allow);
  // 1g at 1 and 1g at 5: six slices free but both 3g placements are cut.
  auto plan = PlanEviction(
      *planner, {R(*planner, "1g.5gb", 1, "default/a"), R(*planner, "1g.5gb", 5, "default/b")},
      "3g.20gb");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->feasible);
  ASSERT_EQ(plan->owners.size(), 1u);
  EXPECT_EQ(plan->units_moved, 1u);
  ASSERT_EQ(plan->moved.size(), 1u);
  EXPECT_EQ(plan->moved[0].owner, plan->owners[0]);
  EXPECT_TRUE(plan->placement.Overlaps(plan->moved[0].placement));
}

TEST(DefragTest, TiesGoToFewestUnitsMoved) {
  auto planner = MakePlanner("A100-SXM4-40GB", kA100Allow);
  // Pod c holds two 1g in the lower half; pod d one 1g in the upper half.
  auto plan =
      PlanEviction(*planner,
                   {R(*planner, "1g.5gb", 0, "default/c"), R(*planner, "1g.5gb", 1, "default/c"),
                    R(*planner, "1g.5gb", 4, "default/d")},
                   "3g.20gb");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->feasible);
  EXPECT_EQ(plan->owners, (std::vector<std::string>{"default/d"}));
  EXPECT_EQ(plan->placement, (Placement{4, 4}));
  EXPECT_EQ(plan->units_moved, 1u);
}

TEST(DefragTest, APodMovesWithAllItsReservations) {
  auto planner = MakePlanner("A100-SXM4-40GB", kA100Allow);
  // Pod m holds 1g at 0 and 1g at 6: freeing 0-3 for the 4g moves both of its instances.
  auto plan = PlanEviction(
      *planner, {R(*planner, "1g.5gb", 0, "default/m"), R(*planner, "1g.5gb", 6, "default/m")},
      "4g.20gb");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->feasible);
  EXPECT_EQ(plan->owners, (std::vector<std::string>{"default/m"}));
  EXPECT_EQ(plan->units_moved, 2u);
  EXPECT_EQ(plan->moved.size(), 2u);
}

TEST(DefragTest, WholeGpuProfileEvictsEveryOwner) {
  auto planner = MakePlanner("A100-SXM4-40GB", kA100Allow);
  auto plan =
      PlanEviction(*planner,
                   {R(*planner, "2g.10gb", 0, "default/a"), R(*planner, "1g.5gb", 2, "default/b"),
                    R(*planner, "3g.20gb", 4, "default/c")},
                   "7g.40gb");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->feasible);
  EXPECT_EQ(plan->owners, (std::vector<std::string>{"default/a", "default/b", "default/c"}));
  EXPECT_EQ(plan->units_moved, 7u);
  EXPECT_EQ(plan->placement, (Placement{0, 8}));
}

TEST(DefragTest, InstanceLimitEvictsAnotherInstanceOfTheProfile) {
  auto planner = MakePlanner("A100-SXM4-40GB", kA100Allow);
  // One 1g.5gb+me per GPU: slice 1 is free but the limit is reached.
  auto plan = PlanEviction(*planner, {R(*planner, "1g.5gb+me", 0, "default/x")}, "1g.5gb+me");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->feasible);
  EXPECT_EQ(plan->owners, (std::vector<std::string>{"default/x"}));
}

TEST(DefragTest, PinnedReservationsCannotMove) {
  auto planner = MakePlanner("A100-SXM4-40GB", kA100Allow);
  auto plan = PlanEviction(*planner, {R(*planner, "1g.5gb", 1, ""), R(*planner, "1g.5gb", 5, "")},
                           "3g.20gb");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->feasible);
  EXPECT_NE(plan->reason.find("cannot move"), std::string::npos) << plan->reason;
}

TEST(DefragTest, ProfileNamesAndSliceClasses) {
  auto planner = MakePlanner("A100-SXM4-40GB", {"1g.5gb", "3g.20gb"});
  auto by_class = PlanEviction(*planner, {}, "3g");
  ASSERT_TRUE(by_class.ok());
  EXPECT_TRUE(by_class->feasible);
  EXPECT_EQ(by_class->profile, "3g.20gb");
  auto not_allowed = PlanEviction(*planner, {}, "2g.10gb");
  ASSERT_TRUE(not_allowed.ok());
  EXPECT_FALSE(not_allowed->feasible);
  EXPECT_EQ(not_allowed->reason, "2g.10gb is not allowlisted on NVIDIA A100-SXM4-40GB");
  auto missing = PlanEviction(*planner, {}, "1g.24gb");
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->reason, "NVIDIA A100-SXM4-40GB offers no 1g.24gb profile");
  auto no_class = PlanEviction(*planner, {}, "5g");
  ASSERT_TRUE(no_class.ok());
  EXPECT_EQ(no_class->reason, "NVIDIA A100-SXM4-40GB offers no 5g profile");
}

TEST(DefragTest, InconsistentReservationsAreAnError) {
  auto planner = MakePlanner("A100-SXM4-40GB", kA100Allow);
  auto plan = PlanEviction(
      *planner, {R(*planner, "2g.10gb", 0, "default/a"), R(*planner, "1g.5gb", 1, "default/b")},
      "1g.5gb");
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("inconsistent"), std::string::npos);
}

TEST(DefragTest, AcrossGpusTheCheapestWins) {
  auto a100 = MakePlanner("A100-SXM4-40GB", kA100Allow);
  std::vector<DefragGpu> gpus(4);
  gpus[0] = {"node-a",
             "GPU-0",
             0,
             a100.get(),
             true,
             "",
             {R(*a100, "1g.5gb", 1, "ns/p1"), R(*a100, "1g.5gb", 5, "ns/p2"),
              R(*a100, "1g.5gb", 0, "ns/p3"), R(*a100, "1g.5gb", 4, "ns/p4")}};
  gpus[1] = {"node-b", "GPU-1", 0, a100.get(), true, "", {R(*a100, "1g.5gb", 2, "ns/q")}};
  gpus[2] = {"node-b", "GPU-2", 1, nullptr, true, "", {}};
  gpus[3] = {"node-c", "GPU-3", 0, a100.get(), false, "cordoned", {}};
  auto result = PlanDefrag(gpus, "3g.20gb");
  ASSERT_NE(result.best(), nullptr);
  EXPECT_EQ(result.best()->gpu, 1u);
  EXPECT_TRUE(result.best()->plan.fits_now());
  ASSERT_EQ(result.ranked.size(), 2u);
  EXPECT_EQ(result.ranked[1].gpu, 0u);
  EXPECT_EQ(result.ranked[1].plan.owners.size(), 2u);
  ASSERT_EQ(result.skipped.size(), 2u);
  EXPECT_EQ(result.skipped[0].second, "no allowlisted MIG capability");
  EXPECT_EQ(result.skipped[1].second, "unhealthy: cordoned");
}

// The owner count is exact: compare with brute force over every subset of owners on random states.
TEST(DefragTest, OwnerCountMatchesBruteForce) {
  auto planner = MakePlanner("A100-SXM4-40GB", kA100Allow);
  const auto& cap = planner->capability();
  std::mt19937 rng(7);
  const std::vector<std::string> sizes = {"1g.5gb",  "1g.5gb",  "1g.5gb",
                                          "2g.10gb", "3g.20gb", "1g.5gb+me"};
  const std::vector<std::string> targets = {"1g.5gb",  "2g.10gb", "3g.20gb",
                                            "4g.20gb", "7g.40gb", "1g.5gb+me"};
  for (int trial = 0; trial < 400; ++trial) {
    Occupancy occ;
    for (int k = 0; k < 8; ++k) {
      const std::string& name = sizes[rng() % sizes.size()];
      const ProfileSpec* spec = cap.FindProfile(name);
      const Placement p = spec->placements[rng() % spec->placements.size()];
      (void)occ.Reserve(cap, name, p, "o" + std::to_string(rng() % 4));
    }
    const auto& rs = occ.reservations();
    std::vector<std::string> owners;
    for (const auto& r : rs) {
      if (std::find(owners.begin(), owners.end(), r.owner) == owners.end()) {
        owners.push_back(r.owner);
      }
    }
    for (const auto& target : targets) {
      auto plan = PlanEviction(*planner, rs, target);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const int idx = planner->ProfileIndex(target);
      size_t brute = SIZE_MAX;
      for (uint32_t subset = 0; subset < (1u << owners.size()); ++subset) {
        std::vector<Reservation> left;
        for (const auto& r : rs) {
          const size_t o = std::find(owners.begin(), owners.end(), r.owner) - owners.begin();
          if (!(subset & (1u << o))) left.push_back(r);
        }
        auto usage = planner->UsageOf(left);
        ASSERT_TRUE(usage.ok());
        bool fits = usage->counts[idx] < cap.profiles[idx].instance_count;
        bool free_placement = false;
        for (const auto& p : cap.profiles[idx].placements) {
          free_placement |= (usage->occupied & p.Mask()) == 0;
        }
        if (fits && free_placement) {
          brute = std::min<size_t>(brute, std::popcount(subset));
        }
      }
      ASSERT_TRUE(plan->feasible) << target;
      EXPECT_EQ(plan->owners.size(), brute) << "trial " << trial << " " << target;
      // The plan really frees a placement.
      std::vector<Reservation> left;
      for (const auto& r : rs) {
        if (std::find(plan->owners.begin(), plan->owners.end(), r.owner) == plan->owners.end()) {
          left.push_back(r);
        }
      }
      left.push_back({target, plan->placement, "new"});
      EXPECT_TRUE(planner->UsageOf(left).ok()) << "trial " << trial << " " << target;
    }
  }
}

}  // namespace
}  // namespace dynmig::mig
