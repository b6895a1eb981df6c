#include "mig/mode_planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace dynmig::mig {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr int64_t kModeMin = 10 * 60 * 1000;  // minModeDuration
constexpr int64_t kModeNow = 100 * kModeMin;

// An idle, switchable, allowed H100 in `mode` for a long time.
ModeGpu MGpu(const std::string& uuid, uint32_t index, ModeKind mode,
             const std::string& model = "NVIDIA H100 80GB HBM3") {
  ModeGpu g;
  g.uuid = uuid;
  g.index = index;
  g.model = model;
  g.mode = mode;
  g.mig_capable = true;
  g.may_switch = true;
  g.switchable = true;
  g.since_ms = 0;
  g.idle = true;
  g.memory_mib = 81559;
  return g;
}

std::string ModeUuid(int node, uint32_t index) {
  return "GPU-" + std::to_string(node) + "-" + std::to_string(index);
}

ModeDemand WholeDemand(const std::string& pod, uint32_t gpus = 1, uint64_t mem = 0) {
  return {pod, ModeKind::kWhole, gpus, mem};
}
ModeDemand MigDemand(const std::string& pod, uint32_t instances = 1) {
  return {pod, ModeKind::kMig, instances, 0};
}

// Two rounds with the same demand: the second one's plan (the first only learns the demand).
ModePlan ModeTwoRounds(ModePlanInput in) {
  ModePlan first = PlanModeSwitches(in);
  EXPECT_THAT(first.switches, IsEmpty()) << "a demand seen once switched a GPU";
  in.seen = first.seen;
  return PlanModeSwitches(in);
}

const ModeGpuVerdict& ModeVerdictOf(const ModePlan& plan, const std::string& uuid) {
  for (const auto& v : plan.verdicts) {
    if (v.gpu_uuid == uuid) return v;
  }
  static const ModeGpuVerdict kNone;
  ADD_FAILURE() << "no verdict for " << uuid;
  return kNone;
}

ModePlanInput ModeOneNode(std::vector<ModeGpu> gpus, std::vector<ModeDemand> demand) {
  ModePlanInput in;
  in.nodes.push_back({"node-a", std::move(gpus)});
  in.demand = std::move(demand);
  in.now_ms = kModeNow;
  in.min_mode_duration_ms = kModeMin;
  return in;
}

TEST(ModePlannerTest, AWholeGpuPodSwitchesAnIdleMigGpuAfterTwoRounds) {
  ModePlanInput in =
      ModeOneNode({MGpu("GPU-0", 0, ModeKind::kMig), MGpu("GPU-1", 1, ModeKind::kMig)},
                  {WholeDemand("default/train")});
  ModePlan first = PlanModeSwitches(in);
  EXPECT_THAT(first.switches, IsEmpty());
  EXPECT_EQ(ModeVerdictOf(first, "GPU-0").code, "demand-unconfirmed");
  EXPECT_THAT(first.seen, ElementsAre("hami-core:default/train"));
  in.seen = first.seen;
  ModePlan second = PlanModeSwitches(in);
  ASSERT_THAT(second.switches, SizeIs(1));
  const auto& s = second.switches[0];
  EXPECT_EQ(s.node, "node-a");
  EXPECT_EQ(s.to, ModeKind::kWhole);
  EXPECT_THAT(s.pods, ElementsAre("default/train"));
  EXPECT_THAT(s.reason, HasSubstr("default/train"));
  EXPECT_EQ(ModeVerdictOf(second, s.gpu_uuid).code, "switch");
}

TEST(ModePlannerTest, ADemandThatComesAndGoesNeverSwitches) {
  ModePlanInput in = ModeOneNode({MGpu("GPU-0", 0, ModeKind::kMig)}, {WholeDemand("default/a")});
  ModePlan r1 = PlanModeSwitches(in);
  // Round 2: the pod is gone (placed elsewhere); round 3: another one appears.
  in.seen = r1.seen;
  in.demand = {};
  ModePlan r2 = PlanModeSwitches(in);
  EXPECT_THAT(r2.switches, IsEmpty());
  in.seen = r2.seen;
  in.demand = {WholeDemand("default/b")};
  EXPECT_THAT(PlanModeSwitches(in).switches, IsEmpty());
}

TEST(ModePlannerTest, EachEligibilityRuleHoldsAGpuAlone) {
  struct Case {
    const char* code;
    void (*spoil)(ModeGpu&);
  };
  const Case cases[] = {
      {"no-mig", [](ModeGpu& g) { g.mig_capable = false; }},
      {"not-allowed", [](ModeGpu& g) { g.may_switch = false; }},
      {"not-switchable", [](ModeGpu& g) { g.switchable = false; }},
      {"in-use", [](ModeGpu& g) { g.idle = false; }},
      {"switching",
       [](ModeGpu& g) {
         g.switching = true;
         g.switching_to = ModeKind::kMig;
       }},
      {"hysteresis", [](ModeGpu& g) { g.since_ms = kModeNow - kModeMin + 1; }},
  };
  for (const auto& c : cases) {
    ModeGpu g = MGpu("GPU-0", 0, ModeKind::kMig);
    c.spoil(g);
    // A second MIG GPU that stays, so rule 4 never applies here.
    ModeGpu stay = MGpu("GPU-1", 1, ModeKind::kMig);
    stay.idle = false;
    ModePlan plan = ModeTwoRounds(ModeOneNode({g, stay}, {WholeDemand("default/a")}));
    EXPECT_THAT(plan.switches, IsEmpty()) << c.code;
    EXPECT_EQ(ModeVerdictOf(plan, "GPU-0").code, c.code);
  }
}

TEST(ModePlannerTest, HysteresisEndsAtSincePlusMinModeDuration) {
  ModeGpu g = MGpu("GPU-0", 0, ModeKind::kWhole);
  g.since_ms = kModeNow - kModeMin + 1;
  ModePlanInput in = ModeOneNode({g, MGpu("GPU-1", 1, ModeKind::kMig)}, {MigDemand("default/m")});
  // GPU-1 is in MIG mode already; the pod does not fit it (the caller says so): GPU-0 is wanted.
  in.nodes[0].gpus[1].idle = false;
  ModePlan plan = ModeTwoRounds(in);
  EXPECT_THAT(plan.switches, IsEmpty());
  EXPECT_EQ(ModeVerdictOf(plan, "GPU-0").code, "hysteresis");
  EXPECT_EQ(ModeVerdictOf(plan, "GPU-0").until_ms, kModeNow + 1);
  in.now_ms = kModeNow + 1;
  ModePlan later = ModeTwoRounds(in);
  ASSERT_THAT(later.switches, SizeIs(1));
  EXPECT_EQ(later.switches[0].gpu_uuid, "GPU-0");
  EXPECT_EQ(later.switches[0].to, ModeKind::kMig);
}

TEST(ModePlannerTest, ASinceInTheFutureHoldsTheGpu) {
  ModeGpu g = MGpu("GPU-0", 0, ModeKind::kMig);
  g.since_ms = kModeNow + kModeMin * 50;  // a node clock far ahead
  ModeGpu stay = MGpu("GPU-1", 1, ModeKind::kMig);
  stay.idle = false;
  ModePlan plan = ModeTwoRounds(ModeOneNode({g, stay}, {WholeDemand("default/a")}));
  EXPECT_THAT(plan.switches, IsEmpty());
  EXPECT_EQ(ModeVerdictOf(plan, "GPU-0").code, "hysteresis");
}

TEST(ModePlannerTest, NeverSwitchesAwayTheLastGpuOfANeededMode) {
  // One MIG GPU (idle) and one whole GPU (busy); MIG pods and a whole pod both wait.
  ModeGpu busy_whole = MGpu("GPU-1", 1, ModeKind::kWhole);
  busy_whole.idle = false;
  ModePlanInput in = ModeOneNode({MGpu("GPU-0", 0, ModeKind::kMig), busy_whole},
                                 {WholeDemand("default/w"), MigDemand("default/m")});
  ModePlan plan = ModeTwoRounds(in);
  EXPECT_THAT(plan.switches, IsEmpty());
  EXPECT_EQ(ModeVerdictOf(plan, "GPU-0").code, "last-of-mode");
  // Without a MIG pod waiting, the last MIG GPU may go.
  in.demand = {WholeDemand("default/w")};
  ModePlan alone = ModeTwoRounds(in);
  ASSERT_THAT(alone.switches, SizeIs(1));
  EXPECT_EQ(alone.switches[0].gpu_uuid, "GPU-0");
}

TEST(ModePlannerTest, TheLastOfModeCountsTheWholeCluster) {
  ModePlanInput in = ModeOneNode({MGpu("GPU-0", 0, ModeKind::kMig)},
                                 {WholeDemand("default/w"), MigDemand("default/m")});
  ModeGpu other = MGpu("GPU-9", 0, ModeKind::kMig);
  other.idle = false;
  in.nodes.push_back({"node-b", {other}});
  ModePlan plan = ModeTwoRounds(in);
  ASSERT_THAT(plan.switches, SizeIs(1));
  EXPECT_EQ(plan.switches[0].gpu_uuid, "GPU-0");  // node-b keeps a MIG GPU
}

TEST(ModePlannerTest, AtMostOneSwitchPerNodePerRound) {
  ModePlanInput in =
      ModeOneNode({MGpu("GPU-0", 0, ModeKind::kMig), MGpu("GPU-1", 1, ModeKind::kMig),
                   MGpu("GPU-2", 2, ModeKind::kMig)},
                  {WholeDemand("default/a"), WholeDemand("default/b")});
  ModePlan plan = ModeTwoRounds(in);
  ASSERT_THAT(plan.switches, SizeIs(1));
  EXPECT_EQ(ModeVerdictOf(plan, "GPU-2").code, "node-busy");
  // Next round, with GPU-0 switching: b gets GPU-1... (a consumes the switching GPU).
  for (auto& g : in.nodes[0].gpus) {
    if (g.uuid == plan.switches[0].gpu_uuid) {
      g.switching = true;
      g.switching_to = ModeKind::kWhole;
    }
  }
  in.seen = plan.seen;
  ModePlan next = PlanModeSwitches(in);
  ASSERT_THAT(next.switches, SizeIs(1));
  EXPECT_THAT(next.switches[0].pods, ElementsAre("default/b"));
}

TEST(ModePlannerTest, ASwitchUnderWayServesItsDemand) {
  ModeGpu coming = MGpu("GPU-0", 0, ModeKind::kMig);
  coming.switching = true;
  coming.switching_to = ModeKind::kWhole;
  ModePlan plan = ModeTwoRounds(
      ModeOneNode({coming, MGpu("GPU-1", 1, ModeKind::kMig)}, {WholeDemand("default/a")}));
  EXPECT_THAT(plan.switches, IsEmpty());
  EXPECT_EQ(ModeVerdictOf(plan, "GPU-1").code, "not-needed");
}

TEST(ModePlannerTest, PrefersNoResetThenLongestInModeThenLowestIndex) {
  ModeGpu a100 = MGpu("GPU-0", 0, ModeKind::kMig, "NVIDIA A100-SXM4-40GB");
  a100.since_ms = 0;
  ModeGpu h_new = MGpu("GPU-1", 1, ModeKind::kMig);
  h_new.since_ms = 5000;
  ModeGpu h_old = MGpu("GPU-2", 2, ModeKind::kMig);
  h_old.since_ms = 1000;
  ModePlan plan = ModeTwoRounds(ModeOneNode({a100, h_new, h_old}, {WholeDemand("default/a")}));
  ASSERT_THAT(plan.switches, SizeIs(1));
  EXPECT_EQ(plan.switches[0].gpu_uuid, "GPU-2");
  // Equal otherwise: the lowest index.
  ModePlan tie = ModeTwoRounds(
      ModeOneNode({MGpu("GPU-7", 7, ModeKind::kMig), MGpu("GPU-3", 3, ModeKind::kMig)},
                  {WholeDemand("default/a")}));
  ASSERT_THAT(tie.switches, SizeIs(1));
  EXPECT_EQ(tie.switches[0].gpu_uuid, "GPU-3");
  // An Ampere GPU switches when it is the only candidate (the plugin said it can: switchable).
  ModePlan ampere = ModeTwoRounds(ModeOneNode({a100}, {WholeDemand("default/a")}));
  ASSERT_THAT(ampere.switches, SizeIs(1));
}

TEST(ModePlannerTest, SwitchesWithoutResetKnowsTheArchitectures) {
  EXPECT_TRUE(SwitchesWithoutReset("NVIDIA H100 80GB HBM3"));
  EXPECT_TRUE(SwitchesWithoutReset("NVIDIA H200"));
  EXPECT_TRUE(SwitchesWithoutReset("NVIDIA GH200 480GB"));
  EXPECT_TRUE(SwitchesWithoutReset("NVIDIA B200"));
  EXPECT_TRUE(SwitchesWithoutReset("NVIDIA H20"));
  EXPECT_FALSE(SwitchesWithoutReset("NVIDIA A100-SXM4-40GB"));
  EXPECT_FALSE(SwitchesWithoutReset("NVIDIA A30"));
  EXPECT_FALSE(SwitchesWithoutReset("Tesla T4"));
  EXPECT_FALSE(SwitchesWithoutReset(""));
}

TEST(ModePlannerTest, PrefersTheNodeNeedingFewestSwitches) {
  // A pod wants 2 whole GPUs: node-a has none whole, node-b one idle whole GPU already.
  ModePlanInput in =
      ModeOneNode({MGpu("GPU-a0", 0, ModeKind::kMig), MGpu("GPU-a1", 1, ModeKind::kMig)},
                  {WholeDemand("default/pair", 2)});
  in.nodes.push_back(
      {"node-b", {MGpu("GPU-b0", 0, ModeKind::kWhole), MGpu("GPU-b1", 1, ModeKind::kMig)}});
  ModePlan plan = ModeTwoRounds(in);
  ASSERT_THAT(plan.switches, SizeIs(1));
  EXPECT_EQ(plan.switches[0].node, "node-b");
  EXPECT_EQ(plan.switches[0].gpu_uuid, "GPU-b1");
}

TEST(ModePlannerTest, APodWantingMoreGpusThanANodeHasSwitchesNothing) {
  ModePlanInput in =
      ModeOneNode({MGpu("GPU-0", 0, ModeKind::kMig), MGpu("GPU-1", 1, ModeKind::kMig)},
                  {WholeDemand("default/huge", 16)});
  ModePlan plan = ModeTwoRounds(in);
  EXPECT_THAT(plan.switches, IsEmpty());
  EXPECT_EQ(ModeVerdictOf(plan, "GPU-0").code, "not-needed");
}

TEST(ModePlannerTest, AMemoryFloorAboveTheGpuSwitchesNothing) {
  ModePlan plan = ModeTwoRounds(
      ModeOneNode({MGpu("GPU-0", 0, ModeKind::kMig)}, {WholeDemand("default/big", 1, 200000)}));
  EXPECT_THAT(plan.switches, IsEmpty());
}

TEST(ModePlannerTest, OneMigGpuServesASlotsWorthOfMigPods) {
  // Three idle whole GPUs on three nodes; 7 one-instance MIG pods wait: one GPU covers them.
  ModePlanInput in;
  in.now_ms = kModeNow;
  in.min_mode_duration_ms = kModeMin;
  for (const char* n : {"node-a", "node-b", "node-c"})
    in.nodes.push_back({n, {MGpu(std::string("GPU-") + n, 0, ModeKind::kWhole)}});
  for (int i = 0; i < 7; ++i) in.demand.push_back(MigDemand("default/m" + std::to_string(i)));
  ModePlan plan = ModeTwoRounds(in);
  ASSERT_THAT(plan.switches, SizeIs(1));
  EXPECT_EQ(plan.switches[0].to, ModeKind::kMig);
  EXPECT_THAT(plan.switches[0].pods, SizeIs(7));
  EXPECT_THAT(plan.switches[0].reason, HasSubstr("and 4 more"));
  // An eighth pod needs a second GPU (another node).
  in.demand.push_back(MigDemand("default/m7"));
  ModePlan more = ModeTwoRounds(in);
  EXPECT_THAT(more.switches, SizeIs(2));
}

TEST(ModePlannerTest, NoDemandNoSwitch) {
  ModePlan plan = ModeTwoRounds(ModeOneNode({MGpu("GPU-0", 0, ModeKind::kMig)}, {}));
  EXPECT_THAT(plan.switches, IsEmpty());
  EXPECT_EQ(ModeVerdictOf(plan, "GPU-0").code, "no-demand");
  // A pending pod of the GPU's own mode is not a reason to switch it.
  ModePlan own =
      ModeTwoRounds(ModeOneNode({MGpu("GPU-0", 0, ModeKind::kMig)}, {MigDemand("default/m")}));
  EXPECT_THAT(own.switches, IsEmpty());
}

TEST(ModePlannerTest, TenThousandPendingPodsAreBounded) {
  ModePlanInput in;
  in.now_ms = kModeNow;
  in.min_mode_duration_ms = kModeMin;
  for (int n = 0; n < 50; ++n) {
    std::vector<ModeGpu> gpus;
    for (uint32_t i = 0; i < 8; ++i) {
      gpus.push_back(MGpu(ModeUuid(n, i), i, i % 2 ? ModeKind::kMig : ModeKind::kWhole));
    }
    in.nodes.push_back({"node-" + std::to_string(n), std::move(gpus)});
  }
  for (int i = 0; i < 10000; ++i) {
    in.demand.push_back(i % 2 ? WholeDemand("ns/w" + std::to_string(i), 16)
                              : MigDemand("ns/m" + std::to_string(i), 16));
  }
  ModePlan first = PlanModeSwitches(in);
  EXPECT_EQ(first.skipped_demands, 10000 - kMaxModeDemands);
  EXPECT_THAT(first.seen, SizeIs(kMaxModeDemands));
  in.seen = first.seen;
  ModePlan plan = PlanModeSwitches(in);
  EXPECT_LE(plan.switches.size(), in.nodes.size());  // one per node at most
  std::set<std::string> nodes;
  for (const auto& s : plan.switches) EXPECT_TRUE(nodes.insert(s.node).second) << s.node;
  // Whole pods of 16 GPUs fit no node of 8: every switch is to MIG.
  for (const auto& s : plan.switches) EXPECT_EQ(s.to, ModeKind::kMig);
  EXPECT_THAT(plan.verdicts, SizeIs(400));
}

}  // namespace
}  // namespace dynmig::mig
