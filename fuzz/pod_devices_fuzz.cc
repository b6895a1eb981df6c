// The HAMi device annotations (hami.io/vgpu-devices-to-allocate and friends) and legacy MIG
// identities: decoding never crashes; a decoded value round-trips.
#include "fuzz/fuzz_util.h"
#include "protocol/devices.h"

namespace dynmig::fuzz {

int FuzzPodDevices(const uint8_t* data, size_t size) {
  const std::string_view text = AsText(data, size);
  auto legacy = protocol::ParseLegacyMigIdentity(text);
  Check(legacy.has_value() == protocol::IsLegacyMigIdentity(text),
        "ParseLegacyMigIdentity disagrees with IsLegacyMigIdentity");
  auto decoded = protocol::DecodePodDevices(text);
  if (!decoded.ok()) return 0;
  auto encoded = protocol::EncodePodDevices(*decoded);
  Check(encoded.ok(), "a decoded device annotation does not encode");
  auto again = protocol::DecodePodDevices(*encoded);
  Check(again.ok() && *again == *decoded, "devices change through encode/decode");
  return 0;
}

}  // namespace dynmig::fuzz
