// PluginCore's options (plugin_core.h), shared by its parts (node_ops.h, allocator.h,
// reclaimer.h), and the crash points a test can stop an Allocate at.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "absl/time/time.h"
#include "common/clock.h"
#include "deviceplugin/runtime_source.h"
#include "mig/allowlist.h"
#include "protocol/annotations.h"
#include "protocol/device_config.h"

namespace dynmig::deviceplugin {

// Crash points (testing): PluginCoreOptions::crash_point is asked at each; `true` makes Allocate
// return kAborted at once, leaving NVML, the API and the state file exactly as they are, as a
// crash would.
inline constexpr std::string_view kCrashAfterIntent = "after-intent";
inline constexpr std::string_view kCrashAfterGpuInstance = "after-gpu-instance";
inline constexpr std::string_view kCrashAfterComputeInstance = "after-compute-instance";
inline constexpr std::string_view kCrashBeforeRollback = "before-rollback";
inline constexpr std::string_view kCrashAfterAnnotation = "after-annotation";
// A MIG mode switch (mode_switch.h) stops at these the same way (its step returns at once).
inline constexpr std::string_view kCrashModeBeforeSet = "mode-before-set";
inline constexpr std::string_view kCrashModeAfterSet = "mode-after-set";
inline constexpr std::string_view kCrashModeBeforeReset = "mode-before-reset";
inline constexpr std::string_view kCrashModeBeforeSetBack = "mode-before-set-back";
inline constexpr std::string_view kCrashModeBeforePublish = "mode-before-publish";

struct PluginCoreOptions {
  std::string node_name;
  std::string resource_name = std::string(protocol::kResourceCount);
  mig::Allowlist allowlist;
  // The node-local state file (managed instances, intents). Required.
  std::string state_file;
  // fsync the state file and CDI specs on every write (off only for benchmarks on tmpfs).
  bool fsync = true;
  // When set, Allocate writes a CDI spec per MIG device here and answers with CDI names.
  std::string cdi_dir;
  // Warm instances (device-config.yaml nvidia.migWarmInstances): an ended pod's instance is kept
  // idle for reuse. Off by default.
  protocol::WarmInstances warm;
  // MIG mode switching (device-config.yaml nvidia.migModeSwitching). Absent (`present` false):
  // every GPU is a MIG GPU as before, dynmig.io/gpu-mode is never written and no request is
  // carried out. Enabled: GPUs that may switch (inventory.h WholeGpuPolicy) are handed out whole
  // while their MIG mode is off, and mode_switch.h carries out the scheduler's requests.
  protocol::MigModeSwitching mig_mode_switching;
  // Attempts of the optimistic-concurrency loop that writes the pod annotation.
  int annotation_attempts = 5;
  // Wall time (timestamps, TTLs, the in-progress window) and monotonic time (durations); must
  // outlive the core. null = RealClock() (DevicePlugin passes its own clock when this is unset).
  // The device list's waits (WaitForDeviceChange) run on real time: they pace a gRPC stream whose
  // peer, the kubelet, does.
  const Clock* clock = nullptr;
  // The container runtime (CRI), handover's second source of evidence (handover.h); must outlive
  // the core. null = not configured: instances only the runtime could prove stay unproven.
  ContainerRuntimeSource* runtime = nullptr;
  // This device plugin's own pod, "namespace/name" ("" = none): the runtime's containers of it are
  // never holders. Its NVIDIA_VISIBLE_DEVICES=all (the toolkit's way to give it NVML) names every
  // GPU, so it would otherwise hold every legacy instance and none would ever be reclaimed.
  std::string self_pod;
  // How long handover's evidence (PodResources and the runtime: up to 1024 ContainerStatus calls)
  // is reused by later cycles: the Allocates of one kubelet admission burst each run a cycle, and
  // must not each list every container. Stale evidence can only keep an instance longer, or miss
  // a holder that a legacy allocator (stopped for handover) created in that window. 0 = read
  // every cycle.
  absl::Duration evidence_max_age = absl::Seconds(2);
  // A destroy NVML refuses with NVML_ERROR_IN_USE (DCGM or another NVML client holds the instance
  // open) is retried after destroy_retry_initial, doubling per refusal up to destroy_retry_max
  // (deterministic: no jitter; the reconcile cycle that runs it spreads retries anyway).
  absl::Duration destroy_retry_initial = absl::Seconds(2);
  absl::Duration destroy_retry_max = absl::Minutes(2);
  // A created instance is answered only once NVML lists it (DCGM needs a second or two to see a
  // new instance): polled every ready_poll for at most ready_timeout, else the Allocate fails and
  // is rolled back.
  absl::Duration ready_timeout = absl::Seconds(3);
  absl::Duration ready_poll = absl::Milliseconds(100);
  std::function<bool(std::string_view point)> crash_point;  // testing only
  std::string component = "dynmig-device-plugin";
};

}  // namespace dynmig::deviceplugin
