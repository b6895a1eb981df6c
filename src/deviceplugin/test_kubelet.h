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
//   auto kubelet = TestKubelet::Start("/tmp/dp-x");
//   (*kubelet)->WaitForRegistrations(1, absl::Seconds(10));
//   auto a = (*kubelet)->AllocateCount("default/pod-a", "main", 1);   // GetPreferred + Allocate
//   a->response.envs().at("NVIDIA_VISIBLE_DEVICES");
//
// Thread-safe.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
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

class TestKubelet {
 public:
  // Serves <dir>/kubelet.sock (dir is created; a stale kubelet.sock is replaced). kUnavailable
  // when gRPC cannot listen; kInvalidArgument when the socket path is too long.
  static absl::StatusOr<std::unique_ptr<TestKubelet>> Start(std::string dir);
  ~TestKubelet();  // Stop()
  TestKubelet(const TestKubelet&) = delete;
  TestKubelet& operator=(const TestKubelet&) = delete;

  // Stops serving, ends every ListAndWatch stream, removes kubelet.sock. Idempotent.
  void Stop();
  // A kubelet restart: Stop, remove every socket file of the directory (not directories or other
  // files), serve a new kubelet.sock. Registrations counted so far are kept.
  absl::Status Restart();

  const std::string& dir() const { return dir_; }
  std::string socket_path() const { return dir_ + "/kubelet.sock"; }

  // `resource` "" = the only (or first) registered resource.
  int registrations(std::string_view resource = "") const;
  bool WaitForRegistrations(int count, absl::Duration timeout, std::string_view resource = "");
  std::optional<KubeletPluginInfo> plugin(std::string_view resource = "") const;
  std::vector<v1beta1::Device> devices(std::string_view resource = "") const;
  // Waits until the resource's device list satisfies `pred`.
  bool WaitForDevices(const std::function<bool(const std::vector<v1beta1::Device>&)>& pred,
                      absl::Duration timeout, std::string_view resource = "");
  // Healthy devices not allocated to any container.
  std::vector<std::string> FreeDevices(std::string_view resource = "") const;

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
  // Forgets the pod's allocations (the pod was deleted).
  void ReleasePod(const std::string& pod);
  std::vector<KubeletAllocation> allocations() const;

 private:
  struct Plugin;
  class RegistrationService;

  explicit TestKubelet(std::string dir);
  absl::Status Serve();
  // The Registration handler.
  absl::Status OnRegister(const v1beta1::RegisterRequest& request);
  void WatchDevices(std::shared_ptr<Plugin> plugin);
  // REQUIRES: mu_ held.
  std::shared_ptr<Plugin> Find(std::string_view resource) const;
  absl::StatusOr<std::shared_ptr<Plugin>> Get(std::string_view resource) const;

  const std::string dir_;
  std::unique_ptr<RegistrationService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::mutex server_mu_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::map<std::string, std::shared_ptr<Plugin>> plugins_;  // by resource name
  std::map<std::string, int> registrations_;
  std::vector<KubeletAllocation> allocations_;
  std::vector<std::thread> retired_;  // stream threads of replaced plugins, joined on Stop
};

}  // namespace dynmig::deviceplugin
