#include "protocol/idle_instances.h"

#include <algorithm>
#include <tuple>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "protocol/json_fields.h"

namespace dynmig::protocol {
namespace {

using internal::IntField;
using nlohmann::json;

}  // namespace

absl::StatusOr<std::vector<IdleInstance>> DecodeIdleInstances(std::string_view value) {
  auto doc = internal::ParseJsonArray(value, kNodeIdleInstancesAnnotation);
  if (!doc.ok()) return doc.status();
  std::vector<IdleInstance> out;
  for (size_t i = 0; i < doc->size(); ++i) {
    const json& e = (*doc)[i];
    const std::string ctx = fmt::format("{}[{}]", kNodeIdleInstancesAnnotation, i);
    if (!e.is_object()) {
      return absl::InvalidArgumentError(fmt::format("{}: must be an object", ctx));
    }
    IdleInstance idle;
    auto gpu = internal::RequiredStringField(e, "gpuUUID", ctx);
    if (!gpu.ok()) return gpu.status();
    idle.gpu_uuid = std::move(*gpu);
    auto profile = internal::RequiredStringField(e, "profile", ctx);
    if (!profile.ok()) return profile.status();
    idle.profile = std::move(*profile);
    auto placement = internal::SlicesField(e, "placement", ctx);
    if (!placement.ok()) return placement.status();
    idle.placement = *placement;
    auto since = IntField(e, "idleSince", ctx, 0, INT64_MAX);
    if (!since.ok()) return since.status();
    idle.idle_since = since->value_or(0);
    out.push_back(std::move(idle));
  }
  return out;
}

std::string EncodeIdleInstances(std::vector<IdleInstance> idle) {
  std::sort(idle.begin(), idle.end(), [](const IdleInstance& a, const IdleInstance& b) {
    return std::tie(a.gpu_uuid, a.placement.start, a.placement.size) <
           std::tie(b.gpu_uuid, b.placement.start, b.placement.size);
  });
  idle.erase(std::unique(idle.begin(), idle.end(),
                         [](const IdleInstance& a, const IdleInstance& b) {
                           return a.gpu_uuid == b.gpu_uuid && a.placement == b.placement;
                         }),
             idle.end());
  json out = json::array();
  for (const auto& i : idle) {
    out.push_back({{"gpuUUID", i.gpu_uuid},
                   {"profile", i.profile},
                   {"placement", {{"start", i.placement.start}, {"size", i.placement.size}}},
                   {"idleSince", i.idle_since}});
  }
  return out.dump();
}

}  // namespace dynmig::protocol
