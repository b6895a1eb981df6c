// `dynmig plan`: what the planner would do for one container on one GPU model.
#include <CLI/CLI.hpp>
#include <charconv>
#include <ostream>

#include "cli/cli.h"
#include "cli/render.h"
#include "common/strings.h"
#include "fmt/format.h"
#include "mig/catalogue.h"
#include "mig/planner.h"
#include "mig/sizing.h"
#include "nlohmann/json.hpp"
#include "protocol/annotations.h"

namespace dynmig::cli {
namespace {

struct PlanOptions {
  std::string gpu;
  std::string allow;
  std::string memory_match = "nominal";
  std::string occupied;
  std::string request;
  std::string prefer;
  std::string output = "text";
  bool demo = false;
};

bool ParsePositive(std::string_view s, uint64_t& out) {
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size() && out > 0;
}

// "19000" (MiB) or "50%" (of the full-GPU profile).
absl::StatusOr<std::vector<uint64_t>> ParseRequests(const std::string& text,
                                                    const mig::GpuCapability& cap) {
  std::vector<uint64_t> out;
  const auto pieces = SplitTrimmed(text, ',');
  if (pieces.empty()) return absl::InvalidArgumentError("--request: no memory given");
  for (const auto& piece : pieces) {
    uint64_t v = 0;
    if (piece.back() == '%') {
      if (!ParsePositive(std::string_view(piece).substr(0, piece.size() - 1), v) || v > 100) {
        return absl::InvalidArgumentError(
            fmt::format("--request: \"{}\" is not a percentage between 1% and 100%", piece));
      }
      out.push_back(mig::ResolveMemory(0, static_cast<uint32_t>(v), cap));
      continue;
    }
    if (!ParsePositive(piece, v)) {
      return absl::InvalidArgumentError(fmt::format(
          "--request: \"{}\" is not a positive memory size in MiB (e.g. 19000) or a percentage "
          "(e.g. 50%)",
          piece));
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<mig::Occupancy> ParseOccupied(const std::string& text,
                                             const mig::GpuCapability& cap) {
  mig::Occupancy occ;
  for (const auto& piece : SplitTrimmed(text, ',')) {
    const size_t at = piece.find('@');
    uint64_t start = 0;
    if (at == std::string::npos || at == 0 ||
        (!ParsePositive(std::string_view(piece).substr(at + 1), start) &&
         std::string_view(piece).substr(at + 1) != "0")) {
      return absl::InvalidArgumentError(
          fmt::format("--occupied: \"{}\" is not PROFILE@START (e.g. 3g.20gb@4)", piece));
    }
    const std::string name = piece.substr(0, at);
    const mig::ProfileSpec* spec = cap.FindProfile(name);
    if (spec == nullptr) {
      return absl::InvalidArgumentError(
          fmt::format("--occupied: {} has no MIG profile \"{}\"", cap.model, name));
    }
    auto st = occ.Reserve(cap, name, {static_cast<uint32_t>(start), spec->memory_slices});
    if (!st.ok()) return absl::InvalidArgumentError("--occupied: " + std::string(st.message()));
  }
  return occ;
}

std::vector<DrawnInstance> Drawn(const mig::Occupancy& occ) {
  std::vector<DrawnInstance> out;
  for (const auto& r : occ.reservations()) out.push_back({r.profile, r.placement, false});
  return out;
}

int RunPlan(const PlanOptions& o, CliContext& ctx) {
  auto model = mig::FindModel(o.gpu);
  if (!model.ok()) {
    ctx.err << "dynmig plan: " << model.status().message() << "\n";
    return kExitBadInput;
  }
  mig::MemoryMatch match = mig::MemoryMatch::kNominal;
  if (o.memory_match == "nvml") {
    match = mig::MemoryMatch::kNvml;
  } else if (o.memory_match != "nominal") {
    ctx.err << fmt::format(
        "dynmig plan: --memory-match: must be \"nominal\" or \"nvml\", got \"{}\"\n",
        o.memory_match);
    return kExitBadInput;
  }
  mig::GpuCapability cap = (*model)->capability;
  mig::ApplyMemoryMatch(cap, match);
  std::vector<std::string> allowed;
  if (o.allow.empty()) {
    for (const auto& p : cap.profiles) allowed.push_back(p.name);
  } else {
    for (auto& name : SplitTrimmed(o.allow, ',')) {
      if (cap.FindProfile(name) == nullptr) {
        std::vector<std::string> known;
        for (const auto& p : cap.profiles) known.push_back(p.name);
        ctx.err << fmt::format("dynmig plan: --allow: {} has no MIG profile \"{}\"; it has {}\n",
                               cap.model, name, fmt::join(known, ", "));
        return kExitBadInput;
      }
      allowed.push_back(std::move(name));
    }
  }
  auto occupancy = ParseOccupied(o.occupied, cap);
  if (!occupancy.ok()) {
    ctx.err << "dynmig plan: " << occupancy.status().message() << "\n";
    return kExitBadInput;
  }
  auto requests = ParseRequests(o.request, cap);
  if (!requests.ok()) {
    ctx.err << "dynmig plan: " << requests.status().message() << "\n";
    return kExitBadInput;
  }
  auto planner = mig::GpuPlanner::Create(cap, allowed);
  if (!planner.ok()) {
    ctx.err << "dynmig plan: " << planner.status().message() << "\n";
    return kExitBadInput;
  }
  const mig::GpuPlanner& p = **planner;
  auto usage = p.UsageOf(occupancy->reservations());
  if (!usage.ok()) {
    ctx.err << "dynmig plan: --occupied: " << usage.status().message() << "\n";
    return kExitBadInput;
  }
  const mig::Preference preference = mig::ParsePreference(o.prefer);
  const mig::GpuPlan plan = p.Plan(*usage, *requests, preference);

  if (o.output == "json") {
    nlohmann::json j;
    j["feasible"] = plan.verdict == mig::Verdict::kFits;
    if (plan.verdict == mig::Verdict::kFits) {
      j["instances"] = nlohmann::json::array();
      for (const auto& inst : plan.instances) {
        j["instances"].push_back(
            {{"profile", cap.profiles[inst.profile_index].name},
             {"placement", {{"start", inst.placement.start}, {"size", inst.placement.size}}}});
      }
      j["usedPreference"] = plan.used_preference;
    } else {
      j["reason"] = plan.reason;
      j["verdict"] = mig::VerdictName(plan.verdict);
    }
    ctx.out << j.dump() << "\n";
    return kExitOk;
  }

  const std::string indent = "         ";
  ctx.out << fmt::format("{}: {} placement units, allowlisted: {}\n", cap.model,
                         cap.placement_units, fmt::join(allowed, ", "));
  std::vector<std::string> asked;
  for (uint64_t m : *requests) asked.push_back(fmt::format("{} MiB", m));
  ctx.out << fmt::format(
      "request: {} instance(s): {}{}\n", requests->size(), fmt::join(asked, ", "),
      preference.empty() ? ""
                         : fmt::format(" (preference: {})", fmt::join(preference.entries, ",")));
  ctx.out << RenderUnitHeader(cap.placement_units, indent) << "\n";
  ctx.out << RenderRow(cap.placement_units, Drawn(*occupancy), "before   ") << "\n";
  if (plan.verdict != mig::Verdict::kFits) {
    ctx.out << "result:  does not fit: " << plan.reason << "\n";
  } else {
    auto after = Drawn(*occupancy);
    for (const auto& inst : plan.instances) {
      after.push_back({cap.profiles[inst.profile_index].name, inst.placement, true});
    }
    ctx.out << RenderRow(cap.placement_units, after, "after    ") << "\n";
    for (size_t i = 0; i < plan.instances.size(); ++i) {
      const auto& inst = plan.instances[i];
      const auto& spec = cap.profiles[inst.profile_index];
      ctx.out << fmt::format("instance {}: {} ({} MiB in NVML, covers {} MiB) at slices {}\n", i,
                             spec.name, spec.memory_mib, spec.SizingMib(),
                             inst.placement.ToString());
    }
    if (plan.used_preference) ctx.out << "the preferred profile was used\n";
  }
  for (uint64_t m : *requests) {
    const auto note = mig::SizingNote(cap, allowed, m, preference, match, "the request of");
    if (note.has_value()) ctx.out << "note: " << *note << "\n";
  }
  return kExitOk;
}

// The walk-through `make run` shows until the local mode exists: one A100-40GB, pods arriving.
int RunDemo(CliContext& ctx) {
  struct Step {
    std::string title;
    std::string occupied;
    std::string request;
    std::string prefer;
  };
  const std::vector<Step> steps = {
      {"a 1g pod (4500 MiB) on an idle A100-40GB", "", "4500", ""},
      {"a second 1g pod: packed next to the first, keeping the 3g half whole", "1g.5gb@0", "4500",
       ""},
      {"a 3g pod (19000 MiB)", "1g.5gb@0,1g.5gb@1", "19000", ""},
      {"a 2g pod (9500 MiB)", "1g.5gb@0,1g.5gb@1,3g.20gb@4", "9500", ""},
      {"19000 MiB with preference 4g on an idle GPU: 4g.20gb instead of 3g.20gb", "", "19000",
       "4g"},
      {"the same preference when slice 0 is taken: falls back to 3g, never rejects", "1g.5gb@0",
       "19000", "4g"},
      {"one container asking for 1g, 1g, 2g, 3g at once (joint placement)", "",
       "4500,4500,9500,19000", ""},
      {"fragmented: 1g at slices 1 and 5 block both 3g halves", "1g.5gb@1,1g.5gb@5", "19000", ""},
  };
  ctx.out
      << "dynmig planner demo (the local mode with the whole system comes with `dynmig local`)\n";
  for (size_t i = 0; i < steps.size(); ++i) {
    ctx.out << fmt::format("\n== step {}: {}\n", i + 1, steps[i].title);
    PlanOptions o;
    o.gpu = "A100-SXM4-40GB";
    o.allow = "1g.5gb,2g.10gb,3g.20gb,4g.20gb,7g.40gb";
    o.occupied = steps[i].occupied;
    o.request = steps[i].request;
    o.prefer = steps[i].prefer;
    const int rc = RunPlan(o, ctx);
    if (rc != kExitOk) return rc;
  }
  return kExitOk;
}

}  // namespace

void RegisterPlanCommand(CLI::App& root, CliContext& ctx) {
  auto opts = std::make_shared<PlanOptions>();
  CLI::App* cmd = root.add_subcommand(
      "plan", "Show which MIG profile and placement the planner picks for one container on a GPU");
  cmd->add_option("--gpu", opts->gpu, "GPU model, matched like the allowlist (A100-SXM4-40GB)");
  cmd->add_option("--allow", opts->allow, "Allowlisted profiles, comma-separated (default: all)");
  cmd->add_option("--memory-match", opts->memory_match,
                  "How a request is sized: nominal (a profile covers the GB of its name x 1024) or "
                  "nvml (the memory NVML reports); device-config.yaml nvidia.migMemoryMatch")
      ->capture_default_str();
  cmd->add_option("--occupied", opts->occupied,
                  "Reserved instances, comma-separated PROFILE@START (3g.20gb@4)");
  cmd->add_option("--request", opts->request,
                  "Memory of each instance in MiB (or N% of the GPU), comma-separated");
  cmd->add_option(
      "--prefer", opts->prefer,
      std::string(protocol::kMigProfilePreferenceAnnotation) + " value (4g or 4g.20gb,3g)");
  cmd->add_option("-o,--output", opts->output, "text or json")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->add_flag("--demo", opts->demo, "Walk through a sequence of plans on an A100-40GB");
  cmd->callback([opts, cmd, &ctx]() {
    if (opts->demo) {
      ctx.exit_code = RunDemo(ctx);
      return;
    }
    if (opts->gpu.empty() || opts->request.empty()) {
      ctx.err << "dynmig plan: --gpu and --request are required (or --demo)\n" << cmd->help();
      ctx.exit_code = kExitBadInput;
      return;
    }
    ctx.exit_code = RunPlan(*opts, ctx);
  });
}

}  // namespace dynmig::cli
