// TestRuntime: the container runtime's CRI side (containerd), for tests and the local mode, next
// to TestKubelet. It serves the RuntimeService subset dynmig reads, in both versions the kubelets
// of our range speak (runtime.v1 and runtime.v1alpha2), on a unix socket:
//
//   ListContainers   the container table, filtered as containerd filters (id, state, sandbox id,
//                    label selector);
//   ContainerStatus  one container; with verbose, info["info"] is containerd's JSON: "sandboxID",
//                    "pid", "runtimeType", "runtimeSpec": {"process": {"args", "env": [...]}}.
//                    An unknown id is NotFound, as containerd answers it.
//
// Containers carry the kubelet's labels (io.kubernetes.pod.uid, io.kubernetes.pod.name,
// io.kubernetes.pod.namespace, io.kubernetes.container.name), and their env is what the kubelet
// gave them: TestKubelet (AttachRuntime) adds a running container when it allocates for a pod's
// container, with every Allocate answer's envs for that container across resources (an env an
// earlier resource already set is kept, as the kubelet's device manager skips it), and marks the
// pod's containers exited when the pod ends (ReleasePod). A kubelet restart leaves the table as
// it is (the runtime is another process).
//
// Test knobs make it hostile: SetRawInfo replaces a container's info["info"] verbatim, FailNext
// makes the next calls fail with a code, SetV1Unimplemented answers runtime.v1 with UNIMPLEMENTED
// (a containerd that serves only v1alpha2). Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "deviceplugin/runtime_source.h"  // the kubelet's container labels

namespace grpc {
class Server;
}  // namespace grpc

namespace dynmig::deviceplugin {

enum class TestRuntimeState { kCreated = 0, kRunning = 1, kExited = 2, kUnknown = 3 };

struct TestRuntimeContainer {
  std::string id;  // 64 hex digits; AddContainer assigns one when empty
  std::string sandbox_id;
  std::string pod_uid;
  std::string pod_name;
  std::string pod_namespace;
  std::string name;  // the container's name in the pod
  TestRuntimeState state = TestRuntimeState::kRunning;
  std::vector<std::string> env;  // "KEY=VALUE", in order
  std::vector<std::string> args = {"sleep", "infinity"};
  uint32_t attempt = 0;
  int64_t created_at = 0;  // ns since the epoch
  std::map<std::string, std::string> extra_labels;
};

class TestRuntime {
 public:
  // Serves the socket (its directory is created; a stale file is replaced). kInvalidArgument when
  // the path is too long for a unix socket; kUnavailable when gRPC cannot listen.
  static absl::StatusOr<std::unique_ptr<TestRuntime>> Start(std::string socket_path);
  ~TestRuntime();  // Stop()
  TestRuntime(const TestRuntime&) = delete;
  TestRuntime& operator=(const TestRuntime&) = delete;

  // Stops serving and removes the socket; the table stays. Idempotent.
  void Stop();
  const std::string& socket_path() const { return socket_path_; }

  // Adds a container (or replaces the one with its id); returns its id.
  std::string AddContainer(TestRuntimeContainer c) ABSL_LOCKS_EXCLUDED(mu_);
  // The kubelet's view: the running container `container` of pod "namespace/name" (created when
  // missing, with `uid`) gets `envs` appended, an env it already has kept.
  void AddEnvs(const std::string& pod, const std::string& uid, const std::string& container,
               const std::map<std::string, std::string>& envs) ABSL_LOCKS_EXCLUDED(mu_);
  // Every container of pod "namespace/name" is exited. Returns how many changed.
  int ExitPod(const std::string& pod) ABSL_LOCKS_EXCLUDED(mu_);
  bool SetState(const std::string& id, TestRuntimeState state) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<TestRuntimeContainer> containers() const ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<TestRuntimeContainer> Find(const std::string& pod,
                                           const std::string& container) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Test knobs.
  void SetRawInfo(const std::string& id, std::string info) ABSL_LOCKS_EXCLUDED(mu_);
  // The next `count` calls (either method, either version) fail with `code` and `message`.
  void FailNext(int count, int grpc_code, std::string message) ABSL_LOCKS_EXCLUDED(mu_);
  void SetV1Unimplemented(bool on) ABSL_LOCKS_EXCLUDED(mu_);
  int calls() const ABSL_LOCKS_EXCLUDED(mu_);

  // The verbose info["info"] JSON of a container, as containerd writes it.
  static std::string VerboseInfo(const TestRuntimeContainer& c);

  // What the services call (public so both versions' services share them).
  struct Answer {
    int grpc_code = 0;  // 0 = OK
    std::string message;
  };
  Answer Admit(bool v1) ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<std::string> RawInfo(const std::string& id) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class V1;
  class V1alpha2;

  explicit TestRuntime(std::string socket_path);
  absl::Status Serve();

  const std::string socket_path_;
  std::unique_ptr<V1> v1_;
  std::unique_ptr<V1alpha2> v1alpha2_;
  dynmig::Mutex server_mu_;
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(server_mu_);

  mutable dynmig::Mutex mu_;
  std::vector<TestRuntimeContainer> table_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> raw_info_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int fail_count_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_code_ ABSL_GUARDED_BY(mu_) = 0;
  std::string fail_message_ ABSL_GUARDED_BY(mu_);
  bool v1_unimplemented_ ABSL_GUARDED_BY(mu_) = false;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dynmig::deviceplugin
