// Connection settings for RestKubeClient, from a kubeconfig file or the in-cluster environment.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dynmig::kube {

// Retries of requests that got 429 or 5xx (or could not connect), with exponential backoff.
// A Retry-After header from the server sets the delay instead (capped by max_retry_after).
// GET/PUT/PATCH/DELETE retry on 429, 5xx and transport errors; POST (not idempotent) only on 429,
// 503 and failures to connect.
struct RetryPolicy {
  int max_attempts = 5;  // 1 = no retry
  absl::Duration initial_backoff = absl::Milliseconds(200);
  absl::Duration max_backoff = absl::Seconds(10);
  absl::Duration max_retry_after = absl::Seconds(30);
  double jitter = 0.2;  // each backoff is multiplied by 1 + jitter * U[0,1)
  // Sleeps between attempts; tests inject a recorder. Default: the client's clock's SleepFor.
  std::function<void(absl::Duration)> sleep;
};

struct RestConfig {
  std::string server;  // "https://10.0.0.1:6443" or "http://127.0.0.1:8080"
  // TLS. *_data fields hold PEM bytes (already base64-decoded); files are read by libcurl.
  std::string ca_file;
  std::string ca_data;
  std::string client_cert_file;
  std::string client_cert_data;
  std::string client_key_file;
  std::string client_key_data;
  bool insecure_skip_tls_verify = false;
  // Bearer token: `token`, or `token_file`, re-read whenever the file changes (projected
  // service-account tokens rotate).
  std::string token;
  std::string token_file;
  std::string ns = "default";  // the context's (or pod's) namespace
  absl::Duration connect_timeout = absl::Seconds(5);
  absl::Duration request_timeout = absl::Seconds(60);  // whole request, not for watches
  RetryPolicy retry;
  std::string user_agent = "dynmig/0.1.0";
};

// Parses kubeconfig YAML. `context` "" = current-context. Relative file paths resolve against
// `base_dir` (the kubeconfig's directory). kInvalidArgument names what is missing or wrong
// (no such context, cluster without server, bad base64, `exec`/`auth-provider` users, which are
// not supported).
absl::StatusOr<RestConfig> ParseKubeconfig(std::string_view yaml, std::string_view base_dir,
                                           std::string_view context = "");
// Reads and parses a kubeconfig file (kNotFound if it does not exist).
absl::StatusOr<RestConfig> LoadKubeconfig(const std::string& path, std::string_view context = "");

// Where in-cluster settings come from; tests inject their own.
struct InClusterEnvironment {
  std::function<std::optional<std::string>(const std::string&)> getenv;  // default ::getenv
  std::string token_path = "/var/run/secrets/kubernetes.io/serviceaccount/token";
  std::string ca_path = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
  std::string namespace_path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
};
// https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT (IPv6 bracketed), the token file
// (re-read on change), the CA file, the namespace file. kFailedPrecondition when not in a cluster
// (variables unset), kNotFound when the token file is missing.
absl::StatusOr<RestConfig> InClusterConfig(const InClusterEnvironment& env = {});

// `kubeconfig_path` if set, else $KUBECONFIG (first entry), else in-cluster if available, else
// ~/.kube/config.
absl::StatusOr<RestConfig> DefaultConfig(const std::string& kubeconfig_path = "");

// Standard base64 (padding optional; whitespace ignored). kInvalidArgument on bad input.
absl::StatusOr<std::string> Base64Decode(std::string_view text);

}  // namespace dynmig::kube
