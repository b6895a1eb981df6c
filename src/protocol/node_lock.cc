#include "protocol/node_lock.h"

#include <vector>

#include "common/strings.h"
#include "fmt/format.h"
#include "protocol/annotations.h"

namespace dynmig::protocol {
namespace {

absl::Status Malformed(std::string_view value, std::string_view why) {
  const std::string shown =
      value.size() > 120 ? std::string(value.substr(0, 120)) + "..." : std::string(value);
  return absl::InvalidArgumentError(
      fmt::format("{}: \"{}\" {} (expected <RFC 3339 time>,<namespace>,<pod>[,<uid>])",
                  kNodeLockAnnotation, shown, why));
}

}  // namespace

bool NodeLock::OwnedBy(std::string_view pod_ns, std::string_view pod_name,
                       std::string_view pod_uid) const {
  if (ns.empty() || pod.empty() || ns != pod_ns || pod != pod_name) return false;
  return uid.empty() || uid == pod_uid;
}

std::string NodeLock::Owner() const {
  if (pod.empty()) return "?";
  return uid.empty() ? fmt::format("{}/{}", ns, pod) : fmt::format("{}/{} (uid {})", ns, pod, uid);
}

std::string FormatNodeLock(const NodeLock& lock) {
  const std::string time = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", lock.time, absl::UTCTimeZone());
  if (lock.uid.empty()) return fmt::format("{},{},{}", time, lock.ns, lock.pod);
  return fmt::format("{},{},{},{}", time, lock.ns, lock.pod, lock.uid);
}

absl::StatusOr<NodeLock> ParseNodeLock(std::string_view value) {
  if (value.size() > kMaxNodeLockBytes) {
    return Malformed(value, fmt::format("is {} bytes, more than the {} a lock may have",
                                        value.size(), kMaxNodeLockBytes));
  }
  std::vector<std::string_view> fields;
  for (size_t start = 0;;) {
    const size_t comma = value.find(',', start);
    fields.push_back(Trim(value.substr(start, comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (fields.size() != 1 && fields.size() != 3 && fields.size() != 4) {
    return Malformed(value, fmt::format("has {} fields", fields.size()));
  }
  NodeLock out;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, std::string(fields[0]), &out.time, &err)) {
    return Malformed(value, "does not start with an RFC 3339 time");
  }
  if (fields.size() == 1) return out;
  if (fields[1].empty() || fields[2].empty()) {
    return Malformed(value, "has an empty namespace or pod name");
  }
  out.ns = std::string(fields[1]);
  out.pod = std::string(fields[2]);
  if (fields.size() == 4) {
    if (fields[3].empty()) return Malformed(value, "has an empty UID");
    out.uid = std::string(fields[3]);
  }
  return out;
}

}  // namespace dynmig::protocol
