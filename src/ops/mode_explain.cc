// Why a GPU does not switch mode for a waiting pod. See mode_explain.h.
#include "ops/mode_explain.h"

#include <map>
#include <set>

#include "fmt/format.h"
#include "kube/object.h"
#include "protocol/annotations.h"
#include "protocol/devices.h"
#include "protocol/gpu_mode_switch.h"
#include "protocol/node_register.h"
#include "scheduler/mode_switcher.h"

namespace dynmig::ops {
namespace {

using nlohmann::json;

std::string ModeWords(mig::ModeKind m) {
  return m == mig::ModeKind::kMig ? "MIG" : "whole-GPU (hami-core)";
}

// GPU UUIDs named by the device annotations of the node's pods that have not terminated.
std::set<std::string> NamedOn(const ClusterSnapshot& snap, const std::string& node) {
  std::set<std::string> named;
  for (const auto& p : snap.pods) {
    if (kube::IsTerminated(p)) continue;
    std::string on = kube::Annotation(p, protocol::kVgpuNodeAnnotation).value_or("");
    if (on.empty()) on = kube::NodeName(p);
    if (on != node) continue;
    for (auto key : {protocol::kDevicesAllocatedAnnotation, protocol::kDevicesToAllocateAnnotation,
                     protocol::kMigAllocationsAnnotation}) {
      if (auto value = kube::Annotation(p, key)) {
        for (auto& uuid : protocol::GpuUuidsNamedIn(*value)) named.insert(uuid);
      }
    }
  }
  return named;
}

// The words for a verdict code.
std::string Words(const mig::ModeGpuVerdict& v, const protocol::GpuModeStatus& s) {
  if (v.code == "not-allowed") return "not allowed by nvidia.migModeSwitching";
  if (v.code == "no-mig") return "it has no MIG: it stays whole";
  if (v.code == "in-use") return "in use: " + v.detail;
  if (v.code == "hysteresis") {
    return fmt::format("hysteresis: it keeps its mode until {}",
                       kube::Rfc3339(absl::FromUnixMillis(v.until_ms)));
  }
  if (v.code == "not-switchable") {
    const std::string code = scheduler::RefusalCode(s.reason);
    // The device plugin's reason, when it says it already (its refusals do: mode_switch.h).
    auto said = [&](std::string_view words) {
      return s.reason.find(words) != std::string::npos ? s.reason
                                                       : std::string(words) + ": " + s.reason;
    };
    if (code == "needs-reboot") return said("needs a reboot");
    if (code == "needs-reset") return said("needs a GPU reset");
    return "the device plugin reports it cannot switch" + (s.reason.empty() ? "" : ": " + s.reason);
  }
  if (v.code == "switching") return v.detail;
  return v.detail;
}

}  // namespace

ModeSwitchExplanation ExplainModeSwitches(const ClusterSnapshot& snap,
                                          const protocol::MigModeSwitching& config,
                                          mig::ModeKind wants, absl::Time now) {
  ModeSwitchExplanation out;
  out.json = {{"enabled", config.enabled}, {"gpus", json::array()}};
  std::string lines;
  bool any_status = false;
  const int64_t now_ms = absl::ToUnixMillis(now);
  for (const auto& n : snap.nodes) {
    auto status_value = kube::Annotation(n, protocol::kGpuModeStatusAnnotation);
    if (!status_value) continue;
    auto statuses = protocol::DecodeGpuModeStatuses(*status_value);
    const std::string node = kube::Name(n);
    if (!statuses.ok()) {
      any_status = true;
      lines += fmt::format("  {}: unreadable {}: {}\n", node, protocol::kGpuModeStatusAnnotation,
                           std::string(statuses.status().message()));
      continue;
    }
    any_status = any_status || !statuses->empty();
    std::map<std::string, protocol::GpuModeRequest> requests;
    if (auto value = kube::Annotation(n, protocol::kGpuModeRequestAnnotation)) {
      if (auto decoded = protocol::DecodeGpuModeRequests(*value); decoded.ok()) {
        for (auto& r : *decoded) requests[r.gpu_uuid] = std::move(r);
      }
    }
    std::map<std::string, protocol::DeviceInfo> registered;
    if (auto value = kube::Annotation(n, protocol::kNodeRegisterAnnotation)) {
      if (auto decoded = protocol::DecodeNodeRegister(*value); decoded.ok()) {
        for (auto& d : *decoded) registered[d.id] = std::move(d);
      }
    }
    const auto labels = kube::Labels(n);
    const std::map<std::string, std::string, std::less<>> node_labels(labels.begin(), labels.end());
    const std::set<std::string> named = NamedOn(snap, node);
    mig::ModeNode mnode;
    mnode.name = node;
    for (const auto& s : *statuses) {
      mig::ModeGpu g;
      g.uuid = s.gpu_uuid;
      g.mode = s.mode == protocol::GpuMode::kMig ? mig::ModeKind::kMig : mig::ModeKind::kWhole;
      g.mig_capable = s.mig_capable;
      g.switchable = s.switchable;
      g.not_switchable_reason = s.reason;
      g.since_ms = s.since_ms;
      auto reg = registered.find(s.gpu_uuid);
      if (reg != registered.end()) {
        g.index = reg->second.index;
        g.model = reg->second.type;
      }
      g.may_switch = config.MaySwitch(g.model, node_labels);
      auto r = requests.find(s.gpu_uuid);
      const bool held = r != requests.end() && protocol::HeldForSwitch(r->second, &s);
      if (held) {
        g.switching = true;
        g.switching_to =
            r->second.to == protocol::GpuMode::kMig ? mig::ModeKind::kMig : mig::ModeKind::kWhole;
      }
      if (reg == registered.end()) {
        g.busy_reason = "the device plugin does not publish it";
      } else if (named.count(s.gpu_uuid)) {
        g.busy_reason = "a pod's devices name it";
      }
      g.idle = g.busy_reason.empty();
      if (g.mode == wants && !(held && g.switching_to != wants)) continue;  // already that mode
      mig::ModeGpuVerdict v = mig::GpuEligibility(
          mnode, g, now_ms, absl::ToInt64Milliseconds(config.min_mode_duration));
      std::string code = v.code, reason;
      if (held && g.switching_to == wants) {
        code = "switching";
        reason = fmt::format("switching to {} mode (requested at {}{})", ModeWords(wants),
                             kube::Rfc3339(absl::FromUnixMillis(r->second.at_ms)),
                             r->second.reason.empty() ? "" : ": " + r->second.reason);
      } else if (!config.enabled) {
        code = "off";
        reason = "mode switching is off (nvidia.migModeSwitching absent or disabled)";
      } else if (code.empty()) {
        code = "may-switch";
        reason =
            "idle and allowed: the scheduler's leader switches it once the demand persists for "
            "two rounds, unless it is the last GPU of its mode that a pending pod needs";
      } else {
        reason = Words(v, s);
      }
      lines += fmt::format("  {}: GPU {} ({}) in {} mode: {}\n", node, g.index, g.uuid,
                           protocol::GpuModeName(s.mode), reason);
      out.json["gpus"].push_back({{"node", node},
                                  {"gpu", g.uuid},
                                  {"index", g.index},
                                  {"mode", std::string(protocol::GpuModeName(s.mode))},
                                  {"code", code},
                                  {"reason", reason}});
    }
  }
  if (!config.enabled && !any_status) return out;  // the default: nothing to say
  out.text = fmt::format("\nGPU mode switching (this pod needs {} GPUs):\n", ModeWords(wants));
  if (!config.enabled) out.text += "  off: nvidia.migModeSwitching is absent or disabled\n";
  out.text +=
      lines.empty() ? "  no GPU in another mode publishes its mode (dynmig.io/gpu-mode)\n" : lines;
  return out;
}

}  // namespace dynmig::ops
