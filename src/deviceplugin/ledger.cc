// The ledger of served Allocates. See ledger.h.
#include "deviceplugin/ledger.h"

#include <utility>

namespace dynmig::deviceplugin {

void Ledger::Load(std::vector<LedgerEntry> entries) {
  dynmig::MutexLock lock(&mu_);
  entries_ = std::move(entries);
}

void Ledger::Record(LedgerEntry entry) {
  dynmig::MutexLock lock(&mu_);
  std::erase_if(entries_,
                [&](const LedgerEntry& old) { return old.device_ids == entry.device_ids; });
  entries_.push_back(std::move(entry));
}

bool Ledger::Prune(const std::set<std::string>& live) {
  dynmig::MutexLock lock(&mu_);
  return std::erase_if(entries_, [&](const LedgerEntry& e) { return !live.count(e.pod_uid); }) > 0;
}

std::optional<LedgerEntry> Ledger::Find(const std::vector<std::string>& device_key) const {
  dynmig::MutexLock lock(&mu_);
  std::optional<LedgerEntry> found;
  for (const auto& e : entries_) {
    if (e.device_ids == device_key) found = e;
  }
  return found;
}

std::vector<LedgerEntry> Ledger::Entries() const {
  dynmig::MutexLock lock(&mu_);
  return entries_;
}

}  // namespace dynmig::deviceplugin
