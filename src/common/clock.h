// The time seam: wall time, monotonic time, sleeps and timed waits, all behind one injected
// interface.
//
// Production code takes a `const Clock&` (the binary's entry point owns one SystemClock) and never
// calls absl::Now(), absl::SleepFor(), std::chrono clocks or a condition variable's timed wait
// itself; the build's `source.clock` check (tools/check_sources.py) fails on a new such call
// outside src/common/clock.*. Tests inject a FakeClock: its time moves only when the test says so,
// and every sleep or timed wait on it wakes when the simulated time passes its deadline, so a test
// of a timeout advances the clock instead of sleeping.
//
// Timed waits on a condition: the caller holds `mu` and passes a predicate that reads state guarded
// by it; annotate the lambda so the thread-safety analysis checks its body:
//   clock_.WaitFor(cv_, mu_, absl::Seconds(5), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return
//   done_; });
#pragma once

#include <chrono>
#include <cstddef>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "common/mutex.h"

namespace dynmig {

// Thread-safe: every method may be called from any thread.
class Clock {
 public:
  virtual ~Clock() = default;

  // Wall time (timestamps written to the API, lease and reservation expiry).
  virtual absl::Time Now() const = 0;
  // Monotonic time since an unspecified origin: never goes back; only differences mean anything
  // (durations, deadlines of waits, rate limits).
  virtual absl::Duration Monotonic() const = 0;
  // Blocks the calling thread for `d` of this clock's time.
  virtual void SleepFor(absl::Duration d) const = 0;

  // With `mu` held: waits on `cv` until `done()` is true or `timeout` of this clock's monotonic
  // time has passed. Returns done() as last evaluated (with mu held). `cv` must be signalled by
  // whoever changes what done() reads. An infinite timeout waits for done() alone.
  bool WaitFor(dynmig::CondVar& cv, dynmig::Mutex& mu, absl::Duration timeout,
               absl::FunctionRef<bool()> done) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // The same with a monotonic deadline (a value of Monotonic(); InfiniteDuration() for none).
  virtual bool WaitUntil(dynmig::CondVar& cv, dynmig::Mutex& mu, absl::Duration monotonic_deadline,
                         absl::FunctionRef<bool()> done) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
};

// The machine's clocks.
class SystemClock final : public Clock {
 public:
  absl::Time Now() const override;
  absl::Duration Monotonic() const override;
  void SleepFor(absl::Duration d) const override;
  bool WaitUntil(dynmig::CondVar& cv, dynmig::Mutex& mu, absl::Duration monotonic_deadline,
                 absl::FunctionRef<bool()> done) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

// A simulated clock whose time moves only when told (tests, simulations). Wall and monotonic time
// move together by Advance(); Set() moves wall time alone. Sleeps and timed waits on this clock end
// when Advance() carries the monotonic time past their deadline ("timers fire on demand"); a waiter
// re-checks its predicate at least every millisecond of real time, so signals are never lost.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'800'000'000));

  absl::Time Now() const override;
  absl::Duration Monotonic() const override;
  void SleepFor(absl::Duration d) const override;
  bool WaitUntil(dynmig::CondVar& cv, dynmig::Mutex& mu, absl::Duration monotonic_deadline,
                 absl::FunctionRef<bool()> done) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  void Advance(absl::Duration d);
  void Set(absl::Time t);
  // Moves time to the earliest deadline of a thread sleeping or waiting on this clock, if any;
  // returns whether there was one.
  bool AdvanceToNextDeadline();
  // How many threads sleep or wait on this clock now.
  size_t Waiters() const;
  // Blocks (real time, at most `real_timeout`) until at least `n` threads sleep or wait on this
  // clock; returns whether they do. Lets a test advance time only once the thread under test is
  // waiting.
  bool AwaitWaiters(size_t n, absl::Duration real_timeout = absl::Seconds(10)) const;

 private:
  mutable dynmig::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  absl::Duration monotonic_ ABSL_GUARDED_BY(mu_) = absl::Hours(1);
  mutable std::multiset<absl::Duration> waiters_ ABSL_GUARDED_BY(mu_);
};

// Another clock's time with a settable offset on the wall time alone, as a machine's clock after an
// NTP step or a resumed suspension: monotonic time, sleeps and waits are the base clock's (chaos
// runs).
class SteppedClock final : public Clock {
 public:
  explicit SteppedClock(const Clock& base) : base_(base) {}
  absl::Time Now() const override;
  absl::Duration Monotonic() const override { return base_.Monotonic(); }
  void SleepFor(absl::Duration d) const override { base_.SleepFor(d); }
  bool WaitUntil(dynmig::CondVar& cv, dynmig::Mutex& mu, absl::Duration monotonic_deadline,
                 absl::FunctionRef<bool()> done) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return base_.WaitUntil(cv, mu, monotonic_deadline, done);
  }
  absl::Duration offset() const;
  void set_offset(absl::Duration offset);

 private:
  const Clock& base_;
  mutable dynmig::Mutex mu_;
  absl::Duration offset_ ABSL_GUARDED_BY(mu_);
};

// The process's SystemClock (stateless), for entry points that construct the components.
const Clock& RealClock();

// A wall-clock deadline `d` from now in the form libraries that wait on the real clock take (gRPC
// deadlines, server shutdown): network peers run on real time whatever clock the caller injects.
std::chrono::system_clock::time_point RealDeadlineAfter(absl::Duration d);

}  // namespace dynmig
