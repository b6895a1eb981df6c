#include "scheduler/node_lock.h"

#include <algorithm>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "kube/object.h"
#include "protocol/annotations.h"
#include "spdlog/spdlog.h"

namespace dynmig::scheduler {

absl::Status AcquireNodeLock(kube::KubeClient& client, std::string_view node,
                             const LockOwner& owner, absl::Time now,
                             const NodeLockOptions& options) {
  const std::string key(protocol::kNodeLockAnnotation);
  absl::Status last = absl::AbortedError("no attempt made");
  for (int attempt = 0; attempt < std::max(1, options.attempts); ++attempt) {
    auto current = client.GetNode(node);
    if (!current.ok()) return Annotate(current.status(), fmt::format("lock node {}", node));
    if (auto held = kube::Annotation(*current, key); held.has_value() && !held->empty()) {
      auto parsed = protocol::ParseNodeLock(*held);
      if (!parsed.ok()) {
        spdlog::warn("node {}: taking over an unreadable lock: {}", node,
                     std::string(parsed.status().message()));
      } else if (parsed->OwnedBy(owner.ns, owner.pod, owner.uid)) {
        // Ours already (a retried bind): refresh it below.
      } else if (now - parsed->time < options.expiry) {
        return absl::FailedPreconditionError(fmt::format(
            "node {} is locked by {} since {} (a pod between bind and device allocation; the "
            "lock expires after {})",
            node, parsed->Owner(), kube::Rfc3339(parsed->time),
            absl::FormatDuration(options.expiry)));
      } else {
        spdlog::info("node {}: taking over the stale lock of {} from {}", node, parsed->Owner(),
                     kube::Rfc3339(parsed->time));
      }
    }
    kube::MetadataPatch patch;
    patch.annotations[key] = protocol::FormatNodeLock(
        {now, std::string(owner.ns), std::string(owner.pod), std::string(owner.uid)});
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

absl::Status ReleaseNodeLock(kube::KubeClient& client, std::string_view node,
                             const LockOwner& owner, const NodeLockOptions& options) {
  const std::string key(protocol::kNodeLockAnnotation);
  absl::Status last = absl::OkStatus();
  for (int attempt = 0; attempt < std::max(1, options.attempts); ++attempt) {
    auto current = client.GetNode(node);
    if (!current.ok()) return Annotate(current.status(), fmt::format("unlock node {}", node));
    auto held = kube::Annotation(*current, key);
    if (!held.has_value()) return absl::OkStatus();
    auto parsed = protocol::ParseNodeLock(*held);
    if (!parsed.ok() || !parsed->OwnedBy(owner.ns, owner.pod, owner.uid)) return absl::OkStatus();
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
