// The `hami.io/vgpu-devices-to-allocate` and `hami.io/vgpu-devices-allocated` Pod annotations.
//
// Per device `UUID,Type,Usedmem,Usedcores:`, and `;` after each container, init containers first;
// a container without devices is an empty segment, so the container index survives:
//   "GPU-a,NVIDIA A100-SXM4-40GB,4864,15:GPU-a,NVIDIA A100-SXM4-40GB,9856,29:;;"
// In MIG mode UUID is the physical GPU and Usedmem/Usedcores are the chosen profile's memoryMB and
// core. Also the legacy MIG identity `GPU-<uuid>[<template>-<slot>]` that pre-dynamic-MIG
// schedulers wrote as the UUID, which dynmig detects and refuses. Pure; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace dynmig::protocol {

struct ContainerDevice {
  std::string uuid;
  std::string type;
  int32_t used_mem_mib = 0;
  int32_t used_cores = 0;

  friend bool operator==(const ContainerDevice&, const ContainerDevice&) = default;
};

using ContainerDevices = std::vector<ContainerDevice>;
// Indexed by container: init containers first, then app containers.
using PodDevices = std::vector<ContainerDevices>;

// Decodes the annotation. Empty string: no containers. The trailing ';' after the last container
// does not add an empty container. Errors (kInvalidArgument) name the container and device
// ("container 1 device 0: ..."): a device without exactly four comma-separated fields, an empty
// UUID, a memory or core value that is not an integer in [0, 2^31).
absl::StatusOr<PodDevices> DecodePodDevices(std::string_view value);

// Encodes; DecodePodDevices(EncodePodDevices(x)) == x. Errors (kInvalidArgument) name the container
// and device when a UUID or type contains one of the separators ',', ':' or ';', a UUID is empty,
// or a value is negative.
absl::StatusOr<std::string> EncodePodDevices(const PodDevices& devices);

// The legacy MIG identity `GPU-<uuid>[<template>-<slot>]`.
struct LegacyMigIdentity {
  std::string gpu_uuid;  // "GPU-<uuid>" without the suffix
  uint32_t template_index = 0;
  uint32_t slot_index = 0;
};

// Whether `id` ends in a `[<t>-<s>]` suffix with two non-negative integers after a non-empty UUID.
bool IsLegacyMigIdentity(std::string_view id);
// Parses it; nullopt when IsLegacyMigIdentity(id) is false.
std::optional<LegacyMigIdentity> ParseLegacyMigIdentity(std::string_view id);

// The GPU UUIDs ("GPU-" followed by letters, digits and dashes, standing alone) that the text of
// a device list or allocations value names, each once in order of appearance, read without
// decoding: for a value its decoder refuses, to fail closed on exactly the GPUs it names.
std::vector<std::string> GpuUuidsNamedIn(std::string_view text);

// NVIDIA's device plugin with the mixed MIG strategy: one extended resource per MIG profile,
// "nvidia.com/mig-<profile>" (kMigResourcePrefix), whose devices are MIG UUIDs.
// The resource of `profile`; nullopt when it would not be a valid resource name (the part after
// the '/' must be at most 63 of [A-Za-z0-9-_.], alphanumeric at both ends: "+me" profiles have
// none).
std::optional<std::string> MigResourceName(std::string_view profile);
// The profile such a resource stands for ("1g.10gb" of "nvidia.com/mig-1g.10gb"); nullopt for any
// other name, or nothing after the prefix.
std::optional<std::string> MigResourceProfile(std::string_view resource);

// The environment variable through which the NVIDIA Container Toolkit gives a container its
// devices: comma-separated GPU or MIG UUIDs, indices, "all", "none"/"void".
inline constexpr std::string_view kVisibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES";

}  // namespace dynmig::protocol
