// A short chaos soak (the long one is `make soak`): the whole local system under a seeded random
// workload with NVML and API faults and restarts keeps the invariants and quiesces clean.
#include "local/chaos.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <sstream>

#include "cli/cli.h"
#include "spdlog/spdlog.h"

namespace dynmig::local {
namespace {

TEST(ChaosTest, ShortSeedKeepsEveryInvariant) {
  spdlog::set_level(spdlog::level::off);
  ChaosOptions o;
  o.seed = 7;
  o.duration = absl::Seconds(25);
  o.step = absl::Milliseconds(150);
  o.max_pods = 8;
  o.state_dir =
      (std::filesystem::temp_directory_path() / ("dynmig-chaos-test-" + std::to_string(::getpid())))
          .string();
  o.log = [](const std::string& line) { std::cerr << line << "\n"; };
  auto report = RunChaos(o);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok()) << report->Summary();
  // The run did what it says: pods ran, faults and restarts happened, invariants were checked.
  EXPECT_GT(report->pods_created, 5) << report->Summary();
  EXPECT_GT(report->pods_running_seen, 1) << report->Summary();
  EXPECT_GT(report->checks, 20) << report->Summary();
  int64_t nvml_faults = 0, api_faults = 0, restarts = 0;
  for (const auto& [action, n] : report->actions) {
    if (action.starts_with("nvml-fault")) nvml_faults += n;
    if (action.starts_with("api-fault")) api_faults += n;
    if (action.starts_with("restart")) restarts += n;
  }
  EXPECT_GT(nvml_faults, 0) << report->Summary();
  EXPECT_GT(api_faults, 0) << report->Summary();
  EXPECT_GT(restarts, 0) << report->Summary();
  EXPECT_FALSE(std::filesystem::exists(o.state_dir));
}

TEST(ChaosTest, BadFlagsAreNamed) {
  std::ostringstream out, err;
  EXPECT_EQ(cli::RunCli({"chaos", "--duration", "soon"}, out, err), cli::kExitBadInput);
  EXPECT_NE(err.str().find("--duration: 'soon'"), std::string::npos) << err.str();
  std::ostringstream out2, err2;
  EXPECT_EQ(cli::RunCli({"chaos", "--max-pods", "0"}, out2, err2), cli::kExitBadInput);
  EXPECT_NE(err2.str().find("--max-pods"), std::string::npos) << err2.str();
}

}  // namespace
}  // namespace dynmig::local
