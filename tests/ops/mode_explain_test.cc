// dynmig explain's GPU mode switching part (ops/mode_explain.h) on snapshots built by hand.
#include "ops/mode_explain.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kube/object.h"
#include "protocol/annotations.h"
#include "protocol/gpu_mode_switch.h"
#include "protocol/node_register.h"

namespace dynmig::ops {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const absl::Time kMxNow = absl::FromUnixSeconds(1'800'000'000);
const int64_t kMxNowMs = absl::ToUnixMillis(kMxNow);

protocol::GpuModeStatus MxStatus(const std::string& uuid, protocol::GpuMode mode, int64_t since) {
  protocol::GpuModeStatus s;
  s.gpu_uuid = uuid;
  s.mode = mode;
  s.mig_capable = true;
  s.switchable = true;
  s.since_ms = since;
  return s;
}

// node-a publishing H100s GPU-0..n-1 (whole) and their statuses.
kube::Object MxNode(const std::vector<protocol::GpuModeStatus>& statuses,
                    const std::vector<protocol::GpuModeRequest>& requests = {}) {
  std::vector<protocol::DeviceInfo> reg;
  for (uint32_t i = 0; i < statuses.size(); ++i) {
    reg.push_back(protocol::WholeGpuDeviceInfo({statuses[i].gpu_uuid, i, 0, true},
                                               "NVIDIA H100 80GB HBM3", 81559));
  }
  kube::Object n = {{"metadata", {{"name", "node-a"}, {"annotations", kube::Object::object()}}}};
  auto& a = n["metadata"]["annotations"];
  a[std::string(protocol::kNodeRegisterAnnotation)] = protocol::EncodeNodeRegister(reg);
  a[std::string(protocol::kGpuModeStatusAnnotation)] = protocol::EncodeGpuModeStatuses(statuses);
  if (!requests.empty())
    a[std::string(protocol::kGpuModeRequestAnnotation)] = protocol::EncodeGpuModeRequests(requests);
  return n;
}

protocol::MigModeSwitching MxOn() {
  protocol::MigModeSwitching c;
  c.enabled = true;
  return c;
}

TEST(ModeExplainTest, TheDefaultConfigurationSaysNothing) {
  ClusterSnapshot snap;
  snap.nodes.push_back(kube::Object{{"metadata", {{"name", "node-a"}}}});
  auto out = ExplainModeSwitches(snap, {}, mig::ModeKind::kMig, kMxNow);
  EXPECT_EQ(out.text, "");
}

TEST(ModeExplainTest, EachReasonAGpuDoesNotSwitch) {
  auto ok = MxStatus("GPU-0", protocol::GpuMode::kWholeGpu, 0);
  auto recent = MxStatus("GPU-1", protocol::GpuMode::kWholeGpu, kMxNowMs - 60000);
  auto reboot = MxStatus("GPU-2", protocol::GpuMode::kWholeGpu, 0);
  reboot.switchable = false;
  reboot.reason = "needs a reboot (RESET_REQUIRED)";
  auto no_mig = MxStatus("GPU-3", protocol::GpuMode::kWholeGpu, 0);
  no_mig.mig_capable = false;
  auto used = MxStatus("GPU-4", protocol::GpuMode::kWholeGpu, 0);
  auto mig = MxStatus("GPU-5", protocol::GpuMode::kMig, 0);  // already MIG: not listed
  auto moving = MxStatus("GPU-6", protocol::GpuMode::kWholeGpu, 0);
  protocol::GpuModeRequest req{"GPU-6", protocol::GpuMode::kMig, kMxNowMs - 1000, "scheduler",
                               "1 MIG pod waits (default/small)"};
  ClusterSnapshot snap;
  snap.nodes.push_back(MxNode({ok, recent, reboot, no_mig, used, mig, moving}, {req}));
  kube::Object pod = {{"metadata",
                       {{"name", "train"},
                        {"namespace", "default"},
                        {"annotations",
                         {{std::string(protocol::kDevicesAllocatedAnnotation),
                           "GPU-4,NVIDIA H100 80GB HBM3,81559,100:;"}}}}},
                      {"spec", {{"nodeName", "node-a"}}},
                      {"status", {{"phase", "Running"}}}};
  snap.pods.push_back(pod);
  auto out = ExplainModeSwitches(snap, MxOn(), mig::ModeKind::kMig, kMxNow);
  EXPECT_THAT(out.text, HasSubstr("this pod needs MIG GPUs"));
  EXPECT_THAT(out.text, HasSubstr("GPU 0 (GPU-0) in hami-core mode: idle and allowed"));
  EXPECT_THAT(out.text, HasSubstr("GPU 1 (GPU-1) in hami-core mode: hysteresis: it keeps its "
                                  "mode until 2027-01-15T08:09:00Z"));
  EXPECT_THAT(out.text, HasSubstr("GPU 2 (GPU-2) in hami-core mode: needs a reboot"));
  EXPECT_THAT(out.text, HasSubstr("GPU 3 (GPU-3) in hami-core mode: it has no MIG"));
  EXPECT_THAT(out.text, HasSubstr("GPU 4 (GPU-4) in hami-core mode: in use"));
  EXPECT_THAT(out.text, Not(HasSubstr("GPU-5")));
  EXPECT_THAT(out.text, HasSubstr("GPU 6 (GPU-6) in hami-core mode: switching to MIG mode"));
  ASSERT_EQ(out.json["gpus"].size(), 6u);
  EXPECT_EQ(out.json["gpus"][6 - 1]["code"], "switching");
  // Not allowed by the rules (no rule matches the model).
  protocol::MigModeSwitching only_a100 = MxOn();
  only_a100.rules.push_back({{"A100"}, {}});
  auto denied = ExplainModeSwitches(snap, only_a100, mig::ModeKind::kMig, kMxNow);
  EXPECT_THAT(denied.text, HasSubstr("GPU 0 (GPU-0) in hami-core mode: not allowed"));
  // Switching off while GPUs publish modes: said so.
  auto off = ExplainModeSwitches(snap, {}, mig::ModeKind::kMig, kMxNow);
  EXPECT_THAT(off.text, HasSubstr("off: nvidia.migModeSwitching is absent or disabled"));
}

TEST(ModeExplainTest, AnUnreadableStatusIsNamed) {
  ClusterSnapshot snap;
  kube::Object n = MxNode({});
  n["metadata"]["annotations"][std::string(protocol::kGpuModeStatusAnnotation)] =
      std::string(70000, '[');
  snap.nodes.push_back(n);
  auto out = ExplainModeSwitches(snap, MxOn(), mig::ModeKind::kWhole, kMxNow);
  EXPECT_THAT(out.text, HasSubstr("node-a: unreadable dynmig.io/gpu-mode"));
  EXPECT_LT(out.text.size(), 2000u);
}

}  // namespace
}  // namespace dynmig::ops
