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

// The same on `clock` (a FakeClock: the commands' waits end when the test moves it).
inline CliResult RunDynmig(const std::vector<std::string>& args, const Clock& clock) {
  std::ostringstream out, err;
  const int code = RunCli(args, out, err, clock);
  return {code, out.str(), err.str()};
}

}  // namespace dynmig::cli::testing
