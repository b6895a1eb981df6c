// TestKubelet: the kubelet's device-manager half, over real gRPC, for tests and the local mode.
//
// Like the kubelet it serves v1beta1.Registration on <dir>/kubelet.sock; inside Register it
// validates the request, dials the plugin's endpoint (<dir>/<endpoint>, 10 s), calls
// GetDevicePluginOptions before answering, then keeps a ListAndWatch stream open in the
// background (a second registration of the same resource replaces the first; when a stream ends
// the resource's devices turn Unhealthy, as the kubelet does). It offers Allocate for a pod
// container (bookkept like the kubelet's checkpoint, so AllocateCount can pick free devices),
// GetPreferredAllocation and PreStartContainer. Restart() behaves like a kubelet restart: every
// socket of the directory is removed and kubelet.sock is created anew, so plugins must register
// again. Keep `dir` short: unix socket paths hold at most 107 bytes.
//
// Like the kubelet it serves the PodResources API (v1 and v1alpha1 PodResourcesLister/List) on
// its own socket, by default <parent of dir>/pod-resources/kubelet.sock (the kubelet's layout:
// device-plugins/ and pod-resources/ side by side): every pod it knows (AddPod, or a pod it
// allocated for) with its app containers (init containers are not listed, as in v1.20) and the
// devices each holds. It knows a pod before it calls Allocate for it, and records the devices
// right after Allocate returns, as the kubelet does. PreStart(pod, container) is the kubelet's
// call before a container starts: PreStartContainer with the container's devices when the
// plugin's options ask for it, failing with the kubelet's error text.
//
//   auto kubelet = TestKubelet::Start("/tmp/dp-x");
//   (*kubelet)->WaitForRegistrations(1, absl::Seconds(10));
//   auto a = (*kubelet)->AllocateCount("default/pod-a", "main", 1);   // GetPreferred + Allocate
//   a->response.envs().at("NVIDIA_VISIBLE_DEVICES");
//
// With a TestRuntime attached (AttachRuntime) it plays the kubelet's part towards the container
// runtime too: each successful Allocate adds the answer's envs to the container's entry (running,
// with the pod's UID from SetPodUid), and ReleasePod marks the pod's containers exited.
//
// Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "deviceplugin/pod_resources.h"
#include "deviceplugin/v1beta1/api.pb.h"

namespace grpc {
class Server;
class Channel;
class ClientContext;
}  // namespace grpc

namespace dynmig::deviceplugin {

// What the test kubelet knows about one registered resource.
struct KubeletPluginInfo {
  std::string resource_name;
  std::string endpoint;  // socket file name in the directory
  v1beta1::DevicePluginOptions options;
  std::vector<v1beta1::Device> devices;  // the last ListAndWatch answer
  bool stream_open = false;
  int registrations = 0;  // of this resource, across restarts
  int updates = 0;        // ListAndWatch messages received
};

// One container's allocation, as the kubelet checkpoints it.
struct KubeletAllocation {
  std::string pod;  // caller's name for the pod, e.g. "default/p"
  std::string container;
  std::string resource_name;
  std::vector<std::string> device_ids;
  v1beta1::ContainerAllocateResponse response;
};

class TestRuntime;

class TestKubelet {
 public:
  // Serves <dir>/kubelet.sock (dir is created; a stale kubelet.sock is replaced) and the
  // PodResources API on `pod_resources_socket` ("" = PodResourcesSocketBeside(dir)). kUnavailable
  // when gRPC cannot listen; kInvalidArgument when a socket path is too long. The Wait* methods
  // wait on `clock`, which must outlive the kubelet; gRPC deadlines run on real time.
  static absl::StatusOr<std::unique_ptr<TestKubelet>> Start(std::string dir,
                                                            std::string pod_resources_socket = "",
                                                            const Clock& clock = RealClock());
  ~TestKubelet();  // Stop()
  TestKubelet(const TestKubelet&) = delete;
  TestKubelet& operator=(const TestKubelet&) = delete;

  // Stops serving, ends every ListAndWatch stream, removes kubelet.sock. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_, server_mu_);
  // A kubelet restart: Stop, remove every socket file of the directory (not directories or other
  // files), serve a new kubelet.sock. Registrations counted so far are kept.
  absl::Status Restart() ABSL_LOCKS_EXCLUDED(mu_, server_mu_);

  const std::string& dir() const { return dir_; }
  std::string socket_path() const { return dir_ + "/kubelet.sock"; }
  const std::string& pod_resources_socket() const { return pod_resources_socket_; }

  // `resource` "" = the only (or first) registered resource.
  int registrations(std::string_view resource = "") const;
  bool WaitForRegistrations(int count, absl::Duration timeout, std::string_view resource = "");
  std::optional<KubeletPluginInfo> plugin(std::string_view resource = "") const;
  // Every resource a plugin registered whose ListAndWatch stream is open, by name.
  std::vector<std::string> resources() const;
  std::vector<v1beta1::Device> devices(std::string_view resource = "") const;
  // Waits until the resource's device list satisfies `pred`.
  bool WaitForDevices(const std::function<bool(const std::vector<v1beta1::Device>&)>& pred,
                      absl::Duration timeout, std::string_view resource = "");
  // Healthy devices not allocated to any container.
  std::vector<std::string> FreeDevices(std::string_view resource = "") const;

  // The kubelet learns of a pod ("namespace/name") with its app and init containers (by name).
  // Allocate adds a pod it does not know yet, with the container as an app container.
  void AddPod(const std::string& pod, std::vector<std::string> containers,
              std::vector<std::string> init_containers = {});
  // The pod's UID, as the runtime's io.kubernetes.pod.uid label shows it ("" until set).
  void SetPodUid(const std::string& pod, std::string uid);
  // The container runtime this kubelet starts containers in (null: none). Must outlive the
  // kubelet or be detached first.
  void AttachRuntime(TestRuntime* runtime);
  // What the PodResources API answers now.
  PodResourcesList PodResources() const;
  // The kubelet's PreStartContainer call before `container` of `pod` starts: nothing unless the
  // container holds devices of the resource and the plugin asked for pre_start_required; then
  // PreStartContainer with its devices. Errors read as the kubelet's ("device plugin
  // PreStartContainer rpc failed with err: rpc error: code = ... desc = ...").
  absl::Status PreStart(const std::string& pod, const std::string& container,
                        std::string_view resource = "");
  int prestart_calls() const;

  // Allocate for one container with these device ids (recorded on success).
  absl::StatusOr<v1beta1::ContainerAllocateResponse> Allocate(
      const std::string& pod, const std::string& container,
      const std::vector<std::string>& device_ids, std::string_view resource = "");
  // Picks `count` free devices (through GetPreferredAllocation when the plugin offers it), then
  // Allocate. kResourceExhausted when fewer are free.
  absl::StatusOr<KubeletAllocation> AllocateCount(const std::string& pod,
                                                  const std::string& container, int count,
                                                  std::string_view resource = "");
  absl::StatusOr<std::vector<std::string>> PreferredAllocation(
      const std::vector<std::string>& available, const std::vector<std::string>& must_include,
      int size, std::string_view resource = "");
  absl::Status PreStartContainer(const std::vector<std::string>& device_ids,
                                 std::string_view resource = "");
  // Forgets the pod and its allocations (the pod was deleted).
  void ReleasePod(const std::string& pod);
  std::vector<KubeletAllocation> allocations() const;

 private:
  struct Plugin;
  struct KnownPod {
    std::vector<std::string> containers;  // app containers, in order
    std::vector<std::string> init_containers;
  };
  class RegistrationService;
  class PodResourcesV1;
  class PodResourcesV1alpha1;

  TestKubelet(std::string dir, std::string pod_resources_socket, const Clock& clock);
  absl::Status Serve() ABSL_LOCKS_EXCLUDED(server_mu_);
  absl::Status ServePodResources() ABSL_EXCLUSIVE_LOCKS_REQUIRED(server_mu_);
  // The Registration handler.
  absl::Status OnRegister(const v1beta1::RegisterRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  // Dials the plugin at <dir>/<endpoint> and asks for its options (both bounded).
  absl::StatusOr<std::shared_ptr<Plugin>> Dial(const v1beta1::RegisterRequest& request) const;
  void WatchDevices(std::shared_ptr<Plugin> plugin) ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<Plugin> Find(std::string_view resource) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<Plugin>> Get(std::string_view resource) const
      ABSL_LOCKS_EXCLUDED(mu_);

  const std::string dir_;
  const std::string pod_resources_socket_;
  const Clock& clock_;
  std::unique_ptr<RegistrationService> service_;
  std::unique_ptr<PodResourcesV1> pod_resources_v1_;
  std::unique_ptr<PodResourcesV1alpha1> pod_resources_v1alpha1_;
  dynmig::Mutex server_mu_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(server_mu_);
  std::unique_ptr<grpc::Server> pod_resources_server_ ABSL_GUARDED_BY(server_mu_);

  mutable dynmig::Mutex mu_;
  mutable dynmig::CondVar cv_;  // signalled on every registration and ListAndWatch update
  std::map<std::string, std::shared_ptr<Plugin>> plugins_ ABSL_GUARDED_BY(mu_);  // by resource name
  std::map<std::string, int> registrations_ ABSL_GUARDED_BY(mu_);
  std::vector<KubeletAllocation> allocations_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, KnownPod> pods_ ABSL_GUARDED_BY(mu_);  // by "namespace/name"
  int prestart_calls_ ABSL_GUARDED_BY(mu_) = 0;
  TestRuntime* runtime_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::map<std::string, std::string> uids_ ABSL_GUARDED_BY(mu_);  // by "namespace/name"
  // Stream threads of replaced plugins, joined on Stop.
  std::vector<std::thread> retired_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dynmig::deviceplugin
