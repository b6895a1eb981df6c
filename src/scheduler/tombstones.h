// Tombstones: the realized MIG slices of pods that left (deleted from the API, or terminated),
// kept occupied in the scheduler's view until the node's device plugin has reported after the pod
// left (docs/scheduler.md, "Slices of departed pods"). The plugin destroys a departed pod's
// instances in its own time (NVML slow, or another NVML client such as DCGM holding one:
// IN_USE); until it has published after the departure nothing says the slices are free, and a
// pod placed there would be refused at Allocate. A tombstone ends when:
//   - the node reports (hami.io/node-handshake "Reported_<time>") at a time later than the
//     departure: the plugin's published state then includes it (the instance is gone, or its
//     slices are published as held, dynmig.io/mig-held, and counted from there);
//   - the node's held slices name its slices (they are counted from there);
//   - it is older than the TTL (the report timeout: a node silent for that long is unhealthy);
//   - the node is removed.
// The departure time is the scheduler's clock and the report time the node's: a node clock ahead
// of the scheduler's by d ends tombstones up to d early.
//
// Bounded whatever the API holds: only realized allocations (a runtime identity) are buried, one
// per GPU and placement (a later departure replaces an earlier one), at most kMaxPerNode per node
// (the oldest go first). Not thread-safe: ClusterState keeps it under its lock. Pure (times are
// passed in).
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "mig/placement.h"
#include "protocol/held_slices.h"
#include "protocol/mig_allocations.h"

namespace dynmig::scheduler {

class Tombstones {
 public:
  static constexpr size_t kMaxPerNode = 64;

  struct Entry {
    std::string pod;  // namespace/name, for reports
    std::string gpu_uuid;
    std::string profile;
    mig::Placement placement;
    absl::Time gone_at;
  };

  // `ttl` <= 0 keeps nothing.
  explicit Tombstones(absl::Duration ttl) : ttl_(ttl) {}

  // `pod` left `node` at `now`: its allocations that carry a runtime identity (the device plugin
  // created them) are kept. Expired entries of the node are dropped first.
  void Bury(const std::string& node, const std::string& pod,
            const std::vector<protocol::MigAllocation>& allocations, absl::Time now);

  // The node's annotations as now read: its last report time (nullopt: none readable) and held
  // slices. Drops the node's tombstones that the report postdates, that `held` covers, or that
  // expired at `now`. true when any was dropped.
  bool Reported(const std::string& node, const std::optional<absl::Time>& reported_at,
                const std::vector<protocol::HeldSlices>& held, absl::Time now);

  void ForgetNode(const std::string& node);

  // The node's tombstones not expired at `now`, oldest first.
  std::vector<Entry> Alive(const std::string& node, absl::Time now) const;

  // When the first of the node's tombstones alive at `now` expires; InfiniteFuture when none.
  absl::Time NextExpiry(const std::string& node, absl::Time now) const;

  size_t size() const;
  absl::Duration ttl() const { return ttl_; }

 private:
  bool Expired(const Entry& e, absl::Time now) const { return now - e.gone_at >= ttl_; }

  absl::Duration ttl_;
  std::map<std::string, std::vector<Entry>> by_node_;  // oldest first
};

}  // namespace dynmig::scheduler
