// The requeuer: a node whose MIG capacity grew while MIG pods wait gets dynmig.io/capacity-freed
// (a Node label: kube-scheduler retries its unschedulable pods on a label change, not on an
// annotation change); nothing is written while nobody waits; at most one label per node per
// min_gap however fast pods come and go. CapacityGrew's rules, case by case.
#include "scheduler/requeuer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "protocol/annotations.h"
#include "scheduler/scheduler_test_util.h"

namespace dynmig::scheduler::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using Occ = ClusterState::Occupancy;

Occ Node(std::vector<Occ::Gpu> gpus, bool healthy = true, uint32_t blocked = 0) {
  Occ o;
  o.healthy = healthy;
  o.blocked_holds = blocked;
  o.gpus = std::move(gpus);
  return o;
}

TEST(CapacityGrewTest, FollowsFreedSlicesAndUsableGpusOnly) {
  const Occ base = Node({{"GPU-0", true, 0b0011}, {"GPU-1", true, 0b1000}});
  EXPECT_FALSE(CapacityGrew(base, base));
  // A slice freed on either GPU.
  EXPECT_TRUE(CapacityGrew(base, Node({{"GPU-0", true, 0b0001}, {"GPU-1", true, 0b1000}})));
  EXPECT_TRUE(CapacityGrew(base, Node({{"GPU-0", true, 0b0011}, {"GPU-1", true, 0}})));
  // One freed and another taken in the same interval: still a slice a pod may fit in now.
  EXPECT_TRUE(CapacityGrew(base, Node({{"GPU-0", true, 0b0110}, {"GPU-1", true, 0b1000}})));
  // Only more occupied: nothing for a waiting pod.
  EXPECT_FALSE(CapacityGrew(base, Node({{"GPU-0", true, 0b0111}, {"GPU-1", true, 0b1000}})));
  // A GPU uncordoned (schedulable again), a GPU appeared, the node became healthy.
  const Occ cordoned = Node({{"GPU-0", false, 0b0011}, {"GPU-1", true, 0b1000}});
  EXPECT_TRUE(CapacityGrew(cordoned, base));
  EXPECT_FALSE(CapacityGrew(base, cordoned));
  EXPECT_TRUE(CapacityGrew(Node({{"GPU-0", true, 0b0011}}), base));
  EXPECT_TRUE(CapacityGrew(Node(base.gpus, false), base));
  // A node that is unhealthy now offers nothing, whatever freed there.
  EXPECT_FALSE(CapacityGrew(base, Node({{"GPU-0", true, 0}}, false)));
  // A slice freed on a GPU that takes no reservation does not count.
  EXPECT_FALSE(CapacityGrew(cordoned, Node({{"GPU-0", false, 0}, {"GPU-1", true, 0b1000}})));
  // A defragmentation hold no longer blocked: its pod may go there now.
  EXPECT_TRUE(CapacityGrew(Node(base.gpus, true, 1), Node(base.gpus, true, 0)));
  EXPECT_FALSE(CapacityGrew(Node(base.gpus, true, 0), Node(base.gpus, true, 1)));
}

class RequeuerTest : public SchedulerTest {
 protected:
  // node-a's GPU-0 holds a Running 1g pod `small` at slice 0; `big` (a 7g) waits, its filter
  // left it pending.
  SchedulerServer* Waiting() {
    CreateNode(MigNode("node-a", {"GPU-0"}));
    SchedulerServer* s = StartScheduler();
    WaitForNodes(s, {"node-a"});
    RunningSmall("small", 0);
    WaitForReservationSeen(s, "default/small");
    CreatePod(MigPod("big", 39000));
    auto r = Filter(s, GetPod("big"), {"node-a"});
    EXPECT_TRUE(r.body.is_object() && r.body.value("NodeNames", json()).empty()) << r.text;
    return s;
  }
  void RunningSmall(const std::string& name, uint32_t start) {
    kube::Object pod = MigPod(name, 4000);
    pod["metadata"]["annotations"][std::string(protocol::kMigAllocationsAnnotation)] =
        Alloc("GPU-0", "1g.5gb", start, 1);
    pod["metadata"]["annotations"][std::string(protocol::kVgpuNodeAnnotation)] = "node-a";
    pod["spec"]["nodeName"] = "node-a";
    CreatePod(pod);
  }
  void Delete(SchedulerServer* s, const std::string& name) {
    kube::DeleteOptions now;
    now.grace_period_seconds = 0;
    ASSERT_TRUE(client_->DeletePod("default", name, now).ok());
    EXPECT_TRUE(kube::testing::Eventually([&] {
      auto v = s->state().View("node-a", clock_.Now());
      return v && v->gpus[0].usage.occupied == 0;
    }));
  }
  std::string Label() {
    auto node = client_->GetNode("node-a");
    EXPECT_TRUE(node.ok());
    return kube::StringAt(*node, "/metadata/labels/" + std::string("dynmig.io~1capacity-freed"));
  }
  Requeuer::Outcome Pass(SchedulerServer* s) {
    auto out = s->RunRequeuePass();
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : Requeuer::Outcome{};
  }
};

TEST_F(RequeuerTest, LabelsTheNodeWhoseSlicesFreedWhileAPodWaits) {
  SchedulerServer* s = Waiting();
  EXPECT_THAT(Pass(s).labelled, IsEmpty());  // the first pass only learns the occupancy
  EXPECT_EQ(Label(), "");
  clock_.Advance(absl::Seconds(1));
  Delete(s, "small");
  auto out = Pass(s);
  EXPECT_THAT(out.labelled, ElementsAre("node-a"));
  EXPECT_THAT(out.errors, IsEmpty());
  EXPECT_EQ(Label(), absl::StrCat(absl::ToUnixMillis(clock_.Now())));
  // Nothing more changed: no further write.
  clock_.Advance(absl::Seconds(5));
  EXPECT_THAT(Pass(s).labelled, IsEmpty());
  EXPECT_THAT(s->requeuer().due(), IsEmpty());
}

TEST_F(RequeuerTest, WritesNothingWhileNoPodWaits) {
  CreateNode(MigNode("node-a", {"GPU-0"}));
  SchedulerServer* s = StartScheduler();
  WaitForNodes(s, {"node-a"});
  RunningSmall("small", 0);
  WaitForReservationSeen(s, "default/small");
  EXPECT_THAT(Pass(s).labelled, IsEmpty());
  Delete(s, "small");
  EXPECT_THAT(Pass(s).labelled, IsEmpty());
  EXPECT_EQ(Label(), "");
  // A pod that comes afterwards is filtered against the freed capacity: nothing is owed to it.
  CreatePod(MigPod("big", 39000));
  auto r = Filter(s, GetPod("big"), {"node-a"});
  EXPECT_THAT(r.body["NodeNames"], ElementsAre("node-a")) << r.text;
  EXPECT_THAT(Pass(s).labelled, IsEmpty());
}

TEST_F(RequeuerTest, AnUncordonedGpuIsFreedCapacity) {
  SchedulerServer* s = Waiting();
  kube::KeyPatch cordon = {{std::string(protocol::kDeviceCordonAnnotation), "GPU-0"}};
  ASSERT_TRUE(client_->PatchNodeAnnotations("node-a", cordon).ok());
  EXPECT_TRUE(kube::testing::Eventually(
      [&] { return !s->state().Report(clock_.Now())[0].gpus[0].healthy; }));
  Pass(s);
  Delete(s, "small");  // freed while cordoned: not usable
  EXPECT_THAT(Pass(s).labelled, IsEmpty());
  cordon[std::string(protocol::kDeviceCordonAnnotation)] = std::nullopt;
  ASSERT_TRUE(client_->PatchNodeAnnotations("node-a", cordon).ok());
  EXPECT_TRUE(kube::testing::Eventually(
      [&] { return s->state().Report(clock_.Now())[0].gpus[0].healthy; }));
  EXPECT_THAT(Pass(s).labelled, ElementsAre("node-a"));
}

TEST_F(RequeuerTest, PodsComingAndGoingInALoopWriteAtMostOncePerMinGap) {
  // An attacker (any tenant) creates and deletes pods on the node as fast as it can while its
  // own big pod waits: each pass sees capacity freed, but the node is written once per min_gap.
  SchedulerServer* s = Waiting();
  Pass(s);
  Delete(s, "small");
  EXPECT_THAT(Pass(s).labelled, ElementsAre("node-a"));
  const std::string first = Label();
  int writes = 0;
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(absl::Milliseconds(150));
    const std::string name = "churn-" + std::to_string(i);
    RunningSmall(name, 0);
    WaitForReservationSeen(s, "default/" + name);
    Pass(s);
    Delete(s, name);
    writes += static_cast<int>(Pass(s).labelled.size());
  }
  EXPECT_EQ(writes, 0);  // 750 ms after the first label: none yet
  EXPECT_EQ(Label(), first);
  EXPECT_THAT(s->requeuer().due(), ElementsAre("node-a"));  // owed, not forgotten
  clock_.Advance(absl::Milliseconds(300));
  EXPECT_THAT(Pass(s).labelled, ElementsAre("node-a"));
  EXPECT_NE(Label(), first);
}

TEST_F(RequeuerTest, ANodeThatRegistersItsGpusLaterIsFreedCapacity) {
  // The node exists before its device plugin publishes the register annotation (an annotation
  // change kube-scheduler does not act on): a waiting pod must still hear of it.
  kube::Object bare = MigNode("node-b", {"GPU-9"});
  bare["metadata"]["annotations"].erase(std::string(protocol::kNodeRegisterAnnotation));
  CreateNode(bare);
  SchedulerServer* s = StartScheduler();
  WaitForNodes(s, {"node-b"});
  CreatePod(MigPod("big", 39000));
  auto r = Filter(s, GetPod("big"), {"node-b"});
  EXPECT_TRUE(r.body.value("NodeNames", json()).empty()) << r.text;
  Pass(s);
  kube::Object full = MigNode("node-b", {"GPU-9"});
  kube::KeyPatch reg = {{std::string(protocol::kNodeRegisterAnnotation),
                         kube::Annotation(full, protocol::kNodeRegisterAnnotation).value()}};
  ASSERT_TRUE(client_->PatchNodeAnnotations("node-b", reg).ok());
  EXPECT_TRUE(kube::testing::Eventually([&] {
    auto v = s->state().View("node-b", clock_.Now());
    return v && !v->gpus.empty() && v->healthy;
  }));
  EXPECT_THAT(Pass(s).labelled, ElementsAre("node-b"));
}

TEST_F(RequeuerTest, OnlyTheLeaderWrites) {
  SchedulerServerOptions o = DefaultOptions();
  o.leader_elect = true;
  o.run_election_loop = false;  // never elected: a follower
  o.election.lease_namespace = "dynmig-system";
  o.election.identity = "sched-x_1234abcd";
  CreateNode(MigNode("node-a", {"GPU-0"}));
  SchedulerServer* s = StartScheduler(o);
  auto out = s->RunRequeuePass();
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
}

}  // namespace
}  // namespace dynmig::scheduler::testing
