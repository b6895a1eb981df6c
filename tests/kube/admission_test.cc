// Admission webhooks and users in the in-memory API server: a test webhook server (HTTP and
// HTTPS) that mutates (adds a label by JSONPatch) and validates (denies pods with an annotation),
// the order of the calls, deny codes and messages, failure policies, matching (operations,
// subresources, excluded namespaces and users), userInfo from bearer tokens, dry runs.
#include "kube/admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/notification.h"
#include "kube/api_status.h"
#include "kube_test_certs.h"
#include "kube_test_util.h"
#include "test_webhook_server.h"

namespace dynmig::kube {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::MakePod;
using testing::TestWebhookServer;

constexpr char kScheduler[] = "system:serviceaccount:kube-system:dynmig-scheduler";

AdmissionWebhook Hook(const std::string& name, const std::string& url, bool mutating) {
  AdmissionWebhook hook;
  hook.name = name;
  hook.url = url;
  hook.mutating = mutating;
  hook.timeout = absl::Seconds(5);
  return hook;
}

// Mutates by adding dynmig.io/mutated=yes; validates: denies pods annotated test/deny (403, with
// a message) or test/deny-plain (no code: 400); records whether the mutation was visible.
class AdmissionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    hooks_ = std::make_unique<TestWebhookServer>();
    ASSERT_TRUE(hooks_->ok());
    hooks_->On("/mutate", [](const Object& request) {
      return testing::AddLabelResponse(request, "dynmig.io/mutated", "yes");
    });
    hooks_->On("/validate", [](const Object& request) {
      const Object& obj = request.value("object", Object());
      if (obj.is_object() && Annotation(obj, "test/deny")) {
        return Object{{"allowed", false},
                      {"status", {{"code", 403}, {"message", "pods with test/deny are refused"}}}};
      }
      if (obj.is_object() && Annotation(obj, "test/deny-plain")) {
        return Object{{"allowed", false}, {"status", {{"message", "plain no"}}}};
      }
      return Object{{"allowed", true}};
    });
    InMemoryApiServerOptions options = testing::FastServerOptions();
    options.token_users = {{"tok-alice", "alice"}, {"tok-sched", kScheduler}};
    auto server = InMemoryApiServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    // The webhook list is set after both servers run, as the local mode does.
    server_->SetAdmissionWebhooks({Hook("mutate.test", hooks_->url("/mutate"), true),
                                   Hook("validate.test", hooks_->url("/validate"), false)});
    alice_ = Client("tok-alice");
  }

  std::unique_ptr<RestKubeClient> Client(const std::string& token) {
    RestConfig config;
    config.server = server_->url();
    config.token = token;
    config.retry.max_attempts = 1;
    config.request_timeout = absl::Seconds(20);
    auto client = RestKubeClient::Create(config);
    EXPECT_TRUE(client.ok()) << client.status();
    return std::move(*client);
  }

  httplib::Result Raw(const std::string& method, const std::string& path, const std::string& body,
                      const std::string& token = "tok-alice",
                      const std::string& content_type = "application/json") {
    httplib::Client client(server_->url());
    httplib::Headers headers;
    if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
    if (method == "POST") return client.Post(path, headers, body, content_type);
    if (method == "PUT") return client.Put(path, headers, body, content_type);
    if (method == "PATCH") return client.Patch(path, headers, body, content_type);
    if (method == "DELETE") return client.Delete(path, headers, body, content_type);
    return client.Get(path, headers);
  }

  std::unique_ptr<TestWebhookServer> hooks_;
  std::unique_ptr<InMemoryApiServer> server_;
  std::unique_ptr<RestKubeClient> alice_;
};

TEST_F(AdmissionTest, MutatesThenValidatesWithTheReviewKubeApiserverSends) {
  auto created = alice_->CreatePod(MakePod("p1"));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(Label(*created, "dynmig.io/mutated"), "yes");
  auto stored = server_->store().Get(Resource::kPods, "default", "p1");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(Label(*stored, "dynmig.io/mutated"), "yes");

  EXPECT_THAT(hooks_->Paths(), ElementsAre("/mutate", "/validate"));
  const Object mutate = hooks_->RequestsTo("/mutate").at(0);
  EXPECT_FALSE(mutate.value("uid", "").empty());
  EXPECT_EQ(mutate["kind"], (Object{{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}));
  EXPECT_EQ(mutate["resource"], (Object{{"group", ""}, {"version", "v1"}, {"resource", "pods"}}));
  EXPECT_EQ(mutate["requestKind"], mutate["kind"]);
  EXPECT_EQ(mutate["requestResource"], mutate["resource"]);
  EXPECT_FALSE(mutate.contains("subResource"));
  EXPECT_EQ(mutate["operation"], "CREATE");
  EXPECT_EQ(mutate["name"], "p1");
  EXPECT_EQ(mutate["namespace"], "default");
  EXPECT_EQ(mutate["userInfo"]["username"], "alice");
  EXPECT_EQ(mutate["userInfo"]["groups"], Object::array({"system:authenticated"}));
  EXPECT_EQ(mutate["object"]["metadata"]["name"], "p1");
  EXPECT_TRUE(mutate["oldObject"].is_null());
  EXPECT_EQ(mutate["dryRun"], false);
  EXPECT_EQ(mutate["options"]["kind"], "CreateOptions");
  EXPECT_FALSE(Label(mutate["object"], "dynmig.io/mutated"));
  // The validating webhook sees the mutated object.
  const Object validate = hooks_->RequestsTo("/validate").at(0);
  EXPECT_EQ(Label(validate["object"], "dynmig.io/mutated"), "yes");
  EXPECT_NE(validate["uid"], mutate["uid"]);
}

// kube-apiserver decodes the body before admission and serves quantities canonically: a pod
// written with `nvidia.com/gpumem: 8000` reaches webhooks, storage, reads and watches as "8k".
TEST_F(AdmissionTest, QuantitiesAreCanonicalEverywhereAsInKubeApiserver) {
  Object pod = MakePod("q1");
  pod["spec"]["containers"][0]["resources"] = {
      {"limits", {{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem", 8000}, {"memory", "1024Mi"}}},
      {"requests", {{"nvidia.com/gpumem", "20000"}, {"cpu", 0.5}}}};
  pod["spec"]["initContainers"] = {{{"name", "init"},
                                    {"image", "busybox"},
                                    {"resources", {{"limits", {{"nvidia.com/gpumem", "19e3"}}}}}}};
  auto created = alice_->CreatePod(pod);
  ASSERT_TRUE(created.ok()) << created.status();
  const auto check = [](const Object& obj, const std::string& where) {
    const Object& c = obj["spec"]["containers"][0]["resources"];
    EXPECT_EQ(c["limits"]["nvidia.com/gpu"], "1") << where;
    EXPECT_EQ(c["limits"]["nvidia.com/gpumem"], "8k") << where;
    EXPECT_EQ(c["limits"]["memory"], "1Gi") << where;
    EXPECT_EQ(c["requests"]["nvidia.com/gpumem"], "20k") << where;
    EXPECT_EQ(c["requests"]["cpu"], "500m") << where;
    EXPECT_EQ(obj["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpumem"], "19e3")
        << where;
  };
  check(hooks_->RequestsTo("/mutate").at(0)["object"], "mutating webhook");
  check(hooks_->RequestsTo("/validate").at(0)["object"], "validating webhook");
  check(*created, "create response");
  auto got = alice_->GetPod("default", "q1");
  ASSERT_TRUE(got.ok());
  check(*got, "get");
  // Updates are canonicalised too (a PATCH reaches admission as the canonical object).
  auto patched = alice_->PatchPodAnnotations("default", "q1", {{"a", "b"}});
  ASSERT_TRUE(patched.ok()) << patched.status();
  check(hooks_->RequestsTo("/validate").back()["object"], "validating webhook on patch");
  // A value that is not a quantity fails the request before admission, naming it.
  Object bad = MakePod("q2");
  bad["spec"]["containers"][0]["resources"] = {{"limits", {{"nvidia.com/gpumem", "8 GB"}}}};
  const size_t calls = hooks_->Paths().size();
  auto refused = alice_->CreatePod(bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("nvidia.com/gpumem: quantities must match"));
  EXPECT_EQ(hooks_->Paths().size(), calls);
}

TEST_F(AdmissionTest, MutatingWebhooksRunInListOrderBeforeValidating) {
  hooks_->On("/mutate2", [](const Object& request) {
    // Sees the first webhook's label.
    const bool saw = Label(request["object"], "dynmig.io/mutated").has_value();
    return testing::AddLabelResponse(request, "second-saw-first", saw ? "true" : "false");
  });
  server_->SetAdmissionWebhooks({Hook("validate.test", hooks_->url("/validate"), false),
                                 Hook("mutate.test", hooks_->url("/mutate"), true),
                                 Hook("mutate2.test", hooks_->url("/mutate2"), true)});
  auto created = alice_->CreatePod(MakePod("p1"));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_THAT(hooks_->Paths(), ElementsAre("/mutate", "/mutate2", "/validate"));
  EXPECT_EQ(Label(*created, "second-saw-first"), "true");
  EXPECT_EQ(server_->admission_webhooks().size(), 3u);
}

TEST_F(AdmissionTest, DeniedWithTheWebhooksCodeAndKubeApiserversMessage) {
  Object pod = MakePod("bad");
  pod["metadata"]["annotations"] = {{"test/deny", "1"}};
  auto denied = alice_->CreatePod(pod);
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(KubeHttpCode(denied.status()), 403);
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(denied.status().message()),
              HasSubstr("admission webhook \"validate.test\" denied the request: pods with "
                        "test/deny are refused"));
  EXPECT_EQ(server_->store().Get(Resource::kPods, "default", "bad").status().code(),
            absl::StatusCode::kNotFound);

  // No code in the webhook's status: 400. The Status body as the HTTP client sees it.
  Object plain = MakePod("plain");
  plain["metadata"]["annotations"] = {{"test/deny-plain", "1"}};
  auto res = Raw("POST", "/api/v1/namespaces/default/pods", plain.dump());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  const Object status = Object::parse(res->body);
  EXPECT_EQ(status["kind"], "Status");
  EXPECT_EQ(status["code"], 400);
  EXPECT_EQ(status["message"], "admission webhook \"validate.test\" denied the request: plain no");
}

TEST_F(AdmissionTest, FailurePolicyFailAndIgnore) {
  // A port nobody listens on.
  TestWebhookServer gone;
  const std::string down_url = gone.url("/validate");
  gone.Stop();

  AdmissionWebhook fail = Hook("down.test", down_url, false);
  fail.failure_policy_fail = true;
  server_->SetAdmissionWebhooks({fail});
  auto refused = alice_->CreatePod(MakePod("p1"));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(KubeHttpCode(refused.status()), 500);
  EXPECT_EQ(KubeReason(refused.status()), "InternalError");
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("Internal error occurred: failed calling webhook \"down.test\": failed to "
                        "call webhook: Post \"" +
                        down_url + "\""));

  AdmissionWebhook ignore = fail;
  ignore.failure_policy_fail = false;
  server_->SetAdmissionWebhooks({ignore, Hook("mutate.test", hooks_->url("/mutate"), true)});
  auto created = alice_->CreatePod(MakePod("p2"));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(Label(*created, "dynmig.io/mutated"), "yes");
}

TEST_F(AdmissionTest, InvalidResponsesAreCallFailures) {
  hooks_->On("/wrong-uid", [](const Object&) {
    return Object{{"uid", "nope"}, {"allowed", true}};
  });
  hooks_->On("/not-json", [](const Object&) { return Object{{"__raw", "{oops"}}; });
  hooks_->On("/http-500", [](const Object&) {
    return Object{{"__raw", "boom"}, {"__status", 500}};
  });
  // The slow webhook answers only when the test is done with it (or after a minute): every call
  // to it outlasts the 300 ms the API server gives it.
  auto release = std::make_shared<absl::Notification>();
  const absl::Cleanup released = [release] { release->Notify(); };
  hooks_->On("/slow", [release](const Object&) {
    release->WaitForNotificationWithTimeout(absl::Minutes(1));
    return Object{{"allowed", true}};
  });
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/wrong-uid", "expected response.uid="},
      {"/not-json", "the webhook response: invalid JSON"},
      {"/http-500", "received HTTP 500"},
      {"/slow", "failed to call webhook"},
  };
  int i = 0;
  for (const auto& [path, want] : cases) {
    AdmissionWebhook hook = Hook("bad.test", hooks_->url(path), false);
    hook.timeout = absl::Milliseconds(300);
    server_->SetAdmissionWebhooks({hook});
    auto refused = alice_->CreatePod(MakePod(fmt::format("p{}", i++)));
    ASSERT_FALSE(refused.ok()) << path;
    EXPECT_EQ(KubeHttpCode(refused.status()), 500) << path;
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr("failed calling webhook \"bad.test\""))
        << path;
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr(want)) << path;
    hook.failure_policy_fail = false;
    server_->SetAdmissionWebhooks({hook});
    EXPECT_TRUE(alice_->CreatePod(MakePod(fmt::format("p{}", i++))).ok()) << path;
  }
}

TEST_F(AdmissionTest, ValidatingWebhookMayNotReturnAPatch) {
  // The mutating handler, configured as a validating webhook.
  server_->SetAdmissionWebhooks({Hook("sneaky.test", hooks_->url("/mutate"), false)});
  auto refused = alice_->CreatePod(MakePod("p1"));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(KubeHttpCode(refused.status()), 500);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("failed calling webhook \"sneaky.test\": validating webhook may not "
                        "return response.patch"));
  // With failurePolicy Ignore the webhook is skipped and its patch not applied.
  AdmissionWebhook ignore = Hook("sneaky.test", hooks_->url("/mutate"), false);
  ignore.failure_policy_fail = false;
  server_->SetAdmissionWebhooks({ignore});
  auto created = alice_->CreatePod(MakePod("p2"));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_FALSE(Label(*created, "dynmig.io/mutated"));
}

TEST_F(AdmissionTest, ExcludedNamespacesAndUsersSkipTheWebhook) {
  AdmissionWebhook hook = Hook("mutate.test", hooks_->url("/mutate"), true);
  hook.excluded_namespaces = {"kube-system"};
  hook.excluded_users = {kScheduler};
  server_->SetAdmissionWebhooks({hook});

  auto system = alice_->CreatePod(MakePod("in-kube-system", "kube-system"));
  ASSERT_TRUE(system.ok()) << system.status();
  EXPECT_FALSE(Label(*system, "dynmig.io/mutated"));
  auto scheduler = Client("tok-sched")->CreatePod(MakePod("by-scheduler"));
  ASSERT_TRUE(scheduler.ok()) << scheduler.status();
  EXPECT_FALSE(Label(*scheduler, "dynmig.io/mutated"));
  EXPECT_TRUE(hooks_->Paths().empty());

  auto normal = alice_->CreatePod(MakePod("normal"));
  ASSERT_TRUE(normal.ok()) << normal.status();
  EXPECT_EQ(Label(*normal, "dynmig.io/mutated"), "yes");
  EXPECT_EQ(hooks_->Paths().size(), 1u);
}

TEST_F(AdmissionTest, UsersFromBearerTokens) {
  // Unknown token: 401 (token_users is set).
  auto stranger = Client("tok-unknown")->CreatePod(MakePod("p0"));
  ASSERT_FALSE(stranger.ok());
  EXPECT_EQ(KubeHttpCode(stranger.status()), 401);
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kUnauthenticated);
  auto get = Raw("GET", "/api/v1/pods", "", "tok-unknown");
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 401);

  ASSERT_TRUE(Client("tok-sched")->CreatePod(MakePod("p1")).ok());
  ASSERT_TRUE(Client("")->CreatePod(MakePod("p2")).ok());
  const auto requests = hooks_->RequestsTo("/mutate");
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0]["userInfo"]["username"], kScheduler);
  EXPECT_EQ(requests[1]["userInfo"]["username"], "system:anonymous");
  EXPECT_EQ(requests[1]["userInfo"]["groups"], Object::array({"system:unauthenticated"}));

  // Token users can change at runtime; the old bearer_token check still works alongside.
  server_->SetTokenUsers({{"tok-bob", "bob"}});
  EXPECT_EQ(KubeHttpCode(alice_->ListPods({}).status()), 401);
  ASSERT_TRUE(Client("tok-bob")->CreatePod(MakePod("p3")).ok());
  EXPECT_EQ(hooks_->RequestsTo("/mutate").back()["userInfo"]["username"], "bob");
  server_->SetBearerToken("tok-admin");
  EXPECT_EQ(KubeHttpCode(Client("")->ListPods({}).status()), 401);
  ASSERT_TRUE(Client("tok-admin")->CreatePod(MakePod("p4")).ok());
  EXPECT_EQ(hooks_->RequestsTo("/mutate").back()["userInfo"]["username"], "system:admin");
  EXPECT_TRUE(Client("tok-bob")->ListPods({}).ok());
}

TEST_F(AdmissionTest, NoTokenChecksMeansAnyTokenIsAnonymous) {
  server_->SetTokenUsers({});
  ASSERT_TRUE(Client("whatever")->CreatePod(MakePod("p1")).ok());
  EXPECT_EQ(hooks_->RequestsTo("/mutate").back()["userInfo"]["username"], "system:anonymous");
}

TEST_F(AdmissionTest, PatchAndPutAreUpdatesWithOldObject) {
  ASSERT_TRUE(server_->store().Create(Resource::kPods, "default", MakePod("p1")).ok());
  auto patched = alice_->PatchPodAnnotations("default", "p1", {{"note", "hello"}});
  ASSERT_TRUE(patched.ok()) << patched.status();
  EXPECT_EQ(Label(*patched, "dynmig.io/mutated"), "yes");  // the mutation is stored
  EXPECT_EQ(Annotation(*patched, "note"), "hello");
  auto requests = hooks_->RequestsTo("/mutate");
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0]["operation"], "UPDATE");
  EXPECT_EQ(requests[0]["options"]["kind"], "PatchOptions");
  EXPECT_EQ(requests[0]["name"], "p1");
  EXPECT_FALSE(Annotation(requests[0]["oldObject"], "note"));
  EXPECT_EQ(Annotation(requests[0]["object"], "note"), "hello");
  EXPECT_EQ(requests[0]["oldObject"]["metadata"]["uid"], requests[0]["object"]["metadata"]["uid"]);

  // A denied patch changes nothing.
  auto denied = alice_->PatchPodAnnotations("default", "p1", {{"test/deny", "1"}});
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(KubeHttpCode(denied.status()), 403);
  EXPECT_FALSE(Annotation(*server_->store().Get(Resource::kPods, "default", "p1"), "test/deny"));

  // PUT.
  Object pod = *server_->store().Get(Resource::kPods, "default", "p1");
  pod["metadata"]["labels"]["tier"] = "gpu";
  auto updated = alice_->Update(Resource::kPods, pod, "");
  ASSERT_TRUE(updated.ok()) << updated.status();
  requests = hooks_->RequestsTo("/mutate");
  EXPECT_EQ(requests.back()["operation"], "UPDATE");
  EXPECT_EQ(requests.back()["options"]["kind"], "UpdateOptions");
  EXPECT_FALSE(Label(requests.back()["oldObject"], "tier"));
  EXPECT_EQ(Label(requests.back()["object"], "tier"), "gpu");
}

TEST_F(AdmissionTest, OperationsAreMatched) {
  AdmissionWebhook hook = Hook("validate.test", hooks_->url("/validate"), false);
  hook.operations = {"CREATE"};
  server_->SetAdmissionWebhooks({hook});
  ASSERT_TRUE(alice_->CreatePod(MakePod("p1")).ok());
  ASSERT_TRUE(alice_->PatchPodAnnotations("default", "p1", {{"a", "b"}}).ok());
  ASSERT_TRUE(alice_->DeletePod("default", "p1").ok());
  EXPECT_EQ(hooks_->Paths().size(), 1u);

  hook.operations = {"DELETE"};
  server_->SetAdmissionWebhooks({hook});
  ASSERT_TRUE(server_->store().Create(Resource::kPods, "default", MakePod("p2")).ok());
  ASSERT_TRUE(alice_->DeletePod("default", "p2").ok());
  const auto requests = hooks_->RequestsTo("/validate");
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[1]["operation"], "DELETE");
  EXPECT_TRUE(requests[1]["object"].is_null());
  EXPECT_EQ(requests[1]["oldObject"]["metadata"]["name"], "p2");
  EXPECT_EQ(requests[1]["options"]["kind"], "DeleteOptions");
}

TEST_F(AdmissionTest, SubresourcesNeedTheirOwnRule) {
  AdmissionWebhook hook = Hook("validate.test", hooks_->url("/validate"), false);
  hook.operations = {"*"};
  server_->SetAdmissionWebhooks({hook});
  ASSERT_TRUE(server_->store().Create(Resource::kPods, "default", MakePod("p1")).ok());
  ASSERT_TRUE(server_->store().Create(Resource::kNodes, "", testing::MakeNode("n1")).ok());
  // A rule naming only "pods" gets neither status nor binding requests.
  ASSERT_TRUE(alice_->PatchPodStatus("default", "p1", {{"status", {{"phase", "Running"}}}}).ok());
  ASSERT_TRUE(alice_->BindPod("default", "p1", "n1", "").ok());
  EXPECT_TRUE(hooks_->Paths().empty());

  hook.resources = {"pods/status"};
  server_->SetAdmissionWebhooks({hook});
  ASSERT_TRUE(alice_->PatchPodStatus("default", "p1", {{"status", {{"phase", "Succeeded"}}}}).ok());
  ASSERT_TRUE(alice_->PatchPodAnnotations("default", "p1", {{"a", "b"}}).ok());  // main: no
  auto requests = hooks_->RequestsTo("/validate");
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0]["subResource"], "status");
  EXPECT_EQ(requests[0]["requestSubResource"], "status");
  EXPECT_EQ(requests[0]["operation"], "UPDATE");
  EXPECT_EQ(requests[0]["object"]["status"]["phase"], "Succeeded");

  hook.resources = {"pods/*"};
  server_->SetAdmissionWebhooks({hook});
  ASSERT_TRUE(alice_->PatchPodAnnotations("default", "p1", {{"c", "d"}}).ok());
  EXPECT_EQ(hooks_->RequestsTo("/validate").size(), 2u);
  // Other resources are not matched by "pods".
  hook.resources = {"pods"};
  server_->SetAdmissionWebhooks({hook});
  ASSERT_TRUE(alice_->PatchNodeAnnotations("n1", {{"a", "b"}}).ok());
  EXPECT_EQ(hooks_->RequestsTo("/validate").size(), 2u);
}

// pods/binding is reviewed as kube-apiserver reviews it: a CREATE whose kind is Binding, resource
// pods, subresource binding, named after the pod; a denial leaves the pod unbound.
TEST_F(AdmissionTest, BindingsAreAdmittedAsACreateOfTheBinding) {
  AdmissionWebhook hook = Hook("validate.test", hooks_->url("/validate"), false);
  hook.operations = {"CREATE"};
  hook.resources = {"pods/binding"};
  server_->SetAdmissionWebhooks({hook});
  ASSERT_TRUE(server_->store().Create(Resource::kPods, "default", MakePod("p1")).ok());
  ASSERT_TRUE(server_->store().Create(Resource::kPods, "default", MakePod("p2")).ok());
  ASSERT_TRUE(server_->store().Create(Resource::kNodes, "", testing::MakeNode("n1")).ok());
  ASSERT_TRUE(alice_->BindPod("default", "p1", "n1", "").ok());
  auto requests = hooks_->RequestsTo("/validate");
  ASSERT_EQ(requests.size(), 1u);
  const Object& r = requests[0];
  EXPECT_EQ(r["kind"], (Object{{"group", ""}, {"version", "v1"}, {"kind", "Binding"}}));
  EXPECT_EQ(r["resource"], (Object{{"group", ""}, {"version", "v1"}, {"resource", "pods"}}));
  EXPECT_EQ(r["subResource"], "binding");
  EXPECT_EQ(r["operation"], "CREATE");
  EXPECT_EQ(r["name"], "p1");
  EXPECT_EQ(r["namespace"], "default");
  EXPECT_EQ(r["userInfo"]["username"], "alice");
  EXPECT_EQ(r["object"]["kind"], "Binding");
  EXPECT_EQ(r["object"]["target"]["name"], "n1");
  EXPECT_EQ(NodeName(*server_->store().Get(Resource::kPods, "default", "p1")), "n1");

  // Denied: not bound, the webhook's message and code.
  const Object binding = {{"apiVersion", "v1"},
                          {"kind", "Binding"},
                          {"metadata", {{"name", "p2"}, {"annotations", {{"test/deny", "1"}}}}},
                          {"target", {{"kind", "Node"}, {"name", "n1"}}}};
  auto res = Raw("POST", "/api/v1/namespaces/default/pods/p2/binding", binding.dump());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 403) << res->body;
  EXPECT_THAT(res->body, HasSubstr("pods with test/deny are refused"));
  EXPECT_EQ(NodeName(*server_->store().Get(Resource::kPods, "default", "p2")), "");
}

TEST_F(AdmissionTest, DryRunIsAdmittedAndNotStored) {
  auto res = Raw("POST", "/api/v1/namespaces/default/pods?dryRun=All", MakePod("dry").dump());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 201) << res->body;
  const Object returned = Object::parse(res->body);
  EXPECT_EQ(Label(returned, "dynmig.io/mutated"), "yes");
  EXPECT_EQ(hooks_->RequestsTo("/mutate").at(0)["dryRun"], true);
  EXPECT_EQ(hooks_->RequestsTo("/mutate").at(0)["options"]["dryRun"], Object::array({"All"}));
  EXPECT_EQ(server_->store().Get(Resource::kPods, "default", "dry").status().code(),
            absl::StatusCode::kNotFound);

  ASSERT_TRUE(server_->store().Create(Resource::kPods, "default", MakePod("p1")).ok());
  const int64_t rv = server_->store().resource_version();
  auto patch =
      Raw("PATCH", "/api/v1/namespaces/default/pods/p1?dryRun=All",
          R"({"metadata":{"labels":{"x":"y"}}})", "tok-alice", "application/merge-patch+json");
  ASSERT_TRUE(patch);
  EXPECT_EQ(patch->status, 200) << patch->body;
  EXPECT_EQ(Label(Object::parse(patch->body), "x"), "y");
  auto del = Raw("DELETE", "/api/v1/namespaces/default/pods/p1?dryRun=All", "");
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 200) << del->body;
  EXPECT_EQ(server_->store().resource_version(), rv);
  EXPECT_FALSE(Label(*server_->store().Get(Resource::kPods, "default", "p1"), "x"));

  auto bad = Raw("POST", "/api/v1/namespaces/default/pods?dryRun=Some", MakePod("d2").dump());
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
}

TEST_F(AdmissionTest, WarningsReachTheClient) {
  hooks_->On("/warn", [](const Object&) {
    return Object{{"allowed", true}, {"warnings", {"GPU pods should set a memory request"}}};
  });
  server_->SetAdmissionWebhooks({Hook("warn.test", hooks_->url("/warn"), false)});
  auto res = Raw("POST", "/api/v1/namespaces/default/pods", MakePod("p1").dump());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 201);
  EXPECT_EQ(res->get_header_value("Warning"), "299 - \"GPU pods should set a memory request\"");
}

TEST_F(AdmissionTest, StorePathIsNotAdmitted) {
  ASSERT_TRUE(server_->store().Create(Resource::kPods, "default", MakePod("p1")).ok());
  EXPECT_TRUE(hooks_->Paths().empty());
}

TEST(AdmissionTlsTest, HttpsWebhookVerifiedAgainstTheCa) {
  const auto dir =
      std::filesystem::temp_directory_path() / fmt::format("dynmig-admission-{}", getpid());
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  const auto ca = testing::MakeCert("webhook-ca", nullptr, true, nullptr, nullptr, 1);
  const auto cert =
      testing::MakeCert("webhook", &ca, false, "IP:127.0.0.1,DNS:localhost", "serverAuth", 2);
  const auto other = testing::MakeCert("other-ca", nullptr, true, nullptr, nullptr, 3);
  TestWebhookServer hooks(write("tls.crt", cert.cert_pem), write("tls.key", cert.key_pem));
  ASSERT_TRUE(hooks.ok());
  hooks.On("/mutate",
           [](const Object& request) { return testing::AddLabelResponse(request, "tls", "ok"); });
  ASSERT_EQ(hooks.url("/mutate").rfind("https://", 0), 0u);

  AdmissionWebhook hook = Hook("tls.test", hooks.url("/mutate"), true);
  hook.ca_file = write("ca.crt", ca.cert_pem);
  InMemoryApiServerOptions options = testing::FastServerOptions();
  options.admission_webhooks = {hook};
  auto server = InMemoryApiServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = testing::MakeClient((*server)->url(), nullptr, 1);
  auto created = client->CreatePod(MakePod("p1"));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(Label(*created, "tls"), "ok");

  // Signed by someone else: the call fails (failurePolicy Fail: 500).
  hook.ca_file = write("other.crt", other.cert_pem);
  (*server)->SetAdmissionWebhooks({hook});
  auto refused = client->CreatePod(MakePod("p2"));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(KubeHttpCode(refused.status()), 500);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("failed calling webhook \"tls.test\""));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("certificate"));
  server->reset();
  hooks.Stop();
  std::filesystem::remove_all(dir);
}

TEST(WebhookMatchesTest, RulesLikeKubeApiserver) {
  AdmissionWebhook hook;
  hook.operations = {"CREATE"};
  hook.resources = {"pods"};
  AdmissionAttributes attrs;
  attrs.operation = "CREATE";
  attrs.resource = Resource::kPods;
  attrs.ns = "default";
  attrs.user = {"alice", {}};
  EXPECT_TRUE(WebhookMatches(hook, attrs));
  attrs.subresource = "status";
  EXPECT_FALSE(WebhookMatches(hook, attrs));
  hook.resources = {"*/*"};
  EXPECT_TRUE(WebhookMatches(hook, attrs));
  hook.resources = {"*"};
  EXPECT_FALSE(WebhookMatches(hook, attrs));
  attrs.subresource = "";
  EXPECT_TRUE(WebhookMatches(hook, attrs));
  attrs.operation = "DELETE";
  EXPECT_FALSE(WebhookMatches(hook, attrs));
  hook.operations = {"*"};
  EXPECT_TRUE(WebhookMatches(hook, attrs));
  attrs.resource = Resource::kNodes;
  attrs.ns = "";
  hook.resources = {"pods"};
  EXPECT_FALSE(WebhookMatches(hook, attrs));
  // Namespaces are matched by their own name.
  hook.resources = {"namespaces"};
  hook.excluded_namespaces = {"kube-system"};
  attrs.resource = Resource::kNamespaces;
  attrs.name = "kube-system";
  EXPECT_FALSE(WebhookMatches(hook, attrs));
  attrs.name = "gpu-jobs";
  EXPECT_TRUE(WebhookMatches(hook, attrs));
}

}  // namespace
}  // namespace dynmig::kube
