// The local mode's ReplicaSet controller against the in-memory API server over HTTP: it keeps a
// ReplicaSet's active pods at spec.replicas as kube-controller-manager does (an evicted pod comes
// back, a terminating one no longer counts, surplus goes unscheduled first), collects the pods of
// a deleted ReplicaSet and leaves pods of owners it never saw alone; a hostile replica count is
// bounded per pass and in total.
#include "local/replicaset_controller.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "common/clock.h"
#include "kube/in_memory_api_server.h"
#include "kube/rest_kube_client.h"

namespace dynmig::local {
namespace {

using kube::Object;

class ReplicaSetControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = kube::InMemoryApiServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    kube::RestConfig cfg;
    cfg.server = server_->url();
    auto client = kube::RestKubeClient::Create(cfg);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }

  Object CreateSet(const std::string& name, int64_t replicas) {
    Object labels = {{"app", name}};
    Object rs = {
        {"apiVersion", "apps/v1"},
        {"kind", "ReplicaSet"},
        {"metadata", {{"name", name}, {"namespace", "default"}}},
        {"spec",
         {{"replicas", replicas},
          {"selector", {{"matchLabels", labels}}},
          {"template",
           {{"metadata", {{"labels", labels}, {"annotations", {{"dynmig.io/defrag", "never"}}}}},
            {"spec",
             {{"terminationGracePeriodSeconds", 30},
              {"containers", {{{"name", "c"}, {"image", "busybox"}}}}}}}}}}};
    auto created = client_->Create(kube::Resource::kReplicaSets, rs);
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? *created : Object();
  }

  std::vector<Object> Pods(const std::string& app) {
    auto list =
        client_->List(kube::Resource::kPods, {.ns = "default", .label_selector = "app=" + app});
    EXPECT_TRUE(list.ok()) << list.status();
    return list.ok() ? list->items : std::vector<Object>{};
  }

  ReplicaSetController::Pass Reconcile(ReplicaSetController& c) {
    auto pass = c.Reconcile();
    EXPECT_TRUE(pass.ok()) << pass.status();
    return pass.ok() ? *pass : ReplicaSetController::Pass{};
  }

  SystemClock clock_;
  std::unique_ptr<kube::InMemoryApiServer> server_;
  std::unique_ptr<kube::KubeClient> client_;
};

TEST_F(ReplicaSetControllerTest, KeepsTheCountAndRecreatesAnEvictedPod) {
  ReplicaSetController c(*client_, clock_);
  const Object rs = CreateSet("web", 2);
  EXPECT_EQ(Reconcile(c).created, 2);
  auto pods = Pods("web");
  ASSERT_EQ(pods.size(), 2u);
  for (const auto& p : pods) {
    EXPECT_THAT(kube::Name(p), ::testing::StartsWith("web-"));
    EXPECT_EQ(kube::Annotation(p, "dynmig.io/defrag"), "never");  // from the template
    const auto& ref = p["metadata"]["ownerReferences"][0];
    EXPECT_EQ(ref["uid"], kube::Uid(rs));
    EXPECT_EQ(ref["kind"], "ReplicaSet");
    EXPECT_EQ(ref["controller"], true);
  }
  EXPECT_EQ(Reconcile(c).created, 0);  // the count holds
  auto got = client_->Get(kube::Resource::kReplicaSets, "default", "web");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)["status"]["replicas"], 2);
  EXPECT_EQ((*got)["status"]["observedGeneration"], 1);

  // Evicted (the defragmenter's way): a replacement with another name and uid.
  ASSERT_TRUE(client_->EvictPod("default", kube::Name(pods[0]), {}).ok());
  EXPECT_EQ(Reconcile(c).created, 1);
  auto after = Pods("web");
  ASSERT_EQ(after.size(), 2u);
  std::set<std::string> uids;
  for (const auto& p : after) uids.insert(kube::Uid(p));
  EXPECT_FALSE(uids.count(kube::Uid(pods[0])));
  EXPECT_TRUE(uids.count(kube::Uid(pods[1])));
}

TEST_F(ReplicaSetControllerTest, ATerminatingPodIsReplacedAtOnce) {
  ReplicaSetController c(*client_, clock_);
  CreateSet("web", 1);
  Reconcile(c);
  auto pods = Pods("web");
  ASSERT_EQ(pods.size(), 1u);
  ASSERT_TRUE(client_->BindPod("default", kube::Name(pods[0]), "node-a", kube::Uid(pods[0])).ok());
  auto deleting = client_->Delete(kube::Resource::kPods, "default", kube::Name(pods[0]), {});
  ASSERT_TRUE(deleting.ok()) << deleting.status();
  ASSERT_TRUE(kube::IsBeingDeleted(*deleting));  // bound: graceful, 30 s
  EXPECT_EQ(Reconcile(c).created, 1);
  EXPECT_EQ(Pods("web").size(), 2u);  // the old one still terminating
}

TEST_F(ReplicaSetControllerTest, ScalesDownUnscheduledFirst) {
  ReplicaSetController c(*client_, clock_);
  CreateSet("web", 3);
  Reconcile(c);
  auto pods = Pods("web");
  ASSERT_EQ(pods.size(), 3u);
  ASSERT_TRUE(client_->BindPod("default", kube::Name(pods[1]), "node-a", kube::Uid(pods[1])).ok());
  ASSERT_TRUE(client_
                  ->Patch(kube::Resource::kReplicaSets, "default", "web",
                          {{"spec", {{"replicas", 1}}}}, kube::PatchType::kMerge, "")
                  .ok());
  EXPECT_EQ(Reconcile(c).deleted, 2);
  auto left = Pods("web");
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(kube::Uid(left[0]), kube::Uid(pods[1]));
}

TEST_F(ReplicaSetControllerTest, CollectsThePodsOfADeletedSetOnly) {
  ReplicaSetController c(*client_, clock_);
  CreateSet("web", 2);
  Reconcile(c);
  // A pod naming a ReplicaSet this controller never saw (the unit tests' fakes): left alone.
  Object stray = {{"apiVersion", "v1"},
                  {"kind", "Pod"},
                  {"metadata",
                   {{"name", "stray"},
                    {"namespace", "default"},
                    {"labels", {{"app", "stray"}}},
                    {"ownerReferences",
                     {{{"apiVersion", "apps/v1"},
                       {"kind", "ReplicaSet"},
                       {"name", "gone"},
                       {"uid", "never-seen"},
                       {"controller", true}}}}}},
                  {"spec", {{"containers", {{{"name", "c"}, {"image", "busybox"}}}}}}};
  ASSERT_TRUE(client_->Create(kube::Resource::kPods, stray).ok());
  ASSERT_TRUE(client_->Delete(kube::Resource::kReplicaSets, "default", "web", {}).ok());
  EXPECT_EQ(Reconcile(c).collected, 2);
  EXPECT_TRUE(Pods("web").empty());
  EXPECT_EQ(Pods("stray").size(), 1u);
  EXPECT_EQ(Reconcile(c).collected, 0);
}

TEST_F(ReplicaSetControllerTest, AHostileReplicaCountIsBounded) {
  ReplicaSetControllerOptions o;
  o.max_replicas = 3;
  ReplicaSetController capped(*client_, clock_, o);
  CreateSet("many", 2147483647);
  EXPECT_EQ(Reconcile(capped).created, 3);
  EXPECT_EQ(Reconcile(capped).created, 0);
  EXPECT_EQ(Pods("many").size(), 3u);
  // Without the total bound lower than a burst: one pass creates at most kBurstReplicas.
  ReplicaSetControllerOptions wide;
  wide.max_replicas = kBurstReplicas + 100;
  ReplicaSetController burst(*client_, clock_, wide);
  EXPECT_EQ(Reconcile(burst).created, kBurstReplicas);
  EXPECT_EQ(Reconcile(burst).created, 100 - 3);
}

TEST_F(ReplicaSetControllerTest, TheLoopRecreatesWithoutBeingAsked) {
  ReplicaSetControllerOptions o;
  o.interval = absl::Milliseconds(50);
  ReplicaSetController c(*client_, clock_, o);
  CreateSet("web", 1);
  c.Start();
  auto one = [&] {
    for (int i = 0; i < 200; ++i) {
      auto pods = Pods("web");
      if (pods.size() == 1) return pods[0];
      clock_.SleepFor(absl::Milliseconds(20));
    }
    return Object();
  };
  const Object first = one();
  ASSERT_FALSE(first.is_null());
  ASSERT_TRUE(client_->EvictPod("default", kube::Name(first), {}).ok());
  Object second;
  for (int i = 0; i < 200 && (second.is_null() || kube::Uid(second) == kube::Uid(first)); ++i) {
    clock_.SleepFor(absl::Milliseconds(20));
    second = one();
  }
  c.Stop();
  ASSERT_FALSE(second.is_null());
  EXPECT_NE(kube::Uid(second), kube::Uid(first));
}

}  // namespace
}  // namespace dynmig::local
