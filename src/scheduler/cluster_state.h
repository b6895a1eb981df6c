// The scheduler's view of MIG capacity, rebuilt from the API objects alone: per node the GPUs its
// device plugin registered (`hami.io/node-nvidia-register`, MIG mode with non-empty migProfiles,
// restricted to the scheduler's allowlist) and the reservations of every pod that is not
// terminated (`hami.io/vgpu-mig-allocations`), plus reservations this scheduler made whose
// annotation has not come back through the watch yet ("assumed").
//
// Fail closed, per GPU and on evidence: a pod on a node without a readable reservation makes a GPU
// unschedulable only when annotations that only dynmig writes (the webhook refuses them from
// anyone else) say it holds devices there: hami.io/vgpu-devices-allocated or -to-allocate naming
// the GPU, or an unreadable hami.io/vgpu-mig-allocations (or device annotation) whose text names
// it. An unreadable one that names none of the node's GPUs fails the whole node (dynmig wrote it,
// so something is reserved there, and nothing says where). What a user may write (resource
// requests, nvidia.com/vgpu-mode, other annotations) never blocks a GPU by itself. A reservation
// naming a GPU the node does not have, or one that is illegal or overlaps another, fails closed
// too. Each such GPU carries the reason.
//
// Defragmentation reservations (dynmig.io/defrag-reservation on the Node, written by the
// defragmenter): until it expires, a reservation's slices count as occupied for every pod but the
// one it names (uid included when it carries one), and stop counting once that pod holds a
// reservation of its own on the node. PlanAndReserve places the named pod into its reserved slices
// first (the planner on the node with only those slices free), as soon as nothing else overlaps
// them; otherwise it plans the pod as usual. An unreadable annotation fails the node closed.
//
// Thread-safe: informer handlers update it while filters plan on it. A reader-writer lock guards
// the nodes and pods; a filter plans under the shared lock (filters plan in parallel) and takes
// the exclusive lock only to record its choice, after checking that the chosen node did not change
// since it planned (each node carries a version bumped by every change of its reservations);
// otherwise it plans again. So concurrent filters never reserve overlapping slices, and no decision
// holds one lock over the whole cluster state for its whole duration.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "mig/allowlist.h"
#include "mig/node_planner.h"
#include "nlohmann/json.hpp"
#include "protocol/defrag.h"
#include "protocol/devices.h"
#include "protocol/gpu_mode.h"
#include "protocol/gpu_mode_switch.h"
#include "protocol/held_slices.h"
#include "protocol/idle_instances.h"
#include "protocol/mig_allocations.h"
#include "protocol/node_register.h"
#include "protocol/pod_request.h"
#include "scheduler/tombstones.h"

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
  // A stable code for unhealthy_reason without names in it (a metric label): unregistered-gpu,
  // unreadable-reservation, devices-without-reservation, unreadable-held-slices,
  // held-slices-beyond-gpu, device-unhealthy, cordoned, switching, conflicting-reservations.
  std::string unhealthy_code;
  // Issue 31's mode switch: the scheduler's request for this GPU (dynmig.io/gpu-mode-request) and
  // the device plugin's status of it (dynmig.io/gpu-mode), when the node carries them. While the
  // request is not answered (protocol::HeldForSwitch) the GPU takes no reservation ("switching").
  // Pointers, null when absent: a report has one entry per GPU of the cluster, and with switching
  // off (the default) both are always absent (two optionals cost ~200 bytes a GPU, 8 MiB at
  // 40,000).
  std::shared_ptr<const protocol::GpuModeRequest> mode_request;
  std::shared_ptr<const protocol::GpuModeStatus> mode_status;
  std::vector<ReservationReport> reservations;
  // Idle (warm) instances the device plugin keeps (dynmig.io/idle-mig-instances): free slices a
  // pod of that profile would reuse.
  struct IdleReport {
    std::string profile;
    mig::Placement placement;
    int64_t idle_since = 0;  // unix seconds
  };
  std::vector<IdleReport> idle;
};

// A GPU the node publishes in whole-GPU mode (mode "hami-core", MIG off): given whole to one pod.
struct WholeGpuReport {
  std::string uuid;
  uint32_t index = 0;
  std::string model;
  uint64_t memory_mib = 0;  // devmem
  bool healthy = true;
  std::string unhealthy_reason;
  // device-unhealthy, cordoned, bad-device, unreadable-reservation, mig-reservation,
  // devices-without-reservation, conflicting-reservations.
  std::string unhealthy_code;
  std::string holder;    // namespace/name of the pod it is given to; empty: free
  bool assumed = false;  // the holder's reservation is this scheduler's, annotation not seen yet
};

struct NodeReport {
  std::string name;
  bool healthy = true;
  std::string unhealthy_reason;
  // unreadable-register, deregistered or stopped-reporting (a metric label, no names in it).
  std::string unhealthy_code;
  std::vector<GpuReport> gpus;
  std::vector<WholeGpuReport> whole_gpus;  // GPUs in whole-GPU mode, apart from the MIG ones
  // hami.io/mutex.lock's time while a bind holds the node's lock (metrics: how long it is held).
  std::optional<absl::Time> locked_at;
  // dynmig.io/defrag-reservation, as read (expired ones included; `active` says which count).
  struct DefragHold {
    protocol::DefragReservation reservation;
    bool active = false;   // not expired, and the pod holds no reservation of its own here
    bool blocked = false;  // other reservations still overlap its slices
  };
  std::vector<DefragHold> defrag;
  std::string defrag_error;  // the annotation could not be decoded (the node is failed closed)
  // dynmig.io/gpu-mode-request could not be decoded (every GPU is held: failed closed), or
  // dynmig.io/gpu-mode could not (requested GPUs count as unanswered).
  std::string mode_error;
};

// What a successful filter decided: the node and the annotations to write on the pod.
struct Reservation {
  std::string node;
  std::vector<protocol::MigAllocation> allocations;  // hami.io/vgpu-mig-allocations
  protocol::PodDevices devices;  // hami.io/vgpu-devices-to-allocate and -allocated
  std::string summary;           // "3g.20gb at slices 4-7 of GPU-… on node-a"
};

struct FilterDecision {
  std::optional<Reservation> reservation;  // nullopt: no candidate fits
  // node -> reason. When nothing fits: every candidate. When a node was chosen: only the
  // candidates that can never run the pod (unknown node, no MIG GPU, no allowlisted profile or
  // none big enough, excluded by the pod's GPU hints); the others would run it and need no entry
  // (kube-scheduler drops a node that is in neither list).
  std::map<std::string, std::string> failed;
  mig::Verdict verdict = mig::Verdict::kFits;  // the best verdict when nothing fits
};

class ClusterState {
 public:
  // With `clock` (the scheduler's own state), the realized slices of a pod that left (deleted or
  // terminated) stay occupied until its node's device plugin has reported after it left, at most
  // the report timeout (scheduler/tombstones.h); without (copies made for one analysis), they
  // are free at once. `clock` must outlive the state.
  explicit ClusterState(ClusterStateOptions options, const Clock* clock = nullptr);

  // Informer events.
  void UpsertNode(const nlohmann::json& node) ABSL_LOCKS_EXCLUDED(mu_);
  void RemoveNode(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);
  void UpsertPod(const nlohmann::json& pod) ABSL_LOCKS_EXCLUDED(mu_);
  void RemovePod(const std::string& ns, const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);

  // Plans the pod on the candidate nodes (all known nodes when empty) and, when one fits,
  // records the reservation as assumed for `pod_key` (namespace/name; `pod_uid` when known) until
  // the pod's annotation arrives or Forget is called. Errors: kInvalidArgument when the pod
  // already holds a reservation.
  absl::StatusOr<FilterDecision> PlanAndReserve(const std::string& pod_key,
                                                const mig::PodRequest& request,
                                                const std::vector<std::string>& candidates,
                                                absl::Time now, const std::string& pod_uid = "")
      ABSL_LOCKS_EXCLUDED(mu_);

  // The pod's assumed reservation (made here, annotation not seen yet); nullopt when it has
  // none. `binding`: a bind is writing it now (ClaimForBind).
  struct AssumedInfo {
    Reservation reservation;
    bool binding = false;
    std::string uid;  // the pod's uid at the filter; empty when unknown
    absl::Time made;  // when the filter (or the bind claiming it) dated it
  };
  std::optional<AssumedInfo> Assumed(const std::string& pod_key) const ABSL_LOCKS_EXCLUDED(mu_);

  // The assumed reservation of the pod for a bind to `node`, marked as being bound (a concurrent
  // filter of the same pod does not move it; expiry does not count its age until EndBind) and
  // re-dated to `now`. kNotFound when the pod has none (or the assumption belongs to another uid:
  // it is dropped); kFailedPrecondition when it is on another node.
  absl::StatusOr<Reservation> ClaimForBind(const std::string& pod_key, const std::string& pod_uid,
                                           const std::string& node, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The bind is over (bound or failed): the assumption stays until the annotation arrives.
  void EndBind(const std::string& pod_key) ABSL_LOCKS_EXCLUDED(mu_);

  // Places a whole-GPU pod (protocol::IsWholeGpuPod) as PlanAndReserve places a MIG pod: on the
  // candidate node where every container gets `count` free, healthy, uncordoned GPUs in whole-GPU
  // mode with at least its memory floor, no GPU given to two containers (init containers
  // included: they get GPUs of their own). Among the nodes that fit: one without a bind in flight,
  // then the one left with the fewest free whole GPUs (whole nodes stay free), then candidate
  // order. The reservation is assumed as a MIG one is (Reservation::devices, no allocations).
  // Errors: kInvalidArgument when the pod already holds a reservation. Under the exclusive lock
  // (whole-GPU pods are few; the work per node is bounded by its GPUs and the pod's containers).
  absl::StatusOr<FilterDecision> PlanAndReserveWhole(const std::string& pod_key,
                                                     const protocol::WholeGpuRequest& request,
                                                     const std::vector<std::string>& candidates,
                                                     absl::Time now,
                                                     const std::string& pod_uid = "")
      ABSL_LOCKS_EXCLUDED(mu_);

  // Drops an assumed reservation (the annotation write failed, or the reservation expired).
  void Forget(const std::string& pod_key) ABSL_LOCKS_EXCLUDED(mu_);

  // Every node, GPU and reservation, for layout pages, metrics and explanations.
  std::vector<NodeReport> Report(absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_);

  // Pods with an assumed or annotated reservation that was not realized (no runtime identity)
  // and whose reservation time (hami.io/vgpu-time) is before `deadline`: expiry candidates.
  // Pods released with ReleaseUnrealized are not listed again.
  std::vector<std::string> UnrealizedBefore(absl::Time deadline) const ABSL_LOCKS_EXCLUDED(mu_);

  // The node of the pod's reservation: the assumed one, else the one its annotation holds
  // (readable and non-empty). nullopt when the pod holds none.
  std::optional<std::string> ReservedNode(const std::string& pod_key) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Stops counting the pod's reservations that carry no runtime identity (the device plugin
  // reported hami.io/bind-phase=failed: nothing was created for them), keeping the realized ones
  // until the pod terminates. In memory only: the expiry pass re-applies it after a restart.
  // Cleared when the pod is removed or terminates.
  void ReleaseUnrealized(const std::string& pod_key) ABSL_LOCKS_EXCLUDED(mu_);

  // The NVML names of the MIG GPU models the nodes register (sorted, each once).
  std::vector<std::string> Models() const ABSL_LOCKS_EXCLUDED(mu_);

  // The node holding a defragmentation reservation for the pod (namespace/name), if any.
  std::optional<std::string> DefragHoldNode(const std::string& pod_key) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // What a pending pod's next try depends on, per node, in compact form: the node's health, per
  // GPU whether it takes reservations (healthy, allowlisted, not cordoned) and which slices are
  // occupied (reservations, held slices, active defragmentation holds), and how many
  // defragmentation holds other reservations still block. Kept per node and compared at every
  // rebuild of its view (CapacityGrew).
  struct Occupancy {
    struct Gpu {
      std::string uuid;
      bool schedulable = false;
      mig::SliceMask occupied = 0;
      bool whole = false;  // a GPU in whole-GPU mode: occupied is 1 while a pod holds it
    };
    bool healthy = false;
    uint32_t blocked_holds = 0;
    std::vector<Gpu> gpus;
  };
  // The nodes whose capacity grew (CapacityGrew; a node first seen healthy counts) since `*seq`,
  // which is then advanced; stale views are rebuilt first (time alone frees capacity too: a
  // defragmentation reservation expires). Start with *seq = 0 and ignore the first answer for a
  // baseline. The requeuer's question (requeuer.h).
  std::vector<std::string> FreedSince(uint64_t* seq, absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_);

  // The node's view for the planner (tests and explain).
  std::optional<mig::NodeView> View(const std::string& node, absl::Time now) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct GpuEntry {
    protocol::DeviceInfo info;
    std::shared_ptr<const mig::GpuPlanner> planner;  // null: not allowlisted or no MIG capability
  };
  // A node's plan for one shape of request, valid while the node's version is unchanged: a
  // filter plans again only the nodes that changed since the last filter of that shape.
  struct CachedPlan {
    std::string request;  // PlanKey of the request
    uint64_t version = 0;
    mig::NodePlan plan;
  };
  static constexpr size_t kCachedShapes = 4;  // request shapes remembered per node
  struct NodeEntry {
    // What every filter reads first, together (a filter reads thousands of entries).
    std::string name;
    bool dirty = true;     // view and report need a Rebuild
    uint64_t version = 0;  // bumped with every change of what a plan reads
    // When time alone changes the view's health or bind-in-flight (a report times out, a node
    // lock expires): Stale from then on, and before viewed_at (a clock set back). Set by ViewOf.
    absl::Time stale_at = absl::InfiniteFuture();
    absl::Time viewed_at = absl::InfinitePast();
    mig::NodeSummary summary;               // of the view, rebuilt with it
    std::optional<absl::Time> reported_at;  // hami.io/node-handshake's "Reported_<time>"
    mig::NodeView view;                     // cache, rebuilt when dirty
    std::string register_error;             // the register annotation could not be decoded
    // dynmig.io/mig-held: slices live instances hold without an active reservation.
    std::vector<protocol::HeldSlices> held;
    std::string held_error;  // the annotation could not be decoded
    // dynmig.io/idle-mig-instances: idle (warm) instances, preferred placements.
    std::vector<protocol::IdleInstance> idle;
    std::string idle_error;  // the annotation could not be decoded (ignored: only a preference)
    // dynmig.io/defrag-reservation: slices freed for a waiting pod.
    std::vector<protocol::DefragReservation> defrag;
    std::string defrag_error;  // the annotation could not be decoded (fails the node closed)
    // The earliest expiry among the active reservations (a rebuild is due then).
    absl::Time next_defrag_expiry = absl::InfiniteFuture();
    std::string handshake;                // hami.io/node-handshake value
    std::optional<absl::Time> locked_at;  // hami.io/mutex.lock's time: a bind is in flight
    std::vector<GpuEntry> gpus;
    // The register's GPUs in whole-GPU mode ("hami-core"), apart from the MIG ones.
    std::vector<protocol::DeviceInfo> whole;
    // hami.io/device-cordon (protocol/device_cordon.h): GPUs that take no new reservation; when
    // the annotation cannot be read, every GPU of the node is cordoned (cordon_error says why).
    std::set<std::string> cordoned;
    std::string cordon_error;
    std::map<std::string, std::string> cordon_reasons;  // dynmig.io/device-cordon-reasons
    // dynmig.io/gpu-mode-request and dynmig.io/gpu-mode by GPU UUID; mode_error: either was
    // unreadable (an unreadable request holds every GPU of the node).
    std::map<std::string, protocol::GpuModeRequest> mode_requests;
    std::map<std::string, protocol::GpuModeStatus> mode_statuses;
    std::string mode_error;
    bool mode_requests_unreadable = false;
    std::set<std::string> pods;     // pod keys placed on this node
    std::set<std::string> assumed;  // keys of assumed_ whose reservation is on this node
    NodeReport report;              // cache, rebuilt when dirty
    // The occupancy of the last view (occupancy_seen: there was one), and the value of
    // freed_counter_ when a rebuild last found the capacity grown (FreedSince).
    Occupancy occupancy;
    bool occupancy_seen = false;
    uint64_t freed_seq = 0;
    // Written under the exclusive lock only (commit), read under the shared one.
    std::array<CachedPlan, kCachedShapes> plans;
    uint32_t next_plan_slot = 0;
  };
  struct PodEntry {
    std::string key;
    std::string node;  // hami.io/vgpu-node, else spec.nodeName
    bool mig = false;  // requests managed resources in MIG mode
    absl::StatusOr<std::vector<protocol::MigAllocation>> allocations =
        std::vector<protocol::MigAllocation>{};
    bool has_annotation = false;
    // Evidence of the GPUs the pod holds, from annotations only dynmig writes: the UUIDs its
    // readable device annotations name, and for unreadable ones (mig-allocations or devices)
    // why, and the GPU UUIDs their text names.
    std::vector<std::string> device_gpus;
    // The same per annotation (readable ones): a whole GPU whose entry the device plugin erased
    // from -to-allocate was allocated (realized).
    std::vector<std::string> allocated_gpus;
    std::vector<std::string> to_allocate_gpus;
    bool whole = false;  // a whole-GPU pod (protocol::IsWholeGpuPod)
    std::string unreadable;
    std::vector<std::string> unreadable_gpus;
    int64_t reserved_at = 0;  // hami.io/vgpu-time (unix seconds)
  };
  struct AssumedEntry {
    Reservation reservation;
    int64_t reserved_at = 0;
    std::string uid;
    bool binding = false;
  };

  // Records an unreadable system annotation of the pod (`key`, its `value`, why) as evidence.
  static void AddUnreadable(PodEntry& entry, std::string_view key, std::string_view value,
                            const absl::Status& error);
  // The device annotations' evidence (UUIDs, or unreadable values) into `entry`.
  static void ReadDeviceEvidence(const nlohmann::json& pod, PodEntry& entry);

  std::shared_ptr<const mig::GpuPlanner> PlannerFor(const protocol::DeviceInfo& info)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rebuilds the node's cached view and report when dirty; sets its health for `now`.
  const mig::NodeView& ViewOf(NodeEntry& node, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether ViewOf would change the node (dirty, or its health or bind-in-flight state changed
  // with time).
  bool Stale(const NodeEntry& node, absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Why a GPU is kept out of scheduling: a stable code and the reason; the first one set stays.
  struct GpuFault {
    std::string code;
    std::string reason;
    bool empty() const { return reason.empty(); }
    void Set(std::string_view c, const std::string& why) {
      if (!empty()) return;
      code = c;
      reason = why;
    }
  };
  // dynmig.io/gpu-mode-request and dynmig.io/gpu-mode into the entry.
  static void ReadModeSwitch(const nlohmann::json& node, NodeEntry& entry);
  // A GPU held for a mode switch (or every GPU, when the requests are unreadable): the fault
  // "switching"; the request and status into its report.
  static void SwitchFault(const NodeEntry& node, const std::string& uuid, GpuReport& gr,
                          GpuFault& fault);
  // Rebuilds the node's view, report and summary from its GPUs, the reservations of its pods and
  // assumptions, its held slices and idle instances.
  void Rebuild(NodeEntry& node, absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rebuild's steps (RebuildState gathers per GPU what the view is written from).
  struct RebuildState;
  void CollectReservations(RebuildState& st) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  static void CollectHeldSlices(RebuildState& st);
  // The node's tombstones (slices of departed pods not reported since): occupied as held slices.
  void CollectTombstones(RebuildState& st, absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The pod's realized reservations become tombstones (it left its node now).
  void Bury(const std::string& pod_key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CollectDefragHolds(RebuildState& st, absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The pod placed into its defragmentation reservation, when it has one that nothing else
  // overlaps any more and its request fits there; nullopt otherwise (plan as usual).
  std::optional<FilterDecision> ReserveInDefragHold(const std::string& pod_key,
                                                    const mig::PodRequest& request,
                                                    const std::vector<std::string>& candidates,
                                                    absl::Time now, const std::string& pod_uid)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The reservation of `plan` on `node` (its view) for the request.
  static Reservation MakeReservation(const std::string& node, const mig::NodeView& view,
                                     const mig::NodePlan& plan, const mig::PodRequest& request);
  static mig::GpuView BuildGpuView(RebuildState& st, size_t i);
  // The node's GPUs in whole-GPU mode into report.whole_gpus: faults, and the pod holding each.
  void CollectWholeGpus(const NodeEntry& node, NodeReport& report) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether the pod's evidence names one of the node's GPUs in whole-GPU mode.
  static bool NamesWholeGpu(const NodeEntry& node, const PodEntry& pod);
  // The whole-GPU request on one node (its view up to date): per container the GPUs (indices
  // into report.whole_gpus), or why not.
  struct WholeFit {
    bool fits = false;
    bool never = false;  // the node could not run the pod even with every GPU free
    mig::Verdict verdict = mig::Verdict::kFits;
    std::string reason;
    std::vector<std::vector<size_t>> picks;
    size_t free_after = 0;
  };
  static WholeFit FitWhole(const NodeEntry& node, const protocol::WholeGpuRequest& request);
  static void AddIdleInstances(const NodeEntry& node, mig::GpuView& gv, GpuReport& gr);
  // The GPUs (indices into node.gpus) a pod without a readable reservation makes unschedulable,
  // with the reason for each into `unhealthy`. See the header comment.
  void FailClosedOnEvidence(const NodeEntry& node, const PodEntry& pod,
                            std::vector<GpuFault>& unhealthy) const;
  void Unlink(const std::string& pod_key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkDirty(const std::string& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases an assumption, from its node's set too, and marks that node dirty.
  void DropAssumed(std::map<std::string, AssumedEntry>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One registered GPU of `model` fewer.
  void Uncount(const std::string& model) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Touch(NodeEntry& node) {
    node.dirty = true;
    ++node.version;
  }
  // One planning pass over the candidates (under the shared lock): every node's plan, the
  // versions it saw, the chosen node and the reasons the answer carries, by one PlanSession.
  // Repair (under the exclusive lock) re-plans the nodes that changed since and chooses again, so
  // the choice equals a plan made at that moment.
  struct Planned {
    std::shared_ptr<const std::vector<NodeEntry*>> entries;  // candidate order; null: unknown
    std::vector<uint64_t> versions;                          // of entries when planned
    std::optional<mig::PlanSession> session;                 // plans, choice and reasons
    std::vector<uint32_t> fresh;  // indices of plans computed by this pass (not cached)
    std::string request_key;      // PlanKey of the request
    uint64_t generation = 0;      // nodes_generation_ when planned
    FilterDecision decision;      // failed and verdict
  };
  // Every candidate up to date (not Stale).
  Planned PlanLocked(std::shared_ptr<const std::vector<NodeEntry*>> entries,
                     const std::vector<std::string>& candidates,
                     const mig::PodRequest& request) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // PlanLocked's steps: each candidate planned, reused from its cache or skipped; then the
  // reasons of the losers the decision reports.
  void PlanCandidates(Planned& out, const std::vector<std::string>& candidates) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void ExplainLosers(Planned& out) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Stores p's fresh plans of nodes still at the version planned. Writes the entries' caches:
  // REQUIRES mu_ held exclusively (a static member cannot name it in an annotation).
  static void CachePlans(const Planned& p);
  // false: plan again (the node set changed, or nothing fits any more).
  bool Repair(Planned& p, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The reservation of p's chosen node into p.decision.
  void Finish(Planned& p, const mig::PodRequest& request) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The entry of `name`, created when missing (kept in nodes_ and index_).
  NodeEntry& NodeFor(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  NodeEntry* FindNode(const std::string& name) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The entries of the candidates (null: unknown), in their order. kube-scheduler sends the same
  // NodeNames filter after filter: the last answer is kept and reused while the list and the set
  // of nodes are unchanged (one pass of string compares instead of thousands of hash lookups).
  // The memo has its own lock.
  std::shared_ptr<const std::vector<NodeEntry*>> Resolve(const std::vector<std::string>& candidates)
      const ABSL_SHARED_LOCKS_REQUIRED(mu_) ABSL_LOCKS_EXCLUDED(resolve_mu_);

  const ClusterStateOptions options_;
  const Clock* const clock_;  // null: no tombstones
  // Readers (filters planning, reports) share it; informer events and commits hold it alone.
  mutable dynmig::Mutex mu_;
  // Sorted: reports list nodes by name. Entries never move (index_ and plans point at them).
  mutable std::map<std::string, NodeEntry> nodes_ ABSL_GUARDED_BY(mu_);
  mutable uint64_t freed_counter_ ABSL_GUARDED_BY(mu_) = 0;  // NodeEntry::freed_seq's source
  // Hash index over nodes_: a filter looks up thousands of candidates.
  std::unordered_map<std::string, NodeEntry*> index_ ABSL_GUARDED_BY(mu_);
  // NVML model name -> registered MIG GPUs of it.
  std::map<std::string, int> model_count_ ABSL_GUARDED_BY(mu_);
  // Bumped whenever nodes_ gains or loses an entry.
  uint64_t nodes_generation_ ABSL_GUARDED_BY(mu_) = 0;
  mutable dynmig::Mutex resolve_mu_ ABSL_ACQUIRED_AFTER(mu_);  // guards Resolve's memo
  mutable std::vector<std::string> resolved_names_ ABSL_GUARDED_BY(resolve_mu_);
  mutable std::shared_ptr<const std::vector<NodeEntry*>> resolved_entries_
      ABSL_GUARDED_BY(resolve_mu_);
  mutable uint64_t resolved_generation_ ABSL_GUARDED_BY(resolve_mu_) = ~uint64_t{0};
  std::map<std::string, PodEntry> pods_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, AssumedEntry> assumed_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> released_ ABSL_GUARDED_BY(mu_);  // ReleaseUnrealized
  Tombstones tombstones_ ABSL_GUARDED_BY(mu_);
  // Pod key -> the node whose dynmig.io/defrag-reservation names it.
  std::map<std::string, std::string> defrag_holds_ ABSL_GUARDED_BY(mu_);
  // By capability key.
  std::map<std::string, std::shared_ptr<const mig::GpuPlanner>> planners_ ABSL_GUARDED_BY(mu_);
};

// Parses hami.io/node-handshake: "Reported_<time>" (RFC 3339 or "2006-01-02 15:04:05" UTC).
std::optional<absl::Time> ParseHandshakeReported(const std::string& value);

// Whether `after` offers a waiting pod anything `before` did not: the node is healthy and was not,
// a GPU takes reservations and did not (uncordoned, new), a slice a usable GPU occupied is free,
// or fewer defragmentation holds are blocked. More occupied, or freed on an unusable GPU or node:
// no.
bool CapacityGrew(const ClusterState::Occupancy& before, const ClusterState::Occupancy& after);

}  // namespace dynmig::scheduler
