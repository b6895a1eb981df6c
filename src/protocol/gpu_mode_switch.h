// The two Node annotations through which a GPU changes mode between MIG ("mig") and whole-GPU
// ("hami-core") (issue 31, docs/mig-mode.md):
//
//   dynmig.io/gpu-mode-request   written by the scheduler's leader (or `dynmig gpu mode`, an
//                                operator) under the node lock: this GPU should become that mode.
//                                While a GPU has a request that the device plugin's status does not
//                                answer yet, the scheduler places nothing on it (the GPU is held
//                                for the switch).
//     [{"gpuUUID":"GPU-…","to":"mig","at":1764820000000,"by":"scheduler","reason":"…"}]
//
//   dynmig.io/gpu-mode           written by the device plugin in its publish patch: per GPU its
//                                mode, whether it may switch, since when it is in its mode, and the
//                                phase of the last switch with the request it answered.
//     [{"gpuUUID":"GPU-…","mode":"hami-core","migCapable":true,"switchable":true,
//       "since":1764820000000,"phase":"done","answers":1764820000000,"reason":""}]
//
// One writer each, so neither annotation is ever merged from two sources. Both are JSON arrays
// sorted by GPU UUID, at most kMaxModeGpus entries, one per GPU. Times are Unix milliseconds.
// Decoders are strict and name the element and field of any error; a tenant cannot write Node
// annotations, but the values are still bounded like every other input. Pure; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "protocol/gpu_mode.h"

namespace dynmig::protocol {

inline constexpr std::string_view kGpuModeRequestAnnotation = "dynmig.io/gpu-mode-request";
inline constexpr std::string_view kGpuModeStatusAnnotation = "dynmig.io/gpu-mode";

inline constexpr size_t kMaxModeGpus = 64;               // entries per annotation
inline constexpr size_t kMaxModeUuid = 128;              // characters of a GPU UUID
inline constexpr size_t kMaxModeText = 256;              // characters of `by` and `reason`
inline constexpr size_t kMaxModeAnnotation = 64 * 1024;  // bytes of either value

// --- dynmig.io/gpu-mode-request --------------------------------------------------------------

struct GpuModeRequest {
  std::string gpu_uuid;
  GpuMode to = GpuMode::kMig;
  int64_t at_ms = 0;   // when it was written; identifies the request (> 0)
  std::string by;      // "scheduler" or "operator:<name>"
  std::string reason;  // for people: the demand behind it

  friend bool operator==(const GpuModeRequest&, const GpuModeRequest&) = default;
};

// kInvalidArgument naming "dynmig.io/gpu-mode-request[i].field" for: not a JSON array of objects,
// more than kMaxModeGpus entries or kMaxModeAnnotation bytes, an empty or over-long GPU UUID, the
// same GPU twice, `to` other than "mig"/"hami-core", `at` missing or not in (0, 2^53), `by` or
// `reason` over kMaxModeText characters or with control characters. "" and "[]" are none.
absl::StatusOr<std::vector<GpuModeRequest>> DecodeGpuModeRequests(std::string_view value);
// Sorted by GPU UUID. The caller keeps one request per GPU (the last one wins here).
std::string EncodeGpuModeRequests(std::vector<GpuModeRequest> requests);

// --- dynmig.io/gpu-mode ----------------------------------------------------------------------

enum class GpuModePhase : uint8_t {
  kSteady = 0,     // "steady": no switch under way; `answers` (if set) names the request done
  kSwitching = 1,  // "switching": the plugin is carrying out `answers`; nothing may be placed
  kRefused = 2,    // "refused": `answers` was not carried out; `reason` says why; mode unchanged
};
std::string_view GpuModePhaseName(GpuModePhase phase);

struct GpuModeStatus {
  std::string gpu_uuid;
  GpuMode mode = GpuMode::kMig;  // the mode NVML reports as current
  bool mig_capable = true;       // NVML supports MIG on this GPU (false: T4, L4, ...)
  // The device config allows a switch (MaySwitch) and nothing known rules it out (a switch that
  // needs a reboot or a reset the node cannot do marks it false until the plugin restarts).
  bool switchable = false;
  int64_t since_ms = 0;  // when it entered `mode` (or when the plugin first saw it in it)
  GpuModePhase phase = GpuModePhase::kSteady;
  int64_t answers_ms = 0;  // the `at` of the request this phase is about; 0: none
  std::string reason;      // why refused, or why not switchable; "" otherwise

  friend bool operator==(const GpuModeStatus&, const GpuModeStatus&) = default;
};

// kInvalidArgument naming "dynmig.io/gpu-mode[i].field" for: not a JSON array of objects, more
// than kMaxModeGpus entries or kMaxModeAnnotation bytes, an empty/over-long or repeated GPU
// UUID, `mode` other than "mig"/"hami-core", `phase` other than steady/switching/refused,
// times negative or beyond 2^53, a reason over kMaxModeText characters or with control
// characters, `migCapable`/`switchable` not booleans. Absent booleans are false, absent times 0.
absl::StatusOr<std::vector<GpuModeStatus>> DecodeGpuModeStatuses(std::string_view value);
// Sorted by GPU UUID; reasons cut to kMaxModeText characters.
std::string EncodeGpuModeStatuses(std::vector<GpuModeStatus> statuses);

// --- What the two say together ------------------------------------------------------------------

// Whether the plugin's status answers `request`: it names the request's `at` and is no longer
// switching (steady in the requested mode, or refused). The scheduler's leader then removes the
// request; until then the GPU is held for the switch.
bool StatusAnswers(const GpuModeStatus& status, const GpuModeRequest& request);

// Whether a GPU is held for a switch: it has a request, and its status is absent or does not
// answer it. `status` may be null (the plugin published none yet).
bool HeldForSwitch(const GpuModeRequest& request, const GpuModeStatus* status);

}  // namespace dynmig::protocol
