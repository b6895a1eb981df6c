// Per-GPU MIG mode in the simulator (sim/mode_sim.h): whole-GPU pods, fixed pools, switching on
// demand through mig::PlanModeSwitches.
#include "sim/mode_sim.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/clock.h"
#include "nlohmann/json.hpp"
#include "sim/generator.h"
#include "sim/trace.h"

namespace dynmig::sim {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kSmallMig = 12;  // resolves to 1g.5gb on an A100-40GB

struct ModePod {
  double arrival;
  double departure;
  bool whole;
  uint32_t count = 1;
  uint32_t percent = 100;
};

Trace ModeTrace(const std::vector<ModePod>& ps, double end) {
  Trace t;
  t.source = "test";
  uint32_t line = 2;
  for (const auto& p : ps) {
    TracePod tp;
    tp.arrival = p.arrival;
    tp.departure = p.departure;
    tp.whole = p.whole;
    tp.count = p.count;
    tp.percent = p.whole ? 100 : p.percent;
    tp.line = line++;
    t.pods.push_back(tp);
  }
  t.start = ps.empty() ? 0 : ps.front().arrival;
  t.end = end;
  return t;
}

Cluster ModeCluster(const std::string& gpus, uint32_t per_node = 8) {
  auto c = BuildCluster(gpus, per_node, {});
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// Set-mig-mode 2 s, reset 10 s: Hopper switches in 2 s, Ampere in 12 s.
mig::NvmlLatency ModeSwitchLatency() {
  auto l = mig::ParseNvmlLatency("set-mig-mode=2s,reset-gpu=10s");
  EXPECT_TRUE(l.ok()) << l.status();
  return *l;
}

ModePolicyResult RunModePolicy(const Trace& t, const Cluster& c, const std::string& policy) {
  ModeSimOptions o;
  o.nvml_latency = ModeSwitchLatency();
  auto r = SimulateModes(t, c, {policy}, o, RealClock());
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok() || r->policies.empty()) return {};
  return r->policies.front();
}

TEST(ModeSimTest, SwitchRunsAWaitingWholeGpuPodAfterTheLatency) {
  // One MIG GPU, one whole-GPU pod at t=0. Round at 0 sees the demand, round at 2 s confirms it
  // and switches; the switch ends 2 s (Hopper) or 12 s (Ampere, with a reset) later.
  const Trace t = ModeTrace({{0, 100, true}}, 1000);
  const auto h100 = RunModePolicy(t, ModeCluster("H100 80GBx1"), "dynmig:mode-switch+min-10s");
  EXPECT_EQ(h100.accepted, 1u);
  EXPECT_EQ(h100.switches_to_whole, 1u);
  EXPECT_EQ(h100.switches_to_mig, 0u);
  EXPECT_DOUBLE_EQ(h100.pending_p50, 4.0);
  EXPECT_NEAR(h100.switch_gpu_hours, 2.0 / 3600, 1e-12);

  const auto a100 = RunModePolicy(t, ModeCluster("A100-SXM4-40GBx1"), "dynmig:mode-switch+min-10s");
  EXPECT_EQ(a100.accepted, 1u);
  EXPECT_DOUBLE_EQ(a100.pending_p50, 14.0);
  EXPECT_NEAR(a100.switch_gpu_hours, 12.0 / 3600, 1e-12);
}

TEST(ModeSimTest, DemandSeenOnceDoesNotSwitch) {
  // The pod leaves the queue (the horizon ends) before a second round confirms its demand.
  const Trace t = ModeTrace({{0, 100, true}}, 1.5);
  const auto r = RunModePolicy(t, ModeCluster("H100 80GBx1"), "dynmig:mode-switch+min-10s");
  EXPECT_EQ(r.switches_to_whole, 0u);
  EXPECT_EQ(r.accepted, 0u);
}

TEST(ModeSimTest, HysteresisHoldsTheModeForMinModeDuration) {
  // The whole-GPU pod switches the GPU at 2 s (whole from 4 s) and ends at 14 s; a MIG pod at 20 s
  // waits until the GPU has been whole for minModeDuration, then 2 s for the switch back.
  const Trace t = ModeTrace({{0, 10, true}, {20, 30, false, 1, kSmallMig}}, 5000);
  const Cluster c = ModeCluster("H100 80GBx1");
  const auto ten_min = RunModePolicy(t, c, "dynmig:mode-switch+min-10m");
  EXPECT_EQ(ten_min.accepted, 2u);
  EXPECT_EQ(ten_min.switches_to_whole, 1u);
  EXPECT_EQ(ten_min.switches_to_mig, 1u);
  EXPECT_DOUBLE_EQ(ten_min.pending_p50, 4.0);                 // the whole-GPU pod
  EXPECT_DOUBLE_EQ(ten_min.pending_p99, 4 + 600 + 2 - 20.0);  // the MIG pod
  const auto one_min = RunModePolicy(t, c, "dynmig:mode-switch+min-1m");
  EXPECT_DOUBLE_EQ(one_min.pending_p99, 4 + 60 + 2 - 20.0);
}

TEST(ModeSimTest, BusyGpuIsNotSwitched) {
  // A MIG pod holds the only GPU until 1000 s: the whole-GPU pod waits for it, then the switch.
  const Trace t = ModeTrace({{0, 1000, false, 1, kSmallMig}, {10, 20, true}}, 5000);
  const Cluster c = ModeCluster("H100 80GBx1");
  const auto r = RunModePolicy(t, c, "dynmig:mode-switch+min-10s");
  EXPECT_EQ(r.switches_to_whole, 1u);
  EXPECT_EQ(r.accepted, 2u);
  EXPECT_DOUBLE_EQ(r.pending_p99, 1000 + 2 - 10.0);
  // With the horizon before the MIG pod ends, nothing ever switches.
  const auto early = RunModePolicy(ModeTrace({{0, 1000, false, 1, kSmallMig}, {10, 20, true}}, 900),
                                   c, "dynmig:mode-switch+min-10s");
  EXPECT_EQ(early.switches_to_whole, 0u);
  EXPECT_EQ(early.never_started, 1u);
}

TEST(ModeSimTest, FixedPoolsNeverSwitch) {
  // Two GPUs, the first whole for good: three whole-GPU pods run one after the other on it, and
  // two full-GPU MIG pods one after the other on the second (the whole GPU takes no instance).
  const Trace t = ModeTrace({{0, 100, true},
                             {0, 100, true},
                             {0, 100, true},
                             {0, 100, false, 1, 100},
                             {0, 100, false, 1, 100}},
                            1000);
  const Cluster c = ModeCluster("A100-SXM4-40GBx2");
  const auto r = RunModePolicy(t, c, "pools:1");
  EXPECT_EQ(r.switches_to_whole + r.switches_to_mig, 0u);
  EXPECT_EQ(r.rounds, 0u);
  EXPECT_EQ(r.whole_gpus_at_start, 1u);
  EXPECT_DOUBLE_EQ(r.mean_whole_gpus, 1.0);
  EXPECT_EQ(r.accepted, 5u);
  EXPECT_DOUBLE_EQ(r.pending_p99, 200.0);  // the third whole-GPU pod
  // No whole GPU: whole-GPU pods never start.
  const auto none = RunModePolicy(t, c, "pools:0");
  EXPECT_EQ(none.whole_accepted, 0u);
  EXPECT_EQ(none.mig_accepted, 2u);
  EXPECT_DOUBLE_EQ(none.pending_p50, 1000.0);
}

TEST(ModeSimTest, MultiGpuWholePodTakesOneNode) {
  // Two nodes of two GPUs, both whole: a 2-GPU pod fits one node; a 3-GPU pod fits none and is
  // counted unservable (a node has 2 GPUs).
  const Trace t = ModeTrace({{0, 100, true, 2}, {1, 100, true, 2}, {2, 100, true, 3}}, 1000);
  const Cluster c = ModeCluster("A100-SXM4-40GBx4", 2);
  ModeSimOptions o;
  auto r = SimulateModes(t, c, {"pools:4"}, o, RealClock());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->unservable, 1u);
  EXPECT_EQ(r->pods, 2u);
  EXPECT_EQ(r->policies[0].accepted, 2u);
}

TEST(ModeSimTest, ResultsAndBestPools) {
  auto c = ModeCluster("A100-SXM4-40GBx16");
  auto t = GenerateTrace("pods=400,load=0.9,whole=0.3", 3, c);
  ASSERT_TRUE(t.ok()) << t.status();
  ModeSimOptions o;
  o.nvml_latency = mig::RealisticNvmlLatency();
  auto r = SimulateModes(*t, c, {"pools:0", "pools:8", "pools:16", "dynmig:mode-switch"}, o,
                         RealClock());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->policies.size(), 4u);
  EXPECT_EQ(r->whole_pods + r->mig_pods, r->pods);
  EXPECT_GT(r->whole_pods, 0u);
  EXPECT_GE(r->best_pools, 0);
  EXPECT_LT(r->best_pools, 3);
  const auto& sw = r->policies[3];
  EXPECT_TRUE(sw.switching);
  EXPECT_GT(sw.switches_to_whole, 0u);
  // Every switch on an A100 costs 12 s of its GPU.
  EXPECT_NEAR(sw.switch_gpu_hours, (sw.switches_to_whole + sw.switches_to_mig) * 12.0 / 3600, 1e-9);
  EXPECT_EQ(r->policies[0].whole_accepted, 0u);
  auto j = nlohmann::json::parse(FormatModeJson(*r));
  EXPECT_EQ(j["policies"].size(), 4u);
  EXPECT_EQ(j["policies"][3]["switchesToWhole"], sw.switches_to_whole);
  EXPECT_EQ(j["bestPools"], r->policies[r->best_pools].name);
  const std::string text = FormatModeText(*r);
  EXPECT_THAT(text, HasSubstr("A100-SXM4-40GB 12s (with a GPU reset)"));
  EXPECT_THAT(text, HasSubstr("dynmig:mode-switch"));
  EXPECT_THAT(FormatModeCsv(*r), HasSubstr("policy,wholeGpusAtStart,"));
}

TEST(ModeSimTest, PolicySpecsAreBounded) {
  const Cluster c = ModeCluster("A100-SXM4-40GBx16");
  for (const char* bad :
       {"pools:-1", "pools:17", "pools:abc", "pools:", "pools:99999999999999999999",
        "dynmig:mode-switch+min-5s", "dynmig:mode-switch+min-25h", "dynmig:mode-switch+min-x",
        "dynmig:mode-switch+interval-0s", "dynmig:mode-switch+interval-11m",
        "dynmig:mode-switch+bogus", "dynmig"}) {
    auto s = ParseModePolicy(bad, c);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  auto ok = ParseModePolicy("dynmig:mode-switch+min-30s+interval-5s", c);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->min_mode_duration, absl::Seconds(30));
  EXPECT_EQ(ok->interval, absl::Seconds(5));
  auto sweep = ExpandPools("sweep", c);
  ASSERT_TRUE(sweep.ok());
  EXPECT_EQ(*sweep, (std::vector<std::string>{"pools:0", "pools:8", "pools:16"}));
  auto step = ExpandPools("sweep:5", c);
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(step->back(), "pools:16");
  EXPECT_EQ(step->size(), 5u);
  for (const char* bad : {"sweep:0", "sweep:x", "sweep:", "4,abc", "4,17"}) {
    EXPECT_FALSE(ExpandPools(bad, c).ok()) << bad;
  }
  // A sweep of a huge cluster in steps of one is refused rather than run.
  const Cluster big = ModeCluster("A100-SXM4-40GBx2000");
  auto huge = ExpandPools("sweep:1", big);
  EXPECT_FALSE(huge.ok());
  EXPECT_THAT(huge.status().message(), HasSubstr("expected 1 to 1000"));
}

TEST(ModeSimTest, GeneratorWholeShare) {
  const Cluster c = ModeCluster("A100-SXM4-40GBx64");
  auto plain = GenerateTrace("pods=2000", 4, c);
  auto mixed = GenerateTrace("pods=2000,whole=0.25", 4, c);
  ASSERT_TRUE(plain.ok() && mixed.ok());
  size_t whole = 0;
  for (size_t k = 0; k < mixed->pods.size(); ++k) {
    const auto& p = mixed->pods[k];
    EXPECT_FALSE(plain->pods[k].whole);
    if (!p.whole) continue;
    ++whole;
    EXPECT_EQ(p.percent, 100u);
    EXPECT_TRUE(p.count == 1 || p.count == 2 || p.count == 4 || p.count == 8) << p.count;
  }
  EXPECT_GT(whole, 400u);
  EXPECT_LT(whole, 600u);
  auto ones = GenerateTrace("pods=500,whole=1,wholemix=2:1", 4, c);
  ASSERT_TRUE(ones.ok());
  for (const auto& p : ones->pods) EXPECT_TRUE(p.whole && p.count == 2);
}

TEST(ModeSimTest, GeneratorRefusesHostileWholeSpecs) {
  const Cluster c = ModeCluster("A100-SXM4-40GBx8");
  const std::string many = "pods=10,whole=0.5,wholemix=" + [] {
    std::string s;
    for (int k = 0; k < 65; ++k) s += (k ? "/" : "") + std::string("1:1");
    return s;
  }();
  for (const std::string& bad :
       {std::string("whole=2"), std::string("whole=-1"), std::string("whole=abc"),
        std::string("whole=nan"), std::string("whole=0.5,wholemix=1000:1"),
        std::string("whole=0.5,wholemix=0:1"), std::string("whole=0.5,wholemix=2.5:1"),
        std::string("whole=0.5,wholemix=17:1"), std::string("whole=0.5,wholemix=1:-1"),
        std::string("whole=0.5,wholemix=1:0"), std::string("whole=0.5,wholemix=4"),
        std::string("whole=0.5,wholemix=") + std::string(2000, '1'), many}) {
    auto t = GenerateTrace(bad, 1, c);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(t.status().message(), HasSubstr("--generate: whole")) << bad;
  }
}

TEST(ModeSimTest, TraceMarksWholeGpuPods) {
  auto t = ParseAlibabaCsv(
      "name,num_gpu,gpu_milli,creation_time,deletion_time\n"
      "a,1,1000,0,10\n"
      "b,2,0,1,10\n"
      "c,1,500,2,10\n"
      "d,1,995,3,10\n",
      "pods.csv");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->pods.size(), 4u);
  EXPECT_TRUE(t->pods[0].whole);
  EXPECT_TRUE(t->pods[1].whole);
  EXPECT_EQ(t->pods[1].count, 2u);
  EXPECT_FALSE(t->pods[2].whole);
  EXPECT_FALSE(t->pods[3].whole);  // 100 % of the memory as a MIG instance, not a whole GPU
  EXPECT_EQ(t->pods[3].percent, 100u);
}

}  // namespace
}  // namespace dynmig::sim
