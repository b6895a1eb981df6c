// ModeSwitcher: the leader asks idle GPUs to change mode. See mode_switcher.h.
#include "scheduler/mode_switcher.h"

#include <algorithm>
#include <span>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "fmt/format.h"
#include "kube/object.h"
#include "mig/node_planner.h"
#include "protocol/annotations.h"
#include "protocol/devices.h"
#include "protocol/node_register.h"
#include "scheduler/node_lock.h"

namespace dynmig::scheduler {
namespace {

using kube::Object;

constexpr std::string_view kLockPod = "dynmig-mode-switch";
constexpr size_t kMaxEventPods = 16;  // pods told about one switch

std::string SwitchPodKey(const Object& o) { return kube::Namespace(o) + "/" + kube::Name(o); }

absl::Time SwitchCreatedAt(const Object& o) {
  auto t = kube::ParseRfc3339(kube::StringAt(o, "/metadata/creationTimestamp"));
  return t.ok() ? *t : absl::InfinitePast();
}

mig::ModeKind Kind(protocol::GpuMode m) {
  return m == protocol::GpuMode::kMig ? mig::ModeKind::kMig : mig::ModeKind::kWhole;
}
protocol::GpuMode Mode(mig::ModeKind m) {
  return m == mig::ModeKind::kMig ? protocol::GpuMode::kMig : protocol::GpuMode::kWholeGpu;
}

std::string SwitchWhere(const std::string& node, uint32_t index, const std::string& uuid) {
  return fmt::format("GPU {} ({}) of {}", index, uuid, node);
}

std::string RequestId(const protocol::GpuModeRequest& r) {
  return fmt::format("{}@{}", r.gpu_uuid, r.at_ms);
}

}  // namespace

std::string RefusalCode(std::string_view reason) {
  const std::string lower =
      absl::AsciiStrToLower(std::string(reason.substr(0, protocol::kMaxModeText)));
  if (absl::StrContains(lower, "reboot")) return "needs-reboot";
  if (absl::StrContains(lower, "reset")) return "needs-reset";
  return "refused";
}

// What one pass reads: the Nodes with their decoded mode annotations, the Pods.
struct ModeSwitcher::Cluster {
  struct Node {
    const Object* object = nullptr;
    std::string name;
    std::vector<protocol::GpuModeRequest> requests;
    bool requests_unreadable = false;
    std::map<std::string, protocol::GpuModeStatus> statuses;  // by GPU UUID
    std::map<std::string, protocol::DeviceInfo> registered;   // by GPU UUID
    std::set<std::string> named;  // GPU UUIDs the device annotations of its pods name
  };
  std::vector<Object> nodes;
  std::vector<Object> pods;
  std::vector<Node> view;
  std::map<std::string, const Object*> pod_by_key;
};

ModeSwitcher::ModeSwitcher(kube::KubeClient& client, const ClusterState& state, const Clock& clock,
                           EventRecorder* events, SchedulerMetrics* metrics,
                           ModeSwitcherOptions options)
    : client_(client),
      state_(state),
      clock_(clock),
      events_(events),
      metrics_(metrics),
      options_(std::move(options)) {}

std::vector<mig::ModeGpuVerdict> ModeSwitcher::Verdicts() const {
  dynmig::MutexLock lock(&mu_);
  return verdicts_;
}

void ModeSwitcher::EventOnPods(const Cluster& c, const std::vector<std::string>& pods,
                               std::string_view type, std::string_view reason,
                               const std::string& message) {
  if (events_ == nullptr) return;
  for (size_t i = 0; i < pods.size() && i < kMaxEventPods; ++i) {
    auto it = c.pod_by_key.find(pods[i]);
    if (it != c.pod_by_key.end()) events_->Record(*it->second, type, reason, message);
  }
}

absl::Status ModeSwitcher::WriteUnderLock(
    const std::string& node,
    const std::function<absl::Status(std::vector<protocol::GpuModeRequest>&)>& change,
    absl::Time now) {
  const LockOwner owner{options_.lock_namespace, kLockPod, ""};
  if (auto st = AcquireNodeLock(client_, node, owner, now); !st.ok()) return st;
  absl::Status result = [&]() -> absl::Status {
    auto current = client_.GetNode(node);
    if (!current.ok()) return current.status();
    std::vector<protocol::GpuModeRequest> requests;
    if (auto value = kube::Annotation(*current, protocol::kGpuModeRequestAnnotation)) {
      auto decoded = protocol::DecodeGpuModeRequests(*value);
      if (decoded.ok()) requests = std::move(*decoded);  // unreadable: replaced
    }
    if (auto st = change(requests); !st.ok()) return st;
    kube::KeyPatch patch;
    patch[std::string(protocol::kGpuModeRequestAnnotation)] =
        requests.empty() ? std::nullopt
                         : std::optional<std::string>(protocol::EncodeGpuModeRequests(requests));
    auto patched = client_.PatchNodeAnnotations(node, patch, kube::ResourceVersion(*current));
    return patched.ok() ? absl::OkStatus() : patched.status();
  }();
  if (auto st = ReleaseNodeLock(client_, node, owner); !st.ok() && result.ok()) result = st;
  return result;
}

void ModeSwitcher::Tidy(Cluster& c, absl::Time now, Outcome& out) {
  for (auto& n : c.view) {
    if (n.requests.empty() && !n.requests_unreadable) continue;
    std::vector<protocol::GpuModeRequest> keep;
    std::set<std::string> drop;  // request ids
    for (const auto& r : n.requests) {
      auto st = n.statuses.find(r.gpu_uuid);
      const protocol::GpuModeStatus* status = st == n.statuses.end() ? nullptr : &st->second;
      const std::string id = RequestId(r);
      std::vector<std::string> pods;
      if (auto it = requested_for_.find(id); it != requested_for_.end()) pods = it->second;
      if (status != nullptr && protocol::StatusAnswers(*status, r)) {
        drop.insert(id);
        if (status->phase == protocol::GpuModePhase::kRefused) {
          const std::string code = RefusalCode(status->reason);
          out.refused.push_back(fmt::format("{}: {}: {}", n.name, r.gpu_uuid, status->reason));
          refused_at_[r.gpu_uuid] = now;
          if (metrics_ != nullptr) metrics_->CountModeSwitchRefusal(n.name, code);
          EventOnPods(c, pods, "Warning", "GpuModeSwitchRefused",
                      fmt::format("GPU {} of {} did not switch to {} mode: {}", r.gpu_uuid, n.name,
                                  protocol::GpuModeName(r.to), status->reason));
        } else {
          out.removed.push_back(fmt::format("{}: {} (now {})", n.name, r.gpu_uuid,
                                            protocol::GpuModeName(status->mode)));
          // Switching lasted from the request to the mode's new `since` (or to now).
          const int64_t end_ms =
              status->since_ms >= r.at_ms ? status->since_ms : absl::ToUnixMillis(now);
          if (metrics_ != nullptr) {
            metrics_->AddModeSwitchSeconds(
                n.name, static_cast<double>(std::max<int64_t>(0, end_ms - r.at_ms)) / 1000.0);
          }
        }
      } else if (now - absl::FromUnixMillis(r.at_ms) > options_.answer_timeout) {
        drop.insert(id);
        out.withdrawn.push_back(fmt::format("{}: {} (no answer since {})", n.name, r.gpu_uuid,
                                            kube::Rfc3339(absl::FromUnixMillis(r.at_ms))));
        silent_at_[n.name] = now;
        if (metrics_ != nullptr) metrics_->CountModeSwitchRefusal(n.name, "timeout");
        EventOnPods(c, pods, "Warning", "GpuModeSwitchTimedOut",
                    fmt::format("GPU {} of {} did not answer its switch to {} mode within {}: "
                                "request withdrawn",
                                r.gpu_uuid, n.name, protocol::GpuModeName(r.to),
                                absl::FormatDuration(options_.answer_timeout)));
      } else {
        keep.push_back(r);
      }
    }
    if (drop.empty() && !n.requests_unreadable) continue;
    auto st = WriteUnderLock(
        n.name,
        [&](std::vector<protocol::GpuModeRequest>& requests) {
          std::erase_if(requests, [&](const auto& r) { return drop.count(RequestId(r)) > 0; });
          return absl::OkStatus();
        },
        now);
    if (!st.ok()) {
      out.errors.push_back(fmt::format("node {}: tidy {}: {}", n.name,
                                       protocol::kGpuModeRequestAnnotation,
                                       std::string(st.message())));
      continue;
    }
    if (n.requests_unreadable) {
      out.removed.push_back(
          fmt::format("{}: unreadable {}", n.name, protocol::kGpuModeRequestAnnotation));
    }
    for (const auto& id : drop) requested_for_.erase(id);
    n.requests = std::move(keep);
    n.requests_unreadable = false;
  }
}

mig::ModePlanInput ModeSwitcher::BuildInput(const Cluster& c, absl::Time now) const {
  mig::ModePlanInput in;
  in.now_ms = absl::ToUnixMillis(now);
  in.min_mode_duration_ms = absl::ToInt64Milliseconds(options_.config.min_mode_duration);
  in.seen = seen_;
  std::map<std::string, const NodeReport*> reports;
  const std::vector<NodeReport> all = state_.Report(now);
  for (const auto& r : all) reports[r.name] = &r;
  for (const auto& n : c.view) {
    if (n.statuses.empty()) continue;  // the plugin publishes no mode: nothing to switch
    const auto labels = kube::Labels(*n.object);
    const std::map<std::string, std::string, std::less<>> node_labels(labels.begin(), labels.end());
    std::map<std::string, const GpuReport*> gpu_reports;
    std::map<std::string, const WholeGpuReport*> whole_reports;
    bool node_healthy = false;
    if (auto it = reports.find(n.name); it != reports.end()) {
      node_healthy = it->second->healthy;
      for (const auto& g : it->second->gpus) gpu_reports[g.uuid] = &g;
      for (const auto& g : it->second->whole_gpus) whole_reports[g.uuid] = &g;
    }
    std::map<std::string, const protocol::GpuModeRequest*> requests;
    for (const auto& r : n.requests) requests[r.gpu_uuid] = &r;
    mig::ModeNode node;
    node.name = n.name;
    for (const auto& [uuid, s] : n.statuses) {
      mig::ModeGpu g;
      g.uuid = uuid;
      g.mode = Kind(s.mode);
      g.mig_capable = s.mig_capable;
      g.switchable = s.switchable;
      g.not_switchable_reason = s.reason;
      g.since_ms = s.since_ms;
      if (auto reg = n.registered.find(uuid); reg != n.registered.end()) {
        g.index = reg->second.index;
        g.model = reg->second.type;
        g.memory_mib = reg->second.devmem_mib;
      }
      g.may_switch = options_.config.MaySwitch(g.model, node_labels);
      if (auto refused = refused_at_.find(uuid);
          refused != refused_at_.end() &&
          now - refused->second < options_.config.min_mode_duration) {
        g.switchable = false;
        g.not_switchable_reason = fmt::format("its last switch was refused or timed out at {}",
                                              kube::Rfc3339(refused->second));
      }
      if (auto silent = silent_at_.find(n.name);
          silent != silent_at_.end() && now - silent->second < options_.config.min_mode_duration) {
        g.switchable = false;
        g.not_switchable_reason =
            fmt::format("the device plugin of {} did not answer a switch (withdrawn at {})", n.name,
                        kube::Rfc3339(silent->second));
      }
      if (auto r = requests.find(uuid); r != requests.end()) {
        g.switching = protocol::HeldForSwitch(*r->second, &s);
        g.switching_to = Kind(r->second->to);
      }
      if (s.phase == protocol::GpuModePhase::kSwitching && !g.switching) {
        g.switching = true;  // the plugin is switching without our request (an operator's)
        g.switching_to =
            g.mode == mig::ModeKind::kMig ? mig::ModeKind::kWhole : mig::ModeKind::kMig;
      }
      // Idle: nothing of the scheduler's view and no pod's devices on it.
      const auto report = gpu_reports.find(uuid);
      const auto whole = whole_reports.find(uuid);
      if (!n.registered.count(uuid)) {
        g.busy_reason = "the device plugin does not publish it";
      } else if (!node_healthy) {
        g.busy_reason = "its node is unhealthy";
      } else if (n.named.count(uuid)) {
        g.busy_reason = "a pod's devices name it";
      } else if (whole != whole_reports.end() && !whole->second->holder.empty()) {
        // A whole GPU reserved for a pod (its reservation may not be on the pod yet: assumed).
        g.busy_reason = "reserved for pod " + whole->second->holder;
      } else if (whole != whole_reports.end() && !whole->second->healthy &&
                 whole->second->unhealthy_code != "switching") {
        g.busy_reason = "kept out of scheduling: " + whole->second->unhealthy_reason;
      } else if (report != gpu_reports.end() && !report->second->reservations.empty()) {
        g.busy_reason =
            fmt::format("{} reservation(s) or held slices", report->second->reservations.size());
      } else if (report != gpu_reports.end() && !report->second->idle.empty()) {
        g.busy_reason = fmt::format("{} warm instance(s)", report->second->idle.size());
      } else if (report != gpu_reports.end() && !report->second->healthy &&
                 report->second->unhealthy_code != "switching") {
        g.busy_reason = "kept out of scheduling: " + report->second->unhealthy_reason;
      } else if (report == gpu_reports.end() && g.mode == mig::ModeKind::kMig) {
        g.busy_reason = "the scheduler has no view of it";
      }
      g.idle = g.busy_reason.empty();
      node.gpus.push_back(std::move(g));
    }
    std::sort(node.gpus.begin(), node.gpus.end(),
              [](const auto& a, const auto& b) { return a.index < b.index; });
    in.nodes.push_back(std::move(node));
  }
  Demand(c, now, in);
  return in;
}

void ModeSwitcher::Demand(const Cluster& c, absl::Time now, mig::ModePlanInput& in) const {
  // This scheduler's unplaced pods without a reservation in flight, oldest first.
  std::vector<const Object*> waiting;
  for (const auto& p : c.pods) {
    if (p.value("/spec/schedulerName"_json_pointer, std::string()) != options_.scheduler_name ||
        !kube::NodeName(p).empty() || kube::IsTerminated(p) || kube::IsBeingDeleted(p)) {
      continue;
    }
    if (state_.Assumed(SwitchPodKey(p)).has_value() ||
        state_.ReservedNode(SwitchPodKey(p)).has_value())
      continue;
    waiting.push_back(&p);
  }
  std::stable_sort(waiting.begin(), waiting.end(), [](const Object* a, const Object* b) {
    return SwitchCreatedAt(*a) < SwitchCreatedAt(*b);
  });
  if (waiting.size() > options_.max_pods) waiting.resize(options_.max_pods);
  // Idle whole GPUs per node, by memory (a whole-GPU pod that one node's fit is no demand).
  std::vector<std::vector<uint64_t>> whole_idle;
  for (const auto& node : in.nodes) {
    std::vector<uint64_t> mem;
    for (const auto& g : node.gpus) {
      if (g.mode == mig::ModeKind::kWhole && g.idle && !g.switching) mem.push_back(g.memory_mib);
    }
    whole_idle.push_back(std::move(mem));
  }
  std::vector<mig::NodeView> views;
  bool views_read = false;
  for (const Object* p : waiting) {
    if (protocol::IsWholeGpuPod(*p, options_.resources)) {
      auto request = protocol::ParseWholeGpuRequest(*p, options_.resources);
      if (!request.ok()) continue;
      uint32_t want = 0;
      uint64_t floor = 0;
      for (const auto& ctr : request->containers) {
        want = ctr.init ? std::max(want, ctr.count) : want;
        floor = std::max(floor, ctr.min_memory_mib);
      }
      uint32_t app = 0;
      for (const auto& ctr : request->containers) app += ctr.init ? 0 : ctr.count;
      want = std::max(want, app);
      const bool fits = std::any_of(whole_idle.begin(), whole_idle.end(), [&](const auto& mem) {
        return static_cast<uint32_t>(std::count_if(mem.begin(), mem.end(),
                                                   [&](uint64_t m) { return m >= floor; })) >= want;
      });
      if (!fits) in.demand.push_back({SwitchPodKey(*p), mig::ModeKind::kWhole, want, floor});
    } else if (protocol::IsMigPod(*p, options_.resources)) {
      auto request = protocol::ParsePodRequest(*p, options_.resources);
      if (!request.ok()) continue;
      if (!views_read) {
        for (const auto& n : c.view) {
          if (auto v = state_.View(n.name, now)) views.push_back(std::move(*v));
        }
        views_read = true;
      }
      if (mig::PlanPod(std::span<const mig::NodeView>(views), *request).chosen >= 0) continue;
      in.demand.push_back({SwitchPodKey(*p), mig::ModeKind::kMig,
                           static_cast<uint32_t>(std::min<uint64_t>(
                               mig::SummarizeRequest(*request).instances, UINT32_MAX)),
                           0});
    }
  }
}

void ModeSwitcher::Request(const Cluster& c, const mig::ModeSwitchDecision& d, absl::Time now,
                           Outcome& out) {
  protocol::GpuModeRequest request;
  request.gpu_uuid = d.gpu_uuid;
  request.to = Mode(d.to);
  request.at_ms = absl::ToUnixMillis(now);
  request.by = "scheduler";
  request.reason = d.reason.substr(0, protocol::kMaxModeText);
  auto st = WriteUnderLock(
      d.node,
      [&](std::vector<protocol::GpuModeRequest>& requests) -> absl::Status {
        // Under the lock no bind is in flight here; a filter's reservation may have come since.
        for (const auto& n : state_.Report(now)) {
          if (n.name != d.node) continue;
          for (const auto& g : n.gpus) {
            if (g.uuid == d.gpu_uuid && (!g.reservations.empty() || !g.idle.empty())) {
              return absl::FailedPreconditionError("a reservation came on it since the plan");
            }
          }
          for (const auto& g : n.whole_gpus) {
            if (g.uuid == d.gpu_uuid && !g.holder.empty()) {
              return absl::FailedPreconditionError("pod " + g.holder +
                                                   " was given it whole since the plan");
            }
          }
        }
        for (const auto& r : requests) {
          if (r.gpu_uuid == d.gpu_uuid) {
            return absl::FailedPreconditionError("it has a request already");
          }
        }
        if (requests.size() >= protocol::kMaxModeGpus) {
          return absl::ResourceExhaustedError("the node has the most requests it may carry");
        }
        requests.push_back(request);
        return absl::OkStatus();
      },
      now);
  const std::string where = SwitchWhere(d.node, d.index, d.gpu_uuid);
  if (!st.ok()) {
    out.errors.push_back(fmt::format("request {} to {}: {}", where, mig::ModeKindName(d.to),
                                     std::string(st.message())));
    return;
  }
  out.requested.push_back(fmt::format("{}: {} to {}", d.node, d.gpu_uuid, mig::ModeKindName(d.to)));
  requested_for_[RequestId(request)] = d.pods;
  if (metrics_ != nullptr) metrics_->CountModeSwitchRequest(d.node, mig::ModeKindName(d.to));
  EventOnPods(c, d.pods, "Normal", "GpuModeSwitch",
              fmt::format("{} switches to {} mode for this pod: {}", where,
                          d.to == mig::ModeKind::kMig ? "MIG" : "whole-GPU (hami-core)", d.reason));
}

absl::StatusOr<ModeSwitcher::Outcome> ModeSwitcher::RunOnce() {
  Outcome out;
  if (!options_.config.enabled) return out;  // off: nothing is ever written
  const absl::Time now = clock_.Now();
  Cluster c;
  auto nodes = client_.ListNodes();
  if (!nodes.ok()) return nodes.status();
  c.nodes = std::move(nodes->items);
  auto pods = client_.ListPods({});
  if (!pods.ok()) return pods.status();
  c.pods = std::move(pods->items);
  std::map<std::string, size_t> node_index;
  for (const auto& n : c.nodes) {
    Cluster::Node v;
    v.object = &n;
    v.name = kube::Name(n);
    if (auto value = kube::Annotation(n, protocol::kGpuModeRequestAnnotation)) {
      auto decoded = protocol::DecodeGpuModeRequests(*value);
      if (decoded.ok()) {
        v.requests = std::move(*decoded);
      } else {
        v.requests_unreadable = true;
        out.errors.push_back(
            fmt::format("node {}: {}", v.name, std::string(decoded.status().message())));
      }
    }
    if (auto value = kube::Annotation(n, protocol::kGpuModeStatusAnnotation)) {
      auto decoded = protocol::DecodeGpuModeStatuses(*value);
      if (decoded.ok()) {
        for (auto& s : *decoded) v.statuses[s.gpu_uuid] = std::move(s);
      } else {
        out.errors.push_back(
            fmt::format("node {}: {}", v.name, std::string(decoded.status().message())));
      }
    }
    if (auto value = kube::Annotation(n, protocol::kNodeRegisterAnnotation)) {
      if (auto decoded = protocol::DecodeNodeRegister(*value); decoded.ok()) {
        for (auto& d : *decoded) v.registered[d.id] = std::move(d);
      }
    }
    node_index[v.name] = c.view.size();
    c.view.push_back(std::move(v));
  }
  for (const auto& p : c.pods) {
    c.pod_by_key[SwitchPodKey(p)] = &p;
    if (kube::IsTerminated(p)) continue;
    std::string node = kube::Annotation(p, protocol::kVgpuNodeAnnotation).value_or("");
    if (node.empty()) node = kube::NodeName(p);
    auto it = node_index.find(node);
    if (it == node_index.end()) continue;
    for (auto key : {protocol::kDevicesAllocatedAnnotation, protocol::kDevicesToAllocateAnnotation,
                     protocol::kMigAllocationsAnnotation}) {
      if (auto value = kube::Annotation(p, key)) {
        for (auto& uuid : protocol::GpuUuidsNamedIn(*value)) c.view[it->second].named.insert(uuid);
      }
    }
  }
  Tidy(c, now, out);
  mig::ModePlanInput in = BuildInput(c, now);
  out.plan = mig::PlanModeSwitches(in);
  seen_ = out.plan.seen;
  for (const auto& d : out.plan.switches) Request(c, d, now, out);
  {
    dynmig::MutexLock lock(&mu_);
    verdicts_ = out.plan.verdicts;
  }
  return out;
}

}  // namespace dynmig::scheduler
