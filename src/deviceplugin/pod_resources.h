// The kubelet's PodResources API as the device plugin reads it: which devices of which resource
// the kubelet handed to each container of each pod it knows. The kubelet records a container's
// devices right after the plugin's Allocate returns, so this is the kubelet's own word on whom an
// allocation went to (see plugin_identity.cc).
//
// Served by the kubelet on <kubelet root>/pod-resources/kubelet.sock (gRPC; v1.20 serves
// v1.PodResourcesLister/List and v1alpha1.PodResourcesLister/List). Pods carry namespace and name
// but no UID; only spec.containers are listed (init containers are not, up to at least v1.20).
//
//   GrpcPodResources kubelet({.socket = "/var/lib/kubelet/pod-resources/kubelet.sock"});
//   auto pods = kubelet.List();   // v1, or v1alpha1 when the kubelet does not serve v1
//
// The answer is hostile input like any other: the channel refuses a message over
// max_message_bytes, every call has a deadline. Thread-safe.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace dynmig::deviceplugin {

inline constexpr std::string_view kDefaultPodResourcesSocket =
    "/var/lib/kubelet/pod-resources/kubelet.sock";
// A node's answer is a few KiB per pod (110 pods: well under 1 MiB).
inline constexpr int kPodResourcesMaxMessageBytes = 4 << 20;

struct PodResourcesContainer {
  std::string name;
  // Resource name -> the device IDs the kubelet gave the container (its per-NUMA entries joined),
  // sorted.
  std::map<std::string, std::vector<std::string>> devices;
};

struct PodResourcesPod {
  std::string ns;
  std::string name;
  std::vector<PodResourcesContainer> containers;

  std::string Key() const { return ns + "/" + name; }
};

using PodResourcesList = std::vector<PodResourcesPod>;

// The seam the device plugin reads the kubelet through (tests inject fakes).
class PodResourcesSource {
 public:
  virtual ~PodResourcesSource() = default;
  // Every pod the kubelet knows. Errors name the endpoint and what failed (kUnavailable: not
  // reachable; kDeadlineExceeded; kResourceExhausted: the answer is over the size limit).
  virtual absl::StatusOr<PodResourcesList> List() = 0;
  // Where it reads from, for messages ("unix:///var/lib/kubelet/pod-resources/kubelet.sock").
  virtual std::string Describe() const = 0;
};

struct PodResourcesClientOptions {
  std::string socket = std::string(kDefaultPodResourcesSocket);
  absl::Duration timeout = absl::Seconds(5);
  int max_message_bytes = kPodResourcesMaxMessageBytes;
};

class GrpcPodResources final : public PodResourcesSource {
 public:
  explicit GrpcPodResources(PodResourcesClientOptions options);
  ~GrpcPodResources() override;

  absl::StatusOr<PodResourcesList> List() override;
  std::string Describe() const override { return "unix://" + options_.socket; }

 private:
  const PodResourcesClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::atomic<bool> v1alpha1_only_{false};  // the kubelet answered v1 with UNIMPLEMENTED
};

// The PodResources socket of the kubelet whose device-plugin directory is `device_plugin_dir`:
// "<its parent>/pod-resources/kubelet.sock" (/var/lib/kubelet/device-plugins ->
// /var/lib/kubelet/pod-resources/kubelet.sock).
std::string PodResourcesSocketBeside(std::string_view device_plugin_dir);

}  // namespace dynmig::deviceplugin
