// Planning a whole pod on a node, and choosing the node: GPU choice (binpack/spread, the pod's
// GPU selection hints), containers in order (each sees the reservations of the ones before it),
// one container's instances on one GPU when possible, spread over several otherwise.
//
// Init containers get slices of their own, never shared with app containers: an init container's
// instance is only reclaimed with the pod, so sharing could overlap a live instance
// (docs/design/0001-placement.md). Pure; thread-compatible.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mig/occupancy.h"
#include "mig/planner.h"
#include "mig/request.h"

namespace dynmig::mig {

// One GPU as the scheduler sees it. The fields every decision reads come first, together (a
// cluster-wide search reads thousands of these; the names are read only to explain or filter).
struct GpuView {
  std::shared_ptr<const GpuPlanner> planner;  // null: no allowlisted MIG capability
  GpuUsage usage;
  bool healthy = true;
  // Idle (warm) instances the device plugin keeps (dynmig.io/idle-mig-instances), allowlisted and
  // on free slices: their slices are free in `usage`; among otherwise equal choices a pod lands on
  // them. Empty without warm instances (the plan is then exactly the one without them).
  std::vector<PlannedInstance> idle;
  std::string mode = "mig";  // the registered mode
  std::string uuid;
  uint32_t index = 0;
  std::string model;  // NVML name, for nvidia.com/use-gputype
  std::string unhealthy_reason;
};

struct NodeView {
  std::string name;
  bool healthy = true;
  std::string unhealthy_reason;
  std::vector<GpuView> gpus;
  // A bind to this node is in flight (its hami.io/mutex.lock is held): among nodes that are
  // equally good for the pod, one without a bind in flight is chosen first.
  bool bind_in_flight = false;
};

// What a node can still take, kept beside its view and rebuilt with it (so it follows every
// reservation change of that node alone): a cluster-wide search skips the nodes that cannot fit a
// pod before any per-GPU work.
struct NodeSummary {
  // The largest sizing memory (ProfileSpec::SizingMib: the most a request may ask of it) of an
  // allowlisted profile with a free placement on some schedulable GPU (healthy, in MIG mode); 0
  // when none. Instance-count limits are ignored (an upper bound).
  uint64_t max_placeable_mib = 0;
  // The largest sizing memory of any allowlisted profile of a schedulable GPU, free or not.
  uint64_t max_profile_mib = 0;
  // The most instances the schedulable GPUs hold when empty (GpuPlanner::max_instances summed),
  // and the most they could still take now (each also at most its free units).
  uint64_t max_instances = 0;
  uint64_t free_instances = 0;
};
NodeSummary Summarize(const NodeView& node);

// What planning needs of a request before it looks at any node, computed once per pod in
// O(containers): with it every per-node step is bounded by the node's size, never by the numbers
// in the pod (a pod asking for 50,000 instances is refused per node in constant time).
struct RequestSummary {
  uint64_t instances = 0;            // MIG instances over all containers
  uint64_t max_mib = 0;              // the largest per-instance memory asked in MiB (0: none)
  std::vector<uint32_t> containers;  // indices of the containers that ask for instances
};
RequestSummary SummarizeRequest(const PodRequest& request);

// False when the node certainly cannot take the pod now: an instance asks for more memory (MiB)
// than any free placement offers, or the pod for more instances than the node could still take.
// Instances sized by percentage never rule a node out by their memory.
bool MayFit(const NodeSummary& summary, const RequestSummary& request);
bool MayFit(const NodeSummary& summary, const PodRequest& request);
// False when no release of slices could make the node take the pod (no profile is big enough on
// any schedulable GPU, or more instances than it holds when empty). Conservative like MayFit.
bool MayEverFit(const NodeSummary& summary, const RequestSummary& request);
bool MayEverFit(const NodeSummary& summary, const PodRequest& request);

// One reserved instance of the pod.
struct Assignment {
  uint32_t container = 0;     // index into PodRequest::containers
  uint32_t device_index = 0;  // index within that container's instances
  uint32_t gpu = 0;           // index into NodeView::gpus
  uint32_t profile_index = 0;
  Placement placement;
};

struct GpuOutcome {
  Verdict verdict = Verdict::kFits;
  std::string reason;
};

struct NodePlan {
  Verdict verdict = Verdict::kFits;
  std::vector<Assignment> assignments;
  std::vector<GpuOutcome> gpus;  // per GPU, filled when the node does not fit
  double used_fraction = 0;      // slices in use before this pod, over all MIG GPUs
  uint64_t score = 0;            // summed fragmentation score after the pod (higher is better)
  // Free units left on the GPUs the pod lands on, in 64ths of a GPU (lower is a tighter fit).
  uint32_t leftover = 0;
  bool bind_in_flight = false;  // the node's, for the last tie-break
  uint32_t idle_reused = 0;     // instances that land exactly on an idle (warm) instance
  // A reason about the node as a whole (the pod asks for more instances than its GPUs hold);
  // empty: the per-GPU outcomes explain it.
  std::string reason;
  // GpuPlanner::Plan calls made for this plan: bounded by the node's GPUs and their units,
  // whatever the request (tests check it).
  uint32_t gpu_plans = 0;

  // The reasons are complete: Reason() gives the full text (a plan made for verdicts alone may
  // lack the per-GPU texts).
  bool explained = false;

  bool fits() const { return verdict == Verdict::kFits; }
  // "node-a: fragmented: GPU 0 (GPU-…): ...; GPU 1 ...".
  std::string Reason(const NodeView& node) const;
};

// Whether a verdict is permanent for the pod on that node: no release of slices changes it (no
// profile big enough, none allowlisted, excluded by the pod's GPU hints, no MIG GPU).
bool NeverFits(Verdict verdict);

// Plans the pod on one node, with a reason for every GPU when it does not fit.
NodePlan PlanPodOnNode(const NodeView& node, const PodRequest& request);

struct PodPlan {
  int chosen = -1;  // index into nodes, -1 when no node fits
  std::vector<NodePlan> nodes;
};

struct NodeScratch;
enum class ReasonLevel;

// One pod over its candidate nodes in one pass: every node's verdict, the reasons a caller reports,
// and the winner's assignments, with the per-pod work (the request's shape, buffers) done once.
// Candidates are given in order, each index once, by Plan (planned now), Reuse (a plan made
// earlier on the same node state, e.g. a cache) or Skip (ruled out without planning, e.g. by its
// NodeSummary); the winner is the first best in that order (BetterNode), PlanPod's choice. Only
// the winner so far keeps assignments, in buffers handed from plan to plan, so the pass allocates
// nothing per node on the common path. The session keeps pointers to the request and the views:
// they must outlive it unchanged (Replan takes a changed node's new view).
class PlanSession {
 public:
  enum class Reasons {
    kNone,  // verdicts only (PlanPod)
    // What a scheduler reports: while no node fits, every node is planned with its reasons (nothing
    // may fit, and then each is reported); once one fits, only the reasons of a verdict that never
    // changes (NeverFits) are written. Explain gives any other loser's reason.
    kForLosers,
  };
  PlanSession(const PodRequest& request, size_t candidates, Reasons reasons);
  ~PlanSession();
  PlanSession(PlanSession&&) noexcept;
  PlanSession& operator=(PlanSession&&) noexcept;

  const RequestSummary& shape() const;
  const NodePlan& Plan(size_t i, const NodeView& node);
  void Reuse(size_t i, const NodeView& node, const NodePlan& plan);
  // `node` may be null (an unknown candidate); the candidate does not fit.
  void Skip(size_t i, const NodeView* node);
  // Plans candidate i again on its node's current view (it changed since the pass), recording
  // its assignments; Choose then chooses again over every candidate.
  const NodePlan& Replan(size_t i, const NodeView& node);
  void Choose();

  int chosen() const { return chosen_; }  // -1: nothing fits
  const NodePlan& plan(size_t i) const { return plans_[i]; }
  const std::vector<NodePlan>& plans() const { return plans_; }
  // The chosen plan with its assignments (a reused winner is planned once more to record them);
  // null when nothing fits.
  const NodePlan* Winner();
  // The verdict and reason of candidate i (which does not fit): from the pass when it wrote them,
  // else planned now with every reason (a skipped or reused node, or one planned after a node fit).
  std::pair<Verdict, std::string> Explain(size_t i);
  // Every candidate's plan, the winner's with its assignments; the session is spent.
  std::vector<NodePlan> TakePlans();

 private:
  NodePlan& Fresh(size_t i, const NodeView& node);
  ReasonLevel PassLevel() const;
  void Run(const NodeView& node, ReasonLevel level, NodePlan& plan);
  // Candidate i competes for the choice: the winner keeps its assignments, any other plan's go to
  // spare_.
  void Consider(size_t i);

  std::unique_ptr<NodeScratch> scratch_;
  NodePolicy policy_;
  Reasons reasons_;
  std::vector<const NodeView*> views_;
  std::vector<NodePlan> plans_;
  std::vector<Assignment> spare_;  // an empty assignment buffer with capacity, for the next plan
  int chosen_ = -1;
};

// Plans on every node and picks one. Node policy binpack (the default) is best-fit: the node
// where the pod's GPUs are left with the fewest free slices, then the fullest node; spread picks
// the emptiest node. Remaining ties go to the better fragmentation score, then to the node where
// more of the pod's instances land on idle (warm) instances, then to a node without a bind in
// flight, then to node order.
// Verdicts only (the chosen node's plan carries its assignments): for the reasons of a node that
// does not fit, call PlanPodOnNode on it (Reason needs them), or plan with a PlanSession.
PodPlan PlanPod(std::span<const NodeView> nodes, const PodRequest& request);
// PlanPod's comparison: whether node plan `a` (which fits) is a better choice than `b` (which
// fits) under `policy`; PlanPod keeps the first of equals in node order.
bool BetterNode(const NodePlan& a, const NodePlan& b, NodePolicy policy);
// The same over nodes held elsewhere (the scheduler's cache).
PodPlan PlanPod(std::span<const NodeView* const> nodes, const PodRequest& request);

}  // namespace dynmig::mig
