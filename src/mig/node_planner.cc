#include "mig/node_planner.h"

#include <algorithm>
#include <bit>
#include <numeric>

#include "common/strings.h"
#include "fmt/format.h"

namespace dynmig::mig {
namespace {

bool ModeAllowsMig(const std::string& mode) {
  // The common value first, without a library call.
  if (mode.size() == 3 && mode[0] == 'm' && mode[1] == 'i' && mode[2] == 'g') return true;
  return mode.empty() || mode.find("mig") != std::string::npos;
}

// Which verdict explains a node best: the one closest to fitting wins.
int Closeness(Verdict v) {
  switch (v) {
    case Verdict::kFits:
      return 0;
    case Verdict::kFragmented:
      return 1;
    case Verdict::kCapacityExhausted:
      return 2;
    case Verdict::kNoProfileBigEnough:
      return 3;
    case Verdict::kGpuUnhealthy:
      return 4;
    case Verdict::kFiltered:
      return 5;
    case Verdict::kNotAllowlisted:
      return 6;
    case Verdict::kNoMigGpu:
      return 7;
    case Verdict::kNodeUnhealthy:
      return 8;
  }
  return 9;
}

GpuOutcome ScreenVerdict(const GpuView& gpu, const GpuFilter& f) {
  if (!gpu.healthy) {
    return {Verdict::kGpuUnhealthy,
            gpu.unhealthy_reason.empty() ? "unschedulable" : gpu.unhealthy_reason};
  }
  if (gpu.planner == nullptr) {
    return {Verdict::kNotAllowlisted, fmt::format("{} has no allowlisted MIG profile", gpu.model)};
  }
  if (!ModeAllowsMig(gpu.mode)) {
    return {Verdict::kNoMigGpu, fmt::format("GPU mode is {}, not mig", gpu.mode)};
  }
  if (!f.vgpu_mode.empty() && f.vgpu_mode.find("mig") == std::string::npos) {
    return {Verdict::kFiltered,
            fmt::format("pod asks for vgpu-mode {}; this GPU is mig", f.vgpu_mode)};
  }
  if (!f.use_uuids.empty() &&
      std::find(f.use_uuids.begin(), f.use_uuids.end(), gpu.uuid) == f.use_uuids.end()) {
    return {Verdict::kFiltered, "not in nvidia.com/use-gpuuuid"};
  }
  if (std::find(f.nouse_uuids.begin(), f.nouse_uuids.end(), gpu.uuid) != f.nouse_uuids.end()) {
    return {Verdict::kFiltered, "excluded by nvidia.com/nouse-gpuuuid"};
  }
  if (!f.use_types.empty() &&
      std::none_of(f.use_types.begin(), f.use_types.end(),
                   [&](const std::string& t) { return ContainsIgnoreCase(gpu.model, t); })) {
    return {Verdict::kFiltered, "model not in nvidia.com/use-gputype"};
  }
  if (std::any_of(f.nouse_types.begin(), f.nouse_types.end(),
                  [&](const std::string& t) { return ContainsIgnoreCase(gpu.model, t); })) {
    return {Verdict::kFiltered, "model excluded by nvidia.com/nouse-gputype"};
  }
  return {Verdict::kFits, ""};
}

// The filter's verdict for a GPU; the reason strings are only built when asked for.
GpuOutcome Screen(const GpuView& gpu, const GpuFilter& f, bool explain) {
  if (!explain) {
    if (gpu.healthy && gpu.planner != nullptr && ModeAllowsMig(gpu.mode) && f.vgpu_mode.empty() &&
        f.use_uuids.empty() && f.nouse_uuids.empty() && f.use_types.empty() &&
        f.nouse_types.empty()) {
      return {Verdict::kFits, {}};
    }
    GpuOutcome out = ScreenVerdict(gpu, f);
    out.reason.clear();
    return out;
  }
  return ScreenVerdict(gpu, f);
}

double UsedFraction(const GpuView& gpu) {
  const uint32_t units = gpu.planner->units();
  return units == 0
             ? 0.0
             : static_cast<double>(std::popcount(gpu.usage.occupied & FullMask(units))) / units;
}

}  // namespace

std::string NodePlan::Reason(const NodeView& node) const {
  if (fits()) return "";
  if (verdict == Verdict::kNodeUnhealthy) {
    return fmt::format("node-unhealthy: {}", node.unhealthy_reason.empty()
                                                 ? "device plugin stopped reporting"
                                                 : node.unhealthy_reason);
  }
  if (!reason.empty()) return fmt::format("{}: {}", VerdictName(verdict), reason);
  if (node.gpus.empty()) return "no-mig-gpu: the node registers no MIG GPU";
  std::string out = VerdictName(verdict);
  out += ":";
  for (size_t i = 0; i < gpus.size() && i < node.gpus.size(); ++i) {
    out += fmt::format("{} GPU {} ({}): {}", i == 0 ? "" : ";", node.gpus[i].index,
                       node.gpus[i].uuid, gpus[i].reason);
  }
  return out;
}

namespace {

// Node choice: binpack = best fit (fewest free slices left on the pod's GPUs), then fullest;
// spread = emptiest. Then the better fragmentation score.
bool Better(const NodePlan& a, const NodePlan& b, NodePolicy policy) {
  if (policy == NodePolicy::kBinpack) {
    if (a.leftover != b.leftover) return a.leftover < b.leftover;
    if (a.used_fraction != b.used_fraction) return a.used_fraction > b.used_fraction;
  } else if (a.used_fraction != b.used_fraction) {
    return a.used_fraction < b.used_fraction;
  }
  if (a.score != b.score) return a.score > b.score;
  if (a.idle_reused != b.idle_reused) return a.idle_reused > b.idle_reused;
  return !a.bind_in_flight && b.bind_in_flight;
}

bool NoFilters(const GpuFilter& f) {
  return f.vgpu_mode.empty() && f.use_uuids.empty() && f.nouse_uuids.empty() &&
         f.use_types.empty() && f.nouse_types.empty();
}

}  // namespace

// Which reasons a node plan carries: none (verdicts only), those of a node that can never run the
// pod (NeverFits: the GPU screens, the node-wide too-many-instances text, a GPU's no profile big
// enough), or all of them.
enum class ReasonLevel { kNone, kNeverFits, kAll };

// What planning reads of the pod on every node, computed once per pod, and buffers reused across
// its nodes, so the common path allocates nothing per node.
struct NodeScratch {
  const PodRequest* request = nullptr;
  RequestSummary shape;
  // One container with one instance, no preference and no GPU hints: the fast path applies.
  bool single = false;
  ReasonLevel reasons = ReasonLevel::kAll;
  std::vector<GpuOutcome> screened;
  std::vector<GpuOutcome> tried;
  std::vector<uint32_t> eligible;
  std::vector<uint32_t> order;
  std::vector<uint32_t> used_units;
  std::vector<GpuUsage> usage;
  std::vector<uint64_t> memories;

  explicit NodeScratch(const PodRequest& r) : request(&r), shape(SummarizeRequest(r)) {
    single = shape.containers.size() == 1 && r.containers[shape.containers[0]].count == 1 &&
             r.preference.empty() && NoFilters(r.filter);
  }
  bool explain() const { return reasons == ReasonLevel::kAll; }
};

namespace {

using Scratch = NodeScratch;

void Fail(NodePlan& plan, Scratch& s, size_t gpus) {
  plan.assignments.clear();
  plan.gpus.assign(s.screened.begin(), s.screened.begin() + gpus);
  for (size_t i = 0; i < gpus; ++i) {
    if (s.screened[i].verdict == Verdict::kFits) plan.gpus[i] = std::move(s.tried[i]);
  }
  plan.verdict = Verdict::kNodeUnhealthy;
  for (const auto& o : plan.gpus) {
    if (Closeness(o.verdict) < Closeness(plan.verdict)) plan.verdict = o.verdict;
  }
  if (plan.verdict == Verdict::kFits) plan.verdict = Verdict::kCapacityExhausted;
}

// The common request, one container with one instance, no preference and no GPU hints, in one
// pass over the GPUs without sorting. Same answer as the general path (the first GPU in policy
// order that fits is the best-ranked fitting GPU); false when nothing fits or a GPU has idle
// instances (the general path then decides).
bool PlanSingleFast(const NodeView& node, const PodRequest& request, const ContainerRequest& ctr,
                    uint32_t c, Scratch& s, NodePlan& plan) {
  const bool binpack = request.gpu_policy == GpuPolicy::kBinpack;
  s.eligible.clear();  // the schedulable GPUs, for the score below
  int best = -1;
  uint32_t best_used = 0;
  PlannedInstance best_inst;
  double used = 0;
  uint32_t mig_gpus = 0;
  for (uint32_t i = 0; i < node.gpus.size(); ++i) {
    const GpuView& gpu = node.gpus[i];
    // Idle (warm) instances take the general path: the tables know nothing of them. Checked in
    // this pass, which reads every GPU anyway (a pass of its own costs a read of each GPU more).
    if (!gpu.idle.empty()) return false;
    if (gpu.planner == nullptr) continue;
    const uint32_t units = gpu.planner->units();
    const uint32_t occupied = std::popcount(gpu.usage.occupied & FullMask(units));
    used += static_cast<double>(occupied) / units;
    ++mig_gpus;
    if (!gpu.healthy || !ModeAllowsMig(gpu.mode)) continue;
    s.eligible.push_back(i);
    const uint32_t used_units = occupied * 64 / std::max(1u, units);
    if (best >= 0 && (binpack ? used_units <= best_used : used_units >= best_used)) continue;
    PlannedInstance inst;
    const uint64_t mem =
        ResolveMemory(ctr.memory.mib, ctr.memory.percent, gpu.planner->capability());
    if (!gpu.planner->PlanSingle(gpu.usage, mem, inst)) continue;
    best = static_cast<int>(i);
    best_used = used_units;
    best_inst = inst;
  }
  if (best < 0) return false;
  plan.used_fraction = mig_gpus == 0 ? 0.0 : used / mig_gpus;
  plan.assignments.push_back(
      {c, 0, static_cast<uint32_t>(best), best_inst.profile_index, best_inst.placement});
  for (uint32_t i : s.eligible) {  // the general path's eligible set without hints
    const GpuView& gpu = node.gpus[i];
    SliceMask occupied = gpu.usage.occupied;
    if (static_cast<int>(i) == best) {
      occupied |= best_inst.placement.Mask();
      const uint32_t units = gpu.planner->units();
      plan.leftover = std::popcount(~occupied & FullMask(units)) * 64 / std::max(1u, units);
    }
    plan.score += gpu.planner->FragmentationScore(~occupied);
  }
  return true;
}

bool IsIdle(const GpuView& gpu, const PlannedInstance& inst) {
  for (const auto& i : gpu.idle) {
    if (i.profile_index == inst.profile_index && i.placement == inst.placement) return true;
  }
  return false;
}

// A pod asking for more instances than the GPUs it may use on this node hold when empty never
// fits there: refused in O(GPUs), before any per-instance work (true; plan says why).
bool TooManyInstances(const NodeView& node, const Scratch& s, NodePlan& plan) {
  uint64_t capacity = 0;
  for (uint32_t i : s.eligible) capacity += node.gpus[i].planner->max_instances();
  if (s.shape.instances <= capacity) return false;
  plan.assignments.clear();
  plan.verdict = Verdict::kCapacityExhausted;
  if (s.explain()) {
    plan.reason = fmt::format(
        "the pod asks for {} MIG instances; the {} GPU(s) of this node it may use hold at most {}",
        s.shape.instances, s.eligible.size(), capacity);
  }
  return true;
}

// Screens every GPU of the node against the pod's hints: the eligible GPUs, their usage copied for
// planning, and the node's used fraction. Reasons of the screens are written unless none are
// wanted (they explain a node that can never run the pod).
void ScreenGpus(const NodeView& node, Scratch& s, NodePlan& plan) {
  const size_t g = node.gpus.size();
  s.screened.resize(std::max(s.screened.size(), g));
  s.tried.resize(std::max(s.tried.size(), g));
  s.usage.resize(std::max(s.usage.size(), g));
  s.used_units.resize(std::max(s.used_units.size(), g));
  s.eligible.clear();
  double used = 0;
  uint32_t mig_gpus = 0;
  for (uint32_t i = 0; i < g; ++i) {
    const GpuView& gpu = node.gpus[i];
    s.usage[i] = gpu.usage;
    if (gpu.planner != nullptr) {
      used += UsedFraction(gpu);
      ++mig_gpus;
    }
    s.screened[i] = Screen(gpu, s.request->filter, s.reasons != ReasonLevel::kNone);
    s.tried[i] = {Verdict::kFits, {}};
    if (s.screened[i].verdict == Verdict::kFits) s.eligible.push_back(i);
  }
  plan.used_fraction = mig_gpus == 0 ? 0.0 : used / mig_gpus;
}

// The eligible GPUs in the order a container tries them: binpack fullest first, spread emptiest
// first, then GPU index.
void OrderGpus(const NodeView& node, Scratch& s) {
  s.order.assign(s.eligible.begin(), s.eligible.end());
  for (uint32_t i : s.order) {
    // Units used scaled to a common 64ths axis, so models with different axes compare.
    s.used_units[i] =
        std::popcount(s.usage[i].occupied) * 64 / std::max(1u, node.gpus[i].planner->units());
  }
  const bool binpack = s.request->gpu_policy == GpuPolicy::kBinpack;
  auto before = [&](uint32_t a, uint32_t b) {
    if (s.used_units[a] != s.used_units[b]) {
      return binpack ? s.used_units[a] > s.used_units[b] : s.used_units[a] < s.used_units[b];
    }
    return a < b;
  };
  // Insertion sort: a node has a handful of GPUs, and std::stable_sort allocates.
  for (size_t i = 1; i < s.order.size(); ++i) {
    const uint32_t v = s.order[i];
    size_t j = i;
    while (j > 0 && before(v, s.order[j - 1])) {
      s.order[j] = s.order[j - 1];
      --j;
    }
    s.order[j] = v;
  }
}

// One container's instances on the node: on one GPU when possible, spread over several otherwise.
// Each placed instance is committed to the scratch usage (the next container sees it).
class ContainerPlacer {
 public:
  ContainerPlacer(const NodeView& node, uint32_t c, Scratch& s, NodePlan& plan)
      : node_(node), c_(c), ctr_(s.request->containers[c]), s_(s), plan_(plan) {}

  // False: the container does not fit (s.tried holds what each GPU said).
  bool Place() {
    if (ctr_.count == 1 && s_.request->preference.empty() && PlaceOneByTable()) return true;
    if (PlaceOnOneGpu()) return true;
    if (ctr_.count == 1) return false;
    return Spread();
  }

 private:
  std::span<const uint64_t> MemoriesFor(uint32_t gpu, uint32_t n) {
    const auto& cap = node_.gpus[gpu].planner->capability();
    s_.memories.assign(n, ResolveMemory(ctr_.memory.mib, ctr_.memory.percent, cap));
    return std::span<const uint64_t>(s_.memories);
  }

  void CommitOne(uint32_t gpu, const PlannedInstance& inst, uint32_t device) {
    plan_.assignments.push_back({c_, device, gpu, inst.profile_index, inst.placement});
    if (!node_.gpus[gpu].idle.empty() && IsIdle(node_.gpus[gpu], inst)) ++plan_.idle_reused;
    s_.usage[gpu].occupied |= inst.placement.Mask();
    ++s_.usage[gpu].counts[inst.profile_index];
  }

  void Commit(uint32_t gpu, const GpuPlan& gp, uint32_t first_device) {
    for (size_t k = 0; k < gp.instances.size(); ++k) {
      CommitOne(gpu, gp.instances[k], static_cast<uint32_t>(first_device + k));
    }
  }

  // The common case, allocation-free: one instance by table lookup (a GPU with idle instances is
  // planned in full: the table knows nothing of them). False: the general path decides.
  bool PlaceOneByTable() {
    for (uint32_t gpu : s_.order) {
      PlannedInstance inst;
      const auto& planner = *node_.gpus[gpu].planner;
      const uint64_t mem =
          ResolveMemory(ctr_.memory.mib, ctr_.memory.percent, planner.capability());
      if (!node_.gpus[gpu].idle.empty()) {
        ++plan_.gpu_plans;
        GpuPlan gp = planner.Plan(s_.usage[gpu], std::span<const uint64_t>(&mem, 1), {}, false,
                                  node_.gpus[gpu].idle);
        if (gp.verdict != Verdict::kFits) continue;
        inst = gp.instances.front();
      } else if (!planner.PlanSingle(s_.usage[gpu], mem, inst)) {
        continue;
      }
      CommitOne(gpu, inst, 0);
      return true;
    }
    return false;
  }

  // All instances on one GPU, in policy order; each GPU that cannot take them says why.
  bool PlaceOnOneGpu() {
    const bool explain = s_.explain();
    for (uint32_t gpu : s_.order) {
      ++plan_.gpu_plans;
      const GpuPlanner& planner = *node_.gpus[gpu].planner;
      const std::span<const uint64_t> memories = MemoriesFor(gpu, ctr_.count);
      GpuPlan gp = planner.Plan(s_.usage[gpu], memories, s_.request->preference, explain,
                                node_.gpus[gpu].idle);
      if (gp.verdict == Verdict::kFits) {
        Commit(gpu, gp, 0);
        return true;
      }
      if (!explain && s_.reasons == ReasonLevel::kNeverFits && NeverFits(gp.verdict)) {
        // The text of a verdict that no release changes; decided before any search, so asking
        // again for it costs no search.
        gp = planner.Plan(s_.usage[gpu], memories, s_.request->preference, true,
                          node_.gpus[gpu].idle);
      }
      s_.tried[gpu] = {gp.verdict, std::move(gp.reason)};
    }
    return false;
  }

  // As many as fit on each GPU in policy order (never more than MaxInstances: larger counts
  // cannot fit).
  bool Spread() {
    uint32_t remaining = ctr_.count;
    for (uint32_t gpu : s_.order) {
      const GpuPlanner& planner = *node_.gpus[gpu].planner;
      const uint32_t room = planner.MaxInstances(s_.usage[gpu].occupied);
      for (uint32_t m = std::min(remaining, room); m >= 1; --m) {
        ++plan_.gpu_plans;
        GpuPlan gp = planner.Plan(s_.usage[gpu], MemoriesFor(gpu, m), s_.request->preference, false,
                                  node_.gpus[gpu].idle);
        if (gp.verdict == Verdict::kFits) {
          Commit(gpu, gp, ctr_.count - remaining);
          remaining -= m;
          break;
        }
      }
      if (remaining == 0) return true;
    }
    for (uint32_t i : s_.eligible) {
      if (s_.tried[i].verdict == Verdict::kFits) {
        s_.tried[i] = {Verdict::kCapacityExhausted, "too few free slices"};
      }
    }
    return false;
  }

  const NodeView& node_;
  const uint32_t c_;
  const ContainerRequest& ctr_;
  Scratch& s_;
  NodePlan& plan_;
};

// The fragmentation score the eligible GPUs keep after the pod, and the units left free on the
// GPUs it lands on.
void ScoreNode(const NodeView& node, const Scratch& s, NodePlan& plan) {
  for (uint32_t i : s.eligible) {
    const auto& planner = *node.gpus[i].planner;
    plan.score += planner.FragmentationScore(~s.usage[i].occupied);
    if (s.usage[i].occupied != node.gpus[i].usage.occupied) {
      const uint32_t free_units = std::popcount(~s.usage[i].occupied & FullMask(planner.units()));
      plan.leftover += free_units * 64 / std::max(1u, planner.units());
    }
  }
}

// Plans the pod on one node into `plan` (a fresh NodePlan; its assignments may hold capacity).
void PlanOnNode(const NodeView& node, Scratch& s, NodePlan& plan) {
  const PodRequest& request = *s.request;
  plan.bind_in_flight = node.bind_in_flight;
  plan.explained = s.reasons == ReasonLevel::kAll;
  if (s.single && node.healthy && !node.gpus.empty()) {
    const uint32_t c = s.shape.containers[0];
    if (PlanSingleFast(node, request, request.containers[c], c, s, plan)) return;
  }
  if (!node.healthy) {
    plan.verdict = Verdict::kNodeUnhealthy;
    return;
  }
  if (node.gpus.empty()) {
    plan.verdict = Verdict::kNoMigGpu;
    return;
  }
  const size_t g = node.gpus.size();
  ScreenGpus(node, s, plan);
  if (s.eligible.empty()) return Fail(plan, s, g);
  if (TooManyInstances(node, s, plan)) return;
  for (uint32_t c : s.shape.containers) {
    OrderGpus(node, s);
    if (!ContainerPlacer(node, c, s, plan).Place()) return Fail(plan, s, g);
  }
  ScoreNode(node, s, plan);
}

void FinishExplained(NodePlan& plan, ReasonLevel reasons) {
  // A node that can never run the pod carries its reasons at kNeverFits too.
  if (reasons == ReasonLevel::kNeverFits && !plan.fits() && NeverFits(plan.verdict)) {
    plan.explained = true;
  }
}

}  // namespace

bool BetterNode(const NodePlan& a, const NodePlan& b, NodePolicy policy) {
  return Better(a, b, policy);
}

NodeSummary Summarize(const NodeView& node) {
  NodeSummary out;
  for (const GpuView& gpu : node.gpus) {
    if (gpu.planner == nullptr || !gpu.healthy || !ModeAllowsMig(gpu.mode)) continue;
    const auto& profiles = gpu.planner->capability().profiles;
    out.max_instances += gpu.planner->max_instances();
    out.free_instances += gpu.planner->MaxInstances(gpu.usage.occupied);
    for (uint32_t idx : gpu.planner->allowed()) {
      const ProfileSpec& spec = profiles[idx];
      // What sizing accepts (nominal by default: 3g.20gb takes a 20000 MiB request although NVML
      // reports 19968 MiB), so the summary never rules out a node the planner would use.
      const uint64_t mib = spec.SizingMib();
      out.max_profile_mib = std::max(out.max_profile_mib, mib);
      if (mib <= out.max_placeable_mib) continue;
      for (const auto& pl : spec.placements) {
        if ((gpu.usage.occupied & pl.Mask()) == 0) {
          out.max_placeable_mib = mib;
          break;
        }
      }
    }
  }
  return out;
}

RequestSummary SummarizeRequest(const PodRequest& request) {
  RequestSummary out;
  for (uint32_t c = 0; c < request.containers.size(); ++c) {
    const ContainerRequest& ctr = request.containers[c];
    if (ctr.count == 0) continue;
    out.instances += ctr.count;
    out.containers.push_back(c);
    out.max_mib = std::max(out.max_mib, ctr.memory.mib);  // 0: sized by percentage
  }
  return out;
}

bool MayFit(const NodeSummary& summary, const RequestSummary& request) {
  return request.instances <= summary.free_instances &&
         request.max_mib <= summary.max_placeable_mib;
}

bool MayFit(const NodeSummary& summary, const PodRequest& request) {
  return MayFit(summary, SummarizeRequest(request));
}

bool MayEverFit(const NodeSummary& summary, const RequestSummary& request) {
  return request.instances <= summary.max_instances && request.max_mib <= summary.max_profile_mib;
}

bool MayEverFit(const NodeSummary& summary, const PodRequest& request) {
  return MayEverFit(summary, SummarizeRequest(request));
}

bool NeverFits(Verdict verdict) {
  switch (verdict) {
    case Verdict::kNoProfileBigEnough:
    case Verdict::kNotAllowlisted:
    case Verdict::kFiltered:
    case Verdict::kNoMigGpu:
      return true;
    default:
      return false;
  }
}

NodePlan PlanPodOnNode(const NodeView& node, const PodRequest& request) {
  NodeScratch scratch(request);
  NodePlan plan;
  PlanOnNode(node, scratch, plan);
  return plan;
}

PodPlan PlanPod(std::span<const NodeView> nodes, const PodRequest& request) {
  std::vector<const NodeView*> ptrs;
  ptrs.reserve(nodes.size());
  for (const auto& n : nodes) ptrs.push_back(&n);
  return PlanPod(std::span<const NodeView* const>(ptrs), request);
}

PodPlan PlanPod(std::span<const NodeView* const> nodes, const PodRequest& request) {
  PlanSession session(request, nodes.size(), PlanSession::Reasons::kNone);
  for (size_t i = 0; i < nodes.size(); ++i) session.Plan(i, *nodes[i]);
  PodPlan out;
  out.chosen = session.chosen();
  out.nodes = session.TakePlans();
  return out;
}

PlanSession::PlanSession(const PodRequest& request, size_t candidates, Reasons reasons)
    : scratch_(std::make_unique<NodeScratch>(request)),
      policy_(request.node_policy),
      reasons_(reasons),
      views_(candidates, nullptr),
      plans_(candidates) {}

PlanSession::~PlanSession() = default;
PlanSession::PlanSession(PlanSession&&) noexcept = default;
PlanSession& PlanSession::operator=(PlanSession&&) noexcept = default;

const RequestSummary& PlanSession::shape() const { return scratch_->shape; }

const NodePlan& PlanSession::Plan(size_t i, const NodeView& node) {
  // Each candidate is given once: its plan is still the one the constructor made.
  views_[i] = &node;
  NodePlan& plan = plans_[i];
  // The winner so far keeps its assignments; a plan that does not win gives the buffer back.
  plan.assignments.swap(spare_);
  Run(node, PassLevel(), plan);
  Consider(i);
  return plan;
}

void PlanSession::Reuse(size_t i, const NodeView& node, const NodePlan& plan) {
  views_[i] = &node;
  plans_[i] = plan;  // copied into the slot: no temporary to move from and destroy
  Consider(i);
}

void PlanSession::Skip(size_t i, const NodeView* node) {
  views_[i] = node;
  plans_[i] = NodePlan{};
  plans_[i].verdict = Verdict::kCapacityExhausted;
}

const NodePlan& PlanSession::Replan(size_t i, const NodeView& node) {
  NodePlan& plan = Fresh(i, node);
  Run(node, reasons_ == Reasons::kNone ? ReasonLevel::kNone : ReasonLevel::kNeverFits, plan);
  return plan;
}

void PlanSession::Choose() {
  chosen_ = -1;
  for (size_t i = 0; i < plans_.size(); ++i) {
    if (!plans_[i].fits()) continue;
    if (chosen_ < 0 || Better(plans_[i], plans_[chosen_], policy_)) chosen_ = static_cast<int>(i);
  }
}

const NodePlan* PlanSession::Winner() {
  if (chosen_ < 0) return nullptr;
  NodePlan& plan = plans_[chosen_];
  if (plan.assignments.empty() && scratch_->shape.instances > 0) {
    // Reused (a cache keeps verdicts and scores): its assignments are recorded now.
    NodePlan recorded;
    Run(*views_[chosen_], ReasonLevel::kNone, recorded);
    plan.assignments = std::move(recorded.assignments);
  }
  return &plan;
}

std::pair<Verdict, std::string> PlanSession::Explain(size_t i) {
  const NodeView* view = views_[i];
  if (view == nullptr) return {plans_[i].verdict, ""};
  if (plans_[i].explained) return {plans_[i].verdict, plans_[i].Reason(*view)};
  // Skipped, reused, or planned after a node fitted without a verdict that never changes: planned
  // now with every reason.
  NodePlan explained;
  Run(*view, ReasonLevel::kAll, explained);
  return {explained.verdict, explained.Reason(*view)};
}

std::vector<NodePlan> PlanSession::TakePlans() {
  Winner();
  return std::move(plans_);
}

NodePlan& PlanSession::Fresh(size_t i, const NodeView& node) {
  views_[i] = &node;
  plans_[i] = NodePlan{};
  return plans_[i];
}

ReasonLevel PlanSession::PassLevel() const {
  if (reasons_ == Reasons::kNone) return ReasonLevel::kNone;
  // Until a node fits, nothing may: every reason may be reported.
  return chosen_ < 0 ? ReasonLevel::kAll : ReasonLevel::kNeverFits;
}

void PlanSession::Run(const NodeView& node, ReasonLevel level, NodePlan& plan) {
  scratch_->reasons = level;
  PlanOnNode(node, *scratch_, plan);
  FinishExplained(plan, level);
}

void PlanSession::Consider(size_t i) {
  NodePlan& plan = plans_[i];
  if (plan.fits() && (chosen_ < 0 || Better(plan, plans_[chosen_], policy_))) {
    if (chosen_ >= 0) {
      spare_.swap(plans_[chosen_].assignments);
      spare_.clear();
    }
    chosen_ = static_cast<int>(i);
    return;
  }
  if (spare_.capacity() < plan.assignments.capacity()) spare_.swap(plan.assignments);
  spare_.clear();
  plan.assignments.clear();
}

}  // namespace dynmig::mig
