// The simulated cluster: GPU models (from the catalogue), their allowlists, nodes, and the
// per-model tables every policy shares (covering profiles per request size, feasible instance
// multisets, static geometries).
//
// A GPU model's table of feasible multisets is built once by brute force over its legal placements:
// every set of non-overlapping placements of allowlisted profiles, keyed by how many instances of
// each profile it holds. Immutable after BuildCluster; thread-compatible.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "mig/catalogue.h"
#include "mig/occupancy.h"
#include "mig/planner.h"

namespace dynmig::sim {

inline constexpr int32_t kNoState = -1;

// Feasible instance multisets of one model, over its allowlisted profiles ("local" index a =
// position in GpuPlanner::allowed()).
struct LayoutTable {
  uint32_t profiles = 0;                                  // number of allowlisted profiles (A)
  std::vector<std::vector<uint8_t>> counts;               // per state: instances per local profile
  std::vector<std::vector<mig::PlannedInstance>> layout;  // per state: one legal layout
  std::vector<int32_t> add;       // [state * A + a]: state with one more of a, or kNoState
  std::vector<int32_t> remove;    // [state * A + a]: state with one fewer of a, or kNoState
  std::vector<uint32_t> units;    // per state: placement units the layout occupies
  std::vector<uint32_t> maximal;  // states to which no instance can be added

  int32_t Add(int32_t state, uint32_t a) const { return add[state * profiles + a]; }
  int32_t Remove(int32_t state, uint32_t a) const { return remove[state * profiles + a]; }
  // The state holding exactly these counts (per local profile), or kNoState.
  int32_t Find(const std::vector<uint8_t>& counts) const;
};

// A fixed partition of one GPU (MIG Manager style): its instances and their profiles.
struct StaticGeometry {
  std::string name;                             // e.g. "all-balanced"
  std::vector<mig::PlannedInstance> instances;  // legal, non-overlapping
  uint32_t leftover_units = 0;                  // units no instance covers
};

struct ModelGroup {
  const mig::CatalogueModel* model = nullptr;
  std::shared_ptr<const mig::GpuPlanner> planner;
  uint32_t gpus = 0;
  uint32_t first_gpu = 0;
  uint32_t units = 0;  // placement units
  // Per requested percentage of the GPU (0..100; 0 unused): the allowlisted profiles whose memory
  // covers it, in the planner's default order (smallest first). Empty: no profile is big enough.
  std::array<std::vector<uint32_t>, 101> candidates;
  // Local index (position in planner->allowed()) by profile index; -1 when not allowlisted.
  std::vector<int32_t> local;
  LayoutTable table;
  // Per percentage, when units <= 16: by free-units mask, whether some covering profile has a
  // legal placement inside it (instance limits aside). Use CanHost.
  std::array<std::vector<uint8_t>, 101> hostable;
  uint32_t device_count = 0;  // max instance count over allowlisted profiles (HAMi's "Count")
  uint32_t full_mp = 0;       // multiprocessors of the full GPU

  const mig::GpuCapability& cap() const { return planner->capability(); }
  const mig::ProfileSpec& profile(uint32_t index) const { return cap().profiles[index]; }
  bool CanHost(uint32_t percent, mig::SliceMask free) const;
  // HAMi's published "core" of a profile: ceil(MP * 100 / full-GPU MP).
  uint32_t Core(uint32_t profile_index) const;
};

struct Cluster {
  std::vector<ModelGroup> groups;
  uint32_t gpus_per_node = 8;
  // Topology: GPU g belongs to group gpu_group[g] and node gpu_node[g]; nodes hold consecutive
  // GPUs of one model.
  std::vector<uint32_t> gpu_group;
  std::vector<uint32_t> gpu_node;
  std::vector<uint32_t> node_first_gpu;
  std::vector<uint32_t> node_gpus;
  uint64_t total_units = 0;

  uint32_t gpu_count() const { return static_cast<uint32_t>(gpu_group.size()); }
  uint32_t node_count() const { return static_cast<uint32_t>(node_first_gpu.size()); }
  const ModelGroup& group_of_gpu(uint32_t g) const { return groups[gpu_group[g]]; }
  const ModelGroup& group_of_node(uint32_t n) const { return groups[gpu_group[node_first_gpu[n]]]; }
  // Placement units a request of `count` x `percent` asks for, on the reference (first) model:
  // count x memory slices of its smallest covering profile; 0 when no profile covers it there.
  uint32_t AskedUnits(uint32_t count, uint32_t percent) const;
  // Whether some model of the cluster has a profile covering `percent`.
  bool Servable(uint32_t percent) const;
};

// "A100-SXM4-40GBx100,H100 80GBx50": models (catalogue names or unambiguous substrings) and GPU
// counts. `allow` empty: the base profiles of each model (no +me/-me/+gfx variants); else the
// profiles with these exact names (each must exist on some model, and each model needs one).
absl::StatusOr<Cluster> BuildCluster(std::string_view gpus, uint32_t gpus_per_node,
                                     const std::vector<std::string>& allow);

// The static geometry `name` ("all-balanced", "all-1g", "all-2g", "all-3g", "all-4g", "all-7g" or
// "all-<profile>", e.g. "all-1g.10gb") on one model. all-balanced follows NVIDIA MIG Manager's
// default config: 2 x 1g + 1 x 2g + 1 x 3g (dropping the 3g, then the 2g, where they do not fit).
absl::StatusOr<StaticGeometry> MakeStaticGeometry(const ModelGroup& group, std::string_view name);

}  // namespace dynmig::sim
