// hami.io/node-nvidia-register: decoding never crashes; a decoded list round-trips, but for
// legacy_mig_template, which records that the input carried HAMi's old "migtemplate" field and is
// never encoded (found by this target: the first property compared it too).
#include "fuzz/fuzz_util.h"
#include "protocol/node_register.h"

namespace dynmig::fuzz {

int FuzzNodeRegister(const uint8_t* data, size_t size) {
  auto decoded = protocol::DecodeNodeRegister(AsText(data, size));
  if (!decoded.ok()) return 0;
  auto again = protocol::DecodeNodeRegister(protocol::EncodeNodeRegister(*decoded));
  Check(again.ok(), "an encoded node register does not decode");
  for (const auto& d : *again) Check(!d.legacy_mig_template, "migtemplate was encoded");
  for (auto& d : *decoded) d.legacy_mig_template = false;
  Check(*again == *decoded, "node register changes through encode/decode");
  return 0;
}

}  // namespace dynmig::fuzz
