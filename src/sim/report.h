// Renders a SimResult: a table a person reads at a glance, JSON, CSV, and an SVG chart
// (utilization over time per policy, acceptance per policy as bars). Pure.
#pragma once

#include <string>

#include "sim/simulator.h"

namespace dynmig::sim {

std::string FormatText(const SimResult& result);
// {"policies":[{"name":"dynmig","acceptedCount":0.93,"acceptedSliceTime":0.91,"gapClosed":0.8,
// ...}], ...}; fractions in 0..1, gapClosed null when undefined.
std::string FormatJson(const SimResult& result);
// One header line, one line per policy (and a "bound" line in fill mode).
std::string FormatCsv(const SimResult& result);
// A self-contained SVG document.
std::string FormatSvg(const SimResult& result);

}  // namespace dynmig::sim
