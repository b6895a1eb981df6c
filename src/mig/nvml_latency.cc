#include "mig/nvml_latency.h"

#include <vector>

#include "common/strings.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "mig/catalogue.h"

namespace dynmig::mig {
namespace {

std::string Text(absl::Duration d) { return absl::FormatDuration(d); }

std::optional<size_t> OpIndex(std::string_view name) {
  for (size_t i = 0; i < kNvmlOpCount; ++i) {
    if (kNvmlOpNames[i] == name) return i;
  }
  return std::nullopt;
}

}  // namespace

absl::Duration NvmlLatency::Of(NvmlOp op, std::string_view model) const {
  const auto i = static_cast<size_t>(op);
  if (auto it = by_model.find(model); it != by_model.end() && it->second[i].has_value()) {
    return *it->second[i];
  }
  return all[i];
}

bool NvmlLatency::IsZero() const {
  for (const auto& d : all) {
    if (d != absl::ZeroDuration()) return false;
  }
  for (const auto& [model, ops] : by_model) {
    for (const auto& d : ops) {
      if (d.has_value() && *d != absl::ZeroDuration()) return false;
    }
  }
  return true;
}

std::string NvmlLatency::ToString() const {
  if (IsZero()) return "none";
  std::vector<std::string> items;
  for (size_t i = 0; i < kNvmlOpCount; ++i) {
    if (all[i] != absl::ZeroDuration())
      items.push_back(fmt::format("{}={}", kNvmlOpNames[i], Text(all[i])));
  }
  for (const auto& [model, ops] : by_model) {
    for (size_t i = 0; i < kNvmlOpCount; ++i) {
      if (ops[i].has_value())
        items.push_back(fmt::format("{}:{}={}", model, kNvmlOpNames[i], Text(*ops[i])));
    }
  }
  return fmt::format("{}", fmt::join(items, ","));
}

NvmlLatency RealisticNvmlLatency() {
  NvmlLatency l;
  l.all[static_cast<size_t>(NvmlOp::kCreateGpuInstance)] = absl::Seconds(1);
  l.all[static_cast<size_t>(NvmlOp::kCreateComputeInstance)] = absl::Milliseconds(500);
  l.all[static_cast<size_t>(NvmlOp::kDestroyComputeInstance)] = absl::Milliseconds(200);
  l.all[static_cast<size_t>(NvmlOp::kDestroyGpuInstance)] = absl::Milliseconds(300);
  l.all[static_cast<size_t>(NvmlOp::kSetMigMode)] = absl::Seconds(2);
  l.all[static_cast<size_t>(NvmlOp::kResetGpu)] = absl::Seconds(10);
  return l;
}

absl::StatusOr<NvmlLatency> ParseNvmlLatency(std::string_view text) {
  NvmlLatency out;
  const std::vector<std::string> items = SplitTrimmed(text, ',');
  if (items.empty()) {
    return absl::InvalidArgumentError(
        "NVML latency: empty (give \"none\", \"realistic\" or OP=DURATION items, e.g. "
        "create-gi=250ms)");
  }
  for (const std::string& item : items) {
    if (item == "none" || item == "0") {
      out = NvmlLatency{};
      continue;
    }
    if (item == "realistic") {
      out = RealisticNvmlLatency();
      continue;
    }
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(
          fmt::format("NVML latency: \"{}\" is not none, realistic or [MODEL:]OP=DURATION", item));
    }
    std::string_view left = Trim(std::string_view(item).substr(0, eq));
    const std::string_view value = Trim(std::string_view(item).substr(eq + 1));
    std::string model;
    if (const size_t colon = left.rfind(':'); colon != std::string_view::npos) {
      auto found = FindModel(Trim(left.substr(0, colon)));
      if (!found.ok()) {
        return absl::InvalidArgumentError(
            fmt::format("NVML latency: \"{}\": {}", item, std::string(found.status().message())));
      }
      model = (*found)->capability.model;
      left = Trim(left.substr(colon + 1));
    }
    const auto op = OpIndex(left);
    if (!op) {
      return absl::InvalidArgumentError(
          fmt::format("NVML latency: \"{}\": unknown operation \"{}\" (known: {})", item, left,
                      fmt::join(kNvmlOpNames, ", ")));
    }
    absl::Duration d;
    if (!absl::ParseDuration(std::string(value), &d) || d < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(fmt::format(
          "NVML latency: \"{}\": \"{}\" is not a duration >= 0 (e.g. 250ms, 1.5s)", item, value));
    }
    if (model.empty()) {
      out.all[*op] = d;
    } else {
      out.by_model[model][*op] = d;
    }
  }
  return out;
}

}  // namespace dynmig::mig
