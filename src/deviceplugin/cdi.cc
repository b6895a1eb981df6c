#include "deviceplugin/cdi.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "deviceplugin/state_store.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "protocol/annotations.h"

namespace dynmig::deviceplugin {

std::string CdiWriter::QualifiedName(std::string_view mig_uuid) {
  return fmt::format("{}={}", protocol::kCdiKind, mig_uuid);
}

std::string CdiWriter::SpecPath(std::string_view mig_uuid) const {
  // The kind with '/' as '-' (a file name holds no '/'): "dynmig.io-mig".
  std::string kind(protocol::kCdiKind);
  std::replace(kind.begin(), kind.end(), '/', '-');
  return fmt::format("{}/{}_{}.json", dir_, kind, mig_uuid);
}

std::string CdiWriter::SpecJson(std::string_view mig_uuid, const std::vector<std::string>& nodes) {
  nlohmann::json edits = {{"env", {fmt::format("NVIDIA_VISIBLE_DEVICES={}", mig_uuid)}}};
  if (!nodes.empty()) {  // simulated devices have none
    nlohmann::json device_nodes = nlohmann::json::array();
    for (const auto& n : nodes) device_nodes.push_back({{"path", n}});
    edits["deviceNodes"] = std::move(device_nodes);
  }
  nlohmann::json spec = {
      {"cdiVersion", "0.5.0"},
      {"kind", std::string(protocol::kCdiKind)},
      {"devices", {{{"name", std::string(mig_uuid)}, {"containerEdits", std::move(edits)}}}}};
  return spec.dump(1) + "\n";
}

absl::Status CdiWriter::Write(std::string_view mig_uuid,
                              const std::vector<std::string>& device_nodes) const {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    return absl::UnavailableError(
        fmt::format("cannot create CDI directory {}: {}", dir_, std::string(ec.message())));
  }
  return WriteFileAtomically(SpecPath(mig_uuid), SpecJson(mig_uuid, device_nodes), fsync_);
}

absl::Status CdiWriter::Remove(std::string_view mig_uuid) const {
  const std::string path = SpecPath(mig_uuid);
  if (std::remove(path.c_str()) != 0 && errno != ENOENT) {
    return absl::UnavailableError(
        fmt::format("cannot remove CDI spec {}: {}", path, std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace dynmig::deviceplugin
