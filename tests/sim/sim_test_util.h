// Helpers shared by the simulator's tests.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "sim/cluster.h"
#include "sim/policies.h"
#include "sim/simulator.h"
#include "sim/trace.h"

namespace dynmig::sim::testing {

// Percentages that resolve to these A100-40GB profiles (smallest covering).
inline constexpr uint32_t k1g5 = 12;     // 4824 MiB -> 1g.5gb
inline constexpr uint32_t k1g10 = 24;    // 9647 MiB -> 1g.10gb
inline constexpr uint32_t k3g20 = 49;    // 19695 MiB -> 3g.20gb
inline constexpr uint32_t kWhole = 100;  // 7g.40gb

struct P {
  double arrival;
  double departure;
  uint32_t percent;
  uint32_t count = 1;
};

// Simulate `t` on `c` under `policies` in `mode` (16 samples); a failure is a test failure.
inline SimResult RunSim(const Trace& t, const Cluster& c, std::vector<std::string> policies,
                        Mode mode) {
  SimOptions o;
  o.mode = mode;
  o.samples = 16;
  auto r = Simulate(t, c, policies, o, RealClock());
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : SimResult{};
}

inline Trace MakeTrace(const std::vector<P>& ps) {
  Trace t;
  t.source = "test";
  uint32_t line = 2;
  for (const auto& p : ps) {
    TracePod tp;
    tp.arrival = p.arrival;
    tp.departure = p.departure;
    tp.percent = p.percent;
    tp.count = p.count;
    tp.line = line++;
    t.pods.push_back(tp);
    t.end = std::max({t.end, p.arrival, p.departure});
  }
  t.start = t.pods.empty() ? 0 : t.pods.front().arrival;
  return t;
}

// SimPods as Simulate prepares them.
inline std::vector<SimPod> MakePods(const Cluster& c, const std::vector<P>& ps) {
  std::vector<SimPod> out;
  std::vector<std::pair<uint32_t, uint32_t>> classes;
  uint32_t slots = 0;
  for (const auto& p : ps) {
    SimPod s;
    s.arrival = p.arrival;
    s.departure = p.departure;
    s.count = p.count;
    s.percent = p.percent;
    auto key = std::make_pair(p.count, p.percent);
    auto it = std::find(classes.begin(), classes.end(), key);
    if (it == classes.end()) {
      classes.push_back(key);
      it = classes.end() - 1;
    }
    s.cls = static_cast<uint32_t>(it - classes.begin());
    s.inst_offset = slots;
    slots += p.count;
    s.asked_units = c.AskedUnits(p.count, p.percent);
    s.line = static_cast<uint32_t>(out.size()) + 2;
    out.push_back(s);
  }
  return out;
}

inline Cluster A100(uint32_t gpus, uint32_t per_node = 8) {
  auto c = BuildCluster(fmt::format("A100-SXM4-40GBx{}", gpus), per_node, {});
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

// A seeded pseudo-random sequence for the churn tests (a 64-bit LCG; the same on every machine).
class Lcg {
 public:
  explicit Lcg(uint64_t seed) : x_(seed) {}
  uint32_t Next() {
    x_ = x_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<uint32_t>(x_ >> 33);
  }

 private:
  uint64_t x_;
};

// The result of policy `name` in `r` (a test failure when there is none).
inline const PolicyResult& PolicyResultOf(const SimResult& r, const std::string& name) {
  for (const auto& p : r.policies) {
    if (p.name == name) return p;
  }
  ADD_FAILURE() << "no policy " << name;
  return r.policies.front();
}

}  // namespace dynmig::sim::testing
