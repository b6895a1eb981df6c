// Allocate's validation step (allocate_plan.h) on plain values: no NVML, no API server.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "deviceplugin/allocate_plan.h"

namespace dynmig::deviceplugin {
namespace {

using ::testing::HasSubstr;

constexpr char kGpu[] = "GPU-aaaa";
constexpr char kOtherGpu[] = "GPU-bbbb";

mig::ProfileSpec Profile(std::string name, uint32_t id, uint32_t size,
                         std::vector<uint32_t> starts) {
  mig::ProfileSpec p;
  p.name = std::move(name);
  p.nvml_id = id;
  p.memory_slices = size;
  for (uint32_t s : starts) p.placements.push_back({s, size});
  return p;
}

GpuEntry Gpu(std::string uuid) {
  GpuEntry g;
  g.info.uuid = std::move(uuid);
  g.info.name = "NVIDIA A100-SXM4-40GB";
  g.allowlisted = g.exposed = g.healthy = true;
  g.capability.profiles = {Profile("1g.5gb", 19, 1, {0, 1, 2, 3, 4, 5, 6}),
                           Profile("3g.20gb", 9, 4, {0, 4}), Profile("7g.40gb", 0, 8, {0})};
  g.allowed = {g.capability.profiles[0], g.capability.profiles[1]};  // 7g.40gb is not allowed
  g.replicas = 7;
  return g;
}

protocol::MigAllocation Reservation(int container, int device, std::string gpu, std::string profile,
                                    uint32_t start, uint32_t size) {
  protocol::MigAllocation a;
  a.container_index = container;
  a.device_index = device;
  a.gpu_uuid = std::move(gpu);
  a.profile = std::move(profile);
  a.placement = {start, size};
  return a;
}

// A pod whose containers list one device per reservation, at its device index.
PodMig Pod(std::vector<protocol::MigAllocation> reservations, int containers = 1, int init = 0) {
  PodMig p;
  p.uid = "uid-1";
  p.ns = "default";
  p.name = "p";
  p.key = "default/p";
  p.active = true;
  p.init_containers = init;
  protocol::PodDevices devices(containers);
  for (const auto& a : reservations) {
    auto& list = devices[a.container_index];
    if (list.size() <= static_cast<size_t>(a.device_index)) list.resize(a.device_index + 1);
    list[a.device_index] = {a.gpu_uuid, "NVIDIA"};
  }
  p.has_to_allocate = true;
  p.to_allocate = devices;
  p.has_allocations = true;
  p.allocations = std::move(reservations);
  return p;
}

ManagedInstance Instance(std::string pod_uid, int container, int device, std::string profile,
                         uint32_t start, uint32_t size, bool idle = false) {
  ManagedInstance m;
  m.gpu_uuid = kGpu;
  m.profile = std::move(profile);
  m.placement = {start, size};
  m.gpu_instance_id = 7;
  m.mig_uuid = "MIG-1";
  m.owner = {std::move(pod_uid), "default", "q", container, device};
  m.idle = idle;
  return m;
}

class PlanTest : public ::testing::Test {
 protected:
  PlanResult Validate(const PodMig& pod, int container, size_t device_count) {
    return ValidateAllocation(pod, container, device_count,
                              NodeView{"node-a", inventory_, instances_, quarantine_});
  }

  Inventory inventory_{{Gpu(kGpu), Gpu(kOtherGpu)}};
  std::vector<ManagedInstance> instances_;
  std::vector<QuarantinedSlices> quarantine_;
};

TEST_F(PlanTest, AValidReservationBecomesAPlanWithTheGpuAndProfileResolved) {
  const PodMig pod =
      Pod({Reservation(0, 1, kGpu, "1g.5gb", 6, 1), Reservation(0, 0, kOtherGpu, "3g.20gb", 4, 4)});
  // Reservations in any order: the plan follows the device indices.
  PlanResult r = Validate(pod, 0, 2);
  ASSERT_TRUE(r.ok()) << r.status;
  EXPECT_EQ(r.reason, "");
  EXPECT_EQ(r.plan.container, 0);
  ASSERT_EQ(r.plan.devices.size(), 2u);
  // Sorted by device index.
  EXPECT_EQ(r.plan.devices[0].allocation.device_index, 0);
  EXPECT_EQ(r.plan.devices[0].gpu->info.uuid, kOtherGpu);
  EXPECT_EQ(r.plan.devices[0].profile->nvml_id, 9u);
  EXPECT_EQ(r.plan.devices[1].profile->name, "1g.5gb");
  EXPECT_FALSE(r.plan.devices[0].reuse.has_value());
  EXPECT_TRUE(r.plan.intents.empty());
}

TEST_F(PlanTest, EachRefusalNamesWhatIsWrong) {
  struct Case {
    std::string name;
    PodMig pod;
    size_t device_count;
    std::string reason;
    std::string message;
  };
  PodMig legacy = Pod({Reservation(0, 0, kGpu, "1g.5gb", 0, 1)});
  (*legacy.to_allocate)[0][0].uuid = "GPU-aaaa[1-2]";
  PodMig undecodable = Pod({Reservation(0, 0, kGpu, "1g.5gb", 0, 1)});
  undecodable.allocations = absl::InvalidArgumentError("entry 0: gpuUUID missing");
  PodMig missing = Pod({Reservation(0, 0, kGpu, "1g.5gb", 0, 1)});
  (*missing.to_allocate)[0].push_back({kGpu, "NVIDIA"});
  PodMig other_gpu = Pod({Reservation(0, 0, kGpu, "1g.5gb", 0, 1)});
  (*other_gpu.to_allocate)[0][0].uuid = kOtherGpu;
  const std::vector<Case> cases = {
      {"legacy", legacy, 1, "legacy", "legacy MIG device identity"},
      {"count", Pod({Reservation(0, 0, kGpu, "1g.5gb", 0, 1)}), 2, "device_count",
       "the kubelet asks for 2 device(s)"},
      {"undecodable", undecodable, 1, "bad_reservation", "gpuUUID missing"},
      {"fewer reservations", missing, 2, "reservation_mismatch", "has 1 reservation(s)"},
      {"other gpu", other_gpu, 1, "reservation_mismatch", "device 0 is GPU GPU-bbbb"},
      {"unknown gpu", Pod({Reservation(0, 0, "GPU-cccc", "1g.5gb", 0, 1)}), 1, "unknown_gpu",
       "not exposed on node node-a"},
      {"not allowlisted", Pod({Reservation(0, 0, kGpu, "7g.40gb", 0, 8)}), 1, "profile_not_allowed",
       "profile 7g.40gb is not an allowlisted profile"},
      {"illegal placement", Pod({Reservation(0, 0, kGpu, "3g.20gb", 2, 4)}), 1, "illegal_placement",
       "legal starts: 0,4"},
      {"overlap within the container",
       Pod({Reservation(0, 0, kGpu, "3g.20gb", 0, 4), Reservation(0, 1, kGpu, "1g.5gb", 3, 1)}), 2,
       "overlapping_reservation", "overlaps device 0 of the same container"},
  };
  for (const auto& c : cases) {
    PlanResult r = Validate(c.pod, 0, c.device_count);
    EXPECT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.reason, c.reason) << c.name;
    EXPECT_THAT(std::string(r.status.message()), HasSubstr(c.message)) << c.name;
    EXPECT_TRUE(r.plan.devices.empty()) << c.name;
  }
}

TEST_F(PlanTest, AnUnhealthyGpuIsUnavailable) {
  inventory_.gpus[0].healthy = false;
  inventory_.gpus[0].unhealthy_reason = "XID 79";
  PlanResult r = Validate(Pod({Reservation(0, 0, kGpu, "1g.5gb", 0, 1)}), 0, 1);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(r.reason, "gpu_unhealthy");
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("XID 79"));
}

TEST_F(PlanTest, AContainerThatIsNotLeftIsRefused) {
  PlanResult r = Validate(Pod({Reservation(0, 0, kGpu, "1g.5gb", 0, 1)}), 3, 1);
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("no container 3"));
  EXPECT_FALSE(Validate(Pod({Reservation(0, 0, kGpu, "1g.5gb", 0, 1)}), -1, 1).ok());
}

TEST_F(PlanTest, QuarantinedSlicesOfAnotherPodRefuseAndThePodsOwnDoNot) {
  quarantine_.push_back({kGpu, {0, 4}, "default/other", "cannot be verified"});
  PlanResult r = Validate(Pod({Reservation(0, 0, kGpu, "1g.5gb", 2, 1)}), 0, 1);
  EXPECT_EQ(r.reason, "quarantined");
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("kept out of use for pod default/other"));
  quarantine_[0].pod = "default/p";
  EXPECT_TRUE(Validate(Pod({Reservation(0, 0, kGpu, "1g.5gb", 2, 1)}), 0, 1).ok());
}

TEST_F(PlanTest, AnotherPodsInstanceMakesThePlacementBusy) {
  instances_.push_back(Instance("uid-2", 0, 0, "3g.20gb", 4, 4));
  PlanResult r = Validate(Pod({Reservation(0, 0, kGpu, "1g.5gb", 5, 1)}), 0, 1);
  EXPECT_EQ(r.reason, "placement_busy");
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("of pod default/q, not reclaimed yet"));
  // Not overlapping: fine.
  EXPECT_TRUE(Validate(Pod({Reservation(0, 0, kGpu, "1g.5gb", 3, 1)}), 0, 1).ok());
}

TEST_F(PlanTest, TheDevicesOwnInstanceIsReusedAndAnExactIdleOneIsTakenOver) {
  instances_.push_back(Instance("uid-1", 0, 0, "1g.5gb", 6, 1));
  PlanResult own = Validate(Pod({Reservation(0, 0, kGpu, "1g.5gb", 6, 1)}), 0, 1);
  ASSERT_TRUE(own.ok()) << own.status;
  ASSERT_TRUE(own.plan.devices[0].reuse.has_value());
  EXPECT_FALSE(own.plan.devices[0].from_idle);

  instances_ = {Instance("uid-9", 0, 0, "1g.5gb", 6, 1, /*idle=*/true)};
  PlanResult idle = Validate(Pod({Reservation(0, 0, kGpu, "1g.5gb", 6, 1)}), 0, 1);
  ASSERT_TRUE(idle.ok()) << idle.status;
  EXPECT_TRUE(idle.plan.devices[0].from_idle);
  EXPECT_EQ(idle.plan.devices[0].reuse->mig_uuid, "MIG-1");

  // An idle instance that overlaps but differs is still in the way.
  PlanResult overlap = Validate(Pod({Reservation(0, 0, kGpu, "3g.20gb", 4, 4)}), 0, 1);
  EXPECT_EQ(overlap.reason, "placement_busy");
  EXPECT_THAT(std::string(overlap.status.message()), HasSubstr("overlaps idle MIG device MIG-1"));
}

TEST_F(PlanTest, AnAppContainerSharesAnInitContainersInstanceOnlyAtTheSameProfileAndPlacement) {
  // Container 0 is the init container, container 1 the app container.
  instances_.push_back(Instance("uid-1", 0, 0, "1g.5gb", 6, 1));
  PodMig pod = Pod({Reservation(1, 0, kGpu, "1g.5gb", 6, 1)}, /*containers=*/2, /*init=*/1);
  PlanResult shared = Validate(pod, 1, 1);
  ASSERT_TRUE(shared.ok()) << shared.status;
  EXPECT_TRUE(shared.plan.devices[0].reuse.has_value());

  // Without the init container, container 0 is an app container: no sharing.
  pod.init_containers = 0;
  PlanResult refused = Validate(pod, 1, 1);
  EXPECT_EQ(refused.reason, "placement_busy");
  EXPECT_THAT(std::string(refused.status.message()), HasSubstr("container 0 of the same pod"));

  // Another profile at overlapping slices: refused even after an init container.
  PodMig other = Pod({Reservation(1, 0, kGpu, "3g.20gb", 4, 4)}, 2, 1);
  EXPECT_EQ(Validate(other, 1, 1).reason, "placement_busy");
}

}  // namespace
}  // namespace dynmig::deviceplugin
