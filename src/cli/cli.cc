#include "cli/cli.h"

#include <pthread.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <exception>
#include <memory>
#include <ostream>

#include "nvml/dlopen_nvml.h"
#include "nvml/sim_nvml.h"

namespace dynmig::cli {

absl::Status ParseHostPort(std::string_view flag, const std::string& text,
                           std::string_view default_host, std::string* host, int* port) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || (colon == 0 && default_host.empty())) {
    return absl::InvalidArgumentError(std::string(flag) + " must be HOST:PORT, got '" + text + "'");
  }
  *host = colon == 0 ? std::string(default_host) : text.substr(0, colon);
  const std::string port_text = text.substr(colon + 1);
  int value = -1;
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), value);
  if (ec != std::errc() || ptr != port_text.data() + port_text.size() || value < 0 ||
      value > 65535) {
    return absl::InvalidArgumentError("bad port '" + port_text + "' in " + std::string(flag));
  }
  *port = value;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<nvml::Nvml>> OpenNodeNvml(const NodeNvmlFlags& flags,
                                                         const Clock& clock) {
  if (flags.sim.empty() && flags.sim_state.empty()) {
    auto real = nvml::DlopenNvml::Create();
    if (!real.ok()) return real.status();
    return std::unique_ptr<nvml::Nvml>(std::move(*real));
  }
  nvml::SimNvmlOptions o;
  o.clock = &clock;
  o.spec = flags.sim;
  o.state_file = flags.sim_state;
  o.seed = flags.node;
  o.latency = flags.latency;
  auto sim = nvml::SimNvml::Create(std::move(o));
  if (!sim.ok()) return absl::InvalidArgumentError(sim.status().message());
  return std::unique_ptr<nvml::Nvml>(std::move(*sim));
}

StopSignals::StopSignals() {
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGINT);
  sigaddset(&signals_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals_, &previous_);
}

StopSignals::~StopSignals() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }

int StopSignals::Wait() {
  int signal_number = 0;
  sigwait(&signals_, &signal_number);
  return signal_number;
}

// `dynmig chaos` (cmd_chaos.cc), declared here rather than in cli.h with the others so that adding
// it did not rebuild every command.
void RegisterChaosCommand(CLI::App& root, CliContext& ctx);
// `dynmig nvidia-plugin-standin` (cmd_nvidia_standin.cc), likewise.
void RegisterNvidiaStandinCommand(CLI::App& root, CliContext& ctx);

int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
           const Clock& clock) {
  CliContext ctx{out, err, clock};
  CLI::App app{"dynmig: dynamic MIG for Kubernetes", "dynmig"};
  app.require_subcommand(1);
  app.fallthrough();
  app.set_version_flag("--version", "dynmig 0.1.0");
  // One line per subcommand (declared in cli.h).
  RegisterPlanCommand(app, ctx);
  RegisterConfigCommand(app, ctx);
  RegisterNvmlCommand(app, ctx);
  RegisterSimulateCommand(app, ctx);
  RegisterApiserverCommand(app, ctx);
  RegisterOpsCommands(app, ctx);
  RegisterSchedulerCommand(app, ctx);
  RegisterDevicePluginCommand(app, ctx);
  RegisterLocalCommand(app, ctx);
  RegisterGpuCommand(app, ctx);
  RegisterChaosCommand(app, ctx);
  RegisterNvidiaStandinCommand(app, ctx);

  // CLI11 parses a reversed vector of arguments.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return kExitOk;
  } catch (const CLI::CallForAllHelp&) {
    out << app.help("", CLI::AppFormatMode::All);
    return kExitOk;
  } catch (const CLI::CallForVersion&) {
    out << "dynmig 0.1.0\n";
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    err << "dynmig: " << e.what() << "\n";
    if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && app.get_subcommands().empty()) {
      err << app.help();
    }
    return kExitBadInput;
  } catch (const std::exception& e) {
    err << "dynmig: " << e.what() << "\n";
    return kExitFailure;
  }
  return ctx.exit_code;
}

}  // namespace dynmig::cli
