// `dynmig gpu cordon|uncordon --node N --gpu UUID|INDEX [--reason TEXT]`: the per-GPU cordon
// (HAMi's hami.io/device-cordon), written through the Kubernetes API. The logic lives in
// src/ops/gpu_cordon; this file parses flags and prints. Exit 0 when done (or nothing to do), 1
// when the cluster could not be read or written, 2 on bad input (no such node or GPU, a bad
// reason, an annotation that does not parse).
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <memory>
#include <ostream>

#include "cli/cli.h"
#include "common/clock.h"
#include "fmt/format.h"
#include "kube/kube_client.h"
#include "ops/gpu_cordon.h"
#include "ops/gpu_mode.h"
#include "ops/report.h"

namespace dynmig::cli {
namespace {

struct GpuFlags {
  std::string kubeconfig;
  bool in_cluster = false;
  std::string output = "text";
  ops::GpuCordonOptions options;
};

int GpuExitFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

int RunGpu(GpuFlags f, bool cordon, CliContext& ctx) {
  const std::string command = cordon ? "gpu cordon" : "gpu uncordon";
  auto fail = [&](const absl::Status& st) {
    ctx.err << "dynmig " << command << ": " << st.message() << "\n";
    return GpuExitFor(st);
  };
  auto format = ops::ParseOutputFormat(f.output);
  if (!format.ok()) return fail(format.status());
  f.options.cordon = cordon;
  if (f.options.by.empty() && cordon) {
    if (const char* user = std::getenv("USER"); user != nullptr) f.options.by = user;
  }
  auto client = ConnectKube(f.kubeconfig, f.in_cluster);
  if (!client.ok()) return fail(client.status());
  auto out = ops::RunGpuCordon(**client, f.options);
  if (!out.ok()) return fail(out.status());
  PrintOutput(ctx, *format, out->json, out->text);
  return kExitOk;
}

struct GpuModeFlags {
  std::string kubeconfig;
  bool in_cluster = false;
  std::string output = "text";
  std::string to;
  ops::GpuModeOptions options;
};

int RunGpuMode(GpuModeFlags f, CliContext& ctx) {
  auto fail = [&](const absl::Status& st) {
    ctx.err << "dynmig gpu mode: " << st.message() << "\n";
    return GpuExitFor(st);
  };
  auto format = ops::ParseOutputFormat(f.output);
  if (!format.ok()) return fail(format.status());
  if (!f.to.empty()) {
    auto to = protocol::GpuModeFromName(f.to);
    if (!to.has_value()) {
      return fail(absl::InvalidArgumentError(
          fmt::format("--to: must be mig or hami-core, got \"{}\"", f.to.substr(0, 64))));
    }
    f.options.to = *to;
  }
  if (f.options.by.empty()) {
    if (const char* user = std::getenv("USER"); user != nullptr) f.options.by = user;
  }
  f.options.now = ctx.clock.Now();
  auto client = ConnectKube(f.kubeconfig, f.in_cluster);
  if (!client.ok()) return fail(client.status());
  auto out = ops::RunGpuMode(**client, f.options);
  if (!out.ok()) return fail(out.status());
  PrintOutput(ctx, *format, out->json, out->text);
  return kExitOk;
}

}  // namespace

void RegisterGpuCommand(CLI::App& root, CliContext& ctx) {
  CLI::App* gpu = root.add_subcommand(
      "gpu",
      "Per-GPU operations: cordon and uncordon one GPU of a node (hami.io/device-cordon), its "
      "MIG mode (dynmig.io/gpu-mode)");
  gpu->require_subcommand(1);
  for (const bool cordon : {true, false}) {
    auto f = std::make_shared<GpuFlags>();
    CLI::App* cmd = gpu->add_subcommand(
        cordon ? "cordon" : "uncordon",
        cordon ? "The GPU takes no new reservation; instances already on it stay"
               : "The GPU takes new reservations again");
    cmd->add_option("--kubeconfig", f->kubeconfig,
                    "kubeconfig file (default: $KUBECONFIG, in-cluster when available, "
                    "~/.kube/config)");
    cmd->add_flag("--in-cluster", f->in_cluster, "use the pod's service account");
    cmd->add_option("-o,--output", f->output, "text, json or yaml")->capture_default_str();
    cmd->add_option("--node", f->options.node, "the node")->required();
    cmd->add_option("--gpu", f->options.gpu, "the GPU: its UUID or its index on the node")
        ->required();
    if (cordon) {
      cmd->add_option("--reason", f->options.reason, "why (shown by `dynmig explain`)");
      cmd->add_option("--by", f->options.by, "who cordons it (default: $USER)");
    }
    cmd->callback([f, cordon, &ctx] { ctx.exit_code = RunGpu(*f, cordon, ctx); });
  }
  auto m = std::make_shared<GpuModeFlags>();
  CLI::App* mode = gpu->add_subcommand(
      "mode",
      "Show each GPU's MIG mode status (dynmig.io/gpu-mode), or ask the device plugin to switch "
      "one GPU (--gpu and --to: dynmig.io/gpu-mode-request)");
  mode->add_option("--kubeconfig", m->kubeconfig,
                   "kubeconfig file (default: $KUBECONFIG, in-cluster when available, "
                   "~/.kube/config)");
  mode->add_flag("--in-cluster", m->in_cluster, "use the pod's service account");
  mode->add_option("-o,--output", m->output, "text, json or yaml")->capture_default_str();
  mode->add_option("--node", m->options.node, "the node")->required();
  mode->add_option("--gpu", m->options.gpu, "the GPU: its UUID or its index on the node");
  mode->add_option("--to", m->to, "mig or hami-core (the whole GPU, MIG off)");
  mode->add_option("--reason", m->options.reason, "why (recorded in the request)");
  mode->add_option("--by", m->options.by, "who asks (default: $USER)");
  mode->callback([m, &ctx] { ctx.exit_code = RunGpuMode(*m, ctx); });
}

}  // namespace dynmig::cli
