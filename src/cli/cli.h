// The `dynmig` command line: one binary, one subcommand per job.
//
// Each subcommand lives in its own cmd_<name>.cc and registers itself on the root app through a
// Register<Name>Command function listed in cli.cc. A command writes to ctx.out / ctx.err (never to
// std::cout directly) and sets ctx.exit_code, so tests run it in-process.
#pragma once

#include <signal.h>

#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "mig/nvml_latency.h"
#include "nlohmann/json.hpp"
#include "nvml/nvml.h"
#include "ops/report.h"

namespace CLI {
class App;
}
namespace dynmig::scheduler {
struct NodeReport;
struct DefragFlags;
}  // namespace dynmig::scheduler
namespace dynmig::kube {
class KubeClient;
}  // namespace dynmig::kube

namespace dynmig::cli {

// Exit codes shared by every command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;   // the command ran and failed (e.g. NVML refused)
inline constexpr int kExitBadInput = 2;  // bad flags or input; nothing was changed

struct CliContext {
  std::ostream& out;
  std::ostream& err;
  // The clock the commands run on: the entry point's (RealClock()), or a test's.
  const Clock& clock;
  int exit_code = kExitOk;
};

// Runs `dynmig args...` (args excludes the program name) on `clock` and returns the exit code.
int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
           const Clock& clock = RealClock());

// Registration functions, one per subcommand file.
void RegisterConfigCommand(CLI::App& root, CliContext& ctx);

void RegisterPlanCommand(CLI::App& root, CliContext& ctx);
void RegisterNvmlCommand(CLI::App& root, CliContext& ctx);
void RegisterSimulateCommand(CLI::App& root, CliContext& ctx);
void RegisterApiserverCommand(CLI::App& root, CliContext& ctx);
void RegisterOpsCommands(CLI::App& root, CliContext& ctx);
void RegisterSchedulerCommand(CLI::App& root, CliContext& ctx);
void RegisterDevicePluginCommand(CLI::App& root, CliContext& ctx);
void RegisterLocalCommand(CLI::App& root, CliContext& ctx);
void RegisterGpuCommand(CLI::App& root, CliContext& ctx);

// The API client of the cluster commands: the pod's service account with `in_cluster`, else
// `kubeconfig` ("" = $KUBECONFIG, in-cluster when available, ~/.kube/config).
absl::StatusOr<std::unique_ptr<kube::KubeClient>> ConnectKube(const std::string& kubeconfig,
                                                              bool in_cluster);

// HOST:PORT of a listen flag (port 0..65535). ":PORT" takes `default_host`, or is an error when
// it is empty. kInvalidArgument: "FLAG must be HOST:PORT, got 'TEXT'", "bad port 'P' in FLAG".
absl::Status ParseHostPort(std::string_view flag, const std::string& text,
                           std::string_view default_host, std::string* host, int* port);

// SIGINT and SIGTERM, blocked from construction in the calling thread (threads started later
// inherit the mask, so none of them takes the signal) until destruction; Wait() returns the signal
// that came. The serving commands make one before starting any thread.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();  // restores the previous mask
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  int Wait();

 private:
  sigset_t signals_;
  sigset_t previous_;
};

// The NVML a node agent (`dynmig device-plugin`, `dynmig nvidia-plugin-standin`) works on: the
// simulator when `sim` (a spec) or `sim_state` (its shared state file) is given, seeded with the
// node's name so that nodes differ and every process of one node sees the same GPUs, else the
// driver through dlopen. The simulator's errors are kInvalidArgument (bad flags); the driver's keep
// their codes.
struct NodeNvmlFlags {
  std::string node;
  std::string sim;
  std::string sim_state;
  mig::NvmlLatency latency;  // the simulator's injected latency
};
absl::StatusOr<std::unique_ptr<nvml::Nvml>> OpenNodeNvml(const NodeNvmlFlags& flags,
                                                         const Clock& clock);

// The defragmenter's flags (--defrag, --defrag-wait, ...), shared by `dynmig scheduler` and
// `dynmig local` (cmd_scheduler.cc).
void AddDefragOptions(CLI::App* cmd, scheduler::DefragFlags& flags);

// A command's answer in the -o format: `text`, or `json` as JSON or YAML (cmd_ops.cc).
void PrintOutput(CliContext& ctx, ops::OutputFormat format, const nlohmann::json& json,
                 const std::string& text);

// `dynmig layout`'s terminal picture of these nodes (cmd_ops.cc), for other commands.
std::string RenderLayoutText(const std::vector<scheduler::NodeReport>& nodes);

}  // namespace dynmig::cli
