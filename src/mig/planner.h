// The placement planner: for one container's N MIG instances on one GPU, which profiles and which
// legal, non-overlapping placements.
//
// Rules (docs/design/0001-placement.md explains them with worked examples):
//  * profile choice: the smallest allowlisted profile whose memory covers the request (ties in
//    memory go to fewer compute slices); if it has no free placement, the next larger one;
//  * preference (`nvidia.com/mig-profile-preference`): preferred profiles that cover the request
//    are tried first, jointly for all instances; if they do not fit, the default order applies. A
//    preference never selects a smaller profile and never rejects a GPU;
//  * joint placement of all N instances: most constrained first, exhaustive with symmetry breaking
//    and branch-and-bound; deterministic;
//  * among equally small choices, the one whose free slices keep the largest allowlisted profiles
//    placeable (the fragmentation score), then (warm instances) the one that lands more instances
//    exactly on idle instances (same profile and placement), then the lowest start.
//
// A GpuPlanner is built once per (capability, allowlist) pair and shared by every GPU of that kind;
// it is immutable after construction and safe to use from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "mig/occupancy.h"
#include "mig/placement.h"
#include "mig/preference.h"
#include "mig/profile.h"

namespace dynmig::mig {

// Why a GPU (or node) cannot take a request; ordered from "nearly fits" to "never fits" is not
// implied. kFits means it fits.
enum class Verdict {
  kFits,
  kFragmented,          // enough free slices, but no legal non-overlapping layout
  kCapacityExhausted,   // not enough free slices (or instance limits reached)
  kNoProfileBigEnough,  // no allowlisted profile has the requested memory
  kNotAllowlisted,      // the GPU's model has no allowlisted profile
  kFiltered,            // excluded by the pod's GPU selection hints (uuid, type, mode)
  kGpuUnhealthy,        // marked unschedulable (e.g. unreadable reservation: fail closed)
  kNoMigGpu,            // the node has no MIG GPU
  kNodeUnhealthy,       // the node's device plugin stopped reporting
};

// A short stable name ("fragmented", "capacity-exhausted", ...), used in reasons and metrics.
const char* VerdictName(Verdict v);

struct PlannedInstance {
  uint32_t profile_index = 0;  // into GpuCapability::profiles
  Placement placement;
};

struct GpuPlan {
  Verdict verdict = Verdict::kFits;
  std::vector<PlannedInstance> instances;  // same order as the requested memories
  bool used_preference = false;            // the preferred layout was taken
  std::string reason;                      // human-readable, empty when it fits
};

class GpuPlanner {
 public:
  // `allowed_names`: the allowlisted profile names for this GPU; names the capability lacks are
  // ignored (discovery reports them). Errors: kInvalidArgument when the capability is unusable
  // (more than 32 placement units or profiles, a placement beyond the axis).
  static absl::StatusOr<std::shared_ptr<const GpuPlanner>> Create(
      GpuCapability capability, const std::vector<std::string>& allowed_names);

  const GpuCapability& capability() const { return capability_; }
  // Indices (into capability().profiles) of the allowlisted profiles, in the default order.
  const std::vector<uint32_t>& allowed() const { return allowed_; }
  bool IsAllowed(uint32_t profile_index) const;
  uint32_t units() const { return capability_.placement_units; }
  // The most instances this GPU holds at once: the most non-overlapping placements of allowlisted
  // profiles (instance-count limits aside, so an upper bound). Plan refuses more without a search.
  uint32_t max_instances() const { return max_instances_; }
  // The same with the units of `occupied` taken: the most instances that could still be added.
  uint32_t MaxInstances(SliceMask occupied) const;

  // Plans `memories_mib.size()` instances (each needing at least that much memory) on a GPU with
  // `usage`. Never fails: an infeasible request yields a verdict and, when `explain`, a reason
  // (hot paths that only need the verdict skip the formatting). More instances than
  // max_instances() are refused (kCapacityExhausted) before anything else is looked at, so the
  // work is bounded by the GPU's size whatever the request.
  // `idle`: idle (warm) instances of the GPU (their slices are free in `usage`); among otherwise
  // equal choices, one that lands on them exactly is preferred. Empty: the answer is the same as
  // without warm instances.
  GpuPlan Plan(const GpuUsage& usage, std::span<const uint64_t> memories_mib,
               const Preference& preference, bool explain = true,
               std::span<const PlannedInstance> idle = {}) const;

  // The precomputed answer for one instance without a preference: true and `out` when the table
  // applies and the instance fits; false otherwise (then Plan gives the verdict). Allocation-free.
  bool PlanSingle(const GpuUsage& usage, uint64_t memory_mib, PlannedInstance& out) const;

  // How well a GPU with these free units serves future requests: higher is better. Compares, in
  // order: the units default-reachable profiles can still fill, the longest free run, and per
  // placement class (largest first) how many instances still fit.
  uint64_t FragmentationScore(SliceMask free) const;

  // Usage of a list of reservations, validating each against the capability (see Occupancy).
  absl::StatusOr<GpuUsage> UsageOf(const std::vector<Reservation>& reservations) const;

  // The profile index with this exact name, or -1.
  int ProfileIndex(std::string_view name) const;

  // Plans one instance by the plain search, bypassing the precomputed table (tests prove the
  // table gives identical results on every state).
  GpuPlan PlanWithoutTable(const GpuUsage& usage, uint64_t memory_mib) const;

 private:
  struct Option {
    uint32_t profile_index;
    uint8_t rank;  // position of the profile in the instance's candidate list
    Placement placement;
    SliceMask mask;
    bool idle = false;  // exactly an idle (warm) instance
  };
  struct Search;

  GpuPlanner() = default;
  // Create's steps, in order (each reads what the previous ones built).
  void ResolveAllowed(const std::vector<std::string>& allowed_names);
  void BuildClasses();
  void BuildScoreTables();
  void BuildInstanceBounds();
  void BuildSingleTable();
  uint64_t ComputeScore(SliceMask free) const;
  uint32_t Coverage(SliceMask free) const;
  // Candidate profiles (indices) covering `memory`, in default or preference order.
  void DefaultCandidates(uint64_t memory, std::vector<uint32_t>& out) const;
  void PreferredCandidates(uint64_t memory, const Preference& preference,
                           std::vector<uint32_t>& out) const;
  bool SearchJoint(const GpuUsage& usage, const std::vector<std::vector<uint32_t>>& candidates,
                   std::vector<PlannedInstance>& out,
                   std::span<const PlannedInstance> idle = {}) const;
  GpuPlan Explain(const GpuUsage& usage, std::span<const uint64_t> memories_mib,
                  const std::vector<std::vector<uint32_t>>& defaults, bool explain) const;

  // The single-instance answer for every (occupied mask, first candidate position in allowed_):
  // requests without a preference take it by lookup. Valid while no count-limited profile
  // (instance count below its number of placements, e.g. one +me per GPU) is at its limit.
  struct Single {
    uint8_t ok = 0;
    uint8_t profile_index = 0;
    uint8_t start = 0;
    uint8_t size = 0;
  };
  bool SinglePlan(SliceMask occupied, size_t first, const GpuUsage& usage,
                  PlannedInstance& out) const;
  // The table's answer for one instance without a preference; `first`: the position in allowed_
  // of the smallest profile covering the memory (set unless kNotApplicable).
  enum class SingleAnswer { kFits, kNoFit, kNoProfile, kNotApplicable };
  SingleAnswer LookupSingle(const GpuUsage& usage, uint64_t memory_mib, PlannedInstance& out,
                            size_t& first) const;
  // The verdict of a table miss (kNoFit) at `first`, as Explain gives it, allocation-free.
  Verdict SingleMissVerdict(const GpuUsage& usage, size_t first) const;
  // Explain's answer for that miss, without the candidate lists (the reason when `explain`).
  GpuPlan ExplainSingleMiss(const GpuUsage& usage, size_t first, bool explain) const;
  // Explain's text: `need` slices for `what` with `free` units free; `limited`: enough slices but
  // every candidate at its instance limit.
  std::string MissReason(SliceMask free, uint32_t need, bool limited, std::string_view what) const;
  std::vector<Single> single_table_;      // [mask * allowed_.size() + first]
  std::vector<uint32_t> count_limited_;   // allowlisted profiles with a binding count
  std::vector<uint64_t> allowed_memory_;  // sizing memory (SizingMib) of allowed_[i]
  uint32_t max_instances_ = 0;
  std::vector<Placement> by_end_;  // every allowlisted placement, by end (for MaxInstances)

  GpuCapability capability_;
  std::vector<uint32_t> allowed_;   // default order
  std::vector<bool> allowed_flag_;  // by profile index
  struct PlacementClass {
    std::vector<SliceMask> masks;
    uint32_t cap;
    bool reachable;  // some request resolves to it in the default order
  };
  std::vector<PlacementClass> classes_;  // largest first
  std::vector<uint64_t> score_table_;    // by free mask, when units <= 16
  std::vector<uint8_t> coverage_table_;  // by free mask, when units <= 16
};

// Resolves a per-instance memory request on a GPU: MiB as asked, or a percentage of the GPU's
// full-GPU profile memory (a whole-GPU request resolves to the full-GPU profile).
uint64_t ResolveMemory(uint64_t mib, uint32_t percent, const GpuCapability& cap);

}  // namespace dynmig::mig
