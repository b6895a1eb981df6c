#include "sim/bound.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "fmt/format.h"
#include "mig/planner.h"

namespace dynmig::sim {
namespace {

constexpr double kEps = 1e-9;

// max c.x s.t. M x <= 1, x >= 0 (M: m x n). Tableau simplex with Bland's rule; the slack basis
// is feasible because the right-hand side is 1 >= 0. Returns +infinity when unbounded.
double MaximizeUnderOnes(const std::vector<std::vector<double>>& m, const std::vector<double>& c) {
  const size_t rows = m.size();
  const size_t n = c.size();
  const size_t cols = n + rows + 1;  // x, slacks, rhs
  std::vector<double> t((rows + 1) * cols, 0.0);
  auto at = [&](size_t r, size_t col) -> double& { return t[r * cols + col]; };
  for (size_t r = 0; r < rows; ++r) {
    for (size_t j = 0; j < n; ++j) at(r, j) = m[r][j];
    at(r, n + r) = 1;
    at(r, cols - 1) = 1;
  }
  for (size_t j = 0; j < n; ++j) at(rows, j) = -c[j];  // objective row: z - c.x = 0
  std::vector<size_t> basis(rows);
  for (size_t r = 0; r < rows; ++r) basis[r] = n + r;
  for (int iter = 0; iter < 100000; ++iter) {
    size_t enter = cols;
    for (size_t j = 0; j + 1 < cols; ++j) {
      if (at(rows, j) < -kEps) {
        enter = j;
        break;
      }
    }
    if (enter == cols) break;
    size_t leave = rows;
    double best = std::numeric_limits<double>::infinity();
    for (size_t r = 0; r < rows; ++r) {
      if (at(r, enter) > kEps) {
        const double ratio = at(r, cols - 1) / at(r, enter);
        if (ratio < best - kEps || (std::abs(ratio - best) <= kEps && basis[r] < basis[leave])) {
          best = ratio;
          leave = r;
        }
      }
    }
    if (leave == rows) return std::numeric_limits<double>::infinity();
    const double piv = at(leave, enter);
    for (size_t j = 0; j < cols; ++j) at(leave, j) /= piv;
    for (size_t r = 0; r <= rows; ++r) {
      if (r == leave) continue;
      const double f = at(r, enter);
      if (std::abs(f) <= 0) continue;
      for (size_t j = 0; j < cols; ++j) at(r, j) -= f * at(leave, j);
    }
    basis[leave] = enter;
  }
  return at(rows, cols - 1);
}

}  // namespace

double CoveringLp(const std::vector<std::vector<double>>& a, const std::vector<double>& b) {
  // Dual: max b.u s.t. for every column k: sum_i a[i][k] u_i <= 1, u >= 0.
  const size_t rows = a.size();
  for (size_t i = 0; i < rows; ++i) {
    if (b[i] > 0 && std::all_of(a[i].begin(), a[i].end(), [](double v) { return v <= 0; })) {
      return std::numeric_limits<double>::infinity();
    }
  }
  const size_t cols = rows == 0 ? 0 : a[0].size();
  std::vector<std::vector<double>> m(cols, std::vector<double>(rows, 0.0));
  for (size_t i = 0; i < rows; ++i) {
    for (size_t k = 0; k < cols; ++k) m[k][i] = a[i][k];
  }
  return MaximizeUnderOnes(m, b);
}

absl::StatusOr<FillBound> ComputeFillBound(const Cluster& cluster,
                                           const std::vector<SimPod>& pods) {
  if (cluster.groups.size() != 1) {
    return absl::UnimplementedError("the fill-mode bound is computed for one GPU model only");
  }
  const ModelGroup& g = cluster.groups.front();
  const auto& cap = g.cap();
  // Request sizes (thresholds), ascending.
  std::vector<uint64_t> sizes;
  std::vector<uint32_t> pod_size(pods.size(), 0);
  for (const auto& p : pods) sizes.push_back(mig::ResolveMemory(0, p.percent, cap));
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  for (size_t i = 0; i < pods.size(); ++i) {
    const uint64_t m = mig::ResolveMemory(0, pods[i].percent, cap);
    pod_size[i] =
        static_cast<uint32_t>(std::lower_bound(sizes.begin(), sizes.end(), m) - sizes.begin());
  }
  const size_t r = sizes.size();
  std::vector<std::vector<double>> a(r, std::vector<double>(g.table.maximal.size(), 0.0));
  const auto& allowed = g.planner->allowed();
  for (size_t k = 0; k < g.table.maximal.size(); ++k) {
    const auto& counts = g.table.counts[g.table.maximal[k]];
    for (size_t t = 0; t < r; ++t) {
      for (size_t l = 0; l < allowed.size(); ++l) {
        if (g.profile(allowed[l]).SizingMib() >= sizes[t]) a[t][k] += counts[l];
      }
    }
  }
  // Prefix sums of instances per size.
  auto demand = [&](size_t prefix) {
    std::vector<double> per(r, 0.0);
    for (size_t i = 0; i < prefix; ++i) per[pod_size[i]] += pods[i].count;
    for (size_t t = r; t-- > 1;) per[t - 1] += per[t];  // >= threshold
    return per;
  };
  auto gpus_needed = [&](size_t prefix) {
    const double lp = CoveringLp(a, demand(prefix));
    return std::isinf(lp) ? std::numeric_limits<uint64_t>::max()
                          : static_cast<uint64_t>(std::ceil(lp - 1e-7));
  };
  FillBound bound;
  bound.lp_gpus_all = gpus_needed(pods.size());
  size_t lo = 0, hi = pods.size();  // lo fits, find the largest
  if (bound.lp_gpus_all <= g.gpus) {
    lo = pods.size();
  } else {
    while (lo + 1 < hi) {
      const size_t mid = lo + (hi - lo) / 2;
      if (gpus_needed(mid) <= g.gpus) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
  }
  bound.pods = lo;
  for (size_t i = 0; i < lo; ++i) bound.units += pods[i].asked_units;
  bound.filled = cluster.total_units == 0
                     ? 0.0
                     : static_cast<double>(bound.units) / static_cast<double>(cluster.total_units);
  return bound;
}

}  // namespace dynmig::sim
