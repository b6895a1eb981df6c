#include <iostream>
#include <string>
#include <vector>

#include "cli/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return dynmig::cli::RunCli(args, std::cout, std::cerr, dynmig::RealClock());
}
