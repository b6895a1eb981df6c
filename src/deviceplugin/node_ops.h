// NodeOps: the context the device plugin's parts share (plugin_core.h): the options, the seams
// (NVML, the API, metrics, events, the kubelet's PodResources, the clock), the state file and CDI
// writers, the node state (node_state.h) and the ledger (ledger.h), and the steps that both the
// Allocator (allocator.h) and the Reclaimer (reclaimer.h) run: persisting the state, building an
// instance record, writing a pod's runtime identity, the device nodes of a MIG device, destroying
// and verifying instances against NVML, events and once-only reports.
//
// The steps that read or write the node state require its lock, named here `ns.mu`: the parts
// reach the node state only through this context (`ops_.ns`), so that the analysis sees one name
// for it in each of them (it does not follow references: PluginCore's NodeLock, plugin_core.h,
// tells it that its names are one mutex). Not thread-safe by itself: every step that needs the
// lock says so.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "deviceplugin/cdi.h"
#include "deviceplugin/events.h"
#include "deviceplugin/inventory.h"
#include "deviceplugin/ledger.h"
#include "deviceplugin/metrics.h"
#include "deviceplugin/node_state.h"
#include "deviceplugin/plugin_options.h"
#include "deviceplugin/pod_resources.h"
#include "deviceplugin/pods.h"
#include "deviceplugin/publisher.h"
#include "deviceplugin/state_store.h"
#include "kube/kube_client.h"
#include "nvml/nvml.h"
#include "protocol/annotations.h"

namespace dynmig::deviceplugin {

class NodeOps {
 public:
  // Every reference must outlive the context; `options.clock` must be set.
  NodeOps(const PluginCoreOptions& core_options, nvml::Nvml& nvml_api,
          kube::KubeClient& kube_client, Metrics& node_metrics, EventRecorder& events,
          PodResourcesSource* kubelet_pods, NodeState& node_state, Ledger& served,
          Publisher& publisher);
  NodeOps(const NodeOps&) = delete;
  NodeOps& operator=(const NodeOps&) = delete;

  // ---- the context (fixed at construction) ----
  const PluginCoreOptions& options;
  nvml::Nvml& nvml;
  kube::KubeClient& kube;
  Metrics& metrics;
  PodResourcesSource* const pod_resources;  // may be null
  const StateStore store;
  const CdiWriter cdi;
  // The node state and its lock (node_state.h), held across every NVML change.
  NodeState& ns;
  // The ledger of served Allocates (its own lock; copied into every state write).
  Ledger& ledger;

  absl::Time Now() const { return options.clock->Now(); }
  int64_t NowUnix() const { return absl::ToUnixSeconds(Now()); }
  absl::Duration Monotonic() const { return options.clock->Monotonic(); }

  // The node's pods from the API (needs no lock). kUnavailable naming the node.
  absl::StatusOr<std::vector<PodMig>> ListPods();

  // ---- the node state ----
  // Writes the state file: the node state and the ledger's entries.
  absl::Status Persist() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu);
  // Persist(), logging a failure with `what` (a state the next start recovers from anyway).
  void PersistOrLog(std::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu);
  // The managed-instance and recovery gauges (the publisher's), as the state is now.
  void UpdateGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu);
  // dynmig_deviceplugin_legacy_instances{state}: handover's held, unproven and free instances.
  void UpdateLegacyGauge() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu);
  // Reports once per key (events and warnings that would repeat every cycle): whether `key` is
  // new. ForgetReport makes it new again.
  bool FirstReport(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu);
  void ForgetReport(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu);
  // An event on `pod` (on the node when null).
  void Event(const PodMig* pod, std::string_view type, std::string_view reason,
             const std::string& message);

  // ---- record and publish: the steps Allocate, intent completion and adoption share ----
  // The instance record every step builds (Allocate, intent completion, adoption).
  ManagedInstance NewInstance(const InstanceOwner& owner, std::string_view gpu_uuid,
                              std::string_view profile, uint32_t profile_id,
                              const mig::Placement& placement, uint32_t gi, uint32_t ci,
                              std::string_view mig_uuid, std::string_view origin) const;
  // Writes the runtime identity of `entries` (device index -> identity) of container `container`
  // into the pod's annotation under its resourceVersion; with `consume`, also erases the container
  // from hami.io/vgpu-devices-to-allocate and sets bind-phase success when none is left (`done`).
  absl::Status WriteRuntimeIdentity(const PodMig& pod, int container,
                                    const std::map<int, protocol::RuntimeIdentity>& entries,
                                    bool consume, bool* done);
  // The pod as attempt `attempt` of an optimistic annotation write sees it: as identified on the
  // first, re-read after; kAborted when it was replaced (another uid), kFailedPrecondition when it
  // is terminating or finished.
  absl::StatusOr<kube::Object> PodForAttempt(const PodMig& pod, int attempt);
  // The device nodes a container needs for MIG device (gi, ci) of `gpu`: none when the NVML
  // backend has no device nodes on the host (simulated GPUs).
  absl::StatusOr<std::vector<std::string>> DeviceNodes(const GpuEntry& gpu, uint32_t gi,
                                                       uint32_t ci)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns.mu);

  // ---- NVML (need no lock of their own; callers hold ns.mu across their changes) ----
  // Destroys every CI of GI `gi`, then the GI. A GI that is already gone is OK.
  absl::Status DestroyGi(const GpuEntry& gpu, uint32_t gi);
  // Whether processes run on GI `gi`; a failing query counts as busy (`why` says which).
  bool GiBusy(const GpuEntry& gpu, uint32_t gi, std::string* why);
  // Whether the GPU runs processes (a failing query counts as busy).
  bool GpuHasProcesses(const GpuEntry& gpu, std::string* why);
  // Verifies a complete allocation against a live GI: profile, placement, GI id, CI id, MIG UUID.
  absl::Status Verify(const GpuEntry& gpu, const nvml::GpuInstanceInfo& gi,
                      const protocol::MigAllocation& allocation);
  // Whether idle instance `m` is still exactly what NVML shows at GI `gi`, with its CI and MIG
  // UUID, and no process runs on it. The error says what differs.
  absl::Status VerifyIdle(const GpuEntry& gpu, const ManagedInstance& m,
                          const nvml::GpuInstanceInfo& gi);

 private:
  // The reservations of `current` with `entries` written in; kFailedPrecondition when one
  // disappeared, carries another identity or changed since `pod` was read. `already`: every
  // entry was written before.
  absl::StatusOr<std::vector<protocol::MigAllocation>> WithIdentities(
      const PodMig& pod, const kube::Object& current, int container,
      const std::map<int, protocol::RuntimeIdentity>& entries, bool& already);

  EventRecorder& events_;
  Publisher& publisher_;
  // Reports made once (FirstReport).
  std::set<std::string> reported_ ABSL_GUARDED_BY(ns.mu);
};

}  // namespace dynmig::deviceplugin
