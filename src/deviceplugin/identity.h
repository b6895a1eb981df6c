// Whom an allocation went to. The kubelet's Allocate carries no pod identity, so the plugin serves
// it for the pod its evidence names (the node lock's owner, see pods.h FindPendingPod) and records
// that in its ledger (state_store.h LedgerEntry). Before a container starts, the kubelet's
// PreStartContainer names the devices it is about to hand over; CheckIdentity proves them against
// the kubelet's own record (PodResources: which container of which pod holds exactly these
// devices) and the API (that pod's UID). Anything that does not agree is refused: the container
// does not start, and nothing is destroyed (the instance stays the reserved pod's).
//
// CheckIdentity is the first step of the Allocate pipeline issue 28 asks for: a pure function of
// the ledger entry, the kubelet's answer and the API's pods, returning OK or the reason. Pure;
// thread-compatible.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "deviceplugin/pod_resources.h"
#include "deviceplugin/pods.h"
#include "deviceplugin/state_store.h"

namespace dynmig::deviceplugin {

// Refusal reasons (the `reason` label of dynmig_deviceplugin_prestart_refusals_total).
inline constexpr std::string_view kIdentityNoDevices = "no_devices";
inline constexpr std::string_view kIdentityNoRecord = "no_record";
inline constexpr std::string_view kIdentityKubeletUnreachable = "kubelet_unreachable";
inline constexpr std::string_view kIdentityApiUnreachable = "api_unreachable";
inline constexpr std::string_view kIdentityNoHolder = "no_holder";
inline constexpr std::string_view kIdentityInitContainer = "init_container";
inline constexpr std::string_view kIdentityAmbiguous = "ambiguous_holder";
inline constexpr std::string_view kIdentityOtherPod = "other_pod";
inline constexpr std::string_view kIdentityOtherContainer = "other_container";
inline constexpr std::string_view kIdentityPodGone = "pod_gone";
inline constexpr std::string_view kIdentityUidMismatch = "uid_mismatch";

struct IdentityVerdict {
  std::string reason;   // "" = proven; otherwise one of the kIdentity* reasons
  std::string message;  // what differs, naming the pods, containers and devices
  // namespace/name of the pods concerned (the one served, and the kubelet's holder): each gets a
  // Warning event.
  std::vector<std::string> pods;

  bool ok() const { return reason.empty(); }
};

// Sorted, without duplicates: the ledger's key for a device list.
std::vector<std::string> DeviceKey(const std::vector<std::string>& device_ids);

// Proves that `device_ids` (of `resource`, as PreStartContainer names them) went to the pod
// container `entry` records (the ledger entry for exactly these IDs; nullptr: none): the kubelet
// (`kubelet`, its PodResources answer) says exactly these IDs are held by that namespace, pod name
// and container, and the API (`pods`, the node's pods) says that pod is active with the recorded
// UID. Every other outcome is a refusal naming what differs.
IdentityVerdict CheckIdentity(const std::vector<std::string>& device_ids, const LedgerEntry* entry,
                              const absl::StatusOr<PodResourcesList>& kubelet,
                              std::string_view resource,
                              const absl::StatusOr<std::vector<PodMig>>& pods);

}  // namespace dynmig::deviceplugin
