#include "deviceplugin/pods.h"

#include <charconv>

#include "common/strings.h"
#include "fmt/format.h"
#include "protocol/annotations.h"
#include "protocol/gpu_mode.h"

namespace dynmig::deviceplugin {
namespace {

int64_t ParseUnix(const std::optional<std::string>& text) {
  if (!text.has_value()) return 0;
  const std::string_view t = Trim(*text);
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || ptr != t.data() + t.size()) return 0;
  return v;
}

// Adds the GPUs of a device annotation, leniently.
void AddDeviceGpus(std::string_view value, PodMig& out) {
  auto devices = protocol::DecodePodDevices(value);
  if (!devices.ok()) {
    out.gpus_unknown = true;
    return;
  }
  for (const auto& container : *devices) {
    for (const auto& d : container) {
      if (auto legacy = protocol::ParseLegacyMigIdentity(d.uuid)) {
        out.legacy = true;
        out.referenced_gpus.insert(legacy->gpu_uuid);
      } else {
        out.referenced_gpus.insert(d.uuid);
      }
    }
  }
}

// How many init containers the pod's spec lists (0 when it lists none or is malformed).
int InitContainerCount(const kube::Object& pod) {
  auto spec = pod.find("spec");
  if (spec == pod.end() || !spec->is_object()) return 0;
  auto init = spec->find("initContainers");
  if (init == spec->end() || !init->is_array()) return 0;
  return static_cast<int>(init->size());
}

}  // namespace

bool IsActive(const kube::Object& pod) {
  return !kube::IsTerminated(pod) && !kube::IsBeingDeleted(pod);
}

std::optional<protocol::NodeLock> NodeLockOf(const kube::Object& node) {
  const auto value = kube::Annotation(node, protocol::kNodeLockAnnotation);
  if (!value.has_value()) return std::nullopt;
  auto lock = protocol::ParseNodeLock(*value);
  if (!lock.ok()) return std::nullopt;
  return *std::move(lock);
}

bool PodMig::ContainerAllocated(int index) const {
  if (bind_phase == protocol::kBindPhaseSuccess) return true;
  // A failed bind leaves the container's devices in place: it was never realized.
  if (!has_to_allocate || !to_allocate.ok()) return false;
  return index < 0 || static_cast<size_t>(index) >= to_allocate->size() ||
         (*to_allocate)[index].empty();
}

int PodMig::NextContainer() const {
  if (!has_to_allocate || !to_allocate.ok()) return -1;
  for (size_t i = 0; i < to_allocate->size(); ++i) {
    if (!(*to_allocate)[i].empty()) return static_cast<int>(i);
  }
  return -1;
}

PodMig AnalyzePod(const kube::Object& pod) {
  PodMig m;
  m.pod = pod;
  m.uid = kube::Uid(pod);
  m.ns = kube::Namespace(pod);
  m.name = kube::Name(pod);
  m.key = m.ns + "/" + m.name;
  m.terminated = kube::IsTerminated(pod);
  m.deleting = kube::IsBeingDeleted(pod);
  m.active = !m.terminated && !m.deleting;
  m.bind_phase = kube::Annotation(pod, protocol::kBindPhaseAnnotation).value_or("");
  m.bind_time = ParseUnix(kube::Annotation(pod, protocol::kBindTimeAnnotation));
  m.vgpu_node = kube::Annotation(pod, protocol::kVgpuNodeAnnotation).value_or("");
  m.init_containers = InitContainerCount(pod);

  if (auto mode = protocol::PodGpuMode(pod); mode.ok() && *mode == protocol::GpuMode::kWholeGpu) {
    m.whole_gpu = true;
  }
  if (auto v = kube::Annotation(pod, protocol::kMigAllocationsAnnotation)) {
    m.relevant = true;
    m.has_allocations = true;
    m.allocations = protocol::DecodeMigAllocations(*v);
    if (m.allocations.ok()) {
      for (const auto& a : *m.allocations) m.referenced_gpus.insert(a.gpu_uuid);
    } else {
      m.unreadable = std::string(m.allocations.status().message());
      // The strict decoder refused it; still learn which GPUs it names, if it is JSON at all.
      protocol::ReferencedGpuSet named = protocol::ReferencedGpus(*v);
      m.referenced_gpus.merge(named.gpu_uuids);
      if (!named.complete) m.gpus_unknown = true;
    }
  }
  if (auto v = kube::Annotation(pod, protocol::kDevicesToAllocateAnnotation)) {
    m.relevant = true;
    m.has_to_allocate = true;
    m.to_allocate = protocol::DecodePodDevices(*v);
    AddDeviceGpus(*v, m);
  }
  if (auto v = kube::Annotation(pod, protocol::kDevicesAllocatedAnnotation)) {
    m.relevant = true;
    AddDeviceGpus(*v, m);
    if (!m.has_allocations && !m.referenced_gpus.empty() && !m.legacy && !m.whole_gpu) {
      m.unreadable =
          fmt::format("{} is missing although {} names GPUs", protocol::kMigAllocationsAnnotation,
                      protocol::kDevicesAllocatedAnnotation);
    }
  }
  if (m.unreadable.empty() && m.has_to_allocate && !m.to_allocate.ok()) {
    m.unreadable = std::string(m.to_allocate.status().message());
  }
  return m;
}

PendingPod FindPendingPod(const std::vector<PodMig>& pods, std::string_view node,
                          const std::optional<protocol::NodeLock>& lock,
                          std::string_view in_progress) {
  PendingPod out;
  auto claims = [&](const PodMig& p) {  // says it is being allocated here
    return p.active && p.NextContainer() >= 0 && p.bind_phase == protocol::kBindPhaseAllocating &&
           p.vgpu_node == node;
  };
  if (!in_progress.empty()) {
    for (const auto& p : pods) {
      if (p.uid == in_progress && claims(p) && (p.has_allocations || p.legacy || p.whole_gpu)) {
        out.pod = &p;
        out.in_progress = true;
      }
    }
  }
  const PodMig* owner = nullptr;
  if (lock.has_value()) {
    for (const auto& p : pods) {
      if (lock->OwnedBy(p.ns, p.name, p.uid)) owner = &p;
    }
  }
  if (out.pod == nullptr && owner != nullptr && owner->active && owner->NextContainer() >= 0) {
    std::string why;
    if (owner->vgpu_node != node) {
      why = fmt::format("the node lock names it, but {} is \"{}\"", protocol::kVgpuNodeAnnotation,
                        owner->vgpu_node);
    } else if (owner->bind_phase != protocol::kBindPhaseAllocating) {
      why = fmt::format("the node lock names it, but {} is \"{}\"", protocol::kBindPhaseAnnotation,
                        owner->bind_phase);
    } else if (!owner->has_allocations && !owner->legacy &&  // legacy: refused with the procedure
               !owner->whole_gpu) {
      why = fmt::format("the node lock names it, but it has no reservation ({})",
                        protocol::kMigAllocationsAnnotation);
    }
    if (why.empty()) {
      out.pod = owner;
    } else {
      out.mismatches.push_back({owner, std::move(why)});
    }
  }
  for (const auto& p : pods) {
    if (&p == out.pod || &p == owner || !claims(p)) continue;
    std::string why;
    if (!lock.has_value()) {
      why = fmt::format("the node lock ({}) is not held", protocol::kNodeLockAnnotation);
    } else {
      why =
          fmt::format("the node lock ({}) names {}", protocol::kNodeLockAnnotation, lock->Owner());
    }
    if (!p.has_allocations && !p.whole_gpu) {
      why += fmt::format(", and it has no reservation ({})", protocol::kMigAllocationsAnnotation);
    }
    out.mismatches.push_back({&p, std::move(why)});
  }
  return out;
}

}  // namespace dynmig::deviceplugin
