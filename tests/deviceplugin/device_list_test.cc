// The device list ListAndWatch waits on (device_list.h), on a simulated clock.
#include "deviceplugin/device_list.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace dynmig::deviceplugin {
namespace {

v1beta1::Device Device(const std::string& id, const std::string& health) {
  v1beta1::Device d;
  d.set_id(id);
  d.set_health(health);
  return d;
}

TEST(DeviceListTest, ANewGenerationOnlyWhenAnIdOrAHealthChanged) {
  FakeClock clock;
  DeviceList list(clock);
  uint64_t generation = 0;
  list.Set({Device("GPU-a::0", "Healthy")});
  list.Get(&generation);
  EXPECT_EQ(generation, 1u);
  list.Set({Device("GPU-a::0", "Healthy")});
  list.Get(&generation);
  EXPECT_EQ(generation, 1u);
  list.Set({Device("GPU-a::0", "Unhealthy")});
  auto devices = list.Get(&generation);
  EXPECT_EQ(generation, 2u);
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].health(), "Unhealthy");
}

TEST(DeviceListTest, AWaitEndsWhenItsTimeoutPassesOnTheClock) {
  FakeClock clock;
  DeviceList list(clock);
  list.Set({Device("GPU-a::0", "Healthy")});
  std::atomic<bool> returned{false};
  std::thread watcher([&] {
    EXPECT_EQ(list.WaitForChange(1, absl::Seconds(5)), 1u);
    returned = true;
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  clock.Advance(absl::Seconds(4));
  EXPECT_FALSE(returned);  // the simulated timeout has not passed
  clock.Advance(absl::Seconds(1));
  watcher.join();
  EXPECT_TRUE(returned);
}

TEST(DeviceListTest, AWaitEndsOnAChangeAndOnClose) {
  FakeClock clock;
  DeviceList list(clock);
  list.Set({Device("GPU-a::0", "Healthy")});
  std::thread changed([&] { EXPECT_EQ(list.WaitForChange(1, absl::Hours(1)), 2u); });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  list.Set({Device("GPU-a::0", "Unhealthy")});
  changed.join();

  std::thread closed([&] { EXPECT_EQ(list.WaitForChange(2, absl::InfiniteDuration()), 2u); });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  list.Close();
  closed.join();
  // Closed: later waits return at once.
  EXPECT_EQ(list.WaitForChange(2, absl::InfiniteDuration()), 2u);
}

}  // namespace
}  // namespace dynmig::deviceplugin
