// A fixed geometry's text (`dynmig nvml apply-geometry --geometry`, `dynmig local
// --legacy-geometry`): parsing never crashes, and what parses prints back to text that parses to
// the same geometry, within the bounds.
#include "fuzz/fuzz_util.h"
#include "mig/geometry.h"

namespace dynmig::fuzz {

int FuzzGeometry(const uint8_t* data, size_t size) {
  auto spec = mig::ParseGeometry(AsText(data, size));
  if (!spec.ok()) return 0;
  Check(spec->all_of.empty() != spec->counts.empty(), "neither or both of all- and counts");
  uint32_t total = 0;
  for (const auto& [name, count] : spec->counts) total += count;
  Check(total <= mig::kMaxGeometryInstances, "more instances than a GPU holds");
  Check(spec->counts.size() <= mig::kMaxGeometryProfiles, "more profiles than the bound");
  const std::string text = spec->ToString();
  auto again = mig::ParseGeometry(text);
  Check(again.ok(), "a printed geometry does not parse");
  Check(again->ToString() == text, "geometry text is not stable");
  return 0;
}

}  // namespace dynmig::fuzz
