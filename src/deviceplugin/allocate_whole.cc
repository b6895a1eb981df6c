// The Allocator's whole-GPU path (allocator.h, docs/mig-mode.md): a whole-GPU pod's container gets
// whole GPUs whose MIG mode is off. The pod is identified exactly as a MIG pod is (IdentifyPod);
// then its reservation is validated (ValidateWholeGpu, allocate_plan.h), NVML confirms the GPU is
// whole and empty, the kubelet's answer names the GPU UUIDs, the container's entry leaves
// hami.io/vgpu-devices-to-allocate (bind-phase success when none is left) and the ledger records
// whom the GPUs went to, so PreStartContainer proves it as for MIG devices. Nothing is created, so
// nothing is rolled back or destroyed: a refusal fails the bind and leaves the GPU as it was.
#include <set>
#include <utility>

#include "common/status_macros.h"
#include "deviceplugin/allocator.h"
#include "deviceplugin/plugin_internal.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "protocol/annotations.h"
#include "protocol/devices.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {

absl::StatusOr<v1beta1::ContainerAllocateResponse> Allocator::AllocateWhole(
    const std::vector<std::string>& device_ids, const PodMig& pod, const std::vector<PodMig>& pods,
    std::string* result) {
  const int container = pod.NextContainer();
  WholeGpuPlanResult validated =
      ValidateWholeGpu(pod, container, device_ids.size(), View(), pods, ops_.ledger.Entries());
  if (!validated.ok()) return Refuse(pod, validated.reason, validated.status, result);
  const WholeGpuPlan& plan = validated.plan;
  std::vector<std::string> uuids;
  for (const GpuEntry* gpu : plan.gpus) {
    const std::string what =
        fmt::format("pod {} container {} (whole GPU {})", pod.key, plan.container, gpu->info.uuid);
    DYNMIG_RETURN_IF_ERROR(ConfirmWholeGpu(pod, what, *gpu, result));
    uuids.push_back(gpu->info.uuid);
  }
  auto answer = WholeAnswer(plan);
  if (!answer.ok()) {
    const absl::Status st = Annotate(answer.status(), fmt::format("pod {} container {}: prepare "
                                                                  "the container's devices",
                                                                  pod.key, plan.container));
    ops_.Event(&pod, "Warning", kReasonFailed, std::string(st.message()));
    FailPod(pod);
    return st;
  }
  bool done = false;
  if (auto st = ConsumeWholeReservation(pod, plan.container, &done); !st.ok()) {
    const absl::Status annotated =
        Annotate(st, fmt::format("pod {} container {}: write {}", pod.key, plan.container,
                                 protocol::kDevicesToAllocateAnnotation));
    ops_.Event(&pod, "Warning", kReasonFailed, std::string(annotated.message()));
    FailPod(pod);
    return annotated;
  }
  RecordLedger(device_ids, pod, plan.container, {}, uuids);
  ops_.PersistOrLog(fmt::format("allocating pod {}", pod.key));
  if (done) state_.in_progress.reset();
  ops_.Event(&pod, "Normal", kReasonWholeGpuAllocated,
             fmt::format("container {} got whole GPU(s) {} (MIG mode off, nothing created)",
                         plan.container, fmt::join(uuids, ",")));
  *result = "success";
  return answer;
}

absl::Status Allocator::ConfirmWholeGpu(const PodMig& pod, const std::string& what,
                                        const GpuEntry& gpu, std::string* result) {
  auto mode = ops_.nvml.GetMigMode(gpu.info.index);
  if (!mode.ok()) {
    ops_.Event(&pod, "Warning", kReasonFailed, std::string(mode.status().message()));
    FailPod(pod);
    return Annotate(mode.status(), what);
  }
  if (mode->supported && (mode->current || mode->pending)) {
    return Refuse(
        pod, "gpu_mode",
        absl::FailedPreconditionError(fmt::format(
            "{}: NVML says its MIG mode is {} (pending {}): not a whole GPU now", what,
            mode->current ? "enabled" : "disabled", mode->pending ? "enabled" : "disabled")),
        result);
  }
  if (!mode->supported) return absl::OkStatus();
  // With MIG mode off NVML lists no GPU instance (or refuses to list): any listed one is in the
  // way.
  if (auto gis = ops_.nvml.ListGpuInstances(gpu.info.index); gis.ok() && !gis->empty()) {
    return Refuse(pod, "placement_busy",
                  absl::FailedPreconditionError(
                      fmt::format("{}: NVML lists {} GPU instance(s) on it", what, gis->size())),
                  result);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> Allocator::WholeAnswer(
    const WholeGpuPlan& plan) {
  v1beta1::ContainerAllocateResponse response;
  std::vector<std::string> uuids;
  std::vector<std::string> paths;
  std::set<std::string> seen;
  // Simulated GPUs have no device node on the host: the container gets the environment only.
  const bool nodes = ops_.nvml.HasDeviceNodes();
  static constexpr std::string_view kControl[] = {"/dev/nvidiactl", "/dev/nvidia-uvm",
                                                  "/dev/nvidia-uvm-tools"};
  for (const GpuEntry* gpu : plan.gpus) {
    uuids.push_back(gpu->info.uuid);
    std::vector<std::string> gpu_nodes;
    if (nodes) {
      gpu_nodes.push_back(fmt::format("/dev/nvidia{}", gpu->info.minor));
      for (std::string_view c : kControl) gpu_nodes.emplace_back(c);
    }
    if (ops_.cdi.enabled()) {
      DYNMIG_RETURN_IF_ERROR(ops_.cdi.Write(gpu->info.uuid, gpu_nodes));
      response.add_cdi_devices()->set_name(CdiWriter::QualifiedName(gpu->info.uuid));
      continue;
    }
    for (auto& p : gpu_nodes) {
      if (seen.insert(p).second) paths.push_back(std::move(p));
    }
  }
  if (!ops_.cdi.enabled()) SetVisibleDevices(uuids, paths, response);
  return response;
}

absl::Status Allocator::ConsumeWholeReservation(const PodMig& pod, int container, bool* done) {
  for (int attempt = 0; attempt < ops_.options.annotation_attempts; ++attempt) {
    DYNMIG_ASSIGN_OR_RETURN(const kube::Object current, ops_.PodForAttempt(pod, attempt));
    if (kube::Annotation(current, protocol::kMigAllocationsAnnotation).has_value()) {
      return absl::FailedPreconditionError(fmt::format(
          "pod {} gained {} meanwhile: a pod gets whole GPUs or MIG devices, never both", pod.key,
          protocol::kMigAllocationsAnnotation));
    }
    auto devices = protocol::DecodePodDevices(
        kube::Annotation(current, protocol::kDevicesToAllocateAnnotation).value_or(""));
    if (!devices.ok()) {
      return absl::FailedPreconditionError(fmt::format("pod {}: {} cannot be decoded: {}", pod.key,
                                                       protocol::kDevicesToAllocateAnnotation,
                                                       std::string(devices.status().message())));
    }
    const bool consumed =
        static_cast<size_t>(container) >= devices->size() || (*devices)[container].empty();
    // The entry must still be the one validated: another writer may not swap the GPUs meanwhile.
    if (consumed || (*devices)[container] != (*pod.to_allocate)[container]) {
      return absl::FailedPreconditionError(
          fmt::format("pod {}: container {}'s entry in {} changed meanwhile", pod.key, container,
                      protocol::kDevicesToAllocateAnnotation));
    }
    (*devices)[container].clear();
    bool remaining = false;
    for (const auto& c : *devices) remaining = remaining || !c.empty();
    DYNMIG_ASSIGN_OR_RETURN(std::string encoded, protocol::EncodePodDevices(*devices));
    kube::KeyPatch patch;
    patch[std::string(protocol::kDevicesToAllocateAnnotation)] = std::move(encoded);
    if (!remaining) {
      patch[std::string(protocol::kBindPhaseAnnotation)] = std::string(protocol::kBindPhaseSuccess);
    }
    auto st =
        ops_.kube.PatchPodAnnotations(pod.ns, pod.name, patch, kube::ResourceVersion(current));
    if (st.ok()) {
      *done = !remaining;
      return absl::OkStatus();
    }
    if (st.status().code() != absl::StatusCode::kAborted) {
      return Annotate(st.status(), fmt::format("patch pod {}", pod.key));
    }
    spdlog::info(
        "pod {} changed while consuming its whole-GPU reservation (attempt {}): re-reading",
        pod.key, attempt + 1);
  }
  return absl::AbortedError(
      fmt::format("pod {}: the annotation write still conflicted after {} attempts", pod.key,
                  ops_.options.annotation_attempts));
}

}  // namespace dynmig::deviceplugin
