// kube_bench: watch throughput and list latency for many pods, in-memory API server over HTTP +
// RestKubeClient. Prints figures; asserts nothing about timings.
//
//   build/bin/bench_kube [--pods N]    (default 50000)
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "kube/in_memory_api_server.h"
#include "kube/informer.h"
#include "kube/rest_kube_client.h"
#include "protocol/annotations.h"

namespace dynmig::kube {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string Key(std::string_view key) { return std::string(key); }

// A pod roughly the size of a scheduled GPU pod with HAMi-style annotations (~1.3 KB of JSON).
Object BenchPod(int i) {
  const std::string node = fmt::format("gpu-node-{:03}", i % 500);
  return Object{
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata",
       {{"name", fmt::format("job-{:06}", i)},
        {"namespace", fmt::format("team-{}", i % 20)},
        {"labels", {{"app", "trainer"}, {"job", fmt::format("job-{}", i / 8)}, {"tier", "gpu"}}},
        {"annotations",
         {{Key(protocol::kVgpuNodeAnnotation), node},
          {Key(protocol::kBindPhaseAnnotation), "success"},
          {Key(protocol::kDevicesAllocatedAnnotation),
           "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,10240,0:;"},
          {Key(protocol::kMigAllocationsAnnotation),
           R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-0fc3eda5","profile":"1g.10gb","placement":{"start":3,"size":1}}])"}}}}},
      {"spec",
       {{"nodeName", node},
        {"schedulerName", "dynmig-scheduler"},
        {"containers",
         {{{"name", "main"},
           {"image", "nvcr.io/nvidia/pytorch:24.01-py3"},
           {"command", {"python", "train.py", "--epochs", "10"}},
           {"resources",
            {{"limits",
              {{Key(protocol::kResourceCount), "1"}, {Key(protocol::kResourceMemory), "10240"}}},
             {"requests", {{"cpu", "4"}, {"memory", "16Gi"}}}}}}}}}},
      {"status",
       {{"phase", "Running"},
        {"podIP", fmt::format("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255)},
        {"conditions",
         {{{"type", "PodScheduled"}, {"status", "True"}},
          {{"type", "Ready"}, {"status", "True"}}}}}}};
}

// Events seen by a watch callback, with a bounded (real-time) wait for a number of them.
class Counter {
 public:
  void Add() {
    dynmig::MutexLock lock(&mu_);
    ++count_;
  }
  int64_t count() const {
    dynmig::MutexLock lock(&mu_);
    return count_;
  }
  bool WaitFor(int64_t n, absl::Duration timeout) const {
    dynmig::MutexLock lock(&mu_);
    const auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return count_ >= n; };
    return mu_.AwaitWithTimeout(dynmig::Condition(&reached), timeout);
  }

 private:
  mutable dynmig::Mutex mu_;
  int64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

// What every measurement runs against.
struct Bench {
  InMemoryApiServer& server;
  RestKubeClient& client;
  int pods;
};

// 1. Watch throughput: a watch is open, the store takes `pods` creates; time until the client's
//    callback has seen all of them (server serialization + chunked HTTP + parse + callback).
bool BenchWatchThroughput(const Bench& b) {
  Counter seen;
  auto list = b.client.ListPods({});
  auto watch =
      b.client.WatchPods({.resource_version = list->resource_version, .allow_bookmarks = false},
                         [&](const WatchEvent& e) {
                           if (e.type == WatchEventType::kAdded) seen.Add();
                         });
  if (!watch.ok()) {
    fmt::print(stderr, "watch failed: {}\n", std::string(watch.status().message()));
    return false;
  }
  const auto start = Clock::now();
  std::thread writer([&] {
    for (int i = 0; i < b.pods; ++i) {
      Object pod = BenchPod(i);
      const std::string ns = Namespace(pod);
      (void)b.server.store().Create(Resource::kPods, ns, pod);
    }
  });
  writer.join();
  const auto written = Clock::now();
  const bool all = seen.WaitFor(b.pods, absl::Seconds(120));
  const auto done = Clock::now();
  fmt::print(
      "watch throughput (store writes -> HTTP watch -> RestKubeClient callback): {} events in "
      "{:.2f} s = {:.0f} events/s{} (writes alone {:.2f} s)\n",
      seen.count(), Seconds(done - start), seen.count() / Seconds(done - start),
      all ? "" : " [INCOMPLETE]", Seconds(written - start));
  (*watch)->Stop();
  return true;
}

// 2. Watch from resourceVersion "": the current state as ADDED events.
void BenchWatchInitialState(const Bench& b) {
  Counter seen;
  const auto start = Clock::now();
  auto watch = b.client.WatchPods({.allow_bookmarks = false}, [&](const WatchEvent& e) {
    if (e.type == WatchEventType::kAdded) seen.Add();
  });
  const bool all = watch.ok() && seen.WaitFor(b.pods, absl::Seconds(120));
  const auto done = Clock::now();
  fmt::print(
      "watch initial state (resourceVersion unset): {} ADDED events in {:.2f} s = {:.0f} "
      "events/s{}\n",
      seen.count(), Seconds(done - start), seen.count() / Seconds(done - start),
      all ? "" : " [INCOMPLETE]");
  if (watch.ok()) (*watch)->Stop();
}

// 3. List latency, one request and paginated, and with a field selector.
void BenchListLatency(const Bench& b) {
  auto time_list = [&](int64_t limit, size_t* items) {
    const auto start = Clock::now();
    auto list = b.client.ListPods({.limit = limit});
    const auto took = Clock::now() - start;
    *items = list.ok() ? list->items.size() : 0;
    return Seconds(took);
  };
  for (int64_t limit : {int64_t{0}, int64_t{500}}) {
    std::vector<double> runs;
    size_t items = 0;
    for (int r = 0; r < 3; ++r) runs.push_back(time_list(limit, &items));
    std::sort(runs.begin(), runs.end());
    fmt::print("list latency, {} ({} pods): min {:.3f} s, median {:.3f} s, max {:.3f} s\n",
               limit == 0
                   ? "one request"
                   : fmt::format("limit={} ({} requests)", limit, (b.pods + limit - 1) / limit),
               items, runs[0], runs[1], runs[2]);
  }
  const auto start = Clock::now();
  auto list = b.client.ListPods({.field_selector = "spec.nodeName=gpu-node-007"});
  fmt::print(
      "list latency, field selector spec.nodeName (server filters {} pods to {}): "
      "{:.4f} s\n",
      b.pods, list.ok() ? list->items.size() : 0, Seconds(Clock::now() - start));
}

// 4. Informer initial sync (paginated list + watch start).
void BenchInformerSync(const Bench& b) {
  Informer informer(b.client, Resource::kPods);
  const auto start = Clock::now();
  informer.Start();
  const bool synced = informer.WaitForSync(absl::Seconds(120));
  fmt::print("informer initial sync ({} pods, pages of 500): {:.2f} s{}\n", informer.size(),
             Seconds(Clock::now() - start), synced ? "" : " [TIMEOUT]");
  informer.Stop();
}

// 5. Request rate of small writes over HTTP (one thread, keep-alive).
void BenchPatchRate(const Bench& b) {
  constexpr int kPatches = 2000;
  const auto start = Clock::now();
  int ok = 0;
  for (int i = 0; i < kPatches; ++i) {
    Object pod = BenchPod(i % b.pods);
    ok +=
        b.client.PatchPodAnnotations(Namespace(pod), Name(pod), {{"bench/seq", std::to_string(i)}})
            .ok();
  }
  const double took = Seconds(Clock::now() - start);
  fmt::print(
      "annotation merge-patch over HTTP (1 client thread): {} ok in {:.2f} s = {:.0f} "
      "req/s\n",
      ok, took, ok / took);
}

int Main(int pods) {
  InMemoryApiServerOptions options;
  options.store.watch_history = static_cast<size_t>(pods) + 1000;
  options.gc_interval = absl::ZeroDuration();
  auto server = InMemoryApiServer::Start(options);
  if (!server.ok()) {
    fmt::print(stderr, "bench_kube: {}\n", std::string(server.status().message()));
    return 1;
  }
  RestConfig config;
  config.server = (*server)->url();
  config.request_timeout = absl::Seconds(120);
  auto client = RestKubeClient::Create(config);
  if (!client.ok()) return 1;
  fmt::print("bench_kube: {} pods, {} bytes of JSON per pod, server {}\n", pods,
             BenchPod(1).dump().size(), (*server)->url());
  const Bench bench{**server, **client, pods};
  if (!BenchWatchThroughput(bench)) return 1;
  BenchWatchInitialState(bench);
  BenchListLatency(bench);
  BenchInformerSync(bench);
  BenchPatchRate(bench);
  client->reset();
  (*server)->Stop();
  return 0;
}

}  // namespace
}  // namespace dynmig::kube

int main(int argc, char** argv) {
  int pods = 50000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--pods") == 0 && i + 1 < argc) pods = std::atoi(argv[++i]);
  }
  if (pods <= 0) {
    fmt::print(stderr, "usage: bench_kube [--pods N]\n");
    return 2;
  }
  return dynmig::kube::Main(pods);
}
