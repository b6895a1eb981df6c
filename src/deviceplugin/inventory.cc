#include "deviceplugin/inventory.h"

#include <algorithm>
#include <charconv>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {
namespace {

// Health of a GPU from its current NVML info.
void SetHealth(GpuEntry& gpu, const absl::StatusOr<nvml::GpuInfo>& info) {
  if (!info.ok()) {
    gpu.healthy = false;
    gpu.unhealthy_reason = fmt::format("NVML cannot read GPU {}: {}", gpu.info.index,
                                       std::string(info.status().message()));
    return;
  }
  gpu.info.mig = info->mig;
  if (!info->mig.supported) {
    gpu.healthy = false;
    gpu.unhealthy_reason = "the GPU does not support MIG";
  } else if (!info->mig.current) {
    gpu.healthy = false;
    gpu.unhealthy_reason =
        info->mig.pending
            ? "MIG mode is enabled but pending a GPU reset; dynmig never resets a GPU: reset it"
            : "MIG mode is disabled; dynmig never toggles MIG mode: enable it (nvidia-smi -i "
              "<gpu> -mig 1) while the GPU is idle";
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

const GpuEntry* Inventory::FindByUuid(std::string_view uuid) const {
  for (const auto& g : gpus) {
    if (g.info.uuid == uuid) return &g;
  }
  return nullptr;
}

std::vector<protocol::DeviceInfo> Inventory::RegisterDevices() const {
  std::vector<protocol::DeviceInfo> out;
  for (const auto& g : gpus) {
    if (!g.exposed) continue;
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

// One GPU's discovery. `quiet`: an NVML failure is not logged (a retry of one already reported).
GpuEntry DiscoverGpu(nvml::Nvml& nvml, const mig::Allowlist& allowlist, uint32_t i, bool quiet) {
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
  const mig::AllowlistEntry* entry = allowlist.Match(info->name);
  if (entry == nullptr) {
    gpu.not_exposed_reason =
        fmt::format("model \"{}\" matches no migProfileAllowlist entry", info->name);
    spdlog::info("discovery: GPU {} ({}) not exposed: {}", i, info->uuid, gpu.not_exposed_reason);
    return gpu;
  }
  gpu.allowlisted = true;
  auto cap = nvml::DiscoverCapability(nvml, i);
  if (!cap.ok()) {
    gpu.not_exposed_reason = fmt::format("MIG capability of GPU {} ({}) cannot be discovered: {}",
                                         i, info->name, std::string(cap.status().message()));
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
    return gpu;
  }
  gpu.exposed = true;
  SetHealth(gpu, info);
  std::vector<std::string> names;
  for (const auto& p : gpu.allowed) {
    names.push_back(fmt::format("{} (id {}, {} MiB, {} placements)", p.name, p.nvml_id,
                                p.memory_mib, p.placements.size()));
  }
  spdlog::info("discovery: GPU {} ({}, {}) exposes {}{}", i, info->uuid, info->name,
               fmt::join(names, ", "),
               gpu.healthy ? "" : fmt::format(" [unhealthy: {}]", gpu.unhealthy_reason));
  return gpu;
}

}  // namespace

absl::StatusOr<Inventory> DiscoverInventory(nvml::Nvml& nvml, const mig::Allowlist& allowlist) {
  auto count = nvml.DeviceCount();
  if (!count.ok()) return count.status();
  Inventory inv;
  for (uint32_t i = 0; i < *count; ++i) inv.gpus.push_back(DiscoverGpu(nvml, allowlist, i, false));
  return inv;
}

bool RetryDiscovery(nvml::Nvml& nvml, const mig::Allowlist& allowlist, Inventory& inventory) {
  bool changed = false;
  for (auto& gpu : inventory.gpus) {
    if (!gpu.discovery_failed) continue;
    GpuEntry again = DiscoverGpu(nvml, allowlist, gpu.info.index, /*quiet=*/true);
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
    SetHealth(gpu, nvml.GetGpu(gpu.info.index));
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
