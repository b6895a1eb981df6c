// The built-in catalogue of MIG-capable GPU models, generated from the MIG facts table
// (tools/gen_catalogue.py). NVML discovery fills the same GpuCapability type at run time; the
// catalogue serves `dynmig plan`, the simulator and defaults. Immutable after first use.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "mig/profile.h"

namespace dynmig::mig {

struct CatalogueModel {
  GpuCapability capability;
  bool total_memory_derived = false;
  std::string architecture;
  std::vector<std::string> names;  // NVML names of this model's boards, the canonical one first
  std::vector<uint32_t> pci_device_ids;
  // GI ID (RM swizzId) of each placement in the identity layout.
  std::vector<std::pair<Placement, uint32_t>> gpu_instance_id_by_placement;
};

// Every catalogued model, in the facts table's order.
const std::vector<CatalogueModel>& Catalogue();

// Finds a model by name the way an allowlist matches NVML names: an exact board name (with or
// without the "NVIDIA " prefix) first, then a substring of a board name. Ambiguous and unknown
// queries are errors that list the candidates.
absl::StatusOr<const CatalogueModel*> FindModel(std::string_view query);

// The model whose board names include this exact NVML name, or nullptr.
const CatalogueModel* FindModelByNvmlName(std::string_view nvml_name);

// Generated (catalogue_data.cc).
std::vector<CatalogueModel> BuildCatalogue();

}  // namespace dynmig::mig
