#include "ops/gpu_cordon.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "kube/object.h"
#include "protocol/annotations.h"
#include "protocol/device_cordon.h"
#include "protocol/node_register.h"

namespace dynmig::ops {
namespace {

constexpr int kAttempts = 5;

struct Target {
  std::string uuid;
  std::optional<uint32_t> index;  // unset: a UUID the node no longer registers (uncordon only)
};

absl::StatusOr<Target> Resolve(const kube::Object& node, const GpuCordonOptions& o,
                               const std::set<std::string>& cordoned) {
  const auto value = kube::Annotation(node, protocol::kNodeRegisterAnnotation);
  if (!value.has_value()) {
    if (!o.cordon && cordoned.count(o.gpu)) return Target{o.gpu, std::nullopt};
    return absl::FailedPreconditionError(fmt::format(
        "node {} registers no GPUs ({} is missing): is dynmig's device plugin running there?",
        o.node, protocol::kNodeRegisterAnnotation));
  }
  auto gpus = protocol::DecodeNodeRegister(*value);
  if (!gpus.ok()) {
    if (!o.cordon && cordoned.count(o.gpu)) return Target{o.gpu, std::nullopt};
    return absl::FailedPreconditionError(
        fmt::format("node {}: {}", o.node, std::string(gpus.status().message())));
  }
  const bool by_index =
      !o.gpu.empty() && o.gpu.size() <= 3 &&
      std::all_of(o.gpu.begin(), o.gpu.end(), [](char c) { return c >= '0' && c <= '9'; });
  std::vector<std::string> known;
  for (const auto& g : *gpus) {
    known.push_back(fmt::format("{} {}", g.index, g.id));
    if (by_index ? std::to_string(g.index) == o.gpu : g.id == o.gpu) return Target{g.id, g.index};
  }
  if (!o.cordon && cordoned.count(o.gpu)) return Target{o.gpu, std::nullopt};
  const std::string shown = o.gpu.size() <= 64 ? o.gpu : o.gpu.substr(0, 64) + "...";
  return absl::NotFoundError(fmt::format("node {} registers no GPU \"{}\" (it has: {})", o.node,
                                         shown, fmt::join(known, ", ")));
}

}  // namespace

absl::StatusOr<CommandOutput> RunGpuCordon(kube::KubeClient& client, const GpuCordonOptions& o) {
  std::string reason = o.reason;
  if (o.cordon && !o.by.empty()) {
    reason = reason.empty() ? fmt::format("by {}", o.by) : fmt::format("{} (by {})", reason, o.by);
  }
  if (std::string why = protocol::CheckCordonReason(reason); !why.empty()) {
    return absl::InvalidArgumentError(fmt::format("--reason: {}", why));
  }
  for (int attempt = 1;; ++attempt) {
    auto node = client.GetNode(o.node);
    if (!node.ok()) {
      if (node.status().code() == absl::StatusCode::kNotFound) {
        return absl::NotFoundError(fmt::format("node \"{}\" not found", o.node));
      }
      return node.status();
    }
    auto cordoned = protocol::ParseDeviceCordon(
        kube::Annotation(*node, protocol::kDeviceCordonAnnotation).value_or(""));
    if (!cordoned.ok()) {
      return absl::InvalidArgumentError(fmt::format(
          "node {}: {}; the scheduler treats every GPU of the node as cordoned until it is "
          "repaired (kubectl annotate node {} {}-)",
          o.node, std::string(cordoned.status().message()), o.node,
          protocol::kDeviceCordonAnnotation));
    }
    std::map<std::string, std::string> reasons;
    if (auto r = kube::Annotation(*node, protocol::kDeviceCordonReasonsAnnotation)) {
      auto parsed = protocol::ParseCordonReasons(*r);
      if (parsed.ok()) reasons = std::move(*parsed);  // words only: an unreadable one is replaced
    }
    const std::map<std::string, std::string> old_reasons = reasons;
    auto target = Resolve(*node, o, *cordoned);
    if (!target.ok()) return target.status();
    const std::string gpu_text =
        target->index ? fmt::format("GPU {} ({})", *target->index, target->uuid) : target->uuid;
    CommandOutput out;
    out.json = {{"node", o.node}, {"gpu", target->uuid}, {"cordoned", o.cordon}};
    if (target->index) out.json["index"] = *target->index;
    const bool was = cordoned->count(target->uuid) > 0;
    std::set<std::string> next = *cordoned;
    if (o.cordon) {
      next.insert(target->uuid);
      if (!reason.empty()) reasons[target->uuid] = reason;
    } else {
      next.erase(target->uuid);
      reasons.erase(target->uuid);
    }
    for (auto it = reasons.begin(); it != reasons.end();) {
      it = next.count(it->first) ? std::next(it) : reasons.erase(it);
    }
    out.json["cordonedGpus"] = next;
    if (next.size() > protocol::kMaxCordonedGpus) {
      return absl::InvalidArgumentError(fmt::format("node {}: at most {} GPUs can be cordoned",
                                                    o.node, protocol::kMaxCordonedGpus));
    }
    if (was == o.cordon && reasons == old_reasons) {
      out.json["changed"] = false;
      out.text = fmt::format("{} of node {} is already {}\n", gpu_text, o.node,
                             o.cordon ? "cordoned" : "not cordoned");
      return out;
    }
    kube::KeyPatch patch;
    patch[std::string(protocol::kDeviceCordonAnnotation)] =
        next.empty() ? std::nullopt : std::optional(protocol::EncodeDeviceCordon(next));
    patch[std::string(protocol::kDeviceCordonReasonsAnnotation)] =
        reasons.empty() ? std::nullopt : std::optional(protocol::EncodeCordonReasons(reasons));
    auto st = client.PatchNodeAnnotations(o.node, patch, kube::ResourceVersion(*node));
    if (st.status().code() == absl::StatusCode::kAborted && attempt < kAttempts) continue;
    if (!st.ok()) return st.status();
    out.json["changed"] = true;
    out.text = o.cordon ? fmt::format(
                              "{} of node {} cordoned{}: it takes no new reservation; instances "
                              "already on it stay\n",
                              gpu_text, o.node, reason.empty() ? "" : " (" + reason + ")")
                        : fmt::format("{} of node {} uncordoned: it takes new reservations again\n",
                                      gpu_text, o.node);
    return out;
  }
}

}  // namespace dynmig::ops
