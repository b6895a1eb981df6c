#include "deviceplugin/inventory.h"

#include <algorithm>
#include <charconv>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {
namespace {

// Health of a GPU that may be whole, from its MIG mode (gpu.info.mig, just read): usable in the
// mode it is in unless a change of mode is pending (Ampere keeps it pending until a GPU reset).
void SetWholeGpuHealth(GpuEntry& gpu) {
  const nvml::MigModeState& mig = gpu.info.mig;
  gpu.healthy = false;
  if (mig.supported && mig.current != mig.pending) {
    gpu.unhealthy_reason = fmt::format(
        "its MIG mode is {} and pending a change to {} (a GPU reset applies it): nothing is "
        "placed on it until the change is applied or taken back",
        mig.current ? "enabled" : "disabled", mig.pending ? "enabled" : "disabled");
  } else if (mig.supported && mig.current && !gpu.mig_exposed) {
    gpu.unhealthy_reason =
        "its MIG mode is enabled, but it offers no allowlisted MIG profile (not published)";
  } else {
    gpu.healthy = true;
    gpu.unhealthy_reason.clear();
  }
}

// Health of a GPU from its current NVML info.
void SetHealth(GpuEntry& gpu, const absl::StatusOr<nvml::GpuInfo>& info) {
  if (!info.ok()) {
    gpu.healthy = false;
    gpu.unhealthy_reason = fmt::format("NVML cannot read GPU {}: {}", gpu.info.index,
                                       std::string(info.status().message()));
    return;
  }
  gpu.info.mig = info->mig;
  if (gpu.may_be_whole) {
    SetWholeGpuHealth(gpu);
    return;
  }
  if (!info->mig.supported) {
    gpu.healthy = false;
    gpu.unhealthy_reason = "the GPU does not support MIG";
  } else if (!info->mig.current) {
    gpu.healthy = false;
    gpu.unhealthy_reason =
        info->mig.pending
            ? "MIG mode is enabled but pending a GPU reset, which dynmig does not do here: reset "
              "it"
            : "MIG mode is disabled and nvidia.migModeSwitching does not let dynmig switch this "
              "GPU: enable it (nvidia-smi -i <gpu> -mig 1) while the GPU is idle";
  } else {
    gpu.healthy = true;
    gpu.unhealthy_reason.clear();
  }
}

}  // namespace

const mig::ProfileSpec* GpuEntry::FindAllowed(std::string_view name) const {
  for (const auto& p : allowed) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

const mig::ProfileSpec* GpuEntry::FindById(uint32_t profile_id) const {
  for (const auto& p : capability.profiles) {
    if (p.nvml_id == profile_id) return &p;
  }
  return nullptr;
}

std::optional<protocol::GpuMode> GpuEntry::Mode() const {
  if (!exposed) return std::nullopt;
  if (may_be_whole && (!info.mig.supported || !info.mig.current)) {
    return protocol::GpuMode::kWholeGpu;
  }
  // A GPU that may be whole is a MIG GPU only with allowlisted profiles; any other exposed GPU is
  // one (discovery exposes it for them).
  if (may_be_whole && !mig_exposed) return std::nullopt;
  return protocol::GpuMode::kMig;
}

uint32_t GpuEntry::DeviceCount() const {
  const std::optional<protocol::GpuMode> mode = Mode();
  if (!mode.has_value()) return 0;
  return *mode == protocol::GpuMode::kWholeGpu ? 1 : replicas;
}

bool WholeGpuPolicy::MayBeWhole(std::string_view nvml_name, bool mig_supported,
                                const mig::Allowlist& allowlist) const {
  if (!switching.enabled) return false;
  if (switching.MaySwitch(nvml_name, node_labels)) return true;
  return !mig_supported && allowlist.Match(nvml_name) != nullptr;
}

const GpuEntry* Inventory::FindByUuid(std::string_view uuid) const {
  for (const auto& g : gpus) {
    if (g.info.uuid == uuid) return &g;
  }
  return nullptr;
}

std::vector<protocol::DeviceInfo> Inventory::RegisterDevices() const {
  std::vector<protocol::DeviceInfo> out;
  for (const auto& g : gpus) {
    const std::optional<protocol::GpuMode> mode = g.Mode();
    if (!mode.has_value()) continue;
    if (*mode == protocol::GpuMode::kWholeGpu) {
      out.push_back(protocol::WholeGpuDeviceInfo({g.info.uuid, g.info.index, 0, g.healthy},
                                                 g.info.name, g.info.total_memory_mib));
      continue;
    }
    std::vector<const mig::ProfileSpec*> allowed;
    for (const auto& p : g.allowed) allowed.push_back(&p);
    out.push_back(
        protocol::MigDeviceInfo({g.info.uuid, g.info.index, 0, g.healthy}, g.capability, allowed));
  }
  return out;
}

bool Inventory::SameView(const Inventory& other) const {
  return RegisterDevices() == other.RegisterDevices();
}

namespace {

// A GPU that may be whole but offers no MIG GPU: exposed as a whole GPU (published while its MIG
// mode is off, or always when it has no MIG).
GpuEntry ExposeWhole(GpuEntry gpu, bool quiet) {
  if (!quiet) {
    spdlog::info("discovery: GPU {} ({}, {}) may be handed out whole{}", gpu.info.index,
                 gpu.info.uuid, gpu.info.name,
                 gpu.not_exposed_reason.empty()
                     ? ""
                     : fmt::format(" (no MIG GPU: {})", gpu.not_exposed_reason));
  }
  gpu.not_exposed_reason.clear();
  gpu.exposed = true;
  SetWholeGpuHealth(gpu);
  return gpu;
}

// One GPU's discovery. `quiet`: an NVML failure is not logged (a retry of one already reported).
GpuEntry DiscoverGpu(nvml::Nvml& nvml, const mig::Allowlist& allowlist, uint32_t i, bool quiet,
                     const WholeGpuPolicy& policy) {
  GpuEntry gpu;
  gpu.info.index = i;
  auto info = nvml.GetGpu(i);
  if (!info.ok()) {
    gpu.not_exposed_reason =
        fmt::format("NVML cannot read GPU {}: {}", i, std::string(info.status().message()));
    gpu.discovery_failed = true;
    SetHealth(gpu, info);
    if (!quiet) spdlog::warn("discovery: {}", gpu.not_exposed_reason);
    return gpu;
  }
  gpu.info = *info;
  gpu.may_be_whole = policy.MayBeWhole(info->name, info->mig.supported, allowlist);
  const mig::AllowlistEntry* entry = allowlist.Match(info->name);
  if (entry == nullptr) {
    gpu.not_exposed_reason =
        fmt::format("model \"{}\" matches no migProfileAllowlist entry", info->name);
    if (gpu.may_be_whole) return ExposeWhole(std::move(gpu), quiet);
    spdlog::info("discovery: GPU {} ({}) not exposed: {}", i, info->uuid, gpu.not_exposed_reason);
    return gpu;
  }
  gpu.allowlisted = true;
  auto cap = nvml::DiscoverCapability(nvml, i);
  if (!cap.ok()) {
    gpu.not_exposed_reason = fmt::format("MIG capability of GPU {} ({}) cannot be discovered: {}",
                                         i, info->name, std::string(cap.status().message()));
    if (gpu.may_be_whole) {
      // A GPU with MIG is discovered again (its capability is needed once MIG mode is on).
      gpu.discovery_failed = info->mig.supported;
      return ExposeWhole(std::move(gpu), quiet);
    }
    gpu.discovery_failed = true;
    if (!quiet) spdlog::warn("discovery: {}", gpu.not_exposed_reason);
    return gpu;
  }
  gpu.capability = std::move(*cap);
  mig::AllowedProfiles allowed = mig::ApplyAllowlist(gpu.capability, *entry);
  for (const mig::ProfileSpec* p : allowed.profiles) {
    gpu.allowed.push_back(*p);
    gpu.replicas = std::max(gpu.replicas, p->instance_count);
  }
  gpu.missing_profiles = allowed.missing;
  if (!gpu.missing_profiles.empty()) {
    spdlog::warn("discovery: GPU {} ({}, {}) does not have allowlisted profile(s) {}", i,
                 info->uuid, info->name, fmt::join(gpu.missing_profiles, ", "));
  }
  if (gpu.allowed.empty()) {
    gpu.not_exposed_reason = fmt::format("none of the allowlisted profiles {} exists on {}",
                                         fmt::join(entry->profiles, ", "), info->name);
    spdlog::warn("discovery: GPU {} ({}) not exposed: {}", i, info->uuid, gpu.not_exposed_reason);
    if (gpu.may_be_whole) return ExposeWhole(std::move(gpu), quiet);
    return gpu;
  }
  gpu.exposed = true;
  gpu.mig_exposed = true;
  SetHealth(gpu, info);
  std::vector<std::string> names;
  for (const auto& p : gpu.allowed) {
    names.push_back(fmt::format("{} (id {}, {} MiB, {} placements)", p.name, p.nvml_id,
                                p.memory_mib, p.placements.size()));
  }
  spdlog::info("discovery: GPU {} ({}, {}) exposes {}{}{}", i, info->uuid, info->name,
               fmt::join(names, ", "), gpu.may_be_whole ? "; may be handed out whole" : "",
               gpu.healthy ? "" : fmt::format(" [unhealthy: {}]", gpu.unhealthy_reason));
  return gpu;
}

}  // namespace

absl::StatusOr<Inventory> DiscoverInventory(nvml::Nvml& nvml, const mig::Allowlist& allowlist,
                                            const WholeGpuPolicy& policy) {
  auto count = nvml.DeviceCount();
  if (!count.ok()) return count.status();
  Inventory inv;
  for (uint32_t i = 0; i < *count; ++i)
    inv.gpus.push_back(DiscoverGpu(nvml, allowlist, i, false, policy));
  return inv;
}

bool RetryDiscovery(nvml::Nvml& nvml, const mig::Allowlist& allowlist, Inventory& inventory,
                    const WholeGpuPolicy& policy) {
  bool changed = false;
  for (auto& gpu : inventory.gpus) {
    if (!gpu.discovery_failed) continue;
    GpuEntry again = DiscoverGpu(nvml, allowlist, gpu.info.index, /*quiet=*/true, policy);
    if (again.discovery_failed) continue;
    gpu = std::move(again);
    changed = true;
  }
  return changed;
}

bool RefreshHealth(nvml::Nvml& nvml, Inventory& inventory) {
  bool changed = false;
  for (auto& gpu : inventory.gpus) {
    if (!gpu.exposed) continue;
    const bool was = gpu.healthy;
    const std::optional<protocol::GpuMode> mode = gpu.Mode();
    SetHealth(gpu, nvml.GetGpu(gpu.info.index));
    if (mode != gpu.Mode()) {
      changed = true;
      const auto name = [](std::optional<protocol::GpuMode> m) {
        return m.has_value() ? std::string(protocol::GpuModeName(*m)) : std::string("unpublished");
      };
      spdlog::info("GPU {} ({}) is now published as {} (was {})", gpu.info.index, gpu.info.uuid,
                   name(gpu.Mode()), name(mode));
    }
    if (was != gpu.healthy) {
      changed = true;
      if (gpu.healthy) {
        spdlog::info("GPU {} ({}) is healthy again", gpu.info.index, gpu.info.uuid);
      } else {
        spdlog::warn("GPU {} ({}) is unhealthy: {}", gpu.info.index, gpu.info.uuid,
                     gpu.unhealthy_reason);
      }
    }
  }
  return changed;
}

std::string ReplicaId(std::string_view gpu_uuid, uint32_t replica) {
  return fmt::format("{}::{}", gpu_uuid, replica);
}

std::string GpuOfReplicaId(std::string_view device_id) {
  const size_t pos = device_id.rfind("::");
  if (pos == std::string_view::npos || pos == 0 || pos + 2 >= device_id.size()) return "";
  const std::string_view n = device_id.substr(pos + 2);
  uint32_t value = 0;
  auto [ptr, ec] = std::from_chars(n.data(), n.data() + n.size(), value);
  if (ec != std::errc() || ptr != n.data() + n.size()) return "";
  return std::string(device_id.substr(0, pos));
}

}  // namespace dynmig::deviceplugin
