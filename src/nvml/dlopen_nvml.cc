#include "nvml/dlopen_nvml.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>

#include "fmt/format.h"

namespace dynmig::nvml {
namespace {

// ---------------------------------------------------------------------------------------------
// The NVML ABI subset dynmig uses (layouts from the NVML 13.x header, mig-facts.md section 5.1).

extern "C" {
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
using nvmlGpuInstance_t = struct nvmlGpuInstance_st*;
using nvmlComputeInstance_t = struct nvmlComputeInstance_st*;

constexpr unsigned int kNameBufferSize = 96;     // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned int kUuidBufferSize = 96;     // NVML_DEVICE_UUID_V2_BUFFER_SIZE
constexpr unsigned int kDriverVersionSize = 80;  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE
constexpr unsigned int kInvalidInstanceId = 0xFFFFFFFF;
constexpr unsigned long long kValueNotAvailable = ~0ULL;  // NVML_VALUE_NOT_AVAILABLE

struct nvmlPciInfo_t {
  char busIdLegacy[16];  // NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];  // NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE
};

struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

struct nvmlProcessInfo_t {  // _v2 layout, taken by ..._v2 and ..._v3 process queries
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

struct nvmlGpuInstancePlacement_t {
  unsigned int start;
  unsigned int size;
};

struct nvmlGpuInstanceProfileInfo_t {
  unsigned int id;
  unsigned int isP2pSupported;
  unsigned int sliceCount;
  unsigned int instanceCount;
  unsigned int multiprocessorCount;
  unsigned int copyEngineCount;
  unsigned int decoderCount;
  unsigned int encoderCount;
  unsigned int jpegCount;
  unsigned int ofaCount;
  unsigned long long memorySizeMB;
};

struct nvmlGpuInstanceInfo_t {
  nvmlDevice_t device;
  unsigned int id;
  unsigned int profileId;
  nvmlGpuInstancePlacement_t placement;
};

struct nvmlComputeInstancePlacement_t {
  unsigned int start;
  unsigned int size;
};

struct nvmlComputeInstanceProfileInfo_t {
  unsigned int id;
  unsigned int sliceCount;
  unsigned int instanceCount;
  unsigned int multiprocessorCount;
  unsigned int sharedCopyEngineCount;
  unsigned int sharedDecoderCount;
  unsigned int sharedEncoderCount;
  unsigned int sharedJpegCount;
  unsigned int sharedOfaCount;
};

struct nvmlComputeInstanceInfo_t {
  nvmlDevice_t device;
  nvmlGpuInstance_t gpuInstance;
  unsigned int id;
  unsigned int profileId;
  nvmlComputeInstancePlacement_t placement;
};
}  // extern "C"

static_assert(sizeof(nvmlPciInfo_t) == 68);
static_assert(sizeof(nvmlProcessInfo_t) == 24);
static_assert(sizeof(nvmlGpuInstanceProfileInfo_t) == 48);
static_assert(sizeof(nvmlGpuInstanceInfo_t) == 24);
static_assert(sizeof(nvmlComputeInstanceInfo_t) == 32);

constexpr int kNotSupported = static_cast<int>(NvmlReturn::kNotSupported);
constexpr int kInvalidArgument = static_cast<int>(NvmlReturn::kInvalidArgument);
constexpr int kNotFound = static_cast<int>(NvmlReturn::kNotFound);
constexpr int kInsufficientSize = static_cast<int>(NvmlReturn::kInsufficientSize);
constexpr int kSuccess = 0;

std::string CString(const char* buf, size_t size) { return std::string(buf, strnlen(buf, size)); }

}  // namespace

struct DlopenNvml::Api {
  nvmlReturn_t (*Init)() = nullptr;
  nvmlReturn_t (*Shutdown)() = nullptr;
  const char* (*ErrorString)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*SystemGetDriverVersion)(char*, unsigned int) = nullptr;
  nvmlReturn_t (*DeviceGetCount)(unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceGetHandleByIndex)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*DeviceGetName)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*DeviceGetUUID)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*DeviceGetPciInfo)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*DeviceGetMinorNumber)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceGetMemoryInfo)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*DeviceGetMigMode)(nvmlDevice_t, unsigned int*, unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceSetMigMode)(nvmlDevice_t, unsigned int, nvmlReturn_t*) = nullptr;
  nvmlReturn_t (*DeviceGetGpuInstanceProfileInfo)(nvmlDevice_t, unsigned int,
                                                  nvmlGpuInstanceProfileInfo_t*) = nullptr;
  nvmlReturn_t (*DeviceGetGpuInstancePossiblePlacements)(nvmlDevice_t, unsigned int,
                                                         nvmlGpuInstancePlacement_t*,
                                                         unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceCreateGpuInstanceWithPlacement)(nvmlDevice_t, unsigned int,
                                                       const nvmlGpuInstancePlacement_t*,
                                                       nvmlGpuInstance_t*) = nullptr;
  nvmlReturn_t (*GpuInstanceGetInfo)(nvmlGpuInstance_t, nvmlGpuInstanceInfo_t*) = nullptr;
  nvmlReturn_t (*DeviceGetGpuInstances)(nvmlDevice_t, unsigned int, nvmlGpuInstance_t*,
                                        unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceGetGpuInstanceById)(nvmlDevice_t, unsigned int,
                                           nvmlGpuInstance_t*) = nullptr;
  nvmlReturn_t (*GpuInstanceDestroy)(nvmlGpuInstance_t) = nullptr;
  nvmlReturn_t (*GpuInstanceGetComputeInstanceProfileInfo)(
      nvmlGpuInstance_t, unsigned int, unsigned int, nvmlComputeInstanceProfileInfo_t*) = nullptr;
  nvmlReturn_t (*GpuInstanceCreateComputeInstance)(nvmlGpuInstance_t, unsigned int,
                                                   nvmlComputeInstance_t*) = nullptr;
  nvmlReturn_t (*GpuInstanceGetComputeInstances)(nvmlGpuInstance_t, unsigned int,
                                                 nvmlComputeInstance_t*, unsigned int*) = nullptr;
  nvmlReturn_t (*GpuInstanceGetComputeInstanceById)(nvmlGpuInstance_t, unsigned int,
                                                    nvmlComputeInstance_t*) = nullptr;
  nvmlReturn_t (*ComputeInstanceGetInfo)(nvmlComputeInstance_t,
                                         nvmlComputeInstanceInfo_t*) = nullptr;
  nvmlReturn_t (*ComputeInstanceDestroy)(nvmlComputeInstance_t) = nullptr;
  nvmlReturn_t (*DeviceGetMaxMigDeviceCount)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceGetMigDeviceHandleByIndex)(nvmlDevice_t, unsigned int,
                                                  nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*DeviceGetGpuInstanceId)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceGetComputeInstanceId)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*DeviceGetComputeRunningProcesses)(nvmlDevice_t, unsigned int*,
                                                   nvmlProcessInfo_t*) = nullptr;
  const char* processes_symbol = nullptr;
};

namespace {

template <typename Fn>
bool Resolve(void* handle, const char* symbol, Fn& out) {
  void* p = dlsym(handle, symbol);
  out = reinterpret_cast<Fn>(p);
  return p != nullptr;
}

// NOT_SUPPORTED status for an entry point this driver lacks.
absl::Status Missing(const char* symbol, std::string_view context) {
  return NvmlStatus(NvmlReturn::kNotSupported,
                    fmt::format("{}: this driver's libnvidia-ml.so.1 lacks {} (driver too old)",
                                context, symbol));
}

#define DYNMIG_NVML_REQUIRE_FN(fn, symbol, context) \
  if (api_->fn == nullptr) return Missing(symbol, context)

absl::Status Check(nvmlReturn_t rc, std::string_view context) {
  return NvmlStatus(static_cast<NvmlReturn>(rc), context);
}

}  // namespace

DlopenNvml::DlopenNvml(DlopenNvmlOptions options, void* handle, std::unique_ptr<Api> api)
    : options_(std::move(options)), handle_(handle), api_(std::move(api)) {}

DlopenNvml::~DlopenNvml() {
  if (api_ != nullptr && api_->Shutdown != nullptr) api_->Shutdown();
  if (handle_ != nullptr) dlclose(handle_);
}

absl::StatusOr<std::unique_ptr<DlopenNvml>> DlopenNvml::Create(const DlopenNvmlOptions& options) {
  dlerror();
  void* handle = dlopen(options.library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return absl::FailedPreconditionError(fmt::format("no NVIDIA driver found ({}: {})",
                                                     options.library,
                                                     err != nullptr ? err : "unknown error"));
  }
  auto api = std::make_unique<Api>();
  struct Required {
    const char* symbol;
    bool ok;
  };
  const Required required[] = {
      {"nvmlInit_v2", Resolve(handle, "nvmlInit_v2", api->Init)},
      {"nvmlShutdown", Resolve(handle, "nvmlShutdown", api->Shutdown)},
      {"nvmlDeviceGetCount_v2", Resolve(handle, "nvmlDeviceGetCount_v2", api->DeviceGetCount)},
      {"nvmlDeviceGetHandleByIndex_v2",
       Resolve(handle, "nvmlDeviceGetHandleByIndex_v2", api->DeviceGetHandleByIndex)},
      {"nvmlDeviceGetName", Resolve(handle, "nvmlDeviceGetName", api->DeviceGetName)},
      {"nvmlDeviceGetUUID", Resolve(handle, "nvmlDeviceGetUUID", api->DeviceGetUUID)},
      {"nvmlDeviceGetPciInfo_v3",
       Resolve(handle, "nvmlDeviceGetPciInfo_v3", api->DeviceGetPciInfo)},
      {"nvmlDeviceGetMinorNumber",
       Resolve(handle, "nvmlDeviceGetMinorNumber", api->DeviceGetMinorNumber)},
      {"nvmlDeviceGetMemoryInfo",
       Resolve(handle, "nvmlDeviceGetMemoryInfo", api->DeviceGetMemoryInfo)},
  };
  for (const auto& r : required) {
    if (!r.ok) {
      dlclose(handle);
      return absl::FailedPreconditionError(fmt::format(
          "{} lacks the required symbol {} (NVIDIA driver too old?)", options.library, r.symbol));
    }
  }
  Resolve(handle, "nvmlErrorString", api->ErrorString);
  Resolve(handle, "nvmlSystemGetDriverVersion", api->SystemGetDriverVersion);
  Resolve(handle, "nvmlDeviceGetMigMode", api->DeviceGetMigMode);
  Resolve(handle, "nvmlDeviceSetMigMode", api->DeviceSetMigMode);
  Resolve(handle, "nvmlDeviceGetGpuInstanceProfileInfo", api->DeviceGetGpuInstanceProfileInfo);
  Resolve(handle, "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
          api->DeviceGetGpuInstancePossiblePlacements);
  Resolve(handle, "nvmlDeviceCreateGpuInstanceWithPlacement",
          api->DeviceCreateGpuInstanceWithPlacement);
  Resolve(handle, "nvmlGpuInstanceGetInfo", api->GpuInstanceGetInfo);
  Resolve(handle, "nvmlDeviceGetGpuInstances", api->DeviceGetGpuInstances);
  Resolve(handle, "nvmlDeviceGetGpuInstanceById", api->DeviceGetGpuInstanceById);
  Resolve(handle, "nvmlGpuInstanceDestroy", api->GpuInstanceDestroy);
  Resolve(handle, "nvmlGpuInstanceGetComputeInstanceProfileInfo",
          api->GpuInstanceGetComputeInstanceProfileInfo);
  Resolve(handle, "nvmlGpuInstanceCreateComputeInstance", api->GpuInstanceCreateComputeInstance);
  Resolve(handle, "nvmlGpuInstanceGetComputeInstances", api->GpuInstanceGetComputeInstances);
  Resolve(handle, "nvmlGpuInstanceGetComputeInstanceById", api->GpuInstanceGetComputeInstanceById);
  Resolve(handle, "nvmlComputeInstanceGetInfo_v2", api->ComputeInstanceGetInfo);
  Resolve(handle, "nvmlComputeInstanceDestroy", api->ComputeInstanceDestroy);
  Resolve(handle, "nvmlDeviceGetMaxMigDeviceCount", api->DeviceGetMaxMigDeviceCount);
  Resolve(handle, "nvmlDeviceGetMigDeviceHandleByIndex", api->DeviceGetMigDeviceHandleByIndex);
  Resolve(handle, "nvmlDeviceGetGpuInstanceId", api->DeviceGetGpuInstanceId);
  Resolve(handle, "nvmlDeviceGetComputeInstanceId", api->DeviceGetComputeInstanceId);
  if (Resolve(handle, "nvmlDeviceGetComputeRunningProcesses_v3",
              api->DeviceGetComputeRunningProcesses)) {
    api->processes_symbol = "nvmlDeviceGetComputeRunningProcesses_v3";
  } else if (Resolve(handle, "nvmlDeviceGetComputeRunningProcesses_v2",
                     api->DeviceGetComputeRunningProcesses)) {
    api->processes_symbol = "nvmlDeviceGetComputeRunningProcesses_v2";
  }

  if (auto st = Check(api->Init(), fmt::format("nvmlInit_v2 ({})", options.library)); !st.ok()) {
    dlclose(handle);
    return st;
  }
  std::unique_ptr<DlopenNvml> nvml(new DlopenNvml(options, handle, std::move(api)));
  if (nvml->api_->SystemGetDriverVersion != nullptr) {
    char buf[kDriverVersionSize] = {};
    if (nvml->api_->SystemGetDriverVersion(buf, sizeof(buf)) == kSuccess) {
      nvml->driver_version_ = CString(buf, sizeof(buf));
    }
  }
  return nvml;
}

namespace {

// Per-call helpers bound to one Api.
class Calls {
 public:
  explicit Calls(const DlopenNvml::Api& api) : api_(api) {}

  absl::StatusOr<nvmlDevice_t> Device(uint32_t gpu, std::string_view context) const {
    nvmlDevice_t dev = nullptr;
    if (auto st = Check(api_.DeviceGetHandleByIndex(gpu, &dev), context); !st.ok()) return st;
    return dev;
  }

  absl::StatusOr<nvmlGpuInstance_t> Gi(nvmlDevice_t dev, uint32_t gi_id,
                                       std::string_view context) const {
    if (api_.DeviceGetGpuInstanceById == nullptr) {
      return Missing("nvmlDeviceGetGpuInstanceById", context);
    }
    nvmlGpuInstance_t gi = nullptr;
    if (auto st = Check(api_.DeviceGetGpuInstanceById(dev, gi_id, &gi),
                        fmt::format("{}: GPU instance {}", context, gi_id));
        !st.ok()) {
      return st;
    }
    return gi;
  }

  absl::StatusOr<nvmlComputeInstance_t> Ci(nvmlGpuInstance_t gi, uint32_t gi_id, uint32_t ci_id,
                                           std::string_view context) const {
    if (api_.GpuInstanceGetComputeInstanceById == nullptr) {
      return Missing("nvmlGpuInstanceGetComputeInstanceById", context);
    }
    nvmlComputeInstance_t ci = nullptr;
    if (auto st =
            Check(api_.GpuInstanceGetComputeInstanceById(gi, ci_id, &ci),
                  fmt::format("{}: compute instance {} of GPU instance {}", context, ci_id, gi_id));
        !st.ok()) {
      return st;
    }
    return ci;
  }

  absl::Status RequireMigEnabled(nvmlDevice_t dev, uint32_t gpu, std::string_view context) const {
    if (api_.DeviceGetMigMode == nullptr) return Missing("nvmlDeviceGetMigMode", context);
    unsigned int current = 0;
    unsigned int pending = 0;
    if (auto st = Check(api_.DeviceGetMigMode(dev, &current, &pending), context); !st.ok()) {
      return st;
    }
    if (current != 1) {
      return NvmlStatus(NvmlReturn::kNotSupported,
                        fmt::format("{}: MIG mode is disabled on GPU {}", context, gpu));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Uuid(nvmlDevice_t dev, std::string_view context) const {
    char buf[kUuidBufferSize] = {};
    if (auto st = Check(api_.DeviceGetUUID(dev, buf, sizeof(buf)), context); !st.ok()) return st;
    return CString(buf, sizeof(buf));
  }

  // The MIG device handle of (gi, ci), by walking the parent's MIG device indices.
  absl::StatusOr<nvmlDevice_t> MigHandle(nvmlDevice_t dev, uint32_t gi_id, uint32_t ci_id,
                                         std::string_view context) const {
    if (api_.DeviceGetMaxMigDeviceCount == nullptr ||
        api_.DeviceGetMigDeviceHandleByIndex == nullptr || api_.DeviceGetGpuInstanceId == nullptr ||
        api_.DeviceGetComputeInstanceId == nullptr) {
      return Missing("nvmlDeviceGetMigDeviceHandleByIndex", context);
    }
    unsigned int count = 0;
    if (auto st = Check(api_.DeviceGetMaxMigDeviceCount(dev, &count), context); !st.ok()) {
      return st;
    }
    for (unsigned int i = 0; i < count; ++i) {
      nvmlDevice_t mig = nullptr;
      const int rc = api_.DeviceGetMigDeviceHandleByIndex(dev, i, &mig);
      if (rc == kNotFound || rc == kInvalidArgument) continue;
      if (auto st = Check(rc, context); !st.ok()) return st;
      unsigned int gi = 0;
      unsigned int ci = 0;
      if (auto st = Check(api_.DeviceGetGpuInstanceId(mig, &gi), context); !st.ok()) return st;
      if (auto st = Check(api_.DeviceGetComputeInstanceId(mig, &ci), context); !st.ok()) return st;
      if (gi == gi_id && ci == ci_id) return mig;
    }
    return NvmlStatus(NvmlReturn::kNotFound,
                      fmt::format("{}: no MIG device for GPU instance {} compute instance {}",
                                  context, gi_id, ci_id));
  }

  absl::StatusOr<ComputeInstanceInfo> CiInfo(uint32_t gpu, nvmlDevice_t dev, uint32_t gi_id,
                                             nvmlComputeInstance_t ci,
                                             std::string_view context) const {
    if (api_.ComputeInstanceGetInfo == nullptr) {
      return Missing("nvmlComputeInstanceGetInfo_v2", context);
    }
    nvmlComputeInstanceInfo_t info{};
    if (auto st = Check(api_.ComputeInstanceGetInfo(ci, &info), context); !st.ok()) return st;
    ComputeInstanceInfo out;
    out.gpu = gpu;
    out.gpu_instance_id = gi_id;
    out.id = info.id;
    out.profile_id = info.profileId;
    out.placement = mig::Placement{info.placement.start, info.placement.size};
    // NVIDIA's DRA driver reads the MIG UUID from the CI info's device; fall back to walking the
    // MIG device handles where that handle is the parent.
    if (info.device != nullptr) {
      auto uuid = Uuid(info.device, context);
      if (uuid.ok() && uuid->starts_with("MIG-")) out.mig_uuid = *uuid;
    }
    if (out.mig_uuid.empty()) {
      auto mig = MigHandle(dev, gi_id, info.id, context);
      if (!mig.ok()) return mig.status();
      auto uuid = Uuid(*mig, context);
      if (!uuid.ok()) return uuid.status();
      out.mig_uuid = *uuid;
    }
    return out;
  }

  absl::StatusOr<std::vector<ProcessInfo>> Processes(nvmlDevice_t dev,
                                                     std::string_view context) const {
    if (api_.DeviceGetComputeRunningProcesses == nullptr) {
      return Missing("nvmlDeviceGetComputeRunningProcesses_v3", context);
    }
    std::vector<nvmlProcessInfo_t> buf;
    for (int attempt = 0; attempt < 5; ++attempt) {
      unsigned int count = static_cast<unsigned int>(buf.size());
      const int rc =
          api_.DeviceGetComputeRunningProcesses(dev, &count, buf.empty() ? nullptr : buf.data());
      if (rc == kInsufficientSize) {
        buf.assign(count + 16, nvmlProcessInfo_t{});
        continue;
      }
      if (auto st = Check(rc, context); !st.ok()) return st;
      std::vector<ProcessInfo> out;
      for (unsigned int i = 0; i < count && i < buf.size(); ++i) {
        ProcessInfo p;
        p.pid = buf[i].pid;
        p.used_memory_mib =
            buf[i].usedGpuMemory == kValueNotAvailable ? 0 : buf[i].usedGpuMemory >> 20;
        if (buf[i].gpuInstanceId != kInvalidInstanceId) p.gpu_instance_id = buf[i].gpuInstanceId;
        if (buf[i].computeInstanceId != kInvalidInstanceId) {
          p.compute_instance_id = buf[i].computeInstanceId;
        }
        out.push_back(p);
      }
      return out;
    }
    return NvmlStatus(NvmlReturn::kInsufficientSize,
                      fmt::format("{}: the process list kept growing", context));
  }

 private:
  const DlopenNvml::Api& api_;
};

}  // namespace

std::string DlopenNvml::Description() const {
  return fmt::format("NVML {} ({})", driver_version_.empty() ? "driver" : driver_version_,
                     options_.library);
}

absl::StatusOr<uint32_t> DlopenNvml::DeviceCount() {
  unsigned int count = 0;
  if (auto st = Check(api_->DeviceGetCount(&count), "nvmlDeviceGetCount_v2"); !st.ok()) return st;
  return count;
}

absl::StatusOr<GpuInfo> DlopenNvml::GetGpu(uint32_t gpu) {
  const std::string context = fmt::format("get GPU {} info", gpu);
  Calls calls(*api_);
  auto dev = calls.Device(gpu, context);
  if (!dev.ok()) return dev.status();
  GpuInfo info;
  info.index = gpu;
  char name[kNameBufferSize] = {};
  if (auto st = Check(api_->DeviceGetName(*dev, name, sizeof(name)), context); !st.ok()) return st;
  info.name = CString(name, sizeof(name));
  auto uuid = calls.Uuid(*dev, context);
  if (!uuid.ok()) return uuid.status();
  info.uuid = *uuid;
  nvmlPciInfo_t pci{};
  if (auto st = Check(api_->DeviceGetPciInfo(*dev, &pci), context); !st.ok()) return st;
  info.pci_bus_id = CString(pci.busId, sizeof(pci.busId));
  info.pci_device_id = pci.pciDeviceId;
  unsigned int minor = 0;
  if (auto st = Check(api_->DeviceGetMinorNumber(*dev, &minor), context); !st.ok()) return st;
  info.minor = minor;
  nvmlMemory_t memory{};
  if (auto st = Check(api_->DeviceGetMemoryInfo(*dev, &memory), context); !st.ok()) return st;
  info.total_memory_bytes = memory.total;
  info.total_memory_mib = memory.total >> 20;
  if (api_->DeviceGetMigMode != nullptr) {
    unsigned int current = 0;
    unsigned int pending = 0;
    const int rc = api_->DeviceGetMigMode(*dev, &current, &pending);
    if (rc == kSuccess) {
      info.mig = MigModeState{.supported = true, .current = current == 1, .pending = pending == 1};
    } else if (rc != kNotSupported) {
      return Check(rc, context);
    }
  }
  return info;
}

absl::StatusOr<MigModeState> DlopenNvml::GetMigMode(uint32_t gpu) {
  const std::string context = fmt::format("get MIG mode of GPU {}", gpu);
  Calls calls(*api_);
  auto dev = calls.Device(gpu, context);
  if (!dev.ok()) return dev.status();
  if (api_->DeviceGetMigMode == nullptr) return MigModeState{};  // a driver from before MIG
  unsigned int current = 0;
  unsigned int pending = 0;
  const int rc = api_->DeviceGetMigMode(*dev, &current, &pending);
  if (rc == kNotSupported) return MigModeState{};
  if (rc != kSuccess) return Check(rc, context);
  return MigModeState{.supported = true, .current = current == 1, .pending = pending == 1};
}

absl::StatusOr<MigModeChange> DlopenNvml::SetMigMode(uint32_t gpu, bool enabled) {
  const std::string context =
      fmt::format("set MIG mode {} on GPU {}", enabled ? "enabled" : "disabled", gpu);
  DYNMIG_NVML_REQUIRE_FN(DeviceSetMigMode, "nvmlDeviceSetMigMode", context);
  Calls calls(*api_);
  auto dev = calls.Device(gpu, context);
  if (!dev.ok()) return dev.status();
  MigModeChange change;
  {
    dynmig::MutexLock lock(&mutate_mu_);
    int activation = kSuccess;
    const int rc = api_->DeviceSetMigMode(*dev, enabled ? 1u : 0u, &activation);
    if (auto st = Check(rc, context); !st.ok()) return st;
    change.activation = static_cast<NvmlReturn>(activation);
  }
  // The call may unbind or reset the GPU: read the mode back through a fresh handle.
  auto mode = GetMigMode(gpu);
  if (!mode.ok()) return mode.status();
  change.mode = *mode;
  return change;
}

absl::Status DlopenNvml::ResetGpu(uint32_t gpu) {
  return NvmlStatus(NvmlReturn::kNotSupported,
                    fmt::format("reset GPU {}: NVML has no GPU reset call; the host resets it "
                                "(`nvidia-smi --gpu-reset -i {}` as root, no process on the GPU) "
                                "or reboots",
                                gpu, gpu));
}

absl::StatusOr<GpuInstanceProfileInfo> DlopenNvml::GetGpuInstanceProfileInfo(
    uint32_t gpu, uint32_t profile_index) {
  const std::string context = fmt::format(
      "get GPU instance profile info for profile index {} on GPU {}", profile_index, gpu);
  DYNMIG_NVML_REQUIRE_FN(DeviceGetGpuInstanceProfileInfo, "nvmlDeviceGetGpuInstanceProfileInfo",
                         context);
  Calls calls(*api_);
  auto dev = calls.Device(gpu, context);
  if (!dev.ok()) return dev.status();
  nvmlGpuInstanceProfileInfo_t info{};
  if (auto st = Check(api_->DeviceGetGpuInstanceProfileInfo(*dev, profile_index, &info), context);
      !st.ok()) {
    return st;
  }
  return GpuInstanceProfileInfo{.index = profile_index,
                                .id = info.id,
                                .slice_count = info.sliceCount,
                                .instance_count = info.instanceCount,
                                .memory_mib = info.memorySizeMB,
                                .multiprocessor_count = info.multiprocessorCount,
                                .copy_engines = info.copyEngineCount,
                                .decoders = info.decoderCount,
                                .encoders = info.encoderCount,
                                .jpegs = info.jpegCount,
                                .ofas = info.ofaCount};
}

absl::StatusOr<std::vector<mig::Placement>> DlopenNvml::GetGpuInstancePossiblePlacements(
    uint32_t gpu, uint32_t profile_id) {
  const std::string context =
      fmt::format("get possible placements of GPU instance profile {} on GPU {}", profile_id, gpu);
  DYNMIG_NVML_REQUIRE_FN(DeviceGetGpuInstancePossiblePlacements,
                         "nvmlDeviceGetGpuInstancePossiblePlacements_v2", context);
  Calls calls(*api_);
  auto dev = calls.Device(gpu, context);
  if (!dev.ok()) return dev.status();
  unsigned int count = 0;
  if (auto st = Check(
          api_->DeviceGetGpuInstancePossiblePlacements(*dev, profile_id, nullptr, &count), context);
      !st.ok()) {
    return st;
  }
  std::vector<nvmlGpuInstancePlacement_t> buf(count);
  if (count > 0) {
    if (auto st = Check(
            api_->DeviceGetGpuInstancePossiblePlacements(*dev, profile_id, buf.data(), &count),
            context);
        !st.ok()) {
      return st;
    }
  }
  std::vector<mig::Placement> out;
  for (unsigned int i = 0; i < count && i < buf.size(); ++i) {
    out.push_back(mig::Placement{buf[i].start, buf[i].size});
  }
  return out;
}

absl::StatusOr<GpuInstanceInfo> DlopenNvml::CreateGpuInstance(uint32_t gpu, uint32_t profile_id,
                                                              const mig::Placement& placement) {
  const std::string context =
      fmt::format("create GPU instance of profile id {} at placement {}:{} on GPU {}", profile_id,
                  placement.start, placement.size, gpu);
  DYNMIG_NVML_REQUIRE_FN(DeviceCreateGpuInstanceWithPlacement,
                         "nvmlDeviceCreateGpuInstanceWithPlacement", context);
  DYNMIG_NVML_REQUIRE_FN(GpuInstanceGetInfo, "nvmlGpuInstanceGetInfo", context);
  dynmig::MutexLock lock(&mutate_mu_);
  Calls calls(*api_);
  auto dev = calls.Device(gpu, context);
  if (!dev.ok()) return dev.status();
  const nvmlGpuInstancePlacement_t pl{placement.start, placement.size};
  nvmlGpuInstance_t gi = nullptr;
  if (auto st =
          Check(api_->DeviceCreateGpuInstanceWithPlacement(*dev, profile_id, &pl, &gi), context);
      !st.ok()) {
    return st;
  }
  nvmlGpuInstanceInfo_t info{};
  if (auto st = Check(api_->GpuInstanceGetInfo(gi, &info), context); !st.ok()) return st;
  return GpuInstanceInfo{.gpu = gpu,
                         .id = info.id,
                         .profile_id = info.profileId,
                         .placement = mig::Placement{info.placement.start, info.placement.size}};
}

absl::StatusOr<std::vector<GpuInstanceInfo>> DlopenNvml::ListGpuInstances(uint32_t gpu) {
  const std::string context = fmt::format("list GPU instances on GPU {}", gpu);
  DYNMIG_NVML_REQUIRE_FN(DeviceGetGpuInstanceProfileInfo, "nvmlDeviceGetGpuInstanceProfileInfo",
                         context);
  DYNMIG_NVML_REQUIRE_FN(DeviceGetGpuInstances, "nvmlDeviceGetGpuInstances", context);
  DYNMIG_NVML_REQUIRE_FN(GpuInstanceGetInfo, "nvmlGpuInstanceGetInfo", context);
  Calls calls(*api_);
  auto dev = calls.Device(gpu, context);
  if (!dev.ok()) return dev.status();
  if (auto st = calls.RequireMigEnabled(*dev, gpu, context); !st.ok()) return st;
  std::vector<GpuInstanceInfo> out;
  std::vector<uint32_t> seen_ids;
  for (uint32_t index = 0; index < kGpuInstanceProfileCount; ++index) {
    nvmlGpuInstanceProfileInfo_t profile{};
    const int rc = api_->DeviceGetGpuInstanceProfileInfo(*dev, index, &profile);
    if (rc == kInvalidArgument) break;
    if (rc == kNotSupported) continue;
    if (auto st = Check(rc, context); !st.ok()) return st;
    if (std::find(seen_ids.begin(), seen_ids.end(), profile.id) != seen_ids.end()) continue;
    seen_ids.push_back(profile.id);
    std::vector<nvmlGpuInstance_t> handles(std::max(profile.instanceCount, 1u));
    unsigned int count = static_cast<unsigned int>(handles.size());
    if (auto st =
            Check(api_->DeviceGetGpuInstances(*dev, profile.id, handles.data(), &count), context);
        !st.ok()) {
      return st;
    }
    for (unsigned int i = 0; i < count && i < handles.size(); ++i) {
      nvmlGpuInstanceInfo_t info{};
      if (auto st = Check(api_->GpuInstanceGetInfo(handles[i], &info), context); !st.ok()) {
        return st;
      }
      out.push_back(
          GpuInstanceInfo{.gpu = gpu,
                          .id = info.id,
                          .profile_id = info.profileId,
                          .placement = mig::Placement{info.placement.start, info.placement.size}});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const GpuInstanceInfo& a, const GpuInstanceInfo& b) { return a.id < b.id; });
  return out;
}

absl::Status DlopenNvml::DestroyGpuInstance(uint32_t gpu, uint32_t gi_id) {
  const std::string context = fmt::format("destroy GPU instance {} on GPU {}", gi_id, gpu);
  DYNMIG_NVML_REQUIRE_FN(GpuInstanceDestroy, "nvmlGpuInstanceDestroy", context);
  dynmig::MutexLock lock(&mutate_mu_);
  Calls calls(*api_);
  auto dev = calls.Device(gpu, context);
  if (!dev.ok()) return dev.status();
  auto gi = calls.Gi(*dev, gi_id, context);
  if (!gi.ok()) return gi.status();
  return Check(api_->GpuInstanceDestroy(*gi), context);
}

absl::StatusOr<ComputeInstanceInfo> DlopenNvml::CreateComputeInstance(uint32_t gpu,
                                                                      uint32_t gi_id) {
  const std::string context =
      fmt::format("create compute instance in GPU instance {} on GPU {}", gi_id, gpu);
  DYNMIG_NVML_REQUIRE_FN(GpuInstanceGetComputeInstanceProfileInfo,
                         "nvmlGpuInstanceGetComputeInstanceProfileInfo", context);
  DYNMIG_NVML_REQUIRE_FN(GpuInstanceCreateComputeInstance, "nvmlGpuInstanceCreateComputeInstance",
                         context);
  dynmig::MutexLock lock(&mutate_mu_);
  Calls calls(*api_);
  auto dev = calls.Device(gpu, context);
  if (!dev.ok()) return dev.status();
  auto gi = calls.Gi(*dev, gi_id, context);
  if (!gi.ok()) return gi.status();
  // The full CI: the supported CI profile with the most compute slices (engine profile SHARED).
  std::optional<nvmlComputeInstanceProfileInfo_t> full;
  for (uint32_t index = 0; index < kComputeInstanceProfileCount; ++index) {
    nvmlComputeInstanceProfileInfo_t info{};
    const int rc = api_->GpuInstanceGetComputeInstanceProfileInfo(*gi, index, 0, &info);
    if (rc == kInvalidArgument) break;
    if (rc == kNotSupported) continue;
    if (auto st = Check(rc, context); !st.ok()) return st;
    if (!full.has_value() || info.sliceCount > full->sliceCount) full = info;
  }
  if (!full.has_value()) {
    return NvmlStatus(
        NvmlReturn::kNotSupported,
        fmt::format("{}: the GPU instance offers no compute instance profile", context));
  }
  nvmlComputeInstance_t ci = nullptr;
  if (auto st = Check(api_->GpuInstanceCreateComputeInstance(*gi, full->id, &ci), context);
      !st.ok()) {
    return st;
  }
  return calls.CiInfo(gpu, *dev, gi_id, ci, context);
}

absl::StatusOr<std::vector<ComputeInstanceInfo>> DlopenNvml::ListComputeInstances(uint32_t gpu,
                                                                                  uint32_t gi_id) {
  const std::string context =
      fmt::format("list compute instances of GPU instance {} on GPU {}", gi_id, gpu);
  DYNMIG_NVML_REQUIRE_FN(GpuInstanceGetComputeInstanceProfileInfo,
                         "nvmlGpuInstanceGetComputeInstanceProfileInfo", context);
  DYNMIG_NVML_REQUIRE_FN(GpuInstanceGetComputeInstances, "nvmlGpuInstanceGetComputeInstances",
                         context);
  Calls calls(*api_);
  auto dev = calls.Device(gpu, context);
  if (!dev.ok()) return dev.status();
  auto gi = calls.Gi(*dev, gi_id, context);
  if (!gi.ok()) return gi.status();
  std::vector<ComputeInstanceInfo> out;
  std::vector<uint32_t> seen_ids;
  for (uint32_t index = 0; index < kComputeInstanceProfileCount; ++index) {
    nvmlComputeInstanceProfileInfo_t profile{};
    const int rc = api_->GpuInstanceGetComputeInstanceProfileInfo(*gi, index, 0, &profile);
    if (rc == kInvalidArgument) break;
    if (rc == kNotSupported) continue;
    if (auto st = Check(rc, context); !st.ok()) return st;
    if (std::find(seen_ids.begin(), seen_ids.end(), profile.id) != seen_ids.end()) continue;
    seen_ids.push_back(profile.id);
    std::vector<nvmlComputeInstance_t> handles(std::max(profile.instanceCount, 1u));
    unsigned int count = static_cast<unsigned int>(handles.size());
    if (auto st = Check(
            api_->GpuInstanceGetComputeInstances(*gi, profile.id, handles.data(), &count), context);
        !st.ok()) {
      return st;
    }
    for (unsigned int i = 0; i < count && i < handles.size(); ++i) {
      auto info = calls.CiInfo(gpu, *dev, gi_id, handles[i], context);
      if (!info.ok()) return info.status();
      out.push_back(std::move(*info));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const ComputeInstanceInfo& a, const ComputeInstanceInfo& b) { return a.id < b.id; });
  return out;
}

absl::StatusOr<std::string> DlopenNvml::GetMigDeviceUuid(uint32_t gpu, uint32_t gi_id,
                                                         uint32_t ci_id) {
  const std::string context =
      fmt::format("get MIG device UUID of GPU {} GI {} CI {}", gpu, gi_id, ci_id);
  Calls calls(*api_);
  auto dev = calls.Device(gpu, context);
  if (!dev.ok()) return dev.status();
  auto gi = calls.Gi(*dev, gi_id, context);
  if (!gi.ok()) return gi.status();
  auto ci = calls.Ci(*gi, gi_id, ci_id, context);
  if (!ci.ok()) return ci.status();
  auto info = calls.CiInfo(gpu, *dev, gi_id, *ci, context);
  if (!info.ok()) return info.status();
  return info->mig_uuid;
}

absl::Status DlopenNvml::DestroyComputeInstance(uint32_t gpu, uint32_t gi_id, uint32_t ci_id) {
  const std::string context =
      fmt::format("destroy compute instance {} of GPU instance {} on GPU {}", ci_id, gi_id, gpu);
  DYNMIG_NVML_REQUIRE_FN(ComputeInstanceDestroy, "nvmlComputeInstanceDestroy", context);
  dynmig::MutexLock lock(&mutate_mu_);
  Calls calls(*api_);
  auto dev = calls.Device(gpu, context);
  if (!dev.ok()) return dev.status();
  auto gi = calls.Gi(*dev, gi_id, context);
  if (!gi.ok()) return gi.status();
  auto ci = calls.Ci(*gi, gi_id, ci_id, context);
  if (!ci.ok()) return ci.status();
  return Check(api_->ComputeInstanceDestroy(*ci), context);
}

absl::StatusOr<std::vector<ProcessInfo>> DlopenNvml::GetComputeProcesses(uint32_t gpu) {
  const std::string context = fmt::format("get compute processes of GPU {}", gpu);
  Calls calls(*api_);
  auto dev = calls.Device(gpu, context);
  if (!dev.ok()) return dev.status();
  return calls.Processes(*dev, context);
}

absl::StatusOr<std::vector<ProcessInfo>> DlopenNvml::GetMigDeviceProcesses(uint32_t gpu,
                                                                           uint32_t gi_id,
                                                                           uint32_t ci_id) {
  const std::string context =
      fmt::format("get compute processes of GPU {} GI {} CI {}", gpu, gi_id, ci_id);
  Calls calls(*api_);
  auto dev = calls.Device(gpu, context);
  if (!dev.ok()) return dev.status();
  auto gi = calls.Gi(*dev, gi_id, context);
  if (!gi.ok()) return gi.status();
  auto ci = calls.Ci(*gi, gi_id, ci_id, context);
  if (!ci.ok()) return ci.status();
  auto mig = calls.MigHandle(*dev, gi_id, ci_id, context);
  if (!mig.ok()) return mig.status();
  auto procs = calls.Processes(*mig, context);
  if (!procs.ok()) return procs.status();
  for (auto& p : *procs) {
    p.gpu_instance_id = gi_id;
    p.compute_instance_id = ci_id;
  }
  return procs;
}

absl::StatusOr<MigMinors> DlopenNvml::GetMigMinors() {
  return MigMinors::Load(options_.mig_minors_path);
}

}  // namespace dynmig::nvml
