// How many MIG instances a GPU can hold at once: the one rule the planner, the scheduler's
// capacity checks and the admission webhook's instance-count limit share. Pure.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mig/placement.h"
#include "mig/profile.h"

namespace dynmig::mig {

// The most pairwise disjoint placements among `by_end` (sorted by end) that avoid the units of
// `occupied`. Placements are intervals on the unit axis, so taking the free one that ends first,
// again and again, is optimal.
uint32_t DisjointPlacements(std::span<const Placement> by_end, SliceMask occupied = 0);

// The most instances a GPU of `capability` holds at once with only the profiles named in
// `allowed_names` (names the capability lacks are ignored): the most disjoint placements of those
// profiles, instance-count limits aside (so an upper bound).
uint32_t MostInstances(const GpuCapability& capability,
                       const std::vector<std::string>& allowed_names);

}  // namespace dynmig::mig
