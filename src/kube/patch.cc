#include "kube/patch.h"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>

namespace dynmig::kube {
namespace {

constexpr std::string_view kSetElementOrder = "$setElementOrder/";
constexpr std::string_view kDeleteFromPrimitiveList = "$deleteFromPrimitiveList/";

// Merge keys of the lists we merge element-wise (from the core/v1 types' patchMergeKey tags).
std::string_view MergeKeyFor(std::string_view field) {
  if (field == "containers" || field == "initContainers" || field == "ephemeralContainers" ||
      field == "volumes" || field == "env" || field == "imagePullSecrets" ||
      field == "resourceClaims" || field == "schedulingGates") {
    return "name";
  }
  if (field == "volumeMounts") return "mountPath";
  if (field == "volumeDevices") return "devicePath";
  if (field == "ports") return "containerPort";
  if (field == "conditions" || field == "addresses") return "type";
  if (field == "taints") return "key";
  if (field == "ownerReferences") return "uid";
  if (field == "hostAliases") return "ip";
  if (field == "topologySpreadConstraints") return "topologyKey";
  return "";
}

bool IsPrimitiveSetList(std::string_view field) { return field == "finalizers"; }

Object StripDirectives(const Object& value) {
  if (value.is_object()) {
    Object out = Object::object();
    for (const auto& [k, v] : value.items()) {
      if (!k.empty() && k[0] == '$') continue;
      out[k] = StripDirectives(v);
    }
    return out;
  }
  if (value.is_array()) {
    Object out = Object::array();
    for (const auto& v : value) {
      if (v.is_object() && v.contains("$patch")) continue;  // directive-only element
      out.push_back(StripDirectives(v));
    }
    return out;
  }
  return value;
}

Object StrategicMerge(const Object& original, const Object& patch);

Object MergeList(const Object& original, const Object& patch, std::string_view key) {
  // An element {"$patch": "replace"} replaces the whole list.
  for (const auto& p : patch) {
    if (p.is_object() && p.value("$patch", "") == "replace") return StripDirectives(patch);
  }
  Object out = original.is_array() ? original : Object::array();
  for (const auto& p : patch) {
    if (!p.is_object() || !p.contains(key)) {
      out.push_back(StripDirectives(p));
      continue;
    }
    const Object& id = p[std::string(key)];
    auto it = std::find_if(out.begin(), out.end(), [&](const Object& e) {
      return e.is_object() && e.contains(key) && e[std::string(key)] == id;
    });
    if (p.value("$patch", "") == "delete") {
      if (it != out.end()) out.erase(it);
      continue;
    }
    if (it == out.end()) {
      out.push_back(StripDirectives(p));
    } else {
      *it = StrategicMerge(*it, p);
    }
  }
  return out;
}

Object StrategicMerge(const Object& original, const Object& patch) {
  if (!patch.is_object()) return patch;
  const std::string directive = patch.value("$patch", "");
  if (directive == "replace") return StripDirectives(patch);
  if (directive == "delete") return Object(nullptr);
  Object result = original.is_object() ? original : Object::object();
  for (const auto& [key, value] : patch.items()) {
    std::string_view k = key;
    if (k == "$patch" || k == "$retainKeys" ||
        k.substr(0, kSetElementOrder.size()) == kSetElementOrder) {
      continue;
    }
    if (k.substr(0, kDeleteFromPrimitiveList.size()) == kDeleteFromPrimitiveList) {
      const std::string field(k.substr(kDeleteFromPrimitiveList.size()));
      if (result.contains(field) && result[field].is_array() && value.is_array()) {
        Object kept = Object::array();
        for (const auto& e : result[field]) {
          if (std::find(value.begin(), value.end(), e) == value.end()) kept.push_back(e);
        }
        result[field] = kept;
      }
      continue;
    }
    if (value.is_null()) {
      result.erase(key);
    } else if (value.is_object()) {
      Object merged = StrategicMerge(result.contains(key) ? result[key] : Object(nullptr), value);
      if (merged.is_null()) {
        result.erase(key);
      } else {
        result[key] = std::move(merged);
      }
    } else if (value.is_array()) {
      const std::string_view merge_key = MergeKeyFor(k);
      const bool all_objects =
          std::all_of(value.begin(), value.end(), [](const Object& e) { return e.is_object(); });
      if (!merge_key.empty() && all_objects) {
        result[key] =
            MergeList(result.contains(key) ? result[key] : Object(nullptr), value, merge_key);
      } else if (IsPrimitiveSetList(k)) {
        Object merged =
            result.contains(key) && result[key].is_array() ? result[key] : Object::array();
        for (const auto& e : value) {
          if (std::find(merged.begin(), merged.end(), e) == merged.end()) merged.push_back(e);
        }
        result[key] = merged;
      } else {
        result[key] = StripDirectives(value);
      }
    } else {
      result[key] = value;
    }
  }
  // $retainKeys: drop keys not listed (only those the directive covers).
  if (patch.contains("$retainKeys") && patch["$retainKeys"].is_array()) {
    const Object& keep = patch["$retainKeys"];
    for (auto it = result.begin(); it != result.end();) {
      if (std::find(keep.begin(), keep.end(), Object(it.key())) == keep.end()) {
        it = result.erase(it);
      } else {
        ++it;
      }
    }
  }
  return result;
}

}  // namespace

absl::StatusOr<Object> ApplyMergePatch(const Object& target, const Object& patch) {
  if (!patch.is_object()) {
    return absl::InvalidArgumentError(
        fmt::format("merge patch must be a JSON object, got {}", patch.type_name()));
  }
  Object result = target;
  result.merge_patch(patch);
  return result;
}

absl::StatusOr<Object> ApplyJsonPatch(const Object& target, const Object& patch) {
  if (!patch.is_array()) {
    return absl::InvalidArgumentError(
        fmt::format("JSON patch must be an array of operations, got {}", patch.type_name()));
  }
  try {
    return target.patch(patch);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("JSON patch failed: {}", e.what()));
  }
}

absl::StatusOr<Object> ApplyStrategicMergePatch(const Object& target, const Object& patch) {
  if (!patch.is_object()) {
    return absl::InvalidArgumentError(
        fmt::format("strategic merge patch must be a JSON object, got {}", patch.type_name()));
  }
  return StrategicMerge(target, patch);
}

absl::StatusOr<Object> ApplyPatch(const Object& target, const Object& patch, PatchType type) {
  switch (type) {
    case PatchType::kMerge:
      return ApplyMergePatch(target, patch);
    case PatchType::kStrategicMerge:
      return ApplyStrategicMergePatch(target, patch);
    case PatchType::kJson:
      return ApplyJsonPatch(target, patch);
  }
  return absl::InvalidArgumentError("unknown patch type");
}

}  // namespace dynmig::kube
