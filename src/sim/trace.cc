#include "sim/trace.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/strings.h"
#include "fmt/format.h"
#include "fmt/ranges.h"

namespace dynmig::sim {
namespace {

constexpr std::string_view kDefaultFile = "openb_pod_list_default.csv";
constexpr std::string_view kDefaultDir = "../shared/data/alibaba-gpu-v2023";

void SplitFields(std::string_view line, std::vector<std::string_view>& out) {
  out.clear();
  while (true) {
    const size_t pos = line.find(',');
    out.push_back(Trim(line.substr(0, pos)));
    if (pos == std::string_view::npos) break;
    line.remove_prefix(pos + 1);
  }
}

template <typename T>
bool ParseNumber(std::string_view s, T& out) {
  if (s.empty()) return false;
  if constexpr (std::is_floating_point_v<T>) {
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && ptr == s.data() + s.size() && std::isfinite(out);
  } else {
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && ptr == s.data() + s.size();
  }
}

}  // namespace

absl::StatusOr<Trace> ParseAlibabaCsv(std::string_view text, std::string_view source) {
  Trace trace;
  trace.source = std::string(source);
  std::vector<std::string_view> fields;
  std::vector<std::string> header;
  int col_num_gpu = -1, col_milli = -1, col_create = -1, col_delete = -1, col_name = -1;
  uint32_t line_no = 0;
  bool have_header = false;
  bool any_never = false;
  double last_time = 0;
  std::vector<bool> never;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (Trim(line).empty()) continue;
    SplitFields(line, fields);
    if (!have_header) {
      have_header = true;
      for (size_t i = 0; i < fields.size(); ++i) {
        std::string_view f = fields[i];
        if (i == 0 && f.starts_with("\xEF\xBB\xBF")) f.remove_prefix(3);  // UTF-8 BOM
        header.emplace_back(f);
        if (f == "name") col_name = static_cast<int>(i);
        if (f == "num_gpu") col_num_gpu = static_cast<int>(i);
        if (f == "gpu_milli") col_milli = static_cast<int>(i);
        if (f == "creation_time") col_create = static_cast<int>(i);
        if (f == "deletion_time") col_delete = static_cast<int>(i);
      }
      // No creation_time: a snapshot (no timing at all, deletion_time ignored).
      trace.snapshot = col_create < 0;
      for (const auto& [col, cname] : {std::pair{col_name, "name"},
                                       {col_num_gpu, "num_gpu"},
                                       {col_milli, "gpu_milli"},
                                       {col_create, "creation_time"},
                                       {col_delete, "deletion_time"}}) {
        // By name: with both timing columns absent a missing num_gpu (-1) would equal them.
        const std::string_view column = cname;
        const bool timing = column == "creation_time" || column == "deletion_time";
        if (col < 0 && !(timing && trace.snapshot)) {
          return absl::InvalidArgumentError(
              fmt::format("{}:{}: missing column \"{}\" (the header has: {})", source, line_no,
                          cname, fmt::join(header, ", ")));
        }
      }
      continue;
    }
    if (fields.size() != header.size()) {
      return absl::InvalidArgumentError(fmt::format("{}:{}: {} field(s) where the header has {}",
                                                    source, line_no, fields.size(), header.size()));
    }
    ++trace.rows;
    auto bad = [&](int col, std::string_view why) {
      return absl::InvalidArgumentError(
          fmt::format("{}:{}: {} \"{}\" {}", source, line_no, header[col], fields[col], why));
    };
    uint32_t num_gpu = 0, milli = 0;
    double created = 0, deleted = 0;
    if (!ParseNumber(fields[col_num_gpu], num_gpu)) return bad(col_num_gpu, "is not a number");
    if (!ParseNumber(fields[col_milli], milli)) return bad(col_milli, "is not a number");
    if (trace.snapshot) {
      created = static_cast<double>(trace.rows - 1);
    } else {
      if (!ParseNumber(fields[col_create], created)) return bad(col_create, "is not a number");
      if (created < 0) return bad(col_create, "is negative");
    }
    const bool never_deleted = trace.snapshot || fields[col_delete].empty();
    if (!never_deleted) {
      if (!ParseNumber(fields[col_delete], deleted)) return bad(col_delete, "is not a number");
      if (deleted < created) {
        return bad(col_delete, fmt::format("is before creation_time {}", fields[col_create]));
      }
    }
    if (milli > 1000) return bad(col_milli, "is above 1000");
    if (num_gpu > kMaxInstancesPerPod) {
      return bad(col_num_gpu, fmt::format("is above {}", kMaxInstancesPerPod));
    }
    last_time = std::max({last_time, created, never_deleted ? created : deleted});
    if (num_gpu == 0) {
      ++trace.cpu_only;
      continue;
    }
    TracePod pod;
    pod.arrival = created;
    pod.departure = never_deleted ? std::numeric_limits<double>::infinity() : deleted;
    pod.count = num_gpu;
    pod.percent = (milli == 0 || milli >= 1000) ? 100 : (milli + 9) / 10;
    pod.whole = milli == 0 || milli >= 1000;
    pod.line = line_no;
    if (never_deleted) {
      ++trace.never_deleted;
      any_never = true;
    }
    trace.pods.push_back(pod);
  }
  if (!have_header) {
    return absl::InvalidArgumentError(fmt::format("{}: empty (no header line)", source));
  }
  std::stable_sort(trace.pods.begin(), trace.pods.end(),
                   [](const TracePod& a, const TracePod& b) { return a.arrival < b.arrival; });
  trace.start = trace.pods.empty() ? 0 : trace.pods.front().arrival;
  trace.end = last_time;
  if (any_never) {
    for (auto& p : trace.pods) p.departure = std::min(p.departure, trace.end);
  }
  return trace;
}

absl::StatusOr<Trace> LoadTrace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(fmt::format("cannot open trace file {}", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ParseAlibabaCsv(ss.str(), path);
}

absl::StatusOr<std::string> ResolveTracePath(const TraceLookup& lookup) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> dirs;
  if (!lookup.env_dir.empty()) dirs.push_back(lookup.env_dir);
  for (const auto& root : lookup.roots) {
    if (!root.empty()) dirs.push_back((fs::path(root) / kDefaultDir).lexically_normal().string());
  }
  std::vector<std::string> tried;
  auto in_dir = [&](const std::string& dir, std::string_view file) -> std::string {
    const fs::path p = fs::path(dir) / file;
    tried.push_back(p.string());
    return fs::is_regular_file(p, ec) ? p.string() : "";
  };
  if (!lookup.flag.empty()) {
    const fs::path p(lookup.flag);
    if (fs::is_regular_file(p, ec)) return lookup.flag;
    if (fs::is_directory(p, ec)) {
      std::string f = in_dir(lookup.flag, kDefaultFile);
      if (!f.empty()) return f;
      return absl::NotFoundError(
          fmt::format("--trace: directory {} has no {}", lookup.flag, kDefaultFile));
    }
    if (lookup.flag.find('/') == std::string::npos) {
      // A short name: "gpushare100", "openb_pod_list_gpushare100" or the file name.
      std::vector<std::string> names = {lookup.flag, lookup.flag + ".csv",
                                        "openb_pod_list_" + lookup.flag + ".csv"};
      for (const auto& dir : dirs) {
        for (const auto& n : names) {
          std::string f = in_dir(dir, n);
          if (!f.empty()) return f;
        }
      }
    }
    return absl::NotFoundError(fmt::format("--trace: no trace file \"{}\"", lookup.flag));
  }
  for (const auto& dir : dirs) {
    std::string f = in_dir(dir, kDefaultFile);
    if (!f.empty()) return f;
  }
  return absl::NotFoundError(fmt::format(
      "no trace given and {} was not found (tried: {}); pass --trace FILE, --generate SPEC, or set "
      "DYNMIG_TRACE_DIR",
      kDefaultFile,
      tried.empty() ? std::string("nothing") : fmt::format("{}", fmt::join(tried, ", "))));
}

}  // namespace dynmig::sim
