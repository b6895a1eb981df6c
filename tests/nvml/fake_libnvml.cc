// A stand-in for libnvidia-ml.so.1 that serves the NVML C ABI subset DlopenNvml uses from the
// test process's simulator (see fake_nvml_host.h). It lets the conformance suite run DlopenNvml's
// handle management, two-call buffer sizing, MIG-handle walk and return-code mapping on machines
// without a GPU. It follows NVML's documented behaviour, not a particular driver's quirks.
#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <tuple>

#include "fake_nvml_host.h"

namespace {

using dynmig::nvml::Nvml;
using dynmig::nvml::NvmlReturn;
using dynmig::nvml::testing::FakeNvmlHost;

enum class Kind { kGpu, kMig, kGi, kCi };

struct Handle {
  Kind kind;
  uint32_t gpu;
  uint32_t gi;
  uint32_t ci;
};

std::mutex g_mu;
int g_refcount = 0;
FakeNvmlHost* g_host = nullptr;
std::deque<Handle> g_handles;  // stable addresses; handles are reused by value

Handle* Intern(Kind kind, uint32_t gpu, uint32_t gi = 0, uint32_t ci = 0) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto& h : g_handles) {
    if (h.kind == kind && h.gpu == gpu && h.gi == gi && h.ci == ci) return &h;
  }
  g_handles.push_back(Handle{kind, gpu, gi, ci});
  return &g_handles.back();
}

Nvml* Host() { return g_host != nullptr ? g_host->nvml : nullptr; }

int Code(const absl::Status& st) {
  if (st.ok()) return 0;
  auto rc = g_host->return_of(st);
  return static_cast<int>(rc.value_or(NvmlReturn::kUnknown));
}

constexpr int kSuccess = 0;
constexpr int kUninitialized = 1;
constexpr int kInvalidArgument = 2;
constexpr int kNotSupported = 3;
constexpr int kNotFound = 6;
constexpr int kInsufficientSize = 7;
constexpr int kDriverNotLoaded = 9;

#define FAKE_REQUIRE_INIT() \
  if (Host() == nullptr) return kUninitialized

Handle* AsHandle(void* p) { return static_cast<Handle*>(p); }

void CopyString(const std::string& s, char* buf, unsigned int len) {
  if (len == 0) return;
  const size_t n = std::min<size_t>(s.size(), len - 1);
  std::memcpy(buf, s.data(), n);
  buf[n] = '\0';
}

// nvml.h layouts, the same subset dlopen_nvml.cc declares.
struct PciInfo {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
struct Memory {
  unsigned long long total, free, used;
};
struct ProcessInfo {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
};
struct Placement {
  unsigned int start, size;
};
struct GiProfileInfo {
  unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
      decoderCount, encoderCount, jpegCount, ofaCount;
  unsigned long long memorySizeMB;
};
struct GiInfo {
  void* device;
  unsigned int id, profileId;
  Placement placement;
};
struct CiProfileInfo {
  unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
      sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
};
struct CiInfo {
  void* device;
  void* gpuInstance;
  unsigned int id, profileId;
  Placement placement;
};

// Compute slices of a CI profile index (NVML_COMPUTE_INSTANCE_PROFILE_*), 0 = none.
uint32_t CiSlices(unsigned int index) {
  constexpr uint32_t kSlices[] = {1, 2, 3, 4, 7, 8, 6, 0, 0};
  return index < 9 ? kSlices[index] : 0;
}

// Compute slices of a GI (from its profile), or an NVML code.
int GiSlices(const Handle& gi, uint32_t* slices) {
  auto gis = Host()->ListGpuInstances(gi.gpu);
  if (!gis.ok()) return Code(gis.status());
  for (const auto& g : *gis) {
    if (g.id != gi.gi) continue;
    for (uint32_t index = 0; index < dynmig::nvml::kGpuInstanceProfileCount; ++index) {
      auto p = Host()->GetGpuInstanceProfileInfo(gi.gpu, index);
      if (p.ok() && p->id == g.profile_id) {
        *slices = p->slice_count;
        return kSuccess;
      }
    }
  }
  return kInvalidArgument;  // a stale handle
}

// The MIG devices of a GPU, ordered by (GI id, CI id).
int MigDevices(uint32_t gpu, std::vector<std::pair<uint32_t, uint32_t>>* out) {
  auto gis = Host()->ListGpuInstances(gpu);
  if (!gis.ok()) return Code(gis.status());
  for (const auto& gi : *gis) {
    auto cis = Host()->ListComputeInstances(gpu, gi.id);
    if (!cis.ok()) return Code(cis.status());
    for (const auto& ci : *cis) out->emplace_back(gi.id, ci.id);
  }
  return kSuccess;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int nvmlInit_v2() {
  using HostFn = FakeNvmlHost* (*)();
  auto fn = reinterpret_cast<HostFn>(dlsym(RTLD_DEFAULT, "DynmigFakeNvmlHost"));
  FakeNvmlHost* host = fn != nullptr ? fn() : nullptr;
  if (host == nullptr || host->nvml == nullptr || host->return_of == nullptr) {
    return kDriverNotLoaded;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  g_host = host;
  ++g_refcount;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlShutdown() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_refcount == 0) return kUninitialized;
  if (--g_refcount == 0) g_host = nullptr;
  return kSuccess;
}

__attribute__((visibility("default"))) const char* nvmlErrorString(int) { return "fake"; }

__attribute__((visibility("default"))) int nvmlSystemGetDriverVersion(char* buf, unsigned int len) {
  CopyString("fake-sim", buf, len);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetCount_v2(unsigned int* count) {
  FAKE_REQUIRE_INIT();
  auto n = Host()->DeviceCount();
  if (!n.ok()) return Code(n.status());
  *count = *n;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetHandleByIndex_v2(unsigned int index,
                                                                         void** device) {
  FAKE_REQUIRE_INIT();
  auto n = Host()->DeviceCount();
  if (!n.ok()) return Code(n.status());
  if (index >= *n) return kInvalidArgument;
  *device = Intern(Kind::kGpu, index);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetName(void* device, char* buf,
                                                             unsigned int len) {
  FAKE_REQUIRE_INIT();
  auto info = Host()->GetGpu(AsHandle(device)->gpu);
  if (!info.ok()) return Code(info.status());
  CopyString(info->name, buf, len);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetUUID(void* device, char* buf,
                                                             unsigned int len) {
  FAKE_REQUIRE_INIT();
  const Handle* h = AsHandle(device);
  if (h->kind == Kind::kMig) {
    auto uuid = Host()->GetMigDeviceUuid(h->gpu, h->gi, h->ci);
    if (!uuid.ok()) return Code(uuid.status());
    CopyString(*uuid, buf, len);
    return kSuccess;
  }
  auto info = Host()->GetGpu(h->gpu);
  if (!info.ok()) return Code(info.status());
  CopyString(info->uuid, buf, len);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetPciInfo_v3(void* device, PciInfo* pci) {
  FAKE_REQUIRE_INIT();
  auto info = Host()->GetGpu(AsHandle(device)->gpu);
  if (!info.ok()) return Code(info.status());
  std::memset(pci, 0, sizeof(*pci));
  CopyString(info->pci_bus_id, pci->busId, sizeof(pci->busId));
  CopyString(info->pci_bus_id.substr(4), pci->busIdLegacy, sizeof(pci->busIdLegacy));
  pci->pciDeviceId = info->pci_device_id;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetMinorNumber(void* device,
                                                                    unsigned int* minor) {
  FAKE_REQUIRE_INIT();
  auto info = Host()->GetGpu(AsHandle(device)->gpu);
  if (!info.ok()) return Code(info.status());
  *minor = info->minor;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetMemoryInfo(void* device, Memory* memory) {
  FAKE_REQUIRE_INIT();
  auto info = Host()->GetGpu(AsHandle(device)->gpu);
  if (!info.ok()) return Code(info.status());
  memory->total = info->total_memory_bytes;
  memory->used = 0;
  memory->free = info->total_memory_bytes;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetMigMode(void* device, unsigned int* current,
                                                                unsigned int* pending) {
  FAKE_REQUIRE_INIT();
  auto info = Host()->GetGpu(AsHandle(device)->gpu);
  if (!info.ok()) return Code(info.status());
  if (!info->mig.supported) return kNotSupported;
  *current = info->mig.current ? 1 : 0;
  *pending = info->mig.pending ? 1 : 0;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceSetMigMode(void* device, unsigned int mode,
                                                                int* activation_status) {
  FAKE_REQUIRE_INIT();
  if (mode > 1 || activation_status == nullptr) return kInvalidArgument;
  auto change = Host()->SetMigMode(AsHandle(device)->gpu, mode == 1);
  if (!change.ok()) return Code(change.status());
  *activation_status = static_cast<int>(change->activation);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetGpuInstanceProfileInfo(
    void* device, unsigned int profile, GiProfileInfo* info) {
  FAKE_REQUIRE_INIT();
  auto p = Host()->GetGpuInstanceProfileInfo(AsHandle(device)->gpu, profile);
  if (!p.ok()) return Code(p.status());
  *info = GiProfileInfo{
      p->id,           0,           p->slice_count, p->instance_count, p->multiprocessor_count,
      p->copy_engines, p->decoders, p->encoders,    p->jpegs,          p->ofas,
      p->memory_mib};
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    void* device, unsigned int profile_id, Placement* placements, unsigned int* count) {
  FAKE_REQUIRE_INIT();
  auto p = Host()->GetGpuInstancePossiblePlacements(AsHandle(device)->gpu, profile_id);
  if (!p.ok()) return Code(p.status());
  if (placements == nullptr) {
    *count = static_cast<unsigned int>(p->size());
    return kSuccess;
  }
  if (*count < p->size()) {
    *count = static_cast<unsigned int>(p->size());
    return kInsufficientSize;
  }
  for (size_t i = 0; i < p->size(); ++i) placements[i] = Placement{(*p)[i].start, (*p)[i].size};
  *count = static_cast<unsigned int>(p->size());
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceCreateGpuInstanceWithPlacement(
    void* device, unsigned int profile_id, const Placement* placement, void** gpu_instance) {
  FAKE_REQUIRE_INIT();
  const uint32_t gpu = AsHandle(device)->gpu;
  auto gi = Host()->CreateGpuInstance(gpu, profile_id, {placement->start, placement->size});
  if (!gi.ok()) return Code(gi.status());
  *gpu_instance = Intern(Kind::kGi, gpu, gi->id);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlGpuInstanceGetInfo(void* gpu_instance,
                                                                  GiInfo* info) {
  FAKE_REQUIRE_INIT();
  const Handle* h = AsHandle(gpu_instance);
  auto gis = Host()->ListGpuInstances(h->gpu);
  if (!gis.ok()) return Code(gis.status());
  for (const auto& g : *gis) {
    if (g.id != h->gi) continue;
    *info = GiInfo{Intern(Kind::kGpu, h->gpu), g.id, g.profile_id,
                   Placement{g.placement.start, g.placement.size}};
    return kSuccess;
  }
  return kInvalidArgument;
}

__attribute__((visibility("default"))) int nvmlDeviceGetGpuInstances(void* device,
                                                                     unsigned int profile_id,
                                                                     void** gpu_instances,
                                                                     unsigned int* count) {
  FAKE_REQUIRE_INIT();
  const uint32_t gpu = AsHandle(device)->gpu;
  auto gis = Host()->ListGpuInstances(gpu);
  if (!gis.ok()) return Code(gis.status());
  std::vector<uint32_t> ids;
  for (const auto& g : *gis) {
    if (g.profile_id == profile_id) ids.push_back(g.id);
  }
  if (*count < ids.size()) return kInsufficientSize;
  for (size_t i = 0; i < ids.size(); ++i) gpu_instances[i] = Intern(Kind::kGi, gpu, ids[i]);
  *count = static_cast<unsigned int>(ids.size());
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetGpuInstanceById(void* device,
                                                                        unsigned int id,
                                                                        void** gpu_instance) {
  FAKE_REQUIRE_INIT();
  const uint32_t gpu = AsHandle(device)->gpu;
  auto gis = Host()->ListGpuInstances(gpu);
  if (!gis.ok()) return Code(gis.status());
  for (const auto& g : *gis) {
    if (g.id == id) {
      *gpu_instance = Intern(Kind::kGi, gpu, id);
      return kSuccess;
    }
  }
  return kNotFound;
}

__attribute__((visibility("default"))) int nvmlGpuInstanceDestroy(void* gpu_instance) {
  FAKE_REQUIRE_INIT();
  const Handle* h = AsHandle(gpu_instance);
  return Code(Host()->DestroyGpuInstance(h->gpu, h->gi));
}

__attribute__((visibility("default"))) int nvmlGpuInstanceGetComputeInstanceProfileInfo(
    void* gpu_instance, unsigned int profile, unsigned int eng_profile, CiProfileInfo* info) {
  FAKE_REQUIRE_INIT();
  if (profile >= 9 || eng_profile != 0) return kInvalidArgument;
  uint32_t total = 0;
  if (int rc = GiSlices(*AsHandle(gpu_instance), &total); rc != kSuccess) return rc;
  const uint32_t slices = CiSlices(profile);
  if (slices == 0 || slices > total || (slices < total && 2 * slices > total + 1)) {
    return kNotSupported;
  }
  *info = CiProfileInfo{profile, slices, slices == total ? 1 : total / slices, 0, 0, 0, 0, 0, 0};
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlGpuInstanceCreateComputeInstance(
    void* gpu_instance, unsigned int profile_id, void** compute_instance) {
  FAKE_REQUIRE_INIT();
  const Handle* h = AsHandle(gpu_instance);
  uint32_t total = 0;
  if (int rc = GiSlices(*h, &total); rc != kSuccess) return rc;
  if (CiSlices(profile_id) != total) return kNotSupported;  // the fake makes full CIs only
  auto ci = Host()->CreateComputeInstance(h->gpu, h->gi);
  if (!ci.ok()) return Code(ci.status());
  *compute_instance = Intern(Kind::kCi, h->gpu, h->gi, ci->id);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlGpuInstanceGetComputeInstances(
    void* gpu_instance, unsigned int profile_id, void** compute_instances, unsigned int* count) {
  FAKE_REQUIRE_INIT();
  const Handle* h = AsHandle(gpu_instance);
  auto cis = Host()->ListComputeInstances(h->gpu, h->gi);
  if (!cis.ok()) return Code(cis.status());
  std::vector<uint32_t> ids;
  for (const auto& c : *cis) {
    if (c.profile_id == profile_id) ids.push_back(c.id);
  }
  if (*count < ids.size()) return kInsufficientSize;
  for (size_t i = 0; i < ids.size(); ++i) {
    compute_instances[i] = Intern(Kind::kCi, h->gpu, h->gi, ids[i]);
  }
  *count = static_cast<unsigned int>(ids.size());
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlGpuInstanceGetComputeInstanceById(
    void* gpu_instance, unsigned int id, void** compute_instance) {
  FAKE_REQUIRE_INIT();
  const Handle* h = AsHandle(gpu_instance);
  auto cis = Host()->ListComputeInstances(h->gpu, h->gi);
  if (!cis.ok()) return Code(cis.status());
  for (const auto& c : *cis) {
    if (c.id == id) {
      *compute_instance = Intern(Kind::kCi, h->gpu, h->gi, id);
      return kSuccess;
    }
  }
  return kNotFound;
}

__attribute__((visibility("default"))) int nvmlComputeInstanceGetInfo_v2(void* compute_instance,
                                                                         CiInfo* info) {
  FAKE_REQUIRE_INIT();
  const Handle* h = AsHandle(compute_instance);
  auto cis = Host()->ListComputeInstances(h->gpu, h->gi);
  if (!cis.ok()) return Code(cis.status());
  for (const auto& c : *cis) {
    if (c.id != h->ci) continue;
    // As NVIDIA's DRA driver relies on: `device` is the MIG device handle.
    *info = CiInfo{Intern(Kind::kMig, h->gpu, h->gi, h->ci), Intern(Kind::kGi, h->gpu, h->gi), c.id,
                   c.profile_id, Placement{c.placement.start, c.placement.size}};
    return kSuccess;
  }
  return kInvalidArgument;
}

__attribute__((visibility("default"))) int nvmlComputeInstanceDestroy(void* compute_instance) {
  FAKE_REQUIRE_INIT();
  const Handle* h = AsHandle(compute_instance);
  return Code(Host()->DestroyComputeInstance(h->gpu, h->gi, h->ci));
}

__attribute__((visibility("default"))) int nvmlDeviceGetMaxMigDeviceCount(void* device,
                                                                          unsigned int* count) {
  FAKE_REQUIRE_INIT();
  auto info = Host()->GetGpu(AsHandle(device)->gpu);
  if (!info.ok()) return Code(info.status());
  *count = info->mig.current ? 7 : 0;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetMigDeviceHandleByIndex(void* device,
                                                                               unsigned int index,
                                                                               void** mig_device) {
  FAKE_REQUIRE_INIT();
  const uint32_t gpu = AsHandle(device)->gpu;
  std::vector<std::pair<uint32_t, uint32_t>> migs;
  if (int rc = MigDevices(gpu, &migs); rc != kSuccess) return rc;
  if (index >= migs.size()) return kNotFound;
  *mig_device = Intern(Kind::kMig, gpu, migs[index].first, migs[index].second);
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetGpuInstanceId(void* device,
                                                                      unsigned int* id) {
  FAKE_REQUIRE_INIT();
  const Handle* h = AsHandle(device);
  if (h->kind != Kind::kMig) return kNotSupported;
  *id = h->gi;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetComputeInstanceId(void* device,
                                                                          unsigned int* id) {
  FAKE_REQUIRE_INIT();
  const Handle* h = AsHandle(device);
  if (h->kind != Kind::kMig) return kNotSupported;
  *id = h->ci;
  return kSuccess;
}

__attribute__((visibility("default"))) int nvmlDeviceGetComputeRunningProcesses_v3(
    void* device, unsigned int* count, ProcessInfo* infos) {
  FAKE_REQUIRE_INIT();
  const Handle* h = AsHandle(device);
  auto procs = h->kind == Kind::kMig ? Host()->GetMigDeviceProcesses(h->gpu, h->gi, h->ci)
                                     : Host()->GetComputeProcesses(h->gpu);
  if (!procs.ok()) return Code(procs.status());
  if (infos == nullptr || *count < procs->size()) {
    const bool fits = procs->empty();
    *count = static_cast<unsigned int>(procs->size());
    return fits ? kSuccess : kInsufficientSize;
  }
  for (size_t i = 0; i < procs->size(); ++i) {
    const auto& p = (*procs)[i];
    infos[i] = ProcessInfo{p.pid, p.used_memory_mib << 20, p.gpu_instance_id.value_or(0xFFFFFFFF),
                           p.compute_instance_id.value_or(0xFFFFFFFF)};
  }
  *count = static_cast<unsigned int>(procs->size());
  return kSuccess;
}

}  // extern "C"
