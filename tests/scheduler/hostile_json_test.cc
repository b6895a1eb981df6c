// The extender's and the webhooks' request decoding against bodies built to exhaust the stack
// (issue 27): a pod whose annotation holds hundreds of thousands of nested arrays.
#include <gmock/gmock.h>

#include <string>

#include "common/bounded_json.h"
#include "scheduler/extender_api.h"
#include "scheduler_test_util.h"

namespace dynmig::scheduler::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string NestedLists(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// ExtenderArgs of a pod whose annotation holds `value_json` (spliced in as text).
std::string HostileFilterBody(const std::string& value_json) {
  return R"({"Pod":{"metadata":{"name":"p","namespace":"default","annotations":{"hami.io/vgpu-mig-allocations":)" +
         value_json + R"(}},"spec":{}},"NodeNames":["node-a"]})";
}

TEST(HostileExtenderArgsTest, OverDeepBodiesAreRefusedNamingTheLimitWithOrWithoutTheCache) {
  const std::string body = HostileFilterBody(NestedLists(300000));
  NodeNamesCache cache;
  for (NodeNamesCache* c : {static_cast<NodeNamesCache*>(nullptr), &cache}) {
    auto args = ParseExtenderArgs(body, c);
    ASSERT_FALSE(args.ok());
    EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(args.status().message()), "ExtenderArgs: nesting deeper than 64 levels");
  }
  // Within the limit, the same body is parsed (by the fast path and the full parse alike).
  for (NodeNamesCache* c : {static_cast<NodeNamesCache*>(nullptr), &cache}) {
    auto args = ParseExtenderArgs(HostileFilterBody(NestedLists(20)), c);
    ASSERT_TRUE(args.ok()) << args.status();
    EXPECT_EQ(kube::Name(args->pod), "p");
    EXPECT_THAT(args->Candidates(), ElementsAre("node-a"));
  }
  auto big = ParseExtenderArgs(
      HostileFilterBody("\"" + std::string(kExtenderArgsJsonLimits.max_bytes, 'x') + "\""), &cache);
  ASSERT_FALSE(big.ok());
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("exceeds the 16 MiB limit"));
}

TEST(HostileExtenderArgsTest, BindingArgsAreSmallAndShallow) {
  // 20000 levels: 40 KB, within the size limit, so the depth limit is what refuses it.
  auto deep = ParseExtenderBindingArgs(R"({"PodName":)" + NestedLists(20000) + "}");
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(std::string(deep.status().message()),
            "ExtenderBindingArgs: nesting deeper than 8 levels");
  auto big = ParseExtenderBindingArgs(R"({"PodName":")" + std::string(70000, 'x') + "\"}");
  ASSERT_FALSE(big.ok());
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("exceeds the 64 KiB limit"));
}

TEST_F(SchedulerTest, OverDeepFilterBindAndWebhookBodiesAreCleanErrorsNotCrashes) {
  SchedulerServer* s = StartScheduler();
  HttpResult r = Post(s->port(), "/filter", HostileFilterBody(NestedLists(300000)));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body["Error"], "ExtenderArgs: nesting deeper than 64 levels");
  EXPECT_TRUE(r.body["NodeNames"].empty());
  r = Post(s->port(), "/bind", R"({"PodName":)" + NestedLists(20000) + "}");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body["Error"], "ExtenderBindingArgs: nesting deeper than 8 levels");
  const std::string review =
      R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","object":)" +
      NestedLists(300000) + "}}";
  for (const char* path : {"/webhook", "/validate"}) {
    r = Post(s->port(), path, review);
    EXPECT_EQ(r.status, 200) << path;
    EXPECT_EQ(r.body["response"]["allowed"], false) << path;
    EXPECT_EQ(r.body["response"]["status"]["code"], 400) << path;
    EXPECT_EQ(r.body["response"]["status"]["message"],
              "AdmissionReview: the request body: nesting deeper than 64 levels")
        << path;
  }
  // The process is still serving.
  EXPECT_EQ(Get(s->port(), "/healthz").text, "ok\n");
}

}  // namespace
}  // namespace dynmig::scheduler::testing
