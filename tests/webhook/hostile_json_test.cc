// AdmissionHandler::Review against bodies built to exhaust the stack or memory (issue 27): a pod
// whose protocol annotation holds hundreds of thousands of nested arrays used to crash the
// scheduler when the value was re-serialised.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "common/bounded_json.h"
#include "protocol/annotations.h"
#include "webhook/admission.h"

namespace dynmig::webhook {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr std::string_view kDeepPlaceholder = "\"@@deep@@\"";

// An AdmissionReview (operation `op`) of a GPU pod whose annotation `key` is `value_json` (JSON
// text, spliced in as it is, so that it may be deeper than nlohmann would let us build).
std::string HostileReview(std::string_view op, std::string_view key,
                          const std::string& value_json) {
  json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata",
       {{"name", "p"}, {"namespace", "jobs"}, {"annotations", {{std::string(key), "@@deep@@"}}}}},
      {"spec",
       {{"containers", json::array({{{"name", "c"},
                                     {"image", "ubuntu"},
                                     {"resources", {{"limits", {{"nvidia.com/gpu", 1}}}}}}})}}}};
  json old_pod = pod;
  old_pod["metadata"]["annotations"] = json::object();
  json review = {{"apiVersion", "admission.k8s.io/v1"},
                 {"kind", "AdmissionReview"},
                 {"request",
                  {{"uid", "u-1"},
                   {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
                   {"namespace", "jobs"},
                   {"name", "p"},
                   {"operation", std::string(op)},
                   {"userInfo", {{"username", "alice"}}},
                   {"object", pod},
                   {"oldObject", op == "UPDATE" ? old_pod : json()}}}};
  std::string text = review.dump();
  const size_t at = text.find(kDeepPlaceholder);
  text.replace(at, kDeepPlaceholder.size(), value_json);
  return text;
}

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

json HostileAnswer(const AdmissionHandler& handler, const std::string& body) {
  return json::parse(handler.Review(body));
}

TEST(HostileAdmissionReviewTest, DeeplyNestedAnnotationIsACleanDenyNamingTheLimit) {
  AdmissionHandler handler{AdmissionOptions{}};
  for (std::string_view op : {"CREATE", "UPDATE"}) {
    for (std::string_view key :
         {protocol::kMigAllocationsAnnotation, protocol::kMigProfilePreferenceAnnotation}) {
      const json out = HostileAnswer(handler, HostileReview(op, key, Nested(300000)));
      const json& r = out["response"];
      EXPECT_EQ(r["allowed"], false) << op << " " << key;
      EXPECT_EQ(r["status"]["code"], 400);
      EXPECT_EQ(r["status"]["reason"], "BadRequest");
      EXPECT_EQ(r["status"]["message"],
                "AdmissionReview: the request body: nesting deeper than 64 levels");
    }
  }
}

TEST(HostileAdmissionReviewTest, NestingWithinTheLimitIsReviewedAsUsual) {
  // The same pod with a nested (but bounded) annotation value: reviewed, re-serialised, and
  // answered by the review's own rules (a user may not write the allocations annotation).
  AdmissionHandler handler{AdmissionOptions{}};
  const json out = HostileAnswer(
      handler, HostileReview("UPDATE", protocol::kMigAllocationsAnnotation, Nested(40)));
  EXPECT_EQ(out["response"]["uid"], "u-1");
  EXPECT_EQ(out["response"]["allowed"], false);
  EXPECT_EQ(out["response"]["status"]["code"], 403);
  EXPECT_THAT(out["response"]["status"]["message"].get<std::string>(),
              HasSubstr("hami.io/vgpu-mig-allocations is written only by"));
  // And a plain string value of an annotation users may set is allowed.
  const json ok =
      HostileAnswer(handler, HostileReview("CREATE", protocol::kVgpuModeAnnotation, "\"mig\""));
  EXPECT_EQ(ok["response"]["allowed"], true) << ok.dump();
}

TEST(HostileAdmissionReviewTest, InvalidBytesInABrokenBodyGetAnAnswerNotAnException) {
  // The parser's message quotes the bytes it stopped at; the answer must still serialise.
  AdmissionHandler handler{AdmissionOptions{}};
  const std::string body =
      std::string(R"({"apiVersion":"admission.k8s.io/v1","request":{"kind":{)") + "\xd5N\x01" +
      std::string(1, '\0') + "}}}";
  std::string answer;
  ASSERT_NO_THROW(answer = handler.Review(body));
  const json out = json::parse(answer);
  EXPECT_EQ(out["response"]["allowed"], false);
  EXPECT_THAT(out["response"]["status"]["message"].get<std::string>(), HasSubstr("invalid JSON"));
}

TEST(HostileAdmissionReviewTest, ABodyOverTheAdmissionReviewLimitIsDeniedNamingIt) {
  AdmissionHandler handler{AdmissionOptions{}};
  const std::string padded =
      HostileReview("CREATE", protocol::kVgpuModeAnnotation,
                    "\"" + std::string(kAdmissionReviewJsonLimits.max_bytes, 'x') + "\"");
  const json out = HostileAnswer(handler, padded);
  EXPECT_EQ(out["response"]["allowed"], false);
  EXPECT_EQ(out["response"]["status"]["code"], 400);
  EXPECT_THAT(out["response"]["status"]["message"].get<std::string>(),
              HasSubstr("exceeds the 7 MiB limit"));
}

}  // namespace
}  // namespace dynmig::webhook
