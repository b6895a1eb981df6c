// Internal to dynmig_protocol: typed, error-naming field readers over nlohmann::json objects.
// Every error is kInvalidArgument and starts with `context.key`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "mig/placement.h"
#include "nlohmann/json.hpp"

namespace dynmig::protocol::internal {

// The largest value of a uint32 field (GPU index, instance IDs, core and slice counts).
inline constexpr int64_t kUint32Max = 0xFFFFFFFF;

// The field `key` of `obj`, or nullptr when absent or JSON null. REQUIRES: obj.is_object().
const nlohmann::json* FindField(const nlohmann::json& obj, std::string_view key);

// "<context>.<key>" (or just key when context is empty).
std::string FieldPath(std::string_view context, std::string_view key);

// A JSON integer in [min, max]; nullopt when absent or null. Floats, strings and booleans are
// type errors.
absl::StatusOr<std::optional<int64_t>> IntField(const nlohmann::json& obj, std::string_view key,
                                                std::string_view context, int64_t min, int64_t max);

// A JSON string; nullopt when absent or null.
absl::StatusOr<std::optional<std::string>> StringField(const nlohmann::json& obj,
                                                       std::string_view key,
                                                       std::string_view context);

// A JSON string that must be present and non-empty ("<context>.<key>: missing" otherwise).
absl::StatusOr<std::string> RequiredStringField(const nlohmann::json& obj, std::string_view key,
                                                std::string_view context);

// An annotation's value that must be a JSON array ("<what>: must be a JSON array, got ...").
absl::StatusOr<nlohmann::json> ParseJsonArray(std::string_view text, std::string_view what);

// The required object `key` {start, size} of slices on a GPU of at most 64 units; the errors
// name `<context>.<key>`.
absl::StatusOr<mig::Placement> SlicesField(const nlohmann::json& obj, std::string_view key,
                                           std::string_view context);

// A JSON boolean; nullopt when absent or null.
absl::StatusOr<std::optional<bool>> BoolField(const nlohmann::json& obj, std::string_view key,
                                              std::string_view context);

// Parses an annotation's JSON text within kAnnotationJsonLimits (256 KiB, 8 levels deep); a
// syntax error or a limit exceeded is kInvalidArgument naming `what` and the cause.
absl::StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view what);

}  // namespace dynmig::protocol::internal
