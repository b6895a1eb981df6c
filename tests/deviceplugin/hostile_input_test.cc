// The device plugin against hostile input (issue 27): request bodies to its HTTP endpoints, and a
// pod's allocations annotation built to exhaust the stack.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <string>

#include "deviceplugin/pods.h"
#include "dp_test_util.h"

namespace dynmig::deviceplugin::testing {
namespace {

using ::testing::HasSubstr;

class HostileHttpTest : public PluginTest {};

TEST_F(HostileHttpTest, ABodyToTheHttpEndpointsIsRefusedUnreadNamingTheLimit) {
  StartPlugin();
  httplib::Client client("127.0.0.1", plugin_->http_port());
  for (const char* path : {"/nvml", "/metrics", "/healthz"}) {
    auto res = client.Post(path, std::string(1 << 20, 'x'), "application/json");
    ASSERT_TRUE(res) << path << ": " << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 413) << path;
    EXPECT_EQ(res->body, "request body too large: the limit is 4 KiB\n") << path;
  }
  auto health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

kube::Object PodWithAllocations(const std::string& value) {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata",
           {{"name", "p"},
            {"namespace", "default"},
            {"uid", "u"},
            {"annotations", {{"hami.io/vgpu-mig-allocations", value}}}}},
          {"spec", {{"nodeName", kNode}}}};
}

TEST(HostilePodsTest, AnOverDeepAllocationsValueIsUnreadableWithUnknownGpusNotACrash) {
  // 100000 levels (200 KB, within the annotation size limit): refused for its depth by the
  // strict decoder and by the lenient gpuUUID read alike.
  const std::string deep =
      R"([{"gpuUUID":"GPU-a"},)" + std::string(100000, '[') + std::string(100000, ']') + "]";
  const PodMig m = AnalyzePod(PodWithAllocations(deep));
  EXPECT_TRUE(m.relevant);
  EXPECT_THAT(m.unreadable, HasSubstr("nesting deeper than 8 levels"));
  EXPECT_TRUE(m.gpus_unknown);
  EXPECT_TRUE(m.referenced_gpus.empty());
  // The same entry without the nesting: its GPU is named although the value is refused.
  const PodMig named = AnalyzePod(PodWithAllocations(R"([{"gpuUUID":"GPU-a"}])"));
  EXPECT_FALSE(named.unreadable.empty());
  EXPECT_EQ(named.referenced_gpus, (std::set<std::string>{"GPU-a"}));
  EXPECT_FALSE(named.gpus_unknown);
}

}  // namespace
}  // namespace dynmig::deviceplugin::testing
