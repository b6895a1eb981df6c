#include "mig/catalogue.h"

#include "absl/status/status.h"
#include "common/strings.h"
#include "fmt/format.h"
#include "fmt/ranges.h"

namespace dynmig::mig {

const std::vector<CatalogueModel>& Catalogue() {
  static const std::vector<CatalogueModel>* const kCatalogue =
      new std::vector<CatalogueModel>(BuildCatalogue());
  return *kCatalogue;
}

const CatalogueModel* FindModelByNvmlName(std::string_view nvml_name) {
  for (const auto& m : Catalogue()) {
    for (const auto& n : m.names) {
      if (n == nvml_name) return &m;
    }
  }
  return nullptr;
}

absl::StatusOr<const CatalogueModel*> FindModel(std::string_view query) {
  if (query.empty()) return absl::InvalidArgumentError("GPU model is empty");
  for (const auto& m : Catalogue()) {
    for (const auto& n : m.names) {
      if (n == query || (n.starts_with("NVIDIA ") && std::string_view(n).substr(7) == query))
        return &m;
    }
  }
  std::vector<const CatalogueModel*> hits;
  for (const auto& m : Catalogue()) {
    for (const auto& n : m.names) {
      if (ContainsIgnoreCase(n, query)) {
        hits.push_back(&m);
        break;
      }
    }
  }
  if (hits.size() == 1) return hits.front();
  std::vector<std::string> names;
  if (hits.empty()) {
    for (const auto& m : Catalogue()) names.push_back(m.capability.model);
    return absl::NotFoundError(
        fmt::format("unknown GPU model \"{}\"; known models: {}", query, fmt::join(names, ", ")));
  }
  for (const auto* m : hits) names.push_back(m->capability.model);
  return absl::InvalidArgumentError(
      fmt::format("GPU model \"{}\" is ambiguous: it matches {}", query, fmt::join(names, ", ")));
}

}  // namespace dynmig::mig
