// gRPC over a unix socket, as the kubelet's device-plugin protocol and its stand-ins speak it.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace dynmig::deviceplugin {

// sockaddr_un's path holds 108 bytes with its terminating NUL.
inline constexpr size_t kMaxUnixSocketPath = 107;

// Serves `services` on the unix socket `path`, replacing a stale file there. kInvalidArgument when
// the path is longer than kMaxUnixSocketPath; kUnavailable when gRPC cannot listen on it.
absl::StatusOr<std::unique_ptr<grpc::Server>> ServeOnUnixSocket(
    const std::string& path, std::initializer_list<grpc::Service*> services);

}  // namespace dynmig::deviceplugin
