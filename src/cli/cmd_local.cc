// `dynmig local`: the whole system on one machine (src/local/local_cluster.h), served until
// SIGINT/SIGTERM, with a small control endpoint to restart its parts and, with --demo, the
// migration guide's walk-through (src/local/demo.h). See docs/local.md.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "cli/cli.h"
#include "common/mutex.h"
#include "fmt/format.h"
#include "kube/informer.h"
#include "local/demo.h"
#include "local/local_cluster.h"
#include "nvml/geometry.h"
#include "scheduler/defragmenter.h"
#include "spdlog/spdlog.h"

namespace dynmig::cli {
namespace {

struct LocalFlags {
  std::string listen = "127.0.0.1:6443";
  std::string nodes = "node-a=A100-SXM4-40GBx2,node-b=H100 80GBx1";
  std::string state_dir = "/tmp/dynmig-local";
  std::string device_config;
  std::string control = "127.0.0.1:6444";
  int nvml_port = 9400;
  bool demo = false;
  bool quiet = false;
  std::string log_level = "warn";
  // Whether the flag was given: a default port that is taken is replaced (and said), a given one
  // is not.
  bool listen_given = false;
  bool control_given = false;
  bool nvml_port_given = false;
  std::string sim_latency = "realistic";
  // The legacy world of a handover (LocalClusterOptions::legacy_geometry, nvidia_standin_nodes,
  // device_plugins_stopped).
  std::vector<std::string> legacy_geometry;        // NODE=GEOMETRY
  std::vector<std::string> nvidia_standin;         // NODE
  std::vector<std::string> device_plugin_stopped;  // NODE
  scheduler::DefragFlags defrag;                   // the in-process scheduler's defragmenter
};

// Binds a TCP socket to host:port and closes it: the port is free now. port 0: the port the kernel
// chose, else `port`; -1 when the bind fails (in use, or not an IPv4 address).
int TryBind(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int bound = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    socklen_t len = sizeof(addr);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      bound = ntohs(addr.sin_port);
  }
  ::close(fd);
  return bound;
}

// A port free on every host (the nodes' addresses), or -1.
int FreePortOn(const std::vector<std::string>& hosts) {
  for (int attempt = 0; attempt < 20 && !hosts.empty(); ++attempt) {
    const int port = TryBind(hosts.front(), 0);
    if (port <= 0) return -1;
    bool all = true;
    for (size_t i = 1; i < hosts.size() && all; ++i) all = TryBind(hosts[i], port) == port;
    if (all) return port;
  }
  return -1;
}

// Serialized output: components log from their own threads.
class Printer {
 public:
  explicit Printer(std::ostream& out) : out_(out) {}
  void Line(const std::string& line) ABSL_LOCKS_EXCLUDED(mu_) {
    dynmig::MutexLock lock(&mu_);
    out_ << line << "\n";
    out_.flush();
  }
  void Block(const std::string& text) ABSL_LOCKS_EXCLUDED(mu_) {
    dynmig::MutexLock lock(&mu_);
    out_ << text;
    out_.flush();
  }

 private:
  dynmig::Mutex mu_;
  std::ostream& out_;  // written under mu_
};

// A stream that hands complete chunks to the printer (the demo writes through it).
class PrinterBuf : public std::stringbuf {
 public:
  explicit PrinterBuf(Printer& p) : printer_(p) {}
  int sync() override {
    printer_.Block(str());
    str("");
    return 0;
  }

 private:
  Printer& printer_;
};

// The flags as the cluster's options and the control endpoint's address.
struct LocalSetup {
  local::LocalClusterOptions options;
  std::string control_host;
  int control_port = 0;
};

// --legacy-geometry, --nvidia-standin, --device-plugin-stopped: each names a node of --nodes
// (once); a geometry must parse. kInvalidArgument names the flag and the item.
absl::Status ParseLegacyFlags(const LocalFlags& f, local::LocalClusterOptions& o) {
  auto known = [&o](std::string_view name) {
    return std::any_of(o.nodes.begin(), o.nodes.end(),
                       [&](const local::LocalNode& n) { return n.name == name; });
  };
  for (const auto& item : f.legacy_geometry) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) {
      return absl::InvalidArgumentError(
          fmt::format("--legacy-geometry '{}': expected NODE=GEOMETRY, e.g. "
                      "node-a=1g.5gb=2,2g.10gb=1",
                      item));
    }
    const std::string node = item.substr(0, eq);
    if (!known(node)) {
      return absl::InvalidArgumentError(
          fmt::format("--legacy-geometry: no node '{}' in --nodes", node));
    }
    if (o.legacy_geometry.count(node)) {
      return absl::InvalidArgumentError(
          fmt::format("--legacy-geometry: node '{}' given twice", node));
    }
    auto geometry = mig::ParseGeometry(item.substr(eq + 1));
    if (!geometry.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("--legacy-geometry {}: {}", node, std::string(geometry.status().message())));
    }
    o.legacy_geometry[node] = item.substr(eq + 1);
  }
  for (const auto& [flag, from, to] :
       {std::tuple{"--nvidia-standin", &f.nvidia_standin, &o.nvidia_standin_nodes},
        std::tuple{"--device-plugin-stopped", &f.device_plugin_stopped,
                   &o.device_plugins_stopped}}) {
    for (const auto& node : *from) {
      if (!known(node))
        return absl::InvalidArgumentError(fmt::format("{}: no node '{}' in --nodes", flag, node));
      if (std::find(to->begin(), to->end(), node) != to->end())
        return absl::InvalidArgumentError(fmt::format("{}: node '{}' given twice", flag, node));
      to->push_back(node);
    }
  }
  return absl::OkStatus();
}

// The addresses, ports, latency model and nodes of the flags; kInvalidArgument names the flag.
absl::StatusOr<LocalSetup> ParseFlags(const LocalFlags& f) {
  LocalSetup s;
  local::LocalClusterOptions& o = s.options;
  if (auto st = ParseHostPort("--listen", f.listen, "", &o.api_host, &o.api_port); !st.ok()) {
    return st;
  }
  if (!f.control.empty()) {
    if (auto st = ParseHostPort("--control", f.control, "", &s.control_host, &s.control_port);
        !st.ok()) {
      return absl::InvalidArgumentError(std::string(st.message()) +
                                        " (or empty for no control endpoint)");
    }
  }
  if (f.nvml_port <= 0 || f.nvml_port > 65535) {
    return absl::InvalidArgumentError("--nvml-port must be 1-65535");
  }
  auto latency = mig::ParseNvmlLatency(f.sim_latency);
  if (!latency.ok()) {
    return absl::InvalidArgumentError("--sim-latency: " + std::string(latency.status().message()));
  }
  o.nvml_latency = *latency;
  auto nodes = local::ParseNodes(f.nodes);
  if (!nodes.ok()) return nodes.status();
  o.nodes = *nodes;
  o.state_dir = f.state_dir;
  o.nvml_port = f.nvml_port;
  if (auto st = ParseLegacyFlags(f, o); !st.ok()) return st;
  return s;
}

// Default ports that are taken (another cluster, k3s, a second `dynmig local`) are replaced by
// free ones; returns a line saying so for each. Ports the user named are used as given (and fail
// loudly when taken).
std::vector<std::string> MoveTakenPorts(const LocalFlags& f, LocalSetup& s) {
  local::LocalClusterOptions& o = s.options;
  std::vector<std::string> moved;
  if (!f.listen_given && o.api_port != 0 && TryBind(o.api_host, o.api_port) < 0) {
    const int port = TryBind(o.api_host, 0);
    if (port > 0) {
      moved.push_back(
          fmt::format("{}:{} is in use; the API server listens on {}:{} instead "
                      "(--listen HOST:PORT chooses)",
                      o.api_host, o.api_port, o.api_host, port));
      o.api_port = port;
    }
  }
  if (!f.control.empty() && !f.control_given && s.control_port != 0 &&
      TryBind(s.control_host, s.control_port) < 0) {
    moved.push_back(fmt::format(
        "{}:{} is in use; the control endpoint listens on a free port instead (printed below; "
        "--control HOST:PORT chooses)",
        s.control_host, s.control_port));
    s.control_port = 0;
  }
  if (f.nvml_port_given) return moved;
  std::vector<std::string> hosts;
  for (size_t i = 0; i < o.nodes.size(); ++i) {
    hosts.push_back(o.node_address_prefix +
                    std::to_string(o.node_address_first + static_cast<int>(i)));
  }
  bool taken = false;
  for (const auto& h : hosts) taken = taken || TryBind(h, o.nvml_port) < 0;
  if (!taken) return moved;
  const int port = FreePortOn(hosts);
  if (port > 0) {
    moved.push_back(
        fmt::format("port {} is in use on a node address; the device plugins serve /nvml on port "
                    "{} instead (--nvml-port chooses)",
                    o.nvml_port, port));
    o.nvml_port = port;
  }
  return moved;
}

// --device-config (read into the options) and --log-level (applied); kInvalidArgument names the
// flag.
absl::Status ApplyConfigFlags(const LocalFlags& f, local::LocalClusterOptions& o) {
  if (auto st = scheduler::ApplyDefragFlags(f.defrag, o.defrag, o.defrag_interval); !st.ok()) {
    return st;
  }
  if (!f.device_config.empty()) {
    std::ifstream in(f.device_config);
    if (!in) return absl::InvalidArgumentError("--device-config: cannot read " + f.device_config);
    std::stringstream text;
    text << in.rdbuf();
    o.device_config_yaml = text.str();
  }
  auto level = spdlog::level::from_str(f.log_level);
  if (level == spdlog::level::off && f.log_level != "off") {
    return absl::InvalidArgumentError("--log-level: unknown level '" + f.log_level + "'");
  }
  spdlog::set_level(level);
  return absl::OkStatus();
}

// The control endpoint: restart parts as a supervisor would restart their processes.
class ControlEndpoint {
 public:
  // Serves on host:port (port 0: a free one); returns the port, or -1 when it cannot listen.
  int Start(local::LocalCluster& c, const std::string& host, int port) {
    auto part = [&c](const std::string& verb, const std::string& what,
                     const std::string& node) -> absl::Status {
      if (what == "scheduler") {
        if (verb == "stop") return c.StopScheduler();
        if (verb == "start") return c.StartScheduler();
        if (auto st = c.StopScheduler(); !st.ok()) return st;
        return c.StartScheduler();
      }
      if (verb == "stop") return c.StopDevicePlugin(node);
      if (verb == "start") return c.StartDevicePlugin(node);
      return c.RestartDevicePlugin(node);
    };
    server_.set_payload_max_length(4096);  // its requests carry no body: 413 for one over 4 KiB
    server_.Post(R"(/(restart|stop|start)/(device-plugin)/([a-z0-9.-]+))",
                 [part](const httplib::Request& req, httplib::Response& res) {
                   auto st = part(req.matches[1], req.matches[2], req.matches[3]);
                   res.status = st.ok() ? 200 : absl::IsNotFound(st) ? 404 : 500;
                   res.set_content(st.ok() ? "ok\n" : std::string(st.message()) + "\n",
                                   "text/plain");
                 });
    // NVIDIA's device-plugin stand-in of a node: as when its DaemonSet comes to or leaves it.
    server_.Post(
        R"(/(stop|start)/nvidia-device-plugin/([a-z0-9.-]+))",
        [&c](const httplib::Request& req, httplib::Response& res) {
          const std::string node = req.matches[2];
          auto st =
              req.matches[1] == "stop" ? c.StopNvidiaStandin(node) : c.StartNvidiaStandin(node);
          res.status = st.ok() ? 200 : absl::IsNotFound(st) ? 404 : 500;
          res.set_content(st.ok() ? "ok\n" : std::string(st.message()) + "\n", "text/plain");
        });
    // HAMi's legacy device-plugin stand-in of a node (?config=<device config with
    // nvidia.knownMigGeometries>), and dynmig's admission webhooks: removed, as before dynmig
    // was installed, and put back.
    server_.Post(R"(/(stop|start)/hami-device-plugin/([a-z0-9.-]+))",
                 [&c](const httplib::Request& req, httplib::Response& res) {
                   const std::string node = req.matches[2];
                   const std::string config = req.get_param_value("config");
                   auto st = req.matches[1] == "stop" ? c.StopHamiStandin(node)
                             : config.empty() || config.size() > 4096
                                 ? absl::InvalidArgumentError("?config=<file> (at most 4096 bytes)")
                                 : c.StartHamiStandin(node, config);
                   res.status = st.ok()                       ? 200
                                : absl::IsNotFound(st)        ? 404
                                : absl::IsInvalidArgument(st) ? 400
                                                              : 500;
                   res.set_content(st.ok() ? "ok\n" : std::string(st.message()) + "\n",
                                   "text/plain");
                 });
    server_.Post(R"(/(remove|install)/webhooks)",
                 [&c](const httplib::Request& req, httplib::Response& res) {
                   c.SetWebhooks(req.matches[1] == "install");
                   res.set_content("ok\n", "text/plain");
                 });
    server_.Post(R"(/(restart|stop|start)/scheduler)", [part](const httplib::Request& req,
                                                              httplib::Response& res) {
      auto st = part(req.matches[1], "scheduler", "");
      res.status = st.ok() ? 200 : 500;
      res.set_content(st.ok() ? "ok\n" : std::string(st.message()) + "\n", "text/plain");
    });
    const int bound =
        port == 0 ? server_.bind_to_any_port(host) : (server_.bind_to_port(host, port) ? port : -1);
    if (bound < 0) return -1;
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    return bound;
  }
  void Stop() {
    if (!thread_.joinable()) return;
    server_.stop();
    thread_.join();
  }

 private:
  httplib::Server server_;
  std::thread thread_;
};

// What `dynmig local` prints once the cluster is up: where everything is and what to try.
std::string Intro(local::LocalCluster& c, const std::string& control_host, int bound_control) {
  const std::string k = c.kubeconfig_path();
  std::string intro = fmt::format(
      "\ndynmig local is up: {} node(s), API server {}\n"
      "  kubeconfig      {}\n"
      "  scheduler       {} (extender /filter /bind, webhooks /webhook /validate, /metrics, "
      "/layout; the live page {}/live)\n"
      "  TLS             CA {}; /filter and /bind need kube-scheduler's client certificate {}\n",
      c.nodes().size(), c.api_url(), k, c.scheduler_url(), c.scheduler_url(), c.tls().ca_file,
      c.tls().client_cert_file);
  for (const auto& n : c.nodes()) {
    intro +=
        fmt::format("  node {:<10} {} at {}, device plugin http://{}:{}/nvml\n", n.name, n.gpus,
                    c.node_address(n.name), c.node_address(n.name), c.options().nvml_port);
  }
  intro += fmt::format(
      "Try:\n"
      "  kubectl --kubeconfig {0} apply -f examples/mig-canary.yaml\n"
      "  kubectl --kubeconfig {0} get pods -o wide\n"
      "  build/bin/dynmig layout --kubeconfig {0}\n"
      "  kubectl --kubeconfig {0} delete pod mig-canary\n",
      k);
  if (bound_control > 0) {
    intro += fmt::format(
        "  curl -d '' http://{}:{}/restart/device-plugin/{}   # restart one part (also: stop, "
        "start, /restart/scheduler, /start|stop/nvidia-device-plugin/NODE)\n",
        control_host, bound_control, c.nodes().front().name);
  }
  intro += "Events follow; Ctrl-C stops.\n";
  return intro;
}

// Kubernetes Events as they happen, one line each.
class EventPrinter {
 public:
  void Start(local::LocalCluster& c, Printer& printer) {
    auto client = c.Client(local::kAdminUser);
    if (!client.ok()) return;
    client_ = std::move(*client);
    informer_ = std::make_unique<kube::Informer>(*client_, kube::Resource::kEvents);
    kube::InformerHandlers h;
    h.on_add = [&printer](const kube::Object& e) {
      const kube::Object& inv = e.contains("involvedObject") ? e["involvedObject"] : kube::Object{};
      const std::string ns = inv.value("namespace", "");
      printer.Line(fmt::format("event: {} {} {} {}{}: {}", e.value("type", ""),
                               e.value("reason", ""), inv.value("kind", ""),
                               ns.empty() ? "" : ns + "/", inv.value("name", ""),
                               e.value("message", "")));
    };
    informer_->AddHandlers(h);
    informer_->Start();
  }
  void Stop() {
    if (informer_) informer_->Stop();
  }

 private:
  std::unique_ptr<kube::KubeClient> client_;
  std::unique_ptr<kube::Informer> informer_;
};

// The migration guide's walk-through (--demo); false when it failed (said on the printer).
bool PlayDemo(local::LocalCluster& c, Printer& printer) {
  PrinterBuf buf(printer);
  std::ostream demo_out(&buf);
  local::DemoOptions d;
  d.layout = [&c] { return RenderLayoutText(c.Layout()); };
  auto st = local::RunDemo(c, demo_out, d);
  demo_out.flush();
  if (st.ok()) return true;
  printer.Line(fmt::format("dynmig local: the demo failed: {}", std::string(st.message())));
  return false;
}

int RunLocal(const LocalFlags& f, CliContext& ctx) {
  auto bad = [&](const std::string& message) {
    ctx.err << "dynmig local: " << message << "\n";
    return kExitBadInput;
  };
  auto setup = ParseFlags(f);
  if (!setup.ok()) return bad(std::string(setup.status().message()));
  for (const auto& line : MoveTakenPorts(f, *setup)) ctx.err << "dynmig local: " << line << "\n";
  if (auto st = ApplyConfigFlags(f, setup->options); !st.ok())
    return bad(std::string(st.message()));

  Printer printer(ctx.out);
  if (!f.quiet) setup->options.log = [&printer](const std::string& line) { printer.Line(line); };

  StopSignals stop;  // before any part starts a thread

  auto cluster = local::LocalCluster::Start(std::move(setup->options));
  if (!cluster.ok()) {
    ctx.err << "dynmig local: " << std::string(cluster.status().message()) << "\n";
    return cluster.status().code() == absl::StatusCode::kInvalidArgument ? kExitBadInput
                                                                         : kExitFailure;
  }
  local::LocalCluster& c = **cluster;

  ControlEndpoint control;
  int bound_control = 0;
  if (!f.control.empty()) {
    bound_control = control.Start(c, setup->control_host, setup->control_port);
    if (bound_control < 0) {
      ctx.err << "dynmig local: --control: cannot listen on " << f.control << "\n";
      return kExitFailure;
    }
  }
  printer.Block(Intro(c, setup->control_host, bound_control));
  EventPrinter events;
  if (!f.quiet) events.Start(c, printer);

  const int rc = f.demo && !PlayDemo(c, printer) ? kExitFailure : kExitOk;
  const int signal_number = stop.Wait();
  printer.Line(fmt::format("dynmig local: signal {}, stopping", signal_number));
  events.Stop();
  control.Stop();
  c.Stop();
  return rc;
}

}  // namespace

void RegisterLocalCommand(CLI::App& root, CliContext& ctx) {
  auto f = std::make_shared<LocalFlags>();
  CLI::App* cmd = root.add_subcommand(
      "local",
      "Run the whole system on this machine: API server, scheduler and webhooks, device plugins on "
      "simulated GPUs, kubelet and kube-scheduler stand-ins");
  CLI::Option* listen_opt =
      cmd->add_option("--listen", f->listen,
                      "HOST:PORT of the API server (port 0 picks one; the default is replaced by "
                      "a free port when taken)")
          ->capture_default_str();
  cmd->add_option("--nodes", f->nodes,
                  "nodes and their simulated GPUs: NAME=MODELxCOUNT[,MODELxCOUNT][,NAME=...]")
      ->capture_default_str();
  cmd->add_option("--state-dir", f->state_dir,
                  "simulated GPU state, device-plugin state, kubeconfig (kept across runs)")
      ->capture_default_str();
  cmd->add_option("--device-config", f->device_config,
                  "device-config.yaml (default: an allowlist of every catalogued model)");
  CLI::Option* control_opt =
      cmd->add_option("--control", f->control,
                      "HOST:PORT of the restart endpoint (empty: none; port 0 picks one)")
          ->capture_default_str();
  CLI::Option* nvml_port_opt =
      cmd->add_option("--nvml-port", f->nvml_port,
                      "port of each device plugin's /metrics and /nvml on its node address")
          ->capture_default_str();
  cmd->add_option("--sim-latency", f->sim_latency,
                  "how long the simulated GPUs take to create/destroy instances: none, realistic "
                  "(about 1.5 s per allocation) or [MODEL:]OP=DURATION items, OP one of "
                  "create-gi, destroy-gi, create-ci, destroy-ci (e.g. create-gi=250ms)")
      ->capture_default_str();
  cmd->add_option("--legacy-geometry", f->legacy_geometry,
                  "a handover's legacy world: lay NODE's GPUs out in a fixed geometry before "
                  "anything runs, as MIG Manager does: NODE=PROFILE=COUNT[,PROFILE=COUNT...] "
                  "(repeatable)");
  cmd->add_option("--nvidia-standin", f->nvidia_standin,
                  "run NVIDIA's device plugin stand-in (mixed strategy, nvidia.com/mig-<profile>) "
                  "on NODE (repeatable; the control endpoint stops and starts it)");
  cmd->add_option("--device-plugin-stopped", f->device_plugin_stopped,
                  "do not start dynmig's device plugin on NODE until the control endpoint's "
                  "/start/device-plugin/NODE (repeatable)");
  cmd->add_flag("--demo", f->demo,
                "play the migration guide's canary and mixed-profile walk-through, then serve");
  cmd->add_flag("--quiet", f->quiet, "print only the summary (and the demo)");
  AddDefragOptions(cmd, f->defrag);
  cmd->add_option("--log-level", f->log_level, "components' log level: debug, info, warn, error")
      ->capture_default_str();
  cmd->callback([f, listen_opt, control_opt, nvml_port_opt, &ctx] {
    f->listen_given = listen_opt->count() > 0;
    f->control_given = control_opt->count() > 0;
    f->nvml_port_given = nvml_port_opt->count() > 0;
    ctx.exit_code = RunLocal(*f, ctx);
  });
}

}  // namespace dynmig::cli
