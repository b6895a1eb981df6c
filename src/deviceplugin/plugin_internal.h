// Helpers shared by the PluginCore source files (plugin_*.cc). Internal to src/deviceplugin.
#pragma once

#include <string>

#include "fmt/format.h"
#include "mig/placement.h"

namespace dynmig::deviceplugin {

// "slices 6 (start 6, size 1)": a placement as events and errors name it.
inline std::string PlacementText(const mig::Placement& p) {
  return fmt::format("slices {} (start {}, size {})", p.ToString(), p.start, p.size);
}

}  // namespace dynmig::deviceplugin
