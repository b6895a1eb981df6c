#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/cli.h"
#include "nlohmann/json.hpp"

namespace dynmig::cli {
namespace {

using ::testing::HasSubstr;

class SimulateCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("dynmig-simulate-cli-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    trace_ = (dir_ / "pods.csv").string();
    std::ofstream(trace_) << "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
                             "creation_time,deletion_time,scheduled_time\n"
                             "a,1,1,1,120,,LS,Running,0,90,0\n"
                             "b,1,1,1,490,,LS,Running,1,100,1\n"
                             "c,1,1,1,240,,LS,Running,2,110,2\n"
                             "d,1,1,1,120,,LS,Running,3,120,3\n"
                             "e,1,1,0,0,,LS,Running,3,120,3\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  int Run(const std::vector<std::string>& args) {
    out_.str("");
    err_.str("");
    return RunCli(args, out_, err_);
  }

  std::filesystem::path dir_;
  std::string trace_;
  std::ostringstream out_, err_;
};

TEST_F(SimulateCliTest, TextTable) {
  ASSERT_EQ(Run({"simulate", "--trace", trace_, "--gpus", "A100-SXM4-40GBx1"}), kExitOk)
      << err_.str();
  const std::string out = out_.str();
  EXPECT_THAT(out, HasSubstr("4 GPU pods (1 CPU-only skipped, 0 unservable)"));
  EXPECT_THAT(out, HasSubstr("A100-SXM4-40GB x 1"));
  for (const char* p :
       {"dynmig", "hami-v2.10", "first-fit", "best-fit", "static:all-balanced", "static:all-1g",
        "static:all-2g", "static:all-3g", "static:all-7g", "repack"}) {
    EXPECT_THAT(out, HasSubstr(p));
  }
  EXPECT_EQ(err_.str(), "");  // no progress bar when stderr is not a terminal
}

TEST_F(SimulateCliTest, JsonAndSvg) {
  const std::string svg = (dir_ / "chart.svg").string();
  ASSERT_EQ(Run({"simulate", "--trace", trace_, "--gpus", "A100-SXM4-40GBx1", "--policy",
                 "dynmig,hami-v2.10,repack", "-o", "json", "--svg", svg}),
            kExitOk)
      << err_.str();
  auto j = nlohmann::json::parse(out_.str());
  ASSERT_EQ(j["policies"].size(), 3u);
  EXPECT_EQ(j["policies"][0]["name"], "dynmig");
  EXPECT_DOUBLE_EQ(j["policies"][0]["acceptedCount"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["policies"][1]["acceptedCount"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(j["policies"][0]["gapClosed"].get<double>(), 1.0);
  std::ifstream in(svg);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_THAT(ss.str(), HasSubstr("<svg"));
}

TEST_F(SimulateCliTest, CsvQueueAndFill) {
  ASSERT_EQ(Run({"simulate", "--trace", trace_, "--gpus", "A100-SXM4-40GBx1", "--mode", "queue",
                 "-o", "csv", "--policy", "first-fit"}),
            kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), ::testing::StartsWith("policy,accepted,"));
  EXPECT_THAT(out_.str(), HasSubstr("\nfirst-fit,4,"));
  ASSERT_EQ(Run({"simulate", "--trace", trace_, "--gpus", "A100-SXM4-40GBx1", "--mode", "fill"}),
            kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("bound"));
  EXPECT_THAT(out_.str(), HasSubstr("vs bound"));
}

TEST_F(SimulateCliTest, Generate) {
  ASSERT_EQ(Run({"simulate", "--generate", "pods=300,load=1.5", "--seed", "3", "--gpus",
                 "A100-SXM4-40GBx8", "--policy", "dynmig,repack"}),
            kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("generated:pods=300,load=1.5 (seed 3)"));
}

TEST_F(SimulateCliTest, ASnapshotWithoutTimingServesFillModeOnly) {
  const std::string snapshot = (dir_ / "openb_pod_list_multigpu50.csv").string();
  std::ofstream(snapshot) << "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase\n"
                             "a,1,1,1,120,,LS,Running\n"
                             "b,1,1,2,490,,LS,Running\n"
                             "c,1,1,1,1000,,LS,Running\n";
  ASSERT_EQ(Run({"simulate", "--trace", snapshot, "--gpus", "A100-SXM4-40GBx2", "--mode", "fill",
                 "-o", "json"}),
            kExitOk)
      << err_.str();
  const auto doc = nlohmann::json::parse(out_.str(), nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << out_.str();
  EXPECT_THAT(doc.dump(), HasSubstr("\"fill\"")) << doc.dump(2);
  for (const char* mode : {"reject", "queue"}) {
    EXPECT_EQ(Run({"simulate", "--trace", snapshot, "--gpus", "A100-SXM4-40GBx2", "--mode", mode}),
              kExitBadInput)
        << mode;
    EXPECT_THAT(err_.str(), HasSubstr("has no creation_time column: a snapshot of pods without "
                                      "timing"));
    EXPECT_THAT(err_.str(), HasSubstr("which only --mode fill can use"));
  }
}

// --warm-instances: without --policy, dynmig:warm runs beside dynmig; with --policy, it configures
// the listed warm policies and needs one.
TEST_F(SimulateCliTest, WarmInstances) {
  ASSERT_EQ(Run({"simulate", "--trace", trace_, "--gpus", "A100-SXM4-40GBx1", "--warm-instances",
                 "90s,3", "-o", "json"}),
            kExitOk)
      << err_.str();
  auto j = nlohmann::json::parse(out_.str());
  EXPECT_EQ(j["warmInstances"], "1m30s,3");
  ASSERT_GE(j["policies"].size(), 2u);
  EXPECT_EQ(j["policies"][0]["name"], "dynmig");
  EXPECT_EQ(j["policies"][1]["name"], "dynmig:warm");
  EXPECT_TRUE(j["policies"][1]["warm"].is_object());
  EXPECT_EQ(j["policies"][1]["acceptedCount"], j["policies"][0]["acceptedCount"]);

  ASSERT_EQ(Run({"simulate", "--trace", trace_, "--gpus", "A100-SXM4-40GBx1", "--policy",
                 "dynmig,dynmig:warm+gpu-binpack"}),
            kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(),
              HasSubstr("warm instances (5m,2: idle for at most 5m, at most 2 per GPU)"));
  EXPECT_THAT(out_.str(), HasSubstr("dynmig:warm+gpu-binpack"));

  EXPECT_EQ(Run({"simulate", "--trace", trace_, "--policy", "dynmig", "--warm-instances", "5m,2"}),
            kExitBadInput);
  EXPECT_THAT(err_.str(), HasSubstr("no policy of --policy has warm instances"));
  EXPECT_EQ(Run({"simulate", "--trace", trace_, "--warm-instances", "5m"}), kExitBadInput);
  EXPECT_THAT(err_.str(), HasSubstr("--warm-instances \"5m\": two values"));
  EXPECT_EQ(Run({"simulate", "--trace", trace_, "--warm-instances", "5m,100"}), kExitBadInput);
  EXPECT_THAT(err_.str(), HasSubstr("MAX_PER_GPU \"100\" is not a number from 1 to 64"));
}

TEST_F(SimulateCliTest, BadInput) {
  EXPECT_EQ(Run({"simulate", "--trace", trace_, "--mode", "sometimes"}), kExitBadInput);
  EXPECT_THAT(err_.str(), HasSubstr("--mode \"sometimes\": expected reject, queue or fill"));
  EXPECT_EQ(Run({"simulate", "--trace", trace_, "--policy", "worst-fit"}), kExitBadInput);
  EXPECT_THAT(err_.str(), HasSubstr("unknown policy \"worst-fit\""));
  EXPECT_EQ(Run({"simulate", "--trace", trace_, "--gpus", "A100"}), kExitBadInput);
  EXPECT_THAT(err_.str(), HasSubstr("has no GPU count"));
  EXPECT_EQ(Run({"simulate", "--trace", (dir_ / "missing.csv").string()}), kExitBadInput);
  EXPECT_THAT(err_.str(), HasSubstr("no trace file"));
  EXPECT_EQ(Run({"simulate", "--trace", trace_, "--generate", "pods=1"}), kExitBadInput);
  EXPECT_THAT(err_.str(), HasSubstr("exclude each other"));
  EXPECT_EQ(Run({"simulate", "--trace", trace_, "-o", "yaml"}), kExitBadInput);
  std::ofstream(dir_ / "bad.csv") << "name,num_gpu,gpu_milli,creation_time,deletion_time\n"
                                     "x,1,1000,zero,5\n";
  EXPECT_EQ(Run({"simulate", "--trace", (dir_ / "bad.csv").string()}), kExitBadInput);
  EXPECT_THAT(err_.str(), HasSubstr("bad.csv:2: creation_time \"zero\" is not a number"));
}

TEST_F(SimulateCliTest, MigModePoliciesSideBySide) {
  ASSERT_EQ(
      Run({"simulate", "--generate", "pods=300,load=0.8,whole=0.3", "--gpus", "A100-SXM4-40GBx16",
           "--policy", "dynmig:mode-switch", "--pools", "0,8", "-o", "json"}),
      kExitOk)
      << err_.str();
  auto j = nlohmann::json::parse(out_.str());
  ASSERT_EQ(j["policies"].size(), 3u);
  EXPECT_EQ(j["policies"][0]["name"], "pools:0");
  EXPECT_EQ(j["policies"][1]["name"], "pools:8");
  EXPECT_EQ(j["policies"][2]["name"], "dynmig:mode-switch");
  EXPECT_EQ(j["mode"], "queue");
  EXPECT_GT(j["wholePods"].get<int>(), 0);
  // Without --pools, every split in steps of a node; text output by default.
  ASSERT_EQ(Run({"simulate", "--generate", "pods=300,whole=0.3", "--gpus", "A100-SXM4-40GBx16",
                 "--policy", "dynmig:mode-switch+min-1m"}),
            kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("pools:16"));
  EXPECT_THAT(out_.str(), HasSubstr("dynmig:mode-switch+min-1m"));
  EXPECT_THAT(out_.str(), HasSubstr("switches w/m"));
}

TEST_F(SimulateCliTest, MigModePoliciesRefuseWhatDoesNotApply) {
  const std::vector<std::string> base = {"simulate", "--trace", trace_, "--gpus",
                                         "A100-SXM4-40GBx8"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return Run(a);
  };
  EXPECT_EQ(with({"--policy", "dynmig:mode-switch", "--mode", "reject"}), kExitBadInput);
  EXPECT_THAT(err_.str(), HasSubstr("only queue"));
  EXPECT_EQ(with({"--policy", "dynmig,dynmig:mode-switch"}), kExitBadInput);
  EXPECT_THAT(err_.str(), HasSubstr("cannot run beside"));
  EXPECT_EQ(with({"--pools", "9"}), kExitBadInput);
  EXPECT_THAT(err_.str(), HasSubstr("from 0 to 8"));
  EXPECT_EQ(with({"--pools", "sweep:0"}), kExitBadInput);
  EXPECT_EQ(with({"--policy", "dynmig:mode-switch+min-1s"}), kExitBadInput);
  EXPECT_EQ(with({"--pools", "4", "--svg", (dir_ / "x.svg").string()}), kExitBadInput);
  // The trace's pods run: --pools alone adds dynmig:mode-switch.
  ASSERT_EQ(with({"--pools", "4", "-o", "csv"}), kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("pools:4,4,"));
  EXPECT_THAT(out_.str(), HasSubstr("dynmig:mode-switch,0,"));
}

}  // namespace
}  // namespace dynmig::cli
