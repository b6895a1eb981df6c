// dynmig:defrag in the simulator: the defragmenter's rules (moves only for pods that fit nowhere
// now and only when the evicted pods fit elsewhere, the plans tried, the eviction cap, never
// opted-out pods, the per-node rate, reserved slices, restart time; the comparison options
// big-first and gain).
#include "sim/defrag.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sim/generator.h"
#include "sim/policies.h"
#include "sim/simulator.h"
#include "sim_test_util.h"

namespace dynmig::sim {
namespace {

using testing::A100;
using ::testing::HasSubstr;
using testing::k1g5;
using testing::k3g20;
using testing::kWhole;
using testing::MakePods;
using testing::MakeTrace;
using testing::P;
using testing::PolicyResultOf;
using testing::RunSim;

// One A100: seven 1g.5gb pods fill slices 0-6; four of them end at 15, which leaves five free
// slices but no free 3g.20gb placement; a 3g.20gb arrives at 20. The three left end at `stay`.
std::vector<P> FragmentedGpu(double stay) {
  std::vector<P> ps;
  for (int i = 0; i < 7; ++i) ps.push_back({double(i), i % 2 == 0 ? 15.0 : stay, k1g5});
  ps.push_back({20, 240, k3g20});
  return ps;
}

TEST(Defrag, MovesAPodWaitingForFragmentation) {
  Cluster c = A100(1);
  Trace t = MakeTrace(FragmentedGpu(1000));
  SimResult r = RunSim(t, c, {"dynmig", "dynmig:defrag"}, Mode::kReject);
  const auto& plain = PolicyResultOf(r, "dynmig");
  EXPECT_EQ(plain.accepted, 7u);
  EXPECT_EQ(plain.evictions, 0u);
  const auto& defrag = PolicyResultOf(r, "dynmig:defrag");
  EXPECT_EQ(defrag.accepted, 8u);
  EXPECT_EQ(defrag.evictions, 1u);
  EXPECT_EQ(defrag.moves, 1u);
  EXPECT_EQ(defrag.restarts, 1u);  // the evicted pod fit elsewhere on the GPU
  EXPECT_DOUBLE_EQ(defrag.evictions_per_accepted(), 1.0 / 8);
  // The 3g.20gb runs after the evicted pod's grace period (30 s by default).
  EXPECT_DOUBLE_EQ(defrag.running_p99, 30);
}

// The evicted pod runs again only after its restart time, and then for what was left of its
// lifetime: a whole-GPU pod arriving at 250 waits for it until 300, not 200.
TEST(Defrag, EvictedPodComesBackAfterItsRestartTime) {
  Cluster c = A100(1);
  std::vector<P> ps = FragmentedGpu(200);
  ps.push_back({250, 400, kWhole});
  Trace t = MakeTrace(ps);
  SimResult r = RunSim(t, c, {"dynmig:defrag+wait-0s+grace-30s+restart-100s"}, Mode::kQueue);
  const auto& p = r.policies.at(0);
  EXPECT_EQ(p.evictions, 1u);
  EXPECT_EQ(p.restarts, 1u);
  EXPECT_EQ(p.never_started, 0u);
  // Evicted at 50 with 150 s left: back at once, running from 150 to 300.
  EXPECT_DOUBLE_EQ(p.pending_p99, 50);
  SimResult quick = RunSim(t, c, {"dynmig:defrag+wait-0s+grace-30s+restart-10s"}, Mode::kQueue);
  EXPECT_DOUBLE_EQ(quick.policies.at(0).pending_p99, 30);  // 3g.20gb's wait; the 7g fits at 250
}

TEST(Defrag, OptedOutPodsAreNeverMoved) {
  Cluster c = A100(1);
  Trace t = MakeTrace(FragmentedGpu(1000));
  for (auto& p : t.pods) p.defrag = DefragChoice::kOptOut;
  SimResult r = RunSim(t, c, {"dynmig:defrag"}, Mode::kReject);
  EXPECT_EQ(r.policies.at(0).evictions, 0u);
  EXPECT_EQ(r.policies.at(0).accepted, 7u);
}

TEST(Defrag, PlanChoiceFollowsTheDefragmenterRules) {
  const Cluster c = A100(1);
  std::vector<SimPod> pods = MakePods(c, FragmentedGpu(1000));
  MoveInput in;
  in.cluster = &c;
  in.pods = &pods;
  // Slices 0-6 hold pods 0-6 (pod k at slice k); pods 1, 5 and 6 are left.
  for (uint32_t k : {1u, 5u, 6u}) {
    in.live.push_back(
        {k, 0, static_cast<uint32_t>(c.groups[0].planner->ProfileIndex("1g.5gb")), {k, 1}});
  }
  std::vector<uint8_t> pinned(pods.size(), 0);
  std::vector<double> started(pods.size(), 0);
  for (uint32_t k = 0; k < pods.size(); ++k) started[k] = k;
  in.pinned = pinned;
  in.started = started;
  in.budget = [](uint32_t) { return 10u; };
  auto plan = PlanMove(in, 7);
  ASSERT_TRUE(plan.has_value());
  // One pod frees a 3g.20gb either way: slices 4-7 (pods 5, 6: two) or 0-3 (pod 1: one).
  EXPECT_EQ(plan->evict, std::vector<uint32_t>{1});
  EXPECT_EQ(plan->placement.start, 0u);
  // Pod 1 opted out: only 4-7 is left, two pods.
  pods[1].defrag = DefragChoice::kOptOut;
  plan = PlanMove(in, 7);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->evict, (std::vector<uint32_t>{5, 6}));
  // A budget of one eviction on the node allows no plan.
  in.budget = [](uint32_t) { return 1u; };
  EXPECT_FALSE(PlanMove(in, 7).has_value());
  // Slices held for another waiting pod are never freed for this one.
  pods[1].defrag = DefragChoice::kDefault;
  in.budget = [](uint32_t) { return 10u; };
  in.held.push_back(
      {0, static_cast<uint32_t>(c.groups[0].planner->ProfileIndex("1g.5gb")), {0, 1}});
  plan = PlanMove(in, 7);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->evict, (std::vector<uint32_t>{5, 6}));
}

// One node of three GPUs. Four 3g.20gb pods fill two GPUs, a whole-GPU pod the third; one 3g.20gb
// of each of the first two GPUs ends, and another whole-GPU pod arrives. No GPU has its eight
// slices free, so the planner's per-GPU verdict is not "fragmented"; the default trigger (it fits
// nowhere now) still moves a 3g.20gb next to the other. The best plan by the rules evicts the
// youngest pod, the whole-GPU one, which fits nowhere else: only trying the next plans finds the
// move.
std::vector<P> WholeGpuAcrossGpus() {
  return {{0, 1000, k3g20}, {1, 5, k3g20},     {2, 6, k3g20},
          {3, 1000, k3g20}, {4, 1000, kWhole}, {10, 500, kWhole}};
}

TEST(Defrag, DefaultTriggerMovesForAPodThatFitsNowhere) {
  Cluster c = A100(3, 3);
  Trace t = MakeTrace(WholeGpuAcrossGpus());
  SimResult r = RunSim(t, c,
                       {"dynmig", "dynmig:defrag+headroom-0", "dynmig:defrag+per-gpu+headroom-0",
                        "dynmig:defrag+node-total+headroom-0", "dynmig:defrag+tries-1+headroom-0",
                        "dynmig:defrag+tries-2+headroom-0", "dynmig:defrag"},
                       Mode::kReject);
  EXPECT_EQ(PolicyResultOf(r, "dynmig").accepted, 5u);
  // Without the headroom rule (the move fills the cluster, which the default 1 % refuses: below).
  const auto& moved = PolicyResultOf(r, "dynmig:defrag+headroom-0");
  EXPECT_EQ(moved.accepted, 6u);
  EXPECT_EQ(moved.evictions, 1u);
  EXPECT_EQ(moved.restarts, 1u);  // the 3g.20gb runs again next to the other one
  EXPECT_EQ(moved.evicted_waiting, 0u);
  // Only the per-GPU "fragmented" verdict: no GPU has eight free slices, nothing moves.
  EXPECT_EQ(PolicyResultOf(r, "dynmig:defrag+per-gpu+headroom-0").evictions, 0u);
  EXPECT_EQ(PolicyResultOf(r, "dynmig:defrag+per-gpu+headroom-0").accepted, 5u);
  // The node has eight slices free in total.
  EXPECT_EQ(PolicyResultOf(r, "dynmig:defrag+node-total+headroom-0").accepted, 6u);
  // The best plan alone (the whole-GPU pod) is refused: its pod fits nowhere else.
  EXPECT_EQ(PolicyResultOf(r, "dynmig:defrag+tries-1+headroom-0").evictions, 0u);
  EXPECT_EQ(PolicyResultOf(r, "dynmig:defrag+tries-1+headroom-0").accepted, 5u);
  EXPECT_EQ(PolicyResultOf(r, "dynmig:defrag+tries-2+headroom-0").evictions, 1u);
  // The default keeps 1 % of the cluster free: no slice would be, so nothing moves.
  EXPECT_EQ(PolicyResultOf(r, "dynmig:defrag").evictions, 0u);
  EXPECT_EQ(PolicyResultOf(r, "dynmig:defrag").accepted, 5u);
}

// The same cluster full of whole-GPU pods: a waiting one fits nowhere, but no evicted pod would
// fit elsewhere, so nothing moves (the cluster lacks capacity, not a better layout).
TEST(Defrag, DefaultTriggerRefusesWhenMovedPodsFitNowhere) {
  Cluster c = A100(3, 3);
  Trace t = MakeTrace({{0, 1000, kWhole},
                       {1, 1000, kWhole},
                       {2, 1000, k3g20},
                       {3, 1000, k3g20},
                       {10, 500, kWhole}});
  SimResult r = RunSim(t, c, {"dynmig", "dynmig:defrag"}, Mode::kReject);
  EXPECT_EQ(PolicyResultOf(r, "dynmig").accepted, 4u);
  EXPECT_EQ(PolicyResultOf(r, "dynmig:defrag").accepted, 4u);
  EXPECT_EQ(PolicyResultOf(r, "dynmig:defrag").evictions, 0u);
}

// evict-N: a plan that evicts more pods than N is not taken.
TEST(Defrag, EvictionCapPerPlan) {
  Cluster c = A100(1);
  Trace t = MakeTrace(FragmentedGpu(1000));
  t.pods[5].defrag = DefragChoice::kOptOut;  // only slices 0-3 are left: pods 1 and 3
  SimResult r = RunSim(t, c, {"dynmig:defrag+evict-1", "dynmig:defrag+evict-2"}, Mode::kReject);
  EXPECT_EQ(r.policies[0].evictions, 0u);
  EXPECT_EQ(r.policies[0].accepted, 7u);
  EXPECT_EQ(r.policies[1].evictions, 2u);
  EXPECT_EQ(r.policies[1].accepted, 8u);
}

// headroom-N: a move only while N percent of the cluster's placement units stay free once the
// waiting pod runs. One A100 with 1g pods at slices 1, 3 and 6: the 3g.20gb's move (pod 6 to a
// free slice, slices 4-7 reserved) leaves one slice of eight free: 12.5 %.
TEST(Defrag, HeadroomKeepsMovesOutOfAFullCluster) {
  Cluster c = A100(1);
  std::vector<P> ps;
  for (int i = 0; i < 7; ++i)
    ps.push_back({double(i), i == 1 || i == 3 || i == 6 ? 1000.0 : 15.0, k1g5});
  ps.push_back({20, 240, k3g20});
  Trace t = MakeTrace(ps);
  SimResult r = RunSim(t, c,
                       {"dynmig:defrag", "dynmig:defrag+headroom-12", "dynmig:defrag+headroom-13",
                        "dynmig:defrag+headroom-100"},
                       Mode::kReject);
  EXPECT_EQ(r.policies[0].evictions, 1u);
  EXPECT_EQ(r.policies[0].accepted, 8u);
  EXPECT_EQ(r.policies[1].evictions, 1u);  // 12.5 % free is at least 12 %
  EXPECT_EQ(r.policies[1].accepted, 8u);
  EXPECT_EQ(r.policies[2].evictions, 0u);  // but not 13 %
  EXPECT_EQ(r.policies[2].accepted, 7u);
  EXPECT_EQ(r.policies[3].evictions, 0u);
}

// Two GPUs of one node fragmented alike, two 3g.20gb waiting: the second move needs two more
// evictions, which the rate allows only from 3 per node per hour.
TEST(Defrag, RateLimitPerNodeIsRespected) {
  Cluster c = A100(2, 2);
  std::vector<P> ps;
  for (int i = 0; i < 14; ++i) ps.push_back({double(i), i % 2 == 0 ? 15.0 : 1000.0, k1g5});
  ps.push_back({20, 500, k3g20});
  ps.push_back({21, 500, k3g20});
  Trace t = MakeTrace(ps);
  SimResult r = RunSim(t, c,
                       {"dynmig:defrag+rate-1+any-move", "dynmig:defrag+rate-2+any-move",
                        "dynmig:defrag+rate-3+any-move"},
                       Mode::kReject);
  EXPECT_EQ(r.policies[0].evictions, 1u);
  EXPECT_EQ(r.policies[1].evictions, 1u);
  EXPECT_EQ(r.policies[2].evictions, 3u);
  EXPECT_EQ(r.policies[2].moves, 2u);
  EXPECT_EQ(r.policies[2].accepted, 16u);
}

// A pod that waits for capacity, not fragmentation, never causes an eviction: the pods a plan
// would evict fit nowhere else.
TEST(Defrag, NeverEvictsWithoutAPodWaitingForFragmentation) {
  Cluster c = A100(2, 2);
  testing::Lcg rng(7);
  std::vector<P> ps;
  for (int i = 0; i < 300; ++i) {
    const double a = i * 5.0;
    ps.push_back({a, a + 1 + rng.Next() % 400, kWhole});
  }
  Trace t = MakeTrace(ps);
  for (Mode m : {Mode::kReject, Mode::kQueue}) {
    SimResult r = RunSim(t, c, {"dynmig", "dynmig:defrag+wait-0s"}, m);
    EXPECT_EQ(r.policies[1].evictions, 0u);
    EXPECT_EQ(r.policies[1].accepted, r.policies[0].accepted);
    EXPECT_LT(r.policies[1].accepted, 300u);  // pods did wait or were lost
  }
}

// The generator's optin/optout shares: the same pods either way, about the shares asked, and a
// run with every pod opted out moves nothing.
TEST(Defrag, GeneratedOptInAndOptOut) {
  Cluster c = A100(16);
  auto plain = GenerateTrace("pods=2000,load=1.2", 3, c);
  auto marked = GenerateTrace("pods=2000,load=1.2,optin=0.3,optout=0.2", 3, c);
  ASSERT_TRUE(plain.ok() && marked.ok());
  ASSERT_EQ(plain->pods.size(), marked->pods.size());
  size_t in = 0, out = 0;
  for (size_t k = 0; k < plain->pods.size(); ++k) {
    EXPECT_EQ(plain->pods[k].arrival, marked->pods[k].arrival);
    EXPECT_EQ(plain->pods[k].percent, marked->pods[k].percent);
    EXPECT_EQ(plain->pods[k].defrag, DefragChoice::kDefault);
    in += marked->pods[k].defrag == DefragChoice::kOptIn;
    out += marked->pods[k].defrag == DefragChoice::kOptOut;
  }
  EXPECT_NEAR(static_cast<double>(in) / 2000, 0.3, 0.05);
  EXPECT_NEAR(static_cast<double>(out) / 2000, 0.2, 0.05);
  auto all_out = GenerateTrace("pods=2000,load=1.2,optout=1", 3, c);
  ASSERT_TRUE(all_out.ok());
  SimResult r = RunSim(*all_out, c, {"dynmig:defrag", "dynmig:defrag+any-move"}, Mode::kReject);
  EXPECT_EQ(r.policies[0].evictions, 0u);
  EXPECT_EQ(r.policies[1].evictions, 0u);
  SimResult some = RunSim(*plain, c, {"dynmig:defrag+any-move"}, Mode::kReject);
  EXPECT_GT(some.policies[0].evictions, 0u);  // the same pods do move when they may
  for (const char* bad : {"optin=1.5", "optout=-0.1", "optin=0.6,optout=0.6", "optin=nan"}) {
    EXPECT_FALSE(GenerateTrace(fmt::format("pods=10,{}", bad), 1, c).ok()) << bad;
  }
}

TEST(Defrag, ReservedSlicesAreNotTakenByOthers) {
  Cluster c = A100(1);
  auto pods = MakePods(
      c, {{0, 9, k3g20}, {0, 9, k1g5}, {0, 9, k1g5}, {0, 9, k1g5}, {0, 9, k1g5}, {0, 9, k1g5}});
  auto policy = MakePolicy("dynmig:defrag", c, pods);
  ASSERT_TRUE(policy.ok()) << policy.status();
  Policy& p = **policy;
  ASSERT_TRUE(p.Reserve(0, 0, {0, 4}).ok());
  EXPECT_FALSE(p.Reserve(1, 0, {2, 1}).ok());  // already reserved
  // Slices 4, 5, 6 take three 1g.5gb; slice 7 cannot; 0-3 are reserved.
  for (uint32_t k = 1; k <= 5; ++k) {
    auto placed = p.Place(k, -1);
    ASSERT_TRUE(placed.ok()) << placed.status();
    EXPECT_EQ(*placed, k <= 3) << k;
  }
  for (const auto& in : p.Snapshot()) EXPECT_GE(in.placement.start, 4u);
  const uint32_t g1 = static_cast<uint32_t>(c.groups[0].planner->ProfileIndex("1g.5gb"));
  const uint32_t g3 = static_cast<uint32_t>(c.groups[0].planner->ProfileIndex("3g.20gb"));
  const absl::Status taken = p.PlaceExactly(4, 0, g1, {1, 1});
  EXPECT_THAT(std::string(taken.message()), HasSubstr("reserved for pod #0"));
  EXPECT_TRUE(p.PlaceExactly(0, 0, g3, {0, 4}).ok());  // its owner may
  p.Unreserve(0, {0, 4});
  uint64_t free = 0, stranded = 0;
  p.Fragmentation(k1g5, free, stranded);
  EXPECT_EQ(free, 1u);
}

// gain (an oracle, for comparison): a move only when the waiting pod's slice-time exceeds what
// the evicted pods lose (asked slices x (grace + restart), at most their time left). A 3g.20gb
// (four slices) for 1 s does not outweigh a 1g.5gb losing 150 s; for 220 s it does.
TEST(Defrag, GainWeighsTheWaitingPodAgainstTheEvictedOnes) {
  Cluster c = A100(1);
  std::vector<P> brief = FragmentedGpu(1000);
  brief.back().departure = 21;
  SimResult r = RunSim(MakeTrace(brief), c, {"dynmig:defrag", "dynmig:defrag+gain"}, Mode::kReject);
  EXPECT_EQ(r.policies[0].evictions, 1u);  // without the rule it moves
  EXPECT_EQ(r.policies[1].evictions, 0u);  // refused: 4 x 1 s < 1 x 150 s
  EXPECT_EQ(r.policies[1].accepted, 7u);
  r = RunSim(MakeTrace(FragmentedGpu(1000)), c, {"dynmig:defrag+gain"}, Mode::kReject);
  EXPECT_EQ(r.policies[0].evictions, 1u);  // allowed: 4 x 220 s > 1 x 150 s
  EXPECT_EQ(r.policies[0].accepted, 8u);
  // An evicted pod about to end anyway loses only its time left: 4 x 30 s < 1 x 150 s, but the
  // pods to evict end at 60, 40 s after the check: 4 x 30 s > 1 x 40 s.
  std::vector<P> ending = FragmentedGpu(60);
  ending.back().departure = 50;
  r = RunSim(MakeTrace(ending), c, {"dynmig:defrag+gain+wait-0s"}, Mode::kQueue);
  EXPECT_EQ(r.policies[0].evictions, 1u);
}

// big-first: no move for a pod while a pod asking for more instances waits (queue mode; in
// reject mode nothing waits). Two GPUs fragmented by 1g.5gb pods, a two-GPU pod waiting from 19,
// a 3g.20gb from 20.
TEST(Defrag, BigFirstHoldsMovesWhileALargerPodWaits) {
  Cluster c = A100(2, 2);
  std::vector<P> ps;
  for (int i = 0; i < 14; ++i) ps.push_back({double(i), i % 2 == 0 ? 15.0 : 1000.0, k1g5});
  ps.push_back({19, 2000, kWhole, 2});
  ps.push_back({20, 500, k3g20});
  Trace t = MakeTrace(ps);
  SimResult r =
      RunSim(t, c, {"dynmig:defrag+wait-0s", "dynmig:defrag+wait-0s+big-first"}, Mode::kQueue);
  EXPECT_GE(r.policies[0].evictions, 1u);  // allowed without the rule
  EXPECT_EQ(r.policies[1].evictions, 0u);  // refused: the two-GPU pod waits
  // Without the two-GPU pod the rule allows the move.
  ps.erase(ps.end() - 2);
  r = RunSim(MakeTrace(ps), c, {"dynmig:defrag+wait-0s+big-first"}, Mode::kQueue);
  EXPECT_GE(r.policies[0].evictions, 1u);
}

TEST(Defrag, Options) {
  Cluster c = A100(1);
  std::vector<SimPod> none;
  auto ok = MakePolicy("dynmig:defrag+wait-2m+grace-0s+restart-90s+rate-12", c, none);
  ASSERT_TRUE(ok.ok()) << ok.status();
  const DefragConfig* d = (*ok)->defrag();
  ASSERT_NE(d, nullptr);
  EXPECT_DOUBLE_EQ(d->wait_s, 120);
  EXPECT_DOUBLE_EQ(d->grace_s, 0);
  EXPECT_DOUBLE_EQ(d->restart_s, 90);
  EXPECT_EQ(d->per_node_hour, 12u);
  EXPECT_EQ(d->trigger, DefragConfig::Trigger::kWaiting);
  EXPECT_EQ(d->plans_tried, 0u);
  EXPECT_EQ(d->max_evicted, 0u);
  auto more = MakePolicy("dynmig:defrag+per-gpu+tries-3+evict-2", c, none);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_EQ((*more)->defrag()->trigger, DefragConfig::Trigger::kFragmented);
  EXPECT_EQ((*more)->defrag()->plans_tried, 3u);
  EXPECT_EQ((*more)->defrag()->max_evicted, 2u);
  EXPECT_EQ((*MakePolicy("dynmig:defrag+node-total", c, none))->defrag()->trigger,
            DefragConfig::Trigger::kNodeTotal);
  EXPECT_FALSE(d->bigger_first);
  EXPECT_FALSE(d->gain);
  auto compare = MakePolicy("dynmig:defrag+big-first+gain", c, none);
  ASSERT_TRUE(compare.ok()) << compare.status();
  EXPECT_TRUE((*compare)->defrag()->bigger_first);
  EXPECT_TRUE((*compare)->defrag()->gain);
  EXPECT_EQ((*MakePolicy("dynmig", c, none))->defrag(), nullptr);
  // Attacks: bad, huge, negative or overlong values, options without defrag.
  for (const char* bad : {"dynmig:defrag+rate-0",
                          "dynmig:defrag+rate-1001",
                          "dynmig:defrag+rate-99999999999",
                          "dynmig:defrag+rate-",
                          "dynmig:defrag+wait-25h",
                          "dynmig:defrag+wait--1s",
                          "dynmig:defrag+grace-2h",
                          "dynmig:defrag+restart-soon",
                          "dynmig:rate-4",
                          "dynmig:defrag+wait-1000000000000000000000000s",
                          "dynmig:defrag+tries-0",
                          "dynmig:defrag+tries-1001",
                          "dynmig:defrag+evict-0",
                          "dynmig:defrag+evict-x",
                          "dynmig:defrag+evict-",
                          "dynmig:defrag+evict-99999999999999999999",
                          "dynmig:defrag+headroom-101",
                          "dynmig:defrag+headroom-",
                          "dynmig:defrag+headroom-5%",
                          "dynmig:headroom-1",
                          "dynmig:per-gpu",
                          "dynmig:evict-2",
                          "dynmig:big-first",
                          "dynmig:gain",
                          "dynmig:defrag+big-first-2",
                          "dynmig:defrag+gain-1"}) {
    auto r = MakePolicy(bad, c, none);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  auto r = MakePolicy("dynmig:defrag+rate-0", c, none);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("rate-N"));
  r = MakePolicy("dynmig:defrag+evict-0", c, none);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("evict-N"));
  r = MakePolicy("dynmig:rate-4", c, none);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("add +defrag"));
}

}  // namespace
}  // namespace dynmig::sim
