#include "ops/layout.h"

#include <algorithm>
#include <bit>

#include "common/strings.h"
#include "fmt/format.h"
#include "ops/report.h"

namespace dynmig::ops {
namespace {

// A stable pastel color per pod.
std::string ColorOf(const std::string& pod) {
  uint32_t h = 2166136261u;  // FNV-1a
  for (unsigned char c : pod) h = (h ^ c) * 16777619u;
  return fmt::format("hsl({},65%,72%)", h % 360);
}

std::string RuntimeText(const scheduler::ReservationReport& r) {
  if (!r.runtime) return r.assumed ? "assumed (annotation not written yet)" : "not realized yet";
  return fmt::format("{} (GI {}, CI {})", r.runtime->mig_uuid, r.runtime->gpu_instance_id,
                     r.runtime->compute_instance_id);
}

uint32_t FreeUnits(const scheduler::GpuReport& gpu) {
  const uint32_t units = DrawnUnits(gpu);
  mig::SliceMask used = 0;
  for (const auto& r : gpu.reservations) {
    if (r.placement.end() <= mig::kMaxPlacementUnits) used |= r.placement.Mask();
  }
  return units - std::min<uint32_t>(
                     units, static_cast<uint32_t>(std::popcount(used & mig::FullMask(units))));
}

// A whole GPU's state in words: "free", "held by ns/p", "held by ns/p (assumed: ...)".
std::string WholeState(const scheduler::WholeGpuReport& w) {
  if (w.holder.empty()) return "free";
  return fmt::format("held by {}{}", w.holder,
                     w.assumed ? " (assumed: reservation not written yet)" : "");
}

constexpr std::string_view kCss = R"CSS(
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em;margin-bottom:.2em}
h2{font-size:1.1em;margin:1.4em 0 .4em}
.generated{color:#666;font-size:.85em;margin-top:0}
.bad{color:#b00020;font-weight:600;font-size:.85em;margin-left:.6em}
table.gpus{border-collapse:collapse;width:100%}
tr.gpu th{text-align:left;vertical-align:top;padding:.4em .8em .4em 0;width:16em;font-weight:600}
tr.gpu th small{font-weight:400;color:#555;display:block}
tr.gpu td{padding:.4em 0;border-top:1px solid #ddd}
tr.gpu.unhealthy td{background:repeating-linear-gradient(45deg,#fff,#fff 6px,#fbe9eb 6px,#fbe9eb 12px)}
.axis{display:grid;gap:2px;grid-auto-rows:minmax(1.4em,auto)}
.unit{grid-row:1;text-align:center;font-size:.75em;color:#777;background:#f3f3f3;border-radius:2px}
.free{grid-row:2;background:#fafafa;border:1px dashed #ccc;border-radius:3px}
.res{grid-row:2;border-radius:3px;padding:.2em .3em;font-size:.8em;overflow:hidden;white-space:nowrap;
text-overflow:ellipsis;border:1px solid rgba(0,0,0,.25);text-align:center}
.res.pending{border-style:dashed}
.reason{color:#b00020;font-size:.8em;margin-top:.3em}
.idle{color:#2e6b30;font-size:.8em;margin-top:.3em}
.whole{grid-row:1;border-radius:3px;padding:.2em .3em;font-size:.8em;text-align:center;
border:1px solid rgba(0,0,0,.25)}
.whole.free{border:1px dashed #ccc;background:#fafafa;color:#777}
)CSS";

}  // namespace

uint32_t DrawnUnits(const scheduler::GpuReport& gpu) {
  if (gpu.units > 0) return gpu.units;
  uint32_t end = 8;
  for (const auto& r : gpu.reservations) end = std::max(end, r.placement.end());
  return std::min(end, mig::kMaxPlacementUnits);
}

std::string ShortPodName(const std::string& pod_key) {
  const size_t slash = pod_key.find('/');
  return slash == std::string::npos ? pod_key : pod_key.substr(slash + 1);
}

namespace {

// A node's whole GPUs (MIG off, given to one pod each) by NVML index, to be drawn among its MIG
// GPUs in index order.
std::vector<const scheduler::WholeGpuReport*> WholeByIndex(const scheduler::NodeReport& n) {
  std::vector<const scheduler::WholeGpuReport*> out;
  for (const auto& w : n.whole_gpus) out.push_back(&w);
  std::stable_sort(out.begin(), out.end(),
                   [](const auto* a, const auto* b) { return a->index < b->index; });
  return out;
}

// One whole GPU's row: one bar across it.
void WholeGpuRowHtml(const scheduler::NodeReport& n, const scheduler::WholeGpuReport& w,
                     std::string& out) {
  out += fmt::format(
      "<tr class=\"gpu whole{}\" data-node=\"{}\" data-gpu=\"{}\">\n<th>GPU {}<small>{}</small>"
      "<small>{}</small><small>whole GPU (MIG off), {} MiB</small></th>\n",
      w.healthy ? "" : " unhealthy", HtmlEscape(n.name), HtmlEscape(w.uuid), w.index,
      HtmlEscape(w.model), HtmlEscape(w.uuid), w.memory_mib);
  out += "<td><div class=\"axis\" style=\"grid-template-columns:1fr\">\n";
  if (w.holder.empty()) {
    out += "<span class=\"whole free\" title=\"whole GPU free\">free</span>\n";
  } else {
    out += fmt::format(
        "<span class=\"whole{}\" data-pod=\"{}\" style=\"background:{}\" title=\"{}\">whole "
        "GPU &middot; {}</span>\n",
        w.assumed ? " pending" : "", HtmlEscape(w.holder), ColorOf(w.holder),
        HtmlEscape(WholeState(w)), HtmlEscape(ShortPodName(w.holder)));
  }
  out += "</div>\n";
  if (!w.healthy) {
    out +=
        fmt::format("<div class=\"reason\">unhealthy: {}</div>\n", HtmlEscape(w.unhealthy_reason));
  }
  out += "</td>\n</tr>\n";
}

// One whole GPU's lines of the terminal picture.
std::string WholeGpuText(const scheduler::WholeGpuReport& w) {
  std::string out = fmt::format("  GPU {}  {}  {}  whole GPU (MIG off, {} MiB): {}\n", w.index,
                                w.model, w.uuid, w.memory_mib, WholeState(w));
  if (!w.healthy) out += fmt::format("  UNHEALTHY: {}\n", w.unhealthy_reason);
  return out;
}

}  // namespace

std::string RenderLayoutHtml(const std::vector<scheduler::NodeReport>& nodes, absl::Time now) {
  std::string out;
  out += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += "<title>dynmig MIG layout</title>\n<style>";
  out += kCss;
  out += "</style>\n</head>\n<body>\n<h1>dynmig MIG layout</h1>\n";
  size_t gpus = 0, reservations = 0;
  for (const auto& n : nodes) {
    gpus += n.gpus.size() + n.whole_gpus.size();
    for (const auto& g : n.gpus) reservations += g.reservations.size();
    for (const auto& w : n.whole_gpus) reservations += w.holder.empty() ? 0 : 1;
  }
  out += fmt::format(
      "<p class=\"generated\">{} nodes, {} GPUs, {} reservations &middot; snapshot {}</p>\n",
      nodes.size(), gpus, reservations,
      HtmlEscape(absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", now, absl::UTCTimeZone())));
  for (const auto& n : nodes) {
    out += fmt::format("<section class=\"node\" data-node=\"{}\">\n<h2>{}", HtmlEscape(n.name),
                       HtmlEscape(n.name));
    if (!n.healthy)
      out +=
          fmt::format("<span class=\"bad\">unhealthy: {}</span>", HtmlEscape(n.unhealthy_reason));
    out += "</h2>\n";
    if (n.gpus.empty() && n.whole_gpus.empty()) {
      out += "<p>No MIG GPU registered.</p>\n</section>\n";
      continue;
    }
    out += "<table class=\"gpus\">\n";
    const auto whole = WholeByIndex(n);
    size_t wi = 0;
    for (const auto& g : n.gpus) {
      while (wi < whole.size() && whole[wi]->index < g.index) WholeGpuRowHtml(n, *whole[wi++], out);
      const uint32_t units = DrawnUnits(g);
      out += fmt::format(
          "<tr class=\"gpu{}\" data-node=\"{}\" data-gpu=\"{}\">\n<th>GPU {}<small>{}</small>"
          "<small>{}</small>",
          g.healthy ? "" : " unhealthy", HtmlEscape(n.name), HtmlEscape(g.uuid), g.index,
          HtmlEscape(g.model), HtmlEscape(g.uuid));
      if (!g.allowlisted) out += "<small>not allowlisted</small>";
      out += fmt::format("<small>{} of {} units free</small></th>\n", FreeUnits(g), units);
      out += fmt::format(
          "<td><div class=\"axis\" style=\"grid-template-columns:repeat({},minmax(0,1fr))\">\n",
          units);
      mig::SliceMask used = 0;
      for (const auto& r : g.reservations) {
        if (r.placement.end() <= mig::kMaxPlacementUnits) used |= r.placement.Mask();
      }
      for (uint32_t u = 0; u < units; ++u) {
        out += fmt::format("<span class=\"unit\" style=\"grid-column:{}\">{}</span>", u + 1, u);
      }
      out += "\n";
      for (uint32_t u = 0; u < units; ++u) {
        if (!(used & (mig::SliceMask{1} << u))) {
          out += fmt::format(
              "<span class=\"free\" style=\"grid-column:{}\" title=\"unit {} free\">"
              "</span>",
              u + 1, u);
        }
      }
      out += "\n";
      for (const auto& r : g.reservations) {
        const std::string title = fmt::format(
            "pod {}\nprofile {}\nplacement {} (start {}, size {})\n{}", r.pod, r.profile,
            r.placement.ToString(), r.placement.start, r.placement.size, RuntimeText(r));
        out += fmt::format(
            "<span class=\"res{}\" data-pod=\"{}\" style=\"grid-column:{} / span {};"
            "background:{}\" title=\"{}\">{} &middot; {}</span>\n",
            r.runtime ? "" : " pending", HtmlEscape(r.pod), r.placement.start + 1,
            std::max<uint32_t>(1, r.placement.size), ColorOf(r.pod), HtmlEscape(title),
            HtmlEscape(r.profile), HtmlEscape(ShortPodName(r.pod)));
      }
      out += "</div>\n";
      for (const auto& i : g.idle) {
        out += fmt::format(
            "<div class=\"idle\" title=\"an idle (warm) instance: its slices are free; a pod of "
            "this profile placed here reuses it\">idle {} at {}</div>\n",
            HtmlEscape(i.profile), HtmlEscape(i.placement.ToString()));
      }
      if (!g.healthy) {
        out += fmt::format("<div class=\"reason\">unhealthy: {}</div>\n",
                           HtmlEscape(g.unhealthy_reason));
      }
      out += "</td>\n</tr>\n";
    }
    while (wi < whole.size()) WholeGpuRowHtml(n, *whole[wi++], out);
    out += "</table>\n</section>\n";
  }
  out += "</body>\n</html>\n";
  return out;
}

std::string RenderLayoutText(const std::vector<scheduler::NodeReport>& nodes,
                             const SlicePainter& painter) {
  std::string out;
  const std::string indent = "    ";
  for (const auto& n : nodes) {
    out += fmt::format("{}{}\n", n.name, n.healthy ? "" : "  UNHEALTHY: " + n.unhealthy_reason);
    if (n.gpus.empty() && n.whole_gpus.empty()) out += "  no MIG GPU registered\n";
    const auto whole = WholeByIndex(n);
    size_t wi = 0;
    for (const auto& g : n.gpus) {
      while (wi < whole.size() && whole[wi]->index < g.index) out += WholeGpuText(*whole[wi++]);
      const uint32_t units = DrawnUnits(g);
      out += fmt::format("  GPU {}  {}  {}  {} of {} units free{}\n", g.index, g.model, g.uuid,
                         FreeUnits(g), units, g.allowlisted ? "" : "  (not allowlisted)");
      if (!g.healthy) out += fmt::format("  UNHEALTHY: {}\n", g.unhealthy_reason);
      std::vector<PictureCell> profiles, pods;
      for (const auto& r : g.reservations) {
        profiles.push_back({r.profile, r.placement, r.assumed});
        pods.push_back({ShortPodName(r.pod), r.placement, r.assumed});
      }
      out += painter.header(units, indent) + "\n";
      out += painter.row(units, profiles, indent) + "\n";
      if (!g.reservations.empty()) out += painter.row(units, pods, indent) + "\n";
      std::vector<std::vector<std::string>> rows;
      for (const auto& r : g.reservations) {
        rows.push_back({r.placement.ToString(), r.profile, r.pod, RuntimeText(r)});
      }
      for (const auto& i : g.idle) {
        rows.push_back({i.placement.ToString(), i.profile, "(idle)",
                        "warm instance: free, reused by a pod of this profile placed here"});
      }
      if (!rows.empty()) out += RenderTable({"SLICES", "PROFILE", "POD", "INSTANCE"}, rows, indent);
    }
    while (wi < whole.size()) out += WholeGpuText(*whole[wi++]);
    out += "\n";
  }
  if (nodes.empty()) out += "no node registers MIG GPUs\n";
  return out;
}

nlohmann::json LayoutJson(const std::vector<scheduler::NodeReport>& nodes) {
  nlohmann::json jnodes = nlohmann::json::array();
  for (const auto& n : nodes) {
    nlohmann::json jgpus = nlohmann::json::array();
    for (const auto& g : n.gpus) {
      nlohmann::json res = nlohmann::json::array();
      for (const auto& r : g.reservations) {
        nlohmann::json jr = {
            {"pod", r.pod},
            {"profile", r.profile},
            {"placement", {{"start", r.placement.start}, {"size", r.placement.size}}},
            {"assumed", r.assumed}};
        if (r.runtime) {
          jr["migUUID"] = r.runtime->mig_uuid;
          jr["gpuInstanceID"] = r.runtime->gpu_instance_id;
          jr["computeInstanceID"] = r.runtime->compute_instance_id;
        }
        res.push_back(std::move(jr));
      }
      nlohmann::json idle = nlohmann::json::array();
      for (const auto& i : g.idle) {
        idle.push_back({{"profile", i.profile},
                        {"placement", {{"start", i.placement.start}, {"size", i.placement.size}}},
                        {"idleSince", i.idle_since}});
      }
      jgpus.push_back({{"uuid", g.uuid},
                       {"index", g.index},
                       {"model", g.model},
                       {"units", DrawnUnits(g)},
                       {"freeUnits", FreeUnits(g)},
                       {"allowlisted", g.allowlisted},
                       {"allowedProfiles", g.allowed_profiles},
                       {"healthy", g.healthy},
                       {"reason", g.unhealthy_reason},
                       {"reservations", res},
                       {"idle", idle}});
    }
    nlohmann::json jwhole = nlohmann::json::array();
    for (const auto& w : n.whole_gpus) {
      jwhole.push_back({{"uuid", w.uuid},
                        {"index", w.index},
                        {"model", w.model},
                        {"memoryMiB", w.memory_mib},
                        {"pod", w.holder},
                        {"assumed", w.assumed},
                        {"healthy", w.healthy},
                        {"reason", w.unhealthy_reason}});
    }
    jnodes.push_back({{"name", n.name},
                      {"healthy", n.healthy},
                      {"reason", n.unhealthy_reason},
                      {"gpus", jgpus},
                      {"wholeGpus", jwhole}});
  }
  return {{"nodes", jnodes}};
}

}  // namespace dynmig::ops
