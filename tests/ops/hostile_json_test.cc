// The ops tools' JSON readers against over-deep input (issue 27): the visible-devices annotation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "ops/validate.h"

namespace dynmig::ops {
namespace {

using ::testing::HasSubstr;

TEST(HostileOpsJsonTest, AnOverDeepVisibleDevicesValueIsRefusedNamingTheLimit) {
  // 100000 levels: 200 KB, within the annotation size limit, so depth is what refuses it.
  const std::string deep = R"({"a":)" + std::string(100000, '[') + std::string(100000, ']') + "}";
  auto v = ParseVisibleDevices(deep);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(v.status().message()),
            "dynmig.io/visible-devices: nesting deeper than 8 levels");
  auto fine = ParseVisibleDevices(R"({"a":"MIG-1"})");
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_THAT(fine->at("a"), ::testing::ElementsAre("MIG-1"));
}

}  // namespace
}  // namespace dynmig::ops
