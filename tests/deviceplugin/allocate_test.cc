// Allocate and reclamation through the real gRPC path: test kubelet -> plugin -> SimNvml + API.
#include <httplib.h>

#include <fstream>
#include <future>
#include <set>
#include <sstream>

#include "dp_test_util.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace dynmig::deviceplugin::testing {
namespace {

std::vector<std::string> DevicePaths(const v1beta1::ContainerAllocateResponse& r) {
  std::vector<std::string> out;
  for (const auto& d : r.devices()) out.push_back(d.host_path());
  return out;
}

class AllocateTest : public PluginTest {};

TEST_F(AllocateTest, CreatesOne1gInstanceAndReclaimsItWhenThePodIsDeleted) {
  StartPlugin();
  CreatePod("p1", {{0, 0, 0, "1g.5gb", 6}});
  auto a = Allocate("p1", 0, 1);
  ASSERT_TRUE(a.ok()) << a.status();

  // NVML: exactly one GI, 1g.5gb at slice 6, with its CI.
  auto gi = GiAt(0, 6);
  ASSERT_TRUE(gi.has_value());
  EXPECT_EQ(gi->placement, (mig::Placement{6, 1}));
  EXPECT_EQ(TotalGis(), 1u);
  auto cis = sim_->ListComputeInstances(0, gi->id);
  ASSERT_TRUE(cis.ok());
  ASSERT_EQ(cis->size(), 1u);
  const std::string uuid = cis->front().mig_uuid;

  // The answer.
  EXPECT_EQ(a->response.envs().at("NVIDIA_VISIBLE_DEVICES"), uuid);
  const auto minors = nvml::MigMinors::Parse(nvml::MigMinors::Generate(1));
  const auto nodes = minors->DeviceNodes(0, gi->id, cis->front().id);
  EXPECT_EQ(DevicePaths(a->response), nodes->All());
  EXPECT_EQ(a->response.devices(0).permissions(), "rw");
  EXPECT_TRUE(a->response.cdi_devices().empty());

  // The annotation: runtime identity, container consumed, bind-phase success, lock released.
  auto allocations = Allocations("p1");
  ASSERT_EQ(allocations.size(), 1u);
  ASSERT_TRUE(allocations[0].runtime.has_value());
  EXPECT_EQ(allocations[0].runtime->mig_uuid, uuid);
  EXPECT_EQ(allocations[0].runtime->gpu_instance_id, gi->id);
  EXPECT_EQ(allocations[0].runtime->compute_instance_id, cis->front().id);
  EXPECT_EQ(PodAnnotation("p1", protocol::kBindPhaseAnnotation), "success");
  auto remaining =
      protocol::DecodePodDevices(PodAnnotation("p1", protocol::kDevicesToAllocateAnnotation));
  ASSERT_TRUE(remaining.ok());
  for (const auto& c : *remaining) EXPECT_TRUE(c.empty());
  EXPECT_FALSE(NodeLock().has_value());
  EXPECT_TRUE(HasEvent(kReasonCreated, uuid));
  EXPECT_EQ(
      plugin_->metrics().Value("dynmig_deviceplugin_instances_created_total", "profile", "1g.5gb"),
      1);
  EXPECT_EQ(plugin_->core().Managed().size(), 1u);
  EXPECT_TRUE(plugin_->core().OpenIntents().empty());

  // Running: a reconcile keeps it.
  SetPhase("p1", "Running");
  auto kept = plugin_->core().Reconcile();
  EXPECT_EQ(kept.destroyed, 0);
  EXPECT_EQ(TotalGis(), 1u);

  // Deleted: reclaimed, CI then GI.
  DeletePod("p1");
  auto report = plugin_->core().Reconcile();
  EXPECT_TRUE(report.skipped.empty()) << report.skipped;
  EXPECT_EQ(report.destroyed, 1);
  EXPECT_EQ(TotalGis(), 0u);
  EXPECT_TRUE(plugin_->core().Managed().empty());
  EXPECT_TRUE(HasEvent(kReasonDestroyed, uuid));
  EXPECT_EQ(plugin_->metrics().Value("dynmig_deviceplugin_instances_destroyed_total", "reason",
                                     "reclaimed"),
            1);
}

TEST_F(AllocateTest, SevenNonOverlapping1gInstancesOnOneGpu) {
  StartPlugin();
  std::set<std::string> uuids;
  for (uint32_t s = 0; s < 7; ++s) {
    const std::string name = fmt::format("p{}", s);
    CreatePod(name, {{0, 0, 0, "1g.5gb", s}});
    auto a = Allocate(name, 0, 1);
    ASSERT_TRUE(a.ok()) << a.status();
    uuids.insert(a->response.envs().at("NVIDIA_VISIBLE_DEVICES"));
    SetPhase(name, "Running");
  }
  EXPECT_EQ(uuids.size(), 7u);
  auto gis = Gis(0);
  ASSERT_EQ(gis.size(), 7u);
  std::set<uint32_t> starts;
  for (const auto& gi : gis) starts.insert(gi.placement.start);
  EXPECT_EQ(starts, (std::set<uint32_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(plugin_->core().Managed().size(), 7u);
}

TEST_F(AllocateTest, MixedProfilesGetTheirExactNvmlProfilesAndPlacements) {
  StartPlugin();
  CreatePod("big", {{0, 0, 0, "3g.20gb", 4}});
  CreatePod("mid", {{0, 0, 0, "2g.10gb", 0}});
  CreatePod("small", {{0, 0, 0, "1g.5gb", 2}, {0, 1, 0, "1g.5gb", 3}});
  CreatePod("other", {{0, 0, 1, "4g.20gb", 0}});
  for (const auto& [name, count] : std::vector<std::pair<std::string, int>>{
           {"big", 1}, {"mid", 1}, {"small", 2}, {"other", 1}}) {
    LockNodeFor(name);
    auto a = Allocate(name, 0, count);
    ASSERT_TRUE(a.ok()) << name << ": " << a.status();
    EXPECT_EQ(std::count(a->response.envs().at("NVIDIA_VISIBLE_DEVICES").begin(),
                         a->response.envs().at("NVIDIA_VISIBLE_DEVICES").end(), ','),
              count - 1);
  }
  const auto& cap = (*mig::FindModel("A100-SXM4-40GB"))->capability;
  auto expect = [&](uint32_t gpu, uint32_t start, const std::string& profile) {
    auto gi = GiAt(gpu, start);
    ASSERT_TRUE(gi.has_value()) << profile << " at " << start;
    EXPECT_EQ(gi->profile_id, cap.FindProfile(profile)->nvml_id) << profile;
    EXPECT_EQ(gi->placement.size, SizeOf(profile));
  };
  expect(0, 4, "3g.20gb");
  expect(0, 0, "2g.10gb");
  expect(0, 2, "1g.5gb");
  expect(0, 3, "1g.5gb");
  expect(1, 0, "4g.20gb");
  EXPECT_EQ(TotalGis(), 5u);
  // Each entry of the two-device pod carries its own identity.
  auto small = Allocations("small");
  ASSERT_EQ(small.size(), 2u);
  EXPECT_NE(small[0].runtime->mig_uuid, small[1].runtime->mig_uuid);
}

TEST_F(AllocateTest, ContainersAreAllocatedInTurnAndTheLastOneCompletesTheBind) {
  StartPlugin();
  // Init container 0 without GPU, container 1 with two 1g, container 2 with a 2g.
  CreatePod("multi", {{1, 0, 0, "1g.5gb", 0}, {1, 1, 0, "1g.5gb", 1}, {2, 0, 0, "2g.10gb", 2}}, 3);
  auto first = Allocate("multi", 1, 2);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(PodAnnotation("multi", protocol::kBindPhaseAnnotation), "allocating");
  // The lock was released once the pod was identified; the next bind may take it meanwhile.
  EXPECT_FALSE(NodeLock().has_value());
  CreatePod("next", {{0, 0, 1, "1g.5gb", 0}});
  // The kubelet goes on with the pod it is admitting: its next container is still this pod's.
  auto second = Allocate("multi", 2, 1);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(PodAnnotation("multi", protocol::kBindPhaseAnnotation), "success");
  for (const auto& a : Allocations("multi")) EXPECT_TRUE(a.runtime.has_value());
  EXPECT_EQ(TotalGis(), 3u);
  EXPECT_EQ(PodAnnotation("next", protocol::kBindPhaseAnnotation), "allocating");
  EXPECT_EQ(NodeLock().value_or("").find(",default,next") != std::string::npos, true);
  // Then the pod that took the lock.
  ASSERT_TRUE(Allocate("next", 0, 1).ok());
  EXPECT_EQ(PodAnnotation("next", protocol::kBindPhaseAnnotation), "success");
  EXPECT_TRUE(GiAt(1, 0).has_value());
  EXPECT_FALSE(NodeLock().has_value());
  EXPECT_FALSE(HasEvent(kReasonBindMismatch));
}

// Issue 27: GET /nvml never waits for Allocate's lock (a caller hammering it cannot stall the
// kubelet's Allocate, nor the other way round): while an Allocate holds the core, the view answers
// the last snapshot at once; after it, the snapshot shows the new instance.
TEST_F(AllocateTest, TheNvmlViewNeverWaitsForAnAllocate) {
  std::vector<bool> answered_during;
  StartPlugin([&](DevicePluginOptions& o) {
    o.core.crash_point = [&](std::string_view point) {
      if (point == kCrashAfterGpuInstance) {
        auto view = std::async(std::launch::async, [&] { return plugin_->core().NvmlView(); });
        answered_during.push_back(view.wait_for(std::chrono::seconds(10)) ==
                                  std::future_status::ready);
        if (answered_during.back()) {
          // The snapshot from before this Allocate: no instance yet.
          answered_during.push_back(view.get().dump().find("\"gpuInstanceID\"") ==
                                    std::string::npos);
        }
      }
      return false;
    };
  });
  (void)plugin_->core().NvmlView();  // a first snapshot
  CreatePod("p", {{0, 0, 0, "1g.5gb", 0}});
  ASSERT_TRUE(Allocate("p", 0, 1).ok());
  EXPECT_EQ(answered_during, (std::vector<bool>{true, true}));
  const nlohmann::json after = plugin_->core().NvmlView();
  EXPECT_NE(after.dump().find("\"gpuInstanceID\""), std::string::npos) << after.dump();
  EXPECT_TRUE(after.contains("snapshotAt"));
}

// The node lock is held only until Allocate knows its pod: it is gone before NVML is touched.
TEST_F(AllocateTest, TheNodeLockIsReleasedBeforeTheInstancesAreCreated) {
  std::vector<std::string> lock_at_nvml;
  StartPlugin([&](DevicePluginOptions& o) {
    o.core.crash_point = [&](std::string_view point) {
      if (point == kCrashAfterIntent) lock_at_nvml.push_back(NodeLock().value_or("<none>"));
      return false;
    };
  });
  CreatePod("p", {{0, 0, 0, "1g.5gb", 0}});
  ASSERT_TRUE(NodeLock().has_value());
  ASSERT_TRUE(Allocate("p", 0, 1).ok());
  EXPECT_EQ(lock_at_nvml, std::vector<std::string>{"<none>"});
  EXPECT_EQ(PodAnnotation("p", protocol::kBindPhaseAnnotation), "success");
}

// A plugin that dies mid-Allocate (after the GI) leaves the node unlocked: the next pod binds and
// is allocated at once; the restart completes the interrupted instance; nothing overlaps or leaks.
TEST_F(AllocateTest, ACrashMidAllocateLeavesNothingThatBlocksTheNode) {
  StartPlugin([&](DevicePluginOptions& o) {
    o.core.crash_point = [](std::string_view point) { return point == kCrashAfterGpuInstance; };
  });
  CreatePod("p", {{0, 0, 0, "3g.20gb", 0}});
  auto a = Allocate("p", 0, 1);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(NodeLock().has_value());
  EXPECT_EQ(plugin_->core().OpenIntents().size(), 1u);
  StopPlugin();  // the crash

  StartPlugin();
  // The interrupted allocation was completed for its pod (still active, same reservation).
  EXPECT_TRUE(plugin_->core().OpenIntents().empty());
  ASSERT_EQ(plugin_->core().Managed().size(), 1u);
  EXPECT_EQ(plugin_->core().Managed()[0].owner.name, "p");
  ASSERT_TRUE(Allocations("p")[0].runtime.has_value());
  // The next pod was never blocked by a lock.
  CreatePod("q", {{0, 0, 0, "3g.20gb", 4}});
  auto b = Allocate("q", 0, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(TotalGis(), 2u);
  EXPECT_FALSE(NodeLock().has_value());
  // No overlap: the two GIs are the two reservations.
  EXPECT_EQ(GiAt(0, 0)->placement, (mig::Placement{0, 4}));
  EXPECT_EQ(GiAt(0, 4)->placement, (mig::Placement{4, 4}));
}

// Moves the first container of the pod spec to initContainers.
void FirstContainerIsInit(kube::Object& pod) {
  auto& containers = pod["spec"]["containers"];
  pod["spec"]["initContainers"] = kube::Object::array({containers[0]});
  containers.erase(containers.begin());
}

TEST_F(AllocateTest, AnAppContainerSharesItsInitContainersInstanceWithTheSameReservation) {
  StartPlugin();
  CreatePod("p", {{0, 0, 0, "1g.5gb", 0}, {1, 0, 0, "1g.5gb", 0}, {2, 0, 0, "2g.10gb", 2}}, 3, true,
            FirstContainerIsInit);
  for (int c = 0; c < 3; ++c) {
    auto a = Allocate("p", c, 1);
    ASSERT_TRUE(a.ok()) << "container " << c << ": " << a.status();
  }
  EXPECT_EQ(TotalGis(), 2u);
  auto allocations = Allocations("p");
  ASSERT_EQ(allocations.size(), 3u);
  ASSERT_TRUE(allocations[0].runtime.has_value());
  EXPECT_EQ(allocations[0].runtime, allocations[1].runtime);
  EXPECT_NE(allocations[2].runtime->mig_uuid, allocations[0].runtime->mig_uuid);
  EXPECT_EQ(PodAnnotation("p", protocol::kBindPhaseAnnotation), "success");
  // Reclaimed once, with the pod.
  DeletePod("p");
  EXPECT_EQ(plugin_->core().Reconcile().destroyed, 2);
  EXPECT_EQ(TotalGis(), 0u);
}

TEST_F(AllocateTest, InitAndAppContainersMayNotReserveOverlappingSlicesWithOtherProfiles) {
  StartPlugin();
  CreatePod("p", {{0, 0, 0, "1g.5gb", 0}, {1, 0, 0, "2g.10gb", 0}}, 2, true, FirstContainerIsInit);
  ASSERT_TRUE(Allocate("p", 0, 1).ok());
  auto a = Allocate("p", 1, 1);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("containers of one pod may share an instance only"),
            std::string::npos)
      << a.status();
  EXPECT_EQ(TotalGis(), 1u);
}

TEST_F(AllocateTest, AnOccupiedPlacementIsRefusedAndNothingOverlappingIsCreated) {
  StartPlugin();
  CreatePod("a", {{0, 0, 0, "2g.10gb", 0}});
  ASSERT_TRUE(Allocate("a", 0, 1).ok());
  SetPhase("a", "Running");
  // A scheduler bug: a 1g inside the running 2g.
  CreatePod("b", {{0, 0, 0, "1g.5gb", 1}});
  auto b = Allocate("b", 0, 1);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(b.status().message().find("overlaps GI"), std::string::npos) << b.status();
  EXPECT_EQ(PodAnnotation("b", protocol::kBindPhaseAnnotation), "failed");
  EXPECT_FALSE(NodeLock().has_value());
  EXPECT_EQ(TotalGis(), 1u);
  EXPECT_EQ(
      plugin_->metrics().Value("dynmig_deviceplugin_refusals_total", "reason", "placement_busy"),
      1);
}

TEST_F(AllocateTest, AnIllegalPlacementIsRefusedNamingTheLegalOnes) {
  StartPlugin();
  CreatePod("a", {{0, 0, 0, "2g.10gb", 1}});
  auto a = Allocate("a", 0, 1);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("legal starts: 0,2,4"), std::string::npos) << a.status();
  EXPECT_EQ(TotalGis(), 0u);
}

TEST_F(AllocateTest, LegacyPodsAreRefusedWithTheMigrationProcedure) {
  StartPlugin();
  const std::string legacy = GpuUuid(0) + "[1-2]";
  CreatePod("old", {{0, 0, 0, "1g.5gb", 0}}, 1, true, [&](kube::Object& pod) {
    const std::string devices = legacy + ",NVIDIA A100-SXM4-40GB,4864,15:;";
    auto& ann = pod["metadata"]["annotations"];
    ann[std::string(protocol::kDevicesToAllocateAnnotation)] = devices;
    ann[std::string(protocol::kDevicesAllocatedAnnotation)] = devices;
    ann.erase(std::string(protocol::kMigAllocationsAnnotation));
  });
  auto a = Allocate("old", 0, 1);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(a.status().message());
  EXPECT_NE(message.find("legacy MIG device identity"), std::string::npos) << message;
  EXPECT_NE(message.find(legacy), std::string::npos) << message;
  EXPECT_NE(message.find("cordon"), std::string::npos) << message;
  EXPECT_NE(message.find("drain"), std::string::npos) << message;
  EXPECT_NE(message.find("dynmig config migrate"), std::string::npos) << message;
  EXPECT_EQ(PodAnnotation("old", protocol::kBindPhaseAnnotation), "failed");
  EXPECT_FALSE(NodeLock().has_value());
  EXPECT_TRUE(HasEvent(kReasonRefused, "legacy"));
  EXPECT_EQ(plugin_->metrics().Value("dynmig_deviceplugin_refusals_total", "reason", "legacy"), 1);
  EXPECT_EQ(TotalGis(), 0u);
}

TEST_F(AllocateTest, WithoutAPendingPodAllocateFailsAndCreatesNothing) {
  StartPlugin();
  auto a = kubelet_->AllocateCount("default/ghost", "c0", 1);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(a.status().message().find("no pod on node node-a"), std::string::npos);
  EXPECT_EQ(TotalGis(), 0u);
}

// bind-phase alone is never trusted: without the node lock no allocating pod is taken, and each
// is told why in an Event.
TEST_F(AllocateTest, WithoutTheNodeLockNoAllocatingPodIsTakenAndEachIsTold) {
  StartPlugin();
  CreatePod("first", {{0, 0, 0, "1g.5gb", 0}}, 1, /*lock=*/false);
  CreatePod("second", {{0, 0, 1, "1g.5gb", 0}}, 1, /*lock=*/false);
  auto a = Allocate("first", 0, 1);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(a.status().message().find("default/first: the node lock (hami.io/mutex.lock) is not "
                                      "held"),
            std::string::npos)
      << a.status();
  EXPECT_EQ(TotalGis(), 0u);
  EXPECT_EQ(PodAnnotation("first", protocol::kBindPhaseAnnotation), "allocating");
  EXPECT_EQ(PodAnnotation("second", protocol::kBindPhaseAnnotation), "allocating");
  plugin_->events().Flush(absl::Seconds(5));
  EXPECT_TRUE(
      HasEvent(kReasonBindMismatch, "pod default/first says hami.io/bind-phase=allocating"));
  EXPECT_TRUE(HasEvent(kReasonBindMismatch, "pod default/second"));
}

// A pod whose bind-phase says allocating (set by hand, older bind time) cannot take the Allocate of
// the pod the node lock names; it is reported.
TEST_F(AllocateTest, AnAllocatingPodTheLockDoesNotNameIsReportedNotServed) {
  StartPlugin();
  CreatePod("intruder", {{0, 0, 0, "1g.5gb", 0}}, 1, /*lock=*/false);
  CreatePod("victim", {{0, 0, 1, "1g.5gb", 0}});  // holds the lock
  auto a = Allocate("victim", 0, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(PodAnnotation("victim", protocol::kBindPhaseAnnotation), "success");
  EXPECT_EQ(PodAnnotation("intruder", protocol::kBindPhaseAnnotation), "allocating");
  EXPECT_TRUE(GiAt(1, 0).has_value());
  EXPECT_FALSE(GiAt(0, 0).has_value());
  plugin_->events().Flush(absl::Seconds(5));
  EXPECT_TRUE(HasEvent(kReasonBindMismatch,
                       "pod default/intruder says hami.io/bind-phase=allocating on node node-a, "
                       "but the node lock (hami.io/mutex.lock) names default/victim"));
  // The lock owner without a reservation is not taken either.
  CreatePod("bare", {{0, 0, 1, "1g.5gb", 1}});
  SetAnnotation("bare", protocol::kMigAllocationsAnnotation, std::nullopt);
  auto b = Allocate("bare", 0, 1);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("the node lock names it, but it has no reservation"),
            std::string::npos)
      << b.status();
  EXPECT_FALSE(GiAt(1, 1).has_value());
}

TEST_F(AllocateTest, PreferredAllocationPicksReplicasOfTheReservedGpu) {
  StartPlugin();
  CreatePod("p", {{0, 0, 1, "1g.5gb", 0}, {0, 1, 1, "1g.5gb", 1}});
  auto free = kubelet_->FreeDevices();
  ASSERT_EQ(free.size(), 14u);
  auto chosen = kubelet_->PreferredAllocation(free, {}, 2);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  ASSERT_EQ(chosen->size(), 2u);
  for (const auto& id : *chosen) EXPECT_EQ(GpuOfReplicaId(id), GpuUuid(1)) << id;
  EXPECT_NE((*chosen)[0], (*chosen)[1]);
  // Must-include ids come first and count.
  auto with_must = kubelet_->PreferredAllocation(free, {free.front()}, 2);
  ASSERT_TRUE(with_must.ok());
  EXPECT_EQ(with_must->front(), free.front());
  EXPECT_EQ(with_must->size(), 2u);
  // Devices no Allocate was served for do not start a container.
  auto prestart = kubelet_->PreStartContainer(*chosen);
  EXPECT_EQ(prestart.code(), absl::StatusCode::kFailedPrecondition) << prestart;
  EXPECT_NE(prestart.message().find("not served by this device plugin"), std::string::npos)
      << prestart;
}

TEST_F(AllocateTest, ARetriedAllocateReusesTheInstanceItAlreadyCreated) {
  int crashes = 0;
  StartPlugin([&](DevicePluginOptions& o) {
    o.core.crash_point = [&](std::string_view point) {
      return point == kCrashAfterComputeInstance && crashes++ == 0;
    };
  });
  CreatePod("p", {{0, 0, 0, "1g.5gb", 3}});
  auto first = Allocate("p", 0, 1);
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), absl::StatusCode::kAborted);
  auto gi = GiAt(0, 3);
  ASSERT_TRUE(gi.has_value());
  ASSERT_EQ(plugin_->core().OpenIntents().size(), 1u);

  auto second = Allocate("p", 0, 1);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(TotalGis(), 1u);
  EXPECT_EQ(GiAt(0, 3)->id, gi->id);
  const std::string uuid = second->response.envs().at("NVIDIA_VISIBLE_DEVICES");
  EXPECT_EQ(Allocations("p")[0].runtime->mig_uuid, uuid);
  EXPECT_TRUE(plugin_->core().OpenIntents().empty());
  EXPECT_EQ(PodAnnotation("p", protocol::kBindPhaseAnnotation), "success");
}

// `--sim` on a real kubelet: simulated devices have no device node on the host, and containerd
// fails a container whose DeviceSpec names a missing host path. The MIG UUID still reaches the
// container's environment.
TEST_F(AllocateTest, SimulatedDevicesGiveTheContainerTheirMigUuidsAndNoDeviceNode) {
  plugin_device_nodes_ = false;
  StartPlugin();
  CreatePod("p", {{0, 0, 0, "1g.5gb", 6}, {0, 1, 1, "2g.10gb", 0}});
  auto a = Allocate("p", 0, 2);
  ASSERT_TRUE(a.ok()) << a.status();
  const auto allocations = Allocations("p");
  ASSERT_EQ(allocations.size(), 2u);
  ASSERT_TRUE(allocations[0].runtime.has_value() && allocations[1].runtime.has_value());
  EXPECT_EQ(a->response.envs().at("NVIDIA_VISIBLE_DEVICES"),
            allocations[0].runtime->mig_uuid + "," + allocations[1].runtime->mig_uuid);
  EXPECT_TRUE(a->response.devices().empty()) << a->response.DebugString();
  EXPECT_TRUE(a->response.mounts().empty());
  EXPECT_TRUE(a->response.cdi_devices().empty());
  EXPECT_EQ(TotalGis(), 2u);
  EXPECT_EQ(PodAnnotation("p", protocol::kBindPhaseAnnotation), "success");
}

TEST_F(AllocateTest, SimulatedDevicesGetACdiSpecWithTheEnvironmentOnly) {
  plugin_device_nodes_ = false;
  const std::string cdi = dir_.path() + "/cdi";
  StartPlugin([&](DevicePluginOptions& o) { o.core.cdi_dir = cdi; });
  CreatePod("p", {{0, 0, 0, "1g.5gb", 0}});
  auto a = Allocate("p", 0, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string uuid = Allocations("p")[0].runtime->mig_uuid;
  ASSERT_EQ(a->response.cdi_devices_size(), 1);
  std::ifstream in(cdi + "/dynmig.io-mig_" + uuid + ".json");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  auto spec = nlohmann::json::parse(text.str());
  const auto& edits = spec["devices"][0]["containerEdits"];
  EXPECT_EQ(edits["env"][0], "NVIDIA_VISIBLE_DEVICES=" + uuid);
  EXPECT_FALSE(edits.contains("deviceNodes")) << text.str();
}

TEST_F(AllocateTest, CdiSpecIsWrittenPerMigDeviceAndRemovedWithTheInstance) {
  const std::string cdi = dir_.path() + "/cdi";
  StartPlugin([&](DevicePluginOptions& o) { o.core.cdi_dir = cdi; });
  CreatePod("p", {{0, 0, 0, "1g.5gb", 0}});
  auto a = Allocate("p", 0, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string uuid = Allocations("p")[0].runtime->mig_uuid;
  ASSERT_EQ(a->response.cdi_devices_size(), 1);
  EXPECT_EQ(a->response.cdi_devices(0).name(), "dynmig.io/mig=" + uuid);
  EXPECT_TRUE(a->response.envs().empty());
  EXPECT_TRUE(a->response.devices().empty());

  const std::string path = cdi + "/dynmig.io-mig_" + uuid + ".json";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path;
  std::stringstream text;
  text << in.rdbuf();
  auto spec = nlohmann::json::parse(text.str());
  EXPECT_EQ(spec["kind"], "dynmig.io/mig");
  EXPECT_EQ(spec["devices"][0]["name"], uuid);
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["env"][0], "NVIDIA_VISIBLE_DEVICES=" + uuid);
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["deviceNodes"].size(), 6u);
  // No temporary file left behind.
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(cdi)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);

  DeletePod("p");
  EXPECT_EQ(plugin_->core().Reconcile().destroyed, 1);
  EXPECT_FALSE(std::filesystem::exists(path));
}

// The local addresses (hex "AABBCCDD:PORT" of /proc/net/tcp, little-endian IPv4) this process
// listens on at `port`.
std::vector<std::string> ListeningAddresses(int port) {
  std::vector<std::string> out;
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  std::getline(tcp, line);  // header
  while (std::getline(tcp, line)) {
    std::istringstream in(line);
    std::string slot, local, remote, state;
    in >> slot >> local >> remote >> state;
    const size_t colon = local.find(':');
    if (state != "0A" || colon == std::string::npos) continue;  // 0A: LISTEN
    if (std::stoi(local.substr(colon + 1), nullptr, 16) == port) out.push_back(local);
  }
  return out;
}

// /nvml names the pods that own instances (issue 27): on a listener of its own on loopback, never
// on a /metrics listener that is open to the network.
TEST_F(AllocateTest, TheNvmlViewListensOnLoopbackOnly) {
  using O = DevicePluginOptions;
  auto serves = [](std::string metrics, std::string nvml) {
    O o;
    o.metrics_listen = std::move(metrics);
    o.nvml_listen = std::move(nvml);
    return DevicePlugin::MetricsListenerServesNvml(o);
  };
  EXPECT_TRUE(serves("127.0.0.1:0", ""));  // tests, local mode: one loopback listener
  EXPECT_TRUE(serves("127.0.0.10:9400", ""));
  EXPECT_FALSE(serves("0.0.0.0:9400", ""));
  EXPECT_FALSE(serves(":9400", ""));
  EXPECT_FALSE(serves("0.0.0.0:9400", "127.0.0.1:9401"));
  EXPECT_FALSE(serves("127.0.0.1:9400", "127.0.0.1:9401"));
  EXPECT_TRUE(serves("0.0.0.0:9400", "0.0.0.0:9400"));  // asked for explicitly

  StartPlugin([](DevicePluginOptions& o) {
    o.metrics_listen = "0.0.0.0:0";
    o.nvml_listen = "127.0.0.1:0";
  });
  ASSERT_GT(plugin_->http_port(), 0);
  ASSERT_GT(plugin_->nvml_port(), 0);
  ASSERT_NE(plugin_->nvml_port(), plugin_->http_port());
  // Bound to 127.0.0.1 ("0100007F"), not to every interface.
  EXPECT_EQ(ListeningAddresses(plugin_->nvml_port()),
            std::vector<std::string>{fmt::format("0100007F:{:04X}", plugin_->nvml_port())});
  EXPECT_EQ(ListeningAddresses(plugin_->http_port()),
            std::vector<std::string>{fmt::format("00000000:{:04X}", plugin_->http_port())});
  httplib::Client open("127.0.0.1", plugin_->http_port());
  auto metrics = open.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  auto refused = open.Get("/nvml");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 404);
  httplib::Client loopback("127.0.0.1", plugin_->nvml_port());
  auto view = loopback.Get("/nvml");
  ASSERT_TRUE(view);
  EXPECT_EQ(view->status, 200);
  EXPECT_EQ(nlohmann::json::parse(view->body)["node"], kNode);
  EXPECT_EQ(loopback.Get("/metrics")->status, 404);
}

TEST_F(AllocateTest, MetricsAndTheNvmlViewAreServedOverHttp) {
  StartPlugin();
  CreatePod("p", {{0, 0, 0, "2g.10gb", 2}});
  ASSERT_TRUE(Allocate("p", 0, 1).ok());
  httplib::Client client("127.0.0.1", plugin_->http_port());
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->body.find("dynmig_deviceplugin_allocations_total{result=\"success\"} 1"),
            std::string::npos)
      << metrics->body;
  EXPECT_NE(metrics->body.find("dynmig_deviceplugin_managed_instances 1"), std::string::npos);
  auto view = client.Get("/nvml");
  ASSERT_TRUE(view);
  EXPECT_EQ(view->status, 200);
  auto json = nlohmann::json::parse(view->body);
  EXPECT_EQ(json["node"], kNode);
  ASSERT_EQ(json["gpus"].size(), 2u);
  const auto& gpu0 = json["gpus"][0];
  EXPECT_EQ(gpu0["uuid"], GpuUuid(0));
  EXPECT_EQ(gpu0["exposed"], true);
  ASSERT_EQ(gpu0["instances"].size(), 1u);
  EXPECT_EQ(gpu0["instances"][0]["profile"], "2g.10gb");
  EXPECT_EQ(gpu0["instances"][0]["placement"]["start"], 2);
  EXPECT_EQ(gpu0["instances"][0]["managed"], true);
  EXPECT_EQ(gpu0["instances"][0]["owner"]["name"], "p");
  EXPECT_EQ(gpu0["allowedProfiles"].size(), 5u);
  auto health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

}  // namespace
}  // namespace dynmig::deviceplugin::testing
