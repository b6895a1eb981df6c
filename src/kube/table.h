// Server-side `Table` output (meta.k8s.io/v1) for `kubectl get` in human-readable form.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "kube/object.h"

namespace dynmig::kube {

// Columns like the real API server's: pods (Name, Ready, Status, Restarts, Age; wide: IP, Node,
// Nominated Node, Readiness Gates), nodes (Name, Status, Roles, Age, Version; wide: Internal-IP,
// External-IP, OS-Image, Kernel-Version, Container-Runtime), leases (Name, Holder, Age), others
// (Name, Age). `include_object` is the request's includeObject: "None", "Object" or "Metadata"
// (the default).
Object MakeTable(Resource resource, const std::vector<const Object*>& objects,
                 const std::string& resource_version, const std::string& continue_token,
                 std::string_view include_object, absl::Time now);

// Kubernetes' short human duration ("45s", "3m12s", "5h", "12d").
std::string HumanDuration(absl::Duration d);

}  // namespace dynmig::kube
