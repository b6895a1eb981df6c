#include "common/clock.h"

#include <algorithm>
#include <chrono>

#include "absl/time/clock.h"

namespace dynmig {

bool Clock::WaitFor(dynmig::CondVar& cv, dynmig::Mutex& mu, absl::Duration timeout,
                    absl::FunctionRef<bool()> done) const {
  if (timeout == absl::InfiniteDuration()) return WaitUntil(cv, mu, absl::InfiniteDuration(), done);
  return WaitUntil(cv, mu, Monotonic() + std::max(timeout, absl::ZeroDuration()), done);
}

absl::Time SystemClock::Now() const { return absl::Now(); }

absl::Duration SystemClock::Monotonic() const {
  return absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

void SystemClock::SleepFor(absl::Duration d) const { absl::SleepFor(d); }

bool SystemClock::WaitUntil(dynmig::CondVar& cv, dynmig::Mutex& mu,
                            absl::Duration monotonic_deadline,
                            absl::FunctionRef<bool()> done) const {
  while (!done()) {
    if (monotonic_deadline == absl::InfiniteDuration()) {
      cv.Wait(&mu);
      continue;
    }
    const absl::Duration left = monotonic_deadline - Monotonic();
    if (left <= absl::ZeroDuration()) return done();
    cv.WaitWithTimeout(&mu, left);
  }
  return true;
}

FakeClock::FakeClock(absl::Time start) : now_(start) {}

absl::Time FakeClock::Now() const {
  dynmig::MutexLock lock(&mu_);
  return now_;
}

absl::Duration FakeClock::Monotonic() const {
  dynmig::MutexLock lock(&mu_);
  return monotonic_;
}

void FakeClock::Advance(absl::Duration d) {
  dynmig::MutexLock lock(&mu_);
  now_ += d;
  monotonic_ += std::max(d, absl::ZeroDuration());
}

void FakeClock::Set(absl::Time t) {
  dynmig::MutexLock lock(&mu_);
  now_ = t;
}

bool FakeClock::AdvanceToNextDeadline() {
  dynmig::MutexLock lock(&mu_);
  if (waiters_.empty() || *waiters_.begin() == absl::InfiniteDuration()) return false;
  const absl::Duration deadline = *waiters_.begin();  // the earliest
  if (deadline > monotonic_) {
    now_ += deadline - monotonic_;
    monotonic_ = deadline;
  }
  return true;
}

size_t FakeClock::Waiters() const {
  dynmig::MutexLock lock(&mu_);
  return waiters_.size();
}

bool FakeClock::AwaitWaiters(size_t n, absl::Duration real_timeout) const {
  dynmig::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiters_.size() >= n; };
  return mu_.AwaitWithTimeout(dynmig::Condition(&enough), real_timeout);
}

void FakeClock::SleepFor(absl::Duration d) const {
  dynmig::MutexLock lock(&mu_);
  const absl::Duration deadline = monotonic_ + std::max(d, absl::ZeroDuration());
  auto it = waiters_.insert(deadline);
  auto passed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return monotonic_ >= deadline; };
  mu_.Await(dynmig::Condition(&passed));
  waiters_.erase(it);
}

bool FakeClock::WaitUntil(dynmig::CondVar& cv, dynmig::Mutex& mu, absl::Duration monotonic_deadline,
                          absl::FunctionRef<bool()> done) const {
  // The caller's cv is signalled by the caller's code, not by Advance(): wait on it in short
  // real-time slices and re-read the simulated time between them. Lock order: the caller's mu, then
  // this clock's mu_.
  std::multiset<absl::Duration>::iterator it;
  {
    dynmig::MutexLock lock(&mu_);
    it = waiters_.insert(monotonic_deadline);
  }
  bool result = true;
  while (!done()) {
    if (Monotonic() >= monotonic_deadline) {
      result = done();
      break;
    }
    cv.WaitWithTimeout(&mu, absl::Milliseconds(1));
  }
  dynmig::MutexLock lock(&mu_);
  waiters_.erase(it);
  return result;
}

absl::Time SteppedClock::Now() const {
  const absl::Time base = base_.Now();
  dynmig::MutexLock lock(&mu_);
  return base + offset_;
}

absl::Duration SteppedClock::offset() const {
  dynmig::MutexLock lock(&mu_);
  return offset_;
}

void SteppedClock::set_offset(absl::Duration offset) {
  dynmig::MutexLock lock(&mu_);
  offset_ = offset;
}

const Clock& RealClock() {
  static const SystemClock clock;
  return clock;
}

std::chrono::system_clock::time_point RealDeadlineAfter(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoNanoseconds(d);
}

}  // namespace dynmig
