#include "ops/explain.h"

#include <algorithm>
#include <set>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "mig/catalogue.h"
#include "mig/defrag.h"
#include "mig/defrag_policy.h"
#include "mig/node_planner.h"
#include "ops/defrag_plan.h"
#include "ops/layout.h"
#include "ops/mode_explain.h"
#include "protocol/annotations.h"
#include "protocol/defrag.h"
#include "protocol/devices.h"
#include "protocol/gpu_mode.h"
#include "protocol/mig_allocations.h"
#include "protocol/pod_request.h"

namespace dynmig::ops {
namespace {

using kube::Object;
using nlohmann::json;

std::string MemoryText(const mig::MemoryRequest& m) {
  if (m.mib > 0) return fmt::format("{} MiB", m.mib);
  if (m.percent > 0 && m.percent < 100) return fmt::format("{}% of the GPU", m.percent);
  return "the whole GPU";
}

std::string RequestText(const mig::PodRequest& r) {
  std::vector<std::string> parts;
  for (const auto& c : r.containers) {
    if (c.count == 0) continue;
    parts.push_back(fmt::format("{}container \"{}\": {} x {}", c.init ? "init " : "", c.name,
                                c.count, MemoryText(c.memory)));
  }
  std::string out = fmt::format("{}", fmt::join(parts, "; "));
  if (!r.preference.empty()) {
    out += fmt::format(" (preference {})", fmt::join(r.preference.entries, ","));
  }
  return out;
}

json RequestJson(const mig::PodRequest& r) {
  json cs = json::array();
  for (const auto& c : r.containers) {
    cs.push_back({{"name", c.name},
                  {"init", c.init},
                  {"count", c.count},
                  {"memoryMiB", c.memory.mib},
                  {"memoryPercent", c.memory.percent}});
  }
  return {{"containers", cs}, {"preference", r.preference.entries}};
}

std::vector<PictureCell> Cells(const scheduler::GpuReport& g, const std::string& highlight_pod) {
  std::vector<PictureCell> cells;
  for (const auto& r : g.reservations) {
    cells.push_back({ShortPodName(r.pod), r.placement, r.pod == highlight_pod});
  }
  return cells;
}

std::string ScheduledCondition(const Object& pod) {
  const auto status = pod.find("status");
  if (status == pod.end() || !status->is_object()) return "";
  const auto conds = status->find("conditions");
  if (conds == status->end() || !conds->is_array()) return "";
  for (const auto& c : *conds) {
    if (c.is_object() && c.value("type", "") == "PodScheduled" && c.value("status", "") != "True") {
      return fmt::format("{}: {}", c.value("reason", ""), c.value("message", ""));
    }
  }
  return "";
}

// The first allowlisted profile (default order) covering `mib` on this planner, or -1.
using mig::CoveringProfile;

bool HasFreePlacement(const mig::GpuPlanner& planner, const mig::GpuUsage& usage, uint32_t idx,
                      mig::Placement* where) {
  const auto& spec = planner.capability().profiles[idx];
  if (usage.counts[idx] >= spec.instance_count) return false;
  for (const auto& p : spec.placements) {
    if ((usage.occupied & p.Mask()) == 0) {
      if (where != nullptr) *where = p;
      return true;
    }
  }
  return false;
}

// One explanation being written: the inputs read once, and the answer in both forms.
struct Explanation {
  const Object& pod;
  std::string key;
  const ClusterSnapshot& snap;
  const protocol::DeviceConfig& config;
  const SlicePainter& painter;
  absl::Time now;
  json& j;
  std::string& text;
};

// The first container asking for instances, or null.
const mig::ContainerRequest* FirstContainer(const mig::PodRequest& request) {
  for (const auto& c : request.containers) {
    if (c.count > 0) return &c;
  }
  return nullptr;
}

// One instance of a placed pod: its line of text and its JSON.
json AllocationEntry(const Explanation& e, const protocol::MigAllocation& a,
                     const scheduler::NodeReport* nr,
                     const std::vector<const Object*>& containers) {
  const std::string cname = static_cast<size_t>(a.container_index) < containers.size()
                                ? containers[a.container_index]->value("name", "")
                                : std::to_string(a.container_index);
  uint32_t gpu_index = 0;
  std::string memory;  // the profile's NVML memory next to the request, when known
  if (nr != nullptr) {
    for (const auto& g : nr->gpus) {
      if (g.uuid != a.gpu_uuid) continue;
      gpu_index = g.index;
      const mig::CatalogueModel* model = mig::FindModelByNvmlName(g.model);
      const mig::ProfileSpec* spec =
          model != nullptr ? model->capability.FindProfile(a.profile) : nullptr;
      if (spec != nullptr) memory = fmt::format(" ({} MiB in NVML)", spec->memory_mib);
    }
  }
  e.text += fmt::format(
      "  container \"{}\" device {}: {}{} at slices {} of GPU {} ({}), {}\n", cname, a.device_index,
      a.profile, memory, a.placement.ToString(), gpu_index, a.gpu_uuid,
      a.runtime ? fmt::format("{} (GI {}, CI {})", a.runtime->mig_uuid, a.runtime->gpu_instance_id,
                              a.runtime->compute_instance_id)
                : "not realized yet (no MIG UUID)");
  json ja = {{"container", cname},
             {"deviceIndex", a.device_index},
             {"gpu", a.gpu_uuid},
             {"profile", a.profile},
             {"placement", {{"start", a.placement.start}, {"size", a.placement.size}}}};
  if (a.runtime) {
    ja["migUUID"] = a.runtime->mig_uuid;
    ja["gpuInstanceID"] = a.runtime->gpu_instance_id;
    ja["computeInstanceID"] = a.runtime->compute_instance_id;
  }
  return ja;
}

// A pod with a decoded, non-empty reservation: where each instance is, and its GPUs' pictures.
void ExplainPlaced(const Explanation& e, const std::vector<protocol::MigAllocation>& allocs) {
  const std::string node = PodNode(e.pod);
  e.j["status"] = "placed";
  e.j["node"] = node;
  const auto bind = kube::Annotation(e.pod, protocol::kBindPhaseAnnotation);
  e.text +=
      fmt::format("Placed on {}{}:\n", node, bind ? fmt::format(" (bind-phase {})", *bind) : "");
  auto state = BuildClusterState(e.snap, e.config);
  const auto reports = state->Report(e.now);
  const scheduler::NodeReport* nr = nullptr;
  for (const auto& n : reports) {
    if (n.name == node) nr = &n;
  }
  json jallocs = json::array();
  std::set<std::string> gpus;
  const auto containers = IndexedContainers(e.pod);
  for (const auto& a : allocs) {
    jallocs.push_back(AllocationEntry(e, a, nr, containers));
    gpus.insert(a.gpu_uuid);
  }
  e.j["allocations"] = jallocs;
  if (nr == nullptr) return;
  for (const auto& g : nr->gpus) {
    if (!gpus.count(g.uuid)) continue;
    e.text += fmt::format("  GPU {} ({}), {}:\n", g.index, g.uuid, g.model);
    e.text += e.painter.header(DrawnUnits(g), "    ") + "\n";
    e.text += e.painter.row(DrawnUnits(g), Cells(g, e.key), "    ") + "\n";
  }
}

// The extender's planner on the cluster without the pod: its views of the nodes.
struct PendingViews {
  std::unique_ptr<scheduler::ClusterState> state;
  std::vector<scheduler::NodeReport> reports;
  std::vector<mig::NodeView> views;
  std::vector<const scheduler::NodeReport*> view_reports;
  std::vector<bool> cordoned;
  std::vector<const mig::NodeView*> open;  // not cordoned: what kube-scheduler offers
};

PendingViews ReadPendingViews(const Explanation& e) {
  PendingViews p;
  p.state = BuildClusterState(e.snap, e.config, e.key);
  p.reports = p.state->Report(e.now);
  for (const auto& n : p.reports) {
    auto v = p.state->View(n.name, e.now);
    if (!v) continue;
    p.views.push_back(std::move(*v));
    p.view_reports.push_back(&n);
    const Object* node = e.snap.FindNode(n.name);
    p.cordoned.push_back(node != nullptr && IsCordoned(*node));
  }
  for (size_t i = 0; i < p.views.size(); ++i) {
    if (!p.cordoned[i]) p.open.push_back(&p.views[i]);
  }
  return p;
}

// One node's verdict, its assignments when the pod fits, and each GPU's verdict and picture.
json ExplainNode(const Explanation& e, const PendingViews& p, size_t i,
                 const mig::PodRequest& request) {
  const mig::NodeView& v = p.views[i];
  std::string& text = e.text;
  const SlicePainter& painter = e.painter;
  const auto& cordoned = p.cordoned;
  const mig::NodePlan plan = mig::PlanPodOnNode(v, request);
  json jn = {{"name", v.name},
             {"cordoned", static_cast<bool>(cordoned[i])},
             {"verdict", mig::VerdictName(plan.verdict)}};
  text += fmt::format("  {}: {}{}\n", v.name, mig::VerdictName(plan.verdict),
                      cordoned[i] ? " (cordoned: kube-scheduler does not offer it)" : "");
  if (!plan.fits() && plan.verdict == mig::Verdict::kNodeUnhealthy) {
    text += fmt::format("    {}\n", plan.Reason(v));
    jn["reason"] = plan.Reason(v);
  }
  if (plan.fits()) {
    json ja = json::array();
    for (const auto& a : plan.assignments) {
      const auto& gv = v.gpus[a.gpu];
      const std::string& profile = gv.planner->capability().profiles[a.profile_index].name;
      text += fmt::format("    would take {} at slices {} of GPU {} ({})\n", profile,
                          a.placement.ToString(), gv.index, gv.uuid);
      ja.push_back({{"gpu", gv.uuid},
                    {"profile", profile},
                    {"placement", {{"start", a.placement.start}, {"size", a.placement.size}}}});
    }
    jn["assignments"] = ja;
  }
  json jgpus = json::array();
  const scheduler::NodeReport& nr = *p.view_reports[i];
  for (size_t g = 0; g < nr.gpus.size(); ++g) {
    const auto& gr = nr.gpus[g];
    const std::string reason = (!plan.fits() && g < plan.gpus.size()) ? plan.gpus[g].reason : "";
    const std::string verdict =
        (!plan.fits() && g < plan.gpus.size()) ? mig::VerdictName(plan.gpus[g].verdict) : "";
    jgpus.push_back({{"index", gr.index},
                     {"uuid", gr.uuid},
                     {"model", gr.model},
                     {"verdict", verdict},
                     {"reason", reason}});
    // The planner's reasons usually start with their verdict ("fragmented: ..."): once.
    const bool prefixed = !verdict.empty() && reason.starts_with(verdict + ":");
    text += fmt::format("    GPU {} ({}, {}){}\n", gr.index, gr.uuid, gr.model,
                        reason.empty() ? ""
                        : prefixed     ? ": " + reason
                                       : ": " + verdict + ": " + reason);
    if (gr.allowlisted) {
      text += painter.header(DrawnUnits(gr), "      ") + "\n";
      text += painter.row(DrawnUnits(gr), Cells(gr, ""), "      ") + "\n";
    }
  }
  jn["gpus"] = jgpus;
  return jn;
}

// (a) The largest per-instance memory with which the same pod fits.
void SuggestMemory(const Explanation& e, const PendingViews& pv, const mig::PodRequest& req,
                   json& suggestions) {
  const mig::PodRequest* request = &req;
  const auto& open = pv.open;
  std::string& text = e.text;
  std::set<uint64_t, std::greater<>> sizes;
  for (const mig::NodeView* v : open) {
    for (const auto& g : v->gpus) {
      if (g.planner == nullptr) continue;
      for (uint32_t idx : g.planner->allowed()) {
        sizes.insert(g.planner->capability().profiles[idx].SizingMib());
      }
    }
  }
  bool found = false;
  for (uint64_t m : sizes) {
    mig::PodRequest smaller = *request;
    for (auto& c : smaller.containers) {
      if (c.count > 0) c.memory = {m, 0};
    }
    const mig::PodPlan p = mig::PlanPod(std::span<const mig::NodeView* const>(open), smaller);
    if (p.chosen < 0) continue;
    const mig::NodeView& v = *open[p.chosen];
    const auto& a = p.nodes[p.chosen].assignments.front();
    const std::string& profile = v.gpus[a.gpu].planner->capability().profiles[a.profile_index].name;
    suggestions["largestMemoryMiB"] = m;
    suggestions["largestMemoryProfile"] = profile;
    suggestions["largestMemoryNode"] = v.name;
    text += fmt::format(
        "  - memory: at most {} MiB per instance (same counts) would fit now ({} on {})\n", m,
        profile, v.name);
    found = true;
    break;
  }
  if (!found) text += "  - memory: no per-instance size fits now, not even the smallest profile\n";
}

// (b) Profiles covering the request with a free placement now: preference values.
void SuggestPreferences(const Explanation& e, const PendingViews& pv,
                        const mig::PodRequest& request, json& suggestions) {
  const auto& open = pv.open;
  std::string& text = e.text;
  const mig::ContainerRequest* first = FirstContainer(request);
  std::map<std::string, std::string> classes;  // class -> "profile on node GPU i"
  if (first != nullptr) {
    for (const mig::NodeView* v : open) {
      for (const auto& g : v->gpus) {
        if (g.planner == nullptr || !g.healthy) continue;
        const uint64_t want =
            mig::ResolveMemory(first->memory.mib, first->memory.percent, g.planner->capability());
        for (uint32_t idx : g.planner->allowed()) {
          const auto& spec = g.planner->capability().profiles[idx];
          mig::Placement where;
          if (spec.SizingMib() < want || !HasFreePlacement(*g.planner, g.usage, idx, &where)) {
            continue;
          }
          const std::string cls(mig::SliceClass(spec.name));
          if (!classes.count(cls)) {
            classes[cls] =
                fmt::format("{} at {} on {} GPU {}", spec.name, where.ToString(), v->name, g.index);
          }
        }
      }
    }
  }
  json jp = json::array();
  for (const auto& [cls, where] : classes) {
    jp.push_back({{"preference", cls}, {"example", where}});
  }
  suggestions["preferences"] = jp;
  if (classes.empty()) {
    text += "  - preference: no profile covering the request has a free placement now\n";
  } else {
    std::vector<std::string> parts;
    for (const auto& [cls, where] : classes) parts.push_back(fmt::format("{} ({})", cls, where));
    text += fmt::format("  - {} values that cover the request and have a free placement now: {}\n",
                        protocol::kMigProfilePreferenceAnnotation, fmt::join(parts, ", "));
  }
}

// One GPU of the blocking-pods analysis: the pods to move and where they could go.
struct Closest {
  size_t gpu;
  mig::EvictionPlan plan;
};

// The GPUs on which one instance of the first container's profile could fit after moving the
// fewest pods, closest first.
std::vector<Closest> ClosestGpus(const DefragInput& in, const mig::ContainerRequest* first) {
  std::vector<Closest> closest;
  if (first == nullptr) return closest;
  for (size_t i = 0; i < in.gpus.size(); ++i) {
    const auto& g = in.gpus[i];
    if (g.planner == nullptr || !g.healthy) continue;
    const int idx = CoveringProfile(*g.planner, first->memory);
    if (idx < 0) continue;
    auto plan =
        mig::PlanEviction(*g.planner, g.reservations, g.planner->capability().profiles[idx].name);
    if (!plan.ok() || !plan->feasible) continue;
    closest.push_back({i, std::move(*plan)});
  }
  std::stable_sort(closest.begin(), closest.end(), [](const Closest& a, const Closest& b) {
    if (a.plan.owners.size() != b.plan.owners.size()) {
      return a.plan.owners.size() < b.plan.owners.size();
    }
    return a.plan.units_moved < b.plan.units_moved;
  });
  return closest;
}

// (c) The pods holding the blocking slices on the closest GPUs.
void SuggestBlocking(const Explanation& e, const PendingViews& pv, const mig::PodRequest& request,
                     size_t closest_gpus, json& suggestions) {
  std::string& text = e.text;
  const mig::ContainerRequest* first = FirstContainer(request);
  std::set<std::string> open_names;
  for (const mig::NodeView* v : pv.open) open_names.insert(v->name);
  const DefragInput in = DefragGpus(*pv.state, pv.reports, open_names, e.now);
  const std::vector<Closest> closest = ClosestGpus(in, first);
  json jb = json::array();
  if (closest.empty()) {
    text += "  - blocking pods: no GPU could take one instance even after moving pods\n";
  } else {
    text += fmt::format("  - blocking pods on the closest GPUs (for one instance{}):\n",
                        first != nullptr && first->count > 1 ? ", of the first container" : "");
  }
  for (size_t k = 0; k < closest.size() && k < closest_gpus; ++k) {
    const auto& c = closest[k];
    const auto& g = in.gpus[c.gpu];
    const auto moves = c.plan.fits_now()
                           ? std::vector<Replacement>{}
                           : ReplaceEvicted(e.snap, e.config, c.plan.owners, g.node, g.uuid,
                                            c.plan.profile, c.plan.placement, e.now);
    json jm = json::array();
    std::vector<std::string> parts;
    for (const auto& m : moves) {
      jm.push_back({{"pod", m.pod},
                    {"canBeReplaced", m.placed},
                    {"replacement", m.where},
                    {"whyNot", m.why_not}});
      parts.push_back(fmt::format("{} -> {}", m.pod, m.placed ? m.where : m.why_not));
    }
    jb.push_back(
        {{"node", g.node},
         {"gpu", g.uuid},
         {"profile", c.plan.profile},
         {"placement", {{"start", c.plan.placement.start}, {"size", c.plan.placement.size}}},
         {"pods", c.plan.owners},
         {"unitsMoved", c.plan.units_moved},
         {"moves", jm}});
    if (c.plan.fits_now()) {
      text += fmt::format("    {} GPU {}: {} fits at {} with nothing moved\n", g.node, g.index,
                          c.plan.profile, c.plan.placement.ToString());
      continue;
    }
    text +=
        fmt::format("    {} GPU {}: moving {} frees slices {} for {}\n", g.node, g.index,
                    fmt::join(c.plan.owners, ", "), c.plan.placement.ToString(), c.plan.profile);
    for (const auto& p : parts) text += "      " + p + "\n";
    text += RenderPlanPictures(*in.reports[c.gpu], c.plan, e.painter, "      ");
  }
  suggestions["blocking"] = jb;
}

// A pod that fits on no schedulable node: whether it would fit with the per-GPU cordons
// (hami.io/device-cordon) lifted, and then which cordoned GPU it waits for. The planner on the
// same snapshot with the cordon annotations of the nodes kube-scheduler offers removed.
void ExplainCordonWait(const Explanation& e, const PendingViews& pv,
                       const mig::PodRequest& request) {
  ClusterSnapshot lifted = e.snap;
  bool any = false;
  for (auto& node : lifted.nodes) {
    if (IsCordoned(node)) continue;
    auto& ann = node["metadata"]["annotations"];
    if (ann.is_object() && ann.contains(std::string(protocol::kDeviceCordonAnnotation))) {
      ann.erase(std::string(protocol::kDeviceCordonAnnotation));
      any = true;
    }
  }
  if (!any) return;
  const auto state = BuildClusterState(lifted, e.config, e.key);
  std::vector<mig::NodeView> views;
  for (const mig::NodeView* v : pv.open) {
    if (auto lv = state->View(v->name, e.now)) views.push_back(std::move(*lv));
  }
  std::vector<const mig::NodeView*> open;
  for (const auto& v : views) open.push_back(&v);
  const mig::PodPlan plan = mig::PlanPod(std::span<const mig::NodeView* const>(open), request);
  if (plan.chosen < 0) return;
  const mig::NodeView& v = *open[plan.chosen];
  // The GPUs of that placement the real view refuses as cordoned.
  const mig::NodeView* real = nullptr;
  const scheduler::NodeReport* report = nullptr;
  for (size_t i = 0; i < pv.views.size(); ++i) {
    if (pv.views[i].name == v.name) {
      real = &pv.views[i];
      report = pv.view_reports[i];
    }
  }
  if (real == nullptr) return;
  json waits = json::array();
  std::set<size_t> seen;
  for (const auto& a : plan.nodes[plan.chosen].assignments) {
    if (a.gpu >= report->gpus.size() || !seen.insert(a.gpu).second) continue;
    const auto& gr = report->gpus[a.gpu];
    if (gr.unhealthy_code != "cordoned") continue;
    waits.push_back(
        {{"node", v.name}, {"gpu", gr.uuid}, {"index", gr.index}, {"reason", gr.unhealthy_reason}});
    e.text += fmt::format("  waiting: GPU {} ({}) of node {} is {}\n", gr.index, gr.uuid, v.name,
                          gr.unhealthy_reason);
  }
  if (!waits.empty()) e.j["cordonedGpus"] = waits;
}

// The defragmentation reservations (dynmig.io/defrag-reservation) that name the pod: "waiting:
// defragmentation of GPU X on node evicted a, b; reserved slices S until T".
void ExplainDefrag(const Explanation& e) {
  json jd = json::array();
  for (const auto& n : e.snap.nodes) {
    auto value = kube::Annotation(n, protocol::kNodeDefragReservationAnnotation);
    if (!value) continue;
    auto holds = protocol::DecodeDefragReservations(*value);
    if (!holds.ok()) continue;
    for (const auto& h : *holds) {
      if (h.pod != e.key) continue;
      const bool expired = absl::FromUnixSeconds(h.expires) <= e.now;
      const std::string until = absl::FormatTime(
          absl::RFC3339_sec, absl::FromUnixSeconds(h.expires), absl::UTCTimeZone());
      e.text += fmt::format(
          "\nwaiting: defragmentation of {} on {} evicted {}; reserved slices {} ({}) {} {}\n",
          h.gpu_uuid, kube::Name(n),
          h.evicted.empty() ? "nothing" : fmt::format("{}", fmt::join(h.evicted, ", ")),
          h.placement.ToString(), h.profile, expired ? "expired at" : "until", until);
      jd.push_back({{"node", kube::Name(n)},
                    {"gpu", h.gpu_uuid},
                    {"profile", h.profile},
                    {"placement", {{"start", h.placement.start}, {"size", h.placement.size}}},
                    {"evicted", h.evicted},
                    {"expires", until},
                    {"expired", expired}});
    }
  }
  if (!jd.empty()) e.j["defragmentation"] = jd;
}

// A pending pod: every node's verdict, whether it fits now, and what would make it fit.
void ExplainPending(const Explanation& e, const mig::PodRequest& request, size_t closest_gpus) {
  ExplainDefrag(e);
  const PendingViews pv = ReadPendingViews(e);
  json jnodes = json::array();
  e.text += "\nPer node (the extender's planner, this pod left out):\n";
  if (pv.views.empty()) e.text += "  no node registers MIG GPUs\n";
  for (size_t i = 0; i < pv.views.size(); ++i) jnodes.push_back(ExplainNode(e, pv, i, request));
  e.j["nodes"] = jnodes;

  const mig::PodPlan now_plan =
      mig::PlanPod(std::span<const mig::NodeView* const>(pv.open), request);
  const std::string condition = ScheduledCondition(e.pod);
  if (!condition.empty()) e.j["podScheduledCondition"] = condition;
  if (now_plan.chosen >= 0) {
    const mig::NodeView& v = *pv.open[now_plan.chosen];
    e.j["status"] = "fits-now";
    e.j["wouldPlaceOn"] = v.name;
    e.text += fmt::format(
        "\nIt fits now: the extender would place it on {}. The wait is outside the extender "
        "(kube-scheduler has not retried yet, or another predicate rejects the node).\n",
        v.name);
  } else {
    e.j["status"] = "pending";
    e.text += "\nIt fits on no schedulable node now.\n";
    ExplainCordonWait(e, pv, request);
  }
  if (!condition.empty()) e.text += fmt::format("  PodScheduled condition: {}\n", condition);

  json suggestions = json::object();
  e.text += "\nWhat would fit now:\n";
  SuggestMemory(e, pv, request, suggestions);
  SuggestPreferences(e, pv, request, suggestions);
  SuggestBlocking(e, pv, request, closest_gpus, suggestions);
  e.j["suggestions"] = suggestions;
  if (e.j["status"] == "pending") {
    auto modes =
        ExplainModeSwitches(e.snap, e.config.mig_mode_switching, mig::ModeKind::kMig, e.now);
    if (!modes.text.empty()) {
      e.text += modes.text;
      e.j["modeSwitching"] = std::move(modes.json);
    }
  }
}

// The request, or the reason there is nothing to plan (not a MIG pod, an invalid request, ended).
std::optional<mig::PodRequest> ExplainRequest(const Explanation& e) {
  const protocol::ResourceNames& resources = e.config.resources;
  if (!protocol::IsMigPod(e.pod, resources)) {
    e.j["status"] = "not-mig";
    e.text += fmt::format(
        "Not a MIG pod: it requests none of {}, {}, {} or {}, or its {} excludes mig. dynmig does "
        "not place it.\n",
        resources.count, resources.memory, resources.memory_percentage, resources.cores,
        protocol::kVgpuModeAnnotation);
    return std::nullopt;
  }
  std::vector<std::string> warnings;
  auto request = protocol::ParsePodRequest(e.pod, resources, &warnings);
  if (!request.ok()) {
    e.j["status"] = "invalid-request";
    e.j["error"] = std::string(request.status().message());
    e.text += fmt::format("Its GPU request is invalid, so the extender rejects it: {}\n",
                          std::string(request.status().message()));
    return std::nullopt;
  }
  e.j["request"] = RequestJson(*request);
  e.text += fmt::format("Asks for {}\n", RequestText(*request));
  for (const auto& w : warnings) e.text += "  note: " + w + "\n";
  if (kube::IsTerminated(e.pod)) {
    e.j["status"] = "terminated";
    e.text += "It has terminated: its reservation (if any) is released.\n";
    return std::nullopt;
  }
  return std::move(*request);
}

// Placed (a reservation that decodes and is not empty, or one that does not decode): true once
// explained.
bool ExplainReservation(const Explanation& e) {
  const auto annotation = kube::Annotation(e.pod, protocol::kMigAllocationsAnnotation);
  if (!annotation) return false;
  auto allocs = protocol::DecodeMigAllocations(*annotation);
  if (!allocs.ok()) {
    e.j["status"] = "placed";
    e.j["error"] = std::string(allocs.status().message());
    e.text += fmt::format(
        "Its reservation annotation does not decode: {}\nThe scheduler fails closed on the "
        "GPUs it uses until this is repaired.\n",
        std::string(allocs.status().message()));
    return true;
  }
  if (allocs->empty()) return false;
  ExplainPlaced(e, *allocs);
  return true;
}

// --- whole-GPU pods (nvidia.com/vgpu-mode: hami-core) ------------------------------------------

std::string WholeRequestText(const protocol::WholeGpuRequest& r) {
  std::vector<std::string> parts;
  for (const auto& c : r.containers) {
    if (c.count == 0) continue;
    std::string part = fmt::format("{}{}: {} whole GPU{}", c.init ? "init " : "", c.name, c.count,
                                   c.count == 1 ? "" : "s");
    if (c.min_memory_mib > 0) part += fmt::format(" of at least {} MiB", c.min_memory_mib);
    parts.push_back(std::move(part));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

// Placed: the device list the scheduler wrote (hami.io/vgpu-devices-allocated), and which GPUs the
// device plugin has yet to serve (still in -to-allocate). False: not placed.
bool ExplainWholePlaced(const Explanation& e) {
  const std::string node = kube::Annotation(e.pod, protocol::kVgpuNodeAnnotation).value_or("");
  const auto allocated = kube::Annotation(e.pod, protocol::kDevicesAllocatedAnnotation);
  if (node.empty() || !allocated.has_value()) return false;
  auto devices = protocol::DecodePodDevices(*allocated);
  e.j["status"] = "placed";
  e.j["node"] = node;
  if (!devices.ok()) {
    e.j["error"] = std::string(devices.status().message());
    e.text += fmt::format(
        "Placed on {}, but its {} does not decode: {}\nThe scheduler fails closed on the GPUs it "
        "names until this is repaired.\n",
        node, protocol::kDevicesAllocatedAnnotation, std::string(devices.status().message()));
    return true;
  }
  auto pending = protocol::DecodePodDevices(
      kube::Annotation(e.pod, protocol::kDevicesToAllocateAnnotation).value_or(""));
  const std::string phase = kube::Annotation(e.pod, protocol::kBindPhaseAnnotation).value_or("");
  e.text += fmt::format("Placed on node {} (bind-phase \"{}\"):\n", node, phase);
  json gpus = json::array();
  for (size_t c = 0; c < devices->size(); ++c) {
    for (const auto& d : (*devices)[c]) {
      bool waiting = false;
      if (pending.ok() && c < pending->size()) {
        for (const auto& p : (*pending)[c]) waiting = waiting || p.uuid == d.uuid;
      }
      gpus.push_back({{"container", c},
                      {"gpu", d.uuid},
                      {"type", d.type},
                      {"memoryMiB", d.used_mem_mib},
                      {"allocated", !waiting}});
      e.text += fmt::format("  container {}: whole GPU {} ({}, {} MiB){}\n", c, d.uuid, d.type,
                            d.used_mem_mib, waiting ? ": not served by the device plugin yet" : "");
    }
  }
  e.j["gpus"] = gpus;
  return true;
}

// Why a whole-GPU pod waits, or where it is: the extender's own placement
// (ClusterState::PlanAndReserveWhole) on the cluster without this pod.
void ExplainWhole(const Explanation& e) {
  e.j["mode"] = "hami-core";
  if (!e.config.mig_mode_switching.enabled) {
    e.j["status"] = "whole-gpu-off";
    e.text += fmt::format(
        "A whole-GPU pod ({}: hami-core). dynmig places whole-GPU pods only while "
        "nvidia.migModeSwitching is enabled in the device config; it is off, so the scheduler "
        "refuses it (not a MIG pod) and it stays pending.\n",
        protocol::kVgpuModeAnnotation);
    return;
  }
  auto request = protocol::ParseWholeGpuRequest(e.pod, e.config.resources);
  if (!request.ok()) {
    e.j["status"] = "invalid-request";
    e.j["error"] = std::string(request.status().message());
    e.text += fmt::format("Its whole-GPU request is invalid, so the extender rejects it: {}\n",
                          std::string(request.status().message()));
    return;
  }
  e.text += fmt::format("Asks for {}\n", WholeRequestText(*request));
  e.j["request"] = WholeRequestText(*request);
  if (kube::IsTerminated(e.pod)) {
    e.j["status"] = "terminated";
    e.text += "It has terminated: its whole GPUs (if any) are released.\n";
    return;
  }
  if (ExplainWholePlaced(e)) return;
  auto state = BuildClusterState(e.snap, e.config, e.key);
  auto decision = state->PlanAndReserveWhole(e.key, *request, {}, e.now);
  if (!decision.ok()) {
    e.j["status"] = "invalid-request";
    e.j["error"] = std::string(decision.status().message());
    e.text += std::string(decision.status().message()) + "\n";
    return;
  }
  json nodes = json::object();
  for (const auto& [node, reason] : decision->failed) nodes[node] = reason;
  e.j["nodes"] = nodes;
  if (decision->reservation.has_value()) {
    e.j["status"] = "fits-now";
    e.j["wouldPlace"] = decision->reservation->summary;
    e.text += fmt::format(
        "It would be placed now: {}. The wait is outside the extender (kube-scheduler's own "
        "filters, a cordoned node, or it has not been tried since the GPUs were freed).\n",
        decision->reservation->summary);
    if (const std::string c = ScheduledCondition(e.pod); !c.empty()) {
      e.text += fmt::format("  PodScheduled condition: {}\n", c);
    }
    return;
  }
  e.j["status"] = "pending";
  e.text += "Pending: no node has the whole GPUs it asks for.\n";
  if (decision->failed.empty()) e.text += "  No node registers a GPU with dynmig.\n";
  for (const auto& [node, reason] : decision->failed) {
    e.text += fmt::format("  {}: {}\n", node, reason);
  }
  // Why each GPU in MIG mode does or does not switch for it (needs a reboot, in use, hysteresis..).
  auto modes =
      ExplainModeSwitches(e.snap, e.config.mig_mode_switching, mig::ModeKind::kWhole, e.now);
  if (!modes.text.empty()) {
    e.text += modes.text;
    e.j["modeSwitching"] = std::move(modes.json);
  } else {
    e.text +=
        "A GPU in MIG mode is switched to whole-GPU mode only by the scheduler's mode "
        "decisions (when idle and allowed by nvidia.migModeSwitching).\n";
  }
}

}  // namespace

absl::StatusOr<CommandOutput> RunExplain(kube::KubeClient& client, const ExplainOptions& options,
                                         const SlicePainter& painter, absl::Time now) {
  auto got = client.GetPod(options.ns, options.pod);
  if (!got.ok()) {
    if (got.status().code() == absl::StatusCode::kNotFound) {
      return absl::NotFoundError(
          fmt::format("pod \"{}\" not found in namespace \"{}\"", options.pod, options.ns));
    }
    return got.status();
  }
  const Object pod = *got;
  auto snap = TakeSnapshot(client, now);
  if (!snap.ok()) return snap.status();
  auto source = FindDeviceConfig(client, options.config);
  if (!source.ok()) return source.status();
  const protocol::DeviceConfig config = EffectiveConfig(*source);

  CommandOutput out;
  const Explanation e{pod, PodKey(pod), *snap, config, painter, now, out.json, out.text};
  const std::string phase = kube::Phase(pod).empty() ? "Unknown" : kube::Phase(pod);
  out.json = {{"pod", e.key}, {"phase", phase}, {"configSource", source->origin}};
  out.text += fmt::format("Pod {}: phase {}\n", e.key, phase);
  if (protocol::IsWholeGpuPod(pod, config.resources)) {
    ExplainWhole(e);
    return out;
  }
  const auto request = ExplainRequest(e);
  if (!request) return out;
  if (ExplainReservation(e)) return out;
  ExplainPending(e, *request, options.closest_gpus);
  return out;
}

}  // namespace dynmig::ops
