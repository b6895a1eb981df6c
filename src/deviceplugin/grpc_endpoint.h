// The kubelet side of the device plugin: the v1beta1 DevicePlugin gRPC service on
// <kubelet dir>/<socket name> (a unix socket), registration with <kubelet dir>/kubelet.sock, and
// re-registration when the kubelet restarts.
//
// A kubelet restart removes the plugin sockets of the directory and creates kubelet.sock anew.
// The endpoint polls both: when its own socket is gone it serves again on a new one, and when
// kubelet.sock has a new inode (or appears) it registers again. ListAndWatch streams loop with
// timed waits and end when the server stops or the kubelet cancels. Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "deviceplugin/metrics.h"
#include "deviceplugin/plugin_core.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace dynmig::deviceplugin {

inline constexpr std::string_view kDevicePluginVersion = "v1beta1";
inline constexpr std::string_view kKubeletSocketName = "kubelet.sock";

struct EndpointOptions {
  std::string kubelet_dir = "/var/lib/kubelet/device-plugins";
  std::string socket_name = "dynmig.sock";
  std::string resource_name = "nvidia.com/gpu";
  absl::Duration kubelet_poll_interval = absl::Seconds(1);
  absl::Duration register_timeout = absl::Seconds(10);
};

class GrpcEndpoint {
 public:
  // `core` and `metrics` must outlive the endpoint.
  GrpcEndpoint(EndpointOptions options, PluginCore& core, Metrics& metrics);
  ~GrpcEndpoint();  // Stop()
  GrpcEndpoint(const GrpcEndpoint&) = delete;
  GrpcEndpoint& operator=(const GrpcEndpoint&) = delete;

  // Serves on the socket (a stale file is removed first), tries to register once, and starts the
  // kubelet watcher, which retries registration until it succeeds. Errors: the socket path is
  // longer than a unix socket allows (107 bytes), or gRPC cannot listen on it.
  absl::Status Start();
  // Stops the watcher and the server (open streams end), removes the socket. Idempotent.
  void Stop();

  std::string socket_path() const;
  std::string kubelet_socket_path() const;
  int registrations() const;
  bool registered() const;
  // Waits until at least `count` successful registrations happened.
  bool WaitForRegistrations(int count, absl::Duration timeout) const;

 private:
  class Service;

  absl::Status Serve();  // REQUIRES: server_mu_ held
  void StopServer();     // REQUIRES: server_mu_ held
  absl::Status Register();
  void Watch();

  const EndpointOptions options_;
  PluginCore& core_;
  Metrics& metrics_;
  std::unique_ptr<Service> service_;

  std::mutex server_mu_;
  std::unique_ptr<grpc::Server> server_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool stop_ = false;
  bool registered_ = false;
  int registrations_ = 0;
  bool started_ = false;
  std::thread watcher_;
};

}  // namespace dynmig::deviceplugin
