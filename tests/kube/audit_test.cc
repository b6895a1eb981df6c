// The audit table of the in-memory API server: kube-apiserver's RequestInfo mapping from method
// and path to RBAC verb, group, resource, subresource, namespace and name; the bounded table; and
// the server recording the calls of each user (faulted calls too, probes and bad tokens not);
// faults aimed at one user.
#include "kube/audit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "kube/in_memory_api_server.h"
#include "kube_test_util.h"

namespace dynmig::kube {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

struct Case {
  std::string method;
  std::string path;
  std::string watch;
  std::string field_selector;
  // Expected.
  std::string verb;
  std::string group;
  std::string resource;
  std::string subresource;
  std::string ns;
  std::string name;
};

class RequestAttributesTest : public ::testing::TestWithParam<Case> {};

TEST_P(RequestAttributesTest, MapsLikeKubeApiserver) {
  const Case& c = GetParam();
  RequestAttributes a = ParseRequestAttributes(c.method, c.path, c.watch, c.field_selector);
  const std::string what = c.method + " " + c.path + "?watch=" + c.watch;
  EXPECT_TRUE(a.resource_request) << what;
  EXPECT_EQ(a.verb, c.verb) << what;
  EXPECT_EQ(a.api_group, c.group) << what;
  EXPECT_EQ(a.resource, c.resource) << what;
  EXPECT_EQ(a.subresource, c.subresource) << what;
  EXPECT_EQ(a.ns, c.ns) << what;
  EXPECT_EQ(a.name, c.name) << what;
  EXPECT_THAT(a.path, IsEmpty()) << what;
}

INSTANTIATE_TEST_SUITE_P(
    Paths, RequestAttributesTest,
    ::testing::Values(
        // get vs list vs watch.
        Case{"GET", "/api/v1/namespaces/default/pods/p1", "", "", "get", "", "pods", "", "default",
             "p1"},
        Case{"GET", "/api/v1/pods", "", "", "list", "", "pods", "", "", ""},
        Case{"GET", "/api/v1/pods", "true", "", "watch", "", "pods", "", "", ""},
        Case{"GET", "/api/v1/pods", "1", "", "watch", "", "pods", "", "", ""},
        Case{"GET", "/api/v1/pods", "false", "", "list", "", "pods", "", "", ""},
        Case{"GET", "/api/v1/namespaces/default/pods", "", "", "list", "", "pods", "", "default",
             ""},
        // A fieldSelector on metadata.name names the object (resourceNames apply to it).
        Case{"GET", "/api/v1/nodes", "true", "metadata.name=node-a", "watch", "", "nodes", "", "",
             "node-a"},
        Case{"GET", "/api/v1/pods", "", "spec.nodeName=node-a,metadata.name==p", "list", "", "pods",
             "", "", "p"},
        Case{"GET", "/api/v1/pods", "", "spec.nodeName=node-a", "list", "", "pods", "", "", ""},
        Case{"GET", "/api/v1/pods", "", "metadata.name!=p", "list", "", "pods", "", "", ""},
        // The deprecated watch path.
        Case{"GET", "/api/v1/watch/namespaces/default/pods", "", "", "watch", "", "pods", "",
             "default", ""},
        Case{"GET", "/api/v1/watch/nodes/node-a", "", "", "watch", "", "nodes", "", "", "node-a"},
        // Writes and subresources.
        Case{"POST", "/api/v1/namespaces/default/pods", "", "", "create", "", "pods", "", "default",
             ""},
        Case{"POST", "/api/v1/namespaces/default/pods/p1/binding", "", "", "create", "", "pods",
             "binding", "default", "p1"},
        Case{"POST", "/api/v1/namespaces/default/pods/p1/eviction", "", "", "create", "", "pods",
             "eviction", "default", "p1"},
        Case{"PATCH", "/api/v1/namespaces/default/pods/p1/status", "", "", "patch", "", "pods",
             "status", "default", "p1"},
        Case{"PUT", "/api/v1/nodes/node-a/status", "", "", "update", "", "nodes", "status", "",
             "node-a"},
        Case{"PATCH", "/api/v1/nodes/node-a", "", "", "patch", "", "nodes", "", "", "node-a"},
        Case{"DELETE", "/api/v1/namespaces/default/pods/p1", "", "", "delete", "", "pods", "",
             "default", "p1"},
        Case{"DELETE", "/api/v1/namespaces/default/pods", "", "", "deletecollection", "", "pods",
             "", "default", ""},
        Case{"POST", "/api/v1/namespaces/default/events", "", "", "create", "", "events", "",
             "default", ""},
        // Named groups.
        Case{"PUT", "/apis/coordination.k8s.io/v1/namespaces/dynmig-system/leases/dynmig-scheduler",
             "", "", "update", "coordination.k8s.io", "leases", "", "dynmig-system",
             "dynmig-scheduler"},
        Case{"GET", "/apis/coordination.k8s.io/v1/namespaces/dynmig-system/leases", "", "", "list",
             "coordination.k8s.io", "leases", "", "dynmig-system", ""},
        Case{"PATCH",
             "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/dynmig-webhook",
             "", "", "patch", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "",
             "", "dynmig-webhook"},
        // Namespaces are their own namespace; status and finalize are their subresources.
        Case{"GET", "/api/v1/namespaces", "", "", "list", "", "namespaces", "", "", ""},
        Case{"GET", "/api/v1/namespaces/dynmig-system", "", "", "get", "", "namespaces", "",
             "dynmig-system", "dynmig-system"},
        Case{"PUT", "/api/v1/namespaces/old/finalize", "", "", "update", "", "namespaces",
             "finalize", "old", "old"},
        Case{"GET", "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication",
             "", "", "get", "", "configmaps", "", "kube-system",
             "extension-apiserver-authentication"}));

TEST(RequestAttributes, DiscoveryAndOtherPathsAreNonResourceRequests) {
  for (const std::string path :
       {"/api", "/api/v1", "/apis", "/apis/coordination.k8s.io", "/apis/coordination.k8s.io/v1",
        "/version", "/openapi/v3", "/openapi/v3/api/v1", "/healthz", "/"}) {
    RequestAttributes a = ParseRequestAttributes("GET", path);
    EXPECT_FALSE(a.resource_request) << path;
    EXPECT_EQ(a.verb, "get") << path;
    EXPECT_EQ(a.path, path);
    EXPECT_THAT(a.resource, IsEmpty()) << path;
  }
  EXPECT_EQ(ParseRequestAttributes("POST", "/apis").verb, "post");
}

TEST(RequestAttributes, RbacResourceJoinsSubresources) {
  EXPECT_EQ(RbacResource("pods", ""), "pods");
  EXPECT_EQ(RbacResource("pods", "binding"), "pods/binding");
}

RequestAttributes Attrs(std::string verb, std::string resource, std::string ns, std::string name,
                        std::string subresource = "") {
  RequestAttributes a;
  a.resource_request = true;
  a.verb = std::move(verb);
  a.resource = std::move(resource);
  a.ns = std::move(ns);
  a.name = std::move(name);
  a.subresource = std::move(subresource);
  return a;
}

TEST(AuditTrail, OneRecordPerCallShapeWithCountsAndNames) {
  AuditTrail trail;
  trail.Record("alice", Attrs("get", "pods", "default", "p1"), 200);
  trail.Record("alice", Attrs("get", "pods", "default", "p2"), 404);
  trail.Record("alice", Attrs("get", "pods", "default", "p1"), 200);
  trail.Record("alice", Attrs("create", "pods", "default", "p1", "binding"), 201);
  trail.Record("bob", Attrs("get", "pods", "default", "p1"), 200);
  trail.Record("alice", Attrs("list", "pods", "", ""), 200);
  const auto records = trail.Records();
  ASSERT_EQ(records.size(), 4u);
  // Sorted by user, verb, group, resource, subresource, namespace.
  EXPECT_EQ(records[0].Describe(), "create pods/binding in default (names: p1)");
  EXPECT_EQ(records[1].Describe(), "get pods in default (names: p1, p2)");
  EXPECT_EQ(records[1].count, 3);
  EXPECT_EQ(records[1].failures, 1);
  EXPECT_THAT(records[1].names, ElementsAre("p1", "p2"));
  EXPECT_FALSE(records[1].unnamed);
  EXPECT_EQ(records[2].Describe(), "list pods (cluster)");
  EXPECT_TRUE(records[2].unnamed);
  EXPECT_EQ(records[3].user, "bob");
  trail.Clear();
  EXPECT_THAT(trail.Records(), IsEmpty());
}

TEST(AuditTrail, BoundedInRecordsAndNames) {
  AuditTrail trail(/*max_records=*/2, /*max_names=*/2);
  for (int i = 0; i < 10; ++i) {
    trail.Record("alice", Attrs("get", "pods", "default", "p" + std::to_string(i)), 200);
  }
  trail.Record("alice", Attrs("list", "pods", "", ""), 200);
  trail.Record("alice", Attrs("list", "nodes", "", ""), 200);  // a third record: dropped
  trail.Record("alice", Attrs("list", "nodes", "", ""), 200);
  const auto records = trail.Records();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].count, 10);
  EXPECT_THAT(records[0].names, ElementsAre("p0", "p1"));
  EXPECT_TRUE(records[0].more_names);
  EXPECT_EQ(records[0].Describe(), "get pods in default (names: p0, p1, ...)");
  EXPECT_EQ(trail.dropped(), 2);
}

class AuditServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InMemoryApiServerOptions options = testing::FastServerOptions();
    options.token_users = {{"tok-alice", "alice"}, {"tok-bob", "bob"}};
    auto server = InMemoryApiServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  httplib::Result Raw(const std::string& method, const std::string& path, const std::string& token,
                      const std::string& body = "",
                      const std::string& content_type = "application/json") {
    httplib::Client client(server_->url());
    httplib::Headers headers;
    if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
    if (method == "POST") return client.Post(path, headers, body, content_type);
    if (method == "PATCH") return client.Patch(path, headers, body, content_type);
    if (method == "DELETE") return client.Delete(path, headers);
    return client.Get(path, headers);
  }

  std::vector<std::string> Described() {
    std::vector<std::string> out;
    for (const AuditRecord& r : server_->AuditLog()) {
      out.push_back(r.user + ": " + r.Describe() + " x" + std::to_string(r.count) +
                    (r.failures > 0 ? " failed " + std::to_string(r.failures) : ""));
    }
    return out;
  }

  std::unique_ptr<InMemoryApiServer> server_;
};

TEST_F(AuditServerTest, RecordsWhoCalledWhatAsAnAuthorizerSeesIt) {
  const std::string pod = testing::MakePod("p1").dump();
  ASSERT_EQ(Raw("POST", "/api/v1/namespaces/default/pods", "tok-alice", pod)->status, 201);
  ASSERT_EQ(Raw("GET", "/api/v1/namespaces/default/pods/p1", "tok-bob")->status, 200);
  ASSERT_EQ(Raw("GET", "/api/v1/namespaces/default/pods/nope", "tok-bob")->status, 404);
  ASSERT_EQ(Raw("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a", "tok-bob")->status,
            200);
  ASSERT_EQ(Raw("PATCH", "/api/v1/namespaces/default/pods/p1", "tok-bob",
                R"({"metadata":{"labels":{"a":"b"}}})", "application/merge-patch+json")
                ->status,
            200);
  ASSERT_EQ(Raw("POST", "/api/v1/namespaces/default/pods/p1/binding", "tok-bob",
                R"({"apiVersion":"v1","kind":"Binding","metadata":{"name":"p1"},)"
                R"("target":{"kind":"Node","name":"node-a"}})")
                ->status,
            201);
  ASSERT_EQ(Raw("GET", "/api/v1", "tok-bob")->status, 200);
  // Not recorded: probes, admin paths, an unknown token.
  ASSERT_EQ(Raw("GET", "/healthz", "")->status, 200);
  ASSERT_EQ(Raw("GET", "/_dynmig/stats", "")->status, 200);
  ASSERT_EQ(Raw("GET", "/api/v1/pods", "tok-mallory")->status, 401);

  EXPECT_THAT(
      Described(),
      ElementsAre("alice: create pods in default x1",
                  "bob: create pods/binding in default (names: p1) x1", "bob: get /api/v1 x1",
                  "bob: get pods in default (names: nope, p1) x2 failed 1",
                  "bob: list pods (cluster) x1", "bob: patch pods in default (names: p1) x1"));
  server_->ClearAuditLog();
  EXPECT_THAT(server_->AuditLog(), IsEmpty());
}

TEST_F(AuditServerTest, RecordsWatchesAndFaultedCalls) {
  ASSERT_EQ(Raw("GET", "/api/v1/nodes?watch=true&timeoutSeconds=1", "tok-alice")->status, 200);
  FaultSpec fault;
  fault.path_prefix = "/apis/coordination.k8s.io";
  fault.status = 503;
  server_->AddFault(fault);
  ASSERT_EQ(
      Raw("GET", "/apis/coordination.k8s.io/v1/namespaces/dynmig-system/leases/l1", "tok-alice")
          ->status,
      503);
  // The lease does not exist: 404, recorded too.
  ASSERT_EQ(
      Raw("GET", "/apis/coordination.k8s.io/v1/namespaces/dynmig-system/leases/l1", "tok-alice")
          ->status,
      404);
  EXPECT_THAT(Described(), ElementsAre("alice: get coordination.k8s.io:leases in dynmig-system "
                                       "(names: l1) x2 failed 2",
                                       "alice: watch nodes (cluster) x1"));
}

TEST_F(AuditServerTest, FaultsCanTargetOneUser) {
  FaultSpec fault;
  fault.method = "GET";
  fault.path_prefix = "/api/v1/nodes";
  fault.user = "bob";
  fault.status = 409;
  server_->AddFault(fault);
  EXPECT_EQ(Raw("GET", "/api/v1/nodes", "tok-alice")->status, 200);
  EXPECT_EQ(Raw("GET", "/api/v1/nodes", "tok-bob")->status, 409);
  EXPECT_EQ(Raw("GET", "/api/v1/nodes", "tok-bob")->status, 200);  // count 1: used up
  auto spec = FaultSpecFromJson(Object{{"user", "bob"}});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->user, "bob");
}

TEST_F(AuditServerTest, CanBeTurnedOff) {
  InMemoryApiServerOptions options = testing::FastServerOptions();
  options.audit = false;
  auto server = InMemoryApiServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client client((*server)->url());
  ASSERT_EQ(client.Get("/api/v1/pods")->status, 200);
  EXPECT_THAT((*server)->AuditLog(), IsEmpty());
}

}  // namespace
}  // namespace dynmig::kube
