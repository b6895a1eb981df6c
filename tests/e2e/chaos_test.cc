// A chaos seed (the long soak is `make soak`): the whole local system under a seeded random
// workload with every kind of fault, crash and restart keeps the invariants and quiesces clean.
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

// Chosen so that every kind of fault comes up within the first 50 steps (of some 300).
constexpr uint64_t kTestSeed = 5;

// The 60-second seed of `make test` (the long one is `make soak`). Its own ctest test, run beside
// the others: the settings leave room for a loaded 2-core machine (the invariants are never
// loosened for it).
TEST(ChaosTest, SixtySecondSeedKeepsEveryInvariant) {
  spdlog::set_level(spdlog::level::off);
  ChaosOptions o;
  o.seed = kTestSeed;
  o.duration = absl::Seconds(60);
  o.step = absl::Milliseconds(150);
  o.max_pods = 8;
  o.quiesce_timeout = absl::Seconds(90);
  o.state_dir =
      (std::filesystem::temp_directory_path() / ("dynmig-chaos-test-" + std::to_string(::getpid())))
          .string();
  o.log = [](const std::string& line) { std::cerr << line << "\n"; };
  auto report = RunChaos(o, RealClock());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok()) << report->Summary();
  std::cerr << report->Summary();
  // The run did what it says: pods ran, every kind of fault was injected, invariants were
  // checked. The kinds of the first steps are fixed by the seed (their own random stream);
  // whether an armed crash point is reached depends on the Allocates that follow.
  EXPECT_GT(report->pods_created, 10) << report->Summary();
  EXPECT_GT(report->pods_running_seen, 3) << report->Summary();
  EXPECT_GT(report->checks, 100) << report->Summary();
  for (const char* kind :
       {"nvml-fault", "api-fault", "api-timeout", "api-outage", "watch-cut", "watch-410-relist",
        "crash armed", "scheduler crash", "clock-jump", "restart device-plugin"}) {
    EXPECT_GT(report->Total(kind), 0) << kind << "\n" << report->Summary();
  }
  EXPECT_FALSE(std::filesystem::exists(o.state_dir));
}

// Handover (issue 29): legacy pods run on the first node under NVIDIA's stand-in, dynmig takes
// the node over, then the usual faults plus restarts of that node's kubelet stand-in and device
// plugin: no running legacy pod loses its instance, no reservation overlaps one, and at the end
// every legacy instance is reclaimed with its pod.
TEST(ChaosTest, HandoverSeedKeepsEveryInvariant) {
  spdlog::set_level(spdlog::level::off);
  ChaosOptions o;
  o.seed = 11;
  o.handover = true;
  o.duration = absl::Seconds(40);
  o.step = absl::Milliseconds(150);
  o.max_pods = 10;
  o.quiesce_timeout = absl::Seconds(90);
  o.state_dir = (std::filesystem::temp_directory_path() /
                 ("dynmig-chaos-handover-" + std::to_string(::getpid())))
                    .string();
  o.log = [](const std::string& line) { std::cerr << line << "\n"; };
  auto report = RunChaos(o, RealClock());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok()) << report->Summary();
  std::cerr << report->Summary();
  EXPECT_EQ(report->actions["legacy pods"], 6) << "2 GPUs of 1g.5gb=2,2g.10gb=1";
  EXPECT_GT(report->Total("restart kubelet"), 0) << report->Summary();
  EXPECT_GT(report->Total("restart device-plugin"), 0) << report->Summary();
  EXPECT_GT(report->checks, 50) << report->Summary();
  EXPECT_FALSE(std::filesystem::exists(o.state_dir));
}

// MIG mode switching on (issue 31): random mode requests, the switch crash points armed among the
// other faults; nothing in use is ever switched, no mode is left pending.
TEST(ChaosTest, ModeSwitchSeedKeepsEveryInvariant) {
  spdlog::set_level(spdlog::level::off);
  ChaosOptions o;
  o.seed = 7;
  o.mode_switches = true;
  o.duration = absl::Seconds(50);
  o.max_pods = 10;
  o.quiesce_timeout = absl::Seconds(90);
  o.state_dir = (std::filesystem::temp_directory_path() /
                 ("dynmig-chaos-modes-" + std::to_string(::getpid())))
                    .string();
  o.log = [](const std::string& line) { std::cerr << line << "\n"; };
  auto report = RunChaos(o, RealClock());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->ok()) << report->Summary();
  std::cerr << report->Summary();
  EXPECT_GT(report->Total("mode request"), 0) << report->Summary();
  EXPECT_GT(report->Total("mode switched"), 0) << report->Summary();
  EXPECT_GT(report->Total("crash armed mode-"), 0) << report->Summary();
  EXPECT_GT(report->checks, 50) << report->Summary();
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
