#include "sim/mode_sim.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>

#include "common/status_macros.h"
#include "common/strings.h"
#include "fmt/format.h"
#include "mig/mode_planner.h"
#include "sim/policies.h"

namespace dynmig::sim {
namespace {

constexpr double kNoTime = std::numeric_limits<double>::infinity();
constexpr std::string_view kSwitchPolicy = "dynmig:mode-switch";
constexpr size_t kMaxPoolPolicies = 1000;

// Events at one instant: departures, then finished switches, then arrivals (taken from the pod
// list, not this heap), then decision rounds.
enum EventKind : uint32_t { kDeparture = 0, kSwitchDone = 1, kRound = 3 };
struct Event {
  double time;
  uint32_t kind;
  uint32_t id;  // pod, GPU, or 0
};
bool EventLater(const Event& a, const Event& b) {
  if (a.time != b.time) return a.time > b.time;
  if (a.kind != b.kind) return a.kind > b.kind;
  return a.id > b.id;
}

double WaitPercentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(std::ceil(q * v.size())) - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

absl::StatusOr<absl::Duration> OptionDuration(std::string_view opt, std::string_view value,
                                              absl::Duration min, absl::Duration max) {
  absl::Duration d;
  if (value.empty() || value.size() > 16 || !absl::ParseDuration(std::string(value), &d) ||
      d < min || d > max) {
    return absl::InvalidArgumentError(
        fmt::format("policy {}: option \"{}\": expected a duration from {} to {}", kSwitchPolicy,
                    opt.substr(0, 64), absl::FormatDuration(min), absl::FormatDuration(max)));
  }
  return d;
}

// The pods of a mode run: MIG pods as the placement policy sees them, whole-GPU pods beside them
// (never given to the policy), then one "phantom" per GPU: a full-GPU instance that holds a GPU
// outside MIG mode (or switching) so that the policy places nothing on it.
struct ModePods {
  std::vector<SimPod> pods;
  std::vector<uint8_t> whole;  // by pod
  std::vector<uint32_t> cls;   // retry class: whole pods by GPU count, MIG pods by request
  std::vector<double> gpus;    // GPUs a pod asks for (MIG: asked slices / a GPU's slices)
  uint32_t phantom_first = 0;  // pods[phantom_first + g] holds GPU g
  uint32_t classes = 0;
  double total_gpu_time = 0, whole_gpu_time = 0, mig_gpu_time = 0;
};

absl::StatusOr<ModePods> CollectModePods(const Trace& trace, const Cluster& cluster,
                                         ModeSimResult& res) {
  ModePods set;
  const double unit_gpus = cluster.groups.front().units;
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> mig_cls;
  set.classes = kMaxInstancesPerPod + 1;  // 0..16: whole pods by count
  uint32_t slots = 0;
  for (const auto& tp : trace.pods) {
    if (tp.count == 0 || tp.count > kMaxInstancesPerPod || tp.percent == 0 || tp.percent > 100) {
      return absl::InvalidArgumentError(fmt::format("{}: pod at line {} asks for {} GPU(s) of {}%",
                                                    trace.source, tp.line, tp.count, tp.percent));
    }
    if ((tp.whole && tp.count > cluster.gpus_per_node) ||
        (!tp.whole && !cluster.Servable(tp.percent))) {
      ++res.unservable;
      continue;
    }
    SimPod sp;
    sp.arrival = tp.arrival;
    sp.departure = tp.departure;
    sp.count = tp.count;
    sp.percent = tp.percent;
    sp.line = tp.line;
    sp.inst_offset = slots;
    slots += tp.count;
    sp.asked_units = cluster.AskedUnits(tp.count, tp.percent);
    double gpus = tp.whole ? tp.count : sp.asked_units / unit_gpus;
    uint32_t cls = tp.count;
    if (!tp.whole) {
      auto [it, added] = mig_cls.emplace(std::make_pair(tp.count, tp.percent), set.classes);
      if (added) ++set.classes;
      cls = it->second;
    }
    sp.cls = cls;  // the policies cache what they learn per request class
    const double gpu_time = gpus * (sp.departure - sp.arrival);
    set.total_gpu_time += gpu_time;
    (tp.whole ? set.whole_gpu_time : set.mig_gpu_time) += gpu_time;
    (tp.whole ? res.whole_pods : res.mig_pods) += 1;
    set.pods.push_back(sp);
    set.whole.push_back(tp.whole ? 1 : 0);
    set.cls.push_back(cls);
    set.gpus.push_back(gpus);
  }
  res.pods = set.pods.size();
  set.phantom_first = static_cast<uint32_t>(set.pods.size());
  for (uint32_t g = 0; g < cluster.gpu_count(); ++g) {
    SimPod sp;
    sp.count = 1;
    sp.percent = 100;
    sp.inst_offset = slots++;
    sp.asked_units = cluster.group_of_gpu(g).units;
    auto [it, added] = mig_cls.emplace(std::make_pair(1u, 100u), set.classes);
    if (added) ++set.classes;
    sp.cls = it->second;
    set.pods.push_back(sp);
  }
  return set;
}

struct GpuMode {
  mig::ModeKind mode = mig::ModeKind::kMig;
  bool switching = false;
  mig::ModeKind to = mig::ModeKind::kMig;
  double since = 0;        // entered its mode
  int64_t whole_pod = -1;  // the whole-GPU pod on it
  uint32_t instances = 0;  // MIG instances on it
};

// One policy's run.
class ModeRun {
 public:
  ModeRun(const ModePods& set, const Cluster& cluster, const ModeSimResult& res,
          const ModePolicySpec& spec, const mig::NvmlLatency& latency, Policy& policy)
      : set_(set),
        cluster_(cluster),
        res_(res),
        spec_(spec),
        latency_(latency),
        policy_(policy),
        failed_pass_(set.classes, 0) {
    const size_t n = set.phantom_first;
    start_.assign(n, -1);
    gpus_of_.resize(n);
    gpu_.resize(cluster.gpu_count());
    min_s_ = absl::ToDoubleSeconds(spec.min_mode_duration);
    interval_s_ = absl::ToDoubleSeconds(spec.interval);
    for (auto& g : gpu_) g.since = res.start - min_s_;  // in its mode long enough at the start
  }

  absl::StatusOr<ModePolicyResult> Go() {
    out_.name = spec_.name;
    out_.switching = spec_.switching;
    out_.whole_gpus_at_start = spec_.switching ? 0 : spec_.whole_gpus;
    for (uint32_t g = 0; g < out_.whole_gpus_at_start; ++g) {
      DYNMIG_RETURN_IF_ERROR(HoldForWhole(g));
      gpu_[g].mode = mig::ModeKind::kWhole;
    }
    DYNMIG_RETURN_IF_ERROR(Events());
    Summarize();
    return std::move(out_);
  }

 private:
  uint32_t Phantom(uint32_t g) const { return set_.phantom_first + g; }

  // Takes GPU g away from MIG placement (whole mode, or switching).
  absl::Status HoldForWhole(uint32_t g) {
    const ModelGroup& grp = cluster_.group_of_gpu(g);
    const uint32_t full = grp.candidates[100].front();
    return policy_.PlaceExactly(Phantom(g), g, full, grp.profile(full).placements.front());
  }

  absl::Status Violation(const std::string& what) const {
    return absl::InternalError(
        fmt::format("invariant violated by policy {}: {}", spec_.name, what));
  }

  void Advance(double t) {
    t = std::min(t, res_.end);
    if (t > last_t_) {
      whole_area_ += static_cast<double>(whole_now_) * (t - last_t_);
      last_t_ = t;
    }
  }

  void Push(double time, uint32_t kind, uint32_t id) {
    heap_.push_back({time, kind, id});
    std::push_heap(heap_.begin(), heap_.end(), EventLater);
  }

  bool WholeFree(uint32_t g) const {
    const GpuMode& m = gpu_[g];
    return m.mode == mig::ModeKind::kWhole && !m.switching && m.whole_pod < 0;
  }

  // A whole-GPU pod on `node` (or the node with the fewest free whole GPUs that suffice).
  absl::StatusOr<bool> PlaceWhole(uint32_t pod, int32_t node) {
    const uint32_t need = set_.pods[pod].count;
    int32_t best = -1;
    uint32_t best_free = 0;
    const uint32_t first = node < 0 ? 0 : static_cast<uint32_t>(node);
    const uint32_t last = node < 0 ? cluster_.node_count() : first + 1;
    for (uint32_t n = first; n < last; ++n) {
      uint32_t free = 0;
      for (uint32_t k = 0; k < cluster_.node_gpus[n]; ++k) {
        free += WholeFree(cluster_.node_first_gpu[n] + k) ? 1 : 0;
      }
      if (free >= need && (best < 0 || free < best_free)) {
        best = static_cast<int32_t>(n);
        best_free = free;
      }
    }
    if (best < 0) return false;
    auto& gpus = gpus_of_[pod];
    const uint32_t g0 = cluster_.node_first_gpu[best];
    for (uint32_t k = 0; k < cluster_.node_gpus[best] && gpus.size() < need; ++k) {
      const uint32_t g = g0 + k;
      if (!WholeFree(g)) continue;
      if (gpu_[g].instances != 0) {
        return Violation(
            fmt::format("GPU {} is whole but holds {} MIG instance(s)", g, gpu_[g].instances));
      }
      gpu_[g].whole_pod = pod;
      gpus.push_back(g);
    }
    return true;
  }

  absl::StatusOr<bool> PlaceMig(uint32_t pod, int32_t node) {
    DYNMIG_ASSIGN_OR_RETURN(const bool placed, policy_.Place(pod, node));
    if (!placed) return false;
    gpus_of_[pod] = policy_.GpusOf(pod);
    for (uint32_t g : gpus_of_[pod]) {
      if (gpu_[g].mode != mig::ModeKind::kMig || gpu_[g].switching) {
        return Violation(fmt::format("pod at line {} got an instance on GPU {}, which is {}",
                                     set_.pods[pod].line, g,
                                     gpu_[g].switching ? "switching" : "whole"));
      }
      ++gpu_[g].instances;
    }
    return true;
  }

  absl::StatusOr<bool> Place(uint32_t pod, int32_t node) {
    return set_.whole[pod] ? PlaceWhole(pod, node) : PlaceMig(pod, node);
  }

  absl::Status Remove(uint32_t pod) {
    if (set_.whole[pod]) {
      for (uint32_t g : gpus_of_[pod]) gpu_[g].whole_pod = -1;
    } else {
      for (uint32_t g : gpus_of_[pod]) --gpu_[g].instances;
      DYNMIG_RETURN_IF_ERROR(policy_.Remove(pod));
    }
    gpus_of_[pod].clear();
    return absl::OkStatus();
  }

  void Started(uint32_t pod, double t) {
    start_[pod] = t;
    const SimPod& p = set_.pods[pod];
    Push(t + (p.departure - p.arrival), kDeparture, pod);
  }

  absl::Status Retry(uint32_t node, double t) {
    ++pass_;
    next_queue_.clear();
    for (uint32_t pod : queue_) {
      const uint32_t cls = set_.cls[pod];
      if (failed_pass_[cls] == pass_) {
        next_queue_.push_back(pod);
        continue;
      }
      DYNMIG_ASSIGN_OR_RETURN(const bool placed, Place(pod, static_cast<int32_t>(node)));
      if (placed) {
        Started(pod, t);
      } else {
        failed_pass_[cls] = pass_;
        next_queue_.push_back(pod);
      }
    }
    queue_.swap(next_queue_);
    return absl::OkStatus();
  }

  void ScheduleRound(double at) {
    if (!spec_.switching || at >= next_round_ || at > res_.end) return;
    next_round_ = at;
    Push(at, kRound, 0);
  }
  void MaybeRound(double t) {
    if (!queue_.empty()) ScheduleRound(std::max(t, last_round_ + interval_s_));
  }

  static int64_t Ms(double seconds) { return std::llround(seconds * 1000.0); }

  mig::ModePlanInput RoundInput(double t) const {
    mig::ModePlanInput in;
    in.now_ms = Ms(t);
    in.min_mode_duration_ms = Ms(min_s_);
    in.seen = seen_;
    for (uint32_t n = 0; n < cluster_.node_count(); ++n) {
      mig::ModeNode node;
      node.name = fmt::format("node-{:05}", n);
      const ModelGroup& grp = cluster_.group_of_node(n);
      const mig::ProfileSpec& smallest = grp.profile(grp.planner->allowed().front());
      for (uint32_t k = 0; k < cluster_.node_gpus[n]; ++k) {
        const uint32_t g = cluster_.node_first_gpu[n] + k;
        const GpuMode& m = gpu_[g];
        mig::ModeGpu gpu;
        gpu.uuid = fmt::format("GPU-{}", g);
        gpu.index = k;
        gpu.model = grp.cap().model;
        gpu.mode = m.mode;
        gpu.mig_capable = true;
        gpu.may_switch = true;
        gpu.switchable = true;
        gpu.since_ms = Ms(m.since);
        gpu.idle = m.whole_pod < 0 && m.instances == 0;
        if (!gpu.idle) gpu.busy_reason = m.whole_pod >= 0 ? "a whole-GPU pod" : "MIG instances";
        gpu.switching = m.switching;
        gpu.switching_to = m.to;
        gpu.memory_mib = grp.cap().total_memory_mib;
        gpu.mig_slots = std::max<uint32_t>(smallest.instance_count, 1);
        node.gpus.push_back(std::move(gpu));
      }
      in.nodes.push_back(std::move(node));
    }
    for (uint32_t pod : queue_) {
      if (in.demand.size() >= mig::kMaxModeDemands) break;
      mig::ModeDemand d;
      d.pod = fmt::format("pod-{}", pod);
      d.wants = set_.whole[pod] ? mig::ModeKind::kWhole : mig::ModeKind::kMig;
      d.gpus = set_.pods[pod].count;
      in.demand.push_back(std::move(d));
    }
    return in;
  }

  // One decision round of the scheduler's leader loop: the pure core decides, the simulation
  // carries the switches out (the device plugin's part) after the switch latency.
  absl::Status Round(double t) {
    last_round_ = t;
    if (queue_.empty()) {
      seen_.clear();
      return absl::OkStatus();
    }
    ++out_.rounds;
    const mig::ModePlanInput in = RoundInput(t);
    const mig::ModePlan plan = mig::PlanModeSwitches(in);
    bool again = !plan.switches.empty();
    double hysteresis = kNoTime;
    for (const auto& v : plan.verdicts) {
      if (v.code == "demand-unconfirmed" || v.code == "node-busy") again = true;
      if (v.code == "hysteresis") hysteresis = std::min(hysteresis, v.until_ms / 1000.0);
    }
    seen_ = plan.seen;
    for (const auto& s : plan.switches) {
      const uint32_t n = static_cast<uint32_t>(std::stoul(s.node.substr(5)));
      DYNMIG_RETURN_IF_ERROR(Switch(cluster_.node_first_gpu[n] + s.index, s.to, t));
    }
    if (again) ScheduleRound(t + interval_s_);
    if (hysteresis < kNoTime) ScheduleRound(std::max(hysteresis, t + interval_s_));
    return absl::OkStatus();
  }

  absl::Status Switch(uint32_t g, mig::ModeKind to, double t) {
    GpuMode& m = gpu_[g];
    if (!spec_.switching) return Violation(fmt::format("fixed pools switched GPU {}", g));
    if (m.switching || m.whole_pod >= 0 || m.instances != 0 || m.mode == to) {
      return Violation(fmt::format(
          "GPU {} switched while {}", g,
          m.switching ? "switching" : (m.mode == to ? "already in the mode" : "in use")));
    }
    if (m.since + min_s_ > t + 1e-3) {
      return Violation(fmt::format("GPU {} switched {:.1f} s after its last switch (minimum {} s)",
                                   g, t - m.since, min_s_));
    }
    if (to == mig::ModeKind::kWhole) {
      DYNMIG_RETURN_IF_ERROR(HoldForWhole(g));
      ++out_.switches_to_whole;
      ++whole_now_;
    } else {
      ++out_.switches_to_mig;
      --whole_now_;
    }
    m.switching = true;
    m.to = to;
    const std::string& model = cluster_.group_of_gpu(g).cap().model;
    const double took =
        absl::ToDoubleSeconds(latency_.MigModeSwitch(model, !mig::SwitchesWithoutReset(model)));
    out_.switch_gpu_hours += took / 3600.0;
    Push(t + took, kSwitchDone, g);
    return absl::OkStatus();
  }

  absl::Status SwitchDone(uint32_t g, double t) {
    GpuMode& m = gpu_[g];
    m.switching = false;
    m.mode = m.to;
    m.since = t;
    if (m.mode == mig::ModeKind::kMig) DYNMIG_RETURN_IF_ERROR(policy_.Remove(Phantom(g)));
    if (!queue_.empty()) DYNMIG_RETURN_IF_ERROR(Retry(cluster_.gpu_node[g], t));
    return absl::OkStatus();
  }

  absl::Status Step(const Event& e) {
    if (e.kind == kDeparture) {
      const uint32_t node = cluster_.gpu_node[gpus_of_[e.id].front()];
      DYNMIG_RETURN_IF_ERROR(Remove(e.id));
      if (!queue_.empty() && e.time < res_.end) DYNMIG_RETURN_IF_ERROR(Retry(node, e.time));
    } else if (e.kind == kSwitchDone) {
      DYNMIG_RETURN_IF_ERROR(SwitchDone(e.id, e.time));
    } else {
      if (e.time != next_round_) return absl::OkStatus();  // superseded by an earlier one
      next_round_ = kNoTime;
      return Round(e.time);
    }
    MaybeRound(e.time);
    return absl::OkStatus();
  }

  absl::Status Events() {
    last_t_ = res_.start;
    whole_now_ = out_.whole_gpus_at_start;
    size_t i = 0;
    const size_t n = set_.phantom_first;
    while (true) {
      const double t_arr = i < n ? set_.pods[i].arrival : kNoTime;
      const double t_ev = heap_.empty() ? kNoTime : heap_.front().time;
      if (t_arr == kNoTime && t_ev == kNoTime) break;
      if (t_ev <= t_arr) {
        if (t_ev > res_.end) break;
        Advance(t_ev);
        std::pop_heap(heap_.begin(), heap_.end(), EventLater);
        const Event e = heap_.back();
        heap_.pop_back();
        // Rounds come after the arrivals of the same instant.
        if (e.kind == kRound && t_arr == t_ev) {
          Push(e.time, e.kind, e.id);
        } else {
          DYNMIG_RETURN_IF_ERROR(Step(e));
          continue;
        }
      }
      Advance(t_arr);
      const uint32_t pod = static_cast<uint32_t>(i++);
      DYNMIG_ASSIGN_OR_RETURN(const bool placed, Place(pod, -1));
      if (placed) {
        Started(pod, t_arr);
      } else {
        queue_.push_back(pod);
      }
      MaybeRound(t_arr);
      if (options_progress_ && (i & 4095) == 0) options_progress_(static_cast<double>(i) / n);
    }
    Advance(res_.end);
    return absl::OkStatus();
  }

  void Summarize() {
    const size_t n = set_.phantom_first;
    std::vector<double> waits(n);
    double sum = 0, acc = 0, acc_whole = 0, acc_mig = 0;
    for (size_t k = 0; k < n; ++k) {
      const SimPod& p = set_.pods[k];
      if (start_[k] >= 0) {
        ++out_.accepted;
        ++(set_.whole[k] ? out_.whole_accepted : out_.mig_accepted);
        const double gt = set_.gpus[k] * (p.departure - p.arrival);
        acc += gt;
        (set_.whole[k] ? acc_whole : acc_mig) += gt;
        waits[k] = start_[k] - p.arrival;
      } else {
        ++out_.never_started;
        waits[k] = std::max(0.0, res_.end - p.arrival);
      }
      sum += waits[k];
    }
    auto frac = [](double a, double b) { return b > 0 ? a / b : 0.0; };
    out_.accepted_count = frac(static_cast<double>(out_.accepted), static_cast<double>(n));
    out_.accepted_gpu_time = frac(acc, set_.total_gpu_time);
    out_.whole_gpu_time = frac(acc_whole, set_.whole_gpu_time);
    out_.mig_gpu_time = frac(acc_mig, set_.mig_gpu_time);
    out_.pending_mean = frac(sum, static_cast<double>(n));
    out_.pending_p50 = WaitPercentile(waits, 0.50);
    out_.pending_p99 = WaitPercentile(waits, 0.99);
    const double span = res_.end - res_.start;
    out_.mean_whole_gpus = span > 0 ? whole_area_ / span : static_cast<double>(whole_now_);
  }

 public:
  std::function<void(double)> options_progress_;

 private:
  const ModePods& set_;
  const Cluster& cluster_;
  const ModeSimResult& res_;
  const ModePolicySpec& spec_;
  const mig::NvmlLatency& latency_;
  Policy& policy_;
  ModePolicyResult out_;
  std::vector<Event> heap_;
  std::vector<uint32_t> queue_, next_queue_;
  std::vector<uint64_t> failed_pass_;
  uint64_t pass_ = 0;
  std::vector<double> start_;
  std::vector<std::vector<uint32_t>> gpus_of_;
  std::vector<GpuMode> gpu_;
  std::set<std::string> seen_;
  double min_s_ = 600, interval_s_ = 2;
  double last_round_ = -kNoTime;
  double next_round_ = kNoTime;
  double last_t_ = 0;
  double whole_area_ = 0;
  uint64_t whole_now_ = 0;
};

std::string ShortModel(std::string model) {
  if (model.starts_with("NVIDIA ")) model = model.substr(7);
  return model;
}

}  // namespace

bool IsModePolicy(std::string_view spec) {
  return spec.starts_with("pools:") || spec == kSwitchPolicy ||
         spec.starts_with(std::string(kSwitchPolicy) + "+");
}

absl::StatusOr<ModePolicySpec> ParseModePolicy(std::string_view spec, const Cluster& cluster) {
  ModePolicySpec out;
  out.name = std::string(spec.substr(0, 128));
  if (spec.starts_with("pools:")) {
    const std::string_view k = spec.substr(6);
    uint64_t v = 0;
    auto [ptr, ec] = std::from_chars(k.data(), k.data() + k.size(), v);
    if (k.empty() || k.size() > 9 || ec != std::errc() || ptr != k.data() + k.size() ||
        v > cluster.gpu_count()) {
      return absl::InvalidArgumentError(
          fmt::format("policy \"{}\": pools:K takes a whole number of GPUs from 0 to {}",
                      spec.substr(0, 64), cluster.gpu_count()));
    }
    out.whole_gpus = static_cast<uint32_t>(v);
    return out;
  }
  if (!IsModePolicy(spec)) {
    return absl::InvalidArgumentError(
        fmt::format("policy \"{}\" is not pools:K or {}", spec.substr(0, 64), kSwitchPolicy));
  }
  out.switching = true;
  const auto parts = SplitTrimmed(spec, '+');
  for (size_t k = 1; k < parts.size(); ++k) {
    const std::string& opt = parts[k];
    if (opt.starts_with("min-")) {
      DYNMIG_ASSIGN_OR_RETURN(
          out.min_mode_duration,
          OptionDuration(opt, opt.substr(4), absl::Seconds(10), absl::Hours(24)));
    } else if (opt.starts_with("interval-")) {
      DYNMIG_ASSIGN_OR_RETURN(
          out.interval, OptionDuration(opt, opt.substr(9), absl::Seconds(1), absl::Minutes(10)));
    } else {
      return absl::InvalidArgumentError(
          fmt::format("policy {}: unknown option \"{}\" (known: min-DURATION, interval-DURATION)",
                      kSwitchPolicy, opt.substr(0, 64)));
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ExpandPools(std::string_view pools,
                                                     const Cluster& cluster) {
  std::vector<std::string> out;
  if (pools == "sweep" || pools.starts_with("sweep:")) {
    uint64_t step = cluster.gpus_per_node;
    if (pools.starts_with("sweep:")) {
      const std::string_view s = pools.substr(6);
      auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), step);
      if (s.empty() || s.size() > 9 || ec != std::errc() || ptr != s.data() + s.size() ||
          step == 0) {
        return absl::InvalidArgumentError(
            fmt::format("--pools \"{}\": sweep:STEP takes a whole number of GPUs above 0",
                        pools.substr(0, 64)));
      }
    }
    for (uint64_t k = 0;; k += step) {
      const uint64_t v = std::min<uint64_t>(k, cluster.gpu_count());
      out.push_back(fmt::format("pools:{}", v));
      if (v == cluster.gpu_count()) break;
      if (out.size() > kMaxPoolPolicies) break;
    }
  } else {
    for (const auto& k : SplitTrimmed(pools, ',')) out.push_back("pools:" + k);
  }
  if (out.empty() || out.size() > kMaxPoolPolicies) {
    return absl::InvalidArgumentError(
        fmt::format("--pools: {} fixed splits (expected 1 to {}; a larger sweep:STEP runs fewer)",
                    out.size(), kMaxPoolPolicies));
  }
  for (const auto& p : out) {
    auto spec = ParseModePolicy(p, cluster);
    if (!spec.ok())
      return absl::InvalidArgumentError("--pools: " + std::string(spec.status().message()));
  }
  return out;
}

absl::StatusOr<ModeSimResult> SimulateModes(const Trace& trace, const Cluster& cluster,
                                            const std::vector<std::string>& policies,
                                            const ModeSimOptions& options, const Clock& clock) {
  if (policies.empty()) return absl::InvalidArgumentError("--policy: no policy given");
  std::vector<ModePolicySpec> specs;
  for (const auto& p : policies) {
    DYNMIG_ASSIGN_OR_RETURN(ModePolicySpec s, ParseModePolicy(p, cluster));
    specs.push_back(std::move(s));
  }
  ModeSimResult res;
  res.trace = trace.source;
  res.gpus = cluster.gpu_count();
  res.gpus_per_node = cluster.gpus_per_node;
  res.cpu_only = trace.cpu_only;
  res.start = trace.start;
  res.end = trace.end;
  res.nvml_latency = options.nvml_latency.ToString();
  for (const auto& g : cluster.groups) {
    const std::string& model = g.cap().model;
    const bool reset = !mig::SwitchesWithoutReset(model);
    res.cluster +=
        fmt::format("{}{} x {}", res.cluster.empty() ? "" : " + ", ShortModel(model), g.gpus);
    res.switch_times.push_back(
        fmt::format("{} {}{}", ShortModel(model),
                    absl::FormatDuration(options.nvml_latency.MigModeSwitch(model, reset)),
                    reset ? " (with a GPU reset)" : ""));
  }
  DYNMIG_ASSIGN_OR_RETURN(const ModePods set, CollectModePods(trace, cluster, res));
  for (size_t k = 0; k < specs.size(); ++k) {
    DYNMIG_ASSIGN_OR_RETURN(auto policy, MakePolicy("dynmig", cluster, set.pods));
    const absl::Duration t0 = clock.Monotonic();
    ModeRun run(set, cluster, res, specs[k], options.nvml_latency, *policy);
    if (options.progress) {
      run.options_progress_ = [&, k](double f) {
        options.progress((static_cast<double>(k) + f) / specs.size());
      };
    }
    DYNMIG_ASSIGN_OR_RETURN(ModePolicyResult r, run.Go());
    r.seconds = absl::ToDoubleSeconds(clock.Monotonic() - t0);
    res.policies.push_back(std::move(r));
  }
  for (size_t k = 0; k < res.policies.size(); ++k) {
    const auto& r = res.policies[k];
    if (r.switching) continue;
    if (res.best_pools < 0) {
      res.best_pools = static_cast<int>(k);
      continue;
    }
    const auto& b = res.policies[res.best_pools];
    if (r.accepted_gpu_time > b.accepted_gpu_time ||
        (r.accepted_gpu_time == b.accepted_gpu_time && r.accepted > b.accepted)) {
      res.best_pools = static_cast<int>(k);
    }
  }
  if (options.progress) options.progress(1.0);
  return res;
}

}  // namespace dynmig::sim
