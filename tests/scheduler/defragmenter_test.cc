// The defragmenter on the in-memory API server (which enforces PodDisruptionBudgets on eviction
// like the apiserver): a 7g pod waits behind 1g pods on one GPU of two; the plan, the
// reservation, the evictions, the 7g landing in the reserved slices and the replacements on the
// other GPU; mode off and dry-run.
#include "scheduler/defragmenter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "protocol/defrag.h"
#include "scheduler/scheduler_test_util.h"

namespace dynmig::scheduler::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class DefragmenterTest : public SchedulerTest {
 protected:
  SchedulerServerOptions Options(DefragMode mode, uint32_t headroom_percent = 0) {
    SchedulerServerOptions o = DefaultOptions();
    o.defrag.mode = mode;
    o.defrag.headroom_percent = headroom_percent;
    o.defrag.wait_threshold = absl::Minutes(1);
    o.defrag_interval = absl::ZeroDuration();  // passes by hand
    return o;
  }

  // A pod of a ReplicaSet holding one 1g at `start` of `gpu` on node-a, running and ready.
  void RunningSmall(const std::string& name, const std::string& gpu, uint32_t start,
                    json labels = json::object(), json annotations = json::object()) {
    Running(name, gpu, "1g.5gb", start, 1, 4000, std::move(labels), std::move(annotations));
  }
  void Running(const std::string& name, const std::string& gpu, const std::string& profile,
               uint32_t start, uint32_t size, int memory, json labels = json::object(),
               json annotations = json::object()) {
    kube::Object pod = MigPod(name, std::vector<Ctr>{{"workload", 1, memory}});
    pod["metadata"]["labels"] = labels;
    annotations[std::string(protocol::kMigAllocationsAnnotation)] =
        Alloc(gpu, profile, start, size);
    annotations[std::string(protocol::kVgpuNodeAnnotation)] = "node-a";
    pod["metadata"]["annotations"] = annotations;
    pod["metadata"]["ownerReferences"] = json::array({{{"apiVersion", "apps/v1"},
                                                       {"kind", "ReplicaSet"},
                                                       {"name", "rs-" + name},
                                                       {"uid", "rs-uid-" + name},
                                                       {"controller", true}}});
    pod["spec"]["nodeName"] = "node-a";
    CreatePod(pod);
    auto st = client_->PatchPodStatus(
        "default", name,
        {{"status",
          {{"phase", "Running"}, {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}});
    ASSERT_TRUE(st.ok()) << st.status();
  }

  void Budget(const std::string& name, const std::string& app, json spec) {
    spec["selector"] = {{"matchLabels", {{"app", app}}}};
    kube::Object pdb = {{"apiVersion", "policy/v1"},
                        {"kind", "PodDisruptionBudget"},
                        {"metadata", {{"name", name}, {"namespace", "default"}}},
                        {"spec", spec}};
    auto created = client_->Create(kube::Resource::kPodDisruptionBudgets, pdb);
    ASSERT_TRUE(created.ok()) << created.status();
  }

  // node-a: GPU-0 holds a (covered by a budget that allows one disruption) and b; GPU-1 holds c
  // (opted out) and d (its budget allows none). A 7g pod waits.
  SchedulerServer* Cluster(DefragMode mode, uint32_t headroom_percent = 0) {
    CreateNode(MigNode("node-a", {"GPU-0", "GPU-1"}));
    SchedulerServer* s = StartScheduler(Options(mode, headroom_percent));
    WaitForNodes(s, {"node-a"});
    RunningSmall("a", "GPU-0", 0, {{"app", "web"}});
    RunningSmall("b", "GPU-0", 1);
    RunningSmall("c", "GPU-1", 0, json::object(),
                 {{std::string(protocol::kDefragPodAnnotation), "never"}});
    RunningSmall("d", "GPU-1", 1, {{"app", "db"}});
    Budget("web", "web", {{"maxUnavailable", 1}});
    Budget("db", "db", {{"minAvailable", 1}});
    for (const char* p : {"a", "b", "c", "d"})
      WaitForReservationSeen(s, std::string("default/") + p);
    big_ = CreatePod(MigPod("big", 39000));
    // It fits nowhere: pending.
    auto r = Filter(s, GetPod("big"), {"node-a"});
    EXPECT_TRUE(r.body.is_object() && r.body.value("NodeNames", json()).empty()) << r.text;
    return s;
  }

  bool Exists(const std::string& name) { return client_->GetPod("default", name).ok(); }
  std::vector<protocol::DefragReservation> Holds() {
    auto node = client_->GetNode("node-a");
    EXPECT_TRUE(node.ok());
    auto v = kube::Annotation(*node, protocol::kNodeDefragReservationAnnotation);
    if (!v) return {};
    auto d = protocol::DecodeDefragReservations(*v);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *d : std::vector<protocol::DefragReservation>{};
  }

  kube::Object big_;
};

TEST_F(DefragmenterTest, EvictsThePlannedPodsReservesTheSlicesAndTheSevenGLandsThere) {
  SchedulerServer* s = Cluster(DefragMode::kOn);
  auto out = s->RunDefragPass();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->executed) << ::testing::PrintToString(out->notes)
                             << ::testing::PrintToString(out->failed);
  EXPECT_EQ(out->pod, "default/big");
  EXPECT_EQ(out->gpu_uuid, "GPU-0");
  EXPECT_THAT(out->evicted, ElementsAre("default/a", "default/b"));
  EXPECT_EQ(out->placement, (mig::Placement{0, 8}));
  // c and d are on the other GPU, never touched.
  EXPECT_TRUE(Exists("c"));
  EXPECT_TRUE(Exists("d"));
  const auto holds = Holds();
  ASSERT_EQ(holds.size(), 1u);
  EXPECT_EQ(holds[0].pod, "default/big");
  EXPECT_EQ(holds[0].pod_uid, kube::Uid(big_));
  EXPECT_THAT(holds[0].evicted, ElementsAre("default/a", "default/b"));
  // The evicted pods leave (the kubelet's part: deleted now), their controllers recreate them.
  for (const char* p : {"a", "b"}) {
    if (Exists(p)) {
      kube::DeleteOptions now;
      now.grace_period_seconds = 0;
      (void)client_->DeletePod("default", p, now);
    }
  }
  EXPECT_TRUE(kube::testing::Eventually([&] {
    return !s->state().Assumed("default/a") &&
           s->state().Report(clock_.Now())[0].defrag.size() == 1 &&
           !s->state().Report(clock_.Now())[0].defrag[0].blocked;
  }));
  // Replacements land on GPU-1, never in the reserved slices; no second plan for big meanwhile.
  for (const char* p : {"a2", "b2"}) {
    kube::Object pod = CreatePod(MigPod(p, 4000));
    auto r = Filter(s, pod, {"node-a"});
    ASSERT_TRUE(r.body.is_object()) << r.text;
    EXPECT_THAT(r.body["NodeNames"], ElementsAre("node-a")) << r.text;
    auto reserved = ReservedOf(s, p);
    ASSERT_EQ(reserved.size(), 1u);
    EXPECT_EQ(reserved[0].gpu_uuid, "GPU-1") << p;
  }
  auto again = s->RunDefragPass();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->pod, "");  // in flight: never twice
  // The 7g lands in the reserved slices.
  auto r = Filter(s, GetPod("big"), {"node-a"});
  EXPECT_THAT(r.body["NodeNames"], ElementsAre("node-a")) << r.text;
  auto reserved = ReservedOf(s, "big");
  ASSERT_EQ(reserved.size(), 1u);
  EXPECT_EQ(reserved[0].gpu_uuid, "GPU-0");
  EXPECT_EQ(reserved[0].profile, "7g.40gb");
  EXPECT_EQ(reserved[0].placement, (mig::Placement{0, 8}));
  EXPECT_THAT(EventMessages("big", "DefragEvicted"),
              ElementsAre(HasSubstr("evicted default/a, default/b")));
  EXPECT_THAT(EventMessages("a", "DefragEvicted"), ElementsAre(HasSubstr("default/big")));
  EXPECT_THAT(s->MetricsText(),
              HasSubstr("dynmig_scheduler_defrag_evictions_total{result=\"evicted\"} 2"));
  EXPECT_THAT(s->MetricsText(),
              HasSubstr("dynmig_scheduler_defrag_plans_total{outcome=\"executed\"} 1"));
}

TEST_F(DefragmenterTest, APlanWhosePodsFitNowhereGivesWayToTheNextPlan) {
  // GPU-0 holds one 3g at 4 (the plan with the fewest pods), which fits nowhere else: GPU-1's 1g
  // pods at 0 and 4 leave it no 3g placement. The next plan, GPU-1's two 1g pods, fits on GPU-0.
  CreateNode(MigNode("node-a", {"GPU-0", "GPU-1"}));
  SchedulerServer* s = StartScheduler(Options(DefragMode::kOn));
  WaitForNodes(s, {"node-a"});
  Running("x", "GPU-0", "3g.20gb", 4, 4, 20000);
  RunningSmall("p", "GPU-1", 0);
  RunningSmall("q", "GPU-1", 4);
  for (const char* p : {"x", "p", "q"}) WaitForReservationSeen(s, std::string("default/") + p);
  big_ = CreatePod(MigPod("big", 39000));
  auto out = s->RunDefragPass();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->executed) << ::testing::PrintToString(out->notes)
                             << ::testing::PrintToString(out->failed);
  EXPECT_EQ(out->gpu_uuid, "GPU-1");
  EXPECT_THAT(out->evicted, ElementsAre("default/p", "default/q"));
  EXPECT_TRUE(Exists("x"));
}

// --defrag-headroom: the move leaves 4 of node-a's 16 slices free (the 7g takes GPU-0's 8, c and d
// keep 2, a and b take 2 elsewhere): 25 %. Kept free 26 %: no move, the reason noted and counted.
TEST_F(DefragmenterTest, HeadroomRefusesAMoveThatWouldFillTheCluster) {
  SchedulerServer* s = Cluster(DefragMode::kOn, 26);
  auto out = s->RunDefragPass();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE(out->executed);
  EXPECT_EQ(out->pod, "");
  ASSERT_EQ(out->notes.size(), 1u);
  EXPECT_THAT(out->notes[0], HasSubstr("headroom: the cluster would keep 4 of its 16 slices free "
                                       "once the pod runs, under the 26% kept free"));
  for (const char* p : {"a", "b", "c", "d"}) EXPECT_TRUE(Exists(p)) << p;
  EXPECT_THAT(Holds(), IsEmpty());
  EXPECT_THAT(s->MetricsText(),
              HasSubstr("dynmig_scheduler_defrag_plans_total{outcome=\"headroom\"} 1"));
  EXPECT_THAT(s->MetricsText(),
              HasSubstr("dynmig_scheduler_defrag_plans_total{outcome=\"no-plan\"} 0"));
}

TEST_F(DefragmenterTest, HeadroomAllowsAMoveThatKeepsItsShareFree) {
  SchedulerServer* s = Cluster(DefragMode::kOn, 25);
  auto out = s->RunDefragPass();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->executed) << ::testing::PrintToString(out->notes);
  EXPECT_THAT(out->evicted, ElementsAre("default/a", "default/b"));
}

TEST_F(DefragmenterTest, OffEvictsNothing) {
  SchedulerServer* s = Cluster(DefragMode::kOff);
  auto out = s->RunDefragPass();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->pod, "");
  EXPECT_THAT(out->evicted, IsEmpty());
  for (const char* p : {"a", "b", "c", "d"}) EXPECT_TRUE(Exists(p)) << p;
  EXPECT_THAT(Holds(), IsEmpty());
}

TEST_F(DefragmenterTest, DryRunOnlyRecordsEvents) {
  SchedulerServer* s = Cluster(DefragMode::kDryRun);
  auto out = s->RunDefragPass();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->dry_run);
  EXPECT_FALSE(out->executed);
  EXPECT_THAT(out->evicted, ElementsAre("default/a", "default/b"));
  for (const char* p : {"a", "b", "c", "d"}) EXPECT_TRUE(Exists(p)) << p;
  EXPECT_THAT(Holds(), IsEmpty());
  EXPECT_THAT(EventMessages("big", "DefragPlanned"),
              ElementsAre(HasSubstr("would evict default/a, default/b")));
  EXPECT_THAT(EventMessages("b", "DefragWouldEvict"), ElementsAre(HasSubstr("default/big")));
  EXPECT_THAT(s->MetricsText(),
              HasSubstr("dynmig_scheduler_defrag_plans_total{outcome=\"dry-run\"} 1"));
  // Not planned again at the next pass.
  auto again = s->RunDefragPass();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->pod, "");
}

TEST_F(DefragmenterTest, TheBudgetTheOptOutAndTheThresholdAreHonoured) {
  SchedulerServer* s = Cluster(DefragMode::kOn);
  // Budget web allows none now: a is pinned and GPU-0 offers no plan; GPU-1 neither (c opted
  // out, d's budget allows none).
  Budget("web-strict", "web", {{"minAvailable", 1}});  // a second budget selecting a
  auto out = s->RunDefragPass();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->pod, "");
  ASSERT_EQ(out->notes.size(), 1u);
  EXPECT_THAT(out->notes[0], HasSubstr("cannot move"));
  for (const char* p : {"a", "b", "c", "d"}) EXPECT_TRUE(Exists(p)) << p;
  EXPECT_THAT(Holds(), IsEmpty());
}

TEST_F(DefragmenterTest, ExpiredReservationsAreTidied) {
  SchedulerServer* s = Cluster(DefragMode::kOn);
  ASSERT_TRUE(s->RunDefragPass().ok());
  ASSERT_EQ(Holds().size(), 1u);
  clock_.Advance(absl::Minutes(11));
  auto out = s->RunDefragPass();
  ASSERT_TRUE(out.ok());
  EXPECT_THAT(out->tidied, ElementsAre(HasSubstr("default/big (expired)")));
  EXPECT_THAT(Holds(), IsEmpty());
  EXPECT_THAT(EventMessages("big", "DefragReservationExpired"), ::testing::SizeIs(1));
}

// The flag: a percentage 0..100; anything else is refused naming the flag, the options untouched.
TEST(DefragFlagsTest, HeadroomIsAPercentage) {
  for (int64_t ok : {0, 1, 100}) {
    DefragFlags f;
    f.headroom_percent = ok;
    DefragmenterOptions o;
    absl::Duration every;
    ASSERT_TRUE(ApplyDefragFlags(f, o, every).ok()) << ok;
    EXPECT_EQ(o.headroom_percent, static_cast<uint32_t>(ok));
  }
  for (int64_t bad : {int64_t{-1}, int64_t{101}, int64_t{1} << 40, INT64_MIN}) {
    DefragFlags f;
    f.headroom_percent = bad;
    DefragmenterOptions o;
    o.headroom_percent = 7;
    absl::Duration every;
    auto st = ApplyDefragFlags(f, o, every);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(st.message()), HasSubstr("--defrag-headroom")) << bad;
    EXPECT_EQ(o.headroom_percent, 7u);
  }
}

}  // namespace
}  // namespace dynmig::scheduler::testing
