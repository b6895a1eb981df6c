// What the kubelet does with a node's pods, for the local mode and the end-to-end tests: for each
// pod bound to the node, ask the device plugin to Allocate each container's GPUs (through a
// DeviceAllocator: the test kubelet speaking the real gRPC protocol), set the pod Running and
// record the MIG UUIDs each container got (annotation `dynmig.io/visible-devices`), stand for the
// workload with a simulated process attached to each MIG device, and end it when the pod's
// `sleep N` is over (Succeeded) or the pod is deleted (the process is detached, then the pod is
// removed, as a kubelet confirms a graceful deletion). Allocate failures fail the pod
// (UnexpectedAdmissionError), as the kubelet does.
//
// As the kubelet, it tells the kubelet side of the device plugin API about a pod before it
// allocates for it (so the PodResources API lists it), and before each container starts (init
// containers first, one after the other; then app containers) it asks for PreStartContainer when
// the plugin wants it. A container whose PreStartContainer fails does not start and gets nothing:
// it stays Waiting with reason CreateContainerConfigError and the kubelet's message, a Warning
// event "Failed" ("Error: device plugin PreStartContainer rpc failed with err: ...") is recorded,
// the pod stays Pending (no app container starts while an init container waits), and the start is
// tried again every prestart_retry, as the kubelet's pod worker does after a failed sync.
//
// Pods' sleeps, the admission delay and the PreStartContainer retries run on the injected clock.
// Thread-safe; owns one thread.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "kube/informer.h"
#include "kube/kube_client.h"
#include "protocol/annotations.h"

namespace dynmig::local {

inline constexpr std::string_view kVisibleDevicesAnnotation = protocol::kVisibleDevicesAnnotation;

struct ContainerAllocation {
  std::map<std::string, std::string> envs;
  std::vector<std::string> devices;      // host paths
  std::vector<std::string> cdi_devices;  // fully qualified CDI names
};

// The kubelet's side of the device plugin API. Like the kubelet, the agent allocates every
// extended resource a registered plugin serves: dynmig's, and others' (NVIDIA's device plugin
// serves one resource per MIG profile, nvidia.com/mig-<profile>, to a handover's legacy pods).
class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  // The resource name dynmig's plugin registered, e.g. "nvidia.com/gpu"; "" while not registered.
  virtual std::string ResourceName() = 0;
  // Every resource a registered plugin serves now (dynmig's among them). Default: dynmig's alone.
  virtual std::vector<std::string> ResourceNames() {
    std::string own = ResourceName();
    return own.empty() ? std::vector<std::string>{} : std::vector<std::string>{own};
  }
  // Device IDs dynmig's plugin advertises (ListAndWatch), healthy ones.
  virtual std::vector<std::string> DeviceIds() = 0;
  // Free healthy device IDs of `resource`. Default: dynmig's resource only.
  virtual std::vector<std::string> ResourceDeviceIds(const std::string& resource) {
    return resource == ResourceName() ? DeviceIds() : std::vector<std::string>{};
  }
  // Allocate for one container of a pod ("namespace/name") with the chosen device IDs of dynmig's
  // resource.
  virtual absl::StatusOr<ContainerAllocation> Allocate(const std::string& pod,
                                                       const std::string& container,
                                                       const std::vector<std::string>& ids) = 0;
  // The same for `resource`. Default: dynmig's resource only.
  virtual absl::StatusOr<ContainerAllocation> AllocateResource(const std::string& pod,
                                                               const std::string& container,
                                                               const std::vector<std::string>& ids,
                                                               const std::string& resource) {
    if (resource != ResourceName())
      return absl::NotFoundError("no device plugin registered for " + resource);
    return Allocate(pod, container, ids);
  }
  // The pod's containers ended: its devices are free again (the kubelet's checkpoint forgets it).
  virtual void Release(const std::string& pod) { (void)pod; }
  // The pod's UID, told before Admit (the runtime's io.kubernetes.pod.uid label shows it).
  virtual void PodUid(const std::string& pod, const std::string& uid) { (void)pod, (void)uid; }
  // The kubelet learns of a pod before admitting it: its app and init containers, by name.
  virtual void Admit(const std::string& pod, const std::vector<std::string>& containers,
                     const std::vector<std::string>& init_containers) {
    (void)pod, (void)containers, (void)init_containers;
  }
  // The kubelet's PreStartContainer call before `container` starts (a no-op unless the plugin
  // asked for it and the container holds its devices). An error: the container does not start.
  virtual absl::Status PreStart(const std::string& pod, const std::string& container) {
    (void)pod, (void)container;
    return absl::OkStatus();
  }
  // The container starts with the literal env of its spec (SpecEnv), which the container runtime
  // shows beside what the plugins' Allocate answers gave (an env an answer set is kept).
  virtual void ContainerEnv(const std::string& pod, const std::string& container,
                            const std::map<std::string, std::string>& env) {
    (void)pod, (void)container, (void)env;
  }
};

// The workload stand-in: processes on MIG devices (SimNvml::AttachProcess/DetachProcess).
struct ProcessHooks {
  std::function<absl::Status(const std::string& mig_uuid, uint32_t pid)> attach;
  std::function<absl::Status(const std::string& mig_uuid, uint32_t pid)> detach;
};

struct NodeAgentOptions {
  std::string node;
  ProcessHooks processes;
  std::function<void(const std::string&)> log;
  uint32_t first_pid = 10000;
  // How long after the agent first sees a pod bound to its node it admits the pod (calls
  // Allocate). Zero: at once. A real kubelet takes a while (its watch, the pod workers, admission:
  // 0.6 s median, up to 2 s, on the 2-core real-cluster harness during a burst), and the node
  // lock is held all that time; the local mode models it to show what a cluster shows.
  absl::Duration admission_delay = absl::ZeroDuration();
  // After a container's PreStartContainer failed, when its start is tried again (the kubelet's
  // pod worker backs off 10 s after a failed sync).
  absl::Duration prestart_retry = absl::Seconds(10);
};

class NodeAgent {
 public:
  // `client`, `allocator` and `clock` must outlive the agent.
  NodeAgent(kube::KubeClient& client, DeviceAllocator& allocator, const Clock& clock,
            NodeAgentOptions options);
  ~NodeAgent();  // Stop()

  void Start();
  // Stops the agent; simulated processes stay attached (a kubelet restart does not kill pods).
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // One pass (the agent's thread calls it; a test may instead, without Start()).
  void Reconcile();

 private:
  // A container admitted (its devices allocated) but not started yet.
  struct Admitted {
    std::string name;
    bool init = false;
    std::string devices;  // what the device plugin answered (MIG UUIDs or CDI names)
    std::string error;    // why its last start failed ("" = not tried yet)
  };
  struct Running {
    std::vector<std::pair<std::string, uint32_t>> processes;  // (MIG UUID, pid)
    std::optional<absl::Time> ends_at;
    std::vector<Admitted> waiting;  // not started yet (a PreStartContainer failed)
    nlohmann::json visible = nlohmann::json::object();  // started containers' devices
    absl::Time retry_at = absl::InfiniteFuture();
  };
  // The agent's thread: a Reconcile on every change of the node's pods and when NextWake says.
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // How long until a pod's sleep ends, a waiting container is tried again or a pod is admitted
  // (at most a second, to retry status writes).
  absl::Duration NextWake() const;
  void StartPod(const kube::Object& pod);
  // Allocates every registered resource `container` asks for (free devices of each, not in
  // `used`); returns what the container's NVIDIA_VISIBLE_DEVICES (or CDI names) say, comma-joined.
  absl::StatusOr<std::string> AllocateContainer(const std::string& key,
                                                const kube::Object& container,
                                                const std::string& name,
                                                const std::vector<std::string>& resources,
                                                std::map<std::string, std::set<std::string>>& used);
  // The pod failed admission (UnexpectedAdmissionError), as the kubelet fails it.
  void FailAdmission(const kube::Object& pod, const std::string& message);
  // Starts the waiting containers of `running` in the kubelet's order: each after its
  // PreStartContainer; stops at an init container that cannot start. Then writes the status.
  void StartContainers(const kube::Object& pod, Running& running);
  void WriteStartedStatus(const kube::Object& pod, const Running& running);
  void FinishPod(const kube::Object& pod, const std::string& phase);
  // Writes the pod's status; a failed write is kept and retried by every Reconcile until it
  // lands or the pod is gone, as the kubelet's status manager does (a status lost to one API
  // error would leave a running pod Pending forever).
  void WriteStatus(const kube::Object& pod, nlohmann::json status);
  void Log(const std::string& line) const;

  kube::KubeClient& client_;
  DeviceAllocator& allocator_;
  const Clock& clock_;
  const NodeAgentOptions options_;
  kube::Informer pods_;
  // The reconcile state: owned by whoever runs Reconcile (the agent's thread), never shared.
  std::map<std::string, Running> running_;  // by pod uid
  std::map<std::string, std::string> started_uid_;
  std::map<std::string, absl::Time> first_seen_;  // by pod uid: bound pods not started yet
  absl::Time next_admission_ = absl::InfiniteFuture();
  struct UnsyncedStatus {
    std::string ns, name;
    nlohmann::json status;
  };
  std::map<std::string, UnsyncedStatus> unsynced_;  // by pod uid: status writes to retry
  uint32_t next_pid_;
  dynmig::Mutex mu_;
  dynmig::CondVar cv_;  // signalled on stop_ and dirty_
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool dirty_ ABSL_GUARDED_BY(mu_) = true;  // the node's pods changed since the last Reconcile
  std::thread thread_;
};

// The literal env of a container's spec (env[].value; valueFrom is not resolved), bounded: at
// most kMaxSpecEnv entries, names up to 256 bytes, values up to 4 KiB (longer ones are left out).
inline constexpr size_t kMaxSpecEnv = 64;
std::map<std::string, std::string> SpecEnv(const kube::Object& container);

// The nvidia.com/mig-<profile> resources a container asks at least one of (NVIDIA's device
// plugin's, mixed strategy), bounded to 16.
std::vector<std::string> MigResources(const kube::Object& container);

// Seconds of the first `sleep N` in a container's command and args (e.g. bash -c "sleep 3600").
std::optional<int64_t> SleepSeconds(const kube::Object& container);

}  // namespace dynmig::local
