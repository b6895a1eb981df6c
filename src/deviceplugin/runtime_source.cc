#include "deviceplugin/runtime_source.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "common/clock.h"
#include "cri/v1/api.grpc.pb.h"
#include "cri/v1alpha2/api.grpc.pb.h"
#include "fmt/format.h"

namespace dynmig::deviceplugin {
namespace {

// The generated types of one CRI version.
struct V1 {
  using Service = ::runtime::v1::RuntimeService;
  using ListRequest = ::runtime::v1::ListContainersRequest;
  using ListResponse = ::runtime::v1::ListContainersResponse;
  using StatusRequest = ::runtime::v1::ContainerStatusRequest;
  using StatusResponse = ::runtime::v1::ContainerStatusResponse;
};
struct V1alpha2 {
  using Service = ::runtime::v1alpha2::RuntimeService;
  using ListRequest = ::runtime::v1alpha2::ListContainersRequest;
  using ListResponse = ::runtime::v1alpha2::ListContainersResponse;
  using StatusRequest = ::runtime::v1alpha2::ContainerStatusRequest;
  using StatusResponse = ::runtime::v1alpha2::ContainerStatusResponse;
};

RuntimeContainerState StateOf(int state) {
  switch (state) {
    case 0:
      return RuntimeContainerState::kCreated;
    case 1:
      return RuntimeContainerState::kRunning;
    case 2:
      return RuntimeContainerState::kExited;
    default:
      return RuntimeContainerState::kUnknown;
  }
}

template <typename Labels>
std::string Label(const Labels& labels, std::string_view key) {
  auto it = labels.find(std::string(key));
  return it == labels.end() ? "" : it->second;
}

}  // namespace

std::string_view StateName(RuntimeContainerState state) {
  switch (state) {
    case RuntimeContainerState::kCreated:
      return "created";
    case RuntimeContainerState::kRunning:
      return "running";
    case RuntimeContainerState::kExited:
      return "exited";
    case RuntimeContainerState::kUnknown:
      break;
  }
  return "unknown";
}

GrpcCriRuntime::GrpcCriRuntime(CriClientOptions options) : options_(std::move(options)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  args.SetMaxSendMessageSize(64 << 10);  // requests carry a container id at most
  channel_ = grpc::CreateCustomChannel("unix://" + options_.socket,
                                       grpc::InsecureChannelCredentials(), args);
}

GrpcCriRuntime::~GrpcCriRuntime() = default;

template <typename Api>
absl::StatusOr<std::vector<RuntimeContainer>> GrpcCriRuntime::ListWith(std::string_view version,
                                                                       absl::Duration deadline) {
  const Clock& clock = RealClock();  // the runtime answers on real time
  auto fail = [&](const grpc::Status& st, std::string_view method) -> absl::Status {
    std::string message = fmt::format("the container runtime ({}.RuntimeService/{} on {}): {}",
                                      version, method, Describe(), st.error_message());
    if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      message += fmt::format(" (answers are limited to {} bytes)", options_.max_message_bytes);
    }
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()), message);
  };
  auto call_deadline = [&]() -> absl::StatusOr<absl::Duration> {
    const absl::Duration left = deadline - clock.Monotonic();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          fmt::format("the container runtime ({}): listing the containers took over {}", Describe(),
                      absl::FormatDuration(options_.list_timeout)));
    }
    return std::min(left, options_.call_timeout);
  };
  auto stub = Api::Service::NewStub(channel_);
  typename Api::ListResponse list;
  {
    auto t = call_deadline();
    if (!t.ok()) return t.status();
    grpc::ClientContext ctx;
    ctx.set_deadline(RealDeadlineAfter(*t));
    const grpc::Status st = stub->ListContainers(&ctx, typename Api::ListRequest(), &list);
    if (!st.ok()) return fail(st, "ListContainers");
  }
  std::vector<RuntimeContainer> out;
  size_t queried = 0;
  for (const auto& c : list.containers()) {
    RuntimeContainer rc;
    rc.id = c.id();
    rc.pod_uid = Label(c.labels(), kCriPodUidLabel);
    rc.pod_name = Label(c.labels(), kCriPodNameLabel);
    rc.pod_namespace = Label(c.labels(), kCriPodNamespaceLabel);
    rc.container = Label(c.labels(), kCriContainerNameLabel);
    if (rc.container.empty()) rc.container = c.metadata().name();
    rc.state = StateOf(static_cast<int>(c.state()));
    if (rc.state != RuntimeContainerState::kExited) {
      if (++queried > options_.max_containers) {
        return absl::ResourceExhaustedError(
            fmt::format("the container runtime ({}) lists more than {} containers that have not "
                        "exited; at most {} are queried",
                        Describe(), options_.max_containers, options_.max_containers));
      }
      auto t = call_deadline();
      if (!t.ok()) return t.status();
      grpc::ClientContext ctx;
      ctx.set_deadline(RealDeadlineAfter(*t));
      typename Api::StatusRequest request;
      request.set_container_id(c.id());
      request.set_verbose(true);
      typename Api::StatusResponse status;
      const grpc::Status st = stub->ContainerStatus(&ctx, request, &status);
      if (!st.ok()) {
        if (st.error_code() == grpc::StatusCode::NOT_FOUND) continue;  // removed since the list
        rc.error = std::string(fail(st, "ContainerStatus").message());
      } else if (static_cast<int>(status.status().state()) == 2) {
        rc.state = RuntimeContainerState::kExited;  // exited since the list: holds nothing
      } else if (auto it = status.info().find("info"); it == status.info().end()) {
        rc.error = "its verbose status has no \"info\" (the runtime is not containerd?)";
      } else if (auto devices = DevicesFromInfo(it->second); !devices.ok()) {
        rc.error = std::string(devices.status().message());
      } else {
        rc.devices = *std::move(devices);
      }
    }
    out.push_back(std::move(rc));
  }
  return out;
}

absl::StatusOr<std::vector<RuntimeContainer>> GrpcCriRuntime::List() {
  const absl::Duration deadline = RealClock().Monotonic() + options_.list_timeout;
  if (!v1alpha2_only_.load()) {
    auto v1 = ListWith<V1>("runtime.v1", deadline);
    if (v1.ok() || v1.status().code() != absl::StatusCode::kUnimplemented) return v1;
    v1alpha2_only_ = true;  // containerd before 1.6
  }
  return ListWith<V1alpha2>("runtime.v1alpha2", deadline);
}

}  // namespace dynmig::deviceplugin
