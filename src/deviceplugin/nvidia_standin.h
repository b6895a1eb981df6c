// NvidiaStandin: a stand-in for NVIDIA's k8s-device-plugin in the mixed MIG strategy, true to it
// where dynmig's handover depends on it, for tests, the local mode and the real-cluster suite.
//
// At Start it reads NVML once for the profiles of the live MIG devices on the node's GPUs and
// serves one v1beta1 DevicePlugin per profile, as the mixed strategy does: resource
// `nvidia.com/mig-<profile>` (e.g. nvidia.com/mig-1g.18gb), socket `nvidia-mig-<profile>.sock` in
// the kubelet's device-plugin directory, registered with <dir>/kubelet.sock (a real kubelet or
// TestKubelet). A profile whose name is not a valid resource-name suffix (the "+me" variants: '+'
// is not allowed in a Kubernetes resource name) is skipped with a warning.
//
//   GetDevicePluginOptions  {}: no PreStartContainer, no GetPreferredAllocation.
//   ListAndWatch            the MIG UUIDs of the live full compute instances of that profile,
//                           re-read from NVML every refresh_interval, all Healthy; a new list is
//                           sent when it changes.
//   Allocate                per container NVIDIA_VISIBLE_DEVICES=<ids comma-joined>, no device
//                           specs, no mounts (the device-list strategy "envvar", id strategy
//                           "uuid"). An id that is not a current device of the resource is
//                           InvalidArgument naming it ("invalid allocation request for
//                           'nvidia.com/mig-1g.18gb': unknown device: ..."); more than
//                           kMaxStandinIdsPerContainer ids, or an id over kMaxStandinIdBytes, too.
//
// Like the real plugin it re-registers when the kubelet restarts (kubelet.sock re-created) and
// serves again when its socket is removed. Stop() stops every server and removes its sockets: the
// plugin "goes away", so the kubelet sees the resources' streams end. Thread-safe.
//
// StandinMode::kHamiLegacy stands in for HAMi's legacy device plugin instead (hami_standin.h): one
// resource nvidia.com/gpu with fake split ids, Allocate through the pod's HAMi annotations. It is a
// mode of this class rather than a sibling because everything but the device list and Allocate
// (serving, registering, re-registering at a kubelet restart, going away) is the same.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "deviceplugin/v1beta1/api.pb.h"
#include "mig/legacy.h"
#include "nvml/nvml.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace dynmig::kube {
class KubeClient;
}  // namespace dynmig::kube

namespace dynmig::deviceplugin {

inline constexpr size_t kMaxStandinIdsPerContainer = 64;
inline constexpr size_t kMaxStandinIdBytes = 256;
// The one "profile" kHamiLegacy serves (its resource is nvidia.com/gpu).
inline constexpr std::string_view kHamiProfileKey = "gpu";

enum class StandinMode {
  kNvidiaMixed,  // NVIDIA's device plugin, mixed MIG strategy
  kHamiLegacy,   // HAMi's device plugin before dynamic MIG (hami_standin.h)
};

struct NvidiaStandinOptions {
  StandinMode mode = StandinMode::kNvidiaMixed;
  std::string kubelet_dir = "/var/lib/kubelet/device-plugins";
  absl::Duration refresh_interval = absl::Seconds(1);       // ListAndWatch re-reads NVML
  absl::Duration kubelet_poll_interval = absl::Seconds(1);  // kubelet.sock and own sockets
  absl::Duration register_timeout = absl::Seconds(10);
  // kHamiLegacy only: this node's name, the API (must outlive the stand-in), the split count and
  // HAMi's knownMigGeometries (non-empty).
  std::string node;
  kube::KubeClient* kube = nullptr;
  int split_count = 10;
  std::vector<mig::LegacyGeometryEntry> legacy_geometries;
};

// The node's live MIG devices (full compute instances) by GI profile name, each list ordered by
// GPU index, then GI id. GPUs without MIG enabled are skipped. NVML errors pass through.
absl::StatusOr<std::map<std::string, std::vector<std::string>>> MigDevicesByProfile(
    nvml::Nvml& nvml);

// The socket file name "nvidia-mig-<profile>.sock" (the resource is protocol::MigResourceName).
std::string StandinSocketName(std::string_view profile);

class NvidiaStandin {
 public:
  // Reads the profiles, serves one plugin per profile and registers each (a kubelet that is not
  // there yet is retried by the watcher). Errors: NVML's; kFailedPrecondition when no GPU has a
  // MIG device (the mixed strategy then advertises no MIG resource); kInvalidArgument when a
  // socket path is too long; kUnavailable when gRPC cannot listen. `nvml` and `clock` must outlive
  // the stand-in.
  static absl::StatusOr<std::unique_ptr<NvidiaStandin>> Start(NvidiaStandinOptions options,
                                                              nvml::Nvml& nvml, const Clock& clock);
  ~NvidiaStandin();  // Stop()
  NvidiaStandin(const NvidiaStandin&) = delete;
  NvidiaStandin& operator=(const NvidiaStandin&) = delete;

  // Ends the streams, stops every server, removes the sockets. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_, server_mu_);

  // The profiles served, in name order (kHamiLegacy: one, "gpu").
  std::vector<std::string> profiles() const;
  // The resource served for a profile: nvidia.com/mig-<profile> (kHamiLegacy: nvidia.com/gpu).
  std::string resource(std::string_view profile) const;
  std::string socket_path(std::string_view profile) const;
  // Successful registrations of a profile's resource (all profiles' when "").
  int registrations(std::string_view profile = "") const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until every profile registered at least `count` times (`timeout` of the clock's time).
  bool WaitForRegistrations(int count, absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Service;
  struct Served;

  NvidiaStandin(NvidiaStandinOptions options, nvml::Nvml& nvml, const Clock& clock);
  static absl::StatusOr<std::unique_ptr<NvidiaStandin>> StartHami(NvidiaStandinOptions options,
                                                                  nvml::Nvml& nvml,
                                                                  const Clock& clock);
  // Serves, registers and watches `s` (its profiles_ set), with the devices read at start.
  static absl::StatusOr<std::unique_ptr<NvidiaStandin>> Launch(
      std::unique_ptr<NvidiaStandin> s, std::map<std::string, std::vector<std::string>> devices);
  absl::Status Serve(Served& served) ABSL_EXCLUSIVE_LOCKS_REQUIRED(server_mu_);
  absl::Status Register(const std::string& profile);
  void RegisterAll(bool only_unregistered) ABSL_LOCKS_EXCLUDED(mu_);
  void Watch() ABSL_LOCKS_EXCLUDED(mu_, server_mu_);
  // The current device ids of a profile (NVML re-read); an NVML error gives the last list.
  std::vector<std::string> Devices(const std::string& profile) ABSL_LOCKS_EXCLUDED(mu_);
  // ListAndWatch's wait: true when stopping.
  bool WaitRefresh() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1beta1::ContainerAllocateResponse> Allocate(
      const std::string& profile, const v1beta1::ContainerAllocateRequest& request);
  absl::StatusOr<v1beta1::ContainerAllocateResponse> AllocateHami(
      const v1beta1::ContainerAllocateRequest& request);
  std::string SocketName(std::string_view profile) const;

  const NvidiaStandinOptions options_;
  nvml::Nvml& nvml_;
  const Clock& clock_;

  dynmig::Mutex server_mu_;
  std::map<std::string, std::unique_ptr<Served>> served_ ABSL_GUARDED_BY(server_mu_);
  std::vector<std::string> profiles_;  // set before any thread starts, then constant

  mutable dynmig::Mutex mu_;
  mutable dynmig::CondVar cv_;  // signalled on stop and on every registration
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, int> registrations_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, bool> registered_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<std::string>> last_devices_ ABSL_GUARDED_BY(mu_);
  std::thread watcher_;
};

}  // namespace dynmig::deviceplugin
