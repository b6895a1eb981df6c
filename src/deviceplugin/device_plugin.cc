#include "deviceplugin/device_plugin.h"

#include <httplib.h>

#include <charconv>

#include "common/bounded_json.h"
#include "common/status_macros.h"
#include "common/strings.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {

DevicePlugin::DevicePlugin(DevicePluginOptions options, nvml::Nvml& nvml, kube::KubeClient& kube)
    : options_(std::move(options)), clock_(*options_.clock), nvml_(nvml), kube_(kube) {}

absl::StatusOr<std::unique_ptr<DevicePlugin>> DevicePlugin::Start(
    DevicePluginOptions options, nvml::Nvml& nvml, kube::KubeClient& kube,
    PodResourcesSource* pod_resources) {
  if (options.kubelet_dir.empty()) {
    return absl::InvalidArgumentError("device plugin: the kubelet directory is required");
  }
  if (options.core.state_file.empty()) {
    options.core.state_file = options.kubelet_dir + "/dynmig/state.json";
  }
  if (options.clock == nullptr) options.clock = &RealClock();
  if (options.core.clock == nullptr) options.core.clock = options.clock;
  if (options.reconcile_interval <= absl::ZeroDuration() ||
      options.register_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("device plugin: intervals must be positive");
  }
  std::unique_ptr<DevicePlugin> plugin(new DevicePlugin(std::move(options), nvml, kube));
  DevicePlugin& p = *plugin;
  p.metrics_ = std::make_unique<Metrics>(p.options_.metrics_pod_identity);
  p.events_ = std::make_unique<EventRecorder>(kube, p.options_.core.component, p.clock_);
  if (pod_resources == nullptr) {
    PodResourcesClientOptions client;
    client.socket = p.options_.pod_resources_socket.empty()
                        ? PodResourcesSocketBeside(p.options_.kubelet_dir)
                        : p.options_.pod_resources_socket;
    client.timeout = p.options_.pod_resources_timeout;
    p.own_pod_resources_ = std::make_unique<GrpcPodResources>(std::move(client));
    pod_resources = p.own_pod_resources_.get();
  }
  spdlog::info("the kubelet's PodResources API: {}", pod_resources->Describe());
  if (p.options_.core.runtime == nullptr && !p.options_.cri_socket.empty()) {
    CriClientOptions cri;
    cri.socket = p.options_.cri_socket;
    p.own_runtime_ = std::make_unique<GrpcCriRuntime>(std::move(cri));
    p.options_.core.runtime = p.own_runtime_.get();
  }
  spdlog::info("the container runtime (CRI): {}", p.options_.core.runtime != nullptr
                                                      ? p.options_.core.runtime->Describe()
                                                      : std::string("not configured"));
  DYNMIG_ASSIGN_OR_RETURN(p.core_, PluginCore::Create(p.options_.core, nvml, kube, *p.metrics_,
                                                      *p.events_, pod_resources));
  DYNMIG_RETURN_IF_ERROR(p.core_->Start());
  if (auto st = p.core_->PublishNode(); !st.ok()) {
    spdlog::warn("{} (retried every {})", std::string(st.message()),
                 absl::FormatDuration(p.options_.register_interval));
  }
  EndpointOptions endpoint;
  endpoint.kubelet_dir = p.options_.kubelet_dir;
  endpoint.socket_name = p.options_.socket_name;
  endpoint.resource_name = p.options_.core.resource_name;
  endpoint.kubelet_poll_interval = p.options_.kubelet_poll_interval;
  p.endpoint_ = std::make_unique<GrpcEndpoint>(endpoint, *p.core_, *p.metrics_, p.clock_);
  DYNMIG_RETURN_IF_ERROR(p.endpoint_->Start());
  DYNMIG_RETURN_IF_ERROR(p.StartHttp());
  p.loop_ = std::thread([&p] { p.Loop(); });
  return plugin;
}

namespace {

// "HOST:PORT" (HOST may be empty: all interfaces) into its parts; `flag` names it in the error.
absl::StatusOr<std::pair<std::string, int>> ParseListen(const std::string& listen,
                                                        std::string_view flag) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon != std::string::npos) {
    const std::string_view text(listen.data() + colon + 1, listen.size() - colon - 1);
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
    if (ec != std::errc() || ptr != text.data() + text.size()) port = -1;
  }
  if (colon == std::string::npos || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        fmt::format("{} must be HOST:PORT, got \"{}\"", flag, listen));
  }
  std::string host = listen.substr(0, colon);
  if (host.empty()) host = "0.0.0.0";
  return std::make_pair(std::move(host), port);
}

}  // namespace

bool DevicePlugin::MetricsListenerServesNvml(const DevicePluginOptions& o) {
  if (o.metrics_listen.empty()) return false;
  if (o.nvml_listen == o.metrics_listen) return true;
  if (!o.nvml_listen.empty()) return false;
  auto parsed = ParseListen(o.metrics_listen, "--metrics-listen");
  return parsed.ok() && IsLoopbackHost(parsed->first);
}

absl::Status DevicePlugin::StartHttp() {
  // /nvml names the pods that own instances: it is served on a loopback listener only, unless
  // the operator names another address for it (--nvml-listen).
  if (!options_.metrics_listen.empty()) {
    DYNMIG_RETURN_IF_ERROR(Listen(options_.metrics_listen, "--metrics-listen", /*metrics=*/true,
                                  MetricsListenerServesNvml(options_), metrics_http_));
  }
  if (!options_.nvml_listen.empty() && options_.nvml_listen != options_.metrics_listen) {
    DYNMIG_RETURN_IF_ERROR(Listen(options_.nvml_listen, "--nvml-listen", /*metrics=*/false,
                                  /*nvml=*/true, nvml_http_));
  }
  return absl::OkStatus();
}

absl::Status DevicePlugin::Listen(const std::string& listen, std::string_view flag, bool metrics,
                                  bool nvml, HttpListener& out) {
  auto parsed = ParseListen(listen, flag);
  if (!parsed.ok()) return parsed.status();
  const auto& [host, port] = *parsed;
  out.server = std::make_unique<httplib::Server>();
  httplib::Server& http = *out.server;
  // Its endpoints take no request body: anything larger than 4 KiB is refused unread with 413.
  constexpr size_t kMaxBody = 4 * kKiB;
  http.set_payload_max_length(kMaxBody);
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request&,
                                                                 httplib::Response& res) {
    if (res.status != 413 || !res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    res.set_content(fmt::format("request body too large: the limit is {}\n", FormatBytes(kMaxBody)),
                    "text/plain");
    return httplib::Server::HandlerResponse::Handled;
  }));
  if (metrics) {
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_->Serialize(), "text/plain; version=0.0.4; charset=utf-8");
    });
  }
  if (nvml) {
    http.Get("/nvml", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(core_->NvmlView().dump(1) + "\n", "application/json");
    });
  }
  http.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  out.port = port == 0 ? http.bind_to_any_port(host) : (http.bind_to_port(host, port) ? port : -1);
  if (out.port <= 0) {
    out.port = 0;
    return absl::UnavailableError(fmt::format("cannot listen on {} ({})", listen, flag));
  }
  out.thread = std::thread([&http] { http.listen_after_bind(); });
  // Up to a second for httplib's thread to accept (stop() before that would not end it). That
  // thread runs on real time, whatever clock the plugin runs on.
  const Clock& real = RealClock();
  const absl::Duration deadline = real.Monotonic() + absl::Seconds(1);
  while (!http.is_running() && real.Monotonic() < deadline) real.SleepFor(absl::Milliseconds(2));
  spdlog::info("{} on http://{}:{}", metrics ? (nvml ? "/metrics, /nvml" : "/metrics") : "/nvml",
               host, out.port);
  return absl::OkStatus();
}

absl::Duration DevicePlugin::Cycle(absl::Duration& next_publish) {
  const bool changed = core_->RefreshDevices();
  core_->Reconcile();
  // MIG mode switches the node's dynmig.io/gpu-mode-request asks for (publishes what it does).
  core_->SwitchModes();
  const absl::Duration now = clock_.Monotonic();
  // Idle (warm) instances are published as they change, so the scheduler can prefer them; held
  // slices too (an instance whose destroy NVML refused with IN_USE, or one not reclaimed yet):
  // until they are, the scheduler counts the slices of an ended pod as free and may place a pod
  // there whose Allocate must then be refused.
  if (changed || now >= next_publish || core_->IdleChanged() || core_->HeldChanged()) {
    if (auto st = core_->PublishNode(); !st.ok()) spdlog::warn("{}", std::string(st.message()));
    next_publish = now + options_.register_interval;
  }
  return now;
}

void DevicePlugin::Loop() {
  absl::Duration next_publish = clock_.Monotonic() + options_.register_interval;
  while (true) {
    uint64_t serving = 0;
    {
      dynmig::MutexLock lock(&mu_);
      serving = wake_requests_;
    }
    const absl::Duration now = Cycle(next_publish);
    const absl::Duration next_reconcile = now + options_.reconcile_interval;
    dynmig::MutexLock lock(&mu_);
    ++cycles_;
    completed_wakes_ = serving;
    cv_.SignalAll();
    clock_.WaitUntil(
        cv_, mu_, std::min(next_reconcile, next_publish),
        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || wake_requests_ != serving; });
    if (stop_) return;
  }
}

bool DevicePlugin::RunCycle(absl::Duration timeout) {
  dynmig::MutexLock lock(&mu_);
  if (stopped_) return false;
  const uint64_t requested = ++wake_requests_;
  cv_.SignalAll();
  return clock_.WaitFor(cv_, mu_, timeout, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return completed_wakes_ >= requested || stop_;
  }) && !stop_;
}

uint64_t DevicePlugin::cycles() const {
  dynmig::MutexLock lock(&mu_);
  return cycles_;
}

void DevicePlugin::Stop() {
  {
    dynmig::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stop_ = true;
    cv_.SignalAll();
  }
  if (loop_.joinable()) loop_.join();
  if (endpoint_) endpoint_->Stop();
  for (HttpListener* l : {&metrics_http_, &nvml_http_}) {
    if (l->server == nullptr) continue;
    l->server->stop();
    if (l->thread.joinable()) l->thread.join();
  }
  if (events_) events_->Flush(absl::Seconds(2));
}

DevicePlugin::~DevicePlugin() { Stop(); }

}  // namespace dynmig::deviceplugin
