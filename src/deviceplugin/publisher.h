// Publisher: what the device plugin tells the Node and Prometheus about this node, with its own
// lock. PluginCore takes a NodeSnapshot (plain values) under its own lock and hands it over; the
// publisher encodes it and writes it to the API server without any PluginCore lock held, so an
// Allocate or a Reconcile never waits for a node patch, and a node patch never waits for NVML.
//
//   Publish()      one node patch: hami.io/node-nvidia-register, hami.io/node-handshake
//                  ("Reported_<RFC3339 now>"), dynmig.io/mig-held and
//                  dynmig.io/idle-mig-instances, every key every time (the register also comes back
//                  after the node object was recreated). Remembers the register and idle values
//                  last written.
//   IdleChanged()  whether given idle instances differ from those last written.
//   HeldChanged()  whether given held slices differ from those last written.
//   SetGauges()    the managed / idle instance and recovery-pending gauges.
//   LiveInstanceInfos()  the pod-attributed instances (dynmig_mig_instance_info, metrics.h).
//
// The kubelet's device list (ListAndWatch) is DeviceList (device_list.h), also with its own lock.
// Thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "deviceplugin/inventory.h"
#include "deviceplugin/metrics.h"
#include "deviceplugin/state_store.h"
#include "kube/kube_client.h"
#include "protocol/gpu_mode_switch.h"
#include "protocol/held_slices.h"
#include "protocol/idle_instances.h"
#include "protocol/node_register.h"

namespace dynmig::deviceplugin {

// What is published about the node, as PluginCore holds it at one instant.
struct NodeSnapshot {
  std::vector<protocol::DeviceInfo> devices;  // hami.io/node-nvidia-register
  std::vector<protocol::HeldSlices> held;     // dynmig.io/mig-held
  std::vector<protocol::IdleInstance> idle;   // dynmig.io/idle-mig-instances
  // dynmig.io/gpu-mode (mode_switch.h); absent: the key is not written at all (switching is not
  // configured).
  std::optional<std::vector<protocol::GpuModeStatus>> modes;
};

// The live instances a pod holds (idle ones excluded: no pod holds them), each with its pod,
// the container (from the served Allocate that handed it out, `ledger`; for a legacy instance its
// first proven holder), the GPU's index (`inventory`) and `node`.
std::vector<InstanceInfo> LiveInstanceInfos(const std::vector<ManagedInstance>& instances,
                                            const std::vector<LedgerEntry>& ledger,
                                            const Inventory& inventory, std::string_view node);

class Publisher {
 public:
  // `kube`, `metrics` and `clock` must outlive the publisher.
  Publisher(std::string node_name, kube::KubeClient& kube, Metrics& metrics, const Clock& clock)
      : node_name_(std::move(node_name)), kube_(kube), metrics_(metrics), clock_(clock) {}
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // Writes `snapshot` to the node in one patch (see the header comment). Errors: the API's code,
  // naming the node.
  absl::Status Publish(NodeSnapshot snapshot) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `idle` differs from the idle instances of the last successful Publish.
  bool IdleChanged(const std::vector<protocol::IdleInstance>& idle) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `held` differs from the held slices of the last successful Publish.
  bool HeldChanged(const std::vector<protocol::HeldSlices>& held) const ABSL_LOCKS_EXCLUDED(mu_);
  // The gauges of the managed instances (`instances`, idle ones by GPU and profile) and of
  // deferred recovery.
  void SetGauges(const std::vector<ManagedInstance>& instances, bool recovery_pending);

 private:
  const std::string node_name_;
  kube::KubeClient& kube_;
  Metrics& metrics_;
  const Clock& clock_;

  mutable dynmig::Mutex mu_;
  // hami.io/node-nvidia-register as last written (a change is logged).
  std::string last_register_ ABSL_GUARDED_BY(mu_);
  // dynmig.io/idle-mig-instances as last written.
  std::string last_idle_ ABSL_GUARDED_BY(mu_) = "[]";
  // dynmig.io/mig-held as last written.
  std::string last_held_ ABSL_GUARDED_BY(mu_) = "[]";
};

}  // namespace dynmig::deviceplugin
