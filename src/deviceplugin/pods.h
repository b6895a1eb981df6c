// What the pods of a node say about MIG: their phase, reservations, runtime identities, which
// container is allocated next, and which pod the kubelet is allocating. Pure functions over API
// objects; thread-compatible.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kube/object.h"
#include "protocol/devices.h"
#include "protocol/mig_allocations.h"
#include "protocol/node_lock.h"

namespace dynmig::deviceplugin {

// Not terminated (kube::IsTerminated) and not being deleted. A pod being deleted may still run
// processes: its instances are reclaimed once the processes are gone.
bool IsActive(const kube::Object& pod);

// The node's `hami.io/mutex.lock` (protocol/node_lock.h); nullopt when absent or unreadable.
std::optional<protocol::NodeLock> NodeLockOf(const kube::Object& node);

// One pod, analysed once per cycle.
struct PodMig {
  kube::Object pod;
  std::string uid;
  std::string ns;
  std::string name;
  std::string key;  // namespace/name
  bool terminated = false;
  bool deleting = false;
  bool active = false;
  // The pod carries any of HAMi's device annotations (it is a vGPU/MIG pod).
  bool relevant = false;
  bool has_allocations = false;  // hami.io/vgpu-mig-allocations present
  absl::StatusOr<std::vector<protocol::MigAllocation>> allocations =
      std::vector<protocol::MigAllocation>{};
  bool has_to_allocate = false;
  absl::StatusOr<protocol::PodDevices> to_allocate = protocol::PodDevices{};
  std::string bind_phase;
  int64_t bind_time = 0;    // hami.io/bind-time, 0 when absent or not a number
  std::string vgpu_node;    // hami.io/vgpu-node
  int init_containers = 0;  // spec.initContainers (container indices count them first)
  // GPUs the pod's annotations name, read leniently (also from an annotation that fails the
  // strict decoder, and from legacy "GPU-…[t-s]" device ids). `gpus_unknown`: an annotation could
  // not be read at all, so the pod may use any GPU.
  std::set<std::string> referenced_gpus;
  bool gpus_unknown = false;
  bool legacy = false;  // some device id has the legacy "GPU-…[t-s]" form
  // A whole-GPU pod (nvidia.com/vgpu-mode: hami-core, docs/mig-mode.md): its reservation is
  // hami.io/vgpu-devices-to-allocate naming whole GPUs, without hami.io/vgpu-mig-allocations.
  bool whole_gpu = false;
  // Why the pod's MIG state cannot be read ("" when it can): the reservation does not decode, or
  // a vGPU pod has device annotations but no hami.io/vgpu-mig-allocations.
  std::string unreadable;

  // Whether the kubelet's Allocate for container `index` has completed: its device list was
  // consumed from hami.io/vgpu-devices-to-allocate, or the pod reached bind-phase success.
  bool ContainerAllocated(int index) const;
  // The next container with devices left in hami.io/vgpu-devices-to-allocate, or -1.
  int NextContainer() const;
};

PodMig AnalyzePod(const kube::Object& pod);

// A pod that says it is being allocated on this node (hami.io/bind-phase=allocating,
// hami.io/vgpu-node=node, a container left) but was not taken as the pod of an Allocate, and why.
struct BindMismatch {
  const PodMig* pod = nullptr;
  std::string why;
};

struct PendingPod {
  const PodMig* pod = nullptr;  // the pod being allocated; nullptr when none is confirmed
  bool in_progress = false;     // found as `in_progress`, not through the node lock
  std::vector<BindMismatch> mismatches;
};

// The pod the kubelet is allocating on `node`. bind-phase alone is never trusted:
//   1. `in_progress` (uid): the pod whose earlier containers this plugin allocated moments ago
//      (it released the node lock once it had identified the pod), while it still has a
//      container left;
//   2. otherwise the node lock's owner (same namespace and name, and the same UID when the lock
//      records one: a pod recreated under the owner's name is not the owner), when it agrees:
//      active, bound here (hami.io/vgpu-node=node), hami.io/bind-phase=allocating, a reservation
//      (hami.io/vgpu-mig-allocations; or legacy device ids, which Allocate refuses with the
//      migration procedure; or, for a whole-GPU pod, hami.io/vgpu-devices-to-allocate alone) and a
//      container left in hami.io/vgpu-devices-to-allocate.
// Every other active pod that says bind-phase allocating on this node with a container left (and a
// lock owner that does not agree) is listed in `mismatches`, with why.
PendingPod FindPendingPod(const std::vector<PodMig>& pods, std::string_view node,
                          const std::optional<protocol::NodeLock>& lock,
                          std::string_view in_progress = "");

}  // namespace dynmig::deviceplugin
