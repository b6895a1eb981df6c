#include "deviceplugin/test_runtime.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "common/clock.h"
#include "cri/v1/api.grpc.pb.h"
#include "cri/v1alpha2/api.grpc.pb.h"
#include "deviceplugin/unix_grpc.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace dynmig::deviceplugin {
namespace {

std::string PodKey(const TestRuntimeContainer& c) { return c.pod_namespace + "/" + c.pod_name; }

std::map<std::string, std::string> Labels(const TestRuntimeContainer& c) {
  std::map<std::string, std::string> labels = c.extra_labels;
  labels[std::string(kCriPodUidLabel)] = c.pod_uid;
  labels[std::string(kCriPodNameLabel)] = c.pod_name;
  labels[std::string(kCriPodNamespaceLabel)] = c.pod_namespace;
  labels[std::string(kCriContainerNameLabel)] = c.name;
  return labels;
}

// containerd's filter: every set field must match.
template <typename Filter>
bool Matches(const TestRuntimeContainer& c, const Filter& f, bool has_filter) {
  if (!has_filter) return true;
  if (!f.id().empty() && c.id.rfind(f.id(), 0) != 0) return false;  // containerd matches a prefix
  if (f.has_state() && static_cast<int>(f.state().state()) != static_cast<int>(c.state))
    return false;
  if (!f.pod_sandbox_id().empty() && f.pod_sandbox_id() != c.sandbox_id) return false;
  const auto labels = Labels(c);
  for (const auto& [k, v] : f.label_selector()) {
    auto it = labels.find(k);
    if (it == labels.end() || it->second != v) return false;
  }
  return true;
}

template <typename Message>
void FillCommon(const TestRuntimeContainer& c, Message* m) {
  m->set_id(c.id);
  m->mutable_metadata()->set_name(c.name);
  m->mutable_metadata()->set_attempt(c.attempt);
  m->mutable_image()->set_image("registry.k8s.io/pause:3.2");
  m->set_image_ref("sha256:80d28bedfe5dec59da9ebf8e6260224ac9008ab5c11dbbe16ee3ba3e4439ac2c");
  m->set_state(static_cast<std::remove_cvref_t<decltype(m->state())>>(static_cast<int>(c.state)));
  m->set_created_at(c.created_at);
  for (const auto& [k, v] : Labels(c)) (*m->mutable_labels())[k] = v;
}

}  // namespace

// Not in the anonymous namespace: TestRuntime's nested classes derive from it.
namespace test_runtime_internal {

// One version's RuntimeService over the shared table.
template <typename Base, typename ListRequest, typename ListResponse, typename StatusRequest,
          typename StatusResponse>
class CriService : public Base {
 public:
  CriService(TestRuntime& runtime, bool v1) : runtime_(runtime), v1_(v1) {}

  grpc::Status ListContainers(grpc::ServerContext*, const ListRequest* request,
                              ListResponse* out) override {
    if (auto a = runtime_.Admit(v1_); a.grpc_code != 0) return Error(a);
    for (const auto& c : runtime_.containers()) {
      if (Matches(c, request->filter(), request->has_filter()))
        FillCommon(c, out->add_containers());
    }
    return grpc::Status::OK;
  }

  grpc::Status ContainerStatus(grpc::ServerContext*, const StatusRequest* request,
                               StatusResponse* out) override {
    if (auto a = runtime_.Admit(v1_); a.grpc_code != 0) return Error(a);
    for (const auto& c : runtime_.containers()) {
      if (c.id != request->container_id()) continue;
      FillCommon(c, out->mutable_status());
      if (c.state == TestRuntimeState::kExited) {
        out->mutable_status()->set_reason("Completed");
        out->mutable_status()->set_finished_at(c.created_at + 1);
      }
      if (request->verbose()) {
        (*out->mutable_info())["info"] =
            runtime_.RawInfo(c.id).value_or(TestRuntime::VerboseInfo(c));
      }
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        fmt::format("an error occurred when try to find container \"{}\": not "
                                    "found",
                                    request->container_id()));
  }

 private:
  static grpc::Status Error(const TestRuntime::Answer& a) {
    return grpc::Status(static_cast<grpc::StatusCode>(a.grpc_code), a.message);
  }
  TestRuntime& runtime_;
  const bool v1_;
};

}  // namespace test_runtime_internal

using test_runtime_internal::CriService;

class TestRuntime::V1 final
    : public CriService<runtime::v1::RuntimeService::Service, runtime::v1::ListContainersRequest,
                        runtime::v1::ListContainersResponse, runtime::v1::ContainerStatusRequest,
                        runtime::v1::ContainerStatusResponse> {
 public:
  explicit V1(TestRuntime& r) : CriService(r, true) {}
};

class TestRuntime::V1alpha2 final
    : public CriService<
          runtime::v1alpha2::RuntimeService::Service, runtime::v1alpha2::ListContainersRequest,
          runtime::v1alpha2::ListContainersResponse, runtime::v1alpha2::ContainerStatusRequest,
          runtime::v1alpha2::ContainerStatusResponse> {
 public:
  explicit V1alpha2(TestRuntime& r) : CriService(r, false) {}
};

TestRuntime::TestRuntime(std::string socket_path)
    : socket_path_(std::move(socket_path)),
      v1_(std::make_unique<V1>(*this)),
      v1alpha2_(std::make_unique<V1alpha2>(*this)) {}

TestRuntime::~TestRuntime() { Stop(); }

absl::StatusOr<std::unique_ptr<TestRuntime>> TestRuntime::Start(std::string socket_path) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(socket_path).parent_path(), ec);
  std::unique_ptr<TestRuntime> r(new TestRuntime(std::move(socket_path)));
  if (auto st = r->Serve(); !st.ok()) return st;
  return r;
}

absl::Status TestRuntime::Serve() {
  dynmig::MutexLock lock(&server_mu_);
  auto server = ServeOnUnixSocket(socket_path_, {v1_.get(), v1alpha2_.get()});
  if (!server.ok()) return server.status();
  server_ = std::move(*server);
  return absl::OkStatus();
}

void TestRuntime::Stop() {
  dynmig::MutexLock lock(&server_mu_);
  if (server_ == nullptr) return;
  server_->Shutdown(RealDeadlineAfter(absl::Seconds(1)));
  server_->Wait();
  server_.reset();
  ::unlink(socket_path_.c_str());
}

std::string TestRuntime::AddContainer(TestRuntimeContainer c) {
  dynmig::MutexLock lock(&mu_);
  if (c.id.empty()) c.id = fmt::format("{:064x}", next_id_++ * 0x9e3779b97f4a7c15ULL);
  if (c.sandbox_id.empty())
    c.sandbox_id = fmt::format("{:064x}", std::hash<std::string>{}(c.pod_uid + PodKey(c)));
  auto it = std::find_if(table_.begin(), table_.end(),
                         [&](const TestRuntimeContainer& x) { return x.id == c.id; });
  const std::string id = c.id;
  if (it != table_.end()) {
    *it = std::move(c);
  } else {
    table_.push_back(std::move(c));
  }
  return id;
}

void TestRuntime::AddEnvs(const std::string& pod, const std::string& uid,
                          const std::string& container,
                          const std::map<std::string, std::string>& envs) {
  std::optional<TestRuntimeContainer> existing = Find(pod, container);
  TestRuntimeContainer c;
  if (existing) {
    c = std::move(*existing);
  } else {
    const size_t slash = pod.find('/');
    c.pod_namespace = slash == std::string::npos ? "" : pod.substr(0, slash);
    c.pod_name = slash == std::string::npos ? pod : pod.substr(slash + 1);
    c.pod_uid = uid;
    c.name = container;
    c.env = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"};
  }
  for (const auto& [k, v] : envs) {
    const std::string prefix = k + "=";
    const bool has = std::any_of(c.env.begin(), c.env.end(),
                                 [&](const std::string& e) { return e.rfind(prefix, 0) == 0; });
    if (!has) c.env.push_back(prefix + v);
  }
  c.state = TestRuntimeState::kRunning;
  AddContainer(std::move(c));
}

std::optional<TestRuntimeContainer> TestRuntime::Find(const std::string& pod,
                                                      const std::string& container) const {
  dynmig::MutexLock lock(&mu_);
  for (auto it = table_.rbegin(); it != table_.rend(); ++it) {
    if (PodKey(*it) == pod && it->name == container && it->state != TestRuntimeState::kExited)
      return *it;
  }
  return std::nullopt;
}

int TestRuntime::ExitPod(const std::string& pod) {
  dynmig::MutexLock lock(&mu_);
  int changed = 0;
  for (auto& c : table_) {
    if (PodKey(c) == pod && c.state != TestRuntimeState::kExited) {
      c.state = TestRuntimeState::kExited;
      ++changed;
    }
  }
  return changed;
}

bool TestRuntime::SetState(const std::string& id, TestRuntimeState state) {
  dynmig::MutexLock lock(&mu_);
  for (auto& c : table_) {
    if (c.id == id) {
      c.state = state;
      return true;
    }
  }
  return false;
}

std::vector<TestRuntimeContainer> TestRuntime::containers() const {
  dynmig::MutexLock lock(&mu_);
  return table_;
}

void TestRuntime::SetRawInfo(const std::string& id, std::string info) {
  dynmig::MutexLock lock(&mu_);
  raw_info_[id] = std::move(info);
}

std::optional<std::string> TestRuntime::RawInfo(const std::string& id) const {
  dynmig::MutexLock lock(&mu_);
  auto it = raw_info_.find(id);
  if (it == raw_info_.end()) return std::nullopt;
  return it->second;
}

void TestRuntime::FailNext(int count, int grpc_code, std::string message) {
  dynmig::MutexLock lock(&mu_);
  fail_count_ = count;
  fail_code_ = grpc_code;
  fail_message_ = std::move(message);
}

void TestRuntime::SetV1Unimplemented(bool on) {
  dynmig::MutexLock lock(&mu_);
  v1_unimplemented_ = on;
}

int TestRuntime::calls() const {
  dynmig::MutexLock lock(&mu_);
  return calls_;
}

TestRuntime::Answer TestRuntime::Admit(bool v1) {
  dynmig::MutexLock lock(&mu_);
  ++calls_;
  if (v1 && v1_unimplemented_) {
    return {static_cast<int>(grpc::StatusCode::UNIMPLEMENTED),
            "unknown service runtime.v1.RuntimeService"};
  }
  if (fail_count_ > 0) {
    --fail_count_;
    return {fail_code_, fail_message_};
  }
  return {};
}

std::string TestRuntime::VerboseInfo(const TestRuntimeContainer& c) {
  nlohmann::json labels = nlohmann::json::object();
  for (const auto& [k, v] : Labels(c)) labels[k] = v;
  nlohmann::json info = {
      {"sandboxID", c.sandbox_id},
      {"pid", c.state == TestRuntimeState::kRunning ? 4242 : 0},
      {"removing", false},
      {"snapshotKey", c.id},
      {"snapshotter", "overlayfs"},
      {"runtimeType", "io.containerd.runc.v2"},
      {"runtimeOptions", nlohmann::json::object()},
      {"config", {{"metadata", {{"name", c.name}, {"attempt", c.attempt}}}, {"labels", labels}}},
      {"runtimeSpec",
       {{"ociVersion", "1.0.2-dev"},
        {"process",
         {{"user", {{"uid", 0}, {"gid", 0}}}, {"args", c.args}, {"env", c.env}, {"cwd", "/"}}},
        {"root", {{"path", "rootfs"}}},
        {"hostname", c.pod_name}}}};
  return info.dump();
}

}  // namespace dynmig::deviceplugin
