// The held-slices node annotation: decoding never crashes; encoding (sorted, deduplicated) is
// stable: encode(decode(encode(x))) == encode(x).
#include "fuzz/fuzz_util.h"
#include "protocol/held_slices.h"

namespace dynmig::fuzz {

int FuzzHeldSlices(const uint8_t* data, size_t size) {
  auto decoded = protocol::DecodeHeldSlices(AsText(data, size));
  if (!decoded.ok()) return 0;
  const std::string text = protocol::EncodeHeldSlices(*decoded);
  auto again = protocol::DecodeHeldSlices(text);
  Check(again.ok(), "encoded held slices do not decode");
  Check(protocol::EncodeHeldSlices(*again) == text, "held slices encoding is not stable");
  return 0;
}

}  // namespace dynmig::fuzz
