// Planner figures: single-GPU decisions per second, and one pod evaluated against a whole cluster
// (5,000 nodes x 8 half-occupied A100-40GB GPUs). Prints figures; asserts nothing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "mig/catalogue.h"
#include "mig/node_planner.h"
#include "mig/planner.h"

using namespace dynmig::mig;
using Clock = std::chrono::steady_clock;

namespace {

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A random legal occupancy with about `target` of the units reserved.
GpuUsage RandomUsage(const GpuPlanner& p, std::mt19937& rng, uint32_t target_units) {
  GpuUsage u;
  const auto& profiles = p.capability().profiles;
  for (int tries = 0;
       tries < 64 && static_cast<uint32_t>(__builtin_popcount(u.occupied)) < target_units;
       ++tries) {
    const uint32_t idx = p.allowed()[rng() % p.allowed().size()];
    const auto& spec = profiles[idx];
    const auto& pl = spec.placements[rng() % spec.placements.size()];
    if ((u.occupied & pl.Mask()) || u.counts[idx] >= spec.instance_count) continue;
    if (__builtin_popcount(u.occupied | pl.Mask()) > static_cast<int>(target_units)) continue;
    u.occupied |= pl.Mask();
    ++u.counts[idx];
  }
  return u;
}

}  // namespace

int main(int argc, char** argv) {
  // `bench_planner profile N`: only N cluster decisions, for valgrind --tool=callgrind (counts
  // instructions, which stay comparable on a busy machine).
  const bool profile = argc > 2 && std::string(argv[1]) == "profile";
  const int profile_reps = profile ? std::atoi(argv[2]) : 0;
  const auto& cap = (*FindModel("A100-SXM4-40GB"))->capability;
  auto planner = *GpuPlanner::Create(cap, {"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"});
  std::mt19937 rng(7);

  // 1. Single-GPU decisions: one instance, random occupancy and memory.
  if (!profile) {
    std::vector<GpuUsage> states;
    for (int i = 0; i < 4096; ++i) states.push_back(RandomUsage(*planner, rng, rng() % 8));
    const uint64_t mems[] = {4000, 9000, 19000, 40000};
    const Preference none;
    long fits = 0;
    const long n = 4'000'000;
    auto t0 = Clock::now();
    for (long i = 0; i < n; ++i) {
      const uint64_t m[1] = {mems[i & 3]};
      fits += planner->Plan(states[i & 4095], m, none).verdict == Verdict::kFits;
    }
    auto t1 = Clock::now();
    std::printf("single-GPU decisions (1 instance): %.2f M/s per core (%.0f ns each, %ld fit)\n",
                n / Seconds(t0, t1) / 1e6, Seconds(t0, t1) / n * 1e9, fits);
    const long n3 = 400'000;
    t0 = Clock::now();
    for (long i = 0; i < n3; ++i) {
      const uint64_t m[3] = {4000, 9000, mems[i & 3]};
      fits += planner->Plan(states[i & 4095], m, none).verdict == Verdict::kFits;
    }
    t1 = Clock::now();
    std::printf("single-GPU decisions (3 instances jointly): %.2f M/s per core (%.0f ns each)\n",
                n3 / Seconds(t0, t1) / 1e6, Seconds(t0, t1) / n3 * 1e9);
  }

  // 2. A whole cluster for one pod: 5,000 nodes x 8 GPUs, each about half occupied.
  {
    std::vector<NodeView> nodes(5000);
    for (size_t i = 0; i < nodes.size(); ++i) {
      nodes[i].name = "node-" + std::to_string(i);
      for (uint32_t g = 0; g < 8; ++g) {
        GpuView gpu;
        gpu.uuid = "GPU-" + std::to_string(i) + "-" + std::to_string(g);
        gpu.index = g;
        gpu.model = cap.model;
        gpu.planner = planner;
        gpu.usage = RandomUsage(*planner, rng, 4);
        nodes[i].gpus.push_back(std::move(gpu));
      }
    }
    if (profile) {
      PodRequest req;
      req.containers.push_back({"main", false, 1, {4000, 0}});
      int chosen = 0;
      for (int rep = 0; rep < profile_reps; ++rep) chosen += PlanPod(nodes, req).chosen >= 0;
      std::printf("%d decisions\n", chosen);
      return 0;
    }
    for (uint64_t mem : {4000u, 19000u}) {
      PodRequest req;
      req.containers.push_back({"main", false, 1, {mem, 0}});
      std::vector<double> samples;
      for (int rep = 0; rep < 60; ++rep) {
        auto t0 = Clock::now();
        PodPlan plan = PlanPod(nodes, req);
        auto t1 = Clock::now();
        if (plan.chosen < 0) std::printf("(no node fits)\n");
        samples.push_back(Seconds(t0, t1) * 1e3);
      }
      std::sort(samples.begin(), samples.end());
      std::printf(
          "one pod (%lu MiB) over 5000 nodes x 8 half-occupied GPUs: p50 %.2f ms, p99 %.2f ms "
          "(%.0f decisions/s per core)\n",
          static_cast<unsigned long>(mem), samples[samples.size() / 2],
          samples[samples.size() * 99 / 100], 1e3 / samples[samples.size() / 2]);
    }
  }
  return 0;
}
