#include "scheduler/server.h"

#include <httplib.h>

#include <algorithm>

#include "common/strings.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "kube/object.h"
#include "protocol/annotations.h"
#include "spdlog/spdlog.h"

namespace dynmig::scheduler {
namespace {

// The pod informer's handlers: the cluster state, and the pending-pod gauges (a pod bound, by
// this scheduler or another, or deleted is no longer pending).
kube::InformerHandlers PodHandlers(ClusterState& state, SchedulerMetrics& metrics) {
  return {
      .on_add = [&state](const kube::Object& pod) { state.UpsertPod(pod); },
      .on_update =
          [&state, &metrics](const kube::Object&, const kube::Object& pod) {
            state.UpsertPod(pod);
            if (!kube::NodeName(pod).empty()) {
              metrics.PodDone(kube::Namespace(pod) + "/" + kube::Name(pod));
            }
          },
      .on_delete =
          [&state, &metrics](const kube::Object& pod) {
            state.RemovePod(kube::Namespace(pod), kube::Name(pod));
            metrics.PodDone(kube::Namespace(pod) + "/" + kube::Name(pod));
          },
  };
}

constexpr const char* kJson = "application/json";

// The pod name in a lease holder identity "<pod name>_<suffix>" ("" when it has no suffix).
std::string PodOfIdentity(const std::string& identity) {
  const size_t underscore = identity.rfind('_');
  if (underscore == std::string::npos || underscore == 0) return "";
  return identity.substr(0, underscore);
}

}  // namespace

SchedulerServer::SchedulerServer(kube::KubeClient& client, const Clock& clock,
                                 SchedulerServerOptions options)
    : client_(client), clock_(clock), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<SchedulerServer>> SchedulerServer::Start(
    kube::KubeClient& client, const Clock& clock, SchedulerServerOptions options) {
  std::unique_ptr<SchedulerServer> server(new SchedulerServer(client, clock, std::move(options)));
  absl::Status st = server->Init();
  if (!st.ok()) {
    server->Stop();
    return st;
  }
  return server;
}

absl::Status SchedulerServer::Init() {
  if (options_.leader_elect && options_.election.identity.empty()) {
    return absl::InvalidArgumentError("leader election needs an identity");
  }
  if (options_.tls_cert_file.empty() != options_.tls_key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate and a key file");
  }
  if (!options_.tls_cert_file.empty()) {
    auto reloader = webhook::CertReloader::Create(options_.tls_cert_file, options_.tls_key_file);
    if (!reloader.ok()) return reloader.status();
    cert_reloader_ = std::move(*reloader);
  }
  if (!options_.extender_client_ca_file.empty()) {
    if (cert_reloader_ == nullptr) {
      return absl::InvalidArgumentError(
          "an extender client CA needs TLS (a serving certificate and key): client certificates "
          "travel only over HTTPS");
    }
    auto auth = ClientCertAuth::Create(options_.extender_client_ca_file);
    if (!auth.ok()) return auth.status();
    client_auth_ = std::move(*auth);
  }
  // Only kube-scheduler reaches /filter then, and the Pod it sends is its own view of the pod.
  options_.extender.trusted_callers = client_auth_ != nullptr;
  options_.extender.resources = options_.state.resources;
  // Binds waiting for node locks leave threads to the filters and webhooks.
  options_.extender.lock_queue.max_waiters =
      std::max(1, std::min(options_.extender.lock_queue.max_waiters, options_.threads * 3 / 4));
  options_.admission.resources = options_.state.resources;
  state_ = std::make_unique<ClusterState>(options_.state);
  metrics_ = std::make_unique<SchedulerMetrics>();
  events_ = std::make_unique<EventRecorder>(client_, clock_, options_.events);
  extender_ = std::make_unique<Extender>(client_, *state_, clock_, events_.get(), metrics_.get(),
                                         options_.extender);
  extender_->SetGate([this] { return WriteGate(); });
  // The webhook's sizing warnings and preference choices follow the models the nodes register.
  if (!options_.admission.cluster_models) {
    options_.admission.cluster_models = [state = state_.get()] { return state->Models(); };
  }
  // The webhook reads the pod of a binding from the API server (the pod cache keeps metadata
  // only, and a binding races the pod's creation).
  if (!options_.admission.pod_lookup) {
    options_.admission.pod_lookup = [this](const std::string& ns, const std::string& name) {
      return client_.GetPod(ns, name);
    };
  }
  // Instance counts are bounded by the largest node the registers describe.
  if (!options_.admission.max_instances_per_node) {
    node_capacity_ = std::make_unique<webhook::NodeCapacityIndex>(options_.state.allowlist);
    options_.admission.max_instances_per_node = [index = node_capacity_.get()] {
      return index->Max();
    };
  }
  admission_ = std::make_unique<webhook::AdmissionHandler>(options_.admission);

  kube::InformerOptions pod_options = options_.informer;
  // The handlers keep what ClusterState needs; on_delete uses only namespace and name. So the
  // caches keep metadata alone (at 5,000 nodes the full objects took ~165 MB).
  if (!pod_options.cache_transform) pod_options.cache_transform = kube::MetadataOnly;
  // Terminated pods hold nothing: leaving the selector delivers them as deleted.
  pod_options.filter = {};
  pod_options.filter.field_selector = "status.phase!=Succeeded,status.phase!=Failed";
  pods_ = std::make_unique<kube::Informer>(client_, kube::Resource::kPods, pod_options);
  pods_->AddHandlers(PodHandlers(*state_, *metrics_));
  kube::InformerOptions node_options = options_.informer;
  node_options.filter = {};
  if (!node_options.cache_transform) node_options.cache_transform = kube::MetadataOnly;
  nodes_ = std::make_unique<kube::Informer>(client_, kube::Resource::kNodes, node_options);
  nodes_->AddHandlers({
      .on_add =
          [this](const kube::Object& node) {
            state_->UpsertNode(node);
            UpdateNodeCapacity(node);
          },
      .on_update =
          [this](const kube::Object&, const kube::Object& node) {
            state_->UpsertNode(node);
            UpdateNodeCapacity(node);
            extender_->NodeChanged(kube::Name(node));  // its lock may be gone
          },
      .on_delete =
          [this](const kube::Object& node) {
            state_->RemoveNode(kube::Name(node));
            if (node_capacity_ != nullptr) node_capacity_->Remove(kube::Name(node));
          },
  });
  pods_->Start();
  nodes_->Start();

  if (options_.leader_elect) {
    elector_ = std::make_unique<LeaderElector>(client_, clock_, options_.election);
    elector_->OnChange(
        [this](bool leading, const std::string& previous) { OnLeadership(leading, previous); });
    if (options_.run_election_loop) elector_->Start();
  }
  if (absl::Status st = Listen(); !st.ok()) return st;

  StartLoops();
  return absl::OkStatus();
}

void SchedulerServer::StartLoops() {
  DefragmenterOptions d = options_.defrag;
  d.scheduler_name = options_.extender.scheduler_name;
  d.resources = options_.extender.resources;
  d.state = options_.state;
  if (!options_.pod_namespace.empty()) d.rules.system_namespaces.insert(options_.pod_namespace);
  defragmenter_ = std::make_unique<Defragmenter>(client_, *state_, clock_, events_.get(),
                                                 metrics_.get(), std::move(d));
  requeuer_ = std::make_unique<Requeuer>(client_, *state_, clock_, options_.requeue);
  if (options_.requeue.interval > absl::ZeroDuration()) {
    requeue_thread_ = std::thread([this] {
      dynmig::MutexLock lock(&loop_mu_);
      while (!stopped_) {
        clock_.WaitFor(loop_cv_, loop_mu_, options_.requeue.interval,
                       [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_mu_) { return stopped_; });
        if (stopped_) break;
        loop_mu_.Unlock();
        auto result = RunRequeuePass();
        if (result.ok()) {
          for (const auto& e : result->errors) spdlog::warn("requeue: {}", e);
          for (const auto& n : result->labelled) {
            spdlog::info("requeue: MIG capacity freed on node {} while pods wait: labelled {}", n,
                         protocol::kCapacityFreedLabel);
          }
        }
        loop_mu_.Lock();
      }
    });
  }
  if (options_.expiry_interval > absl::ZeroDuration()) {
    expiry_thread_ = std::thread([this] {
      dynmig::MutexLock lock(&loop_mu_);
      while (!stopped_) {
        clock_.WaitFor(loop_cv_, loop_mu_, options_.expiry_interval,
                       [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_mu_) { return stopped_; });
        if (stopped_) break;
        loop_mu_.Unlock();
        auto result = extender_->ExpireReservations();
        for (const auto& e : result.errors) spdlog::warn("reservation expiry: {}", e);
        loop_mu_.Lock();
      }
    });
  }
  if (options_.defrag.mode != DefragMode::kOff && options_.defrag_interval > absl::ZeroDuration()) {
    defrag_thread_ = std::thread([this] {
      dynmig::MutexLock lock(&loop_mu_);
      while (!stopped_) {
        clock_.WaitFor(loop_cv_, loop_mu_, options_.defrag_interval,
                       [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_mu_) { return stopped_; });
        if (stopped_) break;
        loop_mu_.Unlock();
        auto result = RunDefragPass();
        if (!result.ok() && result.status().code() != absl::StatusCode::kFailedPrecondition) {
          spdlog::warn("defragmenter: {}", std::string(result.status().message()));
        } else if (result.ok()) {
          for (const auto& t : result->tidied) spdlog::info("defragmenter: dropped {}", t);
          if (!result->pod.empty()) {
            spdlog::info("defragmenter{}: for {} on {}: evicted {}; failed {}",
                         result->dry_run ? " (dry run)" : "", result->pod, result->node,
                         fmt::join(result->evicted, ", "), fmt::join(result->failed, "; "));
          }
        }
        loop_mu_.Lock();
      }
    });
  }
}

absl::StatusOr<Requeuer::Outcome> SchedulerServer::RunRequeuePass() {
  if (std::string gate = WriteGate(); !gate.empty()) return absl::FailedPreconditionError(gate);
  return requeuer_->RunOnce(metrics_->PendingCount(clock_.Now()));
}

absl::StatusOr<Defragmenter::Outcome> SchedulerServer::RunDefragPass() {
  if (std::string gate = WriteGate(); !gate.empty()) return absl::FailedPreconditionError(gate);
  return defragmenter_->RunOnce();
}

void SchedulerServer::UpdateNodeCapacity(const kube::Object& node) {
  if (node_capacity_ == nullptr) return;
  node_capacity_->Upsert(kube::Name(node),
                         kube::Annotation(node, protocol::kNodeRegisterAnnotation).value_or(""));
}

void SchedulerServer::OnLeadership(bool leading, const std::string& previous_holder) {
  if (options_.pod_name.empty() || options_.pod_namespace.empty()) return;
  auto label = [&](const std::string& pod, std::string_view role) {
    kube::MetadataPatch patch;
    patch.labels[std::string(kRoleLabel)] = std::string(role);
    auto st = client_.PatchPodMetadata(options_.pod_namespace, pod, patch);
    if (!st.ok() && st.status().code() != absl::StatusCode::kNotFound) {
      spdlog::warn("cannot label pod {}/{} {}={}: {}", options_.pod_namespace, pod, kRoleLabel,
                   role, std::string(st.status().message()));
    }
  };
  label(options_.pod_name, leading ? "leader" : "follower");
  if (leading) {
    const std::string previous = PodOfIdentity(previous_holder);
    if (!previous.empty() && previous != options_.pod_name) label(previous, "follower");
  }
}

absl::Status SchedulerServer::Listen() {
  if (cert_reloader_ != nullptr) {
    webhook::CertReloader* reloader = cert_reloader_.get();
    ClientCertAuth* auth = client_auth_.get();
    auto ssl = std::make_unique<httplib::SSLServer>([reloader, auth](SSL_CTX& ctx) {
      return reloader->Install(ctx) && (auth == nullptr || auth->Install(ctx));
    });
    if (!ssl->is_valid()) return absl::InternalError("cannot create the TLS context");
    http_ = std::move(ssl);
  } else {
    http_ = std::make_unique<httplib::Server>();
  }
  const int threads = std::max(2, options_.threads);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(options_.max_body_bytes);
  http_->set_keep_alive_max_count(100000);
  http_->set_keep_alive_timeout(
      std::max<time_t>(1, absl::ToInt64Seconds(options_.keep_alive_timeout)));
  http_->set_read_timeout(30, 0);
  http_->set_write_timeout(30, 0);
  http_->set_tcp_nodelay(true);

  http_->Post("/filter", [this](const httplib::Request& req, httplib::Response& res) {
    if (!AuthenticateExtenderCall(req, res)) return;
    res.set_content(extender_->HandleFilter(req.body), kJson);
  });
  http_->Post("/bind", [this](const httplib::Request& req, httplib::Response& res) {
    if (!AuthenticateExtenderCall(req, res)) return;
    res.set_content(extender_->HandleBind(req.body), kJson);
  });
  http_->Post("/webhook", [this](const httplib::Request& req, httplib::Response& res) {
    res.set_content(admission_->Review(req.body), kJson);
  });
  // The same checks without the mutation, for a ValidatingWebhookConfiguration.
  http_->Post("/validate", [this](const httplib::Request& req, httplib::Response& res) {
    res.set_content(admission_->Review(req.body, /*mutate=*/false), kJson);
  });
  http_->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  http_->Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
    if (Ready()) {
      res.set_content("ok\n", "text/plain");
    } else {
      res.status = 503;
      res.set_content("not ready: the pod and node caches have not synced yet\n", "text/plain");
    }
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(MetricsText(), "text/plain; version=0.0.4; charset=utf-8");
  });
  http_->Get("/layout", [this](const httplib::Request& req, httplib::Response& res) {
    if (!AuthorizeLayout(req, res)) return;
    HandleLayout(req.get_param_value("node"), req.get_param_value("format"), res);
  });
  for (const auto& route : {std::pair<const char*, const char*>{"/live", "page"},
                            {"/live/body", "body"},
                            {"/live/script.js", "script"},
                            {"/live/style.css", "style"}}) {
    const char* part = route.second;
    http_->Get(route.first, [this, part](const httplib::Request& req, httplib::Response& res) {
      if (!AuthorizeLayout(req, res)) return;
      HandleLive(part, res);
    });
  }
  const size_t limit = options_.max_body_bytes;
  http_->set_error_handler(httplib::Server::HandlerWithResponse([limit](const httplib::Request& req,
                                                                        httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string message;
    if (res.status == 413) {
      message =
          fmt::format("request body too large: the limit is {} bytes ({} MiB)", limit, limit >> 20);
    } else if (res.status == 404) {
      message = fmt::format("no such endpoint: {} {}", req.method, req.path);
    } else {
      message = fmt::format("HTTP {}", res.status);
    }
    if (req.path == "/webhook" || req.path == "/validate") {
      res.set_content(nlohmann::json{{"apiVersion", "admission.k8s.io/v1"},
                                     {"kind", "AdmissionReview"},
                                     {"response",
                                      {{"uid", ""},
                                       {"allowed", false},
                                       {"status", {{"code", res.status}, {"message", message}}}}}}
                          .dump(),
                      kJson);
    } else {
      res.set_content(ErrorResult(message).dump(), kJson);
    }
    return httplib::Server::HandlerResponse::Handled;
  }));

  if (options_.port == 0) {
    port_ = http_->bind_to_any_port(options_.host);
    if (port_ <= 0) return absl::UnavailableError(fmt::format("cannot bind {}:0", options_.host));
  } else {
    if (!http_->bind_to_port(options_.host, options_.port)) {
      return absl::UnavailableError(
          fmt::format("cannot bind {}:{} (in use?)", options_.host, options_.port));
    }
    port_ = options_.port;
  }
  listener_ = std::thread([this] { http_->listen_after_bind(); });
  // The listener thread starts on real time whatever clock the server was given (a simulated
  // one would never let this poll end).
  const Clock& real = RealClock();
  const absl::Duration deadline = real.Monotonic() + absl::Seconds(10);
  while (!http_->is_running() && real.Monotonic() < deadline) real.SleepFor(absl::Milliseconds(1));
  if (!http_->is_running()) {
    return absl::UnavailableError(fmt::format("the server on port {} did not start", port_));
  }
  spdlog::info("dynmig scheduler listening on {}", url());
  return absl::OkStatus();
}

std::string SchedulerServer::url() const {
  return fmt::format("{}://{}:{}", cert_reloader_ != nullptr ? "https" : "http", options_.host,
                     port_);
}

bool SchedulerServer::Ready() const {
  return pods_ != nullptr && nodes_ != nullptr && pods_->HasSynced() && nodes_->HasSynced();
}

bool SchedulerServer::WaitUntilReady(absl::Duration timeout) const {
  const absl::Duration deadline = clock_.Monotonic() + timeout;
  if (pods_ == nullptr || nodes_ == nullptr) return false;
  return pods_->WaitForSync(timeout) &&
         nodes_->WaitForSync(std::max(absl::ZeroDuration(), deadline - clock_.Monotonic()));
}

std::string SchedulerServer::WriteGate() const {
  if (!Ready()) {
    return "dynmig-scheduler is not ready: its pod and node caches have not synced yet; retry";
  }
  if (elector_ != nullptr && !elector_->IsLeader()) {
    const std::string holder = elector_->holder();
    return fmt::format(
        "this dynmig-scheduler replica ({}) is not the leader (lease {}/{} held by {}); only the "
        "leader reserves and binds",
        options_.election.identity, options_.election.lease_namespace, options_.election.lease_name,
        holder.empty() ? "nobody yet" : "\"" + holder + "\"");
  }
  return "";
}

bool SchedulerServer::AuthenticateExtenderCall(const httplib::Request& req,
                                               httplib::Response& res) const {
  if (client_auth_ == nullptr) return true;
  absl::Status st = client_auth_->Authenticate(req.ssl);
  if (st.ok()) return true;
  const std::string message =
      fmt::format("{} {} refused: {}", req.method, req.path, std::string(st.message()));
  spdlog::warn("{} (from {}:{})", message, req.remote_addr, req.remote_port);
  metrics_->CountUnauthenticated(req.path);
  res.status = 401;
  res.set_content(ErrorResult(message).dump(), kJson);
  return false;
}

bool SchedulerServer::AuthorizeLayout(const httplib::Request& req, httplib::Response& res) const {
  // A loopback listener is reachable from this host (or pod) alone: the local mode's.
  if (IsLoopbackHost(options_.host)) return true;
  if (client_auth_ != nullptr) return AuthenticateExtenderCall(req, res);
  const std::string message = fmt::format(
      "GET {} refused: it shows the pods of every namespace, so it is served only to callers "
      "with a client certificate of the extender client CA (--extender-client-ca) or on a "
      "loopback listener; this scheduler has neither ({})",
      req.path, options_.host);
  spdlog::warn("{} (from {}:{})", message, req.remote_addr, req.remote_port);
  res.status = 403;
  res.set_content(message + "\n", "text/plain; charset=utf-8");
  return false;
}

void SchedulerServer::HandleLayout(const std::string& node, const std::string& format,
                                   httplib::Response& res) const {
  auto plain = [&res](int status, const std::string& message) {
    res.status = status;
    res.set_content(message + "\n", "text/plain; charset=utf-8");
  };
  const bool as_json = format == "json";
  if (!as_json && !format.empty() && format != "html") {
    return plain(400, fmt::format("format \"{}\": give html (the default) or json", format));
  }
  if (as_json ? !options_.layout_json : !options_.layout_html) {
    return plain(404, fmt::format("this scheduler serves no {} layout (no renderer configured)",
                                  as_json ? "JSON" : "HTML"));
  }
  const absl::Time now = clock_.Now();
  std::vector<NodeReport> reports = state_->Report(now);
  if (!node.empty()) {
    std::vector<NodeReport> one;
    for (auto& r : reports) {
      if (r.name == node) one.push_back(std::move(r));
    }
    if (one.empty()) {
      return plain(404, fmt::format("node \"{}\" is not in the scheduler's view", node));
    }
    reports = std::move(one);
  }
  if (as_json) {
    res.set_content(options_.layout_json(reports), kJson);
  } else {
    res.set_content(options_.layout_html(reports, now), "text/html; charset=utf-8");
  }
}

LiveSnapshot SchedulerServer::Live() const {
  LiveSnapshot s;
  s.now = clock_.Now();
  s.nodes = state_->Report(s.now);
  s.pending = metrics_->PendingPods(s.now, LiveSnapshot::kMaxPending, &s.pending_total);
  s.events = events_->Recent();
  if (s.events.size() > LiveSnapshot::kMaxEvents) s.events.resize(LiveSnapshot::kMaxEvents);
  return s;
}

void SchedulerServer::HandleLive(std::string_view part, httplib::Response& res) const {
  const LivePageRenderer& live = options_.live;
  if (!live.page || !live.body) {
    res.status = 404;
    res.set_content("this scheduler serves no live page (no renderer configured)\n",
                    "text/plain; charset=utf-8");
    return;
  }
  // Only this origin's script, style sheet and fetches; no inline script or style, no frames, no
  // forms, no plugins, no base changes: an injected tag would do nothing even if one got through
  // the escaping.
  res.set_header("Content-Security-Policy",
                 "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                 "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Referrer-Policy", "no-referrer");
  res.set_header("Cache-Control", "no-store");
  if (part == "script") {
    res.set_content(live.script, "text/javascript; charset=utf-8");
  } else if (part == "style") {
    res.set_content(live.style, "text/css; charset=utf-8");
  } else {
    const LiveSnapshot snapshot = Live();
    res.set_content(part == "body" ? live.body(snapshot) : live.page(snapshot),
                    "text/html; charset=utf-8");
  }
}

std::string SchedulerServer::MetricsText() const {
  return metrics_->Render(state_->Report(clock_.Now()), elector_ == nullptr || elector_->IsLeader(),
                          extender_->lock_queue().Waiting(), clock_.Now());
}

SchedulerServer::~SchedulerServer() { Stop(); }

void SchedulerServer::Stop() {
  {
    dynmig::MutexLock lock(&loop_mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  loop_cv_.SignalAll();
  if (extender_ != nullptr) extender_->StopWaiting();
  if (expiry_thread_.joinable()) expiry_thread_.join();
  if (defrag_thread_.joinable()) defrag_thread_.join();
  if (requeue_thread_.joinable()) requeue_thread_.join();
  if (elector_ != nullptr) elector_->Stop();
  // Waits for in-flight requests and, as httplib 0.11 does not wake idle keep-alive connections
  // on stop(), up to options.keep_alive_timeout for those.
  if (http_ != nullptr) http_->stop();
  if (listener_.joinable()) listener_.join();
  if (pods_ != nullptr) pods_->Stop();
  if (nodes_ != nullptr) nodes_->Stop();
}

}  // namespace dynmig::scheduler
