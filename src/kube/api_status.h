// Mapping between Kubernetes API errors (HTTP code + `Status` object) and absl::Status.
//
//   404 -> kNotFound            409 -> kAborted (reason AlreadyExists -> kAlreadyExists)
//   410 -> kOutOfRange (expired resourceVersion / continue token: relist)
//   401 -> kUnauthenticated     403 -> kPermissionDenied
//   400, 422, 415 -> kInvalidArgument     405 -> kUnimplemented
//   429, 5xx -> kUnavailable    408 -> kDeadlineExceeded     other 4xx -> kFailedPrecondition
//
// The message reads "<context>: HTTP <code> <reason>: <the API's message>". The HTTP code and the
// API's reason travel as payloads; read them back with KubeHttpCode / KubeReason.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "kube/object.h"

namespace dynmig::kube {

// `body` may be a Status object, other text or empty.
absl::Status StatusFromHttp(int http_code, std::string_view body, std::string_view context);

// From a decoded Status object (e.g. the object of a watch ERROR event).
absl::Status StatusFromApiStatus(const Object& status, std::string_view context);

// The API's reason ("Conflict", "Expired", "NotFound", ...) or "" when not from the API.
std::string KubeReason(const absl::Status& status);
// The HTTP code that produced the status, or 0.
int KubeHttpCode(const absl::Status& status);

// The standard reason for an HTTP error code ("NotFound", "Conflict", "Gone", ...).
std::string_view ReasonForCode(int http_code);

// An error as the API server reports it: KubeHttpCode()/KubeReason() return `http_code` and
// `reason` ("" picks the standard reason for the code); message() is `message` unchanged. The code
// follows the mapping above.
absl::Status ApiError(int http_code, std::string_view reason, std::string message);

// A `Status` object as the API server sends it.
//   {"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":...,
//    "reason":...,"details":{"name":...,"kind":...},"code":N}
Object MakeApiStatus(int http_code, std::string_view reason, std::string_view message,
                     std::string_view name = "", std::string_view kind = "");

}  // namespace dynmig::kube
