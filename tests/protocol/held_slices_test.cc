#include "protocol/held_slices.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dynmig::protocol {
namespace {

using ::testing::HasSubstr;

TEST(HeldSlicesTest, RoundTripsSortedWithoutDuplicates) {
  std::vector<HeldSlices> held = {{"GPU-b", {4, 4}, "", "untracked"},
                                  {"GPU-a", {2, 2}, "2g.10gb", "pod ended"},
                                  {"GPU-a", {0, 1}, "", "x"},
                                  {"GPU-a", {2, 2}, "2g.10gb", "again"}};
  const std::string text = EncodeHeldSlices(held);
  EXPECT_EQ(
      text,
      R"([{"gpuUUID":"GPU-a","placement":{"size":1,"start":0},"reason":"x"},)"
      R"({"gpuUUID":"GPU-a","placement":{"size":2,"start":2},"profile":"2g.10gb","reason":"pod ended"},)"
      R"({"gpuUUID":"GPU-b","placement":{"size":4,"start":4},"reason":"untracked"}])");
  auto back = DecodeHeldSlices(text);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 3u);
  EXPECT_EQ((*back)[1], (HeldSlices{"GPU-a", {2, 2}, "2g.10gb", "pod ended"}));
  EXPECT_EQ(EncodeHeldSlices({}), "[]");
  EXPECT_TRUE(DecodeHeldSlices("[]")->empty());
}

TEST(HeldSlicesTest, BadValuesNameTheField) {
  EXPECT_THAT(std::string(DecodeHeldSlices("{").status().message()),
              HasSubstr("dynmig.io/mig-held"));
  EXPECT_THAT(std::string(DecodeHeldSlices("{}").status().message()), HasSubstr("JSON array"));
  EXPECT_THAT(
      std::string(DecodeHeldSlices(R"([{"placement":{"start":0,"size":1}}])").status().message()),
      HasSubstr("[0].gpuUUID"));
  EXPECT_THAT(std::string(DecodeHeldSlices(R"([{"gpuUUID":"g","placement":{"start":0,"size":0}}])")
                              .status()
                              .message()),
              HasSubstr("[0].placement.size"));
  EXPECT_THAT(std::string(DecodeHeldSlices(R"([{"gpuUUID":"g","placement":{"start":60,"size":8}}])")
                              .status()
                              .message()),
              HasSubstr("beyond 64"));
  EXPECT_THAT(std::string(DecodeHeldSlices(R"([{"gpuUUID":"g"}])").status().message()),
              HasSubstr("[0].placement"));
}

}  // namespace
}  // namespace dynmig::protocol
