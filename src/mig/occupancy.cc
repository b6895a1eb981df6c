#include "mig/occupancy.h"

#include <algorithm>

#include "fmt/format.h"
#include "fmt/ranges.h"

namespace dynmig::mig {

absl::Status Occupancy::Reserve(const GpuCapability& cap, std::string_view profile,
                                Placement placement, std::string owner) {
  const ProfileSpec* spec = cap.FindProfile(profile);
  if (spec == nullptr) {
    return absl::InvalidArgumentError(
        fmt::format("{} has no MIG profile \"{}\"", cap.model, profile));
  }
  if (!spec->IsLegal(placement)) {
    std::vector<std::string> legal;
    for (const auto& p : spec->placements) legal.push_back(std::to_string(p.start));
    return absl::InvalidArgumentError(
        fmt::format("{} at start {} (size {}) is not a legal placement on {}; legal starts: {}",
                    profile, placement.start, placement.size, cap.model, fmt::join(legal, ",")));
  }
  for (const auto& r : reservations_) {
    if (r.placement.Overlaps(placement)) {
      return absl::AlreadyExistsError(fmt::format(
          "{} at slices {} overlaps {} at slices {}{}", profile, placement.ToString(), r.profile,
          r.placement.ToString(), r.owner.empty() ? "" : " held by " + r.owner));
    }
  }
  const auto count = std::count_if(reservations_.begin(), reservations_.end(),
                                   [&](const Reservation& r) { return r.profile == profile; });
  if (static_cast<uint32_t>(count) >= spec->instance_count) {
    return absl::ResourceExhaustedError(
        fmt::format("{} allows at most {} instance(s) of {} per GPU", cap.model,
                    spec->instance_count, profile));
  }
  reservations_.push_back({std::string(profile), placement, std::move(owner)});
  mask_ |= placement.Mask();
  return absl::OkStatus();
}

bool Occupancy::Release(Placement placement) {
  auto it = std::find_if(reservations_.begin(), reservations_.end(),
                         [&](const Reservation& r) { return r.placement == placement; });
  if (it == reservations_.end()) return false;
  reservations_.erase(it);
  mask_ = 0;
  for (const auto& r : reservations_) mask_ |= r.placement.Mask();
  return true;
}

GpuUsage Occupancy::Usage(const GpuCapability& cap) const {
  GpuUsage usage;
  usage.occupied = mask_;
  for (const auto& r : reservations_) {
    for (size_t i = 0; i < cap.profiles.size() && i < kMaxProfilesPerGpu; ++i) {
      if (cap.profiles[i].name == r.profile) {
        ++usage.counts[i];
        break;
      }
    }
  }
  return usage;
}

}  // namespace dynmig::mig
