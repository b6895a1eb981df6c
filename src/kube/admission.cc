#include "kube/admission.h"

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <variant>

#include "absl/strings/escaping.h"
#include "common/bounded_json.h"
#include "kube/api_status.h"
#include "kube/patch.h"

namespace dynmig::kube {
namespace {

bool Contains(const std::vector<std::string>& list, std::string_view value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

std::string NewRequestUid() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}() ^ (counter.fetch_add(1) << 32));
  const uint64_t a = rng();
  const uint64_t b = rng();
  return fmt::format("{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}", a >> 32, (a >> 16) & 0xffff, a & 0xfff,
                     ((b >> 48) & 0x3fff) | 0x8000, b & 0xffffffffffffULL);
}

Object GroupVersionKind(const ResourceInfo& info) {
  return Object{{"group", std::string(info.group)},
                {"version", std::string(info.version)},
                {"kind", std::string(info.kind)}};
}

Object GroupVersionResource(const ResourceInfo& info) {
  return Object{{"group", std::string(info.group)},
                {"version", std::string(info.version)},
                {"resource", std::string(info.plural)}};
}

// A webhook call that failed (transport, HTTP status, malformed or invalid AdmissionReview):
// subject to the failure policy.
struct CallError {
  std::string reason;
};

// POSTs the review and returns its verified `response`, or why the call failed.
std::variant<Object, CallError> CallWebhook(const AdmissionWebhook& hook, const Object& review,
                                            const std::string& uid) {
  const size_t scheme_end = hook.url.find("://");
  if (scheme_end == std::string::npos || (hook.url.compare(0, scheme_end, "http") != 0 &&
                                          hook.url.compare(0, scheme_end, "https") != 0)) {
    return CallError{
        fmt::format("bad webhook URL \"{}\" (want http(s)://HOST:PORT/PATH)", hook.url)};
  }
  const size_t path_start = hook.url.find('/', scheme_end + 3);
  const std::string base =
      path_start == std::string::npos ? hook.url : hook.url.substr(0, path_start);
  const std::string path = path_start == std::string::npos ? "/" : hook.url.substr(path_start);

  httplib::Client client(base);
  if (!client.is_valid()) {
    return CallError{fmt::format("bad webhook URL \"{}\"", hook.url)};
  }
  if (hook.url.compare(0, scheme_end, "https") == 0) {
    if (!hook.ca_file.empty()) client.set_ca_cert_path(hook.ca_file);
    client.enable_server_certificate_verification(true);
  }
  const int64_t usec = std::max<int64_t>(1000, absl::ToInt64Microseconds(hook.timeout));
  const time_t sec = static_cast<time_t>(usec / 1000000);
  const time_t rest = static_cast<time_t>(usec % 1000000);
  client.set_connection_timeout(sec, rest);
  client.set_read_timeout(sec, rest);
  client.set_write_timeout(sec, rest);
  client.set_keep_alive(false);

  auto res = client.Post(path, review.dump(), "application/json");
  if (!res) {
    std::string detail;
    switch (res.error()) {
      case httplib::Error::Connection:
        detail = fmt::format("dial tcp {}: connect failed (connection refused or unreachable)",
                             base.substr(scheme_end + 3));
        break;
      case httplib::Error::Read:
        detail = fmt::format(
            "no response (context deadline exceeded after {}, or the connection "
            "was closed)",
            absl::FormatDuration(hook.timeout));
        break;
      case httplib::Error::SSLServerVerification:
        detail = fmt::format(
            "tls: failed to verify certificate: x509: certificate signed by "
            "unknown authority or not valid for the host (CA file \"{}\")",
            hook.ca_file);
        break;
      default:
        detail = httplib::to_string(res.error());
    }
    return CallError{fmt::format("failed to call webhook: Post \"{}\": {}", hook.url, detail)};
  }
  if (res->status != 200) {
    return CallError{fmt::format("received HTTP {} from the webhook: {}", res->status,
                                 res->body.substr(0, 512))};
  }
  auto parsed = ParseBoundedJson(res->body, kKubeObjectJsonLimits, "the webhook response");
  if (!parsed.ok()) return CallError{std::string(parsed.status().message())};
  Object body = std::move(*parsed);
  if (!body.is_object() || !body.contains("response") || !body["response"].is_object()) {
    return CallError{"webhook response was absent"};
  }
  const Object& response = body["response"];
  const std::string got_uid = response.value("uid", Object()).is_string()
                                  ? response["uid"].get<std::string>()
                                  : std::string();
  if (got_uid != uid) {
    return CallError{fmt::format("expected response.uid=\"{}\", got \"{}\"", uid, got_uid)};
  }
  if (body.value("apiVersion", Object()) != "admission.k8s.io/v1" ||
      body.value("kind", Object()) != "AdmissionReview") {
    return CallError{fmt::format(
        "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {}, Kind={}",
        body.value("apiVersion", Object()).dump(), body.value("kind", Object()).dump())};
  }
  if (!response.contains("allowed") || !response["allowed"].is_boolean()) {
    return CallError{"webhook response has no boolean response.allowed"};
  }
  const bool has_patch =
      response.contains("patch") && response["patch"].is_string() && !response["patch"].empty();
  const bool has_type = response.contains("patchType") && !response["patchType"].is_null();
  if (hook.mutating) {
    if (has_patch && !has_type)
      return CallError{
          "webhook returned response.patch but not "
          "response.patchType"};
    if (!has_patch && has_type)
      return CallError{
          "webhook returned response.patchType but not "
          "response.patch"};
    if (has_type && response["patchType"] != "JSONPatch") {
      return CallError{fmt::format("unsupported patch type {}", response["patchType"].dump())};
    }
  } else {
    if (has_patch) return CallError{"validating webhook may not return response.patch"};
    if (has_type) return CallError{"validating webhook may not return response.patchType"};
  }
  return response;
}

// kube-apiserver's ToStatusErr.
absl::Status Denied(const AdmissionWebhook& hook, const Object& response) {
  const Object status = response.value("status", Object::object());
  int code = 0;
  if (status.is_object() && status.contains("code") && status["code"].is_number_integer()) {
    code = status["code"].get<int>();
  }
  if (code < 400) code = 400;
  std::string message, reason;
  if (status.is_object()) {
    if (status.contains("message") && status["message"].is_string()) {
      message = status["message"].get<std::string>();
    }
    if (status.contains("reason") && status["reason"].is_string()) {
      reason = status["reason"].get<std::string>();
    }
  }
  const std::string denied_by =
      fmt::format("admission webhook \"{}\" denied the request", hook.name);
  std::string text;
  if (!message.empty()) {
    text = fmt::format("{}: {}", denied_by, message);
  } else if (!reason.empty()) {
    text = fmt::format("{}: {}", denied_by, reason);
  } else {
    text = denied_by + " without explanation";
  }
  return ApiError(code, reason, std::move(text));
}

absl::Status InternalError(std::string_view message) {
  return ApiError(500, "InternalError", fmt::format("Internal error occurred: {}", message));
}

}  // namespace

bool WebhookMatches(const AdmissionWebhook& hook, const AdmissionAttributes& attrs) {
  if (!Contains(hook.operations, attrs.operation) && !Contains(hook.operations, "*")) return false;
  const ResourceInfo& info = InfoFor(attrs.resource);
  bool resource_match = false;
  for (const std::string& entry : hook.resources) {
    const size_t slash = entry.find('/');
    const std::string res = entry.substr(0, slash);
    const std::string sub = slash == std::string::npos ? "" : entry.substr(slash + 1);
    if ((res == "*" || res == info.plural) && (sub == "*" || sub == attrs.subresource)) {
      resource_match = true;
      break;
    }
  }
  if (!resource_match) return false;
  if (info.namespaced && Contains(hook.excluded_namespaces, attrs.ns)) return false;
  if (attrs.resource == Resource::kNamespaces && Contains(hook.excluded_namespaces, attrs.name)) {
    return false;
  }
  return !Contains(hook.excluded_users, attrs.user.username);
}

Object MakeAdmissionReview(const AdmissionAttributes& attrs, const std::string& uid) {
  const ResourceInfo& info = InfoFor(attrs.resource);
  Object groups = Object::array();
  for (const auto& g : attrs.user.groups) groups.push_back(g);
  Object kind = GroupVersionKind(info);
  if (attrs.resource == Resource::kPods && attrs.subresource == "binding") kind["kind"] = "Binding";
  Object request = {{"uid", uid},
                    {"kind", kind},
                    {"resource", GroupVersionResource(info)},
                    {"requestKind", kind},
                    {"requestResource", GroupVersionResource(info)},
                    {"name", attrs.name},
                    {"namespace", attrs.ns},
                    {"operation", attrs.operation},
                    {"userInfo", {{"username", attrs.user.username}, {"groups", groups}}},
                    {"object", attrs.object},
                    {"oldObject", attrs.old_object},
                    {"dryRun", attrs.dry_run},
                    {"options", attrs.options}};
  if (!attrs.subresource.empty()) {
    request["subResource"] = attrs.subresource;
    request["requestSubResource"] = attrs.subresource;
  }
  if (attrs.ns.empty()) request.erase("namespace");
  return Object{
      {"apiVersion", "admission.k8s.io/v1"}, {"kind", "AdmissionReview"}, {"request", request}};
}

absl::StatusOr<Object> RunAdmission(const std::vector<AdmissionWebhook>& hooks,
                                    const AdmissionAttributes& attrs,
                                    std::vector<std::string>* warnings) {
  AdmissionAttributes current = attrs;
  for (const bool mutating_phase : {true, false}) {
    for (const AdmissionWebhook& hook : hooks) {
      if (hook.mutating != mutating_phase || !WebhookMatches(hook, current)) continue;
      const std::string uid = NewRequestUid();
      auto result = CallWebhook(hook, MakeAdmissionReview(current, uid), uid);
      if (auto* failed = std::get_if<CallError>(&result)) {
        const std::string message =
            fmt::format("failed calling webhook \"{}\": {}", hook.name, failed->reason);
        if (hook.failure_policy_fail) return InternalError(message);
        spdlog::warn("apiserver: {} {}/{}: {} (failurePolicy Ignore: skipped)", attrs.operation,
                     InfoFor(attrs.resource).plural, attrs.name, message);
        continue;
      }
      const Object& response = std::get<Object>(result);
      if (warnings != nullptr && response.contains("warnings") && response["warnings"].is_array()) {
        for (const auto& w : response["warnings"]) {
          if (w.is_string()) warnings->push_back(w.get<std::string>());
        }
      }
      if (!response["allowed"].get<bool>()) return Denied(hook, response);
      if (!hook.mutating || !response.contains("patch") || !response["patch"].is_string() ||
          response["patch"].get<std::string>().empty()) {
        continue;
      }
      std::string decoded;
      if (!absl::Base64Unescape(response["patch"].get<std::string>(), &decoded)) {
        return InternalError(
            fmt::format("webhook \"{}\" returned a patch that is not base64", hook.name));
      }
      auto patch = ParseBoundedJson(decoded, kKubeObjectJsonLimits,
                                    fmt::format("webhook \"{}\" returned a patch", hook.name));
      if (!patch.ok()) return InternalError(std::string(patch.status().message()));
      if (current.object.is_null()) continue;  // DELETE: nothing to patch
      auto patched = ApplyJsonPatch(current.object, *patch);
      if (!patched.ok()) {
        return InternalError(fmt::format("webhook \"{}\": applying its JSONPatch: {}", hook.name,
                                         std::string(patched.status().message())));
      }
      current.object = std::move(*patched);
    }
  }
  return current.object;
}

}  // namespace dynmig::kube
