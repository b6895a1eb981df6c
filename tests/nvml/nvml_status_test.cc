#include <gtest/gtest.h>

#include "common/status_macros.h"
#include "nvml/mig_minors.h"
#include "nvml/nvml.h"
#include "nvml_test_util.h"

namespace dynmig::nvml {
namespace {

TEST(NvmlStatusTest, MapsEveryCodeTheInterfaceNames) {
  const std::pair<NvmlReturn, absl::StatusCode> table[] = {
      {NvmlReturn::kInsufficientResources, absl::StatusCode::kResourceExhausted},
      {NvmlReturn::kInUse, absl::StatusCode::kFailedPrecondition},
      {NvmlReturn::kNotFound, absl::StatusCode::kNotFound},
      {NvmlReturn::kNotSupported, absl::StatusCode::kUnimplemented},
      {NvmlReturn::kNoPermission, absl::StatusCode::kPermissionDenied},
      {NvmlReturn::kGpuIsLost, absl::StatusCode::kUnavailable},
      {NvmlReturn::kInvalidArgument, absl::StatusCode::kInvalidArgument},
      {NvmlReturn::kUninitialized, absl::StatusCode::kFailedPrecondition},
      {NvmlReturn::kDriverNotLoaded, absl::StatusCode::kFailedPrecondition},
      {NvmlReturn::kLibraryNotFound, absl::StatusCode::kFailedPrecondition},
      {NvmlReturn::kTimeout, absl::StatusCode::kUnknown},
      {NvmlReturn::kResetRequired, absl::StatusCode::kUnknown},
      {NvmlReturn::kUnknown, absl::StatusCode::kUnknown},
      {static_cast<NvmlReturn>(12345), absl::StatusCode::kUnknown},
  };
  for (const auto& [code, want] : table) {
    const absl::Status s = NvmlStatus(code, "destroy GPU instance 3 on GPU 0");
    EXPECT_EQ(s.code(), want) << NvmlReturnName(code);
    EXPECT_EQ(NvmlReturnOf(s), code) << s;
    EXPECT_NE(std::string(s.message()).find("destroy GPU instance 3 on GPU 0: "),
              std::string::npos);
    EXPECT_NE(std::string(s.message()).find(NvmlReturnName(code)), std::string::npos) << s;
  }
  EXPECT_TRUE(NvmlStatus(NvmlReturn::kSuccess, "anything").ok());
}

TEST(NvmlStatusTest, MessageNamesTheCodeAndTheOperation) {
  const absl::Status s = NvmlStatus(NvmlReturn::kInUse, "destroy GPU instance 3 on GPU 0");
  EXPECT_EQ(s.message(),
            "destroy GPU instance 3 on GPU 0: NVML_ERROR_IN_USE (in use by another client)");
}

TEST(NvmlStatusTest, CodeSurvivesAnnotate) {
  const absl::Status s =
      Annotate(NvmlStatus(NvmlReturn::kInsufficientResources, "create GI"), "allocate pod p");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(NvmlReturnOf(s), NvmlReturn::kInsufficientResources);
  EXPECT_EQ(NvmlReturnOf(absl::NotFoundError("no such pod")), std::nullopt);
  EXPECT_EQ(NvmlReturnOf(absl::OkStatus()), std::nullopt);
}

TEST(NvmlStatusTest, ParsesCodeNames) {
  EXPECT_EQ(*ParseNvmlReturn("IN_USE"), NvmlReturn::kInUse);
  EXPECT_EQ(*ParseNvmlReturn("NVML_ERROR_INSUFFICIENT_RESOURCES"),
            NvmlReturn::kInsufficientResources);
  EXPECT_EQ(*ParseNvmlReturn("gpu_is_lost"), NvmlReturn::kGpuIsLost);
  EXPECT_EQ(*ParseNvmlReturn("19"), NvmlReturn::kInUse);
  auto bad = ParseNvmlReturn("BUSY");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("IN_USE"), std::string::npos);
  EXPECT_EQ(NvmlReturnName(NvmlReturn::kSuccess), "NVML_SUCCESS");
  EXPECT_EQ(NvmlReturnName(static_cast<NvmlReturn>(77)), "NVML_ERROR_77");
}

TEST(ProfileNameTest, ComputedLikeGoNvlib) {
  constexpr uint64_t kMiB = 1 << 20;
  // A100-SXM4-40GB, memory + index -> name.
  const uint64_t a100 = 40960 * kMiB;
  EXPECT_EQ(GpuInstanceProfileName(0, 1, 4864, a100), "1g.5gb");
  EXPECT_EQ(GpuInstanceProfileName(7, 1, 4864, a100), "1g.5gb+me");
  EXPECT_EQ(GpuInstanceProfileName(9, 1, 9856, a100), "1g.10gb");
  EXPECT_EQ(GpuInstanceProfileName(1, 2, 9856, a100), "2g.10gb");
  EXPECT_EQ(GpuInstanceProfileName(2, 3, 19968, a100), "3g.20gb");
  EXPECT_EQ(GpuInstanceProfileName(3, 4, 19968, a100), "4g.20gb");
  EXPECT_EQ(GpuInstanceProfileName(4, 7, 40192, a100), "7g.40gb");
  // Halves round away from zero, as Go's math.Round: H200 0.5 * 141 = 70.5 -> 71.
  EXPECT_EQ(GpuInstanceProfileName(2, 3, 71168, 143771 * kMiB), "3g.71gb");
  EXPECT_EQ(GpuInstanceProfileName(0, 1, 16384, 143771 * kMiB), "1g.18gb");
  EXPECT_EQ(GpuInstanceProfileName(0, 1, 22528, 183359 * kMiB), "1g.23gb");
  // RTX PRO 6000: still rounded to eighths; every suffix.
  const uint64_t rtx = 97887 * kMiB;
  EXPECT_EQ(GpuInstanceProfileName(0, 1, 24192, rtx), "1g.24gb");
  EXPECT_EQ(GpuInstanceProfileName(0xA, 1, 24192, rtx), "1g.24gb+gfx");
  EXPECT_EQ(GpuInstanceProfileName(0xF, 1, 24192, rtx), "1g.24gb+me.all");
  EXPECT_EQ(GpuInstanceProfileName(0xE, 2, 48512, rtx), "2g.48gb-me");
  // A30 REV1 on a 2-slice profile.
  EXPECT_EQ(GpuInstanceProfileName(8, 2, 11968, 24576 * kMiB), "2g.12gb+me");
}

TEST(MigMinorsTest, FormulaMatchesTheDriverTable) {
  EXPECT_EQ(GpuInstanceAccessMinorFormula(0, 1), 12u);
  EXPECT_EQ(ComputeInstanceAccessMinorFormula(0, 1, 0), 13u);
  EXPECT_EQ(ComputeInstanceAccessMinorFormula(0, 1, 1), 14u);
  EXPECT_EQ(ComputeInstanceAccessMinorFormula(0, 1, 2), 15u);
  EXPECT_EQ(GpuInstanceAccessMinorFormula(0, 0), 3u);
  EXPECT_EQ(ComputeInstanceAccessMinorFormula(0, 0, 0), 4u);
  EXPECT_EQ(ComputeInstanceAccessMinorFormula(31, 14, 7), 4322u);
}

TEST(MigMinorsTest, GeneratedTextParsesBackToTheFormula) {
  const std::string text = MigMinors::Generate();
  EXPECT_TRUE(text.starts_with("config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n"));
  EXPECT_TRUE(text.ends_with("gpu31/gi14/ci7/access 4322\n"));
  ASSERT_OK_AND_ASSIGN(const MigMinors minors, MigMinors::Parse(text));
  EXPECT_EQ(minors.size(), 2u + 32 * 15 * 9);
  for (uint32_t gpu : {0u, 3u, 31u}) {
    for (uint32_t gi = 0; gi <= kMaxGpuInstanceId; ++gi) {
      EXPECT_EQ(*minors.GpuInstanceAccess(gpu, gi), GpuInstanceAccessMinorFormula(gpu, gi));
      for (uint32_t ci = 0; ci <= kMaxComputeInstanceId; ++ci) {
        EXPECT_EQ(*minors.ComputeInstanceAccess(gpu, gi, ci),
                  ComputeInstanceAccessMinorFormula(gpu, gi, ci));
      }
    }
  }
}

TEST(MigMinorsTest, DeviceNodesForAMigDevice) {
  ASSERT_OK_AND_ASSIGN(const MigMinors minors, MigMinors::Parse(MigMinors::Generate(2)));
  ASSERT_OK_AND_ASSIGN(const MigDeviceNodes nodes, minors.DeviceNodes(0, 1, 0));
  EXPECT_EQ(nodes.gpu, "/dev/nvidia0");
  EXPECT_EQ(nodes.gpu_instance_cap, "/dev/nvidia-caps/nvidia-cap12");
  EXPECT_EQ(nodes.compute_instance_cap, "/dev/nvidia-caps/nvidia-cap13");
  EXPECT_EQ(nodes.All(),
            (std::vector<std::string>{"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12",
                                      "/dev/nvidia-caps/nvidia-cap13", "/dev/nvidiactl",
                                      "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}));
  ASSERT_OK_AND_ASSIGN(const MigDeviceNodes gpu1, minors.DeviceNodes(1, 13, 0));
  EXPECT_EQ(gpu1.gpu, "/dev/nvidia1");
  EXPECT_EQ(gpu1.gpu_instance_cap, "/dev/nvidia-caps/nvidia-cap255");  // 3+135+117
  auto missing = minors.DeviceNodes(5, 1, 0);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(missing.status().message()).find("gpu5/gi1/access"), std::string::npos);
}

TEST(MigMinorsTest, ParsesRealFileQuirksAndRejectsGarbage) {
  ASSERT_OK_AND_ASSIGN(const MigMinors m,
                       MigMinors::Parse("config 1\n\n  monitor 2  \ngpu0/gi1/access\t12\n"));
  EXPECT_EQ(*m.Lookup("monitor"), 2u);
  EXPECT_EQ(*m.GpuInstanceAccess(0, 1), 12u);
  auto bad = MigMinors::Parse("config 1\ngpu0/gi1/access twelve\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("line 2"), std::string::npos);
  auto none = MigMinors::Parse("lonely\n");
  EXPECT_FALSE(none.ok());
}

TEST(MigMinorsTest, LoadNamesAMissingFile) {
  auto missing = MigMinors::Load("/nonexistent/dynmig/mig-minors");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(missing.status().message()).find("/nonexistent/dynmig/mig-minors"),
            std::string::npos);
}

}  // namespace
}  // namespace dynmig::nvml
