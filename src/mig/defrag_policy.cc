#include "mig/defrag_policy.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "fmt/format.h"
#include "fmt/ranges.h"

namespace dynmig::mig {

std::string EvictionRefusal(const MovablePod& pod, const DefragRules& rules) {
  if (!pod.opt_error.empty()) return "its dynmig.io/defrag is unreadable: " + pod.opt_error;
  if (pod.opted_out) return "it opted out (dynmig.io/defrag: never)";
  if (rules.system_namespaces.count(pod.ns)) {
    return fmt::format("it runs in the system namespace {}", pod.ns);
  }
  if (!pod.has_controller) return "no controller owns it: nothing would recreate it";
  if (pod.terminating) return "it is terminating already";
  if (pod.pdbs.size() > 1) {
    return fmt::format("more than one PodDisruptionBudget selects it ({})",
                       fmt::join(pod.pdbs, ", "));
  }
  for (const auto& pdb : pod.pdbs) {
    auto it = rules.pdb_allowed.find(pdb);
    if (it == rules.pdb_allowed.end() || it->second <= 0) {
      return fmt::format("its PodDisruptionBudget {} allows no disruption now", pdb);
    }
  }
  return "";
}

int CoveringProfile(const GpuPlanner& planner, const MemoryRequest& memory) {
  const uint64_t want = ResolveMemory(memory.mib, memory.percent, planner.capability());
  for (uint32_t idx : planner.allowed()) {
    if (planner.capability().profiles[idx].SizingMib() >= want) return static_cast<int>(idx);
  }
  return -1;
}

namespace {

constexpr int64_t kYoungest = std::numeric_limits<int64_t>::max();

}  // namespace

DefragDecision ChooseDefragPlan(std::span<const DefragGpu> gpus, std::string_view profile_query,
                                const std::map<std::string, MovablePod>& pods,
                                const DefragRules& rules) {
  DefragDecision out;
  // Per owner, once: why it may not move.
  std::map<std::string, std::string> refusal;
  for (const auto& g : gpus) {
    for (const auto& r : g.reservations) {
      if (r.owner.empty() || refusal.count(r.owner)) continue;
      auto it = pods.find(r.owner);
      refusal[r.owner] =
          it == pods.end() ? "its facts are unknown" : EvictionRefusal(it->second, rules);
    }
  }
  OwnerJudge judge;
  judge.judge = [&](const std::set<std::string>& owners,
                    std::string& why) -> std::optional<std::vector<int64_t>> {
    std::map<std::string, int64_t> taken;  // budget -> pods of the plan it selects
    int64_t max_priority = std::numeric_limits<int64_t>::min();
    int64_t oldest = kYoungest;
    int64_t opted_in = 0;
    for (const auto& o : owners) {
      const MovablePod& p = pods.at(o);  // pinned owners never reach the judge
      for (const auto& pdb : p.pdbs) ++taken[pdb];
      max_priority = std::max<int64_t>(max_priority, p.priority);
      oldest = std::min(oldest, p.created);
      opted_in += p.opted_in ? 1 : 0;
    }
    for (const auto& [pdb, n] : taken) {
      auto it = rules.pdb_allowed.find(pdb);
      const int64_t allowed = it == rules.pdb_allowed.end() ? 0 : it->second;
      if (n > allowed) {
        why = fmt::format("PodDisruptionBudget {} allows {} disruption{}, the plan needs {}", pdb,
                          allowed, allowed == 1 ? "" : "s", n);
        return std::nullopt;
      }
    }
    // Lower is better: lowest priority, youngest oldest pod, most opted in.
    return std::vector<int64_t>{max_priority, -oldest, -opted_in};
  };
  struct Found {
    size_t gpu;
    EvictionPlan plan;
  };
  std::vector<Found> found;
  for (size_t i = 0; i < gpus.size(); ++i) {
    const DefragGpu& g = gpus[i];
    const std::string where = fmt::format("{} GPU {}", g.node, g.index);
    if (g.planner == nullptr) continue;
    if (!g.healthy) {
      out.reasons.push_back(fmt::format("{}: unhealthy: {}", where, g.unhealthy_reason));
      continue;
    }
    std::vector<Reservation> reservations = g.reservations;
    for (auto& r : reservations) {
      if (!r.owner.empty() && !refusal.at(r.owner).empty()) r.owner.clear();  // pinned
    }
    auto plan = PlanEviction(*g.planner, reservations, profile_query, &judge);
    if (!plan.ok()) {
      out.reasons.push_back(fmt::format("{}: {}", where, std::string(plan.status().message())));
      continue;
    }
    if (!plan->feasible) {
      // Which pods were kept in place, and why (once each).
      std::set<std::string> kept;
      std::vector<std::string> why;
      for (const auto& r : g.reservations) {
        if (r.owner.empty() || refusal.at(r.owner).empty() || !kept.insert(r.owner).second)
          continue;
        why.push_back(fmt::format("{}: {}", r.owner, refusal.at(r.owner)));
      }
      out.reasons.push_back(
          fmt::format("{}: {}{}", where, plan->reason,
                      why.empty() ? "" : fmt::format(" ({})", fmt::join(why, "; "))));
      continue;
    }
    if (plan->fits_now()) {  // not waiting because of fragmentation: no plan at all
      out.reasons = {fmt::format("{}: {} fits now, nothing to move", where, plan->profile)};
      return out;
    }
    found.push_back({i, std::move(*plan)});
  }
  if (found.empty()) return out;
  std::stable_sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    if (a.plan.owners.size() != b.plan.owners.size()) {
      return a.plan.owners.size() < b.plan.owners.size();
    }
    if (a.plan.rank != b.plan.rank) return a.plan.rank < b.plan.rank;
    return a.plan.units_moved < b.plan.units_moved;
  });
  for (size_t k = 0; k < found.size() && k <= kMaxDefragAlternatives; ++k) {
    DefragChoice choice{found[k].gpu, std::move(found[k].plan), {}};
    for (const auto& r : gpus[choice.gpu].reservations) {
      if (!r.owner.empty() && !refusal.at(r.owner).empty()) {
        choice.refused[r.owner] = refusal.at(r.owner);
      }
    }
    if (k == 0) {
      out.choice = std::move(choice);
    } else {
      out.alternatives.push_back(std::move(choice));
    }
  }
  return out;
}

std::vector<size_t> DueWaitingPods(std::span<const WaitingPod> pods, int64_t now,
                                   int64_t threshold_s) {
  std::vector<size_t> out;
  for (size_t i = 0; i < pods.size(); ++i) {
    if (now - pods[i].pending_since >= threshold_s) out.push_back(i);
  }
  std::sort(out.begin(), out.end(), [&](size_t a, size_t b) {
    const WaitingPod& x = pods[a];
    const WaitingPod& y = pods[b];
    return std::tie(y.priority, x.pending_since, x.key) <
           std::tie(x.priority, y.pending_since, y.key);
  });
  return out;
}

namespace {
uint64_t FreeAfter(uint64_t total, uint64_t used, uint64_t asked) {
  const uint64_t taken = used + asked;
  return taken >= total ? 0 : total - taken;
}
}  // namespace

bool KeepsHeadroom(uint64_t total, uint64_t used, uint64_t asked, uint32_t percent) {
  return percent == 0 ||
         (total > 0 && FreeAfter(total, used, asked) * 100 >= uint64_t{percent} * total);
}

std::string HeadroomRefusal(uint64_t total, uint64_t used, uint64_t asked, uint32_t percent) {
  if (KeepsHeadroom(total, used, asked, percent)) return "";
  const uint64_t free = FreeAfter(total, used, asked);
  return fmt::format(
      "the cluster would keep {} of its {} slices free once the pod runs, under the {}% kept free "
      "for the pods to come (--defrag-headroom)",
      free, total, percent);
}

std::string RateLimitRefusal(std::span<const EvictionRecord> history, int64_t now,
                             const EvictionLimits& limits, const std::string& node,
                             std::span<const std::string> namespaces) {
  constexpr int64_t kHour = 3600;
  int64_t on_node = 0;
  std::map<std::string, int64_t> per_ns;
  for (const auto& r : history) {
    if (r.at <= now - kHour || r.at > now) continue;
    if (r.node == node) ++on_node;
    ++per_ns[r.ns];
  }
  const int64_t wanted = static_cast<int64_t>(namespaces.size());
  if (on_node + wanted > limits.per_node_per_hour) {
    return fmt::format(
        "the plan evicts {} pod{} on {}, which had {} eviction{} in the last hour (limit {} per "
        "node per hour)",
        wanted, wanted == 1 ? "" : "s", node, on_node, on_node == 1 ? "" : "s",
        limits.per_node_per_hour);
  }
  std::map<std::string, int64_t> want_ns;
  for (const auto& ns : namespaces) ++want_ns[ns];
  for (const auto& [ns, n] : want_ns) {
    const int64_t had = per_ns.count(ns) ? per_ns.at(ns) : 0;
    if (had + n > limits.per_namespace_per_hour) {
      return fmt::format(
          "the plan evicts {} pod{} of namespace {}, which had {} eviction{} in the last hour "
          "(limit {} per namespace per hour)",
          n, n == 1 ? "" : "s", ns, had, had == 1 ? "" : "s", limits.per_namespace_per_hour);
    }
  }
  return "";
}

}  // namespace dynmig::mig
