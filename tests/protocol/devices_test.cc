#include "protocol/devices.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dynmig::protocol {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

TEST(DevicesTest, DecodesHamisExample) {
  auto decoded = DecodePodDevices("GPU-0fc3,NVIDIA,3000,0:;GPU-0fc3,NVIDIA,5000,0:;");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_THAT(*decoded, SizeIs(2));
  ASSERT_THAT((*decoded)[0], SizeIs(1));
  EXPECT_EQ((*decoded)[0][0], (ContainerDevice{"GPU-0fc3", "NVIDIA", 3000, 0}));
  EXPECT_EQ((*decoded)[1][0], (ContainerDevice{"GPU-0fc3", "NVIDIA", 5000, 0}));
}

TEST(DevicesTest, EmptyContainersKeepTheirIndex) {
  auto decoded = DecodePodDevices(
      ";GPU-a,NVIDIA A100-SXM4-40GB,4864,15:GPU-a,NVIDIA A100-SXM4-40GB,9856,29:;;");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_THAT(*decoded, SizeIs(3));
  EXPECT_THAT((*decoded)[0], IsEmpty());
  ASSERT_THAT((*decoded)[1], SizeIs(2));
  EXPECT_EQ((*decoded)[1][1].used_mem_mib, 9856);
  EXPECT_EQ((*decoded)[1][1].used_cores, 29);
  EXPECT_THAT((*decoded)[2], IsEmpty());
}

TEST(DevicesTest, EmptyStringIsNoContainer) {
  auto decoded = DecodePodDevices("");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_THAT(*decoded, IsEmpty());
}

TEST(DevicesTest, RoundTrip) {
  const PodDevices cases[] = {
      {},
      {{}},
      {{{"GPU-a", "NVIDIA A30", 5952, 25}}},
      {{},
       {{"GPU-a", "NVIDIA A100-SXM4-40GB", 4864, 15}, {"GPU-b", "NVIDIA A100-SXM4-40GB", 0, 0}},
       {}},
  };
  for (const auto& pd : cases) {
    auto encoded = EncodePodDevices(pd);
    ASSERT_TRUE(encoded.ok()) << encoded.status();
    auto decoded = DecodePodDevices(*encoded);
    ASSERT_TRUE(decoded.ok()) << *encoded << ": " << decoded.status();
    EXPECT_EQ(*decoded, pd) << *encoded;
  }
}

TEST(DevicesTest, GoldenEncoding) {
  PodDevices pd = {{{"GPU-a", "NVIDIA", 3000, 0}}, {}, {{"GPU-b", "NVIDIA", 5000, 30}}};
  auto encoded = EncodePodDevices(pd);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  EXPECT_EQ(*encoded, "GPU-a,NVIDIA,3000,0:;;GPU-b,NVIDIA,5000,30:;");
}

TEST(DevicesTest, DecodeErrorsNameContainerAndDevice) {
  auto fields = DecodePodDevices("GPU-a,NVIDIA,1,0:;GPU-a,NVIDIA,1,0:GPU-b,NVIDIA,1:;");
  ASSERT_FALSE(fields.ok());
  EXPECT_EQ(fields.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(fields.status().message()),
              HasSubstr("container 1 device 1: \"GPU-b,NVIDIA,1\" has 3 comma-separated field(s)"));

  auto mem = DecodePodDevices("GPU-a,NVIDIA,abc,0:;");
  ASSERT_FALSE(mem.ok());
  EXPECT_THAT(std::string(mem.status().message()),
              HasSubstr("container 0 device 0: Usedmem \"abc\" is not a non-negative integer"));

  auto cores = DecodePodDevices("GPU-a,NVIDIA,1,-5:;");
  ASSERT_FALSE(cores.ok());
  EXPECT_THAT(std::string(cores.status().message()), HasSubstr("Usedcores \"-5\""));

  auto uuid = DecodePodDevices(",NVIDIA,1,0:;");
  ASSERT_FALSE(uuid.ok());
  EXPECT_THAT(std::string(uuid.status().message()), HasSubstr("UUID is empty"));

  auto overflow = DecodePodDevices("GPU-a,NVIDIA,99999999999,0:;");
  ASSERT_FALSE(overflow.ok());
  EXPECT_THAT(std::string(overflow.status().message()), HasSubstr("Usedmem"));
}

TEST(DevicesTest, EncodeRefusesSeparatorsInFields) {
  auto comma = EncodePodDevices({{}, {{"GPU-a", "NVIDIA, Inc", 1, 0}}});
  ASSERT_FALSE(comma.ok());
  EXPECT_EQ(comma.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(comma.status().message()), HasSubstr("container 1 device 0: type"));
  auto empty = EncodePodDevices({{{"", "NVIDIA", 1, 0}}});
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("UUID is empty"));
  auto negative = EncodePodDevices({{{"GPU-a", "NVIDIA", -1, 0}}});
  ASSERT_FALSE(negative.ok());
  EXPECT_THAT(std::string(negative.status().message()), HasSubstr("must not be negative"));
}

TEST(DevicesTest, LegacyMigIdentity) {
  EXPECT_TRUE(IsLegacyMigIdentity("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448[1-2]"));
  auto parsed = ParseLegacyMigIdentity("GPU-0fc3eda5[12-0]");
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->gpu_uuid, "GPU-0fc3eda5");
  EXPECT_EQ(parsed->template_index, 12u);
  EXPECT_EQ(parsed->slot_index, 0u);

  EXPECT_FALSE(IsLegacyMigIdentity("GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"));
  EXPECT_FALSE(IsLegacyMigIdentity("MIG-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"));
  EXPECT_FALSE(IsLegacyMigIdentity("GPU-a[1]"));
  EXPECT_FALSE(IsLegacyMigIdentity("GPU-a[x-2]"));
  EXPECT_FALSE(IsLegacyMigIdentity("GPU-a[1-]"));
  EXPECT_FALSE(IsLegacyMigIdentity("GPU-a[-1-2]"));
  EXPECT_FALSE(IsLegacyMigIdentity("[1-2]"));
  EXPECT_FALSE(IsLegacyMigIdentity(""));
}

TEST(DevicesTest, LegacyIdentityInsideADevicesAnnotationIsDetectable) {
  auto decoded = DecodePodDevices("GPU-a[1-2],NVIDIA A100-SXM4-40GB,10240,28:;");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(IsLegacyMigIdentity((*decoded)[0][0].uuid));
}

// A value its decoder refuses still names its GPUs, read from the text alone; a "GPU-" inside
// another token is not one.
TEST(DevicesTest, GpuUuidsNamedInReadsUnreadableValuesLeniently) {
  EXPECT_EQ(GpuUuidsNamedIn("GPU-a1,NVIDIA A100,4864,bad-field:;GPU-b2,x;GPU-a1,y"),
            (std::vector<std::string>{"GPU-a1", "GPU-b2"}));
  EXPECT_EQ(GpuUuidsNamedIn(R"([{"gpuUUID":"GPU-1f-2e","profile":7}, garbage)"),
            (std::vector<std::string>{"GPU-1f-2e"}));
  EXPECT_TRUE(GpuUuidsNamedIn("MYGPU-x notGPU-y").empty());
  EXPECT_TRUE(GpuUuidsNamedIn("").empty());
  // Bounded: a long run of "GPU-GPU-..." is read once, as one token.
  std::string run;
  for (int i = 0; i < 10000; ++i) run += "GPU-";
  EXPECT_EQ(GpuUuidsNamedIn(run).size(), 1u);
}

TEST(DevicesTest, MigResourceNamesOfNvidiasMixedStrategy) {
  EXPECT_EQ(MigResourceName("1g.10gb"), "nvidia.com/mig-1g.10gb");
  EXPECT_EQ(MigResourceName("1g.18gb+me"), std::nullopt);  // '+' is not legal in a resource name
  EXPECT_EQ(MigResourceName(""), std::nullopt);
  EXPECT_EQ(MigResourceName("1g./"), std::nullopt);
  EXPECT_EQ(MigResourceName("1g.5gb."), std::nullopt);             // must end alphanumeric
  EXPECT_TRUE(MigResourceName(std::string(59, 'a')).has_value());  // 63 characters after the '/'
  EXPECT_EQ(MigResourceName(std::string(60, 'a')), std::nullopt);  // 64
  EXPECT_EQ(MigResourceProfile("nvidia.com/mig-2g.35gb"), "2g.35gb");
  EXPECT_EQ(MigResourceProfile("nvidia.com/mig-"), std::nullopt);
  EXPECT_EQ(MigResourceProfile("nvidia.com/gpu"), std::nullopt);
  EXPECT_EQ(MigResourceProfile("example.com/mig-1g.5gb"), std::nullopt);
  EXPECT_EQ(MigResourceProfile(*MigResourceName("3g.71gb")), "3g.71gb");
}

}  // namespace
}  // namespace dynmig::protocol
