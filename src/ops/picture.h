// The terminal picture of a GPU's slices, injected by the CLI (src/cli/render.h draws it for
// `dynmig plan`; cmd_ops.cc adapts it), so `layout` and `explain` draw exactly the same picture
// without this library depending on the CLI's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mig/placement.h"

namespace dynmig::ops {

struct PictureCell {
  std::string label;
  mig::Placement placement;
  bool highlight = false;  // drawn { } instead of [ ]
};

struct SlicePainter {
  // The unit-number header line.
  std::function<std::string(uint32_t units, const std::string& indent)> header;
  // One row of cells; free units drawn as '.'.
  std::function<std::string(uint32_t units, const std::vector<PictureCell>& cells,
                            const std::string& indent)>
      row;
};

}  // namespace dynmig::ops
