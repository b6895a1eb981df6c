// `dynmig local` as a user runs it: a process that prints where things are, serves kubectl,
// restarts a part through its control endpoint, and stops on SIGINT.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>

#include "e2e/e2e_test_util.h"
#include "fmt/format.h"

namespace dynmig::e2e {
namespace {

std::pair<int, std::string> Shell(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  return {::pclose(p), out};
}

class LocalProcess {
 public:
  explicit LocalProcess(const std::vector<std::string>& args) {
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    fd_ = fds[0];
  }
  ~LocalProcess() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }

  // Reads output until `needle` appears (true) or the timeout passes.
  bool ReadUntil(const std::string& needle, absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    while (output_.find(needle) == std::string::npos) {
      const int64_t ms = absl::ToInt64Milliseconds(end - absl::Now());
      if (ms <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(ms)) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fd_, buf, sizeof(buf));
      if (n <= 0) return output_.find(needle) != std::string::npos;
      output_.append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  // Sends SIGINT; the exit code, or -1 when it did not exit in time.
  int Interrupt(absl::Duration timeout) {
    ::kill(pid_, SIGINT);
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      ReadUntil("\x01", absl::Milliseconds(50));  // drain
    }
    return -1;
  }
  const std::string& output() const { return output_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool exited_ = false;
  std::string output_;
};

TEST(LocalCommandTest, ServesKubectlRestartsAPartAndStopsOnSigint) {
  const std::string bin = DYNMIG_BIN;
  const auto dir =
      std::filesystem::temp_directory_path() / ("dynmig-local-cmd-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  LocalProcess p({bin, "local", "--listen", "127.0.0.1:0", "--control", "127.0.0.1:0",
                  "--nvml-port", std::to_string(FreePort()), "--state-dir", dir.string(), "--nodes",
                  "node-a=A100-SXM4-40GBx1"});
  ASSERT_TRUE(p.ReadUntil("Events follow", absl::Seconds(60))) << p.output();
  std::smatch m;
  const std::string out = p.output();
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(\n  kubeconfig\s+(\S+)\n)"))) << out;
  const std::string kubeconfig = m[1];
  ASSERT_TRUE(std::regex_search(
      out, m, std::regex(R"(curl -d '' (http://\S+)/restart/device-plugin/node-a)")))
      << out;
  const std::string control = m[1];

  const bool have_kubectl = Shell("kubectl version --client").first == 0;
  if (have_kubectl) {
    const char* src = std::getenv("DYNMIG_SOURCE_DIR");
    ASSERT_NE(src, nullptr);
    auto [rc, applied] = Shell(fmt::format(
        "kubectl --kubeconfig {} apply -f {}/examples/mig-canary.yaml", kubeconfig, src));
    ASSERT_EQ(rc, 0) << applied;
    ASSERT_TRUE(p.ReadUntil("default/mig-canary running on node-a", absl::Seconds(30)))
        << p.output();
  }
  // The restart endpoint: the device plugin stops and serves again; the pod keeps its instance.
  auto [rc, restarted] =
      Shell(fmt::format("curl -s -f -d '' {}/restart/device-plugin/node-a", control));
  EXPECT_EQ(rc, 0) << restarted;
  EXPECT_EQ(restarted, "ok\n");
  EXPECT_TRUE(p.ReadUntil("node-a/device-plugin: stopped", absl::Seconds(10))) << p.output();
  auto [rc404, unknown] = Shell(fmt::format(
      "curl -s -o /dev/null -w '%{{http_code}}' -d '' {}/restart/device-plugin/nope", control));
  EXPECT_EQ(unknown, "404") << unknown;
  if (have_kubectl) {
    auto [grc, pods] = Shell(fmt::format("kubectl --kubeconfig {} get pods", kubeconfig));
    EXPECT_EQ(grc, 0) << pods;
    EXPECT_NE(pods.find("Running"), std::string::npos) << pods;
  }
  EXPECT_EQ(p.Interrupt(absl::Seconds(20)), 0) << p.output();
  EXPECT_NE(p.output().find("stopping"), std::string::npos) << p.output();
  std::filesystem::remove_all(dir);
}

// Holds 127.0.0.1:PORT listening (or finds it already taken by someone else) for the test.
class HeldPort {
 public:
  explicit HeldPort(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) ::listen(fd_, 1);
  }
  ~HeldPort() { ::close(fd_); }

 private:
  int fd_ = -1;
};

TEST(LocalCommandTest, TakenDefaultPortsAreReplacedByFreeOnesAndSaid) {
  const std::string bin = DYNMIG_BIN;
  const auto dir =
      std::filesystem::temp_directory_path() / ("dynmig-local-ports-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  HeldPort api(6443), control(6444);  // another cluster (k3s, kind) and its neighbour
  LocalProcess p({bin, "local", "--nvml-port", std::to_string(FreePort()), "--state-dir",
                  dir.string(), "--nodes", "node-a=A100-SXM4-40GBx1", "--quiet"});
  ASSERT_TRUE(p.ReadUntil("Events follow", absl::Seconds(60))) << p.output();
  const std::string out = p.output();
  EXPECT_NE(out.find("127.0.0.1:6443 is in use; the API server listens on 127.0.0.1:"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("127.0.0.1:6444 is in use; the control endpoint listens on a free port"),
            std::string::npos)
      << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(API server (https?://[0-9.]+:(\d+)))")))
      << out;
  EXPECT_NE(m[2].str(), "6443") << out;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(\n  kubeconfig\s+(\S+)\n)"))) << out;
  const std::string kubeconfig = m[1];
  if (Shell("kubectl version --client").first == 0) {
    auto [rc, nodes] = Shell(fmt::format("kubectl --kubeconfig {} get nodes", kubeconfig));
    EXPECT_EQ(rc, 0) << nodes;
    EXPECT_NE(nodes.find("node-a"), std::string::npos) << nodes;
  }
  ASSERT_TRUE(
      std::regex_search(out, m, std::regex(R"(curl -d '' (http://\S+)/restart/device-plugin/)")))
      << out;
  EXPECT_EQ(m[1].str().find(":6444"), std::string::npos) << out;
  EXPECT_EQ(p.Interrupt(absl::Seconds(20)), 0) << p.output();
  std::filesystem::remove_all(dir);
}

TEST(LocalCommandTest, BadFlagsExit2AndNameTheFlag) {
  const std::string bin = DYNMIG_BIN;
  auto [rc, out] = Shell(bin + " local --nodes 'node-a=NoSuchGPUx1'");
  EXPECT_EQ(WEXITSTATUS(rc), 2) << out;
  EXPECT_NE(out.find("--nodes"), std::string::npos) << out;
  auto [rc2, out2] = Shell(bin + " local --listen nowhere");
  EXPECT_EQ(WEXITSTATUS(rc2), 2) << out2;
  EXPECT_NE(out2.find("--listen must be HOST:PORT, got 'nowhere'"), std::string::npos) << out2;
  auto [rc3, out3] = Shell(bin + " local --control 127.0.0.1:99999");
  EXPECT_EQ(WEXITSTATUS(rc3), 2) << out3;
  EXPECT_NE(out3.find("bad port '99999' in --control"), std::string::npos) << out3;
}

// A handover's legacy world from the flags: the geometry laid out, NVIDIA's stand-in serving,
// dynmig's plugin held back until the control endpoint starts it; the stand-in stops through it
// too.
TEST(LocalCommandTest, LegacyWorldFlagsAndEndpoints) {
  const std::string bin = DYNMIG_BIN;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("dynmig-local-legacy-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  LocalProcess p({bin, "local", "--listen", "127.0.0.1:0", "--control", "127.0.0.1:0",
                  "--nvml-port", std::to_string(FreePort()), "--state-dir", dir.string(), "--nodes",
                  "node-a=A100-SXM4-40GBx1", "--legacy-geometry", "node-a=1g.5gb=2,2g.10gb=1",
                  "--nvidia-standin", "node-a", "--device-plugin-stopped", "node-a"});
  ASSERT_TRUE(p.ReadUntil("Events follow", absl::Seconds(60))) << p.output();
  EXPECT_NE(p.output().find("GPU 0 geometry 1g.5gb=2,2g.10gb=1 applied"), std::string::npos)
      << p.output();
  EXPECT_NE(p.output().find("node-a/nvidia-device-plugin: serving 2 profile(s)"), std::string::npos)
      << p.output();
  EXPECT_EQ(p.output().find("node-a/device-plugin: serving"), std::string::npos)
      << "dynmig's plugin is held back: " << p.output();
  std::smatch m;
  const std::string out = p.output();
  ASSERT_TRUE(std::regex_search(
      out, m, std::regex(R"(curl -d '' (http://\S+)/restart/device-plugin/node-a)")))
      << out;
  const std::string control = m[1];
  auto code = [&](const std::string& path) {
    return Shell(fmt::format("curl -s -o /dev/null -w '%{{http_code}}' -d '' {}/{}", control, path))
        .second;
  };
  EXPECT_EQ(code("stop/nvidia-device-plugin/node-a"), "200");
  EXPECT_TRUE(p.ReadUntil("node-a/nvidia-device-plugin: stopped", absl::Seconds(10))) << p.output();
  EXPECT_EQ(code("stop/nvidia-device-plugin/node-a"), "404") << "none runs any more";
  EXPECT_EQ(code("stop/nvidia-device-plugin/nope"), "404");
  // Started again on the instances there now (dynmig's plugin, not running yet, cleaned none).
  EXPECT_EQ(code("start/nvidia-device-plugin/node-a"), "200");
  EXPECT_TRUE(p.ReadUntil("node-a/nvidia-device-plugin: serving 2 profile(s)\n", absl::Seconds(10)))
      << p.output();
  EXPECT_EQ(code("stop/nvidia-device-plugin/node-a"), "200");
  EXPECT_EQ(code("start/device-plugin/node-a"), "200");
  EXPECT_TRUE(p.ReadUntil("node-a/device-plugin: serving", absl::Seconds(30))) << p.output();
  EXPECT_EQ(p.Interrupt(absl::Seconds(20)), 0) << p.output();
  std::filesystem::remove_all(dir);
}

TEST(LocalCommandTest, BadLegacyWorldFlagsExit2AndNameTheFlag) {
  const std::string bin = DYNMIG_BIN;
  const std::string nodes = " local --nodes node-a=A100-SXM4-40GBx1 ";
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--legacy-geometry node-a", "--legacy-geometry 'node-a': expected NODE=GEOMETRY"},
           {"--legacy-geometry =1g.5gb=1", "expected NODE=GEOMETRY"},
           {"--legacy-geometry node-z=1g.5gb=1", "--legacy-geometry: no node 'node-z' in --nodes"},
           {"--legacy-geometry node-a=1g.5gb=1 --legacy-geometry node-a=1g.5gb=2",
            "--legacy-geometry: node 'node-a' given twice"},
           {"--legacy-geometry node-a=1g.5gb=banana", "--legacy-geometry node-a:"},
           {"--nvidia-standin node-z", "--nvidia-standin: no node 'node-z' in --nodes"},
           {"--device-plugin-stopped node-a --device-plugin-stopped node-a",
            "--device-plugin-stopped: node 'node-a' given twice"},
       }) {
    auto [rc, out] = Shell(bin + nodes + args);
    EXPECT_EQ(WEXITSTATUS(rc), 2) << args << ": " << out;
    EXPECT_NE(out.find(says), std::string::npos) << args << ": " << out;
  }
}

TEST(LocalCommandTest, DevicePluginSelfPodMustBeNamespaceSlashName) {
  const std::string bin = DYNMIG_BIN;
  for (const std::string& bad :
       std::vector<std::string>{"nope", "/p", "ns/", "a/b/c", std::string(400, 'x') + "/p"}) {
    auto [rc, out] = Shell(bin + " device-plugin --self-pod '" + bad + "'");
    EXPECT_NE(WEXITSTATUS(rc), 0) << bad << ": " << out;
    EXPECT_NE(out.find("--self-pod: expected NAMESPACE/NAME"), std::string::npos)
        << bad << ": " << out;
  }
}

}  // namespace
}  // namespace dynmig::e2e
