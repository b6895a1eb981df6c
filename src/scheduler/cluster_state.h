// The scheduler's view of MIG capacity, rebuilt from the API objects alone: per node the GPUs its
// device plugin registered (`hami.io/node-nvidia-register`, MIG mode with non-empty migProfiles,
// restricted to the scheduler's allowlist) and the reservations of every pod that is not
// terminated (`hami.io/vgpu-mig-allocations`), plus reservations this scheduler made whose
// annotation has not come back through the watch yet ("assumed").
//
// Fail closed: a MIG pod on a node without a readable reservation makes the GPUs it uses (all MIG
// GPUs of the node when that is unknown) unschedulable; so does a reservation naming a GPU the
// node does not have, or one that is illegal or overlaps another. Each such GPU carries the reason.
//
// Thread-safe: informer handlers update it while filters plan on it; PlanAndReserve is atomic with
// respect to other PlanAndReserve calls, so concurrent filters never reserve overlapping slices.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "mig/allowlist.h"
#include "mig/node_planner.h"
#include "nlohmann/json.hpp"
#include "protocol/devices.h"
#include "protocol/held_slices.h"
#include "protocol/mig_allocations.h"
#include "protocol/node_register.h"
#include "protocol/pod_request.h"

namespace dynmig::scheduler {

struct ClusterStateOptions {
  mig::Allowlist allowlist;
  protocol::ResourceNames resources;
  // A node whose device plugin last reported (hami.io/node-handshake "Reported_<time>") longer ago
  // than this is unhealthy: its plugin stopped reporting.
  absl::Duration report_timeout = absl::Minutes(3);
  // How requests are sized against profiles (device-config.yaml nvidia.migMemoryMatch).
  mig::MemoryMatch memory_match = mig::MemoryMatch::kNominal;
};

// One reservation as displayed (layout, metrics, explain).
struct ReservationReport {
  std::string pod;  // namespace/name
  std::string profile;
  mig::Placement placement;
  bool assumed = false;  // made by this scheduler, annotation not seen yet
  std::optional<protocol::RuntimeIdentity> runtime;
};

struct GpuReport {
  std::string uuid;
  uint32_t index = 0;
  std::string model;
  uint32_t units = 0;
  bool allowlisted = false;
  std::vector<std::string> allowed_profiles;
  bool healthy = true;
  std::string unhealthy_reason;
  std::vector<ReservationReport> reservations;
};

struct NodeReport {
  std::string name;
  bool healthy = true;
  std::string unhealthy_reason;
  std::vector<GpuReport> gpus;
};

// What a successful filter decided: the node and the annotations to write on the pod.
struct Reservation {
  std::string node;
  std::vector<protocol::MigAllocation> allocations;  // hami.io/vgpu-mig-allocations
  protocol::PodDevices devices;  // hami.io/vgpu-devices-to-allocate and -allocated
  std::string summary;           // "3g.20gb at slices 4-7 of GPU-… on node-a"
};

struct FilterDecision {
  std::optional<Reservation> reservation;      // nullopt: no candidate fits
  std::map<std::string, std::string> failed;   // node -> reason, for every other candidate
  mig::Verdict verdict = mig::Verdict::kFits;  // the best verdict when nothing fits
};

class ClusterState {
 public:
  explicit ClusterState(ClusterStateOptions options);

  // Informer events.
  void UpsertNode(const nlohmann::json& node);
  void RemoveNode(const std::string& name);
  void UpsertPod(const nlohmann::json& pod);
  void RemovePod(const std::string& ns, const std::string& name);

  // Plans the pod on the candidate nodes (all known nodes when empty) and, when one fits,
  // records the reservation as assumed for `pod_key` (namespace/name) until the pod's annotation
  // arrives or Forget is called. Errors: kInvalidArgument when the pod already holds a reservation.
  absl::StatusOr<FilterDecision> PlanAndReserve(const std::string& pod_key,
                                                const mig::PodRequest& request,
                                                const std::vector<std::string>& candidates,
                                                absl::Time now);

  // Drops an assumed reservation (the annotation write failed, or the reservation expired).
  void Forget(const std::string& pod_key);

  // Every node, GPU and reservation, for layout pages, metrics and explanations.
  std::vector<NodeReport> Report(absl::Time now) const;

  // Pods with an assumed or annotated reservation that was not realized (no runtime identity)
  // and whose reservation time (hami.io/vgpu-time) is before `deadline`: expiry candidates.
  // Pods released with ReleaseUnrealized are not listed again.
  std::vector<std::string> UnrealizedBefore(absl::Time deadline) const;

  // The node of the pod's reservation: the assumed one, else the one its annotation holds
  // (readable and non-empty). nullopt when the pod holds none.
  std::optional<std::string> ReservedNode(const std::string& pod_key) const;

  // Stops counting the pod's reservations that carry no runtime identity (the device plugin
  // reported hami.io/bind-phase=failed: nothing was created for them), keeping the realized ones
  // until the pod terminates. In memory only: the expiry pass re-applies it after a restart.
  // Cleared when the pod is removed or terminates.
  void ReleaseUnrealized(const std::string& pod_key);

  // The node's view for the planner (tests and explain).
  std::optional<mig::NodeView> View(const std::string& node, absl::Time now) const;

 private:
  struct GpuEntry {
    protocol::DeviceInfo info;
    std::shared_ptr<const mig::GpuPlanner> planner;  // null: not allowlisted or no MIG capability
  };
  struct NodeEntry {
    // What every filter reads first, together (a filter reads thousands of entries).
    std::string name;
    bool dirty = true;                      // view and report need a Rebuild
    std::optional<absl::Time> reported_at;  // hami.io/node-handshake's "Reported_<time>"
    mig::NodeView view;                     // cache, rebuilt when dirty
    std::string register_error;             // the register annotation could not be decoded
    // dynmig.io/mig-held: slices live instances hold without an active reservation.
    std::vector<protocol::HeldSlices> held;
    std::string held_error;  // the annotation could not be decoded
    std::string handshake;   // hami.io/node-handshake value
    std::vector<GpuEntry> gpus;
    std::set<std::string> cordoned;
    std::set<std::string> pods;  // pod keys placed on this node
    NodeReport report;           // cache, rebuilt when dirty
  };
  struct PodEntry {
    std::string key;
    std::string node;  // hami.io/vgpu-node, else spec.nodeName
    bool mig = false;  // requests managed resources in MIG mode
    absl::StatusOr<std::vector<protocol::MigAllocation>> allocations =
        std::vector<protocol::MigAllocation>{};
    bool has_annotation = false;
    absl::StatusOr<protocol::PodDevices> devices = protocol::PodDevices{};
    int64_t reserved_at = 0;  // hami.io/vgpu-time (unix seconds)
  };
  struct Assumed {
    Reservation reservation;
    int64_t reserved_at = 0;
  };

  // All REQUIRE mu_ held.
  std::shared_ptr<const mig::GpuPlanner> PlannerFor(const protocol::DeviceInfo& info);
  // Rebuilds the node's cached view and report when dirty; sets its health for `now`.
  const mig::NodeView& ViewOf(NodeEntry& node, absl::Time now) const;
  void Rebuild(NodeEntry& node) const;
  void Unlink(const std::string& pod_key);
  void MarkDirty(const std::string& node);
  // The entry of `name`, created when missing (kept in nodes_ and index_).
  NodeEntry& NodeFor(const std::string& name);
  NodeEntry* FindNode(const std::string& name) const;
  // The entries of the candidates (null: unknown), in their order. kube-scheduler sends the same
  // NodeNames filter after filter: the last answer is kept and reused while the list and the set
  // of nodes are unchanged (one pass of string compares instead of thousands of hash lookups).
  const std::vector<NodeEntry*>& Resolve(const std::vector<std::string>& candidates);

  const ClusterStateOptions options_;
  mutable std::mutex mu_;
  mutable std::map<std::string, NodeEntry> nodes_;  // sorted: reports list nodes by name
  // Hash index over nodes_ (its entries never move): a filter looks up thousands of candidates.
  std::unordered_map<std::string, NodeEntry*> index_;
  uint64_t nodes_generation_ = 0;            // bumped whenever nodes_ gains or loses an entry
  std::vector<std::string> resolved_names_;  // Resolve's memo
  std::vector<NodeEntry*> resolved_entries_;
  uint64_t resolved_generation_ = ~uint64_t{0};
  std::map<std::string, PodEntry> pods_;
  std::map<std::string, Assumed> assumed_;
  std::set<std::string> released_;                                          // ReleaseUnrealized
  std::map<std::string, std::shared_ptr<const mig::GpuPlanner>> planners_;  // by capability key
};

// Parses hami.io/node-handshake: "Reported_<time>" (RFC 3339 or "2006-01-02 15:04:05" UTC).
std::optional<absl::Time> ParseHandshakeReported(const std::string& value);

}  // namespace dynmig::scheduler
