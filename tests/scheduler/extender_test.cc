// Unit-level tests: the extender wire types, the node lock, and the reservation write's conflict
// handling (an Extender over a ClusterState fed by hand, so no watch interferes).
#include "scheduler/extender.h"

#include <gmock/gmock.h>

#include <atomic>
#include <thread>

#include "scheduler/extender_api.h"
#include "scheduler/node_lock.h"
#include "scheduler_test_util.h"

namespace dynmig::scheduler::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ExtenderApiTest, ParsesPascalCaseAndAnyCaseLikeGo) {
  auto args =
      ParseExtenderArgs(R"({"Pod":{"metadata":{"name":"p"}},"Nodes":null,"NodeNames":["a","b"]})");
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(kube::Name(args->pod), "p");
  EXPECT_THAT(args->Candidates(), ElementsAre("a", "b"));
  EXPECT_FALSE(args->nodes.has_value());
  args = ParseExtenderArgs(R"({"pod":{"metadata":{"name":"p"}},"nodenames":["c"]})");
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_THAT(args->Candidates(), ElementsAre("c"));
  args = ParseExtenderArgs(
      R"({"Pod":{},"Nodes":{"metadata":{},"items":[{"metadata":{"name":"x"}},{"metadata":{"name":"y"}}]},"NodeNames":null})");
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_THAT(args->Candidates(), ElementsAre("x", "y"));
  ASSERT_TRUE(args->nodes.has_value());
}

TEST(ExtenderApiTest, MalformedArgsAreNamed) {
  EXPECT_THAT(std::string(ParseExtenderArgs("{oops").status().message()),
              HasSubstr("ExtenderArgs: invalid JSON: "));
  EXPECT_EQ(ParseExtenderArgs("[]").status().message(),
            "ExtenderArgs: the request body must be a JSON object");
  EXPECT_EQ(ParseExtenderArgs(R"({"NodeNames":["a"]})").status().message(),
            "ExtenderArgs: Pod is missing");
  EXPECT_EQ(ParseExtenderArgs(R"({"Pod":{},"NodeNames":"a"})").status().message(),
            "ExtenderArgs: NodeNames must be a list of node names");
  EXPECT_EQ(ParseExtenderArgs(R"({"Pod":{},"NodeNames":["a",1]})").status().message(),
            "ExtenderArgs: NodeNames[1] must be a string");
  EXPECT_EQ(ParseExtenderBindingArgs(R"({"PodName":"p","PodNamespace":"d"})").status().message(),
            "ExtenderBindingArgs: Node is missing");
  auto bind =
      ParseExtenderBindingArgs(R"({"PodName":"p","PodNamespace":"d","PodUID":"u","Node":"n"})");
  ASSERT_TRUE(bind.ok());
  EXPECT_EQ(bind->pod_uid, "u");
}

TEST(ExtenderApiTest, FilterResultUsesTheGoFieldNames) {
  ExtenderFilterResult r;
  r.node_names = {"a"};
  r.failed_nodes = {{"b", "capacity-exhausted"}};
  EXPECT_EQ(
      ToJson(r).dump(),
      R"({"Error":"","FailedAndUnresolvableNodes":{},"FailedNodes":{"b":"capacity-exhausted"},"NodeNames":["a"],"Nodes":null})");
  EXPECT_EQ(ErrorResult("boom").dump(), R"({"Error":"boom"})");
  EXPECT_EQ(ToJsonText(r), ToJson(r).dump());
  // The direct writer escapes as nlohmann does.
  r.error = "a \"quoted\" \\ path\n\ttab \x01 \u00fcn";
  r.failed_nodes["c\"d"] = "x\ry";
  r.failed_and_unresolvable_nodes["e"] = "f";
  EXPECT_EQ(ToJsonText(r), ToJson(r).dump());
  r.node_names.clear();
  EXPECT_EQ(ToJsonText(r), ToJson(r).dump());
  // Many nodes sharing a reason (copied from the previous entry), escapes included.
  r.failed_nodes.clear();
  for (int i = 0; i < 300; ++i) {
    r.failed_nodes[fmt::format("node-{:04d}", i)] =
        i % 100 == 7 ? "other" : (i < 150 ? "another node was chosen" : "a \"b\"\n");
  }
  EXPECT_EQ(ToJsonText(r), ToJson(r).dump());
}

class NodeLockTest : public SchedulerTest {
 protected:
  void SetUp() override {
    SchedulerTest::SetUp();
    CreateNode(kube::testing::MakeNode("node-a"));
  }
  std::optional<std::string> Lock() {
    auto node = client_->GetNode("node-a");
    EXPECT_TRUE(node.ok());
    return kube::Annotation(*node, protocol::kNodeLockAnnotation);
  }
};

TEST_F(NodeLockTest, OnePodAtATimeStaleLocksAreTakenOver) {
  const absl::Time t0 = clock_.Now();
  ASSERT_TRUE(AcquireNodeLock(*client_, "node-a", {"default", "p1", "uid-p1"}, t0).ok());
  EXPECT_EQ(Lock(), protocol::FormatNodeLock({t0, "default", "p1", "uid-p1"}));
  // The holder may take it again (a retried bind); another pod may not.
  EXPECT_TRUE(AcquireNodeLock(*client_, "node-a", {"default", "p1", "uid-p1"}, t0).ok());
  absl::Status other =
      AcquireNodeLock(*client_, "node-a", {"default", "p2", "uid-p2"}, t0 + absl::Minutes(4));
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      std::string(other.message()),
      HasSubstr("node node-a is locked by default/p1 (uid uid-p1) since 2027-01-15T08:00:00Z"));
  // A pod recreated under the holder's name is another pod: it neither takes nor releases it.
  EXPECT_EQ(AcquireNodeLock(*client_, "node-a", {"default", "p1", "uid-new"}, t0).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ReleaseNodeLock(*client_, "node-a", {"default", "p1", "uid-new"}).ok());
  EXPECT_EQ(Lock(), protocol::FormatNodeLock({t0, "default", "p1", "uid-p1"}));
  // Releasing someone else's lock leaves it.
  EXPECT_TRUE(ReleaseNodeLock(*client_, "node-a", {"default", "p2", "uid-p2"}).ok());
  EXPECT_TRUE(Lock().has_value());
  // Five minutes later the lock is stale and is taken over.
  ASSERT_TRUE(
      AcquireNodeLock(*client_, "node-a", {"default", "p2", "uid-p2"}, t0 + absl::Minutes(5)).ok());
  EXPECT_EQ(Lock(), protocol::FormatNodeLock({t0 + absl::Minutes(5), "default", "p2", "uid-p2"}));
  ASSERT_TRUE(ReleaseNodeLock(*client_, "node-a", {"default", "p2", "uid-p2"}).ok());
  EXPECT_FALSE(Lock().has_value());
  // An unreadable lock is taken over too.
  ASSERT_TRUE(client_->PatchNodeAnnotations("node-a", {{"hami.io/mutex.lock", "garbage"}}).ok());
  EXPECT_TRUE(AcquireNodeLock(*client_, "node-a", {"default", "p3", "uid-p3"}, t0).ok());
  EXPECT_EQ(AcquireNodeLock(*client_, "node-x", {"default", "p3", "uid-p3"}, t0).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(NodeLockTest, RacingBindsGetTheLockOnce) {
  std::atomic<int> won{0}, refused{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      absl::Status st = AcquireNodeLock(*client_, "node-a", {"default", fmt::format("p{}", i), "u"},
                                        clock_.Now());
      (st.ok() ? won : refused)++;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(refused.load(), 7);
}

// The reservation write against a ClusterState that no watch updates: the conflicts are ours to
// see.
class ReservationWriteTest : public SchedulerTest {
 protected:
  void SetUp() override {
    SchedulerTest::SetUp();
    state_ = std::make_unique<ClusterState>(ClusterStateOptions{TestAllowlist(), {}});
    state_->UpsertNode(CreateNode(MigNode("node-a", {"GPU-a0"})));
    // kube-scheduler's view in the body (client authentication on): the write path meets the
    // concurrent changes itself.
    ExtenderOptions options;
    options.trusted_callers = true;
    extender_ = std::make_unique<Extender>(*client_, *state_, clock_, nullptr, nullptr, options);
  }
  ExtenderFilterResult Filter(const kube::Object& pod) {
    ExtenderArgs args;
    args.pod = pod;
    args.node_names = {"node-a"};
    return extender_->Filter(args);
  }
  std::unique_ptr<ClusterState> state_;
  std::unique_ptr<Extender> extender_;
};

TEST_F(ReservationWriteTest, TheFilterWritesNothingAndTheBindWritesOverUnrelatedChanges) {
  const kube::Object pod = CreatePod(MigPod("p", 4000));
  auto r = Filter(pod);
  ASSERT_EQ(r.error, "");
  EXPECT_THAT(r.node_names, ElementsAre("node-a"));
  EXPECT_EQ(kube::ResourceVersion(GetPod("p")), kube::ResourceVersion(pod));
  kube::MetadataPatch label;
  label.labels["team"] = "a";
  ASSERT_TRUE(client_->PatchPodMetadata("default", "p", label).ok());
  EXPECT_EQ(extender_->Bind({"p", "default", kube::Uid(pod), "node-a"}), "");
  EXPECT_EQ(AllocationsOf("p").size(), 1u);
  EXPECT_EQ(kube::Label(GetPod("p"), "team"), "a");
  EXPECT_EQ(kube::NodeName(GetPod("p")), "node-a");
}

TEST_F(ReservationWriteTest, AnotherReservationARecreatedOrMissingPodAreRefused) {
  // Another writer put a reservation on q after our filter: the bind refuses, touching nothing.
  const kube::Object q = CreatePod(MigPod("q", 4000));
  ASSERT_EQ(Filter(q).error, "");
  ASSERT_TRUE(
      client_
          ->PatchPodAnnotations("default", "q",
                                {{"hami.io/vgpu-node", "node-z"},
                                 {"hami.io/vgpu-mig-allocations", Alloc("GPU-z0", "1g.5gb", 0, 1)}})
          .ok());
  EXPECT_EQ(extender_->Bind({"q", "default", kube::Uid(q), "node-a"}),
            "bind default/q: the pod's MIG reservation is on node node-z, not node-a");
  EXPECT_FALSE(kube::Annotation(*client_->GetNode("node-a"), "hami.io/mutex.lock").has_value());

  // r was filtered, then deleted and created again: the reservation of the old uid is not the new
  // pod's. Its bind is refused; its filter drops the old reservation and plans it afresh.
  const kube::Object old = CreatePod(MigPod("r", 19000));
  ASSERT_EQ(Filter(old).error, "");
  ASSERT_TRUE(client_->DeletePod("default", "r").ok());
  const kube::Object renewed = CreatePod(MigPod("r", 4000));
  EXPECT_THAT(extender_->Bind({"r", "default", kube::Uid(renewed), "node-a"}),
              HasSubstr("holds no MIG reservation of this extender"));
  EXPECT_EQ(AllocationsOf("r").size(), 0u);
  ASSERT_EQ(Filter(renewed).error, "");
  EXPECT_EQ(state_->Assumed("default/r")->reservation.allocations.at(0).profile, "1g.5gb");
  EXPECT_EQ(extender_->Bind({"r", "default", kube::Uid(renewed), "node-a"}), "");
  ASSERT_EQ(AllocationsOf("r").size(), 1u);
  EXPECT_EQ(AllocationsOf("r")[0].profile, "1g.5gb");

  // A pod that disappeared after its filter: the bind fails, the reservation expires.
  kube::Object ghost = MigPod("ghost", 4000);
  ghost["metadata"]["uid"] = "ghost-uid";
  ASSERT_EQ(Filter(ghost).error, "");
  EXPECT_THAT(extender_->Bind({"ghost", "default", "ghost-uid", "node-a"}), HasSubstr("NotFound"));
  clock_.Advance(absl::Minutes(11));
  EXPECT_THAT(extender_->ExpireReservations().released, ::testing::Contains("default/ghost"));
  EXPECT_FALSE(state_->ReservedNode("default/ghost").has_value());
}

TEST_F(ReservationWriteTest, ClosedGateAnswersTheReason) {
  extender_->SetGate([] { return std::string("not the leader"); });
  auto r = Filter(CreatePod(MigPod("p", 4000)));
  EXPECT_EQ(r.error, "not the leader");
  EXPECT_EQ(extender_->Bind({"p", "default", "", "node-a"}), "not the leader");
  EXPECT_TRUE(extender_->ExpireReservations().released.empty());
}

}  // namespace
}  // namespace dynmig::scheduler::testing
