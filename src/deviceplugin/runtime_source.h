// The container runtime as the device plugin reads it (CRI RuntimeService): which containers run on
// the node, whose pod each belongs to, and which devices each was given. Handover (handover.h)
// uses it to prove which container holds a MIG instance dynmig did not create, for pods whose
// kubelet record (PodResources) does not name the instance (HAMi's legacy pods, whose device IDs
// are "GPU-<uuid>[<t>-<s>]").
//
// A container's devices are NVIDIA_VISIBLE_DEVICES of its OCI spec: containerd answers
// ContainerStatus{verbose: true} with info["info"], a JSON object whose runtimeSpec.process.env
// lists "KEY=VALUE" strings. The pod comes from the labels the kubelet puts on every container it
// creates (io.kubernetes.pod.uid, .name, .namespace, io.kubernetes.container.name).
//
//   GrpcCriRuntime runtime({.socket = "/run/containerd/containerd.sock"});
//   auto containers = runtime.List();   // runtime.v1, or v1alpha2 when v1 is UNIMPLEMENTED
//
// Everything the runtime answers is hostile input: every call has a deadline and the whole List a
// budget, answers over max_message_bytes are refused by the channel, at most max_containers
// containers are queried (more: kResourceExhausted), an info JSON over kCriInfoJsonLimits is not
// parsed, and a container's env is bounded (ParseVisibleDevices). A container whose devices cannot
// be read says so in `error` (its devices are unknown; handover treats it as evidence missing).
// Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace dynmig::deviceplugin {

inline constexpr std::string_view kDefaultCriSocket = "/run/containerd/containerd.sock";
// The kubelet's labels on every container it creates (kubelet/types/labels.go).
inline constexpr std::string_view kCriPodUidLabel = "io.kubernetes.pod.uid";
inline constexpr std::string_view kCriPodNameLabel = "io.kubernetes.pod.name";
inline constexpr std::string_view kCriPodNamespaceLabel = "io.kubernetes.pod.namespace";
inline constexpr std::string_view kCriContainerNameLabel = "io.kubernetes.container.name";
// A node runs at most a few hundred containers (110 pods by default); 1024 bounds the
// ContainerStatus calls one List makes.
inline constexpr size_t kCriMaxContainers = 1024;
// ListContainers of 1024 containers with their labels and annotations is well under 4 MiB; a
// verbose ContainerStatus carries the OCI spec (tens of KiB).
inline constexpr int kCriMaxMessageBytes = 8 << 20;
// One NVIDIA_VISIBLE_DEVICES value: 64 device IDs of ~60 bytes are 4 KiB; 64 KiB is generous.
inline constexpr size_t kVisibleDevicesMaxBytes = 64 << 10;
// Device IDs one container may name (a node has at most 8 GPUs of at most 7 instances each).
inline constexpr size_t kVisibleDevicesMaxIds = 256;

enum class RuntimeContainerState { kCreated, kRunning, kExited, kUnknown };
std::string_view StateName(RuntimeContainerState state);

struct RuntimeContainer {
  std::string id;
  std::string pod_uid;  // "" for a container the kubelet did not create
  std::string pod_namespace;
  std::string pod_name;
  std::string container;
  RuntimeContainerState state = RuntimeContainerState::kUnknown;
  // NVIDIA_VISIBLE_DEVICES split at commas, trimmed, empty entries dropped, sorted and unique;
  // "none", "void" and "" name nothing (empty). Empty for an exited container (it holds nothing,
  // so it is not asked).
  std::vector<std::string> devices;
  // Why the container's devices cannot be read ("" when they can): its status failed, the info
  // JSON is missing, too large or malformed, the env is too large.
  std::string error;

  std::string PodKey() const { return pod_namespace + "/" + pod_name; }
};

// The seam the device plugin reads the runtime through (tests inject fakes).
class ContainerRuntimeSource {
 public:
  virtual ~ContainerRuntimeSource() = default;
  // Every container of the node. Errors name the endpoint and what failed (kUnavailable,
  // kDeadlineExceeded, kResourceExhausted: too many containers or an answer over the limit).
  virtual absl::StatusOr<std::vector<RuntimeContainer>> List() = 0;
  // Where it reads from, for messages ("unix:///run/containerd/containerd.sock").
  virtual std::string Describe() const = 0;
};

struct CriClientOptions {
  std::string socket = std::string(kDefaultCriSocket);
  absl::Duration call_timeout = absl::Seconds(2);   // each call
  absl::Duration list_timeout = absl::Seconds(20);  // one List, all its calls together
  int max_message_bytes = kCriMaxMessageBytes;
  size_t max_containers = kCriMaxContainers;
};

class GrpcCriRuntime final : public ContainerRuntimeSource {
 public:
  explicit GrpcCriRuntime(CriClientOptions options);
  ~GrpcCriRuntime() override;

  absl::StatusOr<std::vector<RuntimeContainer>> List() override;
  std::string Describe() const override { return "unix://" + options_.socket; }

 private:
  template <typename Api>
  absl::StatusOr<std::vector<RuntimeContainer>> ListWith(std::string_view version,
                                                         absl::Duration deadline);

  const CriClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::atomic<bool> v1alpha2_only_{false};  // the runtime answered v1 with UNIMPLEMENTED
};

// The devices named by the "KEY=VALUE" strings `env` (an OCI spec's process.env): every
// NVIDIA_VISIBLE_DEVICES entry's value (all of them when it occurs more than once: whichever the
// runtime honours, the container may hold it), split at commas. kInvalidArgument when a value is
// over kVisibleDevicesMaxBytes, names more than kVisibleDevicesMaxIds devices, or names a path
// (the NVIDIA toolkit's volume-mounts strategy: the devices cannot be read from the env).
absl::StatusOr<std::vector<std::string>> ParseVisibleDevices(const std::vector<std::string>& env);

// The devices of a verbose ContainerStatus's info map entry "info" (containerd's JSON:
// runtimeSpec.process.env), parsed within kCriInfoJsonLimits. kInvalidArgument naming what is
// wrong (missing, too large, malformed, env not a list of strings).
absl::StatusOr<std::vector<std::string>> DevicesFromInfo(std::string_view info_json);

}  // namespace dynmig::deviceplugin
