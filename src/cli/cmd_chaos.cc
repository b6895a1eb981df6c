// `dynmig chaos`: the local system under a seeded random workload with injected faults and
// restarts, checking the invariants continuously and after quiescence (src/local/chaos.h).
// Exit 0: no violation; 1: violations (each printed with its seed and step); 2: bad flags.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <memory>
#include <ostream>
#include <string>

#include "absl/time/time.h"
#include "cli/cli.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "fmt/format.h"
#include "local/chaos.h"
#include "spdlog/spdlog.h"

namespace dynmig::cli {
namespace {

struct ChaosFlags {
  uint64_t seed = 1;
  std::string duration = "90s";
  std::string nodes = "node-a=A100-SXM4-40GBx2,node-b=H100 80GBx1";
  std::string state_dir;
  std::string step = "200ms";
  std::string quiesce_timeout = "60s";
  size_t max_pods = 10;
  bool verbose = false;
  bool handover = false;
  bool mode_switches = false;
  std::string handover_geometry = "1g.5gb=2,2g.10gb=1";
};

int RunChaosCommand(const ChaosFlags& f, CliContext& ctx) {
  auto bad = [&](const std::string& message) {
    ctx.err << "dynmig chaos: " << message << "\n";
    return kExitBadInput;
  };
  local::ChaosOptions o;
  o.seed = f.seed;
  o.nodes = f.nodes;
  o.max_pods = f.max_pods;
  o.handover = f.handover;
  o.mode_switches = f.mode_switches;
  o.handover_geometry = f.handover_geometry;
  if (!absl::ParseDuration(f.duration, &o.duration) || o.duration < absl::ZeroDuration()) {
    return bad("--duration: '" + f.duration + "' is not a duration such as 90s or 30m");
  }
  if (!absl::ParseDuration(f.step, &o.step) || o.step < absl::ZeroDuration()) {
    return bad("--step: '" + f.step + "' is not a duration such as 200ms");
  }
  if (!absl::ParseDuration(f.quiesce_timeout, &o.quiesce_timeout) ||
      o.quiesce_timeout <= absl::ZeroDuration()) {
    return bad("--quiesce-timeout: '" + f.quiesce_timeout + "' is not a positive duration");
  }
  if (f.max_pods == 0) return bad("--max-pods must be at least 1");
  o.state_dir = f.state_dir.empty() ? (std::filesystem::temp_directory_path() /
                                       fmt::format("dynmig-chaos-{}-{}", ::getpid(), f.seed))
                                          .string()
                                    : f.state_dir;
  dynmig::Mutex mu;  // one line at a time on each stream
  o.log = [&](const std::string& line) {
    dynmig::MutexLock lock(&mu);
    ctx.out << line << "\n";
    ctx.out.flush();
  };
  // The components' own logs would drown the report; their errors are what chaos provokes.
  // --verbose keeps them (spdlog on stdout, the event lines on stderr), to follow a seed.
  if (f.verbose) {
    o.component_log = [&](const std::string& line) {
      dynmig::MutexLock lock(&mu);
      ctx.err << line << "\n";
    };
  } else {
    spdlog::set_level(spdlog::level::off);
  }
  auto report = local::RunChaos(o, RealClock());
  if (!report.ok()) {
    ctx.err << "dynmig chaos: " << report.status().message() << "\n";
    return kExitFailure;
  }
  ctx.out << report->Summary();
  if (!report->ok()) {
    ctx.err << fmt::format("dynmig chaos: {} violations; replay with --seed {}\n",
                           report->violations.size(), f.seed);
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace

void RegisterChaosCommand(CLI::App& root, CliContext& ctx) {
  auto f = std::make_shared<ChaosFlags>();
  CLI::App* cmd = root.add_subcommand(
      "chaos",
      "Soak the local system under a seeded random workload with NVML and API faults and "
      "restarts, checking that no instance is double-booked, destroyed under a live pod or leaked");
  cmd->add_option("--seed", f->seed, "random seed (it fixes every random choice)")
      ->capture_default_str();
  cmd->add_option("--duration", f->duration, "length of the random phase (e.g. 90s, 30m)")
      ->capture_default_str();
  cmd->add_option("--nodes", f->nodes, "nodes and their simulated GPUs, as for dynmig local")
      ->capture_default_str();
  cmd->add_option(
      "--state-dir", f->state_dir,
      "working directory: new (removed at the end) or empty (default: a new one under $TMPDIR)");
  cmd->add_option("--step", f->step, "pause between actions")->capture_default_str();
  cmd->add_option(
         "--quiesce-timeout", f->quiesce_timeout,
         "how long, after the faults stop and every pod is deleted, until nothing may remain")
      ->capture_default_str();
  cmd->add_option("--max-pods", f->max_pods, "pods alive at most")->capture_default_str();
  cmd->add_flag("--handover", f->handover,
                "start with a legacy world on the first node (--handover-geometry, NVIDIA's "
                "device-plugin stand-in, legacy pods), hand it over to dynmig, and restart its "
                "kubelet stand-in among the faults");
  cmd->add_flag("--mode-switches", f->mode_switches,
                "MIG mode switching on: random dynmig.io/gpu-mode-request writes and switch crash "
                "points, checked: nothing in use is switched, no mode left pending");
  cmd->add_option("--handover-geometry", f->handover_geometry,
                  "the first node's fixed geometry for --handover (its GPUs' model must offer it)")
      ->capture_default_str();
  cmd->add_flag(
      "--verbose", f->verbose,
      "the components' logs too (their own on stdout, their events on stderr), to follow a seed");
  cmd->callback([f, &ctx] { ctx.exit_code = RunChaosCommand(*f, ctx); });
}

}  // namespace dynmig::cli
