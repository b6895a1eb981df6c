#include "protocol/defrag.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace dynmig::protocol {
namespace {

using ::testing::HasSubstr;

TEST(DefragPolicyTest, AllowAndNever) {
  EXPECT_EQ(*ParseDefragPolicy("allow"), DefragPolicy::kAllow);
  EXPECT_EQ(*ParseDefragPolicy(" never "), DefragPolicy::kNever);
}

TEST(DefragPolicyTest, AttackUnknownAndHugeValuesAreRefusedWithABoundedMessage) {
  for (std::string v : {"", "Allow", "yes", "true", "never,allow", "allow\n"}) {
    auto p = ParseDefragPolicy(v);
    ASSERT_FALSE(p.ok()) << v;
    EXPECT_THAT(std::string(p.status().message()), HasSubstr("dynmig.io/defrag"));
    EXPECT_THAT(std::string(p.status().message()), HasSubstr("\"allow\" or \"never\""));
  }
  const std::string huge(1 << 20, 'a');
  auto p = ParseDefragPolicy(huge);
  ASSERT_FALSE(p.ok());
  EXPECT_LT(p.status().message().size(), 200u);  // the value is cut, not echoed whole
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("..."));
}

DefragReservation Sample() {
  return {"GPU-b", {0, 8}, "7g.80gb", "team/big", "uid-1", 100, 700, {"team/a", "team/b"}};
}

TEST(DefragReservationTest, RoundTripsSorted) {
  DefragReservation other = Sample();
  other.gpu_uuid = "GPU-a";
  const std::string text = EncodeDefragReservations({Sample(), other});
  EXPECT_TRUE(text.starts_with(R"([{"created":100,"evicted":["team/a","team/b"],"expires":700,)"
                               R"("gpuUUID":"GPU-a")"))
      << text;
  auto back = DecodeDefragReservations(text);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[1], Sample());
  EXPECT_TRUE(DecodeDefragReservations("[]")->empty());
}

std::string ErrorOf(const std::string& text) {
  auto r = DecodeDefragReservations(text);
  return r.ok() ? "ok" : std::string(r.status().message());
}

TEST(DefragReservationTest, AttackBadValuesNameTheField) {
  EXPECT_THAT(ErrorOf("{"), HasSubstr("dynmig.io/defrag-reservation"));
  EXPECT_THAT(ErrorOf("{}"), HasSubstr("JSON array"));
  EXPECT_THAT(ErrorOf("[1]"), HasSubstr("[0]: must be an object"));
  const std::string base =
      R"("gpuUUID":"g","placement":{"start":0,"size":8},"profile":"7g.80gb","created":1,)";
  EXPECT_THAT(ErrorOf("[{" + base + R"("pod":"nons","expires":5}])"), HasSubstr("[0].pod"));
  EXPECT_THAT(ErrorOf("[{" + base + R"("pod":"a/b/c","expires":5}])"), HasSubstr("[0].pod"));
  EXPECT_THAT(ErrorOf("[{" + base + R"("pod":"a/b"}])"), HasSubstr("[0].expires: missing"));
  EXPECT_THAT(ErrorOf("[{" + base + R"("pod":"a/b","expires":1}])"),
              HasSubstr("expires: must be after created"));
  EXPECT_THAT(ErrorOf("[{" + base + R"("pod":"a/b","expires":5,"evicted":"x"}])"),
              HasSubstr("evicted: must be an array"));
  EXPECT_THAT(ErrorOf("[{" + base + R"("pod":"a/b","expires":5,"evicted":[7]}])"),
              HasSubstr("evicted[0]: must be a string"));
  EXPECT_THAT(ErrorOf(R"([{"gpuUUID":"g","placement":{"start":0,"size":8},"pod":"a/b",)"
                      R"("expires":5}])"),
              HasSubstr("[0].profile"));
  EXPECT_THAT(ErrorOf("[{" + base + R"("pod":")" + std::string(400, 'x') + R"(/y","expires":5}])"),
              HasSubstr("at most"));
  // Bounded: too many entries, too many evicted pods.
  std::string many = "[";
  for (size_t i = 0; i <= kMaxDefragReservations; ++i) {
    many += std::string(i ? "," : "") + "{" + base + R"("pod":"a/b","expires":5})";
  }
  EXPECT_THAT(ErrorOf(many + "]"), HasSubstr("entries, at most"));
  std::string evicted = "[";
  for (size_t i = 0; i <= kMaxDefragEvicted; ++i) evicted += std::string(i ? "," : "") + "\"a/b\"";
  EXPECT_THAT(ErrorOf("[{" + base + R"("pod":"a/b","expires":5,"evicted":)" + evicted + "]}]"),
              HasSubstr("pods, at most"));
}

}  // namespace
}  // namespace dynmig::protocol
