// /filter over HTTP against the in-memory API server: the spec's scheduling checks (the profile
// covers the memory, no overlap with any active reservation, Pending with a reason when
// exhausted, the preference honored and never blocking), pass-through, idempotent retries,
// fail-closed cases and concurrent filters.
#include <gmock/gmock.h>

#include <set>
#include <thread>

#include "common/mutex.h"
#include "kube/informer.h"
#include "scheduler_test_util.h"

namespace dynmig::scheduler::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// kube-scheduler v1.20 ignores only annotation and nodeName updates of a pod it has assumed: any
// other change before the binding requeues the pod, whose second attempt fails with "pod <uid> is
// in the cache, so can't be assumed". So the bind labels the pod only once it is bound.
TEST_F(SchedulerTest, BindChangesOnlyAnnotationsBeforeTheBindingAndLabelsThePodAfter) {
  CreateNode(MigNode("node-a", {"GPU-a0"}));
  SchedulerServer* s = StartScheduler();
  WaitForNodes(s, {"node-a"});
  const kube::Object pod = CreatePod(MigPod("p", 4000));
  dynmig::Mutex mu;
  std::vector<std::string> changed_before_binding;  // what else an unbound pod's update changed
  bool bound_seen = false;
  kube::Informer pods(*client_, kube::Resource::kPods);
  kube::InformerHandlers h;
  h.on_update = [&](const kube::Object& old_pod, const kube::Object& new_pod) {
    dynmig::MutexLock lock(&mu);
    if (!kube::NodeName(new_pod).empty()) {
      bound_seen = true;
      return;
    }
    auto strip = [](kube::Object p) {
      p["metadata"].erase("resourceVersion");
      p["metadata"].erase("annotations");
      p["metadata"].erase("managedFields");
      return p;
    };
    if (strip(old_pod) != strip(new_pod)) {
      changed_before_binding.push_back(nlohmann::json::diff(strip(old_pod), strip(new_pod)).dump());
    }
  };
  pods.AddHandlers(h);
  pods.Start();
  ASSERT_TRUE(pods.WaitForSync(absl::Seconds(10)));

  ASSERT_EQ(Filter(s, pod, {"node-a"}).body["Error"], "");
  ASSERT_EQ(Bind(s, pod, "node-a").body["Error"], "");
  EXPECT_TRUE(kube::testing::Eventually([&] {
    dynmig::MutexLock lock(&mu);
    return bound_seen;
  }));
  pods.Stop();
  EXPECT_THAT(changed_before_binding, IsEmpty());
  EXPECT_EQ(kube::Label(GetPod("p"), "hami.io/vgpu-node"), "node-a");
}

TEST_F(SchedulerTest, FilterReservesAProfileThatCoversTheMemoryAndBindWritesTheAnnotations) {
  CreateNode(MigNode("node-a", {"GPU-a0"}));
  CreateNode(kube::testing::MakeNode("node-cpu"));
  SchedulerServer* s = StartScheduler();
  WaitForNodes(s, {"node-a"});
  const kube::Object pod = CreatePod(MigPod("p", 8000));

  HttpResult r = Filter(s, pod, {"node-a", "node-cpu"});
  ASSERT_EQ(r.status, 200) << r.text;
  EXPECT_EQ(r.body["Error"], "");
  EXPECT_THAT(r.body["NodeNames"], ElementsAre("node-a"));
  // node-cpu can never run the pod: it keeps its reason.
  EXPECT_THAT(r.body["FailedNodes"]["node-cpu"].get<std::string>(), HasSubstr("no-mig-gpu"));
  // The filter does not update the pod (kube-scheduler would requeue it): the reservation is
  // held in memory until the bind.
  EXPECT_EQ(kube::ResourceVersion(GetPod("p")), kube::ResourceVersion(pod));
  auto allocs = ReservedOf(s, "p");
  ASSERT_EQ(allocs.size(), 1u);
  // 8000 MiB: 1g.5gb (4864 MiB) is too small, 2g.10gb (9856 MiB) covers it.
  EXPECT_EQ(allocs[0].profile, "2g.10gb");
  EXPECT_EQ(allocs[0].gpu_uuid, "GPU-a0");
  const auto events = EventMessages("p", "MigReserved");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(
      events[0],
      fmt::format("reserved 2g.10gb (9856 MiB in NVML for 8000 MiB asked) at slices {} of GPU-a0 "
                  "on node-a",
                  allocs[0].placement.ToString()));
  EXPECT_THAT(s->MetricsText(), HasSubstr("dynmig_scheduler_reservations_total 1"));

  ASSERT_EQ(Bind(s, pod, "node-a").body["Error"], "");
  const kube::Object stored = GetPod("p");
  const auto ann = kube::Annotations(stored);
  EXPECT_EQ(kube::NodeName(stored), "node-a");
  EXPECT_EQ(ann.at("hami.io/vgpu-node"), "node-a");
  EXPECT_EQ(kube::Label(stored, "hami.io/vgpu-node"), "node-a");
  EXPECT_EQ(ann.at("hami.io/vgpu-time"), std::to_string(absl::ToUnixSeconds(clock_.Now())));
  EXPECT_EQ(ann.at("hami.io/bind-phase"), "allocating");
  const auto written = AllocationsOf("p");
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(written[0].profile, "2g.10gb");
  EXPECT_EQ(written[0].placement, allocs[0].placement);
  EXPECT_FALSE(written[0].runtime.has_value());
  EXPECT_EQ(ann.at("hami.io/vgpu-devices-to-allocate"), ann.at("hami.io/vgpu-devices-allocated"));
  EXPECT_EQ(ann.at("hami.io/vgpu-devices-allocated"), "GPU-a0,NVIDIA A100-SXM4-40GB,9856,29:;");
  WaitForReservationSeen(s, "default/p");
}

TEST_F(SchedulerTest, ReservationsNeverOverlapAndExhaustionLeavesThePodPendingWithAReason) {
  CreateNode(MigNode("node-a", {"GPU-a0"}));
  // A running pod holds 3g.20gb at slices 4-7.
  kube::Object running = MigPod("running", 19000,
                                {{"hami.io/vgpu-mig-allocations", Alloc("GPU-a0", "3g.20gb", 4, 4)},
                                 {"hami.io/vgpu-node", "node-a"}});
  running["spec"]["nodeName"] = "node-a";
  CreatePod(running);
  SchedulerServer* s = StartScheduler();
  WaitForNodes(s, {"node-a"});
  WaitForReservationSeen(s, "default/running");

  // 1g, 2g and 1g fit into slices 0-3 around the running 3g, never overlapping it or each other.
  std::vector<mig::Placement> taken = {{4, 4}};
  for (auto [name, mem] : {std::pair{"small-1", 4000}, {"mid", 9000}, {"small-2", 4000}}) {
    HttpResult r = Filter(s, CreatePod(MigPod(name, mem)), {"node-a"});
    ASSERT_EQ(r.body["Error"], "") << r.text;
    ASSERT_THAT(r.body["NodeNames"], ElementsAre("node-a")) << r.text;
    auto allocs = ReservedOf(s, name);
    ASSERT_EQ(allocs.size(), 1u);
    for (const auto& t : taken) {
      EXPECT_FALSE(allocs[0].placement.Overlaps(t))
          << name << " at " << allocs[0].placement.ToString() << " overlaps " << t.ToString();
    }
    taken.push_back(allocs[0].placement);
  }
  // The GPU is full: Pending, with the reason per node, and an event.
  const kube::Object late = CreatePod(MigPod("late", 4000));
  HttpResult r = Filter(s, late, {"node-a"});
  EXPECT_EQ(r.body["Error"], "");
  EXPECT_THAT(r.body["NodeNames"], IsEmpty());
  EXPECT_THAT(r.body["FailedNodes"]["node-a"].get<std::string>(), HasSubstr("capacity-exhausted"));
  EXPECT_FALSE(kube::Annotation(GetPod("late"), "hami.io/vgpu-mig-allocations").has_value());
  const auto pending = EventMessages("late", "MigPending");
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_THAT(pending[0], HasSubstr("pending: no candidate node fits (best verdict: "
                                    "capacity-exhausted); node-a: capacity-exhausted"));
  // Deleting a small pod frees its slice for the pending one (placement reuse).
  ASSERT_TRUE(client_->DeletePod("default", "small-1").ok());
  EXPECT_TRUE(kube::testing::Eventually(
      [&] { return Filter(s, late, {"node-a"}).body["NodeNames"] == json::array({"node-a"}); }));
}

TEST_F(SchedulerTest, SeveralOneGInstancesAndMixedProfilesShareOneGpuWithoutOverlap) {
  CreateNode(MigNode("node-a", {"GPU-a0"}));
  SchedulerServer* s = StartScheduler();
  WaitForNodes(s, {"node-a"});
  // One pod, two containers: 2 x 1g and 1 x 3g (mixed), then 2 more single 1g pods.
  const kube::Object mixed =
      CreatePod(MigPod("mixed", std::vector<Ctr>{{"a", 2, 4000}, {"b", 1, 19000}}));
  HttpResult r = Filter(s, mixed, {"node-a"});
  ASSERT_EQ(r.body["Error"], "") << r.text;
  auto allocs = ReservedOf(s, "mixed");
  ASSERT_EQ(allocs.size(), 3u);
  std::vector<mig::Placement> taken;
  for (const auto& a : allocs) taken.push_back(a.placement);
  for (const char* name : {"one", "two"}) {
    ASSERT_EQ(Filter(s, CreatePod(MigPod(name, 4000)), {"node-a"}).body["Error"], "");
    for (const auto& a : ReservedOf(s, name)) {
      EXPECT_EQ(a.profile, "1g.5gb");
      taken.push_back(a.placement);
    }
  }
  std::set<std::string> profiles;
  for (const auto& a : allocs) profiles.insert(a.profile);
  EXPECT_EQ(profiles, (std::set<std::string>{"1g.5gb", "3g.20gb"}));
  for (size_t i = 0; i < taken.size(); ++i) {
    for (size_t j = i + 1; j < taken.size(); ++j) {
      EXPECT_FALSE(taken[i].Overlaps(taken[j]))
          << taken[i].ToString() << " " << taken[j].ToString();
    }
  }
}

TEST_F(SchedulerTest, PreferenceIsHonoredAndNeverBlocks) {
  CreateNode(MigNode("node-a", {"GPU-a0"}));
  CreateNode(MigNode("node-b", {"GPU-b0"}));
  CreateNode(MigNode("node-c", {"GPU-c0"}));
  SchedulerServer* s = StartScheduler();
  WaitForNodes(s, {"node-a", "node-b", "node-c"});
  const json pref4g = {{"nvidia.com/mig-profile-preference", "4g"}};
  // Without a preference 19000 MiB resolves to 3g.20gb (same memory as 4g.20gb, fewer slices).
  ASSERT_EQ(Filter(s, CreatePod(MigPod("plain", 19000)), {"node-b"}).body["Error"], "");
  EXPECT_EQ(ReservedOf(s, "plain")[0].profile, "3g.20gb");
  // With "4g" on an empty GPU: 4g.20gb at 0-3.
  HttpResult r = Filter(s, CreatePod(MigPod("prefers", 19000, pref4g)), {"node-c"});
  ASSERT_EQ(r.body["Error"], "") << r.text;
  EXPECT_EQ(ReservedOf(s, "prefers")[0].profile, "4g.20gb");
  EXPECT_EQ(ReservedOf(s, "prefers")[0].placement, (mig::Placement{0, 4}));
  // A 1g at slice 0 blocks 4g.20gb's only placement: the default order wins, no rejection.
  ASSERT_EQ(Filter(s, CreatePod(MigPod("small", 4000)), {"node-a"}).body["Error"], "");
  ASSERT_EQ(ReservedOf(s, "small")[0].placement, (mig::Placement{0, 1}));
  r = Filter(s, CreatePod(MigPod("fallback", 19000, pref4g)), {"node-a"});
  ASSERT_EQ(r.body["Error"], "") << r.text;
  EXPECT_THAT(r.body["NodeNames"], ElementsAre("node-a"));
  EXPECT_EQ(ReservedOf(s, "fallback")[0].profile, "3g.20gb");
  EXPECT_EQ(ReservedOf(s, "fallback")[0].placement, (mig::Placement{4, 4}));
  // A preference never picks a profile smaller than the request.
  r = Filter(s, CreatePod(MigPod("no-shrink", 9000, {{"nvidia.com/mig-profile-preference", "1g"}})),
             {"node-b"});
  ASSERT_EQ(r.body["Error"], "") << r.text;
  EXPECT_EQ(ReservedOf(s, "no-shrink")[0].profile, "2g.10gb");
}

// Only MIG pods of our scheduler name are filtered (bind_guard.h); others get an Error and nothing
// is written.
TEST_F(SchedulerTest, PodsThatAreNotMigPodsAreRefused) {
  CreateNode(MigNode("node-a", {"GPU-a0"}));
  SchedulerServer* s = StartScheduler();
  WaitForNodes(s, {"node-a"});
  kube::Object cpu = kube::testing::MakePod("cpu");
  cpu["spec"]["schedulerName"] = "dynmig-scheduler";
  cpu["spec"]["containers"][0]["resources"] = {{"limits", {{"cpu", "1"}}}};
  HttpResult r = Filter(s, CreatePod(cpu), {"node-a", "node-x"});
  EXPECT_THAT(r.body["Error"].get<std::string>(), HasSubstr("pod default/cpu is not a MIG pod"));
  EXPECT_THAT(r.body["NodeNames"], IsEmpty()) << r.text;
  kube::Object core = CreatePod(MigPod("core", 4000, {{"nvidia.com/vgpu-mode", "hami-core"}}));
  r = Filter(s, core, {"node-a", "node-x"});
  EXPECT_THAT(r.body["Error"].get<std::string>(), HasSubstr("pod default/core is not a MIG pod"));
  EXPECT_FALSE(kube::Annotation(GetPod("core"), "hami.io/vgpu-mig-allocations").has_value());
  // The NodeList form (nodeCacheCapable: false) is answered with the passing items.
  json nodes = {{"metadata", json::object()},
                {"items", json::array({kube::testing::MakeNode("node-a"),
                                       kube::testing::MakeNode("node-x")})}};
  HttpResult listed = Post(
      s->port(), "/filter",
      json{{"Pod", CreatePod(MigPod("listed", 4000))}, {"Nodes", nodes}, {"NodeNames", nullptr}}
          .dump());
  ASSERT_EQ(listed.body["Error"], "") << listed.text;
  EXPECT_TRUE(listed.body["NodeNames"].is_null());
  ASSERT_EQ(listed.body["Nodes"]["items"].size(), 1u);
  EXPECT_EQ(listed.body["Nodes"]["items"][0]["metadata"]["name"], "node-a");
  EXPECT_THAT(listed.body["FailedNodes"]["node-x"].get<std::string>(), HasSubstr("no-mig-gpu"));
}

TEST_F(SchedulerTest, ARetriedFilterGetsTheReservedNodeBackWithoutASecondReservation) {
  CreateNode(MigNode("node-a", {"GPU-a0"}));
  CreateNode(MigNode("node-b", {"GPU-b0"}));
  SchedulerServer* s = StartScheduler();
  WaitForNodes(s, {"node-a", "node-b"});
  const kube::Object pod = CreatePod(MigPod("p", 19000));
  HttpResult first = Filter(s, pod, {"node-a", "node-b"});
  ASSERT_EQ(first.body["Error"], "") << first.text;
  const std::string node = first.body["NodeNames"][0];
  const auto before = ReservedOf(s, "p");
  ASSERT_EQ(before.size(), 1u);
  auto count_reservations = [&] {
    int reservations = 0;
    for (const auto& n : s->state().Report(clock_.Now())) {
      for (const auto& g : n.gpus) reservations += static_cast<int>(g.reservations.size());
    }
    return reservations;
  };
  // Retried: same node, same reservation, nothing written.
  HttpResult again = Filter(s, pod, {"node-a", "node-b"});
  ASSERT_EQ(again.body["Error"], "") << again.text;
  EXPECT_THAT(again.body["NodeNames"], ElementsAre(node));
  EXPECT_EQ(ReservedOf(s, "p")[0].placement, before[0].placement);
  EXPECT_EQ(count_reservations(), 1);
  EXPECT_EQ(kube::ResourceVersion(GetPod("p")), kube::ResourceVersion(pod));
  // When its node is no longer a candidate, the pod is planned again elsewhere (in memory).
  const std::string other = node == "node-a" ? "node-b" : "node-a";
  HttpResult moved = Filter(s, pod, {other});
  ASSERT_EQ(moved.body["Error"], "") << moved.text;
  EXPECT_THAT(moved.body["NodeNames"], ElementsAre(other));
  EXPECT_EQ(ReservedOf(s, "p")[0].gpu_uuid, other == "node-a" ? "GPU-a0" : "GPU-b0");
  EXPECT_EQ(count_reservations(), 1);

  // A reservation the pod carries (its bind wrote it, then the Binding failed): the same.
  kube::FaultSpec fault;
  fault.method = "POST";
  fault.path_prefix = "/api/v1/namespaces/default/pods/p/binding";
  fault.status = 500;
  fault.message = "no";
  api_->AddFault(fault);
  EXPECT_THAT(Bind(s, pod, other).body["Error"].get<std::string>(), HasSubstr("no"));
  api_->ClearFaults();
  WaitForReservationSeen(s, "default/p");
  const kube::Object carried = GetPod("p");
  EXPECT_EQ(kube::Annotation(carried, "hami.io/vgpu-node"), other);
  HttpResult kept = Filter(s, carried, {"node-a", "node-b"});
  EXPECT_THAT(kept.body["NodeNames"], ElementsAre(other));
  HttpResult cleared = Filter(s, carried, {node});
  ASSERT_EQ(cleared.body["Error"], "") << cleared.text;
  EXPECT_THAT(cleared.body["NodeNames"], ElementsAre(node));
  EXPECT_FALSE(kube::Annotation(GetPod("p"), "hami.io/vgpu-node").has_value());
  EXPECT_EQ(ReservedOf(s, "p")[0].gpu_uuid, node == "node-a" ? "GPU-a0" : "GPU-b0");
}

TEST_F(SchedulerTest, BadRequestsAreErrorsNamingContainerAndResource) {
  CreateNode(MigNode("node-a", {"GPU-a0"}));
  SchedulerServer* s = StartScheduler();
  WaitForNodes(s, {"node-a"});
  kube::Object pod = MigPod("bad", 0);
  pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "8Gi";
  HttpResult r = Filter(s, CreatePod(pod), {"node-a"});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body["Error"],
            "pod default/bad: container \"workload\" (containers[0]): nvidia.com/gpumem: \"8Gi\" "
            "has a binary suffix; it counts MiB: write 8192 for 8Gi");
  // Too big for any allowlisted profile: pending with the reason, not an error.
  r = Filter(s, CreatePod(MigPod("huge", 50000)), {"node-a"});
  EXPECT_EQ(r.body["Error"], "");
  EXPECT_THAT(r.body["FailedNodes"]["node-a"].get<std::string>(),
              HasSubstr("no-profile-big-enough"));
}

// Attack (issue 27): a pod asking for 50,000 instances of 1000 MiB once pinned a core inside the
// planner under the cluster-state lock. Now every node refuses it in constant time with a reason
// that names what the node holds, and the next pod is served at once.
TEST_F(SchedulerTest, APodAskingForMoreInstancesThanANodeHoldsIsRefusedWithTheReason) {
  CreateNode(MigNode("node-a", {"GPU-a0", "GPU-a1"}));
  CreateNode(MigNode("node-b", {"GPU-b0"}));
  SchedulerServer* s = StartScheduler();
  WaitForNodes(s, {"node-a", "node-b"});
  HttpResult r =
      Filter(s, CreatePod(MigPod("greedy", {{"workload", 50000, 1000}})), {"node-a", "node-b"});
  EXPECT_EQ(r.body["Error"], "") << r.text;
  EXPECT_THAT(r.body["NodeNames"], IsEmpty());
  EXPECT_EQ(r.body["FailedNodes"]["node-a"],
            "capacity-exhausted: the pod asks for 50000 MIG instances; the 2 GPU(s) of this node "
            "it may use hold at most 14");
  EXPECT_EQ(r.body["FailedNodes"]["node-b"],
            "capacity-exhausted: the pod asks for 50000 MIG instances; the 1 GPU(s) of this node "
            "it may use hold at most 7");
  const auto pending = EventMessages("greedy", "MigPending");
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_THAT(pending[0], HasSubstr("capacity-exhausted: the pod asks for 50000 MIG instances"));
  // Many containers count together; legal pods are still placed.
  r = Filter(s, CreatePod(MigPod("many", std::vector<Ctr>(8, Ctr{"c", 1, 1000}))), {"node-b"});
  EXPECT_THAT(r.body["FailedNodes"]["node-b"].get<std::string>(),
              HasSubstr("asks for 8 MIG instances"));
  r = Filter(s, CreatePod(MigPod("seven", {{"workload", 7, 1000}})), {"node-b"});
  EXPECT_THAT(r.body["NodeNames"], ElementsAre("node-b")) << r.text;
}

// Lists the planner reads per GPU are bounded: a longer one is an Error naming the annotation.
TEST_F(SchedulerTest, OverlongSelectionListsAreRefusedBeforePlanning) {
  CreateNode(MigNode("node-a", {"GPU-a0"}));
  SchedulerServer* s = StartScheduler();
  WaitForNodes(s, {"node-a"});
  std::string preference;
  for (int i = 0; i < 129; ++i) preference += fmt::format("{}p{},", i == 0 ? "" : " ", i);
  HttpResult r = Filter(
      s, CreatePod(MigPod("picky", 4000, {{"nvidia.com/mig-profile-preference", preference}})),
      {"node-a"});
  EXPECT_EQ(r.body["Error"],
            "pod default/picky: nvidia.com/mig-profile-preference lists 129 entries; at most 128 "
            "are accepted");
  std::string uuids;
  for (int i = 0; i < 257; ++i) uuids += fmt::format("GPU-{},", i);
  r = Filter(s, CreatePod(MigPod("pinned", 4000, {{"nvidia.com/use-gpuuuid", uuids}})), {"node-a"});
  EXPECT_EQ(r.body["Error"],
            "pod default/pinned: nvidia.com/use-gpuuuid lists 257 entries; at most 256 are "
            "accepted");
  preference.resize(preference.rfind(" p128"));  // 128 entries: accepted
  r = Filter(s, CreatePod(MigPod("ok", 4000, {{"nvidia.com/mig-profile-preference", preference}})),
             {"node-a"});
  EXPECT_THAT(r.body["NodeNames"], ElementsAre("node-a")) << r.text;
}

// Attack (issue 27): a bound pod with nvidia.com/gpu: 0 whose vgpu-mode its owner removed holds
// nothing dynmig wrote: the node stays schedulable for another tenant.
TEST_F(SchedulerTest, APodWithoutDynmigsAnnotationsDoesNotBlockTheNode) {
  CreateNode(MigNode("node-a", {"GPU-a0"}));
  kube::Object plain = MigPod("plain0", {{"workload", 0, 0}}, json::object(), "tenant-b");
  plain["spec"]["nodeName"] = "node-a";
  CreatePod(plain);
  SchedulerServer* s = StartScheduler();
  WaitForNodes(s, {"node-a"});
  ASSERT_TRUE(
      kube::testing::Eventually([&] { return s->state().Report(clock_.Now()).size() == 1; }));
  HttpResult r =
      Filter(s, CreatePod(MigPod("canary", {{"workload", 1, 4000}}, json::object(), "tenant-a")),
             {"node-a"});
  EXPECT_THAT(r.body["NodeNames"], ElementsAre("node-a")) << r.text;
  const auto view = s->state().View("node-a", clock_.Now());
  ASSERT_TRUE(view.has_value());
  for (const auto& gpu : view->gpus) {
    EXPECT_TRUE(gpu.healthy) << gpu.unhealthy_reason;
  }
}

TEST_F(SchedulerTest, FailClosedGpusAndNodesAreNeverChosen) {
  // node-a: a MIG pod holds devices of both GPUs there (dynmig's device annotation) without a
  // reservation: they fail closed.
  CreateNode(MigNode("node-a", {"GPU-a0", "GPU-a1"}));
  kube::Object rogue =
      MigPod("rogue", 4000,
             {{"hami.io/vgpu-devices-allocated",
               "GPU-a0,NVIDIA A100-SXM4-40GB,4864,15:GPU-a1,NVIDIA A100-SXM4-40GB,4864,15:;"}});
  rogue["spec"]["nodeName"] = "node-a";
  CreatePod(rogue);
  // node-b: its register annotation is unreadable.
  kube::Object broken = MigNode("node-b", {"GPU-b0"});
  broken["metadata"]["annotations"]["hami.io/node-nvidia-register"] = "[{not json";
  CreateNode(broken);
  // node-c: the device plugin stopped reporting an hour ago.
  kube::Object stale = MigNode("node-c", {"GPU-c0"});
  stale["metadata"]["annotations"]["hami.io/node-handshake"] =
      "Reported_" + kube::Rfc3339(clock_.Now() - absl::Hours(1));
  CreateNode(stale);
  // node-d: one GPU holds an unreadable reservation; the other stays usable.
  CreateNode(MigNode("node-d", {"GPU-d0", "GPU-d1"}));
  kube::Object garbled =
      MigPod("garbled", 4000,
             {{"hami.io/vgpu-mig-allocations", "[{\"containerIndex\":0}]"},
              {"hami.io/vgpu-devices-allocated", "GPU-d0,NVIDIA A100-SXM4-40GB,4864,15:;"}});
  garbled["spec"]["nodeName"] = "node-d";
  CreatePod(garbled);
  SchedulerServer* s = StartScheduler();
  WaitForNodes(s, {"node-a", "node-b", "node-c", "node-d"});
  ASSERT_TRUE(kube::testing::Eventually([&] {
    auto v = s->state().View("node-d", clock_.Now());
    return v.has_value() && !v->gpus[0].healthy;
  }));

  HttpResult r = Filter(s, CreatePod(MigPod("p", 4000)), {"node-a", "node-b", "node-c"});
  EXPECT_EQ(r.body["Error"], "");
  EXPECT_THAT(r.body["NodeNames"], IsEmpty());
  EXPECT_THAT(r.body["FailedNodes"]["node-a"].get<std::string>(),
              HasSubstr("holds devices of this GPU without a MIG reservation"));
  EXPECT_THAT(r.body["FailedNodes"]["node-b"].get<std::string>(),
              HasSubstr("unreadable hami.io/node-nvidia-register"));
  EXPECT_THAT(r.body["FailedNodes"]["node-c"].get<std::string>(), HasSubstr("stopped reporting"));
  r = Filter(s, GetPod("p"), {"node-d"});
  ASSERT_THAT(r.body["NodeNames"], ElementsAre("node-d")) << r.text;
  EXPECT_EQ(ReservedOf(s, "p")[0].gpu_uuid, "GPU-d1");

  const std::string metrics = s->MetricsText();
  EXPECT_THAT(metrics, HasSubstr("dynmig_scheduler_gpu_fail_closed{node=\"node-d\","
                                 "device_uuid=\"GPU-d0\",device_index=\"0\",reason=\""
                                 "unreadable-reservation\"}"));
  EXPECT_THAT(metrics, HasSubstr("dynmig_scheduler_node_unhealthy{node=\"node-b\",reason=\""
                                 "unreadable-register\"}"));
  // /metrics names no pod or namespace: the reasons that do are on /layout and in events.
  EXPECT_THAT(metrics, Not(HasSubstr("garbled")));
  EXPECT_THAT(metrics, Not(HasSubstr("rogue")));
  EXPECT_THAT(metrics, Not(HasSubstr("default/")));
}

// The operators' gauges (metrics.h): pending MIG pods by the planner's verdict (what `dynmig
// explain` classifies), the oldest one's wait, and each GPU's free slices and longest free run.
TEST_F(SchedulerTest, PendingPodsAreCountedByVerdictAndEachGpuShowsItsFreeSlices) {
  CreateNode(MigNode("node-a", {"GPU-a0"}));
  // 1g instances at slices 0 and 4: six slices free, in runs of three; no 3g placement is free.
  for (auto [name, start] : {std::pair{"one", 0u}, {"two", 4u}}) {
    kube::Object held =
        MigPod(name, 4000,
               {{"hami.io/vgpu-mig-allocations", Alloc("GPU-a0", "1g.5gb", start, 1)},
                {"hami.io/vgpu-node", "node-a"}});
    held["spec"]["nodeName"] = "node-a";
    CreatePod(held);
  }
  SchedulerServer* s = StartScheduler();
  WaitForNodes(s, {"node-a"});
  WaitForReservationSeen(s, "default/one");
  WaitForReservationSeen(s, "default/two");
  const std::string gpu = "{node=\"node-a\",device_uuid=\"GPU-a0\",device_index=\"0\"}";
  std::string metrics = s->MetricsText();
  EXPECT_THAT(metrics, HasSubstr("dynmig_scheduler_gpu_slices" + gpu + " 8"));
  EXPECT_THAT(metrics, HasSubstr("dynmig_scheduler_gpu_free_slices" + gpu + " 6"));
  EXPECT_THAT(metrics, HasSubstr("dynmig_scheduler_gpu_largest_free_run_slices" + gpu + " 3"));
  EXPECT_THAT(metrics, HasSubstr("dynmig_scheduler_pending_pods{reason=\"fragmented\"} 0"));

  // A 3g pod: enough free slices, no free placement: pending as fragmented.
  const kube::Object big = CreatePod(MigPod("big", 19000));
  HttpResult r = Filter(s, big, {"node-a"});
  EXPECT_THAT(r.body["NodeNames"], IsEmpty()) << r.text;
  EXPECT_THAT(r.body["FailedNodes"]["node-a"].get<std::string>(), HasSubstr("fragmented"));
  // One kube-scheduler offers no node at all.
  const kube::Object nowhere = CreatePod(MigPod("nowhere", 4000));
  Filter(s, nowhere, {});
  clock_.Advance(absl::Minutes(3));
  Filter(s, big, {"node-a"});  // still pending: its wait counts from the first time
  metrics = s->MetricsText();
  EXPECT_THAT(metrics, HasSubstr("dynmig_scheduler_pending_pods{reason=\"fragmented\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("dynmig_scheduler_pending_pods{reason=\"no-candidates\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("dynmig_scheduler_pending_pods{reason=\"capacity-exhausted\"} 0"));
  EXPECT_THAT(metrics,
              HasSubstr("dynmig_scheduler_pending_oldest_seconds{reason=\"fragmented\"} 180"));
  EXPECT_THAT(metrics, Not(HasSubstr("default/"))) << "no pod is named";
  EXPECT_THAT(metrics, Not(HasSubstr("nowhere")));

  // A small pod fits: reserved, so not pending; "big" deleted: no longer pending either.
  r = Filter(s, nowhere, {"node-a"});
  ASSERT_THAT(r.body["NodeNames"], ElementsAre("node-a")) << r.text;
  ASSERT_TRUE(client_->DeletePod("default", "big").ok());
  EXPECT_TRUE(kube::testing::Eventually([&] {
    return s->MetricsText().find("dynmig_scheduler_pending_pods{reason=\"fragmented\"} 0") !=
           std::string::npos;
  })) << s->MetricsText();
  metrics = s->MetricsText();
  EXPECT_THAT(metrics, HasSubstr("dynmig_scheduler_pending_pods{reason=\"no-candidates\"} 0"));
  EXPECT_THAT(metrics, HasSubstr("dynmig_scheduler_gpu_free_slices" + gpu + " 5"));
}

// A pending pod no filter or watch event mentions again is dropped after the TTL.
TEST(SchedulerMetricsTest, PendingEntriesExpireAndAreBounded) {
  SchedulerMetrics m;
  const absl::Time t0 = absl::FromUnixSeconds(1767323045);
  m.PodPending("default/a", "fragmented", t0);
  m.PodPending("default/a", "capacity-exhausted", t0 + absl::Minutes(1));
  std::string text = m.Render({}, true, 2, t0 + absl::Minutes(2));
  EXPECT_THAT(text, HasSubstr("dynmig_scheduler_pending_pods{reason=\"capacity-exhausted\"} 1"));
  EXPECT_THAT(text, HasSubstr("dynmig_scheduler_pending_pods{reason=\"fragmented\"} 0"));
  EXPECT_THAT(
      text,
      HasSubstr("dynmig_scheduler_pending_oldest_seconds{reason=\"capacity-exhausted\"} 120"));
  EXPECT_THAT(text, HasSubstr("dynmig_scheduler_pending_pods{reason=\"waiting-for-node-lock\"} 2"));
  text = m.Render({}, true, 0,
                  t0 + absl::Minutes(1) + SchedulerMetrics::kPendingTtl + absl::Seconds(1));
  EXPECT_THAT(text, HasSubstr("dynmig_scheduler_pending_pods{reason=\"capacity-exhausted\"} 0"));
  // The lock age of a locked node.
  NodeReport locked;
  locked.name = "node-a";
  locked.locked_at = t0;
  text = m.Render({locked}, true, 0, t0 + absl::Seconds(150));
  EXPECT_THAT(text, HasSubstr("dynmig_scheduler_node_lock_held_seconds{node=\"node-a\"} 150"));
}

TEST_F(SchedulerTest, ConcurrentFiltersFromManyThreadsNeverOverlap) {
  CreateNode(MigNode("node-a", {"GPU-a0", "GPU-a1"}));
  CreateNode(MigNode("node-b", {"GPU-b0", "GPU-b1"}));
  SchedulerServer* s = StartScheduler();
  WaitForNodes(s, {"node-a", "node-b"});
  // 4 GPUs x 7 1g.5gb instances = 28 places for 36 pods.
  constexpr int kPods = 36;
  std::vector<kube::Object> pods;
  for (int i = 0; i < kPods; ++i) pods.push_back(CreatePod(MigPod(fmt::format("p{}", i), 4000)));
  std::vector<HttpResult> results(kPods);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < kPods; i += 8) results[i] = Filter(s, pods[i], {"node-a", "node-b"});
    });
  }
  for (auto& t : threads) t.join();
  int reserved = 0, pending = 0;
  std::map<std::string, std::vector<mig::Placement>> by_gpu;
  for (int i = 0; i < kPods; ++i) {
    ASSERT_EQ(results[i].status, 200);
    ASSERT_EQ(results[i].body["Error"], "") << results[i].text;
    if (results[i].body["NodeNames"].empty()) {
      ++pending;
      continue;
    }
    ++reserved;
    for (const auto& a : ReservedOf(s, fmt::format("p{}", i)))
      by_gpu[a.gpu_uuid].push_back(a.placement);
  }
  EXPECT_EQ(reserved, 28);
  EXPECT_EQ(pending, 8);
  for (const auto& [gpu, placements] : by_gpu) {
    EXPECT_EQ(placements.size(), 7u) << gpu;
    for (size_t i = 0; i < placements.size(); ++i) {
      for (size_t j = i + 1; j < placements.size(); ++j) {
        EXPECT_FALSE(placements[i].Overlaps(placements[j])) << gpu;
      }
    }
  }
}

}  // namespace
}  // namespace dynmig::scheduler::testing
