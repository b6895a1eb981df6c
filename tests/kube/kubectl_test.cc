// Real kubectl against the in-memory API server, and the `dynmig apiserver` binary.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>

#include "common/strings.h"
#include "kube_test_util.h"
#include "test_webhook_server.h"

namespace dynmig::kube {
namespace {

using ::testing::HasSubstr;

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CommandResult RunShell(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) result.output.append(buf.data(), n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string FindKubectl() {
  for (const char* candidate : {"/usr/bin/kubectl", "/usr/local/bin/kubectl"}) {
    if (access(candidate, X_OK) == 0) return candidate;
  }
  CommandResult which = RunShell("command -v kubectl");
  if (which.exit_code == 0) return std::string(dynmig::Trim(which.output));
  return "";
}

class KubectlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kubectl_ = FindKubectl();
    if (kubectl_.empty()) {
      GTEST_SKIP() << "kubectl not found on PATH or in /usr/bin: skipping the real-kubectl test";
    }
    auto server = InMemoryApiServer::Start(testing::FastServerOptions());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    client_ = testing::MakeClient(server_->url());
    dir_ = std::filesystem::temp_directory_path() / fmt::format("dynmig-kubectl-{}", getpid());
    std::filesystem::create_directories(dir_);
    kubeconfig_ = (dir_ / "kubeconfig").string();
    std::ofstream(kubeconfig_) << fmt::format(R"(apiVersion: v1
kind: Config
clusters:
- name: mem
  cluster: {{server: "{}"}}
contexts:
- name: mem
  context: {{cluster: mem, user: me, namespace: default}}
current-context: mem
users:
- name: me
  user: {{}}
)",
                                              server_->url());
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // kubectl with the kubeconfig and a private discovery cache.
  CommandResult Kubectl(const std::string& args) {
    return RunShell(fmt::format("{} --kubeconfig {} --cache-dir {} --request-timeout=20s {}",
                                kubectl_, kubeconfig_, (dir_ / "cache").string(), args));
  }

  std::string kubectl_;
  std::unique_ptr<InMemoryApiServer> server_;
  std::unique_ptr<RestKubeClient> client_;
  std::filesystem::path dir_;
  std::string kubeconfig_;
};

TEST_F(KubectlTest, ApplyGetAnnotateLabelDelete) {
  const std::string manifest = (dir_ / "pod.yaml").string();
  std::ofstream(manifest) << R"(apiVersion: v1
kind: Pod
metadata:
  name: gpu-job
  labels: {app: trainer}
spec:
  containers:
  - name: main
    image: busybox
    resources:
      limits: {nvidia.com/gpu: "1"}  # a string, as the API stores it: re-apply is a no-op
)";
  CommandResult applied = Kubectl(fmt::format("apply -f {}", manifest));
  ASSERT_EQ(applied.exit_code, 0) << applied.output;
  EXPECT_THAT(applied.output, HasSubstr("pod/gpu-job created"));
  // Applying again is a no-op (GET + strategic merge patch with nothing to change).
  CommandResult again = Kubectl(fmt::format("apply -f {}", manifest));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_THAT(again.output, HasSubstr("pod/gpu-job unchanged"));
  EXPECT_THAT(applied.output + again.output, ::testing::Not(HasSubstr("arning")));

  CommandResult json = Kubectl("get pods -o json");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  const Object list = Object::parse(json.output);
  ASSERT_EQ(list["items"].size(), 1u);
  EXPECT_EQ(Name(list["items"][0]), "gpu-job");
  EXPECT_TRUE(Annotation(list["items"][0], "kubectl.kubernetes.io/last-applied-configuration"));
  EXPECT_EQ(list["items"][0]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            "1");

  CommandResult annotated = Kubectl("annotate pod gpu-job hami.io/bind-phase=allocating");
  ASSERT_EQ(annotated.exit_code, 0) << annotated.output;
  CommandResult labeled = Kubectl("label pod gpu-job tier=gpu");
  ASSERT_EQ(labeled.exit_code, 0) << labeled.output;
  auto pod = client_->GetPod("default", "gpu-job");
  ASSERT_TRUE(pod.ok());
  EXPECT_EQ(Annotation(*pod, "hami.io/bind-phase"), "allocating");
  EXPECT_EQ(Label(*pod, "tier"), "gpu");

  CommandResult selected = Kubectl("get pods -l 'tier in (gpu),app=trainer' -o name");
  ASSERT_EQ(selected.exit_code, 0) << selected.output;
  EXPECT_EQ(selected.output, "pod/gpu-job\n");
  CommandResult yaml = Kubectl("get pod gpu-job -o yaml");
  ASSERT_EQ(yaml.exit_code, 0) << yaml.output;
  EXPECT_THAT(yaml.output, HasSubstr("hami.io/bind-phase: allocating"));

  ASSERT_TRUE(client_->CreateNode(testing::MakeNode("gpu-node-1")).ok());
  CommandResult wide = Kubectl("get pods,nodes -o wide");
  ASSERT_EQ(wide.exit_code, 0) << wide.output;
  EXPECT_THAT(wide.output, HasSubstr("pod/gpu-job"));
  EXPECT_THAT(wide.output, HasSubstr("node/gpu-node-1"));
  EXPECT_THAT(wide.output, HasSubstr("NOMINATED NODE"));  // server-side Table, wide columns
  EXPECT_THAT(wide.output, HasSubstr("INTERNAL-IP"));

  // --server instead of a kubeconfig.
  CommandResult direct =
      RunShell(fmt::format("{} --server {} --cache-dir {} get nodes -o name", kubectl_,
                           server_->url(), (dir_ / "cache2").string()));
  ASSERT_EQ(direct.exit_code, 0) << direct.output;
  EXPECT_EQ(direct.output, "node/gpu-node-1\n");

  CommandResult deleted = Kubectl("delete pod gpu-job");
  ASSERT_EQ(deleted.exit_code, 0) << deleted.output;
  EXPECT_THAT(deleted.output, HasSubstr("pod \"gpu-job\" deleted"));
  EXPECT_EQ(client_->GetPod("default", "gpu-job").status().code(), absl::StatusCode::kNotFound);
  CommandResult missing = Kubectl("get pod gpu-job");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_THAT(missing.output, HasSubstr("pods \"gpu-job\" not found"));
}

TEST_F(KubectlTest, CreateAndWatch) {
  const std::string manifest = (dir_ / "node.json").string();
  std::ofstream(manifest) << testing::MakeNode("n1").dump();
  CommandResult created = Kubectl(fmt::format("create -f {}", manifest));
  ASSERT_EQ(created.exit_code, 0) << created.output;
  EXPECT_THAT(created.output, HasSubstr("node/n1 created"));

  // `kubectl get -w` prints the current state, then changes; it ends after 4 s.
  auto watching = std::async(std::launch::async, [&] {
    return RunShell(fmt::format("timeout 4 {} --kubeconfig {} --cache-dir {} get nodes -w",
                                kubectl_, kubeconfig_, (dir_ / "cache").string()));
  });
  ASSERT_TRUE(testing::Eventually([&] { return server_->open_watches() == 1; }));
  ASSERT_TRUE(
      client_->PatchNodeMetadata("n1", {.labels = {{"node-role.kubernetes.io/gpu", ""}}}).ok());
  const CommandResult watched = watching.get();
  EXPECT_THAT(watched.output, HasSubstr("NAME"));
  EXPECT_THAT(watched.output, HasSubstr("n1 "));
  EXPECT_THAT(watched.output, HasSubstr("gpu"));  // the role column of the watched change
}

// Plain `kubectl apply/create -f` validate on the server: kubectl finds `fieldValidation` in the
// OpenAPI v3 document of api/v1 and sends fieldValidation=Strict instead of downloading
// /openapi/v2. --validate=false and --dry-run=server work too.
TEST_F(KubectlTest, ServerSideFieldValidationAndDryRun) {
  const std::string manifest = (dir_ / "pod.yaml").string();
  std::ofstream(manifest) << R"(apiVersion: v1
kind: Pod
metadata: {name: checked}
spec:
  containers: [{name: main, image: busybox}]
)";
  CommandResult created = Kubectl(fmt::format("create -v=6 -f {}", manifest));
  ASSERT_EQ(created.exit_code, 0) << created.output;
  EXPECT_THAT(created.output, HasSubstr("pod/checked created"));
  EXPECT_THAT(created.output, HasSubstr("/openapi/v3/api/v1?hash="));
  EXPECT_THAT(created.output, HasSubstr("fieldValidation=Strict"));
  EXPECT_THAT(created.output, ::testing::Not(HasSubstr("/openapi/v2")));

  CommandResult warn = Kubectl(fmt::format("apply --validate=warn -f {}", manifest));
  ASSERT_EQ(warn.exit_code, 0) << warn.output;
  CommandResult off = Kubectl(fmt::format("apply --validate=false -f {}", manifest));
  ASSERT_EQ(off.exit_code, 0) << off.output;
  EXPECT_THAT(off.output, HasSubstr("pod/checked"));

  const std::string other = (dir_ / "dry.yaml").string();
  std::ofstream(other) << R"(apiVersion: v1
kind: Pod
metadata: {name: dry}
spec:
  containers: [{name: main, image: busybox}]
)";
  CommandResult dry = Kubectl(fmt::format("apply --dry-run=server -f {}", other));
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_THAT(dry.output, HasSubstr("pod/dry created (server dry run)"));
  EXPECT_EQ(client_->GetPod("default", "dry").status().code(), absl::StatusCode::kNotFound);
}

// A validating webhook's denial as kubectl users see it.
TEST_F(KubectlTest, WebhookDenialReachesKubectl) {
  testing::TestWebhookServer hooks;
  ASSERT_TRUE(hooks.ok());
  hooks.On("/validate", [](const Object& request) {
    if (Annotation(request["object"], "deny")) {
      return Object{{"allowed", false}, {"status", {{"code", 403}, {"message", "no GPUs today"}}}};
    }
    return Object{{"allowed", true}};
  });
  AdmissionWebhook hook;
  hook.name = "validate.dynmig.test";
  hook.url = hooks.url("/validate");
  server_->SetAdmissionWebhooks({hook});
  const std::string manifest = (dir_ / "denied.yaml").string();
  std::ofstream(manifest) << R"(apiVersion: v1
kind: Pod
metadata: {name: denied, annotations: {deny: "yes"}}
spec:
  containers: [{name: main, image: busybox}]
)";
  CommandResult applied = Kubectl(fmt::format("apply -f {}", manifest));
  EXPECT_NE(applied.exit_code, 0);
  EXPECT_THAT(applied.output,
              HasSubstr("admission webhook \"validate.dynmig.test\" denied the request: no GPUs "
                        "today"));
  EXPECT_EQ(hooks.RequestsTo("/validate").size(), 1u);
  server_->SetAdmissionWebhooks({});
}

// ---- The `dynmig apiserver` command, as a process. ----

// $DYNMIG_BINARY, else `dynmig` next to this test binary (both go to build*/bin).
std::string DynmigBinary() {
  const char* env = std::getenv("DYNMIG_BINARY");
  if (env != nullptr && access(env, X_OK) == 0) return env;
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const std::string sibling = (self.parent_path() / "dynmig").string();
  return access(sibling.c_str(), X_OK) == 0 ? sibling : "";
}

TEST(ApiserverCommandTest, ServesUntilSigterm) {
  const std::string binary = DynmigBinary();
  if (binary.empty())
    GTEST_SKIP() << "the dynmig binary is not built (DYNMIG_BINARY unset): skipping";
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("dynmig-cmd-{}", getpid());
  std::filesystem::create_directories(dir);
  const std::string kubeconfig = (dir / "kubeconfig").string();
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    execl(binary.c_str(), binary.c_str(), "apiserver", "--listen", "127.0.0.1:0",
          "--kubeconfig-out", kubeconfig.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  FILE* stream = fdopen(out[0], "r");
  char line[512] = {0};
  ASSERT_NE(fgets(line, sizeof(line), stream), nullptr);
  const std::string first(line);
  ASSERT_THAT(first, HasSubstr("listening on http://127.0.0.1:"));
  const std::string url(Trim(first.substr(first.find("http://"))));

  auto config = LoadKubeconfig(kubeconfig);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, url);
  auto client = RestKubeClient::Create(*config);
  ASSERT_TRUE(client.ok());
  auto node = (*client)->CreateNode(testing::MakeNode("n1"));
  EXPECT_TRUE(node.ok()) << node.status();
  client->reset();

  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::string rest;
  while (fgets(line, sizeof(line), stream) != nullptr) rest += line;
  fclose(stream);
  EXPECT_THAT(rest, HasSubstr("stopping"));
  std::filesystem::remove_all(dir);
}

TEST(ApiserverCommandTest, BadListenAddressIsBadInput) {
  const std::string binary = DynmigBinary();
  if (binary.empty())
    GTEST_SKIP() << "the dynmig binary is not built (DYNMIG_BINARY unset): skipping";
  CommandResult r = RunShell(binary + " apiserver --listen nonsense");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--listen must be HOST:PORT"));
  CommandResult port = RunShell(binary + " apiserver --listen 127.0.0.1:99999");
  EXPECT_EQ(port.exit_code, 2);
  EXPECT_THAT(port.output, HasSubstr("bad port"));
}

}  // namespace
}  // namespace dynmig::kube
