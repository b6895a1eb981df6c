// The node agents' NVML (OpenNodeNvml, cli.h): `dynmig device-plugin` and `dynmig
// nvidia-plugin-standin` pick it the same way, and refuse a bad simulator or latency flag with exit
// 2 and a message naming it, before anything serves.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "cli/cli.h"
#include "cli/cli_test_util.h"

namespace dynmig::cli {
namespace {

using ::testing::HasSubstr;
using testing::RunDynmig;

std::string DeviceConfig() {
  const std::string path = ::testing::TempDir() + "/node-nvml-device-config.yaml";
  std::ofstream(path) << "nvidia:\n  migProfileAllowlist:\n    - models: [\"H200\"]\n"
                         "      profiles: [\"1g.18gb\"]\n";
  return path;
}

TEST(NodeNvmlTest, BothNodeAgentsRefuseABadSimulatorSpec) {
  auto r = RunDynmig({"nvidia-plugin-standin", "--sim", "V100x1", "--kubelet-dir", "/nonexistent"});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_THAT(r.err, HasSubstr("dynmig nvidia-plugin-standin: simulator spec \"V100x1\""));
  r = RunDynmig({"device-plugin", "--node", "n", "--device-config", DeviceConfig(), "--state-file",
                 "/nonexistent/state.json", "--sim", "V100x1"});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_THAT(r.err, HasSubstr("dynmig device-plugin: simulator spec \"V100x1\""));
  r = RunDynmig({"device-plugin", "--node", "n", "--device-config", DeviceConfig(), "--state-file",
                 "/nonexistent/state.json", "--sim", "H200x1", "--sim-latency", "slow"});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_THAT(r.err, HasSubstr("--sim-latency"));
}

TEST(NodeNvmlTest, TheSimulatorIsSeededWithTheNodeName) {
  auto a = OpenNodeNvml({"node-a", "H200x1", "", {}}, RealClock());
  auto a2 = OpenNodeNvml({"node-a", "H200x1", "", {}}, RealClock());
  auto b = OpenNodeNvml({"node-b", "H200x1", "", {}}, RealClock());
  ASSERT_TRUE(a.ok() && a2.ok() && b.ok());
  auto ua = (*a)->GetGpu(0), ua2 = (*a2)->GetGpu(0), ub = (*b)->GetGpu(0);
  ASSERT_TRUE(ua.ok() && ua2.ok() && ub.ok());
  EXPECT_EQ(ua->uuid, ua2->uuid);  // one node's processes see the same GPUs
  EXPECT_NE(ua->uuid, ub->uuid);   // nodes differ
  auto bad = OpenNodeNvml({"n", "H200x99999", "", {}}, RealClock());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dynmig::cli
