// `dynmig simulate`: placement policies side by side on a real trace or a generated workload.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/cli.h"
#include "common/clock.h"
#include "common/strings.h"
#include "fmt/format.h"
#include "sim/cluster.h"
#include "sim/generator.h"
#include "sim/mode_sim.h"
#include "sim/policies.h"
#include "sim/report.h"
#include "sim/simulator.h"
#include "sim/trace.h"

namespace dynmig::cli {
namespace {

struct SimulateFlags {
  std::string trace;
  std::string generate;
  std::string gpus = "A100-SXM4-40GBx1000";
  uint32_t gpus_per_node = 8;
  std::string policy;
  std::string mode;   // reject by default; queue for the mode-switching policies
  std::string pools;  // --pools: fixed whole/MIG splits beside dynmig:mode-switch
  std::string nvml_latency = "realistic";
  std::string warm;  // --warm-instances TTL,MAX_PER_GPU
  uint64_t seed = 1;
  std::string allow;
  std::string output = "text";
  std::string svg;
};

int SimulateExitFor(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kResourceExhausted:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

// Directories under which ../shared/data/alibaba-gpu-v2023/ may be found.
std::vector<std::string> SearchRoots() {
  namespace fs = std::filesystem;
  std::vector<std::string> roots;
  std::error_code ec;
  if (const char* src = std::getenv("DYNMIG_SOURCE_DIR"); src != nullptr && *src != '\0') {
    roots.emplace_back(src);
  }
  auto git_root = [&](fs::path p) -> std::string {
    for (; !p.empty(); p = p.parent_path()) {
      if (fs::exists(p / ".git", ec)) return p.string();
      if (p == p.parent_path()) break;
    }
    return "";
  };
  const fs::path cwd = fs::current_path(ec);
  if (!ec) {
    if (std::string r = git_root(cwd); !r.empty()) roots.push_back(r);
  }
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    if (std::string r = git_root(exe.parent_path()); !r.empty()) roots.push_back(r);
  }
  if (!cwd.empty()) roots.push_back(cwd.string());
  return roots;
}

// A progress bar on stderr, only when stderr is a terminal and the run takes over a second.
class ProgressBar {
 public:
  ProgressBar(bool enabled, const Clock& clock)
      : enabled_(enabled), clock_(clock), t0_(clock.Monotonic()) {}
  ~ProgressBar() {
    if (shown_) std::cerr << "\r" << std::string(60, ' ') << "\r" << std::flush;
  }
  void Update(double f) {
    if (!enabled_) return;
    if (clock_.Monotonic() - t0_ < absl::Seconds(1)) return;
    shown_ = true;
    const int width = 40;
    const int filled = static_cast<int>(f * width + 0.5);
    std::cerr << "\rsimulating [" << std::string(filled, '#') << std::string(width - filled, '.')
              << "] " << static_cast<int>(f * 100 + 0.5) << "% " << std::flush;
  }

 private:
  bool enabled_;
  const Clock& clock_;
  bool shown_ = false;
  absl::Duration t0_;
};

// The workload: --generate, else --trace (or the default trace).
absl::StatusOr<sim::Trace> LoadWorkload(const SimulateFlags& f, const sim::Cluster& cluster) {
  if (!f.generate.empty()) return sim::GenerateTrace(f.generate, f.seed, cluster);
  sim::TraceLookup lookup;
  lookup.flag = f.trace;
  if (const char* dir = std::getenv("DYNMIG_TRACE_DIR"); dir != nullptr) lookup.env_dir = dir;
  lookup.roots = SearchRoots();
  auto path = sim::ResolveTracePath(lookup);
  if (!path.ok()) return path.status();
  return sim::LoadTrace(*path);
}

// Whether the run compares per-GPU MIG modes (--pools, or a policy of sim/mode_sim.h).
bool IsModeRun(const SimulateFlags& f) {
  if (!f.pools.empty()) return true;
  for (const auto& p : SplitTrimmed(f.policy, ',')) {
    if (sim::IsModePolicy(p)) return true;
  }
  return false;
}

// The policies of a mode run: --policy's (all of sim/mode_sim.h) and --pools' fixed splits;
// without --pools and without a pools:K policy, every split in steps of a node.
absl::StatusOr<std::vector<std::string>> ModePolicies(const SimulateFlags& f,
                                                      const sim::Cluster& cluster) {
  std::vector<std::string> policies;
  bool any_pools = false;
  for (const auto& p : SplitTrimmed(f.policy, ',')) {
    if (!sim::IsModePolicy(p)) {
      return absl::InvalidArgumentError(
          fmt::format("--policy: \"{}\" cannot run beside the MIG mode policies (pools:K, "
                      "dynmig:mode-switch): every GPU there has a mode; run it separately",
                      p.substr(0, 64)));
    }
    auto spec = sim::ParseModePolicy(p, cluster);
    if (!spec.ok()) return spec.status();
    any_pools = any_pools || !spec->switching;
    policies.push_back(p);
  }
  if (f.policy.empty()) policies.push_back("dynmig:mode-switch");
  if (!f.pools.empty() || !any_pools) {
    auto pools = sim::ExpandPools(f.pools.empty() ? "sweep" : f.pools, cluster);
    if (!pools.ok()) return pools.status();
    policies.insert(policies.begin(), pools->begin(), pools->end());
  }
  return policies;
}

// `dynmig simulate` with per-GPU MIG modes: fixed pools against switching on demand.
void RunModeSimulate(const SimulateFlags& f, CliContext& ctx, const Clock& clock,
                     const sim::Cluster& cluster, const mig::NvmlLatency& latency) {
  auto fail = [&](const absl::Status& s) {
    ctx.err << "dynmig simulate: " << s.message() << "\n";
    ctx.exit_code = SimulateExitFor(s);
  };
  if (!f.mode.empty() && f.mode != "queue") {
    return fail(absl::InvalidArgumentError(fmt::format(
        "--mode {}: the MIG mode policies need pods that wait (a switch serves a pending pod): "
        "only queue",
        f.mode.substr(0, 32))));
  }
  if (!f.warm.empty() || !f.svg.empty()) {
    return fail(absl::InvalidArgumentError(
        "--warm-instances and --svg do not apply to the MIG mode policies"));
  }
  auto policies = ModePolicies(f, cluster);
  if (!policies.ok()) return fail(policies.status());
  auto trace = LoadWorkload(f, cluster);
  if (!trace.ok()) return fail(trace.status());
  if (trace->snapshot) {
    return fail(absl::InvalidArgumentError(fmt::format(
        "--trace {}: the pod list has no creation_time column: a snapshot without timing, which "
        "the MIG mode policies cannot replay",
        trace->source)));
  }
  ProgressBar bar(&ctx.err == &std::cerr && isatty(STDERR_FILENO) != 0, clock);
  sim::ModeSimOptions options;
  options.nvml_latency = latency;
  options.progress = [&](double x) { bar.Update(x); };
  auto result = sim::SimulateModes(*trace, cluster, *policies, options, clock);
  if (!result.ok()) return fail(result.status());
  if (f.output == "json") {
    ctx.out << sim::FormatModeJson(*result);
  } else if (f.output == "csv") {
    ctx.out << sim::FormatModeCsv(*result);
  } else {
    ctx.out << sim::FormatModeText(*result);
  }
}

void RunSimulate(const SimulateFlags& f, CliContext& ctx, const Clock& clock) {
  auto fail = [&](const absl::Status& s) {
    ctx.err << "dynmig simulate: " << s.message() << "\n";
    ctx.exit_code = SimulateExitFor(s);
  };
  sim::SimOptions options;
  if (f.mode.empty() || f.mode == "reject") {
    options.mode = sim::Mode::kReject;
  } else if (f.mode == "queue") {
    options.mode = sim::Mode::kQueue;
  } else if (f.mode == "fill") {
    options.mode = sim::Mode::kFill;
  } else {
    return fail(absl::InvalidArgumentError(
        fmt::format("--mode \"{}\": expected reject, queue or fill", f.mode)));
  }
  auto latency = mig::ParseNvmlLatency(f.nvml_latency);
  if (!latency.ok()) {
    return fail(
        absl::InvalidArgumentError("--nvml-latency: " + std::string(latency.status().message())));
  }
  options.nvml_latency = *latency;
  if (!f.warm.empty() && !IsModeRun(f)) {
    auto warm = sim::ParseWarmConfig(f.warm);
    if (!warm.ok()) return fail(warm.status());
    options.warm = *warm;
  }
  if (f.output != "text" && f.output != "json" && f.output != "csv") {
    return fail(
        absl::InvalidArgumentError(fmt::format("-o \"{}\": expected text, json or csv", f.output)));
  }
  if (!f.trace.empty() && !f.generate.empty()) {
    return fail(absl::InvalidArgumentError("--trace and --generate exclude each other"));
  }
  auto cluster = sim::BuildCluster(f.gpus, f.gpus_per_node, SplitTrimmed(f.allow, ','));
  if (!cluster.ok()) return fail(cluster.status());
  if (IsModeRun(f)) return RunModeSimulate(f, ctx, clock, *cluster, options.nvml_latency);

  std::vector<std::string> policies;
  if (f.policy.empty()) {
    const std::vector<sim::SimPod> none;
    for (const auto& name : sim::DefaultPolicies()) {
      auto p = sim::MakePolicy(name, *cluster, none);
      if (p.ok()) {
        policies.push_back(name);
        // With --warm-instances, the production planner with warm instances beside it.
        if (name == "dynmig" && !f.warm.empty()) policies.push_back("dynmig:warm");
      } else {
        ctx.err << "dynmig simulate: skipping " << name << ": " << p.status().message() << "\n";
      }
    }
  } else {
    policies = SplitTrimmed(f.policy, ',');
    const std::vector<sim::SimPod> none;
    bool any_warm = false;
    for (const auto& name : policies) {
      auto p = sim::MakePolicy(name, *cluster, none, options.warm);
      if (!p.ok()) return fail(p.status());
      any_warm = any_warm || (*p)->warm().enabled;
    }
    if (!f.warm.empty() && !any_warm) {
      return fail(absl::InvalidArgumentError(
          "--warm-instances: no policy of --policy has warm instances (add dynmig:warm, e.g. "
          "--policy dynmig,dynmig:warm)"));
    }
  }

  absl::StatusOr<sim::Trace> trace = LoadWorkload(f, *cluster);
  if (!trace.ok()) return fail(trace.status());
  if (trace->snapshot && options.mode != sim::Mode::kFill) {
    return fail(absl::InvalidArgumentError(fmt::format(
        "--trace {}: the pod list has no creation_time column: a snapshot of pods without "
        "timing (as the v2023 multigpu lists are), which only --mode fill can use ({} replays "
        "arrivals and departures)",
        trace->source, sim::ModeName(options.mode))));
  }

  ProgressBar bar(&ctx.err == &std::cerr && isatty(STDERR_FILENO) != 0, clock);
  options.progress = [&](double x) { bar.Update(x); };
  auto result = sim::Simulate(*trace, *cluster, policies, options, clock);
  if (!result.ok()) return fail(result.status());

  if (!f.svg.empty()) {
    std::ofstream svg(f.svg, std::ios::binary | std::ios::trunc);
    svg << sim::FormatSvg(*result);
    svg.close();
    if (!svg) {
      ctx.err << "dynmig simulate: cannot write " << f.svg << "\n";
      ctx.exit_code = kExitFailure;
      return;
    }
  }
  if (f.output == "json") {
    ctx.out << sim::FormatJson(*result);
  } else if (f.output == "csv") {
    ctx.out << sim::FormatCsv(*result);
  } else {
    ctx.out << sim::FormatText(*result);
  }
}

}  // namespace

void RegisterSimulateCommand(CLI::App& root, CliContext& ctx) {
  auto flags = std::make_shared<SimulateFlags>();
  CLI::App* cmd = root.add_subcommand(
      "simulate",
      "Replay a trace (or a generated workload) against placement policies side by side");
  cmd->add_option("--trace", flags->trace,
                  "Alibaba v2023 pod list (file, directory, or short name such as gpushare100); "
                  "default openb_pod_list_default.csv from $DYNMIG_TRACE_DIR or "
                  "../shared/data/alibaba-gpu-v2023/");
  cmd->add_option("--generate", flags->generate,
                  "generated workload: pods=N,mix=1g:0.5/2g:0.2/3g:0.2/7g:0.1,"
                  "arrival=poisson|daily|burst,rate=R|load=L,life=lognormal:MU,SIGMA,burst=B,"
                  "whole=SHARE,wholemix=1:0.7/2:0.15/4:0.1/8:0.05");
  cmd->add_option("--gpus", flags->gpus,
                  "GPU models and counts, e.g. A100-SXM4-40GBx100,H100 80GBx50")
      ->capture_default_str();
  cmd->add_option("--gpus-per-node", flags->gpus_per_node, "GPUs per node")->capture_default_str();
  cmd->add_option(
      "--policy", flags->policy,
      "comma-separated policies (default: dynmig, dynmig:defrag, hami-v2.10, hami-newest, "
      "first-fit, best-fit, "
      "static:all-balanced/all-1g/all-2g/all-3g/all-7g, repack); pools:K and "
      "dynmig:mode-switch[+min-10m][+interval-2s] compare per-GPU MIG modes (queue mode)");
  cmd->add_option("--mode", flags->mode,
                  "reject | queue | fill (default reject; queue with the MIG mode policies)");
  cmd->add_option("--pools", flags->pools,
                  "fixed whole/MIG splits compared with dynmig:mode-switch: K1,K2,... whole GPUs "
                  "(the first K), or sweep[:STEP] (0 to every GPU in steps of a node; the default "
                  "with dynmig:mode-switch)");
  cmd->add_option("--nvml-latency", flags->nvml_latency,
                  "instance create/destroy time added to each pod's time to Running: none, "
                  "realistic (about 1.5 s per instance) or [MODEL:]OP=DURATION items")
      ->capture_default_str();
  cmd->add_option("--warm-instances", flags->warm,
                  "warm instances of the dynmig:warm policies, TTL,MAX_PER_GPU (default 5m,2, as "
                  "device-config.yaml nvidia.migWarmInstances); without --policy, adds dynmig:warm "
                  "beside dynmig");
  cmd->add_option("--seed", flags->seed, "seed of --generate")->capture_default_str();
  cmd->add_option("--allow", flags->allow,
                  "allowlisted profiles (default: the base profiles of each model)");
  cmd->add_option("-o,--output", flags->output, "text | json | csv")->capture_default_str();
  cmd->add_option("--svg", flags->svg, "write an SVG chart to this file");
  cmd->callback([flags, &ctx] { RunSimulate(*flags, ctx, RealClock()); });
}

}  // namespace dynmig::cli
