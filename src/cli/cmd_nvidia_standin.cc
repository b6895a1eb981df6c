// `dynmig nvidia-plugin-standin`: NVIDIA's device plugin in the mixed MIG strategy, stood in for
// by deviceplugin::NvidiaStandin (one resource nvidia.com/mig-<profile> per profile present, MIG
// UUIDs as device IDs), on a node's kubelet directory. It reads NVML as `dynmig device-plugin`
// does: the real driver, or the simulator (--sim / --sim-state, seeded with --node), so a
// real-cluster run and the local mode share one simulated GPU state with dynmig's device plugin.
// --geometry first lays out a fixed geometry on every GPU (as MIG Manager does before the plugin
// starts). Runs until SIGINT/SIGTERM, then removes its sockets (the plugin goes away).
// --hami-config FILE stands in for HAMi's LEGACY device plugin instead (StandinMode::kHamiLegacy):
// nvidia.com/gpu with fake split ids, Allocate through the pods' HAMi annotations (read and written
// with --kubeconfig), the legacy geometries of FILE's nvidia.knownMigGeometries.
#include <CLI/CLI.hpp>
#include <memory>
#include <ostream>
#include <string>

#include "absl/time/time.h"
#include "cli/cli.h"
#include "common/clock.h"
#include "deviceplugin/nvidia_standin.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "kube/kube_client.h"
#include "nvml/geometry.h"
#include "protocol/device_config.h"
#include "protocol/devices.h"

namespace dynmig::cli {

// Declared here rather than in cli.h (as RegisterChaosCommand) so adding it rebuilds nothing else.
void RegisterNvidiaStandinCommand(CLI::App& root, CliContext& ctx);

namespace {

struct StandinFlags {
  std::string node = "dynmig-sim";
  std::string kubelet_dir = "/var/lib/kubelet/device-plugins";
  std::string sim;
  std::string sim_state;
  std::string geometry;
  std::string refresh = "1s";
  std::string hami_config;  // HAMi's legacy plugin instead, with this device config
  std::string kubeconfig;
  int split = 10;
};

absl::Status ApplyEverywhere(nvml::Nvml& gpu, const std::string& text, CliContext& ctx) {
  auto spec = mig::ParseGeometry(text);
  if (!spec.ok()) return spec.status();
  auto count = gpu.DeviceCount();
  if (!count.ok()) return count.status();
  for (uint32_t i = 0; i < *count; ++i) {
    auto r = nvml::ApplyGeometry(gpu, i, *spec);
    if (!r.ok()) return r.status();
    ctx.out << fmt::format("GPU {}: geometry {} {}\n", i, spec->ToString(),
                           r->unchanged ? "already applied" : "applied");
  }
  return absl::OkStatus();
}

int Run(const StandinFlags& f, CliContext& ctx) {
  auto fail = [&](const std::string& msg, int code) {
    ctx.err << "dynmig nvidia-plugin-standin: " << msg << "\n";
    return code;
  };
  absl::Duration refresh;
  if (!absl::ParseDuration(f.refresh, &refresh) || refresh <= absl::ZeroDuration()) {
    return fail(fmt::format("--refresh: \"{}\" is not a positive duration", f.refresh),
                kExitBadInput);
  }
  const Clock& clock = RealClock();
  auto gpu = OpenNodeNvml({f.node, f.sim, f.sim_state, {}}, clock);  // as dynmig device-plugin
  if (!gpu.ok()) {
    return fail(
        std::string(gpu.status().message()),
        gpu.status().code() == absl::StatusCode::kInvalidArgument ? kExitBadInput : kExitFailure);
  }
  if (!f.geometry.empty()) {
    if (auto st = ApplyEverywhere(**gpu, f.geometry, ctx); !st.ok()) {
      return fail(std::string(st.message()),
                  st.code() == absl::StatusCode::kInvalidArgument ? kExitBadInput : kExitFailure);
    }
  }
  deviceplugin::NvidiaStandinOptions o;
  o.kubelet_dir = f.kubelet_dir;
  o.refresh_interval = refresh;
  std::unique_ptr<kube::KubeClient> kube;
  if (!f.hami_config.empty()) {
    auto config = protocol::LoadDeviceConfig(f.hami_config);
    if (!config.ok()) return fail(std::string(config.status().message()), kExitBadInput);
    auto client = ConnectKube(f.kubeconfig, false);
    if (!client.ok()) return fail(std::string(client.status().message()), kExitFailure);
    kube = std::move(*client);
    o.mode = deviceplugin::StandinMode::kHamiLegacy;
    o.node = f.node;
    o.kube = kube.get();
    o.split_count = f.split;
    o.legacy_geometries = config->legacy_geometries;
  }
  StopSignals stop;
  auto standin = deviceplugin::NvidiaStandin::Start(o, **gpu, clock);
  if (!standin.ok()) return fail(std::string(standin.status().message()), kExitFailure);
  std::vector<std::string> resources;
  for (const auto& p : (*standin)->profiles()) resources.push_back((*standin)->resource(p));
  ctx.out << fmt::format("nvidia-plugin-standin serving {} in {}", fmt::join(resources, ", "),
                         f.kubelet_dir)
          << std::endl;
  const int signal_number = stop.Wait();
  ctx.out << "nvidia-plugin-standin: signal " << signal_number << ", stopping" << std::endl;
  (*standin)->Stop();
  return kExitOk;
}

}  // namespace

void RegisterNvidiaStandinCommand(CLI::App& root, CliContext& ctx) {
  auto f = std::make_shared<StandinFlags>();
  CLI::App* cmd = root.add_subcommand(
      "nvidia-plugin-standin",
      "Stand in for NVIDIA's device plugin, mixed MIG strategy (tests, local mode, real-cluster "
      "suite): one nvidia.com/mig-<profile> resource per profile present, MIG UUIDs as devices");
  cmd->add_option("--node", f->node, "this node's name (seeds the simulator's UUIDs)")
      ->capture_default_str();
  cmd->add_option("--kubelet-dir", f->kubelet_dir, "the kubelet's device-plugin directory")
      ->capture_default_str();
  cmd->add_option("--sim", f->sim, "simulated GPUs instead of NVML, e.g. H200x2");
  cmd->add_option("--sim-state", f->sim_state, "the simulator's state file (shared with dynmig)");
  cmd->add_option("--geometry", f->geometry,
                  "first lay out this fixed geometry on every GPU (all-<profile> or "
                  "<profile>=<n>,...), as MIG Manager does");
  cmd->add_option("--refresh", f->refresh, "how often ListAndWatch re-reads NVML")
      ->capture_default_str();
  cmd->add_option("--hami-config", f->hami_config,
                  "stand in for HAMi's LEGACY device plugin instead (nvidia.com/gpu, fake split "
                  "ids, GPU-<uuid>[t-s] from the pods' annotations), with this device config's "
                  "nvidia.knownMigGeometries");
  cmd->add_option("--kubeconfig", f->kubeconfig, "with --hami-config: the API's kubeconfig");
  cmd->add_option("--split", f->split, "with --hami-config: fake ids per GPU (deviceSplitCount)")
      ->capture_default_str();
  cmd->callback([f, &ctx] { ctx.exit_code = Run(*f, ctx); });
}

}  // namespace dynmig::cli
