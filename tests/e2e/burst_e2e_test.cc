// A burst on one node with a kubelet that takes its time (0.7 s from bind to Allocate, as the real
// kubelet on the 2-core harness): every GPU pod's bind needs the node lock until its Allocate, so
// the binds queue for it one after another (lock_queue.h) for longer than the old 10 s poll-wait
// allowed; none bounces (no FailedScheduling), and every pod runs on its own instance.
#include <set>

#include "e2e/e2e_test_util.h"

namespace dynmig::e2e {
namespace {

TEST_F(E2eTest, ABurstQueuesForTheNodeLockAndNoBindBounces) {
  Scenario("burst behind the node lock");
  kubelet_admission_delay_ = absl::Milliseconds(700);
  StartCluster("node-a=A100-SXM4-40GBx8");
  constexpr int kPods = 16;  // 16 x 0.7 s of lock holding: over 11 s for the last bind
  Step("create the burst");
  for (int i = 0; i < kPods; ++i) Create(MigPod("burst-" + std::to_string(i), 4000));
  Step("all run");
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (int i = 0; i < kPods; ++i)
          if (Phase("burst-" + std::to_string(i)) != "Running") return false;
        return true;
      },
      absl::Seconds(90)))
      << Where();
  Step("no bind bounced off the lock; each pod has its own instance");
  std::set<std::string> uuids;
  std::set<std::pair<std::string, uint32_t>> starts;
  for (int i = 0; i < kPods; ++i) {
    const std::string name = "burst-" + std::to_string(i);
    for (const auto& w : Warnings(name)) ADD_FAILURE() << Where() << name << ": " << w;
    const auto allocs = Allocations(Get(name));
    ASSERT_EQ(allocs.size(), 1u) << Where() << name;
    ExpectRealized(name, allocs[0]);
    if (allocs[0].runtime.has_value()) uuids.insert(allocs[0].runtime->mig_uuid);
    starts.insert({allocs[0].gpu_uuid, allocs[0].placement.start});
  }
  EXPECT_EQ(uuids.size(), static_cast<size_t>(kPods)) << Where();
  EXPECT_EQ(starts.size(), static_cast<size_t>(kPods)) << Where();
  EXPECT_EQ(Live().size(), static_cast<size_t>(kPods)) << Where();
}

}  // namespace
}  // namespace dynmig::e2e
