// The Publisher (publisher.h) against the in-memory API server: the node annotations it writes
// and the dedupe state it keeps.
#include "deviceplugin/publisher.h"

#include <gtest/gtest.h>

#include "kube/in_memory_api_server.h"
#include "kube/rest_kube_client.h"
#include "protocol/annotations.h"

namespace dynmig::deviceplugin {
namespace {

class PublisherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto api = kube::InMemoryApiServer::Start({});
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = std::move(*api);
    kube::RestConfig config;
    config.server = api_->url();
    config.retry.max_attempts = 1;
    auto client = kube::RestKubeClient::Create(config);
    ASSERT_TRUE(client.ok()) << client.status();
    kube_ = std::move(*client);
    kube::Object node = {{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", "n1"}}}};
    ASSERT_TRUE(kube_->CreateNode(node).ok());
  }
  void TearDown() override {
    if (api_) api_->Stop();
  }

  std::string Annotation(std::string_view key) {
    auto node = kube_->GetNode("n1");
    EXPECT_TRUE(node.ok()) << node.status();
    if (!node.ok()) return "<unreadable>";
    const auto& annotations = (*node)["metadata"]["annotations"];
    if (!annotations.contains(std::string(key))) return "<absent>";
    return annotations[std::string(key)].get<std::string>();
  }

  FakeClock clock_;
  Metrics metrics_;
  std::unique_ptr<kube::InMemoryApiServer> api_;
  std::unique_ptr<kube::RestKubeClient> kube_;
};

TEST_F(PublisherTest, WritesEveryKeyInOnePatchAndRemembersTheIdleInstances) {
  Publisher publisher("n1", *kube_, metrics_, clock_);
  clock_.Set(absl::FromUnixSeconds(1767323045));  // 2026-01-02T03:04:05Z
  const std::vector<protocol::IdleInstance> idle = {
      {"GPU-a", "1g.5gb", mig::Placement{6, 1}, 1767323000}};
  EXPECT_TRUE(publisher.IdleChanged(idle));
  EXPECT_FALSE(publisher.IdleChanged({}));  // nothing published yet reads as "[]"
  NodeSnapshot snapshot;
  snapshot.idle = idle;
  snapshot.held = {{"GPU-a", mig::Placement{0, 1}, "1g.5gb", "default/ended"}};
  ASSERT_TRUE(publisher.Publish(snapshot).ok());
  EXPECT_EQ(Annotation(protocol::kNodeHandshakeAnnotation), "Reported_2026-01-02T03:04:05Z");
  EXPECT_EQ(Annotation(protocol::kNodeRegisterAnnotation), protocol::EncodeNodeRegister({}));
  EXPECT_EQ(Annotation(protocol::kNodeHeldSlicesAnnotation),
            protocol::EncodeHeldSlices(snapshot.held));
  EXPECT_EQ(Annotation(protocol::kNodeIdleInstancesAnnotation),
            protocol::EncodeIdleInstances(idle));
  EXPECT_FALSE(publisher.IdleChanged(idle));
  EXPECT_TRUE(publisher.IdleChanged({}));
}

TEST_F(PublisherTest, AFailedPatchNamesTheNodeAndKeepsTheLastWrittenIdleInstances) {
  Publisher publisher("missing-node", *kube_, metrics_, clock_);
  NodeSnapshot snapshot;
  snapshot.idle = {{"GPU-a", "1g.5gb", mig::Placement{6, 1}, 1767323000}};
  auto st = publisher.Publish(snapshot);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("missing-node"), std::string_view::npos) << st;
  EXPECT_TRUE(publisher.IdleChanged(snapshot.idle));
  EXPECT_FALSE(publisher.IdleChanged({}));
}

}  // namespace
}  // namespace dynmig::deviceplugin
