#include "deviceplugin/metrics.h"

#include "prometheus/text_serializer.h"

namespace dynmig::deviceplugin {
namespace {

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  return *buckets;
}

}  // namespace

std::string BoundedLabelValue(std::string_view value) {
  std::string out(value.substr(0, kMaxLabelValueBytes));
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return out;
}

Metrics::Metrics(bool pod_identity)
    : pod_identity_(pod_identity),
      registry_(std::make_shared<prometheus::Registry>()),
      allocations_(prometheus::BuildCounter()
                       .Name("dynmig_deviceplugin_allocations_total")
                       .Help("kubelet Allocate calls by result (success, failed, refused)")
                       .Register(*registry_)),
      allocate_duration_(prometheus::BuildHistogram()
                             .Name("dynmig_deviceplugin_allocate_duration_seconds")
                             .Help("Allocate call latency, NVML included")
                             .Register(*registry_)),
      created_(prometheus::BuildCounter()
                   .Name("dynmig_deviceplugin_instances_created_total")
                   .Help("MIG instances (GI + CI) created, by profile")
                   .Register(*registry_)),
      destroyed_(prometheus::BuildCounter()
                     .Name("dynmig_deviceplugin_instances_destroyed_total")
                     .Help("MIG instances destroyed, by reason")
                     .Register(*registry_)),
      adopted_(prometheus::BuildCounter()
                   .Name("dynmig_deviceplugin_instances_adopted_total")
                   .Help("live MIG instances verified against NVML and taken under management")
                   .Register(*registry_)),
      adoption_failures_(prometheus::BuildCounter()
                             .Name("dynmig_deviceplugin_adoption_failures_total")
                             .Help("allocations whose annotation could not be verified against "
                                   "NVML (their slices are kept out of use)")
                             .Register(*registry_)),
      refusals_(prometheus::BuildCounter()
                    .Name("dynmig_deviceplugin_refusals_total")
                    .Help("Allocate calls refused, by reason")
                    .Register(*registry_)),
      prestart_refusals_(prometheus::BuildCounter()
                             .Name("dynmig_deviceplugin_prestart_refusals_total")
                             .Help("PreStartContainer calls refused (the container does not "
                                   "start), by reason")
                             .Register(*registry_)),
      reconcile_(prometheus::BuildCounter()
                     .Name("dynmig_deviceplugin_reconcile_cycles_total")
                     .Help("reconciliation cycles by result (ok, skipped_list, skipped_decode)")
                     .Register(*registry_)),
      reconcile_duration_(prometheus::BuildHistogram()
                              .Name("dynmig_deviceplugin_reconcile_duration_seconds")
                              .Help("reconciliation cycle duration")
                              .Register(*registry_)),
      destroy_failures_(prometheus::BuildCounter()
                            .Name("dynmig_deviceplugin_destroy_failures_total")
                            .Help("destroy attempts NVML refused (retried next cycle)")
                            .Register(*registry_)),
      destroy_retries_(prometheus::BuildCounter()
                           .Name("dynmig_deviceplugin_destroy_retries_total")
                           .Help("destroys NVML refused that are retried with backoff, by reason "
                                 "(in_use: another NVML client holds the instance open)")
                           .Register(*registry_)),
      destroy_pending_(prometheus::BuildGauge()
                           .Name("dynmig_deviceplugin_destroy_pending_instances")
                           .Help("MIG instances whose destroy NVML refused, waiting for a retry "
                                 "(their slices stay held)")
                           .Register(*registry_)),
      registrations_(prometheus::BuildCounter()
                         .Name("dynmig_deviceplugin_registrations_total")
                         .Help("successful registrations with the kubelet")
                         .Register(*registry_)),
      publishes_(prometheus::BuildCounter()
                     .Name("dynmig_deviceplugin_node_publish_total")
                     .Help("node register/handshake annotation writes by result")
                     .Register(*registry_)),
      managed_(prometheus::BuildGauge()
                   .Name("dynmig_deviceplugin_managed_instances")
                   .Help("MIG instances this plugin manages (created or adopted)")
                   .Register(*registry_)),
      untracked_(prometheus::BuildGauge()
                     .Name("dynmig_deviceplugin_untracked_instances")
                     .Help("live MIG instances not managed by this plugin, kept")
                     .Register(*registry_)),
      busy_(prometheus::BuildGauge()
                .Name("dynmig_deviceplugin_busy_instances")
                .Help("reclaimable instances whose processes still run (retried)")
                .Register(*registry_)),
      unverified_(prometheus::BuildGauge()
                      .Name("dynmig_deviceplugin_unverified_allocations")
                      .Help("allocations of active pods that could not be verified")
                      .Register(*registry_)),
      recovery_pending_(prometheus::BuildGauge()
                            .Name("dynmig_deviceplugin_recovery_pending")
                            .Help("1 while startup recovery waits for the Kubernetes API")
                            .Register(*registry_)),
      gpu_healthy_(prometheus::BuildGauge()
                       .Name("dynmig_deviceplugin_gpu_healthy")
                       .Help("1 when an exposed GPU is healthy")
                       .Register(*registry_)),
      idled_(prometheus::BuildCounter()
                 .Name("dynmig_deviceplugin_instances_idled_total")
                 .Help("MIG instances of ended pods kept idle for reuse (warm instances), by "
                       "profile")
                 .Register(*registry_)),
      reused_(prometheus::BuildCounter()
                  .Name("dynmig_deviceplugin_instances_reused_total")
                  .Help("idle MIG instances given to a pod without an NVML create, by profile")
                  .Register(*registry_)),
      idle_(prometheus::BuildGauge()
                .Name("dynmig_deviceplugin_idle_instances")
                .Help("idle (warm) MIG instances kept for reuse, by GPU and profile")
                .Register(*registry_)),
      legacy_(prometheus::BuildGauge()
                  .Name("dynmig_deviceplugin_legacy_instances")
                  .Help("live MIG instances dynmig did not create, by attribution: held (a "
                        "container holds it), unproven (kept: the evidence is incomplete), free")
                  .Register(*registry_)),
      warm_misses_(prometheus::BuildCounter()
                       .Name("dynmig_deviceplugin_warm_instance_misses_total")
                       .Help("MIG instances created while warm instances are on: no idle "
                             "instance of the profile could be reused, by profile")
                       .Register(*registry_)) {
  if (pod_identity_) {
    instance_info_ = &prometheus::BuildGauge()
                          .Name("dynmig_mig_instance_info")
                          .Help(
                              "A live MIG instance and the pod container holding it (always 1); "
                              "UUID, GPU_I_ID, GPU_I_PROFILE, gpu and Hostname repeat the GPU's "
                              "UUID, GPU instance ID, profile, GPU index and node under "
                              "dcgm-exporter's label names")
                          .Register(*registry_);
  }
  for (const char* r : {"success", "failed", "refused"}) allocations_.Add({{"result", r}});
  allocate_duration_.Add({}, LatencyBuckets());
  reconcile_duration_.Add({}, LatencyBuckets());
  adoption_failures_.Add({});
  destroy_failures_.Add({});
  destroy_retries_.Add({{"reason", "in_use"}});
  destroy_pending_.Add({});
  registrations_.Add({});
  managed_.Add({});
  untracked_.Add({});
  busy_.Add({});
  unverified_.Add({});
  recovery_pending_.Add({});
  SetLegacyInstances(0, 0, 0);
}

std::string Metrics::Serialize() const {
  prometheus::TextSerializer serializer;
  return serializer.Serialize(registry_->Collect());
}

void Metrics::AllocateDone(std::string_view result, double seconds) {
  allocations_.Add({{"result", std::string(result)}}).Increment();
  allocate_duration_.Add({}, LatencyBuckets()).Observe(seconds);
}
void Metrics::InstanceCreated(std::string_view profile) {
  created_.Add({{"profile", std::string(profile)}}).Increment();
}
void Metrics::InstanceDestroyed(std::string_view reason) {
  destroyed_.Add({{"reason", std::string(reason)}}).Increment();
}
void Metrics::InstanceAdopted(std::string_view origin) {
  adopted_.Add({{"origin", std::string(origin)}}).Increment();
}
void Metrics::AdoptionFailed() { adoption_failures_.Add({}).Increment(); }
void Metrics::Refused(std::string_view reason) {
  refusals_.Add({{"reason", std::string(reason)}}).Increment();
}
void Metrics::PreStartRefused(std::string_view reason) {
  prestart_refusals_.Add({{"reason", std::string(reason)}}).Increment();
}
void Metrics::ReconcileDone(std::string_view result, double seconds) {
  reconcile_.Add({{"result", std::string(result)}}).Increment();
  reconcile_duration_.Add({}, LatencyBuckets()).Observe(seconds);
}
void Metrics::DestroyFailed() { destroy_failures_.Add({}).Increment(); }
void Metrics::DestroyRetried(std::string_view reason) {
  destroy_retries_.Add({{"reason", std::string(reason)}}).Increment();
}
void Metrics::SetDestroyPending(double n) { destroy_pending_.Add({}).Set(n); }
void Metrics::Registered() { registrations_.Add({}).Increment(); }
void Metrics::NodePublished(bool ok) {
  publishes_.Add({{"result", ok ? "ok" : "failed"}}).Increment();
}
void Metrics::SetManaged(double n) { managed_.Add({}).Set(n); }
void Metrics::SetUntracked(double n) { untracked_.Add({}).Set(n); }
void Metrics::SetLegacyInstances(int held, int unproven, int free) {
  legacy_.Add({{"state", "held"}}).Set(held);
  legacy_.Add({{"state", "unproven"}}).Set(unproven);
  legacy_.Add({{"state", "free"}}).Set(free);
}
void Metrics::SetBusy(double n) { busy_.Add({}).Set(n); }
void Metrics::SetUnverified(double n) { unverified_.Add({}).Set(n); }
void Metrics::SetRecoveryPending(bool pending) { recovery_pending_.Add({}).Set(pending ? 1 : 0); }
void Metrics::SetGpuHealthy(std::string_view gpu_uuid, bool healthy) {
  gpu_healthy_.Add({{"gpu", std::string(gpu_uuid)}}).Set(healthy ? 1 : 0);
}

void Metrics::InstanceIdled(std::string_view profile) {
  idled_.Add({{"profile", std::string(profile)}}).Increment();
}
void Metrics::InstanceReused(std::string_view profile) {
  reused_.Add({{"profile", std::string(profile)}}).Increment();
}
void Metrics::SetIdle(const std::map<std::pair<std::string, std::string>, int>& idle) {
  dynmig::MutexLock lock(&idle_mu_);
  for (const auto& key : idle_seen_) {
    if (!idle.count(key)) idle_.Add({{"gpu", key.first}, {"profile", key.second}}).Set(0);
  }
  for (const auto& [key, n] : idle) {
    idle_.Add({{"gpu", key.first}, {"profile", key.second}}).Set(n);
    idle_seen_.insert(key);
  }
}

void Metrics::WarmMiss(std::string_view profile) {
  warm_misses_.Add({{"profile", BoundedLabelValue(profile)}}).Increment();
}

void Metrics::SetInstances(const std::vector<InstanceInfo>& instances) {
  if (instance_info_ == nullptr) return;
  std::set<std::map<std::string, std::string>> wanted;
  for (const auto& i : instances) {
    if (wanted.size() >= kMaxInstanceSeries) break;
    const std::string gi = std::to_string(i.gpu_instance_id);
    const std::string profile = BoundedLabelValue(i.profile);
    const std::string gpu_uuid = BoundedLabelValue(i.gpu_uuid);
    const std::string node = BoundedLabelValue(i.node);
    const std::string index = std::to_string(i.gpu_index);
    wanted.insert({{"namespace", BoundedLabelValue(i.ns)},
                   {"pod", BoundedLabelValue(i.pod)},
                   {"container", BoundedLabelValue(i.container)},
                   {"node", node},
                   {"gpu_uuid", gpu_uuid},
                   {"gpu_index", index},
                   {"gpu_instance_id", gi},
                   {"compute_instance_id", std::to_string(i.compute_instance_id)},
                   {"mig_uuid", BoundedLabelValue(i.mig_uuid)},
                   {"profile", profile},
                   {"placement", BoundedLabelValue(i.placement)},
                   {"UUID", gpu_uuid},
                   {"GPU_I_ID", gi},
                   {"GPU_I_PROFILE", profile},
                   {"gpu", index},
                   {"Hostname", node}});
  }
  dynmig::MutexLock lock(&info_mu_);
  for (auto it = info_series_.begin(); it != info_series_.end();) {
    if (wanted.count(it->first)) {
      ++it;
      continue;
    }
    instance_info_->Remove(it->second);
    it = info_series_.erase(it);
  }
  for (const auto& labels : wanted) {
    if (info_series_.count(labels)) continue;
    prometheus::Gauge& g = instance_info_->Add(labels);
    g.Set(1);
    info_series_.emplace(labels, &g);
  }
}

double Metrics::Value(std::string_view name, std::string_view label,
                      std::string_view label_value) const {
  double total = 0;
  for (const auto& family : registry_->Collect()) {
    if (family.name != name) continue;
    for (const auto& m : family.metric) {
      bool match = label.empty();
      for (const auto& l : m.label) {
        if (l.name == label && l.value == label_value) match = true;
      }
      if (!match) continue;
      if (family.type == prometheus::MetricType::Counter) total += m.counter.value;
      if (family.type == prometheus::MetricType::Gauge) total += m.gauge.value;
      if (family.type == prometheus::MetricType::Histogram) {
        total += static_cast<double>(m.histogram.sample_count);
      }
    }
  }
  return total;
}

}  // namespace dynmig::deviceplugin
