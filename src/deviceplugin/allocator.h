// Allocator: a kubelet Allocate as a pipeline of named steps, each with one owner (see
// plugin_core.h for what Allocate promises):
//
//   IdentifyPod         the node lock's owner, or the pod in progress, proven by the kubelet's
//                       PodResources; the node lock is released as soon as the pod is identified
//   ValidateAllocation  pure (allocate_plan.h): the typed reservation + the node's view -> an
//                       AllocationPlan or a refusal
//   ConfirmAgainstNvml  what only NVML can confirm (overlaps, reused and idle instances)
//   RecordIntents       an intent per device to create, persisted before any creation
//   CreateInstances     GI + CI at exactly the reserved placements, rolled back on failure
//   Publish             the runtime identity (NodeOps::WriteRuntimeIdentity), the commit
//                       (managed instances, closed intents, the ledger entry in one write), the
//                       kubelet's answer
//
// It owns the allocator's state (the node as read, whether the node lock was released, the pod in
// progress); the node state it changes is the context's (node_ops.h), under NodeState::mu like
// every NVML change. PluginCore runs it after the Reclaimer has freed what ended pods hold.
// Not thread-safe by itself: every method requires the node state's lock.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "deviceplugin/allocate_plan.h"
#include "deviceplugin/node_ops.h"
#include "deviceplugin/pods.h"
#include "deviceplugin/state_store.h"
#include "deviceplugin/v1beta1/api.pb.h"
#include "kube/kube_client.h"
#include "protocol/annotations.h"

namespace dynmig::deviceplugin {

// How long after identifying a pod (and releasing its node lock) a later Allocate is taken for the
// same pod while it has containers left: the kubelet allocates a pod's containers one after the
// other in one admission pass.
inline constexpr absl::Duration kInProgressWindow = absl::Seconds(30);

class Allocator {
 public:
  // `ops` must outlive the allocator.
  explicit Allocator(NodeOps& ops) : ops_(ops) {}
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // The node state's lock, as the analysis names it for this allocator.
  dynmig::Mutex& mu() const ABSL_LOCK_RETURNED(ops_.ns.mu) { return ops_.ns.mu; }

  // kInvalidArgument unless every ID is a replica of an exposed GPU.
  absl::Status CheckDeviceIds(const std::vector<std::string>& device_ids) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // One container's Allocate over `pods` (the node's pods, what ended ones held already
  // reclaimed): identify -> validate -> confirm against NVML -> record the intents -> create ->
  // publish. `result` receives the outcome label of a failure ("refused", else left as is).
  absl::StatusOr<v1beta1::ContainerAllocateResponse> Allocate(
      const std::vector<std::string>& device_ids, const std::vector<PodMig>& pods,
      std::string* result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // PreferredAllocation's lookup: the GPUs the pending pod's next container reserved (one entry
  // per device); empty when no pod is pending or the pods cannot be listed.
  std::vector<std::string> ReservedGpus() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Prefers, after the must-include IDs, one replica of each GPU in `reserved_gpus` per entry,
  // then any available ID.
  static v1beta1::ContainerPreferredAllocationResponse Prefer(
      const v1beta1::ContainerPreferredAllocationRequest& request,
      const std::vector<std::string>& reserved_gpus);

 private:
  struct Created;

  bool Crash(std::string_view point) const;

  // Step 1: the pod this Allocate is for, proven: the node lock's owner (or the pod in progress)
  // that the kubelet's PodResources lists. Releases the node lock once the pod is identified.
  absl::StatusOr<PodMig> IdentifyPod(const std::vector<PodMig>& pods, size_t device_count,
                                     std::string* result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // The node (read into state_.node) and its lock; nullopt when unreadable or absent.
  std::optional<protocol::NodeLock> ReadNodeLock() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Allocate's check of the pod it is about to serve: kFailedPrecondition when the kubelet's
  // PodResources answers and does not list `pod` (this Allocate is another pod's). OK when it
  // lists it, and when PodResources cannot be read (PreStartContainer then fails closed).
  absl::Status KubeletKnows(const PodMig& pod);
  // Step 2 is ValidateAllocation (allocate_plan.h) over View().
  NodeView View() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Step 3: what only NVML can confirm: no GI the plan does not reuse overlaps a reservation; a
  // reused instance still exists (else it is created again); an idle one still verifies (else
  // it is destroyed when idle, and created again).
  absl::Status ConfirmAgainstNvml(const PodMig& pod, AllocationPlan& plan, std::string* result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  absl::Status ConfirmDevice(const PodMig& pod, int container, const std::string& what,
                             PlannedDevice& d, std::string* result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // An idle instance the plan reuses: verified (then handed to the pod), or destroyed so that
  // the device is created afresh.
  absl::Status TakeOverIdle(const PodMig& pod, int container, const std::string& what,
                            const nvml::GpuInstanceInfo& live, PlannedDevice& d,
                            std::string* result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Step 4: an intent per device to create, persisted before any creation, so that a crash in
  // between is resolved without guessing.
  absl::Status RecordIntents(const PodMig& pod, AllocationPlan& plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Step 5: GI + CI at each planned placement (reused instances as they are). On failure
  // everything in `created` is rolled back (Abort).
  absl::StatusOr<std::vector<ManagedInstance>> CreateInstances(const PodMig& pod,
                                                               const AllocationPlan& plan,
                                                               std::vector<Created>& created)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Step 5's readiness rule: a new instance is reported (answer, runtime identity) only once NVML
  // lists its GI and its CI with `mig_uuid`; polled every options.ready_poll up to
  // options.ready_timeout on the clock (DCGM and the driver take a moment to show a new instance).
  // kDeadlineExceeded saying what is still missing.
  absl::Status WaitListed(const GpuEntry& gpu, uint32_t gi, uint32_t ci,
                          const std::string& mig_uuid);
  // Step 6: the answer, the runtime identity written under the pod's resourceVersion, then the
  // commit (managed instances, closed intents, the ledger entry, in one write).
  absl::StatusOr<v1beta1::ContainerAllocateResponse> Publish(
      const std::vector<std::string>& device_ids, const PodMig& pod, const AllocationPlan& plan,
      const std::vector<ManagedInstance>& instances, std::vector<Created>& created,
      std::string* result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  void Commit(const std::vector<std::string>& device_ids, const PodMig& pod,
              const AllocationPlan& plan, const std::vector<ManagedInstance>& instances)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Records in the ledger that `device_ids` were served for container `container` of `pod` with
  // `instances` (replacing an entry with the same IDs).
  void RecordLedger(const std::vector<std::string>& device_ids, const PodMig& pod, int container,
                    const std::vector<ManagedInstance>& instances,
                    const std::vector<std::string>& whole_gpus = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);

  // ---- whole GPUs (allocate_whole.cc, docs/mig-mode.md) ----
  // A whole-GPU pod's container: ValidateWholeGpu (allocate_plan.h) -> ConfirmWholeGpu -> the
  // answer -> ConsumeWholeReservation -> the ledger entry. Nothing is created or destroyed.
  absl::StatusOr<v1beta1::ContainerAllocateResponse> AllocateWhole(
      const std::vector<std::string>& device_ids, const PodMig& pod,
      const std::vector<PodMig>& pods, std::string* result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // What only NVML can confirm: the GPU's MIG mode is off (none pending) and it has no GPU
  // instance.
  absl::Status ConfirmWholeGpu(const PodMig& pod, const std::string& what, const GpuEntry& gpu,
                               std::string* result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // NVIDIA_VISIBLE_DEVICES=<GPU UUIDs> and, where the host has device nodes, /dev/nvidia<minor>
  // of each GPU and the control nodes (or CDI names when CDI is on).
  absl::StatusOr<v1beta1::ContainerAllocateResponse> WholeAnswer(const WholeGpuPlan& plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Erases the container's entry from hami.io/vgpu-devices-to-allocate and sets bind-phase success
  // when none is left (`done`), in one patch under the pod's resourceVersion.
  absl::Status ConsumeWholeReservation(const PodMig& pod, int container, bool* done);
  absl::StatusOr<v1beta1::ContainerAllocateResponse> Answer(
      const std::vector<ManagedInstance>& instances) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Without CDI, both answers' tail: NVIDIA_VISIBLE_DEVICES=<uuids> and each device node path.
  static void SetVisibleDevices(const std::vector<std::string>& uuids,
                                const std::vector<std::string>& paths,
                                v1beta1::ContainerAllocateResponse& response);
  // A failed step after the intents: rolls back what this call created, reports, fails the pod.
  absl::Status Abort(const PodMig& pod, const AllocationPlan& plan, std::vector<Created>& created,
                     const absl::Status& st, std::string_view step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  void Rollback(std::vector<Created>& created, const std::vector<uint64_t>& intents)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  absl::Status Refuse(const PodMig& pod, std::string_view reason, absl::Status status,
                      std::string* result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // bind-phase failed; releases the node lock unless this Allocate already did.
  void FailPod(const PodMig& pod) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Removes hami.io/mutex.lock when `pod` holds it, under the node's resourceVersion. `node` is a
  // recent read of the node (saves a GET; re-read on conflict). Sets state_.lock_released once
  // the lock is no longer the pod's.
  void ReleaseNodeLock(const PodMig& pod, std::optional<kube::Object> node = std::nullopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // The uid of the allocation in progress (within kInProgressWindow), or "".
  std::string InProgress() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);

  NodeOps& ops_;

  // What an Allocate carries between its steps, and the pod whose containers it is serving.
  struct AllocatorState {
    // The node as read by the current Allocate.
    std::optional<kube::Object> node;
    // The current Allocate released its pod's node lock.
    bool lock_released = false;
    // The pod this process identified last and has not finished (in memory only: a restart
    // breaks the kubelet's admission pass anyway).
    struct InProgressPod {
      std::string uid;
      absl::Time since;
    };
    std::optional<InProgressPod> in_progress;
  };
  AllocatorState state_ ABSL_GUARDED_BY(ops_.ns.mu);
};

}  // namespace dynmig::deviceplugin
