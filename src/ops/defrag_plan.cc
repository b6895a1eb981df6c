#include "ops/defrag_plan.h"

#include <algorithm>
#include <set>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "mig/profile.h"
#include "ops/layout.h"
#include "protocol/annotations.h"
#include "protocol/mig_allocations.h"
#include "protocol/pod_request.h"

namespace dynmig::ops {
namespace {

using kube::Object;

std::vector<std::string> SchedulableNodes(const ClusterSnapshot& snapshot) {
  std::vector<std::string> out;
  for (const auto& n : snapshot.nodes) {
    if (!IsCordoned(n)) out.push_back(kube::Name(n));
  }
  return out;
}

nlohmann::json PlacementJson(const mig::Placement& p) {
  return {{"start", p.start}, {"size", p.size}};
}

}  // namespace

std::vector<Replacement> ReplaceEvicted(const ClusterSnapshot& snapshot,
                                        const protocol::DeviceConfig& config,
                                        const std::vector<std::string>& evicted,
                                        const std::string& node, const std::string& gpu_uuid,
                                        const std::string& profile, mig::Placement placement,
                                        absl::Time now) {
  const auto placed = scheduler::PlaceMovedPods(
      snapshot.nodes, snapshot.pods,
      scheduler::ClusterStateOptions{config.allowlist, config.resources, absl::Minutes(3),
                                     config.memory_match},
      evicted, node, gpu_uuid, profile, placement, SchedulableNodes(snapshot), now);
  std::vector<Replacement> out;
  for (const auto& m : placed) out.push_back({m.pod, m.placed, m.where, m.why_not});
  return out;
}

std::string RenderPlanPictures(const scheduler::GpuReport& gpu, const mig::EvictionPlan& plan,
                               const SlicePainter& painter, const std::string& indent) {
  const uint32_t units = DrawnUnits(gpu);
  std::vector<PictureCell> before, after;
  for (const auto& r : gpu.reservations) {
    const bool moving =
        std::find(plan.owners.begin(), plan.owners.end(), r.pod) != plan.owners.end();
    const std::string label = ShortPodName(r.pod);
    before.push_back({label, r.placement, moving});
    if (!moving) after.push_back({label, r.placement, false});
  }
  after.push_back({plan.profile, plan.placement, true});
  std::string out = painter.header(units, indent + "        ") + "\n";
  out += painter.row(units, before, indent + "before  ") + "\n";
  out += painter.row(units, after, indent + "after   ") + "\n";
  return out;
}

absl::StatusOr<CommandOutput> RunDefrag(kube::KubeClient& client, const DefragOptions& options,
                                        const SlicePainter& painter, absl::Time now) {
  if (options.profile.empty()) return absl::InvalidArgumentError("--for: a profile is required");
  if (options.profile.find('.') != std::string::npos) {
    if (auto parsed = mig::ParseProfileName(options.profile); !parsed.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("--for: {}", std::string(parsed.status().message())));
    }
  } else if (auto parsed = mig::ParseProfileName(options.profile + ".1gb"); !parsed.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("--for: \"{}\" is neither a profile name (3g.20gb) nor a slice class (3g)",
                    options.profile));
  }
  auto snap = TakeSnapshot(client, now);
  if (!snap.ok()) return snap.status();
  auto source = FindDeviceConfig(client, options.config);
  if (!source.ok()) return source.status();
  const protocol::DeviceConfig config = EffectiveConfig(*source);
  std::set<std::string> nodes;
  if (!options.node.empty()) {
    if (snap->FindNode(options.node) == nullptr) {
      return absl::NotFoundError(fmt::format("node \"{}\" not found", options.node));
    }
    nodes.insert(options.node);
  } else {
    for (const auto& n : snap->nodes) {
      if (!IsCordoned(n)) nodes.insert(kube::Name(n));
    }
  }
  auto state = BuildClusterState(*snap, config);
  const auto reports = state->Report(now);
  const DefragInput in = DefragGpus(*state, reports, nodes, now);
  const mig::DefragResult result = mig::PlanDefrag(in.gpus, options.profile);

  CommandOutput out;
  nlohmann::json plans = nlohmann::json::array();
  std::string text;
  const mig::DefragCandidate* best = result.best();
  if (best == nullptr) {
    text += fmt::format("No GPU can take {}, even after moving pods:\n", options.profile);
    if (result.skipped.empty()) text += "  no MIG GPU is registered on the nodes considered\n";
  } else if (best->plan.fits_now()) {
    const auto& g = in.gpus[best->gpu];
    text +=
        fmt::format("{} fits now on {} GPU {} ({}) at slices {}: nothing to move.\n",
                    best->plan.profile, g.node, g.index, g.uuid, best->plan.placement.ToString());
  }
  const size_t shown =
      best == nullptr ? 0 : std::min(result.ranked.size(), options.alternatives + 1);
  for (size_t k = 0; k < shown; ++k) {
    const auto& cand = result.ranked[k];
    const mig::DefragGpu& g = in.gpus[cand.gpu];
    const mig::EvictionPlan& plan = cand.plan;
    const auto moves = plan.fits_now() ? std::vector<Replacement>{}
                                       : ReplaceEvicted(*snap, config, plan.owners, g.node, g.uuid,
                                                        plan.profile, plan.placement, now);
    nlohmann::json jmoves = nlohmann::json::array();
    std::vector<std::vector<std::string>> rows;
    for (const auto& owner : plan.owners) {
      std::vector<std::string> held;
      nlohmann::json jheld = nlohmann::json::array();
      for (const auto& r : plan.moved) {
        if (r.owner != owner) continue;
        held.push_back(fmt::format("{} at {}", r.profile, r.placement.ToString()));
        jheld.push_back({{"profile", r.profile}, {"placement", PlacementJson(r.placement)}});
      }
      const Replacement* rep = nullptr;
      for (const auto& m : moves) {
        if (m.pod == owner) rep = &m;
      }
      rows.push_back({owner, fmt::format("{}", fmt::join(held, ", ")),
                      rep == nullptr ? "?" : (rep->placed ? rep->where : rep->why_not)});
      jmoves.push_back({{"pod", owner},
                        {"holds", jheld},
                        {"canBeReplaced", rep != nullptr && rep->placed},
                        {"replacement", rep == nullptr ? "" : (rep->placed ? rep->where : "")},
                        {"whyNot", rep == nullptr ? "" : rep->why_not}});
    }
    const bool all_replaced =
        std::all_of(moves.begin(), moves.end(), [](const Replacement& r) { return r.placed; });
    plans.push_back({{"node", g.node},
                     {"gpu", g.uuid},
                     {"gpuIndex", g.index},
                     {"profile", plan.profile},
                     {"placement", PlacementJson(plan.placement)},
                     {"fitsNow", plan.fits_now()},
                     {"podsToMove", plan.owners.size()},
                     {"unitsMoved", plan.units_moved},
                     {"allMovedPodsFitElsewhere", all_replaced},
                     {"moves", jmoves}});
    if (plan.fits_now()) continue;
    text += fmt::format(
        "{}: free slices {} of {} GPU {} ({}) for {} by moving {} pod{} ({} slice{}):\n",
        k == 0 ? "Best plan" : fmt::format("Alternative {}", k), plan.placement.ToString(), g.node,
        g.index, g.uuid, plan.profile, plan.owners.size(), plan.owners.size() == 1 ? "" : "s",
        plan.units_moved, plan.units_moved == 1 ? "" : "s");
    text += RenderTable({"POD", "HOLDS HERE", "COULD GO TO (NOW)"}, rows, "  ");
    text += RenderPlanPictures(*in.reports[cand.gpu], plan, painter, "  ");
    text += all_replaced ? "  every moved pod fits elsewhere right now\n"
                         : "  not every moved pod fits elsewhere right now\n";
    text += "\n";
  }
  nlohmann::json skipped = nlohmann::json::array();
  for (const auto& [i, why] : result.skipped) {
    skipped.push_back({{"node", in.gpus[i].node}, {"gpu", in.gpus[i].uuid}, {"reason", why}});
    if (best == nullptr) {
      text += fmt::format("  {} GPU {} ({}): {}\n", in.gpus[i].node, in.gpus[i].index,
                          in.gpus[i].uuid, why);
    }
  }
  text +=
      "Nothing was moved: this is a plan (--pod NAME --apply carries it out for a pending "
      "pod).\n";
  out.text = std::move(text);
  out.json = {{"profile", options.profile},
              {"found", best != nullptr},
              {"plans", plans},
              {"skipped", skipped},
              {"executed", false}};
  return out;
}

absl::StatusOr<CommandOutput> RunDefragApply(kube::KubeClient& client,
                                             const DefragApplyOptions& options,
                                             const Clock& clock) {
  if (options.pod.empty()) {
    return absl::InvalidArgumentError("--apply needs --pod NAME: the pending pod to make room for");
  }
  const std::string want(mig::SliceClass(options.profile));
  if (want.empty()) return absl::InvalidArgumentError("--for: a profile is required");
  const absl::Time now = clock.Now();
  auto snap = TakeSnapshot(client, now);
  if (!snap.ok()) return snap.status();
  auto source = FindDeviceConfig(client, options.config);
  if (!source.ok()) return source.status();
  const protocol::DeviceConfig config = EffectiveConfig(*source);
  auto state = BuildClusterState(*snap, config);
  scheduler::DefragmenterOptions d;
  absl::Duration unused;
  scheduler::DefragFlags flags = options.flags;
  flags.mode = "on";
  if (auto st = scheduler::ApplyDefragFlags(flags, d, unused); !st.ok()) return st;
  d.resources = config.resources;
  d.state = scheduler::ClusterStateOptions{config.allowlist, config.resources, absl::Minutes(3),
                                           config.memory_match};
  // A silent dry run: the plan's profile must be the one asked for.
  scheduler::Defragmenter check(client, *state, clock, nullptr, nullptr, d);
  auto planned = check.ServePod(options.ns, options.pod, true);
  if (!planned.ok()) return planned.status();
  if (mig::SliceClass(planned->profile) != want) {
    return absl::FailedPreconditionError(
        fmt::format("pod {}/{} would get {} (its request), not {}: nothing done", options.ns,
                    options.pod, planned->profile, options.profile));
  }
  scheduler::EventRecorder events(client, clock, {.component = "dynmig-defrag"});
  scheduler::Defragmenter run(client, *state, clock, &events, nullptr, d);
  auto out = run.ServePod(options.ns, options.pod, options.dry_run);
  events.Flush(absl::Seconds(10));
  if (!out.ok()) return out.status();
  CommandOutput result;
  std::string& text = result.text;
  const std::string where =
      fmt::format("slices {} of {} on {}", out->placement.ToString(), out->gpu_uuid, out->node);
  if (options.dry_run) {
    text += fmt::format("Dry run: for {} ({}) would evict {} and reserve {}.\n", out->pod,
                        out->profile, fmt::join(out->evicted, ", "), where);
  } else if (out->executed) {
    text += fmt::format("Evicted {} (Eviction API); reserved {} for {} ({}) for {}.\n",
                        fmt::join(out->evicted, ", "), where, out->pod, out->profile,
                        absl::FormatDuration(d.reservation_ttl));
  } else {
    text += fmt::format(
        "Stopped: {}; evicted before: {}; the reservation was withdrawn.\n",
        fmt::join(out->failed, "; "),
        out->evicted.empty() ? "none" : fmt::format("{}", fmt::join(out->evicted, ", ")));
  }
  for (const auto& [pod, why] : out->left) text += fmt::format("  left alone: {}: {}\n", pod, why);
  result.json = {{"pod", out->pod},
                 {"profile", out->profile},
                 {"node", out->node},
                 {"gpu", out->gpu_uuid},
                 {"placement", PlacementJson(out->placement)},
                 {"dryRun", options.dry_run},
                 {"executed", out->executed},
                 {"evicted", out->evicted},
                 {"failed", out->failed},
                 {"left", out->left}};
  return result;
}

}  // namespace dynmig::ops
