#include "mig/node_planner.h"

#include <algorithm>
#include <bit>
#include <numeric>

#include "common/strings.h"
#include "fmt/format.h"

namespace dynmig::mig {
namespace {

bool ModeAllowsMig(const std::string& mode) {
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

GpuOutcome Screen(const GpuView& gpu, const GpuFilter& f) {
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
  if (node.gpus.empty()) return "no-mig-gpu: the node registers no MIG GPU";
  std::string out = VerdictName(verdict);
  out += ":";
  for (size_t i = 0; i < gpus.size() && i < node.gpus.size(); ++i) {
    out += fmt::format("{} GPU {} ({}): {}", i == 0 ? "" : ";", node.gpus[i].index,
                       node.gpus[i].uuid, gpus[i].reason);
  }
  return out;
}

NodePlan PlanPodOnNode(const NodeView& node, const PodRequest& request) {
  NodePlan plan;
  if (!node.healthy) {
    plan.verdict = Verdict::kNodeUnhealthy;
    return plan;
  }
  if (node.gpus.empty()) {
    plan.verdict = Verdict::kNoMigGpu;
    return plan;
  }
  const size_t g = node.gpus.size();
  std::vector<GpuOutcome> screened(g);
  std::vector<uint32_t> eligible;
  std::vector<GpuUsage> usage(g);
  double used = 0;
  uint32_t mig_gpus = 0;
  for (uint32_t i = 0; i < g; ++i) {
    usage[i] = node.gpus[i].usage;
    if (node.gpus[i].planner != nullptr) {
      used += UsedFraction(node.gpus[i]);
      ++mig_gpus;
    }
    screened[i] = Screen(node.gpus[i], request.filter);
    if (screened[i].verdict == Verdict::kFits) eligible.push_back(i);
  }
  plan.used_fraction = mig_gpus == 0 ? 0.0 : used / mig_gpus;

  auto fail = [&](std::vector<GpuOutcome> outcomes) {
    plan.assignments.clear();
    plan.gpus = std::move(outcomes);
    plan.verdict = Verdict::kNodeUnhealthy;
    for (const auto& o : plan.gpus) {
      if (Closeness(o.verdict) < Closeness(plan.verdict)) plan.verdict = o.verdict;
    }
    if (plan.verdict == Verdict::kFits) plan.verdict = Verdict::kCapacityExhausted;
    return plan;
  };
  if (eligible.empty()) return fail(screened);

  std::vector<uint64_t> memories;
  for (uint32_t c = 0; c < request.containers.size(); ++c) {
    const auto& ctr = request.containers[c];
    if (ctr.count == 0) continue;
    // GPU order for this container: binpack fullest first, spread emptiest first.
    std::vector<uint32_t> order = eligible;
    std::vector<uint32_t> used_units(g, 0);
    for (uint32_t i : order) used_units[i] = std::popcount(usage[i].occupied);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      const double fa = static_cast<double>(used_units[a]) / node.gpus[a].planner->units();
      const double fb = static_cast<double>(used_units[b]) / node.gpus[b].planner->units();
      if (fa != fb) return request.gpu_policy == GpuPolicy::kBinpack ? fa > fb : fa < fb;
      return a < b;
    });

    auto memories_for = [&](uint32_t gpu, uint32_t n) {
      const auto& cap = node.gpus[gpu].planner->capability();
      memories.assign(n, ResolveMemory(ctr.memory.mib, ctr.memory.percent, cap));
      return std::span<const uint64_t>(memories);
    };
    auto commit = [&](uint32_t gpu, const GpuPlan& gp, uint32_t first_device) {
      for (size_t k = 0; k < gp.instances.size(); ++k) {
        const auto& inst = gp.instances[k];
        plan.assignments.push_back(
            {c, static_cast<uint32_t>(first_device + k), gpu, inst.profile_index, inst.placement});
        usage[gpu].occupied |= inst.placement.Mask();
        ++usage[gpu].counts[inst.profile_index];
      }
    };

    // All instances on one GPU, in policy order.
    std::vector<GpuOutcome> outcomes = screened;
    bool placed = false;
    for (uint32_t gpu : order) {
      GpuPlan gp = node.gpus[gpu].planner->Plan(usage[gpu], memories_for(gpu, ctr.count),
                                                request.preference);
      if (gp.verdict == Verdict::kFits) {
        commit(gpu, gp, 0);
        placed = true;
        break;
      }
      outcomes[gpu] = {gp.verdict, std::move(gp.reason)};
    }
    if (placed) continue;
    if (ctr.count == 1) return fail(std::move(outcomes));
    // Spread: as many as fit on each GPU in policy order.
    uint32_t remaining = ctr.count;
    for (uint32_t gpu : order) {
      for (uint32_t m = remaining; m >= 1; --m) {
        GpuPlan gp =
            node.gpus[gpu].planner->Plan(usage[gpu], memories_for(gpu, m), request.preference);
        if (gp.verdict == Verdict::kFits) {
          commit(gpu, gp, ctr.count - remaining);
          remaining -= m;
          break;
        }
      }
      if (remaining == 0) break;
    }
    if (remaining > 0) {
      for (auto& o : outcomes) {
        if (o.verdict == Verdict::kFits) o = {Verdict::kCapacityExhausted, "too few free slices"};
      }
      return fail(std::move(outcomes));
    }
  }
  for (uint32_t i : eligible) {
    plan.score += node.gpus[i].planner->FragmentationScore(~usage[i].occupied);
  }
  return plan;
}

PodPlan PlanPod(std::span<const NodeView> nodes, const PodRequest& request) {
  PodPlan out;
  out.nodes.reserve(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    out.nodes.push_back(PlanPodOnNode(nodes[i], request));
    const NodePlan& p = out.nodes.back();
    if (!p.fits()) continue;
    if (out.chosen < 0) {
      out.chosen = static_cast<int>(i);
      continue;
    }
    const NodePlan& best = out.nodes[out.chosen];
    if (p.used_fraction != best.used_fraction) {
      const bool better = request.node_policy == NodePolicy::kBinpack
                              ? p.used_fraction > best.used_fraction
                              : p.used_fraction < best.used_fraction;
      if (better) out.chosen = static_cast<int>(i);
    } else if (p.score > best.score) {
      out.chosen = static_cast<int>(i);
    }
  }
  return out;
}

}  // namespace dynmig::mig
