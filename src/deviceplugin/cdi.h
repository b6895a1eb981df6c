// CDI (Container Device Interface) specs for dynamically created MIG devices: one spec file per
// MIG device, written atomically when the instance is created (or adopted without one) and deleted
// when it is destroyed, so a runtime never sees a device name it cannot resolve.
//
// Kind protocol::kCdiKind ("dynmig.io/mig"); device name = the MIG UUID (CDI device names may not
// contain '/'); the fully qualified name answered to the kubelet is "dynmig.io/mig=MIG-…". File
// "<dir>/<kind with '/' as '-'>_<MIG-UUID>.json" ("dynmig.io-mig_MIG-….json"):
//   {"cdiVersion":"0.5.0","kind":"dynmig.io/mig","devices":[{"name":"MIG-…","containerEdits":{
//     "env":["NVIDIA_VISIBLE_DEVICES=MIG-…"],"deviceNodes":[{"path":"/dev/nvidia0"},…]}}]}
// Thread-compatible.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace dynmig::deviceplugin {

class CdiWriter {
 public:
  CdiWriter(std::string dir, bool fsync) : dir_(std::move(dir)), fsync_(fsync) {}

  bool enabled() const { return !dir_.empty(); }
  // "dynmig.io/mig=<mig uuid>".
  static std::string QualifiedName(std::string_view mig_uuid);
  std::string SpecPath(std::string_view mig_uuid) const;
  static std::string SpecJson(std::string_view mig_uuid, const std::vector<std::string>& nodes);

  // Writes (replaces) the spec; creates the directory when missing. Errors name the path.
  absl::Status Write(std::string_view mig_uuid, const std::vector<std::string>& device_nodes) const;
  // Deletes the spec; OK when it does not exist.
  absl::Status Remove(std::string_view mig_uuid) const;

 private:
  std::string dir_;
  bool fsync_;
};

}  // namespace dynmig::deviceplugin
