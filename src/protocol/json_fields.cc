#include "protocol/json_fields.h"

#include "absl/status/status.h"
#include "common/bounded_json.h"
#include "fmt/format.h"

namespace dynmig::protocol::internal {

const nlohmann::json* FindField(const nlohmann::json& obj, std::string_view key) {
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string FieldPath(std::string_view context, std::string_view key) {
  if (context.empty()) return std::string(key);
  return fmt::format("{}.{}", context, key);
}

absl::StatusOr<std::optional<int64_t>> IntField(const nlohmann::json& obj, std::string_view key,
                                                std::string_view context, int64_t min,
                                                int64_t max) {
  const nlohmann::json* v = FindField(obj, key);
  if (v == nullptr) return std::optional<int64_t>();
  if (!v->is_number_integer()) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: must be an integer, got {} {}", FieldPath(context, key), v->type_name(), v->dump()));
  }
  int64_t value = 0;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(max)) {
      return absl::InvalidArgumentError(
          fmt::format("{}: {} is out of range [{}, {}]", FieldPath(context, key), u, min, max));
    }
    value = static_cast<int64_t>(u);
  } else {
    value = v->get<int64_t>();
  }
  if (value < min || value > max) {
    return absl::InvalidArgumentError(
        fmt::format("{}: {} is out of range [{}, {}]", FieldPath(context, key), value, min, max));
  }
  return std::optional<int64_t>(value);
}

absl::StatusOr<std::optional<std::string>> StringField(const nlohmann::json& obj,
                                                       std::string_view key,
                                                       std::string_view context) {
  const nlohmann::json* v = FindField(obj, key);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: must be a string, got {} {}", FieldPath(context, key), v->type_name(), v->dump()));
  }
  return std::optional<std::string>(v->get<std::string>());
}

absl::StatusOr<std::optional<bool>> BoolField(const nlohmann::json& obj, std::string_view key,
                                              std::string_view context) {
  const nlohmann::json* v = FindField(obj, key);
  if (v == nullptr) return std::optional<bool>();
  if (!v->is_boolean()) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: must be a boolean, got {} {}", FieldPath(context, key), v->type_name(), v->dump()));
  }
  return std::optional<bool>(v->get<bool>());
}

absl::StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view what) {
  return ParseBoundedJson(text, kAnnotationJsonLimits, what);
}

absl::StatusOr<std::string> RequiredStringField(const nlohmann::json& obj, std::string_view key,
                                                std::string_view context) {
  auto value = StringField(obj, key, context);
  if (!value.ok()) return value.status();
  if (!value->has_value() || (*value)->empty()) {
    return absl::InvalidArgumentError(fmt::format("{}: missing", FieldPath(context, key)));
  }
  return std::move(**value);
}

absl::StatusOr<nlohmann::json> ParseJsonArray(std::string_view text, std::string_view what) {
  auto doc = ParseJson(text, what);
  if (!doc.ok()) return doc.status();
  if (!doc->is_array()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: must be a JSON array, got {}", what, doc->type_name()));
  }
  return doc;
}

absl::StatusOr<mig::Placement> SlicesField(const nlohmann::json& obj, std::string_view key,
                                           std::string_view context) {
  constexpr int64_t kMaxUnits = 64;
  const nlohmann::json* placement = FindField(obj, key);
  const std::string pctx = FieldPath(context, key);
  if (placement == nullptr || !placement->is_object()) {
    return absl::InvalidArgumentError(fmt::format("{}: must be an object {{start, size}}", pctx));
  }
  auto start = IntField(*placement, "start", pctx, 0, kMaxUnits - 1);
  if (!start.ok()) return start.status();
  auto size = IntField(*placement, "size", pctx, 1, kMaxUnits);
  if (!size.ok()) return size.status();
  if (!start->has_value() || !size->has_value()) {
    return absl::InvalidArgumentError(fmt::format("{}: start and size are required", pctx));
  }
  if (**start + **size > kMaxUnits) {
    return absl::InvalidArgumentError(
        fmt::format("{}: ends at {}, beyond {} units", pctx, **start + **size, kMaxUnits));
  }
  return mig::Placement{static_cast<uint32_t>(**start), static_cast<uint32_t>(**size)};
}

}  // namespace dynmig::protocol::internal
