#include "scheduler/bind_guard.h"

#include <cstdlib>

#include "fmt/format.h"
#include "protocol/annotations.h"
#include "protocol/devices.h"
#include "protocol/gpu_mode.h"
#include "protocol/mig_allocations.h"

namespace dynmig::scheduler {
namespace {

std::string PodKey(const kube::Object& pod) {
  const std::string ns = kube::Namespace(pod);
  return (ns.empty() ? "default" : ns) + "/" + kube::Name(pod);
}

}  // namespace

std::optional<std::string> WholeGpuReservationNode(const kube::Object& pod) {
  const std::string node = kube::Annotation(pod, protocol::kVgpuNodeAnnotation).value_or("");
  if (node.empty() || kube::Annotation(pod, protocol::kMigAllocationsAnnotation).has_value()) {
    return std::nullopt;
  }
  auto mode = protocol::PodGpuMode(pod);
  if (!mode.ok() || *mode != protocol::GpuMode::kWholeGpu) return std::nullopt;
  auto devices = protocol::DecodePodDevices(
      kube::Annotation(pod, protocol::kDevicesAllocatedAnnotation).value_or(""));
  if (!devices.ok()) return std::nullopt;
  for (const auto& ctr : *devices) {
    if (!ctr.empty()) return node;
  }
  return std::nullopt;
}

std::optional<HeldReservation> AnnotatedReservation(const kube::Object& pod) {
  std::string node = kube::Annotation(pod, protocol::kVgpuNodeAnnotation).value_or("");
  const std::string allocations =
      kube::Annotation(pod, protocol::kMigAllocationsAnnotation).value_or("");
  if (auto whole = WholeGpuReservationNode(pod)) {
    node = *whole;
  } else {
    if (node.empty() || allocations.empty()) return std::nullopt;
    auto decoded = protocol::DecodeMigAllocations(allocations);
    if (!decoded.ok() || decoded->empty()) return std::nullopt;
  }
  HeldReservation held{.node = node, .made = std::nullopt};
  const std::string time_text = kube::Annotation(pod, protocol::kVgpuTimeAnnotation).value_or("");
  char* end = nullptr;
  const long long seconds = std::strtoll(time_text.c_str(), &end, 10);
  if (!time_text.empty() && end != nullptr && *end == '\0' && seconds > 0) {
    held.made = absl::FromUnixSeconds(seconds);
  }
  return held;
}

BindGuard::BindGuard(BindGuardOptions options, ReservationLookup lookup)
    : options_(std::move(options)), lookup_(std::move(lookup)) {
  if (!lookup_) lookup_ = AnnotatedReservation;
}

absl::Status BindGuard::CheckOurs(const kube::Object& pod) const {
  const std::string scheduler = kube::StringAt(pod, "/spec/schedulerName");
  if (scheduler != options_.scheduler_name) {
    return absl::PermissionDeniedError(fmt::format(
        "pod {} is not scheduled by {}: its spec.schedulerName is \"{}\"; this extender only "
        "reserves for and binds its own MIG pods",
        PodKey(pod), options_.scheduler_name, scheduler.empty() ? "default-scheduler" : scheduler));
  }
  if (options_.whole_gpu_pods && protocol::IsWholeGpuPod(pod, options_.resources)) {
    return absl::OkStatus();
  }
  if (!protocol::IsMigPod(pod, options_.resources)) {
    return absl::PermissionDeniedError(fmt::format(
        "pod {} is not a MIG pod (it requests no {} or asks for another hami.io/vgpu-mode); this "
        "extender only reserves for and binds MIG pods",
        PodKey(pod), options_.resources.count));
  }
  return absl::OkStatus();
}

absl::Status BindGuard::CheckFilter(const kube::Object& pod) const { return CheckOurs(pod); }

absl::Status BindGuard::CheckBind(const kube::Object& stored, const std::string& uid,
                                  const std::string& node, absl::Time now) const {
  const std::string key = PodKey(stored);
  if (uid.empty()) {
    return absl::InvalidArgumentError(fmt::format(
        "bind {}: PodUID is required (the uid of the pod kube-scheduler scheduled)", key));
  }
  if (kube::Uid(stored) != uid) {
    return absl::FailedPreconditionError(fmt::format(
        "bind {}: the pod has uid {}, not {} (recreated?)", key, kube::Uid(stored), uid));
  }
  if (absl::Status ours = CheckOurs(stored); !ours.ok()) {
    return absl::PermissionDeniedError(
        fmt::format("bind refused: {}", std::string(ours.message())));
  }
  if (const std::string bound_to = kube::NodeName(stored); !bound_to.empty()) {
    if (bound_to == node) return absl::OkStatus();  // a retried bind, already done
    return absl::FailedPreconditionError(
        fmt::format("bind {}: the pod is already bound to node {}", key, bound_to));
  }
  const std::optional<HeldReservation> held = lookup_(stored);
  if (!held.has_value()) {
    return absl::FailedPreconditionError(
        fmt::format("bind {}: the pod holds no MIG reservation of this extender "
                    "(hami.io/vgpu-mig-allocations); it must pass this extender's filter first",
                    key));
  }
  if (held->node != node) {
    return absl::FailedPreconditionError(fmt::format(
        "bind {}: the pod's MIG reservation is on node {}, not {}", key, held->node, node));
  }
  if (!held->made.has_value()) {
    return absl::FailedPreconditionError(fmt::format(
        "bind {}: the pod's MIG reservation on node {} has no readable reservation time "
        "(hami.io/vgpu-time); it must pass this extender's filter again",
        key, node));
  }
  if (*held->made + options_.reservation_ttl < now) {
    return absl::FailedPreconditionError(fmt::format(
        "bind {}: the pod's MIG reservation on node {} expired (made {}, the reservation TTL is "
        "{}); it must pass this extender's filter again",
        key, node, absl::FormatTime(absl::RFC3339_sec, *held->made, absl::UTCTimeZone()),
        absl::FormatDuration(options_.reservation_ttl)));
  }
  return absl::OkStatus();
}

}  // namespace dynmig::scheduler
