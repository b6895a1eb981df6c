#include "nvml/nvml.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <map>

#include "absl/strings/cord.h"
#include "fmt/format.h"
#include "fmt/ranges.h"

namespace dynmig::nvml {
namespace {

struct CodeEntry {
  NvmlReturn code;
  const char* name;  // without the NVML_ERROR_ prefix
  const char* description;
};

constexpr CodeEntry kCodes[] = {
    {NvmlReturn::kUninitialized, "UNINITIALIZED", "NVML was not initialized"},
    {NvmlReturn::kInvalidArgument, "INVALID_ARGUMENT", "a supplied argument is invalid"},
    {NvmlReturn::kNotSupported, "NOT_SUPPORTED", "not supported on this device"},
    {NvmlReturn::kNoPermission, "NO_PERMISSION", "insufficient permissions"},
    {NvmlReturn::kAlreadyInitialized, "ALREADY_INITIALIZED", "already initialized"},
    {NvmlReturn::kNotFound, "NOT_FOUND", "not found"},
    {NvmlReturn::kInsufficientSize, "INSUFFICIENT_SIZE", "buffer too small"},
    {NvmlReturn::kInsufficientPower, "INSUFFICIENT_POWER", "insufficient external power"},
    {NvmlReturn::kDriverNotLoaded, "DRIVER_NOT_LOADED", "NVIDIA driver is not loaded"},
    {NvmlReturn::kTimeout, "TIMEOUT", "timed out"},
    {NvmlReturn::kIrqIssue, "IRQ_ISSUE", "interrupt request issue"},
    {NvmlReturn::kLibraryNotFound, "LIBRARY_NOT_FOUND", "NVML shared library not found"},
    {NvmlReturn::kFunctionNotFound, "FUNCTION_NOT_FOUND", "function not found in the library"},
    {NvmlReturn::kCorruptedInforom, "CORRUPTED_INFOROM", "corrupted inforom"},
    {NvmlReturn::kGpuIsLost, "GPU_IS_LOST", "the GPU has fallen off the bus"},
    {NvmlReturn::kResetRequired, "RESET_REQUIRED", "GPU reset required"},
    {NvmlReturn::kOperatingSystem, "OPERATING_SYSTEM", "operating system call failed"},
    {NvmlReturn::kLibRmVersionMismatch, "LIB_RM_VERSION_MISMATCH",
     "NVML library and kernel driver versions differ"},
    {NvmlReturn::kInUse, "IN_USE", "in use by another client"},
    {NvmlReturn::kMemory, "MEMORY", "insufficient memory"},
    {NvmlReturn::kNoData, "NO_DATA", "no data"},
    {NvmlReturn::kVgpuEccNotEnabled, "VGPU_ECC_NOT_ENABLED", "vGPU ECC not enabled"},
    {NvmlReturn::kInsufficientResources, "INSUFFICIENT_RESOURCES", "insufficient resources"},
    {NvmlReturn::kFreqNotSupported, "FREQ_NOT_SUPPORTED", "frequency not supported"},
    {NvmlReturn::kArgumentVersionMismatch, "ARGUMENT_VERSION_MISMATCH", "struct version mismatch"},
    {NvmlReturn::kDeprecated, "DEPRECATED", "deprecated"},
    {NvmlReturn::kNotReady, "NOT_READY", "not ready"},
    {NvmlReturn::kGpuNotFound, "GPU_NOT_FOUND", "GPU not found"},
    {NvmlReturn::kInvalidState, "INVALID_STATE", "invalid state"},
    {NvmlReturn::kUnknown, "UNKNOWN", "unknown error"},
};

const CodeEntry* FindCode(NvmlReturn code) {
  for (const auto& e : kCodes) {
    if (e.code == code) return &e;
  }
  return nullptr;
}

constexpr char kPayloadUrl[] = "type.dynmig.io/nvml.return";

absl::StatusCode CanonicalCode(NvmlReturn code) {
  switch (code) {
    case NvmlReturn::kSuccess:
      return absl::StatusCode::kOk;
    case NvmlReturn::kInsufficientResources:
      return absl::StatusCode::kResourceExhausted;
    case NvmlReturn::kInUse:
      return absl::StatusCode::kFailedPrecondition;
    case NvmlReturn::kNotFound:
      return absl::StatusCode::kNotFound;
    case NvmlReturn::kNotSupported:
      return absl::StatusCode::kUnimplemented;
    case NvmlReturn::kNoPermission:
      return absl::StatusCode::kPermissionDenied;
    case NvmlReturn::kGpuIsLost:
      return absl::StatusCode::kUnavailable;
    case NvmlReturn::kInvalidArgument:
      return absl::StatusCode::kInvalidArgument;
    case NvmlReturn::kUninitialized:
    case NvmlReturn::kDriverNotLoaded:
    case NvmlReturn::kLibraryNotFound:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kUnknown;
  }
}

std::optional<int> ParseInt(std::string_view s) {
  int v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

std::string NvmlReturnName(NvmlReturn code) {
  if (code == NvmlReturn::kSuccess) return "NVML_SUCCESS";
  if (const auto* e = FindCode(code)) return std::string("NVML_ERROR_") + e->name;
  return fmt::format("NVML_ERROR_{}", static_cast<int>(code));
}

absl::StatusOr<NvmlReturn> ParseNvmlReturn(std::string_view text) {
  std::string upper;
  for (char c : text) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  std::string_view u = upper;
  if (auto n = ParseInt(u)) return static_cast<NvmlReturn>(*n);
  if (u == "SUCCESS" || u == "NVML_SUCCESS") return NvmlReturn::kSuccess;
  if (u.starts_with("NVML_ERROR_")) u.remove_prefix(11);
  for (const auto& e : kCodes) {
    if (u == e.name) return e.code;
  }
  std::vector<std::string> names;
  for (const auto& e : kCodes) names.emplace_back(e.name);
  return absl::InvalidArgumentError(
      fmt::format("unknown NVML return code \"{}\"; expected a number or one of {}", text,
                  fmt::join(names, ", ")));
}

absl::Status NvmlStatus(NvmlReturn code, std::string_view context) {
  if (code == NvmlReturn::kSuccess) return absl::OkStatus();
  const auto* e = FindCode(code);
  std::string message =
      e != nullptr ? fmt::format("{}: {} ({})", context, NvmlReturnName(code), e->description)
                   : fmt::format("{}: {}", context, NvmlReturnName(code));
  absl::Status status(CanonicalCode(code), message);
  status.SetPayload(kPayloadUrl, absl::Cord(std::to_string(static_cast<int>(code))));
  return status;
}

std::optional<NvmlReturn> NvmlReturnOf(const absl::Status& status) {
  if (status.ok()) return std::nullopt;
  if (auto payload = status.GetPayload(kPayloadUrl)) {
    if (auto n = ParseInt(std::string(*payload))) return static_cast<NvmlReturn>(*n);
  }
  const std::string message(status.message());
  size_t pos = message.find("NVML_ERROR_");
  if (pos == std::string::npos) return std::nullopt;
  pos += 11;
  size_t end = pos;
  while (end < message.size() &&
         (std::isupper(static_cast<unsigned char>(message[end])) ||
          std::isdigit(static_cast<unsigned char>(message[end])) || message[end] == '_')) {
    ++end;
  }
  auto parsed = ParseNvmlReturn(std::string_view(message).substr(pos, end - pos));
  if (!parsed.ok()) return std::nullopt;
  return *parsed;
}

std::string_view ProfileIndexSuffix(uint32_t profile_index) {
  switch (profile_index) {
    case 0x7:  // 1_SLICE_REV1
    case 0x8:  // 2_SLICE_REV1
      return "+me";
    case 0xA:   // 1_SLICE_GFX
    case 0xB:   // 2_SLICE_GFX
    case 0xC:   // 4_SLICE_GFX
    case 0x11:  // 3_SLICE_GFX
      return "+gfx";
    case 0xD:  // 1_SLICE_NO_ME
    case 0xE:  // 2_SLICE_NO_ME
      return "-me";
    case 0xF:   // 1_SLICE_ALL_ME
    case 0x10:  // 2_SLICE_ALL_ME
      return "+me.all";
    default:
      return "";
  }
}

std::string GpuInstanceProfileName(uint32_t profile_index, uint32_t slice_count,
                                   uint64_t memory_mib, uint64_t total_memory_bytes) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  uint64_t gb = 0;
  if (total_memory_bytes > 0) {
    double frac = static_cast<double>(memory_mib * kMiB) / static_cast<double>(total_memory_bytes);
    frac = std::ceil(frac * 8) / 8;
    const double total_gb = static_cast<double>((total_memory_bytes + kGiB - 1) / kGiB);
    gb = static_cast<uint64_t>(std::round(frac * total_gb));  // halves away from zero, like Go
  }
  return fmt::format("{}g.{}gb{}", slice_count, gb, ProfileIndexSuffix(profile_index));
}

absl::StatusOr<std::vector<mig::ProfileSpec>> DiscoverProfiles(Nvml& nvml, uint32_t gpu) {
  auto info = nvml.GetGpu(gpu);
  if (!info.ok()) return info.status();
  std::vector<mig::ProfileSpec> out;
  for (uint32_t index = 0; index < kGpuInstanceProfileCount; ++index) {
    auto p = nvml.GetGpuInstanceProfileInfo(gpu, index);
    if (!p.ok()) {
      const auto rc = NvmlReturnOf(p.status());
      if (rc == NvmlReturn::kInvalidArgument) break;
      if (rc == NvmlReturn::kNotSupported) continue;
      return p.status();
    }
    auto placements = nvml.GetGpuInstancePossiblePlacements(gpu, p->id);
    if (!placements.ok()) return placements.status();
    mig::ProfileSpec spec;
    spec.name =
        GpuInstanceProfileName(index, p->slice_count, p->memory_mib, info->total_memory_bytes);
    spec.nvml_index = index;
    spec.nvml_id = p->id;
    spec.memory_mib = p->memory_mib;
    spec.compute_slices = p->slice_count;
    spec.instance_count = p->instance_count;
    spec.multiprocessor_count = p->multiprocessor_count;
    spec.copy_engines = p->copy_engines;
    spec.decoders = p->decoders;
    spec.encoders = p->encoders;
    spec.jpegs = p->jpegs;
    spec.ofas = p->ofas;
    spec.placements = std::move(*placements);
    for (const auto& pl : spec.placements)
      spec.memory_slices = std::max(spec.memory_slices, pl.size);
    out.push_back(std::move(spec));
  }
  return out;
}

absl::StatusOr<mig::GpuCapability> DiscoverCapability(Nvml& nvml, uint32_t gpu) {
  auto info = nvml.GetGpu(gpu);
  if (!info.ok()) return info.status();
  auto profiles = DiscoverProfiles(nvml, gpu);
  if (!profiles.ok()) return profiles.status();
  if (profiles->empty()) {
    return NvmlStatus(
        NvmlReturn::kNotSupported,
        fmt::format("discover MIG profiles of GPU {} ({}): none supported", gpu, info->name));
  }
  mig::GpuCapability cap;
  cap.model = info->name;
  cap.total_memory_mib = info->total_memory_mib;
  uint32_t min_size = ~uint32_t{0};
  for (const auto& p : *profiles) {
    cap.compute_slices = std::max(cap.compute_slices, p.compute_slices);
    for (const auto& pl : p.placements) {
      cap.placement_units = std::max(cap.placement_units, pl.end());
      if (pl.size > 0) min_size = std::min(min_size, pl.size);
    }
  }
  cap.memory_slices = min_size == ~uint32_t{0} ? 0 : cap.placement_units / min_size;
  cap.profiles = std::move(*profiles);
  return cap;
}

}  // namespace dynmig::nvml
