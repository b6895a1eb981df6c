#include "kube/api_status.h"

#include <fmt/format.h>

#include <optional>

#include "absl/strings/cord.h"

namespace dynmig::kube {
namespace {

constexpr char kReasonPayload[] = "dynmig.kube/reason";
constexpr char kCodePayload[] = "dynmig.kube/http-code";

absl::StatusCode CodeFor(int http_code, std::string_view reason) {
  switch (http_code) {
    case 400:
    case 415:
    case 422:
      return absl::StatusCode::kInvalidArgument;
    case 401:
      return absl::StatusCode::kUnauthenticated;
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
      return absl::StatusCode::kNotFound;
    case 405:
      return absl::StatusCode::kUnimplemented;
    case 408:
      return absl::StatusCode::kDeadlineExceeded;
    case 409:
      return reason == "AlreadyExists" ? absl::StatusCode::kAlreadyExists
                                       : absl::StatusCode::kAborted;
    case 410:
      return absl::StatusCode::kOutOfRange;
    case 429:
      return absl::StatusCode::kUnavailable;
    default:
      break;
  }
  if (http_code >= 500) return absl::StatusCode::kUnavailable;
  if (http_code >= 400) return absl::StatusCode::kFailedPrecondition;
  return absl::StatusCode::kUnknown;
}

absl::Status Build(int http_code, std::string reason, std::string_view api_message,
                   std::string_view context) {
  if (reason.empty()) reason = std::string(ReasonForCode(http_code));
  std::string message = fmt::format("HTTP {} {}", http_code, reason);
  if (!api_message.empty()) message += fmt::format(": {}", api_message);
  if (!context.empty()) message = fmt::format("{}: {}", context, message);
  absl::Status status(CodeFor(http_code, reason), message);
  status.SetPayload(kReasonPayload, absl::Cord(reason));
  status.SetPayload(kCodePayload, absl::Cord(std::to_string(http_code)));
  return status;
}

}  // namespace

absl::Status ApiError(int http_code, std::string_view reason, std::string message) {
  std::string r = reason.empty() ? std::string(ReasonForCode(http_code)) : std::string(reason);
  absl::Status status(CodeFor(http_code, r), std::move(message));
  status.SetPayload(kReasonPayload, absl::Cord(r));
  status.SetPayload(kCodePayload, absl::Cord(std::to_string(http_code)));
  return status;
}

std::string_view ReasonForCode(int http_code) {
  switch (http_code) {
    case 400:
      return "BadRequest";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "NotFound";
    case 405:
      return "MethodNotAllowed";
    case 406:
      return "NotAcceptable";
    case 408:
      return "Timeout";
    case 409:
      return "Conflict";
    case 410:
      return "Expired";
    case 413:
      return "RequestEntityTooLarge";
    case 415:
      return "UnsupportedMediaType";
    case 422:
      return "Invalid";
    case 429:
      return "TooManyRequests";
    case 500:
      return "InternalError";
    case 503:
      return "ServiceUnavailable";
    case 504:
      return "Timeout";
    default:
      return http_code >= 500 ? "InternalError" : "Unknown";
  }
}

absl::Status StatusFromApiStatus(const Object& status, std::string_view context) {
  int code = 500;
  std::string reason;
  std::string message;
  if (status.is_object()) {
    if (auto it = status.find("code"); it != status.end() && it->is_number_integer()) {
      code = it->get<int>();
    }
    if (auto it = status.find("reason"); it != status.end() && it->is_string()) {
      reason = it->get<std::string>();
    }
    if (auto it = status.find("message"); it != status.end() && it->is_string()) {
      message = it->get<std::string>();
    }
  }
  return Build(code, reason, message, context);
}

absl::Status StatusFromHttp(int http_code, std::string_view body, std::string_view context) {
  std::string reason;
  std::string message;
  auto parsed = ParseObject(body, "error response");
  if (parsed.ok() && parsed->is_object() && Kind(*parsed) == "Status") {
    if (auto it = parsed->find("reason"); it != parsed->end() && it->is_string()) {
      reason = it->get<std::string>();
    }
    if (auto it = parsed->find("message"); it != parsed->end() && it->is_string()) {
      message = it->get<std::string>();
    }
  } else if (!body.empty()) {
    // Not a Status object: quote the start of whatever came back.
    std::string_view excerpt = body.substr(0, 200);
    while (!excerpt.empty() && (excerpt.back() == '\n' || excerpt.back() == '\r')) {
      excerpt.remove_suffix(1);
    }
    message = std::string(excerpt);
  }
  return Build(http_code, reason, message, context);
}

std::string KubeReason(const absl::Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(kReasonPayload);
  return payload ? std::string(*payload) : "";
}

int KubeHttpCode(const absl::Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(kCodePayload);
  if (!payload) return 0;
  return std::atoi(std::string(*payload).c_str());
}

Object MakeApiStatus(int http_code, std::string_view reason, std::string_view message,
                     std::string_view name, std::string_view kind) {
  Object status = {{"kind", "Status"},
                   {"apiVersion", "v1"},
                   {"metadata", Object::object()},
                   {"status", http_code < 400 ? "Success" : "Failure"},
                   {"message", std::string(message)},
                   {"reason", std::string(reason)},
                   {"code", http_code}};
  if (!name.empty() || !kind.empty()) {
    Object details = Object::object();
    if (!name.empty()) details["name"] = std::string(name);
    if (!kind.empty()) details["kind"] = std::string(kind);
    status["details"] = details;
  }
  if (reason.empty()) status.erase("reason");
  return status;
}

}  // namespace dynmig::kube
