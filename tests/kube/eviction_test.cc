// The Eviction API and PodDisruptionBudgets: RestKubeClient::EvictPod against InMemoryApiServer
// over real HTTP, as a v1.20 server (policy/v1beta1 only) and as current ones, and the double's
// budget rules, version handling and refusals of hostile Eviction bodies.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "kube/api_status.h"
#include "kube_test_util.h"

namespace dynmig::kube {
namespace {

using ::testing::HasSubstr;
using testing::MakePod;

constexpr char kViolation[] = "Cannot evict pod as it would violate the pod's disruption budget.";

Object Budget(const std::string& name, Object spec, const std::string& api_version) {
  return Object{{"apiVersion", api_version},
                {"kind", "PodDisruptionBudget"},
                {"metadata", {{"name", name}, {"namespace", "default"}}},
                {"spec", std::move(spec)}};
}

Object WebSelector() { return Object{{"matchLabels", {{"app", "web"}}}}; }

// The server's Kubernetes minor version is the parameter: 20 (the test cluster), 23 (both policy
// versions), 32 (current).
class EvictionTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    InMemoryApiServerOptions options = testing::FastServerOptions();
    options.minor_version = GetParam();
    options.store.clock = &clock_;
    auto server = InMemoryApiServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    client_ = testing::MakeClient(server_->url(), &sleeps_);
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
  }

  bool V1() const { return GetParam() >= 21; }  // policy/v1 PodDisruptionBudgets
  Resource PdbResource() const {
    return V1() ? Resource::kPodDisruptionBudgets : Resource::kPodDisruptionBudgetsV1beta1;
  }
  std::string PdbVersion() const { return V1() ? "policy/v1" : "policy/v1beta1"; }

  // A pod on node-1, Running, Ready unless `ready` is false.
  void RunningPod(const std::string& name, bool ready = true,
                  Object labels = Object{{"app", "web"}}) {
    ASSERT_TRUE(client_->CreatePod(MakePod(name, "default", "node-1", std::move(labels))).ok());
    Object status = {
        {"status",
         {{"phase", "Running"},
          {"conditions", {{{"type", "Ready"}, {"status", ready ? "True" : "False"}}}}}}};
    ASSERT_TRUE(client_->PatchPodStatus("default", name, status).ok());
  }
  void CreateBudget(const std::string& name, Object spec) {
    auto created = client_->Create(PdbResource(), Budget(name, std::move(spec), PdbVersion()));
    ASSERT_TRUE(created.ok()) << created.status();
  }
  Object GetBudget(const std::string& name) {
    auto got = client_->Get(PdbResource(), "default", name);
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? *got : Object();
  }
  bool Gone(const std::string& pod) {
    auto got = client_->GetPod("default", pod);
    return !got.ok() || IsBeingDeleted(*got);
  }

  // Raw POST of an Eviction body, as a hostile client could send it.
  httplib::Result PostEviction(const std::string& pod, const std::string& body) {
    httplib::Client http(server_->url());
    return http.Post(fmt::format("/api/v1/namespaces/default/pods/{}/eviction", pod), body,
                     "application/json");
  }

  FakeClock clock_;
  testing::SleepRecorder sleeps_;
  std::unique_ptr<InMemoryApiServer> server_;
  std::unique_ptr<RestKubeClient> client_;
};

TEST_P(EvictionTest, DiscoveryNamesTheEvictionVersionTheClientSends) {
  auto version = client_->EvictionApiVersion();
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, GetParam() >= 22 ? "policy/v1" : "policy/v1beta1");
  // Asked once.
  const int64_t before = server_->request_count();
  ASSERT_TRUE(client_->EvictionApiVersion().ok());
  EXPECT_EQ(server_->request_count(), before);
}

TEST_P(EvictionTest, BudgetRefusesThenAllowsAndTwoEvictionsCannotShareOneDisruption) {
  RunningPod("web-a");
  RunningPod("web-b");
  CreateBudget("web", {{"selector", WebSelector()}, {"minAvailable", 2}});
  Object status = GetBudget("web")["status"];
  EXPECT_EQ(status["expectedPods"], 2);
  EXPECT_EQ(status["currentHealthy"], 2);
  EXPECT_EQ(status["disruptionsAllowed"], 0);

  const int64_t attempts = client_->attempts();
  absl::Status refused = client_->EvictPod("default", "web-a", {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr(kViolation));
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("The disruption budget web needs 2 healthy pods and has 2 currently"));
  EXPECT_EQ(KubeHttpCode(refused), 429);
  // Not retried (the discovery GET is the one other request).
  EXPECT_LE(client_->attempts() - attempts, 2);
  EXPECT_TRUE(sleeps_.Get().empty());
  EXPECT_FALSE(Gone("web-a"));

  auto relaxed = client_->Patch(PdbResource(), "default", "web", {{"spec", {{"minAvailable", 1}}}},
                                PatchType::kMerge, "");
  ASSERT_TRUE(relaxed.ok()) << relaxed.status();
  ASSERT_TRUE(client_->EvictPod("default", "web-a", {}).ok());
  EXPECT_TRUE(Gone("web-a"));
  status = GetBudget("web")["status"];
  EXPECT_EQ(status["disruptionsAllowed"], 0);
  EXPECT_TRUE(status["disruptedPods"].contains("web-a"));
  // web-a is being deleted (30 s grace): the budget has no disruption left for web-b.
  absl::Status second = client_->EvictPod("default", "web-b", {});
  EXPECT_EQ(second.code(), absl::StatusCode::kResourceExhausted) << second;
  EXPECT_FALSE(Gone("web-b"));
}

TEST_P(EvictionTest, DryRunChecksTheBudgetAndChangesNothing) {
  RunningPod("web-a");
  RunningPod("web-b");
  CreateBudget("web", {{"selector", WebSelector()}, {"minAvailable", 1}});
  const std::string rv = ResourceVersion(GetBudget("web"));
  ASSERT_TRUE(client_->EvictPod("default", "web-a", {.dry_run = true}).ok());
  EXPECT_FALSE(Gone("web-a"));
  EXPECT_EQ(ResourceVersion(GetBudget("web")), rv);
  ASSERT_TRUE(
      client_->PatchPodStatus("default", "web-b", {{"status", {{"phase", "Pending"}}}}).ok());
  EXPECT_EQ(client_->EvictPod("default", "web-a", {.dry_run = true}).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_P(EvictionTest, PodsThatDoNotRunOrAreBeingDeletedIgnoreTheBudget) {
  RunningPod("web-a");
  CreateBudget("web", {{"selector", WebSelector()}, {"minAvailable", 1}});
  ASSERT_TRUE(client_->CreatePod(MakePod("web-pending", "default", "", {{"app", "web"}})).ok());
  EXPECT_TRUE(client_->EvictPod("default", "web-pending", {}).ok());
  EXPECT_TRUE(Gone("web-pending"));
  EXPECT_EQ(client_->EvictPod("default", "web-a", {}).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(client_->DeletePod("default", "web-a", {}).ok());  // graceful: still there
  EXPECT_TRUE(client_->EvictPod("default", "web-a", {.grace_period_seconds = 0}).ok());
  EXPECT_EQ(client_->GetPod("default", "web-a").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(EvictionTest, UnreadyPodGoesWithoutTakingADisruptionWhileTheAppIsHealthy) {
  RunningPod("web-a");
  RunningPod("web-b");
  RunningPod("web-sick", /*ready=*/false);
  CreateBudget("web", {{"selector", WebSelector()}, {"minAvailable", 2}});
  EXPECT_EQ(GetBudget("web")["status"]["disruptionsAllowed"], 0);
  EXPECT_TRUE(client_->EvictPod("default", "web-sick", {}).ok());
  EXPECT_TRUE(Gone("web-sick"));
  EXPECT_EQ(client_->EvictPod("default", "web-a", {}).code(), absl::StatusCode::kResourceExhausted);
}

TEST_P(EvictionTest, PercentagesAndMaxUnavailableCountLikeTheDisruptionController) {
  for (const char* name : {"web-a", "web-b", "web-c"}) RunningPod(name);
  CreateBudget("web", {{"selector", WebSelector()}, {"maxUnavailable", "34%"}});  // ceil: 2
  Object status = GetBudget("web")["status"];
  EXPECT_EQ(status["desiredHealthy"], 1);
  EXPECT_EQ(status["disruptionsAllowed"], 2);
  EXPECT_TRUE(client_->EvictPod("default", "web-a", {}).ok());
  EXPECT_TRUE(client_->EvictPod("default", "web-b", {}).ok());
  EXPECT_EQ(client_->EvictPod("default", "web-c", {}).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(client_->Delete(PdbResource(), "default", "web", {}).ok());
  CreateBudget("web", {{"selector", WebSelector()}, {"minAvailable", "50%"}});  // of 3: 2
  EXPECT_EQ(GetBudget("web")["status"]["desiredHealthy"], 2);
}

TEST_P(EvictionTest, MoreThanOneBudgetUidPreconditionAndMissingPod) {
  RunningPod("web-a");
  RunningPod("web-b");
  CreateBudget("web", {{"selector", WebSelector()}, {"minAvailable", 0}});
  CreateBudget("all",
               {{"selector", {{"matchExpressions", {{{"key", "app"}, {"operator", "Exists"}}}}}},
                {"maxUnavailable", 1}});
  absl::Status two = client_->EvictPod("default", "web-a", {});
  EXPECT_EQ(two.code(), absl::StatusCode::kFailedPrecondition) << two;
  EXPECT_THAT(std::string(two.message()), HasSubstr("more than one PodDisruptionBudget"));
  ASSERT_TRUE(client_->Delete(PdbResource(), "default", "all", {}).ok());
  absl::Status uid = client_->EvictPod("default", "web-a", {.precondition_uid = "not-the-uid"});
  EXPECT_EQ(uid.code(), absl::StatusCode::kAborted) << uid;
  EXPECT_FALSE(Gone("web-a"));
  EXPECT_EQ(client_->EvictPod("default", "nope", {}).code(), absl::StatusCode::kNotFound);
  const std::string real_uid = Uid(*client_->GetPod("default", "web-a"));
  EXPECT_TRUE(client_->EvictPod("default", "web-a", {.precondition_uid = real_uid}).ok());
  EXPECT_EQ(client_->EvictPod("default", "", {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->EvictPod("default", "a/../b", {}).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(EvictionTest, BudgetsAreServedInTheServersPolicyVersions) {
  const int minor = GetParam();
  CreateBudget("web", {{"selector", WebSelector()}, {"minAvailable", 1}});
  auto listed = client_->ListPodDisruptionBudgets("default");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->items.size(), 1u);
  EXPECT_EQ(listed->items[0]["apiVersion"], PdbVersion());
  auto v1 = client_->List(Resource::kPodDisruptionBudgets, {});
  auto v1beta1 = client_->List(Resource::kPodDisruptionBudgetsV1beta1, {});
  EXPECT_EQ(v1.ok(), minor >= 21);
  EXPECT_EQ(v1beta1.ok(), minor <= 24);
  if (!v1beta1.ok()) {
    EXPECT_EQ(v1beta1.status().code(), absl::StatusCode::kNotFound);
  }
  if (v1.ok() && v1beta1.ok()) {
    // One object, two versions.
    ASSERT_EQ(v1beta1->items.size(), 1u);
    EXPECT_EQ(v1beta1->items[0]["apiVersion"], "policy/v1beta1");
    EXPECT_EQ(Uid(v1beta1->items[0]), Uid(v1->items[0]));
    auto wrong = client_->Create(
        Resource::kPodDisruptionBudgetsV1beta1,
        Budget("x", {{"selector", WebSelector()}, {"minAvailable", 1}}, "policy/v1"));
    EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  }
  httplib::Client http(server_->url());
  auto group = http.Get("/apis/policy/v1");
  ASSERT_TRUE(group);
  EXPECT_EQ(group->status, minor >= 21 ? 200 : 404);
  auto core = http.Get("/api/v1");
  ASSERT_TRUE(core);
  EXPECT_EQ(RestKubeClient::EvictionVersionFromDiscovery(Object::parse(core->body)),
            minor >= 22 ? "policy/v1" : "policy/v1beta1");
}

TEST_P(EvictionTest, BudgetSpecIsValidated) {
  auto both = client_->Create(
      PdbResource(),
      Budget("x", {{"selector", WebSelector()}, {"minAvailable", 1}, {"maxUnavailable", 1}},
             PdbVersion()));
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KubeHttpCode(both.status()), 422);
  for (const Object& bad : {Object("150%"), Object("x%"), Object(-1), Object(true)}) {
    auto created = client_->Create(
        PdbResource(),
        Budget("x", {{"selector", WebSelector()}, {"minAvailable", bad}}, PdbVersion()));
    EXPECT_EQ(KubeHttpCode(created.status()), 422) << bad.dump();
  }
  auto bad_selector = client_->Create(
      PdbResource(),
      Budget("x", {{"selector", {{"matchExpressions", {{{"key", "a"}, {"operator", "Near"}}}}}}},
             PdbVersion()));
  EXPECT_EQ(KubeHttpCode(bad_selector.status()), 422);
  // Neither bound: minAvailable 1, as the apiserver defaults it.
  CreateBudget("d", {{"selector", WebSelector()}});
  EXPECT_EQ(GetBudget("d")["spec"]["minAvailable"], 1);
}

TEST_P(EvictionTest, HostileEvictionBodiesAreRefusedWithoutHarm) {
  RunningPod("web-a");
  const std::string version = GetParam() >= 22 ? "policy/v1" : "policy/v1beta1";
  auto body = [&](const std::string& name, const std::string& ns, const std::string& api) {
    return Object{{"apiVersion", api},
                  {"kind", "Eviction"},
                  {"metadata", {{"name", name}, {"namespace", ns}}}}
        .dump();
  };
  struct Case {
    std::string what;
    std::string body;
    int code;
  };
  const std::vector<Case> cases = {
      {"other name", body("web-b", "default", version), 400},
      {"other namespace", body("web-a", "kube-system", version), 400},
      {"unknown version", body("web-a", "default", "policy/v2"), 400},
      {"not an Eviction", R"({"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-a"}})", 400},
      {"v1 on a server without it", body("web-a", "default", "policy/v1"),
       GetParam() >= 22 ? 201 : 400},
      {"not an object", "[1,2]", 400},
      {"bad JSON", "{\"apiVersion\":", 400},
      {"deleteOptions not an object",
       R"({"apiVersion":"policy/v1beta1","kind":"Eviction","metadata":{"name":"web-a"},"deleteOptions":7})",
       400},
      {"bad dryRun",
       R"({"apiVersion":"policy/v1beta1","kind":"Eviction","metadata":{"name":"web-a"},"deleteOptions":{"dryRun":["Some"]}})",
       400},
      {"too large", std::string(4 << 20, ' '), 413},
  };
  for (const Case& c : cases) {
    if (c.code == 201) continue;  // would evict: checked last
    auto res = PostEviction("web-a", c.body);
    ASSERT_TRUE(res) << c.what;
    EXPECT_EQ(res->status, c.code) << c.what << ": " << res->body;
    EXPECT_FALSE(Gone("web-a")) << c.what;
  }
  auto res = PostEviction("web-a", body("web-a", "default", "policy/v1"));
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, GetParam() >= 22 ? 201 : 400) << res->body;
  auto v1beta1 = PostEviction("web-a", body("web-a", "", "policy/v1beta1"));
  ASSERT_TRUE(v1beta1);
  EXPECT_EQ(v1beta1->status, 201) << v1beta1->body;  // v1beta1 is taken by every version
  EXPECT_TRUE(Gone("web-a"));
}

INSTANTIATE_TEST_SUITE_P(Versions, EvictionTest, ::testing::Values(20, 23, 32),
                         [](const ::testing::TestParamInfo<int>& param) {
                           return fmt::format("v1_{}", param.param);
                         });

TEST(EvictionClientTest, VersionFromDiscoveryAndBody) {
  auto list = [](Object entry) {
    return Object{{"kind", "APIResourceList"},
                  {"resources", {{{"name", "pods"}, {"kind", "Pod"}}, std::move(entry)}}};
  };
  EXPECT_EQ(RestKubeClient::EvictionVersionFromDiscovery(
                list({{"name", "pods/eviction"}, {"group", "policy"}, {"version", "v1"}})),
            "policy/v1");
  EXPECT_EQ(RestKubeClient::EvictionVersionFromDiscovery(
                list({{"name", "pods/eviction"}, {"group", "policy"}, {"version", "v1beta1"}})),
            "policy/v1beta1");
  // No group/version named (very old servers), none at all, or garbage: v1beta1.
  EXPECT_EQ(RestKubeClient::EvictionVersionFromDiscovery(list({{"name", "pods/eviction"}})),
            "policy/v1beta1");
  EXPECT_EQ(RestKubeClient::EvictionVersionFromDiscovery(list({{"name", "pods/status"}})),
            "policy/v1beta1");
  EXPECT_EQ(RestKubeClient::EvictionVersionFromDiscovery(Object("x")), "policy/v1beta1");
  EXPECT_EQ(RestKubeClient::EvictionVersionFromDiscovery(Object{{"resources", 3}}),
            "policy/v1beta1");
  EXPECT_EQ(RestKubeClient::EvictionVersionFromDiscovery(
                list({{"name", "pods/eviction"}, {"group", 1}, {"version", Object::array()}})),
            "policy/v1beta1");

  const Object body = RestKubeClient::EvictionBody(
      "policy/v1", "ns", "pod",
      {.grace_period_seconds = 5, .precondition_uid = "u", .dry_run = true});
  EXPECT_EQ(body["apiVersion"], "policy/v1");
  EXPECT_EQ(body["kind"], "Eviction");
  EXPECT_EQ(body["metadata"]["name"], "pod");
  EXPECT_EQ(body["metadata"]["namespace"], "ns");
  EXPECT_EQ(body["deleteOptions"]["gracePeriodSeconds"], 5);
  EXPECT_EQ(body["deleteOptions"]["preconditions"]["uid"], "u");
  EXPECT_EQ(body["deleteOptions"]["dryRun"], Object::array({"All"}));
  const Object plain = RestKubeClient::EvictionBody("policy/v1beta1", "ns", "pod", {});
  EXPECT_FALSE(plain["deleteOptions"].contains("gracePeriodSeconds"));
  EXPECT_FALSE(plain["deleteOptions"].contains("dryRun"));
}

TEST(EvictionClientTest, ThrottlingWithRetryAfterIsRetriedABudgetRefusalIsNot) {
  auto server = InMemoryApiServer::Start(testing::FastServerOptions());
  ASSERT_TRUE(server.ok());
  testing::SleepRecorder sleeps;
  auto client = testing::MakeClient((*server)->url(), &sleeps);
  ASSERT_TRUE(client->CreatePod(MakePod("p", "default")).ok());  // Pending: no budget applies
  FaultSpec throttle;
  throttle.method = "POST";
  throttle.path_prefix = "/api/v1/namespaces/default/pods/p/eviction";
  throttle.status = 429;
  throttle.retry_after_seconds = 1;
  (*server)->AddFault(throttle);
  EXPECT_TRUE(client->EvictPod("default", "p", {}).ok());
  EXPECT_EQ(sleeps.Get().size(), 1u);
  ASSERT_TRUE(client->CreatePod(MakePod("q", "default")).ok());
  FaultSpec bare = throttle;
  bare.path_prefix = "/api/v1/namespaces/default/pods/q/eviction";
  bare.retry_after_seconds = -1;
  (*server)->AddFault(bare);
  EXPECT_EQ(client->EvictPod("default", "q", {}).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(sleeps.Get().size(), 1u);
  client.reset();
}

}  // namespace
}  // namespace dynmig::kube
