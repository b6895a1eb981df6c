#include "deviceplugin/hami_standin.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <tuple>

#include "deviceplugin/nvidia_standin.h"
#include "deviceplugin/pods.h"
#include "fmt/format.h"
#include "mig/geometry.h"
#include "protocol/annotations.h"

namespace dynmig::deviceplugin {
namespace {

constexpr size_t kMaxSkippedNamed = 8;

// "1700000000" -> 1700000000; nullopt unless the whole text is a non-negative decimal number.
std::optional<int64_t> UnixSeconds(std::string_view text) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || v < 0) {
    return std::nullopt;
  }
  return v;
}

// The pod's annotation `key`, bounded: nullopt when absent; an error when too long.
absl::StatusOr<std::optional<std::string>> Bounded(const kube::Object& pod, std::string_view key) {
  auto v = kube::Annotation(pod, key);
  if (v.has_value() && v->size() > kMaxHamiAnnotationBytes) {
    return absl::InvalidArgumentError(
        fmt::format("{} is {} bytes; at most {}", key, v->size(), kMaxHamiAnnotationBytes));
  }
  return v;
}

struct Candidate {
  int64_t bind_time = 0;
  HamiPending pending;
};

// Why `pod`, which says it is being allocated on `node`, is not the pod an Allocate is for; or its
// candidate entry.
absl::StatusOr<Candidate> Check(const kube::Object& pod, std::string_view node) {
  auto bind_time = Bounded(pod, protocol::kBindTimeAnnotation);
  if (!bind_time.ok()) return bind_time.status();
  auto to_allocate = Bounded(pod, protocol::kDevicesToAllocateAnnotation);
  if (!to_allocate.ok()) return to_allocate.status();
  if (kube::NodeName(pod) != node) {
    return absl::FailedPreconditionError(fmt::format("it is not bound to {}", node));
  }
  if (!IsActive(pod)) return absl::FailedPreconditionError("it is terminated or being deleted");
  if (!bind_time->has_value()) {
    return absl::InvalidArgumentError(fmt::format("no {}", protocol::kBindTimeAnnotation));
  }
  const auto t = UnixSeconds(**bind_time);
  if (!t.has_value()) {
    return absl::InvalidArgumentError(fmt::format("{} \"{}\" is not a number of seconds",
                                                  protocol::kBindTimeAnnotation,
                                                  bind_time->value().substr(0, 32)));
  }
  if (!to_allocate->has_value()) {
    return absl::InvalidArgumentError(fmt::format("no {}", protocol::kDevicesToAllocateAnnotation));
  }
  auto devices = protocol::DecodePodDevices(**to_allocate);
  if (!devices.ok()) {
    return absl::InvalidArgumentError(fmt::format("{}: {}", protocol::kDevicesToAllocateAnnotation,
                                                  std::string(devices.status().message())));
  }
  Candidate c;
  c.bind_time = *t;
  c.pending.ns = kube::Namespace(pod);
  c.pending.name = kube::Name(pod);
  c.pending.uid = kube::Uid(pod);
  int next = -1;
  for (size_t i = 0; i < devices->size(); ++i) {
    if ((*devices)[i].size() > kMaxStandinIdsPerContainer) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: container {} lists {} devices; at most {}", protocol::kDevicesToAllocateAnnotation,
          i, (*devices)[i].size(), kMaxStandinIdsPerContainer));
    }
    if (next < 0 && !(*devices)[i].empty()) next = static_cast<int>(i);
  }
  if (next < 0) {
    return absl::FailedPreconditionError(
        fmt::format("{} has no container left", protocol::kDevicesToAllocateAnnotation));
  }
  c.pending.container = next;
  c.pending.devices = (*devices)[next];
  c.pending.rest = std::move(*devices);
  c.pending.rest[next].clear();
  c.pending.last = std::all_of(c.pending.rest.begin(), c.pending.rest.end(),
                               [](const auto& d) { return d.empty(); });
  return c;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> HamiDeviceIds(nvml::Nvml& nvml, int split_count) {
  auto count = nvml.DeviceCount();
  if (!count.ok()) return count.status();
  std::vector<std::string> out;
  for (uint32_t gpu = 0; gpu < *count; ++gpu) {
    auto info = nvml.GetGpu(gpu);
    if (!info.ok()) return info.status();
    if (!info->mig.supported || !info->mig.current) continue;
    for (int i = 0; i < split_count; ++i) out.push_back(fmt::format("{}-{}", info->uuid, i));
  }
  return out;
}

absl::StatusOr<HamiPending> FindHamiPendingPod(const std::vector<kube::Object>& pods,
                                               std::string_view node) {
  std::optional<Candidate> best;
  std::vector<std::string> skipped;
  size_t skipped_count = 0;
  for (const auto& pod : pods) {
    // Only the pods that say so are looked at; bind-phase and vgpu-node are compared, not parsed.
    if (kube::Annotation(pod, protocol::kBindPhaseAnnotation) != protocol::kBindPhaseAllocating ||
        kube::Annotation(pod, protocol::kVgpuNodeAnnotation) != node) {
      continue;
    }
    auto c = Check(pod, node);
    if (!c.ok()) {
      if (skipped.size() < kMaxSkippedNamed) {
        skipped.push_back(fmt::format("{}/{}: {}", kube::Namespace(pod), kube::Name(pod),
                                      std::string(c.status().message())));
      }
      ++skipped_count;
      continue;
    }
    if (!best.has_value() || std::tie(c->bind_time, c->pending.ns, c->pending.name) <
                                 std::tie(best->bind_time, best->pending.ns, best->pending.name)) {
      best = std::move(*c);
    }
  }
  if (best.has_value()) return std::move(best->pending);
  std::string why = fmt::format(
      "no pod is being allocated on node {} ({}={}, {}={}, {} with a "
      "container left)",
      node, protocol::kBindPhaseAnnotation, protocol::kBindPhaseAllocating,
      protocol::kVgpuNodeAnnotation, node, protocol::kDevicesToAllocateAnnotation);
  if (!skipped.empty()) {
    why += fmt::format("; skipped: {}", fmt::join(skipped, "; "));
    if (skipped_count > skipped.size()) {
      why += fmt::format(" and {} more", skipped_count - skipped.size());
    }
  }
  return absl::FailedPreconditionError(why);
}

absl::StatusOr<HamiMigDevice> HamiLegacyMigDevice(
    nvml::Nvml& nvml, const std::vector<mig::LegacyGeometryEntry>& geometries,
    std::string_view id) {
  if (id.size() > kMaxStandinIdBytes) {
    return absl::InvalidArgumentError(fmt::format("device {}... is {} bytes; at most {}",
                                                  id.substr(0, 32), id.size(), kMaxStandinIdBytes));
  }
  const auto legacy = protocol::ParseLegacyMigIdentity(id);
  if (!legacy.has_value()) {
    return absl::InvalidArgumentError(fmt::format(
        "device \"{}\" is not a legacy MIG identity GPU-<uuid>[<template>-<slot>]", id));
  }
  auto count = nvml.DeviceCount();
  if (!count.ok()) return count.status();
  std::optional<nvml::GpuInfo> gpu;
  for (uint32_t i = 0; i < *count && !gpu.has_value(); ++i) {
    auto info = nvml.GetGpu(i);
    if (!info.ok()) return info.status();
    if (info->uuid == legacy->gpu_uuid) gpu = *std::move(info);
  }
  if (!gpu.has_value()) {
    return absl::NotFoundError(
        fmt::format("device {}: no GPU {} on this node", id, legacy->gpu_uuid));
  }
  if (!gpu->mig.supported || !gpu->mig.current) {
    return absl::FailedPreconditionError(
        fmt::format("device {}: GPU {} does not have MIG mode on", id, gpu->index));
  }
  auto spec = mig::SelectLegacyGeometry(geometries, gpu->name, legacy->template_index);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(),
                        fmt::format("device {}: {}", id, std::string(spec.status().message())));
  }
  auto profiles = nvml::DiscoverProfiles(nvml, gpu->index);
  if (!profiles.ok()) return profiles.status();
  auto gis = nvml.ListGpuInstances(gpu->index);
  if (!gis.ok()) return gis.status();
  std::sort(gis->begin(), gis->end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  // The layout, by profile name, and the MIG devices in the driver's index order.
  std::map<std::string, uint32_t> have;
  std::vector<std::pair<std::string, std::string>> devices;  // (MIG UUID, profile)
  for (const auto& gi : *gis) {
    const auto p = std::find_if(profiles->begin(), profiles->end(),
                                [&](const auto& x) { return x.nvml_id == gi.profile_id; });
    const std::string name =
        p == profiles->end() ? fmt::format("profile {}", gi.profile_id) : p->name;
    ++have[name];
    auto cis = nvml.ListComputeInstances(gpu->index, gi.id);
    if (!cis.ok()) return cis.status();
    std::sort(cis->begin(), cis->end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    for (const auto& ci : *cis) devices.emplace_back(ci.mig_uuid, name);
  }
  std::map<std::string, uint32_t> want;
  std::vector<std::string> flattened;  // HAMi's usage list: each template `count` times, in order
  for (const auto& [name, n] : spec->counts) {
    want[name] += n;
    for (uint32_t k = 0; k < n; ++k) flattened.push_back(name);
  }
  if (have != want) {
    std::vector<std::string> now;
    for (const auto& [name, n] : have) now.push_back(fmt::format("{}={}", name, n));
    return absl::FailedPreconditionError(fmt::format(
        "device {}: GPU {} is laid out as {{{}}}, not as legacy geometry {} ({}); HAMi's plugin "
        "would re-apply the geometry with mig-parted, which this stand-in never does",
        id, gpu->index, fmt::join(now, ","), legacy->template_index, spec->ToString()));
  }
  if (legacy->slot_index >= devices.size()) {
    return absl::NotFoundError(fmt::format("device {}: GPU {} has no MIG device at index {} ({})",
                                           id, gpu->index, legacy->slot_index, devices.size()));
  }
  HamiMigDevice out;
  out.mig_uuid = devices[legacy->slot_index].first;
  out.profile = devices[legacy->slot_index].second;
  if (legacy->slot_index < flattened.size()) out.template_profile = flattened[legacy->slot_index];
  return out;
}

}  // namespace dynmig::deviceplugin
