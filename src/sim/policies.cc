#include "sim/policies.h"

#include <algorithm>
#include <array>
#include <bit>
#include <deque>
#include <limits>
#include <optional>
#include <span>

#include "common/status_macros.h"
#include "common/strings.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "mig/node_planner.h"
#include "mig/planner.h"

namespace dynmig::sim {

using mig::GpuUsage;
using mig::Placement;
using mig::SliceMask;

absl::Status Policy::Violation(uint32_t pod, const std::string& what) const {
  const SimPod& p = pods_[pod];
  const std::string who = p.line > 0 ? fmt::format("pod at trace line {}", p.line)
                                     : fmt::format("generated pod #{}", pod);
  return absl::InternalError(
      fmt::format("invariant violated by policy {} ({}): {}", name_, who, what));
}

absl::Status Policy::PlaceExactly(uint32_t pod, uint32_t /*gpu*/, uint32_t /*profile*/,
                                  mig::Placement /*placement*/) {
  return Violation(pod, "this policy does not place pods at a given placement");
}

absl::Status Policy::Reserve(uint32_t pod, uint32_t /*gpu*/, mig::Placement /*placement*/) {
  return Violation(pod, "this policy does not reserve slices");
}

namespace {

struct Pick {
  uint32_t gpu = 0;
  uint32_t profile = 0;
  Placement placement;
};

struct OrderedPlacement {
  Placement placement;
  SliceMask mask;
};
// [profile index] -> placements in the order a policy tries them.
using PlacementOrder = std::vector<std::vector<OrderedPlacement>>;

PlacementOrder MakeOrder(const ModelGroup& g, bool hami) {
  PlacementOrder order(g.cap().profiles.size());
  for (uint32_t idx : g.planner->allowed()) {
    const auto& spec = g.profile(idx);
    auto& v = order[idx];
    for (const auto& pl : spec.placements) v.push_back({pl, pl.Mask()});
    const bool descending = hami && (spec.name.starts_with("1g.") || spec.name.starts_with("3g."));
    std::stable_sort(v.begin(), v.end(), [&](const OrderedPlacement& a, const OrderedPlacement& b) {
      return descending ? a.placement.start > b.placement.start
                        : a.placement.start < b.placement.start;
    });
  }
  return order;
}

// The first candidate profile (smallest first) with a free placement under `order`.
bool PickOn(const ModelGroup& g, const PlacementOrder& order, const GpuUsage& u,
            const std::vector<uint32_t>& cands, uint32_t& profile, Placement& placement) {
  for (uint32_t p : cands) {
    if (u.counts[p] >= g.profile(p).instance_count) continue;
    for (const auto& op : order[p]) {
      if ((op.mask & u.occupied) == 0) {
        profile = p;
        placement = op.placement;
        return true;
      }
    }
  }
  return false;
}

uint32_t FreeUnits(const ModelGroup& g, const GpuUsage& u) {
  return g.units - static_cast<uint32_t>(std::popcount(u.occupied & mig::FullMask(g.units)));
}

void Apply(GpuUsage& u, uint32_t profile, const Placement& pl) {
  u.occupied |= pl.Mask();
  ++u.counts[profile];
}

std::string ProfileAt(const ModelGroup& g, uint32_t profile, const Placement& pl) {
  return fmt::format("{} at slices {}", g.profile(profile).name, pl.ToString());
}

// ---------------------------------------------------------------------------------------------
// Dynamic policies: every GPU is a mask + per-profile counts; instances are created on demand.
class DynamicBase : public Policy {
 public:
  DynamicBase(std::string name, const Cluster& cluster, const std::vector<SimPod>& pods)
      : Policy(std::move(name), cluster, pods) {
    usage_.assign(cluster.gpu_count(), GpuUsage{});
    size_t slots = 0;
    for (const auto& p : pods) slots = std::max<size_t>(slots, p.inst_offset + p.count);
    inst_.assign(slots, Inst{});
    node_of_.assign(pods.size(), 0);
    live_.assign(pods.size(), 0);
    scratch_.assign(cluster.gpus_per_node, GpuUsage{});
    reserved_.assign(cluster.gpu_count(), 0);
    for (const auto& g : cluster.groups) {
      asc_.push_back(MakeOrder(g, false));
      hami_.push_back(MakeOrder(g, true));
    }
  }

  absl::Status PlaceExactly(uint32_t pod, uint32_t gpu, uint32_t profile,
                            Placement placement) override {
    picks_[0] = {gpu, profile, placement};
    npicks_ = 1;
    return Commit(pod);
  }

  absl::Status Reserve(uint32_t pod, uint32_t gpu, Placement placement) override {
    if (gpu >= cluster_.gpu_count())
      return Violation(pod, fmt::format("GPU {} does not exist", gpu));
    const SliceMask m = placement.Mask();
    if ((reserved_[gpu] & m) != 0) {
      return Violation(
          pod, fmt::format("slices {} of GPU {} are already reserved", placement.ToString(), gpu));
    }
    reserved_[gpu] |= m;
    reservations_.push_back({pod, gpu, m});
    OnChange(gpu);
    return absl::OkStatus();
  }

  void Unreserve(uint32_t gpu, Placement placement) override {
    const SliceMask m = placement.Mask();
    for (size_t i = 0; i < reservations_.size(); ++i) {
      if (reservations_[i].gpu == gpu && reservations_[i].mask == m) {
        reservations_.erase(reservations_.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    }
    reserved_[gpu] &= ~m;
    OnChange(gpu);
  }

  absl::Status Remove(uint32_t pod) override {
    const SimPod& sp = pods_[pod];
    if (!live_[pod]) return Violation(pod, "removing a pod that is not placed");
    live_[pod] = 0;
    for (uint32_t k = 0; k < sp.count; ++k) {
      const Inst& in = inst_[sp.inst_offset + k];
      const ModelGroup& g = cluster_.group_of_gpu(in.gpu);
      GpuUsage& u = usage_[in.gpu];
      const SliceMask m = in.placement.Mask();
      if ((u.occupied & m) != m || u.counts[in.profile] == 0) {
        return Violation(pod, fmt::format("releasing {} on GPU {}, which does not hold it",
                                          ProfileAt(g, in.profile, in.placement), in.gpu));
      }
      u.occupied &= ~m;
      --u.counts[in.profile];
      used_units_ -= in.placement.size;
      DYNMIG_ASSIGN_OR_RETURN(const bool kept, KeepIdle(pod, in));
      if (!kept) ++destroys_;
      OnRelease(sp.inst_offset + k);
      OnChange(in.gpu);
    }
    return absl::OkStatus();
  }

  void Fragmentation(uint32_t percent, uint64_t& free, uint64_t& stranded) const override {
    for (const auto& g : cluster_.groups) {
      const SliceMask full = mig::FullMask(g.units);
      for (uint32_t gpu = g.first_gpu; gpu < g.first_gpu + g.gpus; ++gpu) {
        const SliceMask f = full & ~(usage_[gpu].occupied | reserved_[gpu]);
        if (f == 0) continue;
        const uint32_t n = static_cast<uint32_t>(std::popcount(f));
        free += n;
        if (!CanHostOn(g, gpu, percent, f)) stranded += n;
      }
    }
  }

  uint32_t NodeOf(uint32_t pod) const override { return node_of_[pod]; }

  std::vector<LiveInstance> Snapshot() const override {
    std::vector<LiveInstance> out;
    for (uint32_t pod = 0; pod < pods_.size(); ++pod) {
      if (!live_[pod]) continue;
      for (uint32_t k = 0; k < pods_[pod].count; ++k) {
        const Inst& in = inst_[pods_[pod].inst_offset + k];
        out.push_back({pod, in.gpu, in.profile, in.placement});
      }
    }
    return out;
  }

  std::vector<uint32_t> GpusOf(uint32_t pod) const override {
    std::vector<uint32_t> out;
    if (pod >= pods_.size() || !live_[pod]) return out;
    for (uint32_t k = 0; k < pods_[pod].count; ++k) {
      out.push_back(inst_[pods_[pod].inst_offset + k].gpu);
    }
    return out;
  }

 protected:
  struct Inst {
    uint32_t gpu = 0;
    uint32_t profile = 0;
    Placement placement;
  };

  virtual bool CanHostOn(const ModelGroup& g, uint32_t /*gpu*/, uint32_t percent,
                         SliceMask free) const {
    return g.CanHost(percent, free);
  }
  virtual void OnChange(uint32_t /*gpu*/) {}
  virtual void OnRelease(uint32_t /*inst*/) {}
  // A released instance (its slices already freed): true when it stays idle (warm instances),
  // false when it is destroyed.
  virtual absl::StatusOr<bool> KeepIdle(uint32_t /*pod*/, const Inst& /*in*/) { return false; }
  // Before a new instance `p` is applied (checked against the live ones): true when it is exactly
  // an idle instance, which the pod reuses (nothing created); idle instances it overlaps are
  // destroyed first.
  virtual absl::StatusOr<bool> ClaimIdle(uint32_t /*pod*/, const Pick& /*p*/) { return false; }

  // Checks picks_[0..npicks_) against the live state and applies them.
  absl::Status Commit(uint32_t pod) {
    const SimPod& sp = pods_[pod];
    if (npicks_ != sp.count) {
      return Violation(pod,
                       fmt::format("{} instance(s) planned for {} requested", npicks_, sp.count));
    }
    const uint32_t node = cluster_.gpu_node[picks_[0].gpu];
    for (uint32_t k = 0; k < npicks_; ++k) {
      const Pick& p = picks_[k];
      DYNMIG_RETURN_IF_ERROR(Check(pod, p, node));
      DYNMIG_ASSIGN_OR_RETURN(const bool reused, ClaimIdle(pod, p));
      GpuUsage& u = usage_[p.gpu];
      Apply(u, p.profile, p.placement);
      used_units_ += p.placement.size;
      if (!reused) ++creates_;
      inst_[sp.inst_offset + k] = {p.gpu, p.profile, p.placement};
      OnChange(p.gpu);
    }
    node_of_[pod] = node;
    live_[pod] = 1;
    return absl::OkStatus();
  }

  // The invariants of one new instance: allowlisted, large enough, legal, free, under its limit,
  // on the pod's node.
  absl::Status Check(uint32_t pod, const Pick& p, uint32_t node) const {
    if (p.gpu >= cluster_.gpu_count()) {
      return Violation(pod, fmt::format("GPU {} does not exist", p.gpu));
    }
    const ModelGroup& g = cluster_.group_of_gpu(p.gpu);
    if (p.profile >= g.local.size() || g.local[p.profile] < 0) {
      return Violation(
          pod, fmt::format("profile #{} is not allowlisted on {}", p.profile, g.cap().model));
    }
    const auto& spec = g.profile(p.profile);
    if (cluster_.gpu_node[p.gpu] != node) {
      return Violation(pod, "instances of one pod on different nodes");
    }
    if (spec.SizingMib() < mig::ResolveMemory(0, pods_[pod].percent, g.cap())) {
      return Violation(
          pod, fmt::format("{} is smaller than the {}% asked", spec.name, pods_[pod].percent));
    }
    if (!spec.IsLegal(p.placement)) {
      return Violation(pod, fmt::format("{} is not a legal placement on {}",
                                        ProfileAt(g, p.profile, p.placement), g.cap().model));
    }
    const GpuUsage& u = usage_[p.gpu];
    if ((u.occupied & p.placement.Mask()) != 0) {
      return Violation(pod, fmt::format("{} on GPU {} overlaps occupied slices (mask {:#x})",
                                        ProfileAt(g, p.profile, p.placement), p.gpu, u.occupied));
    }
    if ((reserved_[p.gpu] & p.placement.Mask()) != 0) {
      for (const auto& r : reservations_) {
        if (r.gpu == p.gpu && (r.mask & p.placement.Mask()) != 0 && r.pod != pod) {
          return Violation(pod, fmt::format("{} on GPU {} takes slices reserved for pod #{}",
                                            ProfileAt(g, p.profile, p.placement), p.gpu, r.pod));
        }
      }
    }
    if (u.counts[p.profile] >= spec.instance_count) {
      return Violation(pod, fmt::format("GPU {} already holds {} instance(s) of {}, the limit",
                                        p.gpu, u.counts[p.profile], spec.name));
    }
    return absl::OkStatus();
  }

  std::vector<GpuUsage> usage_;
  std::vector<Inst> inst_;
  std::vector<uint32_t> node_of_;
  std::vector<uint8_t> live_;
  std::vector<GpuUsage> scratch_;  // one node's GPUs, while planning
  // Slices reserved for a pod (a move's freed slices): no other pod is placed over them.
  struct Resv {
    uint32_t pod;
    uint32_t gpu;
    SliceMask mask;
  };
  std::vector<SliceMask> reserved_;  // per GPU
  std::vector<Resv> reservations_;
  std::array<Pick, kMaxInstancesPerPod> picks_{};
  uint32_t npicks_ = 0;
  std::vector<PlacementOrder> asc_, hami_;  // by group
};

// ---------------------------------------------------------------------------------------------
// dynmig: the production planner.
class DynmigPolicy : public DynamicBase {
 public:
  DynmigPolicy(std::string name, const Cluster& cluster, const std::vector<SimPod>& pods,
               mig::GpuPolicy gpu_policy, mig::NodePolicy node_policy, uint32_t bind_window,
               const WarmConfig* warm)
      : DynamicBase(std::move(name), cluster, pods), bind_window_(bind_window) {
    if (warm != nullptr) {
      warm_.enabled = true;
      ttl_ = absl::ToDoubleSeconds(warm->ttl);
      max_idle_ = warm->max_per_gpu;
      idle_.resize(cluster.gpu_count());
    }
    for (uint32_t n = 0; n < cluster.node_count(); ++n) {
      const ModelGroup& g = cluster.group_of_node(n);
      mig::NodeView view;
      view.name = fmt::format("node-{}", n);
      for (uint32_t k = 0; k < cluster.node_gpus[n]; ++k) {
        mig::GpuView gv;
        gv.uuid = fmt::format("GPU-{}", cluster.node_first_gpu[n] + k);
        gv.index = k;
        gv.model = g.cap().model;
        gv.planner = g.planner;
        view.gpus.push_back(std::move(gv));
      }
      nodes_.push_back(std::move(view));
    }
    uint32_t classes = 0;
    for (const auto& p : pods) classes = std::max(classes, p.cls + 1);
    requests_.resize(classes);
    for (const auto& p : pods) {
      mig::PodRequest& r = requests_[p.cls];
      if (!r.containers.empty()) continue;
      mig::ContainerRequest c;
      c.name = "main";
      c.count = p.count;
      c.memory.percent = p.percent;
      r.containers.push_back(c);
      r.gpu_policy = gpu_policy;
      r.node_policy = node_policy;
    }
  }

  absl::StatusOr<bool> Place(uint32_t pod, int32_t node) override {
    const mig::PodRequest& req = requests_[pods_[pod].cls];
    if (node < 0) {
      mig::PodPlan plan = mig::PlanPod(nodes_, req);
      if (plan.chosen < 0) return false;
      if (bind_window_ > 0) {
        // The nodes of the last bind_window_ placements have a bind in flight (their lock held
        // until the device plugin's Allocate), as in a burst.
        for (uint32_t n : in_flight_) nodes_[n].bind_in_flight = false;
        in_flight_.push_back(static_cast<uint32_t>(plan.chosen));
        if (in_flight_.size() > bind_window_) in_flight_.erase(in_flight_.begin());
        for (uint32_t n : in_flight_) nodes_[n].bind_in_flight = true;
      }
      return Take(pod, static_cast<uint32_t>(plan.chosen), plan.nodes[plan.chosen]);
    }
    mig::NodePlan plan = mig::PlanPodOnNode(nodes_[node], req);
    if (!plan.fits()) return false;
    return Take(pod, static_cast<uint32_t>(node), plan);
  }

 private:
  absl::StatusOr<bool> Take(uint32_t pod, uint32_t node, const mig::NodePlan& plan) {
    if (plan.assignments.size() > kMaxInstancesPerPod) {
      return Violation(pod, fmt::format("{} instances planned", plan.assignments.size()));
    }
    npicks_ = 0;
    for (const auto& a : plan.assignments) {
      if (a.gpu >= cluster_.node_gpus[node]) {
        return Violation(pod, fmt::format("planned GPU {} is not on node {}", a.gpu, node));
      }
      picks_[npicks_++] = {cluster_.node_first_gpu[node] + a.gpu, a.profile_index, a.placement};
    }
    DYNMIG_RETURN_IF_ERROR(Commit(pod));
    if (warm_.enabled) {
      for (uint32_t k = 0; k < npicks_; ++k) DYNMIG_RETURN_IF_ERROR(CheckIdle(pod, picks_[k].gpu));
    }
    return true;
  }

  void OnChange(uint32_t gpu) override {
    const uint32_t node = cluster_.gpu_node[gpu];
    GpuUsage& view = nodes_[node].gpus[gpu - cluster_.node_first_gpu[node]].usage;
    view = usage_[gpu];
    view.occupied |= reserved_[gpu];  // reserved slices are taken for everyone else
  }

 public:
  const DefragConfig* defrag() const override { return defrag_ ? &*defrag_ : nullptr; }
  void EnableDefrag(const DefragConfig& config) { defrag_ = config; }

  bool MayMoveFor(uint32_t pod) override {
    const mig::PodPlan plan = mig::PlanPod(nodes_, requests_[pods_[pod].cls]);
    if (plan.chosen >= 0 || !defrag_) return false;
    if (defrag_->trigger == DefragConfig::Trigger::kWaiting) return true;
    if (std::any_of(plan.nodes.begin(), plan.nodes.end(), [](const mig::NodePlan& n) {
          return n.verdict == mig::Verdict::kFragmented;
        })) {
      return true;
    }
    if (defrag_->trigger != DefragConfig::Trigger::kNodeTotal) return false;
    // Fragmentation across GPUs: some node has the free slices in total.
    for (uint32_t n = 0; n < cluster_.node_count(); ++n) {
      const ModelGroup& g = cluster_.group_of_node(n);
      if (g.candidates[pods_[pod].percent].empty()) continue;
      uint32_t free = 0;
      for (uint32_t i = 0; i < cluster_.node_gpus[n]; ++i) {
        const uint32_t gpu = cluster_.node_first_gpu[n] + i;
        free += g.units - static_cast<uint32_t>(std::popcount(
                              (usage_[gpu].occupied | reserved_[gpu]) & mig::FullMask(g.units)));
      }
      if (free >= pods_[pod].asked_units) return true;
    }
    return false;
  }

  bool MovedPodsFit(const std::vector<uint32_t>& evict, uint32_t gpu,
                    Placement placement) override {
    // Tried on the planner's own view, every change undone before returning.
    undo_.clear();
    auto touch = [&](GpuUsage& u) -> GpuUsage& {
      undo_.push_back({&u, u});
      return u;
    };
    bool fits = true;
    for (uint32_t e : evict) {
      if (!live_[e]) fits = false;
      for (uint32_t k = 0; fits && k < pods_[e].count; ++k) {
        const Inst& in = inst_[pods_[e].inst_offset + k];
        GpuUsage& u = touch(ViewUsage(in.gpu));
        u.occupied &= ~in.placement.Mask();
        if (u.counts[in.profile] > 0) --u.counts[in.profile];
      }
    }
    if (fits) touch(ViewUsage(gpu)).occupied |= placement.Mask();
    for (size_t i = 0; fits && i < evict.size(); ++i) {
      const mig::PodPlan plan = mig::PlanPod(nodes_, requests_[pods_[evict[i]].cls]);
      if (plan.chosen < 0) {
        fits = false;
        break;
      }
      mig::NodeView& node = nodes_[static_cast<size_t>(plan.chosen)];
      for (const auto& a : plan.nodes[plan.chosen].assignments) {
        if (a.gpu >= node.gpus.size()) {
          fits = false;
          break;
        }
        GpuUsage& u = touch(node.gpus[a.gpu].usage);
        u.occupied |= a.placement.Mask();
        ++u.counts[a.profile_index];
      }
    }
    for (size_t i = undo_.size(); i-- > 0;) *undo_[i].first = undo_[i].second;
    undo_.clear();
    return fits;
  }

 private:
  GpuUsage& ViewUsage(uint32_t gpu) {
    const uint32_t node = cluster_.gpu_node[gpu];
    return nodes_[node].gpus[gpu - cluster_.node_first_gpu[node]].usage;
  }

  std::vector<std::pair<GpuUsage*, GpuUsage>> undo_;  // MovedPodsFit's changes to the view
  std::optional<DefragConfig> defrag_;

 public:
  // Warm instances -------------------------------------------------------------------------------

  void AdvanceTo(double t) override {
    if (!warm_.enabled) return;
    now_ = std::max(now_, t);
    // Instances go idle in time order, so their expiries are in order too; an entry whose instance
    // was reused or destroyed since is skipped.
    while (!expiry_.empty() && expiry_.front().time <= now_) {
      const Expiry e = expiry_.front();
      expiry_.pop_front();
      auto& list = idle_[e.gpu];
      for (size_t i = 0; i < list.size(); ++i) {
        if (list[i].seq == e.seq) {
          list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
          ++destroys_;
          ++warm_.destroyed_ttl;
          --warm_.idle_at_end;
          SyncIdle(e.gpu);
          break;
        }
      }
    }
  }

  std::vector<LiveInstance> IdleSnapshot() const override {
    std::vector<LiveInstance> out;
    for (uint32_t gpu = 0; gpu < idle_.size(); ++gpu) {
      for (const auto& i : idle_[gpu]) {
        out.push_back({i.last_pod, gpu, i.inst.profile_index, i.inst.placement});
      }
    }
    return out;
  }

 private:
  struct Idle {
    mig::PlannedInstance inst;
    uint64_t seq = 0;  // identifies it in expiry_
    uint32_t last_pod = 0;
  };
  struct Expiry {
    double time;
    uint32_t gpu;
    uint64_t seq;
  };

  // The planner's view of a GPU's idle instances follows idle_.
  void SyncIdle(uint32_t gpu) {
    const uint32_t node = cluster_.gpu_node[gpu];
    auto& view = nodes_[node].gpus[gpu - cluster_.node_first_gpu[node]].idle;
    view.clear();
    for (const auto& i : idle_[gpu]) view.push_back(i.inst);
  }

  // As the device plugin: the ended pod's instance stays idle while its GPU keeps fewer than the
  // cap; otherwise it is destroyed.
  absl::StatusOr<bool> KeepIdle(uint32_t pod, const Inst& in) override {
    if (!warm_.enabled) return false;
    auto& list = idle_[in.gpu];
    if (list.size() >= max_idle_) {
      ++warm_.destroyed_cap;
      return false;
    }
    const SliceMask m = in.placement.Mask();
    for (const auto& i : list) {
      if ((i.inst.placement.Mask() & m) != 0) {
        return Violation(
            pod, fmt::format("the released {} on GPU {} overlaps an idle {}",
                             ProfileAt(cluster_.group_of_gpu(in.gpu), in.profile, in.placement),
                             in.gpu, i.inst.placement.ToString()));
      }
    }
    list.push_back({{in.profile, in.placement}, ++seq_, pod});
    expiry_.push_back({now_ + ttl_, in.gpu, seq_});
    ++warm_.kept;
    ++warm_.idle_at_end;  // idle now; what is left at the end of the run
    SyncIdle(in.gpu);
    return true;
  }

  // Exactly an idle instance: reused. Overlapping idle instances: destroyed first (their NVML
  // time is this pod's, as in the device plugin's Allocate).
  absl::StatusOr<bool> ClaimIdle(uint32_t /*pod*/, const Pick& p) override {
    if (!warm_.enabled || idle_[p.gpu].empty()) return false;
    auto& list = idle_[p.gpu];
    const SliceMask m = p.placement.Mask();
    bool reused = false;
    for (size_t i = 0; i < list.size();) {
      const auto& in = list[i].inst;
      if ((in.placement.Mask() & m) == 0) {
        ++i;
        continue;
      }
      if (in.profile_index == p.profile && in.placement == p.placement) {
        reused = true;
        ++warm_.reused;
      } else {
        ++destroys_;
        ++warm_.destroyed_needed;
      }
      list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
      --warm_.idle_at_end;
    }
    SyncIdle(p.gpu);
    return reused;
  }

  // No idle instance overlaps a live one or another idle one.
  absl::Status CheckIdle(uint32_t pod, uint32_t gpu) const {
    SliceMask seen = 0;
    for (const auto& i : idle_[gpu]) {
      const SliceMask m = i.inst.placement.Mask();
      if ((m & usage_[gpu].occupied) != 0 || (m & seen) != 0) {
        return Violation(
            pod, fmt::format(
                     "idle {} on GPU {} overlaps {}",
                     ProfileAt(cluster_.group_of_gpu(gpu), i.inst.profile_index, i.inst.placement),
                     gpu, (m & seen) != 0 ? "another idle instance" : "a live instance"));
      }
      seen |= m;
    }
    return absl::OkStatus();
  }

  std::vector<mig::NodeView> nodes_;
  std::vector<mig::PodRequest> requests_;  // by class
  const uint32_t bind_window_;
  std::vector<uint32_t> in_flight_;  // nodes of the last bind_window_ placements
  // Warm instances (warm_.enabled).
  double ttl_ = 0;
  uint32_t max_idle_ = 0;
  double now_ = 0;
  uint64_t seq_ = 0;
  std::vector<std::vector<Idle>> idle_;  // per GPU, oldest first
  std::deque<Expiry> expiry_;
};

// ---------------------------------------------------------------------------------------------
// Node-level planning shared by the hand-written dynamic baselines: `count` instances on one node,
// one at a time, each on the GPU `choose` returns (index within the node, or -1).
template <typename Choose>
bool PlanOnNode(const Cluster& cluster, uint32_t node, uint32_t count,
                std::vector<GpuUsage>& scratch, const std::vector<GpuUsage>& usage,
                std::array<Pick, kMaxInstancesPerPod>& picks, uint32_t& npicks, Choose&& choose) {
  const uint32_t first = cluster.node_first_gpu[node];
  const uint32_t m = cluster.node_gpus[node];
  for (uint32_t i = 0; i < m; ++i) scratch[i] = usage[first + i];
  npicks = 0;
  for (uint32_t k = 0; k < count; ++k) {
    uint32_t profile = 0;
    Placement pl;
    const int32_t i = choose(first, m, profile, pl);
    if (i < 0) return false;
    Apply(scratch[i], profile, pl);
    picks[npicks++] = {first + static_cast<uint32_t>(i), profile, pl};
  }
  return true;
}

class FirstFitPolicy : public DynamicBase {
 public:
  using DynamicBase::DynamicBase;

  absl::StatusOr<bool> Place(uint32_t pod, int32_t node) override {
    const SimPod& sp = pods_[pod];
    if (sp.count == 1) {
      const uint32_t lo = node < 0 ? 0 : cluster_.node_first_gpu[node];
      const uint32_t hi = node < 0 ? cluster_.gpu_count() : lo + cluster_.node_gpus[node];
      for (uint32_t gpu = lo; gpu < hi; ++gpu) {
        const uint32_t gi = cluster_.gpu_group[gpu];
        const ModelGroup& g = cluster_.groups[gi];
        Pick& p = picks_[0];
        if (PickOn(g, asc_[gi], usage_[gpu], g.candidates[sp.percent], p.profile, p.placement)) {
          p.gpu = gpu;
          npicks_ = 1;
          DYNMIG_RETURN_IF_ERROR(Commit(pod));
          return true;
        }
      }
      return false;
    }
    const uint32_t lo = node < 0 ? 0 : node;
    const uint32_t hi = node < 0 ? cluster_.node_count() : node + 1;
    for (uint32_t n = lo; n < hi; ++n) {
      const uint32_t gi = cluster_.gpu_group[cluster_.node_first_gpu[n]];
      const ModelGroup& g = cluster_.groups[gi];
      const auto& cands = g.candidates[sp.percent];
      auto choose = [&](uint32_t, uint32_t m, uint32_t& profile, Placement& pl) -> int32_t {
        for (uint32_t i = 0; i < m; ++i) {
          if (PickOn(g, asc_[gi], scratch_[i], cands, profile, pl)) return static_cast<int32_t>(i);
        }
        return -1;
      };
      if (PlanOnNode(cluster_, n, sp.count, scratch_, usage_, picks_, npicks_, choose)) {
        DYNMIG_RETURN_IF_ERROR(Commit(pod));
        return true;
      }
    }
    return false;
  }
};

class BestFitPolicy : public DynamicBase {
 public:
  using DynamicBase::DynamicBase;

  absl::StatusOr<bool> Place(uint32_t pod, int32_t node) override {
    const SimPod& sp = pods_[pod];
    if (sp.count == 1) {
      const uint32_t lo = node < 0 ? 0 : cluster_.node_first_gpu[node];
      const uint32_t hi = node < 0 ? cluster_.gpu_count() : lo + cluster_.node_gpus[node];
      uint32_t best_free = std::numeric_limits<uint32_t>::max();
      Pick best;
      for (uint32_t gpu = lo; gpu < hi; ++gpu) {
        const uint32_t gi = cluster_.gpu_group[gpu];
        const ModelGroup& g = cluster_.groups[gi];
        const uint32_t f = FreeUnits(g, usage_[gpu]);
        if (f == 0 || f >= best_free) continue;
        Pick p;
        if (PickOn(g, asc_[gi], usage_[gpu], g.candidates[sp.percent], p.profile, p.placement)) {
          p.gpu = gpu;
          best = p;
          best_free = f;
        }
      }
      if (best_free == std::numeric_limits<uint32_t>::max()) return false;
      picks_[0] = best;
      npicks_ = 1;
      DYNMIG_RETURN_IF_ERROR(Commit(pod));
      return true;
    }
    const uint32_t lo = node < 0 ? 0 : node;
    const uint32_t hi = node < 0 ? cluster_.node_count() : node + 1;
    uint64_t best_free = std::numeric_limits<uint64_t>::max();
    std::array<Pick, kMaxInstancesPerPod> best{};
    for (uint32_t n = lo; n < hi; ++n) {
      const uint32_t gi = cluster_.gpu_group[cluster_.node_first_gpu[n]];
      const ModelGroup& g = cluster_.groups[gi];
      uint64_t node_free = 0;
      for (uint32_t i = 0; i < cluster_.node_gpus[n]; ++i) {
        node_free += FreeUnits(g, usage_[cluster_.node_first_gpu[n] + i]);
      }
      if (node_free >= best_free) continue;
      const auto& cands = g.candidates[sp.percent];
      auto choose = [&](uint32_t, uint32_t m, uint32_t& profile, Placement& pl) -> int32_t {
        int32_t pick = -1;
        uint32_t pick_free = std::numeric_limits<uint32_t>::max();
        for (uint32_t i = 0; i < m; ++i) {
          const uint32_t f = FreeUnits(g, scratch_[i]);
          if (f == 0 || f >= pick_free) continue;
          uint32_t pr = 0;
          Placement pp;
          if (PickOn(g, asc_[gi], scratch_[i], cands, pr, pp)) {
            pick = static_cast<int32_t>(i);
            pick_free = f;
            profile = pr;
            pl = pp;
          }
        }
        return pick;
      };
      if (PlanOnNode(cluster_, n, sp.count, scratch_, usage_, picks_, npicks_, choose)) {
        best_free = node_free;
        best = picks_;
      }
    }
    if (best_free == std::numeric_limits<uint64_t>::max()) return false;
    picks_ = best;
    npicks_ = sp.count;
    DYNMIG_RETURN_IF_ERROR(Commit(pod));
    return true;
  }
};

// gpuplanner:best-fit: the production GpuPlanner::Plan decides profile and placement inside a GPU;
// the GPU is the one with the fewest free slices where Plan fits (an experiment for tuning the
// node/GPU choice, not a shipped path).
class PlannerBestFitPolicy : public DynamicBase {
 public:
  using DynamicBase::DynamicBase;

  absl::StatusOr<bool> Place(uint32_t pod, int32_t node) override {
    const SimPod& sp = pods_[pod];
    const uint32_t lo_node = node < 0 ? 0 : node;
    const uint32_t hi_node = node < 0 ? cluster_.node_count() : node + 1;
    if (sp.count == 1) {
      const uint32_t lo = cluster_.node_first_gpu[lo_node];
      const uint32_t hi = cluster_.node_first_gpu[hi_node - 1] + cluster_.node_gpus[hi_node - 1];
      uint32_t best_free = std::numeric_limits<uint32_t>::max();
      Pick best;
      for (uint32_t gpu = lo; gpu < hi; ++gpu) {
        const ModelGroup& g = cluster_.group_of_gpu(gpu);
        const uint32_t f = FreeUnits(g, usage_[gpu]);
        if (f == 0 || f >= best_free || g.candidates[sp.percent].empty()) continue;
        if (PlanOn(g, usage_[gpu], sp.percent, best.profile, best.placement)) {
          best.gpu = gpu;
          best_free = f;
        }
      }
      if (best_free == std::numeric_limits<uint32_t>::max()) return false;
      picks_[0] = best;
      npicks_ = 1;
      DYNMIG_RETURN_IF_ERROR(Commit(pod));
      return true;
    }
    uint64_t best_free = std::numeric_limits<uint64_t>::max();
    std::array<Pick, kMaxInstancesPerPod> best{};
    for (uint32_t n = lo_node; n < hi_node; ++n) {
      const ModelGroup& g = cluster_.group_of_node(n);
      if (g.candidates[sp.percent].empty()) continue;
      uint64_t node_free = 0;
      for (uint32_t i = 0; i < cluster_.node_gpus[n]; ++i) {
        node_free += FreeUnits(g, usage_[cluster_.node_first_gpu[n] + i]);
      }
      if (node_free >= best_free) continue;
      auto choose = [&](uint32_t, uint32_t m, uint32_t& profile, Placement& pl) -> int32_t {
        int32_t pick = -1;
        uint32_t pick_free = std::numeric_limits<uint32_t>::max();
        for (uint32_t i = 0; i < m; ++i) {
          const uint32_t f = FreeUnits(g, scratch_[i]);
          if (f == 0 || f >= pick_free) continue;
          uint32_t pr = 0;
          Placement pp;
          if (PlanOn(g, scratch_[i], sp.percent, pr, pp)) {
            pick = static_cast<int32_t>(i);
            pick_free = f;
            profile = pr;
            pl = pp;
          }
        }
        return pick;
      };
      if (PlanOnNode(cluster_, n, sp.count, scratch_, usage_, picks_, npicks_, choose)) {
        best_free = node_free;
        best = picks_;
      }
    }
    if (best_free == std::numeric_limits<uint64_t>::max()) return false;
    picks_ = best;
    npicks_ = sp.count;
    DYNMIG_RETURN_IF_ERROR(Commit(pod));
    return true;
  }

 private:
  static bool PlanOn(const ModelGroup& g, const GpuUsage& u, uint32_t percent, uint32_t& profile,
                     Placement& pl) {
    const uint64_t mem = mig::ResolveMemory(0, percent, g.cap());
    const mig::GpuPlan plan = g.planner->Plan(u, std::span<const uint64_t>(&mem, 1), {});
    if (plan.verdict != mig::Verdict::kFits || plan.instances.size() != 1) return false;
    profile = plan.instances[0].profile_index;
    pl = plan.instances[0].placement;
    return true;
  }
};

// The longest run of free units in `occupied` (of `units`).
uint32_t LargestFreeRun(SliceMask occupied, uint32_t units) {
  uint32_t best = 0, run = 0;
  for (uint32_t b = 0; b < units; ++b) {
    run = ((occupied >> b) & 1u) ? 0 : run + 1;
    best = std::max(best, run);
  }
  return best;
}

// HAMi after PR #2855 (reference study, section 8): the smallest covering profile with a free
// placement, as before; among its free placements the one that leaves the largest free run, then
// the most legal placements of the allowlisted profiles still free (within their instance
// limits), then the lowest start.
bool PickNewest(const ModelGroup& g, const PlacementOrder& asc, const GpuUsage& u,
                const std::vector<uint32_t>& cands, uint32_t& profile, Placement& placement) {
  for (uint32_t p : cands) {
    if (u.counts[p] >= g.profile(p).instance_count) continue;
    bool found = false;
    uint32_t best_run = 0, best_left = 0;
    for (const auto& op : asc[p]) {  // by start ascending: ties keep the lowest start
      if ((op.mask & u.occupied) != 0) continue;
      const SliceMask after = u.occupied | op.mask;
      const uint32_t run = LargestFreeRun(after, g.units);
      uint32_t left = 0;
      for (uint32_t q : g.planner->allowed()) {
        if (u.counts[q] + (q == p ? 1u : 0u) >= g.profile(q).instance_count) continue;
        for (const auto& oq : asc[q]) left += (oq.mask & after) == 0 ? 1u : 0u;
      }
      if (!found || run > best_run || (run == best_run && left > best_left)) {
        found = true;
        best_run = run;
        best_left = left;
        profile = p;
        placement = op.placement;
      }
    }
    if (found) return true;
  }
  return false;
}

// HAMi v2.10 (reference study, section 2.3-2.4): nodes binpack by the node score before the pod,
// GPUs in spread order (emptiest first by the GPU score), instances of one container stay on a
// GPU until it is full, profile = smallest covering one with a free placement, placements by the
// name-prefix rule.
class HamiPolicy : public DynamicBase {
 public:
  // `newest`: per GPU, PR #2855's placement scoring (PickNewest) instead of the name-prefix order.
  HamiPolicy(std::string name, const Cluster& cluster, const std::vector<SimPod>& pods, bool newest)
      : DynamicBase(std::move(name), cluster, pods), newest_(newest) {
    order_.resize(cluster.gpus_per_node);
    gpu_score_.resize(cluster.gpus_per_node);
  }

  absl::StatusOr<bool> Place(uint32_t pod, int32_t node) override {
    const SimPod& sp = pods_[pod];
    if (node >= 0) {
      if (!PlanNode(sp, static_cast<uint32_t>(node))) return false;
      DYNMIG_RETURN_IF_ERROR(Commit(pod));
      return true;
    }
    double best_score = -1;
    std::array<Pick, kMaxInstancesPerPod> best{};
    for (uint32_t n = 0; n < cluster_.node_count(); ++n) {
      if (!PlanNode(sp, n)) continue;
      const double s = NodeScore(n);
      if (s > best_score) {
        best_score = s;
        best = picks_;
      }
    }
    if (best_score < 0) return false;
    picks_ = best;
    npicks_ = sp.count;
    DYNMIG_RETURN_IF_ERROR(Commit(pod));
    return true;
  }

 private:
  // used/Count + cores/100 + memory/total (HAMi's DeviceListsScore without the request's part,
  // which is the same for every GPU).
  double GpuScore(const ModelGroup& g, const GpuUsage& u) const {
    uint32_t used = 0, cores = 0;
    uint64_t mem = 0;
    for (uint32_t idx : g.planner->allowed()) {
      const uint32_t n = u.counts[idx];
      if (n == 0) continue;
      used += n;
      cores += n * g.Core(idx);
      mem += n * g.profile(idx).memory_mib;
    }
    const double total_mem = static_cast<double>(std::max<uint64_t>(g.cap().total_memory_mib, 1));
    return static_cast<double>(used) / std::max(g.device_count, 1u) + cores / 100.0 +
           static_cast<double>(mem) / total_mem;
  }

  double NodeScore(uint32_t n) const {
    const ModelGroup& g = cluster_.group_of_node(n);
    double s = 0;
    for (uint32_t i = 0; i < cluster_.node_gpus[n]; ++i) {
      s += GpuScore(g, usage_[cluster_.node_first_gpu[n] + i]);
    }
    return s / cluster_.node_gpus[n];
  }

  bool PlanNode(const SimPod& sp, uint32_t n) {
    const uint32_t gi = cluster_.gpu_group[cluster_.node_first_gpu[n]];
    const ModelGroup& g = cluster_.groups[gi];
    const auto& cands = g.candidates[sp.percent];
    if (cands.empty()) return false;
    const uint32_t first = cluster_.node_first_gpu[n];
    const uint32_t m = cluster_.node_gpus[n];
    const uint32_t need = sp.count * g.profile(cands.front()).memory_slices;
    uint32_t free = 0;
    for (uint32_t i = 0; i < m; ++i) free += FreeUnits(g, usage_[first + i]);
    if (free < need) return false;
    for (uint32_t i = 0; i < m; ++i) {
      order_[i] = i;
      gpu_score_[i] = GpuScore(g, usage_[first + i]);
    }
    std::stable_sort(order_.begin(), order_.begin() + m,
                     [&](uint32_t a, uint32_t b) { return gpu_score_[a] < gpu_score_[b]; });
    uint32_t cursor = 0;
    auto choose = [&](uint32_t, uint32_t mm, uint32_t& profile, Placement& pl) -> int32_t {
      for (; cursor < mm; ++cursor) {
        const uint32_t i = order_[cursor];
        uint32_t instances = 0;
        for (uint32_t idx : g.planner->allowed()) instances += scratch_[i].counts[idx];
        if (instances >= g.device_count) continue;
        const bool ok = newest_ ? PickNewest(g, asc_[gi], scratch_[i], cands, profile, pl)
                                : PickOn(g, hami_[gi], scratch_[i], cands, profile, pl);
        if (ok) return static_cast<int32_t>(i);
      }
      return -1;
    };
    return PlanOnNode(cluster_, n, sp.count, scratch_, usage_, picks_, npicks_, choose);
  }

  bool newest_;
  std::vector<uint32_t> order_;
  std::vector<double> gpu_score_;
};

// ---------------------------------------------------------------------------------------------
// repack: feasibility of the instance multiset, layout recomputed when needed.
class RepackPolicy : public DynamicBase {
 public:
  RepackPolicy(std::string name, const Cluster& cluster, const std::vector<SimPod>& pods)
      : DynamicBase(std::move(name), cluster, pods) {
    state_.assign(cluster.gpu_count(), 0);
    scratch_state_.assign(cluster.gpus_per_node, 0);
    gpu_insts_.resize(cluster.gpu_count());
    for (uint32_t gpu = 0; gpu < cluster.gpu_count(); ++gpu) {
      gpu_insts_[gpu].reserve(cluster.group_of_gpu(gpu).units);
    }
    for (const auto& g : cluster.groups) {
      // State 0 is the empty GPU (the enumeration records it first).
      for (uint8_t c : g.table.counts[0]) {
        if (c != 0) empty_state_ok_ = false;
      }
    }
  }

  absl::StatusOr<bool> Place(uint32_t pod, int32_t node) override {
    if (!empty_state_ok_) return Violation(pod, "layout table does not start empty");
    const SimPod& sp = pods_[pod];
    if (sp.count == 1 && node < 0) {
      uint32_t best_free = std::numeric_limits<uint32_t>::max();
      Pick best;
      int32_t best_state = kNoState;
      for (uint32_t gpu = 0; gpu < cluster_.gpu_count(); ++gpu) {
        const ModelGroup& g = cluster_.group_of_gpu(gpu);
        const uint32_t f = g.units - g.table.units[state_[gpu]];
        if (f == 0 || f >= best_free) continue;
        uint32_t profile = 0;
        const int32_t ns = CanAdd(g, state_[gpu], sp.percent, profile);
        if (ns != kNoState) {
          best = {gpu, profile, {}};
          best_free = f;
          best_state = ns;
        }
      }
      if (best_state == kNoState) return false;
      picks_[0] = best;
      states_[0] = best_state;
      npicks_ = 1;
      DYNMIG_RETURN_IF_ERROR(CommitRepack(pod));
      return true;
    }
    const uint32_t lo = node < 0 ? 0 : node;
    const uint32_t hi = node < 0 ? cluster_.node_count() : node + 1;
    uint64_t best_free = std::numeric_limits<uint64_t>::max();
    std::array<Pick, kMaxInstancesPerPod> best{};
    std::array<int32_t, kMaxInstancesPerPod> best_states{};
    for (uint32_t n = lo; n < hi; ++n) {
      const ModelGroup& g = cluster_.group_of_node(n);
      const uint32_t first = cluster_.node_first_gpu[n];
      const uint32_t m = cluster_.node_gpus[n];
      uint64_t node_free = 0;
      for (uint32_t i = 0; i < m; ++i) {
        scratch_state_[i] = state_[first + i];
        node_free += g.units - g.table.units[scratch_state_[i]];
      }
      if (node_free >= best_free) continue;
      bool ok = true;
      for (uint32_t k = 0; k < sp.count && ok; ++k) {
        int32_t pick = -1;
        uint32_t pick_free = std::numeric_limits<uint32_t>::max();
        for (uint32_t i = 0; i < m; ++i) {
          const uint32_t f = g.units - g.table.units[scratch_state_[i]];
          if (f == 0 || f >= pick_free) continue;
          uint32_t profile = 0;
          const int32_t ns = CanAdd(g, scratch_state_[i], sp.percent, profile);
          if (ns != kNoState) {
            pick = static_cast<int32_t>(i);
            pick_free = f;
            picks_[k] = {first + i, profile, {}};
            states_[k] = ns;
          }
        }
        if (pick < 0) {
          ok = false;
        } else {
          scratch_state_[pick] = states_[k];
        }
      }
      if (ok) {
        best_free = node_free;
        best = picks_;
        best_states = states_;
      }
    }
    if (best_free == std::numeric_limits<uint64_t>::max()) return false;
    picks_ = best;
    states_ = best_states;
    npicks_ = sp.count;
    DYNMIG_RETURN_IF_ERROR(CommitRepack(pod));
    return true;
  }

 private:
  // The smallest candidate profile whose addition keeps the multiset feasible; the new state.
  static int32_t CanAdd(const ModelGroup& g, int32_t state, uint32_t percent, uint32_t& profile) {
    for (uint32_t p : g.candidates[percent]) {
      const int32_t ns = g.table.Add(state, static_cast<uint32_t>(g.local[p]));
      if (ns != kNoState) {
        profile = p;
        return ns;
      }
    }
    return kNoState;
  }

  bool CanHostOn(const ModelGroup& g, uint32_t gpu, uint32_t percent,
                 SliceMask /*free*/) const override {
    uint32_t profile = 0;
    return CanAdd(g, state_[gpu], percent, profile) != kNoState;
  }

  void OnRelease(uint32_t inst) override {
    const Inst& in = inst_[inst];
    const ModelGroup& g = cluster_.group_of_gpu(in.gpu);
    state_[in.gpu] = g.table.Remove(state_[in.gpu], static_cast<uint32_t>(g.local[in.profile]));
    auto& list = gpu_insts_[in.gpu];
    list.erase(std::find(list.begin(), list.end(), inst));
  }

  absl::Status CommitRepack(uint32_t pod) {
    const SimPod& sp = pods_[pod];
    const uint32_t node = cluster_.gpu_node[picks_[0].gpu];
    for (uint32_t k = 0; k < npicks_; ++k) {
      Pick& p = picks_[k];
      const ModelGroup& g = cluster_.group_of_gpu(p.gpu);
      const int32_t expect = g.table.Add(state_[p.gpu], static_cast<uint32_t>(g.local[p.profile]));
      if (expect == kNoState || expect != states_[k]) {
        return Violation(pod, fmt::format("{} does not fit GPU {}'s instances in any layout",
                                          g.profile(p.profile).name, p.gpu));
      }
      const uint32_t id = sp.inst_offset + k;
      GpuUsage& u = usage_[p.gpu];
      // Directly, when a legal placement is free; else re-lay the GPU out.
      bool direct = false;
      for (const auto& op : asc_[cluster_.gpu_group[p.gpu]][p.profile]) {
        if ((op.mask & u.occupied) == 0) {
          p.placement = op.placement;
          direct = true;
          break;
        }
      }
      if (direct) {
        DYNMIG_RETURN_IF_ERROR(Check(pod, p, node));
        Apply(u, p.profile, p.placement);
      } else {
        DYNMIG_RETURN_IF_ERROR(Relayout(pod, p, states_[k]));
      }
      inst_[id] = {p.gpu, p.profile, p.placement};
      gpu_insts_[p.gpu].push_back(id);
      state_[p.gpu] = states_[k];
      used_units_ += p.placement.size;
      ++creates_;
      DYNMIG_RETURN_IF_ERROR(Verify(pod, p.gpu));
    }
    node_of_[pod] = node;
    live_[pod] = 1;
    return absl::OkStatus();
  }

  // Moves the GPU's instances to the stored layout of `state`, keeping those already in place.
  absl::Status Relayout(uint32_t pod, Pick& p, int32_t state) {
    const ModelGroup& g = cluster_.group_of_gpu(p.gpu);
    const auto& layout = g.table.layout[state];
    std::array<bool, 64> taken{};
    if (layout.size() > taken.size()) return Violation(pod, "layout too large");
    auto& list = gpu_insts_[p.gpu];
    std::array<bool, 64> kept{};
    for (size_t j = 0; j < list.size(); ++j) {
      const Inst& in = inst_[list[j]];
      for (size_t s = 0; s < layout.size(); ++s) {
        if (!taken[s] && layout[s].profile_index == in.profile &&
            layout[s].placement == in.placement) {
          taken[s] = true;
          kept[j] = true;
          break;
        }
      }
    }
    for (size_t j = 0; j < list.size(); ++j) {
      if (kept[j]) continue;
      Inst& in = inst_[list[j]];
      bool moved = false;
      for (size_t s = 0; s < layout.size() && !moved; ++s) {
        if (!taken[s] && layout[s].profile_index == in.profile) {
          taken[s] = true;
          in.placement = layout[s].placement;
          moved = true;
        }
      }
      if (!moved) return Violation(pod, "relayout lost an instance");
      ++creates_;
      ++destroys_;
    }
    bool placed = false;
    for (size_t s = 0; s < layout.size() && !placed; ++s) {
      if (!taken[s] && layout[s].profile_index == p.profile) {
        taken[s] = true;
        p.placement = layout[s].placement;
        placed = true;
      }
    }
    if (!placed) return Violation(pod, "relayout has no room for the new instance");
    GpuUsage& u = usage_[p.gpu];
    u.occupied = 0;
    for (uint32_t id : list) u.occupied |= inst_[id].placement.Mask();
    u.occupied |= p.placement.Mask();
    ++u.counts[p.profile];
    return absl::OkStatus();
  }

  // Recomputes one GPU from its instances: legal, non-overlapping, counts as the table says.
  absl::Status Verify(uint32_t pod, uint32_t gpu) const {
    const ModelGroup& g = cluster_.group_of_gpu(gpu);
    SliceMask mask = 0;
    std::array<uint8_t, mig::kMaxProfilesPerGpu> counts{};
    for (uint32_t id : gpu_insts_[gpu]) {
      const Inst& in = inst_[id];
      if (!g.profile(in.profile).IsLegal(in.placement)) {
        return Violation(pod, fmt::format("{} is not legal on {}",
                                          ProfileAt(g, in.profile, in.placement), g.cap().model));
      }
      if ((mask & in.placement.Mask()) != 0) {
        return Violation(pod, fmt::format("{} overlaps another instance on GPU {}",
                                          ProfileAt(g, in.profile, in.placement), gpu));
      }
      mask |= in.placement.Mask();
      ++counts[in.profile];
    }
    if (mask != usage_[gpu].occupied || counts != usage_[gpu].counts) {
      return Violation(pod, fmt::format("GPU {} bookkeeping differs from its instances", gpu));
    }
    const auto& want = g.table.counts[state_[gpu]];
    for (uint32_t a = 0; a < want.size(); ++a) {
      if (counts[g.planner->allowed()[a]] != want[a]) {
        return Violation(pod, fmt::format("GPU {} holds a multiset its state does not", gpu));
      }
    }
    return absl::OkStatus();
  }

  bool empty_state_ok_ = true;
  std::vector<int32_t> state_;
  std::vector<int32_t> scratch_state_;
  std::array<int32_t, kMaxInstancesPerPod> states_{};
  std::vector<std::vector<uint32_t>> gpu_insts_;
};

// ---------------------------------------------------------------------------------------------
// Static geometries: every GPU pre-partitioned; a pod takes idle instances.
class StaticPolicy : public Policy {
 public:
  StaticPolicy(std::string name, const Cluster& cluster, const std::vector<SimPod>& pods,
               std::vector<StaticGeometry> geos)
      : Policy(std::move(name), cluster, pods), geos_(std::move(geos)) {
    busy_.assign(cluster.gpu_count(), 0);
    size_t slots = 0;
    for (const auto& p : pods) slots = std::max<size_t>(slots, p.inst_offset + p.count);
    slot_.assign(slots, {0, 0});
    node_of_.assign(pods.size(), 0);
    live_.assign(pods.size(), 0);
    scratch_.assign(cluster.gpus_per_node, 0);
    for (size_t gi = 0; gi < geos_.size(); ++gi) {
      const ModelGroup& g = cluster.groups[gi];
      const auto& inst = geos_[gi].instances;
      Tables t;
      t.all = inst.size() >= 32 ? ~0u : (1u << inst.size()) - 1;
      t.by_profile.assign(g.cap().profiles.size(), 0);
      for (size_t i = 0; i < inst.size(); ++i) t.by_profile[inst[i].profile_index] |= 1u << i;
      for (uint32_t pct = 1; pct <= 100; ++pct) {
        const uint64_t mem = mig::ResolveMemory(0, pct, g.cap());
        for (size_t i = 0; i < inst.size(); ++i) {
          if (g.profile(inst[i].profile_index).SizingMib() >= mem) t.cover[pct] |= 1u << i;
        }
      }
      t.units.assign(size_t{1} << std::min<size_t>(inst.size(), 16), 0);
      for (size_t s = 0; s < t.units.size(); ++s) {
        for (size_t i = 0; i < inst.size(); ++i) {
          if ((s >> i) & 1u) t.units[s] += inst[i].placement.size;
        }
      }
      tables_.push_back(std::move(t));
    }
  }

  // Validates the geometries once: legal placements, no overlap, instance limits.
  absl::Status Validate() const {
    for (size_t gi = 0; gi < geos_.size(); ++gi) {
      const ModelGroup& g = cluster_.groups[gi];
      SliceMask mask = 0;
      std::array<uint32_t, mig::kMaxProfilesPerGpu> counts{};
      if (geos_[gi].instances.size() > 16) {
        return absl::InvalidArgumentError(
            fmt::format("{}: geometry {} has more than 16 instances", name_, geos_[gi].name));
      }
      for (const auto& in : geos_[gi].instances) {
        const auto& spec = g.profile(in.profile_index);
        if (!spec.IsLegal(in.placement) || (mask & in.placement.Mask()) != 0 ||
            ++counts[in.profile_index] > spec.instance_count) {
          return absl::InternalError(fmt::format("{}: geometry {} on {} is not a legal layout",
                                                 name_, geos_[gi].name, g.cap().model));
        }
        mask |= in.placement.Mask();
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<bool> Place(uint32_t pod, int32_t node) override {
    const SimPod& sp = pods_[pod];
    if (sp.count == 1 && node < 0) {
      // The smallest covering idle instance anywhere (groups in order).
      for (uint32_t gi = 0; gi < cluster_.groups.size(); ++gi) {
        const ModelGroup& g = cluster_.groups[gi];
        const Tables& t = tables_[gi];
        for (uint32_t p : g.candidates[sp.percent]) {
          const uint32_t pm = t.by_profile[p];
          if (pm == 0) continue;
          for (uint32_t gpu = g.first_gpu; gpu < g.first_gpu + g.gpus; ++gpu) {
            const uint32_t idle = pm & ~busy_[gpu];
            if (idle != 0) {
              picks_[0] = {gpu, static_cast<uint32_t>(std::countr_zero(idle))};
              npicks_ = 1;
              DYNMIG_RETURN_IF_ERROR(Commit(pod));
              return true;
            }
          }
        }
      }
      return false;
    }
    const uint32_t lo = node < 0 ? 0 : node;
    const uint32_t hi = node < 0 ? cluster_.node_count() : node + 1;
    for (uint32_t n = lo; n < hi; ++n) {
      const uint32_t gi = cluster_.gpu_group[cluster_.node_first_gpu[n]];
      const ModelGroup& g = cluster_.groups[gi];
      const Tables& t = tables_[gi];
      const uint32_t first = cluster_.node_first_gpu[n];
      const uint32_t m = cluster_.node_gpus[n];
      for (uint32_t i = 0; i < m; ++i) scratch_[i] = busy_[first + i];
      npicks_ = 0;
      for (uint32_t k = 0; k < sp.count; ++k) {
        bool found = false;
        for (uint32_t p : g.candidates[sp.percent]) {
          const uint32_t pm = t.by_profile[p];
          for (uint32_t i = 0; i < m && pm != 0 && !found; ++i) {
            const uint32_t idle = pm & ~scratch_[i];
            if (idle != 0) {
              const uint32_t bit = static_cast<uint32_t>(std::countr_zero(idle));
              scratch_[i] |= 1u << bit;
              picks_[npicks_++] = {first + i, bit};
              found = true;
            }
          }
          if (found) break;
        }
        if (!found) break;
      }
      if (npicks_ == sp.count) {
        DYNMIG_RETURN_IF_ERROR(Commit(pod));
        return true;
      }
    }
    return false;
  }

  absl::Status Remove(uint32_t pod) override {
    const SimPod& sp = pods_[pod];
    if (!live_[pod]) return Violation(pod, "removing a pod that is not placed");
    live_[pod] = 0;
    for (uint32_t k = 0; k < sp.count; ++k) {
      const Slot& s = slot_[sp.inst_offset + k];
      if (((busy_[s.gpu] >> s.instance) & 1u) == 0) {
        return Violation(pod,
                         fmt::format("releasing idle instance {} on GPU {}", s.instance, s.gpu));
      }
      busy_[s.gpu] &= ~(1u << s.instance);
      used_units_ -= Instance(s).placement.size;
    }
    return absl::OkStatus();
  }

  void Fragmentation(uint32_t percent, uint64_t& free, uint64_t& stranded) const override {
    for (size_t gi = 0; gi < cluster_.groups.size(); ++gi) {
      const ModelGroup& g = cluster_.groups[gi];
      const Tables& t = tables_[gi];
      const uint32_t left = geos_[gi].leftover_units;
      for (uint32_t gpu = g.first_gpu; gpu < g.first_gpu + g.gpus; ++gpu) {
        const uint32_t idle = t.all & ~busy_[gpu];
        free += t.units[idle] + left;
        stranded += t.units[idle & ~t.cover[percent]] + left;
      }
    }
  }

  uint32_t NodeOf(uint32_t pod) const override { return node_of_[pod]; }

  std::vector<LiveInstance> Snapshot() const override {
    std::vector<LiveInstance> out;
    for (uint32_t pod = 0; pod < pods_.size(); ++pod) {
      if (!live_[pod]) continue;
      for (uint32_t k = 0; k < pods_[pod].count; ++k) {
        const Slot& sl = slot_[pods_[pod].inst_offset + k];
        const auto& in = Instance(sl);
        out.push_back({pod, sl.gpu, in.profile_index, in.placement});
      }
    }
    return out;
  }

 private:
  struct Slot {
    uint32_t gpu;
    uint32_t instance;
  };
  struct Tables {
    uint32_t all = 0;
    std::vector<uint32_t> by_profile;   // [profile index] -> instances of that profile
    std::array<uint32_t, 101> cover{};  // [percent] -> instances covering it
    std::vector<uint32_t> units;        // [instance set] -> units
  };

  const mig::PlannedInstance& Instance(const Slot& s) const {
    return geos_[cluster_.gpu_group[s.gpu]].instances[s.instance];
  }

  absl::Status Commit(uint32_t pod) {
    const SimPod& sp = pods_[pod];
    const uint32_t node = cluster_.gpu_node[picks_[0].gpu];
    for (uint32_t k = 0; k < npicks_; ++k) {
      const Slot& s = picks_[k];
      const ModelGroup& g = cluster_.group_of_gpu(s.gpu);
      const auto& in = Instance(s);
      if ((busy_[s.gpu] >> s.instance) & 1u) {
        return Violation(pod, fmt::format("{} on GPU {} is already in use",
                                          ProfileAt(g, in.profile_index, in.placement), s.gpu));
      }
      if (g.profile(in.profile_index).SizingMib() < mig::ResolveMemory(0, sp.percent, g.cap())) {
        return Violation(pod, fmt::format("{} is smaller than the {}% asked",
                                          g.profile(in.profile_index).name, sp.percent));
      }
      if (cluster_.gpu_node[s.gpu] != node) {
        return Violation(pod, "instances of one pod on different nodes");
      }
      busy_[s.gpu] |= 1u << s.instance;
      used_units_ += in.placement.size;
      slot_[sp.inst_offset + k] = s;
    }
    node_of_[pod] = node;
    live_[pod] = 1;
    return absl::OkStatus();
  }

  std::vector<StaticGeometry> geos_;  // by group
  std::vector<Tables> tables_;        // by group
  std::vector<uint32_t> busy_;        // per GPU: busy instances
  std::vector<Slot> slot_;            // per instance slot of a pod
  std::vector<uint32_t> node_of_;
  std::vector<uint8_t> live_;
  std::vector<uint32_t> scratch_;
  std::array<Slot, kMaxInstancesPerPod> picks_{};
  uint32_t npicks_ = 0;
};

}  // namespace

std::vector<std::string> DefaultPolicies() {
  return {"dynmig",        "dynmig:defrag", "hami-v2.10",          "hami-newest",
          "first-fit",     "best-fit",      "static:all-balanced", "static:all-1g",
          "static:all-2g", "static:all-3g", "static:all-7g",       "repack"};
}

absl::StatusOr<WarmConfig> ParseWarmConfig(std::string_view text) {
  const std::vector<std::string> parts = SplitTrimmed(text, ',');
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(fmt::format(
        "--warm-instances \"{}\": {} (expected TTL,MAX_PER_GPU, e.g. 5m,2)", text, why));
  };
  if (parts.size() != 2) return bad("two values separated by a comma are needed");
  WarmConfig w;
  if (!absl::ParseDuration(parts[0], &w.ttl)) {
    return bad(fmt::format("the TTL \"{}\" is not a duration such as 90s, 5m or 1h", parts[0]));
  }
  using protocol::WarmInstances;
  if (w.ttl < WarmInstances::kMinTtl || w.ttl > WarmInstances::kMaxTtl) {
    return bad(fmt::format("the TTL {} is not from {} to {}", parts[0],
                           absl::FormatDuration(WarmInstances::kMinTtl),
                           absl::FormatDuration(WarmInstances::kMaxTtl)));
  }
  const std::string& n = parts[1];
  if (n.empty() || n.size() > 2 || n.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(n) < 1 || std::stoul(n) > WarmInstances::kMaxPerGpuLimit) {
    return bad(fmt::format("MAX_PER_GPU \"{}\" is not a number from 1 to {}", n,
                           WarmInstances::kMaxPerGpuLimit));
  }
  w.max_per_gpu = static_cast<uint32_t>(std::stoul(n));
  return w;
}

absl::StatusOr<bool> ParseDefragOption(std::string_view opt, DefragConfig& config) {
  struct Timed {
    std::string_view prefix;
    double* field;
    absl::Duration max;
  };
  const Timed timed[] = {{"wait-", &config.wait_s, absl::Hours(24)},
                         {"grace-", &config.grace_s, absl::Hours(1)},
                         {"restart-", &config.restart_s, absl::Hours(24)}};
  for (const Timed& t : timed) {
    if (!opt.starts_with(t.prefix)) continue;
    const std::string_view value = opt.substr(t.prefix.size());
    absl::Duration d;
    if (value.empty() || value.size() > 16 || !absl::ParseDuration(std::string(value), &d) ||
        d < absl::ZeroDuration() || d > t.max) {
      return absl::InvalidArgumentError(
          fmt::format("\"{}\": {}DURATION needs a duration from 0s to {} (e.g. {}90s)",
                      opt.substr(0, 64), t.prefix, absl::FormatDuration(t.max), t.prefix));
    }
    *t.field = absl::ToDoubleSeconds(d);
    return true;
  }
  struct Counted {
    std::string_view prefix;
    uint32_t* field;
    uint32_t min, max;
    std::string_view what;
  };
  const Counted counted[] = {
      {"rate-", &config.per_node_hour, 1, 1000, "the evictions per node per hour"},
      {"tries-", &config.plans_tried, 1, 1000, "the plans whose moved pods are tried"},
      {"evict-", &config.max_evicted, 1, 1000, "the most pods one move evicts"},
      {"headroom-", &config.headroom_pct, 0, 100,
       "the percent of the cluster's placement units kept free"},
  };
  for (const Counted& c : counted) {
    if (!opt.starts_with(c.prefix)) continue;
    const std::string_view n = opt.substr(c.prefix.size());
    if (n.empty() || n.size() > 4 || n.find_first_not_of("0123456789") != std::string_view::npos ||
        std::stoul(std::string(n)) < c.min || std::stoul(std::string(n)) > c.max) {
      return absl::InvalidArgumentError(fmt::format("\"{}\": {}N needs N, {}, from {} to {}",
                                                    opt.substr(0, 64), c.prefix, c.what, c.min,
                                                    c.max));
    }
    *c.field = static_cast<uint32_t>(std::stoul(std::string(n)));
    return true;
  }
  return false;
}

std::string WarmConfigText(const WarmConfig& warm) {
  return fmt::format("{},{}", absl::FormatDuration(warm.ttl), warm.max_per_gpu);
}

absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(std::string_view spec, const Cluster& cluster,
                                                   const std::vector<SimPod>& pods,
                                                   const WarmConfig& warm) {
  const std::string name(spec);
  if (spec == "dynmig" || spec.starts_with("dynmig:")) {
    mig::GpuPolicy gpu = mig::PodRequest{}.gpu_policy;
    mig::NodePolicy node = mig::PodRequest{}.node_policy;
    uint32_t bind_window = 0;
    bool with_warm = false;
    bool with_defrag = false;
    bool defrag_options = false;
    DefragConfig defrag;
    if (spec.size() > 7) {
      for (const auto& opt : SplitTrimmed(spec.substr(7), '+')) {
        auto is_defrag = ParseDefragOption(opt, defrag);
        if (!is_defrag.ok()) {
          return absl::InvalidArgumentError(
              fmt::format("--policy {}: {}", spec, std::string(is_defrag.status().message())));
        }
        if (*is_defrag) {
          defrag_options = true;
        } else if (opt == "defrag") {
          with_defrag = true;
        } else if (opt == "any-move") {
          defrag.moved_must_fit = false;
          defrag_options = true;
        } else if (opt == "per-gpu") {
          defrag.trigger = DefragConfig::Trigger::kFragmented;
          defrag_options = true;
        } else if (opt == "node-total") {
          defrag.trigger = DefragConfig::Trigger::kNodeTotal;
          defrag_options = true;
        } else if (opt == "big-first") {
          defrag.bigger_first = true;
          defrag_options = true;
        } else if (opt == "gain") {
          defrag.gain = true;
          defrag_options = true;

        } else if (opt == "warm") {
          with_warm = true;
        } else if (opt.starts_with("binds-in-flight-")) {
          const std::string n = opt.substr(16);
          if (n.empty() || n.size() > 6 || n.find_first_not_of("0123456789") != std::string::npos) {
            return absl::InvalidArgumentError(fmt::format(
                "--policy {}: \"{}\" needs a count: binds-in-flight-N (e.g. binds-in-flight-8)",
                spec, opt));
          }
          bind_window = static_cast<uint32_t>(std::stoul(n));
        } else if (opt == "gpu-binpack") {
          gpu = mig::GpuPolicy::kBinpack;
        } else if (opt == "gpu-spread") {
          gpu = mig::GpuPolicy::kSpread;
        } else if (opt == "node-binpack") {
          node = mig::NodePolicy::kBinpack;
        } else if (opt == "node-spread") {
          node = mig::NodePolicy::kSpread;
        } else {
          return absl::InvalidArgumentError(fmt::format(
              "--policy {}: unknown option \"{}\" (gpu-binpack, gpu-spread, node-binpack, "
              "node-spread, binds-in-flight-N, warm, defrag with wait-DURATION, grace-DURATION, "
              "restart-DURATION, rate-N, tries-N, evict-N, per-gpu, node-total, any-move, "
              "big-first, gain; joined with '+')",
              spec, opt));
        }
      }
    }
    if (defrag_options && !with_defrag) {
      return absl::InvalidArgumentError(fmt::format(
          "--policy {}: wait-, grace-, restart-, rate-, tries-, evict-, per-gpu, node-total, "
          "any-move, big-first and gain are options of defrag (add +defrag)",
          spec));
    }
    auto policy = std::make_unique<DynmigPolicy>(name, cluster, pods, gpu, node, bind_window,
                                                 with_warm ? &warm : nullptr);
    if (with_defrag) policy->EnableDefrag(defrag);
    return std::unique_ptr<Policy>(std::move(policy));
  }
  if (spec == "hami-v2.10" || spec == "hami") {
    return std::unique_ptr<Policy>(new HamiPolicy(name, cluster, pods, false));
  }
  if (spec == "hami-newest") {
    return std::unique_ptr<Policy>(new HamiPolicy(name, cluster, pods, true));
  }
  if (spec == "gpuplanner:best-fit") {
    return std::unique_ptr<Policy>(new PlannerBestFitPolicy(name, cluster, pods));
  }
  if (spec == "first-fit") return std::unique_ptr<Policy>(new FirstFitPolicy(name, cluster, pods));
  if (spec == "best-fit") return std::unique_ptr<Policy>(new BestFitPolicy(name, cluster, pods));
  if (spec == "repack") return std::unique_ptr<Policy>(new RepackPolicy(name, cluster, pods));
  if (spec.starts_with("static:")) {
    std::vector<StaticGeometry> geos;
    for (const auto& g : cluster.groups) {
      auto geo = MakeStaticGeometry(g, spec.substr(7));
      if (!geo.ok()) return geo.status();
      geos.push_back(std::move(*geo));
    }
    auto policy = std::make_unique<StaticPolicy>(name, cluster, pods, std::move(geos));
    DYNMIG_RETURN_IF_ERROR(policy->Validate());
    return std::unique_ptr<Policy>(std::move(policy));
  }
  return absl::InvalidArgumentError(fmt::format(
      "--policy: unknown policy \"{}\" (known: dynmig, dynmig:defrag, hami-v2.10, hami-newest, "
      "first-fit, best-fit, repack, "
      "gpuplanner:best-fit, "
      "static:all-balanced, static:all-1g, static:all-2g, static:all-3g, static:all-4g, "
      "static:all-7g)",
      spec));
}

}  // namespace dynmig::sim
