#include "scheduler/defragmenter.h"

#include <algorithm>
#include <set>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "kube/selector.h"
#include "mig/node_planner.h"
#include "protocol/annotations.h"
#include "protocol/mig_allocations.h"

namespace dynmig::scheduler {
namespace {

using kube::Object;
using nlohmann::json;

std::string Key(const Object& o) { return kube::Namespace(o) + "/" + kube::Name(o); }

bool Cordoned(const Object& node) {
  const json* u = node.contains("spec") ? &node["spec"] : nullptr;
  return u != nullptr && u->is_object() && u->value("unschedulable", false);
}

int64_t CreatedAt(const Object& o) {
  const std::string t = o.value("/metadata/creationTimestamp"_json_pointer, std::string());
  absl::Time parsed;
  std::string err;
  if (t.empty() || !absl::ParseTime(absl::RFC3339_full, t, &parsed, &err)) return 0;
  return absl::ToUnixSeconds(parsed);
}

int32_t Priority(const Object& pod) {
  const auto p = pod.value("/spec/priority"_json_pointer, json());
  return p.is_number_integer() ? p.get<int32_t>() : 0;
}

bool HasController(const Object& pod) {
  const auto refs = pod.value("/metadata/ownerReferences"_json_pointer, json::array());
  if (!refs.is_array()) return false;
  for (const auto& r : refs) {
    if (r.is_object() && r.value("controller", false)) return true;
  }
  return false;
}

std::string Where(const std::string& node, uint32_t index, const std::string& uuid) {
  return fmt::format("GPU {} ({}) of {}", index, uuid, node);
}

}  // namespace

absl::StatusOr<DefragMode> ParseDefragMode(std::string_view text) {
  if (text == "off") return DefragMode::kOff;
  if (text == "dry-run") return DefragMode::kDryRun;
  if (text == "on") return DefragMode::kOn;
  return absl::InvalidArgumentError(
      fmt::format("defrag mode \"{}\": must be off, dry-run or on", text.substr(0, 64)));
}

absl::Status ApplyDefragFlags(const DefragFlags& flags, DefragmenterOptions& options,
                              absl::Duration& interval) {
  auto mode = ParseDefragMode(flags.mode);
  if (!mode.ok())
    return absl::InvalidArgumentError("--defrag: " + std::string(mode.status().message()));
  auto duration = [](const std::string& flag, const std::string& text,
                     absl::Duration& out) -> absl::Status {
    if (text.size() > 32 || !absl::ParseDuration(text, &out) || out < absl::ZeroDuration() ||
        out > absl::Hours(24 * 7)) {
      return absl::InvalidArgumentError(
          fmt::format("{}: \"{}\" is not a duration between 0s and 168h (e.g. 5m, 90s)", flag,
                      text.substr(0, 32)));
    }
    return absl::OkStatus();
  };
  DefragmenterOptions o = options;
  o.mode = *mode;
  if (auto s = duration("--defrag-wait", flags.wait, o.wait_threshold); !s.ok()) return s;
  if (auto s = duration("--defrag-reservation-ttl", flags.reservation_ttl, o.reservation_ttl);
      !s.ok()) {
    return s;
  }
  if (o.reservation_ttl < absl::Minutes(1)) {
    return absl::InvalidArgumentError("--defrag-reservation-ttl: at least 1m");
  }
  absl::Duration every;
  if (auto s = duration("--defrag-interval", flags.interval, every); !s.ok()) return s;
  if (every < absl::Seconds(1)) return absl::InvalidArgumentError("--defrag-interval: at least 1s");
  for (const auto& [flag, value] :
       {std::pair<const char*, int64_t>{"--defrag-evictions-per-node-per-hour",
                                        flags.per_node_per_hour},
        {"--defrag-evictions-per-namespace-per-hour", flags.per_namespace_per_hour}}) {
    if (value < 0 || value > 1000) {
      return absl::InvalidArgumentError(fmt::format("{}: {} is not in 0..1000", flag, value));
    }
  }
  if (flags.headroom_percent < 0 || flags.headroom_percent > 100) {
    return absl::InvalidArgumentError(
        fmt::format("--defrag-headroom: {} is not a percentage in 0..100", flags.headroom_percent));
  }
  o.headroom_percent = static_cast<uint32_t>(flags.headroom_percent);
  o.limits.per_node_per_hour = flags.per_node_per_hour;
  o.limits.per_namespace_per_hour = flags.per_namespace_per_hour;
  options = std::move(o);
  interval = every;
  return absl::OkStatus();
}

std::string_view DefragModeName(DefragMode mode) {
  switch (mode) {
    case DefragMode::kOff:
      return "off";
    case DefragMode::kDryRun:
      return "dry-run";
    case DefragMode::kOn:
      return "on";
  }
  return "off";
}

DefragInput DefragGpus(const ClusterState& state, const std::vector<NodeReport>& reports,
                       const std::set<std::string>& nodes, absl::Time now) {
  DefragInput in;
  for (const auto& n : reports) {
    if (!nodes.empty() && !nodes.count(n.name)) continue;
    auto view = state.View(n.name, now);
    if (!view) continue;
    for (size_t i = 0; i < n.gpus.size() && i < view->gpus.size(); ++i) {
      const auto& gv = view->gpus[i];
      mig::DefragGpu g;
      g.node = n.name;
      g.uuid = gv.uuid;
      g.index = gv.index;
      g.planner = gv.planner.get();
      if (gv.planner) in.planners.push_back(gv.planner);
      g.healthy = gv.healthy && view->healthy;
      g.unhealthy_reason = !view->healthy ? "node: " + view->unhealthy_reason : gv.unhealthy_reason;
      for (const auto& r : n.gpus[i].reservations) {
        // "(held by the node)", "(defrag reservation for ...)": no pod to move, pinned.
        const bool pinned = r.pod.starts_with("(");
        g.reservations.push_back({r.profile, r.placement, pinned ? "" : r.pod});
      }
      in.gpus.push_back(std::move(g));
      in.reports.push_back(&n.gpus[i]);
    }
  }
  return in;
}

std::vector<MovedPlacement> PlaceMovedPods(
    const std::vector<Object>& nodes, const std::vector<Object>& pods,
    const ClusterStateOptions& options, const std::vector<std::string>& moved,
    const std::string& node, const std::string& gpu_uuid, const std::string& profile,
    mig::Placement placement, const std::vector<std::string>& candidates, absl::Time now) {
  ClusterState state(options);
  const std::set<std::string> moving(moved.begin(), moved.end());
  for (const auto& n : nodes) state.UpsertNode(n);
  std::map<std::string, const Object*> by_key;
  for (const auto& p : pods) {
    by_key[Key(p)] = &p;
    if (!moving.count(Key(p))) state.UpsertPod(p);
  }
  // The freed placement goes to the profile the plan is for.
  protocol::MigAllocation target;
  target.gpu_uuid = gpu_uuid;
  target.profile = profile;
  target.placement = placement;
  Object holder = {{"metadata",
                    {{"name", "dynmig-defrag-target"},
                     {"namespace", "dynmig-defrag"},
                     {"annotations",
                      {{std::string(protocol::kMigAllocationsAnnotation),
                        protocol::EncodeMigAllocations({target})},
                       {std::string(protocol::kVgpuNodeAnnotation), node}}}}},
                   {"spec", {{"nodeName", node}}},
                   {"status", {{"phase", "Running"}}}};
  state.UpsertPod(holder);
  std::vector<MovedPlacement> out;
  for (const auto& key : moved) {
    MovedPlacement r;
    r.pod = key;
    auto it = by_key.find(key);
    if (it == by_key.end()) {
      r.why_not = "the pod is not in the cluster";
      out.push_back(std::move(r));
      continue;
    }
    auto request = protocol::ParsePodRequest(*it->second, options.resources);
    if (!request.ok()) {
      r.why_not = "its request does not parse: " + std::string(request.status().message());
      out.push_back(std::move(r));
      continue;
    }
    if (candidates.empty()) {
      r.why_not = "every node is cordoned";
      out.push_back(std::move(r));
      continue;
    }
    auto decision = state.PlanAndReserve(key, *request, candidates, now);
    if (!decision.ok()) {
      r.why_not = std::string(decision.status().message());
    } else if (decision->reservation) {
      r.placed = true;
      r.where = decision->reservation->summary;
    } else {
      std::vector<std::string> reasons;
      for (const auto& [n, why] : decision->failed) reasons.push_back(why);
      r.why_not = fmt::format("nowhere right now ({}): {}", mig::VerdictName(decision->verdict),
                              fmt::join(reasons, "; "));
    }
    out.push_back(std::move(r));
  }
  return out;
}

Defragmenter::Defragmenter(kube::KubeClient& client, ClusterState& state, const Clock& clock,
                           EventRecorder* events, SchedulerMetrics* metrics,
                           DefragmenterOptions options)
    : client_(client),
      state_(state),
      clock_(clock),
      events_(events),
      metrics_(metrics),
      options_(std::move(options)) {}

void Defragmenter::Event(const Object& pod, std::string_view type, std::string_view reason,
                         std::string message) {
  if (events_ != nullptr) events_->Record(pod, type, reason, std::move(message));
}

absl::StatusOr<Defragmenter::Cluster> Defragmenter::Read() {
  Cluster c;
  auto nodes = client_.ListNodes();
  if (!nodes.ok()) return nodes.status();
  c.nodes = std::move(nodes->items);
  auto pods = client_.ListPods({});
  if (!pods.ok()) return pods.status();
  c.pods = std::move(pods->items);
  for (const auto& p : c.pods) c.by_key[Key(p)] = &p;
  return c;
}

std::vector<protocol::DefragReservation> Defragmenter::HoldsOn(const Cluster& c,
                                                               const std::string& node) const {
  for (const auto& n : c.nodes) {
    if (kube::Name(n) != node) continue;
    auto value = kube::Annotation(n, protocol::kNodeDefragReservationAnnotation);
    if (!value) return {};
    auto holds = protocol::DecodeDefragReservations(*value);
    return holds.ok() ? *holds : std::vector<protocol::DefragReservation>{};
  }
  return {};
}

absl::Status Defragmenter::WriteHolds(const std::string& node,
                                      const std::vector<protocol::DefragReservation>& holds) {
  kube::KeyPatch patch;
  patch[std::string(protocol::kNodeDefragReservationAnnotation)] =
      holds.empty() ? std::nullopt
                    : std::optional<std::string>(protocol::EncodeDefragReservations(holds));
  auto r = client_.PatchNodeAnnotations(node, patch);
  return r.ok() ? absl::OkStatus() : r.status();
}

void Defragmenter::Tidy(const Cluster& c, absl::Time now, Outcome& out) {
  for (const auto& n : c.nodes) {
    auto value = kube::Annotation(n, protocol::kNodeDefragReservationAnnotation);
    if (!value) continue;
    const std::string node = kube::Name(n);
    auto holds = protocol::DecodeDefragReservations(*value);
    std::vector<protocol::DefragReservation> keep;
    if (!holds.ok()) {
      out.tidied.push_back(
          fmt::format("{}: unreadable ({})", node, std::string(holds.status().message())));
    } else {
      for (const auto& h : *holds) {
        auto it = c.by_key.find(h.pod);
        const Object* pod = it == c.by_key.end() ? nullptr : it->second;
        std::string why;
        if (absl::FromUnixSeconds(h.expires) <= now) {
          why = "expired";
        } else if (pod == nullptr || kube::IsTerminated(*pod) ||
                   (!h.pod_uid.empty() && kube::Uid(*pod) != h.pod_uid)) {
          why = "the pod is gone";
        } else if (!kube::NodeName(*pod).empty()) {
          why = "the pod was placed";
        }
        if (why.empty()) {
          keep.push_back(h);
          continue;
        }
        out.tidied.push_back(fmt::format("{}: {} ({})", node, h.pod, why));
        if (pod != nullptr && why == "expired") {
          Event(*pod, "Warning", "DefragReservationExpired",
                fmt::format("the slices {} of {} on {} reserved for this pod by defragmentation "
                            "expired before it was placed there",
                            h.placement.ToString(), h.gpu_uuid, node));
        }
      }
      if (keep.size() == holds->size()) continue;
    }
    if (absl::Status s = WriteHolds(node, keep); !s.ok()) {
      out.tidied.push_back(fmt::format("{}: could not rewrite the reservations: {}", node,
                                       std::string(s.message())));
    }
  }
}

mig::MovablePod Defragmenter::Facts(const Cluster& c, const Object& pod) const {
  mig::MovablePod p;
  p.key = Key(pod);
  p.ns = kube::Namespace(pod);
  p.priority = Priority(pod);
  p.created = CreatedAt(pod);
  p.has_controller = HasController(pod);
  p.terminating = kube::IsBeingDeleted(pod);
  if (auto v = kube::Annotation(pod, protocol::kDefragPodAnnotation)) {
    auto policy = protocol::ParseDefragPolicy(*v);
    if (!policy.ok()) {
      p.opt_error = std::string(policy.status().message());
    } else {
      p.opted_in = *policy == protocol::DefragPolicy::kAllow;
      p.opted_out = *policy == protocol::DefragPolicy::kNever;
    }
  }
  for (const auto& [key, pdb] : c.pdbs) {
    if (kube::Namespace(pdb) != p.ns) continue;
    const json sel = pdb.value("/spec/selector"_json_pointer, json());
    if (!sel.is_object()) continue;  // a null selector selects nothing
    // policy/v1beta1: an empty selector selects nothing; policy/v1: everything.
    if (sel.empty() && pdb.value("apiVersion", "") == "policy/v1beta1") continue;
    auto selector = kube::LabelSelector::FromObject(sel);
    if (!selector.ok()) {
      p.pdbs.push_back(key);  // unreadable: counted as a budget that allows nothing
      continue;
    }
    if (selector->Matches(pod)) p.pdbs.push_back(key);
  }
  return p;
}

std::unique_ptr<Defragmenter::Planned> Defragmenter::Plan(const Cluster& c,
                                                          const mig::PodRequest& request,
                                                          absl::Time now, std::string& why) {
  auto p = std::make_unique<Planned>();
  std::vector<std::string>& candidates = p->candidates;
  // Schedulable nodes, their views, and whether the pod fits now.
  std::set<std::string> names;
  for (const auto& n : c.nodes) {
    if (Cordoned(n)) continue;
    candidates.push_back(kube::Name(n));
    names.insert(kube::Name(n));
  }
  std::vector<mig::NodeView> views;
  for (const auto& n : candidates) {
    if (auto v = state_.View(n, now)) views.push_back(std::move(*v));
  }
  if (mig::PlanPod(std::span<const mig::NodeView>(views), request).chosen >= 0) {
    why = "it fits now: not waiting because of fragmentation";
    return nullptr;
  }
  p->reports = state_.Report(now);
  p->in = DefragGpus(state_, p->reports, names, now);
  const DefragInput& in = p->in;
  const mig::ContainerRequest* first = nullptr;
  for (const auto& ctr : request.containers) {
    if (ctr.count > 0) first = &ctr;
  }
  if (first == nullptr) {
    why = "it asks for no MIG instance";
    return nullptr;
  }
  // The facts of every pod with reservations on these GPUs, and the budgets.
  std::map<std::string, mig::MovablePod> facts;
  for (const auto& g : in.gpus) {
    for (const auto& r : g.reservations) {
      if (r.owner.empty() || facts.count(r.owner)) continue;
      auto it = c.by_key.find(r.owner);
      if (it != c.by_key.end()) facts[r.owner] = Facts(c, *it->second);
    }
  }
  mig::DefragRules rules = options_.rules;
  rules.pdb_allowed = c.pdb_allowed;
  // Per GPU the profile covering the request; one plan choice per profile, the best kept.
  std::map<std::string, std::vector<size_t>> by_profile;
  for (size_t i = 0; i < in.gpus.size(); ++i) {
    const auto* planner = in.gpus[i].planner;
    if (planner == nullptr) continue;
    const int idx = mig::CoveringProfile(*planner, first->memory);
    if (idx >= 0) by_profile[planner->capability().profiles[idx].name].push_back(i);
  }
  std::vector<std::string> reasons;
  for (const auto& [profile, indices] : by_profile) {
    std::vector<mig::DefragGpu> gpus;
    for (size_t i : indices) gpus.push_back(in.gpus[i]);
    auto d = mig::ChooseDefragPlan(gpus, profile, facts, rules);
    for (auto& r : d.reasons) reasons.push_back(std::move(r));
    if (!d.choice) continue;
    p->choices.push_back(std::move(*d.choice));
    for (auto& a : d.alternatives) p->choices.push_back(std::move(a));
    for (size_t k = p->choices.size() - 1 - d.alternatives.size(); k < p->choices.size(); ++k) {
      p->choices[k].gpu = indices[p->choices[k].gpu];
    }
  }
  if (p->choices.empty()) {
    why = reasons.empty() ? "no GPU can take it even after moving pods"
                          : fmt::format("no plan under the rules: {}", fmt::join(reasons, "; "));
    return nullptr;
  }
  std::stable_sort(p->choices.begin(), p->choices.end(),
                   [](const mig::DefragChoice& a, const mig::DefragChoice& b) {
                     if (a.plan.owners.size() != b.plan.owners.size()) {
                       return a.plan.owners.size() < b.plan.owners.size();
                     }
                     return a.plan.rank < b.plan.rank;
                   });
  if (p->choices.size() > mig::kMaxDefragAlternatives + 1) {
    p->choices.resize(mig::kMaxDefragAlternatives + 1);
  }
  p->best = p->choices.front();
  return p;
}

bool Defragmenter::Admissible(const Cluster& c, const Object& pod, Planned& p, absl::Time now,
                              std::string& why) {
  const DefragInput& in = p.in;
  // Every pod of the plan must fit elsewhere now (otherwise the cluster lacks the capacity): the
  // plans are tried best first until one's pods do.
  // A plan whose pod would leave less than --defrag-headroom of the slices free is not tried (its
  // profile's size decides; the moved pods take as many slices elsewhere as they free).
  uint64_t total = 0, used = 0;
  if (options_.headroom_percent > 0) {
    for (size_t i = 0; i < in.gpus.size(); ++i) {
      if (in.gpus[i].planner == nullptr) continue;
      total += in.reports[i]->units;
      for (const auto& r : in.gpus[i].reservations) used += r.placement.size;
    }
  }
  const mig::DefragChoice* chosen = nullptr;
  std::vector<std::string> tried;
  std::string full;  // the last headroom refusal
  for (const auto& choice : p.choices) {
    const mig::DefragGpu& g = in.gpus[choice.gpu];
    const mig::EvictionPlan& pl = choice.plan;
    if (std::string r =
            mig::HeadroomRefusal(total, used, pl.placement.size, options_.headroom_percent);
        !r.empty()) {
      full = std::move(r);
      continue;
    }
    const auto moves = PlaceMovedPods(c.nodes, c.pods, options_.state, pl.owners, g.node, g.uuid,
                                      pl.profile, pl.placement, p.candidates, now);
    std::vector<std::string> stuck;
    for (const auto& m : moves) {
      if (!m.placed) stuck.push_back(fmt::format("{} ({})", m.pod, m.why_not));
    }
    if (stuck.empty()) {
      chosen = &choice;
      break;
    }
    tried.push_back(fmt::format("{}: {}", Where(g.node, g.index, g.uuid), fmt::join(stuck, "; ")));
  }
  if (chosen == nullptr && tried.empty() && !full.empty()) {
    why = "headroom: " + full;
    if (metrics_ != nullptr) metrics_->CountDefragPlan("headroom");
    return false;
  }
  if (chosen == nullptr) {
    why = fmt::format("the pods to move would not run elsewhere now, in any of {} plan(s): {}",
                      tried.size(), fmt::join(tried, " | "));
    return false;
  }
  p.best = *chosen;
  const mig::DefragGpu& gpu = in.gpus[p.best.gpu];
  const mig::EvictionPlan& plan = p.best.plan;
  std::vector<std::string> namespaces;
  for (const auto& o : plan.owners) namespaces.push_back(o.substr(0, o.find('/')));
  const int64_t now_s = absl::ToUnixSeconds(now);
  std::erase_if(history_, [&](const mig::EvictionRecord& r) { return r.at <= now_s - 3600; });
  if (std::string limit =
          mig::RateLimitRefusal(history_, now_s, options_.limits, gpu.node, namespaces);
      !limit.empty()) {
    why = "rate limit: " + limit;
    if (metrics_ != nullptr) metrics_->CountDefragPlan("rate-limited");
    Event(pod, "Normal", "DefragRateLimited",
          fmt::format("defragmentation of {} for this pod waits: {}",
                      Where(gpu.node, gpu.index, gpu.uuid), limit));
    return false;
  }
  return true;
}

bool Defragmenter::Serve(const Cluster& c, const Object& pod, const mig::PodRequest& request,
                         bool dry_run, absl::Time now, Outcome& out, std::string& why) {
  const std::string key = Key(pod);
  auto p = Plan(c, request, now, why);
  if (p == nullptr || !Admissible(c, pod, *p, now, why)) return false;
  const mig::DefragGpu& gpu = p->in.gpus[p->best.gpu];
  const mig::EvictionPlan& plan = p->best.plan;
  const mig::DefragChoice* best = &p->best;
  out.pod = key;
  out.dry_run = dry_run;
  out.node = gpu.node;
  out.gpu_uuid = gpu.uuid;
  out.profile = plan.profile;
  out.placement = plan.placement;
  out.left = best->refused;
  const std::string where = Where(gpu.node, gpu.index, gpu.uuid);
  if (dry_run) {
    out.evicted = plan.owners;
    if (metrics_ != nullptr) metrics_->CountDefragPlan("dry-run");
    Event(
        pod, "Normal", "DefragPlanned",
        fmt::format("dry run: defragmentation of {} would evict {} and reserve slices {} ({}) "
                    "for this pod",
                    where, fmt::join(plan.owners, ", "), plan.placement.ToString(), plan.profile));
    for (const auto& o : plan.owners) {
      Event(*c.by_key.at(o), "Normal", "DefragWouldEvict",
            fmt::format("dry run: defragmentation of {} would evict this pod to make room for {}",
                        where, key));
    }
    return true;
  }
  return Execute(c, pod, gpu, plan, now, out, why);
}

bool Defragmenter::Execute(const Cluster& c, const Object& pod, const mig::DefragGpu& gpu,
                           const mig::EvictionPlan& plan, absl::Time now, Outcome& out,
                           std::string& why) {
  const std::string key = Key(pod);
  const std::string where = Where(gpu.node, gpu.index, gpu.uuid);
  const int64_t now_s = absl::ToUnixSeconds(now);
  // Reserve first: from now on nothing else (the replacements included) is placed there.
  protocol::DefragReservation hold{gpu.uuid,
                                   plan.placement,
                                   plan.profile,
                                   key,
                                   kube::Uid(pod),
                                   now_s,
                                   now_s + absl::ToInt64Seconds(options_.reservation_ttl),
                                   plan.owners};
  std::vector<protocol::DefragReservation> holds = HoldsOn(c, gpu.node);
  std::erase_if(holds, [&](const auto& h) { return h.pod == key; });
  if (holds.size() >= protocol::kMaxDefragReservations) {
    why = fmt::format("{} already holds {} defragmentation reservations", gpu.node, holds.size());
    return false;
  }
  holds.push_back(hold);
  if (absl::Status s = WriteHolds(gpu.node, holds); !s.ok()) {
    why = "could not reserve the slices: " + std::string(s.message());
    if (metrics_ != nullptr) metrics_->CountDefragPlan("failed");
    return false;
  }
  state_.UpsertNode([&] {  // the informer will bring it too; at once here
    for (const auto& n : c.nodes) {
      if (kube::Name(n) != gpu.node) continue;
      Object copy = n;
      copy["metadata"]["annotations"][std::string(protocol::kNodeDefragReservationAnnotation)] =
          protocol::EncodeDefragReservations(holds);
      return copy;
    }
    return Object();
  }());
  for (const auto& o : plan.owners) {
    const Object& victim = *c.by_key.at(o);
    kube::EvictOptions eo;
    eo.precondition_uid = kube::Uid(victim);
    absl::Status s = client_.EvictPod(kube::Namespace(victim), kube::Name(victim), eo);
    std::string result = "evicted";
    if (s.ok()) {
      out.evicted.push_back(o);
      history_.push_back({now_s, gpu.node, kube::Namespace(victim)});
      Event(victim, "Normal", "DefragEvicted",
            fmt::format("evicted by dynmig's defragmenter: {} of {} is reserved for {} ({})",
                        plan.placement.ToString(), where, key, plan.profile));
    } else if (s.code() == absl::StatusCode::kNotFound) {
      out.evicted.push_back(o);  // gone already: its slices are free
      result = "not-found";
    } else {
      result = s.code() == absl::StatusCode::kResourceExhausted ? "refused-by-pdb" : "error";
      out.failed.push_back(fmt::format("{}: {}", o, std::string(s.message())));
      Event(victim, "Warning", "DefragEvictionRefused",
            fmt::format("dynmig's defragmenter could not evict this pod: {}",
                        std::string(s.message())));
    }
    if (metrics_ != nullptr) metrics_->CountDefragEviction(result);
    if (!out.failed.empty()) break;
  }
  if (!out.failed.empty()) {
    std::erase_if(holds, [&](const auto& h) { return h.pod == key; });
    (void)WriteHolds(gpu.node, holds);
    if (metrics_ != nullptr) metrics_->CountDefragPlan("failed");
    Event(pod, "Warning", "DefragFailed",
          fmt::format(
              "defragmentation of {} stopped: {}; evicted before: {}; reservation "
              "withdrawn",
              where, fmt::join(out.failed, "; "),
              out.evicted.empty() ? "none" : fmt::format("{}", fmt::join(out.evicted, ", "))));
    why = "an eviction was refused";
    return true;
  }
  out.executed = true;
  if (metrics_ != nullptr) metrics_->CountDefragPlan("executed");
  Event(pod, "Normal", "DefragEvicted",
        fmt::format("defragmentation of {} evicted {}; slices {} ({}) reserved for this pod until "
                    "{}",
                    where, fmt::join(out.evicted, ", "), plan.placement.ToString(), plan.profile,
                    absl::FormatTime(absl::RFC3339_sec, absl::FromUnixSeconds(hold.expires),
                                     absl::UTCTimeZone())));
  return true;
}

absl::Status Defragmenter::ReadBudgets(Cluster& c) {
  auto pdbs = client_.ListPodDisruptionBudgets("");
  if (!pdbs.ok()) return pdbs.status();
  for (auto& pdb : pdbs->items) {
    const std::string key = Key(pdb);
    c.pdb_allowed[key] = pdb.value("/status/disruptionsAllowed"_json_pointer, int64_t{0});
    c.pdbs.emplace_back(key, std::move(pdb));
  }
  return absl::OkStatus();
}

absl::StatusOr<Defragmenter::Outcome> Defragmenter::RunOnce() {
  Outcome out;
  const absl::Time now = clock_.Now();
  auto cluster = Read();
  if (!cluster.ok()) return cluster.status();
  Cluster& c = *cluster;
  Tidy(c, now, out);
  if (options_.mode == DefragMode::kOff) return out;
  // Waiting pods: ours, unplaced, one MIG instance, no reservation in flight.
  std::vector<mig::WaitingPod> waiting;
  std::vector<std::pair<const Object*, mig::PodRequest>> requests;
  for (const auto& p : c.pods) {
    if (p.value("/spec/schedulerName"_json_pointer, std::string()) != options_.scheduler_name ||
        !kube::NodeName(p).empty() || kube::IsTerminated(p) || kube::IsBeingDeleted(p)) {
      continue;
    }
    if (state_.DefragHoldNode(Key(p)).has_value()) continue;  // a plan is in flight
    if (state_.Assumed(Key(p)).has_value()) continue;         // placed, bind pending
    auto request = protocol::ParsePodRequest(p, options_.resources);
    if (!request.ok() || mig::SummarizeRequest(*request).instances != 1) continue;
    if (options_.mode == DefragMode::kDryRun) {
      auto it = dry_runs_.find(kube::Uid(p));
      if (it != dry_runs_.end() && now - it->second < options_.reservation_ttl) continue;
    }
    waiting.push_back({Key(p), Priority(p), CreatedAt(p)});
    requests.emplace_back(&p, std::move(*request));
  }
  const auto due = mig::DueWaitingPods(waiting, absl::ToUnixSeconds(now),
                                       absl::ToInt64Seconds(options_.wait_threshold));
  if (due.empty()) return out;
  if (auto st = ReadBudgets(c); !st.ok()) return st;
  const bool dry_run = options_.mode == DefragMode::kDryRun;
  for (size_t i : due) {
    const Object& pod = *requests[i].first;
    std::string why;
    if (Serve(c, pod, requests[i].second, dry_run, now, out, why)) {
      if (dry_run) dry_runs_[kube::Uid(pod)] = now;
      break;
    }
    out.notes.push_back(fmt::format("{}: {}", Key(pod), why));
    if (metrics_ != nullptr && !why.starts_with("rate limit") && !why.starts_with("headroom")) {
      metrics_->CountDefragPlan("no-plan");
    }
  }
  return out;
}

absl::StatusOr<Defragmenter::Outcome> Defragmenter::ServePod(const std::string& ns,
                                                             const std::string& name,
                                                             bool dry_run) {
  Outcome out;
  const absl::Time now = clock_.Now();
  auto cluster = Read();
  if (!cluster.ok()) return cluster.status();
  Cluster& c = *cluster;
  Tidy(c, now, out);
  auto it = c.by_key.find(ns + "/" + name);
  if (it == c.by_key.end())
    return absl::NotFoundError(fmt::format("pod {}/{} not found", ns, name));
  const Object& pod = *it->second;
  if (!kube::NodeName(pod).empty()) {
    return absl::FailedPreconditionError(
        fmt::format("pod {}/{} is placed on {} already", ns, name, kube::NodeName(pod)));
  }
  if (state_.DefragHoldNode(Key(pod)).has_value()) {
    return absl::FailedPreconditionError(fmt::format(
        "pod {}/{} has slices reserved by defragmentation already (see dynmig explain)", ns, name));
  }
  auto request = protocol::ParsePodRequest(pod, options_.resources);
  if (!request.ok()) return request.status();
  if (mig::SummarizeRequest(*request).instances != 1) {
    return absl::FailedPreconditionError(fmt::format(
        "pod {}/{} asks for more than one MIG instance: the defragmenter serves pods of one", ns,
        name));
  }
  if (auto st = ReadBudgets(c); !st.ok()) return st;
  std::string why;
  if (!Serve(c, pod, *request, dry_run, now, out, why) && !why.empty()) {
    return absl::FailedPreconditionError(fmt::format("pod {}/{}: {}", ns, name, why));
  }
  if (!out.failed.empty()) out.notes.push_back(why);
  return out;
}

}  // namespace dynmig::scheduler
