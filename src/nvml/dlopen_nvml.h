// DlopenNvml: the real NVML, loaded with dlopen("libnvidia-ml.so.1") at run time, so dynmig builds
// and runs (with the simulator) on machines without an NVIDIA driver.
//
// Only the ABI subset dynmig uses is declared (dlopen_nvml.cc, from the struct layouts of the NVML
// 13.x header) and only versioned entry points are resolved (nvmlInit_v2,
// nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetPciInfo_v3, ..._v2 where NVML versions a call).
// Symbols needed for identity (init, count, handle, name, UUID, PCI, minor, memory) are required;
// a missing MIG or process symbol (old driver) makes that call NOT_SUPPORTED (kUnimplemented).
// nvmlInit_v2 runs once in Create, nvmlShutdown in the destructor.
//
// Thread-safe (NVML is); mutating calls are additionally serialized by a mutex.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "nvml/nvml.h"

namespace dynmig::nvml {

struct DlopenNvmlOptions {
  std::string library = "libnvidia-ml.so.1";  // dlopen name or path
  std::string mig_minors_path = kMigMinorsPath;
};

class DlopenNvml final : public Nvml {
 public:
  // FailedPrecondition "no NVIDIA driver found (libnvidia-ml.so.1: <dlerror>)" where the library
  // cannot be loaded; FailedPrecondition naming the symbol where a required one is missing;
  // nvmlInit_v2's error (e.g. DRIVER_NOT_LOADED -> kFailedPrecondition) otherwise.
  static absl::StatusOr<std::unique_ptr<DlopenNvml>> Create(const DlopenNvmlOptions& options = {});
  ~DlopenNvml() override;

  DlopenNvml(const DlopenNvml&) = delete;
  DlopenNvml& operator=(const DlopenNvml&) = delete;

  // Nvml
  std::string Description() const override;
  absl::StatusOr<uint32_t> DeviceCount() override;
  absl::StatusOr<GpuInfo> GetGpu(uint32_t gpu) override;
  absl::StatusOr<MigModeState> GetMigMode(uint32_t gpu) override;
  absl::StatusOr<MigModeChange> SetMigMode(uint32_t gpu, bool enabled) override;
  // NOT_SUPPORTED: NVML has no reset call; the message names the host action.
  absl::Status ResetGpu(uint32_t gpu) override;
  absl::StatusOr<GpuInstanceProfileInfo> GetGpuInstanceProfileInfo(uint32_t gpu,
                                                                   uint32_t profile_index) override;
  absl::StatusOr<std::vector<mig::Placement>> GetGpuInstancePossiblePlacements(
      uint32_t gpu, uint32_t profile_id) override;
  absl::StatusOr<GpuInstanceInfo> CreateGpuInstance(uint32_t gpu, uint32_t profile_id,
                                                    const mig::Placement& placement) override;
  absl::StatusOr<std::vector<GpuInstanceInfo>> ListGpuInstances(uint32_t gpu) override;
  absl::Status DestroyGpuInstance(uint32_t gpu, uint32_t gi_id) override;
  absl::StatusOr<ComputeInstanceInfo> CreateComputeInstance(uint32_t gpu, uint32_t gi_id) override;
  absl::StatusOr<std::vector<ComputeInstanceInfo>> ListComputeInstances(uint32_t gpu,
                                                                        uint32_t gi_id) override;
  absl::StatusOr<std::string> GetMigDeviceUuid(uint32_t gpu, uint32_t gi_id,
                                               uint32_t ci_id) override;
  absl::Status DestroyComputeInstance(uint32_t gpu, uint32_t gi_id, uint32_t ci_id) override;
  absl::StatusOr<std::vector<ProcessInfo>> GetComputeProcesses(uint32_t gpu) override;
  absl::StatusOr<std::vector<ProcessInfo>> GetMigDeviceProcesses(uint32_t gpu, uint32_t gi_id,
                                                                 uint32_t ci_id) override;
  absl::StatusOr<MigMinors> GetMigMinors() override;

  struct Api;  // resolved entry points (dlopen_nvml.cc)

 private:
  DlopenNvml(DlopenNvmlOptions options, void* handle, std::unique_ptr<Api> api);

  DlopenNvmlOptions options_;
  void* handle_ = nullptr;
  std::unique_ptr<Api> api_;
  std::string driver_version_;
  dynmig::Mutex mutate_mu_;  // serializes create/destroy (NVML's own state, nothing of ours)
};

}  // namespace dynmig::nvml
