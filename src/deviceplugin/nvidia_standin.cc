#include "deviceplugin/nvidia_standin.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>

#include "deviceplugin/grpc_endpoint.h"
#include "deviceplugin/hami_standin.h"
#include "deviceplugin/runtime_source.h"
#include "deviceplugin/unix_grpc.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "kube/kube_client.h"
#include "protocol/annotations.h"
#include "protocol/devices.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {
namespace {

uint64_t InodeOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

// The MIG devices of one GPU, by profile.
absl::Status AddGpuDevices(nvml::Nvml& nvml, uint32_t gpu,
                           std::map<std::string, std::vector<std::string>>& out) {
  auto info = nvml.GetGpu(gpu);
  if (!info.ok()) return info.status();
  if (!info->mig.supported || !info->mig.current) return absl::OkStatus();
  auto profiles = nvml::DiscoverProfiles(nvml, gpu);
  if (!profiles.ok()) return profiles.status();
  auto gis = nvml.ListGpuInstances(gpu);
  if (!gis.ok()) return gis.status();
  for (const auto& gi : *gis) {
    const auto p = std::find_if(profiles->begin(), profiles->end(),
                                [&](const auto& x) { return x.nvml_id == gi.profile_id; });
    if (p == profiles->end()) continue;
    auto cis = nvml.ListComputeInstances(gpu, gi.id);
    if (!cis.ok()) return cis.status();
    for (const auto& ci : *cis) {
      // A partial compute instance is a "<c>c.<profile>" device of another resource: not served.
      if (ci.placement.size == p->compute_slices) out[p->name].push_back(ci.mig_uuid);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::map<std::string, std::vector<std::string>>> MigDevicesByProfile(
    nvml::Nvml& nvml) {
  auto count = nvml.DeviceCount();
  if (!count.ok()) return count.status();
  std::map<std::string, std::vector<std::string>> out;
  for (uint32_t gpu = 0; gpu < *count; ++gpu) {
    if (auto st = AddGpuDevices(nvml, gpu, out); !st.ok()) return st;
  }
  return out;
}

std::string StandinSocketName(std::string_view profile) {
  return fmt::format("nvidia-mig-{}.sock", profile);
}

struct NvidiaStandin::Served {
  std::string profile;
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Server> server;
  uint64_t inode = 0;
};

class NvidiaStandin::Service final : public v1beta1::DevicePlugin::Service {
 public:
  Service(NvidiaStandin& standin, std::string profile)
      : standin_(standin), profile_(std::move(profile)) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions*) override {
    return grpc::Status::OK;  // {}: no PreStartContainer, no GetPreferredAllocation
  }

  grpc::Status ListAndWatch(grpc::ServerContext* ctx, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    std::vector<std::string> sent;
    bool first = true;
    while (!ctx->IsCancelled()) {
      std::vector<std::string> now = standin_.Devices(profile_);
      if (first || now != sent) {
        v1beta1::ListAndWatchResponse response;
        for (const auto& id : now) {
          auto* d = response.add_devices();
          d->set_id(id);
          d->set_health("Healthy");
        }
        if (!writer->Write(response)) break;
        sent = std::move(now);
        first = false;
      }
      if (standin_.WaitRefresh()) break;
    }
    return grpc::Status::OK;
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest*,
                                      v1beta1::PreferredAllocationResponse*) override {
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* out) override {
    for (const auto& c : request->container_requests()) {
      auto response = standin_.Allocate(profile_, c);
      if (!response.ok()) {
        return grpc::Status(static_cast<grpc::StatusCode>(response.status().code()),
                            std::string(response.status().message()));
      }
      *out->add_container_responses() = std::move(*response);
    }
    return grpc::Status::OK;
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest*,
                                 v1beta1::PreStartContainerResponse*) override {
    return grpc::Status::OK;
  }

 private:
  NvidiaStandin& standin_;
  const std::string profile_;
};

NvidiaStandin::NvidiaStandin(NvidiaStandinOptions options, nvml::Nvml& nvml, const Clock& clock)
    : options_(std::move(options)), nvml_(nvml), clock_(clock) {}

NvidiaStandin::~NvidiaStandin() { Stop(); }

absl::StatusOr<std::unique_ptr<NvidiaStandin>> NvidiaStandin::Start(NvidiaStandinOptions options,
                                                                    nvml::Nvml& nvml,
                                                                    const Clock& clock) {
  if (options.mode == StandinMode::kHamiLegacy) return StartHami(std::move(options), nvml, clock);
  auto devices = MigDevicesByProfile(nvml);
  if (!devices.ok()) return devices.status();
  std::unique_ptr<NvidiaStandin> s(new NvidiaStandin(std::move(options), nvml, clock));
  for (const auto& [profile, ids] : *devices) {
    if (!protocol::MigResourceName(profile).has_value()) {
      spdlog::warn("nvidia stand-in: profile {} is not a valid resource name: not served", profile);
      continue;
    }
    s->profiles_.push_back(profile);
  }
  if (s->profiles_.empty()) {
    return absl::FailedPreconditionError(
        "no GPU of this node has a MIG device: the mixed strategy advertises no MIG resource");
  }
  return Launch(std::move(s), *devices);
}

absl::StatusOr<std::unique_ptr<NvidiaStandin>> NvidiaStandin::StartHami(
    NvidiaStandinOptions options, nvml::Nvml& nvml, const Clock& clock) {
  if (options.kube == nullptr || options.node.empty()) {
    return absl::InvalidArgumentError("HAMi's legacy plugin stand-in needs the API and the node");
  }
  if (options.split_count < 1 || options.split_count > kHamiMaxSplitCount) {
    return absl::InvalidArgumentError(
        fmt::format("split count {} is not 1..{}", options.split_count, kHamiMaxSplitCount));
  }
  if (options.legacy_geometries.empty()) {
    return absl::InvalidArgumentError("HAMi's legacy plugin stand-in needs knownMigGeometries");
  }
  auto ids = HamiDeviceIds(nvml, options.split_count);
  if (!ids.ok()) return ids.status();
  if (ids->empty()) {
    return absl::FailedPreconditionError(
        "no GPU of this node has MIG mode on: HAMi's legacy MIG plugin advertises nothing");
  }
  std::unique_ptr<NvidiaStandin> s(new NvidiaStandin(std::move(options), nvml, clock));
  s->profiles_.push_back(std::string(kHamiProfileKey));
  return Launch(std::move(s), {{std::string(kHamiProfileKey), *std::move(ids)}});
}

absl::StatusOr<std::unique_ptr<NvidiaStandin>> NvidiaStandin::Launch(
    std::unique_ptr<NvidiaStandin> s, std::map<std::string, std::vector<std::string>> devices) {
  {
    dynmig::MutexLock lock(&s->mu_);
    s->started_ = true;
    s->last_devices_ = std::move(devices);
  }
  {
    dynmig::MutexLock lock(&s->server_mu_);
    for (const auto& profile : s->profiles_) {
      auto served = std::make_unique<Served>();
      served->profile = profile;
      served->service = std::make_unique<Service>(*s, profile);
      if (auto st = s->Serve(*served); !st.ok()) return st;
      s->served_[profile] = std::move(served);
    }
  }
  if (InodeOf(s->options_.kubelet_dir + "/" + std::string(kKubeletSocketName)) != 0) {
    s->RegisterAll(false);
  }
  s->watcher_ = std::thread([p = s.get()] { p->Watch(); });
  return s;
}

absl::Status NvidiaStandin::Serve(Served& served) {
  const std::string path = socket_path(served.profile);
  auto server = ServeOnUnixSocket(path, {served.service.get()});
  if (!server.ok()) return server.status();
  served.server = std::move(*server);
  served.inode = InodeOf(path);
  return absl::OkStatus();
}

absl::Status NvidiaStandin::Register(const std::string& profile) {
  const std::string kubelet = options_.kubelet_dir + "/" + std::string(kKubeletSocketName);
  auto stub = v1beta1::Registration::NewStub(
      grpc::CreateChannel("unix://" + kubelet, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(RealDeadlineAfter(options_.register_timeout));  // the kubelet's real time
  v1beta1::RegisterRequest request;
  request.set_version(std::string(kDevicePluginVersion));
  request.set_endpoint(SocketName(profile));
  request.set_resource_name(resource(profile));
  v1beta1::Empty empty;
  grpc::Status st = stub->Register(&ctx, request, &empty);
  if (!st.ok()) {
    return absl::UnavailableError(fmt::format("register {} with the kubelet at {}: {}",
                                              request.resource_name(), kubelet,
                                              st.error_message()));
  }
  return absl::OkStatus();
}

void NvidiaStandin::RegisterAll(bool only_unregistered) {
  for (const auto& profile : profiles_) {
    {
      dynmig::MutexLock lock(&mu_);
      if (stop_) return;
      if (only_unregistered && registered_[profile]) continue;
    }
    absl::Status st = Register(profile);
    dynmig::MutexLock lock(&mu_);
    registered_[profile] = st.ok();
    if (st.ok()) {
      ++registrations_[profile];
      cv_.SignalAll();
    } else {
      spdlog::warn("nvidia stand-in: {} (retried)", std::string(st.message()));
    }
  }
}

void NvidiaStandin::Watch() {
  const std::string kubelet = options_.kubelet_dir + "/" + std::string(kKubeletSocketName);
  uint64_t kubelet_inode = InodeOf(kubelet);
  while (true) {
    {
      dynmig::MutexLock lock(&mu_);
      clock_.WaitFor(cv_, mu_, options_.kubelet_poll_interval,
                     [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; });
      if (stop_) return;
    }
    const uint64_t now = InodeOf(kubelet);
    bool all = false;
    if (now != kubelet_inode) {  // the kubelet restarted: register every resource again
      kubelet_inode = now;
      all = true;
    }
    {
      dynmig::MutexLock lock(&server_mu_);
      for (auto& [profile, served] : served_) {
        if (InodeOf(socket_path(profile)) == served->inode && served->inode != 0) continue;
        served->server->Shutdown(RealDeadlineAfter(absl::Seconds(1)));
        served->server->Wait();
        if (auto st = Serve(*served); !st.ok()) spdlog::error("{}", std::string(st.message()));
        all = true;
      }
    }
    if (now != 0) RegisterAll(!all);
  }
}

std::vector<std::string> NvidiaStandin::Devices(const std::string& profile) {
  absl::StatusOr<std::map<std::string, std::vector<std::string>>> devices;
  if (options_.mode == StandinMode::kHamiLegacy) {
    auto ids = HamiDeviceIds(nvml_, options_.split_count);
    if (ids.ok()) {
      devices = std::map<std::string, std::vector<std::string>>{
          {std::string(kHamiProfileKey), *std::move(ids)}};
    } else {
      devices = ids.status();
    }
  } else {
    devices = MigDevicesByProfile(nvml_);
  }
  dynmig::MutexLock lock(&mu_);
  if (devices.ok()) {
    last_devices_ = std::move(*devices);
  } else {
    spdlog::warn("nvidia stand-in: reading NVML: {}", std::string(devices.status().message()));
  }
  auto it = last_devices_.find(profile);
  return it == last_devices_.end() ? std::vector<std::string>{} : it->second;
}

bool NvidiaStandin::WaitRefresh() const {
  dynmig::MutexLock lock(&mu_);
  clock_.WaitFor(cv_, mu_, options_.refresh_interval,
                 [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; });
  return stop_;
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> NvidiaStandin::Allocate(
    const std::string& profile, const v1beta1::ContainerAllocateRequest& request) {
  const std::string resource = this->resource(profile);
  auto invalid = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        fmt::format("invalid allocation request for '{}': {}", resource, why));
  };
  if (request.devices_ids_size() == 0) return invalid("no device");
  if (static_cast<size_t>(request.devices_ids_size()) > kMaxStandinIdsPerContainer) {
    return invalid(fmt::format("{} devices; at most {}", request.devices_ids_size(),
                               kMaxStandinIdsPerContainer));
  }
  const std::vector<std::string> known = Devices(profile);
  std::vector<std::string> ids, unknown;
  for (const auto& id : request.devices_ids()) {
    if (id.size() > kMaxStandinIdBytes) {
      unknown.push_back(fmt::format("{}... ({} bytes)", id.substr(0, 32), id.size()));
    } else if (std::find(known.begin(), known.end(), id) == known.end()) {
      unknown.push_back(id);
    } else {
      ids.push_back(id);
    }
  }
  if (!unknown.empty()) return invalid(fmt::format("unknown device: {}", fmt::join(unknown, ", ")));
  if (options_.mode == StandinMode::kHamiLegacy) return AllocateHami(request);
  v1beta1::ContainerAllocateResponse out;
  (*out.mutable_envs())[std::string(protocol::kVisibleDevicesEnv)] =
      fmt::format("{}", fmt::join(ids, ","));
  return out;
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> NvidiaStandin::AllocateHami(
    const v1beta1::ContainerAllocateRequest& request) {
  kube::ListOptions list;
  list.field_selector = "spec.nodeName=" + options_.node;
  auto pods = options_.kube->ListPods(list);
  if (!pods.ok()) {
    return absl::UnavailableError(fmt::format("listing the pods of node {}: {}", options_.node,
                                              std::string(pods.status().message())));
  }
  auto pending = FindHamiPendingPod(pods->items, options_.node);
  if (!pending.ok()) return pending.status();
  const std::string key = pending->ns + "/" + pending->name;
  // As HAMi's PodAllocationFailed: the pod is marked failed, its devices stay as they were.
  auto failed = [&](const absl::Status& st) {
    auto patched = options_.kube->PatchPodAnnotations(
        pending->ns, pending->name,
        {{std::string(protocol::kBindPhaseAnnotation), std::string(protocol::kBindPhaseFailed)}});
    if (!patched.ok()) {
      spdlog::warn("hami stand-in: marking {} {} failed: {}", key, protocol::kBindPhaseAnnotation,
                   std::string(patched.status().message()));
    }
    return absl::Status(st.code(), fmt::format("pod {} container {}: {}", key, pending->container,
                                               std::string(st.message())));
  };
  if (pending->devices.size() != static_cast<size_t>(request.devices_ids_size())) {
    return failed(absl::InvalidArgumentError(
        fmt::format("device number not matched: the kubelet allocates {}, {} lists {}",
                    request.devices_ids_size(), protocol::kDevicesToAllocateAnnotation,
                    pending->devices.size())));
  }
  std::vector<std::string> uuids;
  for (const auto& d : pending->devices) {
    auto m = HamiLegacyMigDevice(nvml_, options_.legacy_geometries, d.uuid);
    if (!m.ok()) return failed(m.status());
    if (m->profile != m->template_profile) {
      // HAMi's slot indexes its flattened template list, the driver's index the MIG devices.
      spdlog::warn(
          "hami stand-in: {} gets {} ({}), MIG device at the slot's index, while the "
          "template's slot is {}",
          key, m->mig_uuid, m->profile,
          m->template_profile.empty() ? "beyond the template" : m->template_profile);
    }
    uuids.push_back(m->mig_uuid);
  }
  auto rest = protocol::EncodePodDevices(pending->rest);
  if (!rest.ok()) return failed(rest.status());
  kube::KeyPatch patch = {{std::string(protocol::kDevicesToAllocateAnnotation), *rest}};
  if (pending->last) {
    patch[std::string(protocol::kBindPhaseAnnotation)] = std::string(protocol::kBindPhaseSuccess);
  }
  auto patched = options_.kube->PatchPodAnnotations(pending->ns, pending->name, patch);
  if (!patched.ok()) {
    return absl::UnavailableError(
        fmt::format("writing back pod {}: {}", key, std::string(patched.status().message())));
  }
  spdlog::info("hami stand-in: pod {} container {} gets {}{}", key, pending->container,
               fmt::join(uuids, ","), pending->last ? " (bind-phase success)" : "");
  v1beta1::ContainerAllocateResponse out;
  (*out.mutable_envs())[std::string(protocol::kVisibleDevicesEnv)] =
      fmt::format("{}", fmt::join(uuids, ","));
  return out;
}

std::vector<std::string> NvidiaStandin::profiles() const { return profiles_; }

std::string NvidiaStandin::resource(std::string_view profile) const {
  if (options_.mode == StandinMode::kHamiLegacy) return std::string(protocol::kResourceCount);
  return protocol::MigResourceName(profile).value_or("");
}

std::string NvidiaStandin::SocketName(std::string_view profile) const {
  if (options_.mode == StandinMode::kHamiLegacy) return std::string(kHamiSocketName);
  return StandinSocketName(profile);
}

std::string NvidiaStandin::socket_path(std::string_view profile) const {
  return options_.kubelet_dir + "/" + SocketName(profile);
}

int NvidiaStandin::registrations(std::string_view profile) const {
  dynmig::MutexLock lock(&mu_);
  int total = 0;
  for (const auto& [p, n] : registrations_) {
    if (profile.empty() || p == profile) total += n;
  }
  return total;
}

bool NvidiaStandin::WaitForRegistrations(int count, absl::Duration timeout) const {
  dynmig::MutexLock lock(&mu_);
  return clock_.WaitFor(cv_, mu_, timeout, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::all_of(profiles_.begin(), profiles_.end(),
                       [&](const std::string& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                         auto it = registrations_.find(p);
                         return it != registrations_.end() && it->second >= count;
                       });
  });
}

void NvidiaStandin::Stop() {
  {
    dynmig::MutexLock lock(&mu_);
    if (!started_) return;
    started_ = false;
    stop_ = true;
    cv_.SignalAll();
  }
  if (watcher_.joinable()) watcher_.join();
  dynmig::MutexLock lock(&server_mu_);
  for (auto& [profile, served] : served_) {
    if (served->server != nullptr) {
      served->server->Shutdown(RealDeadlineAfter(absl::Seconds(2)));
      served->server->Wait();
      served->server.reset();
    }
    ::unlink(socket_path(profile).c_str());
  }
}

}  // namespace dynmig::deviceplugin
