#include "mig/defrag_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "mig/test_util.h"

namespace dynmig::mig {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::MakePlanner;

const std::vector<std::string> kPolicyAllow = {"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb",
                                               "7g.40gb"};

MovablePod MPod(const std::string& key, int32_t priority = 0, int64_t created = 100) {
  MovablePod p;
  p.key = key;
  p.ns = key.substr(0, key.find('/'));
  p.priority = priority;
  p.created = created;
  p.has_controller = true;
  return p;
}

TEST(EvictionRefusalTest, EachRuleRefusesAlone) {
  DefragRules rules;
  EXPECT_EQ(EvictionRefusal(MPod("team/a"), rules), "");
  MovablePod p = MPod("team/a");
  p.opted_out = true;
  EXPECT_THAT(EvictionRefusal(p, rules), HasSubstr("opted out"));
  p = MPod("team/a");
  p.opt_error = "bad";
  EXPECT_THAT(EvictionRefusal(p, rules), HasSubstr("unreadable"));
  for (const char* ns : {"kube-system", "kube-public", "kube-node-lease", "dynmig-system"}) {
    EXPECT_THAT(EvictionRefusal(MPod(std::string(ns) + "/x"), rules),
                HasSubstr("system namespace"));
  }
  p = MPod("team/a");
  p.has_controller = false;
  EXPECT_THAT(EvictionRefusal(p, rules), HasSubstr("no controller"));
  p = MPod("team/a");
  p.terminating = true;
  EXPECT_THAT(EvictionRefusal(p, rules), HasSubstr("terminating"));
  p = MPod("team/a");
  p.pdbs = {"team/budget"};
  EXPECT_THAT(EvictionRefusal(p, rules), HasSubstr("allows no disruption"));  // unknown budget
  rules.pdb_allowed["team/budget"] = 0;
  EXPECT_THAT(EvictionRefusal(p, rules), HasSubstr("allows no disruption"));
  rules.pdb_allowed["team/budget"] = 1;
  EXPECT_EQ(EvictionRefusal(p, rules), "");
  p.pdbs = {"team/budget", "team/other"};
  rules.pdb_allowed["team/other"] = 1;
  EXPECT_THAT(EvictionRefusal(p, rules), HasSubstr("more than one"));
}

Reservation Res(const GpuPlanner& planner, const std::string& profile, uint32_t start,
                const std::string& owner) {
  const int idx = planner.ProfileIndex(profile);
  return {profile, {start, planner.capability().profiles[idx].memory_slices}, owner};
}

// One A100 with a 1g at every slice 0..6, each of its own pod.
struct PolicyFixture {
  std::shared_ptr<const GpuPlanner> planner = MakePlanner("A100-SXM4-40GB", kPolicyAllow);
  std::vector<DefragGpu> gpus;
  std::map<std::string, MovablePod> pods;
  DefragRules rules;

  explicit PolicyFixture(int n = 7) {
    DefragGpu g;
    g.node = "node-a";
    g.uuid = "GPU-a";
    g.planner = planner.get();
    for (int i = 0; i < n; ++i) {
      const std::string key = "team/p" + std::to_string(i);
      g.reservations.push_back(Res(*planner, "1g.5gb", i, key));
      pods[key] = MPod(key);
    }
    gpus.push_back(std::move(g));
  }
};

TEST(ChooseDefragPlanTest, SevenGNeedsEveryPodAndAnyRefusalBlocksIt) {
  PolicyFixture f;
  auto d = ChooseDefragPlan(f.gpus, "7g", f.pods, f.rules);
  ASSERT_TRUE(d.choice.has_value());
  EXPECT_EQ(d.choice->plan.owners.size(), 7u);
  f.pods["team/p3"].opted_out = true;
  d = ChooseDefragPlan(f.gpus, "7g", f.pods, f.rules);
  EXPECT_FALSE(d.choice.has_value());
  ASSERT_FALSE(d.reasons.empty());
  EXPECT_THAT(d.reasons[0], HasSubstr("cannot move"));
}

TEST(ChooseDefragPlanTest, OptedOutPodIsNeverInThePlan) {
  PolicyFixture f(4);  // 1g at 0..3: a 4g fits at 4 now; ask for 3g elsewhere: 3g fits at 4 too
  // 1g at 0,1,2,3 and 4: the 3g placements are 0-3 and 4-7; 4-7 needs p4 only.
  f.gpus[0].reservations.push_back(Res(*f.planner, "1g.5gb", 4, "team/p4"));
  f.pods["team/p4"] = MPod("team/p4");
  auto d = ChooseDefragPlan(f.gpus, "3g", f.pods, f.rules);
  ASSERT_TRUE(d.choice.has_value());
  EXPECT_THAT(d.choice->plan.owners, ElementsAre("team/p4"));
  f.pods["team/p4"].opted_out = true;
  d = ChooseDefragPlan(f.gpus, "3g", f.pods, f.rules);
  ASSERT_TRUE(d.choice.has_value());
  EXPECT_THAT(d.choice->plan.owners, ElementsAre("team/p0", "team/p1", "team/p2", "team/p3"));
  EXPECT_THAT(d.choice->refused.at("team/p4"), HasSubstr("opted out"));
}

// 2g at 0 (pod a) and 2g at 4 (pod b) on an A100: a 3g fits after moving either one.
PolicyFixture TwoChoices() {
  PolicyFixture f(0);
  f.gpus[0].reservations = {Res(*f.planner, "2g.10gb", 0, "team/a"),
                            Res(*f.planner, "2g.10gb", 4, "team/b")};
  f.pods = {{"team/a", MPod("team/a")}, {"team/b", MPod("team/b")}};
  return f;
}

TEST(ChooseDefragPlanTest, LowestPriorityFirst) {
  PolicyFixture f = TwoChoices();
  f.pods["team/a"].priority = 10;
  auto d = ChooseDefragPlan(f.gpus, "3g", f.pods, f.rules);
  ASSERT_TRUE(d.choice.has_value());
  EXPECT_THAT(d.choice->plan.owners, ElementsAre("team/b"));
  f.pods["team/a"].priority = -10;
  d = ChooseDefragPlan(f.gpus, "3g", f.pods, f.rules);
  EXPECT_THAT(d.choice->plan.owners, ElementsAre("team/a"));
}

TEST(ChooseDefragPlanTest, YoungestThenOptedIn) {
  PolicyFixture f = TwoChoices();
  f.pods["team/a"].created = 500;  // younger
  auto d = ChooseDefragPlan(f.gpus, "3g", f.pods, f.rules);
  EXPECT_THAT(d.choice->plan.owners, ElementsAre("team/a"));
  f = TwoChoices();
  f.pods["team/b"].opted_in = true;
  d = ChooseDefragPlan(f.gpus, "3g", f.pods, f.rules);
  EXPECT_THAT(d.choice->plan.owners, ElementsAre("team/b"));
  // Priority outranks opting in.
  f.pods["team/b"].priority = 5;
  d = ChooseDefragPlan(f.gpus, "3g", f.pods, f.rules);
  EXPECT_THAT(d.choice->plan.owners, ElementsAre("team/a"));
}

TEST(ChooseDefragPlanTest, BudgetLimitsHowManyOfItsPodsOnePlanTakes) {
  PolicyFixture f(4);  // a 7g would need all four; a 4g needs p0..p3 (slices 0-3)
  for (auto& [k, p] : f.pods) p.pdbs = {"team/budget"};
  f.rules.pdb_allowed["team/budget"] = 3;
  auto d = ChooseDefragPlan(f.gpus, "7g", f.pods, f.rules);
  EXPECT_FALSE(d.choice.has_value());
  ASSERT_FALSE(d.reasons.empty());
  EXPECT_THAT(d.reasons[0], HasSubstr("allows 3 disruptions, the plan needs 4"));
  f.rules.pdb_allowed["team/budget"] = 4;
  d = ChooseDefragPlan(f.gpus, "7g", f.pods, f.rules);
  EXPECT_TRUE(d.choice.has_value());
}

TEST(ChooseDefragPlanTest, SystemAndUncontrolledPodsArePinned) {
  PolicyFixture f = TwoChoices();
  f.pods["team/a"].has_controller = false;
  auto d = ChooseDefragPlan(f.gpus, "3g", f.pods, f.rules);
  EXPECT_THAT(d.choice->plan.owners, ElementsAre("team/b"));
  EXPECT_THAT(d.choice->refused.at("team/a"), HasSubstr("no controller"));
  // A reservation of a pod the rules know nothing of is pinned too.
  f.pods.erase("team/b");
  d = ChooseDefragPlan(f.gpus, "3g", f.pods, f.rules);
  EXPECT_FALSE(d.choice.has_value());
}

TEST(ChooseDefragPlanTest, FitsNowIsNoPlanAndFewestPodsAcrossGpusWins) {
  PolicyFixture f = TwoChoices();
  DefragGpu empty;
  empty.node = "node-b";
  empty.uuid = "GPU-b";
  empty.planner = f.planner.get();
  f.gpus.push_back(empty);
  auto d = ChooseDefragPlan(f.gpus, "7g", f.pods, f.rules);
  EXPECT_FALSE(d.choice.has_value());  // the 7g fits on GPU-b now: nothing to move
  f.gpus[1].reservations = {Res(*f.planner, "1g.5gb", 0, "team/c"),
                            Res(*f.planner, "1g.5gb", 1, "team/d"),
                            Res(*f.planner, "1g.5gb", 2, "team/e")};
  for (const char* k : {"team/c", "team/d", "team/e"}) f.pods[k] = MPod(k);
  d = ChooseDefragPlan(f.gpus, "7g", f.pods, f.rules);
  ASSERT_TRUE(d.choice.has_value());
  EXPECT_EQ(d.choice->gpu, 0u);  // two pods on GPU-a beat three on GPU-b
}

TEST(DueWaitingPodsTest, ThresholdThenPriorityThenAge) {
  std::vector<WaitingPod> w = {
      {"a/young", 0, 990}, {"a/old", 0, 100}, {"a/high", 9, 500}, {"a/old2", 0, 100}};
  EXPECT_THAT(DueWaitingPods(w, 1000, 60), ElementsAre(2, 1, 3));
  EXPECT_TRUE(DueWaitingPods(w, 1000, 10000).empty());
}

TEST(RateLimitTest, PerNodeAndPerNamespaceWithinTheLastHour) {
  EvictionLimits limits{3, 2};
  std::vector<EvictionRecord> h = {
      {1000, "node-a", "x"}, {1000, "node-a", "y"}, {-5000, "node-a", "x"}};  // over an hour ago
  const std::vector<std::string> one_z = {"z"};
  EXPECT_EQ(RateLimitRefusal(h, 1100, limits, "node-a", one_z), "");
  const std::vector<std::string> two_z = {"z", "z"};
  EXPECT_THAT(RateLimitRefusal(h, 1100, limits, "node-a", two_z), HasSubstr("per node per hour"));
  EXPECT_EQ(RateLimitRefusal(h, 1100, limits, "node-b", two_z), "");
  const std::vector<std::string> x2 = {"x", "x"};
  EXPECT_THAT(RateLimitRefusal(h, 1100, limits, "node-b", x2), HasSubstr("per namespace per hour"));
  EXPECT_EQ(RateLimitRefusal(h, 1000 + 3600, limits, "node-b", x2), "");  // aged out
  EXPECT_THAT(RateLimitRefusal({}, 0, {0, 5}, "node-a", one_z), HasSubstr("limit 0"));
}

TEST(HeadroomRefusal, KeepsTheShareFreeOnceThePodRuns) {
  EXPECT_EQ(HeadroomRefusal(16, 4, 8, 0), "");   // no rule
  EXPECT_EQ(HeadroomRefusal(16, 4, 8, 25), "");  // 4 of 16 stay free: 25 %
  EXPECT_THAT(HeadroomRefusal(16, 4, 8, 26),
              HasSubstr("would keep 4 of its 16 slices free once the pod runs, under the 26%"));
  EXPECT_THAT(HeadroomRefusal(16, 12, 8, 1), HasSubstr("keep 0 of its 16"));  // over-full
  EXPECT_THAT(HeadroomRefusal(0, 0, 1, 1), HasSubstr("keep 0 of its 0"));     // no GPU
  EXPECT_EQ(HeadroomRefusal(1600, 1576, 8, 1), "");  // 16 of 1600 free: 1 %
  EXPECT_THAT(HeadroomRefusal(1600, 1577, 8, 1), HasSubstr("keep 15 of its 1600"));
  // The test alone, as the simulator asks it.
  EXPECT_TRUE(KeepsHeadroom(16, 4, 8, 25));
  EXPECT_FALSE(KeepsHeadroom(16, 4, 8, 26));
  EXPECT_TRUE(KeepsHeadroom(0, 0, 1, 0));
  EXPECT_FALSE(KeepsHeadroom(0, 0, 1, 1));
  // Huge counts do not overflow.
  EXPECT_THAT(HeadroomRefusal(uint64_t{1} << 40, 0, 8, 100), HasSubstr("under the 100%"));
}

}  // namespace
}  // namespace dynmig::mig
