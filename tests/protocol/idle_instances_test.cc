#include "protocol/idle_instances.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dynmig::protocol {
namespace {

using ::testing::HasSubstr;

TEST(IdleInstancesTest, RoundTripsSortedWithoutDuplicates) {
  std::vector<IdleInstance> idle = {{"GPU-b", "3g.20gb", {4, 4}, 7},
                                    {"GPU-a", "1g.5gb", {6, 1}, 5},
                                    {"GPU-a", "1g.5gb", {0, 1}, 3},
                                    {"GPU-a", "1g.5gb", {6, 1}, 9}};
  const std::string text = EncodeIdleInstances(idle);
  EXPECT_EQ(
      text,
      R"([{"gpuUUID":"GPU-a","idleSince":3,"placement":{"size":1,"start":0},"profile":"1g.5gb"},)"
      R"({"gpuUUID":"GPU-a","idleSince":5,"placement":{"size":1,"start":6},"profile":"1g.5gb"},)"
      R"({"gpuUUID":"GPU-b","idleSince":7,"placement":{"size":4,"start":4},"profile":"3g.20gb"}])");
  auto back = DecodeIdleInstances(text);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 3u);
  EXPECT_EQ((*back)[2], (IdleInstance{"GPU-b", "3g.20gb", {4, 4}, 7}));
  EXPECT_EQ(EncodeIdleInstances({}), "[]");
  EXPECT_TRUE(DecodeIdleInstances("[]")->empty());
}

TEST(IdleInstancesTest, BadValuesNameTheField) {
  auto error = [](std::string_view value) {
    auto decoded = DecodeIdleInstances(value);
    EXPECT_FALSE(decoded.ok()) << value;
    return std::string(decoded.status().message());
  };
  EXPECT_THAT(error("{"), HasSubstr("dynmig.io/idle-mig-instances"));
  EXPECT_THAT(error("{}"), HasSubstr("JSON array"));
  EXPECT_THAT(error(R"([{"profile":"1g.5gb","placement":{"start":0,"size":1}}])"),
              HasSubstr("dynmig.io/idle-mig-instances[0].gpuUUID: missing"));
  EXPECT_THAT(error(R"([{"gpuUUID":"g","placement":{"start":0,"size":1}}])"),
              HasSubstr("[0].profile: missing"));
  EXPECT_THAT(error(R"([{"gpuUUID":"g","profile":"1g.5gb","placement":{"start":0,"size":0}}])"),
              HasSubstr("[0].placement.size"));
  EXPECT_THAT(error(R"([{"gpuUUID":"g","profile":"1g.5gb","placement":{"start":60,"size":8}}])"),
              HasSubstr("beyond 64 units"));
  EXPECT_THAT(error(R"([{"gpuUUID":"g","profile":"1g.5gb","placement":{"start":0,"size":1},)"
                    R"("idleSince":"yesterday"}])"),
              HasSubstr("[0].idleSince"));
}

}  // namespace
}  // namespace dynmig::protocol
