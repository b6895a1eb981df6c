// device-config.yaml: parsing never crashes, whatever the YAML.
#include "fuzz/fuzz_util.h"
#include "protocol/device_config.h"

namespace dynmig::fuzz {

int FuzzDeviceConfig(const uint8_t* data, size_t size) {
  (void)protocol::ParseDeviceConfig(AsText(data, size));
  return 0;
}

}  // namespace dynmig::fuzz
