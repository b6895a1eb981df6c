// Placements on a GPU's placement axis and the bit masks that represent occupied units.
//
// NVML reports a GPU instance placement as {start, size} in placement units: memory slices on
// 8-slice GPUs and the A30, a 12-unit axis on the RTX PRO 6000. Two placements conflict when their
// half-open ranges [start, start+size) intersect. Pure value types; thread-compatible.
#pragma once

#include <compare>
#include <cstdint>
#include <string>

namespace dynmig::mig {

// The widest axis seen is 12 units (RTX PRO 6000); masks are 32 bits wide.
inline constexpr uint32_t kMaxPlacementUnits = 32;

// Bit i set = placement unit i.
using SliceMask = uint32_t;

struct Placement {
  uint32_t start = 0;
  uint32_t size = 0;

  uint32_t end() const { return start + size; }
  bool Overlaps(const Placement& other) const { return start < other.end() && other.start < end(); }
  // Units covered, as a mask. REQUIRES: end() <= kMaxPlacementUnits.
  SliceMask Mask() const {
    if (size == 0) return 0;
    const uint64_t bits = ((uint64_t{1} << size) - 1) << start;
    return static_cast<SliceMask>(bits);
  }
  // "4-7" (inclusive unit range), as users read slices.
  std::string ToString() const {
    if (size <= 1) return std::to_string(start);
    return std::to_string(start) + "-" + std::to_string(end() - 1);
  }
  friend auto operator<=>(const Placement&, const Placement&) = default;
};

// A mask with the first `units` bits set.
inline SliceMask FullMask(uint32_t units) {
  return units >= 32 ? ~SliceMask{0} : static_cast<SliceMask>((uint64_t{1} << units) - 1);
}

}  // namespace dynmig::mig
