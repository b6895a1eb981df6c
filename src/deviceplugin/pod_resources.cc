#include "deviceplugin/pod_resources.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <filesystem>

#include "common/clock.h"
#include "fmt/format.h"
#include "podresources/v1/api.grpc.pb.h"
#include "podresources/v1alpha1/api.grpc.pb.h"

namespace dynmig::deviceplugin {
namespace {

// v1 and v1alpha1 share the fields read here.
template <typename Response>
PodResourcesList Convert(const Response& response) {
  PodResourcesList out;
  out.reserve(response.pod_resources_size());
  for (const auto& p : response.pod_resources()) {
    PodResourcesPod pod{p.namespace_(), p.name(), {}};
    pod.containers.reserve(p.containers_size());
    for (const auto& c : p.containers()) {
      PodResourcesContainer container{c.name(), {}};
      for (const auto& d : c.devices()) {
        auto& ids = container.devices[d.resource_name()];
        ids.insert(ids.end(), d.device_ids().begin(), d.device_ids().end());
      }
      for (auto& [resource, ids] : container.devices) {
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      }
      pod.containers.push_back(std::move(container));
    }
    out.push_back(std::move(pod));
  }
  return out;
}

}  // namespace

GrpcPodResources::GrpcPodResources(PodResourcesClientOptions options)
    : options_(std::move(options)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  args.SetMaxSendMessageSize(1 << 10);  // the request is empty
  channel_ = grpc::CreateCustomChannel("unix://" + options_.socket,
                                       grpc::InsecureChannelCredentials(), args);
}

GrpcPodResources::~GrpcPodResources() = default;

absl::StatusOr<PodResourcesList> GrpcPodResources::List() {
  auto fail = [&](const grpc::Status& st, std::string_view version) -> absl::Status {
    std::string message = fmt::format(
        "the kubelet's PodResources API ({}.PodResourcesLister/List "
        "on {}): {}",
        version, Describe(), st.error_message());
    if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      message += fmt::format(" (answers are limited to {} bytes)", options_.max_message_bytes);
    }
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()), message);
  };
  // The kubelet answers on real time, whatever clock the plugin runs on.
  auto deadline = [&] { return RealDeadlineAfter(options_.timeout); };
  if (!v1alpha1_only_.load()) {
    auto stub = ::v1::PodResourcesLister::NewStub(channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    ::v1::ListPodResourcesResponse response;
    const grpc::Status st = stub->List(&ctx, ::v1::ListPodResourcesRequest(), &response);
    if (st.ok()) return Convert(response);
    if (st.error_code() != grpc::StatusCode::UNIMPLEMENTED) return fail(st, "v1");
    v1alpha1_only_ = true;  // a kubelet before v1.20
  }
  auto stub = ::v1alpha1::PodResourcesLister::NewStub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline());
  ::v1alpha1::ListPodResourcesResponse response;
  const grpc::Status st = stub->List(&ctx, ::v1alpha1::ListPodResourcesRequest(), &response);
  if (!st.ok()) return fail(st, "v1alpha1");
  return Convert(response);
}

std::string PodResourcesSocketBeside(std::string_view device_plugin_dir) {
  std::filesystem::path dir(device_plugin_dir);
  while (!dir.empty() && !dir.has_filename() && dir != dir.root_path()) dir = dir.parent_path();
  return (dir.parent_path() / "pod-resources" / "kubelet.sock").string();
}

}  // namespace dynmig::deviceplugin
