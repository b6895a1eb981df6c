// Attribution of legacy instances (handover.h) on plain values, attacks included.
#include "deviceplugin/handover.h"

#include <gtest/gtest.h>

namespace dynmig::deviceplugin {
namespace {

constexpr char kGpu0[] = "GPU-aaaa";
constexpr char kGpu1[] = "GPU-bbbb";

LiveInstance Instance(const std::string& gpu, uint32_t index, uint32_t gi, std::string mig) {
  LiveInstance l;
  l.gpu_uuid = gpu;
  l.gpu_index = index;
  l.gi = gi;
  l.placement = {gi, 1};
  l.profile = "1g.5gb";
  l.cis = {{0, std::move(mig)}};
  return l;
}

PodMig Pod(const std::string& name, const std::string& uid, bool active = true) {
  PodMig p;
  p.ns = "default";
  p.name = name;
  p.key = "default/" + name;
  p.uid = uid;
  p.active = active;
  p.terminated = !active;
  return p;
}

PodResourcesPod PrPod(const std::string& name, const std::string& resource,
                      std::vector<std::string> ids) {
  return {"default", name, {{"main", {{resource, std::move(ids)}}}}};
}

RuntimeContainer Container(const std::string& pod, const std::string& uid,
                           std::vector<std::string> devices,
                           RuntimeContainerState state = RuntimeContainerState::kRunning) {
  RuntimeContainer c;
  c.id = "id-" + pod;
  c.pod_uid = uid;
  c.pod_namespace = "default";
  c.pod_name = pod;
  c.container = "main";
  c.state = state;
  c.devices = std::move(devices);
  return c;
}

struct Case {
  HandoverEvidence evidence;
  std::vector<PodMig> pods;
  std::vector<LiveInstance> live;

  Case() {
    evidence.own_resource = "nvidia.com/gpu";
    evidence.pod_resources = PodResourcesList{};
    live = {Instance(kGpu0, 0, 1, "MIG-a"), Instance(kGpu0, 0, 2, "MIG-b"),
            Instance(kGpu1, 1, 3, "MIG-c")};
  }
  Attribution Of(size_t i) const {
    return Attribute(live[i], evidence, pods, EvidenceGap(evidence, pods, live));
  }
};

TEST(HandoverTest, DeviceIdForms) {
  const LiveInstance i = Instance(kGpu0, 0, 1, "MIG-a");
  EXPECT_TRUE(DeviceIdNames("MIG-a", i));
  EXPECT_TRUE(DeviceIdNames("MIG-GPU-aaaa/1/0", i));
  EXPECT_TRUE(DeviceIdNames(kGpu0, i));
  EXPECT_TRUE(DeviceIdNames("0", i));
  EXPECT_TRUE(DeviceIdNames("0:3", i));  // a MIG index: the whole GPU, conservatively
  EXPECT_TRUE(DeviceIdNames("all", i));
  EXPECT_FALSE(DeviceIdNames("MIG-b", i));
  EXPECT_FALSE(DeviceIdNames("MIG-GPU-aaaa/1/1", i));
  EXPECT_FALSE(DeviceIdNames("MIG-GPU-aaaa/2/0", i));
  EXPECT_FALSE(DeviceIdNames("1", i));
  EXPECT_FALSE(DeviceIdNames("GPU-aaaa::0", i));  // dynmig's replicas
  EXPECT_FALSE(DeviceIdNames("", i));
  EXPECT_FALSE(DeviceIdNames("none", i));
  EXPECT_FALSE(DeviceIdNames("0:x", i));
  EXPECT_FALSE(DeviceIdNames("GPU-aaaa[1-0]", i));
}

TEST(HandoverTest, PodResourcesProvesAMixedStrategyHolder) {
  Case c;
  c.pods = {Pod("nv", "uid-nv")};
  c.evidence.pod_resources = PodResourcesList{PrPod("nv", "nvidia.com/mig-1g.5gb", {"MIG-b"})};
  const Attribution held = c.Of(1);
  ASSERT_EQ(held.kind, AttributionKind::kHeld);
  ASSERT_EQ(held.holders.size(), 1u);
  EXPECT_EQ(held.holders[0].pod_uid, "uid-nv");
  EXPECT_EQ(held.holders[0].source, kHolderSourcePodResources);
  EXPECT_EQ(held.holders[0].resource, "nvidia.com/mig-1g.5gb");
  EXPECT_EQ(held.owner.pod_uid, "uid-nv");
  EXPECT_EQ(HeldReason(held),
            "legacy instance of default/nv (container main, nvidia.com/mig-1g.5gb)");
  // No runtime configured, yet the evidence is complete: the pod's devices name an instance.
  EXPECT_EQ(c.Of(0).kind, AttributionKind::kFree);
  EXPECT_EQ(c.Of(2).kind, AttributionKind::kFree);
}

TEST(HandoverTest, WholeGpuIdsHoldEveryInstanceOfThatGpu) {
  Case c;
  c.evidence.pod_resources = PodResourcesList{};
  c.evidence.runtime = std::vector<RuntimeContainer>{Container("whole", "uid-w", {"0"})};
  EXPECT_EQ(c.Of(0).kind, AttributionKind::kHeld);
  EXPECT_EQ(c.Of(1).kind, AttributionKind::kHeld);
  EXPECT_EQ(c.Of(2).kind, AttributionKind::kFree);
  c.evidence.runtime = std::vector<RuntimeContainer>{Container("all", "uid-x", {"all"})};
  EXPECT_EQ(c.Of(2).kind, AttributionKind::kHeld);
}

TEST(HandoverTest, PodResourcesDownMakesEveryInstanceUnproven) {
  Case c;
  c.evidence.pod_resources = absl::UnavailableError("kubelet down");
  c.evidence.runtime = std::vector<RuntimeContainer>{Container("a", "uid-a", {"MIG-a"})};
  for (size_t i = 0; i < c.live.size(); ++i) {
    const Attribution a = c.Of(i);
    EXPECT_EQ(a.kind, AttributionKind::kUnproven);
    EXPECT_NE(a.reason.find("kubelet down"), std::string::npos) << a.reason;
  }
}

TEST(HandoverTest, HamiLegacyPodNeedsTheRuntime) {
  Case c;
  PodMig legacy = Pod("hami", "uid-h");
  legacy.legacy = true;
  c.pods = {legacy};
  // No runtime: nothing can be proven free.
  Attribution a = c.Of(0);
  EXPECT_EQ(a.kind, AttributionKind::kUnproven);
  EXPECT_NE(a.reason.find("default/hami"), std::string::npos) << a.reason;
  EXPECT_NE(a.reason.find("--cri-socket"), std::string::npos) << a.reason;
  // The runtime down: the same, naming its error.
  c.evidence.runtime = absl::UnavailableError("containerd gone");
  a = c.Of(0);
  EXPECT_EQ(a.kind, AttributionKind::kUnproven);
  EXPECT_NE(a.reason.find("containerd gone"), std::string::npos) << a.reason;
  // The runtime answers: its container holds GI 2 in the legacy form, the rest is free.
  c.evidence.runtime =
      std::vector<RuntimeContainer>{Container("hami", "uid-h", {"MIG-GPU-aaaa/2/0"})};
  EXPECT_EQ(c.Of(0).kind, AttributionKind::kFree);
  a = c.Of(1);
  ASSERT_EQ(a.kind, AttributionKind::kHeld);
  EXPECT_EQ(a.holders[0].source, kHolderSourceRuntime);
  EXPECT_EQ(a.owner.pod_uid, "uid-h");
  // A finished legacy pod needs nothing.
  c.pods[0].active = false;
  c.pods[0].terminated = true;
  c.evidence.runtime.reset();
  EXPECT_EQ(c.Of(0).kind, AttributionKind::kFree);
}

TEST(HandoverTest, PodResourcesDeviceNamingNoInstanceNeedsTheRuntime) {
  Case c;
  c.pods = {Pod("odd", "uid-o"), Pod("mine", "uid-m")};
  c.evidence.pod_resources = PodResourcesList{PrPod("odd", "example.com/gpu", {"dev-7"}),
                                              PrPod("mine", "nvidia.com/gpu", {"GPU-aaaa::0"})};
  Attribution a = c.Of(0);
  EXPECT_EQ(a.kind, AttributionKind::kUnproven);
  EXPECT_NE(a.reason.find("default/odd"), std::string::npos) << a.reason;
  // dynmig's own resource never needs it; a finished pod neither.
  c.pods[0].active = false;
  EXPECT_EQ(c.Of(0).kind, AttributionKind::kFree);
  // A pod the API does not list counts as active.
  c.pods.erase(c.pods.begin());
  EXPECT_EQ(c.Of(0).kind, AttributionKind::kUnproven);
}

TEST(HandoverTest, RuntimeContainersHoldUnlessExited) {
  Case c;
  c.pods = {Pod("a", "uid-a"), Pod("b", "uid-b", /*active=*/false)};
  c.evidence.runtime = std::vector<RuntimeContainer>{
      Container("a", "uid-a", {"MIG-a"}, RuntimeContainerState::kCreated),
      Container("b", "uid-b", {"MIG-b"}, RuntimeContainerState::kExited),
      Container("x", "uid-x", {"MIG-c"}, RuntimeContainerState::kUnknown)};
  EXPECT_EQ(c.Of(0).kind, AttributionKind::kHeld);
  EXPECT_EQ(c.Of(1).kind, AttributionKind::kFree);
  const Attribution x = c.Of(2);
  ASSERT_EQ(x.kind, AttributionKind::kHeld);  // a pod the API does not list still holds
  EXPECT_EQ(x.owner.pod_uid, "");
  EXPECT_EQ(x.owner.name, "x");
}

TEST(HandoverTest, UnreadableContainerBlocksFreeButNotHeld) {
  Case c;
  RuntimeContainer bad = Container("bad", "uid-bad", {});
  bad.error = "env too large";
  c.evidence.runtime = std::vector<RuntimeContainer>{bad, Container("a", "uid-a", {"MIG-a"})};
  EXPECT_EQ(c.Of(0).kind, AttributionKind::kHeld);
  const Attribution b = c.Of(1);
  EXPECT_EQ(b.kind, AttributionKind::kUnproven);
  EXPECT_NE(b.reason.find("env too large"), std::string::npos) << b.reason;
  // An unlistable instance is never free either.
  Case d;
  d.live[0].error = "NVML hiccup";
  d.live[0].cis.clear();
  EXPECT_EQ(d.Of(0).kind, AttributionKind::kUnproven);
}

TEST(HandoverTest, AttackAnnotationsDecideNothing) {
  // Pod "thief" names GI 1's MIG UUID in its annotations (PodMig says so: it is a HAMi pod
  // referencing the GPU); only the kubelet says who holds it.
  Case c;
  PodMig thief = Pod("thief", "uid-t");
  thief.relevant = true;
  thief.referenced_gpus = {kGpu0};
  thief.allocations = std::vector<protocol::MigAllocation>{};
  c.pods = {thief, Pod("nv", "uid-nv")};
  c.evidence.pod_resources = PodResourcesList{PrPod("nv", "nvidia.com/mig-1g.5gb", {"MIG-a"})};
  const Attribution a = c.Of(0);
  ASSERT_EQ(a.kind, AttributionKind::kHeld);
  ASSERT_EQ(a.holders.size(), 1u);
  EXPECT_EQ(a.owner.pod_uid, "uid-nv");
  // A runtime container claiming another pod's UID under its own name gets no UID.
  c.evidence.runtime = std::vector<RuntimeContainer>{Container("liar", "uid-nv", {"MIG-b"})};
  const Attribution b = c.Of(1);
  ASSERT_EQ(b.kind, AttributionKind::kHeld);
  EXPECT_EQ(b.holders[0].pod_uid, "");
  EXPECT_EQ(b.owner.name, "liar");
}

TEST(HandoverTest, AbsentAndTerminatedPodsStillHold) {
  Case c;
  c.pods = {Pod("done", "uid-d", /*active=*/false), Pod("live", "uid-l")};
  c.evidence.pod_resources = PodResourcesList{PrPod("ghost", "nvidia.com/mig-1g.5gb", {"MIG-a"}),
                                              PrPod("done", "nvidia.com/mig-1g.5gb", {"MIG-b"}),
                                              PrPod("live", "nvidia.com/mig-1g.5gb", {"MIG-b"})};
  const Attribution ghost = c.Of(0);
  ASSERT_EQ(ghost.kind, AttributionKind::kHeld);
  EXPECT_EQ(ghost.owner.pod_uid, "");
  EXPECT_EQ(ghost.owner.name, "ghost");
  const Attribution shared = c.Of(1);
  ASSERT_EQ(shared.kind, AttributionKind::kHeld);
  EXPECT_EQ(shared.holders.size(), 2u);
  EXPECT_EQ(shared.owner.pod_uid, "uid-l");  // the active holder owns it
  EXPECT_NE(HeldReason(shared).find("1 other holder"), std::string::npos) << HeldReason(shared);
  c.pods.pop_back();
  c.evidence.pod_resources = PodResourcesList{PrPod("done", "nvidia.com/mig-1g.5gb", {"MIG-b"})};
  const Attribution done = c.Of(1);
  ASSERT_EQ(done.kind, AttributionKind::kHeld);
  EXPECT_EQ(done.owner.pod_uid, "uid-d");
}

}  // namespace
}  // namespace dynmig::deviceplugin
