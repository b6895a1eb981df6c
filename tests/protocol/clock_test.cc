// The time seam: the simulated clock's sleeps and timed waits end when the test moves time, never
// on their own.
#include "common/clock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace dynmig {
namespace {

TEST(FakeClockTest, AdvanceMovesWallAndMonotonicTimeSetMovesWallOnly) {
  FakeClock clock(absl::FromUnixSeconds(100));
  const absl::Duration m0 = clock.Monotonic();
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(105));
  EXPECT_EQ(clock.Monotonic() - m0, absl::Seconds(5));
  clock.Set(absl::FromUnixSeconds(50));  // wall time may go back; monotonic time does not
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(50));
  EXPECT_EQ(clock.Monotonic() - m0, absl::Seconds(5));
}

TEST(FakeClockTest, SleepEndsOnlyWhenSimulatedTimePassesItsDeadline) {
  FakeClock clock;
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    clock.SleepFor(absl::Minutes(10));
    woke = true;
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  clock.Advance(absl::Minutes(9));
  // The sleeper is still registered: it cannot have woken, since its deadline has not passed.
  EXPECT_EQ(clock.Waiters(), 1u);
  EXPECT_FALSE(woke.load());
  EXPECT_TRUE(clock.AdvanceToNextDeadline());
  sleeper.join();
  EXPECT_TRUE(woke.load());
  EXPECT_EQ(clock.Waiters(), 0u);
  EXPECT_FALSE(clock.AdvanceToNextDeadline());
}

TEST(FakeClockTest, TimedWaitTimesOutOnSimulatedTimeAndSeesSignalsBefore) {
  FakeClock clock;
  dynmig::Mutex mu;
  dynmig::CondVar cv;
  bool done = false;
  std::atomic<int> result{-1};
  std::thread waiter([&] {
    dynmig::MutexLock lock(&mu);
    result = clock.WaitFor(cv, mu, absl::Seconds(30),
                           [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done; });
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  clock.Advance(absl::Seconds(29));
  EXPECT_EQ(clock.Waiters(), 1u);
  clock.Advance(absl::Seconds(1));
  waiter.join();
  EXPECT_EQ(result.load(), 0);  // timed out

  std::thread signalled([&] {
    dynmig::MutexLock lock(&mu);
    result = clock.WaitFor(cv, mu, absl::Seconds(30),
                           [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done; });
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  {
    dynmig::MutexLock lock(&mu);
    done = true;
    cv.SignalAll();
  }
  signalled.join();
  EXPECT_EQ(result.load(), 1);  // woken by the condition, no time moved
}

TEST(FakeClockTest, InfiniteWaitEndsOnlyByItsCondition) {
  FakeClock clock;
  dynmig::Mutex mu;
  dynmig::CondVar cv;
  bool done = false;
  std::thread waiter([&] {
    dynmig::MutexLock lock(&mu);
    EXPECT_TRUE(clock.WaitFor(cv, mu, absl::InfiniteDuration(),
                              [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done; }));
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  EXPECT_FALSE(clock.AdvanceToNextDeadline());  // no finite deadline to fire
  clock.Advance(absl::Hours(1000));
  EXPECT_EQ(clock.Waiters(), 1u);
  {
    dynmig::MutexLock lock(&mu);
    done = true;
    cv.Signal();
  }
  waiter.join();
}

TEST(SystemClockTest, ShortTimedWaitReturnsFalseAndMonotonicMovesForward) {
  const Clock& clock = RealClock();
  dynmig::Mutex mu;
  dynmig::CondVar cv;
  const absl::Duration m0 = clock.Monotonic();
  dynmig::MutexLock lock(&mu);
  EXPECT_FALSE(clock.WaitFor(cv, mu, absl::Milliseconds(2), [] { return false; }));
  EXPECT_GE(clock.Monotonic() - m0, absl::Milliseconds(2));
  EXPECT_TRUE(clock.WaitFor(cv, mu, absl::Seconds(5), [] { return true; }));
}

}  // namespace
}  // namespace dynmig
