// Status propagation helpers.
//
// Note on Debian's Abseil: absl::string_view is its own type there, not std::string_view, so
// absl::StrCat and friends do not take std::string_view. Build messages with fmt::format and pass
// std::string to absl::Status. Debian's Abseil (20220623) has absl::Status and absl::StatusOr but
// not the status macros, so dynmig defines its own with the same semantics.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define DYNMIG_CONCAT_INNER_(a, b) a##b
#define DYNMIG_CONCAT_(a, b) DYNMIG_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define DYNMIG_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status dynmig_status_ = (expr);          \
    if (!dynmig_status_.ok()) return dynmig_status_; \
  } while (false)

// `lhs = value of expr` when expr (a StatusOr) is OK, else returns its status.
#define DYNMIG_ASSIGN_OR_RETURN(lhs, expr) \
  DYNMIG_ASSIGN_OR_RETURN_IMPL_(DYNMIG_CONCAT_(dynmig_statusor_, __LINE__), lhs, expr)
#define DYNMIG_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

namespace dynmig {

// Prefixes a status message with context, keeping its code: "create GI 3g.20gb@4: <message>".
inline absl::Status Annotate(const absl::Status& status, std::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), std::string(context) + ": " + std::string(status.message()));
}

}  // namespace dynmig
