#include "protocol/mig_allocations.h"

#include <limits>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "mig/profile.h"
#include "nlohmann/json.hpp"
#include "protocol/annotations.h"
#include "protocol/json_fields.h"

namespace dynmig::protocol {
namespace {

using internal::FieldPath;
using internal::IntField;
using internal::kUint32Max;
using internal::StringField;
using nlohmann::json;

constexpr int64_t kIntMax = std::numeric_limits<int>::max();

absl::Status Missing(std::string_view context, std::string_view key, std::string_view what) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", FieldPath(context, key), what));
}

absl::StatusOr<MigAllocation> DecodeEntry(const json& entry, const std::string& ctx) {
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: must be an object, got {}", ctx, entry.type_name()));
  }
  MigAllocation a;
  DYNMIG_ASSIGN_OR_RETURN(auto container, IntField(entry, "containerIndex", ctx, 0, kIntMax));
  if (!container) return Missing(ctx, "containerIndex", "is required");
  a.container_index = static_cast<int>(*container);
  DYNMIG_ASSIGN_OR_RETURN(auto device, IntField(entry, "deviceIndex", ctx, 0, kIntMax));
  if (!device) return Missing(ctx, "deviceIndex", "is required");
  a.device_index = static_cast<int>(*device);

  DYNMIG_ASSIGN_OR_RETURN(auto gpu, StringField(entry, "gpuUUID", ctx));
  if (!gpu || gpu->empty()) return Missing(ctx, "gpuUUID", "is required and must not be empty");
  a.gpu_uuid = std::move(*gpu);

  DYNMIG_ASSIGN_OR_RETURN(auto profile, StringField(entry, "profile", ctx));
  if (!profile || profile->empty()) {
    return Missing(ctx, "profile", "is required and must not be empty");
  }
  if (auto parsed = mig::ParseProfileName(*profile); !parsed.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: {}", FieldPath(ctx, "profile"), std::string(parsed.status().message())));
  }
  a.profile = std::move(*profile);

  const json* placement = internal::FindField(entry, "placement");
  const std::string pctx = FieldPath(ctx, "placement");
  if (placement == nullptr) return Missing(ctx, "placement", "is required");
  if (!placement->is_object()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: must be an object, got {}", pctx, placement->type_name()));
  }
  DYNMIG_ASSIGN_OR_RETURN(auto start,
                          IntField(*placement, "start", pctx, 0, mig::kMaxPlacementUnits - 1));
  DYNMIG_ASSIGN_OR_RETURN(auto size,
                          IntField(*placement, "size", pctx, 0, mig::kMaxPlacementUnits));
  if (!size || *size == 0) return Missing(pctx, "size", "must be greater than 0");
  a.placement.start = static_cast<uint32_t>(start.value_or(0));
  a.placement.size = static_cast<uint32_t>(*size);
  if (a.placement.end() > mig::kMaxPlacementUnits) {
    return absl::InvalidArgumentError(
        fmt::format("{}: {{start {}, size {}}} ends beyond the {}-unit placement axis", pctx,
                    a.placement.start, a.placement.size, mig::kMaxPlacementUnits));
  }

  DYNMIG_ASSIGN_OR_RETURN(auto mig_uuid, StringField(entry, "migUUID", ctx));
  DYNMIG_ASSIGN_OR_RETURN(auto gi, IntField(entry, "gpuInstanceID", ctx, 0, kUint32Max));
  DYNMIG_ASSIGN_OR_RETURN(auto ci, IntField(entry, "computeInstanceID", ctx, 0, kUint32Max));
  const bool has_uuid = mig_uuid.has_value() && !mig_uuid->empty();
  std::vector<std::string> present;
  std::vector<std::string> missing;
  (has_uuid ? present : missing).push_back("migUUID");
  (gi ? present : missing).push_back("gpuInstanceID");
  (ci ? present : missing).push_back("computeInstanceID");
  if (!present.empty() && !missing.empty()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: partial runtime identity: has {}, missing {} (all three or none)", ctx,
                    fmt::join(present, ", "), fmt::join(missing, ", ")));
  }
  if (has_uuid) {
    a.runtime = RuntimeIdentity{std::move(*mig_uuid), static_cast<uint32_t>(*gi),
                                static_cast<uint32_t>(*ci)};
  }
  return a;
}

}  // namespace

absl::StatusOr<std::vector<MigAllocation>> DecodeMigAllocations(std::string_view value) {
  std::vector<MigAllocation> out;
  if (value.empty()) return out;
  DYNMIG_ASSIGN_OR_RETURN(json doc, internal::ParseJson(value, kMigAllocationsAnnotation));
  if (!doc.is_array()) {
    return absl::InvalidArgumentError(fmt::format("{}: must be a JSON array, got {}",
                                                  kMigAllocationsAnnotation, doc.type_name()));
  }
  std::set<std::pair<int, int>> seen;
  out.reserve(doc.size());
  for (size_t i = 0; i < doc.size(); ++i) {
    const std::string ctx = fmt::format("{}[{}]", kMigAllocationsAnnotation, i);
    DYNMIG_ASSIGN_OR_RETURN(MigAllocation a, DecodeEntry(doc[i], ctx));
    if (!seen.insert({a.container_index, a.device_index}).second) {
      return absl::InvalidArgumentError(
          fmt::format("{}: duplicate allocation for containerIndex {} deviceIndex {}", ctx,
                      a.container_index, a.device_index));
    }
    out.push_back(std::move(a));
  }
  return out;
}

ReferencedGpuSet ReferencedGpus(std::string_view value) {
  ReferencedGpuSet out;
  auto doc = internal::ParseJsonArray(value, kMigAllocationsAnnotation);
  if (!doc.ok()) {
    out.complete = false;
    return out;
  }
  for (const json& e : *doc) {
    const json* uuid = e.is_object() ? internal::FindField(e, "gpuUUID") : nullptr;
    if (uuid != nullptr && uuid->is_string()) {
      out.gpu_uuids.insert(uuid->get<std::string>());
    } else {
      out.complete = false;
    }
  }
  return out;
}

std::string EncodeMigAllocations(const std::vector<MigAllocation>& allocations) {
  nlohmann::ordered_json doc = nlohmann::ordered_json::array();
  for (const auto& a : allocations) {
    nlohmann::ordered_json e;
    e["containerIndex"] = a.container_index;
    e["deviceIndex"] = a.device_index;
    e["gpuUUID"] = a.gpu_uuid;
    e["profile"] = a.profile;
    e["placement"] = {{"start", a.placement.start}, {"size", a.placement.size}};
    if (a.runtime) {
      e["migUUID"] = a.runtime->mig_uuid;
      e["gpuInstanceID"] = a.runtime->gpu_instance_id;
      e["computeInstanceID"] = a.runtime->compute_instance_id;
    }
    doc.push_back(std::move(e));
  }
  return doc.dump();
}

}  // namespace dynmig::protocol
