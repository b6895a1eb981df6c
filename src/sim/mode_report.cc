// Text, JSON and CSV forms of a mode-switching simulation (sim/mode_sim.h).
#include <algorithm>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "sim/mode_sim.h"

namespace dynmig::sim {
namespace {

std::string RatePct(double f) { return fmt::format("{:.1f}%", 100.0 * f); }

std::string WaitText(double s) {
  if (s < 120) return fmt::format("{:.0f}s", s);
  if (s < 7200) return fmt::format("{:.1f}m", s / 60);
  if (s < 2 * 86400) return fmt::format("{:.1f}h", s / 3600);
  return fmt::format("{:.1f}d", s / 86400);
}

std::string TraceBaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string FormatModeText(const ModeSimResult& r) {
  std::string out = fmt::format(
      "trace    {}: {} GPU pods ({} whole-GPU, {} MIG; {} CPU-only skipped, {} unservable)\n",
      TraceBaseName(r.trace), r.pods, r.whole_pods, r.mig_pods, r.cpu_only, r.unservable);
  out += fmt::format("cluster  {} ({} GPUs, {} per node), pods wait (queue mode)\n", r.cluster,
                     r.gpus, r.gpus_per_node);
  std::string times;
  for (const auto& t : r.switch_times) times += (times.empty() ? "" : ", ") + t;
  out += fmt::format("switch   MIG mode change per GPU: {}\n", times);
  size_t w = 6;
  for (const auto& p : r.policies) w = std::max(w, p.name.size() + 2);
  out += fmt::format(
      "{:<{}}  {:>6}  {:>8}  {:>8}  {:>9}  {:>9}  {:>8}  {:>8}  {:>7}  {:>12}  "
      "{:>10}  {:>10}  {:>7}\n",
      "policy", w, "whole0", "accepted", "GPU-time", "whole acc", "MIG acc", "p50 wait", "p99 wait",
      "waiting", "switches w/m", "lost GPU-h", "mean whole", "run");
  for (size_t k = 0; k < r.policies.size(); ++k) {
    const auto& p = r.policies[k];
    const std::string name = p.name + (static_cast<int>(k) == r.best_pools ? " *" : "");
    out += fmt::format(
        "{:<{}}  {:>6}  {:>8}  {:>8}  {:>9}  {:>9}  {:>8}  {:>8}  {:>7}  {:>12}  {:>10.2f}  "
        "{:>10.1f}  {:>6.2f}s\n",
        name, w, p.whole_gpus_at_start, RatePct(p.accepted_count), RatePct(p.accepted_gpu_time),
        RatePct(p.whole_gpu_time), RatePct(p.mig_gpu_time), WaitText(p.pending_p50),
        WaitText(p.pending_p99), p.never_started,
        fmt::format("{}/{}", p.switches_to_whole, p.switches_to_mig), p.switch_gpu_hours,
        p.mean_whole_gpus, p.seconds);
  }
  out +=
      "whole0 = whole GPUs at the start (pools:K keeps them; dynmig:mode-switch starts all-MIG)\n"
      "accepted = pods started before the end; GPU-time = GPUs x lifetime of those, over all "
      "pods' (whole acc / MIG acc: of each kind)\n"
      "switches w/m = to whole / to MIG; lost GPU-h = GPU-hours spent switching; mean whole = "
      "GPUs in whole mode, time-averaged\n";
  if (r.best_pools >= 0) out += "* = the fixed split with the most accepted GPU-time\n";
  return out;
}

std::string FormatModeJson(const ModeSimResult& r) {
  nlohmann::ordered_json j;
  j["trace"] = r.trace;
  j["cluster"] = r.cluster;
  j["gpus"] = r.gpus;
  j["gpusPerNode"] = r.gpus_per_node;
  j["mode"] = "queue";
  j["pods"] = r.pods;
  j["wholePods"] = r.whole_pods;
  j["migPods"] = r.mig_pods;
  j["cpuOnlySkipped"] = r.cpu_only;
  j["unservable"] = r.unservable;
  j["nvmlLatency"] = r.nvml_latency;
  j["switchTimes"] = r.switch_times;
  j["bestPools"] = r.best_pools >= 0 ? nlohmann::ordered_json(r.policies[r.best_pools].name)
                                     : nlohmann::ordered_json(nullptr);
  auto& ps = j["policies"] = nlohmann::ordered_json::array();
  for (const auto& p : r.policies) {
    nlohmann::ordered_json o;
    o["name"] = p.name;
    o["switching"] = p.switching;
    o["wholeGpusAtStart"] = p.whole_gpus_at_start;
    o["accepted"] = p.accepted;
    o["wholeAccepted"] = p.whole_accepted;
    o["migAccepted"] = p.mig_accepted;
    o["acceptedCount"] = p.accepted_count;
    o["acceptedGpuTime"] = p.accepted_gpu_time;
    o["wholeGpuTime"] = p.whole_gpu_time;
    o["migGpuTime"] = p.mig_gpu_time;
    o["pendingP50Seconds"] = p.pending_p50;
    o["pendingP99Seconds"] = p.pending_p99;
    o["pendingMeanSeconds"] = p.pending_mean;
    o["neverStarted"] = p.never_started;
    o["switchesToWhole"] = p.switches_to_whole;
    o["switchesToMig"] = p.switches_to_mig;
    o["switchGpuHours"] = p.switch_gpu_hours;
    o["meanWholeGpus"] = p.mean_whole_gpus;
    o["rounds"] = p.rounds;
    o["seconds"] = p.seconds;
    ps.push_back(std::move(o));
  }
  return j.dump(2) + "\n";
}

std::string FormatModeCsv(const ModeSimResult& r) {
  std::string out =
      "policy,wholeGpusAtStart,accepted,acceptedCount,acceptedGpuTime,wholeGpuTime,migGpuTime,"
      "pendingP50Seconds,pendingP99Seconds,neverStarted,switchesToWhole,switchesToMig,"
      "switchGpuHours,meanWholeGpus,seconds\n";
  for (const auto& p : r.policies) {
    out += fmt::format(
        "{},{},{},{:.6f},{:.6f},{:.6f},{:.6f},{:.3f},{:.3f},{},{},{},{:.6f},{:.3f},"
        "{:.3f}\n",
        p.name, p.whole_gpus_at_start, p.accepted, p.accepted_count, p.accepted_gpu_time,
        p.whole_gpu_time, p.mig_gpu_time, p.pending_p50, p.pending_p99, p.never_started,
        p.switches_to_whole, p.switches_to_mig, p.switch_gpu_hours, p.mean_whole_gpus, p.seconds);
  }
  return out;
}

}  // namespace dynmig::sim
