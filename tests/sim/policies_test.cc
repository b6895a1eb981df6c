#include "sim/policies.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "mig/occupancy.h"
#include "sim_test_util.h"

namespace dynmig::sim {
namespace {

using testing::A100;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::k1g10;
using testing::k1g5;
using testing::k3g20;
using testing::kWhole;
using testing::MakePods;
using testing::P;

std::unique_ptr<Policy> Make(const std::string& name, const Cluster& c,
                             const std::vector<SimPod>& pods) {
  auto p = MakePolicy(name, c, pods);
  EXPECT_TRUE(p.ok()) << p.status();
  return std::move(*p);
}

// Independent check of a policy's live instances with mig::Occupancy (legal placement, no
// overlap, instance limits), per GPU.
void ExpectLegal(const Policy& policy, const Cluster& c) {
  std::map<uint32_t, mig::Occupancy> gpus;
  for (const auto& in : policy.Snapshot()) {
    const auto& cap = c.group_of_gpu(in.gpu).cap();
    const auto status =
        gpus[in.gpu].Reserve(cap, cap.profiles[in.profile].name, in.placement, "pod");
    EXPECT_TRUE(status.ok()) << policy.name() << " GPU " << in.gpu << ": " << status;
  }
}

// Places every pod in order (no departures); returns which were accepted.
std::vector<bool> PlaceAll(Policy& policy, size_t n) {
  std::vector<bool> out;
  for (uint32_t i = 0; i < n; ++i) {
    auto r = policy.Place(i, -1);
    EXPECT_TRUE(r.ok()) << r.status();
    out.push_back(r.ok() && *r);
  }
  return out;
}

std::vector<std::string> Layout(const Policy& policy, const Cluster& c) {
  std::vector<std::string> out;
  for (const auto& in : policy.Snapshot()) {
    out.push_back(
        fmt::format("{}@{}", c.group_of_gpu(in.gpu).profile(in.profile).name, in.placement.start));
  }
  return out;
}

TEST(Policies, HamiOrderPlacesOneAndThreeGHighFirst) {
  Cluster c = A100(1);
  auto pods = MakePods(c, {{0, 9, k1g5}, {1, 9, k3g20}, {2, 9, k1g10}});
  auto hami = Make("hami-v2.10", c, pods);
  EXPECT_THAT(PlaceAll(*hami, pods.size()), ElementsAre(true, true, true));
  // 1g.5gb at the highest start (6); 3g.20gb tries 4 (taken) then 0; 1g.10gb tries 6, then 4.
  EXPECT_THAT(Layout(*hami, c), ElementsAre("1g.5gb@6", "3g.20gb@0", "1g.10gb@4"));
  auto ff = Make("first-fit", c, pods);
  EXPECT_THAT(PlaceAll(*ff, pods.size()), ElementsAre(true, true, true));
  EXPECT_THAT(Layout(*ff, c), ElementsAre("1g.5gb@0", "3g.20gb@4", "1g.10gb@2"));
}

// hami-newest (HAMi after PR #2855) scores each free placement by the largest free run it leaves,
// then the legal placements still free: the first 1g.5gb goes to slice 0 (a run of 7 left, where
// v2.10's slice 6 leaves 6), the 1g.10gb to 2-3 (slices 0-1 are not free; 2 is its only start).
TEST(Policies, HamiNewestKeepsTheLargestFreeRun) {
  Cluster c = A100(1);
  auto pods = MakePods(c, {{0, 9, k1g5}, {1, 9, k3g20}, {2, 9, k1g10}, {3, 9, k1g5}});
  auto newest = Make("hami-newest", c, pods);
  EXPECT_THAT(PlaceAll(*newest, pods.size()), ElementsAre(true, true, true, true));
  EXPECT_THAT(Layout(*newest, c), ElementsAre("1g.5gb@0", "3g.20gb@4", "1g.10gb@2", "1g.5gb@1"));
  ExpectLegal(*newest, c);
  // Ties in the largest run go to the most placements left: on an empty GPU a 3g.20gb at 4 or at
  // 0 both leave a run of 4; at 4, the 4 slices left still take a 4g.20gb (start 0 only).
  auto three = MakePods(c, {{0, 9, k3g20}});
  auto p3 = Make("hami-newest", c, three);
  EXPECT_THAT(PlaceAll(*p3, 1), ElementsAre(true));
  EXPECT_THAT(Layout(*p3, c), ElementsAre("3g.20gb@4"));
}

// hami-v2.10's order strands slice 7 (1g.5gb at 6 blocks 3g.20gb at 4), so a fourth small pod no
// longer fits; the production planner keeps the layout packable.
TEST(Policies, HamiFragmentsWhereDynmigDoesNot) {
  Cluster c = A100(1);
  auto pods = MakePods(c, {{0, 9, k1g5}, {1, 9, k3g20}, {2, 9, k1g10}, {3, 9, k1g5}});
  auto hami = Make("hami-v2.10", c, pods);
  EXPECT_THAT(PlaceAll(*hami, pods.size()), ElementsAre(true, true, true, false));
  uint64_t free = 0, stranded = 0;
  hami->Fragmentation(k1g5, free, stranded);
  EXPECT_EQ(free, 1u);
  EXPECT_EQ(stranded, 1u);  // slice 7 cannot host a 1g.5gb
  for (const char* name : {"dynmig", "first-fit", "best-fit", "repack"}) {
    auto p = Make(name, c, pods);
    EXPECT_THAT(PlaceAll(*p, pods.size()), ElementsAre(true, true, true, true)) << name;
    ExpectLegal(*p, c);
  }
}

TEST(Policies, StaticAllOneGRejectsThreeG) {
  Cluster c = A100(1);
  auto pods = MakePods(c, {{0, 9, k3g20}, {1, 9, k1g5}, {2, 9, k1g10}});
  auto one = Make("static:all-1g", c, pods);
  EXPECT_THAT(PlaceAll(*one, pods.size()), ElementsAre(false, true, false));
  auto balanced = Make("static:all-balanced", c, pods);
  // 3g.20gb instance, a 1g.5gb instance, and 2g.10gb for the 10 GB request.
  EXPECT_THAT(PlaceAll(*balanced, pods.size()), ElementsAre(true, true, true));
  EXPECT_EQ(balanced->creates(), 0u);
  ExpectLegal(*balanced, c);
  auto whole = Make("static:all-7g", c, pods);
  EXPECT_THAT(PlaceAll(*whole, pods.size()), ElementsAre(true, false, false));
  uint64_t free = 0, stranded = 0;
  one->Fragmentation(k3g20, free, stranded);
  EXPECT_EQ(free, 7u);      // six idle 1g.5gb instances + the unpartitioned slice 7
  EXPECT_EQ(stranded, 7u);  // none can host a 3g
}

TEST(Policies, StaticUpsizesIntoLargerIdleInstance) {
  Cluster c = A100(1);
  auto pods = MakePods(c, {{0, 9, k1g5}, {1, 9, k1g5}, {2, 9, k1g5}, {3, 9, k1g5}});
  auto balanced = Make("static:all-balanced", c, pods);
  // Two 1g.5gb instances, then the 2g.10gb, then the 3g.20gb.
  EXPECT_THAT(PlaceAll(*balanced, pods.size()), ElementsAre(true, true, true, true));
  EXPECT_EQ(balanced->used_units(), 8u);
}

// Four 1g.10gb fill the GPU; two leave from different halves; a 3g.20gb then needs a repack.
TEST(Policies, RepackAdmitsWhatOnlinePoliciesCannot) {
  Cluster c = A100(1);
  auto pods =
      MakePods(c, {{0, 9, k1g10}, {1, 9, k1g10}, {2, 9, k1g10}, {3, 9, k1g10}, {5, 9, k3g20}});
  for (const char* name : {"first-fit", "hami-v2.10", "best-fit", "repack"}) {
    auto p = Make(name, c, pods);
    EXPECT_THAT(PlaceAll(*p, 4), ElementsAre(true, true, true, true)) << name;
    // first-fit fills 0,2,4,6 in order, hami-v2.10 6,4,2,0: pods 0 and 2 sit in different halves.
    ASSERT_TRUE(p->Remove(0).ok());
    ASSERT_TRUE(p->Remove(2).ok());
    auto r = p->Place(4, -1);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, std::string(name) == "repack") << name;
    ExpectLegal(*p, c);
  }
  auto repack = Make("repack", c, pods);
  PlaceAll(*repack, 4);
  ASSERT_TRUE(repack->Remove(0).ok());
  ASSERT_TRUE(repack->Remove(2).ok());
  ASSERT_TRUE(*repack->Place(4, -1));
  EXPECT_EQ(repack->creates(), 4u + 1u + 1u);  // one 1g.10gb moved: destroyed and re-created
  EXPECT_EQ(repack->destroys(), 2u + 1u);
}

TEST(Policies, MultiInstancePodsStayOnOneNode) {
  Cluster c = A100(4, 2);  // two nodes of two GPUs
  auto pods = MakePods(c, {{0, 9, kWhole}, {1, 9, kWhole, 2}, {2, 9, kWhole, 2}});
  for (const auto& name : DefaultPolicies()) {
    if (name.starts_with("static:") && name != "static:all-7g") continue;
    auto p = Make(name, c, pods);
    // The first whole GPU takes one node's GPU; the 2-GPU pod needs the other node; the second
    // 2-GPU pod finds no node with two free GPUs.
    EXPECT_THAT(PlaceAll(*p, pods.size()), ElementsAre(true, true, false)) << name;
    ExpectLegal(*p, c);
    EXPECT_NE(p->NodeOf(0), p->NodeOf(1)) << name;
  }
}

TEST(Policies, OnlyNodeRestrictsPlacement) {
  Cluster c = A100(2, 1);
  auto pods = MakePods(c, {{0, 9, kWhole}, {1, 9, kWhole}});
  for (const auto& name : DefaultPolicies()) {
    auto p = Make(name, c, pods);
    auto first = p->Place(0, 1);
    ASSERT_TRUE(first.ok());
    if (name.starts_with("static:") && name != "static:all-7g") {
      EXPECT_FALSE(*first) << name;
      continue;
    }
    EXPECT_TRUE(*first) << name;
    EXPECT_EQ(p->NodeOf(0), 1u) << name;
    EXPECT_FALSE(*p->Place(1, 1)) << name;
    EXPECT_TRUE(*p->Place(1, 0)) << name;
  }
}

TEST(Policies, RemovingAnUnplacedPodIsAnInvariantError) {
  Cluster c = A100(1);
  auto pods = MakePods(c, {{0, 9, k1g5}});
  for (const auto& name : DefaultPolicies()) {
    auto p = Make(name, c, pods);
    const absl::Status s = p->Remove(0);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << name;
    EXPECT_THAT(std::string(s.message()), HasSubstr("invariant violated by policy " + name));
    EXPECT_THAT(std::string(s.message()), HasSubstr("pod at trace line"));
  }
}

TEST(Policies, Names) {
  Cluster c = A100(1);
  std::vector<SimPod> none;
  auto bad = MakePolicy("worst-fit", c, none);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("unknown policy \"worst-fit\""));
  auto opt = MakePolicy("dynmig:gpu-sideways", c, none);
  ASSERT_FALSE(opt.ok());
  EXPECT_THAT(std::string(opt.status().message()), HasSubstr("unknown option \"gpu-sideways\""));
  EXPECT_TRUE(MakePolicy("dynmig:gpu-binpack+node-spread", c, none).ok());
  EXPECT_TRUE(MakePolicy("static:all-4g", c, none).ok());
}

// Random churn on a small cluster: every policy keeps every live instance legal and disjoint.
TEST(Policies, RandomChurnNeverOverlaps) {
  Cluster c = A100(6, 3);
  std::vector<P> ps;
  testing::Lcg lcg(12345);
  auto next = [&] { return lcg.Next(); };
  const uint32_t sizes[] = {k1g5, k1g5, k1g10, k3g20, 30, kWhole, 8, 60};
  for (int i = 0; i < 400; ++i) {
    const uint32_t pct = sizes[next() % 8];
    const uint32_t count = next() % 10 == 0 ? 1 + next() % 3 : 1;
    ps.push_back({static_cast<double>(i), static_cast<double>(i + 1 + next() % 40), pct, count});
  }
  auto pods = MakePods(c, ps);
  std::vector<std::string> names = DefaultPolicies();
  names.push_back("dynmig:gpu-binpack");
  for (const auto& name : names) {
    auto p = Make(name, c, pods);
    std::vector<bool> live(pods.size(), false);
    uint64_t units = 0;
    for (uint32_t i = 0; i < pods.size(); ++i) {
      // Departures due by this arrival.
      for (uint32_t j = 0; j < i; ++j) {
        if (live[j] && pods[j].departure <= pods[i].arrival) {
          ASSERT_TRUE(p->Remove(j).ok()) << name;
          live[j] = false;
        }
      }
      auto r = p->Place(i, -1);
      ASSERT_TRUE(r.ok()) << name << ": " << r.status();
      live[i] = *r;
      if (i % 25 == 0) ExpectLegal(*p, c);
    }
    ExpectLegal(*p, c);
    for (const auto& in : p->Snapshot()) units += in.placement.size;
    EXPECT_EQ(units, p->used_units()) << name;
  }
}

}  // namespace
}  // namespace dynmig::sim
