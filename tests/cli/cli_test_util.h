// Runs `dynmig ...` in-process and captures its output.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "cli/cli.h"

namespace dynmig::cli::testing {

struct CliResult {
  int code;
  std::string out;
  std::string err;
};

inline CliResult RunDynmig(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = RunCli(args, out, err);
  return {code, out.str(), err.str()};
}

}  // namespace dynmig::cli::testing
