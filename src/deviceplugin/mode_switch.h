// ModeSwitcher: the device plugin carries out the MIG mode switches the scheduler's leader (or an
// operator) asks for in the Node annotation dynmig.io/gpu-mode-request, and reports each GPU's
// mode in dynmig.io/gpu-mode (protocol/gpu_mode_switch.h, docs/mig-mode.md, issue 31). Only when
// device-config.yaml has nvidia.migModeSwitching (PluginCoreOptions::mig_mode_switching.present);
// without it nothing here runs and the Node's annotations are today's.
//
// Each cycle (PluginCore::SwitchModes, after the reclaimer):
//   Begin()  reads the Node's requests (one that does not decode: logged and an Event once,
//            nothing is switched), and for each request naming one of this node's GPUs that its
//            status does not answer yet: refused at once when the config does not allow it (off,
//            no rule for the model and node labels, no MIG, marked not switchable); steady at
//            once when the GPU already is in the mode; otherwise the GPU goes to phase
//            "switching", unhealthy in the register and the kubelet's list (it takes nothing),
//            and the plugin publishes that before it goes on.
//   Carry()  under NodeState::mu, per switching GPU: idle check (no quarantined slice, no open
//            Allocate intent, no managed instance but warm ones, no held slice, no active pod
//            whose reservation names the GPU, no GI and no process in NVML; warm instances are
//            destroyed first). Busy: "refused", naming what uses it. Then, with a switch intent
//            recorded in the state file before every NVML call: SetMigMode(to); SUCCESS: steady in
//            the new mode. Activation IN_USE (Ampere: pending until a reset): ResetGpu only when
//            NVML shows no process; a reset that applies it: steady; NOT_SUPPORTED (no reset on
//            this host): the mode is set back (SetMigMode(from)), "refused" with "needs a GPU
//            reset this node cannot do", not switchable until the plugin restarts.
//            RESET_REQUIRED: set back, "needs a reboot", not switchable. SetMigMode's own error:
//            refused with it.
//   Recover() at Start (and each cycle while an intent stays open): an open switch intent is
//            resolved from NVML's current and pending mode: applied -> steady (answers the
//            request); nothing applied -> dropped (the request is carried out again next cycle),
//            or refused when the step was the set-back; pending -> set back first.
//
// `since` (when the GPU entered its mode) is kept in the state file; unknown: the plugin's start.
// Thread-compatible: every method requires NodeState::mu.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "deviceplugin/node_ops.h"
#include "deviceplugin/pods.h"
#include "protocol/gpu_mode_switch.h"

namespace dynmig::deviceplugin {

// Events on the Node.
inline constexpr std::string_view kReasonModeSwitched = "GpuModeSwitched";
inline constexpr std::string_view kReasonModeRefused = "GpuModeSwitchRefused";
inline constexpr std::string_view kReasonModeRequestInvalid = "GpuModeRequestInvalid";

// The reasons that mark a GPU not switchable until the plugin restarts.
inline constexpr std::string_view kNeedsReset = "needs a GPU reset this node cannot do";
inline constexpr std::string_view kNeedsReboot = "needs a reboot";
// Appended to the reason of a GPU marked not switchable until the plugin restarts.
inline constexpr std::string_view kUntilRestart =
    " (not switchable until the device plugin restarts)";

class ModeSwitcher {
 public:
  // `ops` must outlive the switcher.
  explicit ModeSwitcher(NodeOps& ops);
  ModeSwitcher(const ModeSwitcher&) = delete;
  ModeSwitcher& operator=(const ModeSwitcher&) = delete;

  dynmig::Mutex& mu() const ABSL_LOCK_RETURNED(ops_.ns.mu) { return ops_.ns.mu; }
  bool configured() const { return ops_.options.mig_mode_switching.present; }

  // Startup: reads the node's labels, resolves open switch intents, records `since` of GPUs
  // seen for the first time. Returns whether a status changed.
  bool Recover() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // The first half of a cycle (see the header comment): fills `todo` with the requests to carry
  // out, whose GPUs are now switching and unhealthy. Returns whether a status changed.
  bool Begin(std::vector<protocol::GpuModeRequest>& todo) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // The second half: carries out `todo`. Returns false when a crash point stopped it (nothing
  // after it ran, as after a crash).
  bool Carry(const std::vector<protocol::GpuModeRequest>& todo)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // dynmig.io/gpu-mode: one status per exposed GPU.
  std::vector<protocol::GpuModeStatus> Statuses() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Whether the GPU is mid-switch (switching now, or an open switch intent).
  bool Switching(std::string_view gpu_uuid) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Marks switching GPUs unhealthy in the inventory (after a health refresh re-read them).
  void ApplyHealth() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);

 private:
  GpuModeRecord& Record(const GpuEntry& gpu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Why the config does not let `gpu` switch ("" when it does).
  std::string NotAllowed(const GpuEntry& gpu) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // What uses `gpu` ("" when idle); destroys its warm instances when nothing else does.
  std::string BusyReason(const GpuEntry& gpu, const std::vector<PodMig>& pods)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // One GPU's switch; false when a crash point stopped it.
  bool CarryOne(const GpuEntry& gpu, const protocol::GpuModeRequest& request,
                const absl::StatusOr<std::vector<PodMig>>& pods)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Sets the mode back after a refusal; false when a crash point stopped it.
  bool SetBack(const GpuEntry& gpu, ModeSwitchIntent intent, const std::string& reason, bool mark)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  void Done(const GpuEntry& gpu, bool mig, int64_t answers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  void Refuse(const GpuEntry& gpu, int64_t answers, const std::string& reason, bool mark)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  void SaveIntent(const ModeSwitchIntent& intent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  void DropIntent(std::string_view gpu_uuid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  // Resolves the open intents from NVML; returns whether a status changed.
  bool ResolveIntents() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_.ns.mu);
  bool Crash(std::string_view point) const;
  int64_t NowMs() const;

  NodeOps& ops_;
  const int64_t started_ms_;
  // The node's labels as last read (for MaySwitch).
  std::map<std::string, std::string, std::less<>> labels_ ABSL_GUARDED_BY(ops_.ns.mu);
  // GPUs switching in this cycle: the request being carried out.
  std::map<std::string, int64_t, std::less<>> switching_ ABSL_GUARDED_BY(ops_.ns.mu);
  // GPUs marked not switchable until the plugin restarts, and why.
  std::map<std::string, std::string, std::less<>> marked_ ABSL_GUARDED_BY(ops_.ns.mu);
};

}  // namespace dynmig::deviceplugin
