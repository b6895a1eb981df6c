#include "protocol/devices.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>

#include "absl/status/status.h"
#include "fmt/format.h"
#include "protocol/annotations.h"

namespace dynmig::protocol {
namespace {

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  while (true) {
    const size_t pos = s.find(sep);
    out.push_back(s.substr(0, pos));
    if (pos == std::string_view::npos) break;
    s.remove_prefix(pos + 1);
  }
  return out;
}

bool ParseInt32(std::string_view s, int32_t& out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && ptr == end;
}

bool ParseUint32(std::string_view s, uint32_t& out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && ptr == end;
}

absl::Status DeviceError(size_t container, size_t device, std::string_view what) {
  return absl::InvalidArgumentError(
      fmt::format("container {} device {}: {}", container, device, what));
}

}  // namespace

absl::StatusOr<PodDevices> DecodePodDevices(std::string_view value) {
  PodDevices out;
  if (value.empty()) return out;
  std::vector<std::string_view> containers = Split(value, ';');
  // Every container ends in ';', so the last piece is empty; a value without the final ';' is
  // accepted too.
  if (containers.back().empty()) containers.pop_back();
  for (size_t c = 0; c < containers.size(); ++c) {
    ContainerDevices devices;
    std::vector<std::string_view> pieces = Split(containers[c], ':');
    if (pieces.back().empty()) pieces.pop_back();
    for (size_t d = 0; d < pieces.size(); ++d) {
      std::vector<std::string_view> fields = Split(pieces[d], ',');
      if (fields.size() != 4) {
        return DeviceError(c, d,
                           fmt::format("\"{}\" has {} comma-separated field(s), want 4 "
                                       "(UUID,Type,Usedmem,Usedcores)",
                                       pieces[d], fields.size()));
      }
      ContainerDevice dev;
      if (fields[0].empty()) return DeviceError(c, d, "UUID is empty");
      dev.uuid = std::string(fields[0]);
      dev.type = std::string(fields[1]);
      if (!ParseInt32(fields[2], dev.used_mem_mib) || dev.used_mem_mib < 0) {
        return DeviceError(c, d,
                           fmt::format("Usedmem \"{}\" is not a non-negative integer", fields[2]));
      }
      if (!ParseInt32(fields[3], dev.used_cores) || dev.used_cores < 0) {
        return DeviceError(
            c, d, fmt::format("Usedcores \"{}\" is not a non-negative integer", fields[3]));
      }
      devices.push_back(std::move(dev));
    }
    out.push_back(std::move(devices));
  }
  return out;
}

absl::StatusOr<std::string> EncodePodDevices(const PodDevices& devices) {
  std::string out;
  for (size_t c = 0; c < devices.size(); ++c) {
    for (size_t d = 0; d < devices[c].size(); ++d) {
      const ContainerDevice& dev = devices[c][d];
      if (dev.uuid.empty()) return DeviceError(c, d, "UUID is empty");
      if (dev.uuid.find_first_of(",:;") != std::string::npos) {
        return DeviceError(
            c, d, fmt::format("UUID \"{}\" contains a separator (',', ':' or ';')", dev.uuid));
      }
      if (dev.type.find_first_of(",:;") != std::string::npos) {
        return DeviceError(
            c, d, fmt::format("type \"{}\" contains a separator (',', ':' or ';')", dev.type));
      }
      if (dev.used_mem_mib < 0 || dev.used_cores < 0) {
        return DeviceError(c, d, "Usedmem and Usedcores must not be negative");
      }
      out += fmt::format("{},{},{},{}:", dev.uuid, dev.type, dev.used_mem_mib, dev.used_cores);
    }
    out += ';';
  }
  return out;
}

std::optional<LegacyMigIdentity> ParseLegacyMigIdentity(std::string_view id) {
  if (id.size() < 5 || id.back() != ']') return std::nullopt;
  const size_t open = id.rfind('[');
  if (open == std::string_view::npos || open == 0) return std::nullopt;
  std::string_view inner = id.substr(open + 1, id.size() - open - 2);
  const size_t dash = inner.find('-');
  if (dash == std::string_view::npos) return std::nullopt;
  LegacyMigIdentity out;
  if (!ParseUint32(inner.substr(0, dash), out.template_index) ||
      !ParseUint32(inner.substr(dash + 1), out.slot_index)) {
    return std::nullopt;
  }
  out.gpu_uuid = std::string(id.substr(0, open));
  return out;
}

bool IsLegacyMigIdentity(std::string_view id) { return ParseLegacyMigIdentity(id).has_value(); }

std::vector<std::string> GpuUuidsNamedIn(std::string_view text) {
  std::vector<std::string> out;
  auto token_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-'; };
  size_t i = 0;
  while ((i = text.find("GPU-", i)) != std::string_view::npos) {
    if (i > 0 && token_char(text[i - 1])) {
      i += 4;
      continue;
    }
    size_t end = i + 4;
    while (end < text.size() && token_char(text[end])) ++end;
    std::string uuid(text.substr(i, end - i));
    if (std::find(out.begin(), out.end(), uuid) == out.end()) out.push_back(std::move(uuid));
    i = end;
  }
  return out;
}

std::optional<std::string> MigResourceName(std::string_view profile) {
  std::string name = std::string(kMigResourcePrefix) + std::string(profile);
  const std::string_view suffix = std::string_view(name).substr(name.find('/') + 1);
  auto alnum = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  if (profile.empty() || suffix.size() > 63 || !alnum(suffix.back()) ||
      !std::all_of(suffix.begin(), suffix.end(),
                   [&](char c) { return alnum(c) || c == '-' || c == '_' || c == '.'; })) {
    return std::nullopt;
  }
  return name;
}

std::optional<std::string> MigResourceProfile(std::string_view resource) {
  if (!resource.starts_with(kMigResourcePrefix) || resource.size() == kMigResourcePrefix.size()) {
    return std::nullopt;
  }
  return std::string(resource.substr(kMigResourcePrefix.size()));
}

}  // namespace dynmig::protocol
