// `dynmig nvml`: look at and change MIG instances through the Nvml seam, on the real driver (the
// default) or the simulator (--sim SPEC and/or --state FILE), like `nvidia-smi mig -lgip/-lgipp/
// -lgi/-lci/-cgi/-dgi`. Simulator-only subcommands drive its test helpers (faults, processes, MIG
// mode) so an end-to-end test can script another process's GPU.
#include <CLI/CLI.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "common/clock.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "nvml/dlopen_nvml.h"
#include "nvml/geometry.h"
#include "nvml/nvml.h"
#include "nvml/sim_nvml.h"
#include "protocol/device_config.h"

namespace dynmig::cli {
namespace {

using Json = nlohmann::json;
using nvml::Nvml;

struct NvmlFlags {
  // Backend.
  std::string sim;
  std::string state;
  std::string seed = "dynmig-sim";
  std::vector<uint32_t> swapped_halves;
  std::string library = "libnvidia-ml.so.1";
  // Per subcommand.
  std::string output = "text";
  std::optional<uint32_t> gpu;
  std::string profile;
  uint32_t placement = 0;
  uint32_t gi = 0;
  uint32_t ci = 0;
  bool yes = false;
  std::string op;
  uint32_t nth = 1;
  uint32_t times = 1;
  std::string code;
  std::optional<int64_t> latency_ms;
  bool clear = false;
  bool list = false;
  std::string uuid;
  uint32_t pid = 0;
  uint64_t memory_mib = 0;
  std::string mode;
  std::string geometry;
  std::string holder = "dcgm";
  std::string hami_config;
  std::optional<size_t> hami_geometry;
};

// An opened backend.
struct Backend {
  std::unique_ptr<Nvml> nvml;
  nvml::SimNvml* sim = nullptr;  // set for the simulator
  bool real() const { return sim == nullptr; }
};

// Reports an error and sets the exit code.
void Fail(CliContext& ctx, std::string_view command, std::string_view message, int code) {
  ctx.err << "dynmig nvml " << command << ": " << message << "\n";
  ctx.exit_code = code;
}

void Fail(CliContext& ctx, std::string_view command, const absl::Status& status, int code) {
  Fail(ctx, command, std::string(status.message()), code);
}

std::optional<Backend> Open(const NvmlFlags& f, CliContext& ctx, std::string_view command) {
  Backend b;
  if (!f.sim.empty() || !f.state.empty()) {
    nvml::SimNvmlOptions o;
    o.clock = &RealClock();  // the command's clock: injected latency sleeps on it
    o.spec = f.sim;
    o.state_file = f.state;
    o.seed = f.seed;
    o.swapped_halves_gpus = f.swapped_halves;
    auto sim = nvml::SimNvml::Create(std::move(o));
    if (!sim.ok()) {
      const bool bad_input = sim.status().code() == absl::StatusCode::kInvalidArgument ||
                             sim.status().code() == absl::StatusCode::kNotFound;
      Fail(ctx, command, sim.status(), bad_input ? kExitBadInput : kExitFailure);
      return std::nullopt;
    }
    b.sim = sim->get();
    b.nvml = std::move(*sim);
    return b;
  }
  nvml::DlopenNvmlOptions o;
  o.library = f.library;
  auto real = nvml::DlopenNvml::Create(o);
  if (!real.ok()) {
    Fail(ctx, command,
         fmt::format("{} (use --sim SPEC [--state FILE] for the simulator)",
                     std::string(real.status().message())),
         kExitFailure);
    return std::nullopt;
  }
  b.nvml = std::move(*real);
  return b;
}

// GPUs to show: --gpu or all.
std::optional<std::vector<uint32_t>> Gpus(Nvml& nvml, const NvmlFlags& f, CliContext& ctx,
                                          std::string_view command) {
  auto count = nvml.DeviceCount();
  if (!count.ok()) {
    Fail(ctx, command, count.status(), kExitFailure);
    return std::nullopt;
  }
  if (f.gpu.has_value()) {
    if (*f.gpu >= *count) {
      Fail(ctx, command, fmt::format("there is no GPU {} ({} GPUs)", *f.gpu, *count),
           kExitBadInput);
      return std::nullopt;
    }
    return std::vector<uint32_t>{*f.gpu};
  }
  std::vector<uint32_t> out;
  for (uint32_t i = 0; i < *count; ++i) out.push_back(i);
  return out;
}

std::string MigText(const nvml::MigModeState& m) {
  if (!m.supported) return "MIG not supported";
  std::string s = m.current ? "MIG enabled" : "MIG disabled";
  if (m.pending != m.current) s += m.pending ? " (enabled after reset)" : " (disabled after reset)";
  return s;
}

std::string PlacementsText(const std::vector<mig::Placement>& placements) {
  // -lgipp style: "{0,2,4}:2" per size.
  std::vector<std::string> groups;
  size_t i = 0;
  while (i < placements.size()) {
    std::vector<uint32_t> starts;
    const uint32_t size = placements[i].size;
    while (i < placements.size() && placements[i].size == size)
      starts.push_back(placements[i++].start);
    groups.push_back(fmt::format("{{{}}}:{}", fmt::join(starts, ","), size));
  }
  return fmt::format("{}", fmt::join(groups, " "));
}

Json PlacementJson(const mig::Placement& p) { return Json{{"start", p.start}, {"size", p.size}}; }

// How many more GIs of a profile fit now: free legal placements, greedily disjoint, capped by the
// instances left.
uint32_t FreeCount(const mig::ProfileSpec& p, const std::vector<nvml::GpuInstanceInfo>& gis) {
  uint32_t same = 0;
  for (const auto& gi : gis) same += gi.profile_id == p.nvml_id ? 1 : 0;
  if (same >= p.instance_count) return 0;
  std::vector<mig::Placement> taken;
  for (const auto& gi : gis) taken.push_back(gi.placement);
  uint32_t fits = 0;
  for (const auto& pl : p.placements) {
    bool free = true;
    for (const auto& t : taken) free = free && !t.Overlaps(pl);
    if (free) {
      taken.push_back(pl);
      ++fits;
    }
  }
  return std::min(fits, p.instance_count - same);
}

std::string ProfileNameById(const std::vector<mig::ProfileSpec>& profiles, uint32_t id) {
  for (const auto& p : profiles) {
    if (p.nvml_id == id) return p.name;
  }
  return fmt::format("profile {}", id);
}

// --- list, profiles, instances ---------------------------------------------------------------

void RunList(const NvmlFlags& f, CliContext& ctx) {
  auto b = Open(f, ctx, "list");
  if (!b) return;
  auto gpus = Gpus(*b->nvml, f, ctx, "list");
  if (!gpus) return;
  Json out = {{"backend", b->nvml->Description()}, {"gpus", Json::array()}};
  for (uint32_t i : *gpus) {
    auto info = b->nvml->GetGpu(i);
    if (!info.ok()) return Fail(ctx, "list", info.status(), kExitFailure);
    if (f.output == "json") {
      out["gpus"].push_back({{"index", info->index},
                             {"uuid", info->uuid},
                             {"name", info->name},
                             {"pciBusId", info->pci_bus_id},
                             {"pciDeviceId", fmt::format("0x{:08X}", info->pci_device_id)},
                             {"minor", info->minor},
                             {"memoryMiB", info->total_memory_mib},
                             {"mig",
                              {{"supported", info->mig.supported},
                               {"current", info->mig.current},
                               {"pending", info->mig.pending}}}});
    } else {
      ctx.out << fmt::format("GPU {}: {} (UUID: {}, PCI {}, minor {}, {} MiB, {})\n", info->index,
                             info->name, info->uuid, info->pci_bus_id, info->minor,
                             info->total_memory_mib, MigText(info->mig));
    }
  }
  if (f.output == "json") ctx.out << out.dump(2) << "\n";
}

void RunProfiles(const NvmlFlags& f, CliContext& ctx) {
  auto b = Open(f, ctx, "profiles");
  if (!b) return;
  auto gpus = Gpus(*b->nvml, f, ctx, "profiles");
  if (!gpus) return;
  Json out = {{"gpus", Json::array()}};
  for (uint32_t i : *gpus) {
    auto info = b->nvml->GetGpu(i);
    if (!info.ok()) return Fail(ctx, "profiles", info.status(), kExitFailure);
    if (!info->mig.supported) {
      if (f.output != "json")
        ctx.out << fmt::format("GPU {} {}: MIG not supported\n", i, info->name);
      continue;
    }
    auto profiles = nvml::DiscoverProfiles(*b->nvml, i);
    if (!profiles.ok()) return Fail(ctx, "profiles", profiles.status(), kExitFailure);
    std::optional<std::vector<nvml::GpuInstanceInfo>> gis;
    if (info->mig.current) {
      auto listed = b->nvml->ListGpuInstances(i);
      if (!listed.ok()) return Fail(ctx, "profiles", listed.status(), kExitFailure);
      gis = std::move(*listed);
    }
    Json jgpu = {{"index", i}, {"name", info->name}, {"profiles", Json::array()}};
    if (f.output != "json") {
      ctx.out << fmt::format("GPU {} {} ({})\n", i, info->name, MigText(info->mig));
      ctx.out << fmt::format(
          "  {:<16} {:>3} {:>5} {:>10} {:>11} {:>6} {:>4} {:>3} {:>3} {:>3} {:>3} "
          "{:>3}  {}\n",
          "PROFILE", "ID", "INDEX", "FREE/TOTAL", "MEMORY_MiB", "SLICES", "SM", "CE", "DEC", "ENC",
          "JPG", "OFA", "PLACEMENTS");
    }
    for (const auto& p : *profiles) {
      // "-" / null while MIG is disabled.
      const Json free = gis ? Json(FreeCount(p, *gis)) : Json(nullptr);
      const std::string free_text = gis ? std::to_string(FreeCount(p, *gis)) : "-";
      if (f.output == "json") {
        Json placements = Json::array();
        for (const auto& pl : p.placements) placements.push_back(PlacementJson(pl));
        jgpu["profiles"].push_back({{"name", p.name},
                                    {"id", p.nvml_id},
                                    {"index", p.nvml_index},
                                    {"memoryMiB", p.memory_mib},
                                    {"sliceCount", p.compute_slices},
                                    {"memorySlices", p.memory_slices},
                                    {"instanceCount", p.instance_count},
                                    {"free", free},
                                    {"multiprocessorCount", p.multiprocessor_count},
                                    {"placements", placements}});
      } else {
        ctx.out << fmt::format(
            "  {:<16} {:>3} {:>5} {:>10} {:>11} {:>6} {:>4} {:>3} {:>3} {:>3} {:>3} {:>3}  {}\n",
            p.name, p.nvml_id, p.nvml_index, fmt::format("{}/{}", free_text, p.instance_count),
            p.memory_mib, p.compute_slices, p.multiprocessor_count, p.copy_engines, p.decoders,
            p.encoders, p.jpegs, p.ofas, PlacementsText(p.placements));
      }
    }
    out["gpus"].push_back(std::move(jgpu));
  }
  if (f.output == "json") ctx.out << out.dump(2) << "\n";
}

void RunInstances(const NvmlFlags& f, CliContext& ctx) {
  auto b = Open(f, ctx, "instances");
  if (!b) return;
  auto gpus = Gpus(*b->nvml, f, ctx, "instances");
  if (!gpus) return;
  Json out = {{"gpus", Json::array()}};
  for (uint32_t i : *gpus) {
    auto info = b->nvml->GetGpu(i);
    if (!info.ok()) return Fail(ctx, "instances", info.status(), kExitFailure);
    Json jgpu = {{"index", i},
                 {"uuid", info->uuid},
                 {"name", info->name},
                 {"migEnabled", info->mig.current},
                 {"gpuInstances", Json::array()}};
    if (f.output != "json") ctx.out << fmt::format("GPU {} {}\n", i, info->name);
    if (!info->mig.current) {
      if (f.output != "json") ctx.out << "  " << MigText(info->mig) << "\n";
      out["gpus"].push_back(std::move(jgpu));
      continue;
    }
    auto profiles = nvml::DiscoverProfiles(*b->nvml, i);
    if (!profiles.ok()) return Fail(ctx, "instances", profiles.status(), kExitFailure);
    auto gis = b->nvml->ListGpuInstances(i);
    if (!gis.ok()) return Fail(ctx, "instances", gis.status(), kExitFailure);
    if (f.output != "json") {
      if (gis->empty()) {
        ctx.out << "  no GPU instances\n";
      } else {
        ctx.out << fmt::format("  {:>3}  {:<16} {:>3} {:>9}  {:>3}  {}\n", "GI", "PROFILE", "ID",
                               "PLACEMENT", "CI", "MIG DEVICE");
      }
    }
    for (const auto& gi : *gis) {
      auto cis = b->nvml->ListComputeInstances(i, gi.id);
      if (!cis.ok()) return Fail(ctx, "instances", cis.status(), kExitFailure);
      const std::string name = ProfileNameById(*profiles, gi.profile_id);
      Json jcis = Json::array();
      for (const auto& ci : *cis) {
        jcis.push_back({{"id", ci.id},
                        {"profileId", ci.profile_id},
                        {"placement", PlacementJson(ci.placement)},
                        {"migUUID", ci.mig_uuid}});
      }
      jgpu["gpuInstances"].push_back({{"id", gi.id},
                                      {"profile", name},
                                      {"profileId", gi.profile_id},
                                      {"placement", PlacementJson(gi.placement)},
                                      {"computeInstances", jcis}});
      if (f.output == "json") continue;
      const std::string placement = fmt::format("{}:{}", gi.placement.start, gi.placement.size);
      if (cis->empty()) {
        ctx.out << fmt::format("  {:>3}  {:<16} {:>3} {:>9}  {:>3}  {}\n", gi.id, name,
                               gi.profile_id, placement, "-", "(no compute instance)");
      }
      for (const auto& ci : *cis) {
        ctx.out << fmt::format("  {:>3}  {:<16} {:>3} {:>9}  {:>3}  {}\n", gi.id, name,
                               gi.profile_id, placement, ci.id, ci.mig_uuid);
      }
    }
    out["gpus"].push_back(std::move(jgpu));
  }
  if (f.output == "json") ctx.out << out.dump(2) << "\n";
}

// --- create, destroy ---------------------------------------------------------------------------

bool RequireYes(const Backend& b, const NvmlFlags& f, CliContext& ctx, std::string_view command) {
  if (!b.real() || f.yes) return true;
  Fail(ctx, command,
       fmt::format("refusing to change a real GPU without --yes ({})", b.nvml->Description()),
       kExitBadInput);
  return false;
}

void RunCreate(const NvmlFlags& f, CliContext& ctx) {
  auto b = Open(f, ctx, "create");
  if (!b) return;
  if (!RequireYes(*b, f, ctx, "create")) return;
  auto gpus = Gpus(*b->nvml, f, ctx, "create");
  if (!gpus) return;
  const uint32_t gpu = gpus->front();
  auto profiles = nvml::DiscoverProfiles(*b->nvml, gpu);
  if (!profiles.ok()) {
    return Fail(ctx, "create",
                fmt::format("GPU {}: {}", gpu, std::string(profiles.status().message())),
                kExitFailure);
  }
  const mig::ProfileSpec* profile = nullptr;
  for (const auto& p : *profiles) {
    if (p.name == f.profile || std::to_string(p.nvml_id) == f.profile) profile = &p;
  }
  if (profile == nullptr) {
    std::vector<std::string> names;
    for (const auto& p : *profiles) names.push_back(fmt::format("{} (id {})", p.name, p.nvml_id));
    return Fail(ctx, "create",
                fmt::format("GPU {} has no MIG profile \"{}\"; it has {}", gpu, f.profile,
                            fmt::join(names, ", ")),
                kExitBadInput);
  }
  const mig::Placement placement{f.placement, profile->memory_slices};
  if (!profile->IsLegal(placement)) {
    std::vector<uint32_t> starts;
    for (const auto& p : profile->placements) starts.push_back(p.start);
    return Fail(ctx, "create",
                fmt::format("{} cannot start at placement {} on GPU {}; legal starts: {}",
                            profile->name, f.placement, gpu, fmt::join(starts, ", ")),
                kExitBadInput);
  }
  const std::string what = fmt::format("{} at placement {} ({}:{}) on GPU {}", profile->name,
                                       placement.start, placement.start, placement.size, gpu);
  auto gi = b->nvml->CreateGpuInstance(gpu, profile->nvml_id, placement);
  if (!gi.ok()) {
    return Fail(ctx, "create",
                fmt::format("cannot create {}: {}", what, std::string(gi.status().message())),
                kExitFailure);
  }
  auto ci = b->nvml->CreateComputeInstance(gpu, gi->id);
  if (!ci.ok()) {
    // Leave nothing behind.
    const absl::Status undo = b->nvml->DestroyGpuInstance(gpu, gi->id);
    return Fail(ctx, "create",
                fmt::format("cannot create the compute instance of {} (GPU instance {}): {}{}",
                            what, gi->id, std::string(ci.status().message()),
                            undo.ok() ? "; the GPU instance was destroyed again"
                                      : "; and removing the GPU instance failed: " +
                                            std::string(undo.message())),
                kExitFailure);
  }
  if (f.output == "json") {
    ctx.out << Json{{"migUUID", ci->mig_uuid},
                    {"gpuInstanceID", gi->id},
                    {"computeInstanceID", ci->id}}
                   .dump(2)
            << "\n";
  } else {
    ctx.out << fmt::format(
        "created {} on GPU {}: GPU instance {} ({} at {}:{}), compute instance {}\n", ci->mig_uuid,
        gpu, gi->id, profile->name, gi->placement.start, gi->placement.size, ci->id);
  }
}

void RunDestroy(const NvmlFlags& f, CliContext& ctx) {
  auto b = Open(f, ctx, "destroy");
  if (!b) return;
  if (!RequireYes(*b, f, ctx, "destroy")) return;
  auto gpus = Gpus(*b->nvml, f, ctx, "destroy");
  if (!gpus) return;
  const uint32_t gpu = gpus->front();
  const std::string what = fmt::format("GPU instance {} on GPU {}", f.gi, gpu);
  auto cis = b->nvml->ListComputeInstances(gpu, f.gi);
  if (!cis.ok()) {
    return Fail(ctx, "destroy",
                fmt::format("cannot destroy {}: {}", what, std::string(cis.status().message())),
                kExitFailure);
  }
  // Refuse before changing anything when a MIG device is busy.
  for (const auto& ci : *cis) {
    auto procs = b->nvml->GetMigDeviceProcesses(gpu, f.gi, ci.id);
    if (!procs.ok()) {
      return Fail(ctx, "destroy",
                  fmt::format("cannot destroy {}: {}", what, std::string(procs.status().message())),
                  kExitFailure);
    }
    if (!procs->empty()) {
      std::vector<uint32_t> pids;
      for (const auto& p : *procs) pids.push_back(p.pid);
      return Fail(ctx, "destroy",
                  fmt::format("cannot destroy {}: MIG device {} (compute instance {}) is in use by "
                              "process {}",
                              what, ci.mig_uuid, ci.id, fmt::join(pids, ", ")),
                  kExitFailure);
    }
  }
  std::vector<uint32_t> destroyed;
  for (const auto& ci : *cis) {
    const absl::Status st = b->nvml->DestroyComputeInstance(gpu, f.gi, ci.id);
    if (!st.ok()) {
      return Fail(
          ctx, "destroy",
          fmt::format("cannot destroy {}: {}{}", what, std::string(st.message()),
                      destroyed.empty() ? ""
                                        : fmt::format(" (compute instances {} were destroyed)",
                                                      fmt::join(destroyed, ", "))),
          kExitFailure);
    }
    destroyed.push_back(ci.id);
  }
  const absl::Status st = b->nvml->DestroyGpuInstance(gpu, f.gi);
  if (!st.ok()) {
    return Fail(ctx, "destroy",
                fmt::format("cannot destroy {}: {}", what, std::string(st.message())),
                kExitFailure);
  }
  if (f.output == "json") {
    ctx.out << Json{{"gpuInstanceID", f.gi}, {"destroyedComputeInstanceIDs", destroyed}}.dump(2)
            << "\n";
  } else {
    ctx.out << fmt::format(
        "destroyed {} (compute instances: {})\n", what,
        destroyed.empty() ? "none" : fmt::format("{}", fmt::join(destroyed, ", ")));
  }
}

void RunDevices(const NvmlFlags& f, CliContext& ctx) {
  auto b = Open(f, ctx, "devices");
  if (!b) return;
  auto gpus = Gpus(*b->nvml, f, ctx, "devices");
  if (!gpus) return;
  auto info = b->nvml->GetGpu(gpus->front());
  if (!info.ok()) return Fail(ctx, "devices", info.status(), kExitFailure);
  auto minors = b->nvml->GetMigMinors();
  if (!minors.ok()) return Fail(ctx, "devices", minors.status(), kExitFailure);
  auto nodes = minors->DeviceNodes(info->minor, f.gi, f.ci);
  if (!nodes.ok()) return Fail(ctx, "devices", nodes.status(), kExitFailure);
  if (f.output == "json") {
    ctx.out << Json{{"devices", nodes->All()}}.dump(2) << "\n";
  } else {
    for (const auto& n : nodes->All()) ctx.out << n << "\n";
  }
}

// --- apply-geometry ------------------------------------------------------------------------------

// The geometry for one GPU: --geometry, or the HAMi legacy geometry for its model.
absl::StatusOr<mig::GeometrySpec> GeometryFor(const NvmlFlags& f, Nvml& nvml, uint32_t gpu) {
  if (!f.geometry.empty()) return mig::ParseGeometry(f.geometry);
  auto config = protocol::LoadDeviceConfig(f.hami_config);
  if (!config.ok()) return config.status();
  auto info = nvml.GetGpu(gpu);
  if (!info.ok()) return info.status();
  return mig::SelectLegacyGeometry(config->legacy_geometries, info->name, *f.hami_geometry);
}

Json GeometryJson(const nvml::GeometryResult& r) {
  Json instances = Json::array();
  for (const auto& i : r.instances) {
    instances.push_back({{"profile", i.profile},
                         {"gpuInstanceID", i.gi_id},
                         {"computeInstanceID", i.ci_id},
                         {"placement", PlacementJson(i.placement)},
                         {"migUUID", i.mig_uuid}});
  }
  return {
      {"gpu", r.gpu}, {"name", r.gpu_name}, {"unchanged", r.unchanged}, {"instances", instances}};
}

void RunApplyGeometry(const NvmlFlags& f, CliContext& ctx) {
  const char* command = "apply-geometry";
  if (f.geometry.empty() == f.hami_config.empty() ||
      f.hami_config.empty() != !f.hami_geometry.has_value()) {
    return Fail(ctx, command, "give --geometry TEXT, or --hami-config FILE with --hami-geometry N",
                kExitBadInput);
  }
  if (!f.geometry.empty()) {
    if (auto parsed = mig::ParseGeometry(f.geometry); !parsed.ok())
      return Fail(ctx, command, parsed.status(), kExitBadInput);
  }
  auto b = Open(f, ctx, command);
  if (!b) return;
  if (!RequireYes(*b, f, ctx, command)) return;
  auto gpus = Gpus(*b->nvml, f, ctx, command);
  if (!gpus) return;
  Json out = {{"gpus", Json::array()}};
  for (uint32_t gpu : *gpus) {
    auto spec = GeometryFor(f, *b->nvml, gpu);
    if (!spec.ok()) return Fail(ctx, command, spec.status(), kExitBadInput);
    auto r = nvml::ApplyGeometry(*b->nvml, gpu, *spec);
    if (!r.ok()) {
      const bool input = r.status().code() == absl::StatusCode::kInvalidArgument &&
                         !nvml::NvmlReturnOf(r.status()).has_value();
      return Fail(ctx, command, r.status(), input ? kExitBadInput : kExitFailure);
    }
    out["gpus"].push_back(GeometryJson(*r));
    if (f.output == "json") continue;
    ctx.out << fmt::format("GPU {} {}: {} {}\n", gpu, r->gpu_name, spec->ToString(),
                           r->unchanged ? "already applied, nothing changed" : "applied");
    for (const auto& i : r->instances) {
      ctx.out << fmt::format("  GI {:>2} CI {}  {:<12} {}:{}  {}\n", i.gi_id, i.ci_id, i.profile,
                             i.placement.start, i.placement.size, i.mig_uuid);
    }
  }
  if (f.output == "json") ctx.out << out.dump(2) << "\n";
}

// --- simulator helpers ---------------------------------------------------------------------------

std::optional<Backend> OpenSim(const NvmlFlags& f, CliContext& ctx, std::string_view command) {
  if (f.sim.empty() && f.state.empty()) {
    Fail(ctx, command, "this subcommand drives the simulator: give --sim SPEC and/or --state FILE",
         kExitBadInput);
    return std::nullopt;
  }
  return Open(f, ctx, command);
}

void Report(CliContext& ctx, std::string_view command, const absl::Status& st,
            std::string_view done) {
  if (!st.ok()) {
    const int code =
        st.code() == absl::StatusCode::kInvalidArgument && !nvml::NvmlReturnOf(st).has_value()
            ? kExitBadInput
            : kExitFailure;
    return Fail(ctx, command, st, code);
  }
  ctx.out << done << "\n";
}

void RunFault(const NvmlFlags& f, CliContext& ctx) {
  auto b = OpenSim(f, ctx, "fault");
  if (!b) return;
  if (f.clear)
    return Report(ctx, "fault", b->sim->ClearFaults(), "cleared every fault and latency");
  if (f.list) {
    auto faults = b->sim->Faults();
    if (!faults.ok()) return Fail(ctx, "fault", faults.status(), kExitFailure);
    for (const auto& x : *faults) {
      ctx.out << fmt::format("{} call {}{} -> {}{} (seen {} calls)\n", x.op, x.nth,
                             x.times == 0 ? " onwards" : fmt::format(" x{}", x.times),
                             nvml::NvmlReturnName(x.code),
                             x.gpu ? fmt::format(" on GPU {}", *x.gpu) : "", x.calls);
    }
    return;
  }
  if (f.op.empty())
    return Fail(ctx, "fault", "give --op OPERATION (or --clear / --list)", kExitBadInput);
  if (!f.latency_ms.has_value() && f.code.empty()) {
    return Fail(ctx, "fault", "give --code NVML_CODE and/or --latency-ms MS", kExitBadInput);
  }
  if (f.latency_ms.has_value()) {
    const absl::Status st = b->sim->SetLatency(f.op, std::chrono::milliseconds(*f.latency_ms));
    if (!st.ok()) return Report(ctx, "fault", st, "");
    ctx.out << fmt::format("{} now takes {} ms longer\n", f.op, *f.latency_ms);
  }
  if (!f.code.empty()) {
    auto code = nvml::ParseNvmlReturn(f.code);
    if (!code.ok()) return Fail(ctx, "fault", code.status(), kExitBadInput);
    nvml::SimFault fault;
    fault.op = f.op;
    fault.nth = f.nth;
    fault.times = f.times;
    fault.code = *code;
    fault.gpu = f.gpu;
    Report(
        ctx, "fault", b->sim->InjectFault(fault),
        fmt::format("call {} of {}{} will fail with {}", f.nth, f.op,
                    f.gpu ? fmt::format(" on GPU {}", *f.gpu) : "", nvml::NvmlReturnName(*code)));
  }
}

void RunAttach(const NvmlFlags& f, CliContext& ctx, bool attach) {
  const char* command = attach ? "attach" : "detach";
  auto b = OpenSim(f, ctx, command);
  if (!b) return;
  if (attach) {
    Report(ctx, command, b->sim->AttachProcess(f.uuid, f.pid, f.memory_mib),
           fmt::format("process {} attached to {}", f.pid, f.uuid));
  } else {
    Report(ctx, command, b->sim->DetachProcess(f.uuid, f.pid),
           fmt::format("process {} detached from {}", f.pid, f.uuid));
  }
}

void RunHold(const NvmlFlags& f, CliContext& ctx, bool hold) {
  const char* command = hold ? "hold" : "release";
  auto b = OpenSim(f, ctx, command);
  if (!b) return;
  if (f.list) {
    auto holders = b->sim->Holders();
    if (!holders.ok()) return Report(ctx, command, holders.status(), "");
    if (holders->empty()) ctx.out << "no GPU instance is held\n";
    for (const auto& h : *holders) {
      ctx.out << fmt::format("GPU {} GI {}: held by {}\n", h.gpu, h.gi, h.name);
    }
    return;
  }
  if (!f.gpu.has_value())
    return Fail(ctx, command, "give --gpu N --gi G (or --list)", kExitBadInput);
  if (hold) {
    Report(ctx, command, b->sim->HoldGpuInstance(*f.gpu, f.gi, f.holder),
           fmt::format("GI {} of GPU {} held by {}: destroying it fails with NVML_ERROR_IN_USE "
                       "until released",
                       f.gi, *f.gpu, f.holder));
  } else {
    Report(ctx, command, b->sim->ReleaseGpuInstance(*f.gpu, f.gi, f.holder),
           fmt::format("GI {} of GPU {} released{}", f.gi, *f.gpu,
                       f.holder.empty() ? "" : " by " + f.holder));
  }
}

// What an activation status means for the operator.
std::string ActivationText(const nvml::MigModeChange& c) {
  switch (c.activation) {
    case nvml::NvmlReturn::kSuccess:
      return "active now";
    case nvml::NvmlReturn::kInUse:
      return "pending: NVML_ERROR_IN_USE, a GPU reset applies it once the GPU is idle";
    case nvml::NvmlReturn::kResetRequired:
      return "pending: NVML_ERROR_RESET_REQUIRED, this host cannot reset the GPU; a reboot applies "
             "it";
    default:
      return fmt::format("pending: {}", nvml::NvmlReturnName(c.activation));
  }
}

void RunMigMode(const NvmlFlags& f, CliContext& ctx) {
  if (f.mode.empty()) {  // show: any backend, read-only
    auto b = Open(f, ctx, "mig-mode");
    if (!b) return;
    auto mode = b->nvml->GetMigMode(*f.gpu);
    if (!mode.ok()) return Report(ctx, "mig-mode", mode.status(), "");
    if (f.output == "json") {
      ctx.out << nlohmann::json{{"gpu", *f.gpu},
                                {"supported", mode->supported},
                                {"current", mode->current},
                                {"pending", mode->pending}}
                     .dump()
              << "\n";
      return;
    }
    ctx.out << fmt::format("GPU {}: {}\n", *f.gpu, MigText(*mode));
    return;
  }
  auto b = OpenSim(f, ctx, "mig-mode");
  if (!b) return;
  const bool enable = f.mode == "enabled";
  auto change = b->sim->SetMigMode(*f.gpu, enable);
  if (!change.ok()) return Report(ctx, "mig-mode", change.status(), "");
  ctx.out << fmt::format("MIG mode of GPU {} set to {}: {} ({})\n", *f.gpu, f.mode,
                         ActivationText(*change), MigText(change->mode));
}

void RunReset(const NvmlFlags& f, CliContext& ctx) {
  auto b = OpenSim(f, ctx, "reset");
  if (!b) return;
  Report(ctx, "reset", b->sim->ResetGpu(*f.gpu), fmt::format("GPU {} reset", *f.gpu));
}

void RunReboot(const NvmlFlags& f, CliContext& ctx) {
  auto b = OpenSim(f, ctx, "reboot");
  if (!b) return;
  Report(ctx, "reboot", b->sim->RebootHost(),
         "host rebooted: every instance, process and holder is gone, pending MIG modes applied");
}

void RunRebootRequired(const NvmlFlags& f, CliContext& ctx) {
  auto b = OpenSim(f, ctx, "reboot-required");
  if (!b) return;
  Report(ctx, "reboot-required", b->sim->SetRebootRequired(*f.gpu, !f.clear),
         f.clear ? fmt::format("GPU {} can be reset again", *f.gpu)
                 : fmt::format("GPU {} is on a host without GPU reset: a MIG mode change stays "
                               "pending until `dynmig nvml reboot`",
                               *f.gpu));
}

void AddOutput(CLI::App* sub, NvmlFlags& f) {
  sub->add_option("-o,--output", f.output, "Output format")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
}

// The simulator-only subcommands: faults, processes, holders, MIG mode, reset.
void RegisterSimulatorCommands(CLI::App* nvml, const std::shared_ptr<NvmlFlags>& flags,
                               CliContext& ctx) {
  NvmlFlags& f = *flags;
  auto* fault = nvml->add_subcommand(
      "fault", "Simulator: make the nth call of an operation fail, or slow it down");
  fault->add_option("--op", f.op, "Operation, e.g. CreateGpuInstance");
  fault->add_option("--nth", f.nth, "Which call fails, counting from 1")->capture_default_str();
  fault->add_option("--times", f.times, "Consecutive failing calls (0 = all from the nth on)")
      ->capture_default_str();
  fault->add_option("--code", f.code, "NVML code, e.g. INSUFFICIENT_RESOURCES");
  fault->add_option("--gpu", f.gpu, "Only calls on this GPU count");
  fault->add_option("--latency-ms", f.latency_ms, "Delay every call of --op (0 removes it)");
  fault->add_flag("--clear", f.clear, "Remove every fault and latency");
  fault->add_flag("--list", f.list, "List pending faults");
  fault->callback([flags, &ctx] { RunFault(*flags, ctx); });

  auto* attach = nvml->add_subcommand(
      "attach", "Simulator: attach a process to a MIG device (or GPU) so it counts as busy");
  attach->add_option("--mig,--uuid", f.uuid, "MIG device (or GPU) UUID")->required();
  attach->add_option("--pid", f.pid, "Process id")->required();
  attach->add_option("--memory-mib", f.memory_mib, "GPU memory it uses");
  attach->callback([flags, &ctx] { RunAttach(*flags, ctx, true); });

  auto* detach = nvml->add_subcommand("detach", "Simulator: detach a process");
  detach->add_option("--mig,--uuid", f.uuid, "MIG device (or GPU) UUID")->required();
  detach->add_option("--pid", f.pid, "Process id")->required();
  detach->callback([flags, &ctx] { RunAttach(*flags, ctx, false); });

  auto* hold = nvml->add_subcommand(
      "hold",
      "Simulator: another NVML client (e.g. DCGM) holds a GPU instance open, so destroying it "
      "fails with NVML_ERROR_IN_USE until released");
  hold->add_option("--gpu", f.gpu, "GPU index");
  hold->add_option("--gi", f.gi, "GPU instance id");
  hold->add_option("--holder", f.holder, "The holder's name (1..64 of [A-Za-z0-9._-])")
      ->capture_default_str();
  hold->add_flag("--list", f.list, "List the held GPU instances");
  hold->callback([flags, &ctx] { RunHold(*flags, ctx, true); });

  auto* release =
      nvml->add_subcommand("release", "Simulator: the holder lets go of a GPU instance");
  release->add_option("--gpu", f.gpu, "GPU index")->required();
  release->add_option("--gi", f.gi, "GPU instance id")->required();
  release->add_option("--holder", f.holder, "Only this holder (\"\" = every holder)")
      ->capture_default_str();
  release->callback([flags, &ctx] { RunHold(*flags, ctx, false); });

  auto* mig_mode = nvml->add_subcommand(
      "mig-mode",
      "Show a GPU's MIG mode (current, pending); with --mode, set it on a simulated GPU (pending "
      "until reset on Ampere, until reboot on a reboot-required GPU)");
  mig_mode->add_option("--gpu", f.gpu, "GPU index")->required();
  mig_mode->add_option("--mode", f.mode, "enabled or disabled (simulator only)")
      ->check(CLI::IsMember({"enabled", "disabled"}));
  AddOutput(mig_mode, f);
  mig_mode->callback([flags, &ctx] { RunMigMode(*flags, ctx); });

  auto* reboot = nvml->add_subcommand(
      "reboot", "Simulator: the host reboots (instances, processes, holders gone; modes applied)");
  reboot->callback([flags, &ctx] { RunReboot(*flags, ctx); });

  auto* reboot_required = nvml->add_subcommand(
      "reboot-required",
      "Simulator: the GPU's host exposes no GPU reset (pass-through VM): MIG mode changes stay "
      "pending until reboot");
  reboot_required->add_option("--gpu", f.gpu, "GPU index")->required();
  reboot_required->add_flag("--clear", f.clear, "The host can reset the GPU again");
  reboot_required->callback([flags, &ctx] { RunRebootRequired(*flags, ctx); });

  auto* reset =
      nvml->add_subcommand("reset", "Simulator: reset a GPU (applies a pending MIG mode)");
  reset->add_option("--gpu", f.gpu, "GPU index")->required();
  reset->callback([flags, &ctx] { RunReset(*flags, ctx); });
}

}  // namespace

void RegisterNvmlCommand(CLI::App& root, CliContext& ctx) {
  auto flags = std::make_shared<NvmlFlags>();
  NvmlFlags& f = *flags;
  CLI::App* nvml = root.add_subcommand(
      "nvml", "Inspect and change MIG instances through NVML (real driver) or the simulator");
  nvml->require_subcommand(1);
  nvml->add_option("--sim", f.sim,
                   "Use the simulator with these GPUs, e.g. \"A100-SXM4-40GBx2,H100 80GBx1\"");
  nvml->add_option("--state", f.state,
                   "Simulator state file (created from --sim when missing; shared with other "
                   "processes)");
  nvml->add_option("--seed", f.seed, "Simulator UUID seed, e.g. the node name")
      ->capture_default_str();
  nvml->add_option("--swapped-halves", f.swapped_halves,
                   "Simulated GPUs (indices) that report GI ids in the swapped-halves layout");
  nvml->add_option("--library", f.library, "NVML library to dlopen")->capture_default_str();

  auto* list = nvml->add_subcommand("list", "List GPUs (like nvidia-smi -L)");
  list->add_option("--gpu", f.gpu, "Only this GPU");
  AddOutput(list, f);
  list->callback([flags, &ctx] { RunList(*flags, ctx); });

  auto* profiles = nvml->add_subcommand(
      "profiles", "GPU instance profiles with placements (like nvidia-smi mig -lgip/-lgipp)");
  profiles->add_option("--gpu", f.gpu, "Only this GPU");
  AddOutput(profiles, f);
  profiles->callback([flags, &ctx] { RunProfiles(*flags, ctx); });

  auto* instances = nvml->add_subcommand(
      "instances", "GPU and compute instances with MIG UUIDs (like nvidia-smi mig -lgi/-lci)");
  instances->add_option("--gpu", f.gpu, "Only this GPU");
  AddOutput(instances, f);
  instances->callback([flags, &ctx] { RunInstances(*flags, ctx); });

  auto* create = nvml->add_subcommand(
      "create", "Create a GPU instance at a placement and its full compute instance");
  create->add_option("--gpu", f.gpu, "GPU index")->required();
  create->add_option("--profile", f.profile, "Profile name (3g.20gb) or id")->required();
  create->add_option("--placement", f.placement, "First placement unit (start)")->required();
  create->add_flag("--yes", f.yes, "Really change a real GPU");
  AddOutput(create, f);
  create->callback([flags, &ctx] { RunCreate(*flags, ctx); });

  auto* destroy = nvml->add_subcommand(
      "destroy", "Destroy a GPU instance and its compute instances (refused while in use)");
  destroy->add_option("--gpu", f.gpu, "GPU index")->required();
  destroy->add_option("--gi", f.gi, "GPU instance id")->required();
  destroy->add_flag("--yes", f.yes, "Really change a real GPU");
  AddOutput(destroy, f);
  destroy->callback([flags, &ctx] { RunDestroy(*flags, ctx); });

  auto* devices = nvml->add_subcommand(
      "devices", "Device nodes a container needs for one MIG device (from mig-minors)");
  devices->add_option("--gpu", f.gpu, "GPU index")->required();
  devices->add_option("--gi", f.gi, "GPU instance id")->required();
  devices->add_option("--ci", f.ci, "Compute instance id")->capture_default_str();
  AddOutput(devices, f);
  devices->callback([flags, &ctx] { RunDevices(*flags, ctx); });

  auto* geometry = nvml->add_subcommand(
      "apply-geometry",
      "Lay out a fixed geometry as NVIDIA MIG Manager (mig-parted) does: per GPU, instances "
      "without placement (the driver's slot) and their full compute instances; refused on a GPU "
      "with other instances, a no-op when they already match");
  geometry->add_option("--gpu", f.gpu, "Only this GPU (default: every GPU)");
  geometry->add_option("--geometry", f.geometry,
                       "all-<profile> or <profile>=<n>,... e.g. \"1g.18gb=1,2g.35gb=3\"");
  geometry->add_option("--hami-config", f.hami_config,
                       "HAMi device config with nvidia.knownMigGeometries: use the entry "
                       "matching each GPU's model");
  geometry->add_option("--hami-geometry", f.hami_geometry,
                       "Which allowedGeometries item of that entry (from 0)");
  geometry->add_flag("--yes", f.yes, "Really change a real GPU");
  AddOutput(geometry, f);
  geometry->callback([flags, &ctx] { RunApplyGeometry(*flags, ctx); });

  RegisterSimulatorCommands(nvml, flags, ctx);
}

}  // namespace dynmig::cli
