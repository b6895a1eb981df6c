#include "ops/gpu_mode.h"

#include <algorithm>
#include <map>
#include <vector>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "kube/object.h"
#include "protocol/annotations.h"
#include "protocol/gpu_mode_switch.h"
#include "protocol/node_lock.h"
#include "protocol/node_register.h"

namespace dynmig::ops {
namespace {

constexpr int kModeAttempts = 5;
// HAMi's node lock expiry (HAMI_NODELOCK_EXPIRE): an older lock is stale.
constexpr absl::Duration kModeNodeLockExpiry = absl::Minutes(5);

std::string ModeShown(const std::string& s) { return s.size() <= 64 ? s : s.substr(0, 64) + "..."; }

std::string ModeMsText(int64_t ms) {
  if (ms <= 0) return "-";
  return kube::Rfc3339(absl::FromUnixMillis(ms));
}

nlohmann::json ModeStatusJson(const protocol::GpuModeStatus& s) {
  return {{"mode", protocol::GpuModeName(s.mode)},
          {"migCapable", s.mig_capable},
          {"switchable", s.switchable},
          {"since", s.since_ms},
          {"phase", protocol::GpuModePhaseName(s.phase)},
          {"answers", s.answers_ms},
          {"reason", s.reason}};
}

nlohmann::json ModeRequestJson(const protocol::GpuModeRequest& r) {
  return {{"to", protocol::GpuModeName(r.to)}, {"at", r.at_ms}, {"by", r.by}, {"reason", r.reason}};
}

struct NodeModes {
  std::vector<protocol::DeviceInfo> gpus;  // the register (empty when absent)
  std::vector<protocol::GpuModeStatus> statuses;
  bool has_statuses = false;
  std::vector<protocol::GpuModeRequest> requests;
};

absl::StatusOr<NodeModes> ReadNodeModes(const kube::Object& node, const std::string& name) {
  NodeModes out;
  if (auto v = kube::Annotation(node, protocol::kNodeRegisterAnnotation)) {
    auto gpus = protocol::DecodeNodeRegister(*v);
    if (!gpus.ok()) {
      return absl::FailedPreconditionError(
          fmt::format("node {}: {}", name, std::string(gpus.status().message())));
    }
    out.gpus = std::move(*gpus);
  }
  if (auto v = kube::Annotation(node, protocol::kGpuModeStatusAnnotation)) {
    auto statuses = protocol::DecodeGpuModeStatuses(*v);
    if (!statuses.ok()) {
      return absl::FailedPreconditionError(
          fmt::format("node {}: {}", name, std::string(statuses.status().message())));
    }
    out.statuses = std::move(*statuses);
    out.has_statuses = true;
  }
  if (auto v = kube::Annotation(node, protocol::kGpuModeRequestAnnotation)) {
    auto requests = protocol::DecodeGpuModeRequests(*v);
    if (!requests.ok()) {
      return absl::InvalidArgumentError(fmt::format(
          "node {}: {}; no GPU of the node switches until it is repaired (kubectl annotate node "
          "{} {}-)",
          name, std::string(requests.status().message()), name,
          protocol::kGpuModeRequestAnnotation));
    }
    out.requests = std::move(*requests);
  }
  return out;
}

const protocol::GpuModeStatus* FindModeStatus(const NodeModes& m, std::string_view uuid) {
  for (const auto& s : m.statuses) {
    if (s.gpu_uuid == uuid) return &s;
  }
  return nullptr;
}

const protocol::GpuModeRequest* FindModeRequest(const NodeModes& m, std::string_view uuid) {
  for (const auto& r : m.requests) {
    if (r.gpu_uuid == uuid) return &r;
  }
  return nullptr;
}

CommandOutput ShowNodeModes(const std::string& name, const NodeModes& m) {
  CommandOutput out;
  out.json = {{"node", name}, {"gpus", nlohmann::json::array()}};
  std::vector<std::pair<std::optional<uint32_t>, std::string>> gpus;
  for (const auto& g : m.gpus) gpus.emplace_back(g.index, g.id);
  for (const auto& s : m.statuses) {
    if (std::none_of(gpus.begin(), gpus.end(),
                     [&](const auto& g) { return g.second == s.gpu_uuid; }))
      gpus.emplace_back(std::nullopt, s.gpu_uuid);
  }
  if (!m.has_statuses) {
    out.text += fmt::format(
        "node {} publishes no {}: nvidia.migModeSwitching is not configured, or dynmig's device "
        "plugin does not run there; every GPU stays in its mode\n",
        name, protocol::kGpuModeStatusAnnotation);
  }
  for (const auto& [index, uuid] : gpus) {
    const protocol::GpuModeStatus* s = FindModeStatus(m, uuid);
    const protocol::GpuModeRequest* r = FindModeRequest(m, uuid);
    nlohmann::json item = {{"gpu", uuid},
                           {"status", s != nullptr ? ModeStatusJson(*s) : nlohmann::json()},
                           {"request", r != nullptr ? ModeRequestJson(*r) : nlohmann::json()},
                           {"held", r != nullptr && protocol::HeldForSwitch(*r, s)}};
    if (index) item["index"] = *index;
    out.json["gpus"].push_back(item);
    out.text += fmt::format("GPU {} {}", index ? std::to_string(*index) : "?", uuid);
    if (s != nullptr) {
      out.text += fmt::format(": {}, {}, since {}, {}", protocol::GpuModeName(s->mode),
                              !s->mig_capable ? "no MIG"
                              : s->switchable ? "switchable"
                                              : "not switchable",
                              ModeMsText(s->since_ms), protocol::GpuModePhaseName(s->phase));
      if (s->answers_ms > 0) out.text += fmt::format(" (request {})", s->answers_ms);
      if (!s->reason.empty()) out.text += fmt::format(": {}", s->reason);
    }
    out.text += "\n";
    if (r != nullptr) {
      out.text += fmt::format(
          "  request {}: to {} by {}{}{}\n", r->at_ms, protocol::GpuModeName(r->to), r->by,
          r->reason.empty() ? "" : " (" + r->reason + ")",
          protocol::HeldForSwitch(*r, s) ? ", not answered yet: nothing is placed on the GPU"
                                         : ", answered");
    }
  }
  return out;
}

// Why `text` cannot go into the request ("" when it can): the decoder's bounds.
std::string BadModeText(const std::string& text) {
  if (text.size() > protocol::kMaxModeText) {
    return fmt::format("{} characters; at most {}", text.size(), protocol::kMaxModeText);
  }
  for (unsigned char c : text) {
    if (c < 0x20 || c == 0x7f) return "control characters are not allowed";
  }
  return "";
}

}  // namespace

absl::StatusOr<CommandOutput> RunGpuMode(kube::KubeClient& client, const GpuModeOptions& o) {
  if (std::string why = BadModeText(o.reason); !why.empty()) {
    return absl::InvalidArgumentError("--reason: " + why);
  }
  if (std::string why = BadModeText("operator:" + o.by); !why.empty()) {
    return absl::InvalidArgumentError("--by: " + why);
  }
  for (int attempt = 1;; ++attempt) {
    auto node = client.GetNode(o.node);
    if (!node.ok()) {
      if (node.status().code() == absl::StatusCode::kNotFound) {
        return absl::NotFoundError(fmt::format("node \"{}\" not found", ModeShown(o.node)));
      }
      return node.status();
    }
    auto modes = ReadNodeModes(*node, o.node);
    if (!modes.ok()) return modes.status();
    if (!o.to.has_value() || o.gpu.empty()) {
      if (o.to.has_value() || !o.gpu.empty()) {
        return absl::InvalidArgumentError("--gpu and --to go together (neither: show the node)");
      }
      return ShowNodeModes(o.node, *modes);
    }
    // The GPU, by UUID or index.
    const bool by_index = o.gpu.size() <= 3 && std::all_of(o.gpu.begin(), o.gpu.end(), [](char c) {
                            return c >= '0' && c <= '9';
                          });
    const protocol::DeviceInfo* gpu = nullptr;
    std::vector<std::string> known;
    for (const auto& g : modes->gpus) {
      known.push_back(fmt::format("{} {}", g.index, g.id));
      if (by_index ? std::to_string(g.index) == o.gpu : g.id == o.gpu) gpu = &g;
    }
    if (gpu == nullptr) {
      return absl::NotFoundError(fmt::format("node {} registers no GPU \"{}\" (it has: {})", o.node,
                                             ModeShown(o.gpu), fmt::join(known, ", ")));
    }
    if (!modes->has_statuses) {
      return absl::FailedPreconditionError(fmt::format(
          "node {} publishes no {}: nvidia.migModeSwitching is not configured there (or the "
          "device plugin is older); nothing would carry the switch out",
          o.node, protocol::kGpuModeStatusAnnotation));
    }
    const protocol::GpuModeStatus* status = FindModeStatus(*modes, gpu->id);
    if (status == nullptr) {
      return absl::FailedPreconditionError(fmt::format(
          "node {} publishes no mode status for GPU {} ({})", o.node, gpu->index, gpu->id));
    }
    if (!status->switchable) {
      return absl::FailedPreconditionError(
          fmt::format("GPU {} ({}) of node {} is not switchable{}", gpu->index, gpu->id, o.node,
                      status->reason.empty() ? "" : ": " + status->reason));
    }
    const protocol::GpuModeRequest* existing = FindModeRequest(*modes, gpu->id);
    CommandOutput out;
    out.json = {{"node", o.node},
                {"gpu", gpu->id},
                {"index", gpu->index},
                {"to", protocol::GpuModeName(*o.to)}};
    if (existing == nullptr && status->mode == *o.to &&
        status->phase != protocol::GpuModePhase::kSwitching) {
      out.json["changed"] = false;
      out.text = fmt::format("GPU {} ({}) of node {} already is in mode {}: nothing written\n",
                             gpu->index, gpu->id, o.node, protocol::GpuModeName(*o.to));
      return out;
    }
    // A lock younger than the expiry: a pod is between bind and allocation on this node.
    if (auto held = kube::Annotation(*node, protocol::kNodeLockAnnotation);
        held.has_value() && !held->empty()) {
      auto lock = protocol::ParseNodeLock(*held);
      if (lock.ok() && o.now - lock->time < kModeNodeLockExpiry) {
        return absl::FailedPreconditionError(fmt::format(
            "node {} is locked by {} (a pod between bind and device allocation): try again in a "
            "moment",
            o.node, lock->Owner()));
      }
    }
    protocol::GpuModeRequest request;
    request.gpu_uuid = gpu->id;
    request.to = *o.to;
    request.at_ms = absl::ToUnixMillis(o.now);
    if (existing != nullptr && existing->at_ms >= request.at_ms)
      request.at_ms = existing->at_ms + 1;
    request.by = "operator:" + (o.by.empty() ? std::string("unknown") : o.by);
    request.reason = o.reason;
    std::vector<protocol::GpuModeRequest> next;
    for (const auto& r : modes->requests) {
      if (r.gpu_uuid != gpu->id) next.push_back(r);
    }
    next.push_back(request);
    const std::string value = protocol::EncodeGpuModeRequests(next);
    // The strict decoder is the check of what we write (reason and by: length, control
    // characters).
    if (auto check = protocol::DecodeGpuModeRequests(value); !check.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("--reason/--by: {}", std::string(check.status().message())));
    }
    kube::KeyPatch patch;
    patch[std::string(protocol::kGpuModeRequestAnnotation)] = value;
    auto st = client.PatchNodeAnnotations(o.node, patch, kube::ResourceVersion(*node));
    if (st.status().code() == absl::StatusCode::kAborted && attempt < kModeAttempts) continue;
    if (!st.ok()) return st.status();
    out.json["at"] = request.at_ms;
    out.json["changed"] = true;
    out.text = fmt::format(
        "GPU {} ({}) of node {}: asked to switch to {} (request {} by {}); the device plugin "
        "carries it out when the GPU is idle (`dynmig gpu mode --node {}` shows its answer)\n",
        gpu->index, gpu->id, o.node, protocol::GpuModeName(*o.to), request.at_ms, request.by,
        o.node);
    return out;
  }
}

}  // namespace dynmig::ops
