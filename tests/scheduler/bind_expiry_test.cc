// /bind (node lock, bind-phase, Binding, failure cleanup) and reservation expiry with the
// injected clock.
#include <gmock/gmock.h>

#include <thread>

#include "scheduler/node_lock.h"
#include "scheduler_test_util.h"

namespace dynmig::scheduler::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class BindTest : public SchedulerTest {
 protected:
  void SetUp() override {
    SchedulerTest::SetUp();
    CreateNode(MigNode("node-a", {"GPU-a0"}));
    SchedulerServerOptions options = DefaultOptions();
    options.extender.lock_queue.wait = absl::Seconds(2);
    s_ = StartScheduler(std::move(options));
    WaitForNodes(s_, {"node-a"});
  }
  // Creates a MIG pod and reserves it on node-a.
  kube::Object Reserved(const std::string& name, int64_t mem = 4000) {
    kube::Object pod = CreatePod(MigPod(name, mem));
    HttpResult r = Filter(s_, pod, {"node-a"});
    EXPECT_THAT(r.body["NodeNames"], ElementsAre("node-a")) << r.text;
    return GetPod(name);
  }
  std::optional<std::string> Lock() {
    return kube::Annotation(*client_->GetNode("node-a"), protocol::kNodeLockAnnotation);
  }
  // The lock as the bind writes it for pod `name` now: with the pod's UID.
  std::string LockOf(const std::string& name) {
    return protocol::FormatNodeLock({clock_.Now(), "default", name, kube::Uid(GetPod(name))});
  }
  // What the device plugin does once it has identified pod `name`.
  absl::Status Unlock(const std::string& name) {
    const std::string uid = kube::Uid(GetPod(name));
    return ReleaseNodeLock(*client_, "node-a", {"default", name, uid});
  }
  SchedulerServer* s_ = nullptr;
};

TEST_F(BindTest, BindTakesTheNodeLockMarksAllocatingAndBinds) {
  const kube::Object pod = Reserved("p");
  HttpResult r = Bind(s_, pod, "node-a");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.body, (json{{"Error", ""}}));
  const kube::Object bound = GetPod("p");
  EXPECT_EQ(kube::NodeName(bound), "node-a");
  EXPECT_EQ(kube::Annotation(bound, "hami.io/bind-phase"), "allocating");
  EXPECT_EQ(kube::Annotation(bound, "hami.io/bind-time"),
            std::to_string(absl::ToUnixSeconds(clock_.Now())));
  EXPECT_EQ(Lock(), LockOf("p"));
  EXPECT_THAT(s_->MetricsText(), HasSubstr("dynmig_scheduler_bind_total{outcome=\"bound\"} 1"));

  // The lock is held until the device plugin releases it: the next pod's bind waits for it (up
  // to lock_queue.wait) instead of bouncing off it.
  const kube::Object q = Reserved("q");
  HttpResult waited;
  std::thread binding([&] { waited = Bind(s_, q, "node-a"); });
  ASSERT_TRUE(kube::testing::Eventually([&] {
    auto a = s_->state().Assumed("default/q");
    return a.has_value() && a->binding;
  }));
  ASSERT_TRUE(kube::testing::Eventually([&] {
    return s_->MetricsText().find("dynmig_scheduler_binds_waiting_for_node_lock 1\n") !=
           std::string::npos;
  }));
  ASSERT_TRUE(Unlock("p").ok());
  binding.join();
  EXPECT_THAT(s_->MetricsText(), HasSubstr("dynmig_scheduler_binds_waiting_for_node_lock 0\n"));
  EXPECT_EQ(waited.body["Error"], "") << waited.text;
  EXPECT_EQ(kube::NodeName(GetPod("q")), "node-a");
  EXPECT_EQ(Lock(), LockOf("q"));
  // A lock that stays is refused after the wait (2 s of the scheduler's clock here), with the
  // reason: the bind queues, then the time passes.
  const kube::Object v = Reserved("v");
  std::thread refusing([&] { r = Bind(s_, v, "node-a"); });
  ASSERT_TRUE(kube::testing::Eventually([&] {
    return s_->MetricsText().find("dynmig_scheduler_binds_waiting_for_node_lock 1\n") !=
           std::string::npos;
  }));
  clock_.Advance(absl::Seconds(3));
  refusing.join();
  EXPECT_THAT(
      r.body["Error"].get<std::string>(),
      HasSubstr("node node-a is locked by default/q (uid " + kube::Uid(GetPod("q")) + ") since"));
  EXPECT_THAT(r.body["Error"].get<std::string>(), HasSubstr("waited 2s for it"));
  EXPECT_EQ(kube::NodeName(GetPod("v")), "");
  ASSERT_TRUE(Unlock("q").ok());
  EXPECT_EQ(Bind(s_, v, "node-a").body["Error"], "");
  // A lock left behind for more than five minutes is taken over.
  const kube::Object w = Reserved("w");
  clock_.Advance(absl::Minutes(6));
  EXPECT_EQ(Bind(s_, w, "node-a").body["Error"], "");
  EXPECT_EQ(Lock(), LockOf("w"));
}

// A second bind of a pod already bound (a retry whose answer was lost, a lagging scheduler cache)
// touches nothing: the device plugin may be allocating it or have set bind-phase=success.
TEST_F(BindTest, ABoundPodIsNeverBoundAgain) {
  const kube::Object pod = Reserved("p");
  ASSERT_EQ(Bind(s_, pod, "node-a").body["Error"], "");
  // The device plugin allocated it: success, lock released.
  ASSERT_TRUE(
      client_->PatchPodAnnotations("default", "p", {{"hami.io/bind-phase", "success"}}).ok());
  ASSERT_TRUE(Unlock("p").ok());
  EXPECT_EQ(Bind(s_, pod, "node-a").body["Error"], "") << "the same node: already done";
  EXPECT_EQ(kube::Annotation(GetPod("p"), "hami.io/bind-phase"), "success");
  EXPECT_FALSE(Lock().has_value()) << "the lock was taken again";
  EXPECT_EQ(Bind(s_, pod, "node-b").body["Error"],
            "bind default/p: the pod is already bound to node node-a");
  EXPECT_EQ(kube::Annotation(GetPod("p"), "hami.io/bind-phase"), "success");
}

TEST_F(BindTest, BindRefusesPodsWithoutAMatchingReservation) {
  const kube::Object pod = Reserved("p");
  EXPECT_EQ(Bind(s_, pod, "node-b").body["Error"],
            "bind default/p: the pod's MIG reservation is on node node-a, not node-b");
  // Never filtered by this replica: refused, nothing written.
  const kube::Object bare = CreatePod(MigPod("bare", 4000));
  EXPECT_EQ(Bind(s_, bare, "node-a").body["Error"].get<std::string>(),
            "bind default/bare: the pod holds no MIG reservation of this extender "
            "(hami.io/vgpu-mig-allocations); it must pass this extender's filter first");
  EXPECT_EQ(kube::ResourceVersion(GetPod("bare")), kube::ResourceVersion(bare));
  EXPECT_THAT(
      Post(s_->port(), "/bind", R"({"PodName":"gone","PodNamespace":"default","Node":"node-a"})")
          .body["Error"]
          .get<std::string>(),
      HasSubstr("bind default/gone:"));
  kube::Object wrong_uid = pod;
  wrong_uid["metadata"]["uid"] = "not-the-uid";
  EXPECT_THAT(Bind(s_, wrong_uid, "node-a").body["Error"].get<std::string>(),
              HasSubstr("(recreated?)"));
  EXPECT_FALSE(Lock().has_value());
  // A pod that is not a MIG pod is not ours to bind (bind_guard.h).
  kube::Object cpu = kube::testing::MakePod("cpu");
  cpu["spec"]["schedulerName"] = "dynmig-scheduler";
  cpu["spec"]["containers"][0]["resources"] = {{"limits", {{"cpu", "1"}}}};
  EXPECT_THAT(Bind(s_, CreatePod(cpu), "node-a").body["Error"].get<std::string>(),
              HasSubstr("bind refused: pod default/cpu is not a MIG pod"));
  EXPECT_EQ(kube::NodeName(GetPod("cpu")), "");
  EXPECT_FALSE(Lock().has_value());
}

TEST_F(BindTest, AFailedBindingReleasesTheLockAndMarksTheFailure) {
  const kube::Object pod = Reserved("p");
  kube::FaultSpec fault;
  fault.method = "POST";
  fault.path_prefix = "/api/v1/namespaces/default/pods/p/binding";
  fault.status = 500;
  fault.message = "etcd is on fire";
  api_->AddFault(fault);
  HttpResult r = Bind(s_, pod, "node-a");
  EXPECT_THAT(r.body["Error"].get<std::string>(), HasSubstr("etcd is on fire"));
  EXPECT_FALSE(Lock().has_value());
  EXPECT_EQ(kube::Annotation(GetPod("p"), "hami.io/bind-phase"), "failed");
  EXPECT_EQ(kube::NodeName(GetPod("p")), "");
  EXPECT_THAT(s_->MetricsText(), HasSubstr("dynmig_scheduler_bind_total{outcome=\"error\"} 1"));
  // kube-scheduler retries: the reservation is still there and the bind now succeeds.
  EXPECT_EQ(Bind(s_, pod, "node-a").body["Error"], "");
  EXPECT_EQ(kube::Annotation(GetPod("p"), "hami.io/bind-phase"), "allocating");
}

// After a restart or a change of leader the filter's in-memory reservation is gone: the bind is
// refused (nothing written, the lock untouched) and the pod's next filter plans it again.
TEST_F(BindTest, ABindThatFindsNoReservationIsRefusedAndTheNextFilterPlansAgain) {
  const kube::Object p = Reserved("p", 19000);
  ASSERT_EQ(ReservedOf(s_, "p").size(), 1u);
  SchedulerServer* fresh = StartScheduler(DefaultOptions());  // the new leader
  WaitForNodes(fresh, {"node-a"});
  EXPECT_FALSE(fresh->state().Assumed("default/p").has_value());
  EXPECT_THAT(Bind(fresh, p, "node-a").body["Error"].get<std::string>(),
              HasSubstr("holds no MIG reservation of this extender"));
  EXPECT_TRUE(AllocationsOf("p").empty());
  EXPECT_EQ(kube::ResourceVersion(GetPod("p")), kube::ResourceVersion(p));
  EXPECT_FALSE(Lock().has_value());
  ASSERT_THAT(Filter(fresh, p, {"node-a"}).body["NodeNames"], ElementsAre("node-a"));
  ASSERT_EQ(Bind(fresh, p, "node-a").body["Error"], "");
  const auto written = AllocationsOf("p");
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(written[0].profile, "3g.20gb");
  EXPECT_EQ(kube::NodeName(GetPod("p")), "node-a");
}

TEST_F(BindTest, ReservationsWhoseBindNeverComesExpireAfterTheTtl) {
  // p: filtered, never bound (in memory only). q: its bind wrote the reservation, then the
  // Binding failed (annotated, unbound, bind-phase failed).
  const kube::Object p = Reserved("p", 19000);
  const kube::Object q = Reserved("q", 19000);
  kube::FaultSpec fault;
  fault.method = "POST";
  fault.path_prefix = "/api/v1/namespaces/default/pods/q/binding";
  fault.status = 500;
  fault.message = "etcd is on fire";
  api_->AddFault(fault);
  EXPECT_THAT(Bind(s_, q, "node-a").body["Error"].get<std::string>(), HasSubstr("on fire"));
  api_->ClearFaults();
  WaitForReservationSeen(s_, "default/q");
  clock_.Advance(absl::Minutes(9));
  EXPECT_THAT(s_->ExpireReservations().released, IsEmpty());
  clock_.Advance(absl::Minutes(2));
  auto result = s_->ExpireReservations();
  EXPECT_THAT(result.released, ::testing::UnorderedElementsAre("default/p", "default/q"));
  EXPECT_THAT(result.errors, IsEmpty());
  EXPECT_FALSE(s_->state().Assumed("default/p").has_value());
  EXPECT_EQ(kube::ResourceVersion(GetPod("p")), kube::ResourceVersion(p)) << "never written";
  const kube::Object cleared = GetPod("q");
  for (const auto& key : ReservationAnnotationKeys()) {
    EXPECT_FALSE(kube::Annotation(cleared, key).has_value()) << key;
  }
  EXPECT_FALSE(kube::Label(cleared, "hami.io/vgpu-node").has_value());
  EXPECT_EQ(EventMessages("q", "MigReservationExpired").size(), 1u);
  EXPECT_THAT(s_->MetricsText(),
              HasSubstr("dynmig_scheduler_reservation_expiries_total{action=\"released\"} 1"));
  EXPECT_THAT(s_->MetricsText(),
              HasSubstr("dynmig_scheduler_reservation_expiries_total{action=\"forgotten\"} 1"));
  // The slices are free again once the watch delivers the change: two 3g fit.
  ASSERT_TRUE(kube::testing::Eventually(
      [&] { return s_->state().View("node-a", clock_.Now())->gpus[0].usage.occupied == 0; }));
  EXPECT_THAT(Filter(s_, CreatePod(MigPod("a", 19000)), {"node-a"}).body["NodeNames"],
              ElementsAre("node-a"));
  EXPECT_THAT(Filter(s_, CreatePod(MigPod("b", 19000)), {"node-a"}).body["NodeNames"],
              ElementsAre("node-a"));
  // q itself is scheduled again from scratch: no room left.
  EXPECT_THAT(Filter(s_, GetPod("q"), {"node-a"}).body["NodeNames"], IsEmpty());
}

TEST_F(BindTest, BoundPodsKeepTheirReservationUnlessTheDevicePluginFailed) {
  const kube::Object p = Reserved("p", 19000);
  const kube::Object q = Reserved("q", 19000);
  ASSERT_EQ(Bind(s_, p, "node-a").body["Error"], "");
  ASSERT_TRUE(Unlock("p").ok());
  ASSERT_EQ(Bind(s_, q, "node-a").body["Error"], "");
  // The device plugin failed q's Allocate; p is still allocating.
  ASSERT_TRUE(
      client_->PatchPodAnnotations("default", "q", {{"hami.io/bind-phase", "failed"}}).ok());
  ASSERT_TRUE(kube::testing::Eventually([&] {
    auto pod = client_->GetPod("default", "q");
    return pod.ok() && kube::Annotation(*pod, "hami.io/bind-phase") == "failed";
  }));
  WaitForReservationSeen(s_, "default/p");
  WaitForReservationSeen(s_, "default/q");
  clock_.Advance(absl::Minutes(11));
  // The informer may still deliver q's update: expire until it is released.
  std::vector<std::string> released;
  ASSERT_TRUE(kube::testing::Eventually([&] {
    auto r = s_->ExpireReservations();
    released.insert(released.end(), r.released.begin(), r.released.end());
    return !released.empty();
  }));
  EXPECT_THAT(released, ElementsAre("default/q"));
  auto r = s_->ExpireReservations();
  EXPECT_THAT(r.kept, ElementsAre("default/p"));
  EXPECT_THAT(r.released, IsEmpty());
  // q's slices no longer count (its annotation stays: the pod is bound); p's do.
  const auto view = s_->state().View("node-a", clock_.Now());
  const auto p_slices = AllocationsOf("p")[0].placement.Mask();
  EXPECT_EQ(view->gpus[0].usage.occupied, p_slices);
  EXPECT_TRUE(kube::Annotation(GetPod("q"), "hami.io/vgpu-mig-allocations").has_value());
  EXPECT_THAT(s_->MetricsText(),
              HasSubstr("dynmig_scheduler_reservation_expiries_total{action=\"bind-failed\"} 1"));
}

TEST_F(BindTest, RealizedReservationsNeverExpireAndShowInTheHamiMetric) {
  const kube::Object p = Reserved("p", 19000);
  ASSERT_EQ(Bind(s_, p, "node-a").body["Error"], "");
  // The device plugin records the runtime identity.
  auto allocs = AllocationsOf("p");
  allocs[0].runtime = protocol::RuntimeIdentity{"MIG-1234", 2, 0};
  ASSERT_TRUE(client_
                  ->PatchPodAnnotations(
                      "default", "p",
                      {{"hami.io/vgpu-mig-allocations", protocol::EncodeMigAllocations(allocs)},
                       {"hami.io/bind-phase", "success"}})
                  .ok());
  const std::string expected = fmt::format(
      "hami_node_gpu_mig_instance_info{{node=\"node-a\",device_uuid=\"GPU-a0\",device_index=\"0\","
      "mig_uuid=\"MIG-1234\",profile=\"3g.20gb\",gpu_instance_id=\"2\",compute_instance_id=\"0\","
      "placement_start=\"{}\",placement_size=\"4\"}} 1",
      allocs[0].placement.start);
  ASSERT_TRUE(kube::testing::Eventually([&] {
    return s_->MetricsText().find(expected) != std::string::npos;
  })) << s_->MetricsText();
  clock_.Advance(absl::Hours(2));
  auto r = s_->ExpireReservations();
  EXPECT_THAT(r.released, IsEmpty());
  EXPECT_THAT(r.kept, IsEmpty());
  // Over HTTP too.
  HttpResult metrics = Get(s_->port(), "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_THAT(metrics.text, HasSubstr(expected));
  EXPECT_THAT(metrics.text, HasSubstr("dynmig_scheduler_filter_duration_seconds_bucket"));
  EXPECT_THAT(metrics.text, HasSubstr("dynmig_scheduler_reserved_instances{state=\"ready\"} 1"));
  // The bind took the node's lock (no device plugin releases it here): its age, two hours on.
  EXPECT_THAT(metrics.text,
              HasSubstr("dynmig_scheduler_node_lock_held_seconds{node=\"node-a\"} 72"));
  // The bind observed the pod's wait once, under its profile.
  EXPECT_THAT(metrics.text,
              HasSubstr("dynmig_scheduler_pod_wait_seconds_count{profile=\"3g.20gb\"} 1"));
}

}  // namespace
}  // namespace dynmig::scheduler::testing
