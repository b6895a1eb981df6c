// The local mode's legacy world (LocalClusterOptions::legacy_geometry, nvidia_standin_nodes) and
// the container runtime stand-in beside each kubelet stand-in.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>

#include "cri/v1/api.grpc.pb.h"
#include "deviceplugin/nvidia_standin.h"
#include "deviceplugin/test_kubelet.h"
#include "deviceplugin/test_runtime.h"
#include "local/local_cluster.h"

namespace dynmig::local {
namespace {

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

TEST(LegacyWorldTest, GeometryStandInAndRuntimeOnANode) {
  char buf[] = "/tmp/lw.XXXXXX";
  ASSERT_NE(::mkdtemp(buf), nullptr);
  const std::string dir = buf;
  LocalClusterOptions o;
  o.api_port = 0;
  o.nodes = {{"node-a", "H200x1"}};
  o.state_dir = dir;
  o.node_address_prefix = "127.2." + std::to_string(::getpid() % 250) + ".";
  o.nvml_port = FreePort();
  o.legacy_geometry = {{"node-a", "1g.18gb=1,2g.35gb=3"}};
  o.nvidia_standin_nodes = {"node-a"};
  std::mutex mu;
  std::vector<std::string> log;
  o.log = [&](const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    log.push_back(line);
  };
  auto cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_NE(
        std::find(log.begin(), log.end(), "node-a: GPU 0 geometry 1g.18gb=1,2g.35gb=3 applied"),
        log.end());
  }
  // NVIDIA's stand-in registered its two resources beside dynmig's.
  deviceplugin::NvidiaStandin* standin = (*cluster)->nvidia_standin("node-a");
  ASSERT_NE(standin, nullptr);
  EXPECT_EQ(standin->profiles(), (std::vector<std::string>{"1g.18gb", "2g.35gb"}));
  ASSERT_TRUE(standin->WaitForRegistrations(1, absl::Seconds(20)));
  deviceplugin::TestKubelet* kubelet = (*cluster)->kubelet("node-a");
  ASSERT_NE(kubelet, nullptr);
  EXPECT_TRUE(kubelet->plugin("nvidia.com/mig-2g.35gb").has_value());
  EXPECT_TRUE(kubelet->plugin("nvidia.com/gpu").has_value()) << "dynmig's plugin registered too";

  // The runtime answers CRI beside the kubelet's sockets.
  const std::string socket = (*cluster)->runtime_socket("node-a");
  ASSERT_NE((*cluster)->runtime("node-a"), nullptr);
  EXPECT_EQ(socket, (*cluster)->runtime("node-a")->socket_path());
  auto stub = runtime::v1::RuntimeService::NewStub(
      grpc::CreateChannel("unix://" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  runtime::v1::ListContainersResponse listed;
  EXPECT_TRUE(stub->ListContainers(&ctx, {}, &listed).ok());

  // The legacy component leaves the node: its sockets go away.
  ASSERT_TRUE((*cluster)->StopNvidiaStandin("node-a").ok());
  EXPECT_EQ((*cluster)->nvidia_standin("node-a"), nullptr);
  EXPECT_FALSE(std::filesystem::exists(kubelet->dir() + "/nvidia-mig-2g.35gb.sock"));
  EXPECT_EQ((*cluster)->StopNvidiaStandin("node-a").code(), absl::StatusCode::kNotFound);
  (*cluster)->Stop();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace dynmig::local
