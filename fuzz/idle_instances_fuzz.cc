// The idle-instances node annotation (dynmig.io/idle-mig-instances, warm instances): decoding never
// crashes; encoding (sorted, duplicates dropped) is stable: encode(decode(encode(x))) == encode(x).
#include "fuzz/fuzz_util.h"
#include "protocol/idle_instances.h"

namespace dynmig::fuzz {

int FuzzIdleInstances(const uint8_t* data, size_t size) {
  auto decoded = protocol::DecodeIdleInstances(AsText(data, size));
  if (!decoded.ok()) return 0;
  const std::string text = protocol::EncodeIdleInstances(*decoded);
  auto again = protocol::DecodeIdleInstances(text);
  Check(again.ok(), "encoded idle instances do not decode");
  Check(protocol::EncodeIdleInstances(*again) == text, "idle instances encoding is not stable");
  return 0;
}

}  // namespace dynmig::fuzz
