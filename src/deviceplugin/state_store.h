// The device plugin's node-local state: the MIG instances it manages (created or adopted) and the
// intents it records before creating one, persisted in a small JSON file so that a crash never
// loses track of an instance.
//
// File format (version 1), replaced atomically (write "<file>.tmp", fsync, rename, fsync the
// directory):
//   {"version":1,"nextIntentId":3,
//    "instances":[{"gpuUUID":"GPU-…","profile":"1g.5gb","profileId":19,
//                  "placement":{"start":6,"size":1},"gpuInstanceID":13,"computeInstanceID":0,
//                  "migUUID":"MIG-…","origin":"created","since":1800000000,
//                  "owner":{"podUID":"…","namespace":"default","name":"p","containerIndex":0,
//                           "deviceIndex":0}}],
//    "intents":[{"id":2,"gpuUUID":"GPU-…","profile":"1g.5gb","placement":{"start":5,"size":1},
//                "created":1800000000,"owner":{…}}],
//    "ledger":[{"deviceIDs":["GPU-…::0"],"podUID":"…","namespace":"default","name":"p",
//               "container":"main","containerIndex":0,"initContainer":false,
//               "migUUIDs":["MIG-…"],"since":1800000000}]}
// "ledger" may be absent (a file written before it existed): an empty ledger. An instance of
// origin "legacy" also has "holders":[{"podUID","namespace","name","container","resource",
// "deviceID","source"}]; absent = none (files written before handover existed). An instance whose
// destroy NVML refused with IN_USE also has "destroyPending":{"attempts":2,"since":1800000000,
// "nextAttemptMs":1800000004000,"error":"…"}; absent = not pending.
// MIG mode switches (mode_switch.h), only once a switch happened on the node (absent otherwise, so
// files stay as they were): "modeSwitches":[{"gpuUUID":"GPU-…","from":"mig","to":"hami-core",
// "requestAt":1764820000000,"step":"set-mode","reason":"","markUnswitchable":false}] (the open
// switch intents, one per GPU) and "gpuModes":[{"gpuUUID":"GPU-…","mode":"hami-core",
// "since":1764820000000,"phase":"steady","answers":1764820000000,"reason":""}] (per GPU: since
// when it is in its mode and the last request it answered).
// Value types are thread-compatible; StateStore is thread-compatible (callers serialize).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mig/placement.h"
#include "nlohmann/json_fwd.hpp"

namespace dynmig::deviceplugin {

// The pod container device an instance belongs to.
struct InstanceOwner {
  std::string pod_uid;
  std::string ns;
  std::string name;
  int container_index = 0;
  int device_index = 0;

  std::string PodKey() const { return ns + "/" + name; }
  friend bool operator==(const InstanceOwner&, const InstanceOwner&) = default;
};

// A container the node says was given a legacy instance (handover.h): the kubelet's PodResources
// ("pod-resources": `resource` is the resource, `device_id` its device ID) or the container
// runtime ("runtime": `device_id` is the NVIDIA_VISIBLE_DEVICES entry). `pod_uid` is the pod's
// UID in the API ("" when the API does not list it).
struct InstanceHolder {
  std::string pod_uid;
  std::string ns;
  std::string name;
  std::string container;
  std::string resource;
  std::string device_id;
  std::string source;  // "pod-resources" or "runtime"

  std::string PodKey() const { return ns + "/" + name; }
  friend bool operator==(const InstanceHolder&, const InstanceHolder&) = default;
  friend auto operator<=>(const InstanceHolder&, const InstanceHolder&) = default;
};

// A MIG instance (one GI with its full CI) this plugin created or adopted.
struct ManagedInstance {
  std::string gpu_uuid;
  std::string profile;  // exact profile name
  uint32_t profile_id = 0;
  mig::Placement placement;
  uint32_t gpu_instance_id = 0;
  uint32_t compute_instance_id = 0;
  std::string mig_uuid;
  InstanceOwner owner;
  // "created", "adopted", "completed" (an intent finished after a crash), "intent" (an
  // interrupted Allocate's instance kept while busy), "reused" (an idle instance taken over) or
  // "legacy" (a live instance dynmig did not create, held by the containers in `holders`).
  std::string origin;
  int64_t since = 0;  // unix seconds
  // Warm instances (nvidia.migWarmInstances): its pod ended and it is kept for reuse. `owner` is
  // then the last pod that had it (no pod owns an idle instance).
  bool idle = false;
  int64_t idle_since = 0;  // unix seconds; 0 unless idle
  // origin "legacy": the containers that hold it, as last proven (sorted). `owner` is the first
  // holder's pod.
  std::vector<InstanceHolder> holders;
  // Pending destroy: NVML refused to destroy it with NVML_ERROR_IN_USE although no process of
  // ours runs there (another NVML client such as DCGM holds it open). It is never given out again,
  // its slices stay held, and the destroy is retried with backoff until it succeeds (or NVML no
  // longer lists it). destroy_attempts == 0: not pending.
  int destroy_attempts = 0;
  int64_t destroy_since = 0;    // unix seconds of the first refusal
  int64_t destroy_next_ms = 0;  // unix milliseconds of the next attempt
  std::string destroy_error;    // the last refusal as NVML worded it

  bool destroy_pending() const { return destroy_attempts > 0; }
  friend bool operator==(const ManagedInstance&, const ManagedInstance&) = default;
};

// Recorded before creating a GI, closed once the pod's annotation carries its identity (or the
// instance is gone). An open intent at startup means a crash happened in between.
struct Intent {
  uint64_t id = 0;
  InstanceOwner owner;
  std::string gpu_uuid;
  std::string profile;
  mig::Placement placement;
  int64_t created = 0;  // unix seconds

  friend bool operator==(const Intent&, const Intent&) = default;
};

// One container's Allocate as this plugin served it: the device IDs the kubelet sent and the pod
// container it was served for. PreStartContainer proves it against the kubelet's own record
// (plugin_identity.cc). A later Allocate with the same device IDs replaces it; Reconcile drops it
// once its pod has ended.
struct LedgerEntry {
  std::vector<std::string> device_ids;  // sorted, unique
  std::string pod_uid;
  std::string ns;
  std::string name;
  std::string container;    // the container's name
  int container_index = 0;  // init containers first, then app containers (HAMi's index)
  bool init_container = false;
  std::vector<std::string> mig_uuids;  // what the answer gave the container
  int64_t since = 0;                   // unix seconds
  // The whole GPUs (their UUIDs) the answer gave a whole-GPU pod's container; state file
  // "gpuUUIDs", written only when not empty.
  std::vector<std::string> gpu_uuids;

  std::string PodKey() const { return ns + "/" + name; }
  friend bool operator==(const LedgerEntry&, const LedgerEntry&) = default;
};

// A MIG mode switch under way on one GPU (mode_switch.h), recorded before each NVML call of it, so
// a restart at any step resumes or rolls it back from what NVML shows.
struct ModeSwitchIntent {
  std::string gpu_uuid;
  bool from_mig = true;  // the mode before the switch (MIG on)
  bool to_mig = false;   // the mode asked for
  int64_t request_at_ms = 0;
  // The step about to run: "set-mode" (SetMigMode(to)), "reset" (ResetGpu), "set-back"
  // (SetMigMode(from) after a refusal; `reason` says why, `mark_unswitchable` whether the GPU is
  // marked not switchable for it).
  std::string step;
  std::string reason;
  bool mark_unswitchable = false;

  friend bool operator==(const ModeSwitchIntent&, const ModeSwitchIntent&) = default;
};

// Per GPU: the MIG mode as last seen, since when, and the last switch request answered.
struct GpuModeRecord {
  std::string gpu_uuid;
  bool mig = true;
  int64_t since_ms = 0;
  std::string phase = "steady";  // "steady" or "refused" (a switch in progress is not recorded)
  int64_t answers_ms = 0;
  std::string reason;

  friend bool operator==(const GpuModeRecord&, const GpuModeRecord&) = default;
};

struct PluginState {
  std::vector<ManagedInstance> instances;
  std::vector<Intent> intents;
  std::vector<LedgerEntry> ledger;
  std::vector<ModeSwitchIntent> mode_switches;
  std::vector<GpuModeRecord> gpu_modes;
  uint64_t next_intent_id = 1;

  friend bool operator==(const PluginState&, const PluginState&) = default;
};

std::string EncodeState(const PluginState& state);
// The holders of a legacy instance as the state file and GET /nvml write them.
nlohmann::json HoldersJson(const std::vector<InstanceHolder>& holders);
// kDataLoss naming the field when the text is not a valid version-1 state.
absl::StatusOr<PluginState> DecodeState(std::string_view text);

class StateStore {
 public:
  // `fsync` = false skips the fsyncs (benchmarks on tmpfs); the rename keeps saves atomic.
  StateStore(std::string path, bool fsync) : path_(std::move(path)), fsync_(fsync) {}

  // The saved state; an empty state when the file does not exist. kDataLoss when it cannot be
  // parsed (the caller decides: the plugin moves it aside and recovers from NVML and the API).
  absl::StatusOr<PluginState> Load() const;
  // Creates the directory when missing. kUnavailable/kPermissionDenied naming the path.
  absl::Status Save(const PluginState& state) const;
  // Renames a corrupt file to "<file>.corrupt-<unix time>" and returns the new name.
  absl::StatusOr<std::string> MoveAside(int64_t now_unix) const;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool fsync_;
};

// Writes `content` to `path` atomically: "<path>.tmp.<pid>", optional fsync, rename, optional
// fsync of the directory. Errors name the path and errno text.
absl::Status WriteFileAtomically(const std::string& path, std::string_view content, bool fsync);

}  // namespace dynmig::deviceplugin
