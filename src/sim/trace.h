// Workload traces for `dynmig simulate`: the Alibaba GPU cluster trace v2023 pod lists
// (openb_pod_list_*.csv) parsed into GPU pods with arrival and departure times.
//
// Mapping (docs/simulate.md): a pod with num_gpu N >= 1 asks for N MIG instances; gpu_milli
// 1..999 is the share of one GPU's memory each instance needs, expressed as
// nvidia.com/gpumem-percentage = ceil(gpu_milli / 10); gpu_milli 0 or 1000 is a whole GPU (100 %).
// CPU-only pods (num_gpu 0) are skipped. creation_time is the arrival, deletion_time the departure
// (empty: the pod runs to the end of the trace). Pure, except LoadTrace (reads a file).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace dynmig::sim {

inline constexpr uint32_t kMaxInstancesPerPod = 16;

// Whether the defragmenter may move a pod (the pod's opt-in / opt-out; traces have none).
enum class DefragChoice : uint8_t { kDefault, kOptIn, kOptOut };

struct TracePod {
  double arrival = 0;      // seconds
  double departure = 0;    // seconds, >= arrival
  uint32_t count = 1;      // MIG instances (nvidia.com/gpu)
  uint32_t percent = 100;  // memory per instance, percent of the GPU (1..100)
  uint32_t line = 0;       // line in the source file (1-based); 0 for generated pods
  DefragChoice defrag = DefragChoice::kDefault;
  // A whole-GPU pod: `count` whole GPUs (the trace's gpu_milli 0 or 1000, the generator's
  // `whole` share). Only the mode-switching simulation (sim/mode_sim.h) gives it GPUs outside MIG
  // mode; the placement policies run it as `count` full-GPU instances (percent 100), as before.
  bool whole = false;
};

struct Trace {
  std::string source;
  std::vector<TracePod> pods;  // GPU pods in arrival order (ties: file order)
  double start = 0;            // first arrival
  double end = 0;              // last arrival or departure: the simulation horizon
  size_t rows = 0;             // data rows read
  size_t cpu_only = 0;         // rows skipped because they ask for no GPU
  size_t never_deleted = 0;    // rows with an empty deletion_time
  // A pod list without a creation_time column (the v2023 multigpu* lists): a snapshot of pods
  // with no timing. Arrivals are the row order (0, 1, 2, ...) and every pod stays to the end;
  // only fill mode, which places pods in order until nothing fits, can use it.
  bool snapshot = false;
};

// Parses an Alibaba v2023 pod list. Columns are found by header name (name, num_gpu, gpu_milli
// are required; creation_time and deletion_time are required together unless creation_time is
// absent, which makes the list a snapshot; others are ignored). Errors name the source, the
// line and the column: "pods.csv:57: gpu_milli \"abc\" is not a number".
absl::StatusOr<Trace> ParseAlibabaCsv(std::string_view text, std::string_view source);

// Reads and parses a trace file.
absl::StatusOr<Trace> LoadTrace(const std::string& path);

// Where to look for a trace: `flag` (--trace: a file, a directory holding
// openb_pod_list_default.csv, or a short name such as "gpushare100" for
// openb_pod_list_gpushare100.csv in the default directory), else `env_dir` ($DYNMIG_TRACE_DIR),
// else ../shared/data/alibaba-gpu-v2023/ relative to each of `roots` (repository root, current
// directory).
struct TraceLookup {
  std::string flag;
  std::string env_dir;
  std::vector<std::string> roots;
};
absl::StatusOr<std::string> ResolveTracePath(const TraceLookup& lookup);

}  // namespace dynmig::sim
