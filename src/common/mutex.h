// Locks the compiler checks AND ThreadSanitizer sees: a thin ABSL_LOCKABLE mutex with the subset
// of absl::Mutex's API dynmig uses (Lock, ReaderLock, TryLock, Await, scoped locks, a condition
// variable), over one of two implementations chosen at compile time:
//   - absl::Mutex / absl::CondVar in every build but ThreadSanitizer's (the production binary's
//     locks are absl's, with their fast uncontended paths);
//   - under ThreadSanitizer (or -DDYNMIG_PTHREAD_MUTEX=1), std::shared_mutex and
//     std::condition_variable_any. Debian's libabsl is not built with -fsanitize=thread, so its
//     fast paths (atomics and futexes inside the uninstrumented library) give TSan no
//     happens-before edge and every access to state an absl::Mutex guards looks like a race; the
//     pthread calls under the std types are intercepted by TSan.
// Both behave alike for dynmig's uses (tests/protocol/mutex_test.cc runs against the one built).
#pragma once

#include <condition_variable>
#include <functional>
#include <shared_mutex>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

#if !defined(DYNMIG_PTHREAD_MUTEX)
#if defined(__SANITIZE_THREAD__)
#define DYNMIG_PTHREAD_MUTEX 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DYNMIG_PTHREAD_MUTEX 1
#endif
#endif
#endif
#if !defined(DYNMIG_PTHREAD_MUTEX)
#define DYNMIG_PTHREAD_MUTEX 0
#endif

namespace dynmig {

// A predicate for Mutex::Await: a pointer to a bool, or to a callable returning bool (kept by
// pointer, as absl::Condition does: it must outlive the wait).
class Condition {
 public:
  explicit Condition(const bool* flag) : eval_([flag] { return *flag; }) {}
  // Await evaluates the callable with the mutex held; the analysis cannot follow that through the
  // stored std::function, so the callable's own annotation (REQUIRES the mutex) is not checked at
  // this call.
  template <typename F>
  explicit Condition(const F* f) : eval_([f]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return (*f)(); }) {}
  bool Eval() const { return eval_(); }
  static bool Thunk(const Condition* c) { return c->Eval(); }  // for absl::Condition

 private:
  std::function<bool()> eval_;
};

#if DYNMIG_PTHREAD_MUTEX

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    // Await re-evaluates its condition on every release, as absl's does. awaiters_ is read with the
    // lock held and an awaiter counts itself before it waits, so no wakeup is lost; with nobody
    // awaiting, a release costs no broadcast.
    const bool wake = awaiters_ > 0;
    mu_.unlock();
    if (wake) changed_.notify_all();
  }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

  // With the lock held: releases it until `cond` holds (re-checked whenever the lock is released),
  // then returns with it held.
  void Await(const Condition& cond) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    ++awaiters_;
    while (!cond.Eval()) changed_.wait(mu_);
    --awaiters_;
  }
  // The same for at most `timeout` of real time; returns cond's last value.
  bool AwaitWithTimeout(const Condition& cond, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    ++awaiters_;
    const bool held =
        changed_.wait_for(mu_, absl::ToChronoNanoseconds(timeout), [&] { return cond.Eval(); });
    --awaiters_;
    return held;
  }

  // BasicLockable, for CondVar's std::condition_variable_any.
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { Lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { Unlock(); }

 private:
  std::shared_mutex mu_;
  std::condition_variable_any changed_;
  int awaiters_ = 0;  // threads inside Await; changed only with mu_ held
};

// A condition variable for Mutex (absl::CondVar's subset): waits with the mutex held exclusively.
class CondVar {
 public:
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { cv_.wait(*mu); }
  // Returns true when the timeout passed (absl::CondVar's convention).
  bool WaitWithTimeout(Mutex* mu, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return cv_.wait_for(*mu, absl::ToChronoNanoseconds(timeout)) == std::cv_status::timeout;
  }
  // Returns true when the deadline passed.
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return cv_.wait_until(*mu, absl::ToChronoTime(deadline)) == std::cv_status::timeout;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

#else  // absl::Mutex underneath. The wrappers' bodies are not analysed: absl::Mutex's own
       // annotations would name the inner mutex, the callers' analysis names this one.

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.Unlock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return mu_.TryLock();
  }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.ReaderLock(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() ABSL_NO_THREAD_SAFETY_ANALYSIS { mu_.ReaderUnlock(); }
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() { mu_.AssertHeld(); }

  // With the lock held: releases it until `cond` holds, then returns with it held.
  void Await(const Condition& cond)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    mu_.Await(absl::Condition(&Condition::Thunk, &cond));
  }
  // The same for at most `timeout` of real time; returns cond's last value.
  bool AwaitWithTimeout(const Condition& cond, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return mu_.AwaitWithTimeout(absl::Condition(&Condition::Thunk, &cond), timeout);
  }

 private:
  friend class CondVar;
  absl::Mutex mu_;
};

// A condition variable for Mutex (absl::CondVar's subset): waits with the mutex held exclusively.
class CondVar {
 public:
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    cv_.Wait(&mu->mu_);
  }
  // Returns true when the timeout passed (absl::CondVar's convention).
  bool WaitWithTimeout(Mutex* mu, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return cv_.WaitWithTimeout(&mu->mu_, timeout);
  }
  // Returns true when the deadline passed.
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return cv_.WaitWithDeadline(&mu->mu_, deadline);
  }
  void Signal() { cv_.Signal(); }
  void SignalAll() { cv_.SignalAll(); }

 private:
  absl::CondVar cv_;
};

#endif  // DYNMIG_PTHREAD_MUTEX

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(Mutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) { mu_->ReaderLock(); }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class ABSL_SCOPED_LOCKABLE ReleasableMutexLock {
 public:
  explicit ReleasableMutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~ReleasableMutexLock() ABSL_UNLOCK_FUNCTION() {
    if (mu_ != nullptr) mu_->Unlock();
  }
  void Release() ABSL_UNLOCK_FUNCTION() {
    mu_->Unlock();
    mu_ = nullptr;
  }
  ReleasableMutexLock(const ReleasableMutexLock&) = delete;
  ReleasableMutexLock& operator=(const ReleasableMutexLock&) = delete;

 private:
  Mutex* mu_;
};

}  // namespace dynmig
