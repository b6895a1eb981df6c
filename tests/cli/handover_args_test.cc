// `dynmig handover plan|check` and preflight's new flags: argument handling. Every bad input is
// refused (exit 2, a message naming the flag) before the cluster is read: the kubeconfig named here
// does not exist, so reaching it would answer differently (exit 2 with its own message, or 1).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/cli_test_util.h"

namespace dynmig::cli {
namespace {

using ::testing::HasSubstr;
using testing::RunDynmig;

const std::string kNoCluster = "/nonexistent/kubeconfig";

TEST(HandoverArgsTest, AVerbIsRequired) {
  auto r = RunDynmig({"handover"});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_THAT(r.err, HasSubstr("subcommand"));
  r = RunDynmig({"handover", "apply"});
  EXPECT_EQ(r.code, kExitBadInput);
}

TEST(HandoverArgsTest, PlanNeedsANode) {
  auto r = RunDynmig({"handover", "plan", "--kubeconfig", kNoCluster});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_EQ(r.err, "dynmig handover plan: --node: name the node to hand over\n");
}

TEST(HandoverArgsTest, BadFlagsAreRefusedBeforeTheClusterIsRead) {
  auto r = RunDynmig(
      {"handover", "plan", "--node", "n", "--nvml-timeout", "soon", "--kubeconfig", kNoCluster});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_THAT(r.err, HasSubstr("--nvml-timeout: \"soon\" is not a positive duration"));
  r = RunDynmig({"handover", "check", "--nvml-timeout", "0s", "--kubeconfig", kNoCluster});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_THAT(r.err, HasSubstr("dynmig handover check: --nvml-timeout"));
  r = RunDynmig({"handover", "check", "--nvml-endpoint", "", "--kubeconfig", kNoCluster});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_THAT(r.err, HasSubstr("--nvml-endpoint: the device plugin's NVML view is the "
                               "handover's evidence; it cannot be empty"));
  r = RunDynmig({"handover", "check", "-o", "xml", "--kubeconfig", kNoCluster});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_THAT(r.err, HasSubstr("xml"));
  r = RunDynmig({"handover", "check", "--bogus"});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_THAT(r.err, HasSubstr("--bogus"));
  r = RunDynmig({"preflight", "--nvml-timeout", "-1s", "--kubeconfig", kNoCluster});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_THAT(r.err, HasSubstr("dynmig preflight: --nvml-timeout"));
}

TEST(HandoverArgsTest, GoodFlagsReachTheCluster) {
  // The flags pass; the missing kubeconfig is what answers.
  auto r = RunDynmig({"handover", "check", "--node", "n", "--kubeconfig", kNoCluster});
  EXPECT_THAT(r.err, HasSubstr("dynmig handover check: "));
  EXPECT_THAT(r.err, HasSubstr(kNoCluster));
}

TEST(HandoverArgsTest, HelpListsTheVerbs) {
  auto r = RunDynmig({"handover", "--help"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_THAT(r.out, HasSubstr("plan"));
  EXPECT_THAT(r.out, HasSubstr("check"));
  r = RunDynmig({"handover", "plan", "--help"});
  EXPECT_THAT(r.out, HasSubstr("--nvml-endpoint"));
  EXPECT_THAT(r.out, HasSubstr("--node"));
}

}  // namespace
}  // namespace dynmig::cli
