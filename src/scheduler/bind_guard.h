// BindGuard: "bind only what this extender reserved". The checks the extender runs before a filter
// may reserve for a pod and before a bind may place one, independent of how the caller was
// authenticated (defence in depth: they hold with client authentication off too).
//
// A pod is ours when it is a MIG pod (protocol::IsMigPod), or a whole-GPU pod
// (protocol::IsWholeGpuPod) while whole_gpu_pods is on, whose spec.schedulerName is the configured
// scheduler name. Bind is allowed only for a pod of ours, read from the API (never the
// request body), whose uid is the request's PodUID, and that holds a reservation of this extender
// on the request's Node made less than reservation_ttl ago. Where that reservation lives (the pod's
// annotations today; perhaps the scheduler's memory between filter and bind) is behind
// ReservationLookup, so the check does not depend on it.
//
// Every refusal is a kPermissionDenied (not ours) or kFailedPrecondition (no, another or an expired
// reservation) status whose message names the pod and what is wrong. Pure; thread-safe.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kube/object.h"
#include "protocol/pod_request.h"

namespace dynmig::scheduler {

// The reservation this extender holds for a pod: the node and when it was made.
struct HeldReservation {
  std::string node;
  std::optional<absl::Time> made;  // nullopt: unknown (treated as expired)
};

// Finds the reservation this extender holds for `pod` (the pod as read from the API).
using ReservationLookup = std::function<std::optional<HeldReservation>(const kube::Object& pod)>;

// The reservation the pod's annotations carry: hami.io/vgpu-node with a readable, non-empty
// hami.io/vgpu-mig-allocations (or, for a whole-GPU pod, none of those and a readable, non-empty
// hami.io/vgpu-devices-allocated: WholeGpuReservationNode), made at hami.io/vgpu-time (Unix
// seconds).
std::optional<HeldReservation> AnnotatedReservation(const kube::Object& pod);

// The node of the whole-GPU reservation the pod carries: nvidia.com/vgpu-mode "hami-core",
// hami.io/vgpu-node, no hami.io/vgpu-mig-allocations, and a readable hami.io/vgpu-devices-allocated
// naming at least one device. nullopt otherwise.
std::optional<std::string> WholeGpuReservationNode(const kube::Object& pod);

struct BindGuardOptions {
  std::string scheduler_name = "dynmig-scheduler";
  protocol::ResourceNames resources;
  absl::Duration reservation_ttl = absl::Minutes(10);
  // Whole-GPU pods are ours too (device-config.yaml nvidia.migModeSwitching enabled).
  bool whole_gpu_pods = false;
};

class BindGuard {
 public:
  // `lookup` empty = AnnotatedReservation.
  explicit BindGuard(BindGuardOptions options, ReservationLookup lookup = {});

  // OK when `pod` is a MIG pod of our scheduler name; else kPermissionDenied naming the pod and
  // why ("spec.schedulerName is X, not Y" / "requests no MIG resource").
  absl::Status CheckOurs(const kube::Object& pod) const;

  // For a filter: `pod` as the request carries it. OK when CheckOurs passes.
  absl::Status CheckFilter(const kube::Object& pod) const;

  // For a bind of `stored` (the pod read from the API) to `node`, asked with `uid`: CheckOurs, the
  // uid (required), then the held reservation (present, on `node`, made within the TTL at `now`).
  // A pod already bound to `node` needs no live reservation (a retried bind).
  absl::Status CheckBind(const kube::Object& stored, const std::string& uid,
                         const std::string& node, absl::Time now) const;

  const BindGuardOptions& options() const { return options_; }

 private:
  BindGuardOptions options_;
  ReservationLookup lookup_;
};

}  // namespace dynmig::scheduler
