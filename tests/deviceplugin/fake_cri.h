// A small in-process CRI RuntimeService (ListContainers, ContainerStatus verbose) over a unix
// socket, serving runtime.v1 and/or runtime.v1alpha2, for the tests of GrpcCriRuntime. Each
// container answers with the labels the kubelet sets and containerd's verbose info JSON, whose
// runtimeSpec.process.env the test chooses (or a raw info text, to attack the parser).
#pragma once

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/mutex.h"
#include "cri/v1/api.grpc.pb.h"
#include "cri/v1alpha2/api.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace dynmig::deviceplugin::testing {

struct FakeContainer {
  std::string id;
  std::string pod_uid, pod_ns, pod_name, container;
  int state = 1;  // CONTAINER_RUNNING
  std::vector<std::string> env;
  std::optional<std::string> raw_info;  // replaces the info JSON built from env
  bool no_info = false;                 // the verbose answer has no "info"
  grpc::StatusCode status_error = grpc::StatusCode::OK;
};

class FakeCri {
 public:
  // Serves on `socket`; v1 and/or v1alpha2.
  FakeCri(const std::string& socket, bool v1, bool v1alpha2) : v1_(this), v1alpha2_(this) {
    grpc::ServerBuilder b;
    b.AddListeningPort("unix://" + socket, grpc::InsecureServerCredentials());
    if (v1) b.RegisterService(&v1_);
    if (v1alpha2) b.RegisterService(&v1alpha2_);
    b.SetMaxSendMessageSize(64 << 20);
    server_ = b.BuildAndStart();
  }
  ~FakeCri() {
    if (server_) server_->Shutdown();
  }
  bool ok() const { return server_ != nullptr; }

  void Set(std::vector<FakeContainer> containers) {
    dynmig::MutexLock lock(&mu_);
    containers_ = std::move(containers);
  }
  int status_calls() const {
    dynmig::MutexLock lock(&mu_);
    return status_calls_;
  }
  int v1_calls() const {
    dynmig::MutexLock lock(&mu_);
    return v1_calls_;
  }

 private:
  template <typename Base, typename Ns>
  class Service final : public Base {
   public:
    explicit Service(FakeCri* owner) : owner_(owner) {}
    grpc::Status ListContainers(grpc::ServerContext*, const typename Ns::ListContainersRequest*,
                                typename Ns::ListContainersResponse* out) override {
      dynmig::MutexLock lock(&owner_->mu_);
      if constexpr (std::is_same_v<Ns, V1Ns>) ++owner_->v1_calls_;
      for (const auto& c : owner_->containers_) {
        auto* x = out->add_containers();
        x->set_id(c.id);
        x->mutable_metadata()->set_name(c.container);
        x->set_state(static_cast<decltype(x->state())>(c.state));
        auto& labels = *x->mutable_labels();
        if (!c.pod_uid.empty()) labels["io.kubernetes.pod.uid"] = c.pod_uid;
        if (!c.pod_name.empty()) labels["io.kubernetes.pod.name"] = c.pod_name;
        if (!c.pod_ns.empty()) labels["io.kubernetes.pod.namespace"] = c.pod_ns;
        labels["io.kubernetes.container.name"] = c.container;
      }
      return grpc::Status::OK;
    }
    grpc::Status ContainerStatus(grpc::ServerContext*,
                                 const typename Ns::ContainerStatusRequest* request,
                                 typename Ns::ContainerStatusResponse* out) override {
      dynmig::MutexLock lock(&owner_->mu_);
      ++owner_->status_calls_;
      for (const auto& c : owner_->containers_) {
        if (c.id != request->container_id()) continue;
        if (c.status_error != grpc::StatusCode::OK) return grpc::Status(c.status_error, "boom");
        out->mutable_status()->set_id(c.id);
        out->mutable_status()->set_state(static_cast<decltype(out->status().state())>(c.state));
        if (!request->verbose() || c.no_info) return grpc::Status::OK;
        std::string info = c.raw_info.value_or(
            nlohmann::json{{"pid", 1}, {"runtimeSpec", {{"process", {{"env", c.env}}}}}}.dump());
        (*out->mutable_info())["info"] = info;
        return grpc::Status::OK;
      }
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such container");
    }

   private:
    FakeCri* owner_;
  };
  struct V1Ns {
    using ListContainersRequest = ::runtime::v1::ListContainersRequest;
    using ListContainersResponse = ::runtime::v1::ListContainersResponse;
    using ContainerStatusRequest = ::runtime::v1::ContainerStatusRequest;
    using ContainerStatusResponse = ::runtime::v1::ContainerStatusResponse;
  };
  struct V1alpha2Ns {
    using ListContainersRequest = ::runtime::v1alpha2::ListContainersRequest;
    using ListContainersResponse = ::runtime::v1alpha2::ListContainersResponse;
    using ContainerStatusRequest = ::runtime::v1alpha2::ContainerStatusRequest;
    using ContainerStatusResponse = ::runtime::v1alpha2::ContainerStatusResponse;
  };

  mutable dynmig::Mutex mu_;
  std::vector<FakeContainer> containers_ ABSL_GUARDED_BY(mu_);
  int status_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int v1_calls_ ABSL_GUARDED_BY(mu_) = 0;
  Service<::runtime::v1::RuntimeService::Service, V1Ns> v1_;
  Service<::runtime::v1alpha2::RuntimeService::Service, V1alpha2Ns> v1alpha2_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace dynmig::deviceplugin::testing
