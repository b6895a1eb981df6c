// A seeded synthetic workload for `dynmig simulate --generate SPEC`.
//
// SPEC: comma-separated key=value pairs (docs/simulate.md):
//   pods=5000                       number of GPU pods
//   mix=1g:0.5/2g:0.2/3g:0.2/7g:0.1 request mix: slice class or exact profile name on the first
//                                   GPU model of the cluster, optional "xN" for N instances
//                                   (7gx8:0.01), and a weight; a class asks for the memory of its
//                                   smallest allowlisted profile
//   arrival=poisson|daily|burst     Poisson; Poisson with a daily cycle (peak/mean 1.69, as in the
//                                   Alibaba trace); Poisson batches of `burst` pods
//   rate=0.5                        arrivals per second; default: from load
//   load=1.0                        offered load: asked slice-time over cluster capacity
//   life=lognormal:6.3,1.9          lifetime in seconds: lognormal:mu,sigma (heavy-tailed; the
//                                   default fits the trace's p50 545 s and p90 6,255 s) or fixed:S
//   burst=50                        batch size for arrival=burst
//   optin=0, optout=0               shares of pods that opt in to / out of the defragmenter's
//                                   moves (drawn from a stream of their own)
// Deterministic for a given (SPEC, seed, cluster) on every platform.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "sim/cluster.h"
#include "sim/trace.h"

namespace dynmig::sim {

absl::StatusOr<Trace> GenerateTrace(std::string_view spec, uint64_t seed, const Cluster& cluster);

}  // namespace dynmig::sim
