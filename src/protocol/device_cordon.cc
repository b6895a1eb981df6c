#include "protocol/device_cordon.h"

#include "common/strings.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "nlohmann/json.hpp"
#include "protocol/json_fields.h"

namespace dynmig::protocol {
namespace {

// "" when `uuid` is an acceptable entry, else why not.
std::string CheckUuid(std::string_view uuid) {
  if (uuid.size() > kMaxCordonUuid) {
    return fmt::format("{} characters (at most {})", uuid.size(), kMaxCordonUuid);
  }
  for (char c : uuid) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f) return fmt::format("character 0x{:02x} is not allowed", u);
  }
  return "";
}

std::string Shown(std::string_view s) {
  return s.size() <= 40 ? std::string(s) : std::string(s.substr(0, 40)) + "...";
}

}  // namespace

absl::StatusOr<std::set<std::string>> ParseDeviceCordon(std::string_view value) {
  if (value.size() > kMaxCordonBytes) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: {} bytes (at most {})", kDeviceCordonAnnotation, value.size(), kMaxCordonBytes));
  }
  std::set<std::string> out;
  size_t index = 0;
  while (true) {
    const size_t comma = value.find(',');
    const std::string_view entry = TrimBlanks(value.substr(0, comma));
    if (!entry.empty()) {
      if (std::string why = CheckUuid(entry); !why.empty()) {
        return absl::InvalidArgumentError(fmt::format(
            "{}: entry {} (\"{}\"): {}", kDeviceCordonAnnotation, index, Shown(entry), why));
      }
      out.emplace(entry);
      if (out.size() > kMaxCordonedGpus) {
        return absl::InvalidArgumentError(
            fmt::format("{}: more than {} GPUs", kDeviceCordonAnnotation, kMaxCordonedGpus));
      }
    }
    ++index;
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return out;
}

std::string EncodeDeviceCordon(const std::set<std::string>& uuids) {
  return fmt::format("{}", fmt::join(uuids, ","));
}

std::string CheckCordonReason(std::string_view reason) {
  if (reason.size() > kMaxCordonReason) {
    return fmt::format("{} characters (at most {})", reason.size(), kMaxCordonReason);
  }
  for (char c : reason) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return fmt::format("control character 0x{:02x}", u);
  }
  return "";
}

absl::StatusOr<std::map<std::string, std::string>> ParseCordonReasons(std::string_view value) {
  if (value.size() > kMaxCordonReasonsBytes) {
    return absl::InvalidArgumentError(fmt::format("{}: {} bytes (at most {})",
                                                  kDeviceCordonReasonsAnnotation, value.size(),
                                                  kMaxCordonReasonsBytes));
  }
  auto doc = internal::ParseJson(value, kDeviceCordonReasonsAnnotation);
  if (!doc.ok()) return doc.status();
  if (!doc->is_object()) {
    return absl::InvalidArgumentError(fmt::format("{}: must be a JSON object of GPU UUID to reason",
                                                  kDeviceCordonReasonsAnnotation));
  }
  if (doc->size() > kMaxCordonedGpus) {
    return absl::InvalidArgumentError(
        fmt::format("{}: more than {} GPUs", kDeviceCordonReasonsAnnotation, kMaxCordonedGpus));
  }
  std::map<std::string, std::string> out;
  for (const auto& [key, v] : doc->items()) {
    const std::string ctx = fmt::format("{}[\"{}\"]", kDeviceCordonReasonsAnnotation, Shown(key));
    if (std::string why = key.empty() ? "empty GPU UUID" : CheckUuid(key); !why.empty()) {
      return absl::InvalidArgumentError(fmt::format("{}: {}", ctx, why));
    }
    if (!v.is_string()) return absl::InvalidArgumentError(ctx + ": must be a string");
    const std::string reason = v.get<std::string>();
    if (std::string why = CheckCordonReason(reason); !why.empty()) {
      return absl::InvalidArgumentError(fmt::format("{}: {}", ctx, why));
    }
    out.emplace(key, reason);
  }
  return out;
}

std::string EncodeCordonReasons(const std::map<std::string, std::string>& reasons) {
  return nlohmann::json(reasons).dump();
}

}  // namespace dynmig::protocol
