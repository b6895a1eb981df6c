#include "protocol/gpu_mode.h"

#include <algorithm>

#include "common/status_macros.h"
#include "common/strings.h"
#include "fmt/format.h"
#include "protocol/annotations.h"

namespace dynmig::protocol {
namespace {

bool LabelAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

// A label name or value part: 1..63 of [A-Za-z0-9_.-], alphanumeric at both ends.
bool IsLabelNamePart(std::string_view s) {
  if (s.empty() || s.size() > 63 || !LabelAlnum(s.front()) || !LabelAlnum(s.back())) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return LabelAlnum(c) || c == '-' || c == '_' || c == '.'; });
}

// A DNS subdomain: dot-separated labels of [a-z0-9-], alphanumeric at both ends, <= 253 in all.
bool IsLabelPrefix(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  for (const std::string& part : SplitTrimmed(s, '.')) {
    if (part.empty() || part.size() > 63) return false;
    if (!LabelAlnum(part.front()) || !LabelAlnum(part.back())) return false;
    for (char c : part) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
    }
  }
  // SplitTrimmed drops empty pieces: "a..b" and ".a" must still fail.
  return s.front() != '.' && s.back() != '.' && s.find("..") == std::string_view::npos &&
         s.find(' ') == std::string_view::npos;
}

std::string ModeShown(std::string_view s) {
  constexpr size_t kShown = 80;
  if (s.size() <= kShown) return fmt::format("\"{}\"", s);
  return fmt::format("\"{}...\" ({} characters)", s.substr(0, kShown), s.size());
}

}  // namespace

std::string_view GpuModeName(GpuMode mode) {
  return mode == GpuMode::kMig ? kVgpuModeMig : kVgpuModeHamiCore;
}

std::optional<GpuMode> GpuModeFromName(std::string_view name) {
  if (name == kVgpuModeMig) return GpuMode::kMig;
  if (name == kVgpuModeHamiCore) return GpuMode::kWholeGpu;
  return std::nullopt;
}

bool MigModeSwitching::MaySwitch(
    std::string_view nvml_name,
    const std::map<std::string, std::string, std::less<>>& node_labels) const {
  if (!enabled) return false;
  if (rules.empty()) return true;
  for (const auto& rule : rules) {
    const bool model_ok =
        rule.models.empty() ||
        std::any_of(rule.models.begin(), rule.models.end(), [&](const std::string& m) {
          return nvml_name.find(m) != std::string_view::npos;
        });
    if (!model_ok) continue;
    const bool node_ok =
        std::all_of(rule.node_selector.begin(), rule.node_selector.end(), [&](const auto& kv) {
          auto it = node_labels.find(kv.first);
          return it != node_labels.end() && it->second == kv.second;
        });
    if (node_ok) return true;
  }
  return false;
}

absl::Status ValidateLabelKey(std::string_view key) {
  const size_t slash = key.find('/');
  std::string_view name = key;
  if (slash != std::string_view::npos) {
    const std::string_view prefix = key.substr(0, slash);
    name = key.substr(slash + 1);
    if (!IsLabelPrefix(prefix)) {
      return absl::InvalidArgumentError(
          fmt::format("label key {}: the prefix before '/' must be a DNS subdomain (lower-case "
                      "letters, digits, '-' and '.', at most 253 characters)",
                      ModeShown(key)));
    }
  }
  if (!IsLabelNamePart(name)) {
    return absl::InvalidArgumentError(
        fmt::format("label key {}: the name must be 1 to 63 letters, digits, '-', '_' or '.', "
                    "starting and ending with a letter or digit",
                    ModeShown(key)));
  }
  return absl::OkStatus();
}

absl::Status ValidateLabelValue(std::string_view value) {
  if (value.empty() || IsLabelNamePart(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      fmt::format("label value {}: must be empty or 1 to 63 letters, digits, '-', '_' or '.', "
                  "starting and ending with a letter or digit",
                  ModeShown(value)));
}

DeviceInfo WholeGpuDeviceInfo(const DeviceIdentity& identity, std::string_view nvml_name,
                              uint64_t total_memory_mib) {
  DeviceInfo d;
  d.id = identity.uuid;
  d.index = identity.index;
  d.count = 1;
  d.devmem_mib = total_memory_mib;
  d.devcore = 100;
  d.type = std::string(nvml_name);
  d.numa = identity.numa;
  d.mode = std::string(kVgpuModeHamiCore);
  d.health = identity.health;
  return d;
}

std::optional<GpuMode> DeviceGpuMode(const DeviceInfo& device) {
  if (device.mode == kVgpuModeMig) return GpuMode::kMig;
  if (device.mode == kVgpuModeHamiCore) return GpuMode::kWholeGpu;
  return std::nullopt;
}

uint32_t WholeGpuRequest::TotalGpus() const {
  uint32_t n = 0;
  for (const auto& c : containers) n += c.count;
  return n;
}

absl::StatusOr<std::optional<GpuMode>> PodGpuMode(const nlohmann::json& pod) {
  constexpr size_t kMaxModeLength = 64;
  const std::string raw = PodAnnotation(pod, kVgpuModeAnnotation);
  const std::string_view mode = Trim(raw);
  if (mode.size() > kMaxModeLength) {
    return absl::InvalidArgumentError(fmt::format(
        "annotation {}: {} is longer than {} characters (write \"{}\" or \"{}\")",
        kVgpuModeAnnotation, ModeShown(mode), kMaxModeLength, kVgpuModeMig, kVgpuModeHamiCore));
  }
  const bool mig = mode.find(kVgpuModeMig) != std::string_view::npos;
  const bool whole = mode.find(kVgpuModeHamiCore) != std::string_view::npos;
  if (mig && whole) {
    return absl::InvalidArgumentError(
        fmt::format("annotation {}: {} names both \"{}\" (a MIG instance) and \"{}\" (a whole "
                    "GPU); write one",
                    kVgpuModeAnnotation, ModeShown(mode), kVgpuModeMig, kVgpuModeHamiCore));
  }
  if (mode.empty() || mig) return std::optional<GpuMode>(GpuMode::kMig);
  if (mode == kVgpuModeHamiCore) return std::optional<GpuMode>(GpuMode::kWholeGpu);
  return std::optional<GpuMode>();
}

bool IsWholeGpuPod(const nlohmann::json& pod, const ResourceNames& names) {
  if (!RequestsGpuResources(pod, names)) return false;
  auto mode = PodGpuMode(pod);
  return mode.ok() && *mode == GpuMode::kWholeGpu;
}

absl::StatusOr<WholeGpuRequest> ParseWholeGpuRequest(const nlohmann::json& pod,
                                                     const ResourceNames& names) {
  DYNMIG_ASSIGN_OR_RETURN(const std::optional<GpuMode> mode, PodGpuMode(pod));
  if (mode != GpuMode::kWholeGpu) {
    return absl::InvalidArgumentError(fmt::format(
        "annotation {}: a whole-GPU pod sets it to \"{}\", got \"{}\"", kVgpuModeAnnotation,
        kVgpuModeHamiCore, std::string(Trim(PodAnnotation(pod, kVgpuModeAnnotation)))));
  }
  DYNMIG_ASSIGN_OR_RETURN(const mig::PodRequest parsed, ParsePodRequest(pod, names));
  WholeGpuRequest out;
  for (size_t i = 0; i < parsed.containers.size(); ++i) {
    const mig::ContainerRequest& c = parsed.containers[i];
    const std::string where = fmt::format("container \"{}\"", c.name);
    if (c.memory.mib == 0 && c.memory.percent != 0 && c.memory.percent != 100) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: {}: {} asks for a share of a GPU; a whole-GPU pod ({}: {}) gets the whole GPU: "
          "write 100 or leave it out (dynmig does not share GPUs through HAMi-core)",
          where, names.memory_percentage, c.memory.percent, kVgpuModeAnnotation,
          kVgpuModeHamiCore));
    }
    if (c.count > kMaxWholeGpusPerContainer) {
      return absl::InvalidArgumentError(
          fmt::format("{}: {}: {} whole GPUs; at most {} per container", where, names.count,
                      c.count, kMaxWholeGpusPerContainer));
    }
    out.containers.push_back(WholeGpuContainer{
        .name = c.name, .init = c.init, .count = c.count, .min_memory_mib = c.memory.mib});
  }
  if (out.TotalGpus() == 0) {
    return absl::InvalidArgumentError(
        fmt::format("annotation {}: \"{}\" but no container asks for {}", kVgpuModeAnnotation,
                    kVgpuModeHamiCore, names.count));
  }
  return out;
}

}  // namespace dynmig::protocol
