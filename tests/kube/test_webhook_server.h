// A small admission webhook server for the kube tests (cpp-httplib, HTTP or HTTPS): routes POSTed
// AdmissionReviews to per-path handlers, records every request, answers with an AdmissionReview
// admission.k8s.io/v1 whose response.uid is the request's unless the handler set one.
#pragma once

#include <httplib.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "common/mutex.h"
#include "kube/object.h"
#include "kube_test_util.h"

namespace dynmig::kube::testing {

class TestWebhookServer {
 public:
  // request (the review's "request") -> response (the review's "response"). A response with a
  // "__raw" string is sent as the HTTP body verbatim (malformed answers); "__status" sets the
  // HTTP status.
  using Handler = std::function<Object(const Object& request)>;

  // HTTPS when cert and key (PEM files) are given.
  explicit TestWebhookServer(const std::string& cert_file = "", const std::string& key_file = "") {
    if (!cert_file.empty()) {
      http_ = std::make_unique<httplib::SSLServer>(cert_file.c_str(), key_file.c_str());
      scheme_ = "https";
    } else {
      http_ = std::make_unique<httplib::Server>();
    }
    http_->Post(".*", [this](const httplib::Request& req, httplib::Response& res) {
      Object review = Object::parse(req.body, nullptr, /*allow_exceptions=*/false);
      Handler handler;
      {
        dynmig::MutexLock lock(&mu_);
        calls_.emplace_back(req.path, review);
        auto it = handlers_.find(req.path);
        if (it != handlers_.end()) handler = it->second;
      }
      const Object request = review.is_object() ? review.value("request", Object()) : Object();
      Object response = handler ? handler(request) : Object{{"allowed", true}};
      if (response.contains("__raw")) {
        res.status = response.value("__status", 200);
        res.set_content(response["__raw"].get<std::string>(), "application/json");
        return;
      }
      if (!response.contains("uid")) response["uid"] = request.value("uid", "");
      res.status = 200;
      res.set_content(Object{{"apiVersion", "admission.k8s.io/v1"},
                             {"kind", "AdmissionReview"},
                             {"response", response}}
                          .dump(),
                      "application/json");
    });
    port_ = http_->bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { http_->listen_after_bind(); });
    (void)Eventually([this] { return http_->is_running(); });  // the listener thread serves
  }
  ~TestWebhookServer() { Stop(); }
  TestWebhookServer(const TestWebhookServer&) = delete;
  TestWebhookServer& operator=(const TestWebhookServer&) = delete;

  void Stop() {
    if (thread_.joinable()) {
      http_->stop();
      thread_.join();
    }
  }
  bool ok() const { return port_ > 0; }
  int port() const { return port_; }
  std::string url(const std::string& path) const {
    return scheme_ + "://127.0.0.1:" + std::to_string(port_) + path;
  }

  void On(const std::string& path, Handler handler) {
    dynmig::MutexLock lock(&mu_);
    handlers_[path] = std::move(handler);
  }
  // The AdmissionReview "request"s POSTed to `path`, in order.
  std::vector<Object> RequestsTo(const std::string& path) const {
    dynmig::MutexLock lock(&mu_);
    std::vector<Object> out;
    for (const auto& [p, review] : calls_) {
      if (p == path) out.push_back(review.is_object() ? review.value("request", Object()) : review);
    }
    return out;
  }
  // Every path called, in order.
  std::vector<std::string> Paths() const {
    dynmig::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const auto& call : calls_) out.push_back(call.first);
    return out;
  }
  void ClearCalls() {
    dynmig::MutexLock lock(&mu_);
    calls_.clear();
  }

 private:
  std::unique_ptr<httplib::Server> http_;
  std::string scheme_ = "http";
  int port_ = -1;
  std::thread thread_;
  mutable dynmig::Mutex mu_;
  std::map<std::string, Handler> handlers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, Object>> calls_ ABSL_GUARDED_BY(mu_);
};

// A JSONPatch response that sets label `key`=`value` (adding the labels map when absent).
inline Object AddLabelResponse(const Object& request, const std::string& key,
                               const std::string& value) {
  const Object& obj = request.value("object", Object());
  Object patch;
  const bool has_labels = obj.is_object() && obj.contains("metadata") &&
                          obj["metadata"].is_object() && obj["metadata"].contains("labels") &&
                          obj["metadata"]["labels"].is_object();
  if (has_labels) {
    std::string escaped;
    for (char c : key) {
      if (c == '~') {
        escaped += "~0";
      } else if (c == '/') {
        escaped += "~1";
      } else {
        escaped += c;
      }
    }
    patch =
        Object::array({{{"op", "add"}, {"path", "/metadata/labels/" + escaped}, {"value", value}}});
  } else {
    patch =
        Object::array({{{"op", "add"}, {"path", "/metadata/labels"}, {"value", {{key, value}}}}});
  }
  return Object{
      {"allowed", true}, {"patchType", "JSONPatch"}, {"patch", absl::Base64Escape(patch.dump())}};
}

}  // namespace dynmig::kube::testing
