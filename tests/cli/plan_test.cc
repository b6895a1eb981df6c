#include <gtest/gtest.h>

#include "cli_test_util.h"
#include "nlohmann/json.hpp"

namespace dynmig::cli {
namespace {

using testing::RunDynmig;

TEST(PlanCommandTest, JsonNamesProfileAndPlacement) {
  auto r = RunDynmig({"plan", "--gpu", "A100-SXM4-40GB", "--occupied", "1g.5gb@0", "--request",
                      "19000", "-o", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["feasible"].get<bool>());
  ASSERT_EQ(j["instances"].size(), 1u);
  EXPECT_EQ(j["instances"][0]["profile"], "3g.20gb");
  EXPECT_EQ(j["instances"][0]["placement"]["start"], 4);
  EXPECT_EQ(j["instances"][0]["placement"]["size"], 4);
}

TEST(PlanCommandTest, JsonInfeasibleCarriesTheReason) {
  auto r = RunDynmig({"plan", "--gpu", "A100-SXM4-40GB", "--occupied", "1g.5gb@1,1g.5gb@5",
                      "--allow", "1g.5gb,3g.20gb", "--request", "19000", "-o", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["feasible"].get<bool>());
  EXPECT_NE(j["reason"].get<std::string>().find("fragmented"), std::string::npos);
}

TEST(PlanCommandTest, TextDrawsBeforeAndAfter) {
  auto r = RunDynmig({"plan", "--gpu", "H100 80GB", "--request", "9000,9000", "--prefer", "2g"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("before"), std::string::npos);
  EXPECT_NE(r.out.find("after"), std::string::npos);
  EXPECT_NE(r.out.find("{    2g.20gb     }"), std::string::npos) << r.out;
}

TEST(PlanCommandTest, NominalSizeNote) {
  auto r = RunDynmig({"plan", "--gpu", "A100-SXM4-40GB", "--allow",
                      "1g.5gb,2g.10gb,3g.20gb,7g.40gb", "--request", "20000"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("instance 0: 3g.20gb (19968 MiB in NVML, covers 20480 MiB)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("note: 3g.20gb has 19968 MiB on A100-SXM4-40GB, 32 MiB less than the "
                       "request of 20000"),
            std::string::npos)
      << r.out;
  // Strict NVML matching: never less than asked, and the note says what it costs.
  r = RunDynmig({"plan", "--gpu", "A100-SXM4-40GB", "--allow", "1g.5gb,2g.10gb,3g.20gb,7g.40gb",
                 "--request", "20000", "--memory-match", "nvml"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("instance 0: 7g.40gb"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("note: 20000 MiB needs 7g.40gb on A100-SXM4-40GB; 3g.20gb has 19968"),
            std::string::npos)
      << r.out;
  r = RunDynmig({"plan", "--gpu", "A100-SXM4-40GB", "--request", "20000", "--memory-match", "x"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--memory-match: must be \"nominal\" or \"nvml\", got \"x\""),
            std::string::npos)
      << r.err;
}

TEST(PlanCommandTest, BadInputExitsTwoWithAMessage) {
  struct Case {
    std::vector<std::string> args;
    std::string want;
  };
  const std::vector<Case> cases = {
      {{"plan", "--gpu", "V100", "--request", "1000"}, "unknown GPU model"},
      {{"plan", "--gpu", "H100", "--request", "1000"}, "ambiguous"},
      {{"plan", "--gpu", "A30", "--allow", "3g.20gb", "--request", "1000"}, "no MIG profile"},
      {{"plan", "--gpu", "A30", "--occupied", "5g.1gb@0", "--request", "1000"}, "no MIG profile"},
      {{"plan", "--gpu", "A30", "--occupied", "1g.6gb", "--request", "1000"}, "PROFILE@START"},
      {{"plan", "--gpu", "A30", "--occupied", "2g.12gb@1", "--request", "1000"},
       "not a legal placement"},
      {{"plan", "--gpu", "A30", "--occupied", "2g.12gb@0,1g.6gb@1", "--request", "1000"},
       "overlaps"},
      {{"plan", "--gpu", "A30", "--request", "-5"}, "positive memory"},
      {{"plan", "--gpu", "A30", "--request", "abc"}, "positive memory"},
      {{"plan", "--gpu", "A30", "--request", "150%"}, "percentage"},
      {{"plan", "--gpu", "A30"}, "required"},
      {{"plan", "--gpu", "A30", "--request", "1", "-o", "yaml"}, "yaml"},
  };
  for (const auto& c : cases) {
    auto r = RunDynmig(c.args);
    EXPECT_EQ(r.code, 2) << c.args.back() << ": " << r.out;
    EXPECT_NE(r.err.find(c.want), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST(PlanCommandTest, DemoWalksThroughThePlans) {
  auto r = RunDynmig({"plan", "--demo"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("step 8"), std::string::npos);
  EXPECT_NE(r.out.find("4g.20gb (19968 MiB in NVML, covers 20480 MiB) at slices 0-3"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("fragmented"), std::string::npos);
}

TEST(CliTest, UnknownCommandIsBadInput) {
  auto r = RunDynmig({"frobnicate"});
  EXPECT_EQ(r.code, 2);
  auto none = RunDynmig({});
  EXPECT_EQ(none.code, 2);
  auto help = RunDynmig({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("plan"), std::string::npos);
}

}  // namespace
}  // namespace dynmig::cli
