// What is reserved on one GPU: (profile, placement) pairs.
//
// Occupancy keeps the reservations a user can read (names, placements); GpuUsage is the compact
// form the planner works on (an occupied-units mask and per-profile instance counts), cheap to
// copy for every candidate node. Pure value types; thread-compatible.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "mig/placement.h"
#include "mig/profile.h"

namespace dynmig::mig {

inline constexpr size_t kMaxProfilesPerGpu = 32;

struct Reservation {
  std::string profile;
  Placement placement;
  std::string owner;  // who holds it ("namespace/pod"), for display and explanations
};

// Compact usage of one GPU: occupied units and instances per profile (by index into the
// capability's profile list).
struct GpuUsage {
  SliceMask occupied = 0;
  std::array<uint8_t, kMaxProfilesPerGpu> counts{};
};

class Occupancy {
 public:
  // Adds a reservation after checking it against `cap`: the profile exists, the placement is one
  // of its legal placements, it overlaps no reservation, and the profile's instance count is not
  // exceeded. Errors: kInvalidArgument (unknown profile, illegal placement), kAlreadyExists
  // (overlap; the message names the reservation it overlaps), kResourceExhausted (instance count).
  absl::Status Reserve(const GpuCapability& cap, std::string_view profile, Placement placement,
                       std::string owner = "");

  // Removes the reservation at exactly this placement; false when there is none.
  bool Release(Placement placement);

  const std::vector<Reservation>& reservations() const { return reservations_; }
  SliceMask mask() const { return mask_; }
  // The compact form. REQUIRES: every reservation was added through Reserve with `cap`.
  GpuUsage Usage(const GpuCapability& cap) const;

 private:
  std::vector<Reservation> reservations_;
  SliceMask mask_ = 0;
};

}  // namespace dynmig::mig
