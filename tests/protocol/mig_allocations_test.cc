#include "protocol/mig_allocations.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace dynmig::protocol {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The spec's example annotation (docs: "Allocation identity moves from a UUID suffix to a Pod
// annotation").
constexpr char kSpecExample[] = R"([
  {
    "containerIndex": 0,
    "deviceIndex": 0,
    "gpuUUID": "GPU-xxxxxxxx",
    "profile": "2g.10gb",
    "placement": { "start": 2, "size": 2 },
    "migUUID": "MIG-xxxxxxxx",
    "gpuInstanceID": 4,
    "computeInstanceID": 0
  }
])";

absl::Status DecodeError(const std::string& value) {
  auto decoded = DecodeMigAllocations(value);
  EXPECT_FALSE(decoded.ok()) << "decoded: " << value;
  return decoded.status();
}

TEST(MigAllocationsTest, DecodesTheSpecExample) {
  auto decoded = DecodeMigAllocations(kSpecExample);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->size(), 1u);
  const MigAllocation& a = decoded->front();
  EXPECT_EQ(a.container_index, 0);
  EXPECT_EQ(a.device_index, 0);
  EXPECT_EQ(a.gpu_uuid, "GPU-xxxxxxxx");
  EXPECT_EQ(a.profile, "2g.10gb");
  EXPECT_EQ(a.placement, (mig::Placement{2, 2}));
  ASSERT_TRUE(a.runtime.has_value());
  EXPECT_EQ(a.runtime->mig_uuid, "MIG-xxxxxxxx");
  EXPECT_EQ(a.runtime->gpu_instance_id, 4u);
  EXPECT_EQ(a.runtime->compute_instance_id, 0u);
  EXPECT_TRUE(RuntimeReady(a));
}

TEST(MigAllocationsTest, EmptyStringIsAnEmptyList) {
  auto decoded = DecodeMigAllocations("");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(decoded->empty());
  auto empty_array = DecodeMigAllocations("[]");
  ASSERT_TRUE(empty_array.ok()) << empty_array.status();
  EXPECT_TRUE(empty_array->empty());
}

TEST(MigAllocationsTest, ReservationWithoutRuntimeIdentity) {
  auto decoded = DecodeMigAllocations(
      R"([{"containerIndex":1,"deviceIndex":2,"gpuUUID":"GPU-a","profile":"1g.5gb",)"
      R"("placement":{"start":6,"size":1}}])");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->size(), 1u);
  EXPECT_FALSE((*decoded)[0].runtime.has_value());
  EXPECT_FALSE(RuntimeReady((*decoded)[0]));
}

TEST(MigAllocationsTest, EncodesTheGoldenCompactForm) {
  std::vector<MigAllocation> allocations = {
      {0, 0, "GPU-xxxxxxxx", "2g.10gb", {2, 2}, RuntimeIdentity{"MIG-xxxxxxxx", 4, 0}},
      {1, 0, "GPU-yyyy", "1g.5gb", {0, 1}, std::nullopt},
  };
  EXPECT_EQ(EncodeMigAllocations(allocations),
            R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-xxxxxxxx","profile":"2g.10gb",)"
            R"("placement":{"start":2,"size":2},"migUUID":"MIG-xxxxxxxx","gpuInstanceID":4,)"
            R"("computeInstanceID":0},)"
            R"({"containerIndex":1,"deviceIndex":0,"gpuUUID":"GPU-yyyy","profile":"1g.5gb",)"
            R"("placement":{"start":0,"size":1}}])");
  EXPECT_EQ(EncodeMigAllocations({}), "[]");
}

TEST(MigAllocationsTest, RoundTripKeepsZeroIds) {
  std::vector<MigAllocation> allocations = {
      {0, 0, "GPU-a", "7g.40gb", {0, 8}, RuntimeIdentity{"MIG-0", 0, 0}},
      {0, 1, "GPU-b", "1g.10gb+me", {6, 2}, std::nullopt},
      {2, 0, "GPU-a", "3g.20gb", {4, 4}, RuntimeIdentity{"MIG-1", 2, 0}},
  };
  auto decoded = DecodeMigAllocations(EncodeMigAllocations(allocations));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, allocations);
}

TEST(MigAllocationsTest, SpecExampleRoundTripsThroughEncode) {
  auto decoded = DecodeMigAllocations(kSpecExample);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  auto again = DecodeMigAllocations(EncodeMigAllocations(*decoded));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *decoded);
}

TEST(MigAllocationsTest, UnknownFieldsAreIgnored) {
  auto decoded = DecodeMigAllocations(
      R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",)"
      R"("placement":{"start":0,"size":1,"extra":true},"future":{"x":1}}])");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->size(), 1u);
}

TEST(MigAllocationsTest, NullRuntimeFieldsCountAsAbsent) {
  auto decoded = DecodeMigAllocations(
      R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",)"
      R"("placement":{"start":0,"size":1},"migUUID":null,"gpuInstanceID":null}])");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_FALSE((*decoded)[0].runtime.has_value());
}

TEST(MigAllocationsTest, PartialRuntimeIdentityListsPresentAndMissing) {
  absl::Status s =
      DecodeError(R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",)"
                  R"("placement":{"start":0,"size":1},"migUUID":"MIG-a","computeInstanceID":0}])");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(s.message()),
      AllOf(HasSubstr("hami.io/vgpu-mig-allocations[0]"), HasSubstr("partial runtime identity"),
            HasSubstr("has migUUID, computeInstanceID"), HasSubstr("missing gpuInstanceID")));
}

TEST(MigAllocationsTest, OnlyAnIdIsPartialToo) {
  absl::Status s =
      DecodeError(R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",)"
                  R"("placement":{"start":0,"size":1},"gpuInstanceID":0}])");
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("partial runtime identity"), HasSubstr("has gpuInstanceID"),
                    HasSubstr("missing migUUID, computeInstanceID")));
  // An empty migUUID with both IDs is partial: the UUID is what the container sees.
  absl::Status empty_uuid = DecodeError(
      R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",)"
      R"("placement":{"start":0,"size":1},"migUUID":"","gpuInstanceID":1,"computeInstanceID":0}])");
  EXPECT_THAT(std::string(empty_uuid.message()), HasSubstr("missing migUUID"));
}

TEST(MigAllocationsTest, DuplicateContainerDeviceIsAnError) {
  absl::Status s =
      DecodeError(R"([{"containerIndex":0,"deviceIndex":1,"gpuUUID":"GPU-a","profile":"1g.5gb",)"
                  R"("placement":{"start":0,"size":1}},)"
                  R"({"containerIndex":0,"deviceIndex":1,"gpuUUID":"GPU-b","profile":"1g.5gb",)"
                  R"("placement":{"start":1,"size":1}}])");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("[1]"), HasSubstr("duplicate"), HasSubstr("containerIndex 0"),
                    HasSubstr("deviceIndex 1")));
}

struct BadCase {
  const char* name;
  const char* value;
  const char* want;  // substring of the error
};

class MigAllocationsBadInputTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(MigAllocationsBadInputTest, IsRejectedWithAFieldPath) {
  absl::Status s = DecodeError(GetParam().value);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr(GetParam().want));
}

#define ENTRY(fields) "[{" fields "}]"
#define GOOD_PLACEMENT "\"placement\":{\"start\":0,\"size\":1}"

INSTANTIATE_TEST_SUITE_P(
    Cases, MigAllocationsBadInputTest,
    ::testing::Values(
        BadCase{"NotJson", "[{", "invalid JSON"},
        BadCase{"NotArray", R"({"containerIndex":0})", "must be a JSON array"},
        BadCase{"EntryNotObject", "[1]", "[0]: must be an object"},
        BadCase{"MissingContainer",
                ENTRY("\"deviceIndex\":0,\"gpuUUID\":\"G\",\"profile\":\"1g.5gb\"," GOOD_PLACEMENT),
                "[0].containerIndex: is required"},
        BadCase{"NegativeContainer",
                ENTRY("\"containerIndex\":-1,\"deviceIndex\":0,\"gpuUUID\":\"G\",\"profile\":"
                      "\"1g.5gb\"," GOOD_PLACEMENT),
                "[0].containerIndex: -1 is out of range"},
        BadCase{"NegativeDevice",
                ENTRY("\"containerIndex\":0,\"deviceIndex\":-2,\"gpuUUID\":\"G\",\"profile\":"
                      "\"1g.5gb\"," GOOD_PLACEMENT),
                "[0].deviceIndex: -2 is out of range"},
        BadCase{"StringIndex",
                ENTRY("\"containerIndex\":\"0\",\"deviceIndex\":0,\"gpuUUID\":\"G\",\"profile\":"
                      "\"1g.5gb\"," GOOD_PLACEMENT),
                "[0].containerIndex: must be an integer, got string"},
        BadCase{"FloatIndex",
                ENTRY("\"containerIndex\":0.5,\"deviceIndex\":0,\"gpuUUID\":\"G\",\"profile\":"
                      "\"1g.5gb\"," GOOD_PLACEMENT),
                "[0].containerIndex: must be an integer, got number"},
        BadCase{"EmptyGpu",
                ENTRY("\"containerIndex\":0,\"deviceIndex\":0,\"gpuUUID\":\"\",\"profile\":"
                      "\"1g.5gb\"," GOOD_PLACEMENT),
                "[0].gpuUUID: is required"},
        BadCase{"GpuNotString",
                ENTRY("\"containerIndex\":0,\"deviceIndex\":0,\"gpuUUID\":7,\"profile\":"
                      "\"1g.5gb\"," GOOD_PLACEMENT),
                "[0].gpuUUID: must be a string, got number"},
        BadCase{"MissingProfile",
                ENTRY("\"containerIndex\":0,\"deviceIndex\":0,\"gpuUUID\":\"G\"," GOOD_PLACEMENT),
                "[0].profile: is required"},
        BadCase{"InvalidProfile",
                ENTRY("\"containerIndex\":0,\"deviceIndex\":0,\"gpuUUID\":\"G\",\"profile\":"
                      "\"5gb\"," GOOD_PLACEMENT),
                "[0].profile: invalid MIG profile name \"5gb\""},
        BadCase{"MissingPlacement",
                ENTRY("\"containerIndex\":0,\"deviceIndex\":0,\"gpuUUID\":\"G\",\"profile\":"
                      "\"1g.5gb\""),
                "[0].placement: is required"},
        BadCase{"PlacementNotObject",
                ENTRY("\"containerIndex\":0,\"deviceIndex\":0,\"gpuUUID\":\"G\",\"profile\":"
                      "\"1g.5gb\",\"placement\":[0,1]"),
                "[0].placement: must be an object, got array"},
        BadCase{"ZeroSize",
                ENTRY("\"containerIndex\":0,\"deviceIndex\":0,\"gpuUUID\":\"G\",\"profile\":"
                      "\"1g.5gb\",\"placement\":{\"start\":3,\"size\":0}"),
                "[0].placement.size: must be greater than 0"},
        BadCase{"BeyondAxis",
                ENTRY("\"containerIndex\":0,\"deviceIndex\":0,\"gpuUUID\":\"G\",\"profile\":"
                      "\"1g.5gb\",\"placement\":{\"start\":30,\"size\":4}"),
                "ends beyond the 32-unit placement axis"},
        BadCase{"NegativeGi",
                ENTRY("\"containerIndex\":0,\"deviceIndex\":0,\"gpuUUID\":\"G\",\"profile\":"
                      "\"1g.5gb\"," GOOD_PLACEMENT
                      ",\"migUUID\":\"MIG-a\",\"gpuInstanceID\":-1,\"computeInstanceID\":0"),
                "[0].gpuInstanceID: -1 is out of range"},
        BadCase{"MigUuidNotString",
                ENTRY("\"containerIndex\":0,\"deviceIndex\":0,\"gpuUUID\":\"G\",\"profile\":"
                      "\"1g.5gb\"," GOOD_PLACEMENT
                      ",\"migUUID\":5,\"gpuInstanceID\":1,\"computeInstanceID\":0"),
                "[0].migUUID: must be a string"}),
    [](const ::testing::TestParamInfo<BadCase>& param_info) {
      return std::string(param_info.param.name);
    });

TEST(MigAllocationsTest, ErrorNamesTheFailingEntryIndex) {
  absl::Status s =
      DecodeError(R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",)"
                  R"("placement":{"start":0,"size":1}},)"
                  R"({"containerIndex":0,"deviceIndex":1,"gpuUUID":"GPU-a","profile":"1g.5gb",)"
                  R"("placement":{"start":1,"size":"1"}}])");
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("hami.io/vgpu-mig-allocations[1].placement.size: must be an integer"));
}

}  // namespace
}  // namespace dynmig::protocol
