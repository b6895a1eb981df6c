// NodeState (node_state.h): the managed-instance bookkeeping under the node lock, on plain values.
#include "deviceplugin/node_state.h"

#include <gtest/gtest.h>

namespace dynmig::deviceplugin {
namespace {

ManagedInstance Instance(std::string gpu, uint32_t start, uint32_t size, uint32_t gi) {
  ManagedInstance m;
  m.gpu_uuid = std::move(gpu);
  m.profile = size == 1 ? "1g.5gb" : "2g.10gb";
  m.placement = mig::Placement{start, size};
  m.gpu_instance_id = gi;
  return m;
}

TEST(NodeStateTest, ManageReplacesTheRecordOfTheSameGiOrAnOverlappingPlacement) {
  NodeState ns;
  dynmig::MutexLock lock(&ns.mu);
  ns.Manage(Instance("GPU-a", 0, 1, 7));
  ns.Manage(Instance("GPU-a", 2, 2, 4));
  ns.Manage(Instance("GPU-b", 0, 1, 7));  // another GPU: kept
  ASSERT_EQ(ns.state.instances.size(), 3u);
  ns.Manage(Instance("GPU-a", 3, 1, 9));  // overlaps GI 4's slices 2-3
  ASSERT_EQ(ns.state.instances.size(), 3u);
  EXPECT_EQ(ns.FindManagedGi("GPU-a", 4), nullptr);
  ASSERT_NE(ns.FindManaged("GPU-a", mig::Placement{3, 1}), nullptr);
  EXPECT_EQ(ns.FindManaged("GPU-a", mig::Placement{3, 1})->gpu_instance_id, 9u);
  ns.Manage(Instance("GPU-a", 5, 1, 7));  // same GI as slices 0: replaced
  EXPECT_EQ(ns.FindManaged("GPU-a", mig::Placement{0, 1}), nullptr);
  ASSERT_NE(ns.FindManagedGi("GPU-a", 7), nullptr);
  EXPECT_EQ(ns.FindManagedGi("GPU-a", 7)->placement, (mig::Placement{5, 1}));
  ns.RemoveManaged("GPU-a", 7);
  EXPECT_EQ(ns.FindManagedGi("GPU-a", 7), nullptr);
  EXPECT_NE(ns.FindManagedGi("GPU-b", 7), nullptr);
}

TEST(NodeStateTest, HeldJoinsEndedAndUntrackedAndIdleListsOnlyIdleInstances) {
  NodeState ns;
  dynmig::MutexLock lock(&ns.mu);
  ns.ended_held = {{"GPU-a", mig::Placement{0, 1}, "1g.5gb", "ended"}};
  ns.untracked_held = {{"GPU-b", mig::Placement{2, 2}, "", "untracked"}};
  auto held = ns.Held();
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(held[0].reason, "ended");
  EXPECT_EQ(held[1].reason, "untracked");
  auto idle = Instance("GPU-a", 6, 1, 13);
  idle.idle = true;
  idle.idle_since = 42;
  ns.Manage(Instance("GPU-a", 0, 1, 7));
  ns.Manage(idle);
  auto listed = ns.Idle();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].gpu_uuid, "GPU-a");
  EXPECT_EQ(listed[0].placement, (mig::Placement{6, 1}));
  EXPECT_EQ(listed[0].idle_since, 42);
}

// Managed legacy instances are held from the managed instances themselves, so also right after a
// restart, before any cycle has attributed them again (a chaos seed under TSan caught a
// reservation overlapping them when only the cycle's list was published); a cycle adds the
// instances whose holders it could not confirm and the unproven untracked ones.
TEST(NodeStateTest, LegacyInstancesAreHeldFromTheStateAndTheCycle) {
  NodeState ns;
  dynmig::MutexLock lock(&ns.mu);
  auto legacy = Instance("GPU-a", 4, 1, 9);
  legacy.origin = std::string(kOriginLegacy);
  legacy.mig_uuid = "MIG-x";
  legacy.owner.ns = "default";
  legacy.owner.name = "legacy-0";
  legacy.holders = {{"uid-0", "default", "legacy-0", "main", "nvidia.com/mig-1g.5gb", "MIG-x",
                     std::string(kHolderSourcePodResources)}};
  ns.Manage(legacy);
  ns.Manage(Instance("GPU-a", 0, 1, 7));  // dynmig's own: its reservation names it, not held
  auto ended_legacy = Instance("GPU-a", 6, 1, 13);
  ended_legacy.origin = std::string(kOriginLegacy);
  ended_legacy.idle = true;  // kept warm: no longer held, offered as idle
  ns.Manage(ended_legacy);
  auto held = ns.Held();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].gpu_uuid, "GPU-a");
  EXPECT_EQ(held[0].placement, (mig::Placement{4, 1}));
  EXPECT_EQ(held[0].reason,
            "legacy instance of default/legacy-0 (container main, nvidia.com/mig-1g.5gb)");

  ns.legacy.unconfirmed[{"GPU-a", 9}] = "PodResources cannot be read";
  LegacyState::Untracked unproven;
  unproven.attribution.kind = AttributionKind::kUnproven;
  unproven.placement = mig::Placement{2, 2};
  unproven.profile = "2g.10gb";
  unproven.held_reason = "unproven: GI 3";
  ns.legacy.untracked[{"GPU-b", 3}] = unproven;
  LegacyState::Untracked free;
  free.attribution.kind = AttributionKind::kFree;
  free.placement = mig::Placement{5, 1};
  ns.legacy.untracked[{"GPU-b", 5}] = free;  // free: the untracked rule decides, not held here
  held = ns.Held();
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(held[0].reason,
            "legacy instance MIG-x of default/legacy-0: its holders cannot be confirmed "
            "(PodResources cannot be read); kept");
  EXPECT_EQ(held[1].gpu_uuid, "GPU-b");
  EXPECT_EQ(held[1].placement, (mig::Placement{2, 2}));
  EXPECT_EQ(held[1].reason, "unproven: GI 3");
}

}  // namespace
}  // namespace dynmig::deviceplugin
