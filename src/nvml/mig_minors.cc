#include "nvml/mig_minors.h"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "common/strings.h"
#include "fmt/format.h"

namespace dynmig::nvml {

std::vector<std::string> MigDeviceNodes::All() const {
  std::vector<std::string> out = {gpu, gpu_instance_cap, compute_instance_cap};
  out.insert(out.end(), control.begin(), control.end());
  return out;
}

absl::StatusOr<MigMinors> MigMinors::Parse(std::string_view text) {
  MigMinors out;
  int line_no = 0;
  while (!text.empty()) {
    ++line_no;
    const size_t nl = text.find('\n');
    std::string_view line = Trim(text.substr(0, nl));
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (line.empty()) continue;
    const size_t sp = line.find_last_of(" \t");
    auto bad = [&](std::string_view why) {
      return absl::InvalidArgumentError(
          fmt::format("mig-minors line {} \"{}\": {} (expected \"<name> <minor>\", e.g. "
                      "\"gpu0/gi1/access 12\")",
                      line_no, line, why));
    };
    if (sp == std::string_view::npos) return bad("no minor number");
    std::string_view name = Trim(line.substr(0, sp));
    std::string_view number = line.substr(sp + 1);
    if (name.empty()) return bad("no capability name");
    uint32_t minor = 0;
    auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), minor);
    if (ec != std::errc() || ptr != number.data() + number.size()) {
      return bad("minor is not a number");
    }
    out.minors_[std::string(name)] = minor;
  }
  return out;
}

absl::StatusOr<MigMinors> MigMinors::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(
          fmt::format("{} does not exist (no NVIDIA driver with MIG support loaded?)", path));
    }
    return absl::PermissionDeniedError(fmt::format("cannot read {}: {}", path, std::strerror(err)));
  }
  std::stringstream buf;
  buf << in.rdbuf();
  auto parsed = Parse(buf.str());
  if (!parsed.ok()) {
    return absl::Status(parsed.status().code(),
                        fmt::format("{}: {}", path, std::string(parsed.status().message())));
  }
  return parsed;
}

std::string MigMinors::Generate(uint32_t gpus) {
  std::string out = "config 1\nmonitor 2\n";
  for (uint32_t g = 0; g < gpus; ++g) {
    for (uint32_t gi = 0; gi <= kMaxGpuInstanceId; ++gi) {
      out += fmt::format("gpu{}/gi{}/access {}\n", g, gi, GpuInstanceAccessMinorFormula(g, gi));
      for (uint32_t ci = 0; ci <= kMaxComputeInstanceId; ++ci) {
        out += fmt::format("gpu{}/gi{}/ci{}/access {}\n", g, gi, ci,
                           ComputeInstanceAccessMinorFormula(g, gi, ci));
      }
    }
  }
  return out;
}

absl::StatusOr<uint32_t> MigMinors::Lookup(std::string_view name) const {
  auto it = minors_.find(name);
  if (it == minors_.end()) {
    return absl::NotFoundError(fmt::format(
        "MIG capability \"{}\" is not listed in mig-minors ({} entries)", name, minors_.size()));
  }
  return it->second;
}

absl::StatusOr<uint32_t> MigMinors::GpuInstanceAccess(uint32_t gpu_minor, uint32_t gi) const {
  return Lookup(fmt::format("gpu{}/gi{}/access", gpu_minor, gi));
}

absl::StatusOr<uint32_t> MigMinors::ComputeInstanceAccess(uint32_t gpu_minor, uint32_t gi,
                                                          uint32_t ci) const {
  return Lookup(fmt::format("gpu{}/gi{}/ci{}/access", gpu_minor, gi, ci));
}

absl::StatusOr<MigDeviceNodes> MigMinors::DeviceNodes(uint32_t gpu_minor, uint32_t gi,
                                                      uint32_t ci) const {
  auto gi_minor = GpuInstanceAccess(gpu_minor, gi);
  if (!gi_minor.ok()) return gi_minor.status();
  auto ci_minor = ComputeInstanceAccess(gpu_minor, gi, ci);
  if (!ci_minor.ok()) return ci_minor.status();
  MigDeviceNodes nodes;
  nodes.gpu = fmt::format("/dev/nvidia{}", gpu_minor);
  nodes.gpu_instance_cap = fmt::format("/dev/nvidia-caps/nvidia-cap{}", *gi_minor);
  nodes.compute_instance_cap = fmt::format("/dev/nvidia-caps/nvidia-cap{}", *ci_minor);
  nodes.control = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"};
  return nodes;
}

}  // namespace dynmig::nvml
