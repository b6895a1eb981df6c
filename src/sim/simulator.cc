#include "sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "mig/defrag_policy.h"
#include "sim/defrag.h"
#include "sim/policies.h"

namespace dynmig::sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Departure {
  double time;
  uint32_t pod;
};
// Min-heap order: earlier first, then lower pod index (deterministic).
bool Later(const Departure& a, const Departure& b) {
  return a.time != b.time ? a.time > b.time : a.pod > b.pod;
}

// A timed step of the defragmenter: look at a waiting pod, or finish a move after the evicted
// pods' grace period. Min-heap order: earlier first, then kind, then id.
struct DefragEvent {
  double time;
  uint32_t kind;  // kCheck or kMoveDone
  uint32_t id;    // pod (kCheck) or move (kMoveDone)
};
constexpr uint32_t kMoveDone = 0;  // before checks at the same instant: the move frees slices
constexpr uint32_t kCheck = 1;
bool LaterEvent(const DefragEvent& a, const DefragEvent& b) {
  if (a.time != b.time) return a.time > b.time;
  if (a.kind != b.kind) return a.kind > b.kind;
  return a.id > b.id;
}

// A move in progress: `evict` terminate, then `pod` takes the reserved placement.
struct Move {
  uint32_t pod;
  uint32_t gpu;
  uint32_t profile;
  mig::Placement placement;
  std::vector<uint32_t> evict;
  bool done = false;
};

double Percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(std::ceil(q * v.size())) - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

class Run {
 public:
  Run(const std::vector<SimPod>& pods, const SimResult& res,
      const std::vector<uint32_t>& profile_of, const SimOptions& options, uint32_t classes,
      double asked_total, Policy& policy, const Cluster& cluster,
      std::function<void(double)> progress)
      : pods_(pods),
        cluster_(cluster),
        latency_(options.nvml_latency),
        profile_of_(profile_of),
        res_(res),
        asked_total_(asked_total),
        policy_(policy),
        progress_(std::move(progress)),
        failed_pass_(classes, 0) {
    const size_t n = pods.size();
    heap_.reserve(n);
    queue_.reserve(n);
    next_queue_.reserve(n);
    start_.assign(n, -1);
    nvml_.assign(n, 0);
    defrag_ = policy.defrag();
    if (defrag_ != nullptr) {
      dep_.assign(n, -1);
      last_start_.assign(n, 0);
      run_from_.assign(n, 0);
      remaining_.assign(n, 0);
      evicted_.assign(n, 0);
      terminating_.assign(n, 0);
      waiting_.assign(n, 0);
      checks_.assign(n, 0);
      node_evictions_.resize(cluster.node_count());
    }
    const size_t stride_n = std::max<size_t>(options.fragmentation_samples, 1);
    frag_stride_ = std::max<size_t>(1, n / stride_n);
    out_.utilization.assign(res.sample_x.size(), 0.0);
  }

  absl::StatusOr<PolicyResult> Go() {
    out_.name = policy_.name();
    out_.pods = pods_.size();
    if (res_.mode == Mode::kFill) {
      DYNMIG_RETURN_IF_ERROR(Fill());
    } else {
      DYNMIG_RETURN_IF_ERROR(Events());
    }
    out_.accepted_count = pods_.empty() ? 0.0 : static_cast<double>(out_.accepted) / pods_.size();
    out_.fragmentation = frag_n_ == 0 ? 0.0 : frag_sum_ / frag_n_;
    out_.rejected_by_profile.assign(res_.profiles.size(), 0);
    if (res_.mode != Mode::kFill) {
      for (size_t k = 0; k < pods_.size(); ++k) {
        if (start_[k] < 0) ++out_.rejected_by_profile[profile_of_[k]];
      }
    }
    out_.creates = policy_.creates();
    out_.destroys = policy_.destroys();
    out_.warm = policy_.warm();
    for (size_t k = 0; k < evicted_.size(); ++k) out_.evicted_waiting += evicted_[k];
    return std::move(out_);
  }

 private:
  double Utilization() const {
    return res_.capacity_units == 0
               ? 0.0
               : static_cast<double>(policy_.used_units()) / res_.capacity_units;
  }

  void Advance(double t) {
    t = std::min(t, res_.end);
    policy_.AdvanceTo(t);
    while (next_sample_ < res_.sample_x.size() && res_.sample_x[next_sample_] <= t) {
      out_.utilization[next_sample_++] = Utilization();
    }
    if (t > last_t_) {
      area_ += static_cast<double>(policy_.used_units()) * (t - last_t_);
      last_t_ = t;
    }
  }

  void MeasureFragmentation(uint32_t pod, size_t arrival_index) {
    if (arrival_index % frag_stride_ != 0) return;
    uint64_t free = 0, stranded = 0;
    policy_.Fragmentation(pods_[pod].percent, free, stranded);
    if (free > 0) {
      frag_sum_ += static_cast<double>(stranded) / static_cast<double>(free);
      ++frag_n_;
    }
  }

  // Places the pod and notes the NVML time of the reconfigurations that took.
  absl::StatusOr<bool> Place(uint32_t pod, int32_t node) {
    const uint64_t creates = policy_.creates(), destroys = policy_.destroys();
    DYNMIG_ASSIGN_OR_RETURN(const bool placed, policy_.Place(pod, node));
    if (placed) NoteNvml(pod, creates, destroys);
    return placed;
  }

  // The NVML time of a pod's first placement (a restart after a move is not a new pod).
  void NoteNvml(uint32_t pod, uint64_t creates, uint64_t destroys) {
    if (!latency_.IsZero() && start_[pod] < 0) {
      const std::string& model = cluster_.group_of_node(policy_.NodeOf(pod)).cap().model;
      nvml_[pod] = static_cast<double>(policy_.creates() - creates) *
                       absl::ToDoubleSeconds(latency_.Create(model)) +
                   static_cast<double>(policy_.destroys() - destroys) *
                       absl::ToDoubleSeconds(latency_.Destroy(model));
    }
  }

  void Started(uint32_t pod, double t) {
    const SimPod& p = pods_[pod];
    start_[pod] = t;
    ++out_.accepted;
    accepted_asked_ += static_cast<double>(p.asked_units) * (p.departure - p.arrival);
    heap_.push_back({t + (p.departure - p.arrival), pod});
    std::push_heap(heap_.begin(), heap_.end(), Later);
    out_.peak_utilization = std::max(out_.peak_utilization, Utilization());
    if (defrag_ != nullptr) {
      dep_[pod] = t + (p.departure - p.arrival);
      run_from_[pod] = t;
      last_start_[pod] = t;
      waiting_[pod] = 0;
    }
  }

  // A pod the defragmenter evicted is placed again at `t`: it holds its slices from now, runs
  // after its restart time, and then for what was left of its lifetime.
  void Restarted(uint32_t pod, double t) {
    const SimPod& p = pods_[pod];
    const double end = t + defrag_->restart_s + remaining_[pod];
    accepted_asked_ += static_cast<double>(p.asked_units) * remaining_[pod];
    evicted_[pod] = 0;
    waiting_[pod] = 0;
    dep_[pod] = end;
    run_from_[pod] = t + defrag_->restart_s;
    last_start_[pod] = t;
    ++out_.restarts;
    heap_.push_back({end, pod});
    std::push_heap(heap_.begin(), heap_.end(), Later);
    out_.peak_utilization = std::max(out_.peak_utilization, Utilization());
  }

  void StartedOrRestarted(uint32_t pod, double t) {
    if (defrag_ != nullptr && evicted_[pod]) {
      Restarted(pod, t);
    } else {
      Started(pod, t);
    }
  }

  // Defragmentation ------------------------------------------------------------------------------

  void Wait(uint32_t pod, double t) {
    queue_.push_back(pod);
    if (defrag_ == nullptr) return;
    waiting_[pod] = 1;
    checks_[pod] = 0;
    ScheduleCheck(pod, t + defrag_->wait_s);
  }

  void ScheduleCheck(uint32_t pod, double at) {
    events_.push_back({at, kCheck, pod});
    std::push_heap(events_.begin(), events_.end(), LaterEvent);
  }

  // Evictions the node may still take: its rate limit over the last hour.
  uint32_t Budget(uint32_t node, double t) {
    auto& h = node_evictions_[node];
    while (!h.empty() && h.front() <= t - 3600) h.pop_front();
    return h.size() >= defrag_->per_node_hour
               ? 0
               : defrag_->per_node_hour - static_cast<uint32_t>(h.size());
  }

  // The defragmenter looks at a pod that has waited: when only fragmentation stops it and a move
  // is allowed, the planned pods are evicted and the freed placement is reserved for it.
  absl::StatusOr<bool> TryMove(uint32_t pod, double t) {
    if (pods_[pod].count != 1 || !policy_.MayMoveFor(pod)) return false;
    if (defrag_->bigger_first && std::any_of(queue_.begin(), queue_.end(), [&](uint32_t q) {
          return pods_[q].count > pods_[pod].count;
        })) {
      return false;  // a pod asking for more instances waits: it goes first
    }
    MoveInput in;
    in.cluster = &cluster_;
    in.pods = &pods_;
    in.live = policy_.Snapshot();
    if (defrag_->headroom_pct > 0) {
      uint64_t used = 0;
      for (const LiveInstance& l : in.live) used += l.placement.size;
      for (const Move& m : moves_) {
        if (!m.done) used += m.placement.size;
      }
      if (!mig::KeepsHeadroom(cluster_.total_units, used, pods_[pod].asked_units,
                              defrag_->headroom_pct)) {
        return false;  // the room kept for the pods to come
      }
    }
    in.pinned = terminating_;
    in.started = last_start_;
    for (const Move& m : moves_) {
      if (!m.done) in.held.push_back({m.gpu, m.profile, m.placement});
    }
    in.budget = [&](uint32_t node) { return Budget(node, t); };
    in.tries = defrag_->plans_tried;
    if (defrag_->max_evicted > 0 || defrag_->gain) {
      in.allow = [&](const MovePlan& m) {
        if (defrag_->max_evicted > 0 && m.evict.size() > defrag_->max_evicted) return false;
        if (!defrag_->gain) return true;
        const SimPod& w = pods_[pod];
        double lost = 0;
        for (uint32_t e : m.evict) {
          lost += static_cast<double>(pods_[e].asked_units) *
                  std::min(defrag_->grace_s + defrag_->restart_s, std::max(0.0, dep_[e] - t));
        }
        return static_cast<double>(w.asked_units) * (w.departure - w.arrival) > lost;
      };
    }
    if (defrag_->moved_must_fit) {
      in.accept = [&](const MovePlan& m) {
        return policy_.MovedPodsFit(m.evict, m.gpu, m.placement);
      };
    }
    const std::optional<MovePlan> plan = PlanMove(in, pod);
    if (!plan) return false;
    DYNMIG_RETURN_IF_ERROR(policy_.Reserve(pod, plan->gpu, plan->placement));
    const uint32_t node = cluster_.gpu_node[plan->gpu];
    for (uint32_t e : plan->evict) {
      terminating_[e] = 1;
      node_evictions_[node].push_back(t);
      ++out_.evictions;
    }
    ++out_.moves;
    waiting_[pod] = 0;
    queue_.erase(std::remove(queue_.begin(), queue_.end(), pod), queue_.end());
    events_.push_back({t + defrag_->grace_s, kMoveDone, static_cast<uint32_t>(moves_.size())});
    std::push_heap(events_.begin(), events_.end(), LaterEvent);
    moves_.push_back({pod, plan->gpu, plan->profile, plan->placement, plan->evict});
    return true;
  }

  // The evicted pods have terminated: the waiting pod takes the reserved placement, the evicted
  // ones are recreated (placed at once where they fit, else they wait).
  absl::Status FinishMove(uint32_t id, double t) {
    Move& m = moves_[id];
    m.done = true;
    std::vector<uint32_t> back;
    for (uint32_t e : m.evict) {
      if (!terminating_[e]) continue;  // it ended on its own during the grace period
      terminating_[e] = 0;
      DYNMIG_RETURN_IF_ERROR(policy_.Remove(e));
      remaining_[e] = std::max(0.0, dep_[e] - std::max(t, run_from_[e]));
      accepted_asked_ -= static_cast<double>(pods_[e].asked_units) * remaining_[e];
      dep_[e] = -1;
      evicted_[e] = 1;
      back.push_back(e);
    }
    policy_.Unreserve(m.gpu, m.placement);
    const uint64_t creates = policy_.creates(), destroys = policy_.destroys();
    DYNMIG_RETURN_IF_ERROR(policy_.PlaceExactly(m.pod, m.gpu, m.profile, m.placement));
    NoteNvml(m.pod, creates, destroys);
    StartedOrRestarted(m.pod, t);
    for (uint32_t e : back) {
      DYNMIG_ASSIGN_OR_RETURN(const bool placed, Place(e, -1));
      if (placed) {
        Restarted(e, t);
      } else {
        Wait(e, t);
      }
    }
    if (!queue_.empty() && t < res_.end) {
      DYNMIG_RETURN_IF_ERROR(Retry(cluster_.gpu_node[m.gpu], t));
    }
    return absl::OkStatus();
  }

  absl::Status Check(uint32_t pod, double t) {
    if (!waiting_[pod]) return absl::OkStatus();  // started, or served by a move, since
    DYNMIG_ASSIGN_OR_RETURN(const bool moved, TryMove(pod, t));
    if (moved) return absl::OkStatus();
    // Not now (not fragmentation, no allowed move, the rate limit): looked at again later, less
    // and less often.
    const double base = std::max(defrag_->wait_s, 30.0);
    const double delay =
        std::min(base * static_cast<double>(uint64_t{1} << std::min(checks_[pod], 7u)), 3600.0);
    ++checks_[pod];
    ScheduleCheck(pod, t + delay);
    return absl::OkStatus();
  }

  void Tick() {
    if (progress_ && (++ticks_ & 4095) == 0) {
      progress_(static_cast<double>(arrivals_) / std::max<size_t>(pods_.size(), 1));
    }
  }

  absl::Status Retry(uint32_t node, double t) {
    ++pass_;
    next_queue_.clear();
    for (uint32_t pod : queue_) {
      const uint32_t cls = pods_[pod].cls;
      if (failed_pass_[cls] == pass_) {
        next_queue_.push_back(pod);
        continue;
      }
      DYNMIG_ASSIGN_OR_RETURN(const bool placed, Place(pod, static_cast<int32_t>(node)));
      if (placed) {
        StartedOrRestarted(pod, t);
      } else {
        failed_pass_[cls] = pass_;
        next_queue_.push_back(pod);
      }
    }
    queue_.swap(next_queue_);
    return absl::OkStatus();
  }

  absl::Status Events() {
    const bool queue_mode = res_.mode == Mode::kQueue;
    last_t_ = res_.start;
    size_t i = 0;
    while (true) {
      Tick();
      const double t_arr = i < pods_.size() ? pods_[i].arrival : kInf;
      const double t_dep = heap_.empty() ? kInf : heap_.front().time;
      const double t_def = events_.empty() ? kInf : events_.front().time;
      if (t_dep == kInf && t_arr == kInf && t_def == kInf) break;
      if (t_dep <= t_arr && t_dep <= t_def) {
        if (t_dep > res_.end) break;
        Advance(t_dep);
        std::pop_heap(heap_.begin(), heap_.end(), Later);
        const uint32_t pod = heap_.back().pod;
        heap_.pop_back();
        if (defrag_ != nullptr) {
          if (dep_[pod] != t_dep) continue;  // evicted since: that departure is void
          dep_[pod] = -1;
          terminating_[pod] = 0;  // ended during its grace period
        }
        const uint32_t node = policy_.NodeOf(pod);
        DYNMIG_RETURN_IF_ERROR(policy_.Remove(pod));
        // Nothing starts at the very end of the horizon. In reject mode only pods evicted by a
        // move wait.
        if (!queue_.empty() && t_dep < res_.end) {
          DYNMIG_RETURN_IF_ERROR(Retry(node, t_dep));
        }
        continue;
      }
      if (t_def <= t_arr) {
        if (t_def > res_.end) break;
        Advance(t_def);
        std::pop_heap(events_.begin(), events_.end(), LaterEvent);
        const DefragEvent e = events_.back();
        events_.pop_back();
        if (e.kind == kMoveDone) {
          DYNMIG_RETURN_IF_ERROR(FinishMove(e.id, t_def));
        } else {
          DYNMIG_RETURN_IF_ERROR(Check(e.id, t_def));
        }
        continue;
      }
      Advance(t_arr);
      const uint32_t pod = static_cast<uint32_t>(i);
      MeasureFragmentation(pod, i);
      DYNMIG_ASSIGN_OR_RETURN(const bool placed, Place(pod, -1));
      if (placed) {
        Started(pod, t_arr);
      } else if (queue_mode) {
        Wait(pod, t_arr);
      } else if (defrag_ != nullptr) {
        // Reject mode has no waiting: the defragmenter looks at the pod as it arrives; without
        // a move it is lost.
        DYNMIG_ASSIGN_OR_RETURN(const bool moved, TryMove(pod, t_arr));
        (void)moved;
      }
      ++i;
      ++arrivals_;
    }
    Advance(res_.end);
    const double span = res_.end - res_.start;
    out_.mean_utilization =
        span > 0 && res_.capacity_units > 0 ? area_ / (span * res_.capacity_units) : Utilization();
    out_.accepted_slice_time =
        asked_total_ > 0
            ? accepted_asked_ / asked_total_
            : (pods_.empty() ? 0.0 : static_cast<double>(out_.accepted) / pods_.size());
    if (queue_mode) {
      std::vector<double> waits(pods_.size());
      double sum = 0;
      for (size_t k = 0; k < pods_.size(); ++k) {
        waits[k] = start_[k] >= 0 ? start_[k] - pods_[k].arrival : res_.end - pods_[k].arrival;
        if (start_[k] < 0) ++out_.never_started;
        sum += waits[k];
      }
      out_.pending_mean = waits.empty() ? 0 : sum / waits.size();
      out_.pending_p50 = Percentile(waits, 0.50);
      out_.pending_p99 = Percentile(waits, 0.99);
    }
    std::vector<double> running;
    double running_sum = 0, nvml_sum = 0;
    for (size_t k = 0; k < pods_.size(); ++k) {
      if (start_[k] < 0) continue;
      running.push_back(start_[k] - pods_[k].arrival + nvml_[k]);
      running_sum += running.back();
      nvml_sum += nvml_[k];
    }
    if (!running.empty()) {
      out_.running_mean = running_sum / running.size();
      out_.nvml_mean = nvml_sum / running.size();
      out_.running_p50 = Percentile(running, 0.50);
      out_.running_p99 = Percentile(running, 0.99);
    }
    return absl::OkStatus();
  }

  absl::Status Fill() {
    uint64_t units = 0, asked_all = 0;
    for (const auto& p : pods_) asked_all += p.asked_units;
    const size_t n = pods_.size();
    for (size_t i = 0; i < n; ++i) {
      Tick();
      const uint32_t pod = static_cast<uint32_t>(i);
      MeasureFragmentation(pod, i);
      DYNMIG_ASSIGN_OR_RETURN(const bool placed, policy_.Place(pod, -1));
      if (!placed) break;
      ++out_.accepted;
      ++arrivals_;
      units += pods_[i].asked_units;
      out_.peak_utilization = std::max(out_.peak_utilization, Utilization());
      while (next_sample_ < res_.sample_x.size() && res_.sample_x[next_sample_] <= i + 1) {
        out_.utilization[next_sample_++] = Utilization();
      }
    }
    while (next_sample_ < res_.sample_x.size()) out_.utilization[next_sample_++] = Utilization();
    out_.filled = res_.capacity_units == 0 ? 0.0 : static_cast<double>(units) / res_.capacity_units;
    out_.mean_utilization = Utilization();
    out_.accepted_slice_time = asked_all == 0 ? 0.0 : static_cast<double>(units) / asked_all;
    return absl::OkStatus();
  }

  const std::vector<SimPod>& pods_;
  const Cluster& cluster_;
  const mig::NvmlLatency& latency_;
  std::vector<double> nvml_;  // per pod: NVML reconfiguration time of its placement
  const std::vector<uint32_t>& profile_of_;
  const SimResult& res_;
  const double asked_total_;
  Policy& policy_;
  std::function<void(double)> progress_;
  PolicyResult out_;
  std::vector<Departure> heap_;
  std::vector<uint32_t> queue_, next_queue_;
  std::vector<uint64_t> failed_pass_;
  uint64_t pass_ = 0;
  std::vector<double> start_;
  // The defragmenter (dynmig:defrag; null otherwise) and its per-pod state.
  const DefragConfig* defrag_ = nullptr;
  std::vector<DefragEvent> events_;  // min-heap by LaterEvent
  std::vector<Move> moves_;
  std::vector<double> dep_;           // scheduled departure of a running pod, -1 when none
  std::vector<double> last_start_;    // when it last started (the youngest are moved first)
  std::vector<double> run_from_;      // when its work (re)starts: after a restart's delay
  std::vector<double> remaining_;     // an evicted pod's lifetime left
  std::vector<uint8_t> evicted_;      // evicted, not running again yet
  std::vector<uint8_t> terminating_;  // evicted, in its grace period (still holds its slices)
  std::vector<uint8_t> waiting_;      // in queue_ (a check may serve it)
  std::vector<uint32_t> checks_;      // checks that found no move since it last began waiting
  std::vector<std::deque<double>> node_evictions_;  // per node: eviction times, last hour
  double accepted_asked_ = 0;
  double area_ = 0;
  double last_t_ = 0;
  size_t next_sample_ = 0;
  size_t frag_stride_ = 1;
  double frag_sum_ = 0;
  uint64_t frag_n_ = 0;
  uint64_t ticks_ = 0;
  size_t arrivals_ = 0;
};

}  // namespace

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kReject:
      return "reject";
    case Mode::kQueue:
      return "queue";
    case Mode::kFill:
      return "fill";
  }
  return "?";
}

namespace {

// The pods the policies run on (servable GPU pods of the trace), with their request classes,
// instance slots and covering profiles.
struct PodSet {
  std::vector<SimPod> pods;
  uint32_t classes = 0;
  std::vector<uint32_t> profile_of;  // by pod: index into SimResult::profiles
  double asked_total = 0;            // asked units x duration, every pod
};

// What the result says of its input: the trace, the cluster, the mode.
SimResult Describe(const Trace& trace, const Cluster& cluster, const SimOptions& options) {
  SimResult res;
  res.trace = trace.source;
  res.mode = options.mode;
  res.gpus = cluster.gpu_count();
  res.capacity_units = cluster.total_units;
  res.cpu_only = trace.cpu_only;
  res.start = trace.start;
  res.end = trace.end;
  res.nvml_latency = options.nvml_latency.ToString();
  for (const auto& g : cluster.groups) {
    std::string model = g.cap().model;
    if (model.starts_with("NVIDIA ")) model = model.substr(7);
    res.cluster += fmt::format("{}{} x {}", res.cluster.empty() ? "" : " + ", model, g.gpus);
  }
  return res;
}

// The trace's pods, their request classes and instance slots; counts the unservable ones and the
// pods of each covering profile in `res`. kInvalidArgument: a pod asks for what no GPU has.
absl::StatusOr<PodSet> CollectPods(const Trace& trace, const Cluster& cluster, SimResult& res) {
  PodSet set;
  set.pods.reserve(trace.pods.size());
  std::vector<std::array<int32_t, 101>> cls_of(kMaxInstancesPerPod + 1);
  for (auto& row : cls_of) row.fill(-1);
  uint32_t slots = 0;
  for (const auto& tp : trace.pods) {
    if (tp.count == 0 || tp.count > kMaxInstancesPerPod || tp.percent == 0 || tp.percent > 100) {
      return absl::InvalidArgumentError(
          fmt::format("{}: pod at line {} asks for {} instance(s) of {}%", trace.source, tp.line,
                      tp.count, tp.percent));
    }
    if (!cluster.Servable(tp.percent)) {
      ++res.unservable;
      continue;
    }
    SimPod sp;
    sp.arrival = tp.arrival;
    sp.departure = tp.departure;
    sp.count = tp.count;
    sp.percent = tp.percent;
    sp.line = tp.line;
    sp.defrag = tp.defrag;
    int32_t& cls = cls_of[tp.count][tp.percent];
    if (cls < 0) cls = static_cast<int32_t>(set.classes++);
    sp.cls = static_cast<uint32_t>(cls);
    sp.inst_offset = slots;
    slots += tp.count;
    sp.asked_units = cluster.AskedUnits(tp.count, tp.percent);
    for (const auto& g : cluster.groups) {
      if (g.candidates[tp.percent].empty()) continue;
      const std::string name = fmt::format("{}{}", tp.count > 1 ? fmt::format("{}x", tp.count) : "",
                                           g.profile(g.candidates[tp.percent].front()).name);
      auto it = std::find(res.profiles.begin(), res.profiles.end(), name);
      if (it == res.profiles.end()) {
        res.profiles.push_back(name);
        res.pods_by_profile.push_back(0);
        it = res.profiles.end() - 1;
      }
      const auto k = static_cast<uint32_t>(it - res.profiles.begin());
      set.profile_of.push_back(k);
      ++res.pods_by_profile[k];
      break;
    }
    set.asked_total += static_cast<double>(sp.asked_units) * (sp.departure - sp.arrival);
    set.pods.push_back(sp);
  }
  res.pods = set.pods.size();
  return set;
}

// Profiles in size order: instance count, then memory of the smallest covering profile.
void SortProfiles(const Cluster& cluster, PodSet& set, SimResult& res) {
  const std::vector<SimPod>& pods = set.pods;
  std::vector<std::pair<uint64_t, uint32_t>> keys(res.profiles.size());
  for (size_t k = 0; k < pods.size(); ++k) {
    const auto& g =
        *std::find_if(cluster.groups.begin(), cluster.groups.end(),
                      [&](const ModelGroup& m) { return !m.candidates[pods[k].percent].empty(); });
    keys[set.profile_of[k]] = {uint64_t{pods[k].count} << 40 |
                                   g.profile(g.candidates[pods[k].percent].front()).SizingMib(),
                               set.profile_of[k]};
  }
  std::sort(keys.begin(), keys.end());
  std::vector<uint32_t> rank(keys.size());
  std::vector<std::string> names(keys.size());
  std::vector<uint64_t> counts(keys.size());
  for (size_t r = 0; r < keys.size(); ++r) {
    rank[keys[r].second] = static_cast<uint32_t>(r);
    names[r] = res.profiles[keys[r].second];
    counts[r] = res.pods_by_profile[keys[r].second];
  }
  for (auto& k : set.profile_of) k = rank[k];
  res.profiles = std::move(names);
  res.pods_by_profile = std::move(counts);
}

// The sample axis of the utilization series (arrivals in fill mode, with the fill bound; seconds
// otherwise).
void SetSamples(const Cluster& cluster, const std::vector<SimPod>& pods, const SimOptions& options,
                SimResult& res) {
  const uint32_t samples = std::max<uint32_t>(options.samples, 2);
  if (options.mode == Mode::kFill) {
    res.sample_axis = "arrivals";
    for (uint32_t s = 0; s < samples; ++s) {
      res.sample_x.push_back(std::round(static_cast<double>(pods.size()) * s / (samples - 1)));
    }
    auto bound = ComputeFillBound(cluster, pods);
    if (bound.ok()) {
      res.bound = *bound;
    } else {
      res.bound_note = std::string(bound.status().message());
    }
    return;
  }
  res.sample_axis = "seconds";
  for (uint32_t s = 0; s < samples; ++s) {
    res.sample_x.push_back(res.start + (res.end - res.start) * s / (samples - 1));
  }
}

// Gap closed between hami-v2.10 and repack, when both ran.
void ComputeGap(const SimOptions& options, SimResult& res) {
  const PolicyResult* hami = nullptr;
  const PolicyResult* repack = nullptr;
  for (const auto& r : res.policies) {
    if (r.name == "hami-v2.10" || r.name == "hami") hami = &r;
    if (r.name == "repack") repack = &r;
  }
  if (hami == nullptr || repack == nullptr) return;
  auto metric = [&](const PolicyResult& r) {
    return options.mode == Mode::kFill ? r.filled : r.accepted_slice_time;
  };
  const double span = metric(*repack) - metric(*hami);
  res.has_gap = true;
  res.gap_span = span;
  if (span > 1e-9) {
    for (auto& r : res.policies) r.gap_closed = (metric(r) - metric(*hami)) / span;
  }
}

}  // namespace

absl::StatusOr<SimResult> Simulate(const Trace& trace, const Cluster& cluster,
                                   const std::vector<std::string>& policies,
                                   const SimOptions& options, const Clock& clock) {
  if (policies.empty()) return absl::InvalidArgumentError("--policy: no policy given");
  SimResult res = Describe(trace, cluster, options);
  DYNMIG_ASSIGN_OR_RETURN(PodSet set, CollectPods(trace, cluster, res));
  SortProfiles(cluster, set, res);
  SetSamples(cluster, set.pods, options, res);

  for (size_t k = 0; k < policies.size(); ++k) {
    DYNMIG_ASSIGN_OR_RETURN(auto policy, MakePolicy(policies[k], cluster, set.pods, options.warm));
    std::function<void(double)> progress;
    if (options.progress) {
      progress = [&, k](double f) { options.progress((k + f) / policies.size()); };
    }
    const absl::Duration t0 = clock.Monotonic();
    Run run(set.pods, res, set.profile_of, options, set.classes, set.asked_total, *policy, cluster,
            progress);
    DYNMIG_ASSIGN_OR_RETURN(PolicyResult r, run.Go());
    r.seconds = absl::ToDoubleSeconds(clock.Monotonic() - t0);
    if (r.warm.enabled) res.warm = options.warm;
    res.policies.push_back(std::move(r));
  }
  if (options.progress) options.progress(1.0);
  ComputeGap(options, res);
  return res;
}

}  // namespace dynmig::sim
