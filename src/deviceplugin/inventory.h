// Discovery: which GPUs of the node the device plugin exposes, with the exact NVML profile of each
// allowlisted name, and what it publishes in `hami.io/node-nvidia-register`.
//
// A GPU is exposed when its NVML name matches an allowlist entry (first match wins, substring) and
// NVML reports at least one of the entry's profiles by exact name (variants such as "1g.10gb+me"
// or "1g.20gb" are their own NVML profiles, never mapped by slice class). Allowlisted names the GPU
// lacks are listed in `missing_profiles`. GPUs of other models are not exposed. An exposed GPU is
// healthy while NVML answers for it and its MIG mode is enabled.
//
// Whole GPUs (issue 31, docs/mig-mode.md): with `nvidia.migModeSwitching` present and enabled, a
// GPU that MaySwitch (its NVML name, the node's labels) or that has no MIG at all and is
// allowlisted may be handed out whole: while its MIG mode is off (or it has no MIG) it is
// published as protocol::WholeGpuDeviceInfo (mode "hami-core") with one device ID, healthy when
// NVML reads it and no mode change is pending. While its MIG mode is on it is a MIG GPU as above.
// The mode is re-read every cycle (RefreshHealth). Without the key nothing of this applies: the
// register and the device list are exactly what they were. Pure value types.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "mig/allowlist.h"
#include "mig/profile.h"
#include "nvml/nvml.h"
#include "protocol/gpu_mode.h"
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
  // Exposed as a MIG GPU (allowlisted, at least one allowlisted profile): what `exposed` means
  // for a GPU that may not be whole. Set by discovery.
  bool mig_exposed = false;
  // May be handed out whole (see the header comment): `exposed` too. Set by discovery.
  bool may_be_whole = false;

  // How the GPU is published now: kWholeGpu when it may be whole and its MIG mode is off (or it
  // has no MIG), kMig when it is exposed as a MIG GPU otherwise; nullopt: not published.
  std::optional<protocol::GpuMode> Mode() const;
  bool Whole() const { return Mode() == protocol::GpuMode::kWholeGpu; }
  // Device IDs advertised now: 1 for a whole GPU, `replicas` for a MIG GPU, 0 when unpublished.
  uint32_t DeviceCount() const;

  const mig::ProfileSpec* FindAllowed(std::string_view name) const;
  // Any discovered profile (allowlisted or not) by NVML profile id; nullptr when unknown.
  const mig::ProfileSpec* FindById(uint32_t profile_id) const;
};

struct Inventory {
  std::vector<GpuEntry> gpus;  // every GPU of the node, by NVML index

  const GpuEntry* FindByUuid(std::string_view uuid) const;
  // The DeviceInfo list of the published GPUs (protocol::MigDeviceInfo, or
  // protocol::WholeGpuDeviceInfo for a whole GPU), health included.
  std::vector<protocol::DeviceInfo> RegisterDevices() const;
  // Equal capability and health (what ListAndWatch and the register annotation show).
  bool SameView(const Inventory& other) const;
};

// Which GPUs may be whole: device-config.yaml's nvidia.migModeSwitching and the node's labels
// (for its rules' nodeSelector). The default (switching off) publishes no whole GPU.
struct WholeGpuPolicy {
  protocol::MigModeSwitching switching;
  std::map<std::string, std::string, std::less<>> node_labels;

  // Whether a GPU named `nvml_name` (with MIG, or without: `mig_supported`) may be handed out
  // whole: switching enabled, and MaySwitch holds, or the GPU has no MIG and is allowlisted.
  bool MayBeWhole(std::string_view nvml_name, bool mig_supported,
                  const mig::Allowlist& allowlist) const;
};

// Discovers every GPU. Errors: NVML failing on DeviceCount (the node cannot be served). A GPU whose
// GetGpu or capability discovery fails is listed unhealthy (not exposed when its model is unknown,
// unless `policy` lets it be whole).
absl::StatusOr<Inventory> DiscoverInventory(nvml::Nvml& nvml, const mig::Allowlist& allowlist,
                                            const WholeGpuPolicy& policy = {});

// Discovers again, in place, the GPUs whose discovery failed on an NVML error, so that a transient
// error does not leave a GPU unserved (and its instances unmanaged) until the next restart.
// Returns whether any of them was discovered now.
bool RetryDiscovery(nvml::Nvml& nvml, const mig::Allowlist& allowlist, Inventory& inventory,
                    const WholeGpuPolicy& policy = {});

// Re-reads health (GetGpu: reachable, MIG mode enabled; for a GPU that may be whole, its MIG mode
// decides its Mode()) of every exposed GPU in place; returns whether any health or mode changed.
bool RefreshHealth(nvml::Nvml& nvml, Inventory& inventory);

// Device IDs of one GPU: "<uuid>::0" .. "<uuid>::<replicas-1>".
std::string ReplicaId(std::string_view gpu_uuid, uint32_t replica);
// The GPU UUID of a replica ID; "" when the ID does not have the "::<n>" form.
std::string GpuOfReplicaId(std::string_view device_id);

}  // namespace dynmig::deviceplugin
