#include "scheduler/cluster_state.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "common/mutex.h"
#include "fmt/format.h"
#include "mig/catalogue.h"
#include "protocol/annotations.h"
#include "protocol/device_cordon.h"
#include "protocol/held_slices.h"
#include "protocol/idle_instances.h"
#include "protocol/node_register.h"
#include "scheduler/node_lock.h"

namespace dynmig::scheduler {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

mig::Allowlist TestAllowlist() {
  mig::Allowlist a;
  a.entries.push_back({{"A100-SXM4-40GB"}, {"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"}});
  return a;
}

std::string Register(const std::vector<std::pair<std::string, std::string>>& gpus) {
  std::vector<protocol::DeviceInfo> infos;
  uint32_t index = 0;
  for (const auto& [uuid, model] : gpus) {
    const auto& cap = (*mig::FindModel(model))->capability;
    std::vector<const mig::ProfileSpec*> all;
    for (const auto& p : cap.profiles) {
      if (p.name.find_first_of("+-") == std::string::npos) all.push_back(&p);
    }
    infos.push_back(protocol::MigDeviceInfo({uuid, index++, 0, true}, cap, all));
  }
  return protocol::EncodeNodeRegister(infos);
}

json Node(const std::string& name, const std::string& reg, const std::string& handshake = "") {
  json n = {{"metadata", {{"name", name}, {"annotations", json::object()}}}};
  n["metadata"]["annotations"][std::string(protocol::kNodeRegisterAnnotation)] = reg;
  if (!handshake.empty()) {
    n["metadata"]["annotations"][std::string(protocol::kNodeHandshakeAnnotation)] = handshake;
  }
  return n;
}

json Pod(const std::string& name, const std::string& node, const std::string& allocations,
         bool with_annotation = true, const std::string& phase = "Running") {
  json p = {
      {"metadata", {{"name", name}, {"namespace", "default"}, {"annotations", json::object()}}},
      {"spec",
       {{"nodeName", node},
        {"containers",
         json::array({{{"name", "main"},
                       {"resources",
                        {{"limits", {{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem", 4000}}}}}}})}}},
      {"status", {{"phase", phase}}}};
  if (with_annotation) {
    p["metadata"]["annotations"][std::string(protocol::kMigAllocationsAnnotation)] = allocations;
  }
  return p;
}

std::string Alloc(const std::string& gpu, const std::string& profile, uint32_t start,
                  uint32_t size) {
  return fmt::format(
      R"([{{"containerIndex":0,"deviceIndex":0,"gpuUUID":"{}","profile":"{}","placement":{{"start":{},"size":{}}}}}])",
      gpu, profile, start, size);
}

mig::PodRequest Request(uint64_t mib, uint32_t count = 1) {
  mig::PodRequest r;
  r.containers.push_back({"main", false, count, {mib, 0}});
  return r;
}

class ClusterStateTest : public ::testing::Test {
 protected:
  ClusterStateTest() : state_({TestAllowlist(), {}, absl::Minutes(3)}) {}
  ClusterState state_;
};

TEST_F(ClusterStateTest, RegisteredGpusRestrictedToTheAllowlist) {
  state_.UpsertNode(
      Node("node-a", Register({{"GPU-a0", "A100-SXM4-40GB"}, {"GPU-h0", "H100 80GB"}})));
  auto view = state_.View("node-a", kNow);
  ASSERT_TRUE(view.has_value());
  ASSERT_EQ(view->gpus.size(), 2u);
  ASSERT_NE(view->gpus[0].planner, nullptr);
  EXPECT_EQ(view->gpus[0].planner->allowed().size(), 4u);
  EXPECT_EQ(view->gpus[1].planner, nullptr);  // H100 is not allowlisted here
  auto d = state_.PlanAndReserve("default/p", Request(4000), {"node-a"}, kNow);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(d->reservation.has_value());
  EXPECT_EQ(d->reservation->allocations[0].gpu_uuid, "GPU-a0");
}

// The models the nodes register, for the webhook's lists: counted per GPU, gone with the last.
TEST_F(ClusterStateTest, ModelsFollowTheRegisteredGpus) {
  EXPECT_TRUE(state_.Models().empty());
  state_.UpsertNode(
      Node("node-a", Register({{"GPU-a0", "A100-SXM4-40GB"}, {"GPU-h0", "H100 80GB"}})));
  state_.UpsertNode(Node("node-b", Register({{"GPU-b0", "A100-SXM4-40GB"}})));
  EXPECT_THAT(state_.Models(), ElementsAre("NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"));
  // node-a re-registers without its H100; then node-b goes and node-a loses its register.
  state_.UpsertNode(Node("node-a", Register({{"GPU-a0", "A100-SXM4-40GB"}})));
  EXPECT_THAT(state_.Models(), ElementsAre("NVIDIA A100-SXM4-40GB"));
  state_.RemoveNode("node-b");
  EXPECT_THAT(state_.Models(), ElementsAre("NVIDIA A100-SXM4-40GB"));
  state_.UpsertNode(Node("node-a", "not json"));
  EXPECT_TRUE(state_.Models().empty());
}

TEST_F(ClusterStateTest, ReservationsOfPodsAndAssumptionsNeverOverlap) {
  state_.UpsertNode(Node("node-a", Register({{"GPU-0", "A100-SXM4-40GB"}})));
  state_.UpsertPod(Pod("running", "node-a", Alloc("GPU-0", "3g.20gb", 4, 4)));
  auto first = state_.PlanAndReserve("default/a", Request(19000), {}, kNow);
  ASSERT_TRUE(first.ok() && first->reservation);
  EXPECT_EQ(first->reservation->allocations[0].placement, (mig::Placement{0, 4}));
  // The first reservation is assumed: the GPU is now full for a second 3g.
  auto second = state_.PlanAndReserve("default/b", Request(19000), {}, kNow);
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->reservation.has_value());
  EXPECT_EQ(second->verdict, mig::Verdict::kCapacityExhausted);
  EXPECT_NE(second->failed["node-a"].find("capacity"), std::string::npos)
      << second->failed["node-a"];
  // A second reservation for the same pod is refused.
  EXPECT_EQ(state_.PlanAndReserve("default/a", Request(4000), {}, kNow).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Forgetting frees the slices.
  state_.Forget("default/a");
  auto third = state_.PlanAndReserve("default/b", Request(19000), {}, kNow);
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(third->reservation.has_value());
}

TEST_F(ClusterStateTest, SlicesTheNodeHoldsAreNeverReserved) {
  // The device plugin holds slices 4-7 (a deleted pod's 3g whose processes still run) and 0
  // (an untracked 1g): only 2-3 stay for a 2g, and a 3g does not fit at all.
  json node = Node("node-a", Register({{"GPU-0", "A100-SXM4-40GB"}}));
  node["metadata"]["annotations"][std::string(protocol::kNodeHeldSlicesAnnotation)] =
      protocol::EncodeHeldSlices(
          {{"GPU-0", {4, 4}, "3g.20gb", "pod default/gone (deleted)"},
           {"GPU-0", {0, 1}, "", "untracked GI 7"},
           {"GPU-unknown", {0, 8}, "", "a GPU this node does not register"}});
  state_.UpsertNode(node);
  auto big = state_.PlanAndReserve("default/big", Request(19000), {}, kNow);
  ASSERT_TRUE(big.ok());
  EXPECT_FALSE(big->reservation.has_value()) << "a 3g was placed over held slices";
  auto two = state_.PlanAndReserve("default/two", Request(9000), {}, kNow);
  ASSERT_TRUE(two.ok() && two->reservation);
  EXPECT_EQ(two->reservation->allocations[0].placement, (mig::Placement{2, 2}));
  // The layout shows them.
  auto report = state_.Report(kNow);
  ASSERT_EQ(report.size(), 1u);
  int held = 0;
  for (const auto& r : report[0].gpus[0].reservations) held += r.pod == "(held by the node)";
  EXPECT_EQ(held, 2);
  // Released by the node: the 3g fits again.
  node["metadata"]["annotations"][std::string(protocol::kNodeHeldSlicesAnnotation)] = "[]";
  state_.UpsertNode(node);
  state_.Forget("default/two");
  auto again = state_.PlanAndReserve("default/big", Request(19000), {}, kNow);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->reservation.has_value());
  // An unreadable value fails the node closed.
  node["metadata"]["annotations"][std::string(protocol::kNodeHeldSlicesAnnotation)] = "{";
  state_.UpsertNode(node);
  auto closed = state_.PlanAndReserve("default/small", Request(4000), {}, kNow);
  ASSERT_TRUE(closed.ok());
  EXPECT_FALSE(closed->reservation.has_value());
  EXPECT_NE(closed->failed["node-a"].find("dynmig.io/mig-held"), std::string::npos)
      << closed->failed["node-a"];
}

TEST_F(ClusterStateTest, IdleInstancesArePreferredAmongEqualsAndStayFree) {
  // Two empty, equal nodes: the first in order wins, unless the other keeps an idle instance
  // exactly where the pod would go.
  state_.UpsertNode(Node("node-a", Register({{"GPU-a", "A100-SXM4-40GB"}})));
  state_.UpsertNode(Node("node-b", Register({{"GPU-b", "A100-SXM4-40GB"}})));
  auto first = state_.PlanAndReserve("default/probe", Request(4000), {"node-a", "node-b"}, kNow);
  ASSERT_TRUE(first.ok() && first->reservation);
  EXPECT_EQ(first->reservation->node, "node-a");
  const mig::Placement where = first->reservation->allocations[0].placement;
  state_.Forget("default/probe");

  json b = Node("node-b", Register({{"GPU-b", "A100-SXM4-40GB"}}));
  b["metadata"]["annotations"][std::string(protocol::kNodeIdleInstancesAnnotation)] =
      protocol::EncodeIdleInstances({{"GPU-b", "1g.5gb", where, 1'799'999'000}});
  state_.UpsertNode(b);
  auto warm = state_.PlanAndReserve("default/p", Request(4000), {"node-a", "node-b"}, kNow);
  ASSERT_TRUE(warm.ok() && warm->reservation);
  EXPECT_EQ(warm->reservation->node, "node-b");
  EXPECT_EQ(warm->reservation->allocations[0].placement, where);
  EXPECT_EQ(warm->reservation->allocations[0].profile, "1g.5gb");

  // Reserved now: no longer offered as idle (the next pod does not aim at it), shown until then.
  auto view = state_.View("node-b", kNow);
  ASSERT_TRUE(view.has_value());
  EXPECT_TRUE(view->gpus[0].idle.empty());
  state_.Forget("default/p");
  view = state_.View("node-b", kNow);
  ASSERT_EQ(view->gpus[0].idle.size(), 1u);
  auto report = state_.Report(kNow);
  ASSERT_EQ(report.size(), 2u);
  ASSERT_EQ(report[1].gpus[0].idle.size(), 1u);
  EXPECT_EQ(report[1].gpus[0].idle[0].profile, "1g.5gb");
  EXPECT_EQ(report[1].gpus[0].idle[0].idle_since, 1'799'999'000);

  // Idle slices are free: a 7g takes the whole GPU (the device plugin destroys the idle one).
  auto big = state_.PlanAndReserve("default/big", Request(39000), {"node-b"}, kNow);
  ASSERT_TRUE(big.ok());
  EXPECT_TRUE(big->reservation.has_value());
  state_.Forget("default/big");

  // An unreadable value is only a lost preference: the node stays schedulable.
  b["metadata"]["annotations"][std::string(protocol::kNodeIdleInstancesAnnotation)] = "{";
  state_.UpsertNode(b);
  auto plain = state_.PlanAndReserve("default/q", Request(4000), {"node-a", "node-b"}, kNow);
  ASSERT_TRUE(plain.ok() && plain->reservation);
  EXPECT_EQ(plain->reservation->node, "node-a");
}

TEST_F(ClusterStateTest, TheAnnotationTakesOverFromTheAssumption) {
  state_.UpsertNode(Node("node-a", Register({{"GPU-0", "A100-SXM4-40GB"}})));
  auto d = state_.PlanAndReserve("default/a", Request(19000), {}, kNow);
  ASSERT_TRUE(d.ok() && d->reservation);
  // The watch delivers the pod before our patch: the assumption still counts.
  state_.UpsertPod(Pod("a", "", "", false, "Pending"));
  auto view = state_.View("node-a", kNow);
  EXPECT_NE(view->gpus[0].usage.occupied, 0u);
  // Then with the annotation: it takes over, same slices.
  auto pod =
      Pod("a", "", protocol::EncodeMigAllocations(d->reservation->allocations), true, "Pending");
  pod["metadata"]["annotations"][std::string(protocol::kVgpuNodeAnnotation)] = "node-a";
  state_.UpsertPod(pod);
  EXPECT_EQ(state_.View("node-a", kNow)->gpus[0].usage.occupied,
            d->reservation->allocations[0].placement.Mask());
  // Terminated: released.
  pod["status"]["phase"] = "Succeeded";
  state_.UpsertPod(pod);
  EXPECT_EQ(state_.View("node-a", kNow)->gpus[0].usage.occupied, 0u);
}

TEST_F(ClusterStateTest, DeletedAndTerminatedPodsReleaseTerminatingPodsHold) {
  state_.UpsertNode(Node("node-a", Register({{"GPU-0", "A100-SXM4-40GB"}})));
  auto p = Pod("a", "node-a", Alloc("GPU-0", "7g.40gb", 0, 8));
  p["metadata"]["deletionTimestamp"] = "2027-01-01T00:00:00Z";
  state_.UpsertPod(p);
  EXPECT_EQ(state_.View("node-a", kNow)->gpus[0].usage.occupied, 0xFFu);
  state_.RemovePod("default", "a");
  EXPECT_EQ(state_.View("node-a", kNow)->gpus[0].usage.occupied, 0u);
  state_.UpsertPod(Pod("b", "node-a", Alloc("GPU-0", "7g.40gb", 0, 8), true, "Failed"));
  EXPECT_EQ(state_.View("node-a", kNow)->gpus[0].usage.occupied, 0u);
}

// Attack (issue 27): a tenant's bound pod asking for `nvidia.com/gpu: 0`, its vgpu-mode removed
// after binding, carries nothing dynmig wrote: it blocks no GPU, and another tenant's pod is
// placed on the node. What the user may write alone (requests, modes, selection hints) is no
// evidence.
TEST_F(ClusterStateTest, APodWithoutDynmigsAnnotationsBlocksNothing) {
  state_.UpsertNode(
      Node("node-a", Register({{"GPU-0", "A100-SXM4-40GB"}, {"GPU-1", "A100-SXM4-40GB"}})));
  json plain = Pod("plain0", "node-a", "", false);
  plain["metadata"]["namespace"] = "tenant-b";
  plain["spec"]["containers"][0]["resources"]["limits"] = {{"nvidia.com/gpu", 0}};
  state_.UpsertPod(plain);
  json hinted = Pod("hinted", "node-a", "", false);  // a MIG pod naming GPUs in user annotations
  hinted["metadata"]["annotations"][std::string(protocol::kUseGpuUuidAnnotation)] = "GPU-0";
  hinted["metadata"]["annotations"][std::string(protocol::kVgpuModeAnnotation)] = "mig";
  state_.UpsertPod(hinted);
  auto view = state_.View("node-a", kNow);
  EXPECT_TRUE(view->gpus[0].healthy) << view->gpus[0].unhealthy_reason;
  EXPECT_TRUE(view->gpus[1].healthy) << view->gpus[1].unhealthy_reason;
  auto d = state_.PlanAndReserve("tenant-a/canary", Request(4000), {"node-a"}, kNow);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(d->reservation.has_value()) << d->failed["node-a"];
  EXPECT_EQ(d->reservation->node, "node-a");
}

TEST_F(ClusterStateTest, FailClosedPerGpuOnEvidenceOnly) {
  const std::string reg = Register({{"GPU-0", "A100-SXM4-40GB"}, {"GPU-1", "A100-SXM4-40GB"}});
  state_.UpsertNode(Node("node-a", reg));
  auto expect_blocked = [&](bool gpu0, bool gpu1, const std::string& code) {
    auto view = state_.View("node-a", kNow);
    EXPECT_EQ(view->gpus[0].healthy, !gpu0) << view->gpus[0].unhealthy_reason;
    EXPECT_EQ(view->gpus[1].healthy, !gpu1) << view->gpus[1].unhealthy_reason;
    for (const auto& node : state_.Report(kNow)) {
      for (const auto& gpu : node.gpus) {
        EXPECT_EQ(gpu.unhealthy_code, gpu.healthy ? "" : code) << gpu.uuid;
      }
    }
  };
  // Devices dynmig wrote (allocated, or to allocate) without a reservation: those GPUs only.
  auto known = Pod("known", "node-a", "", false);
  known["metadata"]["annotations"][std::string(protocol::kDevicesAllocatedAnnotation)] =
      "GPU-1,NVIDIA,4864,15:;";
  state_.UpsertPod(known);
  expect_blocked(false, true, "devices-without-reservation");
  EXPECT_THAT(state_.View("node-a", kNow)->gpus[1].unhealthy_reason,
              ::testing::HasSubstr("pod default/known holds devices of this GPU without a MIG "
                                   "reservation"));
  state_.RemovePod("default", "known");
  auto to_allocate = Pod("to-allocate", "node-a", "[]");  // readable, empty
  to_allocate["metadata"]["annotations"][std::string(protocol::kDevicesToAllocateAnnotation)] =
      "GPU-0,NVIDIA,4864,15:;";
  state_.UpsertPod(to_allocate);
  expect_blocked(true, false, "devices-without-reservation");
  state_.RemovePod("default", "to-allocate");

  // An unreadable reservation whose text names GPU-0: GPU-0 only.
  state_.UpsertPod(Pod("named", "node-a", R"([{"containerIndex":0,"gpuUUID":"GPU-0"}])"));
  expect_blocked(true, false, "unreadable-reservation");
  state_.RemovePod("default", "named");
  // An unreadable device annotation naming GPU-1: GPU-1 only.
  auto bad_devices = Pod("bad-devices", "node-a", "", false);
  bad_devices["metadata"]["annotations"][std::string(protocol::kDevicesAllocatedAnnotation)] =
      "GPU-1,NVIDIA,notanumber";
  state_.UpsertPod(bad_devices);
  expect_blocked(false, true, "unreadable-reservation");
  state_.RemovePod("default", "bad-devices");

  // An unreadable reservation naming none of the node's GPUs: only dynmig writes it, so
  // something is reserved here and nothing says where: the whole node.
  state_.UpsertPod(Pod("garbled", "node-a", R"([{"containerIndex":0}])"));
  expect_blocked(true, true, "unreadable-reservation");
  auto view = state_.View("node-a", kNow);
  EXPECT_THAT(view->gpus[0].unhealthy_reason,
              ::testing::HasSubstr("naming none of this node's GPUs"));
  auto d = state_.PlanAndReserve("default/x", Request(4000), {}, kNow);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->reservation.has_value());
  EXPECT_EQ(d->verdict, mig::Verdict::kGpuUnhealthy);
  state_.RemovePod("default", "garbled");
  expect_blocked(false, false, "");
}

TEST_F(ClusterStateTest, FailClosedOnUnknownOrConflictingReservations) {
  const std::string reg = Register({{"GPU-0", "A100-SXM4-40GB"}, {"GPU-1", "A100-SXM4-40GB"}});
  state_.UpsertNode(Node("node-a", reg));
  std::optional<mig::NodeView> view;

  // Unknown GPU.
  state_.UpsertPod(Pod("stray", "node-a", Alloc("GPU-9", "1g.5gb", 0, 1)));
  view = state_.View("node-a", kNow);
  EXPECT_FALSE(view->gpus[0].healthy);
  EXPECT_NE(view->gpus[1].unhealthy_reason.find("GPU-9"), std::string::npos);
  state_.RemovePod("default", "stray");

  // Two pods claiming overlapping slices.
  state_.UpsertPod(Pod("one", "node-a", Alloc("GPU-0", "3g.20gb", 0, 4)));
  state_.UpsertPod(Pod("two", "node-a", Alloc("GPU-0", "2g.10gb", 2, 2)));
  view = state_.View("node-a", kNow);
  EXPECT_FALSE(view->gpus[0].healthy);
  EXPECT_NE(view->gpus[0].unhealthy_reason.find("overlaps"), std::string::npos)
      << view->gpus[0].unhealthy_reason;
  EXPECT_TRUE(view->gpus[1].healthy);
  state_.RemovePod("default", "two");
  EXPECT_TRUE(state_.View("node-a", kNow)->gpus[0].healthy);
}

TEST_F(ClusterStateTest, NodesWhosePluginStoppedReportingDropOut) {
  const std::string reg = Register({{"GPU-0", "A100-SXM4-40GB"}});
  state_.UpsertNode(Node(
      "fresh", reg,
      "Reported_" +
          absl::FormatTime(absl::RFC3339_full, kNow - absl::Seconds(30), absl::UTCTimeZone())));
  state_.UpsertNode(Node("stale", reg, "Reported_2020-01-01 00:00:00"));
  state_.UpsertNode(Node("gone", reg, "Deleted"));
  state_.UpsertNode(Node("broken", "not json"));
  EXPECT_TRUE(state_.View("fresh", kNow)->healthy);
  EXPECT_FALSE(state_.View("stale", kNow)->healthy);
  EXPECT_NE(state_.View("stale", kNow)->unhealthy_reason.find("stopped reporting"),
            std::string::npos);
  EXPECT_FALSE(state_.View("gone", kNow)->healthy);
  EXPECT_FALSE(state_.View("broken", kNow)->healthy);
  auto d = state_.PlanAndReserve("default/p", Request(4000), {"stale", "gone", "broken", "nosuch"},
                                 kNow);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->reservation.has_value());
  EXPECT_EQ(d->failed.size(), 4u);
  EXPECT_NE(d->failed["nosuch"].find("no-mig-gpu"), std::string::npos);
  EXPECT_NE(d->failed["broken"].find("node-unhealthy"), std::string::npos) << d->failed["broken"];
}

// The same candidate list filter after filter (resolved once, then reused) stays right when
// nodes appear, disappear and come back between the filters.
TEST_F(ClusterStateTest, RepeatedCandidateListsFollowNodesAddedAndRemoved) {
  const std::string reg = Register({{"GPU-0", "A100-SXM4-40GB"}});
  const std::vector<std::string> candidates = {"node-b", "node-a", "node-c"};
  state_.UpsertNode(Node("node-a", reg));
  int pods = 0;
  auto plan = [&] {
    auto d =
        state_.PlanAndReserve(fmt::format("default/p{}", pods++), Request(39000), candidates, kNow);
    EXPECT_TRUE(d.ok());
    return d.ok() ? *d : FilterDecision{};
  };
  auto first = plan();
  ASSERT_TRUE(first.reservation.has_value());
  EXPECT_EQ(first.reservation->node, "node-a");
  EXPECT_NE(first.failed["node-b"].find("no-mig-gpu"), std::string::npos);
  // node-a is full now; node-b appears.
  state_.UpsertNode(Node("node-b", reg));
  auto second = plan();
  ASSERT_TRUE(second.reservation.has_value());
  EXPECT_EQ(second.reservation->node, "node-b");
  EXPECT_NE(second.failed["node-c"].find("no-mig-gpu"), std::string::npos);
  // node-c appears, node-a goes away (its reservation with it).
  state_.UpsertNode(Node("node-c", reg));
  state_.RemoveNode("node-a");
  auto third = plan();
  ASSERT_TRUE(third.reservation.has_value());
  EXPECT_EQ(third.reservation->node, "node-c");
  EXPECT_NE(third.failed["node-a"].find("no-mig-gpu"), std::string::npos);
  // node-b is full, which may change: no entry when another node was chosen.
  EXPECT_EQ(third.failed.count("node-b"), 0u) << third.failed["node-b"];
  // node-a is back (its assumption counts again until forgotten).
  state_.UpsertNode(Node("node-a", reg));
  EXPECT_FALSE(plan().reservation.has_value());
  state_.Forget("default/p0");
  auto fourth = plan();
  ASSERT_TRUE(fourth.reservation.has_value());
  EXPECT_EQ(fourth.reservation->node, "node-a");
  // Another list, then the first one again.
  auto other = state_.PlanAndReserve("default/q", Request(4000), {"node-c"}, kNow);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->reservation.has_value());
  auto fifth = plan();
  EXPECT_FALSE(fifth.reservation.has_value());
  EXPECT_EQ(fifth.failed.size(), 3u);
}

TEST_F(ClusterStateTest, CordonedGpusAreSkipped) {
  auto node = Node("node-a", Register({{"GPU-0", "A100-SXM4-40GB"}, {"GPU-1", "A100-SXM4-40GB"}}));
  node["metadata"]["annotations"][std::string(protocol::kDeviceCordonAnnotation)] = "GPU-0";
  state_.UpsertNode(node);
  auto d = state_.PlanAndReserve("default/p", Request(4000), {}, kNow);
  ASSERT_TRUE(d.ok() && d->reservation);
  EXPECT_EQ(d->reservation->allocations[0].gpu_uuid, "GPU-1");
}

TEST_F(ClusterStateTest, CordonReasonsAreShownAndAnUnreadableCordonCordonsEveryGpu) {
  auto node = Node("node-a", Register({{"GPU-0", "A100-SXM4-40GB"}, {"GPU-1", "A100-SXM4-40GB"}}));
  auto& ann = node["metadata"]["annotations"];
  ann[std::string(protocol::kDeviceCordonAnnotation)] = " GPU-0 ,GPU-unknown";
  ann[std::string(protocol::kDeviceCordonReasonsAnnotation)] =
      R"j({"GPU-0":"bad ECC (by alice)"})j";
  state_.UpsertNode(node);
  auto view = state_.View("node-a", kNow);
  ASSERT_TRUE(view.has_value());
  EXPECT_FALSE(view->gpus[0].healthy);
  EXPECT_EQ(view->gpus[0].unhealthy_reason, "cordoned (hami.io/device-cordon): bad ECC (by alice)");
  EXPECT_TRUE(view->gpus[1].healthy) << "a UUID the node lacks cordons nothing else";
  // A value the codec refuses: fail closed, every GPU of the node takes no new reservation.
  ann[std::string(protocol::kDeviceCordonAnnotation)] = "GPU-0,GPU 1";
  state_.UpsertNode(node);
  view = state_.View("node-a", kNow);
  for (const auto& g : view->gpus) {
    EXPECT_FALSE(g.healthy);
    EXPECT_NE(g.unhealthy_reason.find("unreadable hami.io/device-cordon"), std::string::npos)
        << g.unhealthy_reason;
  }
  auto d = state_.PlanAndReserve("default/p", Request(4000), {}, kNow);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->reservation.has_value());
  // Uncordoned: schedulable again.
  ann.erase(std::string(protocol::kDeviceCordonAnnotation));
  state_.UpsertNode(node);
  d = state_.PlanAndReserve("default/p", Request(4000), {}, kNow);
  ASSERT_TRUE(d.ok() && d->reservation);
}

TEST_F(ClusterStateTest, ReservationCarriesAllocationsDevicesAndSummary) {
  state_.UpsertNode(Node("node-a", Register({{"GPU-0", "A100-SXM4-40GB"}})));
  mig::PodRequest r;
  r.containers.push_back({"init", true, 1, {4000, 0}});
  r.containers.push_back({"sidecar", false, 0, {}});
  r.containers.push_back({"main", false, 2, {9000, 0}});
  auto d = state_.PlanAndReserve("default/p", r, {}, kNow);
  ASSERT_TRUE(d.ok() && d->reservation);
  const auto& res = *d->reservation;
  ASSERT_EQ(res.allocations.size(), 3u);
  EXPECT_EQ(res.allocations[0].container_index, 0);
  EXPECT_EQ(res.allocations[1].container_index, 2);
  EXPECT_EQ(res.allocations[2].device_index, 1);
  ASSERT_EQ(res.devices.size(), 3u);
  EXPECT_EQ(res.devices[0].size(), 1u);
  EXPECT_TRUE(res.devices[1].empty());
  EXPECT_EQ(res.devices[2].size(), 2u);
  EXPECT_EQ(res.devices[2][0].used_mem_mib, 9856);
  EXPECT_NE(res.summary.find("2g.10gb"), std::string::npos);
  EXPECT_NE(res.summary.find("node-a"), std::string::npos);
}

TEST_F(ClusterStateTest, UnrealizedReservationsExpire) {
  state_.UpsertNode(Node("node-a", Register({{"GPU-0", "A100-SXM4-40GB"}})));
  auto old = Pod("old", "", Alloc("GPU-0", "1g.5gb", 0, 1), true, "Pending");
  old["metadata"]["annotations"][std::string(protocol::kVgpuNodeAnnotation)] = "node-a";
  old["metadata"]["annotations"][std::string(protocol::kVgpuTimeAnnotation)] = "1000";
  state_.UpsertPod(old);
  auto ready = Pod(
      "ready", "node-a",
      R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-0","profile":"1g.5gb","placement":{"start":1,"size":1},"migUUID":"MIG-x","gpuInstanceID":8,"computeInstanceID":0}])");
  ready["metadata"]["annotations"][std::string(protocol::kVgpuTimeAnnotation)] = "1000";
  state_.UpsertPod(ready);
  auto expired = state_.UnrealizedBefore(absl::FromUnixSeconds(2000));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0], "default/old");
  EXPECT_TRUE(state_.UnrealizedBefore(absl::FromUnixSeconds(500)).empty());
}

TEST_F(ClusterStateTest, ConcurrentFiltersNeverReserveOverlappingSlices) {
  state_.UpsertNode(
      Node("node-a", Register({{"GPU-0", "A100-SXM4-40GB"}, {"GPU-1", "A100-SXM4-40GB"}})));
  std::vector<std::thread> threads;
  dynmig::Mutex mu;
  std::vector<protocol::MigAllocation> all;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 4; ++i) {
        auto d =
            state_.PlanAndReserve(fmt::format("default/p{}-{}", t, i), Request(4000), {}, kNow);
        if (d.ok() && d->reservation) {
          dynmig::MutexLock lock(&mu);
          for (auto& a : d->reservation->allocations) all.push_back(a);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(all.size(), 14u);  // 7 x 1g per A100-40GB
  for (size_t i = 0; i < all.size(); ++i) {
    for (size_t j = i + 1; j < all.size(); ++j) {
      if (all[i].gpu_uuid == all[j].gpu_uuid) {
        EXPECT_FALSE(all[i].placement.Overlaps(all[j].placement));
      }
    }
  }
}

// Health and bind-in-flight change with time alone (a report ages past the timeout, a node lock
// expires), and with a clock set back; a filter sees each change without any event.
TEST_F(ClusterStateTest, TimeAloneChangesHealthAndBindInFlight) {
  const std::string reg = Register({{"GPU-0", "A100-SXM4-40GB"}});
  auto reported = [&](absl::Time t) {
    return "Reported_" + absl::FormatTime(absl::RFC3339_full, t, absl::UTCTimeZone());
  };
  json a = Node("node-a", reg, reported(kNow - absl::Minutes(1)));
  a["metadata"]["annotations"][std::string(protocol::kNodeLockAnnotation)] =
      protocol::FormatNodeLock({kNow, "default", "binding", "uid-binding"});
  state_.UpsertNode(a);
  state_.UpsertNode(Node("node-b", reg, reported(kNow)));
  int n = 0;
  auto node_at = [&](absl::Time t) -> std::string {
    const std::string key = fmt::format("default/p{}", n++);
    auto d = state_.PlanAndReserve(key, Request(4000), {"node-a", "node-b"}, t);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok() || !d->reservation.has_value()) return "";
    state_.Forget(key);
    return d->reservation->node;
  };
  // The cached view follows time without any event (View reads it as a filter does).
  EXPECT_TRUE(state_.View("node-a", kNow)->bind_in_flight);
  EXPECT_TRUE(state_.View("node-a", kNow)->healthy);
  EXPECT_FALSE(state_.View("node-a", kNow + absl::Minutes(2) + absl::Seconds(1))->healthy);
  EXPECT_TRUE(state_.View("node-a", kNow + absl::Minutes(2))->healthy);  // the clock set back
  // Equal nodes: the one with a bind in flight is not the first choice.
  EXPECT_EQ(node_at(kNow), "node-b");
  EXPECT_EQ(node_at(kNow + absl::Minutes(2)), "node-b");
  // node-a's report (kNow - 1m) is older than the 3-minute timeout after kNow + 2m, and its
  // lock has not expired yet: node-b either way.
  EXPECT_EQ(node_at(kNow + absl::Minutes(2) + absl::Seconds(1)), "node-b");
  // node-b's report times out at kNow + 3m: nothing fits.
  EXPECT_EQ(node_at(kNow + absl::Minutes(3) + absl::Seconds(1)), "");
  // node-a reports again: healthy; its lock still holds until kNow + 5m.
  state_.UpsertNode(Node("node-a", reg, reported(kNow + absl::Minutes(4))));
  EXPECT_EQ(node_at(kNow + absl::Minutes(4)), "node-a");  // the event dropped the lock too
  // A lock taken again at kNow + 4m expires at kNow + 9m.
  a = Node("node-a", reg, reported(kNow + absl::Minutes(6)));
  a["metadata"]["annotations"][std::string(protocol::kNodeLockAnnotation)] =
      protocol::FormatNodeLock({kNow + absl::Minutes(4), "default", "binding", "uid-binding"});
  state_.UpsertNode(a);
  state_.UpsertNode(Node("node-b", reg, reported(kNow + absl::Minutes(6))));
  EXPECT_EQ(node_at(kNow + absl::Minutes(6)), "node-b");
  EXPECT_EQ(node_at(kNow + absl::Minutes(9)), "node-a");
  EXPECT_FALSE(state_.View("node-a", kNow + absl::Minutes(9))->bind_in_flight);
  // The clock set back: the lock holds again.
  EXPECT_TRUE(state_.View("node-a", kNow + absl::Minutes(6))->bind_in_flight);
  EXPECT_EQ(node_at(kNow + absl::Minutes(6)), "node-b");
}

// A filter reuses a node's plan for the same request shape only while the node is unchanged:
// an event on a node that was not chosen (its pod ended) is seen by the next filter.
TEST_F(ClusterStateTest, CachedPlansFollowEveryChangeOfTheNode) {
  const std::string reg = Register({{"GPU-0", "A100-SXM4-40GB"}});
  state_.UpsertNode(Node("node-a", reg));
  state_.UpsertNode(Node("node-b", reg));
  state_.UpsertPod(Pod("big", "node-a", Alloc("GPU-0", "3g.20gb", 0, 4)));
  mig::PodRequest spread = Request(4000);
  spread.node_policy = mig::NodePolicy::kSpread;
  // Spread: the emptier node-b; node-a's plan (half full) is cached.
  auto first = state_.PlanAndReserve("default/p1", spread, {"node-a", "node-b"}, kNow);
  ASSERT_TRUE(first.ok() && first->reservation.has_value());
  EXPECT_EQ(first->reservation->node, "node-b");
  // node-a's pod ends: node-a is empty now, emptier than node-b with p1's 1g.
  state_.RemovePod("default", "big");
  auto second = state_.PlanAndReserve("default/p2", spread, {"node-a", "node-b"}, kNow);
  ASSERT_TRUE(second.ok() && second->reservation.has_value());
  EXPECT_EQ(second->reservation->node, "node-a");
  // Another shape on the same nodes is planned for itself: a 7g fits neither now (node-a
  // holds p2's 1g, node-b p1's).
  auto whole = state_.PlanAndReserve("default/p3", Request(40000), {"node-a", "node-b"}, kNow);
  ASSERT_TRUE(whole.ok());
  EXPECT_FALSE(whole->reservation.has_value());
  // p1's reservation forgotten: node-b is empty again and takes the 7g.
  state_.Forget("default/p1");
  auto again = state_.PlanAndReserve("default/p3", Request(40000), {"node-a", "node-b"}, kNow);
  ASSERT_TRUE(again.ok() && again->reservation.has_value());
  EXPECT_EQ(again->reservation->node, "node-b");
  EXPECT_EQ(again->reservation->allocations[0].profile, "7g.40gb");
}

}  // namespace
}  // namespace dynmig::scheduler

namespace dynmig::scheduler {
namespace {

json WithDefragHold(json node, const std::vector<protocol::DefragReservation>& holds) {
  node["metadata"]["annotations"][std::string(protocol::kNodeDefragReservationAnnotation)] =
      protocol::EncodeDefragReservations(holds);
  return node;
}

protocol::DefragReservation Hold(const std::string& pod, const std::string& uid = "") {
  return {"GPU-0",
          {0, 8},
          "7g.40gb",
          pod,
          uid,
          absl::ToUnixSeconds(kNow) - 10,
          absl::ToUnixSeconds(kNow) + 600,
          {"default/small"}};
}

// Slices reserved by defragmentation: nobody else gets them, the waiting pod lands there once the
// evicted pods left, and the reservation stops counting when it expires.
TEST_F(ClusterStateTest, DefragReservationHoldsSlicesForItsPodAlone) {
  const std::string reg = Register({{"GPU-0", "A100-SXM4-40GB"}});
  state_.UpsertNode(WithDefragHold(Node("node-a", reg), {Hold("default/big", "uid-big")}));
  // An evicted pod still terminating overlaps the reserved slices.
  state_.UpsertPod(Pod("small", "node-a", Alloc("GPU-0", "1g.5gb", 0, 1)));
  auto other = state_.PlanAndReserve("default/other", Request(4000), {}, kNow);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->reservation.has_value()) << other->reservation->summary;
  auto reports = state_.Report(kNow);
  ASSERT_EQ(reports[0].defrag.size(), 1u);
  EXPECT_TRUE(reports[0].defrag[0].active);
  EXPECT_TRUE(reports[0].defrag[0].blocked);
  // The waiting pod does not fit yet either (the evicted pod is still there).
  auto early = state_.PlanAndReserve("default/big", Request(39000), {}, kNow, "uid-big");
  ASSERT_TRUE(early.ok());
  EXPECT_FALSE(early->reservation.has_value());
  state_.RemovePod("default", "small");
  // Still nobody else; a pod of that name with another uid neither.
  other = state_.PlanAndReserve("default/other", Request(4000), {}, kNow);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->reservation.has_value());
  auto impostor = state_.PlanAndReserve("default/big", Request(39000), {}, kNow, "uid-new");
  ASSERT_TRUE(impostor.ok());
  EXPECT_FALSE(impostor->reservation.has_value());
  auto big = state_.PlanAndReserve("default/big", Request(39000), {}, kNow, "uid-big");
  ASSERT_TRUE(big.ok()) << big.status();
  ASSERT_TRUE(big->reservation.has_value());
  EXPECT_EQ(big->reservation->allocations[0].profile, "7g.40gb");
  EXPECT_EQ(big->reservation->allocations[0].placement, (mig::Placement{0, 8}));
  EXPECT_NE(big->reservation->summary.find("defragmentation"), std::string::npos);
  // Its own reservation now counts, the hold no longer does.
  reports = state_.Report(kNow);
  EXPECT_FALSE(reports[0].defrag[0].active);
}

TEST_F(ClusterStateTest, DefragReservationExpiresAndUnreadableFailsClosed) {
  const std::string reg = Register({{"GPU-0", "A100-SXM4-40GB"}});
  state_.UpsertNode(WithDefragHold(Node("node-a", reg), {Hold("default/big")}));
  auto before = state_.PlanAndReserve("default/other", Request(4000), {}, kNow);
  ASSERT_TRUE(before.ok());
  EXPECT_FALSE(before->reservation.has_value());
  // After its expiry the slices are free for anyone, with no node change at all.
  auto after = state_.PlanAndReserve("default/other", Request(4000), {}, kNow + absl::Minutes(11));
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->reservation.has_value());
  EXPECT_EQ(state_.DefragHoldNode("default/big"), "node-a");
  json bad = Node("node-a", reg);
  bad["metadata"]["annotations"][std::string(protocol::kNodeDefragReservationAnnotation)] = "{";
  state_.UpsertNode(bad);
  auto reports = state_.Report(kNow);
  EXPECT_FALSE(reports[0].gpus[0].healthy);
  EXPECT_EQ(reports[0].gpus[0].unhealthy_code, "unreadable-defrag-reservation");
  EXPECT_FALSE(state_.DefragHoldNode("default/big").has_value());
}

}  // namespace
}  // namespace dynmig::scheduler
