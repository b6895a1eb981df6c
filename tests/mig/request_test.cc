#include "mig/request.h"

#include <gtest/gtest.h>

#include <functional>
#include <vector>

namespace dynmig::mig {
namespace {

PodRequest Base() {
  PodRequest r;
  r.containers.push_back({"main", false, 1, {4000, 0}});
  return r;
}

// Requests the planner treats alike share a key; every field it reads changes the key.
TEST(PlanKeyTest, ContainerNamesAreLeftOutAndEveryPlannedFieldCounts) {
  PodRequest renamed = Base();
  renamed.containers[0].name = "other";
  EXPECT_EQ(PlanKey(renamed), PlanKey(Base()));

  const std::vector<std::function<void(PodRequest&)>> changes = {
      [](PodRequest& r) { r.containers[0].init = true; },
      [](PodRequest& r) { r.containers[0].count = 2; },
      [](PodRequest& r) {
        r.containers[0].memory = {9000, 0};
      },
      [](PodRequest& r) {
        r.containers[0].memory = {0, 50};
      },
      [](PodRequest& r) {
        r.containers.push_back({"side", false, 1, {4000, 0}});
      },
      [](PodRequest& r) { r.preference.entries = {"2g"}; },
      [](PodRequest& r) { r.filter.use_uuids = {"GPU-1"}; },
      [](PodRequest& r) { r.filter.nouse_uuids = {"GPU-1"}; },
      [](PodRequest& r) { r.filter.use_types = {"A100"}; },
      [](PodRequest& r) { r.filter.nouse_types = {"A100"}; },
      [](PodRequest& r) { r.filter.vgpu_mode = "mig"; },
      [](PodRequest& r) { r.gpu_policy = GpuPolicy::kSpread; },
      [](PodRequest& r) { r.node_policy = NodePolicy::kSpread; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    PodRequest r = Base();
    changes[i](r);
    EXPECT_NE(PlanKey(r), PlanKey(Base())) << "change " << i;
  }
  // The same strings in different lists, or split differently, are different keys.
  PodRequest a = Base(), b = Base();
  a.filter.use_uuids = {"GPU-1"};
  b.filter.nouse_uuids = {"GPU-1"};
  EXPECT_NE(PlanKey(a), PlanKey(b));
  a = Base();
  b = Base();
  a.preference.entries = {"1g", "2g"};
  b.preference.entries = {"1g2g"};
  EXPECT_NE(PlanKey(a), PlanKey(b));
}

}  // namespace
}  // namespace dynmig::mig
