// common/bounded_json.h (the one parser of untrusted JSON) and the protocol readers built on it.
#include "common/bounded_json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "protocol/mig_allocations.h"
#include "protocol/node_register.h"

namespace dynmig {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

std::string NestedArrays(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(BoundedJsonTest, DepthAtTheLimitPassesOneMoreFailsNamingTheLimit) {
  const JsonLimits limits{kMiB, 64};
  auto at = ParseBoundedJson(NestedArrays(64), limits, "body");
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_TRUE(at->is_array());
  auto over = ParseBoundedJson(NestedArrays(65), limits, "body");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(over.status().message()), "body: nesting deeper than 64 levels");
}

TEST(BoundedJsonTest, ObjectsAndArraysCountAlike) {
  const std::string text = R"({"a":{"b":[1,{"c":2}]},"d":[]})";  // 4 deep at "c"
  EXPECT_TRUE(ParseBoundedJson(text, {kKiB, 4}, "x").ok());
  auto over = ParseBoundedJson(text, {kKiB, 3}, "x");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(std::string(over.status().message()), "x: nesting deeper than 3 levels");
  // Closed containers do not add up: a long flat list of shallow items is shallow.
  std::string flat = "[";
  for (int i = 0; i < 1000; ++i) flat += i == 0 ? "[[]]" : ",[[]]";
  flat += "]";
  EXPECT_TRUE(ParseBoundedJson(flat, {kMiB, 3}, "x").ok());
}

TEST(BoundedJsonTest, BracketsInsideStringsDoNotCount) {
  const JsonLimits limits{kKiB, 1};
  auto in_string = ParseBoundedJson(R"(["[[[[{{{{ ]]] }"])", limits, "x");
  ASSERT_TRUE(in_string.ok()) << in_string.status();
  EXPECT_EQ((*in_string)[0], "[[[[{{{{ ]]] }");
  // An escaped quote does not end the string; the brackets after it are still inside.
  auto escaped_quote = ParseBoundedJson(R"(["a\"[[[[", "{{"])", limits, "x");
  ASSERT_TRUE(escaped_quote.ok()) << escaped_quote.status();
  EXPECT_EQ((*escaped_quote)[0], "a\"[[[[");
  // An escaped backslash does end its string: the brackets after it count.
  EXPECT_EQ(JsonNestingDepth(R"(["a\\",[[1]]])", 10), 3);
  auto after_backslash = ParseBoundedJson(R"(["a\\",[[1]]])", {kKiB, 2}, "x");
  ASSERT_FALSE(after_backslash.ok());
  EXPECT_THAT(std::string(after_backslash.status().message()),
              HasSubstr("nesting deeper than 2 levels"));
}

TEST(BoundedJsonTest, SizeAtTheLimitPassesOneByteMoreFailsNamingTheLimit) {
  const JsonLimits limits{kMiB, 8};
  std::string text = "\"" + std::string(kMiB - 2, 'x') + "\"";
  ASSERT_EQ(text.size(), kMiB);
  EXPECT_TRUE(ParseBoundedJson(text, limits, "body").ok());
  text.insert(1, "y");
  auto over = ParseBoundedJson(text, limits, "body");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(over.status().message()),
            "body: 1048577 bytes (1.0 MiB) exceeds the 1 MiB limit");
  auto round = ParseBoundedJson(std::string(3 * kMiB, ' '), limits, "body");
  EXPECT_EQ(std::string(round.status().message()), "body: 3 MiB exceeds the 1 MiB limit");
}

TEST(BoundedJsonTest, InvalidJsonNamesWhatAndTheParserMessage) {
  auto bad = ParseBoundedJson("{not json", {kKiB, 8}, "the body");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("the body: invalid JSON: "));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("parse error"));
  // Unbalanced closers cannot lower the count below zero and hide later nesting.
  EXPECT_EQ(JsonNestingDepth("]]]][[[", 10), 3);
  EXPECT_FALSE(ParseBoundedJson("]]]]", {kKiB, 8}, "x").ok());
}

TEST(BoundedJsonTest, TheParserMessageQuotesInputAsPrintableAscii) {
  // nlohmann quotes the bytes it last read; raw, they would make the message invalid UTF-8 and
  // every dump() of an answer carrying it throw (found by the admission_review fuzzer).
  auto bad = ParseBoundedJson("{\"kind\": {\xd5N\x01\x00}}", {kKiB, 8}, "body");
  ASSERT_FALSE(bad.ok());
  const std::string message(bad.status().message());
  EXPECT_THAT(message, HasSubstr("\\xd5"));
  for (const char c : message) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << message;
  const nlohmann::json answer = {{"message", message}};
  EXPECT_NO_THROW((void)answer.dump());
  EXPECT_EQ(PrintableText("a\n\xff"), "a\\x0a\\xff");
}

TEST(BoundedJsonTest, HundredsOfThousandsOfNestedArraysAreRefusedWithoutRecursion) {
  // The attack of issue 27: a value nlohmann would parse, and dump() would then overflow the
  // stack on. The pre-scan stops at the first level past the limit.
  const std::string deep = NestedArrays(300000);
  EXPECT_EQ(JsonNestingDepth(deep, 64), 65);
  auto parsed = ParseBoundedJson(deep, {16 * kMiB, 64}, "AdmissionReview");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(std::string(parsed.status().message()),
            "AdmissionReview: nesting deeper than 64 levels");
}

TEST(BoundedJsonTest, FormatBytesIsExactWhenNotRound) {
  EXPECT_EQ(FormatBytes(3 * kMiB), "3 MiB");
  EXPECT_EQ(FormatBytes(256 * kKiB), "256 KiB");
  EXPECT_EQ(FormatBytes(1000), "1000 bytes");
  EXPECT_EQ(FormatBytes(3 * kMiB + 1), "3145729 bytes (3.0 MiB)");
}

TEST(BoundedJsonTest, TheLimitsHoldWhatTheyAreSizedFor) {
  // The deepest annotation of the protocol, the node register (6 levels), fits the annotation
  // limits with room; a Pod's deepest fields (managedFields, affinity) fit the object depth.
  protocol::DeviceInfo gpu;
  gpu.id = "GPU-1";
  gpu.mode = "mig";
  protocol::MigProfileInfo profile;
  profile.name = "1g.5gb";
  profile.placements = {{0, 1}, {1, 1}};
  gpu.mig_profiles = {profile};
  const std::string node_register = protocol::EncodeNodeRegister({gpu});
  EXPECT_EQ(JsonNestingDepth(node_register, 64), 6) << node_register;
  EXPECT_TRUE(ParseBoundedJson(node_register, kAnnotationJsonLimits, "register").ok());
  EXPECT_LE(6, kAnnotationJsonLimits.max_depth - 2);
  EXPECT_EQ(kAdmissionReviewJsonLimits.max_bytes, 7 * kMiB);
  EXPECT_EQ(kAnnotationJsonLimits.max_bytes, 256 * kKiB);
}

}  // namespace

namespace protocol {
namespace {

TEST(AnnotationJsonLimitsTest, AnOverDeepAllocationsValueIsRefusedNamingTheLimit) {
  // 100000 levels: 200 KB, within the size limit, so the depth limit is what refuses it.
  const std::string deep = "[" + NestedArrays(100000) + "]";
  auto decoded = DecodeMigAllocations(deep);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(std::string(decoded.status().message()),
            "hami.io/vgpu-mig-allocations: nesting deeper than 8 levels");
  auto big = DecodeMigAllocations("[" + std::string(300 * kKiB, ' ') + "]");
  ASSERT_FALSE(big.ok());
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("exceeds the 256 KiB limit"));
  auto reg = DecodeNodeRegister(deep);
  ASSERT_FALSE(reg.ok());
  EXPECT_THAT(std::string(reg.status().message()), HasSubstr("nesting deeper than 8 levels"));
}

TEST(ReferencedGpusTest, NamesTheGpusOfAValueTheStrictDecoderRefuses) {
  // The second entry lacks its profile: DecodeMigAllocations refuses the value.
  const std::string value =
      R"([{"gpuUUID":"GPU-a","containerIndex":0,"deviceIndex":0,"profile":"1g.5gb",)"
      R"("placement":{"start":0,"size":1}},{"gpuUUID":"GPU-b"}])";
  ASSERT_FALSE(DecodeMigAllocations(value).ok());
  ReferencedGpuSet named = ReferencedGpus(value);
  EXPECT_THAT(named.gpu_uuids, UnorderedElementsAre("GPU-a", "GPU-b"));
  EXPECT_TRUE(named.complete);
  // Entries that name no GPU make the set incomplete.
  named = ReferencedGpus(R"([{"gpuUUID":"GPU-a"},{"gpuUUID":7},"x",{}])");
  EXPECT_THAT(named.gpu_uuids, UnorderedElementsAre("GPU-a"));
  EXPECT_FALSE(named.complete);
  // Not a JSON array: nothing is known.
  EXPECT_FALSE(ReferencedGpus("{").complete);
  EXPECT_FALSE(ReferencedGpus(R"({"gpuUUID":"GPU-a"})").complete);
}

TEST(ReferencedGpusTest, AnOverDeepValueIsUnknownNotACrash) {
  const std::string deep = R"([{"gpuUUID":"GPU-a"},)" + NestedArrays(100000) + "]";
  ReferencedGpuSet named = ReferencedGpus(deep);
  EXPECT_TRUE(named.gpu_uuids.empty());
  EXPECT_FALSE(named.complete);
}

}  // namespace
}  // namespace protocol
}  // namespace dynmig
