// Clock: the source of "now" for code whose behaviour depends on time (reservation expiry, leases,
// node locks), injected so tests move time by hand instead of sleeping.
#pragma once

#include <mutex>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dynmig {

// Thread-safe: Now() may be called from any thread.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// The wall clock.
class SystemClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

// A clock that moves only when told (tests). Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'800'000'000)) : now_(start) {}
  absl::Time Now() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += d;
  }
  void Set(absl::Time t) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ = t;
  }

 private:
  mutable std::mutex mu_;
  absl::Time now_;
};

}  // namespace dynmig
