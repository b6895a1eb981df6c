// The migration and operations commands: inventory, preflight, validate, handover (plan, check),
// explain, layout, defrag, rollback (plan, check, apply).
// Each reads the cluster through the Kubernetes API (--kubeconfig / --in-cluster), prints a
// readable table by default or -o json|yaml, and exits 0 when it answered, 1 when a check failed
// (preflight, validate, handover check) or the cluster could not be read, 2 on bad input. The logic
// lives in src/ops; this file parses flags and prints.
#include <CLI/CLI.hpp>
#include <fstream>
#include <memory>
#include <ostream>

#include "cli/cli.h"
#include "cli/render.h"
#include "fmt/format.h"
#include "kube/rest_config.h"
#include "kube/rest_kube_client.h"
#include "nvml/dlopen_nvml.h"
#include "nvml/sim_nvml.h"
#include "ops/defrag_plan.h"
#include "ops/explain.h"
#include "ops/handover.h"
#include "ops/inventory.h"
#include "ops/layout.h"
#include "ops/preflight.h"
#include "ops/rollback.h"
#include "ops/validate.h"
#include "scheduler/defragmenter.h"

namespace dynmig::cli {
namespace {

struct CommonFlags {
  std::string kubeconfig;
  bool in_cluster = false;
  std::string output = "text";
  std::string device_config_file;
  std::string device_config_ns;
  std::string device_config_name;
};

void AddCommon(CLI::App* cmd, CommonFlags& f, bool config_file = true, bool config_query = true) {
  cmd->add_option("--kubeconfig", f.kubeconfig,
                  "kubeconfig file (default: $KUBECONFIG, in-cluster when available, "
                  "~/.kube/config)");
  cmd->add_flag("--in-cluster", f.in_cluster, "use the pod's service account");
  cmd->add_option("-o,--output", f.output, "text, json or yaml")->capture_default_str();
  if (config_file) {
    cmd->add_option("--device-config", f.device_config_file,
                    "device-config.yaml to use instead of the cluster's ConfigMap");
  }
  if (!config_query) return;
  cmd->add_option("--device-config-namespace", f.device_config_ns,
                  "namespace of the scheduler's device ConfigMap (default: search all)");
  cmd->add_option("--device-config-name", f.device_config_name,
                  "name of the scheduler's device ConfigMap (default: the one with a "
                  "device-config.yaml key)");
}

ops::DeviceConfigQuery Query(const CommonFlags& f) {
  return {f.device_config_file, f.device_config_ns, f.device_config_name};
}

int ExitFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

int Fail(CliContext& ctx, const std::string& command, const absl::Status& status) {
  ctx.err << "dynmig " << command << ": " << status.message() << "\n";
  return ExitFor(status);
}

absl::StatusOr<std::unique_ptr<kube::KubeClient>> Connect(const CommonFlags& f) {
  return ConnectKube(f.kubeconfig, f.in_cluster);
}

ops::SlicePainter Painter() {
  return {
      [](uint32_t units, const std::string& indent) { return RenderUnitHeader(units, indent); },
      [](uint32_t units, const std::vector<ops::PictureCell>& cells, const std::string& indent) {
        std::vector<DrawnInstance> drawn;
        for (const auto& c : cells) drawn.push_back({c.label, c.placement, c.highlight});
        return RenderRow(units, drawn, indent);
      }};
}

}  // namespace

void PrintOutput(CliContext& ctx, ops::OutputFormat format, const nlohmann::json& json,
                 const std::string& text) {
  switch (format) {
    case ops::OutputFormat::kText:
      ctx.out << text;
      break;
    case ops::OutputFormat::kJson:
      ctx.out << json.dump(2) << "\n";
      break;
    case ops::OutputFormat::kYaml:
      ctx.out << ops::JsonToYaml(json);
      break;
  }
}

namespace {

// Parses -o, connects; on failure prints the error and returns nullopt with `code` set.
struct Session {
  ops::OutputFormat format = ops::OutputFormat::kText;
  std::unique_ptr<kube::KubeClient> client;
};
std::optional<Session> Open(CliContext& ctx, const std::string& command, const CommonFlags& f,
                            int& code) {
  Session s;
  auto format = ops::ParseOutputFormat(f.output);
  if (!format.ok()) {
    code = Fail(ctx, command, format.status());
    return std::nullopt;
  }
  s.format = *format;
  auto client = Connect(f);
  if (!client.ok()) {
    code = Fail(ctx, command, client.status());
    return std::nullopt;
  }
  s.client = std::move(*client);
  return s;
}

std::unique_ptr<ops::NvmlSource> MakeNvml(const std::string& endpoint, const std::string& timeout,
                                          absl::Status& error) {
  if (endpoint.empty()) return nullptr;
  absl::Duration d;
  if (!absl::ParseDuration(timeout, &d) || d <= absl::ZeroDuration()) {
    error = absl::InvalidArgumentError(
        fmt::format("--nvml-timeout: \"{}\" is not a positive duration (e.g. 5s)", timeout));
    return nullptr;
  }
  return std::make_unique<ops::HttpNvmlSource>(endpoint, d);
}

// ---- inventory ----

struct InventoryFlags {
  CommonFlags common;
  std::string out;
  bool force = false;
  std::string nvml_endpoint = "http://{node}:9400/nvml";
  std::string nvml_timeout = "5s";
};

int RunInventoryCommand(const InventoryFlags& f, CliContext& ctx) {
  int code = kExitOk;
  auto s = Open(ctx, "inventory", f.common, code);
  if (!s) return code;
  absl::Status error;
  auto nvml = MakeNvml(f.nvml_endpoint, f.nvml_timeout, error);
  if (!error.ok()) return Fail(ctx, "inventory", error);
  ops::InventoryOptions options{f.out, f.force, Query(f.common)};
  auto out = ops::RunInventory(*s->client, nvml.get(), options, ctx.clock.Now());
  if (!out.ok()) return Fail(ctx, "inventory", out.status());
  PrintOutput(ctx, s->format, out->json, out->text);
  return kExitOk;
}

// ---- preflight / validate ----

int PrintReport(CliContext& ctx, ops::OutputFormat format, const ops::CheckReport& report) {
  PrintOutput(ctx, format, report.ToJson(), report.ToText());
  return report.failed() ? kExitFailure : kExitOk;
}

struct PreflightFlags {
  CommonFlags common;
  std::string node;
  std::string nvml_endpoint = "http://{node}:9400/nvml";
  std::string nvml_timeout = "3s";
};

int RunPreflightCommand(const PreflightFlags& f, CliContext& ctx) {
  absl::Status error;
  auto nvml = MakeNvml(f.nvml_endpoint, f.nvml_timeout, error);
  if (!error.ok()) return Fail(ctx, "preflight", error);
  int code = kExitOk;
  auto s = Open(ctx, "preflight", f.common, code);
  if (!s) return code;
  auto report =
      ops::RunPreflight(*s->client, nvml.get(), {f.node, Query(f.common)}, ctx.clock.Now());
  if (!report.ok()) return Fail(ctx, "preflight", report.status());
  return PrintReport(ctx, s->format, *report);
}

struct ValidateFlags {
  CommonFlags common;
  std::string node;
  bool canary = false;
  std::string timeout = "2m";
  std::string poll = "500ms";
  std::string nvml_endpoint = "http://{node}:9400/nvml";
  std::string nvml_timeout = "5s";
  ops::CanaryOptions canary_options;
};

int RunValidateCommand(ValidateFlags f, CliContext& ctx) {
  int code = kExitOk;
  auto s = Open(ctx, "validate", f.common, code);
  if (!s) return code;
  absl::Status error;
  auto nvml = MakeNvml(f.nvml_endpoint, f.nvml_timeout, error);
  if (!error.ok()) return Fail(ctx, "validate", error);
  if (!absl::ParseDuration(f.timeout, &f.canary_options.timeout) ||
      f.canary_options.timeout <= absl::ZeroDuration()) {
    return Fail(ctx, "validate",
                absl::InvalidArgumentError(fmt::format(
                    "--timeout: \"{}\" is not a positive duration (e.g. 2m)", f.timeout)));
  }
  if (!absl::ParseDuration(f.poll, &f.canary_options.poll) ||
      f.canary_options.poll <= absl::ZeroDuration()) {
    return Fail(ctx, "validate",
                absl::InvalidArgumentError(fmt::format(
                    "--canary-poll: \"{}\" is not a positive duration (e.g. 500ms)", f.poll)));
  }
  if (f.canary_options.gpumem_mib == 0) {
    return Fail(ctx, "validate",
                absl::InvalidArgumentError("--canary-gpumem: must be a positive MiB value"));
  }
  ops::ValidateOptions options;
  options.node = f.node;
  options.config = Query(f.common);
  options.canary = f.canary;
  options.canary_options = f.canary_options;
  if (s->format == ops::OutputFormat::kText) {
    options.canary_options.progress = [&ctx](const std::string& line) {
      ctx.err << line << std::endl;
    };
  }
  auto report = ops::RunValidate(*s->client, nvml.get(), options, ctx.clock);
  if (!report.ok()) return Fail(ctx, "validate", report.status());
  if (s->format == ops::OutputFormat::kText) report->notes.clear();  // already on stderr
  return PrintReport(ctx, s->format, *report);
}

// ---- handover ----

struct HandoverFlags {
  CommonFlags common;
  std::string node;
  std::string nvml_endpoint = "http://{node}:9400/nvml";
  std::string nvml_timeout = "5s";
};

// Runs plan or check. Flags are read before the cluster: bad input changes and reads nothing.
int RunHandoverCommand(const HandoverFlags& f, const std::string& verb, CliContext& ctx) {
  const std::string command = "handover " + verb;
  if (verb == "plan" && f.node.empty()) {
    return Fail(ctx, command, absl::InvalidArgumentError("--node: name the node to hand over"));
  }
  if (f.nvml_endpoint.empty()) {
    return Fail(ctx, command,
                absl::InvalidArgumentError(
                    "--nvml-endpoint: the device plugin's NVML view is the handover's evidence; "
                    "it cannot be empty"));
  }
  absl::Status error;
  auto nvml = MakeNvml(f.nvml_endpoint, f.nvml_timeout, error);
  if (!error.ok()) return Fail(ctx, command, error);
  int code = kExitOk;
  auto s = Open(ctx, command, f.common, code);
  if (!s) return code;
  const ops::HandoverOptions options{f.node, Query(f.common)};
  if (verb == "plan") {
    auto out = ops::RunHandoverPlan(*s->client, nvml.get(), options, ctx.clock.Now());
    if (!out.ok()) return Fail(ctx, command, out.status());
    PrintOutput(ctx, s->format, out->json, out->text);
    return kExitOk;
  }
  auto report = ops::RunHandoverCheck(*s->client, nvml.get(), options, ctx.clock.Now());
  if (!report.ok()) return Fail(ctx, command, report.status());
  return PrintReport(ctx, s->format, *report);
}

// ---- explain / layout / defrag ----

struct ExplainFlags {
  CommonFlags common;
  std::string ns = "default";
  std::string pod;
};

int RunExplainCommand(const ExplainFlags& f, CliContext& ctx) {
  int code = kExitOk;
  auto s = Open(ctx, "explain", f.common, code);
  if (!s) return code;
  ops::ExplainOptions options;
  options.ns = f.ns;
  options.pod = f.pod;
  options.config = Query(f.common);
  auto out = ops::RunExplain(*s->client, options, Painter(), ctx.clock.Now());
  if (!out.ok()) return Fail(ctx, "explain", out.status());
  PrintOutput(ctx, s->format, out->json, out->text);
  return kExitOk;
}

struct LayoutFlags {
  CommonFlags common;
  std::string node;
  std::string html;
};

int RunLayoutCommand(const LayoutFlags& f, CliContext& ctx) {
  int code = kExitOk;
  auto s = Open(ctx, "layout", f.common, code);
  if (!s) return code;
  const absl::Time now = ctx.clock.Now();
  auto snap = ops::TakeSnapshot(*s->client, now);
  if (!snap.ok()) return Fail(ctx, "layout", snap.status());
  if (!f.node.empty() && snap->FindNode(f.node) == nullptr) {
    return Fail(ctx, "layout", absl::NotFoundError(fmt::format("node \"{}\" not found", f.node)));
  }
  auto source = ops::FindDeviceConfig(*s->client, Query(f.common));
  if (!source.ok()) return Fail(ctx, "layout", source.status());
  auto state = ops::BuildClusterState(*snap, ops::EffectiveConfig(*source));
  std::vector<scheduler::NodeReport> reports;
  for (auto& r : state->Report(now)) {
    if (f.node.empty() || r.name == f.node) reports.push_back(std::move(r));
  }
  if (!f.html.empty()) {
    const std::string page = ops::RenderLayoutHtml(reports, now);
    if (f.html == "-") {
      ctx.out << page;
      return kExitOk;
    }
    std::ofstream file(f.html, std::ios::trunc);
    file << page;
    file.close();
    if (!file) {
      return Fail(ctx, "layout",
                  absl::PermissionDeniedError(fmt::format("--html: cannot write {}", f.html)));
    }
    ctx.err << "dynmig layout: wrote " << f.html << "\n";
  }
  PrintOutput(ctx, s->format, ops::LayoutJson(reports), ops::RenderLayoutText(reports, Painter()));
  return kExitOk;
}

struct DefragFlags {
  CommonFlags common;
  std::string profile;
  std::string node;
  size_t alternatives = 2;
  bool apply = false;
  bool dry_run = false;
  std::string ns = "default";
  std::string pod;
  scheduler::DefragFlags limits;
};

int RunDefragCommand(const DefragFlags& f, CliContext& ctx) {
  int code = kExitOk;
  auto s = Open(ctx, "defrag", f.common, code);
  if (!s) return code;
  if (f.apply || f.dry_run) {
    ops::DefragApplyOptions a;
    a.profile = f.profile;
    a.ns = f.ns;
    a.pod = f.pod;
    a.dry_run = f.dry_run;
    a.config = Query(f.common);
    a.flags = f.limits;
    auto out = ops::RunDefragApply(*s->client, a, ctx.clock);
    if (!out.ok()) return Fail(ctx, "defrag", out.status());
    PrintOutput(ctx, s->format, out->json, out->text);
    return kExitOk;
  }
  ops::DefragOptions options;
  options.profile = f.profile;
  options.node = f.node;
  options.config = Query(f.common);
  options.alternatives = f.alternatives;
  auto out = ops::RunDefrag(*s->client, options, Painter(), ctx.clock.Now());
  if (!out.ok()) return Fail(ctx, "defrag", out.status());
  PrintOutput(ctx, s->format, out->json, out->text);
  return kExitOk;
}

// ---- rollback ----

struct RollbackFlags {
  CommonFlags common;
  std::string node;
  std::string backup;
  std::string geometry;
  bool on_node = false;
  std::string library = "libnvidia-ml.so.1";
  std::string sim_state;
  std::string instances;
  std::string nvml_endpoint = "http://{node}:9400/nvml";
  std::string nvml_timeout = "3s";
};

// Runs one of plan / check / apply.
int RunRollbackCommand(const RollbackFlags& f, const std::string& verb, CliContext& ctx) {
  const std::string command = "rollback " + verb;
  const int sources =
      (f.on_node ? 1 : 0) + (f.sim_state.empty() ? 0 : 1) + (f.instances.empty() ? 0 : 1);
  if (sources > 1) {
    return Fail(ctx, command,
                absl::InvalidArgumentError(
                    "--on-node, --sim-state and --instances each give the node's instances: "
                    "pass one"));
  }
  if (verb == "apply" && !f.instances.empty()) {
    return Fail(ctx, command,
                absl::InvalidArgumentError(
                    "--instances: apply needs NVML to reapply the geometry (--on-node or "
                    "--sim-state); the file only serves check and plan"));
  }
  // The backup is read before anything else: bad input changes nothing.
  if (auto b = ops::LoadRollbackBackup(f.backup, f.node, f.geometry); !b.ok()) {
    return Fail(ctx, command, b.status());
  }
  int code = kExitOk;
  auto s = Open(ctx, command, f.common, code);
  if (!s) return code;
  absl::Status error;
  auto endpoint = MakeNvml(f.nvml_endpoint, f.nvml_timeout, error);
  if (!error.ok()) return Fail(ctx, command, error);
  std::unique_ptr<nvml::Nvml> nvml;
  if (!f.sim_state.empty()) {
    nvml::SimNvmlOptions o;
    o.state_file = f.sim_state;
    auto sim = nvml::SimNvml::Create(std::move(o));
    if (!sim.ok()) {
      return Fail(ctx, command,
                  absl::InvalidArgumentError(fmt::format("--sim-state {}: {}", f.sim_state,
                                                         std::string(sim.status().message()))));
    }
    nvml = std::move(*sim);
  } else if (f.on_node) {
    nvml::DlopenNvmlOptions o;
    o.library = f.library;
    auto real = nvml::DlopenNvml::Create(o);
    if (!real.ok()) {
      return Fail(ctx, command,
                  absl::FailedPreconditionError(fmt::format(
                      "--on-node: {} (run this on the GPU node, or pass --instances FILE)",
                      std::string(real.status().message()))));
    }
    nvml = std::move(*real);
  }
  ops::RollbackOptions options;
  options.node = f.node;
  options.backup_dir = f.backup;
  options.geometry_file = f.geometry;
  options.nvml = nvml.get();
  options.instances_file = f.instances;
  options.endpoint = endpoint.get();
  const absl::Time now = ctx.clock.Now();
  if (verb == "plan") {
    auto out = ops::RunRollbackPlan(*s->client, options, now);
    if (!out.ok()) return Fail(ctx, command, out.status());
    PrintOutput(ctx, s->format, out->json, out->text);
    return kExitOk;
  }
  if (verb == "check") {
    auto out = ops::RunRollbackCheck(*s->client, options, now);
    if (!out.ok()) return Fail(ctx, command, out.status());
    PrintOutput(ctx, s->format, out->ToJson(), out->ToText());
    return out->report.failed() ? kExitFailure : kExitOk;
  }
  auto out = ops::RunRollbackApply(*s->client, options, now);
  if (!out.ok()) return Fail(ctx, command, out.status());
  PrintOutput(ctx, s->format, out->output.json, out->output.text);
  return out->refused ? kExitFailure : kExitOk;
}

// ---- registration, one function per command ----

void RegisterInventory(CLI::App& root, CliContext& ctx) {
  auto f = std::make_shared<InventoryFlags>();
  CLI::App* cmd = root.add_subcommand(
      "inventory",
      "Back up the device ConfigMap, MIG node annotations and labels, active MIG "
      "pods and each node's NVML view before migrating");
  AddCommon(cmd, f->common, false);
  cmd->add_option("--out", f->out, "directory to write (must not exist or be empty)")->required();
  cmd->add_flag("--force", f->force, "write into a non-empty directory, overwriting files");
  cmd->add_option("--nvml-endpoint", f->nvml_endpoint,
                  "URL template of the device plugin's NVML view: {node} = node address, "
                  "{name} = node name; empty = do not fetch")
      ->capture_default_str();
  cmd->add_option("--nvml-timeout", f->nvml_timeout, "per-node timeout")->capture_default_str();
  cmd->callback([f, &ctx] { ctx.exit_code = RunInventoryCommand(*f, ctx); });
}

void RegisterPreflight(CLI::App& root, CliContext& ctx) {
  auto f = std::make_shared<PreflightFlags>();
  CLI::App* cmd = root.add_subcommand(
      "preflight", "Can a node be handed over to dynamic MIG? Each blocker with evidence");
  AddCommon(cmd, f->common);
  cmd->add_option("--node", f->node, "the node to check (default: every GPU node)");
  cmd->add_option("--nvml-endpoint", f->nvml_endpoint,
                  "URL template of dynmig's device-plugin NVML view ({node}, {name}), read for "
                  "nodes with legacy pods to tell whether they can stay (no-drain handover); "
                  "empty = do not read")
      ->capture_default_str();
  cmd->add_option("--nvml-timeout", f->nvml_timeout, "per-request timeout")->capture_default_str();
  cmd->callback([f, &ctx] { ctx.exit_code = RunPreflightCommand(*f, ctx); });
}

void RegisterValidate(CLI::App& root, CliContext& ctx) {
  auto f = std::make_shared<ValidateFlags>();
  CLI::App* cmd = root.add_subcommand(
      "validate",
      "The migration guide's validation checklist; --canary runs a MIG pod through "
      "its lifecycle");
  AddCommon(cmd, f->common);
  cmd->add_option("--node", f->node, "the node to validate (default: every registered node)");
  cmd->add_flag("--canary", f->canary,
                "create the mig-canary pod, check it, delete it and check the release");
  cmd->add_option("--timeout", f->timeout, "bound of each canary wait")->capture_default_str();
  cmd->add_option("--canary-poll", f->poll, "interval between the canary's API reads")
      ->capture_default_str();
  cmd->add_option("--nvml-endpoint", f->nvml_endpoint,
                  "URL template of the device plugin's NVML view ({node}, {name}); empty = "
                  "compare with the catalogue")
      ->capture_default_str();
  cmd->add_option("--nvml-timeout", f->nvml_timeout, "per-request timeout")->capture_default_str();
  cmd->add_option("--canary-name", f->canary_options.name)->capture_default_str();
  cmd->add_option("--canary-namespace", f->canary_options.ns)->capture_default_str();
  cmd->add_option("--canary-image", f->canary_options.image)->capture_default_str();
  cmd->add_option("--canary-gpumem", f->canary_options.gpumem_mib,
                  "MiB asked by the canary (NVML memory is below the nominal profile size)")
      ->capture_default_str();
  cmd->add_option("--canary-scheduler-name", f->canary_options.scheduler_name,
                  "spec.schedulerName of the canary (default: left to the webhook)");
  cmd->callback([f, &ctx] { ctx.exit_code = RunValidateCommand(*f, ctx); });
}

void RegisterHandover(CLI::App& root, CliContext& ctx) {
  CLI::App* handover = root.add_subcommand(
      "handover",
      "Hand a live node over to dynamic MIG without draining it: plan (what is on each GPU, who "
      "holds it, what will happen, what blocks it), check (PASS/FAIL)");
  handover->require_subcommand(1);
  const std::vector<std::pair<std::string, std::string>> verbs = {
      {"plan",
       "Per GPU, every instance, its holders and its fate; the node's legacy pods; what blocks "
       "a no-drain handover"},
      {"check", "handover-proof, handover-overlap, handover-allocator per node; exits 1 on FAIL"}};
  for (const auto& [verb, help] : verbs) {
    auto f = std::make_shared<HandoverFlags>();
    CLI::App* cmd = handover->add_subcommand(verb, help);
    AddCommon(cmd, f->common);
    cmd->add_option("--node", f->node,
                    verb == "plan" ? "the node to hand over (required)"
                                   : "the node to check (default: every GPU node)");
    cmd->add_option("--nvml-endpoint", f->nvml_endpoint,
                    "URL template of dynmig's device-plugin NVML view ({node}, {name})")
        ->capture_default_str();
    cmd->add_option("--nvml-timeout", f->nvml_timeout, "per-request timeout")
        ->capture_default_str();
    const std::string v = verb;
    cmd->callback([f, v, &ctx] { ctx.exit_code = RunHandoverCommand(*f, v, ctx); });
  }
}

void RegisterExplain(CLI::App& root, CliContext& ctx) {
  auto f = std::make_shared<ExplainFlags>();
  CLI::App* cmd = root.add_subcommand(
      "explain", "Why a pod is pending, or where it was placed, and what would make it fit");
  AddCommon(cmd, f->common);
  cmd->add_option("-n,--namespace", f->ns, "the pod's namespace")->capture_default_str();
  cmd->add_option("pod", f->pod, "the pod's name")->required();
  cmd->callback([f, &ctx] { ctx.exit_code = RunExplainCommand(*f, ctx); });
}

void RegisterLayout(CLI::App& root, CliContext& ctx) {
  auto f = std::make_shared<LayoutFlags>();
  CLI::App* cmd = root.add_subcommand(
      "layout", "The slices of every GPU and who holds them (terminal picture, JSON, HTML)");
  AddCommon(cmd, f->common);
  cmd->add_option("--node", f->node, "only this node");
  cmd->add_option("--html", f->html,
                  "also write a self-contained HTML page to this file ('-': print it instead)");
  cmd->callback([f, &ctx] { ctx.exit_code = RunLayoutCommand(*f, ctx); });
}

void RegisterDefrag(CLI::App& root, CliContext& ctx) {
  auto f = std::make_shared<DefragFlags>();
  CLI::App* cmd = root.add_subcommand(
      "defrag",
      "The fewest pods whose move would let a profile fit (a plan); with --apply --pod, carry "
      "it out for that pending pod (evict, reserve the slices)");
  AddCommon(cmd, f->common);
  cmd->add_option("--for", f->profile, "profile (3g.20gb) or slice class (3g)")->required();
  cmd->add_option("--node", f->node, "only this node (default: every node not cordoned)");
  cmd->add_option("--alternatives", f->alternatives, "further plans shown")->capture_default_str();
  cmd->add_flag("--apply", f->apply,
                "evict the plan's pods through the Eviction API and reserve the freed slices for "
                "--pod (the defragmenter's rules: docs/operations.md)");
  cmd->add_flag("--dry-run", f->dry_run, "with --pod: plan under the same rules, evict nothing");
  cmd->add_option("--pod", f->pod, "the pending pod (in -n NAMESPACE) to make room for");
  cmd->add_option("-n,--namespace", f->ns, "the --pod's namespace")->capture_default_str();
  cmd->add_option("--evictions-per-node", f->limits.per_node_per_hour,
                  "at most this many evictions on the node")
      ->capture_default_str();
  cmd->add_option("--evictions-per-namespace", f->limits.per_namespace_per_hour,
                  "at most this many evictions per namespace")
      ->capture_default_str();
  cmd->add_option("--reservation-ttl", f->limits.reservation_ttl,
                  "how long the freed slices stay reserved for the pod")
      ->capture_default_str();
  cmd->callback([f, &ctx] { ctx.exit_code = RunDefragCommand(*f, ctx); });
}

void RegisterRollback(CLI::App& root, CliContext& ctx) {
  CLI::App* rollback = root.add_subcommand(
      "rollback",
      "Roll a node back from dynamic MIG to its fixed geometry, from a `dynmig inventory` "
      "backup: plan, check, apply");
  rollback->require_subcommand(1);
  const std::vector<std::pair<std::string, std::string>> verbs = {
      {"plan", "The steps for this node, each with its command and the check that proves it"},
      {"check",
       "Run every proof (PASS/FAIL with evidence); refuses while anything dynamic remains"},
      {"apply",
       "After check's safety items pass: restore the backup's ConfigMaps and MIG Manager "
       "labels, and the fixed geometry through NVML; says what changed"}};
  for (const auto& [verb, help] : verbs) {
    auto f = std::make_shared<RollbackFlags>();
    CLI::App* cmd = rollback->add_subcommand(verb, help);
    AddCommon(cmd, f->common, false, false);
    cmd->add_option("--node", f->node, "the node to roll back")->required();
    cmd->add_option("--backup", f->backup, "the directory `dynmig inventory --out` wrote")
        ->required();
    cmd->add_option("--geometry", f->geometry,
                    "the fixed geometry to reapply, as `dynmig nvml instances -o json` prints it "
                    "(default: the backup's NVML view of the node)");
    cmd->add_flag("--on-node", f->on_node,
                  "read (apply: recreate) the node's MIG instances through NVML here, on the node");
    cmd->add_option("--nvml-library", f->library, "with --on-node")->capture_default_str();
    cmd->add_option("--sim-state", f->sim_state,
                    "use the simulator's state file as the node's NVML (dynmig local)");
    cmd->add_option("--instances", f->instances,
                    "the node's instances as `dynmig nvml instances -o json` printed them there");
    cmd->add_option("--nvml-endpoint", f->nvml_endpoint,
                    "dynmig's device-plugin NVML view ({node}, {name}): answering means it still "
                    "runs; empty = do not probe")
        ->capture_default_str();
    cmd->add_option("--nvml-timeout", f->nvml_timeout, "probe timeout")->capture_default_str();
    const std::string v = verb;
    cmd->callback([f, v, &ctx] { ctx.exit_code = RunRollbackCommand(*f, v, ctx); });
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<kube::KubeClient>> ConnectKube(const std::string& kubeconfig,
                                                              bool in_cluster) {
  absl::StatusOr<kube::RestConfig> config =
      in_cluster ? kube::InClusterConfig() : kube::DefaultConfig(kubeconfig);
  if (!config.ok()) return config.status();
  auto client = kube::RestKubeClient::Create(*config);
  if (!client.ok()) return client.status();
  return std::unique_ptr<kube::KubeClient>(std::move(*client));
}

std::string RenderLayoutText(const std::vector<scheduler::NodeReport>& nodes) {
  return ops::RenderLayoutText(nodes, Painter());
}

void RegisterOpsCommands(CLI::App& root, CliContext& ctx) {
  RegisterInventory(root, ctx);
  RegisterPreflight(root, ctx);
  RegisterValidate(root, ctx);
  RegisterHandover(root, ctx);
  RegisterExplain(root, ctx);
  RegisterLayout(root, ctx);
  RegisterDefrag(root, ctx);
  RegisterRollback(root, ctx);
}

}  // namespace dynmig::cli
