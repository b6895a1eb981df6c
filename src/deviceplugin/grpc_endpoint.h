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
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "deviceplugin/metrics.h"
#include "deviceplugin/plugin_core.h"
#include "protocol/annotations.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace dynmig::deviceplugin {

inline constexpr std::string_view kDevicePluginVersion = "v1beta1";
inline constexpr std::string_view kKubeletSocketName = "kubelet.sock";

struct EndpointOptions {
  std::string kubelet_dir = "/var/lib/kubelet/device-plugins";
  std::string socket_name = "dynmig.sock";
  std::string resource_name = std::string(protocol::kResourceCount);
  absl::Duration kubelet_poll_interval = absl::Seconds(1);
  absl::Duration register_timeout = absl::Seconds(10);
};

class GrpcEndpoint {
 public:
  // `core`, `metrics` and `clock` must outlive the endpoint. The kubelet watcher polls and
  // WaitForRegistrations waits on `clock`; gRPC deadlines run on real time.
  GrpcEndpoint(EndpointOptions options, PluginCore& core, Metrics& metrics, const Clock& clock);
  ~GrpcEndpoint();  // Stop()
  GrpcEndpoint(const GrpcEndpoint&) = delete;
  GrpcEndpoint& operator=(const GrpcEndpoint&) = delete;

  // Serves on the socket (a stale file is removed first), tries to register once, and starts the
  // kubelet watcher, which retries registration until it succeeds. Errors: the socket path is
  // longer than a unix socket allows (107 bytes), or gRPC cannot listen on it.
  absl::Status Start() ABSL_LOCKS_EXCLUDED(mu_, server_mu_);
  // Stops the watcher and the server (open streams end), removes the socket. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_, server_mu_);

  std::string socket_path() const;
  std::string kubelet_socket_path() const;
  int registrations() const ABSL_LOCKS_EXCLUDED(mu_);
  bool registered() const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until at least `count` successful registrations happened (`timeout` of the clock's time).
  bool WaitForRegistrations(int count, absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Service;

  absl::Status Serve() ABSL_EXCLUSIVE_LOCKS_REQUIRED(server_mu_);
  void StopServer() ABSL_EXCLUSIVE_LOCKS_REQUIRED(server_mu_);
  absl::Status Register();
  // Registers and records the outcome (a failure is logged; the watcher retries).
  void RegisterAndRecord() ABSL_LOCKS_EXCLUDED(mu_);
  void Watch() ABSL_LOCKS_EXCLUDED(mu_, server_mu_);
  // One poll of the watcher: serves again when our socket is gone, registers again when
  // kubelet.sock is new (or we are not registered yet). `kubelet_inode` and `own_inode` are the
  // inodes seen last; they are updated.
  void Poll(uint64_t& kubelet_inode, uint64_t& own_inode) ABSL_LOCKS_EXCLUDED(mu_, server_mu_);

  const EndpointOptions options_;
  PluginCore& core_;
  Metrics& metrics_;
  const Clock& clock_;
  std::unique_ptr<Service> service_;

  dynmig::Mutex server_mu_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(server_mu_);

  mutable dynmig::Mutex mu_;
  mutable dynmig::CondVar cv_;  // signalled on stop and on every registration
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  int registrations_ ABSL_GUARDED_BY(mu_) = 0;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;
};

}  // namespace dynmig::deviceplugin
