// /proc/driver/nvidia-caps/mig-minors: parsing never crashes; what parses answers lookups.
#include "fuzz/fuzz_util.h"
#include "nvml/mig_minors.h"

namespace dynmig::fuzz {

int FuzzMigMinors(const uint8_t* data, size_t size) {
  auto minors = nvml::MigMinors::Parse(AsText(data, size));
  if (!minors.ok()) return 0;
  (void)minors->DeviceNodes(0, 1, 0);
  (void)minors->Lookup("config");
  return 0;
}

}  // namespace dynmig::fuzz
