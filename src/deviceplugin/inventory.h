// Discovery: which GPUs of the node the device plugin exposes, with the exact NVML profile of each
// allowlisted name, and what it publishes in `hami.io/node-nvidia-register`.
//
// A GPU is exposed when its NVML name matches an allowlist entry (first match wins, substring) and
// NVML reports at least one of the entry's profiles by exact name (variants such as "1g.10gb+me"
// or "1g.20gb" are their own NVML profiles, never mapped by slice class). Allowlisted names the GPU
// lacks are listed in `missing_profiles`. GPUs of other models are not exposed. An exposed GPU is
// healthy while NVML answers for it and its MIG mode is enabled. Pure value types.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "mig/allowlist.h"
#include "mig/profile.h"
#include "nvml/nvml.h"
#include "protocol/node_register.h"

namespace dynmig::deviceplugin {

struct GpuEntry {
  nvml::GpuInfo info;
  bool allowlisted = false;  // the model matches an allowlist entry
  bool exposed = false;      // allowlisted and has at least one allowlisted profile
  std::string not_exposed_reason;
  mig::GpuCapability capability;              // every profile NVML reports
  std::vector<mig::ProfileSpec> allowed;      // the allowlisted ones, in capability order
  std::vector<std::string> missing_profiles;  // allowlisted names NVML does not report
  bool healthy = false;
  std::string unhealthy_reason;
  uint32_t replicas = 0;  // device IDs advertised: the largest instance count of `allowed`
  // NVML failed while discovering it (GetGpu or the MIG capability): RetryDiscovery tries again.
  bool discovery_failed = false;

  const mig::ProfileSpec* FindAllowed(std::string_view name) const;
  // Any discovered profile (allowlisted or not) by NVML profile id; nullptr when unknown.
  const mig::ProfileSpec* FindById(uint32_t profile_id) const;
};

struct Inventory {
  std::vector<GpuEntry> gpus;  // every GPU of the node, by NVML index

  const GpuEntry* FindByUuid(std::string_view uuid) const;
  // The DeviceInfo list of the exposed GPUs (protocol::MigDeviceInfo), health included.
  std::vector<protocol::DeviceInfo> RegisterDevices() const;
  // Equal capability and health (what ListAndWatch and the register annotation show).
  bool SameView(const Inventory& other) const;
};

// Discovers every GPU. Errors: NVML failing on DeviceCount (the node cannot be served). A GPU whose
// GetGpu or capability discovery fails is listed unhealthy (not exposed when its model is unknown).
absl::StatusOr<Inventory> DiscoverInventory(nvml::Nvml& nvml, const mig::Allowlist& allowlist);

// Discovers again, in place, the GPUs whose discovery failed on an NVML error, so that a transient
// error does not leave a GPU unserved (and its instances unmanaged) until the next restart.
// Returns whether any of them was discovered now.
bool RetryDiscovery(nvml::Nvml& nvml, const mig::Allowlist& allowlist, Inventory& inventory);

// Re-reads health (GetGpu: reachable, MIG mode enabled) of every exposed GPU in place; returns
// whether any health changed.
bool RefreshHealth(nvml::Nvml& nvml, Inventory& inventory);

// Device IDs of one GPU: "<uuid>::0" .. "<uuid>::<replicas-1>".
std::string ReplicaId(std::string_view gpu_uuid, uint32_t replica);
// The GPU UUID of a replica ID; "" when the ID does not have the "::<n>" form.
std::string GpuOfReplicaId(std::string_view device_id);

}  // namespace dynmig::deviceplugin
