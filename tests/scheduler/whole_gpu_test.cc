// Whole-GPU pods (issue 31 phase 2): GPUs in whole-GPU mode ("hami-core") in the cluster state,
// ClusterState::PlanAndReserveWhole, and the extender's filter, bind and expiry for them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "protocol/device_cordon.h"
#include "protocol/devices.h"
#include "protocol/gpu_mode.h"
#include "protocol/gpu_mode_switch.h"
#include "scheduler/cluster_state.h"
#include "scheduler_test_util.h"

namespace dynmig::scheduler::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

const absl::Time kAt = absl::FromUnixSeconds(1'800'000'000);
constexpr std::string_view kH100 = "NVIDIA H100 80GB HBM3";

protocol::DeviceInfo Whole(const std::string& uuid, uint32_t index, uint64_t mib = 81559,
                           std::string_view model = kH100) {
  return protocol::WholeGpuDeviceInfo({uuid, index, 0, true}, model, mib);
}

protocol::DeviceInfo MigA100(const std::string& uuid, uint32_t index) {
  const auto& cap = (*mig::FindModel("A100-SXM4-40GB"))->capability;
  std::vector<const mig::ProfileSpec*> base;
  for (const auto& p : cap.profiles) {
    if (p.name.find_first_of("+-") == std::string::npos) base.push_back(&p);
  }
  return protocol::MigDeviceInfo({uuid, index, 0, true}, cap, base);
}

json NodeWith(const std::string& name, const std::vector<protocol::DeviceInfo>& gpus) {
  json n = kube::testing::MakeNode(name);
  n["metadata"]["annotations"] = {
      {std::string(protocol::kNodeRegisterAnnotation), protocol::EncodeNodeRegister(gpus)}};
  return n;
}

// A whole-GPU pod: nvidia.com/vgpu-mode hami-core, `containers` as in MigPod.
kube::Object WholePod(const std::string& name, std::vector<Ctr> containers = {Ctr{}},
                      json annotations = json::object()) {
  annotations[std::string(protocol::kVgpuModeAnnotation)] = "hami-core";
  return MigPod(name, std::move(containers), std::move(annotations));
}

// The pod as a bind leaves it: on `node`, its devices allocated (and still to allocate unless
// `realized`).
json Placed(json pod, const std::string& node, const std::string& devices, bool realized = true) {
  auto& a = pod["metadata"]["annotations"];
  a[std::string(protocol::kVgpuNodeAnnotation)] = node;
  a[std::string(protocol::kVgpuTimeAnnotation)] = std::to_string(absl::ToUnixSeconds(kAt));
  a[std::string(protocol::kDevicesAllocatedAnnotation)] = devices;
  a[std::string(protocol::kDevicesToAllocateAnnotation)] = realized ? ";" : devices;
  pod["spec"]["nodeName"] = node;
  pod["status"] = {{"phase", "Running"}};
  return pod;
}

ClusterStateOptions StateOptions() {
  ClusterStateOptions o;
  o.allowlist = TestAllowlist();
  return o;
}

protocol::WholeGpuRequest Request(const kube::Object& pod) {
  auto r = protocol::ParseWholeGpuRequest(pod);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : protocol::WholeGpuRequest{};
}

// A copy (a report is a temporary more often than not): nullopt when the GPU is not in it.
std::optional<WholeGpuReport> FindWhole(const std::vector<NodeReport>& report,
                                        const std::string& uuid) {
  for (const auto& n : report) {
    for (const auto& w : n.whole_gpus) {
      if (w.uuid == uuid) return w;
    }
  }
  return std::nullopt;
}

// --- ClusterState ---------------------------------------------------------------------------

TEST(WholeGpuStateTest, AMixedNodeGivesWholeGpusToWholePodsAndSlicesToMigPods) {
  ClusterState state(StateOptions());
  state.UpsertNode(NodeWith("node-a", {MigA100("GPU-m0", 0), Whole("GPU-w1", 1)}));
  auto d = state.PlanAndReserveWhole("default/w", Request(WholePod("w")), {"node-a"}, kAt);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->reservation.has_value()) << d->failed["node-a"];
  EXPECT_EQ(d->reservation->node, "node-a");
  EXPECT_THAT(d->reservation->allocations, IsEmpty());
  EXPECT_EQ(*protocol::EncodePodDevices(d->reservation->devices),
            "GPU-w1,NVIDIA H100 80GB HBM3,81559,100:;");
  EXPECT_EQ(d->reservation->summary, "whole GPU GPU-w1 on node-a");
  // A MIG pod still gets its slice on the MIG GPU, never the whole one.
  mig::PodRequest mig_request;
  mig_request.containers.push_back(
      {.name = "c", .init = false, .count = 1, .memory = {.mib = 39000, .percent = 0}});
  auto m = state.PlanAndReserve("default/m", mig_request, {"node-a"}, kAt);
  ASSERT_TRUE(m.ok() && m->reservation.has_value());
  EXPECT_EQ(m->reservation->allocations[0].gpu_uuid, "GPU-m0");
  // A second whole-GPU pod waits: the one whole GPU is taken, the other is in MIG mode.
  auto second = state.PlanAndReserveWhole("default/w2", Request(WholePod("w2")), {"node-a"}, kAt);
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->reservation.has_value());
  EXPECT_EQ(second->failed["node-a"],
            "no whole GPU free for the pod (needs 1, 0 free): 1 GPU in MIG mode, 1 whole GPU in "
            "use by default/w");
  EXPECT_EQ(second->verdict, mig::Verdict::kCapacityExhausted);
  // The report shows the holder, assumed.
  const std::vector<NodeReport> report = state.Report(kAt);
  const std::optional<WholeGpuReport> w = FindWhole(report, "GPU-w1");
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->holder, "default/w");
  EXPECT_TRUE(w->assumed);
  EXPECT_TRUE(w->healthy);
  // Again for the same pod: refused, as for MIG pods.
  EXPECT_EQ(state.PlanAndReserveWhole("default/w", Request(WholePod("w")), {}, kAt).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WholeGpuStateTest, NodesWithoutWholeGpusSayWhyAndAMigOnlyNodeNeverFits) {
  ClusterState state(StateOptions());
  state.UpsertNode(NodeWith("mig-only", {MigA100("GPU-m0", 0), MigA100("GPU-m1", 1)}));
  state.UpsertNode(NodeWith("whole", {Whole("GPU-w0", 0)}));
  auto d = state.PlanAndReserveWhole("default/w", Request(WholePod("w")),
                                     {"mig-only", "whole", "ghost"}, kAt);
  ASSERT_TRUE(d.ok() && d->reservation.has_value());
  EXPECT_EQ(d->reservation->node, "whole");
  // Only the nodes that can never run it are listed once one fits.
  EXPECT_EQ(d->failed.at("mig-only"),
            "no whole GPU: the node publishes no GPU in whole-GPU mode, 2 GPUs in MIG mode");
  EXPECT_THAT(d->failed.at("ghost"), HasSubstr("registers no GPU with dynmig"));
  EXPECT_EQ(d->failed.count("whole"), 0u);
  // A MIG pod is never placed on the whole-GPU node.
  mig::PodRequest mig_request;
  mig_request.containers.push_back(
      {.name = "c", .init = false, .count = 1, .memory = {.mib = 4000, .percent = 0}});
  auto m = state.PlanAndReserve("default/m", mig_request, {"whole"}, kAt);
  ASSERT_TRUE(m.ok());
  EXPECT_FALSE(m->reservation.has_value());
}

TEST(WholeGpuStateTest, MemoryFloorsAndDistinctGpusPerContainer) {
  ClusterState state(StateOptions());
  state.UpsertNode(NodeWith("node-a", {Whole("GPU-big", 0, 81559), Whole("GPU-small", 1, 40960),
                                       Whole("GPU-mid", 2, 49152)}));
  // The 60 GB container gets the 80 GB GPU, the one without a floor the smallest one.
  auto d = state.PlanAndReserveWhole(
      "default/p", Request(WholePod("p", {Ctr{"any", 1, 0}, Ctr{"large", 1, 60000}})), {"node-a"},
      kAt);
  ASSERT_TRUE(d.ok() && d->reservation.has_value()) << d->failed["node-a"];
  ASSERT_EQ(d->reservation->devices.size(), 2u);
  EXPECT_EQ(d->reservation->devices[0][0].uuid, "GPU-small");
  EXPECT_EQ(d->reservation->devices[1][0].uuid, "GPU-big");
  EXPECT_EQ(d->reservation->devices[1][0].used_mem_mib, 81559);
  EXPECT_EQ(d->reservation->devices[1][0].used_cores, 100);
  // Two GPUs in one container: distinct. Only GPU-mid is left: one GPU short.
  auto two = state.PlanAndReserveWhole("default/q", Request(WholePod("q", {Ctr{"c", 2, 0}})),
                                       {"node-a"}, kAt);
  ASSERT_TRUE(two.ok());
  EXPECT_FALSE(two->reservation.has_value());
  EXPECT_THAT(two->failed["node-a"],
              HasSubstr("no whole GPU free for all the pod's containers (needs 2, 1 free): 2 "
                        "whole GPUs in use by default/p"));
  // A floor above every GPU never fits.
  auto huge = state.PlanAndReserveWhole("default/h", Request(WholePod("h", {Ctr{"c", 1, 90000}})),
                                        {"node-a"}, kAt);
  ASSERT_TRUE(huge.ok());
  EXPECT_EQ(huge->failed["node-a"],
            "too small: the pod needs 1 whole GPU with at least 90000 MiB, the node has 0 that "
            "large");
  EXPECT_EQ(huge->verdict, mig::Verdict::kNoProfileBigEnough);
  // Init containers get GPUs of their own.
  ClusterState fresh(StateOptions());
  fresh.UpsertNode(NodeWith("node-a", {Whole("GPU-0", 0), Whole("GPU-1", 1)}));
  json with_init = WholePod("i");
  with_init["spec"]["initContainers"] = with_init["spec"]["containers"];
  with_init["spec"]["initContainers"][0]["name"] = "setup";
  auto init = fresh.PlanAndReserveWhole("default/i", Request(with_init), {"node-a"}, kAt);
  ASSERT_TRUE(init.ok() && init->reservation.has_value());
  ASSERT_EQ(init->reservation->devices.size(), 2u);
  EXPECT_NE(init->reservation->devices[0][0].uuid, init->reservation->devices[1][0].uuid);
}

TEST(WholeGpuStateTest, PrefersTheFullestNodeAndANodeWithoutABindInFlight) {
  ClusterState state(StateOptions());
  state.UpsertNode(NodeWith("roomy", {Whole("GPU-r0", 0), Whole("GPU-r1", 1)}));
  state.UpsertNode(NodeWith("tight", {Whole("GPU-t0", 0)}));
  auto d = state.PlanAndReserveWhole("default/a", Request(WholePod("a")), {"roomy", "tight"}, kAt);
  ASSERT_TRUE(d.ok() && d->reservation.has_value());
  EXPECT_EQ(d->reservation->node, "tight");  // leaves roomy's two GPUs together
}

TEST(WholeGpuStateTest, AnnotatedPodsHoldTheirGpusUntilTheyEnd) {
  ClusterState state(StateOptions());
  state.UpsertNode(NodeWith("node-a", {MigA100("GPU-m0", 0), Whole("GPU-w1", 1)}));
  uint64_t seq = 0;
  state.FreedSince(&seq, kAt);  // baseline
  const std::string devices = "GPU-w1,NVIDIA H100 80GB HBM3,81559,100:;";
  json running = Placed(WholePod("run"), "node-a", devices);
  state.UpsertPod(running);
  const std::vector<NodeReport> report = state.Report(kAt);
  const std::optional<WholeGpuReport> w = FindWhole(report, "GPU-w1");
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->holder, "default/run");
  EXPECT_FALSE(w->assumed);
  EXPECT_EQ(state.ReservedNode("default/run"), "node-a");
  auto d = state.PlanAndReserveWhole("default/w", Request(WholePod("w")), {"node-a"}, kAt);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->reservation.has_value());
  EXPECT_THAT(d->failed["node-a"], HasSubstr("1 whole GPU in use by default/run"));
  // The MIG GPU is untouched by it.
  EXPECT_TRUE(state.View("node-a", kAt)->gpus[0].healthy);
  EXPECT_THAT(state.FreedSince(&seq, kAt), IsEmpty());
  // The pod ends: the GPU is free again, and the requeuer hears of it.
  running["status"]["phase"] = "Succeeded";
  state.UpsertPod(running);
  EXPECT_THAT(state.FreedSince(&seq, kAt), ElementsAre("node-a"));
  d = state.PlanAndReserveWhole("default/w", Request(WholePod("w")), {"node-a"}, kAt);
  ASSERT_TRUE(d.ok() && d->reservation.has_value());
}

TEST(WholeGpuStateTest, UnrealizedReservationsExpireAndAFailedAllocationReleasesThem) {
  ClusterState state(StateOptions());
  state.UpsertNode(NodeWith("node-a", {Whole("GPU-w0", 0), Whole("GPU-w1", 1)}));
  const std::string both =
      "GPU-w0,NVIDIA H100 80GB HBM3,81559,100:;GPU-w1,NVIDIA H100 80GB HBM3,81559,100:;";
  // Two containers; the device plugin served the first (erased its entry), not the second.
  json pod = Placed(WholePod("p", {Ctr{"a"}, Ctr{"b"}}), "node-a", both, false);
  pod["metadata"]["annotations"][std::string(protocol::kDevicesToAllocateAnnotation)] =
      ";GPU-w1,NVIDIA H100 80GB HBM3,81559,100:;";
  state.UpsertPod(pod);
  EXPECT_THAT(state.UnrealizedBefore(kAt + absl::Minutes(11)), ElementsAre("default/p"));
  EXPECT_THAT(state.UnrealizedBefore(kAt - absl::Minutes(1)), IsEmpty());
  EXPECT_EQ(FindWhole(state.Report(kAt), "GPU-w1")->holder, "default/p");
  // bind-phase failed: the unserved GPU is released, the served one stays held.
  state.ReleaseUnrealized("default/p");
  EXPECT_EQ(FindWhole(state.Report(kAt), "GPU-w0")->holder, "default/p");
  EXPECT_EQ(FindWhole(state.Report(kAt), "GPU-w1")->holder, "");
  EXPECT_THAT(state.UnrealizedBefore(kAt + absl::Minutes(11)), IsEmpty());
  // Fully realized: nothing to expire.
  state.UpsertPod(Placed(WholePod("r"), "node-a", "GPU-w1,NVIDIA H100 80GB HBM3,81559,100:;"));
  EXPECT_THAT(state.UnrealizedBefore(kAt + absl::Hours(1)), IsEmpty());
}

TEST(WholeGpuStateTest, CordonedAndUnhealthyWholeGpusTakeNothing) {
  ClusterState state(StateOptions());
  protocol::DeviceInfo sick = Whole("GPU-sick", 1);
  sick.health = false;
  json node = NodeWith("node-a", {Whole("GPU-c", 0), sick});
  node["metadata"]["annotations"][std::string(protocol::kDeviceCordonAnnotation)] =
      protocol::EncodeDeviceCordon({"GPU-c"});
  state.UpsertNode(node);
  auto d = state.PlanAndReserveWhole("default/w", Request(WholePod("w")), {"node-a"}, kAt);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->reservation.has_value());
  EXPECT_EQ(d->failed["node-a"],
            "no whole GPU free for the pod (needs 1, 0 free): 1 cordoned, 1 device-unhealthy");
  EXPECT_EQ(d->verdict, mig::Verdict::kGpuUnhealthy);
  // Uncordoned: capacity grew.
  uint64_t seq = 0;
  state.FreedSince(&seq, kAt);
  state.UpsertNode(NodeWith("node-a", {Whole("GPU-c", 0), sick}));
  EXPECT_THAT(state.FreedSince(&seq, kAt), ElementsAre("node-a"));
}

TEST(WholeGpuStateTest, AWholeGpuHeldForAModeSwitchTakesNoPodUntilTheStatusAnswers) {
  ClusterState state(StateOptions());
  json node = NodeWith("node-a", {Whole("GPU-w0", 0)});
  protocol::GpuModeRequest request;
  request.gpu_uuid = "GPU-w0";
  request.to = protocol::GpuMode::kMig;
  request.at_ms = absl::ToUnixMillis(kAt);
  request.by = "scheduler";
  node["metadata"]["annotations"][std::string(protocol::kGpuModeRequestAnnotation)] =
      protocol::EncodeGpuModeRequests({request});
  // Without the device plugin's dynmig.io/gpu-mode nobody carries the request out: no hold.
  state.UpsertNode(node);
  {
    const std::vector<NodeReport> report = state.Report(kAt);
    EXPECT_TRUE(FindWhole(report, "GPU-w0")->healthy);
  }
  protocol::GpuModeStatus status;
  status.gpu_uuid = "GPU-w0";
  status.mode = protocol::GpuMode::kWholeGpu;
  status.mig_capable = true;
  status.switchable = true;
  node["metadata"]["annotations"][std::string(protocol::kGpuModeStatusAnnotation)] =
      protocol::EncodeGpuModeStatuses({status});
  state.UpsertNode(node);
  auto d = state.PlanAndReserveWhole("default/w", Request(WholePod("w")), {"node-a"}, kAt);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->reservation.has_value()) << d->reservation->summary;
  EXPECT_THAT(d->failed["node-a"], HasSubstr("1 switching"));
  const std::vector<NodeReport> report = state.Report(kAt);
  const std::optional<WholeGpuReport> w = FindWhole(report, "GPU-w0");
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->unhealthy_code, "switching");
  EXPECT_EQ(w->unhealthy_reason, "GPU GPU-w0 is switching to mig");
  // An unreadable request annotation holds every GPU of the node (fails closed).
  node["metadata"]["annotations"][std::string(protocol::kGpuModeRequestAnnotation)] = "[{";
  state.UpsertNode(node);
  EXPECT_EQ(FindWhole(state.Report(kAt), "GPU-w0")->unhealthy_code, "switching");
  // The request withdrawn: the GPU takes the pod.
  node["metadata"]["annotations"].erase(std::string(protocol::kGpuModeRequestAnnotation));
  state.UpsertNode(node);
  d = state.PlanAndReserveWhole("default/w", Request(WholePod("w")), {"node-a"}, kAt);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->reservation.has_value()) << d->failed["node-a"];
}

// --- Attacks ----------------------------------------------------------------------------------

TEST(WholeGpuStateTest, ALyingRegisterGetsNoPodOnItsAmbiguousGpus) {
  ClusterState state(StateOptions());
  // The same UUID twice (it would be given to two containers), a UUID that breaks the device
  // list, a type with a separator, devmem beyond the wire's int32, and a UUID also published as a
  // MIG GPU.
  protocol::DeviceInfo huge = Whole("GPU-huge", 4, uint64_t{1} << 40);
  state.UpsertNode(NodeWith("node-a", {Whole("GPU-dup", 0), Whole("GPU-dup", 1),
                                       Whole("GPU-a,b", 2), Whole("GPU-t", 3, 81559, "H100:x"),
                                       huge, MigA100("GPU-both", 5), Whole("GPU-both", 6)}));
  auto d = state.PlanAndReserveWhole("default/w", Request(WholePod("w")), {"node-a"}, kAt);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->reservation.has_value()) << d->reservation->summary;
  EXPECT_THAT(d->failed["node-a"], HasSubstr("6 bad-device"));
  const auto report = state.Report(kAt);
  EXPECT_THAT(FindWhole(report, "GPU-dup")->unhealthy_reason,
              HasSubstr("publishes GPU-dup more than once"));
  EXPECT_THAT(FindWhole(report, "GPU-huge")->unhealthy_reason, HasSubstr("out of range"));
  // The MIG GPU of the same UUID still takes MIG pods (its side is unchanged).
  EXPECT_TRUE(state.View("node-a", kAt)->gpus[0].healthy);
  // A register that asks for more than it has: a pod of 1000 containers never fits, at once.
  std::vector<Ctr> many(1000, Ctr{"c", 1, 0});
  for (size_t i = 0; i < many.size(); ++i) many[i].name = fmt::format("c{}", i);
  auto big =
      state.PlanAndReserveWhole("default/big", Request(WholePod("big", many)), {"node-a"}, kAt);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->failed["node-a"],
            "the pod asks for 1000 whole GPUs, the node has 6 in whole-GPU mode, 1 GPU in MIG "
            "mode");
}

TEST(WholeGpuStateTest, AMigPodCannotTakeAWholeGpuThroughItsAnnotations) {
  ClusterState state(StateOptions());
  state.UpsertNode(
      NodeWith("node-a", {Whole("GPU-w0", 0), Whole("GPU-w1", 1), Whole("GPU-w2", 2)}));
  // A MIG pod whose (dynmig-only) MIG allocations name a whole GPU: that GPU takes nothing.
  json mig = MigPod("m", 4000);
  mig["spec"]["nodeName"] = "node-a";
  mig["status"] = {{"phase", "Running"}};
  mig["metadata"]["annotations"][std::string(protocol::kVgpuNodeAnnotation)] = "node-a";
  mig["metadata"]["annotations"][std::string(protocol::kMigAllocationsAnnotation)] =
      Alloc("GPU-w0", "1g.5gb", 0, 1);
  state.UpsertPod(mig);
  // A MIG pod holding a whole GPU's devices without a reservation: fail closed on it too.
  json devices = Placed(MigPod("d", 4000), "node-a", "GPU-w1,NVIDIA,4864,15:;");
  state.UpsertPod(devices);
  const auto report = state.Report(kAt);
  EXPECT_EQ(FindWhole(report, "GPU-w0")->unhealthy_code, "mig-reservation");
  EXPECT_EQ(FindWhole(report, "GPU-w1")->unhealthy_code, "devices-without-reservation");
  EXPECT_TRUE(FindWhole(report, "GPU-w2")->healthy);
  auto d = state.PlanAndReserveWhole("default/w", Request(WholePod("w", {Ctr{"c", 2, 0}})),
                                     {"node-a"}, kAt);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->reservation.has_value());
  // Two whole-GPU pods naming one GPU: it is in conflict, taken by neither again.
  ClusterState other(StateOptions());
  other.UpsertNode(NodeWith("node-a", {Whole("GPU-w0", 0)}));
  other.UpsertPod(Placed(WholePod("x"), "node-a", "GPU-w0,NVIDIA,81559,100:;"));
  other.UpsertPod(Placed(WholePod("y"), "node-a", "GPU-w0,NVIDIA,81559,100:;"));
  EXPECT_EQ(FindWhole(other.Report(kAt), "GPU-w0")->unhealthy_code, "conflicting-reservations");
  // An unreadable device list on a whole-GPU pod fails the node's whole GPUs closed.
  ClusterState third(StateOptions());
  third.UpsertNode(NodeWith("node-a", {Whole("GPU-w0", 0)}));
  third.UpsertPod(Placed(WholePod("z"), "node-a", "garbage"));
  EXPECT_EQ(FindWhole(third.Report(kAt), "GPU-w0")->unhealthy_code, "unreadable-reservation");
}

TEST(CapacityGrewTest, AFreedWholeGpuIsCapacityAndAModeChangeIsANewGpu) {
  ClusterState::Occupancy before{.healthy = true, .blocked_holds = 0, .gpus = {}};
  before.gpus.push_back({"GPU-0", true, 1, true});
  ClusterState::Occupancy after = before;
  after.gpus[0].occupied = 0;
  EXPECT_TRUE(CapacityGrew(before, after));
  EXPECT_FALSE(CapacityGrew(after, before));
  // The same GPU now in MIG mode (a switch): new capacity for MIG pods.
  ClusterState::Occupancy switched = before;
  switched.gpus[0] = {"GPU-0", true, 0, false};
  EXPECT_TRUE(CapacityGrew(before, switched));
}

// --- The extender ----------------------------------------------------------------------------

class WholeGpuSchedulerTest : public SchedulerTest {
 protected:
  SchedulerServer* Start(bool whole = true) {
    SchedulerServerOptions o = DefaultOptions();
    o.extender.whole_gpu_pods = whole;
    o.extender.lock_queue.wait = absl::Seconds(2);
    SchedulerServer* s = StartScheduler(std::move(o));
    WaitForNodes(s, {"node-a"});
    return s;
  }
  void SetUp() override {
    SchedulerTest::SetUp();
    CreateNode(NodeWith("node-a", {MigA100("GPU-m0", 0), Whole("GPU-w1", 1)}));
  }
};

TEST_F(WholeGpuSchedulerTest, FilterAndBindWriteHamisReservationWithoutMigAllocations) {
  SchedulerServer* s = Start();
  const kube::Object pod = CreatePod(WholePod("w"));
  HttpResult r = Filter(s, pod, {"node-a"});
  ASSERT_EQ(r.body["Error"], "") << r.text;
  EXPECT_THAT(r.body["NodeNames"], ElementsAre("node-a"));
  EXPECT_THAT(EventMessages("w", "MigReserved"),
              ElementsAre("reserved whole GPU GPU-w1 on node-a"));
  // A retried filter gets the same node.
  EXPECT_THAT(Filter(s, pod, {"node-a"}).body["NodeNames"], ElementsAre("node-a"));
  ASSERT_EQ(Bind(s, GetPod("w"), "node-a").body["Error"], "");
  const kube::Object bound = GetPod("w");
  const std::string devices = "GPU-w1,NVIDIA H100 80GB HBM3,81559,100:;";
  EXPECT_EQ(kube::Annotation(bound, protocol::kDevicesToAllocateAnnotation), devices);
  EXPECT_EQ(kube::Annotation(bound, protocol::kDevicesAllocatedAnnotation), devices);
  EXPECT_FALSE(kube::Annotation(bound, protocol::kMigAllocationsAnnotation).has_value());
  EXPECT_EQ(kube::Annotation(bound, protocol::kVgpuNodeAnnotation), "node-a");
  EXPECT_EQ(kube::Annotation(bound, protocol::kBindPhaseAnnotation), "allocating");
  EXPECT_TRUE(kube::Annotation(bound, protocol::kBindTimeAnnotation).has_value());
  EXPECT_EQ(kube::NodeName(bound), "node-a");
  auto lock = kube::Annotation(*client_->GetNode("node-a"), protocol::kNodeLockAnnotation);
  ASSERT_TRUE(lock.has_value());
  EXPECT_THAT(*lock, HasSubstr(",default,w," + kube::Uid(bound)));
  // The watch takes the annotation over from the assumption: still held, not assumed.
  ASSERT_TRUE(kube::testing::Eventually([&] {
    const std::optional<WholeGpuReport> w = FindWhole(s->state().Report(clock_.Now()), "GPU-w1");
    return w.has_value() && w->holder == "default/w" && !w->assumed;
  }));
  // /metrics: the whole GPU is in use.
  EXPECT_THAT(s->MetricsText(), HasSubstr("dynmig_scheduler_whole_gpu_in_use{node=\"node-a\","
                                          "device_uuid=\"GPU-w1\",device_index=\"1\"} "
                                          "1"));
  // The next whole-GPU pod waits, with the reason in its event; a MIG pod still fits.
  HttpResult second = Filter(s, CreatePod(WholePod("w2")), {"node-a"});
  EXPECT_THAT(second.body["NodeNames"], IsEmpty());
  EXPECT_EQ(second.body["FailedNodes"]["node-a"],
            "no whole GPU free for the pod (needs 1, 0 free): 1 GPU in MIG mode, 1 whole GPU in "
            "use by default/w");
  EXPECT_THAT(EventMessages("w2", "MigPending"),
              ElementsAre(HasSubstr("pending: no candidate node has the whole GPUs")));
  EXPECT_THAT(Filter(s, CreatePod(MigPod("m", 39000)), {"node-a"}).body["NodeNames"],
              ElementsAre("node-a"));
}

TEST_F(WholeGpuSchedulerTest, OffByDefaultAWholeGpuPodIsNotOurs) {
  SchedulerServer* s = Start(false);
  HttpResult r = Filter(s, CreatePod(WholePod("w")), {"node-a"});
  EXPECT_THAT(r.body["Error"].get<std::string>(), HasSubstr("pod default/w is not a MIG pod"));
  EXPECT_THAT(r.body["NodeNames"], IsEmpty());
}

TEST_F(WholeGpuSchedulerTest, AMalformedWholeGpuRequestIsRefusedWithTheParsersMessage) {
  SchedulerServer* s = Start();
  struct Case {
    json limits;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"nvidia.com/gpu", "17"}}, "17 whole GPUs; at most 16 per container"},
      {{{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem-percentage", "50"}},
       "asks for a share of a GPU"},
      {{{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "-5"}}, "nvidia.com/gpumem"},
      {{{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "1e30"}}, "nvidia.com/gpumem"},
      {{{"nvidia.com/gpu", "99999999999999999999"}}, "nvidia.com/gpu"},
  };
  int i = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.limits.dump());
    kube::Object pod = WholePod(fmt::format("bad{}", i++));
    pod["spec"]["containers"][0]["resources"]["limits"] = c.limits;
    HttpResult r = Filter(s, CreatePod(pod), {"node-a"});
    EXPECT_THAT(r.body["Error"].get<std::string>(), HasSubstr(c.message)) << r.text;
    EXPECT_THAT(r.body["NodeNames"], IsEmpty());
  }
  EXPECT_FALSE(s->state().Assumed("default/bad0").has_value());
  // The GPU is still free for a good pod.
  EXPECT_THAT(Filter(s, CreatePod(WholePod("good")), {"node-a"}).body["NodeNames"],
              ElementsAre("node-a"));
}

TEST_F(WholeGpuSchedulerTest, UnboundReservationsExpireAndTheGpuIsFreeAgain) {
  SchedulerServer* s = Start();
  // p: filtered, never bound. q: bound, then its Allocate failed (bind-phase failed).
  ASSERT_THAT(Filter(s, CreatePod(WholePod("p")), {"node-a"}).body["NodeNames"],
              ElementsAre("node-a"));
  clock_.Advance(absl::Minutes(11));
  auto result = s->ExpireReservations();
  EXPECT_THAT(result.released, ElementsAre("default/p"));
  EXPECT_FALSE(s->state().Assumed("default/p").has_value());
  const kube::Object q = CreatePod(WholePod("q"));
  ASSERT_THAT(Filter(s, q, {"node-a"}).body["NodeNames"], ElementsAre("node-a"));
  ASSERT_EQ(Bind(s, GetPod("q"), "node-a").body["Error"], "");
  ASSERT_TRUE(
      client_->PatchPodAnnotations("default", "q", {{"hami.io/bind-phase", "failed"}}).ok());
  ASSERT_TRUE(kube::testing::Eventually([&] {
    const std::optional<WholeGpuReport> w = FindWhole(s->state().Report(clock_.Now()), "GPU-w1");
    return w.has_value() && w->holder == "default/q" && !w->assumed;
  }));
  clock_.Advance(absl::Minutes(5));
  EXPECT_THAT(s->ExpireReservations().released, IsEmpty());  // within the TTL
  clock_.Advance(absl::Minutes(6));
  std::vector<std::string> released;
  ASSERT_TRUE(kube::testing::Eventually([&] {
    auto r = s->ExpireReservations();
    released.insert(released.end(), r.released.begin(), r.released.end());
    return !released.empty();
  }));
  EXPECT_THAT(released, ElementsAre("default/q"));
  EXPECT_EQ(FindWhole(s->state().Report(clock_.Now()), "GPU-w1")->holder, "");
}

}  // namespace
}  // namespace dynmig::scheduler::testing
