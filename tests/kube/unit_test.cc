// Pure pieces of the kube seam: selectors, patches, status mapping, object helpers, configs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "kube/api_status.h"
#include "kube/api_store.h"
#include "kube/object.h"
#include "kube/patch.h"
#include "kube/rest_config.h"
#include "kube/selector.h"
#include "kube/table.h"
#include "kube_test_util.h"

namespace dynmig::kube {
namespace {

using ::testing::HasSubstr;

Object WithLabels(std::map<std::string, std::string> labels) {
  Object obj = {{"metadata", {{"name", "x"}}}};
  for (const auto& [k, v] : labels) obj["metadata"]["labels"][k] = v;
  return obj;
}

TEST(LabelSelectorTest, AllOperators) {
  const Object obj = WithLabels({{"app", "web"}, {"tier", "gpu"}, {"rank", "5"}});
  auto match = [&](const std::string& text) {
    auto sel = LabelSelector::Parse(text);
    EXPECT_TRUE(sel.ok()) << text << ": " << sel.status();
    return sel.ok() && sel->Matches(obj);
  };
  EXPECT_TRUE(match(""));
  EXPECT_TRUE(match("app=web"));
  EXPECT_TRUE(match("app==web"));
  EXPECT_FALSE(match("app!=web"));
  EXPECT_TRUE(match("missing!=x"));  // != matches objects without the label
  EXPECT_TRUE(match("tier in (gpu, cpu)"));
  EXPECT_FALSE(match("tier notin (gpu,cpu)"));
  EXPECT_TRUE(match("missing notin (a)"));
  EXPECT_TRUE(match("app"));
  EXPECT_FALSE(match("!app"));
  EXPECT_TRUE(match("!missing"));
  EXPECT_TRUE(match("rank>4,rank<6"));
  EXPECT_FALSE(match("rank>5"));
  EXPECT_TRUE(match("app=web, tier in (gpu), !missing"));
  EXPECT_FALSE(match("app=web,tier=cpu"));
}

TEST(LabelSelectorTest, RejectsBadSyntax) {
  for (const char* bad : {"=web", "app in gpu", "app in (a", "app ~ b", "a,,b", "k>x"}) {
    auto sel = LabelSelector::Parse(bad);
    EXPECT_EQ(sel.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  // An empty value is a valid label value.
  auto empty = LabelSelector::Parse("app=");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->Matches(WithLabels({{"app", ""}})));
}

TEST(FieldSelectorTest, PodFields) {
  Object pod = testing::MakePod("p", "ns1", "node-1");
  pod["status"]["phase"] = "Running";
  auto sel = FieldSelector::Parse("spec.nodeName=node-1,status.phase!=Succeeded", Resource::kPods);
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_TRUE(sel->Matches(pod));
  EXPECT_EQ(sel->EqualsValue("spec.nodeName"), "node-1");
  auto other = FieldSelector::Parse("spec.nodeName==node-2", Resource::kPods);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->Matches(pod));
  auto unbound = FieldSelector::Parse("spec.nodeName=", Resource::kPods);
  ASSERT_TRUE(unbound.ok());
  EXPECT_FALSE(unbound->Matches(pod));
  EXPECT_TRUE(unbound->Matches(testing::MakePod("q")));
  auto ns = FieldSelector::Parse("metadata.namespace=ns1,metadata.name=p", Resource::kPods);
  ASSERT_TRUE(ns.ok());
  EXPECT_TRUE(ns->Matches(pod));
}

TEST(FieldSelectorTest, UnsupportedFieldIsRejectedLikeTheApiServer) {
  auto sel = FieldSelector::Parse("spec.priority=3", Resource::kPods);
  EXPECT_EQ(sel.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(sel.status().message()), HasSubstr("field label not supported"));
  auto node = FieldSelector::Parse("spec.unschedulable=false", Resource::kNodes);
  ASSERT_TRUE(node.ok());
  EXPECT_TRUE(node->Matches(testing::MakeNode("n")));
  EXPECT_EQ(FieldSelector::Parse("nonsense", Resource::kPods).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PatchTest, MergePatchDeletesWithNull) {
  Object obj = {{"metadata", {{"annotations", {{"a", "1"}, {"b", "2"}}}}}};
  auto out = ApplyMergePatch(obj, {{"metadata", {{"annotations", {{"a", nullptr}, {"c", "3"}}}}}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)["metadata"]["annotations"], Object({{"b", "2"}, {"c", "3"}}));
  EXPECT_EQ(ApplyMergePatch(obj, Object::array()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PatchTest, JsonPatchOpsAndFailures) {
  Object obj = {{"metadata", {{"annotations", {{"a/b", "1"}}}}}, {"status", {{"capacity", {}}}}};
  auto out = ApplyJsonPatch(
      obj, Object::parse(R"([{"op":"add","path":"/status/capacity/example.com~1foo","value":"4"},
                            {"op":"test","path":"/metadata/annotations/a~1b","value":"1"},
                            {"op":"remove","path":"/metadata/annotations/a~1b"}])"));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)["status"]["capacity"]["example.com/foo"], "4");
  EXPECT_TRUE((*out)["metadata"]["annotations"].empty());
  auto failed =
      ApplyJsonPatch(obj, Object::parse(R"([{"op":"test","path":"/metadata/annotations/a~1b",
                                             "value":"2"}])"));
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("JSON patch failed"));
}

TEST(PatchTest, StrategicMergeMergesContainersByName) {
  Object pod = testing::MakePod("p");
  pod["spec"]["containers"].push_back({{"name", "side"}, {"image", "envoy:1"}});
  pod["metadata"]["finalizers"] = {"a"};
  const Object patch = Object::parse(R"({
    "metadata": {"labels": {"x": "y"}, "finalizers": ["b"]},
    "spec": {"$setElementOrder/containers": [{"name": "main"}, {"name": "side"}],
             "containers": [{"name": "side", "image": "envoy:2"},
                            {"name": "new", "image": "n", "$patch": "merge"}]}})");
  auto out = ApplyStrategicMergePatch(pod, patch);
  ASSERT_TRUE(out.ok()) << out.status();
  const Object& containers = (*out)["spec"]["containers"];
  ASSERT_EQ(containers.size(), 3u);
  EXPECT_EQ(containers[0]["image"], "busybox");
  EXPECT_EQ(containers[1]["image"], "envoy:2");
  EXPECT_EQ(containers[2], Object({{"name", "new"}, {"image", "n"}}));
  EXPECT_FALSE((*out)["spec"].contains("$setElementOrder/containers"));
  EXPECT_EQ((*out)["metadata"]["finalizers"], Object({"a", "b"}));
  auto deleted = ApplyStrategicMergePatch(
      *out, Object::parse(R"({"spec":{"containers":[{"name":"new","$patch":"delete"}]},
                              "metadata":{"$deleteFromPrimitiveList/finalizers":["a"]}})"));
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ((*deleted)["spec"]["containers"].size(), 2u);
  EXPECT_EQ((*deleted)["metadata"]["finalizers"], Object({"b"}));
}

TEST(ApiStatusTest, HttpMapping) {
  const std::string conflict =
      R"({"kind":"Status","apiVersion":"v1","status":"Failure","message":"Operation cannot be fulfilled on pods \"p\": the object has been modified","reason":"Conflict","code":409})";
  absl::Status st = StatusFromHttp(409, conflict, "PATCH pods/p");
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(KubeReason(st), "Conflict");
  EXPECT_EQ(KubeHttpCode(st), 409);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("PATCH pods/p: HTTP 409 Conflict: Operation cannot be fulfilled"));
  EXPECT_EQ(
      StatusFromHttp(409, R"({"kind":"Status","reason":"AlreadyExists","code":409})", "").code(),
      absl::StatusCode::kAlreadyExists);
  const std::map<int, absl::StatusCode> expected = {
      {400, absl::StatusCode::kInvalidArgument},  {401, absl::StatusCode::kUnauthenticated},
      {403, absl::StatusCode::kPermissionDenied}, {404, absl::StatusCode::kNotFound},
      {410, absl::StatusCode::kOutOfRange},       {422, absl::StatusCode::kInvalidArgument},
      {429, absl::StatusCode::kUnavailable},      {500, absl::StatusCode::kUnavailable},
      {503, absl::StatusCode::kUnavailable},      {504, absl::StatusCode::kUnavailable}};
  for (const auto& [code, want] : expected) {
    EXPECT_EQ(StatusFromHttp(code, "", "").code(), want) << code;
  }
  // A non-Status body is quoted.
  EXPECT_THAT(std::string(StatusFromHttp(502, "<html>bad gateway</html>", "GET x").message()),
              HasSubstr("<html>bad gateway</html>"));
  absl::Status expired = StatusFromApiStatus(
      Object::parse(R"({"kind":"Status","code":410,"reason":"Expired","message":"too old"})"),
      "watch");
  EXPECT_EQ(expired.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(KubeReason(expired), "Expired");
}

TEST(ObjectTest, Accessors) {
  Object pod = testing::MakePod("p", "ns", "node-1", {{"app", "x"}});
  pod["metadata"]["annotations"] = {{"hami.io/bind-phase", "allocating"}};
  pod["metadata"]["resourceVersion"] = "42";
  pod["status"] = {{"phase", "Pending"}};
  EXPECT_EQ(Name(pod), "p");
  EXPECT_EQ(Namespace(pod), "ns");
  EXPECT_EQ(NodeName(pod), "node-1");
  EXPECT_EQ(Phase(pod), "Pending");
  EXPECT_EQ(ResourceVersionNumber(pod), 42);
  EXPECT_EQ(ObjectKey(pod), "ns/p");
  EXPECT_EQ(Annotation(pod, "hami.io/bind-phase"), "allocating");
  EXPECT_EQ(Annotation(pod, "nope"), std::nullopt);
  EXPECT_EQ(Labels(pod), (std::map<std::string, std::string>{{"app", "x"}}));
  EXPECT_FALSE(IsBeingDeleted(pod));
  EXPECT_EQ(ObjectKey(testing::MakeNode("n1")), "n1");
  EXPECT_EQ(StringAt(pod, "/metadata/annotations/hami.io~1bind-phase"), "allocating");
  // Wrong types read as empty, never throw.
  Object weird = {{"metadata", 5}, {"spec", {{"nodeName", 7}}}};
  EXPECT_EQ(Name(weird), "");
  EXPECT_EQ(NodeName(weird), "");
  EXPECT_TRUE(Annotations(Object("string")).empty());
}

TEST(ObjectTest, TimesAndEvents) {
  const absl::Time t = absl::FromUnixMicros(1767323045123456);
  EXPECT_EQ(Rfc3339(t), "2026-01-02T03:04:05Z");
  EXPECT_EQ(MicroTime(t), "2026-01-02T03:04:05.123456Z");
  auto parsed = ParseRfc3339("2026-01-02T03:04:05.123456Z");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, t);
  EXPECT_EQ(ParseRfc3339("yesterday").status().code(), absl::StatusCode::kInvalidArgument);
  Object pod = testing::MakePod("p", "ns");
  Object event = NewEvent(pod, "Warning", "FailedMig", "no placement", "dynmig-scheduler", t);
  EXPECT_EQ(Namespace(event), "ns");
  EXPECT_EQ(event["involvedObject"]["kind"], "Pod");
  EXPECT_EQ(event["involvedObject"]["name"], "p");
  EXPECT_EQ(event["reason"], "FailedMig");
  EXPECT_THAT(Name(event), ::testing::StartsWith("p."));
  EXPECT_EQ(HumanDuration(absl::Seconds(45)), "45s");
  EXPECT_EQ(HumanDuration(absl::Seconds(192)), "3m12s");
  EXPECT_EQ(HumanDuration(absl::Hours(5)), "5h");
  EXPECT_EQ(HumanDuration(absl::Hours(24 * 12)), "12d");
}

TEST(ObjectTest, ParseObjectNamesTheProblem) {
  auto bad = ParseObject(R"({"kind":"Pod",)", "response to GET /api/v1/pods/x");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("malformed JSON in response to GET /api/v1/pods/x"));
}

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("dynmig-kube-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const auto path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }
  std::filesystem::path dir_;
};

TEST_F(ConfigTest, KubeconfigWithInlineDataAndRelativeFiles) {
  const std::string yaml = R"(apiVersion: v1
kind: Config
current-context: prod
contexts:
- name: prod
  context: {cluster: c1, user: u1, namespace: gpu-jobs}
- name: dev
  context: {cluster: c2, user: u2}
clusters:
- name: c1
  cluster:
    server: https://10.0.0.1:6443/
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t
- name: c2
  cluster:
    server: http://127.0.0.1:8080
    certificate-authority: ca.crt
    insecure-skip-tls-verify: true
users:
- name: u1
  user:
    client-certificate-data: Y2VydA==
    client-key-data: a2V5
- name: u2
  user:
    tokenFile: token
)";
  const std::string path = Write("config", yaml);
  auto prod = LoadKubeconfig(path);
  ASSERT_TRUE(prod.ok()) << prod.status();
  EXPECT_EQ(prod->server, "https://10.0.0.1:6443");
  EXPECT_EQ(prod->ca_data, "-----BEGIN CERTIFICATE-----");
  EXPECT_EQ(prod->client_cert_data, "cert");
  EXPECT_EQ(prod->client_key_data, "key");
  EXPECT_EQ(prod->ns, "gpu-jobs");
  auto dev = LoadKubeconfig(path, "dev");
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_EQ(dev->ca_file, (dir_ / "ca.crt").string());
  EXPECT_TRUE(dev->insecure_skip_tls_verify);
  EXPECT_EQ(dev->token_file, (dir_ / "token").string());
  EXPECT_EQ(dev->ns, "default");
}

TEST_F(ConfigTest, KubeconfigErrorsNameTheProblem) {
  auto missing_ctx = ParseKubeconfig("current-context: nope\ncontexts: []\n", "");
  EXPECT_EQ(missing_ctx.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing_ctx.status().message()), HasSubstr("no context named 'nope'"));
  auto exec = ParseKubeconfig(R"(current-context: a
contexts: [{name: a, context: {cluster: c, user: u}}]
clusters: [{name: c, cluster: {server: "https://x"}}]
users: [{name: u, user: {exec: {command: aws}}}])",
                              "");
  EXPECT_EQ(exec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(exec.status().message()), HasSubstr("exec/auth-provider"));
  auto bad_b64 = ParseKubeconfig(R"(current-context: a
contexts: [{name: a, context: {cluster: c}}]
clusters: [{name: c, cluster: {server: "https://x", certificate-authority-data: "!!"}}])",
                                 "");
  EXPECT_THAT(std::string(bad_b64.status().message()), HasSubstr("certificate-authority-data"));
  EXPECT_EQ(ParseKubeconfig(": : :", "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadKubeconfig((dir_ / "absent").string()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ConfigTest, InClusterConfigFromInjectedEnvironment) {
  InClusterEnvironment env;
  std::map<std::string, std::string> vars = {{"KUBERNETES_SERVICE_HOST", "fd00::1"},
                                             {"KUBERNETES_SERVICE_PORT", "443"}};
  env.getenv = [&](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
  env.token_path = Write("token", "tok\n");
  env.ca_path = Write("ca.crt", "pem");
  env.namespace_path = Write("namespace", "kube-system\n");
  auto config = InClusterConfig(env);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://[fd00::1]:443");
  EXPECT_EQ(config->token_file, env.token_path);
  EXPECT_EQ(config->ca_file, env.ca_path);
  EXPECT_EQ(config->ns, "kube-system");
  vars.erase("KUBERNETES_SERVICE_HOST");
  EXPECT_EQ(InClusterConfig(env).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Base64Test, Decodes) {
  EXPECT_EQ(*Base64Decode("aGVsbG8gd29ybGQ="), "hello world");
  EXPECT_EQ(*Base64Decode("aGVs\nbG8="), "hello");
  EXPECT_EQ(Base64Decode("a$b").status().code(), absl::StatusCode::kInvalidArgument);
}

// Store semantics that need no HTTP (the conformance suite covers them over HTTP too).
TEST(ApiStoreTest, ResourceVersionsAreGlobalAndMonotonic) {
  ApiStore store;
  auto a = store.Create(Resource::kPods, "default", testing::MakePod("a"));
  auto n = store.Create(Resource::kNodes, "", testing::MakeNode("n"));
  ASSERT_TRUE(a.ok() && n.ok());
  EXPECT_LT(ResourceVersionNumber(*a), ResourceVersionNumber(*n));
  EXPECT_EQ(store.resource_version(), ResourceVersionNumber(*n));
  // A no-op update does not bump the version.
  auto same = store.Update(Resource::kNodes, "", "n", *n, "");
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(ResourceVersion(*same), ResourceVersion(*n));
}

TEST(ApiStoreTest, QuantitiesAreStoredAsStrings) {
  ApiStore store;
  Object pod = testing::MakePod("q");
  pod["spec"]["containers"][0]["resources"]["limits"] = {{"nvidia.com/gpu", 2}, {"cpu", 0.5}};
  auto created = store.Create(Resource::kPods, "default", pod);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ((*created)["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "2");
  EXPECT_EQ((*created)["spec"]["containers"][0]["resources"]["limits"]["cpu"], "500m");
}

TEST(ApiStoreTest, GracefulDeletionFollowsTheInjectedClock) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  ApiStoreOptions options;
  options.clock = &clock;
  ApiStore store(options);
  ASSERT_TRUE(
      store.Create(Resource::kPods, "default", testing::MakePod("p", "default", "n1")).ok());
  DeleteOptions grace;
  grace.grace_period_seconds = 10;
  auto deleting = store.Delete(Resource::kPods, "default", "p", grace);
  ASSERT_TRUE(deleting.ok());
  EXPECT_EQ(DeletionTimestamp(*deleting), Rfc3339(start + absl::Seconds(10)));
  EXPECT_EQ((*deleting)["metadata"]["deletionGracePeriodSeconds"], 10);
  clock.Advance(absl::Seconds(9));
  EXPECT_EQ(store.CollectGarbage(), 0);
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(store.CollectGarbage(), 1);
  EXPECT_EQ(store.Get(Resource::kPods, "default", "p").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace dynmig::kube
