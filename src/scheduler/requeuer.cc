// Requeuer: a Node label when MIG capacity frees while pods wait. See requeuer.h.
#include "scheduler/requeuer.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "fmt/format.h"
#include "protocol/annotations.h"

namespace dynmig::scheduler {

bool CapacityGrew(const ClusterState::Occupancy& before, const ClusterState::Occupancy& after) {
  if (!after.healthy) return false;  // nothing can be placed there now
  if (!before.healthy) return true;
  if (after.blocked_holds < before.blocked_holds) return true;
  for (const auto& g : after.gpus) {
    if (!g.schedulable) continue;
    const ClusterState::Occupancy::Gpu* old = nullptr;
    for (const auto& b : before.gpus) {
      if (b.uuid == g.uuid) {
        old = &b;
        break;
      }
    }
    if (old == nullptr || !old->schedulable) return true;  // a GPU appeared or became usable
    if ((old->occupied & ~g.occupied) != 0) return true;   // a slice it occupied is free now
  }
  return false;
}

Requeuer::Outcome Requeuer::RunOnce(size_t pending) {
  Outcome out;
  const absl::Time now = clock_.Now();
  std::map<std::string, ClusterState::Occupancy> current = state_.Occupancies(now);
  if (has_baseline_) {
    for (const auto& [name, occ] : current) {
      auto old = last_.find(name);
      const bool grew = old == last_.end() ? occ.healthy : CapacityGrew(old->second, occ);
      if (grew) due_.insert(name);
    }
  }
  std::erase_if(due_, [&](const std::string& n) { return !current.count(n); });
  std::erase_if(labelled_at_, [&](const auto& e) { return !current.count(e.first); });
  last_ = std::move(current);
  has_baseline_ = true;
  if (pending == 0) {
    // Nobody waits: a pod that comes later is filtered against the capacity as it is then.
    due_.clear();
    return out;
  }
  for (auto it = due_.begin(); it != due_.end();) {
    const std::string& node = *it;
    if (auto at = labelled_at_.find(node);
        at != labelled_at_.end() && now - at->second < options_.min_gap && now >= at->second) {
      ++it;  // labelled a moment ago: the next pass
      continue;
    }
    kube::MetadataPatch patch;
    patch.labels[std::string(protocol::kCapacityFreedLabel)] =
        absl::StrCat(absl::ToUnixMillis(now));
    auto st = client_.PatchNodeMetadata(node, patch);
    if (!st.ok() && st.status().code() != absl::StatusCode::kNotFound) {
      out.errors.push_back(fmt::format("label {} on node {}: {}", protocol::kCapacityFreedLabel,
                                       node, std::string(st.status().message())));
      ++it;
      continue;
    }
    if (st.ok()) {
      out.labelled.push_back(node);
      labelled_at_[node] = now;
    }
    it = due_.erase(it);
  }
  return out;
}

}  // namespace dynmig::scheduler
