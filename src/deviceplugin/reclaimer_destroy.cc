// Destroys that NVML refuses with NVML_ERROR_IN_USE (reclaimer.h): DCGM and other NVML clients keep
// handles open on MIG devices, and on H100/H200 nvmlGpuInstanceDestroy then fails until they let
// go. Such an instance is never forgotten (it stays in the state file, marked pending destroy) and
// never leaked (its slices stay held until a retry destroys it); retries back off exponentially on
// the injected clock. See docs/device-plugin.md (Destroy refused: IN_USE).
#include <algorithm>
#include <vector>

#include "deviceplugin/plugin_internal.h"
#include "deviceplugin/reclaimer.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace dynmig::deviceplugin {
namespace {

// The delay before attempt `attempts` + 1: initial * 2^(attempts-1), at most `max`.
absl::Duration Backoff(int attempts, absl::Duration initial, absl::Duration max) {
  absl::Duration d = initial;
  for (int i = 1; i < attempts && d < max; ++i) d *= 2;
  return std::min(d, max);
}

}  // namespace

std::string Reclaimer::HolderOf(const GpuEntry& gpu, uint32_t gi) {
  auto procs = ops_.nvml.GetComputeProcesses(gpu.info.index);
  if (!procs.ok()) {
    return fmt::format("NVML cannot list the GPU's processes ({})",
                       std::string(procs.status().message()));
  }
  std::vector<uint32_t> pids;
  for (const auto& p : *procs) {
    if (p.gpu_instance_id == gi) pids.push_back(p.pid);
  }
  if (!pids.empty()) return fmt::format("held by process(es) {}", fmt::join(pids, ","));
  return "NVML names no process on it: another NVML client (such as DCGM or a monitoring agent) "
         "holds it open";
}

bool Reclaimer::DeferInUse(const ManagedInstance& m, const GpuEntry& gpu, const absl::Status& st,
                           const PodMig* owner) {
  if (nvml::NvmlReturnOf(st) != nvml::NvmlReturn::kInUse) return false;
  ManagedInstance* rec = ops_.ns.FindManagedGi(m.gpu_uuid, m.gpu_instance_id);
  if (rec == nullptr) return false;
  const bool first = !rec->destroy_pending();
  if (first) rec->destroy_since = ops_.NowUnix();
  ++rec->destroy_attempts;
  rec->idle = false;  // never given out again: part of it may already be gone (its CI)
  rec->idle_since = 0;
  rec->destroy_error = std::string(st.message());
  const absl::Duration wait = Backoff(rec->destroy_attempts, ops_.options.destroy_retry_initial,
                                      ops_.options.destroy_retry_max);
  rec->destroy_next_ms = absl::ToUnixMillis(ops_.Now() + wait);
  ops_.metrics.DestroyRetried("in_use");
  const std::string holder = HolderOf(gpu, m.gpu_instance_id);
  spdlog::warn(
      "destroy of {} (GI {} on GPU {}) refused with NVML_ERROR_IN_USE ({}), attempt {}; "
      "retried in {}",
      m.mig_uuid, m.gpu_instance_id, m.gpu_uuid, holder, rec->destroy_attempts,
      absl::FormatDuration(wait));
  if (ops_.FirstReport(fmt::format("in-use/{}/{}", m.gpu_uuid, m.gpu_instance_id))) {
    ops_.Event(owner, "Warning", kReasonDestroyInUse,
               fmt::format("MIG device {} ({} at {} of GPU {}, GI {}) cannot be destroyed yet: "
                           "NVML_ERROR_IN_USE, {}; its slices stay held and the destroy is "
                           "retried with backoff (next in {})",
                           m.mig_uuid, m.profile, PlacementText(m.placement), m.gpu_uuid,
                           m.gpu_instance_id, holder, absl::FormatDuration(wait)));
  }
  return true;
}

bool Reclaimer::RetryPendingDestroys(bool destructive, ReconcileReport& report) {
  bool changed = false;
  const int64_t now_ms = absl::ToUnixMillis(ops_.Now());
  const std::vector<ManagedInstance> managed = ops_.ns.state.instances;
  for (const auto& m : managed) {
    if (!m.destroy_pending()) continue;
    ++report.destroy_pending;
    if (!destructive || now_ms < m.destroy_next_ms) continue;
    const GpuEntry* gpu = ops_.ns.inventory.FindByUuid(m.gpu_uuid);
    if (gpu == nullptr) continue;
    auto st = ops_.DestroyGi(*gpu, m.gpu_instance_id);
    if (!st.ok()) {
      if (DeferInUse(m, *gpu, st, nullptr)) {
        changed = true;
        continue;
      }
      // Another error: counted and retried on the same backoff, never forgotten.
      ManagedInstance* rec = ops_.ns.FindManagedGi(m.gpu_uuid, m.gpu_instance_id);
      if (rec == nullptr) continue;
      ++rec->destroy_attempts;
      rec->destroy_error = std::string(st.message());
      rec->destroy_next_ms = absl::ToUnixMillis(
          ops_.Now() + Backoff(rec->destroy_attempts, ops_.options.destroy_retry_initial,
                               ops_.options.destroy_retry_max));
      ++report.destroy_failed;
      ops_.metrics.DestroyFailed();
      ops_.metrics.DestroyRetried("error");
      spdlog::warn("retried destroy of {} failed: {}", m.mig_uuid, std::string(st.message()));
      changed = true;
      continue;
    }
    ops_.ns.RemoveManaged(m.gpu_uuid, m.gpu_instance_id);
    ops_.ForgetReport(fmt::format("in-use/{}/{}", m.gpu_uuid, m.gpu_instance_id));
    if (ops_.cdi.enabled()) {
      if (auto rm = ops_.cdi.Remove(m.mig_uuid); !rm.ok())
        spdlog::warn("{}", std::string(rm.message()));
    }
    --report.destroy_pending;
    ++report.destroyed;
    changed = true;
    ops_.metrics.InstanceDestroyed("in_use_retry");
    ops_.Event(
        nullptr, "Normal", kReasonDestroyed,
        fmt::format("destroyed MIG device {} ({} at {} of GPU {}, GI {}) after NVML refused "
                    "{} time(s) with NVML_ERROR_IN_USE over {}s; its slices are free",
                    m.mig_uuid, m.profile, PlacementText(m.placement), m.gpu_uuid,
                    m.gpu_instance_id, m.destroy_attempts, ops_.NowUnix() - m.destroy_since));
  }
  return changed;
}

}  // namespace dynmig::deviceplugin
