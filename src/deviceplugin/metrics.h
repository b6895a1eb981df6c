// Prometheus metrics of the device plugin (prometheus-cpp registry; the text format is served by
// the plugin's own HTTP listener, not by prometheus-cpp's Exposer). Thread-safe.
//
//   dynmig_deviceplugin_allocations_total{result}            success | failed | refused
//   dynmig_deviceplugin_allocate_duration_seconds             histogram of Allocate calls
//   dynmig_deviceplugin_instances_created_total{profile}
//   dynmig_deviceplugin_instances_destroyed_total{reason}    reclaimed | rollback | startup_cleanup
//                                                             | idle_cleanup | intent
//                                                             | idle_ttl | idle_needed | idle_cap
//                                                             | idle_disabled | idle_invalid
//   dynmig_deviceplugin_instances_idled_total{profile}       kept idle for reuse (warm instances)
//   dynmig_deviceplugin_instances_reused_total{profile}      idle instances given to a pod
//   dynmig_deviceplugin_idle_instances{gpu,profile}          gauge: idle (warm) instances
//   dynmig_deviceplugin_instances_adopted_total{origin}      annotation | intent
//   dynmig_deviceplugin_adoption_failures_total               allocations that could not be
//                                                             verified
//   dynmig_deviceplugin_refusals_total{reason}                refused Allocates, by reason
//   dynmig_deviceplugin_prestart_refusals_total{reason}       refused PreStartContainers (the
//                                                             container does not start), by reason
//                                                             (identity.h kIdentity*)
//   dynmig_deviceplugin_reconcile_cycles_total{result}        ok | skipped_list | skipped_decode
//   dynmig_deviceplugin_reconcile_duration_seconds            histogram
//   dynmig_deviceplugin_destroy_failures_total                destroy attempts NVML refused
//   dynmig_deviceplugin_destroy_retries_total{reason}         destroys NVML refused and that are
//                                                             retried with backoff: in_use (another
//                                                             NVML client, e.g. DCGM, holds the
//                                                             instance open), error
//   dynmig_deviceplugin_destroy_pending_instances             gauge: instances waiting for such a
//                                                             retry (held, never given out)
//   dynmig_deviceplugin_registrations_total                   successful kubelet registrations
//   dynmig_deviceplugin_node_publish_total{result}            ok | failed
//   dynmig_deviceplugin_managed_instances                     gauge
//   dynmig_deviceplugin_untracked_instances                   gauge: live, not managed, kept
//   dynmig_deviceplugin_busy_instances                        gauge: reclaimable but still in use
//   dynmig_deviceplugin_unverified_allocations                gauge: allocations kept out of use
//   dynmig_deviceplugin_recovery_pending                      gauge: 1 while startup recovery waits
//                                                             for the API
//   dynmig_deviceplugin_gpu_healthy{gpu}                      gauge per exposed GPU
//   dynmig_deviceplugin_warm_instance_misses_total{profile}   instances created while warm
//                                                             instances are on (no idle instance
//                                                             of that profile could be reused);
//                                                             the hits are instances_reused_total
//   dynmig_mig_instance_info{...} 1                           one per live instance a pod holds,
//                                                             only with pod identity on (below)
//
// dynmig_mig_instance_info names pods (workload identity), so it is exported only when the
// Metrics is made with `pod_identity` (--metrics-pod-identity): labels namespace, pod, container,
// node, gpu_uuid, gpu_index, gpu_instance_id, compute_instance_id, mig_uuid, profile, placement
// ("start:size"), and the same values under dcgm-exporter's names (UUID = the GPU's UUID,
// GPU_I_ID, GPU_I_PROFILE, gpu = the GPU's index, Hostname = the node) so that its series join
// with `on(UUID, GPU_I_ID)`. A series goes when its instance goes (no stale series).
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace dynmig::deviceplugin {

// One live MIG instance and the pod container that holds it (dynmig_mig_instance_info).
struct InstanceInfo {
  std::string ns;
  std::string pod;
  std::string container;  // "" when no served Allocate names it
  std::string node;
  std::string gpu_uuid;
  uint32_t gpu_index = 0;
  uint32_t gpu_instance_id = 0;
  uint32_t compute_instance_id = 0;
  std::string mig_uuid;
  std::string profile;
  std::string placement;  // "start:size"
};

// A label value as exported: bytes outside printable ASCII become '?' (a label value must be
// UTF-8, and one bad value would fail the whole scrape), at most kMaxLabelValueBytes bytes (the
// rest is cut). Quotes and backslashes are kept: the text serializer escapes them.
inline constexpr size_t kMaxLabelValueBytes = 256;
std::string BoundedLabelValue(std::string_view value);

class Metrics {
 public:
  explicit Metrics(bool pod_identity = false);

  // The registry in the Prometheus text exposition format.
  std::string Serialize() const;
  prometheus::Registry& registry() { return *registry_; }

  void AllocateDone(std::string_view result, double seconds);
  void InstanceCreated(std::string_view profile);
  void InstanceDestroyed(std::string_view reason);
  void InstanceAdopted(std::string_view origin);
  void AdoptionFailed();
  void Refused(std::string_view reason);
  void PreStartRefused(std::string_view reason);
  void ReconcileDone(std::string_view result, double seconds);
  void DestroyFailed();
  void DestroyRetried(std::string_view reason);
  void SetDestroyPending(double n);
  void Registered();
  void NodePublished(bool ok);
  void SetManaged(double n);
  void SetUntracked(double n);
  void SetBusy(double n);
  void SetUnverified(double n);
  // dynmig_deviceplugin_legacy_instances{state="held"|"unproven"|"free"}: live instances dynmig
  // did not create, by attribution (handover.h).
  void SetLegacyInstances(int held, int unproven, int free);
  void SetRecoveryPending(bool pending);
  void SetGpuHealthy(std::string_view gpu_uuid, bool healthy);
  void InstanceIdled(std::string_view profile);
  void InstanceReused(std::string_view profile);
  // The idle instances per (GPU UUID, profile); pairs no longer present are set to 0.
  void SetIdle(const std::map<std::pair<std::string, std::string>, int>& idle);
  // An instance was created while warm instances are on: no idle one could be reused.
  void WarmMiss(std::string_view profile);
  // The live instances held by pods, replacing the previous set (series of instances that are
  // gone are removed). A no-op without pod identity. At most kMaxInstanceSeries are exported.
  static constexpr size_t kMaxInstanceSeries = 4096;
  void SetInstances(const std::vector<InstanceInfo>& instances) ABSL_LOCKS_EXCLUDED(info_mu_);
  bool pod_identity() const { return pod_identity_; }

  // Current value of a counter or gauge sample (tests): name plus its labels; 0 when absent.
  double Value(std::string_view name, std::string_view label = "",
               std::string_view label_value = "") const;

 private:
  const bool pod_identity_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& allocations_;
  prometheus::Family<prometheus::Histogram>& allocate_duration_;
  prometheus::Family<prometheus::Counter>& created_;
  prometheus::Family<prometheus::Counter>& destroyed_;
  prometheus::Family<prometheus::Counter>& adopted_;
  prometheus::Family<prometheus::Counter>& adoption_failures_;
  prometheus::Family<prometheus::Counter>& refusals_;
  prometheus::Family<prometheus::Counter>& prestart_refusals_;
  prometheus::Family<prometheus::Counter>& reconcile_;
  prometheus::Family<prometheus::Histogram>& reconcile_duration_;
  prometheus::Family<prometheus::Counter>& destroy_failures_;
  prometheus::Family<prometheus::Counter>& destroy_retries_;
  prometheus::Family<prometheus::Gauge>& destroy_pending_;
  prometheus::Family<prometheus::Counter>& registrations_;
  prometheus::Family<prometheus::Counter>& publishes_;
  prometheus::Family<prometheus::Gauge>& managed_;
  prometheus::Family<prometheus::Gauge>& untracked_;
  prometheus::Family<prometheus::Gauge>& busy_;
  prometheus::Family<prometheus::Gauge>& unverified_;
  prometheus::Family<prometheus::Gauge>& recovery_pending_;
  prometheus::Family<prometheus::Gauge>& gpu_healthy_;
  prometheus::Family<prometheus::Counter>& idled_;
  prometheus::Family<prometheus::Counter>& reused_;
  prometheus::Family<prometheus::Gauge>& idle_;
  prometheus::Family<prometheus::Gauge>& legacy_;
  prometheus::Family<prometheus::Counter>& warm_misses_;
  prometheus::Family<prometheus::Gauge>* instance_info_ = nullptr;  // with pod identity only
  dynmig::Mutex idle_mu_;
  std::set<std::pair<std::string, std::string>> idle_seen_ ABSL_GUARDED_BY(idle_mu_);
  dynmig::Mutex info_mu_;
  // The exported info series by their labels.
  std::map<std::map<std::string, std::string>, prometheus::Gauge*> info_series_
      ABSL_GUARDED_BY(info_mu_);
};

}  // namespace dynmig::deviceplugin
