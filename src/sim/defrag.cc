#include "sim/defrag.h"

#include <algorithm>
#include <charconv>
#include <string>
#include <tuple>

#include "fmt/format.h"
#include "mig/defrag.h"

namespace dynmig::sim {
namespace {

// Owners are pod indexes in decimal ("" = pinned, mig::PlanDefrag's convention).
uint32_t PodOf(const std::string& owner) {
  uint32_t v = 0;
  std::from_chars(owner.data(), owner.data() + owner.size(), v);
  return v;
}

}  // namespace

std::optional<MovePlan> PlanMove(const MoveInput& in, uint32_t pod) {
  const Cluster& cluster = *in.cluster;
  const std::vector<SimPod>& pods = *in.pods;
  const SimPod& waiter = pods[pod];
  if (waiter.count != 1) return std::nullopt;
  std::vector<std::vector<const LiveInstance*>> by_gpu(cluster.gpu_count());
  for (const auto& li : in.live) {
    if (li.gpu < by_gpu.size()) by_gpu[li.gpu].push_back(&li);
  }
  // owners, owners that did not opt in, -(start of the oldest owner), units moved, GPU
  using Key = std::tuple<size_t, size_t, double, uint32_t, uint32_t>;
  std::vector<std::pair<Key, MovePlan>> plans;
  for (const ModelGroup& g : cluster.groups) {
    const auto& cands = g.candidates[waiter.percent];
    if (cands.empty()) continue;
    const std::string& profile = g.profile(cands.front()).name;
    std::vector<mig::DefragGpu> gpus;
    gpus.reserve(g.gpus);
    for (uint32_t gpu = g.first_gpu; gpu < g.first_gpu + g.gpus; ++gpu) {
      mig::DefragGpu d;
      d.node = fmt::format("node-{}", cluster.gpu_node[gpu]);
      d.index = gpu;
      d.planner = g.planner.get();
      for (const LiveInstance* li : by_gpu[gpu]) {
        const SimPod& owner = pods[li->pod];
        const bool movable = owner.defrag != DefragChoice::kOptOut && !in.pinned[li->pod];
        d.reservations.push_back({g.profile(li->profile).name, li->placement,
                                  movable ? std::to_string(li->pod) : std::string()});
      }
      for (const auto& h : in.held) {
        if (h.gpu == gpu) d.reservations.push_back({g.profile(h.profile).name, h.placement, ""});
      }
      gpus.push_back(std::move(d));
    }
    const mig::DefragResult result = mig::PlanDefrag(gpus, profile);
    for (const auto& cand : result.ranked) {
      const uint32_t gpu = g.first_gpu + static_cast<uint32_t>(cand.gpu);
      const mig::EvictionPlan& plan = cand.plan;
      if (!plan.owners.empty() && in.budget(cluster.gpu_node[gpu]) < plan.owners.size()) continue;
      size_t not_opted_in = 0;
      double oldest = 0;
      bool first = true;
      for (const auto& o : plan.owners) {
        const uint32_t p = PodOf(o);
        if (pods[p].defrag != DefragChoice::kOptIn) ++not_opted_in;
        oldest = first ? in.started[p] : std::min(oldest, in.started[p]);
        first = false;
      }
      const Key key{plan.owners.size(), not_opted_in, -oldest, plan.units_moved, gpu};
      const int idx = g.planner->ProfileIndex(plan.profile);
      if (idx < 0) continue;
      MovePlan m;
      m.gpu = gpu;
      m.profile = static_cast<uint32_t>(idx);
      m.placement = plan.placement;
      for (const auto& o : plan.owners) m.evict.push_back(PodOf(o));
      std::sort(m.evict.begin(), m.evict.end());
      plans.emplace_back(key, std::move(m));
    }
  }
  std::sort(plans.begin(), plans.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  uint32_t tried = 0;
  for (size_t k = 0; k < plans.size() && (in.tries == 0 || tried < in.tries); ++k) {
    if (in.allow && !in.allow(plans[k].second)) continue;
    ++tried;
    if (!in.accept || in.accept(plans[k].second)) return std::move(plans[k].second);
  }
  return std::nullopt;
}

}  // namespace dynmig::sim
