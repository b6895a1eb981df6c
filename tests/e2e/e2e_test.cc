// The migration guide's recommended scenarios and validation checklist, end to end: every request
// goes over HTTP (API server, extender, webhooks) or gRPC (kubelet <-> device plugin) to simulated
// GPUs, exactly as in a cluster. Each failure names its scenario and step.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>

#include "e2e/e2e_test_util.h"
#include "fmt/format.h"
#include "local/demo.h"
#include "nvml/nvml.h"
#include "protocol/node_register.h"

namespace dynmig::e2e {
namespace {

bool Overlap(const mig::Placement& a, const mig::Placement& b) {
  return a.start < b.start + b.size && b.start < a.start + a.size;
}

// Scenario 1: creation and deletion of one 1g pod.
TEST_F(E2eTest, Scenario1_CreateAndDeleteOne1gPod) {
  Scenario("scenario 1 (create and delete one 1g pod)");
  StartCluster();
  Step("create a 4000 MiB pod");
  auto a = RunPod(MigPod("one-1g", 4000));
  EXPECT_EQ(a.profile, "1g.5gb") << Where();
  EXPECT_EQ(a.placement.size, 1u) << Where();
  json pod = Get("one-1g");
  EXPECT_EQ(pod["spec"].value("schedulerName", ""), "dynmig-scheduler")
      << Where() << "the mutating webhook did not route the pod";
  EXPECT_EQ(kube::Annotation(pod, protocol::kBindPhaseAnnotation).value_or(""), "success")
      << Where();
  ExpectRealized("one-1g", a);
  ASSERT_EQ(Live().size(), 1u) << Where();
  // No Warning on a pod that scheduled fine (a pod update during kube-scheduler's decision
  // would show "FailedScheduling: pod ... is in the cache, so can't be assumed").
  EXPECT_EQ(Warnings("one-1g"), std::vector<std::string>{}) << Where();

  Step("delete it");
  DeletePod("one-1g");
  EXPECT_TRUE(WaitUntil([&] { return Live().empty(); }))
      << Where() << "the instance was not reclaimed: " << Live().size() << " left";
}

// Scenario 2: several non-overlapping 1g instances on one GPU.
TEST_F(E2eTest, Scenario2_SeveralNonOverlapping1gOnOneGpu) {
  Scenario("scenario 2 (several non-overlapping 1g)");
  StartCluster();
  std::vector<protocol::MigAllocation> got;
  for (int i = 0; i < 5; ++i) {
    Step(fmt::format("create 1g pod {}", i));
    got.push_back(RunPod(MigPod(fmt::format("small-{}", i), 4000)));
    ExpectRealized(fmt::format("small-{}", i), got.back());
  }
  Step("check the placements");
  std::set<std::string> uuids;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].profile, "1g.5gb") << Where();
    EXPECT_EQ(got[i].gpu_uuid, got[0].gpu_uuid) << Where() << "not on one GPU";
    for (size_t j = i + 1; j < got.size(); ++j) {
      EXPECT_FALSE(Overlap(got[i].placement, got[j].placement))
          << Where() << "pods " << i << " and " << j << " overlap at " << got[i].placement.start;
    }
    if (got[i].runtime) uuids.insert(got[i].runtime->mig_uuid);
  }
  EXPECT_EQ(uuids.size(), got.size()) << Where() << "MIG UUIDs are not distinct";
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(Warnings(fmt::format("small-{}", i)), std::vector<std::string>{}) << Where();
  }
  EXPECT_EQ(Live().size(), got.size()) << Where();
}

// Scenario 3: mixed placement of 1g, 2g and 3g instances.
TEST_F(E2eTest, Scenario3_Mixed1g2g3g) {
  Scenario("scenario 3 (mixed 1g, 2g, 3g)");
  StartCluster();
  const std::vector<std::pair<std::string, int64_t>> pods = {
      {"large-3g", 19000}, {"small-1g", 4000}, {"medium-2g", 9000}};
  const std::map<std::string, std::string> expected = {
      {"large-3g", "3g.20gb"}, {"small-1g", "1g.5gb"}, {"medium-2g", "2g.10gb"}};
  std::vector<protocol::MigAllocation> got;
  for (const auto& [name, mib] : pods) {
    Step("create " + name);
    got.push_back(RunPod(MigPod(name, mib)));
    EXPECT_EQ(got.back().profile, expected.at(name)) << Where();
    ExpectRealized(name, got.back());
  }
  Step("no two instances overlap, in the annotations and in NVML");
  for (size_t i = 0; i < got.size(); ++i) {
    for (size_t j = i + 1; j < got.size(); ++j) {
      EXPECT_FALSE(Overlap(got[i].placement, got[j].placement)) << Where() << i << " and " << j;
    }
  }
  auto live = Live();
  ASSERT_EQ(live.size(), 3u) << Where();
  for (size_t i = 0; i < live.size(); ++i) {
    for (size_t j = i + 1; j < live.size(); ++j) {
      if (live[i].gpu_uuid == live[j].gpu_uuid) {
        EXPECT_FALSE(Overlap(live[i].placement, live[j].placement)) << Where() << "NVML overlap";
      }
    }
  }
}

// Scenario 4: a pod stays Pending when capacity is exhausted, with a reason; it runs once room
// is made.
TEST_F(E2eTest, Scenario4_PendingWhenExhaustedWithReason) {
  Scenario("scenario 4 (Pending when exhausted)");
  StartCluster();
  Step("fill the GPU with two 3g pods");
  auto a = RunPod(MigPod("big-a", 19000));
  auto b = RunPod(MigPod("big-b", 19000));
  EXPECT_EQ(a.profile, "3g.20gb") << Where();
  EXPECT_EQ(b.profile, "3g.20gb") << Where();
  Step("a 1g pod has no room");
  Create(MigPod("waiting", 4000));
  std::string reason;
  ASSERT_TRUE(WaitUntil([&] { return !(reason = Unschedulable("waiting")).empty(); }))
      << Where() << "no PodScheduled=False condition: " << Get("waiting").dump();
  EXPECT_NE(reason.find("node-a"), std::string::npos) << Where() << reason;
  EXPECT_EQ(Phase("waiting"), "Pending") << Where();
  EXPECT_TRUE(Allocations(Get("waiting")).empty())
      << Where() << "a Pending pod holds a reservation";
  EXPECT_TRUE(HoldsFor([&] { return Phase("waiting") == "Pending"; }, absl::Seconds(1)))
      << Where() << "phase " << Phase("waiting");
  EXPECT_EQ(Live().size(), 2u) << Where() << "something was created for the Pending pod";

  Step("delete one 3g pod: the waiting pod is scheduled into its slices");
  DeletePod("big-a");
  auto w = WaitRunning("waiting");
  EXPECT_EQ(w.profile, "1g.5gb") << Where();
  EXPECT_TRUE(Overlap(w.placement, a.placement)) << Where() << "it should use the freed slices";
  ExpectRealized("waiting", w);
}

// Scenario 5: reuse of a placement after deleting a small instance.
TEST_F(E2eTest, Scenario5_PlacementReusedAfterDelete) {
  Scenario("scenario 5 (placement reuse)");
  StartCluster();
  std::vector<protocol::MigAllocation> got;
  for (int i = 0; i < 7; ++i) {
    Step(fmt::format("fill with 1g pod {}", i));
    got.push_back(RunPod(MigPod(fmt::format("p{}", i), 4000)));
  }
  Step("the GPU is full");
  Create(MigPod("extra", 4000));
  ASSERT_TRUE(WaitUntil([&] { return !Unschedulable("extra").empty(); })) << Where();
  Step("delete the pod at slice 3");
  int victim = -1;
  for (int i = 0; i < 7; ++i) {
    if (got[i].placement.start == 3) victim = i;
  }
  ASSERT_GE(victim, 0) << Where() << "no pod at slice 3";
  const std::string old_uuid = got[victim].runtime ? got[victim].runtime->mig_uuid : "";
  DeletePod(fmt::format("p{}", victim));
  Step("the waiting pod gets slice 3 with a new instance");
  auto reused = WaitRunning("extra");
  EXPECT_EQ(reused.placement.start, 3u) << Where();
  EXPECT_EQ(reused.gpu_uuid, got[victim].gpu_uuid) << Where();
  ExpectRealized("extra", reused);
  EXPECT_EQ(Live().size(), 7u) << Where();
  (void)old_uuid;
}

// Scenario 6: a device-plugin restart while a workload runs: nothing destroyed, same MIG UUIDs,
// adopted (the adopted instance is reclaimed normally afterwards).
TEST_F(E2eTest, Scenario6_DevicePluginRestartAdoptsRunningWorkloads) {
  Scenario("scenario 6 (device-plugin restart)");
  StartCluster();
  Step("run two pods");
  auto a = RunPod(MigPod("keep-a", 9000));
  auto b = RunPod(MigPod("keep-b", 4000));
  ASSERT_TRUE(a.runtime && b.runtime) << Where();
  auto before = Live();
  ASSERT_EQ(before.size(), 2u) << Where();

  Step("restart the device plugin");
  ASSERT_TRUE(cluster_->RestartDevicePlugin("node-a").ok()) << Where();
  ASSERT_TRUE(Plugin().RunCycle()) << Where();
  ASSERT_TRUE(Plugin().RunCycle()) << Where();

  Step("same instances, same MIG UUIDs, pods Running, adopted");
  auto after = Live();
  ASSERT_EQ(after.size(), 2u) << Where();
  for (const auto& li : before) {
    const local::LiveInstance* same = FindLive(after, li.mig_uuid);
    ASSERT_NE(same, nullptr) << Where() << li.mig_uuid << " is gone";
    EXPECT_EQ(same->gi_id, li.gi_id) << Where();
    EXPECT_EQ(same->ci_id, li.ci_id) << Where();
  }
  EXPECT_EQ(Phase("keep-a"), "Running") << Where();
  std::set<std::string> managed;
  for (const auto& m : Plugin().core().Managed()) managed.insert(m.mig_uuid);
  EXPECT_TRUE(managed.count(a.runtime->mig_uuid) && managed.count(b.runtime->mig_uuid))
      << Where() << "not adopted";
  EXPECT_TRUE(Plugin().core().Quarantined().empty()) << Where();

  Step("a new pod after the restart does not overlap the adopted ones");
  auto c = RunPod(MigPod("after-restart", 19000));
  EXPECT_FALSE(Overlap(c.placement, a.placement) || Overlap(c.placement, b.placement)) << Where();

  Step("deleting an adopted pod reclaims exactly its instance");
  DeletePod("keep-a");
  EXPECT_TRUE(WaitUntil([&] { return FindLive(Live(), a.runtime->mig_uuid) == nullptr; }))
      << Where();
  EXPECT_NE(FindLive(Live(), b.runtime->mig_uuid), nullptr) << Where() << "keep-b was touched";
}

// Ends the workload on a MIG device, so that only the plugin's own rules (not NVML's IN_USE) keep
// the instance alive.
void DetachAll(local::LocalCluster& cluster, const std::string& node, const std::string& mig_uuid) {
  auto ended = cluster.EndProcesses(node, mig_uuid);
  ASSERT_TRUE(ended.ok()) << ended.status();
  ASSERT_GE(*ended, 1) << "no process ran on " << mig_uuid;
}

// Scenario 7: an annotation missing or holding only part of its runtime identity fails safe:
// nothing is destroyed, it is reported, the scheduler places nothing over it; an annotation that
// reads but does not match NVML keeps its slices out of use.
TEST_F(E2eTest, Scenario7_PartialOrMissingAnnotationFailsSafe) {
  Scenario("scenario 7 (partial or missing annotation)");
  StartCluster();
  Step("run a pod; its workload goes idle");
  auto a = RunPod(MigPod("victim", 9000));
  ASSERT_TRUE(a.runtime) << Where();
  DetachAll(*cluster_, "node-a", a.runtime->mig_uuid);
  ASSERT_TRUE(cluster_->StopDevicePlugin("node-a").ok()) << Where();
  auto as_scheduler = cluster_->Client(local::kSchedulerUser);
  ASSERT_TRUE(as_scheduler.ok());
  auto write = [&](std::optional<std::string> value) {
    auto patched =
        (*as_scheduler)
            ->PatchPodAnnotations("default", "victim",
                                  {{std::string(protocol::kMigAllocationsAnnotation), value}});
    ASSERT_TRUE(patched.ok()) << Where() << patched.status();
  };
  const json original =
      json::parse(*kube::Annotation(Get("victim"), protocol::kMigAllocationsAnnotation));

  Step("the annotation loses its GI/CI ids (written as the scheduler, past the webhook)");
  json partial = original;
  partial[0].erase("gpuInstanceID");
  partial[0].erase("computeInstanceID");
  write(partial.dump());
  ASSERT_TRUE(cluster_->StartDevicePlugin("node-a").ok()) << Where();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Plugin().RunCycle()) << Where();
  EXPECT_NE(FindLive(Live(), a.runtime->mig_uuid), nullptr)
      << Where() << "the instance of an unreadable reservation was destroyed";
  auto events = kube_->List(kube::Resource::kEvents, {});
  ASSERT_TRUE(events.ok());
  bool reported = false;
  for (const auto& e : events->items) {
    reported |= e.value("reason", "") == "MigReconcileSkipped" &&
                e["involvedObject"].value("name", "") == "victim";
  }
  EXPECT_TRUE(reported) << Where() << "no event on the pod says why nothing is reclaimed";
  Create(MigPod("blocked", 4000));
  std::string reason;
  EXPECT_TRUE(WaitUntil([&] { return !(reason = Unschedulable("blocked")).empty(); }))
      << Where() << "a pod was placed next to an unreadable reservation: " << Get("blocked").dump();
  DeletePod("blocked");

  Step("the annotation is complete but names another GI: unverified, its slices kept out of use");
  ASSERT_TRUE(cluster_->StopDevicePlugin("node-a").ok()) << Where();
  json wrong = original;
  wrong[0]["gpuInstanceID"] = original[0]["gpuInstanceID"].get<int>() + 1;
  write(wrong.dump());
  ASSERT_TRUE(cluster_->StartDevicePlugin("node-a").ok()) << Where();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Plugin().RunCycle()) << Where();
  EXPECT_NE(FindLive(Live(), a.runtime->mig_uuid), nullptr) << Where() << "destroyed";
  auto quarantined = Plugin().core().Quarantined();
  ASSERT_FALSE(quarantined.empty()) << Where() << "its slices are not kept out of use";
  EXPECT_EQ(quarantined[0].pod, "default/victim") << Where();
  EXPECT_EQ(quarantined[0].placement, a.placement) << Where();
  EXPECT_EQ(Plugin().metrics().Value("dynmig_deviceplugin_unverified_allocations"), 1.0)
      << Where() << "not visible in metrics:\n"
      << Plugin().metrics().Serialize();
  auto b = RunPod(MigPod("neighbour", 9000));
  EXPECT_FALSE(Overlap(b.placement, a.placement)) << Where();
  ExpectRealized("neighbour", b);

  Step("the annotation disappears entirely (a MIG pod without a readable reservation)");
  write(std::nullopt);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Plugin().RunCycle()) << Where();
  EXPECT_NE(FindLive(Live(), a.runtime->mig_uuid), nullptr)
      << Where() << "an instance was destroyed while a MIG pod's reservation was missing";
  ASSERT_TRUE(b.runtime.has_value());
  EXPECT_NE(FindLive(Live(), b.runtime->mig_uuid), nullptr) << Where();
  Create(MigPod("blocked-again", 4000));
  EXPECT_TRUE(WaitUntil([&] { return !Unschedulable("blocked-again").empty(); }))
      << Where()
      << "placed next to a MIG pod without a reservation: " << Get("blocked-again").dump();
}

// Scenario 8: no destructive reclamation while the Kubernetes API is unavailable.
TEST_F(E2eTest, Scenario8_NoReclamationWhileApiUnavailable) {
  Scenario("scenario 8 (API unavailable)");
  StartCluster();
  Step("run two pods, stop the device plugin, delete one pod");
  auto a = RunPod(MigPod("gone", 4000));
  auto b = RunPod(MigPod("stays", 4000));
  ASSERT_TRUE(a.runtime && b.runtime) << Where();
  ASSERT_TRUE(cluster_->StopDevicePlugin("node-a").ok()) << Where();
  DeletePod("gone");
  DetachAll(*cluster_, "node-a", b.runtime->mig_uuid);  // even an idle instance must survive

  Step("the API server answers 503 to every pod list; the plugin starts and reconciles");
  kube::FaultSpec fault;
  fault.method = "GET";
  fault.path_prefix = "/api/v1/pods";
  fault.count = -1;
  fault.status = 503;
  fault.message = "e2e: the API is unavailable";
  cluster_->api().AddFault(fault);
  ASSERT_TRUE(cluster_->StartDevicePlugin("node-a").ok()) << Where();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Plugin().RunCycle()) << Where();
  // And three of its own background cycles (counted, not slept for).
  const uint64_t cycles = Plugin().cycles();
  ASSERT_TRUE(WaitUntil([&] { return Plugin().cycles() >= cycles + 3; })) << Where();
  EXPECT_EQ(Live().size(), 2u) << Where()
                               << "an instance was destroyed while pods could not be listed";
  EXPECT_TRUE(Plugin().core().recovery_pending()) << Where();

  Step("the API comes back: exactly the deleted pod's instance is reclaimed");
  cluster_->api().ClearFaults();
  EXPECT_TRUE(WaitUntil([&] { return FindLive(Live(), a.runtime->mig_uuid) == nullptr; },
                        absl::Seconds(30)))
      << Where();
  EXPECT_NE(FindLive(Live(), b.runtime->mig_uuid), nullptr)
      << Where() << "the running pod's instance";
  EXPECT_EQ(Phase("stays"), "Running") << Where();
}

// Checklist, node capability: mode mig, non-empty migProfiles, profile memory, slices and
// placements as NVML reports them; a model that is not allowlisted is not exposed.
TEST_F(E2eTest, ChecklistNodeCapabilityMatchesNvml) {
  Scenario("checklist (node capability)");
  const std::string config =
      "nvidia:\n"
      "  migProfileAllowlist:\n"
      "    - models: [\"A100-SXM4-40GB\"]\n"
      "      profiles: [\"1g.5gb\", \"2g.10gb\", \"3g.20gb\", \"4g.20gb\", \"7g.40gb\"]\n";
  StartCluster("node-a=A100-SXM4-40GBx1,A30x1", config);
  Step("read the node register annotation");
  auto node = kube_->GetNode("node-a");
  ASSERT_TRUE(node.ok()) << Where();
  auto value = kube::Annotation(*node, protocol::kNodeRegisterAnnotation);
  ASSERT_TRUE(value) << Where();
  auto devices = protocol::DecodeNodeRegister(*value);
  ASSERT_TRUE(devices.ok()) << Where() << devices.status();
  auto sim = cluster_->OpenNvml("node-a");
  ASSERT_TRUE(sim.ok());
  auto a100 = (*sim)->GetGpu(0);
  auto a30 = (*sim)->GetGpu(1);
  ASSERT_TRUE(a100.ok() && a30.ok());
  ASSERT_EQ(devices->size(), 1u) << Where() << "the A30 (not allowlisted) is exposed: " << *value;
  const protocol::DeviceInfo& d = devices->front();
  EXPECT_EQ(d.id, a100->uuid) << Where();
  EXPECT_EQ(d.mode, "mig") << Where();
  ASSERT_EQ(d.mig_profiles.size(), 5u) << Where();

  Step("every published profile matches NVML");
  std::map<std::string, std::pair<nvml::GpuInstanceProfileInfo, std::vector<mig::Placement>>> nv;
  for (uint32_t index = 0; index < nvml::kGpuInstanceProfileCount; ++index) {
    auto info = (*sim)->GetGpuInstanceProfileInfo(0, index);
    if (!info.ok()) continue;
    auto placements = (*sim)->GetGpuInstancePossiblePlacements(0, info->id);
    ASSERT_TRUE(placements.ok());
    nv[nvml::GpuInstanceProfileName(index, info->slice_count, info->memory_mib,
                                    a100->total_memory_bytes)] = {*info, *placements};
  }
  for (const auto& p : d.mig_profiles) {
    ASSERT_TRUE(nv.count(p.name)) << Where() << p.name << " is not an NVML profile";
    EXPECT_EQ(p.memory_mib, nv[p.name].first.memory_mib) << Where() << p.name;
    EXPECT_EQ(p.slice_count, nv[p.name].first.slice_count) << Where() << p.name;
    EXPECT_EQ(p.placements, nv[p.name].second) << Where() << p.name;
  }

  Step("pods are only ever placed on the A100: the A30 is not exposed");
  Create(MigPod("two-instances", 4000, "", "sleep 3600", 2));
  auto two = WaitRunning("two-instances");
  EXPECT_EQ(two.gpu_uuid, a100->uuid) << Where();
}

// Checklist, scheduling: the preference is honored and never blocks; typos and user edits of the
// reservation are refused at admission.
TEST_F(E2eTest, ChecklistPreferenceAndAdmission) {
  Scenario("checklist (preference and admission)");
  StartCluster();
  Step("a 19000 MiB pod that prefers 4g");
  auto p = RunPod(MigPod("prefer-4g", 19000, "4g"));
  EXPECT_EQ(p.profile, "4g.20gb") << Where();
  ExpectRealized("prefer-4g", p);
  Step("a second 4g preference cannot be met: it falls back, not Pending");
  auto q = RunPod(MigPod("prefer-4g-again", 19000, "4g"));
  EXPECT_EQ(q.profile, "3g.20gb") << Where();

  Step("a misspelled preference is refused at creation");
  auto typo = kube_->CreatePod(MigPod("typo", 4000, "4gg"));
  ASSERT_FALSE(typo.ok()) << Where() << "accepted";
  const std::string msg(typo.status().message());
  EXPECT_NE(msg.find("4gg"), std::string::npos) << Where() << msg;
  EXPECT_NE(msg.find("3g.20gb"), std::string::npos)
      << Where() << "no valid choices listed: " << msg;

  Step("a user cannot edit the reservation annotation");
  auto edit = kube_->PatchPodAnnotations(
      "default", "prefer-4g", {{std::string(protocol::kMigAllocationsAnnotation), "[]"}});
  ASSERT_FALSE(edit.ok()) << Where() << "the edit was accepted";
  EXPECT_NE(std::string(edit.status().message()).find(protocol::kMigAllocationsAnnotation),
            std::string::npos)
      << Where() << edit.status();
  EXPECT_EQ(Allocations(Get("prefer-4g")).front(), p) << Where() << "the reservation changed";
}

// Every annotation of the protocol is the system's to write (issue 19): a user may not set, change
// or remove any of them (kubectl annotate is refused with the reservation's message), the
// system's identities may, and the user may still delete the pod.
TEST_F(E2eTest, EveryProtocolAnnotationIsTheSystemsToWrite) {
  Scenario("checklist (protocol annotations are the system's)");
  StartCluster();
  Step("a running MIG pod");
  auto p = RunPod(MigPod("canary", 4000));
  ExpectRealized("canary", p);
  const json before = Get("canary");
  auto as_scheduler = cluster_->Client(local::kSchedulerUser);
  auto as_kubelet = cluster_->Client("system:node:node-a");
  ASSERT_TRUE(as_scheduler.ok() && as_kubelet.ok()) << Where();
  for (const std::string_view k : protocol::kSystemPodAnnotations) {
    const std::string key(k);
    Step("a user writes " + key);
    const std::optional<std::string> original = kube::Annotation(before, key);
    for (const std::optional<std::string>& value :
         {std::optional<std::string>("forged-by-user"), std::optional<std::string>()}) {
      if (!value.has_value() && !original.has_value()) continue;  // nothing to remove
      auto edit = kube_->PatchPodAnnotations("default", "canary", {{key, value}});
      ASSERT_FALSE(edit.ok()) << Where() << (value ? "set" : "removal") << " was accepted";
      const std::string msg(edit.status().message());
      EXPECT_NE(msg.find(key + " is written only by the dynmig scheduler and device plugin"),
                std::string::npos)
          << Where() << msg;
      EXPECT_NE(msg.find("user \"kubernetes-admin\" may not change or remove it"),
                std::string::npos)
          << Where() << msg;
      EXPECT_EQ(kube::Annotation(Get("canary"), key), original) << Where() << "it changed";
    }
    Step("a user creates a pod carrying " + key);
    json forged = MigPod("forged", 4000);
    forged["metadata"]["annotations"][key] = "allocating";
    auto created = kube_->CreatePod(forged);
    ASSERT_FALSE(created.ok()) << Where() << "accepted";
    EXPECT_NE(std::string(created.status().message()).find("may not set it"), std::string::npos)
        << Where() << created.status();
  }
  Step("the system's identities may write them");
  const std::string bind_time(protocol::kBindTimeAnnotation);
  const std::string visible(protocol::kVisibleDevicesAnnotation);
  auto by_scheduler = (*as_scheduler)
                          ->PatchPodAnnotations("default", "canary",
                                                {{bind_time, kube::Annotation(before, bind_time)}});
  EXPECT_TRUE(by_scheduler.ok()) << Where() << by_scheduler.status();
  // The kubelet stand-in rewrites what it gave the container (same content, other spelling).
  const std::string respelled =
      json::parse(kube::Annotation(before, visible).value_or("{}")).dump(1);
  ASSERT_NE(respelled, kube::Annotation(before, visible).value_or("")) << Where();
  auto by_kubelet = (*as_kubelet)->PatchPodAnnotations("default", "canary", {{visible, respelled}});
  EXPECT_TRUE(by_kubelet.ok()) << Where() << by_kubelet.status();
  Step("the user may still delete the pod");
  DeletePod("canary");
}

// A deleted pod whose process goes on holds its slices: the scheduler does not hand them out (a pod
// reserved there would fail at Allocate) until the instance is reclaimed.
TEST_F(E2eTest, SlicesOfADeletedPodStillRunningAreNotHandedOut) {
  Scenario("held slices");
  StartCluster();
  Step("two 3g pods fill the GPU; one is deleted while a process of it goes on");
  auto keep = RunPod(MigPod("keep", 19000));
  auto gone = RunPod(MigPod("gone", 19000));
  ASSERT_TRUE(gone.runtime) << Where();
  auto sim = cluster_->OpenNvml("node-a");
  ASSERT_TRUE(sim.ok());
  ASSERT_TRUE((*sim)->AttachProcess(gone.runtime->mig_uuid, 777).ok()) << Where();
  DeletePod("gone");
  ASSERT_TRUE(Plugin().RunCycle()) << Where();
  ASSERT_NE(FindLive(Live(), gone.runtime->mig_uuid), nullptr) << Where() << "reclaimed while busy";
  ASSERT_TRUE(WaitUntil([&] {
    for (const auto& n : cluster_->Layout()) {
      for (const auto& g : n.gpus) {
        for (const auto& r : g.reservations) {
          if (r.pod == "(held by the node)" && r.placement == gone.placement) return true;
        }
      }
    }
    return false;
  })) << Where()
      << "the scheduler does not show the held slices";

  Step("a new 3g pod waits instead of being sent to the held slices");
  Create(MigPod("next", 19000));
  std::string reason;
  ASSERT_TRUE(WaitUntil([&] { return !(reason = Unschedulable("next")).empty(); }))
      << Where() << Get("next").dump();
  EXPECT_EQ(Phase("next"), "Pending") << Where();

  Step("the process ends: the instance is reclaimed and the pod runs there");
  ASSERT_TRUE((*sim)->DetachProcess(gone.runtime->mig_uuid, 777).ok());
  auto next = WaitRunning("next");
  EXPECT_EQ(next.placement, gone.placement) << Where();
  ExpectRealized("next", next);
  (void)keep;
}

// A pod that ends by itself: Succeeded, its instance reclaimed.
TEST_F(E2eTest, ShortJobSucceedsAndIsReclaimed) {
  Scenario("lifecycle (a job that ends)");
  StartCluster();
  Step("run a pod of `sleep 1`");
  auto a = RunPod(MigPod("short", 4000, "", "sleep 1"));
  ASSERT_TRUE(a.runtime) << Where();
  Step("it succeeds and its instance goes away");
  EXPECT_TRUE(WaitUntil([&] { return Phase("short") == "Succeeded"; })) << Where();
  EXPECT_TRUE(WaitUntil([&] { return Live().empty(); })) << Where();
}

// Several nodes and GPUs: the scheduler spreads what does not fit, the plugins stay independent.
TEST_F(E2eTest, TwoNodesServeTogether) {
  Scenario("two nodes");
  StartCluster("node-a=A100-SXM4-40GBx1,node-b=H100 80GBx1");
  Step("two 7g pods: one per node");
  auto a = RunPod(MigPod("whole-a", 40000));
  auto b = RunPod(MigPod("whole-b", 40000));
  const std::string na = kube::NodeName(Get("whole-a"));
  const std::string nb = kube::NodeName(Get("whole-b"));
  EXPECT_NE(na, nb) << Where();
  ExpectRealized("whole-a", a, na);
  ExpectRealized("whole-b", b, nb);
}

// `dynmig local` run again on the same state directory: the earlier run's workloads ended with it,
// so its leftover instances are cleaned and the GPUs serve again.
TEST_F(E2eTest, WholeLocalModeRestartStartsClean) {
  Scenario("local mode restarted on its state");
  StartCluster();
  Step("first run: a 3g and a 1g pod");
  auto a = RunPod(MigPod("first-3g", 19000));
  RunPod(MigPod("first-1g", 4000));
  ASSERT_EQ(Live().size(), 2u) << Where();
  Step("second run on the same state directory");
  RestartWholeCluster();
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(Plugin().RunCycle()) << Where();
  EXPECT_TRUE(WaitUntil([&] { return Live().empty(); }))
      << Where() << Live().size() << " instance(s) of the first run left";
  Step("the freed slices serve a new pod");
  auto b = RunPod(MigPod("second-3g", 19000));
  ExpectRealized("second-3g", b);
  (void)a;
}

// `dynmig local`'s demo itself passes on the default nodes.
TEST_F(E2eTest, DemoRunsToTheEnd) {
  Scenario("the demo");
  StartCluster("node-a=A100-SXM4-40GBx2,node-b=H100 80GBx1");
  std::ostringstream out;
  local::DemoOptions d;
  d.layout = [] { return std::string("(layout)\n"); };
  auto st = local::RunDemo(*cluster_, out, d);
  EXPECT_TRUE(st.ok()) << st << "\n" << out.str();
  EXPECT_EQ(out.str().find("FAILED"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("stays Pending"), std::string::npos) << out.str();
}

// The README's kubectl commands work as written against the local mode.
TEST_F(E2eTest, RealKubectlAppliesTheExamples) {
  Scenario("kubectl");
  if (std::system("kubectl version --client >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "kubectl is not installed (tools/install-deps.sh installs it)";
  }
  StartCluster();
  const char* src = std::getenv("DYNMIG_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  const std::string k = cluster_->kubeconfig_path();
  auto run = [&](const std::string& args) {
    return RunCommand(fmt::format("kubectl --kubeconfig {} {}", k, args));
  };
  Step("kubectl apply -f examples/mig-canary.yaml");
  auto [rc, out] = run(fmt::format("apply -f {}/examples/mig-canary.yaml", src));
  ASSERT_EQ(rc, 0) << Where() << out;
  auto a = WaitRunning("mig-canary");
  ExpectRealized("mig-canary", a);
  Step("kubectl get pods");
  auto [rc2, out2] = run("get pods");
  EXPECT_EQ(rc2, 0) << Where() << out2;
  EXPECT_NE(out2.find("mig-canary"), std::string::npos) << Where() << out2;
  EXPECT_NE(out2.find("Running"), std::string::npos) << Where() << out2;
  Step("kubectl apply -f examples/mig-typo.yaml is refused");
  auto [rc3, out3] = run(fmt::format("apply -f {}/examples/mig-typo.yaml", src));
  EXPECT_NE(rc3, 0) << Where() << out3;
  EXPECT_NE(out3.find("4gg"), std::string::npos) << Where() << out3;
  Step("kubectl delete pod mig-canary");
  auto [rc4, out4] = run("delete pod mig-canary");
  EXPECT_EQ(rc4, 0) << Where() << out4;
  EXPECT_TRUE(WaitUntil([&] { return Live().empty(); })) << Where();
}

}  // namespace
}  // namespace dynmig::e2e
