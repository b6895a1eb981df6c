#include "deviceplugin/test_kubelet.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "deviceplugin/test_runtime.h"
#include "deviceplugin/unix_grpc.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "fmt/format.h"
#include "podresources/v1/api.grpc.pb.h"
#include "podresources/v1alpha1/api.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {
namespace {

absl::Status FromGrpc(const grpc::Status& st, std::string_view what) {
  if (st.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                      fmt::format("{}: {}", what, st.error_message()));
}

// Extended resource names: "domain/name", not in the kubernetes.io domain.
bool IsExtendedResourceName(std::string_view name) {
  const size_t slash = name.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 >= name.size()) return false;
  const std::string_view domain = name.substr(0, slash);
  return domain != "kubernetes.io" && !domain.ends_with(".kubernetes.io");
}

// grpc-go's names of the status codes, as the kubelet's error text shows them.
std::string_view GoCodeName(absl::StatusCode code) {
  static constexpr std::string_view kNames[] = {
      "OK",       "Canceled",       "Unknown",          "InvalidArgument",   "DeadlineExceeded",
      "NotFound", "AlreadyExists",  "PermissionDenied", "ResourceExhausted", "FailedPrecondition",
      "Aborted",  "OutOfRange",     "Unimplemented",    "Internal",          "Unavailable",
      "DataLoss", "Unauthenticated"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < static_cast<int>(std::size(kNames)) ? kNames[i] : "Unknown";
}

// The PodResources answer in either version's messages (their shared fields).
template <typename Response>
void FillPodResources(const PodResourcesList& pods, Response* out) {
  for (const auto& p : pods) {
    auto* pod = out->add_pod_resources();
    pod->set_name(p.name);
    pod->set_namespace_(p.ns);
    for (const auto& c : p.containers) {
      auto* container = pod->add_containers();
      container->set_name(c.name);
      for (const auto& [resource, ids] : c.devices) {
        auto* d = container->add_devices();
        d->set_resource_name(resource);
        for (const auto& id : ids) d->add_device_ids(id);
      }
    }
  }
}

}  // namespace

class TestKubelet::PodResourcesV1 final : public ::v1::PodResourcesLister::Service {
 public:
  explicit PodResourcesV1(TestKubelet& kubelet) : kubelet_(kubelet) {}
  grpc::Status List(grpc::ServerContext*, const ::v1::ListPodResourcesRequest*,
                    ::v1::ListPodResourcesResponse* out) override {
    FillPodResources(kubelet_.PodResources(), out);
    return grpc::Status::OK;
  }

 private:
  TestKubelet& kubelet_;
};

class TestKubelet::PodResourcesV1alpha1 final : public ::v1alpha1::PodResourcesLister::Service {
 public:
  explicit PodResourcesV1alpha1(TestKubelet& kubelet) : kubelet_(kubelet) {}
  grpc::Status List(grpc::ServerContext*, const ::v1alpha1::ListPodResourcesRequest*,
                    ::v1alpha1::ListPodResourcesResponse* out) override {
    FillPodResources(kubelet_.PodResources(), out);
    return grpc::Status::OK;
  }

 private:
  TestKubelet& kubelet_;
};

struct TestKubelet::Plugin {
  KubeletPluginInfo info;  // guarded by TestKubelet::mu_
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1beta1::DevicePlugin::Stub> stub;
  std::shared_ptr<grpc::ClientContext> stream;
  std::thread thread;
};

class TestKubelet::RegistrationService final : public v1beta1::Registration::Service {
 public:
  explicit RegistrationService(TestKubelet& kubelet) : kubelet_(kubelet) {}
  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* request,
                        v1beta1::Empty*) override {
    absl::Status st = kubelet_.OnRegister(*request);
    if (st.ok()) return grpc::Status::OK;
    return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
  }

 private:
  TestKubelet& kubelet_;
};

TestKubelet::TestKubelet(std::string dir, std::string pod_resources_socket, const Clock& clock)
    : dir_(std::move(dir)),
      pod_resources_socket_(std::move(pod_resources_socket)),
      clock_(clock),
      service_(std::make_unique<RegistrationService>(*this)),
      pod_resources_v1_(std::make_unique<PodResourcesV1>(*this)),
      pod_resources_v1alpha1_(std::make_unique<PodResourcesV1alpha1>(*this)) {}

absl::StatusOr<std::unique_ptr<TestKubelet>> TestKubelet::Start(std::string dir,
                                                                std::string pod_resources_socket,
                                                                const Clock& clock) {
  if (pod_resources_socket.empty()) pod_resources_socket = PodResourcesSocketBeside(dir);
  std::error_code ec;
  for (const std::string& d :
       {dir, std::filesystem::path(pod_resources_socket).parent_path().string()}) {
    std::filesystem::create_directories(d, ec);
    if (ec) {
      return absl::UnavailableError(
          fmt::format("cannot create {}: {}", d, std::string(ec.message())));
    }
  }
  std::unique_ptr<TestKubelet> kubelet(
      new TestKubelet(std::move(dir), std::move(pod_resources_socket), clock));
  if (auto st = kubelet->Serve(); !st.ok()) return st;
  return kubelet;
}

TestKubelet::~TestKubelet() { Stop(); }

absl::Status TestKubelet::Serve() {
  dynmig::MutexLock lock(&server_mu_);
  auto server = ServeOnUnixSocket(socket_path(), {service_.get()});
  if (!server.ok()) return server.status();
  server_ = std::move(*server);
  return ServePodResources();
}

absl::Status TestKubelet::ServePodResources() {
  auto server = ServeOnUnixSocket(pod_resources_socket_,
                                  {pod_resources_v1_.get(), pod_resources_v1alpha1_.get()});
  if (!server.ok()) return server.status();
  pod_resources_server_ = std::move(*server);
  return absl::OkStatus();
}

void TestKubelet::Stop() {
  {
    dynmig::MutexLock lock(&server_mu_);
    if (server_ != nullptr) {
      server_->Shutdown(RealDeadlineAfter(absl::Seconds(1)));
      server_->Wait();
      server_.reset();
      ::unlink(socket_path().c_str());
    }
    if (pod_resources_server_ != nullptr) {
      pod_resources_server_->Shutdown(RealDeadlineAfter(absl::Seconds(1)));
      pod_resources_server_->Wait();
      pod_resources_server_.reset();
      ::unlink(pod_resources_socket_.c_str());
    }
  }
  std::vector<std::thread> threads;
  {
    dynmig::MutexLock lock(&mu_);
    for (auto& [name, plugin] : plugins_) {
      if (plugin->stream) plugin->stream->TryCancel();
      if (plugin->thread.joinable()) threads.push_back(std::move(plugin->thread));
    }
    for (auto& t : retired_) threads.push_back(std::move(t));
    retired_.clear();
  }
  for (auto& t : threads) t.join();
}

absl::Status TestKubelet::Restart() {
  Stop();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    if (entry.is_socket(ec)) std::filesystem::remove(entry.path(), ec);
  }
  return Serve();
}

absl::Status TestKubelet::OnRegister(const v1beta1::RegisterRequest& request) {
  if (request.version() != "v1beta1") {
    return absl::InvalidArgumentError(
        fmt::format("unsupported device plugin API version \"{}\"", request.version()));
  }
  if (!IsExtendedResourceName(request.resource_name())) {
    return absl::InvalidArgumentError(
        fmt::format("invalid extended resource name \"{}\"", request.resource_name()));
  }
  if (request.endpoint().empty() || request.endpoint().find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        fmt::format("endpoint \"{}\" must be a file name in {}", request.endpoint(), dir_));
  }
  auto dialed = Dial(request);
  if (!dialed.ok()) return dialed.status();
  std::shared_ptr<Plugin> plugin = std::move(*dialed);
  {
    dynmig::MutexLock lock(&mu_);
    auto it = plugins_.find(request.resource_name());
    if (it != plugins_.end()) {
      if (it->second->stream) it->second->stream->TryCancel();
      if (it->second->thread.joinable()) retired_.push_back(std::move(it->second->thread));
    }
    plugin->info.registrations = ++registrations_[request.resource_name()];
    plugins_[request.resource_name()] = plugin;
    plugin->thread = std::thread([this, plugin] { WatchDevices(plugin); });
    cv_.SignalAll();
  }
  spdlog::debug("test kubelet: registered {} at {}/{}", request.resource_name(), dir_,
                request.endpoint());
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<TestKubelet::Plugin>> TestKubelet::Dial(
    const v1beta1::RegisterRequest& request) const {
  auto plugin = std::make_shared<Plugin>();
  const std::string path = dir_ + "/" + request.endpoint();
  plugin->channel = grpc::CreateChannel("unix://" + path, grpc::InsecureChannelCredentials());
  if (!plugin->channel->WaitForConnected(RealDeadlineAfter(absl::Seconds(10)))) {
    return absl::UnavailableError(fmt::format("cannot dial the plugin at {}", path));
  }
  plugin->stub = v1beta1::DevicePlugin::NewStub(plugin->channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(RealDeadlineAfter(absl::Seconds(10)));
  v1beta1::Empty empty;
  grpc::Status st = plugin->stub->GetDevicePluginOptions(&ctx, empty, &plugin->info.options);
  if (!st.ok()) return FromGrpc(st, "GetDevicePluginOptions");
  plugin->info.resource_name = request.resource_name();
  plugin->info.endpoint = request.endpoint();
  plugin->stream = std::make_shared<grpc::ClientContext>();
  return plugin;
}

void TestKubelet::WatchDevices(std::shared_ptr<Plugin> plugin) {
  v1beta1::Empty empty;
  auto reader = plugin->stub->ListAndWatch(plugin->stream.get(), empty);
  v1beta1::ListAndWatchResponse response;
  while (reader->Read(&response)) {
    dynmig::MutexLock lock(&mu_);
    plugin->info.devices.assign(response.devices().begin(), response.devices().end());
    plugin->info.stream_open = true;
    ++plugin->info.updates;
    cv_.SignalAll();
  }
  reader->Finish();
  dynmig::MutexLock lock(&mu_);
  plugin->info.stream_open = false;
  for (auto& d : plugin->info.devices) d.set_health("Unhealthy");
  cv_.SignalAll();
}

std::shared_ptr<TestKubelet::Plugin> TestKubelet::Find(std::string_view resource) const {
  if (resource.empty()) return plugins_.empty() ? nullptr : plugins_.begin()->second;
  auto it = plugins_.find(std::string(resource));
  return it == plugins_.end() ? nullptr : it->second;
}

absl::StatusOr<std::shared_ptr<TestKubelet::Plugin>> TestKubelet::Get(
    std::string_view resource) const {
  dynmig::MutexLock lock(&mu_);
  auto plugin = Find(resource);
  if (plugin == nullptr) {
    return absl::NotFoundError(fmt::format(
        "no device plugin registered{}", resource.empty() ? "" : fmt::format(" for {}", resource)));
  }
  return plugin;
}

int TestKubelet::registrations(std::string_view resource) const {
  dynmig::MutexLock lock(&mu_);
  if (resource.empty()) {
    int total = 0;
    for (const auto& [name, n] : registrations_) total += n;
    return total;
  }
  auto it = registrations_.find(std::string(resource));
  return it == registrations_.end() ? 0 : it->second;
}

bool TestKubelet::WaitForRegistrations(int count, absl::Duration timeout,
                                       std::string_view resource) {
  dynmig::MutexLock lock(&mu_);
  return clock_.WaitFor(cv_, mu_, timeout, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int total = 0;
    for (const auto& [name, n] : registrations_) {
      if (resource.empty() || name == resource) total += n;
    }
    return total >= count;
  });
}

std::optional<KubeletPluginInfo> TestKubelet::plugin(std::string_view resource) const {
  dynmig::MutexLock lock(&mu_);
  auto p = Find(resource);
  if (p == nullptr) return std::nullopt;
  return p->info;
}

std::vector<std::string> TestKubelet::resources() const {
  dynmig::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [name, p] : plugins_) {
    if (p->info.stream_open) out.push_back(name);
  }
  return out;
}

std::vector<v1beta1::Device> TestKubelet::devices(std::string_view resource) const {
  dynmig::MutexLock lock(&mu_);
  auto p = Find(resource);
  return p == nullptr ? std::vector<v1beta1::Device>{} : p->info.devices;
}

bool TestKubelet::WaitForDevices(
    const std::function<bool(const std::vector<v1beta1::Device>&)>& pred, absl::Duration timeout,
    std::string_view resource) {
  dynmig::MutexLock lock(&mu_);
  return clock_.WaitFor(cv_, mu_, timeout, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto p = Find(resource);
    return p != nullptr && pred(p->info.devices);
  });
}

std::vector<std::string> TestKubelet::FreeDevices(std::string_view resource) const {
  dynmig::MutexLock lock(&mu_);
  auto p = Find(resource);
  if (p == nullptr) return {};
  std::set<std::string> used;
  for (const auto& a : allocations_) {
    if (a.resource_name == p->info.resource_name)
      used.insert(a.device_ids.begin(), a.device_ids.end());
  }
  std::vector<std::string> out;
  for (const auto& d : p->info.devices) {
    if (d.health() == "Healthy" && !used.count(d.id())) out.push_back(d.id());
  }
  return out;
}

void TestKubelet::AddPod(const std::string& pod, std::vector<std::string> containers,
                         std::vector<std::string> init_containers) {
  dynmig::MutexLock lock(&mu_);
  pods_[pod] = KnownPod{std::move(containers), std::move(init_containers)};
}

PodResourcesList TestKubelet::PodResources() const {
  dynmig::MutexLock lock(&mu_);
  PodResourcesList out;
  for (const auto& [key, known] : pods_) {
    const size_t slash = key.find('/');
    PodResourcesPod pod{slash == std::string::npos ? "" : key.substr(0, slash),
                        slash == std::string::npos ? key : key.substr(slash + 1),
                        {}};
    for (const auto& name : known.containers) {  // not init containers, as the kubelet
      PodResourcesContainer c{name, {}};
      for (const auto& a : allocations_) {
        if (a.pod != key || a.container != name) continue;
        auto& ids = c.devices[a.resource_name];
        ids.insert(ids.end(), a.device_ids.begin(), a.device_ids.end());
        std::sort(ids.begin(), ids.end());
      }
      pod.containers.push_back(std::move(c));
    }
    out.push_back(std::move(pod));
  }
  return out;
}

int TestKubelet::prestart_calls() const {
  dynmig::MutexLock lock(&mu_);
  return prestart_calls_;
}

absl::Status TestKubelet::PreStart(const std::string& pod, const std::string& container,
                                   std::string_view resource) {
  auto plugin = Get(resource);
  if (!plugin.ok()) return plugin.status();
  std::vector<std::string> ids;
  {
    dynmig::MutexLock lock(&mu_);
    if (!(*plugin)->info.options.pre_start_required()) return absl::OkStatus();
    for (const auto& a : allocations_) {
      if (a.pod == pod && a.container == container &&
          a.resource_name == (*plugin)->info.resource_name) {
        ids.insert(ids.end(), a.device_ids.begin(), a.device_ids.end());
      }
    }
    if (ids.empty()) return absl::OkStatus();
    ++prestart_calls_;
  }
  absl::Status st = PreStartContainer(ids, resource);
  if (st.ok()) return st;
  // PreStartContainer's error is "PreStartContainer: <desc>"; the kubelet shows grpc-go's text.
  std::string desc(st.message());
  if (desc.rfind("PreStartContainer: ", 0) == 0) desc.erase(0, std::strlen("PreStartContainer: "));
  return absl::Status(st.code(),
                      fmt::format("device plugin PreStartContainer rpc failed with err: rpc "
                                  "error: code = {} desc = {}",
                                  GoCodeName(st.code()), desc));
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> TestKubelet::Allocate(
    const std::string& pod, const std::string& container,
    const std::vector<std::string>& device_ids, std::string_view resource) {
  auto plugin = Get(resource);
  if (!plugin.ok()) return plugin.status();
  {
    // The kubelet knows the pod it admits before it asks for its devices.
    dynmig::MutexLock lock(&mu_);
    KnownPod& known = pods_[pod];
    if (std::find(known.containers.begin(), known.containers.end(), container) ==
            known.containers.end() &&
        std::find(known.init_containers.begin(), known.init_containers.end(), container) ==
            known.init_containers.end()) {
      known.containers.push_back(container);
    }
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(RealDeadlineAfter(absl::Seconds(60)));
  v1beta1::AllocateRequest request;
  auto* c = request.add_container_requests();
  for (const auto& id : device_ids) c->add_devices_ids(id);
  v1beta1::AllocateResponse response;
  grpc::Status st = (*plugin)->stub->Allocate(&ctx, request, &response);
  if (!st.ok()) return FromGrpc(st, fmt::format("Allocate for {} container {}", pod, container));
  if (response.container_responses_size() != 1) {
    return absl::InternalError(fmt::format("Allocate answered {} container responses, want 1",
                                           response.container_responses_size()));
  }
  KubeletAllocation a{pod, container, (*plugin)->info.resource_name, device_ids,
                      response.container_responses(0)};
  dynmig::MutexLock lock(&mu_);
  allocations_.push_back(a);
  if (runtime_ != nullptr) {
    std::map<std::string, std::string> envs(a.response.envs().begin(), a.response.envs().end());
    runtime_->AddEnvs(pod, uids_[pod], container, envs);
  }
  return a.response;
}

absl::StatusOr<KubeletAllocation> TestKubelet::AllocateCount(const std::string& pod,
                                                             const std::string& container,
                                                             int count, std::string_view resource) {
  auto plugin = Get(resource);
  if (!plugin.ok()) return plugin.status();
  const std::vector<std::string> free = FreeDevices(resource);
  if (count <= 0 || free.size() < static_cast<size_t>(count)) {
    return absl::ResourceExhaustedError(fmt::format("{} container {} wants {} device(s), {} free",
                                                    pod, container, count, free.size()));
  }
  std::vector<std::string> ids(free.begin(), free.begin() + count);
  bool preferred = false;
  {
    dynmig::MutexLock lock(&mu_);
    preferred = (*plugin)->info.options.get_preferred_allocation_available();
  }
  if (preferred) {
    auto chosen = PreferredAllocation(free, {}, count, resource);
    if (chosen.ok() && chosen->size() == static_cast<size_t>(count)) ids = *chosen;
  }
  auto response = Allocate(pod, container, ids, resource);
  if (!response.ok()) return response.status();
  return KubeletAllocation{pod, container, (*plugin)->info.resource_name, ids, *response};
}

absl::StatusOr<std::vector<std::string>> TestKubelet::PreferredAllocation(
    const std::vector<std::string>& available, const std::vector<std::string>& must_include,
    int size, std::string_view resource) {
  auto plugin = Get(resource);
  if (!plugin.ok()) return plugin.status();
  grpc::ClientContext ctx;
  ctx.set_deadline(RealDeadlineAfter(absl::Seconds(30)));
  v1beta1::PreferredAllocationRequest request;
  auto* c = request.add_container_requests();
  for (const auto& id : available) c->add_available_deviceids(id);
  for (const auto& id : must_include) c->add_must_include_deviceids(id);
  c->set_allocation_size(size);
  v1beta1::PreferredAllocationResponse response;
  grpc::Status st = (*plugin)->stub->GetPreferredAllocation(&ctx, request, &response);
  if (!st.ok()) return FromGrpc(st, "GetPreferredAllocation");
  if (response.container_responses_size() != 1) {
    return absl::InternalError("GetPreferredAllocation answered no container response");
  }
  const auto& ids = response.container_responses(0).deviceids();
  return std::vector<std::string>(ids.begin(), ids.end());
}

absl::Status TestKubelet::PreStartContainer(const std::vector<std::string>& device_ids,
                                            std::string_view resource) {
  auto plugin = Get(resource);
  if (!plugin.ok()) return plugin.status();
  grpc::ClientContext ctx;
  ctx.set_deadline(RealDeadlineAfter(absl::Seconds(30)));
  v1beta1::PreStartContainerRequest request;
  for (const auto& id : device_ids) request.add_devices_ids(id);
  v1beta1::PreStartContainerResponse response;
  return FromGrpc((*plugin)->stub->PreStartContainer(&ctx, request, &response),
                  "PreStartContainer");
}

void TestKubelet::ReleasePod(const std::string& pod) {
  dynmig::MutexLock lock(&mu_);
  std::erase_if(allocations_, [&](const KubeletAllocation& a) { return a.pod == pod; });
  pods_.erase(pod);
  if (runtime_ != nullptr) runtime_->ExitPod(pod);
}

void TestKubelet::SetPodUid(const std::string& pod, std::string uid) {
  dynmig::MutexLock lock(&mu_);
  uids_[pod] = std::move(uid);
}

void TestKubelet::AttachRuntime(TestRuntime* runtime) {
  dynmig::MutexLock lock(&mu_);
  runtime_ = runtime;
}

std::vector<KubeletAllocation> TestKubelet::allocations() const {
  dynmig::MutexLock lock(&mu_);
  return allocations_;
}

}  // namespace dynmig::deviceplugin
