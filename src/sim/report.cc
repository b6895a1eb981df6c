#include "sim/report.h"

#include <algorithm>
#include <cmath>

#include "common/strings.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace dynmig::sim {
namespace {

std::string Pct(double f) { return fmt::format("{:.1f}%", 100.0 * f); }

std::string Duration(double s) {
  if (s < 120) return fmt::format("{:.0f}s", s);
  if (s < 7200) return fmt::format("{:.1f}m", s / 60);
  if (s < 2 * 86400) return fmt::format("{:.1f}h", s / 3600);
  return fmt::format("{:.1f}d", s / 86400);
}

// Sub-second precision for the short times NVML adds.
std::string FineDuration(double s) { return s < 10 ? fmt::format("{:.2f}s", s) : Duration(s); }

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Gap closed for the table: "-" when undefined or when repack and hami-v2.10 differ by less than
// 0.1 point (the ratio is then noise), clamped to +-999 %.
std::string Gap(const SimResult& r, const PolicyResult& p) {
  if (!p.gap_closed || r.gap_span < 0.001) return "-";
  const double g = std::clamp(*p.gap_closed, -9.99, 9.99);
  return fmt::format("{}{:.1f}%", std::abs(*p.gap_closed) > 9.99 ? (g < 0 ? "<" : ">") : "",
                     100.0 * g);
}

std::string Header(const SimResult& r) {
  std::string out = fmt::format("trace    {}: {} GPU pods ({} CPU-only skipped, {} unservable)\n",
                                BaseName(r.trace), r.pods, r.cpu_only, r.unservable);
  out += fmt::format("cluster  {} ({} GPUs, {} slices), mode {}\n", r.cluster, r.gpus,
                     r.capacity_units, ModeName(r.mode));
  if (r.mode != Mode::kFill && !r.nvml_latency.empty()) {
    out += fmt::format("NVML     instance create/destroy latency: {}\n", r.nvml_latency);
  }
  return out;
}

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

}  // namespace

std::string FormatText(const SimResult& r) {
  std::string out = Header(r);
  size_t w = 6;
  for (const auto& p : r.policies) w = std::max(w, p.name.size());
  if (r.mode == Mode::kFill) {
    out += fmt::format("{:<{}}  {:>9}  {:>7}  {:>9}  {:>10}  {:>6}  {:>7}\n", "policy", w,
                       "pods in", "filled", "vs bound", "gap closed", "frag", "run");
    for (const auto& p : r.policies) {
      const std::string vs =
          r.bound ? fmt::format("{:+.1f} pt", 100.0 * (p.filled - r.bound->filled)) : "-";
      out += fmt::format("{:<{}}  {:>9}  {:>7}  {:>9}  {:>10}  {:>6}  {:>6.2f}s\n", p.name, w,
                         p.accepted, Pct(p.filled), vs, Gap(r, p), Pct(p.fragmentation), p.seconds);
    }
    if (r.bound) {
      out += fmt::format(
          "{:<{}}  {:>9}  {:>7}  (LP over whole-GPU configurations; the whole trace "
          "needs >= {} GPUs)\n",
          "bound", w, r.bound->pods, Pct(r.bound->filled), r.bound->lp_gpus_all);
    } else if (!r.bound_note.empty()) {
      out += fmt::format("bound: none ({})\n", r.bound_note);
    }
    out +=
        "filled = slices the accepted pods asked for, over cluster slices, at the first "
        "rejection\n";
    if (r.has_gap) {
      out += fmt::format(
          "gap closed = (policy - hami-v2.10) / (repack - hami-v2.10) on filled; "
          "repack - hami-v2.10 = {:+.2f} pt\n",
          100.0 * r.gap_span);
    }
    return out;
  }
  const bool queue = r.mode == Mode::kQueue;
  out += fmt::format("{:<{}}  {:>8}  {:>10}  {:>10}  {:>9}  {:>9}  {:>6}", "policy", w, "accepted",
                     "slice-time", "gap closed", "mean util", "peak util", "frag");
  if (queue) out += fmt::format("  {:>8}  {:>8}  {:>7}", "p50 wait", "p99 wait", "waiting");
  out += fmt::format("  {:>9}  {:>9}  {:>9}  {:>9}  {:>10}  {:>9}  {:>9}  {:>7}\n", "p50 toRun",
                     "p99 toRun", "mean NVML", "GI create", "GI destroy", "evictions", "evict/acc",
                     "run");
  for (const auto& p : r.policies) {
    out += fmt::format("{:<{}}  {:>8}  {:>10}  {:>10}  {:>9}  {:>9}  {:>6}", p.name, w,
                       Pct(p.accepted_count), Pct(p.accepted_slice_time), Gap(r, p),
                       Pct(p.mean_utilization), Pct(p.peak_utilization), Pct(p.fragmentation));
    if (queue) {
      out += fmt::format("  {:>8}  {:>8}  {:>7}", Duration(p.pending_p50), Duration(p.pending_p99),
                         p.never_started);
    }
    out += fmt::format("  {:>9}  {:>9}  {:>9}  {:>9}  {:>10}  {:>9}  {:>9.4f}  {:>6.2f}s\n",
                       FineDuration(p.running_p50), FineDuration(p.running_p99),
                       FineDuration(p.nvml_mean), p.creates, p.destroys, p.evictions,
                       p.evictions_per_accepted(), p.seconds);
  }
  if (r.warm) {
    // Warm instances beside the same policies' acceptance and time to Running above.
    out += fmt::format("\nwarm instances ({}: idle for at most {}, at most {} per GPU)\n",
                       WarmConfigText(*r.warm), absl::FormatDuration(r.warm->ttl),
                       r.warm->max_per_gpu);
    out += fmt::format("{:<{}}  {:>9}  {:>8}  {:>11}  {:>11}  {:>14}  {:>11}\n", "policy", w,
                       "kept idle", "reused", "TTL destroy", "cap destroy", "needed destroy",
                       "idle at end");
    for (const auto& p : r.policies) {
      if (!p.warm.enabled) continue;
      out += fmt::format("{:<{}}  {:>9}  {:>8}  {:>11}  {:>11}  {:>14}  {:>11}\n", p.name, w,
                         p.warm.kept, p.warm.reused, p.warm.destroyed_ttl, p.warm.destroyed_cap,
                         p.warm.destroyed_needed, p.warm.idle_at_end);
    }
    out +=
        "reused = instances placed exactly on an idle one (no NVML time); TTL / cap / needed = "
        "idle "
        "instances destroyed\nafter the TTL, ended pods' instances destroyed at once on a GPU at "
        "its cap, idle ones a placement\noverlapped (their destroy time counts in that pod's NVML "
        "time)\n";
  }
  if (!r.profiles.empty()) {
    out += fmt::format("\n{:<{}}", queue ? "not started by" : "rejected by", w);
    for (size_t k = 0; k < r.profiles.size(); ++k) {
      out += fmt::format("  {:>{}}", r.profiles[k], std::max<size_t>(r.profiles[k].size(), 6));
    }
    out += fmt::format("\n{:<{}}", "size (pods)", w);
    for (size_t k = 0; k < r.profiles.size(); ++k) {
      out +=
          fmt::format("  {:>{}}", r.pods_by_profile[k], std::max<size_t>(r.profiles[k].size(), 6));
    }
    out += "\n";
    for (const auto& p : r.policies) {
      out += fmt::format("{:<{}}", p.name, w);
      for (size_t k = 0; k < r.profiles.size() && k < p.rejected_by_profile.size(); ++k) {
        out += fmt::format("  {:>{}}", p.rejected_by_profile[k],
                           std::max<size_t>(r.profiles[k].size(), 6));
      }
      out += "\n";
    }
    out += "\n";
  }
  out += "accepted = pods placed";
  out += queue ? " (started before the end)" : "";
  out += "; slice-time = asked slices x duration of accepted pods over all\n";
  if (r.has_gap) {
    out += fmt::format(
        "gap closed = (policy - hami-v2.10) / (repack - hami-v2.10) on slice-time; repack - "
        "hami-v2.10 = {:+.2f} pt{}\n",
        100.0 * r.gap_span, r.gap_span < 0.001 ? " (too small to compare: shown as -)" : "");
  }
  return out;
}

std::string FormatJson(const SimResult& r) {
  nlohmann::json j;
  j["trace"] = r.trace;
  j["cluster"] = r.cluster;
  j["gpus"] = r.gpus;
  j["capacitySlices"] = r.capacity_units;
  j["mode"] = ModeName(r.mode);
  j["nvmlLatency"] = r.nvml_latency;
  if (r.warm) j["warmInstances"] = WarmConfigText(*r.warm);
  j["pods"] = r.pods;
  j["cpuOnlySkipped"] = r.cpu_only;
  j["unservable"] = r.unservable;
  j["start"] = r.start;
  j["end"] = r.end;
  nlohmann::json sizes = nlohmann::json::object();
  for (size_t k = 0; k < r.profiles.size(); ++k) sizes[r.profiles[k]] = r.pods_by_profile[k];
  j["podsByProfile"] = std::move(sizes);
  j["sampleAxis"] = r.sample_axis;
  j["sampleX"] = r.sample_x;
  if (r.has_gap) j["gapSpan"] = r.gap_span;
  j["policies"] = nlohmann::json::array();
  for (const auto& p : r.policies) {
    nlohmann::json q;
    q["name"] = p.name;
    q["accepted"] = p.accepted;
    q["acceptedCount"] = p.accepted_count;
    q["acceptedSliceTime"] = p.accepted_slice_time;
    q["gapClosed"] = p.gap_closed ? nlohmann::json(*p.gap_closed) : nlohmann::json(nullptr);
    q["meanUtilization"] = p.mean_utilization;
    q["peakUtilization"] = p.peak_utilization;
    q["fragmentation"] = p.fragmentation;
    if (r.mode == Mode::kQueue) {
      q["pendingP50Seconds"] = p.pending_p50;
      q["pendingP99Seconds"] = p.pending_p99;
      q["pendingMeanSeconds"] = p.pending_mean;
      q["neverStarted"] = p.never_started;
    }
    if (r.mode != Mode::kFill) {
      q["timeToRunningP50Seconds"] = p.running_p50;
      q["timeToRunningP99Seconds"] = p.running_p99;
      q["timeToRunningMeanSeconds"] = p.running_mean;
      q["nvmlMeanSeconds"] = p.nvml_mean;
    }
    if (r.mode == Mode::kFill) {
      q["filled"] = p.filled;
      if (r.bound) q["belowBound"] = r.bound->filled - p.filled;
    }
    if (r.mode != Mode::kFill) {
      nlohmann::json by = nlohmann::json::object();
      for (size_t k = 0; k < r.profiles.size() && k < p.rejected_by_profile.size(); ++k) {
        by[r.profiles[k]] = p.rejected_by_profile[k];
      }
      q["rejectedByProfile"] = std::move(by);
    }
    q["giCreates"] = p.creates;
    q["giDestroys"] = p.destroys;
    if (r.mode != Mode::kFill) {
      q["evictions"] = p.evictions;
      q["evictionsPerAcceptedPod"] = p.evictions_per_accepted();
      q["moves"] = p.moves;
      q["restarts"] = p.restarts;
      q["evictedWaitingAtEnd"] = p.evicted_waiting;
    }
    if (p.warm.enabled) {
      q["warm"] = {{"kept", p.warm.kept},
                   {"reused", p.warm.reused},
                   {"destroyedTtl", p.warm.destroyed_ttl},
                   {"destroyedCap", p.warm.destroyed_cap},
                   {"destroyedNeeded", p.warm.destroyed_needed},
                   {"idleAtEnd", p.warm.idle_at_end}};
    }
    q["utilization"] = p.utilization;
    q["seconds"] = p.seconds;
    j["policies"].push_back(std::move(q));
  }
  if (r.bound) {
    j["bound"] = {{"pods", r.bound->pods},
                  {"filled", r.bound->filled},
                  {"lpGpusForWholeTrace", r.bound->lp_gpus_all}};
  } else if (!r.bound_note.empty()) {
    j["boundNote"] = r.bound_note;
  }
  return j.dump(2) + "\n";
}

std::string FormatCsv(const SimResult& r) {
  std::string out =
      "policy,accepted,acceptedCount,acceptedSliceTime,gapClosed,meanUtilization,"
      "peakUtilization,fragmentation,pendingP50Seconds,pendingP99Seconds,pendingMeanSeconds,"
      "neverStarted,giCreates,giDestroys,filled,seconds,timeToRunningP50Seconds,"
      "timeToRunningP99Seconds,nvmlMeanSeconds,warmKept,warmReused,warmDestroyedTtl,"
      "warmDestroyedCap,warmDestroyedNeeded,evictions,evictionsPerAcceptedPod\n";
  for (const auto& p : r.policies) {
    const std::string warm =
        p.warm.enabled
            ? fmt::format(",{},{},{},{},{}", p.warm.kept, p.warm.reused, p.warm.destroyed_ttl,
                          p.warm.destroyed_cap, p.warm.destroyed_needed)
            : ",,,,,";
    out += fmt::format(
        "{},{},{:.6f},{:.6f},{},{:.6f},{:.6f},{:.6f},{:.3f},{:.3f},{:.3f},{},{},{},{},{:.3f},{:.3f}"
        ","
        "{:.3f},{:.3f}{},{},{:.6f}\n",
        p.name, p.accepted, p.accepted_count, p.accepted_slice_time,
        p.gap_closed ? fmt::format("{:.6f}", *p.gap_closed) : "", p.mean_utilization,
        p.peak_utilization, p.fragmentation, p.pending_p50, p.pending_p99, p.pending_mean,
        p.never_started, p.creates, p.destroys,
        r.mode == Mode::kFill ? fmt::format("{:.6f}", p.filled) : "", p.seconds, p.running_p50,
        p.running_p99, p.nvml_mean, warm, p.evictions, p.evictions_per_accepted());
  }
  if (r.bound) {
    out += fmt::format("bound,{},,,,,,,,,,,,,{:.6f},,,,,,,,,,,\n", r.bound->pods, r.bound->filled);
  }
  return out;
}

std::string FormatSvg(const SimResult& r) {
  const int width = 980;
  const int left = 70, right = 200, top = 60;
  const int chart_h = 300;
  const int bar_h = 18, bar_gap = 8;
  const int n = static_cast<int>(r.policies.size());
  const int bars_top = top + chart_h + 90;
  const int height = bars_top + n * (bar_h + bar_gap) + 60;
  const int plot_w = width - left - right;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height, width, height);
  s +=
      fmt::format("<text x=\"{}\" y=\"24\" font-size=\"16\" font-weight=\"bold\">{}</text>\n", left,
                  HtmlEscape(fmt::format("dynmig simulate — {}, {}, mode {}", BaseName(r.trace),
                                         r.cluster, ModeName(r.mode))));
  // Utilization over time.
  const bool fill = r.mode == Mode::kFill;
  s += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"13\">Slice utilization over {}</text>\n",
                   left, top - 10, fill ? "arrivals" : "time");
  const double x0 = r.sample_x.empty() ? 0 : r.sample_x.front();
  const double x1 = r.sample_x.empty() ? 1 : std::max(r.sample_x.back(), x0 + 1e-9);
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * plot_w; };
  auto py = [&](double u) { return top + chart_h - u * chart_h; };
  for (int k = 0; k <= 4; ++k) {
    const double u = k / 4.0;
    s += fmt::format(
        "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.0f}%</text>\n",
        left, py(u), left + plot_w, py(u), left - 6, py(u) + 4, 100 * u);
  }
  const double span = x1 - x0;
  const bool days = !fill && span > 2 * 86400;
  const bool hours = !fill && !days && span > 7200;
  const double shown_span = fill ? span : days ? span / 86400 : hours ? span / 3600 : span;
  const int tick_decimals = shown_span < 6 ? 1 : 0;
  for (int k = 0; k <= 6; ++k) {
    const double x = x0 + span * k / 6;
    const double shown = fill ? x : days ? (x - x0) / 86400 : hours ? (x - x0) / 3600 : x - x0;
    s += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#999\"/>"
        "<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:.{}f}</text>\n",
        px(x), top + chart_h, px(x), top + chart_h + 5, px(x), top + chart_h + 18, shown,
        tick_decimals);
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", left + plot_w / 2,
                   top + chart_h + 36,
                   fill    ? "pods arrived"
                   : days  ? "days"
                   : hours ? "hours"
                           : "seconds");
  s += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" "
      "stroke=\"#333\"/>\n",
      left, top, plot_w, chart_h);
  for (int i = 0; i < n; ++i) {
    const auto& p = r.policies[i];
    const char* color = kColors[i % 10];
    std::string pts;
    for (size_t k = 0; k < p.utilization.size() && k < r.sample_x.size(); ++k) {
      pts += fmt::format("{:.1f},{:.1f} ", px(r.sample_x[k]), py(p.utilization[k]));
    }
    s += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>\n",
                     color, pts);
    const int ly = top + 10 + i * 18;
    s += fmt::format(
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"3\"/>"
        "<text x=\"{}\" y=\"{}\">{}</text>\n",
        left + plot_w + 12, ly, left + plot_w + 32, ly, color, left + plot_w + 38, ly + 4,
        HtmlEscape(p.name));
  }
  // Acceptance bars.
  s += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"13\">{}</text>\n", left, bars_top - 14,
                   fill ? "Filled at the first rejection (slices asked / cluster slices)"
                        : "Accepted by slice-time (bar) and by count (tick)");
  const int label_w = 150;
  const int bar_w = width - left - label_w - 80;
  for (int i = 0; i < n; ++i) {
    const auto& p = r.policies[i];
    const int y = bars_top + i * (bar_h + bar_gap);
    const double v = fill ? p.filled : p.accepted_slice_time;
    s += fmt::format(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>"
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#eee\"/>"
        "<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"/>"
        "<text x=\"{}\" y=\"{}\">{}</text>\n",
        left + label_w - 8, y + bar_h - 5, HtmlEscape(p.name), left + label_w, y, bar_w, bar_h,
        left + label_w, y, std::clamp(v, 0.0, 1.0) * bar_w, bar_h, kColors[i % 10],
        left + label_w + bar_w + 6, y + bar_h - 5, Pct(v));
    if (!fill) {
      const double cx = left + label_w + std::clamp(p.accepted_count, 0.0, 1.0) * bar_w;
      s += fmt::format(
          "<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"black\" "
          "stroke-width=\"2\"/>\n",
          cx, y - 2, cx, y + bar_h + 2);
    }
  }
  if (fill && r.bound) {
    const double bx = left + label_w + std::clamp(r.bound->filled, 0.0, 1.0) * bar_w;
    const int y_end = bars_top + n * (bar_h + bar_gap);
    s += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"black\" "
        "stroke-dasharray=\"4 3\"/><text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">bound "
        "{}</text>\n",
        bx, bars_top - 4, bx, y_end, bx, y_end + 14, Pct(r.bound->filled));
  }
  s += "</svg>\n";
  return s;
}

}  // namespace dynmig::sim
