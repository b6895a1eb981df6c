// Requeuer: a Node label when MIG capacity frees while pods wait. See requeuer.h.
#include "scheduler/requeuer.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "fmt/format.h"
#include "protocol/annotations.h"

namespace dynmig::scheduler {

Requeuer::Outcome Requeuer::RunOnce(size_t pending) {
  Outcome out;
  const absl::Time now = clock_.Now();
  std::vector<std::string> freed = state_.FreedSince(&seq_, now);
  if (has_baseline_) due_.insert(freed.begin(), freed.end());
  has_baseline_ = true;
  // Only the labels of the last min_gap matter (and none "from the future": a clock set back).
  std::erase_if(labelled_at_, [&](const auto& e) {
    return now - e.second >= options_.min_gap || now < e.second;
  });
  if (pending == 0) {
    // Nobody waits: a pod that comes later is filtered against the capacity as it is then.
    due_.clear();
    return out;
  }
  for (auto it = due_.begin(); it != due_.end();) {
    const std::string& node = *it;
    if (labelled_at_.count(node)) {
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
