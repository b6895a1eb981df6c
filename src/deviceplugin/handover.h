// Handover without draining: which container holds each live MIG instance dynmig did not create
// (a "legacy instance": made by MIG Manager / mig-parted, HAMi's legacy templates, or by hand).
// Pure: the caller reads NVML, the kubelet, the runtime and the API; this decides. No I/O.
//
// Evidence, and only this evidence, proves a holder (a pod's annotations never do: a pod could
// name any instance):
//   1. the kubelet's PodResources API: a container holds instance I when one of its device IDs (of
//      any resource but dynmig's own, whose IDs are GPU replicas) names I;
//   2. the container runtime: a container that has not exited holds I when an entry of its
//      NVIDIA_VISIBLE_DEVICES names I.
// A device ID names instance I when it is I's MIG UUID, "MIG-<gpu uuid>/<gi>/<ci>" (the legacy
// form), or names I's whole GPU: its UUID, its index, "<index>:<mig index>" (the MIG device index
// is the driver's enumeration order, so the whole GPU is taken), or "all" (every GPU).
//
// Attribution of one instance:
//   held      at least one holder (whatever else is missing: a holder is a holder). The owner is
//             the first holder whose pod the API lists (active ones first), else the first holder
//             with no UID. A PodResources pod the API does not list still holds, and so does a
//             terminated pod whose container the kubelet still lists.
//   free      no holder, the evidence is complete (EvidenceGap is "") and NVML listed its CIs.
//   unproven  no holder, and the evidence is incomplete: the reason says what is missing. Never
//             destroyed.
// Evidence is complete when PodResources answered and either the runtime answered (every
// container that has not exited with readable devices) or no active pod needs runtime evidence:
// a HAMi legacy pod (PodMig::legacy), or a pod the kubelet lists with a device (of a resource
// other than dynmig's own) that names no live instance. A PodResources pod the API does not list
// counts as active.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "deviceplugin/pod_resources.h"
#include "deviceplugin/pods.h"
#include "deviceplugin/runtime_source.h"
#include "deviceplugin/state_store.h"
#include "mig/placement.h"
#include "protocol/held_slices.h"

namespace dynmig::deviceplugin {

inline constexpr std::string_view kHolderSourcePodResources = "pod-resources";
inline constexpr std::string_view kHolderSourceRuntime = "runtime";

inline constexpr std::string_view kOriginLegacy = "legacy";  // ManagedInstance::origin

// One compute instance of a live instance.
struct LiveCi {
  uint32_t id = 0;
  std::string mig_uuid;
};

// One live instance (a GI with its CIs) as NVML shows it.
struct LiveInstance {
  std::string gpu_uuid;
  uint32_t gpu_index = 0;
  uint32_t gi = 0;
  mig::Placement placement;
  std::string profile;  // "" when the profile is unknown
  uint32_t profile_id = 0;
  std::vector<LiveCi> cis;  // a container holding any of them holds the instance
  // Why its CIs cannot be listed ("" when they can): it is then never proven free.
  std::string error;
};

struct HandoverEvidence {
  absl::StatusOr<PodResourcesList> pod_resources = absl::UnavailableError("not read");
  // nullopt: no container runtime is configured.
  std::optional<absl::StatusOr<std::vector<RuntimeContainer>>> runtime;
  // dynmig's own resource (its device IDs are GPU replicas, never an instance).
  std::string own_resource;
};

enum class AttributionKind { kHeld, kFree, kUnproven };
std::string_view KindName(AttributionKind kind);  // "held", "free", "unproven"

struct Attribution {
  AttributionKind kind = AttributionKind::kUnproven;
  std::vector<InstanceHolder> holders;  // sorted, unique; empty unless held
  InstanceOwner owner;                  // held: the owning pod (indices 0)
  std::string reason;                   // unproven: what is missing
};

// Whether device ID `id` names instance `instance` (see the header comment): a MIG UUID or the
// legacy form names it through any of its CIs.
bool DeviceIdNames(std::string_view id, const LiveInstance& instance);

// "" when the evidence is complete; else what is missing, naming the pod or the source. `live` is
// every live instance of the node (for "a device that names no live instance").
std::string EvidenceGap(const HandoverEvidence& evidence, const std::vector<PodMig>& pods,
                        const std::vector<LiveInstance>& live);

// Attributes `instance` given the evidence, the node's pods from the API and `gap`
// (EvidenceGap of the same evidence).
Attribution Attribute(const LiveInstance& instance, const HandoverEvidence& evidence,
                      const std::vector<PodMig>& pods, const std::string& gap);

// The device plugin's handover state between and within cycles (NodeState::legacy). What
// dynmig.io/mig-held and the gauge say of managed legacy instances is derived from the managed
// instances themselves (NodeState::Held); this keeps only what a cycle learns beyond them.
struct LegacyState {
  std::optional<HandoverEvidence> evidence;  // the last read (shown in GET /nvml)
  bool fresh = false;                        // `evidence` may be used in this cycle
  absl::Duration read_at;                    // monotonic time of the read
  std::string gap;                           // EvidenceGap of `evidence`
  bool gap_known = false;   // `gap` was computed for `evidence` (not so for a prefetched read)
  bool asked = false;       // this cycle asked for the evidence (the next one likely will)
  bool prefetched = false;  // `evidence` was read ahead for the next cycle (OfferEvidence)
  // A live instance dynmig does not manage, as this cycle attributed it (free or unproven).
  struct Untracked {
    Attribution attribution;
    mig::Placement placement;
    std::string profile;
    std::string held_reason;  // what dynmig.io/mig-held says of it when unproven
  };
  // By (GPU UUID, GI id).
  std::map<std::pair<std::string, uint32_t>, Untracked> untracked;
  // Managed legacy instances whose holders this cycle could not confirm, by (GPU UUID, GI id):
  // why (they are kept).
  std::map<std::pair<std::string, uint32_t>, std::string> unconfirmed;
};

// What dynmig.io/mig-held says of a held legacy instance: "legacy instance of ns/name (container
// c, nvidia.com/mig-1g.18gb)" (+ " and N other holder(s)"); the owner's holder is named first.
std::string HeldReason(const std::vector<InstanceHolder>& holders, const InstanceOwner& owner);
inline std::string HeldReason(const Attribution& attribution) {
  return HeldReason(attribution.holders, attribution.owner);
}

}  // namespace dynmig::deviceplugin
