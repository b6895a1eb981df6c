// Terminal pictures of a GPU's slices: one cell per placement unit, each reservation drawn across
// the units it covers. Shared by `dynmig plan` and `dynmig layout`.
#pragma once

#include <string>
#include <vector>

#include "mig/occupancy.h"
#include "mig/profile.h"

namespace dynmig::cli {

struct DrawnInstance {
  std::string label;  // usually the profile name
  mig::Placement placement;
  bool highlight = false;  // drawn with { } instead of [ ] (e.g. newly planned)
};

// The header line with unit numbers, aligned with RenderRow.
std::string RenderUnitHeader(uint32_t units, const std::string& indent);
// One row: `indent` then the cells. Free units show as a centered '.'.
std::string RenderRow(uint32_t units, const std::vector<DrawnInstance>& instances,
                      const std::string& indent);

}  // namespace dynmig::cli
