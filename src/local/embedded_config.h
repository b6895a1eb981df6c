// Files of deploy/ compiled into the binary, so the local mode runs with exactly what a cluster
// is given (src/local/CMakeLists.txt generates the definitions at configure time).
#pragma once

#include <string_view>

namespace dynmig::local {

// deploy/scheduler/kube-scheduler-config.yaml
extern const std::string_view kEmbeddedSchedulerConfig;

}  // namespace dynmig::local
