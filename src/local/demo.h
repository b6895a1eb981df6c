// The walk-through `dynmig local --demo` plays on a running LocalCluster: the migration guide's
// canary and mixed-profile scenarios, each as a user would do it (pods created through the API
// server as the cluster admin, so the admission webhooks run), with the slice layout printed after
// every step:
//   1. the canary pod (spec example, 8000 MiB): Running, reservation annotation complete, the
//      container's MIG UUID is the annotation's and NVML's;
//   2. the canary deleted: its instance is destroyed, nothing else touched;
//   3. mixed 1g, 2g and 3g pods on one node, non-overlapping;
//   4. a profile preference (4g) honored; a misspelled one refused at admission;
//   5. capacity exhausted: small pods until one stays Pending, with the reason;
//   6. a device-plugin restart while the workloads run: same MIG UUIDs, nothing destroyed;
// then the fillers of step 5 are deleted and the rest keeps running.
#pragma once

#include <functional>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "local/local_cluster.h"

namespace dynmig::local {

struct DemoOptions {
  std::string ns = "default";
  // Prints the current slice layout (the CLI passes `dynmig layout`'s renderer).
  std::function<std::string()> layout;
  absl::Duration step_timeout = absl::Seconds(60);
};

// Runs the steps; the first step whose expectation fails ends the demo with an error naming the
// step and what was seen. Each step's outcome is printed as "ok" or "FAILED".
absl::Status RunDemo(LocalCluster& cluster, std::ostream& out, const DemoOptions& options);

}  // namespace dynmig::local
