#include "cli/render.h"

#include <algorithm>

#include "fmt/format.h"

namespace dynmig::cli {
namespace {

uint32_t CellWidth(uint32_t units) { return units > 8 ? 7 : 9; }

std::string Center(const std::string& s, size_t width) {
  if (s.size() >= width) return s.substr(0, width);
  const size_t left = (width - s.size()) / 2;
  return std::string(left, ' ') + s + std::string(width - s.size() - left, ' ');
}

}  // namespace

std::string RenderUnitHeader(uint32_t units, const std::string& indent) {
  const uint32_t w = CellWidth(units);
  std::string out = indent;
  for (uint32_t i = 0; i < units; ++i) out += Center(std::to_string(i), w);
  return out;
}

std::string RenderRow(uint32_t units, const std::vector<DrawnInstance>& instances,
                      const std::string& indent) {
  const uint32_t w = CellWidth(units);
  std::vector<const DrawnInstance*> by_start(units, nullptr);
  for (const auto& inst : instances) {
    if (inst.placement.start < units) by_start[inst.placement.start] = &inst;
  }
  std::string out = indent;
  uint32_t i = 0;
  while (i < units) {
    const DrawnInstance* inst = by_start[i];
    if (inst == nullptr || inst->placement.size == 0) {
      out += Center(".", w);
      ++i;
      continue;
    }
    const uint32_t size = std::min(inst->placement.size, units - i);
    const size_t width = size_t{size} * w;
    const char open = inst->highlight ? '{' : '[';
    const char close = inst->highlight ? '}' : ']';
    out += open;
    out += Center(inst->label, width - 2);
    out += close;
    i += size;
  }
  return out;
}

}  // namespace dynmig::cli
