// Helpers shared by the core's tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "mig/catalogue.h"
#include "mig/planner.h"

namespace dynmig::mig::testing {

inline const GpuCapability& Model(const std::string& query) {
  auto m = FindModel(query);
  EXPECT_TRUE(m.ok()) << m.status();
  return (*m)->capability;
}

// A planner for a catalogued model; `allowed` empty = every profile of the model.
inline std::shared_ptr<const GpuPlanner> MakePlanner(const std::string& model,
                                                     std::vector<std::string> allowed = {}) {
  const auto& cap = Model(model);
  if (allowed.empty()) {
    for (const auto& p : cap.profiles) allowed.push_back(p.name);
  }
  auto planner = GpuPlanner::Create(cap, allowed);
  EXPECT_TRUE(planner.ok()) << planner.status();
  return *planner;
}

inline GpuUsage UsageOf(const GpuPlanner& planner,
                        const std::vector<std::pair<std::string, uint32_t>>& reservations) {
  std::vector<Reservation> rs;
  for (const auto& [name, start] : reservations) {
    const int idx = planner.ProfileIndex(name);
    EXPECT_GE(idx, 0) << name;
    rs.push_back({name, {start, planner.capability().profiles[idx].memory_slices}, ""});
  }
  auto usage = planner.UsageOf(rs);
  EXPECT_TRUE(usage.ok()) << usage.status();
  return *usage;
}

inline std::string Name(const GpuPlanner& planner, const PlannedInstance& i) {
  return planner.capability().profiles[i.profile_index].name;
}

}  // namespace dynmig::mig::testing
