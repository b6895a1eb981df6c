// RestKubeClient: KubeClient over the Kubernetes REST API, on libcurl.
//
// HTTP or HTTPS (CA, client certificate and key as files or PEM data, bearer token or token
// file re-read when it changes, insecure-skip-tls-verify). Connections are pooled and reused.
// Requests that get 429/5xx or fail to connect are retried per RetryPolicy (Retry-After honored).
// Watches run on their own thread each, with their own connection, and stop promptly (curl multi
// + wakeup). Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "kube/kube_client.h"
#include "kube/rest_config.h"

namespace dynmig::kube {

class RestKubeClient : public KubeClient {
 public:
  // kInvalidArgument when the config is unusable (no server, bad scheme). `clock` times the
  // retry backoff (unless config.retry.sleep is set) and the waits for a watch's response headers
  // and end; it must outlive the client.
  static absl::StatusOr<std::unique_ptr<RestKubeClient>> Create(RestConfig config,
                                                                const Clock& clock = RealClock());
  ~RestKubeClient() override;
  RestKubeClient(const RestKubeClient&) = delete;
  RestKubeClient& operator=(const RestKubeClient&) = delete;

  // KubeClient. Create() uses obj.metadata.namespace, else config().ns.
  absl::StatusOr<Object> Get(Resource resource, std::string_view ns,
                             std::string_view name) override;
  absl::StatusOr<ObjectList> List(Resource resource, const ListOptions& options) override;
  absl::StatusOr<std::string> ListPages(
      Resource resource, const ListOptions& options,
      const std::function<absl::Status(std::vector<Object>& items)>& page) override;
  absl::StatusOr<std::unique_ptr<WatchStream>> Watch(Resource resource, const ListOptions& options,
                                                     WatchHandler handler) override;
  absl::StatusOr<Object> Create(Resource resource, const Object& obj) override;
  absl::StatusOr<Object> Update(Resource resource, const Object& obj,
                                std::string_view subresource) override;
  absl::StatusOr<Object> Patch(Resource resource, std::string_view ns, std::string_view name,
                               const Object& patch, PatchType type,
                               std::string_view subresource) override;
  absl::StatusOr<Object> Delete(Resource resource, std::string_view ns, std::string_view name,
                                const DeleteOptions& options) override;
  absl::Status BindPod(std::string_view ns, std::string_view pod_name, std::string_view node_name,
                       std::string_view pod_uid) override;
  // Finds the Eviction's version once (see EvictionApiVersion) and posts it. A 429 is not
  // retried: it is the PodDisruptionBudget's answer (kResourceExhausted), unless it carries a
  // Retry-After header (the apiserver's own throttling: retried as other requests are).
  absl::Status EvictPod(std::string_view ns, std::string_view pod_name,
                        const EvictOptions& options) override;

  // The apiVersion of the Eviction body: the group/version the server's discovery (GET /api/v1)
  // gives for the pods/eviction subresource, "policy/v1" (1.22+) or "policy/v1beta1" (v1.20 and
  // 1.21, or a server that does not say). Asked once; a failed discovery is asked again next time.
  absl::StatusOr<std::string> EvictionApiVersion() ABSL_LOCKS_EXCLUDED(eviction_mu_);
  // The version choice from a GET /api/v1 APIResourceList; for tests.
  static std::string EvictionVersionFromDiscovery(const Object& core_resource_list);
  // The Eviction body EvictPod posts.
  static Object EvictionBody(std::string_view api_version, std::string_view ns,
                             std::string_view pod_name, const EvictOptions& options);

  const RestConfig& config() const { return config_; }
  // HTTP attempts made so far (retries included); for tests.
  int64_t attempts() const { return attempts_.load(); }

  // The REST path of a resource, e.g. "/api/v1/namespaces/ns/pods/name/status".
  static std::string ResourcePath(Resource resource, std::string_view ns, std::string_view name,
                                  std::string_view subresource);

 private:
  struct HttpResponse {
    long code = 0;
    std::string body;
    std::string retry_after;
  };
  RestKubeClient(RestConfig config, const Clock& clock);

  // One request with retries. A non-2xx answer is returned as a response (not an error) once
  // retries are exhausted; errors are transport failures.
  // `retry_bare_429`: retry a 429 that has no Retry-After header (the eviction subresource's
  // PodDisruptionBudget refusal has none and must not be retried).
  absl::StatusOr<HttpResponse> Send(std::string_view method, const std::string& path_and_query,
                                    const std::string* body, std::string_view content_type,
                                    bool retry_bare_429 = true);
  absl::StatusOr<HttpResponse> SendOnce(std::string_view method, const std::string& path_and_query,
                                        const std::string* body, std::string_view content_type,
                                        bool* connect_failed);
  // Send + map: 2xx -> parsed object (kind/apiVersion filled for `resource`), else the API error.
  absl::StatusOr<Object> Call(std::string_view method, const std::string& path_and_query,
                              const std::string* body, std::string_view content_type,
                              Resource resource);
  absl::Duration Backoff(int attempt) const;
  void* Acquire();
  void Release(void* handle);
  // Applies URL, TLS and common options to a curl easy handle and appends the auth and
  // user-agent header lines to `headers`.
  absl::Status Configure(void* handle, const std::string& url, std::vector<std::string>* headers);
  absl::StatusOr<std::string> BearerToken() ABSL_LOCKS_EXCLUDED(token_mu_);

  RestConfig config_;
  const Clock& clock_;
  std::atomic<int64_t> attempts_{0};
  dynmig::Mutex pool_mu_;
  std::vector<void*> idle_handles_ ABSL_GUARDED_BY(pool_mu_);
  dynmig::Mutex token_mu_;
  std::string cached_token_ ABSL_GUARDED_BY(token_mu_);
  int64_t token_mtime_ ABSL_GUARDED_BY(token_mu_) = -1;
  int64_t token_size_ ABSL_GUARDED_BY(token_mu_) = -1;
  dynmig::Mutex eviction_mu_;
  std::string eviction_version_ ABSL_GUARDED_BY(eviction_mu_);  // "" = not asked yet
};

}  // namespace dynmig::kube
