// When an idle GPU should change mode. See mode_planner.h for the rules.
#include "mig/mode_planner.h"

#include <algorithm>
#include <map>

#include "fmt/format.h"
#include "mig/catalogue.h"

namespace dynmig::mig {
namespace {

ModeKind Other(ModeKind m) { return m == ModeKind::kMig ? ModeKind::kWhole : ModeKind::kMig; }

// "default/a, default/b and 3 more".
std::string PodList(const std::vector<std::string>& pods) {
  constexpr size_t kShown = 3;
  std::string out;
  for (size_t i = 0; i < pods.size() && i < kShown; ++i) {
    if (i > 0) out += ", ";
    out += pods[i];
  }
  if (pods.size() > kShown) out += fmt::format(" and {} more", pods.size() - kShown);
  return out;
}

// Per GPU what the round decided so far.
struct GpuState {
  const ModeNode* node = nullptr;
  size_t node_index = 0;
  const ModeGpu* gpu = nullptr;
  ModeGpuVerdict verdict;
  bool eligible = false;  // rule 1 holds
};

// Rule 6 among a node's candidates: true when a is preferred over b.
bool Preferred(const ModeGpu& a, const ModeGpu& b) {
  const bool ra = SwitchesWithoutReset(a.model), rb = SwitchesWithoutReset(b.model);
  if (ra != rb) return ra;
  if (a.since_ms != b.since_ms) return a.since_ms < b.since_ms;
  return a.index < b.index;
}

}  // namespace

std::string_view ModeKindName(ModeKind mode) {
  return mode == ModeKind::kMig ? "mig" : "hami-core";
}

bool SwitchesWithoutReset(std::string_view nvml_name) {
  if (const CatalogueModel* m = FindModelByNvmlName(nvml_name); m != nullptr) {
    return !m->architecture.starts_with("Ampere");
  }
  // Boards the catalogue does not list by exact name: Hopper and Blackwell families by name.
  for (std::string_view family : {"H100", "H200", "H20", "H800", "GH200", "B200", "B100", "GB200",
                                  "GB300", "B300", "RTX PRO 6000"}) {
    if (nvml_name.find(family) != std::string_view::npos) return true;
  }
  return false;
}

std::string DemandKey(const ModeDemand& demand) {
  return fmt::format("{}:{}", ModeKindName(demand.wants), demand.pod);
}

ModeGpuVerdict GpuEligibility(const ModeNode& node, const ModeGpu& gpu, int64_t now_ms,
                              int64_t min_mode_duration_ms) {
  ModeGpuVerdict v;
  v.node = node.name;
  v.gpu_uuid = gpu.uuid;
  v.index = gpu.index;
  if (!gpu.mig_capable) {
    v.code = "no-mig";
    v.detail = "the GPU has no MIG: it stays whole";
  } else if (!gpu.may_switch) {
    v.code = "not-allowed";
    v.detail = "nvidia.migModeSwitching does not allow this GPU to switch";
  } else if (gpu.switching) {
    v.code = "switching";
    v.detail = fmt::format("switching to {}", ModeKindName(gpu.switching_to));
  } else if (!gpu.switchable) {
    v.code = "not-switchable";
    v.detail = gpu.not_switchable_reason.empty() ? "the device plugin reports it cannot switch"
                                                 : gpu.not_switchable_reason;
  } else if (!gpu.idle) {
    v.code = "in-use";
    v.detail = gpu.busy_reason.empty() ? "not idle" : gpu.busy_reason;
  } else if (now_ms < gpu.since_ms || now_ms - gpu.since_ms < min_mode_duration_ms) {
    // A `since` in the future (a skewed node clock) holds too: never switch early.
    v.code = "hysteresis";
    v.until_ms = std::max(gpu.since_ms, gpu.since_ms + min_mode_duration_ms);
    v.detail = fmt::format("kept {} mode only since {} ms; may switch at {} ms",
                           ModeKindName(gpu.mode), gpu.since_ms, v.until_ms);
  }
  return v;
}

namespace {

// One round of PlanModeSwitches: the GPUs' states, the demand sorted by rule 2, the supply under
// way (rule 3) and the switches chosen so far.
class Round {
 public:
  explicit Round(const ModePlanInput& input) : input_(input), by_node_(input.nodes.size()) {}

  ModePlan Run() {
    Setup();
    Classify();
    CountSupply();
    node_used_.assign(input_.nodes.size(), false);
    for (const ModeDemand* d : confirmed_) {
      if (d->wants == ModeKind::kWhole) ServeWhole(*d);
    }
    ServeMig();
    Explain();
    plan_.verdicts.reserve(gpus_.size());
    for (auto& s : gpus_) plan_.verdicts.push_back(std::move(s.verdict));
    return std::move(plan_);
  }

 private:
  // Rule 1 per GPU; rule 4's counts: GPUs in each mode (or switching to it), cluster-wide.
  void Setup() {
    for (size_t n = 0; n < input_.nodes.size(); ++n) {
      const ModeNode& node = input_.nodes[n];
      for (const ModeGpu& g : node.gpus) {
        GpuState s;
        s.node = &node;
        s.node_index = n;
        s.gpu = &g;
        s.verdict = GpuEligibility(node, g, input_.now_ms, input_.min_mode_duration_ms);
        s.eligible = s.verdict.code.empty();
        if (s.eligible) {
          s.verdict.code = "no-demand";
          s.verdict.detail =
              fmt::format("no pending pod needs it in {} mode", ModeKindName(Other(g.mode)));
        }
        by_node_[n].push_back(gpus_.size());
        gpus_.push_back(std::move(s));
        ++in_mode_[g.switching ? g.switching_to : g.mode];
      }
    }
  }

  // Rule 2: which demands are confirmed; which modes any demand needs (rule 4).
  void Classify() {
    const size_t considered = std::min(input_.demand.size(), kMaxModeDemands);
    plan_.skipped_demands = input_.demand.size() - considered;
    for (size_t i = 0; i < considered; ++i) {
      const ModeDemand& d = input_.demand[i];
      std::string key = DemandKey(d);
      needed_[d.wants] = true;
      (input_.seen.count(key) ? confirmed_ : unconfirmed_).push_back(&d);
      plan_.seen.insert(std::move(key));
    }
  }

  // Rule 3: supply under way. Whole GPUs switching to whole, per node; MIG instances of GPUs
  // switching to MIG, cluster-wide. Demands consume it first.
  void CountSupply() {
    whole_supply_.assign(input_.nodes.size(), {});
    for (size_t n = 0; n < input_.nodes.size(); ++n) {
      for (size_t i : by_node_[n]) {
        const ModeGpu& g = *gpus_[i].gpu;
        if (g.switching && g.switching_to == ModeKind::kWhole)
          whole_supply_[n].push_back(g.memory_mib);
        if (g.switching && g.switching_to == ModeKind::kMig) mig_coming_ += g.mig_slots;
        if (!g.switching && g.mode == ModeKind::kWhole && g.idle) {
          whole_supply_[n].push_back(g.memory_mib);
        }
      }
      std::sort(whole_supply_[n].begin(), whole_supply_[n].end());
    }
  }

  // Whether the GPU at position i may leave its mode (rule 4).
  bool MayLeave(size_t i) {
    const ModeKind mode = gpus_[i].gpu->mode;
    return !needed_[mode] || in_mode_[mode] > 1;
  }

  // The preferred eligible candidate of node n for a switch to `to` (rules 1, 4, 6); SIZE_MAX:
  // none.
  size_t Candidate(size_t n, ModeKind to) {
    size_t best = SIZE_MAX;
    for (size_t i : by_node_[n]) {
      const GpuState& s = gpus_[i];
      if (!s.eligible || s.gpu->mode == to || !MayLeave(i)) continue;
      if (best == SIZE_MAX || Preferred(*s.gpu, *gpus_[best].gpu)) best = i;
    }
    return best;
  }

  uint32_t EligibleCount(size_t n, ModeKind to, uint64_t min_memory) const {
    uint32_t c = 0;
    for (size_t i : by_node_[n]) {
      const GpuState& s = gpus_[i];
      if (s.eligible && s.gpu->mode != to && s.gpu->memory_mib >= min_memory) ++c;
    }
    return c;
  }

  void Choose(size_t i, ModeKind to, std::vector<std::string> pods, std::string reason) {
    GpuState& s = gpus_[i];
    ModeSwitchDecision d;
    d.node = s.node->name;
    d.gpu_uuid = s.gpu->uuid;
    d.index = s.gpu->index;
    d.to = to;
    d.pods = std::move(pods);
    d.reason = std::move(reason);
    s.verdict.code = "switch";
    s.verdict.detail = d.reason;
    s.eligible = false;
    node_used_[s.node_index] = true;
    --in_mode_[s.gpu->mode];
    ++in_mode_[to];
    plan_.switches.push_back(std::move(d));
  }

  // A whole-GPU demand, on one node (rule 5).
  void ServeWhole(const ModeDemand& d) {
    const uint32_t want = std::max<uint32_t>(d.gpus, 1);
    size_t best_node = SIZE_MAX, best_gpu = SIZE_MAX;
    uint32_t best_missing = 0;
    for (size_t n = 0; n < input_.nodes.size(); ++n) {
      // Whole GPUs idle or on their way here with the memory it needs (sorted ascending).
      std::vector<uint64_t>& supply = whole_supply_[n];
      const auto first = std::lower_bound(supply.begin(), supply.end(), d.min_memory_mib);
      const uint32_t have = static_cast<uint32_t>(supply.end() - first);
      if (have >= want) {
        // Enough is idle or on its way here: take the smallest that fit, switch nothing.
        supply.erase(first, first + want);
        return;
      }
      if (node_used_[n]) continue;
      if (have + EligibleCount(n, ModeKind::kWhole, d.min_memory_mib) < want) continue;
      const size_t g = Candidate(n, ModeKind::kWhole);
      if (g == SIZE_MAX || gpus_[g].gpu->memory_mib < d.min_memory_mib) continue;
      const uint32_t missing = want - have;
      const bool better = best_node == SIZE_MAX || missing < best_missing ||
                          (missing == best_missing && SwitchesWithoutReset(gpus_[g].gpu->model) &&
                           !SwitchesWithoutReset(gpus_[best_gpu].gpu->model));
      if (better) {
        best_node = n;
        best_gpu = g;
        best_missing = missing;
      }
    }
    if (best_node == SIZE_MAX) return;
    // The switched GPU and the whole GPUs already here are this pod's.
    whole_supply_[best_node].clear();
    Choose(best_gpu, ModeKind::kWhole, {d.pod},
           fmt::format("whole-GPU pod {} waits for {} GPU{} ({} more to switch on {})", d.pod, want,
                       want == 1 ? "" : "s", best_missing, input_.nodes[best_node].name));
  }

  // MIG demands: the instances confirmed pods want beyond what is on its way, served by as few
  // switches as cover them, one per node.
  void ServeMig() {
    std::vector<std::string> pods;
    uint64_t wanted = 0;
    for (const ModeDemand* d : confirmed_) {
      if (d->wants != ModeKind::kMig) continue;
      const uint32_t want = std::max<uint32_t>(d->gpus, 1);
      if (mig_coming_ >= want) {
        mig_coming_ -= want;
        continue;
      }
      wanted += want - mig_coming_;
      mig_coming_ = 0;
      pods.push_back(d->pod);
    }
    while (wanted > 0) {
      size_t best = SIZE_MAX;
      for (size_t n = 0; n < input_.nodes.size(); ++n) {
        if (node_used_[n]) continue;
        const size_t g = Candidate(n, ModeKind::kMig);
        if (g == SIZE_MAX) continue;
        if (best == SIZE_MAX || (SwitchesWithoutReset(gpus_[g].gpu->model) &&
                                 !SwitchesWithoutReset(gpus_[best].gpu->model))) {
          best = g;
        }
      }
      if (best == SIZE_MAX) return;
      const uint64_t slots = std::max<uint32_t>(gpus_[best].gpu->mig_slots, 1);
      Choose(best, ModeKind::kMig, pods,
             fmt::format("{} MIG pod{} ({}) and no MIG GPU fits {}", pods.size(),
                         pods.size() == 1 ? " waits" : "s wait", PodList(pods),
                         pods.size() == 1 ? "it" : "them"));
      wanted = wanted > slots ? wanted - slots : 0;
    }
  }

  // The verdicts of the eligible GPUs left: why each did not switch.
  void Explain() {
    std::map<ModeKind, std::vector<std::string>> unconfirmed_pods, confirmed_pods;
    for (const ModeDemand* d : unconfirmed_) unconfirmed_pods[d->wants].push_back(d->pod);
    for (const ModeDemand* d : confirmed_) confirmed_pods[d->wants].push_back(d->pod);
    for (size_t i = 0; i < gpus_.size(); ++i) {
      GpuState& s = gpus_[i];
      if (!s.eligible) continue;
      const ModeKind to = Other(s.gpu->mode);
      if (!confirmed_pods[to].empty()) {
        if (!MayLeave(i)) {
          s.verdict.code = "last-of-mode";
          s.verdict.detail =
              fmt::format("the last {} GPU of the cluster, and a pending pod needs that mode",
                          ModeKindName(s.gpu->mode));
        } else if (node_used_[s.node_index]) {
          s.verdict.code = "node-busy";
          s.verdict.detail = "another GPU of this node switches this round (one per node)";
        } else {
          s.verdict.code = "not-needed";
          s.verdict.detail = fmt::format(
              "the waiting {} pods are served by GPUs switching or idle elsewhere, or need more "
              "GPUs than this node can offer",
              ModeKindName(to));
        }
      } else if (!unconfirmed_pods[to].empty()) {
        s.verdict.code = "demand-unconfirmed";
        s.verdict.detail =
            fmt::format("{} waits since this round only: a demand must persist for two rounds",
                        PodList(unconfirmed_pods[to]));
      }
    }
  }

  const ModePlanInput& input_;
  ModePlan plan_;
  std::vector<GpuState> gpus_;                // in input order
  std::vector<std::vector<size_t>> by_node_;  // per node its GPUs' positions in gpus_
  std::map<ModeKind, size_t> in_mode_;
  std::map<ModeKind, bool> needed_;
  std::vector<const ModeDemand*> confirmed_, unconfirmed_;
  // Per node the memory of the whole GPUs idle or switching to whole, sorted (rule 3).
  std::vector<std::vector<uint64_t>> whole_supply_;
  uint64_t mig_coming_ = 0;
  std::vector<bool> node_used_;
};

}  // namespace

ModePlan PlanModeSwitches(const ModePlanInput& input) { return Round(input).Run(); }

}  // namespace dynmig::mig
