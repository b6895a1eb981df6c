// Tombstones: slices of departed pods until their node reports. See tombstones.h.
#include "scheduler/tombstones.h"

#include <algorithm>

namespace dynmig::scheduler {

void Tombstones::Bury(const std::string& node, const std::string& pod,
                      const std::vector<protocol::MigAllocation>& allocations, absl::Time now) {
  if (ttl_ <= absl::ZeroDuration()) return;
  bool any = false;
  for (const auto& a : allocations) any = any || a.runtime.has_value();
  if (!any) return;
  std::vector<Entry>& entries = by_node_[node];
  std::erase_if(entries, [&](const Entry& e) { return Expired(e, now); });
  for (const auto& a : allocations) {
    if (!a.runtime.has_value() || a.placement.end() > mig::kMaxPlacementUnits) continue;
    // One per GPU and placement: the later departure replaces the earlier one.
    std::erase_if(entries, [&](const Entry& e) {
      return e.gpu_uuid == a.gpu_uuid && e.placement == a.placement;
    });
    entries.push_back({pod, a.gpu_uuid, a.profile, a.placement, now});
  }
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& x, const Entry& y) { return x.gone_at < y.gone_at; });
  if (entries.size() > kMaxPerNode) {
    entries.erase(entries.begin(),
                  entries.begin() + static_cast<std::ptrdiff_t>(entries.size() - kMaxPerNode));
  }
}

bool Tombstones::Reported(const std::string& node, const std::optional<absl::Time>& reported_at,
                          const std::vector<protocol::HeldSlices>& held, absl::Time now) {
  auto it = by_node_.find(node);
  if (it == by_node_.end()) return false;
  const size_t before = it->second.size();
  std::erase_if(it->second, [&](const Entry& e) {
    if (Expired(e, now)) return true;
    if (reported_at.has_value() && *reported_at > e.gone_at) return true;
    const mig::SliceMask mask = e.placement.Mask();
    return std::any_of(held.begin(), held.end(), [&](const protocol::HeldSlices& h) {
      return h.gpu_uuid == e.gpu_uuid && h.placement.end() <= mig::kMaxPlacementUnits &&
             (h.placement.Mask() & mask) == mask;
    });
  });
  const bool dropped = it->second.size() != before;
  if (it->second.empty()) by_node_.erase(it);
  return dropped;
}

void Tombstones::ForgetNode(const std::string& node) { by_node_.erase(node); }

std::vector<Tombstones::Entry> Tombstones::Alive(const std::string& node, absl::Time now) const {
  std::vector<Entry> out;
  auto it = by_node_.find(node);
  if (it == by_node_.end()) return out;
  for (const auto& e : it->second) {
    if (!Expired(e, now)) out.push_back(e);
  }
  return out;
}

absl::Time Tombstones::NextExpiry(const std::string& node, absl::Time now) const {
  absl::Time next = absl::InfiniteFuture();
  auto it = by_node_.find(node);
  if (it == by_node_.end()) return next;
  for (const auto& e : it->second) {
    if (!Expired(e, now)) next = std::min(next, e.gone_at + ttl_);
  }
  return next;
}

size_t Tombstones::size() const {
  size_t n = 0;
  for (const auto& [node, entries] : by_node_) n += entries.size();
  return n;
}

}  // namespace dynmig::scheduler
