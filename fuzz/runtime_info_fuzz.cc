// A container's verbose CRI info (containerd's JSON, what the runtime answers for handover):
// parsing never crashes; what it returns respects the bounds: at most kVisibleDevicesMaxIds
// device IDs, each non-empty, no path, sorted and unique.
#include <algorithm>

#include "deviceplugin/runtime_source.h"
#include "fuzz/fuzz_util.h"

namespace dynmig::fuzz {

int FuzzRuntimeInfo(const uint8_t* data, size_t size) {
  auto devices = deviceplugin::DevicesFromInfo(AsText(data, size));
  if (!devices.ok()) return 0;
  Check(devices->size() <= deviceplugin::kVisibleDevicesMaxIds, "more devices than the bound");
  for (const auto& d : *devices) {
    Check(!d.empty(), "an empty device ID");
    Check(!d.starts_with("/"), "a path returned as a device ID");
  }
  Check(std::is_sorted(devices->begin(), devices->end()), "device IDs not sorted");
  Check(std::adjacent_find(devices->begin(), devices->end()) == devices->end(),
        "device IDs not unique");
  return 0;
}

}  // namespace dynmig::fuzz
