// HAMi's legacy MIG geometry configuration (`nvidia.knownMigGeometries`) and its conversion to the
// profile allowlist.
//
// A legacy entry lists whole-GPU geometries, each a list of templates {name, core, memory, count}.
// The current model only needs the profile names: capability (memory, compute, placements,
// instance counts) comes from NVML. Conversion keeps the union of the profile names of an entry
// and reports everything it drops. Pure; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mig/allowlist.h"

namespace dynmig::mig {

// One template of a legacy geometry: `count` instances of profile `name`.
struct LegacyTemplate {
  std::string name;     // profile name, e.g. "2g.10gb"
  uint32_t core = 0;    // percent of the GPU's compute (operator-maintained)
  uint32_t memory = 0;  // MiB (operator-maintained)
  uint32_t count = 0;   // instances of this profile in the geometry
};

// One `knownMigGeometries` entry: the GPU models it applies to (NVML name substrings) and its
// ordered whole-GPU geometries.
struct LegacyGeometryEntry {
  std::vector<std::string> models;
  std::vector<std::vector<LegacyTemplate>> geometries;
};

// What the conversion of one legacy entry kept and dropped.
struct LegacyEntryReport {
  std::string path;                     // e.g. "nvidia.knownMigGeometries[0]"
  std::vector<std::string> models;      // the entry's models
  std::vector<std::string> profiles;    // the profile names kept, in allowlist order
  std::vector<std::string> geometries;  // dropped combinations: "3 x 2g.10gb + 1 x 1g.5gb"
  std::vector<LegacyTemplate> dropped_templates;  // every template with its core/memory/count
  std::vector<std::string> warnings;              // invalid or unknown names, empty entries
};

struct LegacyConversion {
  // One allowlist entry per legacy entry that kept at least one profile, in the legacy order.
  std::vector<AllowlistEntry> entries;
  std::vector<LegacyEntryReport> reports;  // one per legacy entry, in order

  // Every warning of every entry, prefixed with the entry's path.
  std::vector<std::string> Warnings() const;
  // A human report: per entry, the profiles kept, the geometries and template values dropped, and
  // the warnings. One line each.
  std::vector<std::string> Lines() const;
};

// Converts legacy geometries to allowlist entries: per entry, the union of the template names,
// ordered by size (compute slices, then memory, then base profiles before variants, then name).
// Names that are not valid profile names are dropped with a warning; names that a catalogued
// model matched by the entry's models does not have are kept with a warning ("verify profile
// names for each actual GPU model"); models that match no catalogued board are warned about too.
// `path` prefixes the report paths.
LegacyConversion ConvertLegacyGeometries(const std::vector<LegacyGeometryEntry>& legacy,
                                         std::string_view path = "nvidia.knownMigGeometries");

// Orders profile names by size the way converted and default allowlists list them. Names that do
// not parse go last, in their original order.
void SortProfileNamesBySize(std::vector<std::string>& names);

}  // namespace dynmig::mig
