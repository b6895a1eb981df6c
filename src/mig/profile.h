// MIG profiles and GPU capabilities.
//
// A profile is identified by its exact name ("1g.10gb", "1g.10gb+me", "1g.20gb"): variants are
// never collapsed onto their base profile. A GpuCapability is what one GPU can do, either from the
// built-in catalogue or discovered through NVML at run time. Pure value types; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "mig/placement.h"

namespace dynmig::mig {

// The parts of a profile name `<c>g.<m>gb[suffix]`, e.g. "1g.24gb+me.all".
struct ProfileName {
  uint32_t compute_slices = 0;  // the <c> of "<c>g"
  uint32_t memory_gb = 0;       // the <m> of "<m>gb"
  std::string suffix;           // "", "+me", "+me.all", "-me" or "+gfx"
};

// Parses a profile name; the error names what is wrong ("7g.40" has no "gb", "3x.20gb" no "g").
absl::StatusOr<ProfileName> ParseProfileName(std::string_view name);

// The slice class of a profile name: the text before the first '.' ("4g" for "4g.20gb"); a string
// without '.' is its own class.
std::string_view SliceClass(std::string_view name);

// How a memory request (nvidia.com/gpumem, MiB) is matched against a profile
// (device-config.yaml `nvidia.migMemoryMatch`).
enum class MemoryMatch {
  // A profile covers up to its nominal memory: the GB of its name x 1024 MiB (3g.20gb: 20480),
  // as HAMi's geometry tables and the migration guide size profiles. The default.
  kNominal,
  // A profile covers up to the memory NVML reports for it (3g.20gb on an A100-40GB: 19968 MiB):
  // a pod never gets less than it asked, at the price of larger profiles for round requests.
  kNvml,
};

// "nominal" / "nvml".
std::string_view MemoryMatchName(MemoryMatch m);

// The nominal memory of a profile name in MiB (the <m> of "<m>gb" x 1024); 0 when unparsable.
uint64_t NominalMemoryMib(std::string_view profile_name);

// One GPU instance profile as NVML reports it.
struct ProfileSpec {
  std::string name;             // exact name, e.g. "3g.20gb"
  uint32_t nvml_index = 0;      // NVML_GPU_INSTANCE_PROFILE_* value passed to GetProfileInfo
  uint32_t nvml_id = 0;         // info.id, passed to every other GI call
  uint64_t memory_mib = 0;      // info.memorySizeMB
  uint32_t compute_slices = 0;  // info.sliceCount
  uint32_t memory_slices = 0;   // placement size, in placement units
  uint32_t instance_count = 0;  // info.instanceCount
  uint32_t multiprocessor_count = 0;
  uint32_t copy_engines = 0;
  uint32_t decoders = 0;
  uint32_t encoders = 0;
  uint32_t jpegs = 0;
  uint32_t ofas = 0;
  std::vector<Placement> placements;  // legal placements, as NVML lists them
  bool memory_derived = false;        // catalogue only: memory not observed, derived
  // The most memory a request may ask of this profile (see MemoryMatch); 0 = nominal (the
  // default). Set by ApplyMemoryMatch.
  uint64_t sizing_mib = 0;

  bool IsLegal(const Placement& p) const;
  // What sizing compares a request with: sizing_mib, else the nominal memory (memory_mib when the
  // name has none).
  uint64_t SizingMib() const;
};

// What one GPU can do.
struct GpuCapability {
  std::string model;              // NVML name, e.g. "NVIDIA A100-SXM4-40GB"
  uint64_t total_memory_mib = 0;  // nvmlDeviceGetMemoryInfo total
  uint32_t placement_units = 0;   // length of the placement axis (max start+size)
  uint32_t memory_slices = 0;
  uint32_t compute_slices = 0;
  std::vector<ProfileSpec> profiles;

  // The profile with exactly this name, or nullptr.
  const ProfileSpec* FindProfile(std::string_view name) const;
  // Memory of the largest profile (the full-GPU instance): what a whole-GPU request gets.
  uint64_t FullProfileMemory() const;
};

// The most memory a request may ask of `p` under `match`: NVML's memory, or the nominal memory
// (memory_mib when the name has none).
uint64_t SizingMemory(const ProfileSpec& p, MemoryMatch match);

// Sets every profile's sizing memory for `match`.
void ApplyMemoryMatch(GpuCapability& cap, MemoryMatch match);

// The default order among profiles that cover a request: less memory first (sizing memory, then
// NVML's), then fewer compute
// slices (so 20 GB on an A100-40GB is 3g.20gb, not 4g.20gb), then base profiles before variants
// (1g.5gb before 1g.5gb+me), then by name.
bool DefaultProfileLess(const ProfileSpec& a, const ProfileSpec& b);

}  // namespace dynmig::mig
