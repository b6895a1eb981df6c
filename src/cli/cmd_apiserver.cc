// `dynmig apiserver`: serves the in-memory Kubernetes API server until SIGINT/SIGTERM.
// For tests and the local mode only; it keeps everything in memory and has no authentication.
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <charconv>
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
  const size_t colon = flags.listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0) {
    ctx.err << "dynmig apiserver: --listen must be HOST:PORT, got '" << flags.listen << "'\n";
    return kExitBadInput;
  }
  const std::string host = flags.listen.substr(0, colon);
  const std::string port_text = flags.listen.substr(colon + 1);
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || ptr != port_text.data() + port_text.size() || port < 0 || port > 65535) {
    ctx.err << "dynmig apiserver: bad port '" << port_text << "' in --listen\n";
    return kExitBadInput;
  }
  if (flags.bookmark_interval_s <= 0) {
    ctx.err << "dynmig apiserver: --bookmark-interval must be positive\n";
    return kExitBadInput;
  }

  // Block the stop signals before the server starts its threads (they inherit the mask), then
  // wait for one synchronously: no signal handler, no global state.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigset_t previous;
  pthread_sigmask(SIG_BLOCK, &stop_signals, &previous);

  kube::InMemoryApiServerOptions options;
  options.host = host;
  options.port = port;
  options.store.watch_history = flags.watch_history;
  options.bookmark_interval = absl::Milliseconds(flags.bookmark_interval_s * 1000);
  options.log_requests = flags.log_requests;
  auto server = kube::InMemoryApiServer::Start(options);
  if (!server.ok()) {
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    ctx.err << "dynmig apiserver: " << server.status().message() << "\n";
    return kExitFailure;
  }
  if (!flags.kubeconfig_out.empty()) {
    std::ofstream out(flags.kubeconfig_out);
    out << KubeconfigFor((*server)->url());
    if (!out) {
      pthread_sigmask(SIG_SETMASK, &previous, nullptr);
      ctx.err << "dynmig apiserver: cannot write " << flags.kubeconfig_out << "\n";
      return kExitFailure;
    }
  }
  ctx.out << "dynmig apiserver listening on " << (*server)->url() << std::endl;

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  ctx.out << "dynmig apiserver: signal " << signal_number << ", stopping" << std::endl;
  (*server)->Stop();
  server->reset();
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
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
