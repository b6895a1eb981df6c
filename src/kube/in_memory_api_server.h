// InMemoryApiServer: a small Kubernetes API server over real HTTP, for tests and the local mode.
// Never for production.
//
// Serves ApiStore (pods, nodes, events, leases, namespaces, configmaps, PodDisruptionBudgets in
// the policy group versions of options.minor_version, apps/v1 ReplicaSets (stored only: the local
// mode's ReplicaSet controller acts on them), and the pods/eviction subresource with the
// apiserver's budget rules: see ApiStore::Evict and docs/kube.md) with the REST paths,
// discovery documents, watch streams, Status error bodies and Table output (pods, nodes) that
// kubectl v1.32 needs. Adds fault injection for tests, through the C++ API and over HTTP:
//   POST   /_dynmig/faults        body: FaultSpec as JSON (see FaultSpecFromJson)
//   DELETE /_dynmig/faults        clear all faults
//   POST   /_dynmig/cut-watches   drop every open watch connection
//   POST   /_dynmig/compact       forget the watch history (watches from older RVs get 410)
//   GET    /_dynmig/stats         {"requests":N,"openWatches":N,"resourceVersion":"N"}
// Knows who calls (bearer tokens -> usernames, see token_users) and calls admission webhooks on
// the writes that arrive over HTTP (see admission_webhooks and kube/admission.h); the C++ store()
// is a backdoor that neither authenticates nor admits. Keeps an audit table of the authenticated
// requests (see kube/audit.h): who called which RBAC verb on which resource, as an authorizer
// would see it (AuditLog()), to compare the calls of each identity with the RBAC it is given.
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "kube/admission.h"
#include "kube/api_store.h"
#include "kube/audit.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace dynmig::kube {

namespace apiserver_detail {
struct Call;
struct ResourceCall;
}  // namespace apiserver_detail

// One fault rule. The first rule matching a request (method, path prefix, user) applies to it and
// counts down; exhausted rules are removed. Admin paths (/_dynmig/...) are never faulted.
struct FaultSpec {
  enum class Action {
    kStatus,     // answer `status` with a Status body (and Retry-After if set)
    kMalformed,  // answer 200 with a body (or watch event) that is not valid JSON
    kTruncate,   // start a 200 response and cut the connection in the middle of the body
    kDelay,      // only add `latency`, then serve normally
  };
  std::string method{};       // "GET", "POST", ...; "" = any
  std::string path_prefix{};  // e.g. "/api/v1/namespaces/default/pods"; "" = any
  std::string user{};         // only requests of this user (see token_users); "" = anyone's
  int count = 1;              // requests to affect; -1 = until cleared
  Action action = Action::kStatus;
  int status = 500;
  int retry_after_seconds = -1;                   // >= 0 adds a Retry-After header
  absl::Duration latency = absl::ZeroDuration();  // delay before answering (any action)
  std::string message{};  // Status message ("" = a default naming the fault)
  // > 0: the rule ends this long (of the server's clock) after AddFault, whatever its count (with
  // count -1 and no method, path or user: an API outage of that length).
  absl::Duration window = absl::ZeroDuration();
};

// {"method":"GET","pathPrefix":"/api/v1/pods","user":"alice","count":2,"action":"status|malformed|truncate|delay",
//  "status":503,"retryAfterSeconds":1,"latencyMs":200,"message":"...","windowMs":3000}; all fields
//  optional.
absl::StatusOr<FaultSpec> FaultSpecFromJson(const Object& json);

struct InMemoryApiServerOptions {
  // The Kubernetes 1.x this server answers as (/version) and whose versioned APIs it serves:
  // policy/v1 PodDisruptionBudgets from 21, policy/v1beta1 ones up to 24; the Eviction body in
  // policy/v1 from 22 (discovery names pods/eviction policy/v1 from then on, policy/v1beta1
  // before), in policy/v1beta1 always. 20 is the project's test cluster; 32 current clusters.
  int minor_version = 32;
  // The server's time: watch timeouts, bookmarks and heartbeats, the garbage collector's interval,
  // fault windows and latencies, Table ages; and the store's (see ApiStoreOptions::clock) unless
  // store.clock is set. nullptr: RealClock(). A FakeClock makes these timers fire as a test
  // advances it (the HTTP transport itself runs on real time).
  const Clock* clock = nullptr;
  std::string host = "127.0.0.1";
  int port = 0;  // 0 = pick a free port (see port())
  ApiStoreOptions store;
  // Serve this store instead of a new one (e.g. to "restart" a server on the same state).
  std::shared_ptr<ApiStore> shared_store;
  int threads = 64;                                     // worker threads; each open watch holds one
  absl::Duration bookmark_interval = absl::Seconds(5);  // for watches with allowWatchBookmarks
  absl::Duration default_watch_timeout = absl::Minutes(30);
  // Idle watch streams get a "\n" (JSON whitespace) this often, to notice clients that left.
  absl::Duration watch_heartbeat = absl::Seconds(2);
  // An idle keep-alive connection is closed after this (whole seconds, at least 1). Stop() waits
  // for it: httplib 0.11 does not wake idle connections on stop(), so this test double keeps it
  // short. Clients reconnect on their next request. (httplib also gives a new connection only
  // this long to send its first request; libcurl sends it at once.)
  absl::Duration keep_alive_timeout = absl::Seconds(1);
  // How often pods whose graceful deletion period has passed are removed (0 = only when
  // CollectGarbage() is called).
  absl::Duration gc_interval = absl::Milliseconds(200);
  // Answer a watch from an expired resourceVersion with an HTTP 410 instead of the usual 200 +
  // ERROR event (a real server does either).
  bool expired_watch_as_http_error = false;
  bool log_requests = false;  // spdlog debug line per request
  // HTTPS when both are set (PEM files). With a client CA, clients must present a certificate
  // signed by it (mutual TLS). Used to test the client's TLS settings.
  std::string tls_cert_file{};
  std::string tls_key_file{};
  std::string tls_client_ca_file{};
  // When set, every request (admin endpoints and /healthz excepted) must carry
  // "Authorization: Bearer <token>" with this token (user "system:admin") or one of token_users,
  // else 401. A test hook, not security.
  std::string bearer_token;
  // Bearer token -> username (groups: system:authenticated). A request with a known token is that
  // user. A token that is neither here nor bearer_token is refused (401) when this map or
  // bearer_token is set; with neither set any token is accepted as anonymous (no auth). A request
  // without a token is "system:anonymous" (groups: system:unauthenticated) unless bearer_token
  // is set. No authorization (RBAC) follows: every user may do everything.
  std::map<std::string, std::string> token_users;
  // Called, in kube-apiserver's order, on creates, updates, patches and deletes that arrive over
  // HTTP (see kube/admission.h). Change at runtime with SetAdmissionWebhooks.
  std::vector<AdmissionWebhook> admission_webhooks;
  // The audit table (AuditLog()): every request that passed authentication (faulted ones too:
  // the client made the call), probes (/healthz, /readyz, /livez) and admin paths excepted.
  bool audit = true;
  size_t audit_max_records = 4096;  // distinct (user, verb, resource, ...) records kept
  size_t audit_max_names = 64;      // distinct object names kept per record
};

class InMemoryApiServer {
 public:
  // Binds and starts serving. kUnavailable if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<InMemoryApiServer>> Start(
      InMemoryApiServerOptions options = {});
  ~InMemoryApiServer();  // Stop()
  InMemoryApiServer(const InMemoryApiServer&) = delete;
  InMemoryApiServer& operator=(const InMemoryApiServer&) = delete;

  int port() const { return port_; }
  std::string url() const;  // "http://127.0.0.1:PORT" ("https://..." with TLS)
  // Stops accepting, ends open watches and waits for in-flight requests and for idle keep-alive
  // connections to time out (up to options.keep_alive_timeout). Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // The store, for direct (non-HTTP) setup and inspection in tests.
  ApiStore& store() { return *store_; }
  std::shared_ptr<ApiStore> shared_store() { return store_; }

  // Fault injection.
  void AddFault(FaultSpec fault) ABSL_LOCKS_EXCLUDED(mu_);
  void ClearFaults() ABSL_LOCKS_EXCLUDED(mu_);
  int CutWatches();  // returns the number of watches that were open
  void CompactHistory() { store_->CompactHistory(); }
  int CollectGarbage() { return store_->CollectGarbage(); }

  int64_t request_count() const { return requests_.load(); }
  // Changes the required bearer token (see options); "" turns the check off.
  void SetBearerToken(std::string token) ABSL_LOCKS_EXCLUDED(mu_);
  // Replaces token_users (see options).
  void SetTokenUsers(std::map<std::string, std::string> token_users) ABSL_LOCKS_EXCLUDED(mu_);
  // Replaces the admission webhooks (e.g. once a webhook server has its port). Requests already
  // being admitted finish with the old list.
  void SetAdmissionWebhooks(std::vector<AdmissionWebhook> webhooks) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<AdmissionWebhook> admission_webhooks() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t open_watches() const { return store_->open_watches(); }

  // One record per distinct (user, verb, API group, resource, subresource, namespace) seen since
  // the start or the last ClearAuditLog(), with counts and the object names (see kube/audit.h).
  std::vector<AuditRecord> AuditLog() const { return audit_.Records(); }
  void ClearAuditLog() { audit_.Clear(); }
  int64_t audit_dropped() const { return audit_.dropped(); }  // requests beyond the record limit

 private:
  explicit InMemoryApiServer(InMemoryApiServerOptions options);
  absl::Status Listen();
  void Handle(const httplib::Request& req, httplib::Response& res);
  // Everything after authentication and fault injection: dispatches by the route table (method +
  // path pattern -> one of the handlers below).
  void Serve(const httplib::Request& req, httplib::Response& res, const UserInfo& user);
  // Non-resource endpoints: discovery, version, OpenAPI v3, health probes.
  void ServeApiVersions(apiserver_detail::Call& call);
  void ServeCoreResources(apiserver_detail::Call& call);
  void ServeApiGroups(apiserver_detail::Call& call);
  void ServeAppsGroup(apiserver_detail::Call& call);
  void ServeAppsResources(apiserver_detail::Call& call);
  void ServeCoordinationGroup(apiserver_detail::Call& call);
  void ServeCoordinationResources(apiserver_detail::Call& call);
  void ServePolicyGroup(apiserver_detail::Call& call);
  void ServePolicyResources(apiserver_detail::Call& call);
  void ServeVersion(apiserver_detail::Call& call);
  void ServeOpenApiIndex(apiserver_detail::Call& call);
  void ServeOpenApiDocument(apiserver_detail::Call& call);
  void ServeHealth(apiserver_detail::Call& call);
  // Resource paths.
  void ServeList(apiserver_detail::ResourceCall& call);
  void ServeWatch(apiserver_detail::ResourceCall& call, const ListQuery& query);
  void ServeGet(apiserver_detail::ResourceCall& call);
  void ServeCreate(apiserver_detail::ResourceCall& call);
  void ServeBind(apiserver_detail::ResourceCall& call);
  void ServeEvict(apiserver_detail::ResourceCall& call);
  void RefusePost(apiserver_detail::ResourceCall& call);
  void ServeUpdate(apiserver_detail::ResourceCall& call);
  void ServePatch(apiserver_detail::ResourceCall& call);
  void ServeDelete(apiserver_detail::ResourceCall& call);
  // `user`: the caller's username ("" when not authenticated).
  bool ApplyFault(const httplib::Request& req, httplib::Response& res, const std::string& user)
      ABSL_LOCKS_EXCLUDED(mu_);
  void HandleAdmin(const httplib::Request& req, httplib::Response& res);
  // The caller, or 401.
  absl::StatusOr<UserInfo> Authenticate(const httplib::Request& req) const ABSL_LOCKS_EXCLUDED(mu_);
  // The webhooks matching a request, or an empty list (then no admission step at all).
  std::vector<AdmissionWebhook> MatchingWebhooks(const AdmissionAttributes& attrs) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Collects garbage every options_.gc_interval until Stop().
  void RunGarbageCollector() ABSL_LOCKS_EXCLUDED(mu_);

  InMemoryApiServerOptions options_;
  const Clock& clock_;
  std::shared_ptr<ApiStore> store_;
  std::unique_ptr<httplib::Server> http_;
  std::thread listener_;
  std::thread gc_thread_;
  int port_ = 0;
  std::atomic<int64_t> requests_{0};
  std::atomic<bool> stopping_{false};
  mutable dynmig::Mutex mu_;
  dynmig::CondVar stop_cv_;  // signalled when stopped_ becomes true
  struct FaultRule {
    FaultSpec spec;
    absl::Duration until = absl::InfiniteDuration();  // clock_.Monotonic() deadline, spec.window
  };
  std::vector<FaultRule> faults_ ABSL_GUARDED_BY(mu_);
  std::string bearer_token_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> token_users_ ABSL_GUARDED_BY(mu_);
  std::vector<AdmissionWebhook> webhooks_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  AuditTrail audit_;
};

}  // namespace dynmig::kube
