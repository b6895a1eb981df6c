#include "deviceplugin/unix_grpc.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include "fmt/format.h"

namespace dynmig::deviceplugin {

absl::StatusOr<std::unique_ptr<grpc::Server>> ServeOnUnixSocket(
    const std::string& path, std::initializer_list<grpc::Service*> services) {
  if (path.size() > kMaxUnixSocketPath) {
    return absl::InvalidArgumentError(
        fmt::format("socket path {} is {} bytes; a unix socket path holds at most {}", path,
                    path.size(), kMaxUnixSocketPath));
  }
  ::unlink(path.c_str());
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + path, grpc::InsecureServerCredentials());
  for (grpc::Service* s : services) builder.RegisterService(s);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    return absl::UnavailableError(fmt::format("cannot serve gRPC on unix://{}", path));
  }
  return server;
}

}  // namespace dynmig::deviceplugin
