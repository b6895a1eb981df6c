// The HTTP surface: malformed and oversized requests, health and readiness, the webhook over
// HTTPS with a certificate swapped under the running server, and the `dynmig scheduler` command.
#include <gmock/gmock.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "cli/cli.h"
#include "ops/layout.h"
#include "ops/live_page.h"
#include "protocol/device_config.h"
#include "scheduler_test_util.h"
#include "webhook/test_certs.h"

namespace dynmig::scheduler::testing {
namespace {

using ::testing::HasSubstr;

TEST_F(SchedulerTest, MalformedRequestsGetErrorFieldsWithHttp200) {
  SchedulerServer* s = StartScheduler();
  HttpResult r = Post(s->port(), "/filter", "{\"Pod\": [");
  EXPECT_EQ(r.status, 200);
  EXPECT_THAT(r.body["Error"].get<std::string>(), HasSubstr("ExtenderArgs: invalid JSON: "));
  EXPECT_TRUE(r.body["NodeNames"].empty());
  r = Post(s->port(), "/filter", R"({"NodeNames":["a"]})");
  EXPECT_EQ(r.body["Error"], "ExtenderArgs: Pod is missing");
  r = Post(s->port(), "/bind", "nope");
  EXPECT_EQ(r.status, 200);
  EXPECT_THAT(r.body["Error"].get<std::string>(), HasSubstr("ExtenderBindingArgs: invalid JSON: "));
  r = Post(s->port(), "/webhook", "nope");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body["kind"], "AdmissionReview");
  EXPECT_EQ(r.body["response"]["allowed"], false);
  EXPECT_EQ(r.body["response"]["status"]["code"], 400);
  r = Post(s->port(), "/nothing", "{}");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body["Error"], "no such endpoint: POST /nothing");
  EXPECT_THAT(s->MetricsText(), HasSubstr("dynmig_scheduler_filter_total{outcome=\"error\"} 2"));
}

TEST_F(SchedulerTest, OversizedBodiesAreRefusedWith413AndAClearError) {
  SchedulerServerOptions o = DefaultOptions();
  o.max_body_bytes = 1 << 20;  // 1 MiB here; 16 MiB by default
  SchedulerServer* s = StartScheduler(o);
  const std::string big = "{\"Pod\":{},\"pad\":\"" + std::string((1 << 20) + 10, 'x') + "\"}";
  HttpResult r = Post(s->port(), "/filter", big);
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(r.body["Error"], "request body too large: the limit is 1048576 bytes (1 MiB)");
  r = Post(s->port(), "/webhook", big);
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(r.body["response"]["status"]["message"],
            "request body too large: the limit is 1048576 bytes (1 MiB)");
  // The server is fine afterwards.
  EXPECT_EQ(Get(s->port(), "/healthz").text, "ok\n");
}

TEST_F(SchedulerTest, ReadinessFollowsTheInformersAndGatesWrites) {
  // The API server refuses pod lists: the caches never sync.
  kube::FaultSpec fault;
  fault.method = "GET";
  fault.path_prefix = "/api/v1/pods";
  fault.count = -1;
  fault.status = 403;
  api_->AddFault(fault);
  CreateNode(MigNode("node-a", {"GPU-a0"}));
  SchedulerServer* s = StartScheduler(DefaultOptions(), /*wait_ready=*/false);
  EXPECT_EQ(Get(s->port(), "/healthz").status, 200);
  HttpResult ready = Get(s->port(), "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_THAT(ready.text, HasSubstr("not ready"));
  const kube::Object pod = CreatePod(MigPod("p", 4000));
  EXPECT_THAT(Filter(s, pod, {"node-a"}).body["Error"].get<std::string>(),
              HasSubstr("dynmig-scheduler is not ready"));
  api_->ClearFaults();
  ASSERT_TRUE(s->WaitUntilReady(absl::Seconds(10)));
  EXPECT_EQ(Get(s->port(), "/readyz").status, 200);
  WaitForNodes(s, {"node-a"});
  EXPECT_EQ(Filter(s, pod, {"node-a"}).body["Error"], "");
}

// GET /layout names the pods of every namespace: without client authentication only a loopback
// listener serves it (issue 27).
TEST_F(SchedulerTest, LayoutOnAnOpenListenerWithoutClientAuthenticationIsRefused) {
  CreateNode(MigNode("node-a", {"GPU-a0"}));
  SchedulerServerOptions o = DefaultOptions();
  o.host = "0.0.0.0";
  o.layout_html = ops::RenderLayoutHtml;
  SchedulerServer* s = StartScheduler(o);
  ASSERT_NE(s, nullptr);
  WaitForNodes(s, {"node-a"});
  ASSERT_EQ(Filter(s, CreatePod(MigPod("secret-job", 4000)), {"node-a"}).body["NodeNames"],
            json::array({"node-a"}));
  HttpResult r = Get(s->port(), "/layout");
  EXPECT_EQ(r.status, 403);
  EXPECT_THAT(r.text, HasSubstr("GET /layout refused: it shows the pods of every namespace"));
  EXPECT_THAT(r.text, ::testing::Not(HasSubstr("secret-job")));
  EXPECT_EQ(Get(s->port(), "/healthz").status, 200);
  EXPECT_EQ(Get(s->port(), "/metrics").status, 200);
}

// GET /layout answers with the injected renderer (the CLI and the local mode inject
// ops::RenderLayoutHtml / ops::LayoutJson), 404 without one.
TEST_F(SchedulerTest, LayoutIsServedOnlyWithAnInjectedRenderer) {
  CreateNode(MigNode("node-a", {"GPU-a0"}));
  CreateNode(MigNode("node-b", {"GPU-b0"}));
  SchedulerServer* bare = StartScheduler();
  HttpResult r = Get(bare->port(), "/layout");
  EXPECT_EQ(r.status, 404);
  EXPECT_THAT(r.text, HasSubstr("serves no HTML layout"));
  EXPECT_EQ(Get(bare->port(), "/layout?format=json").status, 404);

  SchedulerServerOptions o = DefaultOptions();
  o.layout_html = ops::RenderLayoutHtml;
  o.layout_json = [](const std::vector<NodeReport>& n) { return ops::LayoutJson(n).dump(); };
  SchedulerServer* s = StartScheduler(o);
  WaitForNodes(s, {"node-a", "node-b"});
  const kube::Object pod = CreatePod(MigPod("train-1", 19000));
  ASSERT_EQ(Filter(s, pod, {"node-a"}).body["NodeNames"], json::array({"node-a"}));

  httplib::Client client("127.0.0.1", s->port());
  auto page = client.Get("/layout");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_THAT(page->get_header_value("Content-Type"), HasSubstr("text/html"));
  EXPECT_THAT(page->body, HasSubstr("<!DOCTYPE html>"));
  EXPECT_THAT(page->body, HasSubstr("data-gpu=\"GPU-a0\""));
  EXPECT_THAT(page->body, HasSubstr("data-gpu=\"GPU-b0\""));
  EXPECT_THAT(page->body, HasSubstr("train-1"));
  EXPECT_THAT(page->body, HasSubstr("3g.20gb"));

  auto one = client.Get("/layout?node=node-b");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  EXPECT_THAT(one->body, HasSubstr("data-gpu=\"GPU-b0\""));
  EXPECT_THAT(one->body, ::testing::Not(HasSubstr("GPU-a0")));
  EXPECT_THAT(one->body, ::testing::Not(HasSubstr("train-1")));

  auto doc = client.Get("/layout?format=json&node=node-a");
  ASSERT_TRUE(doc);
  EXPECT_EQ(doc->status, 200);
  EXPECT_THAT(doc->get_header_value("Content-Type"), HasSubstr("application/json"));
  const json layout = json::parse(doc->body, nullptr, false);
  ASSERT_EQ(layout["nodes"].size(), 1u) << doc->body;
  EXPECT_EQ(layout["nodes"][0]["name"], "node-a");
  ASSERT_EQ(layout["nodes"][0]["gpus"][0]["reservations"].size(), 1u) << doc->body;
  EXPECT_EQ(layout["nodes"][0]["gpus"][0]["reservations"][0]["pod"], "default/train-1");
  EXPECT_EQ(layout["nodes"][0]["gpus"][0]["reservations"][0]["profile"], "3g.20gb");

  r = Get(s->port(), "/layout?node=node-z");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.text, "node \"node-z\" is not in the scheduler's view\n");
  r = Get(s->port(), "/layout?format=xml");
  EXPECT_EQ(r.status, 400);
  EXPECT_THAT(r.text, HasSubstr("give html (the default) or json"));
}

// GET /live shows the owners of every namespace, pending pods and events: without client
// authentication only a loopback listener serves it, as /layout.
TEST_F(SchedulerTest, LivePageOnAnOpenListenerWithoutClientAuthenticationIsRefused) {
  CreateNode(MigNode("node-a", {"GPU-a0"}));
  SchedulerServerOptions o = DefaultOptions();
  o.host = "0.0.0.0";
  o.live = ops::LivePageRenderer();
  SchedulerServer* s = StartScheduler(o);
  ASSERT_NE(s, nullptr);
  WaitForNodes(s, {"node-a"});
  ASSERT_EQ(Filter(s, CreatePod(MigPod("secret-job", 4000)), {"node-a"}).body["NodeNames"],
            json::array({"node-a"}));
  for (const std::string path : {"/live", "/live/body", "/live/script.js", "/live/style.css"}) {
    HttpResult r = Get(s->port(), path);
    EXPECT_EQ(r.status, 403) << path;
    EXPECT_THAT(r.text,
                HasSubstr("GET " + path + " refused: it shows the pods of every namespace"));
    EXPECT_THAT(r.text, ::testing::Not(HasSubstr("secret-job")));
  }
}

// GET /live: the page, its body, script and style sheet under a strict Content-Security-Policy;
// the GPUs with their owners, the pods the filter left pending with its reason, the events.
TEST_F(SchedulerTest, LivePageListsOwnersPendingPodsAndEvents) {
  CreateNode(MigNode("node-a", {"GPU-a0"}));
  SchedulerServer* bare = StartScheduler();
  HttpResult r = Get(bare->port(), "/live");
  EXPECT_EQ(r.status, 404);
  EXPECT_THAT(r.text, HasSubstr("serves no live page"));

  SchedulerServerOptions o = DefaultOptions();
  o.live = ops::LivePageRenderer();
  SchedulerServer* s = StartScheduler(o);
  WaitForNodes(s, {"node-a"});
  const kube::Object placed = CreatePod(MigPod("train-1", 19000));
  ASSERT_EQ(Filter(s, placed, {"node-a"}).body["NodeNames"], json::array({"node-a"}));
  const kube::Object waits = CreatePod(MigPod("too-big", 41000));
  ASSERT_EQ(Filter(s, waits, {"node-a"}).body["NodeNames"], json::array());
  ASSERT_TRUE(s->events().Flush(absl::Seconds(10)));

  httplib::Client client("127.0.0.1", s->port());
  for (const char* path : {"/live", "/live/body", "/live/script.js", "/live/style.css"}) {
    auto res = client.Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 200) << path;
    EXPECT_EQ(res->get_header_value("Content-Security-Policy"),
              "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
              "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
        << path;
    EXPECT_EQ(res->get_header_value("X-Content-Type-Options"), "nosniff");
    EXPECT_EQ(res->get_header_value("Cache-Control"), "no-store");
  }
  auto page = client.Get("/live");
  EXPECT_THAT(page->get_header_value("Content-Type"), HasSubstr("text/html"));
  EXPECT_THAT(page->body, HasSubstr("<script src=\"live/script.js\"></script>"));
  EXPECT_THAT(client.Get("/live/script.js")->get_header_value("Content-Type"),
              HasSubstr("text/javascript"));
  EXPECT_THAT(client.Get("/live/style.css")->get_header_value("Content-Type"),
              HasSubstr("text/css"));
  const std::string body = client.Get("/live/body")->body;
  EXPECT_THAT(body, HasSubstr("<div class=\"gpu\" data-node=\"node-a\" data-gpu=\"GPU-a0\""));
  EXPECT_THAT(body, HasSubstr("<li class=\"owner\" data-pod=\"default/train-1\" "
                              "data-profile=\"3g.20gb\""));
  EXPECT_THAT(body, HasSubstr("<tr class=\"pending\" data-pod=\"default/too-big\" data-reason=\""));
  EXPECT_THAT(body, HasSubstr("<td class=\"detail\">pending: "));
  EXPECT_THAT(body, HasSubstr("data-reason=\"MigReserved\" data-pod=\"default/train-1\""));
  EXPECT_THAT(body, HasSubstr("data-reason=\"MigPending\" data-pod=\"default/too-big\""));
  const LiveSnapshot live = s->Live();
  ASSERT_EQ(live.pending.size(), 1u);
  EXPECT_EQ(live.pending_total, 1u);
  EXPECT_EQ(live.pending[0].pod, "default/too-big");
  EXPECT_EQ(live.events.size(), 2u);
  EXPECT_EQ(live.events[0].pod, "default/too-big");  // newest first
}

class TlsSchedulerTest : public SchedulerTest {
 protected:
  void SetUp() override {
    SchedulerTest::SetUp();
    dir_ = std::filesystem::temp_directory_path() / fmt::format("dynmig-sched-tls-{}", getpid());
    std::filesystem::create_directories(dir_);
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
  // POST over HTTPS, trusting only `ca_file`.
  std::optional<json> PostTls(int port, const std::string& ca_file, const std::string& path,
                              const std::string& body) {
    httplib::SSLClient client("127.0.0.1", port);
    client.set_ca_cert_path(ca_file.c_str());
    client.enable_server_certificate_verification(true);
    auto res = client.Post(path.c_str(), body, "application/json");
    if (!res) return std::nullopt;
    return json::parse(res->body, nullptr, false);
  }
  std::filesystem::path dir_;
};

TEST_F(TlsSchedulerTest, WebhookOverHttpsAndARotatedCertificateIsServedWithoutRestart) {
  const auto first = dynmig::testing::MakeTestCert("dynmig-scheduler", 11);
  const auto second = dynmig::testing::MakeTestCert("dynmig-scheduler", 22);
  SchedulerServerOptions o = DefaultOptions();
  o.tls_cert_file = Put("tls.crt", first.cert_pem);
  o.tls_key_file = Put("tls.key", first.key_pem);
  SchedulerServer* s = StartScheduler(o);
  EXPECT_THAT(s->url(), HasSubstr("https://127.0.0.1:"));
  const std::string ca1 = Put("ca1.crt", first.cert_pem);
  const std::string ca2 = Put("ca2.crt", second.cert_pem);

  json review = {{"apiVersion", "admission.k8s.io/v1"},
                 {"kind", "AdmissionReview"},
                 {"request",
                  {{"uid", "u-1"},
                   {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
                   {"operation", "CREATE"},
                   {"namespace", "default"},
                   {"userInfo", {{"username", "alice"}}},
                   {"object", MigPod("p", 4000)}}}};
  review["request"]["object"]["spec"].erase("schedulerName");
  auto answer = PostTls(s->port(), ca1, "/webhook", review.dump());
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ((*answer)["response"]["uid"], "u-1");
  EXPECT_EQ((*answer)["response"]["allowed"], true);
  std::string patch;
  ASSERT_TRUE(absl::Base64Unescape((*answer)["response"]["patch"].get<std::string>(), &patch));
  EXPECT_EQ(json::parse(patch)[0]["value"], "dynmig-scheduler");
  // A typo'd preference is rejected with the valid choices.
  review["request"]["object"]["metadata"]["annotations"] = {
      {"nvidia.com/mig-profile-preference", "3g.20"}};
  answer = PostTls(s->port(), ca1, "/webhook", review.dump());
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ((*answer)["response"]["allowed"], false);
  EXPECT_THAT((*answer)["response"]["status"]["message"].get<std::string>(),
              HasSubstr("\"3g.20\" matches no profile of the MIG profile allowlist"));
  EXPECT_THAT((*answer)["response"]["status"]["message"].get<std::string>(),
              HasSubstr("valid choices: 1g.5gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb, 1g, 2g, 3g, "
                        "4g, 7g"));

  // Rotate: the next connection presents the new certificate.
  EXPECT_FALSE(PostTls(s->port(), ca2, "/webhook", review.dump()).has_value());
  Put("tls.crt", second.cert_pem);
  Put("tls.key", second.key_pem);
  EXPECT_TRUE(PostTls(s->port(), ca2, "/webhook", review.dump()).has_value());
  EXPECT_FALSE(PostTls(s->port(), ca1, "/webhook", review.dump()).has_value());
  EXPECT_EQ(s->cert_reloader()->reloads(), 1);
}

TEST_F(TlsSchedulerTest, UnusableCertificatesFailTheStart) {
  SchedulerServerOptions o = DefaultOptions();
  o.tls_cert_file = (dir_ / "missing.crt").string();
  o.tls_key_file = (dir_ / "missing.key").string();
  auto server = SchedulerServer::Start(*client_, clock_, o);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("missing.crt"));
}

// ---- dynmig scheduler --------------------------------------------------------------------------

TEST_F(TlsSchedulerTest, CommandRefusesBadFlags) {
  std::ostringstream out, err;
  EXPECT_EQ(cli::RunCli({"scheduler", "--in-cluster"}, out, err), cli::kExitBadInput);
  EXPECT_THAT(err.str(), HasSubstr("--device-config is required"));
  const std::string config = Put("device-config.yaml", protocol::DefaultDeviceConfigYaml());
  const std::string kubeconfig = Put("kubeconfig", "apiVersion: v1\nkind: Config\n");
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--device-config", config}, "give exactly one of --kubeconfig FILE and --in-cluster"},
           {{"--device-config", config, "--in-cluster", "--kubeconfig", kubeconfig},
            "give exactly one of"},
           {{"--device-config", config, "--kubeconfig", kubeconfig, "--reservation-ttl", "soon"},
            "--reservation-ttl: 'soon' is not a positive duration"},
           {{"--device-config", config, "--kubeconfig", kubeconfig, "--listen", "8443"},
            "--listen must be HOST:PORT"},
           {{"--device-config", config, "--kubeconfig", kubeconfig, "--requeue-interval", "1ns"},
            "--requeue-interval: '1ns' is not 0 (off) or a duration of at least 100ms"},
           {{"--device-config", config, "--kubeconfig", kubeconfig, "--requeue-interval", "-1s"},
            "--requeue-interval: '-1s' is not 0 (off)"},
           {{"--device-config", config, "--kubeconfig", kubeconfig, "--requeue-interval", "often"},
            "--requeue-interval: 'often'"},
           {{"--device-config", config, "--kubeconfig", kubeconfig, "--mode-switch-interval",
             "10ms"},
            "--mode-switch-interval: '10ms' is not 0 (off) or a duration between 1s and 1h"},
           {{"--device-config", config, "--kubeconfig", kubeconfig, "--mode-switch-interval",
             std::string(1000, '9')},
            "--mode-switch-interval: '99999999999999999999999999999999' is not"},
           {{"--device-config", config, "--kubeconfig", kubeconfig, "--tls-cert", "x"},
            "--tls-cert and --tls-key go together"},
           {{"--device-config", (dir_ / "nope.yaml").string(), "--kubeconfig", kubeconfig},
            "nope.yaml"},
       }) {
    std::vector<std::string> args = {"scheduler"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    std::ostringstream o, e;
    EXPECT_EQ(cli::RunCli(args, o, e), cli::kExitBadInput) << e.str();
    EXPECT_THAT(e.str(), HasSubstr(c.message));
  }
}

TEST_F(TlsSchedulerTest, CommandServesUntilSigterm) {
  const char* env = std::getenv("DYNMIG_BINARY");
  const std::string binary = env != nullptr ? env : DYNMIG_BIN;  // the build's, by default
  ASSERT_TRUE(std::filesystem::exists(binary)) << binary;
  CreateNode(MigNode("node-a", {"GPU-a0"}));
  const std::string config = Put("device-config.yaml", protocol::DefaultDeviceConfigYaml());
  const std::string kubeconfig =
      Put("kubeconfig",
          fmt::format("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: "
                      "{}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n"
                      "current-context: c\nusers:\n- name: u\n  user: {{}}\n",
                      api_->url()));
  int out_pipe[2];
  ASSERT_EQ(pipe(out_pipe), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out_pipe[1], STDOUT_FILENO);
    close(out_pipe[0]);
    execl(binary.c_str(), binary.c_str(), "scheduler", "--kubeconfig", kubeconfig.c_str(),
          "--device-config", config.c_str(), "--listen", "127.0.0.1:0", "--log-level", "warn",
          nullptr);
    _exit(127);
  }
  close(out_pipe[1]);
  FILE* out = fdopen(out_pipe[0], "r");
  char line[512] = {};
  ASSERT_NE(fgets(line, sizeof(line), out), nullptr);
  const std::string first(line);
  ASSERT_THAT(first, HasSubstr("dynmig scheduler listening on http://127.0.0.1:"));
  const int port = std::stoi(first.substr(first.rfind(':') + 1));
  EXPECT_TRUE(kube::testing::Eventually([&] { return Get(port, "/readyz").status == 200; }));
  const kube::Object pod = CreatePod(MigPod("p", 4000));
  EXPECT_TRUE(kube::testing::Eventually([&] {
    return Post(port, "/filter", FilterBody(pod, {"node-a"}).dump()).body["NodeNames"] ==
           json::array({"node-a"});
  }));
  // The filter holds the reservation in memory; the bind writes it on the pod.
  EXPECT_FALSE(kube::Annotation(GetPod("p"), "hami.io/vgpu-node").has_value());
  const json bind = {{"PodName", "p"},
                     {"PodNamespace", "default"},
                     {"PodUID", kube::Uid(pod)},
                     {"Node", "node-a"}};
  EXPECT_EQ(Post(port, "/bind", bind.dump()).body["Error"], "");
  EXPECT_EQ(kube::Annotation(GetPod("p"), "hami.io/vgpu-node"), "node-a");
  // The command injects the layout page (GET /layout), with the pod it just reserved.
  HttpResult layout = Get(port, "/layout");
  EXPECT_EQ(layout.status, 200);
  EXPECT_THAT(layout.text, HasSubstr("data-node=\"node-a\""));
  EXPECT_THAT(layout.text, HasSubstr("default/p"));
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  fclose(out);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace dynmig::scheduler::testing
