#include "cli/cli.h"

#include <CLI/CLI.hpp>
#include <exception>
#include <ostream>

namespace dynmig::cli {

int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CliContext ctx{out, err};
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
