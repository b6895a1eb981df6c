// The optimum for `fill` mode (arrivals only, until the first rejection): the longest prefix of
// the arrivals that ANY placement could hold, bounded by a configuration LP over whole GPUs.
//
// Configurations are the maximal feasible instance multisets of the model (LayoutTable). A request
// of memory m may use any profile with at least m memory, so a prefix fits G GPUs only if some
// y >= 0 with sum(y) <= G covers, for every request size t, the requests needing >= t with
// profiles having >= t (Hall's condition on these nested sets). The LP relaxation of that covering
// problem gives an upper bound on the prefix; node boundaries are ignored (a relaxation too).
// Single-model clusters only. Pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sim/cluster.h"
#include "sim/policies.h"

namespace dynmig::sim {

struct FillBound {
  uint64_t pods = 0;         // the longest prefix the LP admits
  uint64_t units = 0;        // asked units of that prefix
  double filled = 0;         // units over cluster capacity
  uint64_t lp_gpus_all = 0;  // ceil(LP) for the whole trace: GPUs the LP says it needs
};

// Minimizes sum(y) subject to A y >= b, y >= 0 (A: rows x cols, row-major, non-negative; b >= 0)
// through the dual simplex on max b.u, A^T u <= 1. Returns +infinity when some b_i > 0 has an
// all-zero row. Exposed for tests.
double CoveringLp(const std::vector<std::vector<double>>& a, const std::vector<double>& b);

// `pods` in arrival order. Errors: kUnimplemented for clusters of more than one model.
absl::StatusOr<FillBound> ComputeFillBound(const Cluster& cluster, const std::vector<SimPod>& pods);

}  // namespace dynmig::sim
