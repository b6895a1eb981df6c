#include "mig/nvml_latency.h"

#include <gtest/gtest.h>

namespace dynmig::mig {
namespace {

TEST(NvmlLatencyTest, ParsesOperationsModelsAndPresets) {
  auto l = ParseNvmlLatency("create-gi=250ms, create-ci=1.5s,A30:create-gi=80ms");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->Of(NvmlOp::kCreateGpuInstance, "NVIDIA A100-SXM4-40GB"), absl::Milliseconds(250));
  EXPECT_EQ(l->Of(NvmlOp::kCreateGpuInstance, "NVIDIA A30"), absl::Milliseconds(80));
  EXPECT_EQ(l->Of(NvmlOp::kCreateComputeInstance, "NVIDIA A30"), absl::Milliseconds(1500));
  EXPECT_EQ(l->Of(NvmlOp::kDestroyGpuInstance, "NVIDIA A30"), absl::ZeroDuration());
  EXPECT_EQ(l->Create("NVIDIA A30"), absl::Milliseconds(1580));
  EXPECT_FALSE(l->IsZero());
  // The text form reads back the same.
  auto again = ParseNvmlLatency(l->ToString());
  ASSERT_TRUE(again.ok()) << l->ToString() << ": " << again.status();
  EXPECT_EQ(again->ToString(), l->ToString());

  auto none = ParseNvmlLatency("none");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->IsZero());
  EXPECT_EQ(none->ToString(), "none");

  // The preset: about 1.5 s per allocation (HAMi's measurement), later items override.
  auto real = ParseNvmlLatency("realistic,destroy-gi=0");
  ASSERT_TRUE(real.ok());
  EXPECT_EQ(real->Create("NVIDIA H100 80GB HBM3"), absl::Milliseconds(1500));
  EXPECT_EQ(real->Of(NvmlOp::kDestroyGpuInstance, "x"), absl::ZeroDuration());
  EXPECT_EQ(RealisticNvmlLatency().Create("any"), absl::Milliseconds(1500));
}

TEST(NvmlLatencyTest, BadItemsAreNamed) {
  for (const char* bad : {"", "create-gi", "make-gi=1s", "create-gi=fast", "create-gi=-1s",
                          "NoSuchGpu:create-gi=1s"}) {
    auto l = ParseNvmlLatency(bad);
    ASSERT_FALSE(l.ok()) << bad;
    EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  auto l = ParseNvmlLatency("make-gi=1s");
  EXPECT_NE(std::string(l.status().message()).find("create-gi, destroy-gi, create-ci, destroy-ci"),
            std::string::npos)
      << l.status();
  auto m = ParseNvmlLatency("create-ci=soon");
  EXPECT_NE(std::string(m.status().message()).find("\"soon\""), std::string::npos) << m.status();
}

}  // namespace
}  // namespace dynmig::mig
