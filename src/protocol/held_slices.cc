#include "protocol/held_slices.h"

#include <algorithm>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "protocol/json_fields.h"

namespace dynmig::protocol {
namespace {

using internal::StringField;
using nlohmann::json;

}  // namespace

absl::StatusOr<std::vector<HeldSlices>> DecodeHeldSlices(std::string_view value) {
  auto doc = internal::ParseJsonArray(value, kNodeHeldSlicesAnnotation);
  if (!doc.ok()) return doc.status();
  std::vector<HeldSlices> out;
  for (size_t i = 0; i < doc->size(); ++i) {
    const json& e = (*doc)[i];
    const std::string ctx = fmt::format("{}[{}]", kNodeHeldSlicesAnnotation, i);
    if (!e.is_object()) {
      return absl::InvalidArgumentError(fmt::format("{}: must be an object", ctx));
    }
    HeldSlices h;
    auto gpu = internal::RequiredStringField(e, "gpuUUID", ctx);
    if (!gpu.ok()) return gpu.status();
    h.gpu_uuid = std::move(*gpu);
    auto placement = internal::SlicesField(e, "placement", ctx);
    if (!placement.ok()) return placement.status();
    h.placement = *placement;
    auto profile = StringField(e, "profile", ctx);
    if (!profile.ok()) return profile.status();
    h.profile = profile->value_or("");
    auto reason = StringField(e, "reason", ctx);
    if (!reason.ok()) return reason.status();
    h.reason = reason->value_or("");
    out.push_back(std::move(h));
  }
  return out;
}

std::string EncodeHeldSlices(std::vector<HeldSlices> held) {
  std::sort(held.begin(), held.end(), [](const HeldSlices& a, const HeldSlices& b) {
    return std::tie(a.gpu_uuid, a.placement.start, a.placement.size) <
           std::tie(b.gpu_uuid, b.placement.start, b.placement.size);
  });
  held.erase(std::unique(held.begin(), held.end(),
                         [](const HeldSlices& a, const HeldSlices& b) {
                           return a.gpu_uuid == b.gpu_uuid && a.placement == b.placement;
                         }),
             held.end());
  json out = json::array();
  for (const auto& h : held) {
    json e = {{"gpuUUID", h.gpu_uuid},
              {"placement", {{"start", h.placement.start}, {"size", h.placement.size}}},
              {"reason", h.reason}};
    if (!h.profile.empty()) e["profile"] = h.profile;
    out.push_back(std::move(e));
  }
  return out.dump();
}

}  // namespace dynmig::protocol
