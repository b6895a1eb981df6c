// The slices of departed pods (scheduler/tombstones.h): kept occupied until the node's device
// plugin reports after the departure, or its held slices name them, or the report timeout; bounded
// per node; and in ClusterState, a pod is not placed into them meanwhile.
#include "scheduler/tombstones.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/clock.h"
#include "fmt/format.h"
#include "mig/catalogue.h"
#include "protocol/annotations.h"
#include "protocol/held_slices.h"
#include "protocol/mig_allocations.h"
#include "protocol/node_register.h"
#include "scheduler/cluster_state.h"

namespace dynmig::scheduler {
namespace {

using nlohmann::json;

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);

protocol::MigAllocation Realized(const std::string& gpu, const std::string& profile, uint32_t start,
                                 uint32_t size) {
  protocol::MigAllocation a;
  a.gpu_uuid = gpu;
  a.profile = profile;
  a.placement = {start, size};
  a.runtime = protocol::RuntimeIdentity{fmt::format("MIG-{}-{}", gpu, start), start + 1, 0};
  return a;
}

TEST(Tombstones, OnlyRealizedSlicesAreKeptUntilALaterReport) {
  Tombstones t(absl::Minutes(3));
  protocol::MigAllocation planned = Realized("GPU-0", "1g.5gb", 6, 1);
  planned.runtime.reset();  // reserved, never created: nothing to wait for
  t.Bury("node-a", "default/p", {Realized("GPU-0", "3g.20gb", 0, 4), planned}, kT0);
  auto alive = t.Alive("node-a", kT0);
  ASSERT_EQ(alive.size(), 1u);
  EXPECT_EQ(alive[0].placement, (mig::Placement{0, 4}));
  EXPECT_EQ(alive[0].pod, "default/p");
  EXPECT_TRUE(t.Alive("node-b", kT0).empty());
  // A report made before the departure (or at the same instant) does not end it.
  EXPECT_FALSE(t.Reported("node-a", kT0 - absl::Seconds(5), {}, kT0 + absl::Seconds(1)));
  EXPECT_FALSE(t.Reported("node-a", kT0, {}, kT0 + absl::Seconds(1)));
  EXPECT_FALSE(t.Reported("node-a", std::nullopt, {}, kT0 + absl::Seconds(1)));
  EXPECT_EQ(t.size(), 1u);
  // A report after it does.
  EXPECT_TRUE(t.Reported("node-a", kT0 + absl::Seconds(1), {}, kT0 + absl::Seconds(2)));
  EXPECT_EQ(t.size(), 0u);
  // A pod with nothing realized leaves nothing.
  t.Bury("node-a", "default/q", {planned}, kT0);
  EXPECT_EQ(t.size(), 0u);
}

TEST(Tombstones, HeldSlicesCoveringThemEndThem) {
  Tombstones t(absl::Minutes(3));
  t.Bury("node-a", "default/p",
         {Realized("GPU-0", "3g.20gb", 0, 4), Realized("GPU-0", "1g.5gb", 4, 1)}, kT0);
  // Held slices elsewhere (another GPU, other slices, part of them only) do not.
  std::vector<protocol::HeldSlices> held = {
      {"GPU-1", {0, 4}, "3g.20gb", ""}, {"GPU-0", {5, 1}, "1g.5gb", ""}, {"GPU-0", {0, 2}, "", ""}};
  EXPECT_FALSE(t.Reported("node-a", std::nullopt, held, kT0));
  held.push_back({"GPU-0", {0, 4}, "3g.20gb", "IN_USE"});
  EXPECT_TRUE(t.Reported("node-a", std::nullopt, held, kT0));
  auto alive = t.Alive("node-a", kT0);
  ASSERT_EQ(alive.size(), 1u);
  EXPECT_EQ(alive[0].placement, (mig::Placement{4, 1}));
}

TEST(Tombstones, ExpireAfterTheTtlAndWithTheirNode) {
  Tombstones t(absl::Minutes(3));
  t.Bury("node-a", "default/p", {Realized("GPU-0", "3g.20gb", 0, 4)}, kT0);
  t.Bury("node-a", "default/q", {Realized("GPU-0", "3g.20gb", 4, 4)}, kT0 + absl::Minutes(1));
  EXPECT_EQ(t.NextExpiry("node-a", kT0), kT0 + absl::Minutes(3));
  EXPECT_EQ(t.Alive("node-a", kT0 + absl::Minutes(3)).size(), 1u);
  EXPECT_EQ(t.NextExpiry("node-a", kT0 + absl::Minutes(3)), kT0 + absl::Minutes(4));
  EXPECT_TRUE(t.Alive("node-a", kT0 + absl::Minutes(4)).empty());
  EXPECT_EQ(t.NextExpiry("node-a", kT0 + absl::Minutes(4)), absl::InfiniteFuture());
  t.ForgetNode("node-a");
  EXPECT_EQ(t.size(), 0u);
  // Without a TTL (no clock in ClusterState) nothing is kept.
  Tombstones off(absl::ZeroDuration());
  off.Bury("node-a", "default/p", {Realized("GPU-0", "3g.20gb", 0, 4)}, kT0);
  EXPECT_EQ(off.size(), 0u);
}

// Attack: a tenant deleting and recreating pods in a loop. One entry per GPU and placement (the
// later departure replaces the earlier), at most kMaxPerNode per node, the oldest dropped first;
// placements beyond the widest axis are ignored.
TEST(Tombstones, BoundedWhateverTheDeletions) {
  Tombstones t(absl::Minutes(3));
  for (int i = 0; i < 10'000; ++i) {
    t.Bury("node-a", fmt::format("ns/p{}", i), {Realized("GPU-0", "1g.5gb", i % 7, 1)},
           kT0 + absl::Milliseconds(i));
  }
  EXPECT_EQ(t.size(), 7u);
  for (const auto& e : t.Alive("node-a", kT0)) {
    EXPECT_GE(e.gone_at, kT0 + absl::Milliseconds(10'000 - 7)) << e.pod;  // the latest ones
  }
  for (int i = 0; i < 1'000; ++i) {
    t.Bury("node-a", fmt::format("ns/q{}", i), {Realized(fmt::format("GPU-{}", i), "1g.5gb", 0, 1)},
           kT0 + absl::Seconds(20 + i));
  }
  EXPECT_EQ(t.size(), Tombstones::kMaxPerNode);
  const auto alive = t.Alive("node-a", kT0 + absl::Seconds(20));
  EXPECT_EQ(alive.front().pod, fmt::format("ns/q{}", 1'000 - Tombstones::kMaxPerNode));
  Tombstones wide(absl::Minutes(3));
  wide.Bury("node-a", "ns/w", {Realized("GPU-0", "1g.5gb", mig::kMaxPlacementUnits, 1)}, kT0);
  EXPECT_EQ(wide.size(), 0u);
}

// In the scheduler's state: the evicted (deleted) pod's slices are not given to the waiting pod
// until the node's device plugin has reported after the deletion.
class DepartedSlicesTest : public ::testing::Test {
 protected:
  DepartedSlicesTest() : state_({Allowlist(), {}, absl::Minutes(3)}, &clock_) {}

  static mig::Allowlist Allowlist() {
    mig::Allowlist a;
    a.entries.push_back({{"A100-SXM4-40GB"}, {"1g.5gb", "3g.20gb", "7g.40gb"}});
    return a;
  }
  static json Node(const std::string& handshake, const std::string& held = "") {
    const auto& cap = (*mig::FindModel("A100-SXM4-40GB"))->capability;
    std::vector<const mig::ProfileSpec*> all;
    for (const auto& p : cap.profiles) {
      if (p.name.find_first_of("+-") == std::string::npos) all.push_back(&p);
    }
    json n = {{"metadata", {{"name", "node-a"}, {"annotations", json::object()}}}};
    auto& ann = n["metadata"]["annotations"];
    ann[std::string(protocol::kNodeRegisterAnnotation)] =
        protocol::EncodeNodeRegister({protocol::MigDeviceInfo({"GPU-0", 0, 0, true}, cap, all)});
    ann[std::string(protocol::kNodeHandshakeAnnotation)] = handshake;
    if (!held.empty()) ann[std::string(protocol::kNodeHeldSlicesAnnotation)] = held;
    return n;
  }
  static std::string Reported(absl::Time t) {
    return "Reported_" + absl::FormatTime(absl::RFC3339_full, t, absl::UTCTimeZone());
  }
  static json Pod(const std::string& name, const std::vector<protocol::MigAllocation>& allocs,
                  const std::string& phase = "Running") {
    json p = {
        {"metadata", {{"name", name}, {"namespace", "default"}, {"annotations", json::object()}}},
        {"spec",
         {{"nodeName", "node-a"},
          {"containers",
           json::array(
               {{{"name", "main"},
                 {"resources",
                  {{"limits", {{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem", 39000}}}}}}})}}},
        {"status", {{"phase", phase}}}};
    p["metadata"]["annotations"][std::string(protocol::kMigAllocationsAnnotation)] =
        protocol::EncodeMigAllocations(allocs);
    return p;
  }
  // Whether a whole-GPU pod would be placed now (nothing is reserved: Forget).
  bool WholeGpuFits() {
    mig::PodRequest r;
    r.containers.push_back({"main", false, 1, {39000, 0}});
    auto d = state_.PlanAndReserve("default/big", r, {}, clock_.Now());
    EXPECT_TRUE(d.ok()) << d.status();
    const bool fits = d.ok() && d->reservation.has_value();
    state_.Forget("default/big");
    return fits;
  }

  FakeClock clock_{kT0};
  ClusterState state_;
};

TEST_F(DepartedSlicesTest, DeletedPodHoldsItsSlicesUntilTheNodeReports) {
  state_.UpsertNode(Node(Reported(kT0)));
  state_.UpsertPod(Pod("small", {Realized("GPU-0", "3g.20gb", 0, 4)}));
  EXPECT_FALSE(WholeGpuFits());
  clock_.Advance(absl::Seconds(2));
  state_.RemovePod("default", "small");
  EXPECT_FALSE(WholeGpuFits()) << "placed over an instance the device plugin may still hold";
  const auto report = state_.Report(clock_.Now());
  ASSERT_EQ(report[0].gpus[0].reservations.size(), 1u);
  EXPECT_EQ(report[0].gpus[0].reservations[0].pod,
            "(left by default/small, until the node reports)");
  // A node update with the report from before the deletion changes nothing.
  state_.UpsertNode(Node(Reported(kT0)));
  EXPECT_FALSE(WholeGpuFits());
  // The plugin reports after the deletion: free.
  clock_.Advance(absl::Seconds(1));
  state_.UpsertNode(Node(Reported(clock_.Now())));
  EXPECT_TRUE(WholeGpuFits());
}

TEST_F(DepartedSlicesTest, TerminatedPodAndHeldSlicesAndTimeout) {
  state_.UpsertNode(Node(Reported(kT0)));
  state_.UpsertPod(Pod("done", {Realized("GPU-0", "3g.20gb", 0, 4)}));
  clock_.Advance(absl::Seconds(2));
  state_.UpsertPod(Pod("done", {Realized("GPU-0", "3g.20gb", 0, 4)}, "Succeeded"));
  EXPECT_FALSE(WholeGpuFits());
  // The node publishes the instance as held (IN_USE) with a report time before the departure:
  // held from then on, the tombstone ends; the slices stay occupied.
  const std::string held = protocol::EncodeHeldSlices({{"GPU-0", {0, 4}, "3g.20gb", "IN_USE"}});
  state_.UpsertNode(Node(Reported(kT0), held));
  EXPECT_FALSE(WholeGpuFits());
  state_.UpsertNode(Node(Reported(kT0)));  // destroyed: no longer held
  EXPECT_TRUE(WholeGpuFits());
  // A node that never reports again: the tombstone ends with the report timeout, when the node
  // is unhealthy anyway.
  state_.UpsertPod(Pod("again", {Realized("GPU-0", "7g.40gb", 0, 8)}));
  state_.RemovePod("default", "again");
  clock_.Advance(absl::Seconds(30));
  EXPECT_FALSE(WholeGpuFits());
  auto view = state_.View("node-a", kT0 + absl::Minutes(3) + absl::Seconds(2));
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->gpus[0].usage.occupied, 0u) << "the tombstone outlived the report timeout";
}

// A pod that was only reserved (no runtime identity: nothing created) frees its slices at once;
// so does every departure in a state without a clock (one made for an analysis).
TEST_F(DepartedSlicesTest, UnrealizedOrNoClockFreesAtOnce) {
  state_.UpsertNode(Node(Reported(kT0)));
  protocol::MigAllocation planned = Realized("GPU-0", "3g.20gb", 0, 4);
  planned.runtime.reset();
  state_.UpsertPod(Pod("planned", {planned}));
  EXPECT_FALSE(WholeGpuFits());
  state_.RemovePod("default", "planned");
  EXPECT_TRUE(WholeGpuFits());
  ClusterState analysis({Allowlist(), {}, absl::Minutes(3)});
  analysis.UpsertNode(Node(Reported(kT0)));
  analysis.UpsertPod(Pod("small", {Realized("GPU-0", "3g.20gb", 0, 4)}));
  analysis.RemovePod("default", "small");
  auto view = analysis.View("node-a", kT0);
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->gpus[0].usage.occupied, 0u);
}

}  // namespace
}  // namespace dynmig::scheduler
