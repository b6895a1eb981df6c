// Who may filter and bind: BindGuard's checks ("bind only what this extender reserved", with or
// without client authentication), the issue's attack against the scheduler server (a plain pod of
// another scheduler bound by an unauthenticated POST /bind), bad bodies, and client-certificate
// authentication of /filter and /bind (refused without, with a foreign or a serving certificate;
// kube-scheduler's accepted; the CA file rotated under the running server).
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/cli.h"
#include "ops/layout.h"
#include "ops/live_page.h"
#include "protocol/device_config.h"
#include "scheduler/bind_guard.h"
#include "scheduler_test_util.h"
#include "webhook/pki.h"

namespace dynmig::scheduler::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// A plain pod of another scheduler, no GPU: the issue's victim.
kube::Object ForeignPod(const std::string& name) {
  kube::Object pod = kube::testing::MakePod(name);
  pod["spec"]["schedulerName"] = "some-other-scheduler";
  pod["spec"]["containers"][0]["resources"] = {{"limits", {{"cpu", "1"}}}};
  return pod;
}

kube::Object WithReservation(kube::Object pod, const std::string& node, absl::Time made) {
  pod["metadata"]["uid"] = "uid-1";
  pod["metadata"]["annotations"]["hami.io/vgpu-node"] = node;
  pod["metadata"]["annotations"]["hami.io/vgpu-mig-allocations"] = Alloc("GPU-a0", "1g.5gb", 0, 1);
  pod["metadata"]["annotations"]["hami.io/vgpu-time"] = std::to_string(absl::ToUnixSeconds(made));
  return pod;
}

// ---- BindGuard ---------------------------------------------------------------------------------

TEST(BindGuardTest, OnlyMigPodsOfOurSchedulerNameAreOurs) {
  BindGuard guard(BindGuardOptions{});
  EXPECT_TRUE(guard.CheckOurs(MigPod("p", 4000)).ok());
  absl::Status st = guard.CheckOurs(ForeignPod("x"));
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("pod default/x is not scheduled by dynmig-scheduler: its "
                        "spec.schedulerName is \"some-other-scheduler\""));
  kube::Object unnamed = MigPod("u", 4000);
  unnamed["spec"].erase("schedulerName");
  EXPECT_THAT(std::string(guard.CheckOurs(unnamed).message()),
              HasSubstr("spec.schedulerName is \"default-scheduler\""));
  kube::Object cpu = ForeignPod("cpu");
  cpu["spec"]["schedulerName"] = "dynmig-scheduler";
  EXPECT_THAT(std::string(guard.CheckFilter(cpu).message()),
              HasSubstr("pod default/cpu is not a MIG pod"));
  kube::Object core = MigPod("core", 4000, {{"nvidia.com/vgpu-mode", "hami-core"}});
  EXPECT_EQ(guard.CheckOurs(core).code(), absl::StatusCode::kPermissionDenied);
  BindGuardOptions tenant;
  tenant.scheduler_name = "tenant-mig";
  BindGuard other(tenant);
  EXPECT_THAT(std::string(other.CheckOurs(MigPod("p", 4000)).message()),
              HasSubstr("is not scheduled by tenant-mig"));
}

TEST(BindGuardTest, BindNeedsTheUidAndALiveReservationOfOursOnTheNode) {
  const absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  BindGuard guard(BindGuardOptions{});  // reservation TTL 10m
  const kube::Object reserved =
      WithReservation(MigPod("p", 4000), "node-a", now - absl::Minutes(1));
  EXPECT_TRUE(guard.CheckBind(reserved, "uid-1", "node-a", now).ok());

  auto message = [&](const kube::Object& pod, const std::string& uid, const std::string& node) {
    absl::Status st = guard.CheckBind(pod, uid, node, now);
    EXPECT_FALSE(st.ok());
    return std::string(st.message());
  };
  EXPECT_EQ(guard.CheckBind(reserved, "", "node-a", now).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(message(reserved, "", "node-a"), HasSubstr("PodUID is required"));
  EXPECT_THAT(message(reserved, "uid-2", "node-a"),
              HasSubstr("the pod has uid uid-1, not uid-2 (recreated?)"));
  EXPECT_EQ(message(reserved, "uid-1", "node-b"),
            "bind default/p: the pod's MIG reservation is on node node-a, not node-b");
  kube::Object bare = MigPod("bare", 4000);
  bare["metadata"]["uid"] = "uid-1";
  EXPECT_THAT(message(bare, "uid-1", "node-a"),
              HasSubstr("the pod holds no MIG reservation of this extender"));
  kube::Object expired = WithReservation(MigPod("p", 4000), "node-a", now - absl::Minutes(11));
  EXPECT_THAT(message(expired, "uid-1", "node-a"),
              HasSubstr("the pod's MIG reservation on node node-a expired"));
  EXPECT_THAT(message(expired, "uid-1", "node-a"), HasSubstr("the reservation TTL is 10m"));
  kube::Object timeless = reserved;
  timeless["metadata"]["annotations"].erase("hami.io/vgpu-time");
  EXPECT_THAT(message(timeless, "uid-1", "node-a"), HasSubstr("no readable reservation time"));
  kube::Object foreign = WithReservation(ForeignPod("x"), "node-a", now);
  EXPECT_THAT(message(foreign, "uid-1", "node-a"),
              HasSubstr("bind refused: pod default/x is not scheduled by dynmig-scheduler"));
  // Bound already: the same node is a retry (no live reservation needed), another is refused.
  kube::Object bound = expired;
  bound["spec"]["nodeName"] = "node-a";
  EXPECT_TRUE(guard.CheckBind(bound, "uid-1", "node-a", now).ok());
  EXPECT_THAT(message(bound, "uid-1", "node-b"), HasSubstr("already bound to node node-a"));
}

// The reservation may live elsewhere than the pod's annotations (the scheduler's memory between
// filter and bind): the guard asks the injected lookup.
TEST(BindGuardTest, TheReservationIsFoundThroughTheInjectedLookup) {
  const absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  std::map<std::string, HeldReservation> held = {{"default/p", {"node-b", now}}};
  BindGuard guard(BindGuardOptions{}, [&](const kube::Object& pod) {
    auto it = held.find(kube::ObjectKey(pod));
    return it == held.end() ? std::nullopt : std::optional<HeldReservation>(it->second);
  });
  kube::Object pod = MigPod("p", 4000);
  pod["metadata"]["uid"] = "uid-1";
  EXPECT_TRUE(guard.CheckBind(pod, "uid-1", "node-b", now).ok());
  EXPECT_THAT(std::string(guard.CheckBind(pod, "uid-1", "node-a", now).message()),
              HasSubstr("is on node node-b, not node-a"));
  held.clear();
  EXPECT_THAT(std::string(guard.CheckBind(pod, "uid-1", "node-b", now).message()),
              HasSubstr("holds no MIG reservation"));
}

TEST(BindGuardTest, AnnotatedReservationReadsNodeAndTime) {
  const absl::Time made = absl::FromUnixSeconds(1'700'000'000);
  auto held = AnnotatedReservation(WithReservation(MigPod("p", 4000), "node-a", made));
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->node, "node-a");
  EXPECT_EQ(held->made, made);
  kube::Object unreadable = WithReservation(MigPod("p", 4000), "node-a", made);
  unreadable["metadata"]["annotations"]["hami.io/vgpu-mig-allocations"] = "garbage";
  EXPECT_FALSE(AnnotatedReservation(unreadable).has_value());
  EXPECT_FALSE(AnnotatedReservation(MigPod("p", 4000)).has_value());
}

// ---- the issue's attack, client authentication off ----------------------------------------------

class GuardedServerTest : public SchedulerTest {
 protected:
  void SetUp() override {
    SchedulerTest::SetUp();
    CreateNode(MigNode("node-a", {"GPU-a0"}));
    CreateNode(MigNode("node-b", {"GPU-b0"}));
    s_ = StartScheduler();
    WaitForNodes(s_, {"node-a", "node-b"});
  }
  HttpResult BindRaw(const std::string& name, const std::string& uid, const std::string& node) {
    return Post(
        s_->port(), "/bind",
        json{{"PodName", name}, {"PodNamespace", "default"}, {"PodUID", uid}, {"Node", node}}
            .dump());
  }
  SchedulerServer* s_ = nullptr;
};

TEST_F(GuardedServerTest, AnUnauthenticatedBindOfAnotherSchedulersPodIsRefused) {
  const kube::Object victim = CreatePod(ForeignPod("victim"));
  HttpResult r = BindRaw("victim", kube::Uid(victim), "node-b");
  ASSERT_EQ(r.status, 200);
  EXPECT_THAT(r.body["Error"].get<std::string>(),
              HasSubstr("bind refused: pod default/victim is not scheduled by dynmig-scheduler: "
                        "its spec.schedulerName is \"some-other-scheduler\""));
  EXPECT_EQ(kube::NodeName(GetPod("victim")), "") << "the pod was bound";
  EXPECT_THAT(EventMessages("victim", "MigBindRefused"),
              ElementsAre(HasSubstr("is not scheduled by dynmig-scheduler")));
  // Nor may a filter reserve for it.
  r = Filter(s_, victim, {"node-a", "node-b"});
  EXPECT_THAT(r.body["Error"].get<std::string>(),
              HasSubstr("is not scheduled by dynmig-scheduler"));
  EXPECT_TRUE(r.body["NodeNames"].is_null() || r.body["NodeNames"].empty()) << r.text;
  EXPECT_THAT(EventMessages("victim", "MigFilterRefused"), ElementsAre(HasSubstr("victim")));
  EXPECT_THAT(s_->MetricsText(), HasSubstr("dynmig_scheduler_bind_total{outcome=\"error\"} 1"));
}

// With client authentication off, a filter's Pod is not trusted: a body that dresses another
// scheduler's GPU pod as ours reserves nothing, because the pod the API has is checked.
TEST_F(GuardedServerTest, AForgedFilterBodyReservesNothing) {
  kube::Object gpu = MigPod("tenant", 4000);
  gpu["spec"]["schedulerName"] = "tenant-scheduler";
  const kube::Object stored = CreatePod(gpu);
  kube::Object forged = stored;
  forged["spec"]["schedulerName"] = "dynmig-scheduler";
  HttpResult r = Filter(s_, forged, {"node-a"});
  EXPECT_THAT(r.body["Error"].get<std::string>(),
              HasSubstr("pod default/tenant is not scheduled by dynmig-scheduler"));
  EXPECT_THAT(AllocationsOf("tenant"), IsEmpty());
  EXPECT_FALSE(s_->state().ReservedNode("default/tenant").has_value());
  // A forged plain pod (no GPU) dressed as a MIG pod: the same.
  const kube::Object plain = CreatePod(ForeignPod("plain"));
  kube::Object dressed = MigPod("plain", 4000);
  dressed["metadata"]["uid"] = kube::Uid(plain);
  dressed["metadata"]["resourceVersion"] = kube::ResourceVersion(plain);
  r = Filter(s_, dressed, {"node-a"});
  EXPECT_THAT(r.body["Error"].get<std::string>(),
              HasSubstr("is not scheduled by dynmig-scheduler"));
  EXPECT_THAT(AllocationsOf("plain"), IsEmpty());
  EXPECT_EQ(s_->state().View("node-a", clock_.Now())->gpus[0].usage.occupied, 0u);
}

TEST_F(GuardedServerTest, BadBindBodiesGetAClearErrorAndChangeNothing) {
  const kube::Object pod = CreatePod(MigPod("p", 4000));
  ASSERT_THAT(Filter(s_, pod, {"node-a"}).body["NodeNames"], ElementsAre("node-a"));
  const kube::Object before = GetPod("p");
  struct Case {
    std::string body;
    std::string error;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"PodName":"nobody","PodNamespace":"default","PodUID":"u","Node":"node-a"})",
            "bind default/nobody:"},
           {json{{"PodName", "p"},
                 {"PodNamespace", "default"},
                 {"PodUID", "wrong"},
                 {"Node", "node-a"}}
                .dump(),
            "the pod has uid " + kube::Uid(pod) + ", not wrong (recreated?)"},
           {R"({"PodName":"p","PodNamespace":"default","Node":"node-a"})", "PodUID is required"},
           {R"({"PodName":"p","PodNamespace":"default",)", ""},
           {"[1,2]", ""},
           {R"({"PodName":"p","Node":"node-a"})", "PodNamespace"},
       }) {
    HttpResult r = Post(s_->port(), "/bind", c.body);
    ASSERT_EQ(r.status, 200) << c.body;
    const std::string error = r.body["Error"].get<std::string>();
    EXPECT_FALSE(error.empty()) << c.body;
    if (!c.error.empty()) {
      EXPECT_THAT(error, HasSubstr(c.error)) << c.body;
    }
  }
  // An oversized body is refused before it is read.
  HttpResult big = Post(s_->port(), "/bind", std::string(17 << 20, ' '));
  EXPECT_EQ(big.status, 413);
  EXPECT_THAT(big.body["Error"].get<std::string>(), HasSubstr("request body too large"));
  const kube::Object after = GetPod("p");
  EXPECT_EQ(kube::ResourceVersion(after), kube::ResourceVersion(before)) << "the pod changed";
  EXPECT_EQ(kube::NodeName(after), "");
  EXPECT_FALSE(
      kube::Annotation(*client_->GetNode("node-a"), protocol::kNodeLockAnnotation).has_value());
  EXPECT_THAT(EventMessages("p", "MigBindRefused"), IsEmpty()) << "bad bodies record no event";
}

TEST_F(GuardedServerTest, ABindAfterTheReservationExpiredIsRefused) {
  const kube::Object pod = CreatePod(MigPod("p", 4000));
  ASSERT_THAT(Filter(s_, pod, {"node-a"}).body["NodeNames"], ElementsAre("node-a"));
  clock_.Advance(absl::Minutes(11));  // the default reservation TTL is 10m
  HttpResult r = Bind(s_, pod, "node-a");
  EXPECT_THAT(r.body["Error"].get<std::string>(),
              HasSubstr("bind default/p: the pod's MIG reservation on node node-a expired"));
  EXPECT_EQ(kube::NodeName(GetPod("p")), "");
  EXPECT_FALSE(
      kube::Annotation(*client_->GetNode("node-a"), protocol::kNodeLockAnnotation).has_value());
  EXPECT_THAT(EventMessages("p", "MigBindRefused"), ElementsAre(HasSubstr("expired")));
}

// ---- client-certificate authentication
// ------------------------------------------------------------

class ClientAuthTest : public SchedulerTest {
 protected:
  void SetUp() override {
    SchedulerTest::SetUp();
    dir_ = std::filesystem::temp_directory_path() / fmt::format("dynmig-client-auth-{}", getpid());
    std::filesystem::create_directories(dir_);
    ca_ = *webhook::MakeCa("dynmig-ca");
    webhook::CertSpec serving{.common_name = "dynmig-scheduler.dynmig-system.svc",
                              .sans = {"IP:127.0.0.1", "DNS:localhost"}};
    const webhook::PemPair server = *webhook::IssueCert(ca_, serving);
    server_cert_ = Put("tls.crt", server.cert_pem);
    server_key_ = Put("tls.key", server.key_pem);
    ca_file_ = Put("ca.crt", ca_.cert_pem);
    client_ca_file_ = Put("client-ca.crt", ca_.cert_pem);
    webhook::CertSpec client;
    client.common_name = "system:kube-scheduler";
    client.usage = webhook::CertUsage::kClient;
    kube_scheduler_ = Pair("kube-scheduler", *webhook::IssueCert(ca_, client));
    const webhook::PemPair rogue_ca = *webhook::MakeCa("dynmig-ca");  // same name, other key
    rogue_ = Pair("rogue", *webhook::IssueCert(rogue_ca, client));
    // A certificate of the trusted CA made for serving, not for clients.
    serving_as_client_ = Pair("serving", server);
    CreateNode(MigNode("node-a", {"GPU-a0"}));
  }
  void TearDown() override {
    SchedulerTest::TearDown();
    std::filesystem::remove_all(dir_);
  }
  std::string Put(const std::string& name, const std::string& text) {
    const auto path = dir_ / name;
    std::ofstream(path.string() + ".tmp") << text;
    std::filesystem::rename(path.string() + ".tmp", path);
    return path.string();
  }
  std::pair<std::string, std::string> Pair(const std::string& name, const webhook::PemPair& p) {
    return {Put(name + ".crt", p.cert_pem), Put(name + ".key", p.key_pem)};
  }
  SchedulerServer* StartWithAuth() {
    SchedulerServerOptions o = DefaultOptions();
    o.tls_cert_file = server_cert_;
    o.tls_key_file = server_key_;
    o.extender_client_ca_file = client_ca_file_;
    SchedulerServer* s = StartScheduler(o);
    if (s != nullptr) WaitForNodes(s, {"node-a"});
    return s;
  }
  // POST over HTTPS trusting our CA, presenting `cert` (empty: none).
  HttpResult PostTls(int port, const std::string& path, const std::string& body,
                     const std::pair<std::string, std::string>& cert = {}) {
    std::unique_ptr<httplib::SSLClient> client =
        cert.first.empty()
            ? std::make_unique<httplib::SSLClient>("127.0.0.1", port)
            : std::make_unique<httplib::SSLClient>("127.0.0.1", port, cert.first, cert.second);
    client->set_ca_cert_path(ca_file_.c_str());
    client->enable_server_certificate_verification(true);
    client->set_read_timeout(30, 0);
    return ToHttpResult(path == "/healthz" || path == "/metrics" || path.starts_with("/layout") ||
                                path.starts_with("/live")
                            ? client->Get(path.c_str())
                            : client->Post(path.c_str(), body, "application/json"));
  }
  json BindArgs(const kube::Object& pod, const std::string& node) {
    return {{"PodName", kube::Name(pod)},
            {"PodNamespace", "default"},
            {"PodUID", kube::Uid(pod)},
            {"Node", node}};
  }

  std::filesystem::path dir_;
  webhook::PemPair ca_;
  std::string server_cert_, server_key_, ca_file_, client_ca_file_;
  std::pair<std::string, std::string> kube_scheduler_, rogue_, serving_as_client_;
};

TEST_F(ClientAuthTest, FilterAndBindNeedKubeSchedulersClientCertificate) {
  SchedulerServer* s = StartWithAuth();
  ASSERT_NE(s, nullptr);
  const kube::Object pod = CreatePod(MigPod("p", 4000));
  const kube::Object victim = CreatePod(ForeignPod("victim"));
  const std::string filter = FilterBody(pod, {"node-a"}).dump();

  // No certificate, a certificate of another CA, the trusted CA's serving certificate: 401.
  for (const auto& [who, cert] :
       std::vector<std::pair<std::string, std::pair<std::string, std::string>>>{
           {"POST {} refused: no client certificate", {}},
           {"POST {} refused: the client certificate \"/CN=system:kube-scheduler\" is not "
            "accepted (unable to verify the first certificate)",
            rogue_},
           {"POST {} refused: the client certificate \"/CN=dynmig-scheduler.dynmig-system.svc\" "
            "is not accepted (unsuitable certificate purpose)",
            serving_as_client_}}) {
    HttpResult r = PostTls(s->port(), "/filter", filter, cert);
    EXPECT_EQ(r.status, 401) << who << ": " << r.text;
    EXPECT_THAT(r.body["Error"].get<std::string>(),
                HasSubstr(fmt::format(fmt::runtime(who), "/filter")))
        << r.text;
    r = PostTls(s->port(), "/bind", BindArgs(victim, "node-a").dump(), cert);
    EXPECT_EQ(r.status, 401) << who << ": " << r.text;
    EXPECT_THAT(r.body["Error"].get<std::string>(),
                HasSubstr(fmt::format(fmt::runtime(who), "/bind")));
  }
  EXPECT_THAT(AllocationsOf("p"), IsEmpty());
  EXPECT_EQ(kube::NodeName(GetPod("victim")), "");
  EXPECT_THAT(s->MetricsText(),
              HasSubstr("dynmig_scheduler_unauthenticated_total{path=\"/bind\"} 3"));

  // The webhooks, probes and metrics need no client certificate.
  EXPECT_EQ(PostTls(s->port(), "/healthz", "").status, 200);
  EXPECT_EQ(PostTls(s->port(), "/metrics", "").status, 200);
  EXPECT_EQ(PostTls(s->port(), "/validate", "{}").status, 200);

  // kube-scheduler: filter reserves, bind binds.
  HttpResult r = PostTls(s->port(), "/filter", filter, kube_scheduler_);
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body["Error"], "") << r.text;
  EXPECT_THAT(r.body["NodeNames"], ElementsAre("node-a"));
  r = PostTls(s->port(), "/bind", BindArgs(pod, "node-a").dump(), kube_scheduler_);
  EXPECT_EQ(r.body["Error"], "") << r.text;
  EXPECT_EQ(kube::NodeName(GetPod("p")), "node-a");
  // Even kube-scheduler's certificate does not bind another scheduler's pod.
  r = PostTls(s->port(), "/bind", BindArgs(victim, "node-a").dump(), kube_scheduler_);
  EXPECT_THAT(r.body["Error"].get<std::string>(),
              HasSubstr("is not scheduled by dynmig-scheduler"));
  EXPECT_EQ(kube::NodeName(GetPod("victim")), "");
}

// GET /layout names the pods of every namespace: only a caller with a client certificate of the
// extender client CA gets it (issue 27); /metrics, which names none, stays open.
TEST_F(ClientAuthTest, LayoutNeedsAClientCertificate) {
  SchedulerServerOptions o = DefaultOptions();
  o.host = "0.0.0.0";  // not loopback: reachable by tenants
  o.tls_cert_file = server_cert_;
  o.tls_key_file = server_key_;
  o.extender_client_ca_file = client_ca_file_;
  o.layout_json = [](const std::vector<NodeReport>& n) { return ops::LayoutJson(n).dump(); };
  SchedulerServer* s = StartScheduler(o);
  ASSERT_NE(s, nullptr);
  WaitForNodes(s, {"node-a"});
  ASSERT_THAT(
      PostTls(s->port(), "/filter",
              FilterBody(CreatePod(MigPod("secret-job", 4000)), {"node-a"}).dump(), kube_scheduler_)
          .body["NodeNames"],
      ElementsAre("node-a"));
  for (const auto& cert : {std::pair<std::string, std::string>{}, rogue_, serving_as_client_}) {
    HttpResult r = PostTls(s->port(), "/layout?format=json", "", cert);
    EXPECT_EQ(r.status, 401) << r.text;
    EXPECT_THAT(r.text, HasSubstr("GET /layout refused"));
    EXPECT_THAT(r.text, Not(HasSubstr("secret-job")));
  }
  EXPECT_THAT(s->MetricsText(),
              HasSubstr("dynmig_scheduler_unauthenticated_total{path=\"/layout\"} 3"));
  HttpResult r = PostTls(s->port(), "/layout?format=json", "", kube_scheduler_);
  EXPECT_EQ(r.status, 200) << r.text;
  EXPECT_THAT(r.text, HasSubstr("default/secret-job"));
  r = PostTls(s->port(), "/metrics", "");
  EXPECT_EQ(r.status, 200);
  EXPECT_THAT(r.text, Not(HasSubstr("secret-job")));
}

// GET /live and its parts show what /layout shows (owners of every namespace) and more (pending
// pods, events): the same rule, a client certificate of the extender client CA.
TEST_F(ClientAuthTest, LivePageNeedsAClientCertificate) {
  SchedulerServerOptions o = DefaultOptions();
  o.host = "0.0.0.0";  // not loopback: reachable by tenants
  o.tls_cert_file = server_cert_;
  o.tls_key_file = server_key_;
  o.extender_client_ca_file = client_ca_file_;
  o.live = ops::LivePageRenderer();
  SchedulerServer* s = StartScheduler(o);
  ASSERT_NE(s, nullptr);
  WaitForNodes(s, {"node-a"});
  ASSERT_THAT(
      PostTls(s->port(), "/filter",
              FilterBody(CreatePod(MigPod("secret-job", 4000)), {"node-a"}).dump(), kube_scheduler_)
          .body["NodeNames"],
      ElementsAre("node-a"));
  ASSERT_EQ(PostTls(s->port(), "/filter",
                    FilterBody(CreatePod(MigPod("secret-wait", 90000)), {"node-a"}).dump(),
                    kube_scheduler_)
                .status,
            200);
  for (const std::string path : {"/live", "/live/body", "/live/script.js", "/live/style.css"}) {
    for (const auto& cert : {std::pair<std::string, std::string>{}, rogue_, serving_as_client_}) {
      HttpResult r = PostTls(s->port(), path, "", cert);
      EXPECT_EQ(r.status, 401) << path << ": " << r.text;
      EXPECT_THAT(r.text, HasSubstr("GET " + path + " refused"));
      EXPECT_THAT(r.text, Not(HasSubstr("secret")));
    }
  }
  EXPECT_THAT(s->MetricsText(),
              HasSubstr("dynmig_scheduler_unauthenticated_total{path=\"/live\"} 12"));
  HttpResult r = PostTls(s->port(), "/live/body", "", kube_scheduler_);
  EXPECT_EQ(r.status, 200) << r.text;
  EXPECT_THAT(r.text, HasSubstr("data-pod=\"default/secret-job\""));
  EXPECT_THAT(r.text, HasSubstr("<tr class=\"pending\" data-pod=\"default/secret-wait\""));
}

// A client that resumes a TLS session (a browser's second connection) gets a full handshake, not
// an internal-error alert; the resumed connection is authenticated afresh.
TEST_F(ClientAuthTest, AClientResumingASessionGetsAFullHandshake) {
  SchedulerServer* s = StartWithAuth();
  ASSERT_NE(s, nullptr);
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  ASSERT_NE(ctx, nullptr);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT);
  for (const int version : {TLS1_2_VERSION, TLS1_3_VERSION}) {
    SSL_CTX_set_max_proto_version(ctx, version);
    SSL_SESSION* session = nullptr;
    for (int attempt = 0; attempt < 2; ++attempt) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(s->port()));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
      SSL* ssl = SSL_new(ctx);
      SSL_set_fd(ssl, fd);
      if (session != nullptr) SSL_set_session(ssl, session);
      EXPECT_EQ(SSL_connect(ssl), 1)
          << "TLS version " << version << ", connection " << attempt << ": handshake failed";
      const std::string request = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
      EXPECT_GT(SSL_write(ssl, request.data(), static_cast<int>(request.size())), 0);
      std::string answer;
      char buf[512];
      for (int n; (n = SSL_read(ssl, buf, sizeof(buf))) > 0;) answer.append(buf, n);
      EXPECT_THAT(answer, HasSubstr("200 OK"));
      if (attempt == 1) {
        EXPECT_FALSE(SSL_session_reused(ssl));
      }
      if (session == nullptr) session = SSL_get1_session(ssl);
      SSL_shutdown(ssl);
      SSL_free(ssl);
      close(fd);
    }
    SSL_SESSION_free(session);
  }
  SSL_CTX_free(ctx);
}

TEST_F(ClientAuthTest, ARotatedClientCaIsTrustedWithoutARestart) {
  SchedulerServer* s = StartWithAuth();
  ASSERT_NE(s, nullptr);
  const std::string health = FilterBody(CreatePod(ForeignPod("x")), {"node-a"}).dump();
  // Authenticated (then refused by the guard: x is not ours), so HTTP 200.
  EXPECT_EQ(PostTls(s->port(), "/filter", health, kube_scheduler_).status, 200);
  const webhook::PemPair next_ca = *webhook::MakeCa("dynmig-ca-2");
  webhook::CertSpec client;
  client.common_name = "system:kube-scheduler";
  client.usage = webhook::CertUsage::kClient;
  const auto next_client = Pair("next", *webhook::IssueCert(next_ca, client));
  EXPECT_EQ(PostTls(s->port(), "/filter", health, next_client).status, 401);
  // Both CAs during the changeover, then only the new one.
  Put("client-ca.crt", ca_.cert_pem + next_ca.cert_pem);
  EXPECT_EQ(PostTls(s->port(), "/filter", health, next_client).status, 200);
  EXPECT_EQ(PostTls(s->port(), "/filter", health, kube_scheduler_).status, 200);
  Put("client-ca.crt", next_ca.cert_pem);
  EXPECT_EQ(PostTls(s->port(), "/filter", health, next_client).status, 200);
  EXPECT_EQ(PostTls(s->port(), "/filter", health, kube_scheduler_).status, 401);
  EXPECT_EQ(s->client_auth()->reloads(), 2);
  // A file that does not load keeps the previous CAs.
  Put("client-ca.crt", "not a certificate\n");
  EXPECT_EQ(PostTls(s->port(), "/filter", health, next_client).status, 200);
  EXPECT_EQ(s->client_auth()->failures(), 1);
  // The serving certificate still rotates on its own (webhook/cert_reloader.h).
  EXPECT_EQ(PostTls(s->port(), "/healthz", "").status, 200);
}

TEST_F(ClientAuthTest, AClientCaNeedsTlsAndAReadableFile) {
  SchedulerServerOptions o = DefaultOptions();
  o.extender_client_ca_file = client_ca_file_;
  auto plain = SchedulerServer::Start(*client_, clock_, o);
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plain.status().message()), HasSubstr("needs TLS"));
  o.tls_cert_file = server_cert_;
  o.tls_key_file = server_key_;
  o.extender_client_ca_file = (dir_ / "missing-ca.crt").string();
  auto missing = SchedulerServer::Start(*client_, clock_, o);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("missing-ca.crt"));
  o.extender_client_ca_file = Put("empty.crt", "");
  auto empty = SchedulerServer::Start(*client_, clock_, o);
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("no PEM certificate"));

  std::ostringstream out, err;
  const std::string config = Put("device-config.yaml", protocol::DefaultDeviceConfigYaml());
  EXPECT_EQ(cli::RunCli({"scheduler", "--in-cluster", "--device-config", config,
                         "--extender-client-ca", client_ca_file_},
                        out, err),
            cli::kExitBadInput);
  EXPECT_THAT(err.str(), HasSubstr("--extender-client-ca needs --tls-cert and --tls-key"));
}

}  // namespace
}  // namespace dynmig::scheduler::testing
