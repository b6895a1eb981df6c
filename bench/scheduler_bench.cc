// /filter over HTTP at cluster scale: 1,000 and 5,000 nodes x 8 A100-SXM4-40GB GPUs, half of the
// slices reserved (per node: GPUs 0-3 hold a 3g.20gb at slices 4-7, GPUs 4-5 a 7g.40gb, GPUs 6-7
// are free: 6 pods per node). The API server (the in-memory one) runs in a forked child process,
// filled directly through its store, so the figures for memory are the scheduler's own: informer
// caches, cluster state and HTTP server. The scheduler lists and watches it over HTTP like in a
// cluster; filters are sent one at a time (latency) and from 4 threads (throughput), each with
// every node as a candidate (NodeNames) and a fresh pending pod asking 1g, 2g or 3g. For scale, the
// same run times the planner alone in process (mig::PlanPod over the scheduler's own node views of
// this cluster, the question one filter answers) and prints the filter's rate as a share of it.
// By default the extender runs as deploy/ runs it: HTTPS with kube-scheduler's client certificate
// (--extender-client-ca), so the request's Pod is kube-scheduler's own view and the filter reads
// nothing from the API. --plain: HTTP without client authentication, where each filter first
// reads the pod from the API server (bind_guard.h) and the figures include that round trip.
// Prints figures; asserts nothing.
//
//   bench_scheduler [--nodes 1000,5000] [--filters 1000] [--plain] [--requeue-ms 1000]
//   (--requeue-ms: the requeuer loop's interval, as deployed 1000; 0: no loop)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/clock.h"
#include "fmt/format.h"
#include "kube/in_memory_api_server.h"
#include "kube/object.h"
#include "kube/rest_kube_client.h"
#include "mig/catalogue.h"
#include "mig/node_planner.h"
#include "protocol/annotations.h"
#include "protocol/device_config.h"
#include "protocol/mig_allocations.h"
#include "protocol/node_register.h"
#include "scheduler/server.h"
#include "spdlog/spdlog.h"
#include "webhook/pki.h"

namespace {

using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;
using namespace dynmig;

constexpr int kGpusPerNode = 8;
constexpr int kThreads = 4;

double Since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// VmHWM and VmRSS of this process, MiB.
std::pair<double, double> Memory() {
  std::ifstream in("/proc/self/status");
  std::string line;
  double hwm = 0, rss = 0;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) hwm = std::atof(line.c_str() + 6) / 1024;
    if (line.rfind("VmRSS:", 0) == 0) rss = std::atof(line.c_str() + 6) / 1024;
  }
  return {hwm, rss};
}

// CPU seconds used so far by this process (every thread) or by the calling thread.
double CpuSeconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

std::string NodeName(int i) { return fmt::format("node-{:05d}", i); }
std::string Gpu(int node, int gpu) { return fmt::format("GPU-{:05d}-{}", node, gpu); }

json Pod(const std::string& ns, const std::string& name, int64_t mem) {
  return {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", name}, {"namespace", ns}, {"annotations", json::object()}}},
      {"spec",
       {{"schedulerName", "dynmig-scheduler"},
        {"containers",
         json::array({{{"name", "main"},
                       {"image", "cuda"},
                       {"resources",
                        {{"limits",
                          {{std::string(protocol::kResourceCount), "1"},
                           {std::string(protocol::kResourceMemory), std::to_string(mem)}}}}}}})}}}};
}

// The child: an in-memory API server with the cluster in it. Writes its port to `port_fd`, then
// serves until `control_fd` is closed by the parent.
[[noreturn]] void RunApiServer(int nodes, int pending, int port_fd, int control_fd) {
  spdlog::set_level(spdlog::level::warn);
  kube::InMemoryApiServerOptions options;
  options.threads = 32;
  options.store.watch_history = 20000;
  auto server = kube::InMemoryApiServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "api server: %s\n", std::string(server.status().message()).c_str());
    _exit(1);
  }
  kube::ApiStore& store = (*server)->store();
  const auto& cap = (*mig::FindModel("A100-SXM4-40GB"))->capability;
  std::vector<const mig::ProfileSpec*> base;
  for (const auto& p : cap.profiles) {
    if (p.name.find_first_of("+-") == std::string::npos) base.push_back(&p);
  }
  for (int n = 0; n < nodes; ++n) {
    std::vector<protocol::DeviceInfo> infos;
    for (int g = 0; g < kGpusPerNode; ++g) {
      infos.push_back(
          protocol::MigDeviceInfo({Gpu(n, g), static_cast<uint32_t>(g), 0, true}, cap, base));
    }
    json node = {{"apiVersion", "v1"},
                 {"kind", "Node"},
                 {"metadata",
                  {{"name", NodeName(n)},
                   {"annotations",
                    {{std::string(protocol::kNodeRegisterAnnotation),
                      protocol::EncodeNodeRegister(infos)}}}}},
                 {"status", {{"allocatable", {{std::string(protocol::kResourceCount), "8"}}}}}};
    (void)store.Create(kube::Resource::kNodes, "", node);
    for (int g = 0; g < 6; ++g) {
      const bool full = g >= 4;
      protocol::MigAllocation a;
      a.gpu_uuid = Gpu(n, g);
      a.profile = full ? "7g.40gb" : "3g.20gb";
      a.placement = full ? mig::Placement{0, 8} : mig::Placement{4, 4};
      a.runtime = protocol::RuntimeIdentity{fmt::format("MIG-{:05d}-{}", n, g), full ? 0u : 2u, 0};
      json pod = Pod("running", fmt::format("run-{:05d}-{}", n, g), full ? 39000 : 19000);
      auto& ann = pod["metadata"]["annotations"];
      ann[std::string(protocol::kVgpuNodeAnnotation)] = NodeName(n);
      ann[std::string(protocol::kVgpuTimeAnnotation)] = "1700000000";
      ann[std::string(protocol::kMigAllocationsAnnotation)] = protocol::EncodeMigAllocations({a});
      const std::string dev = fmt::format("{},NVIDIA A100-SXM4-40GB,{},{}:;", a.gpu_uuid,
                                          full ? 40192 : 19968, full ? 100 : 43);
      ann[std::string(protocol::kDevicesAllocatedAnnotation)] = dev;
      ann[std::string(protocol::kBindPhaseAnnotation)] = std::string(protocol::kBindPhaseSuccess);
      pod["spec"]["nodeName"] = NodeName(n);
      pod["status"] = {{"phase", "Running"}};
      (void)store.Create(kube::Resource::kPods, "running", pod);
    }
  }
  const int64_t mems[] = {4000, 9000, 19000};
  for (int i = 0; i < pending; ++i) {
    (void)store.Create(kube::Resource::kPods, "bench",
                       Pod("bench", fmt::format("p-{:06d}", i), mems[i % 3]));
  }
  const int port = (*server)->port();
  if (write(port_fd, &port, sizeof(port)) != sizeof(port)) _exit(1);
  char c;
  while (read(control_fd, &c, 1) > 0) {
  }
  (*server)->Stop();
  _exit(0);
}

// A minimal keep-alive HTTP/1.1 client for POSTs to 127.0.0.1 (the benchmark measures the server,
// not a client library).
class HttpConnection {
 public:
  // With `tls`, the connection is HTTPS with the context's client certificate.
  explicit HttpConnection(int port, SSL_CTX* tls = nullptr) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd_);
      fd_ = -1;
    }
    int one = 1;
    if (fd_ >= 0) setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (fd_ >= 0 && tls != nullptr) {
      ssl_ = SSL_new(tls);
      SSL_set_fd(ssl_, fd_);
      if (SSL_connect(ssl_) != 1) {
        std::printf("TLS handshake with the extender failed: %s\n",
                    ERR_error_string(ERR_get_error(), nullptr));
        SSL_free(ssl_);
        ssl_ = nullptr;
        close(fd_);
        fd_ = -1;
      }
    }
  }
  ~HttpConnection() {
    if (ssl_ != nullptr) {
      SSL_shutdown(ssl_);
      SSL_free(ssl_);
    }
    if (fd_ >= 0) close(fd_);
  }
  // Returns the status code (-1 on transport failure) and fills `body`.
  int Post(const std::string& path, const std::string& payload, std::string& body) {
    if (fd_ < 0) return -1;
    const std::string request = fmt::format(
        "POST {} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: {}\r\n\r\n",
        path, payload.size());
    if (!WriteAll(request) || !WriteAll(payload)) return -1;
    buffer_.clear();
    size_t header_end;
    while ((header_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (!ReadMore()) return -1;
    }
    const int status = std::atoi(buffer_.c_str() + 9);
    size_t length = 0;
    const size_t cl = buffer_.find("Content-Length: ");
    if (cl != std::string::npos && cl < header_end) length = std::atoll(buffer_.c_str() + cl + 16);
    while (buffer_.size() < header_end + 4 + length) {
      if (!ReadMore()) return -1;
    }
    body.assign(buffer_, header_end + 4, length);
    return status;
  }

 private:
  bool WriteAll(const std::string& data) {
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ssl_ != nullptr ? SSL_write(ssl_, data.data() + done,
                                                    static_cast<int>(data.size() - done))
                                        : write(fd_, data.data() + done, data.size() - done);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }
  bool ReadMore() {
    char chunk[65536];
    const ssize_t n =
        ssl_ != nullptr ? SSL_read(ssl_, chunk, sizeof(chunk)) : read(fd_, chunk, sizeof(chunk));
    if (n <= 0) return false;
    buffer_.append(chunk, static_cast<size_t>(n));
    return true;
  }
  int fd_ = -1;
  SSL* ssl_ = nullptr;
  std::string buffer_;
};

// A CA, the extender's serving certificate and kube-scheduler's client certificate, written to a
// temporary directory; the client context that presents the client certificate.
struct BenchPki {
  std::string dir, ca_file, cert_file, key_file;
  SSL_CTX* client = nullptr;
  ~BenchPki() {
    if (client != nullptr) SSL_CTX_free(client);
    std::error_code ignored;
    if (!dir.empty()) std::filesystem::remove_all(dir, ignored);
  }
  bool Make() {
    char tmpl[] = "/tmp/bench_scheduler.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return false;
    dir = tmpl;
    auto ca = webhook::MakeCa("bench-ca");
    if (!ca.ok()) return false;
    auto server = webhook::IssueCert(*ca, {.common_name = "dynmig-scheduler",
                                           .sans = {"IP:127.0.0.1"},
                                           .usage = webhook::CertUsage::kServer});
    auto kube_scheduler = webhook::IssueCert(
        *ca, {.common_name = "kube-scheduler", .sans = {}, .usage = webhook::CertUsage::kClient});
    if (!server.ok() || !kube_scheduler.ok()) return false;
    ca_file = dir + "/ca.crt";
    cert_file = dir + "/tls.crt";
    key_file = dir + "/tls.key";
    const std::string client_cert = dir + "/client.crt", client_key = dir + "/client.key";
    for (const auto& [path, text] :
         std::vector<std::pair<std::string, std::string>>{{ca_file, ca->cert_pem},
                                                          {cert_file, server->cert_pem},
                                                          {key_file, server->key_pem},
                                                          {client_cert, kube_scheduler->cert_pem},
                                                          {client_key, kube_scheduler->key_pem}}) {
      if (!webhook::WritePrivateFile(path, text).ok()) return false;
    }
    client = SSL_CTX_new(TLS_client_method());
    return client != nullptr &&
           SSL_CTX_use_certificate_file(client, client_cert.c_str(), SSL_FILETYPE_PEM) == 1 &&
           SSL_CTX_use_PrivateKey_file(client, client_key.c_str(), SSL_FILETYPE_PEM) == 1 &&
           SSL_CTX_load_verify_locations(client, ca_file.c_str(), nullptr) == 1 &&
           (SSL_CTX_set_verify(client, SSL_VERIFY_PEER, nullptr), true);
  }
};

struct Stats {
  double p50_ms = 0, p99_ms = 0, max_ms = 0, per_second = 0;
  int reserved = 0, pending = 0, errors = 0;
};

// The API server in a forked child, filled with the cluster; serves until Stop().
struct ApiChild {
  pid_t pid = -1;
  int port = 0;
  int control_fd = -1;  // closing it ends the child
  double fill_s = 0;    // seconds until it served

  // False when the child did not start (printed).
  bool Start(int nodes, int pending) {
    int port_pipe[2], control_pipe[2];
    if (pipe(port_pipe) != 0 || pipe(control_pipe) != 0) return false;
    const auto t_fill = SteadyClock::now();
    pid = fork();
    if (pid == 0) {
      close(port_pipe[0]);
      close(control_pipe[1]);
      RunApiServer(nodes, pending, port_pipe[1], control_pipe[0]);
    }
    close(port_pipe[1]);
    close(control_pipe[0]);
    control_fd = control_pipe[1];
    if (read(port_pipe[0], &port, sizeof(port)) != sizeof(port)) {
      std::printf("api server failed to start\n");
      return false;
    }
    fill_s = Since(t_fill);
    return true;
  }
  void Stop() {
    close(control_fd);
    int status = 0;
    waitpid(pid, &status, 0);
  }
};

// The planner alone, in process, on this cluster: one pod (1g, 2g, 3g in turn) over every node.
struct PlannerFigures {
  double per_second = 0;
  double cpu_ms = 0;  // CPU time of one decision
};

PlannerFigures MeasurePlanner(scheduler::SchedulerServer& s, const Clock& clock, int nodes) {
  std::vector<mig::NodeView> views;
  for (int i = 0; i < nodes; ++i) {
    auto v = s.state().View(NodeName(i), clock.Now());
    if (v.has_value()) views.push_back(std::move(*v));
  }
  std::vector<mig::PodRequest> requests(3);
  const uint64_t mib[] = {4000, 9000, 19000};
  for (int k = 0; k < 3; ++k) requests[k].containers.push_back({"main", false, 1, {mib[k], 0}});
  const int reps = 300;
  int fits = 0;
  const auto t = SteadyClock::now();
  const double cpu = CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
  for (int r = 0; r < reps; ++r)
    fits += mig::PlanPod(std::span(views), requests[r % 3]).chosen >= 0;
  PlannerFigures out;
  out.per_second = reps / Since(t);
  out.cpu_ms = (CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - cpu) * 1000 / reps;
  if (fits != reps) std::printf("(the planner found no node for %d pods)\n", reps - fits);
  return out;
}

// The /filter requests of the run: pod i's request body, built outside the timed part.
class FilterRequests {
 public:
  FilterRequests(const std::vector<kube::Object>& pending, int nodes) {
    std::vector<std::string> names;
    for (int i = 0; i < nodes; ++i) names.push_back(NodeName(i));
    names_json_ = json(names).dump();
    for (const auto& pod : pending) pods_.push_back(pod.dump());
    std::sort(pods_.begin(), pods_.end());
  }
  std::string Body(int i) const {
    return "{\"Pod\":" + pods_[i] + ",\"Nodes\":null,\"NodeNames\":" + names_json_ + "}";
  }

 private:
  std::string names_json_;
  std::vector<std::string> pods_;
};

// One /filter: its latency in ms, its outcome counted in `st`.
double Filter(HttpConnection& http, const std::string& body, Stats& st) {
  std::string answer;
  const auto t = SteadyClock::now();
  const int status = http.Post("/filter", body, answer);
  const double ms = Since(t) * 1000;
  if (status != 200 || answer.find("\"Error\":\"\"") == std::string::npos) {
    ++st.errors;
  } else if (answer.find("\"NodeNames\":[]") != std::string::npos) {
    ++st.pending;
  } else {
    ++st.reserved;
  }
  return ms;
}

// One at a time: latency. `cpu_ms`: CPU time of this process (scheduler and client) per filter.
Stats MeasureSequential(int port, SSL_CTX* tls, const FilterRequests& requests, int filters,
                        double* cpu_ms) {
  Stats seq;
  std::vector<double> lat;
  {
    HttpConnection http(port, tls);
    const auto t = SteadyClock::now();
    const double cpu = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
    for (int i = 0; i < filters; ++i) lat.push_back(Filter(http, requests.Body(i), seq));
    seq.per_second = filters / Since(t);
    *cpu_ms = (CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - cpu) * 1000 / filters;
  }
  std::sort(lat.begin(), lat.end());
  seq.p50_ms = lat[lat.size() / 2];
  seq.p99_ms = lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
  seq.max_ms = lat.back();
  return seq;
}

// kThreads at once: throughput, over requests [first, first + count).
Stats MeasureParallel(int port, SSL_CTX* tls, const FilterRequests& requests, int first,
                      int count) {
  Stats par;
  std::vector<Stats> per_thread(kThreads);
  std::vector<std::vector<double>> par_lat(kThreads);
  {
    const auto t = SteadyClock::now();
    std::vector<std::thread> threads;
    for (int k = 0; k < kThreads; ++k) {
      threads.emplace_back([&, k] {
        HttpConnection http(port, tls);
        for (int i = first + k; i < first + count; i += kThreads) {
          par_lat[k].push_back(Filter(http, requests.Body(i), per_thread[k]));
        }
      });
    }
    for (auto& th : threads) th.join();
    par.per_second = count / Since(t);
  }
  std::vector<double> all;
  for (int k = 0; k < kThreads; ++k) {
    par.reserved += per_thread[k].reserved;
    par.pending += per_thread[k].pending;
    par.errors += per_thread[k].errors;
    all.insert(all.end(), par_lat[k].begin(), par_lat[k].end());
  }
  std::sort(all.begin(), all.end());
  par.p50_ms = all[all.size() / 2];
  par.p99_ms = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  return par;
}

// What one run measured.
struct RunFigures {
  int nodes = 0, filters = 0, concurrent = 0;
  bool plain = false;
  double fill_s = 0, sync_s = 0;
  PlannerFigures planner;
  Stats seq, par;
  double filter_cpu_ms = 0;
  double rss_idle = 0, rss = 0, hwm = 0;
  double requeue_p50_ms = 0, requeue_max_ms = 0;  // one requeuer pass (every node's occupancy)
};

void Print(const RunFigures& r) {
  std::printf("%d nodes x %d A100 (%d GPUs, %d running pods, half the slices reserved), %s:\n",
              r.nodes, kGpusPerNode, r.nodes * kGpusPerNode, r.nodes * 6,
              r.plain
                  ? "plain HTTP, no client authentication (each filter reads the pod from the API)"
                  : "HTTPS with kube-scheduler's client certificate (as deployed)");
  std::printf("  api server filled in %.1f s (child process); scheduler synced in %.1f s\n",
              r.fill_s, r.sync_s);
  std::printf(
      "  sequential: %d filters, p50 %.2f ms, p99 %.2f ms, max %.2f ms, %.0f decisions/s "
      "(%d reserved, %d pending, %d errors)\n",
      r.filters, r.seq.p50_ms, r.seq.p99_ms, r.seq.max_ms, r.seq.per_second, r.seq.reserved,
      r.seq.pending, r.seq.errors);
  std::printf(
      "  planner alone in process (mig::PlanPod over the same %d node views): %.0f decisions/s; "
      "sequential /filter reaches %.0f%% of it\n",
      r.nodes, r.planner.per_second, 100.0 * r.seq.per_second / r.planner.per_second);
  // Wall-clock rates move with the machine's load; CPU time per decision much less.
  std::printf(
      "  CPU time per decision: /filter %.3f ms (scheduler and client threads together), planner "
      "alone %.3f ms: %.0f%% (what a quiet machine's rates would show at best)\n",
      r.filter_cpu_ms, r.planner.cpu_ms, 100.0 * r.planner.cpu_ms / r.filter_cpu_ms);
  std::printf(
      "  %d threads: %d filters, p50 %.2f ms, p99 %.2f ms, %.0f decisions/s (%d reserved, "
      "%d pending, %d errors)\n",
      kThreads, r.concurrent, r.par.p50_ms, r.par.p99_ms, r.par.per_second, r.par.reserved,
      r.par.pending, r.par.errors);
  std::printf(
      "  requeuer pass (every node's occupancy, under the cluster state's lock; once a second on "
      "the leader): p50 %.2f ms, max %.2f ms\n",
      r.requeue_p50_ms, r.requeue_max_ms);
  std::printf(
      "  memory: VmRSS %.0f MiB after sync, VmRSS %.0f MiB / VmHWM %.0f MiB after the "
      "filters\n",
      r.rss_idle, r.rss, r.hwm);
  std::fflush(stdout);
}

void Run(int nodes, int filters, bool plain, int requeue_ms) {
  RunFigures r;
  r.nodes = nodes;
  r.filters = filters;
  r.concurrent = filters;  // as many again from kThreads threads
  r.plain = plain;
  ApiChild api;
  if (!api.Start(nodes, r.filters + r.concurrent)) return;
  r.fill_s = api.fill_s;

  kube::RestConfig rest;
  rest.server = fmt::format("http://127.0.0.1:{}", api.port);
  auto client = kube::RestKubeClient::Create(rest);
  const Clock& clock = RealClock();
  scheduler::SchedulerServerOptions options;
  options.state.allowlist = protocol::DefaultAllowlist();
  options.admission.allowlist = options.state.allowlist;
  options.threads = 8;
  options.expiry_interval = absl::ZeroDuration();
  options.requeue.interval = absl::Milliseconds(requeue_ms);  // 0: no requeuer loop
  BenchPki pki;
  SSL_CTX* tls = nullptr;
  if (!plain) {
    if (!pki.Make()) {
      std::printf("could not make the benchmark's certificates\n");
      return;
    }
    options.tls_cert_file = pki.cert_file;
    options.tls_key_file = pki.key_file;
    options.extender_client_ca_file = pki.ca_file;
    tls = pki.client;
  }
  const auto t_sync = SteadyClock::now();
  auto server = scheduler::SchedulerServer::Start(**client, clock, options);
  if (!server.ok()) {
    std::printf("scheduler: %s\n", std::string(server.status().message()).c_str());
    return;
  }
  scheduler::SchedulerServer& s = **server;
  s.WaitUntilReady(absl::Minutes(2));
  r.sync_s = Since(t_sync);
  r.rss_idle = Memory().second;
  r.planner = MeasurePlanner(s, clock, nodes);
  {
    std::vector<double> passes;
    for (int k = 0; k < 21; ++k) {
      const auto t = SteadyClock::now();
      (void)s.RunRequeuePass();
      passes.push_back(Since(t) * 1000);
    }
    std::sort(passes.begin(), passes.end());
    r.requeue_p50_ms = passes[passes.size() / 2];
    r.requeue_max_ms = passes.back();
  }

  auto pending_pods = (*client)->ListPods({.ns = "bench", .limit = 500});
  if (!pending_pods.ok()) return;
  const FilterRequests requests(pending_pods->items, nodes);
  r.seq = MeasureSequential(s.port(), tls, requests, filters, &r.filter_cpu_ms);
  r.par = MeasureParallel(s.port(), tls, requests, filters, r.concurrent);
  std::tie(r.hwm, r.rss) = Memory();
  Print(r);

  s.Stop();
  server->reset();
  api.Stop();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {1000, 5000};
  int filters = 1000;
  int requeue_ms = 1000;  // as deployed (--requeue-interval 1s); --requeue-ms 0: no loop
  bool plain = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--plain") == 0) plain = true;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--plain") == 0) {
      --i;
      continue;
    }
    if (std::strcmp(argv[i], "--nodes") == 0) {
      sizes.clear();
      for (const char* p = argv[i + 1]; *p != '\0';) {
        sizes.push_back(std::atoi(p));
        while (*p != '\0' && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    } else if (std::strcmp(argv[i], "--filters") == 0) {
      filters = std::max(10, std::atoi(argv[i + 1]));
    } else if (std::strcmp(argv[i], "--requeue-ms") == 0) {
      requeue_ms = std::max(0, std::atoi(argv[i + 1]));
    }
  }
  spdlog::set_level(spdlog::level::warn);
  for (int n : sizes) Run(n, filters, plain, requeue_ms);
  return 0;
}
