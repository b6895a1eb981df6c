// `dynmig device-plugin`: the node agent. Serves the kubelet device-plugin API for the MIG
// resource, creates and reclaims MIG instances, publishes the node's capability, until SIGINT or
// SIGTERM. See docs/device-plugin.md.
#include <CLI/CLI.hpp>
#include <memory>
#include <ostream>
#include <string>

#include "absl/time/time.h"
#include "cli/cli.h"
#include "common/clock.h"
#include "deviceplugin/device_plugin.h"
#include "fmt/format.h"
#include "kube/rest_config.h"
#include "kube/rest_kube_client.h"
#include "protocol/device_config.h"
#include "spdlog/spdlog.h"

namespace dynmig::cli {
namespace {

struct DevicePluginFlags {
  std::string node;
  std::string device_config;
  std::string kubeconfig;
  bool in_cluster = false;
  std::string kubelet_dir = "/var/lib/kubelet/device-plugins";
  std::string socket_name = "dynmig.sock";
  std::string pod_resources_socket = std::string(deviceplugin::kDefaultPodResourcesSocket);
  std::string cri_socket = std::string(deviceplugin::kDefaultCriSocket);
  std::string self_pod;
  std::string state_file;
  std::string sim;
  std::string sim_state;
  std::string sim_latency = "none";
  std::string cdi_dir;
  std::string reconcile_interval = "5s";
  std::string register_interval = "30s";
  std::string metrics_listen;
  bool metrics_pod_identity = false;
  std::string nvml_listen = "127.0.0.1:9401";
  std::string log_level = "info";
};

int Run(const DevicePluginFlags& f, CliContext& ctx) {
  auto bad = [&](const std::string& message) {
    ctx.err << "dynmig device-plugin: " << message << "\n";
    return kExitBadInput;
  };
  auto failed = [&](const std::string& message) {
    ctx.err << "dynmig device-plugin: " << message << "\n";
    return kExitFailure;
  };
  if (auto level = spdlog::level::from_str(f.log_level);
      level != spdlog::level::off || f.log_level == "off") {
    spdlog::set_level(level);
  } else {
    return bad(fmt::format("--log-level: unknown level \"{}\"", f.log_level));
  }
  absl::Duration reconcile;
  absl::Duration register_every;
  if (!absl::ParseDuration(f.reconcile_interval, &reconcile) || reconcile <= absl::ZeroDuration()) {
    return bad(fmt::format("--reconcile-interval: \"{}\" is not a positive duration (e.g. 5s)",
                           f.reconcile_interval));
  }
  if (!absl::ParseDuration(f.register_interval, &register_every) ||
      register_every <= absl::ZeroDuration()) {
    return bad(fmt::format("--register-interval: \"{}\" is not a positive duration (e.g. 30s)",
                           f.register_interval));
  }
  if (f.in_cluster && !f.kubeconfig.empty()) {
    return bad("--kubeconfig and --in-cluster exclude each other");
  }
  auto config = protocol::LoadDeviceConfig(f.device_config);
  if (!config.ok()) return bad(std::string(config.status().message()));
  for (const auto& w : config->warnings) spdlog::warn("device config: {}", w);

  // The process's one clock: the simulator's delays, the plugin's intervals, timestamps.
  const Clock& clock = RealClock();
  auto latency = mig::ParseNvmlLatency(f.sim_latency);
  if (!latency.ok()) return bad("--sim-latency: " + std::string(latency.status().message()));
  auto gpu = OpenNodeNvml({f.node, f.sim, f.sim_state, *latency}, clock);
  if (!gpu.ok()) {
    return gpu.status().code() == absl::StatusCode::kInvalidArgument
               ? bad(std::string(gpu.status().message()))
               : failed(std::string(gpu.status().message()));
  }

  auto rest = f.in_cluster ? kube::InClusterConfig() : kube::DefaultConfig(f.kubeconfig);
  if (!rest.ok()) return bad(std::string(rest.status().message()));
  auto kube = kube::RestKubeClient::Create(*rest);
  if (!kube.ok()) return bad(std::string(kube.status().message()));

  deviceplugin::DevicePluginOptions options;
  options.clock = &clock;
  options.core.node_name = f.node;
  options.core.resource_name = config->resources.count;
  options.core.allowlist = config->allowlist;
  options.core.warm = config->warm_instances;
  options.core.mode_switching = config->mig_mode_switching;
  options.core.state_file = f.state_file;
  options.core.cdi_dir = f.cdi_dir;
  options.kubelet_dir = f.kubelet_dir;
  options.socket_name = f.socket_name;
  options.pod_resources_socket = f.pod_resources_socket;
  options.cri_socket = f.cri_socket;
  options.core.self_pod = f.self_pod;
  options.reconcile_interval = reconcile;
  options.register_interval = register_every;
  options.metrics_listen = f.metrics_listen;
  options.nvml_listen = f.nvml_listen;
  options.metrics_pod_identity = f.metrics_pod_identity;

  // Blocked before any thread starts (they inherit the mask), then waited for.
  StopSignals stop;
  auto plugin = deviceplugin::DevicePlugin::Start(std::move(options), **gpu, **kube);
  if (!plugin.ok()) {
    const bool input = plugin.status().code() == absl::StatusCode::kInvalidArgument;
    ctx.err << "dynmig device-plugin: " << plugin.status().message() << "\n";
    return input ? kExitBadInput : kExitFailure;
  }
  ctx.out << "dynmig device-plugin serving " << (*plugin)->options().core.resource_name
          << " for node " << f.node << " on " << (*plugin)->endpoint().socket_path();
  if ((*plugin)->http_port() > 0) ctx.out << ", metrics on port " << (*plugin)->http_port();
  if ((*plugin)->nvml_port() > 0) ctx.out << ", /nvml on port " << (*plugin)->nvml_port();
  ctx.out << std::endl;
  const int signal_number = stop.Wait();
  ctx.out << "dynmig device-plugin: signal " << signal_number << ", stopping" << std::endl;
  (*plugin)->Stop();
  return kExitOk;
}

}  // namespace

void RegisterDevicePluginCommand(CLI::App& root, CliContext& ctx) {
  auto f = std::make_shared<DevicePluginFlags>();
  CLI::App* cmd = root.add_subcommand(
      "device-plugin",
      "Run the node agent: kubelet device plugin, MIG instance lifecycle, node capability");
  cmd->add_option("--node", f->node, "this node's name")->required();
  cmd->add_option("--device-config", f->device_config,
                  "device-config.yaml (migProfileAllowlist, resource names)")
      ->required();
  cmd->add_option("--kubeconfig", f->kubeconfig, "kubeconfig file (default: $KUBECONFIG, ...)");
  cmd->add_flag("--in-cluster", f->in_cluster, "use the pod's service account");
  cmd->add_option("--kubelet-dir", f->kubelet_dir, "the kubelet's device-plugin directory")
      ->capture_default_str();
  cmd->add_option("--socket-name", f->socket_name, "this plugin's socket in --kubelet-dir")
      ->capture_default_str();
  cmd->add_option("--pod-resources-socket", f->pod_resources_socket,
                  "the kubelet's PodResources API socket: PreStartContainer proves there that the "
                  "devices it starts a container with went to the reserved pod")
      ->capture_default_str();
  cmd->add_option("--cri-socket", f->cri_socket,
                  "the container runtime's CRI socket: handover proves there which container "
                  "holds a MIG instance dynmig did not create (\"\" = none: such instances "
                  "that only the runtime can prove stay unproven, kept and never destroyed)")
      ->capture_default_str();
  cmd->add_option(
         "--self-pod", f->self_pod,
         "this plugin's pod, NAMESPACE/NAME (deploy/ passes $(POD_NAMESPACE)/$(POD_NAME)): "
         "its own containers are never taken for holders of a MIG instance (its "
         "NVIDIA_VISIBLE_DEVICES=all names every GPU)")
      ->check([](const std::string& v) -> std::string {
        const size_t slash = v.find('/');
        if (v.empty()) return "";
        if (v.size() > 317 || slash == std::string::npos || slash == 0 || slash + 1 == v.size() ||
            v.find('/', slash + 1) != std::string::npos)
          return "expected NAMESPACE/NAME, got '" + v.substr(0, 80) + "'";
        return "";
      });
  cmd->add_option("--state-file", f->state_file,
                  "node-local state (default <kubelet-dir>/dynmig/state.json)");
  cmd->add_option("--sim", f->sim, "simulated GPUs instead of NVML, e.g. A100-SXM4-40GBx2");
  cmd->add_option("--sim-state", f->sim_state, "the simulator's state file");
  cmd->add_option("--sim-latency", f->sim_latency,
                  "with --sim: how long instance create/destroy take: none, realistic or "
                  "[MODEL:]OP=DURATION items (OP: create-gi, destroy-gi, create-ci, destroy-ci)")
      ->capture_default_str();
  cmd->add_option("--cdi-dir", f->cdi_dir,
                  "write a CDI spec per MIG device here and answer with CDI names");
  cmd->add_option("--reconcile-interval", f->reconcile_interval, "reclamation period")
      ->capture_default_str();
  cmd->add_option("--register-interval", f->register_interval,
                  "period of the node register/handshake annotations")
      ->capture_default_str();
  cmd->add_option("--metrics-listen", f->metrics_listen,
                  "HOST:PORT for /metrics and /healthz (port 0 picks one; also /nvml when HOST is "
                  "a loopback address and --nvml-listen is empty)");
  cmd->add_flag("--metrics-pod-identity", f->metrics_pod_identity,
                "also export dynmig_mig_instance_info on /metrics: one series per live MIG "
                "instance naming the namespace, pod and container that hold it (joins with "
                "dcgm-exporter's UUID and GPU_I_ID)");
  cmd->add_option("--nvml-listen", f->nvml_listen,
                  "HOST:PORT for /nvml, which names the pods owning MIG instances: keep it on "
                  "loopback (\"\": only on a loopback --metrics-listen)")
      ->capture_default_str();
  cmd->add_option("--log-level", f->log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  cmd->callback([f, &ctx] { ctx.exit_code = Run(*f, ctx); });
}

}  // namespace dynmig::cli
