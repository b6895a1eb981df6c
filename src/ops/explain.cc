#include "ops/explain.h"

#include <algorithm>
#include <set>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "mig/catalogue.h"
#include "mig/defrag.h"
#include "mig/node_planner.h"
#include "ops/defrag_plan.h"
#include "ops/layout.h"
#include "protocol/annotations.h"
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
int CoveringProfile(const mig::GpuPlanner& planner, const mig::MemoryRequest& m) {
  const uint64_t want = mig::ResolveMemory(m.mib, m.percent, planner.capability());
  for (uint32_t idx : planner.allowed()) {
    if (planner.capability().profiles[idx].SizingMib() >= want) return static_cast<int>(idx);
  }
  return -1;
}

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
  const std::string key = PodKey(pod);
  auto snap = TakeSnapshot(client, now);
  if (!snap.ok()) return snap.status();
  auto source = FindDeviceConfig(client, options.config);
  if (!source.ok()) return source.status();
  const protocol::DeviceConfig config = EffectiveConfig(*source);

  CommandOutput out;
  json& j = out.json;
  std::string& text = out.text;
  const std::string phase = kube::Phase(pod).empty() ? "Unknown" : kube::Phase(pod);
  j = {{"pod", key}, {"phase", phase}, {"configSource", source->origin}};
  text += fmt::format("Pod {}: phase {}\n", key, phase);

  if (!protocol::IsMigPod(pod, config.resources)) {
    j["status"] = "not-mig";
    text += fmt::format(
        "Not a MIG pod: it requests none of {}, {}, {} or {}, or its nvidia.com/vgpu-mode "
        "excludes mig. dynmig does not place it.\n",
        config.resources.count, config.resources.memory, config.resources.memory_percentage,
        config.resources.cores);
    return out;
  }
  std::vector<std::string> warnings;
  auto request = protocol::ParsePodRequest(pod, config.resources, &warnings);
  if (!request.ok()) {
    j["status"] = "invalid-request";
    j["error"] = std::string(request.status().message());
    text += fmt::format("Its GPU request is invalid, so the extender rejects it: {}\n",
                        std::string(request.status().message()));
    return out;
  }
  j["request"] = RequestJson(*request);
  text += fmt::format("Asks for {}\n", RequestText(*request));
  for (const auto& w : warnings) text += "  note: " + w + "\n";

  if (IsTerminated(pod)) {
    j["status"] = "terminated";
    text += "It has terminated: its reservation (if any) is released.\n";
    return out;
  }

  // Placed?
  const auto annotation = kube::Annotation(pod, protocol::kMigAllocationsAnnotation);
  if (annotation) {
    auto allocs = protocol::DecodeMigAllocations(*annotation);
    if (!allocs.ok()) {
      j["status"] = "placed";
      j["error"] = std::string(allocs.status().message());
      text += fmt::format(
          "Its reservation annotation does not decode: {}\nThe scheduler fails closed on the "
          "GPUs it uses until this is repaired.\n",
          std::string(allocs.status().message()));
      return out;
    }
    if (!allocs->empty()) {
      const std::string node = PodNode(pod);
      j["status"] = "placed";
      j["node"] = node;
      const auto bind = kube::Annotation(pod, protocol::kBindPhaseAnnotation);
      text += fmt::format("Placed on {}{}:\n", node,
                          bind ? fmt::format(" (bind-phase {})", *bind) : "");
      auto state = BuildClusterState(*snap, config);
      const auto reports = state->Report(now);
      const scheduler::NodeReport* nr = nullptr;
      for (const auto& n : reports) {
        if (n.name == node) nr = &n;
      }
      json jallocs = json::array();
      std::set<std::string> gpus;
      const auto containers = IndexedContainers(pod);
      for (const auto& a : *allocs) {
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
        text += fmt::format(
            "  container \"{}\" device {}: {}{} at slices {} of GPU {} ({}), {}\n", cname,
            a.device_index, a.profile, memory, a.placement.ToString(), gpu_index, a.gpu_uuid,
            a.runtime ? fmt::format("{} (GI {}, CI {})", a.runtime->mig_uuid,
                                    a.runtime->gpu_instance_id, a.runtime->compute_instance_id)
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
        jallocs.push_back(ja);
        gpus.insert(a.gpu_uuid);
      }
      j["allocations"] = jallocs;
      if (nr != nullptr) {
        for (const auto& g : nr->gpus) {
          if (!gpus.count(g.uuid)) continue;
          text += fmt::format("  GPU {} ({}), {}:\n", g.index, g.uuid, g.model);
          text += painter.header(DrawnUnits(g), "    ") + "\n";
          text += painter.row(DrawnUnits(g), Cells(g, key), "    ") + "\n";
        }
      }
      return out;
    }
  }

  // Pending: the extender's planner on the cluster without this pod.
  auto state = BuildClusterState(*snap, config, key);
  const auto reports = state->Report(now);
  std::vector<mig::NodeView> views;
  std::vector<const scheduler::NodeReport*> view_reports;
  std::vector<bool> cordoned;
  for (const auto& n : reports) {
    auto v = state->View(n.name, now);
    if (!v) continue;
    views.push_back(std::move(*v));
    view_reports.push_back(&n);
    const Object* node = snap->FindNode(n.name);
    cordoned.push_back(node != nullptr && IsCordoned(*node));
  }
  std::vector<const mig::NodeView*> open;  // not cordoned: what kube-scheduler offers
  for (size_t i = 0; i < views.size(); ++i) {
    if (!cordoned[i]) open.push_back(&views[i]);
  }

  json jnodes = json::array();
  text += "\nPer node (the extender's planner, this pod left out):\n";
  if (views.empty()) text += "  no node registers MIG GPUs\n";
  for (size_t i = 0; i < views.size(); ++i) {
    const mig::NodeView& v = views[i];
    const mig::NodePlan plan = mig::PlanPodOnNode(v, *request);
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
    const scheduler::NodeReport& nr = *view_reports[i];
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
    jnodes.push_back(std::move(jn));
  }
  j["nodes"] = jnodes;

  const mig::PodPlan now_plan = mig::PlanPod(std::span<const mig::NodeView* const>(open), *request);
  const std::string condition = ScheduledCondition(pod);
  if (!condition.empty()) j["podScheduledCondition"] = condition;
  if (now_plan.chosen >= 0) {
    const mig::NodeView& v = *open[now_plan.chosen];
    j["status"] = "fits-now";
    j["wouldPlaceOn"] = v.name;
    text += fmt::format(
        "\nIt fits now: the extender would place it on {}. The wait is outside the extender "
        "(kube-scheduler has not retried yet, or another predicate rejects the node).\n",
        v.name);
    if (!condition.empty()) text += fmt::format("  PodScheduled condition: {}\n", condition);
  } else {
    j["status"] = "pending";
    text += "\nIt fits on no schedulable node now.\n";
    if (!condition.empty()) text += fmt::format("  PodScheduled condition: {}\n", condition);
  }

  // What would make it fit.
  json suggestions = json::object();
  text += "\nWhat would fit now:\n";
  // (a) The largest per-instance memory with which the same pod fits.
  {
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
      const std::string& profile =
          v.gpus[a.gpu].planner->capability().profiles[a.profile_index].name;
      suggestions["largestMemoryMiB"] = m;
      suggestions["largestMemoryProfile"] = profile;
      suggestions["largestMemoryNode"] = v.name;
      text += fmt::format(
          "  - memory: at most {} MiB per instance (same counts) would fit now ({} on {})\n", m,
          profile, v.name);
      found = true;
      break;
    }
    if (!found)
      text += "  - memory: no per-instance size fits now, not even the smallest profile\n";
  }
  // (b) Profiles covering the request with a free placement now: preference values.
  {
    const mig::ContainerRequest* first = nullptr;
    for (const auto& c : request->containers) {
      if (c.count > 0 && first == nullptr) first = &c;
    }
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
              classes[cls] = fmt::format("{} at {} on {} GPU {}", spec.name, where.ToString(),
                                         v->name, g.index);
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
      text += fmt::format(
          "  - nvidia.com/mig-profile-preference values that cover the request and "
          "have a free placement now: {}\n",
          fmt::join(parts, ", "));
    }
  }
  // (c) The pods holding the blocking slices on the closest GPUs.
  {
    const mig::ContainerRequest* first = nullptr;
    for (const auto& c : request->containers) {
      if (c.count > 0 && first == nullptr) first = &c;
    }
    std::set<std::string> open_names;
    for (const mig::NodeView* v : open) open_names.insert(v->name);
    const DefragInput in = DefragGpus(*state, reports, open_names, now);
    struct Closest {
      size_t gpu;
      mig::EvictionPlan plan;
    };
    std::vector<Closest> closest;
    if (first != nullptr) {
      for (size_t i = 0; i < in.gpus.size(); ++i) {
        const auto& g = in.gpus[i];
        if (g.planner == nullptr || !g.healthy) continue;
        const int idx = CoveringProfile(*g.planner, first->memory);
        if (idx < 0) continue;
        auto plan = mig::PlanEviction(*g.planner, g.reservations,
                                      g.planner->capability().profiles[idx].name);
        if (!plan.ok() || !plan->feasible) continue;
        closest.push_back({i, std::move(*plan)});
      }
    }
    std::stable_sort(closest.begin(), closest.end(), [](const Closest& a, const Closest& b) {
      if (a.plan.owners.size() != b.plan.owners.size()) {
        return a.plan.owners.size() < b.plan.owners.size();
      }
      return a.plan.units_moved < b.plan.units_moved;
    });
    json jb = json::array();
    if (closest.empty()) {
      text += "  - blocking pods: no GPU could take one instance even after moving pods\n";
    } else {
      text += fmt::format("  - blocking pods on the closest GPUs (for one instance{}):\n",
                          first != nullptr && first->count > 1 ? ", of the first container" : "");
    }
    for (size_t k = 0; k < closest.size() && k < options.closest_gpus; ++k) {
      const auto& c = closest[k];
      const auto& g = in.gpus[c.gpu];
      const auto moves = c.plan.fits_now()
                             ? std::vector<Replacement>{}
                             : ReplaceEvicted(*snap, config, c.plan.owners, g.node, g.uuid,
                                              c.plan.profile, c.plan.placement, now);
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
      text += RenderPlanPictures(*in.reports[c.gpu], c.plan, painter, "      ");
    }
    suggestions["blocking"] = jb;
  }
  j["suggestions"] = suggestions;
  return out;
}

}  // namespace dynmig::ops
