// dynmig::Mutex, CondVar and the scoped locks (src/common/mutex.h), against the implementation this
// build chose: absl::Mutex in ordinary builds, the pthread-backed one under ThreadSanitizer.
#include "common/mutex.h"

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace dynmig {
namespace {

TEST(MutexTest, AwaitReturnsOnceAnotherThreadMakesTheConditionTrue) {
  Mutex mu;
  bool ready = false;
  std::atomic<bool> woke{false};
  std::thread waiter([&] {
    MutexLock lock(&mu);
    mu.Await(Condition(&ready));
    woke = true;
  });
  absl::SleepFor(absl::Milliseconds(20));  // the waiter is (most likely) parked in Await
  EXPECT_FALSE(woke.load());
  {
    MutexLock lock(&mu);
    ready = true;
  }
  waiter.join();
  EXPECT_TRUE(woke.load());
}

TEST(MutexTest, AwaitWithTimeoutReportsTheConditionsLastValue) {
  Mutex mu;
  int n = 0;
  auto positive = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return n > 0; };
  MutexLock lock(&mu);
  EXPECT_FALSE(mu.AwaitWithTimeout(Condition(&positive), absl::Milliseconds(10)));
  n = 1;
  EXPECT_TRUE(mu.AwaitWithTimeout(Condition(&positive), absl::Milliseconds(10)));
}

TEST(MutexTest, CondVarTimesOutAndIsSignalled) {
  Mutex mu;
  CondVar cv;
  {
    MutexLock lock(&mu);
    EXPECT_TRUE(cv.WaitWithTimeout(&mu, absl::Milliseconds(5)));  // true: timed out
  }
  bool done = false;
  std::thread signaller([&] {
    absl::SleepFor(absl::Milliseconds(10));
    MutexLock lock(&mu);
    done = true;
    cv.SignalAll();
  });
  {
    MutexLock lock(&mu);
    while (!done) cv.Wait(&mu);
  }
  signaller.join();
  EXPECT_TRUE(done);
}

TEST(MutexTest, ReadersShareAndExcludeAWriter) {
  Mutex mu;
  ReaderMutexLock first(&mu);
  std::thread second([&] {
    ReaderMutexLock again(&mu);  // a second reader does not wait for the first
  });
  second.join();
  std::atomic<bool> locked{true};
  std::thread writer([&] {
    locked = mu.TryLock();
    if (locked) mu.Unlock();
  });
  writer.join();
  EXPECT_FALSE(locked.load()) << "a writer got the lock while a reader held it";
}

TEST(MutexTest, ReleasableLockReleasesEarly) {
  Mutex mu;
  ReleasableMutexLock lock(&mu);
  lock.Release();
  ASSERT_TRUE(mu.TryLock());
  mu.Unlock();
}

}  // namespace
}  // namespace dynmig
