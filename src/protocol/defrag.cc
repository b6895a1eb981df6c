#include "protocol/defrag.h"

#include <algorithm>
#include <tuple>

#include "common/strings.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "protocol/json_fields.h"

namespace dynmig::protocol {
namespace {

using nlohmann::json;

constexpr size_t kMaxShownValue = 64;
constexpr size_t kMaxPodKey = 253 + 1 + 63;  // namespace (DNS label, 63) / name (253)

// "namespace/name", each part non-empty, bounded.
absl::Status CheckPodKey(const std::string& key, const std::string& ctx) {
  const size_t slash = key.find('/');
  if (key.size() > kMaxPodKey || slash == std::string::npos || slash == 0 ||
      slash + 1 == key.size() || key.find('/', slash + 1) != std::string::npos) {
    return absl::InvalidArgumentError(
        fmt::format("{}: must be namespace/name of at most {} bytes", ctx, kMaxPodKey));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DefragPolicy> ParseDefragPolicy(std::string_view value) {
  const std::string_view v = TrimBlanks(value);
  if (v == kDefragAllow) return DefragPolicy::kAllow;
  if (v == kDefragNever) return DefragPolicy::kNever;
  const bool cut = value.size() > kMaxShownValue;
  return absl::InvalidArgumentError(
      fmt::format("{}: \"{}{}\" is not one of \"{}\" or \"{}\"", kDefragPodAnnotation,
                  value.substr(0, kMaxShownValue), cut ? "..." : "", kDefragAllow, kDefragNever));
}

absl::StatusOr<std::vector<DefragReservation>> DecodeDefragReservations(std::string_view value) {
  auto doc = internal::ParseJsonArray(value, kNodeDefragReservationAnnotation);
  if (!doc.ok()) return doc.status();
  if (doc->size() > kMaxDefragReservations) {
    return absl::InvalidArgumentError(fmt::format("{}: {} entries, at most {}",
                                                  kNodeDefragReservationAnnotation, doc->size(),
                                                  kMaxDefragReservations));
  }
  std::vector<DefragReservation> out;
  for (size_t i = 0; i < doc->size(); ++i) {
    const json& e = (*doc)[i];
    const std::string ctx = fmt::format("{}[{}]", kNodeDefragReservationAnnotation, i);
    if (!e.is_object()) return absl::InvalidArgumentError(ctx + ": must be an object");
    DefragReservation r;
    auto gpu = internal::RequiredStringField(e, "gpuUUID", ctx);
    if (!gpu.ok()) return gpu.status();
    r.gpu_uuid = std::move(*gpu);
    auto placement = internal::SlicesField(e, "placement", ctx);
    if (!placement.ok()) return placement.status();
    r.placement = *placement;
    auto profile = internal::RequiredStringField(e, "profile", ctx);
    if (!profile.ok()) return profile.status();
    r.profile = std::move(*profile);
    auto pod = internal::RequiredStringField(e, "pod", ctx);
    if (!pod.ok()) return pod.status();
    if (auto s = CheckPodKey(*pod, ctx + ".pod"); !s.ok()) return s;
    r.pod = std::move(*pod);
    auto uid = internal::StringField(e, "podUID", ctx);
    if (!uid.ok()) return uid.status();
    r.pod_uid = uid->value_or("");
    auto created = internal::IntField(e, "created", ctx, 0, int64_t{1} << 40);
    if (!created.ok()) return created.status();
    r.created = created->value_or(0);
    auto expires = internal::IntField(e, "expires", ctx, 0, int64_t{1} << 40);
    if (!expires.ok()) return expires.status();
    if (!expires->has_value()) return absl::InvalidArgumentError(ctx + ".expires: missing");
    r.expires = **expires;
    if (r.expires <= r.created) {
      return absl::InvalidArgumentError(ctx + ".expires: must be after created");
    }
    if (const json* ev = internal::FindField(e, "evicted")) {
      if (!ev->is_array()) return absl::InvalidArgumentError(ctx + ".evicted: must be an array");
      if (ev->size() > kMaxDefragEvicted) {
        return absl::InvalidArgumentError(
            fmt::format("{}.evicted: {} pods, at most {}", ctx, ev->size(), kMaxDefragEvicted));
      }
      for (size_t k = 0; k < ev->size(); ++k) {
        const std::string ectx = fmt::format("{}.evicted[{}]", ctx, k);
        if (!(*ev)[k].is_string()) return absl::InvalidArgumentError(ectx + ": must be a string");
        std::string key = (*ev)[k].get<std::string>();
        if (auto s = CheckPodKey(key, ectx); !s.ok()) return s;
        r.evicted.push_back(std::move(key));
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::string EncodeDefragReservations(std::vector<DefragReservation> reservations) {
  std::sort(reservations.begin(), reservations.end(),
            [](const DefragReservation& a, const DefragReservation& b) {
              return std::tie(a.gpu_uuid, a.placement.start, a.pod) <
                     std::tie(b.gpu_uuid, b.placement.start, b.pod);
            });
  json out = json::array();
  for (const auto& r : reservations) {
    out.push_back({{"gpuUUID", r.gpu_uuid},
                   {"placement", {{"start", r.placement.start}, {"size", r.placement.size}}},
                   {"profile", r.profile},
                   {"pod", r.pod},
                   {"podUID", r.pod_uid},
                   {"created", r.created},
                   {"expires", r.expires},
                   {"evicted", r.evicted}});
  }
  return out.dump();
}

}  // namespace dynmig::protocol
