#include "sim/simulator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "sim/generator.h"
#include "sim/report.h"
#include "sim_test_util.h"

namespace dynmig::sim {
namespace {

using testing::A100;
using ::testing::HasSubstr;
using testing::k1g10;
using testing::k1g5;
using testing::k3g20;
using testing::kWhole;
using testing::MakeTrace;
using testing::RunSim;

TEST(Simulate, RejectModeLosesWhatDoesNotFit) {
  Cluster c = A100(1);
  Trace t = MakeTrace({{0, 10, kWhole}, {5, 15, kWhole}});
  SimResult r = RunSim(t, c, {"dynmig", "first-fit"}, Mode::kReject);
  for (const auto& p : r.policies) {
    EXPECT_EQ(p.accepted, 1u) << p.name;
    EXPECT_DOUBLE_EQ(p.accepted_count, 0.5);
    EXPECT_DOUBLE_EQ(p.accepted_slice_time, 0.5);
    EXPECT_NEAR(p.mean_utilization, 10.0 / 15.0, 1e-9);
    EXPECT_DOUBLE_EQ(p.peak_utilization, 1.0);
    EXPECT_EQ(p.creates, 1u);
    EXPECT_EQ(p.destroys, 1u);
    ASSERT_EQ(p.rejected_by_profile.size(), 1u);
    EXPECT_EQ(p.rejected_by_profile[0], 1u);
  }
  EXPECT_EQ(r.profiles, std::vector<std::string>{"7g.40gb"});
  EXPECT_FALSE(r.has_gap);
}

TEST(Simulate, QueueModeWaitsAndBackfills) {
  Cluster c = A100(1);
  // A 3g runs 0-10; a whole GPU waits from 1 to 10; a 3g arriving at 2 backfills at once.
  Trace t = MakeTrace({{0, 10, k3g20}, {1, 6, kWhole}, {2, 30, k3g20}, {40, 41, k1g5}});
  SimResult r = RunSim(t, c, {"hami-v2.10", "repack"}, Mode::kQueue);
  for (const auto& p : r.policies) {
    // The whole GPU waits for both 3g pods: the second leaves at 30, so it starts at 30.
    EXPECT_EQ(p.accepted, 4u) << p.name;
    EXPECT_EQ(p.never_started, 0u);
    EXPECT_DOUBLE_EQ(p.pending_p99, 29);
    EXPECT_DOUBLE_EQ(p.pending_p50, 0);
    EXPECT_DOUBLE_EQ(p.pending_mean, 29.0 / 4);
  }
}

// Time to Running: the wait plus the NVML time of the instances the placement created; a static
// geometry's pods land on instances that already exist.
TEST(Simulate, TimeToRunningAddsTheNvmlTimeOfCreatedInstances) {
  Cluster c = A100(1);
  Trace t = MakeTrace({{0, 10, k3g20}, {1, 6, kWhole}, {2, 30, k3g20}, {40, 41, k1g5}});
  SimOptions o;
  o.mode = Mode::kQueue;
  o.samples = 16;
  auto latency = mig::ParseNvmlLatency("create-gi=1s,create-ci=500ms");
  ASSERT_TRUE(latency.ok());
  o.nvml_latency = *latency;
  auto r = Simulate(t, c, {"hami-v2.10", "static:all-1g"}, o, RealClock());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->nvml_latency, "create-gi=1s,create-ci=500ms");
  const PolicyResult& hami = testing::PolicyResultOf(*r, "hami-v2.10");
  // Waits 0, 29, 0, 0; each pod created one instance (1.5 s).
  EXPECT_DOUBLE_EQ(hami.nvml_mean, 1.5);
  EXPECT_DOUBLE_EQ(hami.running_p50, 1.5);
  EXPECT_DOUBLE_EQ(hami.running_p99, 30.5);
  EXPECT_DOUBLE_EQ(hami.running_mean, (1.5 * 4 + 29) / 4);
  const PolicyResult& fixed = testing::PolicyResultOf(*r, "static:all-1g");
  EXPECT_EQ(fixed.accepted, 1u);  // only the 1g pod fits an all-1g GPU
  EXPECT_DOUBLE_EQ(fixed.nvml_mean, 0);
  EXPECT_DOUBLE_EQ(fixed.running_p99, 0);
  // Without a latency model the time to Running is the wait.
  SimResult plain = RunSim(t, c, {"hami-v2.10"}, Mode::kQueue);
  EXPECT_DOUBLE_EQ(plain.policies[0].running_p99, 29);
  EXPECT_EQ(plain.nvml_latency, "none");
  EXPECT_THAT(FormatText(*r), HasSubstr("p99 toRun"));
  const auto j = nlohmann::json::parse(FormatJson(*r));
  EXPECT_DOUBLE_EQ(j["policies"][0]["timeToRunningP99Seconds"].get<double>(), 30.5);
  EXPECT_EQ(j["nvmlLatency"], "create-gi=1s,create-ci=500ms");
}

TEST(Simulate, QueueModeCountsPodsStillWaitingAtTheEnd) {
  Cluster c = A100(1);
  Trace t = MakeTrace({{0, 100, kWhole}, {10, 20, kWhole}});
  SimResult r = RunSim(t, c, {"dynmig"}, Mode::kQueue);
  const auto& p = r.policies[0];
  EXPECT_EQ(p.accepted, 1u);
  EXPECT_EQ(p.never_started, 1u);
  EXPECT_DOUBLE_EQ(p.pending_p99, 90);  // waited from 10 to the end (100)
}

TEST(Simulate, GapClosedBetweenHamiAndRepack) {
  Cluster c = A100(1);
  Trace t = MakeTrace({{0, 9, k1g5}, {1, 10, k3g20}, {2, 11, k1g10}, {3, 12, k1g5}});
  SimResult r = RunSim(t, c, {"dynmig", "hami-v2.10", "first-fit", "repack"}, Mode::kReject);
  EXPECT_TRUE(r.has_gap);
  EXPECT_EQ(testing::PolicyResultOf(r, "hami-v2.10").accepted, 3u);
  EXPECT_EQ(testing::PolicyResultOf(r, "repack").accepted, 4u);
  EXPECT_NEAR(testing::PolicyResultOf(r, "hami-v2.10").accepted_slice_time, 7.0 / 8.0, 1e-9);
  ASSERT_TRUE(testing::PolicyResultOf(r, "dynmig").gap_closed.has_value());
  EXPECT_DOUBLE_EQ(*testing::PolicyResultOf(r, "dynmig").gap_closed, 1.0);
  EXPECT_DOUBLE_EQ(*testing::PolicyResultOf(r, "hami-v2.10").gap_closed, 0.0);
  EXPECT_DOUBLE_EQ(*testing::PolicyResultOf(r, "first-fit").gap_closed, 1.0);
  EXPECT_NEAR(r.gap_span, 1.0 / 8.0, 1e-9);
}

TEST(Simulate, FillModeStopsAtFirstRejectionAndReportsTheBound) {
  Cluster c = A100(1);
  Trace t = MakeTrace({{0, 1, k3g20}, {1, 2, k3g20}, {2, 3, k1g5}, {3, 4, k1g5}});
  SimResult r = RunSim(t, c, {"dynmig", "static:all-1g", "repack"}, Mode::kFill);
  ASSERT_TRUE(r.bound.has_value());
  EXPECT_EQ(r.bound->pods, 2u);
  EXPECT_DOUBLE_EQ(r.bound->filled, 1.0);
  EXPECT_EQ(testing::PolicyResultOf(r, "dynmig").accepted, 2u);
  EXPECT_DOUBLE_EQ(testing::PolicyResultOf(r, "dynmig").filled, 1.0);
  EXPECT_EQ(testing::PolicyResultOf(r, "static:all-1g").accepted,
            0u);  // the first 3g is already rejected
  EXPECT_EQ(r.sample_axis, "arrivals");
  EXPECT_EQ(testing::PolicyResultOf(r, "dynmig").utilization.back(), 1.0);
}

TEST(Simulate, UnservablePodsAreSkipped) {
  auto c = BuildCluster("A100-SXM4-40GBx1", 8, {"1g.5gb", "1g.10gb"});
  ASSERT_TRUE(c.ok());
  Trace t = MakeTrace({{0, 1, k3g20}, {0, 1, k1g5}});
  SimResult r = RunSim(t, *c, {"first-fit"}, Mode::kReject);
  EXPECT_EQ(r.unservable, 1u);
  EXPECT_EQ(r.pods, 1u);
  EXPECT_DOUBLE_EQ(r.policies[0].accepted_count, 1.0);
}

TEST(Report, JsonShape) {
  Cluster c = A100(1);
  Trace t = MakeTrace({{0, 9, k1g5}, {1, 10, k3g20}, {2, 11, k1g10}, {3, 12, k1g5}});
  SimResult r = RunSim(t, c, {"dynmig", "hami-v2.10", "static:all-1g", "repack"}, Mode::kReject);
  auto j = nlohmann::json::parse(FormatJson(r));
  ASSERT_TRUE(j["policies"].is_array());
  ASSERT_EQ(j["policies"].size(), 4u);
  for (const auto& p : j["policies"]) {
    for (const char* key : {"acceptedCount", "acceptedSliceTime", "meanUtilization",
                            "peakUtilization", "fragmentation"}) {
      ASSERT_TRUE(p[key].is_number()) << key;
      EXPECT_GE(p[key].get<double>(), 0.0) << key;
      EXPECT_LE(p[key].get<double>(), 1.0) << key;
    }
    EXPECT_TRUE(p["gapClosed"].is_number());
    EXPECT_TRUE(p["name"].is_string());
    EXPECT_TRUE(p["giCreates"].is_number_unsigned());
    EXPECT_EQ(p["utilization"].size(), 16u);
    EXPECT_TRUE(p["rejectedByProfile"].is_object());
  }
  EXPECT_EQ(j["policies"][0]["name"], "dynmig");
  EXPECT_DOUBLE_EQ(j["policies"][0]["acceptedCount"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["policies"][0]["gapClosed"].get<double>(), 1.0);
  EXPECT_EQ(j["mode"], "reject");
  EXPECT_EQ(j["gpus"], 1);
  EXPECT_EQ(j["sampleX"].size(), 16u);

  SimResult one = RunSim(t, c, {"dynmig"}, Mode::kReject);
  auto j1 = nlohmann::json::parse(FormatJson(one));
  EXPECT_TRUE(j1["policies"][0]["gapClosed"].is_null());
}

TEST(Report, CsvShape) {
  Cluster c = A100(1);
  Trace t = MakeTrace({{0, 1, k3g20}, {1, 2, k3g20}, {2, 3, k1g5}});
  SimResult r = RunSim(t, c, {"dynmig", "repack"}, Mode::kFill);
  const std::string csv = FormatCsv(r);
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < csv.size()) {
    const size_t nl = csv.find('\n', pos);
    lines.push_back(csv.substr(pos, nl - pos));
    pos = nl + 1;
  }
  ASSERT_EQ(lines.size(), 4u);  // header, two policies, bound
  const auto columns = [](const std::string& l) { return std::count(l.begin(), l.end(), ',') + 1; };
  EXPECT_THAT(lines[0],
              ::testing::StartsWith("policy,accepted,acceptedCount,acceptedSliceTime,gapClosed,"));
  for (const auto& l : lines) EXPECT_EQ(columns(l), columns(lines[0])) << l;
  EXPECT_THAT(lines[1], ::testing::StartsWith("dynmig,2,"));
  EXPECT_THAT(lines[3], ::testing::StartsWith("bound,2,"));
}

TEST(Report, TextAndSvg) {
  Cluster c = A100(1);
  Trace t = MakeTrace({{0, 9, k1g5}, {1, 10, k3g20}, {2, 11, k1g10}, {3, 12, k1g5}});
  SimResult r = RunSim(t, c, {"dynmig", "hami-v2.10", "repack"}, Mode::kQueue);
  const std::string text = FormatText(r);
  EXPECT_THAT(text, HasSubstr("policy"));
  EXPECT_THAT(text, HasSubstr("p99 wait"));
  EXPECT_THAT(text, HasSubstr("hami-v2.10"));
  const std::string svg = FormatSvg(r);
  EXPECT_THAT(svg, ::testing::StartsWith("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_THAT(svg, HasSubstr("<polyline"));
  EXPECT_THAT(svg, HasSubstr(">repack</text>"));
  EXPECT_THAT(svg, ::testing::EndsWith("</svg>\n"));
}

TEST(Generator, DeterministicAndValidated) {
  Cluster c = A100(16);
  auto a = GenerateTrace("pods=500,mix=1g:1/3g:1/7gx2:0.5,arrival=daily,life=lognormal:5,1", 7, c);
  auto b = GenerateTrace("pods=500,mix=1g:1/3g:1/7gx2:0.5,arrival=daily,life=lognormal:5,1", 7, c);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(a->pods.size(), 500u);
  size_t doubles = 0;
  for (size_t i = 0; i < a->pods.size(); ++i) {
    EXPECT_EQ(a->pods[i].arrival, b->pods[i].arrival);
    EXPECT_EQ(a->pods[i].percent, b->pods[i].percent);
    EXPECT_GE(a->pods[i].departure, a->pods[i].arrival);
    if (a->pods[i].count == 2) {
      ++doubles;
      EXPECT_EQ(a->pods[i].percent, 100u);
    }
  }
  EXPECT_GT(doubles, 50u);
  EXPECT_LT(doubles, 170u);
  auto other = GenerateTrace("pods=500,mix=1g:1/3g:1/7gx2:0.5", 8, c);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->pods[3].arrival, a->pods[3].arrival);
  // Each class resolves to its profile.
  const ModelGroup& g = c.groups[0];
  for (const auto& p : a->pods) {
    const std::string name = g.profile(g.candidates[p.percent].front()).name;
    EXPECT_TRUE(name == "1g.5gb" || name == "3g.20gb" || name == "7g.40gb") << name;
  }
  auto burst = GenerateTrace("pods=100,arrival=burst,burst=10,rate=1", 1, c);
  ASSERT_TRUE(burst.ok());
  EXPECT_EQ(burst->pods[0].arrival, burst->pods[9].arrival);

  auto key = GenerateTrace("pods=10,colour=blue", 1, c);
  ASSERT_FALSE(key.ok());
  EXPECT_THAT(std::string(key.status().message()), HasSubstr("unknown key \"colour\""));
  auto mix = GenerateTrace("mix=5g:1", 1, c);
  ASSERT_FALSE(mix.ok());
  EXPECT_THAT(std::string(mix.status().message()), HasSubstr("has no allowlisted profile \"5g\""));
  auto arrival = GenerateTrace("arrival=sometimes", 1, c);
  ASSERT_FALSE(arrival.ok());
  EXPECT_THAT(std::string(arrival.status().message()), HasSubstr("is not poisson, daily or burst"));
  auto pods = GenerateTrace("pods=abc", 1, c);
  ASSERT_FALSE(pods.ok());
  EXPECT_EQ(std::string(pods.status().message()), "--generate: pods: \"abc\" is not a number");
}

// Every mode and every default policy on generated churn: the run-time invariant checks pass.
TEST(Simulate, GeneratedChurnInEveryMode) {
  Cluster c = A100(16, 4);
  for (uint64_t seed : {1, 2}) {
    auto t =
        GenerateTrace("pods=1500,mix=1g:0.4/2g:0.2/3g:0.2/7g:0.15/7gx2:0.05,load=1.2", seed, c);
    ASSERT_TRUE(t.ok()) << t.status();
    for (Mode m : {Mode::kReject, Mode::kQueue, Mode::kFill}) {
      SimResult r = RunSim(*t, c, DefaultPolicies(), m);
      ASSERT_EQ(r.policies.size(), DefaultPolicies().size());
      const auto& repack = testing::PolicyResultOf(r, "repack");
      if (m == Mode::kReject) {
        EXPECT_GT(repack.accepted_count, 0.5);
        EXPECT_GE(repack.accepted_count + 0.02,
                  testing::PolicyResultOf(r, "first-fit").accepted_count);
      }
      if (m == Mode::kFill) {
        ASSERT_TRUE(r.bound.has_value());
        for (const auto& p : r.policies) EXPECT_LE(p.filled, r.bound->filled + 1e-9) << p.name;
      }
    }
  }
}

}  // namespace
}  // namespace dynmig::sim
