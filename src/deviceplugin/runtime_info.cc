// The devices a container was given, read from its OCI spec (runtime_source.h declares them):
// parsers of runtime answers with no gRPC in them, so the fuzz build compiles them alone.
#include <algorithm>

#include "common/bounded_json.h"
#include "common/strings.h"
#include "deviceplugin/runtime_source.h"
#include "fmt/format.h"
#include "protocol/devices.h"

namespace dynmig::deviceplugin {

absl::StatusOr<std::vector<std::string>> ParseVisibleDevices(const std::vector<std::string>& env) {
  std::vector<std::string> out;
  const std::string prefix = std::string(protocol::kVisibleDevicesEnv) + "=";
  for (const auto& entry : env) {
    if (!entry.starts_with(prefix)) continue;
    const std::string_view value = std::string_view(entry).substr(prefix.size());
    if (value.size() > kVisibleDevicesMaxBytes) {
      return absl::InvalidArgumentError(
          fmt::format("{} is {} long, over the {} limit", protocol::kVisibleDevicesEnv,
                      FormatBytes(value.size()), FormatBytes(kVisibleDevicesMaxBytes)));
    }
    for (const std::string& part : SplitTrimmed(value, ',')) {
      if (part.empty() || part == "none" || part == "void") continue;
      if (part.starts_with("/")) {  // the toolkit's volume-mounts strategy: the list is elsewhere
        return absl::InvalidArgumentError(
            fmt::format("{} names a path ({}): the devices are mounted as files, not listed",
                        protocol::kVisibleDevicesEnv, part));
      }
      if (out.size() >= kVisibleDevicesMaxIds) {
        return absl::InvalidArgumentError(fmt::format(
            "{} names more than {} devices", protocol::kVisibleDevicesEnv, kVisibleDevicesMaxIds));
      }
      out.emplace_back(part);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

absl::StatusOr<std::vector<std::string>> DevicesFromInfo(std::string_view info_json) {
  auto info = ParseBoundedJson(info_json, kCriInfoJsonLimits, "the container's verbose info");
  if (!info.ok()) return info.status();
  if (!info->is_object()) {
    return absl::InvalidArgumentError("the container's verbose info is not a JSON object");
  }
  const nlohmann::json* env = nullptr;
  auto spec = info->find("runtimeSpec");
  if (spec != info->end() && spec->is_object()) {
    auto process = spec->find("process");
    if (process != spec->end() && process->is_object()) {
      auto e = process->find("env");
      if (e != process->end()) env = &*e;
    }
  }
  if (env == nullptr) return std::vector<std::string>{};  // no env at all: no devices
  if (!env->is_array()) {
    return absl::InvalidArgumentError("runtimeSpec.process.env is not a list");
  }
  std::vector<std::string> strings;
  strings.reserve(env->size());
  for (const auto& e : *env) {
    if (!e.is_string()) {
      return absl::InvalidArgumentError(
          "runtimeSpec.process.env holds a value that is not a string");
    }
    strings.push_back(e.get<std::string>());
  }
  return ParseVisibleDevices(strings);
}

}  // namespace dynmig::deviceplugin
