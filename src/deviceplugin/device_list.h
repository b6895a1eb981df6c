// The device list the kubelet watches (ListAndWatch): the publisher's part of PluginCore with its
// own lock, so that a watcher never waits for an Allocate or a Reconcile. Thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "deviceplugin/v1beta1/api.pb.h"

namespace dynmig::deviceplugin {

class DeviceList {
 public:
  // `clock` times the waits; it must outlive the list.
  explicit DeviceList(const Clock& clock) : clock_(clock) {}

  // Replaces the list; a new generation (waking every waiter) only when an ID or a health
  // changed, or on the first call.
  void Set(std::vector<v1beta1::Device> devices) ABSL_LOCKS_EXCLUDED(mu_);
  // The list; `generation` (optional) receives its generation.
  std::vector<v1beta1::Device> Get(uint64_t* generation = nullptr) const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until the generation differs from `seen`, `timeout` of the clock's time passed, or
  // Close(); returns the current generation.
  uint64_t WaitForChange(uint64_t seen, absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every wait, now and later (the watchers' transport is shutting down).
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const Clock& clock_;
  mutable dynmig::Mutex mu_;
  mutable dynmig::CondVar changed_;
  std::vector<v1beta1::Device> devices_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dynmig::deviceplugin
