#include "scheduler/metrics.h"

#include <algorithm>
#include <bit>
#include <map>
#include <set>
#include <sstream>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace dynmig::scheduler {
namespace {

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
  return *buckets;
}

const prometheus::Histogram::BucketBoundaries& WaitBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200};
  return *buckets;
}

// Every reason dynmig_scheduler_pending_pods has (each exported, 0 when none).
constexpr const char* kPendingReasons[] = {"fragmented",
                                           "capacity-exhausted",
                                           "no-profile-big-enough",
                                           "not-allowlisted",
                                           "filtered",
                                           "gpu-unhealthy",
                                           "no-mig-gpu",
                                           "node-unhealthy",
                                           "no-candidates",
                                           "binding",
                                           "waiting-for-node-lock"};

// The longest run of adjacent free slices of `units` slices under `occupied`.
uint32_t LongestFreeRun(uint64_t occupied, uint32_t units) {
  uint32_t run = 0, longest = 0;
  for (uint32_t u = 0; u < units && u < 64; ++u) {
    run = (occupied >> u) & 1 ? 0 : run + 1;
    longest = std::max(longest, run);
  }
  return longest;
}

prometheus::ClientMetric Gauge(double value,
                               std::vector<std::pair<std::string, std::string>> labels) {
  prometheus::ClientMetric m;
  m.gauge.value = value;
  for (auto& [k, v] : labels) m.label.push_back({std::move(k), std::move(v)});
  return m;
}

prometheus::MetricFamily GaugeFamily(std::string name, std::string help) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = prometheus::MetricType::Gauge;
  return f;
}

// Per allowlisted GPU its slices, free slices and longest free run; per locked node the lock's age.
std::vector<prometheus::MetricFamily> CapacityFamilies(const std::vector<NodeReport>& nodes,
                                                       absl::Time now) {
  auto slices = GaugeFamily("dynmig_scheduler_gpu_slices", "Slices (memory units) of a MIG GPU");
  auto free_slices = GaugeFamily("dynmig_scheduler_gpu_free_slices",
                                 "Slices of a MIG GPU no reservation or held instance covers");
  auto largest_free = GaugeFamily("dynmig_scheduler_gpu_largest_free_run_slices",
                                  "The longest run of adjacent free slices of a MIG GPU");
  auto lock_held = GaugeFamily("dynmig_scheduler_node_lock_held_seconds",
                               "How long a node's bind lock (hami.io/mutex.lock) has been held");
  auto whole_in_use = GaugeFamily("dynmig_scheduler_whole_gpu_in_use",
                                  "A GPU in whole-GPU mode (MIG off): 1 while a pod holds or is "
                                  "reserved it, 0 while free");
  for (const auto& node : nodes) {
    if (node.locked_at.has_value()) {
      lock_held.metric.push_back(Gauge(std::max(0.0, absl::ToDoubleSeconds(now - *node.locked_at)),
                                       {{"node", node.name}}));
    }
    for (const auto& gpu : node.gpus) {
      if (!gpu.allowlisted || gpu.units == 0) continue;
      uint64_t occupied = 0;
      for (const auto& r : gpu.reservations) occupied |= r.placement.Mask();
      const uint32_t units = std::min<uint32_t>(gpu.units, 64);
      const uint64_t all = units == 64 ? ~uint64_t{0} : (uint64_t{1} << units) - 1;
      const auto labels = [&] {
        return std::vector<std::pair<std::string, std::string>>{
            {"node", node.name},
            {"device_uuid", gpu.uuid},
            {"device_index", std::to_string(gpu.index)}};
      };
      slices.metric.push_back(Gauge(units, labels()));
      free_slices.metric.push_back(
          Gauge(static_cast<double>(units - std::popcount(occupied & all)), labels()));
      largest_free.metric.push_back(Gauge(LongestFreeRun(occupied, units), labels()));
    }
    for (const auto& w : node.whole_gpus) {
      whole_in_use.metric.push_back(
          Gauge(w.holder.empty() ? 0 : 1, {{"node", node.name},
                                           {"device_uuid", w.uuid},
                                           {"device_index", std::to_string(w.index)}}));
    }
  }
  std::vector<prometheus::MetricFamily> out;
  for (auto* f : {&slices, &free_slices, &largest_free, &lock_held, &whole_in_use}) {
    out.push_back(std::move(*f));
  }
  return out;
}

}  // namespace

SchedulerMetrics::SchedulerMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  filter_total_ = &prometheus::BuildCounter()
                       .Name("dynmig_scheduler_filter_total")
                       .Help("Filter calls by outcome")
                       .Register(*registry_);
  expiries_total_ = &prometheus::BuildCounter()
                         .Name("dynmig_scheduler_reservation_expiries_total")
                         .Help("Reservations released after the reservation TTL, by action")
                         .Register(*registry_);
  unauthenticated_total_ =
      &prometheus::BuildCounter()
           .Name("dynmig_scheduler_unauthenticated_total")
           .Help("Extender calls refused for want of a valid client certificate, by path")
           .Register(*registry_);
  bind_total_ = &prometheus::BuildCounter()
                     .Name("dynmig_scheduler_bind_total")
                     .Help("Bind calls by outcome")
                     .Register(*registry_);
  reservations_total_ = &prometheus::BuildCounter()
                             .Name("dynmig_scheduler_reservations_total")
                             .Help("MIG reservations made (written to the pod)")
                             .Register(*registry_)
                             .Add({});
  filter_latency_ = &prometheus::BuildHistogram()
                         .Name("dynmig_scheduler_filter_duration_seconds")
                         .Help("Time to answer a filter call")
                         .Register(*registry_)
                         .Add({}, LatencyBuckets());
  bind_latency_ = &prometheus::BuildHistogram()
                       .Name("dynmig_scheduler_bind_duration_seconds")
                       .Help("Time to answer a bind call")
                       .Register(*registry_)
                       .Add({}, LatencyBuckets());
  pod_wait_ = &prometheus::BuildHistogram()
                   .Name("dynmig_scheduler_pod_wait_seconds")
                   .Help("MIG pods' wait from creation to a successful bind, by profile")
                   .Register(*registry_);
  for (const char* o : {"reserved", "already-reserved", "pending", "passthrough", "error"}) {
    filter_total_->Add({{"outcome", o}});
  }
  for (const char* o : {"bound", "error"}) bind_total_->Add({{"outcome", o}});
  defrag_evictions_total_ = &prometheus::BuildCounter()
                                 .Name("dynmig_scheduler_defrag_evictions_total")
                                 .Help("Evictions asked by the defragmenter, by result")
                                 .Register(*registry_);
  for (const char* r : {"evicted", "not-found", "refused-by-pdb", "error"}) {
    defrag_evictions_total_->Add({{"result", r}});
  }
  defrag_plans_total_ = &prometheus::BuildCounter()
                             .Name("dynmig_scheduler_defrag_plans_total")
                             .Help("Defragmentation plans for waiting pods, by outcome")
                             .Register(*registry_);
  for (const char* o : {"executed", "dry-run", "no-plan", "rate-limited", "headroom", "failed"}) {
    defrag_plans_total_->Add({{"outcome", o}});
  }
  for (const char* a : {"released", "forgotten", "bind-failed"}) {
    expiries_total_->Add({{"action", a}});
  }
  mode_switch_requests_total_ =
      &prometheus::BuildCounter()
           .Name("dynmig_scheduler_mode_switch_requests_total")
           .Help(
               "GPU mode switches the leader asked for (dynmig.io/gpu-mode-request), by node and "
               "target mode")
           .Register(*registry_);
  mode_switch_refusals_total_ =
      &prometheus::BuildCounter()
           .Name("dynmig_scheduler_mode_switch_refusals_total")
           .Help(
               "GPU mode switch requests refused by the device plugin or withdrawn unanswered, "
               "by node and reason (needs-reboot, needs-reset, refused, timeout)")
           .Register(*registry_);
  mode_switch_seconds_total_ =
      &prometheus::BuildCounter()
           .Name("dynmig_scheduler_mode_switch_seconds_total")
           .Help("Seconds GPUs spent switching mode (request to the new mode), by node")
           .Register(*registry_);
}

SchedulerMetrics::~SchedulerMetrics() = default;

void SchedulerMetrics::ObserveFilter(std::string_view outcome, absl::Duration latency) {
  filter_total_->Add({{"outcome", std::string(outcome)}}).Increment();
  if (outcome == "reserved") reservations_total_->Increment();
  filter_latency_->Observe(absl::ToDoubleSeconds(latency));
}

void SchedulerMetrics::ObserveBind(bool ok, absl::Duration latency) {
  bind_total_->Add({{"outcome", ok ? "bound" : "error"}}).Increment();
  bind_latency_->Observe(absl::ToDoubleSeconds(latency));
}

void SchedulerMetrics::CountExpiry(std::string_view action) {
  expiries_total_->Add({{"action", std::string(action)}}).Increment();
}

void SchedulerMetrics::CountDefragEviction(std::string_view result) {
  defrag_evictions_total_->Add({{"result", std::string(result)}}).Increment();
}

void SchedulerMetrics::CountDefragPlan(std::string_view outcome) {
  defrag_plans_total_->Add({{"outcome", std::string(outcome)}}).Increment();
}

void SchedulerMetrics::CountModeSwitchRequest(const std::string& node, std::string_view to) {
  mode_switch_requests_total_->Add({{"node", node}, {"to", std::string(to)}}).Increment();
}

void SchedulerMetrics::CountModeSwitchRefusal(const std::string& node, std::string_view reason) {
  mode_switch_refusals_total_->Add({{"node", node}, {"reason", std::string(reason)}}).Increment();
}

void SchedulerMetrics::AddModeSwitchSeconds(const std::string& node, double seconds) {
  if (seconds > 0) mode_switch_seconds_total_->Add({{"node", node}}).Increment(seconds);
}

void SchedulerMetrics::CountUnauthenticated(std::string_view path) {
  std::string_view known = "other";
  if (path == "/filter" || path == "/bind" || path == "/layout") known = path;
  if (path.starts_with("/live")) known = "/live";  // the live page and its parts
  unauthenticated_total_->Add({{"path", std::string(known)}}).Increment();
}

void SchedulerMetrics::ObserveWait(const std::vector<std::string>& profiles,
                                   absl::Duration waited) {
  const double seconds = std::max(0.0, absl::ToDoubleSeconds(waited));
  for (const auto& p : std::set<std::string>(profiles.begin(), profiles.end())) {
    // Profile names are the catalogue's (decoded from our own annotation); bounded all the same.
    pod_wait_->Add({{"profile", p.substr(0, 64)}}, WaitBuckets()).Observe(seconds);
  }
}

void SchedulerMetrics::PodPending(const std::string& pod_key, std::string_view reason,
                                  absl::Time now, std::string_view detail) {
  if (detail.size() > kMaxPendingDetail) {
    size_t cut = kMaxPendingDetail;
    while (cut > 0 && (static_cast<unsigned char>(detail[cut]) & 0xC0) == 0x80) --cut;
    detail = detail.substr(0, cut);  // on a UTF-8 character boundary
  }
  dynmig::MutexLock lock(&pending_mu_);
  auto it = pending_.find(pod_key);
  if (it == pending_.end()) {
    if (pending_.size() >= kMaxPendingPods) return;
    pending_.emplace(pod_key, Pending{std::string(reason), std::string(detail), now, now});
    return;
  }
  it->second.reason = std::string(reason);
  it->second.detail = std::string(detail);
  it->second.last_seen = now;
}

std::vector<PendingPod> SchedulerMetrics::PendingPods(absl::Time now, size_t limit,
                                                      size_t* total) const {
  std::vector<PendingPod> out;
  {
    dynmig::MutexLock lock(&pending_mu_);
    for (const auto& [key, p] : pending_) {
      if (now - p.last_seen > kPendingTtl) continue;
      out.push_back(
          PendingPod{.pod = key, .reason = p.reason, .detail = p.detail, .since = p.since});
    }
  }
  if (total != nullptr) *total = out.size();
  auto older = [](const PendingPod& a, const PendingPod& b) {
    return a.since != b.since ? a.since < b.since : a.pod < b.pod;
  };
  if (out.size() > limit) {
    std::partial_sort(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(limit), out.end(),
                      older);
    out.resize(limit);
  } else {
    std::sort(out.begin(), out.end(), older);
  }
  return out;
}

void SchedulerMetrics::PodDone(const std::string& pod_key) {
  dynmig::MutexLock lock(&pending_mu_);
  pending_.erase(pod_key);
}

size_t SchedulerMetrics::PendingCount(absl::Time now) const {
  dynmig::MutexLock lock(&pending_mu_);
  return static_cast<size_t>(std::count_if(pending_.begin(), pending_.end(), [&](const auto& p) {
    return now - p.second.last_seen <= kPendingTtl;
  }));
}

std::vector<prometheus::MetricFamily> SchedulerMetrics::PendingFamilies(int binds_waiting,
                                                                        absl::Time now) const {
  auto pending = GaugeFamily("dynmig_scheduler_pending_pods",
                             "MIG pods pending, by the reason of their last filter");
  auto oldest = GaugeFamily("dynmig_scheduler_pending_oldest_seconds",
                            "How long the oldest MIG pod pending for that reason has waited");
  {
    std::map<std::string, std::pair<int64_t, double>> by_reason;
    for (const char* r : kPendingReasons) by_reason[r] = {0, 0};
    dynmig::MutexLock lock(&pending_mu_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (now - it->second.last_seen > kPendingTtl) {
        it = pending_.erase(it);
        continue;
      }
      auto& [count, age] = by_reason[it->second.reason];
      ++count;
      age = std::max(age, absl::ToDoubleSeconds(now - it->second.since));
      ++it;
    }
    by_reason["waiting-for-node-lock"].first += binds_waiting;
    for (const auto& [reason, v] : by_reason) {
      pending.metric.push_back(Gauge(static_cast<double>(v.first), {{"reason", reason}}));
      oldest.metric.push_back(Gauge(v.second, {{"reason", reason}}));
    }
  }
  std::vector<prometheus::MetricFamily> out;
  out.push_back(std::move(pending));
  out.push_back(std::move(oldest));
  return out;
}

std::string SchedulerMetrics::Render(const std::vector<NodeReport>& nodes, bool leader,
                                     int binds_waiting, absl::Time now) const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  std::vector<prometheus::MetricFamily> pending = PendingFamilies(binds_waiting, now);
  std::vector<prometheus::MetricFamily> capacity = CapacityFamilies(nodes, now);
  auto info = GaugeFamily("hami_node_gpu_mig_instance_info",
                          "A MIG instance realized for a pod's reservation (always 1)");
  auto fail_closed =
      GaugeFamily("dynmig_scheduler_gpu_fail_closed",
                  "A GPU kept out of scheduling (always 1); the reason label says why");
  auto node_unhealthy =
      GaugeFamily("dynmig_scheduler_node_unhealthy", "A node kept out of scheduling (always 1)");
  auto reserved = GaugeFamily("dynmig_scheduler_reserved_instances",
                              "Reserved MIG instances by state: assumed (annotation not seen "
                              "yet), reserved (not created yet), ready (runtime identity known)");
  std::map<std::string, int64_t> states = {{"assumed", 0}, {"reserved", 0}, {"ready", 0}};
  int64_t defrag_active = 0;
  for (const auto& node : nodes) {
    for (const auto& h : node.defrag) defrag_active += h.active ? 1 : 0;
    if (!node.healthy) {
      node_unhealthy.metric.push_back(
          Gauge(1, {{"node", node.name}, {"reason", node.unhealthy_code}}));
    }
    for (const auto& w : node.whole_gpus) {
      if (!w.healthy) {
        fail_closed.metric.push_back(Gauge(1, {{"node", node.name},
                                               {"device_uuid", w.uuid},
                                               {"device_index", std::to_string(w.index)},
                                               {"reason", w.unhealthy_code}}));
      }
    }
    for (const auto& gpu : node.gpus) {
      if (!gpu.healthy) {
        fail_closed.metric.push_back(Gauge(1, {{"node", node.name},
                                               {"device_uuid", gpu.uuid},
                                               {"device_index", std::to_string(gpu.index)},
                                               {"reason", gpu.unhealthy_code}}));
      }
      for (const auto& r : gpu.reservations) {
        if (r.pod.starts_with("(defrag")) continue;  // counted below
        if (r.assumed) {
          ++states["assumed"];
        } else if (r.runtime.has_value()) {
          ++states["ready"];
        } else {
          ++states["reserved"];
        }
        if (!r.runtime.has_value()) continue;
        info.metric.push_back(
            Gauge(1, {{"node", node.name},
                      {"device_uuid", gpu.uuid},
                      {"device_index", std::to_string(gpu.index)},
                      {"mig_uuid", r.runtime->mig_uuid},
                      {"profile", r.profile},
                      {"gpu_instance_id", std::to_string(r.runtime->gpu_instance_id)},
                      {"compute_instance_id", std::to_string(r.runtime->compute_instance_id)},
                      {"placement_start", std::to_string(r.placement.start)},
                      {"placement_size", std::to_string(r.placement.size)}}));
      }
    }
  }
  for (const auto& [state, count] : states) {
    reserved.metric.push_back(Gauge(static_cast<double>(count), {{"state", state}}));
  }
  auto leader_family = GaugeFamily("dynmig_scheduler_leader",
                                   "1 when this replica holds the leader lease (or runs alone)");
  leader_family.metric.push_back(Gauge(leader ? 1 : 0, {}));
  auto waiting = GaugeFamily("dynmig_scheduler_binds_waiting_for_node_lock",
                             "Binds queued for a node's lock (hami.io/mutex.lock) now");
  waiting.metric.push_back(Gauge(static_cast<double>(binds_waiting), {}));
  auto defrag = GaugeFamily("dynmig_scheduler_defrag_reservations_active",
                            "Slices reserved by defragmentation for a waiting pod, in force now");
  defrag.metric.push_back(Gauge(static_cast<double>(defrag_active), {}));
  families.push_back(std::move(defrag));
  families.push_back(std::move(info));
  families.push_back(std::move(fail_closed));
  families.push_back(std::move(node_unhealthy));
  families.push_back(std::move(reserved));
  families.push_back(std::move(leader_family));
  families.push_back(std::move(waiting));
  for (auto* more : {&pending, &capacity}) {
    for (auto& f : *more) families.push_back(std::move(f));
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

}  // namespace dynmig::scheduler
