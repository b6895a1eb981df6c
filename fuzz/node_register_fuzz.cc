// hami.io/node-nvidia-register: decoding never crashes; a decoded list round-trips.
#include "fuzz/fuzz_util.h"
#include "protocol/node_register.h"

namespace dynmig::fuzz {

int FuzzNodeRegister(const uint8_t* data, size_t size) {
  auto decoded = protocol::DecodeNodeRegister(AsText(data, size));
  if (!decoded.ok()) return 0;
  auto again = protocol::DecodeNodeRegister(protocol::EncodeNodeRegister(*decoded));
  Check(again.ok(), "an encoded node register does not decode");
  Check(*again == *decoded, "node register changes through encode/decode");
  return 0;
}

}  // namespace dynmig::fuzz
