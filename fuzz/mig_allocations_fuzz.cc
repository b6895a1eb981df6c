// hami.io/vgpu-mig-allocations: decoding never crashes, and what decodes encodes to a value that
// decodes back to the same allocations.
#include "fuzz/fuzz_util.h"
#include "protocol/mig_allocations.h"

namespace dynmig::fuzz {

int FuzzMigAllocations(const uint8_t* data, size_t size) {
  auto decoded = protocol::DecodeMigAllocations(AsText(data, size));
  if (!decoded.ok()) return 0;
  auto again = protocol::DecodeMigAllocations(protocol::EncodeMigAllocations(*decoded));
  Check(again.ok(), "an encoded allocation list does not decode");
  Check(*again == *decoded, "allocations change through encode/decode");
  return 0;
}

}  // namespace dynmig::fuzz
