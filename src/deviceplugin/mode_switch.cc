// The device plugin's MIG mode switches (mode_switch.h): requests read from the Node, the idle
// check, the switch with its intent recorded before every NVML call, and the statuses published
// in dynmig.io/gpu-mode.
#include "deviceplugin/mode_switch.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "kube/object.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {
namespace {

std::string_view ModeWord(bool mig) { return mig ? "mig" : "hami-core"; }

const GpuModeRecord* FindRecord(const std::vector<GpuModeRecord>& records, std::string_view uuid) {
  for (const auto& r : records) {
    if (r.gpu_uuid == uuid) return &r;
  }
  return nullptr;
}

const ModeSwitchIntent* FindIntent(const std::vector<ModeSwitchIntent>& intents,
                                   std::string_view uuid) {
  for (const auto& i : intents) {
    if (i.gpu_uuid == uuid) return &i;
  }
  return nullptr;
}

// Whether a refusal's reason held only until the device plugin restarts: the GPU was marked (a
// reset this node cannot do, a host that needs a reboot), or a later request was refused for it.
bool HeldUntilRestart(std::string_view reason) {
  return reason == kNeedsReboot || reason == kNeedsReset || reason.ends_with(kUntilRestart);
}

}  // namespace

ModeSwitcher::ModeSwitcher(NodeOps& ops)
    : ops_(ops), started_ms_(absl::ToUnixMillis(ops.options.clock->Now())) {}

int64_t ModeSwitcher::NowMs() const { return absl::ToUnixMillis(ops_.Now()); }

bool ModeSwitcher::Crash(std::string_view point) const {
  return ops_.options.crash_point && ops_.options.crash_point(point);
}

GpuModeRecord& ModeSwitcher::Record(const GpuEntry& gpu) {
  auto& records = ops_.ns.state.gpu_modes;
  for (auto& r : records) {
    if (r.gpu_uuid == gpu.info.uuid) return r;
  }
  GpuModeRecord r;
  r.gpu_uuid = gpu.info.uuid;
  r.mig = gpu.info.mig.current;
  r.since_ms = started_ms_;  // unknown before this plugin saw it
  records.push_back(std::move(r));
  std::sort(records.begin(), records.end(),
            [](const GpuModeRecord& a, const GpuModeRecord& b) { return a.gpu_uuid < b.gpu_uuid; });
  for (auto& x : records) {
    if (x.gpu_uuid == gpu.info.uuid) return x;
  }
  return records.back();  // not reached
}

std::string ModeSwitcher::NotAllowed(const GpuEntry& gpu) const {
  const protocol::MigModeSwitching& sw = ops_.options.mig_mode_switching;
  if (!sw.enabled) return "MIG mode switching is off (nvidia.migModeSwitching.enabled: false)";
  if (!gpu.info.mig.supported) return "the GPU does not support MIG";
  if (!sw.MaySwitch(gpu.info.name, labels_)) {
    return fmt::format("no nvidia.migModeSwitching rule allows {} on node {}", gpu.info.name,
                       ops_.options.node_name);
  }
  if (auto it = marked_.find(gpu.info.uuid); it != marked_.end()) {
    return it->second + std::string(kUntilRestart);
  }
  return "";
}

bool ModeSwitcher::Switching(std::string_view gpu_uuid) const {
  return switching_.count(gpu_uuid) > 0 ||
         FindIntent(ops_.ns.state.mode_switches, gpu_uuid) != nullptr;
}

void ModeSwitcher::ApplyHealth() {
  for (auto& gpu : ops_.ns.inventory.gpus) {
    if (!gpu.exposed || !Switching(gpu.info.uuid)) continue;
    gpu.healthy = false;
    gpu.unhealthy_reason = "its MIG mode is being switched";
  }
}

std::vector<protocol::GpuModeStatus> ModeSwitcher::Statuses() const {
  std::vector<protocol::GpuModeStatus> out;
  for (const auto& gpu : ops_.ns.inventory.gpus) {
    if (!gpu.exposed) continue;
    protocol::GpuModeStatus s;
    s.gpu_uuid = gpu.info.uuid;
    s.mode = gpu.info.mig.current ? protocol::GpuMode::kMig : protocol::GpuMode::kWholeGpu;
    s.mig_capable = gpu.info.mig.supported;
    const std::string not_allowed = NotAllowed(gpu);
    s.switchable = not_allowed.empty();
    const GpuModeRecord* r = FindRecord(ops_.ns.state.gpu_modes, gpu.info.uuid);
    s.since_ms = r != nullptr ? r->since_ms : started_ms_;
    const ModeSwitchIntent* intent = FindIntent(ops_.ns.state.mode_switches, gpu.info.uuid);
    if (auto it = switching_.find(gpu.info.uuid); it != switching_.end()) {
      s.phase = protocol::GpuModePhase::kSwitching;
      s.answers_ms = it->second;
    } else if (intent != nullptr) {
      s.phase = protocol::GpuModePhase::kSwitching;
      s.answers_ms = intent->request_at_ms;
    } else if (r != nullptr) {
      s.phase = r->phase == "refused" ? protocol::GpuModePhase::kRefused
                                      : protocol::GpuModePhase::kSteady;
      s.answers_ms = r->answers_ms;
      s.reason = r->reason;
    }
    if (s.reason.empty() && marked_.count(gpu.info.uuid) > 0) s.reason = not_allowed;
    out.push_back(std::move(s));
  }
  return out;
}

void ModeSwitcher::SaveIntent(const ModeSwitchIntent& intent) {
  auto& intents = ops_.ns.state.mode_switches;
  auto it = std::find_if(intents.begin(), intents.end(),
                         [&](const ModeSwitchIntent& i) { return i.gpu_uuid == intent.gpu_uuid; });
  if (it == intents.end()) {
    intents.push_back(intent);
  } else {
    *it = intent;
  }
}

void ModeSwitcher::DropIntent(std::string_view gpu_uuid) {
  auto& intents = ops_.ns.state.mode_switches;
  intents.erase(std::remove_if(intents.begin(), intents.end(),
                               [&](const ModeSwitchIntent& i) { return i.gpu_uuid == gpu_uuid; }),
                intents.end());
}

void ModeSwitcher::Done(const GpuEntry& gpu, bool mig, int64_t answers) {
  GpuModeRecord& r = Record(gpu);
  const bool changed = r.mig != mig;
  if (changed) r.since_ms = NowMs();
  r.mig = mig;
  r.phase = "steady";
  r.answers_ms = answers;
  r.reason.clear();
  ops_.PersistOrLog("mode switch");
  const std::string message =
      changed ? fmt::format("GPU {} ({}) switched to mode {} (request {})", gpu.info.index,
                            gpu.info.uuid, ModeWord(mig), answers)
              : fmt::format("GPU {} ({}) already is in mode {} (request {})", gpu.info.index,
                            gpu.info.uuid, ModeWord(mig), answers);
  spdlog::info("{}", message);
  if (changed) ops_.Event(nullptr, "Normal", kReasonModeSwitched, message);
}

void ModeSwitcher::Refuse(const GpuEntry& gpu, int64_t answers, const std::string& reason,
                          bool mark) {
  GpuModeRecord& r = Record(gpu);
  r.phase = "refused";
  r.answers_ms = answers;
  r.reason = reason.substr(0, protocol::kMaxModeText);
  if (mark) marked_[gpu.info.uuid] = reason;
  ops_.PersistOrLog("mode switch refusal");
  const std::string message =
      fmt::format("GPU {} ({}) keeps mode {}: the switch (request {}) is refused: {}",
                  gpu.info.index, gpu.info.uuid, ModeWord(r.mig), answers, reason);
  spdlog::warn("{}", message);
  ops_.Event(nullptr, "Warning", kReasonModeRefused, message);
}

bool ModeSwitcher::Recover() {
  if (auto node = ops_.kube.GetNode(ops_.options.node_name); node.ok()) {
    labels_.clear();
    for (auto& [k, v] : kube::Labels(*node)) labels_.emplace(k, v);
  }
  bool changed = ResolveIntents();
  for (const auto& gpu : ops_.ns.inventory.gpus) {
    if (!gpu.exposed) continue;
    GpuModeRecord& r = Record(gpu);
    // A refusal that held only until the plugin restarts (a reset this node cannot do, a host that
    // needs a reboot), recorded by the previous run: this run may try again, so the status no
    // longer says it (the request it answered stays answered). One an interrupted set-back has
    // just recorded again (ResolveIntents) is this run's and stays.
    if (r.phase == "refused" && marked_.count(gpu.info.uuid) == 0 && HeldUntilRestart(r.reason)) {
      spdlog::info(
          "GPU {} ({}): the refusal of the previous run ({}) is cleared: it may switch again",
          gpu.info.index, gpu.info.uuid, r.reason);
      r.phase = "steady";
      r.reason.clear();
      changed = true;
    }
  }
  ops_.PersistOrLog("mode records");
  return changed;
}

bool ModeSwitcher::ResolveIntents() {
  bool changed = false;
  const std::vector<ModeSwitchIntent> intents = ops_.ns.state.mode_switches;
  for (const auto& intent : intents) {
    const GpuEntry* gpu = ops_.ns.inventory.FindByUuid(intent.gpu_uuid);
    if (gpu == nullptr) {
      spdlog::warn("MIG mode switch of GPU {}: the GPU is gone; its intent is dropped",
                   intent.gpu_uuid);
      DropIntent(intent.gpu_uuid);
      changed = true;
      continue;
    }
    auto mode = ops_.nvml.GetMigMode(gpu->info.index);
    if (!mode.ok()) {
      if (ops_.FirstReport("mode-intent/" + intent.gpu_uuid)) {
        spdlog::warn("MIG mode switch of GPU {} left open: its mode cannot be read ({}); retried",
                     intent.gpu_uuid, std::string(mode.status().message()));
      }
      continue;
    }
    const bool settled = mode->current == mode->pending;
    if (settled && mode->current == intent.to_mig) {
      DropIntent(intent.gpu_uuid);
      Done(*gpu, intent.to_mig, intent.request_at_ms);
      changed = true;
      continue;
    }
    if (!settled) {
      // Pending (a restart between SetMigMode and the reset, or during the set-back): undo it.
      auto back = ops_.nvml.SetMigMode(gpu->info.index, intent.from_mig);
      if (!back.ok() || back->mode.current != intent.from_mig ||
          back->mode.pending != intent.from_mig) {
        if (ops_.FirstReport("mode-intent/" + intent.gpu_uuid)) {
          spdlog::warn(
              "MIG mode switch of GPU {}: the pending mode cannot be set back ({}); "
              "retried",
              intent.gpu_uuid, back.ok() ? "still pending" : std::string(back.status().message()));
        }
        continue;
      }
    }
    ops_.ForgetReport("mode-intent/" + intent.gpu_uuid);
    DropIntent(intent.gpu_uuid);
    changed = true;
    if (intent.step == "set-back") {
      Refuse(*gpu, intent.request_at_ms, intent.reason, intent.mark_unswitchable);
    } else {
      ops_.PersistOrLog("mode switch rollback");
      spdlog::info(
          "MIG mode switch of GPU {} to {} was interrupted before it applied; it stays "
          "{} and the request is carried out again",
          intent.gpu_uuid, ModeWord(intent.to_mig), ModeWord(intent.from_mig));
    }
  }
  return changed;
}

bool ModeSwitcher::Begin(std::vector<protocol::GpuModeRequest>& todo) {
  bool changed = false;
  if (!ops_.ns.state.mode_switches.empty()) changed = ResolveIntents();
  // A mode that changed outside dynmig (an operator's nvidia-smi): since = now.
  for (const auto& gpu : ops_.ns.inventory.gpus) {
    if (!gpu.exposed || Switching(gpu.info.uuid)) continue;
    GpuModeRecord& r = Record(gpu);
    if (r.mig != gpu.info.mig.current && gpu.info.mig.current == gpu.info.mig.pending) {
      r.mig = gpu.info.mig.current;
      r.since_ms = NowMs();
      ops_.PersistOrLog("mode records");
      changed = true;
    }
  }
  auto node = ops_.kube.GetNode(ops_.options.node_name);
  if (!node.ok()) {
    if (ops_.FirstReport("mode-node")) {
      spdlog::warn("MIG mode requests not read: {}", std::string(node.status().message()));
    }
    return changed;
  }
  ops_.ForgetReport("mode-node");
  labels_.clear();
  for (auto& [k, v] : kube::Labels(*node)) labels_.emplace(k, v);
  const auto value = kube::Annotation(*node, protocol::kGpuModeRequestAnnotation);
  if (!value.has_value()) return changed;
  auto requests = protocol::DecodeGpuModeRequests(*value);
  if (!requests.ok()) {
    if (ops_.FirstReport(
            fmt::format("mode-request-invalid/{}", std::hash<std::string>{}(*value)))) {
      const std::string message =
          fmt::format("{} of node {} is not valid, no MIG mode is switched until it is: {}",
                      protocol::kGpuModeRequestAnnotation, ops_.options.node_name,
                      std::string(requests.status().message()));
      spdlog::warn("{}", message);
      ops_.Event(nullptr, "Warning", kReasonModeRequestInvalid, message);
    }
    return changed;
  }
  const std::vector<protocol::GpuModeStatus> statuses = Statuses();
  for (const auto& request : *requests) {
    const GpuEntry* gpu = ops_.ns.inventory.FindByUuid(request.gpu_uuid);
    if (gpu == nullptr || !gpu->exposed) {
      if (ops_.FirstReport(
              fmt::format("mode-request-unknown/{}/{}", request.gpu_uuid, request.at_ms))) {
        const std::string message = fmt::format(
            "{} of node {} names GPU {}, which this node does not expose: ignored",
            protocol::kGpuModeRequestAnnotation, ops_.options.node_name, request.gpu_uuid);
        spdlog::warn("{}", message);
        ops_.Event(nullptr, "Warning", kReasonModeRequestInvalid, message);
      }
      continue;
    }
    if (Switching(request.gpu_uuid)) continue;
    auto status = std::find_if(statuses.begin(), statuses.end(),
                               [&](const auto& s) { return s.gpu_uuid == request.gpu_uuid; });
    if (status != statuses.end() && protocol::StatusAnswers(*status, request)) continue;
    changed = true;
    if (const std::string why = NotAllowed(*gpu); !why.empty()) {
      Refuse(*gpu, request.at_ms, why, false);
      continue;
    }
    const bool to = request.to == protocol::GpuMode::kMig;
    if (gpu->info.mig.current == to && gpu->info.mig.pending == to) {
      Done(*gpu, to, request.at_ms);
      continue;
    }
    spdlog::info("GPU {} ({}): switching MIG mode to {} (request {} by {}: {})", gpu->info.index,
                 gpu->info.uuid, ModeWord(to), request.at_ms, request.by, request.reason);
    switching_[request.gpu_uuid] = request.at_ms;
    todo.push_back(request);
  }
  ApplyHealth();
  return changed;
}

bool ModeSwitcher::Carry(const std::vector<protocol::GpuModeRequest>& todo) {
  const absl::StatusOr<std::vector<PodMig>> pods = ops_.ListPods();
  for (const auto& request : todo) {
    const GpuEntry* gpu = ops_.ns.inventory.FindByUuid(request.gpu_uuid);
    if (gpu != nullptr && !CarryOne(*gpu, request, pods)) return false;
    switching_.erase(request.gpu_uuid);
  }
  return !Crash(kCrashModeBeforePublish);
}

std::string ModeSwitcher::BusyReason(const GpuEntry& gpu, const std::vector<PodMig>& pods) {
  const std::string& uuid = gpu.info.uuid;
  for (const auto& q : ops_.ns.quarantine) {
    if (q.gpu_uuid == uuid) {
      return fmt::format("slices {} are kept for pod {} ({})", q.placement.ToString(), q.pod,
                         q.reason);
    }
  }
  for (const auto& i : ops_.ns.state.intents) {
    if (i.gpu_uuid == uuid) return fmt::format("an Allocate for pod {} is open", i.owner.PodKey());
  }
  for (const auto& m : ops_.ns.state.instances) {
    if (m.gpu_uuid == uuid && !m.idle) {
      return fmt::format("MIG device {} (GI {}) of pod {}", m.mig_uuid, m.gpu_instance_id,
                         m.owner.PodKey());
    }
  }
  for (const auto& h : ops_.ns.Held()) {
    if (h.gpu_uuid == uuid) {
      return fmt::format("held slices {}: {}", h.placement.ToString(), h.reason);
    }
  }
  for (const auto& p : pods) {
    if (!p.active) continue;
    if (p.referenced_gpus.count(uuid) > 0) return fmt::format("pod {} reserves it", p.key);
    if (p.gpus_unknown) {
      return fmt::format("the reservation of pod {} cannot be read (it may name this GPU)", p.key);
    }
  }
  // Warm (idle, dynmig-owned) instances go first.
  const std::vector<ManagedInstance> managed = ops_.ns.state.instances;
  for (const auto& m : managed) {
    if (m.gpu_uuid != uuid || !m.idle) continue;
    std::string why;
    if (ops_.GiBusy(gpu, m.gpu_instance_id, &why)) {
      return fmt::format("warm MIG device {} (GI {}): {}", m.mig_uuid, m.gpu_instance_id, why);
    }
    if (auto st = ops_.DestroyGi(gpu, m.gpu_instance_id); !st.ok()) {
      return fmt::format("warm MIG device {} (GI {}) cannot be destroyed: {}", m.mig_uuid,
                         m.gpu_instance_id, std::string(st.message()));
    }
    ops_.ns.RemoveManaged(m.gpu_uuid, m.gpu_instance_id);
    if (ops_.cdi.enabled()) {
      if (auto rm = ops_.cdi.Remove(m.mig_uuid); !rm.ok()) {
        spdlog::warn("{}", std::string(rm.message()));
      }
    }
    ops_.metrics.InstanceDestroyed("mode_switch");
    ops_.Event(nullptr, "Normal", kReasonDestroyed,
               fmt::format("warm MIG device {} (GI {} on GPU {}) destroyed for a MIG mode switch",
                           m.mig_uuid, m.gpu_instance_id, uuid));
    ops_.PersistOrLog("warm instance destroyed for a mode switch");
  }
  if (gpu.info.mig.current) {
    auto gis = ops_.nvml.ListGpuInstances(gpu.info.index);
    if (!gis.ok()) {
      return fmt::format("its GPU instances cannot be listed: {}",
                         std::string(gis.status().message()));
    }
    if (!gis->empty()) {
      std::vector<uint32_t> ids;
      for (const auto& gi : *gis) ids.push_back(gi.id);
      return fmt::format("GPU instance(s) {} exist in NVML", fmt::join(ids, ", "));
    }
  }
  std::string why;
  if (ops_.GpuHasProcesses(gpu, &why)) return why;
  return "";
}

bool ModeSwitcher::CarryOne(const GpuEntry& gpu, const protocol::GpuModeRequest& request,
                            const absl::StatusOr<std::vector<PodMig>>& pods) {
  const bool to = request.to == protocol::GpuMode::kMig;
  auto mode = ops_.nvml.GetMigMode(gpu.info.index);
  if (!mode.ok()) {
    Refuse(gpu, request.at_ms,
           fmt::format("its MIG mode cannot be read: {}", std::string(mode.status().message())),
           false);
    return true;
  }
  if (mode->current != mode->pending) {
    Refuse(gpu, request.at_ms,
           fmt::format("a MIG mode change is pending already (current {}, pending {}): only a "
                       "reset or reboot of the host applies it",
                       ModeWord(mode->current), ModeWord(mode->pending)),
           false);
    return true;
  }
  if (mode->current == to) {
    Done(gpu, to, request.at_ms);
    return true;
  }
  if (!pods.ok()) {
    Refuse(gpu, request.at_ms,
           fmt::format("the node's pods cannot be listed ({}): nothing is switched blind",
                       std::string(pods.status().message())),
           false);
    return true;
  }
  if (const std::string busy = BusyReason(gpu, *pods); !busy.empty()) {
    Refuse(gpu, request.at_ms, "the GPU is in use: " + busy, false);
    return true;
  }
  ModeSwitchIntent intent;
  intent.gpu_uuid = gpu.info.uuid;
  intent.from_mig = mode->current;
  intent.to_mig = to;
  intent.request_at_ms = request.at_ms;
  intent.step = "set-mode";
  SaveIntent(intent);
  if (auto st = ops_.Persist(); !st.ok()) {
    DropIntent(gpu.info.uuid);
    Refuse(gpu, request.at_ms,
           fmt::format("the state file cannot be written: {}", std::string(st.message())), false);
    return true;
  }
  if (Crash(kCrashModeBeforeSet)) return false;
  auto change = ops_.nvml.SetMigMode(gpu.info.index, to);
  if (Crash(kCrashModeAfterSet)) return false;
  if (!change.ok()) {
    DropIntent(gpu.info.uuid);
    Refuse(gpu, request.at_ms,
           fmt::format("NVML refused to set MIG mode {}: {}", ModeWord(to),
                       std::string(change.status().message())),
           false);
    return true;
  }
  if (change->Active() && change->mode.current == to) {
    DropIntent(gpu.info.uuid);
    Done(gpu, to, request.at_ms);
    return true;
  }
  if (change->NeedsReboot()) return SetBack(gpu, intent, std::string(kNeedsReboot), true);
  if (change->activation != nvml::NvmlReturn::kInUse) {
    return SetBack(
        gpu, intent,
        fmt::format("NVML's activation status {}", nvml::NvmlReturnName(change->activation)),
        false);
  }
  // Pending until a reset (Ampere): only with no process on the GPU.
  if (std::string why; ops_.GpuHasProcesses(gpu, &why)) {
    return SetBack(gpu, intent, "needs a GPU reset, which cannot run now: " + why, false);
  }
  intent.step = "reset";
  SaveIntent(intent);
  ops_.PersistOrLog("mode switch intent");
  if (Crash(kCrashModeBeforeReset)) return false;
  auto reset = ops_.nvml.ResetGpu(gpu.info.index);
  if (reset.ok()) {
    auto after = ops_.nvml.GetMigMode(gpu.info.index);
    if (after.ok() && after->current == to && after->pending == to) {
      DropIntent(gpu.info.uuid);
      Done(gpu, to, request.at_ms);
      return true;
    }
    return SetBack(gpu, intent, "the GPU reset did not apply the mode", false);
  }
  if (reset.code() == absl::StatusCode::kUnimplemented) {
    return SetBack(gpu, intent, std::string(kNeedsReset), true);
  }
  return SetBack(gpu, intent, fmt::format("the GPU reset failed: {}", std::string(reset.message())),
                 false);
}

bool ModeSwitcher::SetBack(const GpuEntry& gpu, ModeSwitchIntent intent, const std::string& reason,
                           bool mark) {
  intent.step = "set-back";
  intent.reason = reason;
  intent.mark_unswitchable = mark;
  SaveIntent(intent);
  ops_.PersistOrLog("mode switch intent");
  if (Crash(kCrashModeBeforeSetBack)) return false;
  auto back = ops_.nvml.SetMigMode(gpu.info.index, intent.from_mig);
  if (!back.ok() || back->mode.current != intent.from_mig ||
      back->mode.pending != intent.from_mig) {
    // Left open: ResolveIntents sets it back in a later cycle; the GPU stays unhealthy meanwhile.
    spdlog::warn("GPU {} ({}): the MIG mode cannot be set back to {} ({}); retried", gpu.info.index,
                 gpu.info.uuid, ModeWord(intent.from_mig),
                 back.ok() ? "still pending" : std::string(back.status().message()));
    return true;
  }
  DropIntent(gpu.info.uuid);
  Refuse(gpu, intent.request_at_ms, reason, mark);
  return true;
}

}  // namespace dynmig::deviceplugin
