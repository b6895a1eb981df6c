// Warm instances in the simulator (dynmig:warm): reuse of an exact idle instance, the planner's own
// choice when the idle one is not equally good, TTL and cap, destruction of overlapped idle
// instances with its NVML time, and the effect on time to Running.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "nlohmann/json.hpp"
#include "sim/generator.h"
#include "sim/policies.h"
#include "sim/report.h"
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

std::unique_ptr<Policy> MakeWarm(const Cluster& c, const std::vector<SimPod>& pods,
                                 WarmConfig warm = {}) {
  auto p = MakePolicy("dynmig:warm", c, pods, warm);
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(*p);
}

// The pod whose instance starts at `start` (single-instance pods).
uint32_t PodAt(const Policy& p, uint32_t start) {
  for (const auto& in : p.Snapshot()) {
    if (in.placement.start == start) return in.pod;
  }
  ADD_FAILURE() << "no live instance at " << start;
  return 0;
}

std::vector<uint32_t> Starts(const std::vector<LiveInstance>& v) {
  std::vector<uint32_t> out;
  for (const auto& in : v) out.push_back(in.placement.start);
  std::sort(out.begin(), out.end());
  return out;
}

// No idle instance overlaps a live one or another idle one.
void ExpectDisjoint(const Policy& p) {
  std::map<uint32_t, mig::SliceMask> used;
  for (const auto& in : p.Snapshot()) used[in.gpu] |= in.placement.Mask();
  for (const auto& in : p.IdleSnapshot()) {
    EXPECT_EQ(used[in.gpu] & in.placement.Mask(), 0u)
        << "idle at " << in.placement.ToString() << " on GPU " << in.gpu;
    used[in.gpu] |= in.placement.Mask();
  }
}

TEST(WarmConfig, ParsesAndNamesBadValues) {
  auto w = ParseWarmConfig("90s,3");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->ttl, absl::Seconds(90));
  EXPECT_EQ(w->max_per_gpu, 3u);
  EXPECT_EQ(WarmConfigText(*w), "1m30s,3");
  EXPECT_EQ(WarmConfigText(WarmConfig{}), "5m,2");  // the device plugin's defaults
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"5m", "two values"},
           {"soon,2", "the TTL \"soon\" is not a duration"},
           {"0s,2", "not from 1s to 24h"},
           {"25h,2", "not from 1s to 24h"},
           {"5m,0", "MAX_PER_GPU \"0\" is not a number from 1 to 64"},
           {"5m,65", "from 1 to 64"},
           {"5m,two", "MAX_PER_GPU \"two\""}}) {
    auto bad = ParseWarmConfig(text);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr(why)) << text;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("--warm-instances")) << text;
  }
}

// One GPU filled with seven 1g.5gb pods (placements 0..6). With a cap of 2, the pods at 0 and 1
// leave idle instances, the pod at 2 is destroyed (cap). A new 1g.5gb then goes to 2, not to an
// idle instance: free slices 0-1 keep a 2g.10gb placeable, which 1-2 would not (the planner
// prefers an idle instance only among equally good placements). The next one lands on the idle
// instance at 0 (0 and 1 are equally good) and reuses it.
TEST(WarmPolicy, ReusesAnExactIdleInstanceOnlyWhereThePlannerWouldPlaceAnyway) {
  Cluster c = A100(1);
  std::vector<P> ps(9, P{0, 100, k1g5});
  auto pods = MakePods(c, ps);
  auto p = MakeWarm(c, pods);
  EXPECT_TRUE(p->warm().enabled);
  for (uint32_t i = 0; i < 7; ++i) {
    auto r = p->Place(i, -1);
    ASSERT_TRUE(r.ok() && *r) << i;
  }
  ASSERT_EQ(Starts(p->Snapshot()), (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(p->creates(), 7u);
  for (uint32_t start : {0u, 1u, 2u}) ASSERT_TRUE(p->Remove(PodAt(*p, start)).ok());
  EXPECT_EQ(Starts(p->IdleSnapshot()), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(p->warm().kept, 2u);
  EXPECT_EQ(p->warm().destroyed_cap, 1u);
  EXPECT_EQ(p->destroys(), 1u);

  auto r = p->Place(7, -1);
  ASSERT_TRUE(r.ok() && *r);
  EXPECT_EQ(PodAt(*p, 2), 7u);
  EXPECT_EQ(p->warm().reused, 0u);
  EXPECT_EQ(p->creates(), 8u);
  EXPECT_EQ(Starts(p->IdleSnapshot()), (std::vector<uint32_t>{0, 1}));  // untouched
  ExpectDisjoint(*p);

  r = p->Place(8, -1);
  ASSERT_TRUE(r.ok() && *r);
  EXPECT_EQ(PodAt(*p, 0), 8u);
  EXPECT_EQ(p->warm().reused, 1u);
  EXPECT_EQ(p->creates(), 8u);  // nothing created
  EXPECT_EQ(Starts(p->IdleSnapshot()), (std::vector<uint32_t>{1}));
  EXPECT_EQ(p->warm().destroyed_needed, 0u);
  ExpectDisjoint(*p);
}

// The planner sees the idle instances: on a tie it picks the idle one over the lowest start.
// Slices 0 and 1 are free and equally good for a 1g.5gb (as above); only 1 holds an idle instance
// (cap 1: the instance at 0, released second, was destroyed).
TEST(WarmPolicy, ThePlannerPrefersTheIdleInstanceOnATie) {
  Cluster c = A100(1);
  std::vector<P> ps(8, P{0, 100, k1g5});
  auto pods = MakePods(c, ps);
  WarmConfig warm;
  warm.max_per_gpu = 1;
  auto p = MakeWarm(c, pods, warm);
  for (uint32_t i = 0; i < 7; ++i) ASSERT_TRUE(*p->Place(i, -1));
  for (uint32_t start : {1u, 0u}) ASSERT_TRUE(p->Remove(PodAt(*p, start)).ok());
  EXPECT_EQ(Starts(p->IdleSnapshot()), (std::vector<uint32_t>{1}));
  EXPECT_EQ(p->warm().destroyed_cap, 1u);
  ASSERT_TRUE(*p->Place(7, -1));
  EXPECT_EQ(PodAt(*p, 1), 7u);
  EXPECT_EQ(p->warm().reused, 1u);
  EXPECT_TRUE(p->IdleSnapshot().empty());
  // Without warm instances the same pod takes the lowest start.
  auto cold = MakePolicy("dynmig", c, pods);
  ASSERT_TRUE(cold.ok());
  for (uint32_t i = 0; i < 7; ++i) ASSERT_TRUE(*(*cold)->Place(i, -1));
  for (uint32_t start : {1u, 0u}) ASSERT_TRUE((*cold)->Remove(PodAt(**cold, start)).ok());
  ASSERT_TRUE(*(*cold)->Place(7, -1));
  EXPECT_EQ(PodAt(**cold, 0), 7u);
}

// A placement that overlaps idle instances destroys them first; a different profile never reuses.
TEST(WarmPolicy, APlacementOverlappingIdleInstancesDestroysThem) {
  Cluster c = A100(1);
  auto pods = MakePods(c, {{0, 10, k1g5}, {0, 10, k1g5}, {20, 30, kWhole}});
  auto p = MakeWarm(c, pods);
  ASSERT_TRUE(*p->Place(0, -1));
  ASSERT_TRUE(*p->Place(1, -1));
  ASSERT_TRUE(p->Remove(0).ok());
  ASSERT_TRUE(p->Remove(1).ok());
  EXPECT_EQ(p->IdleSnapshot().size(), 2u);
  EXPECT_EQ(p->used_units(), 0u);  // idle slices are free
  auto r = p->Place(2, -1);
  ASSERT_TRUE(r.ok() && *r) << r.status();
  EXPECT_EQ(p->warm().reused, 0u);
  EXPECT_EQ(p->warm().destroyed_needed, 2u);
  EXPECT_TRUE(p->IdleSnapshot().empty());
  EXPECT_EQ(p->creates(), 3u);
  EXPECT_EQ(p->destroys(), 2u);
}

TEST(WarmPolicy, IdleInstancesExpireAfterTheTtl) {
  Cluster c = A100(1);
  auto pods = MakePods(c, {{0, 10, k1g5}});
  WarmConfig warm;
  warm.ttl = absl::Seconds(60);
  auto p = MakeWarm(c, pods, warm);
  p->AdvanceTo(0);
  ASSERT_TRUE(*p->Place(0, -1));
  p->AdvanceTo(10);
  ASSERT_TRUE(p->Remove(0).ok());
  p->AdvanceTo(69.9);
  EXPECT_EQ(p->IdleSnapshot().size(), 1u);
  EXPECT_EQ(p->warm().destroyed_ttl, 0u);
  p->AdvanceTo(70);  // idle for exactly the TTL: destroyed, as the device plugin does
  EXPECT_TRUE(p->IdleSnapshot().empty());
  EXPECT_EQ(p->warm().destroyed_ttl, 1u);
  EXPECT_EQ(p->warm().idle_at_end, 0u);
  EXPECT_EQ(p->destroys(), 1u);
}

TEST(WarmPolicy, OtherPoliciesHaveNone) {
  Cluster c = A100(1);
  auto pods = MakePods(c, {{0, 10, k1g5}, {20, 30, k1g5}});
  auto p = MakePolicy("dynmig", c, pods);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE((*p)->warm().enabled);
  ASSERT_TRUE(*(*p)->Place(0, -1));
  ASSERT_TRUE((*p)->Remove(0).ok());
  EXPECT_TRUE((*p)->IdleSnapshot().empty());
  EXPECT_EQ((*p)->destroys(), 1u);
  auto bad = MakePolicy("dynmig:warmish", c, pods);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("binds-in-flight-N, warm"));
}

SimOptions Latency(Mode mode, WarmConfig warm = {}) {
  SimOptions o;
  o.mode = mode;
  o.samples = 16;
  o.warm = warm;
  auto latency =
      mig::ParseNvmlLatency("create-gi=1s,create-ci=500ms,destroy-gi=300ms,destroy-ci=200ms");
  EXPECT_TRUE(latency.ok());
  o.nvml_latency = *latency;
  return o;
}

// The time to Running: a reused instance costs nothing, a destroyed idle instance costs its
// destroy time in the pod that needed its slices, an expired one nothing.
TEST(WarmSimulate, NvmlTimeOfReuseTtlAndNeededDestroys) {
  Cluster c = A100(1);
  WarmConfig warm;
  warm.ttl = absl::Seconds(100);
  // 0: 1g created (1.5 s), idle from 10; 1: 1g at 20 reuses it (0 s), idle again from 30; 2: a
  // whole GPU at 40 destroys that idle instance (0.5 s) and creates its own (1.5 s), idle from 150
  // until its TTL at 250; 3: 1g at 300 is created (1.5 s), idle from 310 (the end) on.
  Trace t = MakeTrace({{0, 10, k1g5}, {20, 30, k1g5}, {40, 150, kWhole}, {300, 310, k1g5}});
  auto r = Simulate(t, c, {"dynmig", "dynmig:warm"}, Latency(Mode::kReject, warm), RealClock());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->warm.has_value());
  EXPECT_EQ(WarmConfigText(*r->warm), "1m40s,2");
  const PolicyResult& cold = testing::PolicyResultOf(*r, "dynmig");
  const PolicyResult& hot = testing::PolicyResultOf(*r, "dynmig:warm");
  EXPECT_FALSE(cold.warm.enabled);
  EXPECT_DOUBLE_EQ(cold.nvml_mean, 1.5);
  EXPECT_EQ(cold.creates, 4u);
  EXPECT_TRUE(hot.warm.enabled);
  EXPECT_EQ(hot.accepted, cold.accepted);
  EXPECT_EQ(hot.warm.kept, 4u);  // every ended pod's instance
  EXPECT_EQ(hot.warm.reused, 1u);
  EXPECT_EQ(hot.warm.destroyed_needed, 1u);
  EXPECT_EQ(hot.warm.destroyed_ttl, 1u);
  EXPECT_EQ(hot.warm.destroyed_cap, 0u);
  EXPECT_EQ(hot.warm.idle_at_end, 1u);
  EXPECT_EQ(hot.creates, 3u);
  EXPECT_EQ(hot.destroys, 2u);
  EXPECT_DOUBLE_EQ(hot.nvml_mean, (1.5 + 0 + 2.0 + 1.5) / 4);
  EXPECT_DOUBLE_EQ(hot.running_p50, 1.5);
  EXPECT_DOUBLE_EQ(hot.running_p99, 2.0);
}

// Generated churn that fits a 16-GPU cluster with room to spare: every pod is accepted with and
// without warm instances (the idle preference only breaks ties, and nothing is ever short of
// slices), while warm instances reuse instances and cut the NVML time. In queue mode too.
TEST(WarmSimulate, SameAcceptanceWhereEverythingFitsAndLessNvmlTime) {
  Cluster c = A100(16);
  auto t = GenerateTrace("pods=3000,load=0.3,life=fixed:600,mix=1g:0.6/2g:0.2/3g:0.2", 7, c);
  ASSERT_TRUE(t.ok()) << t.status();
  for (Mode mode : {Mode::kReject, Mode::kQueue}) {
    auto r = Simulate(*t, c, {"dynmig", "dynmig:warm"}, Latency(mode), RealClock());
    ASSERT_TRUE(r.ok()) << r.status();
    const PolicyResult& cold = testing::PolicyResultOf(*r, "dynmig");
    const PolicyResult& hot = testing::PolicyResultOf(*r, "dynmig:warm");
    EXPECT_EQ(cold.accepted, r->pods) << ModeName(mode);
    EXPECT_EQ(hot.accepted, cold.accepted) << ModeName(mode);
    EXPECT_GT(hot.warm.reused, r->pods / 4) << ModeName(mode);
    EXPECT_EQ(hot.creates + hot.warm.reused, cold.creates) << ModeName(mode);
    EXPECT_LT(hot.nvml_mean, cold.nvml_mean) << ModeName(mode);
    EXPECT_LE(hot.running_p50, cold.running_p50) << ModeName(mode);
    // Every instance kept idle ends reused, destroyed (TTL or needed) or still idle.
    EXPECT_EQ(hot.warm.kept, hot.warm.reused + hot.warm.destroyed_ttl + hot.warm.destroyed_needed +
                                 hot.warm.idle_at_end)
        << ModeName(mode);
  }
}

// Random churn with warm instances on a small, contended cluster: live instances stay legal and
// disjoint, no idle instance overlaps a live one or another, and no GPU keeps more than the cap.
TEST(WarmPolicy, RandomChurnKeepsIdleInstancesDisjointAndCapped) {
  Cluster c = A100(6, 3);
  std::vector<P> ps;
  testing::Lcg lcg(4242);
  auto next = [&] { return lcg.Next(); };
  const uint32_t sizes[] = {k1g5, k1g5, testing::k1g10, k3g20, 30, kWhole, 8, 60};
  for (int i = 0; i < 600; ++i) {
    const uint32_t count = next() % 10 == 0 ? 1 + next() % 3 : 1;
    ps.push_back({static_cast<double>(i), static_cast<double>(i + 1 + next() % 40),
                  sizes[next() % 8], count});
  }
  auto pods = MakePods(c, ps);
  WarmConfig warm;
  warm.ttl = absl::Seconds(30);
  warm.max_per_gpu = 3;
  auto p = MakeWarm(c, pods, warm);
  std::vector<bool> live(pods.size(), false);
  for (uint32_t i = 0; i < pods.size(); ++i) {
    for (uint32_t j = 0; j < i; ++j) {
      if (live[j] && pods[j].departure <= pods[i].arrival) {
        p->AdvanceTo(pods[j].departure);
        ASSERT_TRUE(p->Remove(j).ok());
        live[j] = false;
      }
    }
    p->AdvanceTo(pods[i].arrival);
    auto r = p->Place(i, -1);
    ASSERT_TRUE(r.ok()) << r.status();
    live[i] = *r;
    ExpectDisjoint(*p);
    std::map<uint32_t, uint32_t> per_gpu;
    for (const auto& in : p->IdleSnapshot()) {
      EXPECT_LE(++per_gpu[in.gpu], warm.max_per_gpu) << "GPU " << in.gpu;
    }
  }
  const WarmStats& w = p->warm();
  EXPECT_GT(w.reused, 0u);
  EXPECT_GT(w.destroyed_ttl, 0u);
  EXPECT_GT(w.destroyed_cap + w.destroyed_needed, 0u);
  EXPECT_EQ(w.idle_at_end, p->IdleSnapshot().size());
  EXPECT_EQ(w.kept, w.reused + w.destroyed_ttl + w.destroyed_needed + w.idle_at_end);
}

TEST(WarmReport, TextJsonCsv) {
  Cluster c = A100(1);
  Trace t = MakeTrace({{0, 10, k1g5}, {20, 30, k1g5}});
  auto r = Simulate(t, c, {"dynmig", "dynmig:warm"}, Latency(Mode::kReject), RealClock());
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string text = FormatText(*r);
  EXPECT_THAT(text, HasSubstr("warm instances (5m,2: idle for at most 5m, at most 2 per GPU)"));
  EXPECT_THAT(text, ::testing::ContainsRegex("dynmig:warm +2 +1 +0 +0 +0 +1\n"));
  const auto j = nlohmann::json::parse(FormatJson(*r));
  EXPECT_EQ(j["warmInstances"], "5m,2");
  EXPECT_FALSE(j["policies"][0].contains("warm"));
  EXPECT_EQ(j["policies"][1]["warm"]["reused"], 1);
  EXPECT_EQ(j["policies"][1]["warm"]["kept"], 2);
  EXPECT_EQ(j["policies"][1]["warm"]["idleAtEnd"], 1);
  const std::string csv = FormatCsv(*r);
  EXPECT_THAT(csv, HasSubstr(",warmKept,warmReused,warmDestroyedTtl,warmDestroyedCap,"
                             "warmDestroyedNeeded,evictions,evictionsPerAcceptedPod\n"));
  EXPECT_THAT(csv, HasSubstr(",,,,,,0,0.000000\ndynmig:warm,"));
  EXPECT_THAT(csv, ::testing::EndsWith(",2,1,0,0,0,0,0.000000\n"));
  // Without a warm policy, nothing about warm instances is shown.
  auto plain = Simulate(t, c, {"dynmig"}, Latency(Mode::kReject), RealClock());
  ASSERT_TRUE(plain.ok());
  EXPECT_THAT(FormatText(*plain), ::testing::Not(HasSubstr("warm instances")));
  EXPECT_FALSE(nlohmann::json::parse(FormatJson(*plain)).contains("warmInstances"));
}

}  // namespace
}  // namespace dynmig::sim
