// `dynmig config`: HAMi device-config.yaml tools.
//   dynmig config migrate --in OLD.yaml [--out NEW.yaml]   knownMigGeometries ->
//   migProfileAllowlist dynmig config validate --in FILE                        OK, or the error
//   with its field path dynmig config default                                   the default
//   device-config.yaml
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "cli/cli.h"
#include "fmt/format.h"
#include "protocol/device_config.h"

namespace dynmig::cli {
namespace {

// Reads a whole file; false (with `why`) when it cannot be read.
bool ReadFile(const std::string& path, std::string& out, std::string& why) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    why = fmt::format("cannot read {}: {}", path, std::strerror(errno));
    return false;
  }
  std::stringstream buf;
  buf << in.rdbuf();
  if (in.bad()) {
    why = fmt::format("cannot read {}: read error", path);
    return false;
  }
  out = buf.str();
  return true;
}

// Writes via a temporary file renamed into place, so a failed write leaves no partial file.
bool WriteFile(const std::string& path, const std::string& content, std::string& why) {
  const std::string tmp = path + ".dynmig-tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      why = fmt::format("cannot write {}: {}", tmp, std::strerror(errno));
      return false;
    }
    out << content;
    out.flush();
    if (!out) {
      why = fmt::format("cannot write {}: write error", tmp);
      std::remove(tmp.c_str());
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    why = fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(errno));
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

struct ConfigOptions {
  std::string in;
  std::string out;
};

void RunMigrate(const ConfigOptions& opts, CliContext& ctx) {
  std::string text;
  std::string why;
  if (!ReadFile(opts.in, text, why)) {
    ctx.err << "dynmig config migrate: " << why << "\n";
    ctx.exit_code = kExitBadInput;
    return;
  }
  auto migrated = protocol::MigrateDeviceConfig(text);
  if (!migrated.ok()) {
    ctx.err << "dynmig config migrate: " << opts.in << ": " << migrated.status().message()
            << "\nnothing was written\n";
    ctx.exit_code = migrated.status().code() == absl::StatusCode::kInvalidArgument ? kExitBadInput
                                                                                   : kExitFailure;
    return;
  }
  for (const auto& line : migrated->report) ctx.err << line << "\n";
  if (opts.out.empty()) {
    ctx.out << migrated->yaml;
  } else {
    if (!WriteFile(opts.out, migrated->yaml, why)) {
      ctx.err << "dynmig config migrate: " << why << "\n";
      ctx.exit_code = kExitFailure;
      return;
    }
    ctx.err << "wrote " << opts.out << "\n";
  }
  ctx.exit_code = kExitOk;
}

void RunValidate(const ConfigOptions& opts, CliContext& ctx) {
  std::string text;
  std::string why;
  if (!ReadFile(opts.in, text, why)) {
    ctx.err << "dynmig config validate: " << why << "\n";
    ctx.exit_code = kExitBadInput;
    return;
  }
  auto cfg = protocol::ParseDeviceConfig(text);
  if (!cfg.ok()) {
    ctx.err << opts.in << ": " << cfg.status().message() << "\n";
    ctx.exit_code = kExitBadInput;
    return;
  }
  for (const auto& w : cfg->warnings) ctx.err << "warning: " << w << "\n";
  ctx.out << "OK: " << opts.in << ": " << cfg->allowlist.entries.size() << " allowlist entr"
          << (cfg->allowlist.entries.size() == 1 ? "y" : "ies") << "\n";
  if (const auto& sw = cfg->mig_mode_switching; sw.enabled) {
    ctx.out << "MIG mode switching: on, "
            << (sw.rules.empty()
                    ? std::string("every GPU")
                    : std::to_string(sw.rules.size()) + (sw.rules.size() == 1 ? " rule" : " rules"))
            << ", minModeDuration " << absl::FormatDuration(sw.min_mode_duration) << "\n";
  }
  ctx.exit_code = kExitOk;
}

}  // namespace

void RegisterConfigCommand(CLI::App& root, CliContext& ctx) {
  auto opts = std::make_shared<ConfigOptions>();
  CLI::App* config = root.add_subcommand("config", "HAMi device-config.yaml tools");
  config->require_subcommand(1);

  CLI::App* migrate = config->add_subcommand(
      "migrate",
      "Convert nvidia.knownMigGeometries to nvidia.migProfileAllowlist, keeping every other key; "
      "reports what was dropped on stderr");
  migrate->add_option("--in", opts->in, "the device-config.yaml to convert")->required();
  migrate->add_option("--out", opts->out, "where to write the result (default: stdout)");
  migrate->callback([opts, &ctx] { RunMigrate(*opts, ctx); });

  CLI::App* validate =
      config->add_subcommand("validate", "Check a device-config.yaml; prints OK or the error");
  validate->add_option("--in", opts->in, "the device-config.yaml to check")->required();
  validate->callback([opts, &ctx] { RunValidate(*opts, ctx); });

  CLI::App* dflt = config->add_subcommand(
      "default", "Print the default device-config.yaml (an allowlist for every catalogued GPU)");
  dflt->callback([&ctx] {
    ctx.out << protocol::DefaultDeviceConfigYaml();
    ctx.exit_code = kExitOk;
  });
}

}  // namespace dynmig::cli
