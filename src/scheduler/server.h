// SchedulerServer: `dynmig scheduler` in-process. One HTTP(S) server (cpp-httplib) serving
//   POST /filter   kube-scheduler extender filter (ExtenderArgs -> ExtenderFilterResult)
//   POST /bind     kube-scheduler extender bind (ExtenderBindingArgs -> ExtenderBindingResult)
//   POST /webhook  admission webhook (AdmissionReview v1, mutating and validating)
//   POST /validate the same checks, never a patch (for a ValidatingWebhookConfiguration)
//   GET  /healthz  200 "ok" while the process serves
//   GET  /readyz   200 once the pod and node informers have synced, else 503
//   GET  /metrics  Prometheus text (metrics.h)
//   GET  /layout   the slices of every GPU and who holds them (ClusterState::Report rendered by
//                  the injected layout_html, `dynmig layout --html`'s page); ?node=NAME for one
//                  node, ?format=json for layout_json's document. 404 when no renderer is set.
//                  It names the pods of every namespace: a listener on a loopback address serves
//                  it (reachable from this host or pod alone: the local mode); any other only to a
//                  caller with a client certificate of the extender client CA, as /filter (401
//                  otherwise; 403 without client authentication).
//   GET  /live     the live page (live_snapshot.h, rendered by the injected `live`): GPUs with
//                  their slices and owners, pending pods with their reasons, recent events; its
//                  own script (/live/script.js; style: /live/style.css) fetches /live/body every
//                  few seconds. The same access rule as /layout; a strict Content-Security-Policy
//                  (nothing but this origin's script, style and fetches); 404 without a renderer.
// over list+watch informers (pods that have not terminated, nodes) that feed a ClusterState.
// Errors travel in the protocols' error fields with HTTP 200; request bodies above
// max_body_bytes get HTTP 413 with an error body. TLS from a certificate and key that are
// re-read when the files change (webhook/cert_reloader.h). With extender_client_ca_file, /filter
// and /bind answer 401 with an Error unless the caller presented a client certificate of that CA
// (client_auth.h), and so does /layout; the webhooks, /metrics (which names no pod) and the probes
// need none.
//
// The defragmenter (defragmenter.h) runs on the leader alone, every defrag_interval, when its mode
// is not off; so does the mode switcher (mode_switcher.h), every mode_switch.interval, when the
// device config's nvidia.migModeSwitching is enabled.
//
// With leader election, only the leader writes: a follower answers filter and bind with an Error
// saying it is not the leader, and does not expire reservations. The leader labels its own pod
// (pod_namespace/pod_name) dynmig.io/role=leader and the previous holder's pod
// dynmig.io/role=follower, so a Service selecting dynmig.io/role=leader routes kube-scheduler to
// it; a replica that stops leading labels itself follower.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/bounded_json.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "kube/informer.h"
#include "kube/kube_client.h"
#include "protocol/annotations.h"
#include "scheduler/client_auth.h"
#include "scheduler/cluster_state.h"
#include "scheduler/defragmenter.h"
#include "scheduler/events.h"
#include "scheduler/extender.h"
#include "scheduler/leader_election.h"
#include "scheduler/live_snapshot.h"
#include "scheduler/metrics.h"
#include "scheduler/mode_switcher.h"
#include "scheduler/requeuer.h"
#include "webhook/admission.h"
#include "webhook/cert_reloader.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace dynmig::scheduler {

// The label a replica carries: leader or follower.
using protocol::kRoleLabel;

struct SchedulerServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0 = a free port (see port())
  // HTTPS when both are set.
  std::string tls_cert_file;
  std::string tls_key_file;
  // PEM CA bundle (needs TLS): /filter and /bind require a client certificate signed by one of
  // these CAs (kube-scheduler's extender tlsConfig certFile/keyFile). Re-read when it changes.
  // Empty: no client authentication (the extender's own checks, bind_guard.h, still hold).
  std::string extender_client_ca_file;
  // An idle keep-alive connection is closed after this (whole seconds, at least 1), and Stop()
  // waits up to this long for such connections (httplib 0.11 does not wake them on stop()).
  // httplib also gives a new connection only this long to send its first request, so a short
  // value drops slow clients. kube-scheduler and kube-apiserver (Go's net/http) notice a
  // connection the server closed while idle, drop it from their pool and connect again for the
  // next request; a request that meets the close before anything of it was written is retried on
  // a new connection by Go itself, and an extender call that still fails is retried by
  // kube-scheduler with the pod. Our own clients (tests, local mode) close after each request.
  absl::Duration keep_alive_timeout = absl::Seconds(5);
  ClusterStateOptions state;
  ExtenderOptions extender;
  webhook::AdmissionOptions admission;
  EventRecorderOptions events;
  // Leader election on a Lease; off = this replica always leads.
  bool leader_elect = false;
  LeaderElectionOptions election;
  bool run_election_loop = true;  // false: tests call elector()->TryAcquireOrRenew()
  // This replica's pod, labelled with its role (POD_NAMESPACE / POD_NAME); empty = no labels.
  std::string pod_namespace;
  std::string pod_name;
  // How often the leader expires reservations; zero = never by itself (tests call
  // ExpireReservations()).
  absl::Duration expiry_interval = absl::Seconds(30);
  // The defragmenter (defragmenter.h): off by default. When not off the leader runs a pass every
  // defrag_interval (zero = never by itself: tests call RunDefragPass()).
  DefragmenterOptions defrag;
  absl::Duration defrag_interval = absl::Seconds(15);
  // The requeuer (requeuer.h): the leader labels a node when its MIG capacity grew while MIG pods
  // are pending, every requeue.interval (zero = never by itself: tests call RunRequeuePass()).
  RequeueOptions requeue;
  // The mode switcher (mode_switcher.h): off unless mode_switch.config is enabled; then the leader
  // runs a pass every mode_switch.interval (zero = never by itself: tests call
  // RunModeSwitchPass()).
  ModeSwitcherOptions mode_switch;
  // The largest body of any endpoint: /filter's ExtenderArgs (16 MiB); an AdmissionReview is then
  // held to its own 7 MiB and a /bind body to 64 KiB as they are parsed (common/bounded_json.h).
  size_t max_body_bytes = kExtenderArgsJsonLimits.max_bytes;
  // HTTP threads, shared by /filter, /bind and the webhooks. kube-scheduler binds every pod of a
  // burst at once and a bind may wait up to 75 s for the node lock in one of them (lock_queue.h),
  // so there must be room for a burst's binds besides the filters and webhooks: at most 3/4 of
  // the threads wait for node locks (16 threads stalled a 56-pod burst for 90 s as filters and
  // webhooks queued behind waiting binds; 64: 5.8 s, bench_burst).
  int threads = 128;
  kube::InformerOptions informer;  // filters are set by the server
  // GET /layout's renderers (ops::RenderLayoutHtml and ops::LayoutJson; injected because the ops
  // library builds on this one). Unset: GET /layout answers 404 (?format=json: 404 too).
  std::function<std::string(const std::vector<NodeReport>&, absl::Time)> layout_html;
  std::function<std::string(const std::vector<NodeReport>&)> layout_json;
  // GET /live's renderer (ops::LivePageRenderer()); unset (no page function): /live answers 404.
  LivePageRenderer live;
};

class SchedulerServer {
 public:
  // Starts the informers, the election and the HTTP server. Errors: kInvalidArgument for unusable
  // TLS files or options, kUnavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<SchedulerServer>> Start(kube::KubeClient& client,
                                                                const Clock& clock,
                                                                SchedulerServerOptions options);
  ~SchedulerServer();  // Stop()
  SchedulerServer(const SchedulerServer&) = delete;
  SchedulerServer& operator=(const SchedulerServer&) = delete;

  // Stops serving, the loops and the informers; a leader hands its lease back. Idempotent.
  void Stop();

  int port() const { return port_; }
  std::string url() const;  // "http(s)://HOST:PORT"

  bool Ready() const;  // informers synced
  bool WaitUntilReady(absl::Duration timeout) const;
  // Whether this replica may write now (leader, or no election) — "" when yes, else why not.
  std::string WriteGate() const;

  ClusterState& state() { return *state_; }
  Extender& extender() { return *extender_; }
  EventRecorder& events() { return *events_; }
  SchedulerMetrics& metrics() { return *metrics_; }
  LeaderElector* elector() { return elector_.get(); }  // null without leader election
  webhook::CertReloader* cert_reloader() { return cert_reloader_.get(); }
  ClientCertAuth* client_auth() { return client_auth_.get(); }  // null without a client CA
  const SchedulerServerOptions& options() const { return options_; }

  std::string MetricsText() const;
  // What GET /live shows now.
  LiveSnapshot Live() const;
  Extender::ExpiryResult ExpireReservations() { return extender_->ExpireReservations(); }
  // One defragmenter pass when this replica may write (else kFailedPrecondition with why not).
  absl::StatusOr<Defragmenter::Outcome> RunDefragPass();
  Defragmenter& defragmenter() { return *defragmenter_; }
  // One requeuer pass when this replica may write (else kFailedPrecondition with why not).
  absl::StatusOr<Requeuer::Outcome> RunRequeuePass();
  const Requeuer& requeuer() const { return *requeuer_; }
  // One mode switcher pass when this replica may write (else kFailedPrecondition with why not).
  absl::StatusOr<ModeSwitcher::Outcome> RunModeSwitchPass();
  const ModeSwitcher& mode_switcher() const { return *mode_switcher_; }

 private:
  SchedulerServer(kube::KubeClient& client, const Clock& clock, SchedulerServerOptions options);
  absl::Status Init();
  absl::Status Listen();
  // The defragmenter, then the expiry and defragmenter loops (by their intervals).
  void StartLoops();
  void OnLeadership(bool leading, const std::string& previous_holder);
  // Feeds node_capacity_ (when the webhook's instance bound is ours to keep).
  void UpdateNodeCapacity(const kube::Object& node);
  // False (and `res` holds the 401 answer) when client authentication is on and the caller of an
  // extender verb did not authenticate.
  bool AuthenticateExtenderCall(const httplib::Request& req, httplib::Response& res) const;
  // False (and `res` holds the 401 or 403 answer) when GET /layout may not be served to `req`.
  bool AuthorizeLayout(const httplib::Request& req, httplib::Response& res) const;
  void HandleLayout(const std::string& node, const std::string& format,
                    httplib::Response& res) const;
  // GET /live and its parts: `part` is "page", "body", "script" or "style".
  void HandleLive(std::string_view part, httplib::Response& res) const;

  kube::KubeClient& client_;
  const Clock& clock_;
  SchedulerServerOptions options_;

  std::unique_ptr<ClusterState> state_;
  std::unique_ptr<SchedulerMetrics> metrics_;
  std::unique_ptr<EventRecorder> events_;
  std::unique_ptr<Extender> extender_;
  std::unique_ptr<Defragmenter> defragmenter_;
  std::unique_ptr<Requeuer> requeuer_;
  std::unique_ptr<ModeSwitcher> mode_switcher_;
  std::unique_ptr<webhook::AdmissionHandler> admission_;
  std::unique_ptr<webhook::NodeCapacityIndex> node_capacity_;  // null: max_instances_per_node given
  std::unique_ptr<webhook::CertReloader> cert_reloader_;
  std::unique_ptr<ClientCertAuth> client_auth_;
  std::unique_ptr<kube::Informer> pods_;
  std::unique_ptr<kube::Informer> nodes_;
  std::unique_ptr<LeaderElector> elector_;

  std::unique_ptr<httplib::Server> http_;
  std::thread listener_;
  int port_ = 0;

  dynmig::Mutex loop_mu_;
  dynmig::CondVar loop_cv_;
  bool stopped_ ABSL_GUARDED_BY(loop_mu_) = false;
  std::thread expiry_thread_;
  std::thread defrag_thread_;
  std::thread requeue_thread_;
  std::thread mode_switch_thread_;
};

}  // namespace dynmig::scheduler
