// Burst benchmark: N pods applied at once to one node of the local mode, time from each pod's
// creation to Running (p50/p99/max) and until all run; 1g GPU pods against plain pods (no GPU)
// on the same node, with a configurable simulated NVML latency and kube-scheduler's real retry
// timing (or a faster one). Checks what it measures: every GPU pod got its own MIG device, no two
// live instances overlap on a GPU, and nothing is left once the pods are deleted.
//
//   bench_burst [--pods 56] [--nodes node-a=A100-SXM4-40GBx8] [--gpumem 4000]
//               [--sim-latency none|realistic|create-gi=250ms,...] [--kind both|gpu|plain]
//               [--bursts 1] [--timing-speedup 1] [--timeout 900s] [--scheduler-threads 128]
//               [--kubelet-delay 0] [--warm off|on|both] [--warm-ttl 10m] [--warm-max-per-gpu 7]
//               [--verbose]
//
// --warm on runs with warm instances (device-config.yaml nvidia.migWarmInstances): a deleted
// burst's instances stay idle and the next burst reuses them. --warm both runs the GPU bursts
// twice, on a fresh cluster without and then with warm instances (at least 2 bursts each), and
// compares the time to Running of the repeated bursts. With warm instances the checks also say
// that every live instance no pod has is idle and published (dynmig.io/idle-mig-instances), at
// most --warm-max-per-gpu per GPU, after every burst and at the end.
//
// --kubelet-delay D: each pod is admitted (Allocate) D after the kubelet stand-in sees it bound,
// as a real kubelet takes a while (the node lock is held that long for each GPU pod).
//
// Prints figures; asserts no timing. Exit 1 when a check fails or a burst does not finish.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "fmt/format.h"
#include "kube/informer.h"
#include "kube/object.h"
#include "local/local_cluster.h"
#include "local/node_agent.h"
#include "protocol/annotations.h"
#include "protocol/device_config.h"
#include "protocol/idle_instances.h"
#include "spdlog/spdlog.h"

namespace {

using dynmig::local::LocalCluster;
using nlohmann::json;
namespace protocol = dynmig::protocol;

struct Flags {
  int pods = 56;
  std::string nodes = "node-a=A100-SXM4-40GBx8";
  int64_t gpumem = 4000;  // 1g.5gb on an A100-40GB
  std::string latency = "none";
  std::string kind = "both";
  int bursts = 1;
  double speedup = 1;
  absl::Duration timeout = absl::Seconds(900);
  int scheduler_threads = 128;  // the local mode's default
  // The kubelet stand-in's delay from a pod bound to its admission (Allocate); the real kubelet on
  // the 2-core harness: 0.6 s median during a burst.
  absl::Duration kubelet_delay = absl::ZeroDuration();
  bool verbose = false;      // every component's log line on stderr, with the time since the start
  std::string warm = "off";  // off | on | both
  absl::Duration warm_ttl = absl::Minutes(10);
  int warm_max_per_gpu = 7;
};

json Pod(const std::string& name, bool gpu, int64_t gpumem) {
  json c = {
      {"name", "work"}, {"image", "busybox"}, {"command", json::array({"sh", "-c", "sleep 3600"})}};
  json meta = {{"name", name}, {"namespace", "default"}};
  if (gpu) {
    c["resources"] = {{"limits",
                       {{std::string(protocol::kResourceCount), 1},
                        {std::string(protocol::kResourceMemory), gpumem}}}};
    meta["annotations"] = {
        {std::string(protocol::kVgpuModeAnnotation), std::string(protocol::kVgpuModeMig)}};
  }
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", meta},
          {"spec", {{"restartPolicy", "Never"}, {"containers", json::array({c})}}}};
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(std::ceil(q * v.size())) - 1);
  return v[k];
}

struct BurstResult {
  std::vector<double> seconds;  // per pod, creation to Running
  double all = 0;               // first creation to the last Running
  bool finished = false;
  int failed_scheduling = 0;  // FailedScheduling events of the burst's pods
  int bind_rejected = 0;      // of which a bind refused (the node lock still held after the wait)
  int reused = 0;             // MigInstanceReused events of the burst's pods (warm instances)
  std::vector<std::string> problems;
};

// Watches pods and notes when each first shows Running.
class RunningWatch {
 public:
  explicit RunningWatch(dynmig::kube::KubeClient& client)
      : informer_(client, dynmig::kube::Resource::kPods) {
    dynmig::kube::InformerHandlers h;
    h.on_add = [this](const dynmig::kube::Object& o) { Seen(o); };
    h.on_update = [this](const dynmig::kube::Object&, const dynmig::kube::Object& o) { Seen(o); };
    informer_.AddHandlers(h);
    informer_.Start();
    informer_.WaitForSync(absl::Seconds(30));
  }
  void Seen(const dynmig::kube::Object& o) {
    if (dynmig::kube::Phase(o) != "Running") return;
    std::lock_guard<std::mutex> lock(mu_);
    running_.emplace(dynmig::kube::Name(o), absl::Now());
  }
  std::optional<absl::Time> RunningAt(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = running_.find(name);
    return it == running_.end() ? std::nullopt : std::optional<absl::Time>(it->second);
  }
  void Forget() {
    std::lock_guard<std::mutex> lock(mu_);
    running_.clear();
  }
  size_t Count() {
    std::lock_guard<std::mutex> lock(mu_);
    return running_.size();
  }

 private:
  dynmig::kube::Informer informer_;
  std::mutex mu_;
  std::map<std::string, absl::Time> running_;
};

// With warm instances: every live instance whose MIG UUID no pod has (`owned`) is idle, listed in
// the node's dynmig.io/idle-mig-instances (published within a reconcile cycle or two: waited for),
// and no GPU keeps more than `cap`. Without: there is none.
void CheckSpare(LocalCluster& cluster, dynmig::kube::KubeClient& kube, const std::string& node,
                const std::set<std::string>& owned, int cap, std::vector<std::string>& problems) {
  std::string why;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  do {
    why.clear();
    auto live = cluster.Instances(node);
    auto n = kube.GetNode(node);
    if (!live.ok() || !n.ok()) {
      why = "cannot read the node or its instances";
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    std::set<std::pair<std::string, uint32_t>> spare;  // (GPU UUID, start)
    std::map<std::string, int> per_gpu;
    for (const auto& i : *live) {
      if (owned.count(i.mig_uuid)) continue;
      spare.insert({i.gpu_uuid, i.placement.start});
      if (++per_gpu[i.gpu_uuid] > cap) {
        why = fmt::format("GPU {} keeps {} spare instances, more than {}", i.gpu_uuid,
                          per_gpu[i.gpu_uuid], cap);
      }
    }
    std::set<std::pair<std::string, uint32_t>> idle;
    auto value = dynmig::kube::Annotation(*n, dynmig::protocol::kNodeIdleInstancesAnnotation);
    auto decoded = dynmig::protocol::DecodeIdleInstances(value.value_or("[]"));
    if (!decoded.ok()) {
      why = std::string(decoded.status().message());
    } else {
      for (const auto& i : *decoded) idle.insert({i.gpu_uuid, i.placement.start});
    }
    if (why.empty() && spare != idle) {
      why = fmt::format("{} live instance(s) no pod has, {} published idle, not the same",
                        spare.size(), idle.size());
    }
    if (cap == 0 && why.empty() && !spare.empty()) {
      why = fmt::format("{} instance(s) no pod has", spare.size());
    }
    if (!why.empty()) absl::SleepFor(absl::Milliseconds(100));
  } while (!why.empty() && absl::Now() < deadline);
  if (!why.empty()) problems.push_back("spare instances: " + why);
}

// Every Running GPU pod its own MIG device, live on the node; no two live instances overlap on a
// GPU; when all run (`all`), no live instance beyond theirs (with warm instances: beyond theirs
// and the idle ones, CheckSpare).
void CheckPlacements(LocalCluster& cluster, dynmig::kube::KubeClient& kube, const std::string& node,
                     const std::vector<std::string>& names, bool all, int warm_cap,
                     std::vector<std::string>& problems) {
  auto live = cluster.Instances(node);
  if (!live.ok()) {
    problems.push_back("cannot read the node's instances: " + std::string(live.status().message()));
    return;
  }
  std::set<std::string> live_uuids;
  for (size_t i = 0; i < live->size(); ++i) {
    live_uuids.insert((*live)[i].mig_uuid);
    for (size_t j = i + 1; j < live->size(); ++j) {
      const auto& a = (*live)[i];
      const auto& b = (*live)[j];
      if (a.gpu_index == b.gpu_index && a.placement.Overlaps(b.placement)) {
        problems.push_back(fmt::format("GPU {}: instances {} and {} overlap", a.gpu_index,
                                       a.mig_uuid, b.mig_uuid));
      }
    }
  }
  std::map<std::string, std::string> owner;  // MIG UUID -> pod
  for (const auto& name : names) {
    auto pod = kube.GetPod("default", name);
    if (!pod.ok()) {
      problems.push_back(name + ": " + std::string(pod.status().message()));
      continue;
    }
    auto visible = dynmig::kube::Annotation(*pod, dynmig::local::kVisibleDevicesAnnotation);
    if (!visible) {
      problems.push_back(name + ": no MIG device recorded");
      continue;
    }
    const json devices = json::parse(*visible, nullptr, /*allow_exceptions=*/false);
    if (!devices.is_object()) {
      problems.push_back(name + ": unreadable MIG device record " + *visible);
      continue;
    }
    for (auto d = devices.begin(); d != devices.end(); ++d) {
      const std::string u = d->is_string() ? d->get<std::string>() : d->dump();
      if (!live_uuids.count(u)) problems.push_back(fmt::format("{}: {} is not live", name, u));
      if (auto [it, fresh] = owner.emplace(u, name); !fresh) {
        problems.push_back(fmt::format("{} given to both {} and {}", u, it->second, name));
      }
    }
  }
  if (all && warm_cap == 0 && live->size() != owner.size()) {
    problems.push_back(
        fmt::format("{} live instances for {} GPU pods", live->size(), owner.size()));
  }
  if (all && warm_cap > 0) {
    std::set<std::string> owned;
    for (const auto& [uuid, pod] : owner) owned.insert(uuid);
    CheckSpare(cluster, kube, node, owned, warm_cap, problems);
  }
}

BurstResult Burst(LocalCluster& cluster, dynmig::kube::KubeClient& kube, RunningWatch& watch,
                  const Flags& f, bool gpu, int round, bool warm) {
  const int warm_cap = warm ? f.warm_max_per_gpu : 0;
  BurstResult r;
  const std::string node = cluster.nodes().front().name;
  std::vector<std::string> names;
  std::map<std::string, absl::Time> created;
  watch.Forget();
  const absl::Time start = absl::Now();
  for (int i = 0; i < f.pods; ++i) {
    const std::string name = fmt::format("{}-{}-{}", gpu ? "g1" : "plain", round, i);
    created[name] = absl::Now();
    auto st = kube.CreatePod(Pod(name, gpu, f.gpumem));
    if (!st.ok()) {
      r.problems.push_back(name + ": " + std::string(st.status().message()));
      return r;
    }
    names.push_back(name);
  }
  const absl::Time deadline = start + f.timeout;
  while (watch.Count() < names.size() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  r.finished = watch.Count() >= names.size();
  absl::Time last = start;
  for (const auto& name : names) {
    auto at = watch.RunningAt(name);
    if (!at) continue;
    r.seconds.push_back(absl::ToDoubleSeconds(*at - created[name]));
    last = std::max(last, *at);
  }
  r.all = absl::ToDoubleSeconds(last - start);
  if (!r.finished) {
    r.problems.push_back(fmt::format("{} of {} pods Running after {}", watch.Count(), names.size(),
                                     absl::FormatDuration(f.timeout)));
  }
  if (gpu) {
    std::vector<std::string> running;  // a pod still waiting has no device to check yet
    for (const auto& name : names) {
      if (watch.RunningAt(name)) running.push_back(name);
    }
    CheckPlacements(cluster, kube, node, running, r.finished, warm_cap, r.problems);
  }
  // How often a pod went back to kube-scheduler's queue on the way (events of this burst's pods).
  if (auto events = kube.List(dynmig::kube::Resource::kEvents, {.ns = "default"}); events.ok()) {
    const std::set<std::string> burst(names.begin(), names.end());
    for (const auto& e : events->items) {
      if (!burst.count(dynmig::kube::StringAt(e, "/involvedObject/name"))) continue;
      if (e.value("reason", "") == "MigInstanceReused") ++r.reused;
      if (e.value("reason", "") != "FailedScheduling") continue;
      ++r.failed_scheduling;
      if (e.value("message", "").find("Binding rejected") != std::string::npos) ++r.bind_rejected;
    }
  }
  // Delete the burst and wait until the node is empty again (nothing leaked); with warm instances,
  // until every instance left is idle and published as such.
  for (const auto& name : names) (void)kube.DeletePod("default", name, {});
  const absl::Time clean_by = absl::Now() + absl::Seconds(120);
  while (absl::Now() < clean_by) {
    auto list = kube.ListPods({.ns = "default"});
    auto live = cluster.Instances(node);
    if (list.ok() && list->items.empty() && live.ok() && (warm_cap > 0 || live->empty())) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (!gpu) return r;
  if (warm_cap > 0) {
    CheckSpare(cluster, kube, node, {}, warm_cap, r.problems);
  } else if (auto live = cluster.Instances(node); live.ok() && !live->empty()) {
    r.problems.push_back(
        fmt::format("{} instance(s) left 120 s after the pods were deleted", live->size()));
  }
  return r;
}

bool ParseFlags(int argc, char** argv, Flags& f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--pods") {
      f.pods = std::stoi(value());
    } else if (a == "--nodes") {
      f.nodes = value();
    } else if (a == "--gpumem") {
      f.gpumem = std::stoll(value());
    } else if (a == "--sim-latency") {
      f.latency = value();
    } else if (a == "--kind") {
      f.kind = value();
    } else if (a == "--bursts") {
      f.bursts = std::stoi(value());
    } else if (a == "--timing-speedup") {
      f.speedup = std::stod(value());
    } else if (a == "--scheduler-threads") {
      f.scheduler_threads = std::stoi(value());
    } else if (a == "--kubelet-delay") {
      if (!absl::ParseDuration(value(), &f.kubelet_delay)) return false;
    } else if (a == "--verbose") {
      f.verbose = true;
    } else if (a == "--warm") {
      f.warm = value();
    } else if (a == "--warm-ttl") {
      if (!absl::ParseDuration(value(), &f.warm_ttl)) return false;
    } else if (a == "--warm-max-per-gpu") {
      f.warm_max_per_gpu = std::stoi(value());
    } else if (a == "--timeout") {
      if (!absl::ParseDuration(value(), &f.timeout)) return false;
    } else {
      std::cerr << "unknown flag " << a << "\n";
      return false;
    }
  }
  return f.pods > 0 && f.bursts > 0 && f.speedup > 0 && f.scheduler_threads >= 2 &&
         (f.kind == "both" || f.kind == "gpu" || f.kind == "plain") &&
         (f.warm == "off" || f.warm == "on" || f.warm == "both") && f.warm_max_per_gpu >= 1 &&
         f.warm_max_per_gpu <= 64 && f.warm_ttl >= absl::Seconds(1);
}

struct ModeResult {
  bool ok = true;
  std::map<std::string, double> all_by_kind;       // first burst, "1g" / "plain"
  std::map<int, std::vector<double>> gpu_seconds;  // GPU bursts by round
};

// One fresh local cluster, with or without warm instances: the bursts of f.kind.
ModeResult RunMode(const Flags& f, const dynmig::mig::NvmlLatency& latency,
                   const std::vector<dynmig::local::LocalNode>& nodes, bool warm, bool plain_too) {
  ModeResult out;
  const auto dir =
      std::filesystem::temp_directory_path() /
      fmt::format("dynmig-burst-bench-{}-{}", static_cast<int>(::getpid()), warm ? "warm" : "cold");
  std::filesystem::remove_all(dir);
  dynmig::local::LocalClusterOptions o;
  o.api_port = 0;
  o.nodes = nodes;
  o.state_dir = dir.string();
  o.node_address_prefix = "127.2." + std::to_string(::getpid() % 250) + ".";
  o.nvml_port = 0;
  o.nvml_latency = latency;
  o.scheduler_timing = dynmig::local::SchedulingQueueTiming{}.Scaled(f.speedup);
  o.scheduler_threads = f.scheduler_threads;
  o.kubelet_admission_delay = f.kubelet_delay;
  if (warm) {
    o.device_config_yaml = dynmig::protocol::DefaultDeviceConfigYaml() +
                           fmt::format("  migWarmInstances: {{ttl: {}s, maxPerGpu: {}}}\n",
                                       absl::ToInt64Seconds(f.warm_ttl), f.warm_max_per_gpu);
  }
  if (f.verbose) {
    const absl::Time t0 = absl::Now();
    o.log = [t0](const std::string& line) {
      std::cerr << fmt::format("{:9.3f} {}\n", absl::ToDoubleSeconds(absl::Now() - t0), line);
    };
  }
  auto cluster = LocalCluster::Start(o);
  if (!cluster.ok()) {
    std::cerr << "local cluster: " << cluster.status().message() << "\n";
    out.ok = false;
    return out;
  }
  auto kube = (*cluster)->Client();
  if (!kube.ok()) {
    out.ok = false;
    return out;
  }
  RunningWatch watch(**kube);
  std::cout << fmt::format("warm instances: {}\n",
                           warm ? fmt::format("on (ttl {}, maxPerGpu {})",
                                              absl::FormatDuration(f.warm_ttl), f.warm_max_per_gpu)
                                : std::string("off"));
  std::cout << fmt::format("{:<8} {:>5} {:>5} {:>8} {:>8} {:>8} {:>10} {:>12} {:>10} {:>7}\n",
                           "kind", "burst", "pods", "p50 s", "p99 s", "max s", "all Run s",
                           "FailedSched", "bind rej.", "reused");
  for (const bool gpu : {false, true}) {
    if ((gpu && f.kind == "plain") || (!gpu && (f.kind == "gpu" || !plain_too))) continue;
    for (int round = 1; round <= f.bursts; ++round) {
      BurstResult r = Burst(**cluster, **kube, watch, f, gpu, round, warm);
      const char* kind = gpu ? "1g" : "plain";
      std::cout << fmt::format(
          "{:<8} {:>5} {:>5} {:>8.2f} {:>8.2f} {:>8.2f} {:>10.2f} {:>12} {:>10} {:>7}\n", kind,
          round, r.seconds.size(), Percentile(r.seconds, 0.5), Percentile(r.seconds, 0.99),
          Percentile(r.seconds, 1.0), r.all, r.failed_scheduling, r.bind_rejected, r.reused);
      if (round == 1) out.all_by_kind[kind] = r.all;
      if (gpu) out.gpu_seconds[round] = r.seconds;
      for (const auto& p : r.problems) std::cout << "  PROBLEM: " << p << "\n";
      out.ok = out.ok && r.finished && r.problems.empty();
    }
  }
  (*cluster)->Stop();
  std::filesystem::remove_all(dir);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (!ParseFlags(argc, argv, f)) {
    std::cerr << "usage: bench_burst [--pods N] [--nodes SPEC] [--gpumem MIB] [--sim-latency L] "
                 "[--kind both|gpu|plain] [--bursts R] [--timing-speedup X] [--timeout D] "
                 "[--scheduler-threads T] [--kubelet-delay D] [--warm off|on|both] [--warm-ttl D] "
                 "[--warm-max-per-gpu N] [--verbose]\n";
    return 2;
  }
  spdlog::set_level(spdlog::level::err);
  auto latency = dynmig::mig::ParseNvmlLatency(f.latency);
  if (!latency.ok()) {
    std::cerr << "--sim-latency: " << latency.status().message() << "\n";
    return 2;
  }
  auto nodes = dynmig::local::ParseNodes(f.nodes);
  if (!nodes.ok() || nodes->size() != 1) {
    std::cerr << "--nodes: one node, e.g. node-a=A100-SXM4-40GBx8\n";
    return 2;
  }
  if (f.warm == "both") {
    f.bursts = std::max(f.bursts, 2);
    if (f.kind == "plain") f.kind = "gpu";
  }
  std::cout << fmt::format(
      "burst of {} pods on {} ({}), simulated NVML latency {}, kube-scheduler timing {}, kubelet "
      "admission delay {}\n",
      f.pods, nodes->front().name, nodes->front().gpus, latency->ToString(),
      f.speedup == 1 ? std::string("real (v1.20)") : fmt::format("{}x faster", f.speedup),
      absl::FormatDuration(f.kubelet_delay));
  bool ok = true;
  std::map<bool, ModeResult> results;
  for (const bool warm : {false, true}) {
    if ((warm && f.warm == "off") || (!warm && f.warm == "on")) continue;
    // Plain pods once: they do not depend on warm instances.
    results[warm] = RunMode(f, *latency, *nodes, warm, !(warm && f.warm == "both"));
    ok = ok && results[warm].ok;
  }
  for (const auto& [warm, r] : results) {
    auto a = r.all_by_kind;
    if (a.count("1g") && a.count("plain") && a["plain"] > 0) {
      std::cout << fmt::format("1g / plain, all Running{}: {:.1f}x\n",
                               warm ? " (warm instances)" : "", a["1g"] / a["plain"]);
    }
  }
  if (results.size() == 2) {
    for (int round = 2; round <= f.bursts; ++round) {
      const auto& cold = results[false].gpu_seconds[round];
      const auto& warm = results[true].gpu_seconds[round];
      const double c = Percentile(cold, 0.5), w = Percentile(warm, 0.5);
      std::cout << fmt::format(
          "burst {}: time to Running p50 {:.2f} s without warm instances, {:.2f} s with ({:.0f}% "
          "less); p99 {:.2f} / {:.2f} s; max {:.2f} / {:.2f} s\n",
          round, c, w, c > 0 ? 100 * (1 - w / c) : 0.0, Percentile(cold, 0.99),
          Percentile(warm, 0.99), Percentile(cold, 1.0), Percentile(warm, 1.0));
    }
  }
  std::cout << (ok ? "checks: every GPU pod its own live MIG device, no overlap, nothing left "
                     "after delete but idle instances (published, within the cap)\n"
                   : "checks FAILED\n");
  return ok ? 0 : 1;
}
