// The Publisher (publisher.h) against the in-memory API server: the node annotations it writes
// and the dedupe state it keeps.
#include "deviceplugin/publisher.h"

#include <gtest/gtest.h>

#include <sstream>

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
  EXPECT_TRUE(publisher.HeldChanged(snapshot.held));
  EXPECT_FALSE(publisher.HeldChanged({}));
  ASSERT_TRUE(publisher.Publish(snapshot).ok());
  EXPECT_EQ(Annotation(protocol::kNodeHandshakeAnnotation), "Reported_2026-01-02T03:04:05Z");
  EXPECT_EQ(Annotation(protocol::kNodeRegisterAnnotation), protocol::EncodeNodeRegister({}));
  EXPECT_EQ(Annotation(protocol::kNodeHeldSlicesAnnotation),
            protocol::EncodeHeldSlices(snapshot.held));
  EXPECT_EQ(Annotation(protocol::kNodeIdleInstancesAnnotation),
            protocol::EncodeIdleInstances(idle));
  EXPECT_FALSE(publisher.IdleChanged(idle));
  EXPECT_TRUE(publisher.IdleChanged({}));
  EXPECT_FALSE(publisher.HeldChanged(snapshot.held));
  EXPECT_TRUE(publisher.HeldChanged({}));
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
  EXPECT_FALSE(publisher.HeldChanged({}));
}

// The pod-attributed instances: idle ones are left out; the container comes from the served
// Allocate that handed the instance out (not from another pod's), a legacy one's from its holder.
TEST(LiveInstanceInfosTest, NamesEachLiveInstancesPodAndContainer) {
  ManagedInstance a;
  a.gpu_uuid = "GPU-b";
  a.profile = "3g.20gb";
  a.placement = {4, 4};
  a.gpu_instance_id = 2;
  a.compute_instance_id = 0;
  a.mig_uuid = "MIG-a";
  a.owner = {"uid-a", "ml", "trainer-0", 1, 0};
  ManagedInstance idle = a;
  idle.mig_uuid = "MIG-idle";
  idle.idle = true;
  ManagedInstance legacy = a;
  legacy.mig_uuid = "MIG-legacy";
  legacy.owner = {"uid-l", "old", "holder", 0, 0};
  legacy.holders = {{"uid-l", "old", "holder", "app", "nvidia.com/gpu", "MIG-legacy", "runtime"}};
  ManagedInstance stranger = a;  // a ledger entry of another pod names its MIG UUID
  stranger.mig_uuid = "MIG-s";
  stranger.owner = {"uid-s", "ml", "other", 0, 0};
  LedgerEntry served;
  served.pod_uid = "uid-a";
  served.ns = "ml";
  served.name = "trainer-0";
  served.container = "main";
  served.mig_uuids = {"MIG-a"};
  LedgerEntry foreign = served;
  foreign.name = "trainer-1";
  foreign.container = "wrong";
  foreign.mig_uuids = {"MIG-s"};
  Inventory inv;
  inv.gpus.resize(2);
  inv.gpus[0].info.uuid = "GPU-a";
  inv.gpus[0].info.index = 0;
  inv.gpus[1].info.uuid = "GPU-b";
  inv.gpus[1].info.index = 1;
  auto infos = LiveInstanceInfos({a, idle, legacy, stranger}, {served, foreign}, inv, "gpu-1");
  ASSERT_EQ(infos.size(), 3u);
  EXPECT_EQ(infos[0].ns, "ml");
  EXPECT_EQ(infos[0].pod, "trainer-0");
  EXPECT_EQ(infos[0].container, "main");
  EXPECT_EQ(infos[0].node, "gpu-1");
  EXPECT_EQ(infos[0].gpu_index, 1u);
  EXPECT_EQ(infos[0].gpu_instance_id, 2u);
  EXPECT_EQ(infos[0].placement, "4:4");
  EXPECT_EQ(infos[1].pod, "holder");
  EXPECT_EQ(infos[1].container, "app");
  EXPECT_EQ(infos[2].pod, "other");
  EXPECT_EQ(infos[2].container, "") << "another pod's ledger entry does not name its container";
}

// A hostile pod name (quotes, a newline that would start a forged sample, bytes that are not
// UTF-8, 10 KiB): one sample line, its value escaped by the serializer and bounded.
TEST(InstanceInfoMetricTest, AHostileNameStaysInsideItsLabelValue) {
  Metrics m(/*pod_identity=*/true);
  InstanceInfo i;
  i.ns = "default";
  i.pod = "evil\"} 1\nforged_metric{x=\"\\" + std::string("\xff\xfe") + std::string(10240, 'p');
  i.container = "c";
  i.node = "n";
  i.gpu_uuid = "GPU-a";
  i.mig_uuid = "MIG-a";
  i.profile = "1g.5gb";
  i.placement = "0:1";
  m.SetInstances({i});
  const std::string text = m.Serialize();
  std::istringstream lines(text);
  std::string line;
  int samples = 0;
  while (std::getline(lines, line)) {
    EXPECT_FALSE(line.starts_with("forged_metric")) << line;
    if (!line.starts_with("dynmig_mig_instance_info{")) continue;
    ++samples;
    EXPECT_LT(line.size(), 16u * 1024) << "label values are bounded";
    EXPECT_NE(line.find("pod=\"evil\\\"} 1?forged_metric{x=\\\"\\\\??ppp"), std::string::npos)
        << line;
    EXPECT_TRUE(line.ends_with("} 1")) << line;
  }
  EXPECT_EQ(samples, 1);
  EXPECT_EQ(BoundedLabelValue(i.pod).size(), kMaxLabelValueBytes);

  // Replaced, not added: the old series goes.
  i.pod = "calm";
  m.SetInstances({i});
  EXPECT_EQ(m.Value("dynmig_mig_instance_info"), 1);
  EXPECT_EQ(m.Value("dynmig_mig_instance_info", "pod", "calm"), 1);
  m.SetInstances({});
  EXPECT_EQ(m.Value("dynmig_mig_instance_info"), 0);
}

// At most kMaxInstanceSeries series, however many instances are given.
TEST(InstanceInfoMetricTest, TheSeriesAreBounded) {
  Metrics m(true);
  std::vector<InstanceInfo> many(Metrics::kMaxInstanceSeries + 10);
  for (size_t k = 0; k < many.size(); ++k) many[k].mig_uuid = "MIG-" + std::to_string(k);
  m.SetInstances(many);
  EXPECT_EQ(m.Value("dynmig_mig_instance_info"), Metrics::kMaxInstanceSeries);
}

}  // namespace
}  // namespace dynmig::deviceplugin
