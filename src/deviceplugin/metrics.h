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
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace dynmig::deviceplugin {

class Metrics {
 public:
  Metrics();

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

  // Current value of a counter or gauge sample (tests): name plus its labels; 0 when absent.
  double Value(std::string_view name, std::string_view label = "",
               std::string_view label_value = "") const;

 private:
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
  dynmig::Mutex idle_mu_;
  std::set<std::pair<std::string, std::string>> idle_seen_ ABSL_GUARDED_BY(idle_mu_);
};

}  // namespace dynmig::deviceplugin
