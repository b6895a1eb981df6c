// DevicePlugin: the whole node agent in one object, runnable in-process (tests, the local mode)
// and by `dynmig device-plugin`:
//
//   nvml::SimNvml / DlopenNvml  ─┐
//   kube::KubeClient            ─┤
//   PodResourcesSource (kubelet)─┼─> PluginCore ──> GrpcEndpoint (kubelet socket, registration)
//                                │                ─> HTTP listeners (/metrics, /healthz; /nvml)
//                                └─> EventRecorder, Metrics
//   plus a loop: every reconcile interval RefreshDevices + Reconcile, every register interval
//   (and whenever health changes) PublishNode.
//
//   DevicePluginOptions o;
//   o.core.node_name = "node-a";
//   o.core.allowlist = config.allowlist;
//   o.kubelet_dir = "/tmp/dp";            // the test kubelet's directory
//   o.metrics_listen = "127.0.0.1:0";
//   auto plugin = DevicePlugin::Start(std::move(o), nvml, kube);   // serves and registers
//   ... (*plugin)->core().Reconcile(); (*plugin)->http_port(); ...
//   (*plugin)->Stop();
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "deviceplugin/events.h"
#include "deviceplugin/grpc_endpoint.h"
#include "deviceplugin/metrics.h"
#include "deviceplugin/plugin_core.h"
#include "deviceplugin/pod_resources.h"
#include "deviceplugin/runtime_source.h"
#include "kube/kube_client.h"
#include "nvml/nvml.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace dynmig::deviceplugin {

struct DevicePluginOptions {
  // node_name, allowlist, resource_name, cdi_dir, ... ; state_file defaults to
  // <kubelet_dir>/dynmig/state.json (a directory: the kubelet's restart cleanup removes sockets
  // and, in old kubelets, every plain file of kubelet_dir, but never directories).
  PluginCoreOptions core;
  // The clock of the loop's intervals, the kubelet watcher, events and timed waits, and of the
  // core when core.clock is unset; must outlive the plugin. null = RealClock().
  const Clock* clock = &RealClock();
  std::string kubelet_dir = "/var/lib/kubelet/device-plugins";
  std::string socket_name = "dynmig.sock";
  absl::Duration reconcile_interval = absl::Seconds(5);
  absl::Duration register_interval = absl::Seconds(30);
  absl::Duration kubelet_poll_interval = absl::Seconds(1);
  // "HOST:PORT" for /metrics and /healthz; port 0 picks a free one; "" = no listener. /metrics
  // names no pod (GPU UUIDs, profiles, counts) unless metrics_pod_identity, so it may listen on
  // every interface.
  std::string metrics_listen;
  // The kubelet's PodResources socket; "" = beside kubelet_dir (PodResourcesSocketBeside:
  // /var/lib/kubelet/device-plugins -> /var/lib/kubelet/pod-resources/kubelet.sock).
  std::string pod_resources_socket;
  absl::Duration pod_resources_timeout = absl::Seconds(5);
  // The container runtime's CRI socket (handover's runtime evidence, handover.h), read when
  // core.runtime is null; "" = no runtime (`dynmig device-plugin --cri-socket` defaults to
  // kDefaultCriSocket).
  std::string cri_socket;
  // "HOST:PORT" for /nvml (and /healthz), which names the pods that own MIG instances: keep it on
  // a loopback address (`dynmig device-plugin` defaults to 127.0.0.1:9401). "" or equal to
  // metrics_listen: /nvml is served on the metrics listener when that listener is on a loopback
  // address (or equal to this), else nowhere.
  std::string nvml_listen;
  // /metrics also exports dynmig_mig_instance_info (metrics.h), which names the pod, namespace and
  // container holding each live instance: workload identity on metrics_listen. Off by default.
  bool metrics_pod_identity = false;
};

class DevicePlugin {
 public:
  // Starts everything: core (discovery, recovery), gRPC endpoint (serve + register), HTTP
  // listener, loop. `nvml` and `kube` (and `pod_resources` when given) must outlive the plugin;
  // without `pod_resources` the plugin reads the kubelet's PodResources API on
  // options.pod_resources_socket. Errors: bad options, NVML unreadable, the state file
  // unwritable, the socket or the listen address unusable.
  static absl::StatusOr<std::unique_ptr<DevicePlugin>> Start(
      DevicePluginOptions options, nvml::Nvml& nvml, kube::KubeClient& kube,
      PodResourcesSource* pod_resources = nullptr);
  ~DevicePlugin();  // Stop()
  DevicePlugin(const DevicePlugin&) = delete;
  DevicePlugin& operator=(const DevicePlugin&) = delete;

  // Stops the loop, the endpoint (its socket is removed) and the listener. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  PluginCore& core() { return *core_; }
  GrpcEndpoint& endpoint() { return *endpoint_; }
  Metrics& metrics() { return *metrics_; }
  EventRecorder& events() { return *events_; }
  const DevicePluginOptions& options() const { return options_; }
  // The metrics listener's port (0 without one).
  int http_port() const { return metrics_http_.port; }
  // The port /nvml is served on (0: not served).
  int nvml_port() const {
    return nvml_http_.port != 0 ? nvml_http_.port
                                : (MetricsListenerServesNvml(options_) ? metrics_http_.port : 0);
  }
  // Whether the metrics listener serves /nvml too under `options` (see nvml_listen).
  static bool MetricsListenerServesNvml(const DevicePluginOptions& options);

  // Runs a loop cycle now (refresh, reconcile, publish) and waits for it (`timeout` of the
  // clock's time).
  bool RunCycle(absl::Duration timeout = absl::Seconds(30)) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t cycles() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  DevicePlugin(DevicePluginOptions options, nvml::Nvml& nvml, kube::KubeClient& kube);
  struct HttpListener {
    std::unique_ptr<httplib::Server> server;
    std::thread thread;
    int port = 0;
  };
  absl::Status StartHttp();
  // Serves /healthz, and /metrics and /nvml when asked, on `listen` (named `flag` in errors).
  absl::Status Listen(const std::string& listen, std::string_view flag, bool metrics, bool nvml,
                      HttpListener& out);
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // One cycle's work: refresh, reconcile, and publish when devices or idle instances changed or
  // `next_publish` (monotonic) passed, which then moves on. Returns the monotonic time it ran at.
  absl::Duration Cycle(absl::Duration& next_publish) ABSL_LOCKS_EXCLUDED(mu_);

  DevicePluginOptions options_;
  const Clock& clock_;
  nvml::Nvml& nvml_;
  kube::KubeClient& kube_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<EventRecorder> events_;
  std::unique_ptr<PodResourcesSource> own_pod_resources_;  // when none was given
  std::unique_ptr<ContainerRuntimeSource> own_runtime_;    // from cri_socket, when none was given
  std::unique_ptr<PluginCore> core_;
  std::unique_ptr<GrpcEndpoint> endpoint_;
  HttpListener metrics_http_;
  HttpListener nvml_http_;

  mutable dynmig::Mutex mu_;
  dynmig::CondVar cv_;  // signalled on stop, on a wake request and when a cycle completes
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t wake_requests_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t completed_wakes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t cycles_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread loop_;
};

}  // namespace dynmig::deviceplugin
