#include "scheduler/node_lock.h"

#include <algorithm>

#include "common/status_macros.h"
#include "common/strings.h"
#include "fmt/format.h"
#include "kube/object.h"
#include "protocol/annotations.h"
#include "spdlog/spdlog.h"

namespace dynmig::scheduler {

std::string FormatNodeLock(const NodeLockValue& value) {
  return fmt::format("{},{},{}", kube::Rfc3339(value.time), value.ns, value.pod);
}

absl::StatusOr<NodeLockValue> ParseNodeLock(std::string_view value) {
  NodeLockValue out;
  const size_t first = value.find(',');
  const std::string_view time_text = Trim(value.substr(0, first));
  auto t = kube::ParseRfc3339(time_text);
  if (!t.ok()) {
    return absl::InvalidArgumentError(fmt::format("{}: \"{}\" does not start with an RFC 3339 time",
                                                  protocol::kNodeLockAnnotation,
                                                  std::string(value)));
  }
  out.time = *t;
  if (first == std::string_view::npos) return out;
  const std::string_view rest = value.substr(first + 1);
  const size_t second = rest.find(',');
  if (second == std::string_view::npos) {
    return absl::InvalidArgumentError(fmt::format("{}: \"{}\" is not <time>,<namespace>,<pod>",
                                                  protocol::kNodeLockAnnotation,
                                                  std::string(value)));
  }
  out.ns = std::string(Trim(rest.substr(0, second)));
  out.pod = std::string(Trim(rest.substr(second + 1)));
  return out;
}

absl::Status AcquireNodeLock(kube::KubeClient& client, std::string_view node, std::string_view ns,
                             std::string_view pod, absl::Time now, const NodeLockOptions& options) {
  const std::string key(protocol::kNodeLockAnnotation);
  absl::Status last = absl::AbortedError("no attempt made");
  for (int attempt = 0; attempt < std::max(1, options.attempts); ++attempt) {
    auto current = client.GetNode(node);
    if (!current.ok()) return Annotate(current.status(), fmt::format("lock node {}", node));
    if (auto held = kube::Annotation(*current, key); held.has_value() && !held->empty()) {
      auto parsed = ParseNodeLock(*held);
      if (!parsed.ok()) {
        spdlog::warn("node {}: taking over an unreadable lock: {}", node,
                     std::string(parsed.status().message()));
      } else if (parsed->ns == ns && parsed->pod == pod) {
        // Ours already (a retried bind): refresh it below.
      } else if (now - parsed->time < options.expiry) {
        return absl::FailedPreconditionError(fmt::format(
            "node {} is locked by {}/{} since {} (a pod between bind and device allocation; the "
            "lock expires after {})",
            node, parsed->ns.empty() ? "?" : parsed->ns, parsed->pod.empty() ? "?" : parsed->pod,
            kube::Rfc3339(parsed->time), absl::FormatDuration(options.expiry)));
      } else {
        spdlog::info("node {}: taking over the stale lock of {}/{} from {}", node, parsed->ns,
                     parsed->pod, kube::Rfc3339(parsed->time));
      }
    }
    kube::MetadataPatch patch;
    patch.annotations[key] = FormatNodeLock({now, std::string(ns), std::string(pod)});
    patch.resource_version = kube::ResourceVersion(*current);
    auto patched = client.PatchNodeMetadata(node, patch);
    if (patched.ok()) return absl::OkStatus();
    if (patched.status().code() != absl::StatusCode::kAborted) {
      return Annotate(patched.status(), fmt::format("lock node {}", node));
    }
    last = patched.status();  // the node changed since we read it: read again
  }
  return absl::AbortedError(fmt::format("lock node {}: the node kept changing ({} attempts): {}",
                                        node, options.attempts, std::string(last.message())));
}

absl::Status ReleaseNodeLock(kube::KubeClient& client, std::string_view node, std::string_view ns,
                             std::string_view pod, const NodeLockOptions& options) {
  const std::string key(protocol::kNodeLockAnnotation);
  absl::Status last = absl::OkStatus();
  for (int attempt = 0; attempt < std::max(1, options.attempts); ++attempt) {
    auto current = client.GetNode(node);
    if (!current.ok()) return Annotate(current.status(), fmt::format("unlock node {}", node));
    auto held = kube::Annotation(*current, key);
    if (!held.has_value()) return absl::OkStatus();
    auto parsed = ParseNodeLock(*held);
    if (!parsed.ok() || parsed->ns != ns || parsed->pod != pod) return absl::OkStatus();
    kube::MetadataPatch patch;
    patch.annotations[key] = std::nullopt;
    patch.resource_version = kube::ResourceVersion(*current);
    auto patched = client.PatchNodeMetadata(node, patch);
    if (patched.ok()) return absl::OkStatus();
    if (patched.status().code() != absl::StatusCode::kAborted) {
      return Annotate(patched.status(), fmt::format("unlock node {}", node));
    }
    last = patched.status();
  }
  return absl::AbortedError(
      fmt::format("unlock node {}: the node kept changing: {}", node, std::string(last.message())));
}

}  // namespace dynmig::scheduler
