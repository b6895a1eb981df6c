#include "ops/live_page.h"

#include <algorithm>
#include <bit>

#include "common/strings.h"
#include "fmt/format.h"
#include "ops/layout.h"

namespace dynmig::ops {
namespace {

// One of eight colour classes per pod, stable across refreshes.
std::string LiveColorClass(std::string_view pod) {
  uint32_t h = 2166136261u;  // FNV-1a
  for (unsigned char c : pod) h = (h ^ c) * 16777619u;
  return fmt::format("c{}", h % 8);
}

uint32_t LiveFreeUnits(const scheduler::GpuReport& gpu, uint32_t units) {
  mig::SliceMask used = 0;
  for (const auto& r : gpu.reservations) {
    if (r.placement.end() <= mig::kMaxPlacementUnits) used |= r.placement.Mask();
  }
  return units - std::min<uint32_t>(
                     units, static_cast<uint32_t>(std::popcount(used & mig::FullMask(units))));
}

std::string TimeOfDay(absl::Time t) { return absl::FormatTime("%H:%M:%S", t, absl::UTCTimeZone()); }

std::string LiveWaited(absl::Duration d) {
  if (d < absl::ZeroDuration()) d = absl::ZeroDuration();
  return absl::FormatDuration(absl::Trunc(d, absl::Seconds(1)));
}

// The slice bar: a header row of unit numbers, then one cell per free unit and one spanning cell
// per reservation (or warm instance). A reservation that overlaps one drawn before it (a conflict,
// which fails the GPU closed) or lies beyond the units is listed under owners only.
void RenderLiveSlices(const scheduler::GpuReport& gpu, uint32_t units, std::string& out) {
  struct Item {
    mig::Placement placement;
    const scheduler::ReservationReport* reservation;  // null: a warm instance
    const scheduler::GpuReport::IdleReport* idle;
  };
  std::vector<Item> items;
  for (const auto& r : gpu.reservations) items.push_back({r.placement, &r, nullptr});
  for (const auto& i : gpu.idle) items.push_back({i.placement, nullptr, &i});
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.placement.start != b.placement.start ? a.placement.start < b.placement.start
                                                  : a.placement.size > b.placement.size;
  });
  out += "<table class=\"slices\"><tr class=\"axis\">";
  for (uint32_t u = 0; u < units; ++u) out += fmt::format("<th>{}</th>", u);
  out += "</tr><tr>";
  uint32_t col = 0;
  auto free_to = [&](uint32_t end) {
    for (; col < end; ++col) out += fmt::format("<td class=\"free\" data-unit=\"{}\"></td>", col);
  };
  for (const Item& it : items) {
    const mig::Placement& p = it.placement;
    if (p.size == 0 || p.start < col || p.end() > units) continue;
    free_to(p.start);
    if (it.reservation != nullptr) {
      const auto& r = *it.reservation;
      out += fmt::format(
          "<td class=\"slice {}{}\" colspan=\"{}\" data-pod=\"{}\" data-profile=\"{}\" "
          "data-start=\"{}\" data-size=\"{}\"><b>{}</b><br>{}</td>",
          LiveColorClass(r.pod), r.runtime ? "" : " unrealized", p.size, HtmlEscape(r.pod),
          HtmlEscape(r.profile), p.start, p.size, HtmlEscape(r.profile),
          HtmlEscape(ShortPodName(r.pod)));
    } else {
      out += fmt::format(
          "<td class=\"slice idle\" colspan=\"{}\" data-profile=\"{}\" data-start=\"{}\" "
          "data-size=\"{}\"><b>{}</b><br>idle</td>",
          p.size, HtmlEscape(it.idle->profile), p.start, p.size, HtmlEscape(it.idle->profile));
    }
    col = p.end();
  }
  free_to(units);
  out += "</tr></table>\n";
}

void RenderLiveGpu(const scheduler::NodeReport& node, const scheduler::GpuReport& gpu,
                   std::string& out) {
  const uint32_t units = DrawnUnits(gpu);
  const uint32_t free = LiveFreeUnits(gpu, units);
  out += fmt::format(
      "<div class=\"gpu{}\" data-node=\"{}\" data-gpu=\"{}\" data-index=\"{}\" data-model=\"{}\" "
      "data-units=\"{}\" data-free=\"{}\">\n<h4>GPU {} <span class=\"model\">{}</span> "
      "<span class=\"uuid\">{}</span> <span class=\"freecount\">{} of {} free</span></h4>\n",
      gpu.healthy ? "" : " unhealthy", HtmlEscape(node.name), HtmlEscape(gpu.uuid), gpu.index,
      HtmlEscape(gpu.model), units, free, gpu.index, HtmlEscape(gpu.model), HtmlEscape(gpu.uuid),
      free, units);
  if (!gpu.healthy) {
    out += fmt::format("<p class=\"reason\">no new reservations: {}</p>\n",
                       HtmlEscape(gpu.unhealthy_reason));
  }
  if (!gpu.allowlisted) out += "<p class=\"note\">not in the allowlist</p>\n";
  RenderLiveSlices(gpu, units, out);
  out += "<ul class=\"owners\">\n";
  size_t shown = 0;
  for (const auto& r : gpu.reservations) {
    if (shown++ == kLiveMaxOwners) break;
    std::string where =
        r.runtime   ? fmt::format("{} (GI {}, CI {})", r.runtime->mig_uuid,
                                  r.runtime->gpu_instance_id, r.runtime->compute_instance_id)
        : r.assumed ? "reserved, not written yet"
                    : "reserved, instance not created yet";
    out += fmt::format(
        "<li class=\"owner\" data-pod=\"{}\" data-profile=\"{}\" data-start=\"{}\" "
        "data-size=\"{}\" data-mig=\"{}\"><span class=\"pod\">{}</span> {} at slices {}: {}</li>\n",
        HtmlEscape(r.pod), HtmlEscape(r.profile), r.placement.start, r.placement.size,
        r.runtime ? HtmlEscape(r.runtime->mig_uuid) : "", HtmlEscape(r.pod), HtmlEscape(r.profile),
        r.placement.ToString(), HtmlEscape(where));
  }
  out += "</ul>\n";
  if (gpu.reservations.size() > kLiveMaxOwners) {
    out += fmt::format("<p class=\"more\">{} more reservations not listed</p>\n",
                       gpu.reservations.size() - kLiveMaxOwners);
  }
  out += "</div>\n";
}

// A whole GPU (MIG off, given to one pod): its line and who holds it.
void RenderLiveWholeGpu(const scheduler::NodeReport& node, const scheduler::WholeGpuReport& w,
                        std::string& out) {
  const std::string state = w.holder.empty() ? std::string("free")
                                             : fmt::format("held by {}{}", w.holder,
                                                           w.assumed ? " (not written yet)" : "");
  out += fmt::format(
      "<div class=\"gpu whole{}\" data-node=\"{}\" data-gpu=\"{}\" data-index=\"{}\" "
      "data-model=\"{}\" data-pod=\"{}\">\n<h4>GPU {} <span class=\"model\">{}</span> "
      "<span class=\"uuid\">{}</span> <span class=\"freecount\">whole GPU (MIG off, {} MiB): "
      "{}</span></h4>\n",
      w.healthy ? "" : " unhealthy", HtmlEscape(node.name), HtmlEscape(w.uuid), w.index,
      HtmlEscape(w.model), HtmlEscape(w.holder), w.index, HtmlEscape(w.model), HtmlEscape(w.uuid),
      w.memory_mib, HtmlEscape(state));
  if (!w.healthy) {
    out += fmt::format("<p class=\"reason\">no new pod: {}</p>\n", HtmlEscape(w.unhealthy_reason));
  }
  out += "</div>\n";
}

constexpr std::string_view kLiveScript = R"JS("use strict";
// dynmig live page: fetch the body every data-refresh-ms and swap it in (no library; same origin).
(function () {
  const main = document.getElementById("live");
  const state = document.getElementById("refresh");
  const every = Number(main.dataset.refreshMs) || 2000;
  state.textContent = "live, every " + every / 1000 + " s";
  state.className = "ok";
  async function tick() {
    try {
      const r = await fetch("live/body", {cache: "no-store", credentials: "same-origin"});
      if (!r.ok) throw new Error("HTTP " + r.status);
      // Parsed as an inert document (no script runs), then moved in.
      const doc = new DOMParser().parseFromString(await r.text(), "text/html");
      main.replaceChildren(...doc.body.childNodes);
      state.textContent = "live, every " + every / 1000 + " s";
      state.className = "ok";
    } catch (e) {
      state.textContent = "refresh failed (" + e.message + "), retrying";
      state.className = "bad";
    }
    setTimeout(tick, every);
  }
  setTimeout(tick, every);
})();
)JS";

constexpr std::string_view kLiveStyle = R"CSS(
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:1.2em;color:#222}
h1{font-size:1.4em;margin:0 0 .2em}
h2{font-size:1.15em;margin:1.2em 0 .4em;border-bottom:1px solid #ddd}
h3{font-size:1em;margin:.8em 0 .3em}
h4{font-size:.9em;font-weight:600;margin:.5em 0 .2em}
.model,.uuid,.freecount,#snapshot,.note,.more{color:#666;font-weight:400}
#refresh.ok{color:#2e6b30}
.bad,.reason{color:#b00020}
.gpu{margin:0 0 .8em 1em}
.gpu.unhealthy{background:#fbe9eb}
table.slices{border-collapse:separate;border-spacing:2px;table-layout:fixed;width:100%;max-width:60em}
table.slices th{font-size:.7em;color:#777;background:#f3f3f3;font-weight:400}
td.free{background:#fafafa;border:1px dashed #ccc;height:2.2em}
td.slice{border:1px solid rgba(0,0,0,.3);border-radius:3px;font-size:.78em;text-align:center;
overflow:hidden;white-space:nowrap;text-overflow:ellipsis}
td.slice.unrealized{border-style:dashed}
td.slice.idle{background:#e6f2e6;color:#2e6b30}
.c0{background:#f4b6b6}.c1{background:#f6d5a8}.c2{background:#f0eca0}.c3{background:#bfe8b0}
.c4{background:#a9e0dc}.c5{background:#b4c8f4}.c6{background:#d2bdf2}.c7{background:#f2bde0}
ul.owners{margin:.3em 0;padding-left:1.2em;font-size:.85em}
table.list{border-collapse:collapse;font-size:.85em;width:100%}
table.list th{text-align:left;border-bottom:1px solid #ccc;padding:.2em .5em}
table.list td{border-bottom:1px solid #eee;padding:.2em .5em;vertical-align:top}
td.detail,td.message{white-space:pre-wrap;word-break:break-word}
tr.event[data-type=Warning] td.type{color:#b00020}
)CSS";

}  // namespace

std::string RenderLiveBody(const scheduler::LiveSnapshot& s) {
  std::string out;
  size_t gpus = 0, reservations = 0;
  for (const auto& n : s.nodes) {
    gpus += n.gpus.size() + n.whole_gpus.size();
    for (const auto& g : n.gpus) reservations += g.reservations.size();
    for (const auto& w : n.whole_gpus) reservations += w.holder.empty() ? 0 : 1;
  }
  out += fmt::format(
      "<p id=\"snapshot\" data-time=\"{}\">{} UTC: {} nodes, {} GPUs, {} reservations, {} pending "
      "pods</p>\n",
      absl::ToUnixSeconds(s.now), absl::FormatTime("%Y-%m-%d %H:%M:%S", s.now, absl::UTCTimeZone()),
      s.nodes.size(), gpus, reservations, s.pending_total);

  out += "<section id=\"gpus\">\n<h2>GPUs</h2>\n";
  size_t drawn = 0;
  for (const auto& n : s.nodes) {
    if (drawn >= kLiveMaxGpus) break;
    out += fmt::format("<div class=\"node\" data-node=\"{}\">\n<h3>{}", HtmlEscape(n.name),
                       HtmlEscape(n.name));
    if (!n.healthy) {
      out +=
          fmt::format(" <span class=\"bad\">unhealthy: {}</span>", HtmlEscape(n.unhealthy_reason));
    }
    out += "</h3>\n";
    if (n.gpus.empty() && n.whole_gpus.empty()) {
      out += "<p class=\"note\">no MIG GPU registered</p>\n";
    }
    for (const auto& g : n.gpus) {
      if (drawn++ >= kLiveMaxGpus) break;
      RenderLiveGpu(n, g, out);
    }
    for (const auto& w : n.whole_gpus) {
      if (drawn++ >= kLiveMaxGpus) break;
      RenderLiveWholeGpu(n, w, out);
    }
    out += "</div>\n";
  }
  if (gpus > kLiveMaxGpus) {
    out += fmt::format("<p class=\"more\">{} more GPUs not drawn (dynmig layout lists all)</p>\n",
                       gpus - kLiveMaxGpus);
  }
  out += "</section>\n";

  out += fmt::format("<section id=\"pending\">\n<h2>Pending pods ({})</h2>\n", s.pending_total);
  if (s.pending.empty()) {
    out += "<p class=\"note\">none: the scheduler left no MIG pod pending</p>\n";
  } else {
    out +=
        "<table class=\"list\"><tr><th>pod</th><th>reason</th><th>the scheduler's "
        "message</th><th>waiting</th></tr>\n";
    for (const auto& p : s.pending) {
      out += fmt::format(
          "<tr class=\"pending\" data-pod=\"{}\" data-reason=\"{}\"><td class=\"pod\">{}</td><td "
          "class=\"reason\">{}</td><td class=\"detail\">{}</td><td "
          "class=\"waiting\">{}</td></tr>\n",
          HtmlEscape(p.pod), HtmlEscape(p.reason), HtmlEscape(p.pod), HtmlEscape(p.reason),
          HtmlEscape(p.detail), LiveWaited(s.now - p.since));
    }
    out += "</table>\n";
    if (s.pending_total > s.pending.size()) {
      out += fmt::format("<p class=\"more\">{} more pending pods not listed</p>\n",
                         s.pending_total - s.pending.size());
    }
  }
  out += "</section>\n";

  out += "<section id=\"events\">\n<h2>Recent events</h2>\n";
  if (s.events.empty()) {
    out += "<p class=\"note\">none recorded since the scheduler started</p>\n";
  } else {
    out +=
        "<table class=\"list\"><tr><th>time</th><th>type</th><th>reason</th><th>pod</th>"
        "<th>message</th></tr>\n";
    for (const auto& e : s.events) {
      out += fmt::format(
          "<tr class=\"event\" data-type=\"{}\" data-reason=\"{}\" data-pod=\"{}\"><td "
          "class=\"time\">{}</td><td class=\"type\">{}</td><td class=\"reason\">{}</td><td "
          "class=\"pod\">{}</td><td class=\"message\">{}</td></tr>\n",
          HtmlEscape(e.type), HtmlEscape(e.reason), HtmlEscape(e.pod), TimeOfDay(e.time),
          HtmlEscape(e.type), HtmlEscape(e.reason), HtmlEscape(e.pod), HtmlEscape(e.message));
    }
    out += "</table>\n";
  }
  out += "</section>\n";
  return out;
}

std::string RenderLivePage(const scheduler::LiveSnapshot& s) {
  std::string out;
  out += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += "<title>dynmig live</title>\n";
  out += "<link rel=\"stylesheet\" href=\"live/style.css\">\n";
  out += "<noscript><meta http-equiv=\"refresh\" content=\"10\"></noscript>\n";
  out += "</head>\n<body>\n<header><h1>dynmig live</h1>";
  out += "<p id=\"refresh\">a snapshot, reloaded every 10 s (script is off)</p></header>\n";
  out += fmt::format("<main id=\"live\" data-refresh-ms=\"{}\">\n", kLiveRefreshMs);
  out += RenderLiveBody(s);
  out += "</main>\n<script src=\"live/script.js\"></script>\n</body>\n</html>\n";
  return out;
}

std::string_view LivePageScript() { return kLiveScript; }
std::string_view LivePageStyle() { return kLiveStyle; }

scheduler::LivePageRenderer LivePageRenderer() {
  return {.page = RenderLivePage,
          .body = RenderLiveBody,
          .script = std::string(kLiveScript),
          .style = std::string(kLiveStyle)};
}

}  // namespace dynmig::ops
