#include "mig/legacy.h"

#include <algorithm>
#include <optional>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "mig/catalogue.h"

namespace dynmig::mig {
namespace {

// The catalogued models whose board names contain `model`, as an allowlist matches NVML names.
std::vector<const CatalogueModel*> CatalogueMatches(std::string_view model) {
  std::vector<const CatalogueModel*> out;
  if (model.empty()) return out;
  for (const auto& m : Catalogue()) {
    for (const auto& n : m.names) {
      if (n.find(model) != std::string::npos) {
        out.push_back(&m);
        break;
      }
    }
  }
  return out;
}

std::string FormatGeometry(const std::vector<LegacyTemplate>& geometry) {
  if (geometry.empty()) return "(empty)";
  std::vector<std::string> parts;
  parts.reserve(geometry.size());
  for (const auto& t : geometry) parts.push_back(fmt::format("{} x {}", t.count, t.name));
  return fmt::format("{}", fmt::join(parts, " + "));
}

}  // namespace

void SortProfileNamesBySize(std::vector<std::string>& names) {
  struct Key {
    std::optional<ProfileName> parsed;
    size_t order;
  };
  std::vector<std::pair<Key, std::string>> keyed;
  keyed.reserve(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    auto parsed = ParseProfileName(names[i]);
    keyed.push_back({Key{parsed.ok() ? std::optional<ProfileName>(*parsed) : std::nullopt, i},
                     std::move(names[i])});
  }
  std::stable_sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) {
    const auto& ka = a.first;
    const auto& kb = b.first;
    if (ka.parsed.has_value() != kb.parsed.has_value()) return ka.parsed.has_value();
    if (!ka.parsed.has_value()) return ka.order < kb.order;
    const ProfileName& pa = *ka.parsed;
    const ProfileName& pb = *kb.parsed;
    if (pa.compute_slices != pb.compute_slices) return pa.compute_slices < pb.compute_slices;
    if (pa.memory_gb != pb.memory_gb) return pa.memory_gb < pb.memory_gb;
    if (pa.suffix.empty() != pb.suffix.empty()) return pa.suffix.empty();
    return a.second < b.second;
  });
  names.clear();
  for (auto& [key, name] : keyed) names.push_back(std::move(name));
}

LegacyConversion ConvertLegacyGeometries(const std::vector<LegacyGeometryEntry>& legacy,
                                         std::string_view path) {
  LegacyConversion out;
  for (size_t i = 0; i < legacy.size(); ++i) {
    const LegacyGeometryEntry& entry = legacy[i];
    LegacyEntryReport report;
    report.path = fmt::format("{}[{}]", path, i);
    report.models = entry.models;

    std::vector<std::string> names;
    for (size_t g = 0; g < entry.geometries.size(); ++g) {
      const auto& geometry = entry.geometries[g];
      report.geometries.push_back(FormatGeometry(geometry));
      for (size_t t = 0; t < geometry.size(); ++t) {
        const LegacyTemplate& tmpl = geometry[t];
        report.dropped_templates.push_back(tmpl);
        if (std::find(names.begin(), names.end(), tmpl.name) != names.end()) continue;
        auto parsed = ParseProfileName(tmpl.name);
        if (!parsed.ok()) {
          report.warnings.push_back(fmt::format("allowedGeometries[{}][{}].name: dropped: {}", g, t,
                                                std::string(parsed.status().message())));
          // Remember it so that the same bad name is reported once.
          names.push_back(tmpl.name);
          continue;
        }
        names.push_back(tmpl.name);
      }
    }
    // Keep only the valid names, ordered by size.
    std::vector<std::string> profiles;
    for (const auto& n : names) {
      if (ParseProfileName(n).ok()) profiles.push_back(n);
    }
    SortProfileNamesBySize(profiles);

    if (entry.models.empty()) {
      report.warnings.push_back("models: no GPU model; the entry is dropped");
    }
    if (profiles.empty()) {
      report.warnings.push_back("no valid profile name in any geometry; the entry is dropped");
    }

    // Check the names against the catalogue for every model the entry names.
    for (const auto& model : entry.models) {
      auto matches = CatalogueMatches(model);
      if (matches.empty()) {
        report.warnings.push_back(fmt::format(
            "model \"{}\" matches no catalogued GPU; verify its profile names on the hardware",
            model));
        continue;
      }
      for (const auto* m : matches) {
        for (const auto& p : profiles) {
          if (m->capability.FindProfile(p) == nullptr) {
            report.warnings.push_back(
                fmt::format("profile \"{}\" is not a MIG profile of {} (matched by model \"{}\")",
                            p, m->capability.model, model));
          }
        }
      }
    }

    report.profiles = profiles;
    if (!entry.models.empty() && !profiles.empty()) {
      out.entries.push_back(AllowlistEntry{entry.models, profiles});
    }
    out.reports.push_back(std::move(report));
  }
  return out;
}

std::vector<std::string> LegacyConversion::Warnings() const {
  std::vector<std::string> out;
  for (const auto& r : reports) {
    for (const auto& w : r.warnings) out.push_back(fmt::format("{}: {}", r.path, w));
  }
  return out;
}

std::vector<std::string> LegacyConversion::Lines() const {
  std::vector<std::string> out;
  for (const auto& r : reports) {
    out.push_back(fmt::format("{} (models: {}): kept profiles [{}]", r.path,
                              fmt::join(r.models, ", "), fmt::join(r.profiles, ", ")));
    if (!r.geometries.empty()) {
      out.push_back(fmt::format("{}: dropped {} geometr{}: {}", r.path, r.geometries.size(),
                                r.geometries.size() == 1 ? "y" : "ies",
                                fmt::join(r.geometries, " | ")));
    }
    if (!r.dropped_templates.empty()) {
      std::vector<std::string> values;
      values.reserve(r.dropped_templates.size());
      for (const auto& t : r.dropped_templates) {
        values.push_back(
            fmt::format("{} core={} memory={} count={}", t.name, t.core, t.memory, t.count));
      }
      out.push_back(fmt::format("{}: dropped template values (NVML supplies them now): {}", r.path,
                                fmt::join(values, "; ")));
    }
    for (const auto& w : r.warnings) out.push_back(fmt::format("{}: warning: {}", r.path, w));
  }
  return out;
}

}  // namespace dynmig::mig
