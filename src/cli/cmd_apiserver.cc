// `dynmig apiserver`: serves the in-memory Kubernetes API server until SIGINT/SIGTERM.
// For tests and the local mode only; it keeps everything in memory and has no authentication.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>

#include "cli/cli.h"
#include "kube/in_memory_api_server.h"

namespace dynmig::cli {
namespace {

struct ApiserverFlags {
  std::string listen = "127.0.0.1:0";
  size_t watch_history = 10000;
  double bookmark_interval_s = 5;
  std::string kubeconfig_out;
  bool log_requests = false;
};

std::string KubeconfigFor(const std::string& url) {
  return fmt::format(
      "apiVersion: v1\n"
      "kind: Config\n"
      "clusters:\n"
      "- name: dynmig-inmemory\n"
      "  cluster:\n"
      "    server: {}\n"
      "contexts:\n"
      "- name: dynmig-inmemory\n"
      "  context:\n"
      "    cluster: dynmig-inmemory\n"
      "    user: dynmig\n"
      "    namespace: default\n"
      "current-context: dynmig-inmemory\n"
      "users:\n"
      "- name: dynmig\n"
      "  user: {{}}\n",
      url);
}

int RunApiserver(const ApiserverFlags& flags, CliContext& ctx) {
  std::string host;
  int port = -1;
  if (auto st = ParseHostPort("--listen", flags.listen, "", &host, &port); !st.ok()) {
    ctx.err << "dynmig apiserver: " << st.message() << "\n";
    return kExitBadInput;
  }
  if (flags.bookmark_interval_s <= 0) {
    ctx.err << "dynmig apiserver: --bookmark-interval must be positive\n";
    return kExitBadInput;
  }

  // Blocked before the server starts its threads, then waited for: no handler, no global state.
  StopSignals stop;

  kube::InMemoryApiServerOptions options;
  options.clock = &RealClock();  // the process's one clock, for the server and its store
  options.host = host;
  options.port = port;
  options.store.watch_history = flags.watch_history;
  options.bookmark_interval = absl::Milliseconds(flags.bookmark_interval_s * 1000);
  options.log_requests = flags.log_requests;
  auto server = kube::InMemoryApiServer::Start(options);
  if (!server.ok()) {
    ctx.err << "dynmig apiserver: " << server.status().message() << "\n";
    return kExitFailure;
  }
  if (!flags.kubeconfig_out.empty()) {
    std::ofstream out(flags.kubeconfig_out);
    out << KubeconfigFor((*server)->url());
    if (!out) {
      ctx.err << "dynmig apiserver: cannot write " << flags.kubeconfig_out << "\n";
      return kExitFailure;
    }
  }
  ctx.out << "dynmig apiserver listening on " << (*server)->url() << std::endl;

  const int signal_number = stop.Wait();
  ctx.out << "dynmig apiserver: signal " << signal_number << ", stopping" << std::endl;
  (*server)->Stop();
  return kExitOk;
}

}  // namespace

void RegisterApiserverCommand(CLI::App& root, CliContext& ctx) {
  auto flags = std::make_shared<ApiserverFlags>();
  CLI::App* cmd = root.add_subcommand(
      "apiserver",
      "Serve an in-memory Kubernetes API server (tests and local mode; never production)");
  cmd->add_option("--listen", flags->listen, "HOST:PORT to listen on (port 0 picks a free one)")
      ->capture_default_str();
  cmd->add_option("--watch-history", flags->watch_history,
                  "watch events kept for resuming watches (older resourceVersions get 410)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{10000000}));
  cmd->add_option("--bookmark-interval", flags->bookmark_interval_s,
                  "seconds between BOOKMARK events on watches that allow them")
      ->capture_default_str();
  cmd->add_option("--kubeconfig-out", flags->kubeconfig_out,
                  "write a kubeconfig for this server to this path");
  cmd->add_flag("--log-requests", flags->log_requests, "log each request (spdlog debug)");
  cmd->callback([flags, &ctx] { ctx.exit_code = RunApiserver(*flags, ctx); });
}

}  // namespace dynmig::cli
