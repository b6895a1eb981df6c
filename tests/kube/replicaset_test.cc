// apps/v1 ReplicaSets on the in-memory API server (for the local mode's ReplicaSet controller):
// discovery, the API server's validation (selector, template labels, replicas) with hostile
// values, the status subresource and generation, all over real HTTP.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "kube/api_status.h"
#include "kube_test_util.h"

namespace dynmig::kube {
namespace {

using ::testing::HasSubstr;

Object ReplicaSet(const std::string& name, Object spec) {
  return Object{{"apiVersion", "apps/v1"},
                {"kind", "ReplicaSet"},
                {"metadata", {{"name", name}, {"namespace", "default"}}},
                {"spec", std::move(spec)}};
}

Object Spec(Object selector_labels, Object template_labels) {
  return Object{{"selector", {{"matchLabels", std::move(selector_labels)}}},
                {"template",
                 {{"metadata", {{"labels", std::move(template_labels)}}},
                  {"spec", {{"containers", {{{"name", "c"}, {"image", "busybox"}}}}}}}}};
}

class ReplicaSetApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = InMemoryApiServer::Start(testing::FastServerOptions());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    client_ = testing::MakeClient(server_->url(), nullptr, 1);
  }
  Object GetJson(const std::string& path) {
    httplib::Client http(server_->url());
    auto res = http.Get(path);
    EXPECT_TRUE(res);
    if (!res) return Object();
    EXPECT_EQ(res->status, 200) << path << ": " << res->body;
    return Object::parse(res->body);
  }
  std::unique_ptr<InMemoryApiServer> server_;
  std::unique_ptr<RestKubeClient> client_;
};

TEST_F(ReplicaSetApiTest, DiscoveryNamesAppsV1ReplicaSetsWithStatus) {
  bool apps = false;
  const Object groups = GetJson("/apis");
  for (const auto& g : groups["groups"]) apps = apps || g["name"] == "apps";
  EXPECT_TRUE(apps);
  EXPECT_EQ(GetJson("/apis/apps")["preferredVersion"]["groupVersion"], "apps/v1");
  std::set<std::string> names;
  const Object resources = GetJson("/apis/apps/v1");
  for (const auto& r : resources["resources"]) names.insert(r["name"]);
  EXPECT_EQ(names, (std::set<std::string>{"replicasets", "replicasets/status"}));
}

TEST_F(ReplicaSetApiTest, CreateDefaultsReplicasAndStatusKeepsGeneration) {
  auto created = client_->Create(Resource::kReplicaSets,
                                 ReplicaSet("web", Spec({{"app", "web"}}, {{"app", "web"}})));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ((*created)["spec"]["replicas"], 1);
  EXPECT_EQ((*created)["metadata"]["generation"], 1);
  auto status = client_->Patch(Resource::kReplicaSets, "default", "web",
                               {{"status", {{"replicas", 1}}}}, PatchType::kMerge, "status");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ((*status)["status"]["replicas"], 1);
  EXPECT_EQ((*status)["metadata"]["generation"], 1);
  auto scaled = client_->Patch(Resource::kReplicaSets, "default", "web",
                               {{"spec", {{"replicas", 3}}}}, PatchType::kMerge, "");
  ASSERT_TRUE(scaled.ok()) << scaled.status();
  EXPECT_EQ((*scaled)["metadata"]["generation"], 2);
  EXPECT_EQ((*scaled)["status"]["replicas"], 1);  // a spec write keeps the status
  auto list = client_->List(Resource::kReplicaSets, {.ns = "default"});
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->items.size(), 1u);
  EXPECT_EQ(list->items[0]["kind"], "ReplicaSet");
  EXPECT_EQ(list->items[0]["apiVersion"], "apps/v1");
}

TEST_F(ReplicaSetApiTest, HostileSpecsAreRefusedNamingTheField) {
  struct Case {
    const char* what;
    Object spec;
    const char* field;
  };
  Object no_selector = Spec({{"app", "web"}}, {{"app", "web"}});
  no_selector.erase("selector");
  Object no_template = Spec({{"app", "web"}}, {{"app", "web"}});
  no_template.erase("template");
  const std::vector<Case> cases = {
      {"labels differ", Spec({{"app", "web"}}, {{"app", "db"}}), "spec.template.metadata.labels"},
      {"no selector", no_selector, "spec.selector"},
      {"empty selector", Spec(Object::object(), {{"app", "web"}}), "spec.selector"},
      {"no template", no_template, "spec.template.spec"},
  };
  for (const auto& c : cases) {
    auto created = client_->Create(Resource::kReplicaSets, ReplicaSet("bad", c.spec));
    ASSERT_FALSE(created.ok()) << c.what;
    EXPECT_EQ(KubeHttpCode(created.status()), 422) << c.what;
    EXPECT_THAT(created.status().message(), HasSubstr(c.field)) << c.what;
  }
  for (const Object& replicas : {Object(-1), Object(int64_t{1} << 40), Object("3"), Object(2.5)}) {
    Object spec = Spec({{"app", "web"}}, {{"app", "web"}});
    spec["replicas"] = replicas;
    auto created = client_->Create(Resource::kReplicaSets, ReplicaSet("bad", spec));
    ASSERT_FALSE(created.ok()) << replicas.dump();
    EXPECT_EQ(KubeHttpCode(created.status()), 422) << replicas.dump();
    EXPECT_THAT(created.status().message(), HasSubstr("spec.replicas")) << replicas.dump();
  }
  auto list = client_->List(Resource::kReplicaSets, {});
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->items.empty());  // nothing stored
}

}  // namespace
}  // namespace dynmig::kube
