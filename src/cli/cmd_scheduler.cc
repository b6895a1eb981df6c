// `dynmig scheduler`: the scheduler extender and admission webhook (src/scheduler/server.h),
// served until SIGINT/SIGTERM. docs/scheduler.md describes the flags and endpoints.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <memory>
#include <ostream>
#include <random>
#include <string>

#include "cli/cli.h"
#include "common/clock.h"
#include "common/strings.h"
#include "kube/rest_config.h"
#include "kube/rest_kube_client.h"
#include "ops/layout.h"
#include "ops/live_page.h"
#include "protocol/device_config.h"
#include "scheduler/server.h"
#include "spdlog/spdlog.h"
#include "webhook/admission.h"

namespace dynmig::cli {
namespace {

struct SchedulerFlags {
  std::string kubeconfig;
  bool in_cluster = false;
  std::string listen = "0.0.0.0:8443";
  std::string device_config;
  std::string tls_cert;
  std::string tls_key;
  std::string extender_client_ca;
  std::string scheduler_name = "dynmig-scheduler";
  std::string reservation_ttl = "10m";
  std::string node_lock_wait = "75s";
  std::string expiry_interval = "30s";
  std::string requeue_interval = "1s";
  std::string mode_switch_interval = "2s";
  bool leader_elect = false;
  std::string lease_namespace;
  std::string lease_name = "dynmig-scheduler";
  std::string annotation_writers = std::string(webhook::kDefaultAnnotationWriters);
  std::string binders = std::string(webhook::kDefaultBinders);
  std::string log_level = "info";
  scheduler::DefragFlags defrag;
};

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

bool ParsePositiveDuration(const std::string& text, absl::Duration* out) {
  return absl::ParseDuration(text, out) && *out > absl::ZeroDuration();
}

// What device-config.yaml decides for the scheduler and its webhook.
void ApplyDeviceConfig(const protocol::DeviceConfig& config,
                       scheduler::SchedulerServerOptions& options) {
  options.state.allowlist = config.allowlist;
  options.state.memory_match = config.memory_match;
  options.state.resources = config.resources;
  options.admission.allowlist = config.allowlist;
  options.admission.memory_match = config.memory_match;
  // Whole-GPU pods are placed (and admitted as such) only where GPUs may change mode.
  options.extender.whole_gpu_pods = config.mig_mode_switching.enabled;
}

// --requeue-interval: 0 (off) or at least 100ms; --mode-switch-interval: 0 (off) or 1s..1h.
absl::Status ParseLoopIntervals(const SchedulerFlags& flags, absl::Duration& requeue,
                                absl::Duration& mode_switch) {
  if (!absl::ParseDuration(flags.requeue_interval, &requeue) || requeue < absl::ZeroDuration() ||
      (requeue > absl::ZeroDuration() && requeue < absl::Milliseconds(100))) {
    return absl::InvalidArgumentError("--requeue-interval: '" + flags.requeue_interval +
                                      "' is not 0 (off) or a duration of at least 100ms (e.g. 1s)");
  }
  const std::string& text = flags.mode_switch_interval;
  if (text.size() > 32 || !absl::ParseDuration(text, &mode_switch) ||
      mode_switch < absl::ZeroDuration() ||
      (mode_switch > absl::ZeroDuration() && mode_switch < absl::Seconds(1)) ||
      mode_switch > absl::Hours(1)) {
    return absl::InvalidArgumentError("--mode-switch-interval: '" + text.substr(0, 32) +
                                      "' is not 0 (off) or a duration between 1s and 1h (e.g. 2s)");
  }
  return absl::OkStatus();
}

int RunScheduler(const SchedulerFlags& flags, CliContext& ctx) {
  auto bad = [&](const std::string& message) {
    ctx.err << "dynmig scheduler: " << message << "\n";
    return kExitBadInput;
  };
  if (flags.kubeconfig.empty() == !flags.in_cluster) {
    return bad("give exactly one of --kubeconfig FILE and --in-cluster");
  }
  std::string host;
  int port = -1;
  if (auto st = ParseHostPort("--listen", flags.listen, "0.0.0.0", &host, &port); !st.ok()) {
    return bad(std::string(st.message()));
  }
  if (flags.tls_cert.empty() != flags.tls_key.empty()) {
    return bad("--tls-cert and --tls-key go together");
  }
  if (!flags.extender_client_ca.empty() && flags.tls_cert.empty()) {
    return bad(
        "--extender-client-ca needs --tls-cert and --tls-key (client certificates travel "
        "only over HTTPS)");
  }
  absl::Duration ttl, expiry_interval;
  if (!ParsePositiveDuration(flags.reservation_ttl, &ttl)) {
    return bad("--reservation-ttl: '" + flags.reservation_ttl +
               "' is not a positive duration (e.g. 10m, 90s)");
  }
  absl::Duration node_lock_wait;
  if (!ParsePositiveDuration(flags.node_lock_wait, &node_lock_wait)) {
    return bad("--node-lock-wait: '" + flags.node_lock_wait +
               "' is not a positive duration (e.g. 75s; keep it below the extender's httpTimeout)");
  }
  if (!ParsePositiveDuration(flags.expiry_interval, &expiry_interval)) {
    return bad("--expiry-interval: '" + flags.expiry_interval + "' is not a positive duration");
  }
  absl::Duration requeue_interval, mode_switch_interval;
  if (auto st = ParseLoopIntervals(flags, requeue_interval, mode_switch_interval); !st.ok()) {
    return bad(std::string(st.message()));
  }
  scheduler::DefragmenterOptions defrag;
  absl::Duration defrag_interval;
  if (auto st = scheduler::ApplyDefragFlags(flags.defrag, defrag, defrag_interval); !st.ok()) {
    return bad(std::string(st.message()));
  }
  auto level = spdlog::level::from_str(flags.log_level);
  if (level == spdlog::level::off && flags.log_level != "off") {
    return bad("--log-level: unknown level '" + flags.log_level + "'");
  }
  spdlog::set_level(level);
  auto config = protocol::LoadDeviceConfig(flags.device_config);
  if (!config.ok()) return bad(std::string(config.status().message()));
  for (const auto& w : config->warnings) ctx.err << "dynmig scheduler: warning: " << w << "\n";

  auto rest = flags.in_cluster ? kube::InClusterConfig() : kube::LoadKubeconfig(flags.kubeconfig);
  if (!rest.ok()) return bad(std::string(rest.status().message()));
  auto client = kube::RestKubeClient::Create(*rest);
  if (!client.ok()) return bad(std::string(client.status().message()));

  scheduler::SchedulerServerOptions options;
  options.host = host;
  options.port = port;
  options.tls_cert_file = flags.tls_cert;
  options.tls_key_file = flags.tls_key;
  options.extender_client_ca_file = flags.extender_client_ca;
  if (flags.extender_client_ca.empty()) {
    ctx.err << "dynmig scheduler: warning: no --extender-client-ca: /filter and /bind accept "
               "callers without a client certificate (only the extender's own checks apply)\n";
  }
  ApplyDeviceConfig(*config, options);
  options.extender.reservation_ttl = ttl;
  options.extender.lock_queue.wait = node_lock_wait;
  options.extender.scheduler_name = flags.scheduler_name;
  options.expiry_interval = expiry_interval;
  options.defrag = defrag;
  options.defrag_interval = defrag_interval;
  options.requeue.interval = requeue_interval;
  options.mode_switch.interval = mode_switch_interval;
  options.mode_switch.config = config->mig_mode_switching;  // absent or disabled: no loop
  options.admission.scheduler_name = flags.scheduler_name;
  options.admission.annotation_writers = SplitTrimmed(flags.annotation_writers, ',');
  options.admission.binders = SplitTrimmed(flags.binders, ',');
  options.pod_name = Env("POD_NAME");
  options.pod_namespace = Env("POD_NAMESPACE");
  options.layout_html = ops::RenderLayoutHtml;  // GET /layout: `dynmig layout --html`'s page
  options.layout_json = [](const std::vector<scheduler::NodeReport>& nodes) {
    return ops::LayoutJson(nodes).dump(2);
  };
  options.live = ops::LivePageRenderer();  // GET /live
  options.leader_elect = flags.leader_elect;
  options.election.lease_name = flags.lease_name;
  options.election.lease_namespace = !flags.lease_namespace.empty()   ? flags.lease_namespace
                                     : !options.pod_namespace.empty() ? options.pod_namespace
                                                                      : "dynmig-system";
  std::string who = options.pod_name;
  if (who.empty()) {
    char hostname[256] = {};
    gethostname(hostname, sizeof(hostname) - 1);
    who = hostname;
  }
  options.election.identity = fmt::format("{}_{:08x}", who, std::random_device{}());

  // Blocked before any thread starts (threads inherit the mask), then waited for.
  StopSignals stop;

  auto server = scheduler::SchedulerServer::Start(**client, RealClock(), options);
  if (!server.ok()) {
    ctx.err << "dynmig scheduler: " << server.status().message() << "\n";
    return server.status().code() == absl::StatusCode::kInvalidArgument ? kExitBadInput
                                                                        : kExitFailure;
  }
  ctx.out << "dynmig scheduler listening on " << (*server)->url() << std::endl;
  const int signal_number = stop.Wait();
  ctx.out << "dynmig scheduler: signal " << signal_number << ", stopping" << std::endl;
  (*server)->Stop();
  return kExitOk;
}

}  // namespace

void AddDefragOptions(CLI::App* cmd, scheduler::DefragFlags& f) {
  cmd->add_option("--defrag", f.mode,
                  "defragmenter: off, dry-run (events only) or on (evicts pods that block a "
                  "waiting pod's instance; docs/operations.md)")
      ->capture_default_str();
  cmd->add_option("--defrag-wait", f.wait,
                  "how long a pod waits because of fragmentation before the defragmenter acts")
      ->capture_default_str();
  cmd->add_option("--defrag-evictions-per-node-per-hour", f.per_node_per_hour,
                  "the defragmenter's evictions per node per hour (0: none)")
      ->capture_default_str();
  cmd->add_option("--defrag-evictions-per-namespace-per-hour", f.per_namespace_per_hour,
                  "the defragmenter's evictions per namespace per hour (0: none)")
      ->capture_default_str();
  cmd->add_option("--defrag-reservation-ttl", f.reservation_ttl,
                  "how long freed slices stay reserved for the waiting pod")
      ->capture_default_str();
  cmd->add_option("--defrag-interval", f.interval, "how often the leader's defragmenter looks")
      ->capture_default_str();
  cmd->add_option("--defrag-headroom", f.headroom_percent,
                  "moves only while this percent of the GPUs' slices stay free once the waiting "
                  "pod runs (0: no such rule; docs/simulate.md, \"Headroom\")")
      ->capture_default_str();
}

void RegisterSchedulerCommand(CLI::App& root, CliContext& ctx) {
  auto flags = std::make_shared<SchedulerFlags>();
  CLI::App* cmd = root.add_subcommand(
      "scheduler", "Serve the kube-scheduler extender (filter, bind) and the admission webhook");
  cmd->add_option("--kubeconfig", flags->kubeconfig, "kubeconfig file of the cluster");
  cmd->add_flag("--in-cluster", flags->in_cluster, "use the pod's service account");
  cmd->add_option("--listen", flags->listen, "HOST:PORT to serve on")->capture_default_str();
  cmd->add_option("--device-config", flags->device_config,
                  "device-config.yaml (MIG profile allowlist, resource names)")
      ->required();
  cmd->add_option("--tls-cert", flags->tls_cert, "serving certificate (PEM), reloaded on change");
  cmd->add_option("--tls-key", flags->tls_key, "serving key (PEM), reloaded on change");
  cmd->add_option("--extender-client-ca", flags->extender_client_ca,
                  "CA bundle (PEM) of the client certificates /filter and /bind require "
                  "(kube-scheduler's extender tlsConfig certFile); reloaded on change");
  cmd->add_option("--scheduler-name", flags->scheduler_name,
                  "schedulerName the webhook gives GPU pods; the extender filters and binds only "
                  "MIG pods of this name")
      ->capture_default_str();
  cmd->add_option("--reservation-ttl", flags->reservation_ttl,
                  "release reservations not allocated after this long")
      ->capture_default_str();
  cmd->add_option(
         "--node-lock-wait", flags->node_lock_wait,
         "how long a bind waits in line for its node's lock (hami.io/mutex.lock) before it "
         "fails; keep it below kube-scheduler's extender httpTimeout (90s in deploy/)")
      ->capture_default_str();
  cmd->add_option("--expiry-interval", flags->expiry_interval,
                  "how often the leader looks for expired reservations")
      ->capture_default_str();
  cmd->add_option("--requeue-interval", flags->requeue_interval,
                  "how often the leader looks for nodes whose MIG capacity freed while MIG pods "
                  "wait, and labels them (dynmig.io/capacity-freed) so that kube-scheduler tries "
                  "those pods again at once; 0: never")
      ->capture_default_str();
  cmd->add_option("--mode-switch-interval", flags->mode_switch_interval,
                  "how often the leader decides whether an idle GPU changes mode between MIG and "
                  "whole-GPU (only when device-config.yaml's nvidia.migModeSwitching is enabled); "
                  "0: never")
      ->capture_default_str();
  AddDefragOptions(cmd, flags->defrag);
  cmd->add_flag("--leader-elect", flags->leader_elect,
                "elect a leader among replicas on a coordination.k8s.io Lease");
  cmd->add_option("--lease-namespace", flags->lease_namespace,
                  "namespace of the Lease (default: $POD_NAMESPACE, else dynmig-system)");
  cmd->add_option("--lease-name", flags->lease_name, "name of the Lease")->capture_default_str();
  cmd->add_option("--allowed-annotation-writers", flags->annotation_writers,
                  "comma list of users that may write the protocol's pod annotations (hami.io/...)")
      ->capture_default_str();
  cmd->add_option("--allowed-binders", flags->binders,
                  "comma list of users that may bind pods that request the managed resources "
                  "(pods/binding): the extender's identity")
      ->capture_default_str();
  cmd->add_option("--log-level", flags->log_level, "trace|debug|info|warn|error|off")
      ->capture_default_str();
  cmd->callback([flags, &ctx] { ctx.exit_code = RunScheduler(*flags, ctx); });
}

}  // namespace dynmig::cli
