#include "protocol/node_register.h"

#include <algorithm>
#include <limits>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "common/strings.h"
#include "fmt/format.h"
#include "mig/catalogue.h"
#include "nlohmann/json.hpp"
#include "protocol/annotations.h"
#include "protocol/json_fields.h"

namespace dynmig::protocol {
namespace {

using internal::BoolField;
using internal::FieldPath;
using internal::IntField;
using internal::kUint32Max;
using internal::StringField;
using nlohmann::json;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

absl::StatusOr<mig::Placement> DecodePlacement(const json& p, const std::string& ctx) {
  if (!p.is_object()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: must be an object, got {}", ctx, p.type_name()));
  }
  DYNMIG_ASSIGN_OR_RETURN(auto start, IntField(p, "start", ctx, 0, mig::kMaxPlacementUnits - 1));
  DYNMIG_ASSIGN_OR_RETURN(auto size, IntField(p, "size", ctx, 0, mig::kMaxPlacementUnits));
  mig::Placement out{static_cast<uint32_t>(start.value_or(0)),
                     static_cast<uint32_t>(size.value_or(0))};
  if (out.end() > mig::kMaxPlacementUnits) {
    return absl::InvalidArgumentError(
        fmt::format("{}: {{start {}, size {}}} ends beyond the {}-unit placement axis", ctx,
                    out.start, out.size, mig::kMaxPlacementUnits));
  }
  return out;
}

absl::StatusOr<MigProfileInfo> DecodeProfile(const json& p, const std::string& ctx) {
  if (!p.is_object()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: must be an object, got {}", ctx, p.type_name()));
  }
  MigProfileInfo out;
  DYNMIG_ASSIGN_OR_RETURN(auto name, StringField(p, "name", ctx));
  if (!name || name->empty()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: is required and must not be empty", FieldPath(ctx, "name")));
  }
  out.name = std::move(*name);
  DYNMIG_ASSIGN_OR_RETURN(auto memory, IntField(p, "memoryMB", ctx, 0, kInt64Max));
  out.memory_mib = static_cast<uint64_t>(memory.value_or(0));
  DYNMIG_ASSIGN_OR_RETURN(auto core, IntField(p, "core", ctx, 0, kUint32Max));
  out.core = static_cast<uint32_t>(core.value_or(0));
  DYNMIG_ASSIGN_OR_RETURN(auto slices, IntField(p, "sliceCount", ctx, 0, kUint32Max));
  out.slice_count = static_cast<uint32_t>(slices.value_or(0));
  if (const json* placements = internal::FindField(p, "placements")) {
    const std::string pctx = FieldPath(ctx, "placements");
    if (!placements->is_array()) {
      return absl::InvalidArgumentError(
          fmt::format("{}: must be an array, got {}", pctx, placements->type_name()));
    }
    for (size_t k = 0; k < placements->size(); ++k) {
      DYNMIG_ASSIGN_OR_RETURN(auto pl,
                              DecodePlacement((*placements)[k], fmt::format("{}[{}]", pctx, k)));
      out.placements.push_back(pl);
    }
  }
  return out;
}

absl::StatusOr<DeviceInfo> DecodeDevice(const json& d, const std::string& ctx) {
  if (!d.is_object()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: must be an object, got {}", ctx, d.type_name()));
  }
  DeviceInfo out;
  DYNMIG_ASSIGN_OR_RETURN(auto id, StringField(d, "id", ctx));
  out.id = id.value_or("");
  DYNMIG_ASSIGN_OR_RETURN(auto index, IntField(d, "index", ctx, 0, kUint32Max));
  out.index = static_cast<uint32_t>(index.value_or(0));
  DYNMIG_ASSIGN_OR_RETURN(auto count, IntField(d, "count", ctx, 0, kInt32Max));
  out.count = static_cast<uint32_t>(count.value_or(0));
  DYNMIG_ASSIGN_OR_RETURN(auto devmem, IntField(d, "devmem", ctx, 0, kInt64Max));
  out.devmem_mib = static_cast<uint64_t>(devmem.value_or(0));
  DYNMIG_ASSIGN_OR_RETURN(auto devcore, IntField(d, "devcore", ctx, 0, kInt32Max));
  out.devcore = static_cast<uint32_t>(devcore.value_or(0));
  DYNMIG_ASSIGN_OR_RETURN(auto type, StringField(d, "type", ctx));
  out.type = type.value_or("");
  DYNMIG_ASSIGN_OR_RETURN(auto numa, IntField(d, "numa", ctx, kInt32Min, kInt32Max));
  out.numa = static_cast<int32_t>(numa.value_or(0));
  DYNMIG_ASSIGN_OR_RETURN(auto mode, StringField(d, "mode", ctx));
  out.mode = mode.value_or("");
  DYNMIG_ASSIGN_OR_RETURN(auto health, BoolField(d, "health", ctx));
  out.health = health.value_or(false);
  if (const json* profiles = internal::FindField(d, "migProfiles")) {
    const std::string pctx = FieldPath(ctx, "migProfiles");
    if (!profiles->is_array()) {
      return absl::InvalidArgumentError(
          fmt::format("{}: must be an array, got {}", pctx, profiles->type_name()));
    }
    for (size_t k = 0; k < profiles->size(); ++k) {
      DYNMIG_ASSIGN_OR_RETURN(auto p,
                              DecodeProfile((*profiles)[k], fmt::format("{}[{}]", pctx, k)));
      out.mig_profiles.push_back(std::move(p));
    }
  }
  out.legacy_mig_template = d.contains("migtemplate");
  return out;
}

nlohmann::ordered_json ProfileJson(const MigProfileInfo& p) {
  nlohmann::ordered_json j;
  j["name"] = p.name;
  j["memoryMB"] = p.memory_mib;
  j["core"] = p.core;
  j["sliceCount"] = p.slice_count;
  nlohmann::ordered_json placements = nlohmann::ordered_json::array();
  for (const auto& pl : p.placements) {
    nlohmann::ordered_json e;
    e["start"] = pl.start;
    e["size"] = pl.size;
    placements.push_back(std::move(e));
  }
  j["placements"] = std::move(placements);
  return j;
}

}  // namespace

absl::StatusOr<std::vector<DeviceInfo>> DecodeNodeRegister(std::string_view value) {
  std::vector<DeviceInfo> out;
  if (Trim(value).empty()) return out;
  DYNMIG_ASSIGN_OR_RETURN(json doc, internal::ParseJson(value, kNodeRegisterAnnotation));
  if (!doc.is_array()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: must be a JSON array, got {}", kNodeRegisterAnnotation, doc.type_name()));
  }
  for (size_t i = 0; i < doc.size(); ++i) {
    DYNMIG_ASSIGN_OR_RETURN(
        auto d, DecodeDevice(doc[i], fmt::format("{}[{}]", kNodeRegisterAnnotation, i)));
    out.push_back(std::move(d));
  }
  return out;
}

std::string EncodeMigProfile(const MigProfileInfo& profile) { return ProfileJson(profile).dump(); }

std::string EncodeNodeRegister(const std::vector<DeviceInfo>& devices) {
  nlohmann::ordered_json doc = nlohmann::ordered_json::array();
  for (const auto& d : devices) {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    if (!d.id.empty()) j["id"] = d.id;
    if (d.index != 0) j["index"] = d.index;
    if (d.count != 0) j["count"] = d.count;
    if (d.devmem_mib != 0) j["devmem"] = d.devmem_mib;
    if (d.devcore != 0) j["devcore"] = d.devcore;
    if (!d.type.empty()) j["type"] = d.type;
    if (d.numa != 0) j["numa"] = d.numa;
    if (!d.mode.empty()) j["mode"] = d.mode;
    if (d.health) j["health"] = true;
    if (!d.mig_profiles.empty()) {
      nlohmann::ordered_json profiles = nlohmann::ordered_json::array();
      for (const auto& p : d.mig_profiles) profiles.push_back(ProfileJson(p));
      j["migProfiles"] = std::move(profiles);
    }
    doc.push_back(std::move(j));
  }
  return doc.dump();
}

mig::GpuCapability ToCapability(const DeviceInfo& device) {
  mig::GpuCapability cap;
  cap.model = device.type;
  cap.total_memory_mib = device.devmem_mib;
  const mig::CatalogueModel* known = mig::FindModelByNvmlName(device.type);
  uint32_t max_slices = 0;
  for (const auto& info : device.mig_profiles) {
    mig::ProfileSpec p;
    p.name = info.name;
    p.memory_mib = info.memory_mib;
    p.compute_slices = info.slice_count;
    for (const auto& pl : info.placements) {
      if (pl.size == 0) continue;
      p.placements.push_back(pl);
      cap.placement_units = std::max(cap.placement_units, pl.end());
    }
    if (!p.placements.empty()) p.memory_slices = p.placements.front().size;
    p.instance_count = static_cast<uint32_t>(p.placements.size());
    const mig::ProfileSpec* ref = known ? known->capability.FindProfile(info.name) : nullptr;
    if (ref != nullptr && ref->compute_slices == info.slice_count) {
      p.nvml_index = ref->nvml_index;
      p.nvml_id = ref->nvml_id;
      p.instance_count = std::min(ref->instance_count, p.instance_count);
      p.multiprocessor_count = ref->multiprocessor_count;
      p.copy_engines = ref->copy_engines;
      p.decoders = ref->decoders;
      p.encoders = ref->encoders;
      p.jpegs = ref->jpegs;
      p.ofas = ref->ofas;
    }
    max_slices = std::max(max_slices, info.slice_count);
    cap.profiles.push_back(std::move(p));
  }
  if (known != nullptr) {
    cap.memory_slices = known->capability.memory_slices;
    cap.compute_slices = known->capability.compute_slices;
    cap.placement_units = std::max(cap.placement_units, known->capability.placement_units);
  } else {
    cap.memory_slices = cap.placement_units;
    cap.compute_slices = max_slices;
  }
  return cap;
}

uint32_t ProfileCore(const mig::GpuCapability& cap, const mig::ProfileSpec& profile) {
  uint32_t full_sm = 0;
  for (const auto& p : cap.profiles) full_sm = std::max(full_sm, p.multiprocessor_count);
  if (full_sm > 0 && profile.multiprocessor_count > 0) {
    return static_cast<uint32_t>((uint64_t{profile.multiprocessor_count} * 100 + full_sm - 1) /
                                 full_sm);
  }
  uint32_t full_slices = cap.compute_slices;
  for (const auto& p : cap.profiles) full_slices = std::max(full_slices, p.compute_slices);
  if (full_slices == 0) return 0;
  return static_cast<uint32_t>((uint64_t{profile.compute_slices} * 100 + full_slices - 1) /
                               full_slices);
}

DeviceInfo MigDeviceInfo(const DeviceIdentity& identity, const mig::GpuCapability& cap,
                         const std::vector<const mig::ProfileSpec*>& allowed) {
  DeviceInfo d;
  d.id = identity.uuid;
  d.index = identity.index;
  d.numa = identity.numa;
  d.health = identity.health;
  d.type = cap.model;
  d.mode = std::string(kVgpuModeMig);
  d.devcore = 100;
  d.devmem_mib = cap.total_memory_mib;
  for (const mig::ProfileSpec* p : allowed) {
    if (p == nullptr) continue;
    d.count = std::max(d.count, p->instance_count);
    d.mig_profiles.push_back(MigProfileInfo{p->name, p->memory_mib, ProfileCore(cap, *p),
                                            p->compute_slices, p->placements});
  }
  return d;
}

std::optional<std::string> LegacyFormatReason(const DeviceInfo& device) {
  if (device.legacy_mig_template) {
    return std::string(
        "carries the legacy \"migtemplate\" field (a pre-dynamic-MIG device plugin)");
  }
  if (device.mode == kVgpuModeMig && device.mig_profiles.empty()) {
    return std::string(
        "is in MIG mode but publishes no migProfiles (a legacy device plugin, or no allowlisted "
        "profile was discovered)");
  }
  return std::nullopt;
}

std::vector<std::string> DetectLegacyNodeRegister(std::string_view value) {
  std::vector<std::string> out;
  if (Trim(value).empty()) return out;
  auto decoded = DecodeNodeRegister(value);
  if (!decoded.ok()) {
    const std::string_view trimmed = Trim(value);
    if (trimmed.front() != '[') {
      out.push_back(
          "the annotation is not JSON: the legacy colon-separated device list "
          "(UUID,count,mem,cores,type,numa,health:)");
    } else {
      out.push_back(fmt::format("the annotation cannot be decoded: {}",
                                std::string(decoded.status().message())));
    }
    return out;
  }
  for (size_t i = 0; i < decoded->size(); ++i) {
    const DeviceInfo& d = (*decoded)[i];
    if (auto reason = LegacyFormatReason(d)) {
      out.push_back(fmt::format("device {} ({}) {}", i, d.id.empty() ? "no id" : d.id, *reason));
    }
  }
  return out;
}

}  // namespace dynmig::protocol
