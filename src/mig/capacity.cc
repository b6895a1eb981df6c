#include "mig/capacity.h"

#include <algorithm>

namespace dynmig::mig {

uint32_t DisjointPlacements(std::span<const Placement> by_end, SliceMask occupied) {
  uint32_t count = 0, free_from = 0;
  for (const Placement& pl : by_end) {
    if (pl.start < free_from || (pl.Mask() & occupied) != 0) continue;
    ++count;
    free_from = pl.end();
  }
  return count;
}

uint32_t MostInstances(const GpuCapability& capability,
                       const std::vector<std::string>& allowed_names) {
  std::vector<Placement> by_end;
  for (const auto& p : capability.profiles) {
    if (std::find(allowed_names.begin(), allowed_names.end(), p.name) == allowed_names.end()) {
      continue;
    }
    by_end.insert(by_end.end(), p.placements.begin(), p.placements.end());
  }
  std::sort(by_end.begin(), by_end.end(),
            [](const Placement& a, const Placement& b) { return a.end() < b.end(); });
  return DisjointPlacements(by_end);
}

}  // namespace dynmig::mig
