#include "deviceplugin/grpc_endpoint.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include "deviceplugin/unix_grpc.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {
namespace {

grpc::Status ToGrpc(const absl::Status& st) {
  if (st.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
}

// Inode of a path, 0 when it does not exist.
uint64_t InodeOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

}  // namespace

class GrpcEndpoint::Service final : public v1beta1::DevicePlugin::Service {
 public:
  explicit Service(PluginCore& core) : core_(core) {}

  void set_stopping(bool stopping) { stopping_ = stopping; }

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* out) override {
    *out = core_.PluginOptions();
    return grpc::Status::OK;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    uint64_t generation = 0;
    auto send = [&]() {
      v1beta1::ListAndWatchResponse response;
      for (auto& d : core_.Devices(&generation)) *response.add_devices() = std::move(d);
      return writer->Write(response);
    };
    if (!send()) return grpc::Status::OK;
    while (!stopping_ && !ctx->IsCancelled()) {
      const uint64_t now = core_.WaitForDeviceChange(generation, absl::Milliseconds(200));
      if (now != generation && !send()) break;
    }
    return grpc::Status::OK;
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* request,
                                      v1beta1::PreferredAllocationResponse* out) override {
    for (const auto& c : request->container_requests()) {
      *out->add_container_responses() = core_.PreferredAllocation(c);
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* out) override {
    for (const auto& c : request->container_requests()) {
      std::vector<std::string> ids(c.devices_ids().begin(), c.devices_ids().end());
      auto response = core_.Allocate(ids);
      if (!response.ok()) return ToGrpc(response.status());
      *out->add_container_responses() = std::move(*response);
    }
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*,
                                 const v1beta1::PreStartContainerRequest* request,
                                 v1beta1::PreStartContainerResponse*) override {
    std::vector<std::string> ids(request->devices_ids().begin(), request->devices_ids().end());
    return ToGrpc(core_.PreStartContainer(ids));
  }

 private:
  PluginCore& core_;
  std::atomic<bool> stopping_{false};
};

GrpcEndpoint::GrpcEndpoint(EndpointOptions options, PluginCore& core, Metrics& metrics,
                           const Clock& clock)
    : options_(std::move(options)),
      core_(core),
      metrics_(metrics),
      clock_(clock),
      service_(std::make_unique<Service>(core)) {}

GrpcEndpoint::~GrpcEndpoint() { Stop(); }

std::string GrpcEndpoint::socket_path() const {
  return options_.kubelet_dir + "/" + options_.socket_name;
}

std::string GrpcEndpoint::kubelet_socket_path() const {
  return options_.kubelet_dir + "/" + std::string(kKubeletSocketName);
}

absl::Status GrpcEndpoint::Serve() {
  const std::string path = socket_path();
  service_->set_stopping(false);
  auto server = ServeOnUnixSocket(path, {service_.get()});
  if (!server.ok()) return server.status();
  server_ = std::move(*server);
  spdlog::info("device plugin serving on unix://{}", path);
  return absl::OkStatus();
}

void GrpcEndpoint::StopServer() {
  if (server_ == nullptr) return;
  service_->set_stopping(true);
  server_->Shutdown(RealDeadlineAfter(absl::Seconds(2)));  // gRPC waits on real time
  server_->Wait();
  server_.reset();
}

absl::Status GrpcEndpoint::Register() {
  auto channel =
      grpc::CreateChannel("unix://" + kubelet_socket_path(), grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(RealDeadlineAfter(options_.register_timeout));  // the kubelet's real time
  v1beta1::RegisterRequest request;
  request.set_version(std::string(kDevicePluginVersion));
  request.set_endpoint(options_.socket_name);
  request.set_resource_name(options_.resource_name);
  *request.mutable_options() = core_.PluginOptions();
  v1beta1::Empty empty;
  grpc::Status st = stub->Register(&ctx, request, &empty);
  if (!st.ok()) {
    return absl::UnavailableError(fmt::format("register {} with the kubelet at {}: {}",
                                              options_.resource_name, kubelet_socket_path(),
                                              st.error_message()));
  }
  metrics_.Registered();
  spdlog::info("registered {} (endpoint {}) with the kubelet", options_.resource_name,
               options_.socket_name);
  return absl::OkStatus();
}

void GrpcEndpoint::RegisterAndRecord() {
  auto st = Register();
  dynmig::MutexLock lock(&mu_);
  if (st.ok()) {
    registered_ = true;
    ++registrations_;
    cv_.SignalAll();
  } else {
    spdlog::warn("{} (retried)", std::string(st.message()));
  }
}

absl::Status GrpcEndpoint::Start() {
  {
    dynmig::MutexLock lock(&mu_);
    if (started_) return absl::FailedPreconditionError("endpoint already started");
    started_ = true;
    stop_ = false;
  }
  {
    dynmig::MutexLock lock(&server_mu_);
    if (auto st = Serve(); !st.ok()) return st;
  }
  if (InodeOf(kubelet_socket_path()) != 0) RegisterAndRecord();
  watcher_ = std::thread([this] { Watch(); });
  return absl::OkStatus();
}

void GrpcEndpoint::Watch() {
  uint64_t kubelet_inode = InodeOf(kubelet_socket_path());
  uint64_t own_inode = InodeOf(socket_path());
  while (true) {
    {
      dynmig::MutexLock lock(&mu_);
      clock_.WaitFor(cv_, mu_, options_.kubelet_poll_interval,
                     [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; });
      if (stop_) return;
    }
    Poll(kubelet_inode, own_inode);
  }
}

void GrpcEndpoint::Poll(uint64_t& kubelet_inode, uint64_t& own_inode) {
  const uint64_t kubelet_now = InodeOf(kubelet_socket_path());
  const uint64_t own_now = InodeOf(socket_path());
  bool reregister = false;
  if (own_now == 0 || own_now != own_inode) {
    // Our socket was removed (a kubelet restart cleans the directory): serve anew.
    spdlog::info("device plugin socket {} is gone: serving again", socket_path());
    dynmig::MutexLock lock(&server_mu_);
    StopServer();
    if (auto st = Serve(); !st.ok()) {
      spdlog::error("{}", std::string(st.message()));
      return;
    }
    own_inode = InodeOf(socket_path());
    reregister = true;
  }
  if (kubelet_now != kubelet_inode) {
    if (kubelet_now != 0) spdlog::info("kubelet.sock was re-created: the kubelet restarted");
    kubelet_inode = kubelet_now;
    reregister = true;
  }
  {
    dynmig::MutexLock lock(&mu_);
    if (reregister) registered_ = false;
    if (registered_ || kubelet_now == 0) return;
  }
  RegisterAndRecord();
}

void GrpcEndpoint::Stop() {
  {
    dynmig::MutexLock lock(&mu_);
    if (!started_) return;
    stop_ = true;
    started_ = false;
    cv_.SignalAll();
  }
  if (watcher_.joinable()) watcher_.join();
  dynmig::MutexLock lock(&server_mu_);
  StopServer();
  ::unlink(socket_path().c_str());
}

int GrpcEndpoint::registrations() const {
  dynmig::MutexLock lock(&mu_);
  return registrations_;
}

bool GrpcEndpoint::registered() const {
  dynmig::MutexLock lock(&mu_);
  return registered_;
}

bool GrpcEndpoint::WaitForRegistrations(int count, absl::Duration timeout) const {
  dynmig::MutexLock lock(&mu_);
  return clock_.WaitFor(cv_, mu_, timeout, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return registrations_ >= count;
  });
}

}  // namespace dynmig::deviceplugin
