// The device list the kubelet watches. See device_list.h.
#include "deviceplugin/device_list.h"

#include <utility>

namespace dynmig::deviceplugin {

void DeviceList::Set(std::vector<v1beta1::Device> devices) {
  dynmig::MutexLock lock(&mu_);
  bool same = devices.size() == devices_.size();
  for (size_t i = 0; same && i < devices.size(); ++i) {
    same = devices[i].id() == devices_[i].id() && devices[i].health() == devices_[i].health();
  }
  if (same && generation_ > 0) return;
  devices_ = std::move(devices);
  ++generation_;
  changed_.SignalAll();
}

std::vector<v1beta1::Device> DeviceList::Get(uint64_t* generation) const {
  dynmig::MutexLock lock(&mu_);
  if (generation != nullptr) *generation = generation_;
  return devices_;
}

uint64_t DeviceList::WaitForChange(uint64_t seen, absl::Duration timeout) const {
  dynmig::MutexLock lock(&mu_);
  clock_.WaitFor(changed_, mu_, timeout, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return generation_ != seen || closed_;
  });
  return generation_;
}

void DeviceList::Close() {
  dynmig::MutexLock lock(&mu_);
  closed_ = true;
  changed_.SignalAll();
}

}  // namespace dynmig::deviceplugin
