// MIG capability minors and the device nodes a container needs for one MIG device.
//
// The driver lists fixed minor numbers in /proc/driver/nvidia-caps/mig-minors, one "<name> <minor>"
// per line: "config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4", ...
// "gpu31/gi14/ci7/access 4322". The <N> of gpuN is the GPU's device minor (GpuInfo::minor), not its
// NVML index. The table is built in a fixed order, which gives
//   minor(gpu N, gi G)       = 3 + 135*N + 9*G
//   minor(gpu N, gi G, ci C) = 3 + 135*N + 9*G + 1 + C
// Production code reads the file; the formula serves the simulator and tests. Value type;
// thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace dynmig::nvml {

inline constexpr char kMigMinorsPath[] = "/proc/driver/nvidia-caps/mig-minors";
inline constexpr uint32_t kMaxMigMinorGpus = 32;      // gpu0..gpu31
inline constexpr uint32_t kMaxGpuInstanceId = 14;     // gi0..gi14
inline constexpr uint32_t kMaxComputeInstanceId = 7;  // ci0..ci7

constexpr uint32_t GpuInstanceAccessMinorFormula(uint32_t gpu_minor, uint32_t gi) {
  return 3 + 135 * gpu_minor + 9 * gi;
}
constexpr uint32_t ComputeInstanceAccessMinorFormula(uint32_t gpu_minor, uint32_t gi, uint32_t ci) {
  return GpuInstanceAccessMinorFormula(gpu_minor, gi) + 1 + ci;
}

// The device nodes one MIG device needs inside a container.
struct MigDeviceNodes {
  std::string gpu;                   // /dev/nvidia<gpu minor>
  std::string gpu_instance_cap;      // /dev/nvidia-caps/nvidia-cap<gi access minor>
  std::string compute_instance_cap;  // /dev/nvidia-caps/nvidia-cap<ci access minor>
  std::vector<std::string> control;  // /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools

  // gpu, gpu_instance_cap, compute_instance_cap, then control.
  std::vector<std::string> All() const;
};

class MigMinors {
 public:
  MigMinors() = default;

  // Parses mig-minors text. Blank lines are skipped; a malformed line is InvalidArgument naming
  // its line number and text.
  static absl::StatusOr<MigMinors> Parse(std::string_view text);
  // Reads and parses a file. NotFound where it is missing (no driver, or MIG never enabled).
  static absl::StatusOr<MigMinors> Load(const std::string& path = kMigMinorsPath);
  // The text the driver writes, from the formula, for gpu0..gpu<gpus-1>.
  static std::string Generate(uint32_t gpus = kMaxMigMinorGpus);

  // The minor of a capability name ("gpu0/gi1/access"). NotFound names it.
  absl::StatusOr<uint32_t> Lookup(std::string_view name) const;
  absl::StatusOr<uint32_t> GpuInstanceAccess(uint32_t gpu_minor, uint32_t gi) const;
  absl::StatusOr<uint32_t> ComputeInstanceAccess(uint32_t gpu_minor, uint32_t gi,
                                                 uint32_t ci) const;
  // Device nodes for MIG device (gpu minor, gi, ci). NotFound where a capability is not listed.
  absl::StatusOr<MigDeviceNodes> DeviceNodes(uint32_t gpu_minor, uint32_t gi, uint32_t ci) const;

  size_t size() const { return minors_.size(); }

 private:
  std::map<std::string, uint32_t, std::less<>> minors_;
};

}  // namespace dynmig::nvml
