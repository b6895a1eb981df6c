// Leader election between two scheduler replicas on one Lease, with the injected clock: only the
// leader writes, the leader labels its pod, and a follower takes over when the lease expires.
#include <gmock/gmock.h>

#include "scheduler_test_util.h"

namespace dynmig::scheduler::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class LeaderTest : public SchedulerTest {
 protected:
  SchedulerServer* Replica(const std::string& pod) {
    SchedulerServerOptions o = DefaultOptions();
    o.leader_elect = true;
    o.run_election_loop = false;  // rounds are driven by the test
    o.election.lease_namespace = "dynmig-system";
    o.election.identity = pod + "_1234abcd";
    o.pod_namespace = "dynmig-system";
    o.pod_name = pod;
    kube::Object self = kube::testing::MakePod(pod, "dynmig-system");
    self["spec"]["containers"][0]["resources"] = json::object();
    CreatePod(self);
    return StartScheduler(o);
  }
  std::optional<std::string> Role(const std::string& pod) {
    return kube::Label(GetPod(pod, "dynmig-system"), std::string(kRoleLabel));
  }
};

TEST_F(LeaderTest, OnlyTheLeaderWritesAndAFollowerTakesOverWhenTheLeaseExpires) {
  CreateNode(MigNode("node-a", {"GPU-a0"}));
  SchedulerServer* a = Replica("sched-a");
  SchedulerServer* b = Replica("sched-b");
  WaitForNodes(a, {"node-a"});
  WaitForNodes(b, {"node-a"});
  // Before any round nobody leads.
  EXPECT_THAT(Filter(a, CreatePod(MigPod("p0", 4000)), {"node-a"}).body["Error"].get<std::string>(),
              HasSubstr("is not the leader"));
  ASSERT_TRUE(a->elector()->TryAcquireOrRenew());
  EXPECT_FALSE(b->elector()->TryAcquireOrRenew());
  EXPECT_EQ(b->elector()->holder(), "sched-a_1234abcd");
  EXPECT_EQ(Role("sched-a"), "leader");
  EXPECT_FALSE(Role("sched-b").has_value());

  const kube::Object p1 = CreatePod(MigPod("p1", 4000));
  HttpResult refused = Filter(b, p1, {"node-a"});
  EXPECT_THAT(refused.body["Error"].get<std::string>(),
              HasSubstr("this dynmig-scheduler replica (sched-b_1234abcd) is not the leader "
                        "(lease dynmig-system/dynmig-scheduler held by \"sched-a_1234abcd\")"));
  EXPECT_THAT(Bind(b, p1, "node-a").body["Error"].get<std::string>(), HasSubstr("not the leader"));
  EXPECT_FALSE(kube::Annotation(GetPod("p1"), "hami.io/vgpu-mig-allocations").has_value());
  EXPECT_THAT(Filter(a, p1, {"node-a"}).body["NodeNames"], ElementsAre("node-a"));
  EXPECT_THAT(a->MetricsText(), HasSubstr("dynmig_scheduler_leader 1"));
  EXPECT_THAT(b->MetricsText(), HasSubstr("dynmig_scheduler_leader 0"));

  // The leader renews while the follower keeps trying.
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(absl::Seconds(2));
    ASSERT_TRUE(a->elector()->TryAcquireOrRenew());
    ASSERT_FALSE(b->elector()->TryAcquireOrRenew());
  }
  // The leader stops renewing (hung, partitioned): after renew_deadline it stops writing itself,
  // and once the lease has run out the follower takes over.
  clock_.Advance(absl::Seconds(11));
  EXPECT_FALSE(a->elector()->IsLeader());
  EXPECT_THAT(Filter(a, CreatePod(MigPod("p2", 4000)), {"node-a"}).body["Error"].get<std::string>(),
              HasSubstr("not the leader"));
  EXPECT_FALSE(b->elector()->TryAcquireOrRenew());  // 11 s: the lease (15 s) still runs
  clock_.Advance(absl::Seconds(5));
  EXPECT_TRUE(b->elector()->TryAcquireOrRenew());
  EXPECT_EQ(Role("sched-b"), "leader");
  EXPECT_EQ(Role("sched-a"), "follower");  // relabelled by the new leader
  auto lease = client_->GetLease("dynmig-system", "dynmig-scheduler");
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ((*lease)["spec"]["holderIdentity"], "sched-b_1234abcd");
  EXPECT_EQ((*lease)["spec"]["leaseTransitions"], 1);
  // The old leader comes back: it sees the new holder and stays a follower.
  EXPECT_FALSE(a->elector()->TryAcquireOrRenew());
  EXPECT_THAT(Filter(b, GetPod("p2"), {"node-a"}).body["NodeNames"], ElementsAre("node-a"));
  EXPECT_EQ(b->ExpireReservations().errors.size(), 0u);

  // A clean stop hands the lease back: the other replica takes over at once.
  b->Stop();
  EXPECT_EQ(Role("sched-b"), "follower");
  EXPECT_TRUE(a->elector()->TryAcquireOrRenew());
  EXPECT_EQ(Role("sched-a"), "leader");
}

TEST_F(LeaderTest, AnotherHolderIsRespectedUntilItsLeaseRunsOut) {
  SchedulerServer* a = Replica("sched-a");
  ASSERT_TRUE(a->elector()->TryAcquireOrRenew());
  // Another replica (say, after a split) writes itself into the lease.
  auto lease = client_->GetLease("dynmig-system", "dynmig-scheduler");
  ASSERT_TRUE(lease.ok());
  (*lease)["spec"]["holderIdentity"] = "intruder_1";
  ASSERT_TRUE(client_->UpdateLease(*lease).ok());
  EXPECT_FALSE(a->elector()->TryAcquireOrRenew());  // holder changed just now: it is live
  EXPECT_EQ(a->elector()->holder(), "intruder_1");
  EXPECT_EQ(Role("sched-a"), "follower");
  clock_.Advance(absl::Seconds(16));
  EXPECT_TRUE(a->elector()->TryAcquireOrRenew());
}

}  // namespace
}  // namespace dynmig::scheduler::testing
