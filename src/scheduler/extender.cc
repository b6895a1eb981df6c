#include "scheduler/extender.h"

#include <algorithm>
#include <set>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "kube/object.h"
#include "protocol/annotations.h"
#include "protocol/devices.h"
#include "protocol/gpu_mode.h"
#include "protocol/mig_allocations.h"
#include "spdlog/spdlog.h"

namespace dynmig::scheduler {
namespace {

using nlohmann::json;

std::string PodNamespace(const kube::Object& pod) {
  const std::string ns = kube::Namespace(pod);
  return ns.empty() ? "default" : ns;
}

std::string AnnotationOr(const kube::Object& obj, std::string_view key) {
  return kube::Annotation(obj, key).value_or("");
}

// The node of the reservation the pod object carries: hami.io/vgpu-node together with a
// readable, non-empty hami.io/vgpu-mig-allocations, or a whole-GPU pod's device list.
std::optional<std::string> CarriedReservation(const kube::Object& pod) {
  if (auto whole = WholeGpuReservationNode(pod)) return whole;
  const std::string node = AnnotationOr(pod, protocol::kVgpuNodeAnnotation);
  const std::string allocations = AnnotationOr(pod, protocol::kMigAllocationsAnnotation);
  if (node.empty() || allocations.empty()) return std::nullopt;
  auto decoded = protocol::DecodeMigAllocations(allocations);
  if (!decoded.ok() || decoded->empty()) return std::nullopt;
  return node;
}

// A pod pending because kube-scheduler's own filters left no node, as the live page says it.
constexpr std::string_view kNoCandidatesMessage =
    "kube-scheduler offered no node (its own filters left none for the extender)";

std::string PendingMessage(mig::Verdict verdict, const std::map<std::string, std::string>& failed) {
  std::string out =
      fmt::format("pending: no candidate node fits (best verdict: {})", mig::VerdictName(verdict));
  // The reasons closest to fitting first: those that carry the best verdict.
  const std::string best = mig::VerdictName(verdict);
  std::vector<const std::pair<const std::string, std::string>*> ordered;
  for (const auto& entry : failed) {
    if (entry.second.starts_with(best)) ordered.push_back(&entry);
  }
  for (const auto& entry : failed) {
    if (!entry.second.starts_with(best)) ordered.push_back(&entry);
  }
  size_t shown = 0;
  for (const auto* entry : ordered) {
    if (shown == 3) {
      out += fmt::format("; and {} more nodes", ordered.size() - shown);
      break;
    }
    out += fmt::format("; {}: {}", entry->first, entry->second);
    ++shown;
  }
  return out;
}

// A whole-GPU pod's pending message: every candidate's reason (the first few).
std::string WholePendingMessage(const std::map<std::string, std::string>& failed) {
  std::string out = "pending: no candidate node has the whole GPUs the pod asks for";
  size_t shown = 0;
  for (const auto& [node, reason] : failed) {
    if (shown == 3) {
      out += fmt::format("; and {} more nodes", failed.size() - shown);
      break;
    }
    out += fmt::format("; {}: {}", node, reason);
    ++shown;
  }
  return out;
}

// The lists of a request that the planner reads per GPU, within mig::kMax*Entries: without a
// bound, the pod's annotations would decide how long its filters hold the cluster state.
absl::Status CheckRequestLimits(const mig::PodRequest& r) {
  struct List {
    std::string_view annotation;
    size_t size;
    size_t limit;
  };
  const List lists[] = {
      {protocol::kMigProfilePreferenceAnnotation, r.preference.entries.size(),
       mig::kMaxPreferenceEntries},
      {protocol::kUseGpuTypeAnnotation, r.filter.use_types.size(), mig::kMaxGpuTypeEntries},
      {protocol::kNoUseGpuTypeAnnotation, r.filter.nouse_types.size(), mig::kMaxGpuTypeEntries},
      {protocol::kUseGpuUuidAnnotation, r.filter.use_uuids.size(), mig::kMaxGpuUuidEntries},
      {protocol::kNoUseGpuUuidAnnotation, r.filter.nouse_uuids.size(), mig::kMaxGpuUuidEntries},
  };
  for (const List& l : lists) {
    if (l.size > l.limit) {
      return absl::InvalidArgumentError(fmt::format("{} lists {} entries; at most {} are accepted",
                                                    l.annotation, l.size, l.limit));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> ReservationAnnotationKeys() {
  return {std::string(protocol::kVgpuNodeAnnotation), std::string(protocol::kVgpuTimeAnnotation),
          std::string(protocol::kDevicesToAllocateAnnotation),
          std::string(protocol::kDevicesAllocatedAnnotation),
          std::string(protocol::kMigAllocationsAnnotation)};
}

Extender::Extender(kube::KubeClient& client, ClusterState& state, const Clock& clock,
                   EventRecorder* events, SchedulerMetrics* metrics, ExtenderOptions options)
    : client_(client),
      state_(state),
      clock_(clock),
      events_(events),
      metrics_(metrics),
      options_(std::move(options)),
      guard_(
          BindGuardOptions{.scheduler_name = options_.scheduler_name,
                           .resources = options_.resources,
                           .reservation_ttl = options_.reservation_ttl,
                           .whole_gpu_pods = options_.whole_gpu_pods},
          options_.reservation_lookup ? options_.reservation_lookup
                                      : [this](const kube::Object& pod) { return HeldBy(pod); }),
      lock_queue_(options_.lock_queue) {}

std::optional<HeldReservation> Extender::HeldBy(const kube::Object& pod) const {
  // A reservation still in memory (between filter and bind) first, then the pod's annotations.
  if (auto assumed = state_.Assumed(PodNamespace(pod) + "/" + kube::Name(pod));
      assumed.has_value() &&
      (assumed->uid.empty() || kube::Uid(pod).empty() || assumed->uid == kube::Uid(pod))) {
    return HeldReservation{.node = assumed->reservation.node, .made = assumed->made};
  }
  return AnnotatedReservation(pod);
}

void Extender::Event(const kube::Object& pod, std::string_view type, std::string_view reason,
                     std::string message) {
  if (events_ != nullptr) events_->Record(pod, type, reason, std::move(message));
}

std::string Extender::HandleFilter(std::string_view body) {
  auto args = ParseExtenderArgs(body, &node_names_);
  if (!args.ok()) {
    if (metrics_ != nullptr) metrics_->ObserveFilter("error", absl::ZeroDuration());
    ExtenderFilterResult result;
    result.error = std::string(args.status().message());
    return ToJsonText(result);
  }
  return ToJsonText(Filter(*args));
}

std::string Extender::HandleBind(std::string_view body) {
  auto args = ParseExtenderBindingArgs(body);
  if (!args.ok()) {
    if (metrics_ != nullptr) metrics_->ObserveBind(false, absl::ZeroDuration());
    return ErrorResult(std::string(args.status().message())).dump();
  }
  return ErrorResult(Bind(*args)).dump();
}

ExtenderFilterResult Extender::Filter(const ExtenderArgs& args) {
  const absl::Duration started = clock_.Monotonic();
  ExtenderFilterResult result;
  if (args.nodes.has_value()) result.nodes = args.nodes;
  auto finish = [&](std::string_view outcome, std::string_view why = "",
                    std::string_view detail = "") {
    CountFilter(outcome, args.pod, why, clock_.Monotonic() - started, detail);
    return std::move(result);  // once per filter; a copy of thousands of FailedNodes is not free
  };
  auto fail = [&](std::string error) {
    result.node_names.clear();
    result.failed_nodes.clear();
    result.error = std::move(error);
    return finish("error");
  };
  if (std::string closed = Gate(); !closed.empty()) return fail(std::move(closed));

  const std::vector<std::string>& candidates = args.Candidates();
  const std::string ns = PodNamespace(args.pod);
  const std::string name = kube::Name(args.pod);
  if (name.empty()) return fail("ExtenderArgs: Pod has no metadata.name");
  const std::string key = ns + "/" + name;
  // Only our MIG pods (bind_guard.h); from an unauthenticated caller, the pod as the API has it.
  auto verified = VerifyFilterPod(args.pod, ns, name);
  if (!verified.ok()) return fail(std::string(verified.status().message()));
  const kube::Object& pod = verified->has_value() ? **verified : args.pod;

  // A pod that holds a reservation already (a retried filter) gets its node back.
  // The cluster state knows our assumptions and every reservation the watch delivered; a
  // reservation only the request's pod carries (another replica's, not watched yet; or one we
  // released that kube-scheduler's cache still shows) is checked against the API.
  auto is_candidate = [&](const std::string& node) {
    return std::find(candidates.begin(), candidates.end(), node) != candidates.end();
  };
  std::optional<ClusterState::AssumedInfo> assumed = AssumedFor(key, pod);
  if (assumed.has_value()) {
    // Made by an earlier filter and kept in memory until the bind writes it.
    if (is_candidate(assumed->reservation.node)) {
      result.node_names = {assumed->reservation.node};
      return finish("already-reserved");
    }
    if (assumed->binding) {
      for (const auto& node : candidates) {
        result.failed_nodes[node] =
            fmt::format("the pod holds a MIG reservation on node {}, which is being bound",
                        assumed->reservation.node);
      }
      return finish("pending", "binding");
    }
    // Its node is no longer a candidate: the reservation lives only here, so giving it back
    // touches nothing on the API server.
    state_.Forget(key);
    spdlog::info("filter {}: released the reservation on {}, which is no longer a candidate", key,
                 assumed->reservation.node);
  }
  std::optional<std::string> reserved = state_.ReservedNode(key);
  if (!reserved.has_value() && CarriedReservation(pod).has_value()) {
    auto current = client_.GetPod(ns, name);
    if (current.ok()) reserved = CarriedReservation(*current);
  }
  if (reserved.has_value()) {
    if (is_candidate(*reserved)) {
      result.node_names = {*reserved};
      return finish("already-reserved");
    }
    // Its node is no longer a candidate. An unbound pod that is not being bound gives the
    // reservation back and is planned again; otherwise it waits (the reservation expires).
    const bool unbound = kube::NodeName(pod).empty();
    const bool binding =
        AnnotationOr(pod, protocol::kBindPhaseAnnotation) == protocol::kBindPhaseAllocating;
    absl::Status released = absl::FailedPreconditionError("the pod is bound or being bound");
    if (unbound && !binding) {
      auto current = client_.GetPod(ns, name);
      released = current.ok() ? ClearReservation(*current) : current.status();
    }
    if (!released.ok()) {
      for (const auto& node : candidates) {
        result.failed_nodes[node] =
            fmt::format("the pod holds a MIG reservation on node {}, which is not a candidate ({})",
                        *reserved, std::string(released.message()));
      }
      return finish("pending", "binding");
    }
    spdlog::info("filter {}: released the reservation on {}, which is no longer a candidate", key,
                 *reserved);
  }
  if (candidates.empty()) return finish("pending", "no-candidates", kNoCandidatesMessage);

  if (options_.whole_gpu_pods && protocol::IsWholeGpuPod(pod, options_.resources)) {
    return FilterWhole(pod, key, candidates, std::move(result), started);
  }

  std::vector<std::string> warnings;
  auto request = protocol::ParsePodRequest(pod, options_.resources, &warnings);
  if (!request.ok()) {
    return fail(fmt::format("pod {}: {}", key, std::string(request.status().message())));
  }
  if (!request->WantsGpu()) {
    result.node_names = candidates;
    return finish("passthrough");
  }
  if (absl::Status bounded = CheckRequestLimits(*request); !bounded.ok()) {
    return fail(fmt::format("pod {}: {}", key, std::string(bounded.message())));
  }
  // The reservation is recorded in memory only: no pod update while kube-scheduler is still
  // deciding (it would requeue the pod and report "is in the cache, so can't be assumed"). The
  // bind writes it.
  auto decision = state_.PlanAndReserve(key, *request, candidates, clock_.Now(), kube::Uid(pod));
  if (!decision.ok()) return fail(std::string(decision.status().message()));
  result.failed_nodes = std::move(decision->failed);
  if (!decision->reservation.has_value()) {
    std::string why = PendingMessage(decision->verdict, result.failed_nodes);
    Event(pod, "Warning", "MigPending", why);
    return finish("pending", mig::VerdictName(decision->verdict), why);  // explain's classification
  }
  const Reservation& r = *decision->reservation;
  Event(pod, "Normal", "MigReserved", "reserved " + r.summary);
  result.node_names = {r.node};
  return finish("reserved");
}

ExtenderFilterResult Extender::FilterWhole(const kube::Object& pod, const std::string& key,
                                           const std::vector<std::string>& candidates,
                                           ExtenderFilterResult result, absl::Duration started) {
  auto finish = [&](std::string_view outcome, std::string_view why = "",
                    std::string_view detail = "") {
    CountFilter(outcome, pod, why, clock_.Monotonic() - started, detail);
    return std::move(result);
  };
  auto fail = [&](std::string error) {
    result.node_names.clear();
    result.failed_nodes.clear();
    result.error = std::move(error);
    return finish("error");
  };
  auto whole = protocol::ParseWholeGpuRequest(pod, options_.resources);
  if (!whole.ok()) {
    return fail(fmt::format("pod {}: {}", key, std::string(whole.status().message())));
  }
  auto decision = state_.PlanAndReserveWhole(key, *whole, candidates, clock_.Now(), kube::Uid(pod));
  if (!decision.ok()) return fail(std::string(decision.status().message()));
  result.failed_nodes = std::move(decision->failed);
  if (!decision->reservation.has_value()) {
    std::string why = WholePendingMessage(result.failed_nodes);
    Event(pod, "Warning", "MigPending", why);
    return finish("pending", mig::VerdictName(decision->verdict), why);
  }
  Event(pod, "Normal", "MigReserved", "reserved " + decision->reservation->summary);
  result.node_names = {decision->reservation->node};
  return finish("reserved");
}

std::optional<ClusterState::AssumedInfo> Extender::AssumedFor(const std::string& key,
                                                              const kube::Object& pod) {
  std::optional<ClusterState::AssumedInfo> assumed = state_.Assumed(key);
  if (assumed.has_value() && !assumed->uid.empty() && !kube::Uid(pod).empty() &&
      assumed->uid != kube::Uid(pod)) {
    // Made for an earlier pod of that name (deleted and created again): not this one's.
    state_.Forget(key);
    assumed.reset();
  }
  return assumed;
}

absl::StatusOr<std::optional<kube::Object>> Extender::VerifyFilterPod(const kube::Object& pod,
                                                                      const std::string& ns,
                                                                      const std::string& name) {
  if (absl::Status ours = guard_.CheckFilter(pod); !ours.ok()) {
    Event(pod, "Warning", "MigFilterRefused", std::string(ours.message()));
    return ours;
  }
  if (options_.trusted_callers) return std::nullopt;
  auto stored = client_.GetPod(ns, name);
  if (!stored.ok()) {
    return absl::Status(
        stored.status().code(),
        fmt::format("pod {}/{}: {}", ns, name, std::string(stored.status().message())));
  }
  const std::string uid = kube::Uid(pod);
  if (!uid.empty() && kube::Uid(*stored) != uid) {
    return absl::FailedPreconditionError(fmt::format(
        "pod {}/{}: the pod has uid {}, not {} (recreated?)", ns, name, kube::Uid(*stored), uid));
  }
  if (absl::Status ours = guard_.CheckFilter(*stored); !ours.ok()) {
    Event(*stored, "Warning", "MigFilterRefused", std::string(ours.message()));
    return ours;
  }
  return std::optional<kube::Object>(std::move(*stored));
}

absl::Status Extender::WriteReservation(const kube::Object& pod, const Reservation& r,
                                        absl::Time now, const kube::KeyPatch& also) {
  const std::string ns = PodNamespace(pod);
  const std::string name = kube::Name(pod);
  auto devices = protocol::EncodePodDevices(r.devices);
  if (!devices.ok()) return devices.status();
  const std::string allocations = protocol::EncodeMigAllocations(r.allocations);
  kube::MetadataPatch patch;
  patch.annotations[std::string(protocol::kVgpuNodeAnnotation)] = r.node;
  patch.annotations[std::string(protocol::kVgpuTimeAnnotation)] =
      std::to_string(absl::ToUnixSeconds(now));
  patch.annotations[std::string(protocol::kDevicesToAllocateAnnotation)] = *devices;
  patch.annotations[std::string(protocol::kDevicesAllocatedAnnotation)] = *devices;
  // A whole-GPU reservation is the device lists alone (no MIG allocations entry).
  const bool whole = r.allocations.empty();
  if (!whole) patch.annotations[std::string(protocol::kMigAllocationsAnnotation)] = allocations;
  // Not the hami.io/vgpu-node label: kube-scheduler v1.20 ignores only annotation (and nodeName)
  // updates of a pod it has assumed; a label written now would requeue the pod, whose second
  // attempt fails with "pod <uid> is in the cache, so can't be assumed" (a FailedScheduling
  // Warning and PodScheduled=False on a pod that binds fine). The bind writes it once bound.
  for (const auto& [k, v] : also) patch.annotations[k] = v;
  patch.resource_version = kube::ResourceVersion(pod);
  const std::string uid = kube::Uid(pod);

  // Checks the pod as read from the API: can our reservation go on this version of it?
  // OK(true) when it already carries exactly our reservation.
  auto examine = [&](const kube::Object& current) -> absl::StatusOr<bool> {
    if (!uid.empty() && kube::Uid(current) != uid) {
      return absl::AbortedError(
          fmt::format("the pod was recreated (uid {} is now {})", uid, kube::Uid(current)));
    }
    if (AnnotationOr(current, protocol::kVgpuNodeAnnotation) == r.node &&
        (whole ? WholeGpuReservationNode(current).has_value() &&
                     AnnotationOr(current, protocol::kDevicesAllocatedAnnotation) == *devices
               : AnnotationOr(current, protocol::kMigAllocationsAnnotation) == allocations)) {
      return true;
    }
    if (auto other = CarriedReservation(current); other.has_value()) {
      return absl::AbortedError(fmt::format(
          "the pod was changed concurrently: it now holds another reservation, on node {}",
          *other));
    }
    if (!kube::NodeName(current).empty()) {
      return absl::AbortedError(
          fmt::format("the pod was bound to node {} meanwhile", kube::NodeName(current)));
    }
    return false;
  };

  // The reservation is there already (an earlier attempt): the other annotations still go on.
  auto write_also = [&]() -> absl::Status {
    if (also.empty()) return absl::OkStatus();
    return client_.PatchPodAnnotations(ns, name, also).status();
  };
  if (patch.resource_version.empty()) {
    // No version to hold the write to: read the pod first.
    auto current = client_.GetPod(ns, name);
    if (!current.ok()) return current.status();
    auto done = examine(*current);
    if (!done.ok()) return done.status();
    if (*done) return write_also();
    patch.resource_version = kube::ResourceVersion(*current);
  }
  absl::Status last;
  for (int attempt = 0; attempt < std::max(1, options_.patch_attempts); ++attempt) {
    auto patched = client_.PatchPodMetadata(ns, name, patch);
    if (patched.ok()) return absl::OkStatus();
    last = patched.status();
    if (last.code() != absl::StatusCode::kAborted) return last;
    auto current = client_.GetPod(ns, name);
    if (!current.ok()) return current.status();
    auto done = examine(*current);
    if (!done.ok()) return done.status();
    if (*done) return write_also();
    patch.resource_version = kube::ResourceVersion(*current);
  }
  return absl::AbortedError(fmt::format("the pod kept changing ({} attempts): {}",
                                        options_.patch_attempts, std::string(last.message())));
}

absl::Status Extender::ClearReservation(const kube::Object& pod) {
  const std::string ns = PodNamespace(pod);
  const std::string name = kube::Name(pod);
  kube::MetadataPatch patch;
  for (const auto& key : ReservationAnnotationKeys()) patch.annotations[key] = std::nullopt;
  patch.annotations[std::string(protocol::kBindPhaseAnnotation)] = std::nullopt;
  patch.annotations[std::string(protocol::kBindTimeAnnotation)] = std::nullopt;
  patch.labels[std::string(protocol::kVgpuNodeLabel)] = std::nullopt;
  patch.resource_version = kube::ResourceVersion(pod);
  auto patched = client_.PatchPodMetadata(ns, name, patch);
  if (!patched.ok()) return patched.status();
  state_.Forget(ns + "/" + name);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Reservation>> Extender::ReservationForBind(const kube::Object& pod,
                                                                        const std::string& node,
                                                                        absl::Time now) {
  const std::string ns = PodNamespace(pod);
  const std::string key = ns + "/" + kube::Name(pod);
  // Written already (a retried bind, or a reservation from before this scheduler kept them in
  // memory): it must be on this node.
  if (const std::optional<std::string> carried = CarriedReservation(pod); carried.has_value()) {
    if (*carried != node) {
      return absl::FailedPreconditionError(
          fmt::format("the pod's MIG reservation is on node {}, not {}", *carried, node));
    }
    return std::nullopt;
  }
  // Made by this scheduler's filter and kept in memory.
  // Made by this scheduler's filter and kept in memory (BindGuard found it; a replica that
  // restarted or took over leadership since the filter holds none and refused the bind there).
  auto claimed = state_.ClaimForBind(key, kube::Uid(pod), node, now);
  if (!claimed.ok()) return claimed.status();
  return std::optional<Reservation>(std::move(*claimed));
}

std::string Extender::Bind(const ExtenderBindingArgs& args) {
  const absl::Duration started = clock_.Monotonic();
  auto finish = [&](std::string error) {
    if (metrics_ != nullptr) metrics_->ObserveBind(error.empty(), clock_.Monotonic() - started);
    if (!error.empty()) {
      spdlog::info("bind {}/{} to {}: {}", args.pod_namespace, args.pod_name, args.node, error);
    }
    return error;
  };
  if (std::string closed = Gate(); !closed.empty()) return finish(std::move(closed));
  const std::string& ns = args.pod_namespace;
  const std::string& name = args.pod_name;
  const std::string key = ns + "/" + name;
  auto pod = client_.GetPod(ns, name);
  if (!pod.ok()) {
    return finish(fmt::format("bind {}: {}", key, std::string(pod.status().message())));
  }
  const absl::Time now = clock_.Now();
  // Bind only what this extender reserved (bind_guard.h), judged on the pod as the API has it.
  if (absl::Status allowed = guard_.CheckBind(*pod, args.pod_uid, args.node, now); !allowed.ok()) {
    // A wrong or missing uid is a bad request about some other object: no event on this pod.
    if (allowed.code() != absl::StatusCode::kInvalidArgument && kube::Uid(*pod) == args.pod_uid) {
      Event(*pod, "Warning", "MigBindRefused", std::string(allowed.message()));
    }
    return finish(std::string(allowed.message()));
  }
  // Already bound (a retried bind whose answer was lost, or a second scheduler loop): never touch
  // the lock or bind-phase of a pod the device plugin may be allocating or has allocated.
  if (const std::string bound_to = kube::NodeName(*pod); !bound_to.empty()) {
    if (bound_to == args.node) return finish("");
    return finish(fmt::format("bind {}: the pod is already bound to node {}", key, bound_to));
  }
  // The reservation to write now (nullopt: the pod carries it already).
  auto reservation = ReservationForBind(*pod, args.node, now);
  if (!reservation.ok()) {
    return finish(fmt::format("bind {}: {}", key, std::string(reservation.status().message())));
  }
  // From here on the in-memory reservation is marked as being bound; it stays (until the watch
  // delivers the annotation, or expiry) whatever the outcome, so a retry finds it.
  struct EndBind {
    ClusterState& state;
    const std::string& key;
    bool active;
    ~EndBind() {
      if (active) state.EndBind(key);
    }
  } end_bind{state_, key, reservation->has_value()};

  // The lock names the pod's UID as the API has it (CheckBind verified it is the bind's).
  const std::string uid = kube::Uid(*pod);
  const LockOwner owner{ns, name, uid};
  if (absl::Status locked =
          lock_queue_.Acquire(client_, args.node, owner, clock_, options_.node_lock);
      !locked.ok()) {
    return finish(fmt::format("bind {}: {}", key, std::string(locked.message())));
  }
  auto fail = [&](std::string error) {
    if (absl::Status st = ReleaseNodeLock(client_, args.node, owner, options_.node_lock);
        !st.ok()) {
      error +=
          fmt::format(" (and the node lock could not be released: {})", std::string(st.message()));
    }
    kube::KeyPatch phase;
    phase[std::string(protocol::kBindPhaseAnnotation)] = std::string(protocol::kBindPhaseFailed);
    if (auto st = client_.PatchPodAnnotations(ns, name, phase); !st.ok()) {
      spdlog::warn("bind {}: cannot mark bind-phase failed: {}", key,
                   std::string(st.status().message()));
    }
    return finish(std::move(error));
  };
  kube::KeyPatch phase;
  phase[std::string(protocol::kBindPhaseAnnotation)] = std::string(protocol::kBindPhaseAllocating);
  phase[std::string(protocol::kBindTimeAnnotation)] = std::to_string(absl::ToUnixSeconds(now));
  if (reservation->has_value()) {
    // The pod is assumed by kube-scheduler now (it ignores annotation-only updates of an
    // assumed pod): the reservation and bind-phase go on in one patch.
    if (absl::Status st = WriteReservation(*pod, **reservation, now, phase); !st.ok()) {
      return fail(fmt::format("bind {}: the reservation ({}) could not be written: {}", key,
                              (*reservation)->summary, std::string(st.message())));
    }
  } else if (auto st = client_.PatchPodAnnotations(ns, name, phase); !st.ok()) {
    return fail(
        fmt::format("bind {}: cannot set bind-phase: {}", key, std::string(st.status().message())));
  }
  absl::Status bound = client_.BindPod(ns, name, args.node, args.pod_uid);
  if (!bound.ok() && bound.code() == absl::StatusCode::kAlreadyExists) {
    // A retried bind: the pod is bound already. Fine when it is bound where we reserved.
    auto current = client_.GetPod(ns, name);
    if (current.ok() && kube::NodeName(*current) == args.node) bound = absl::OkStatus();
  }
  if (!bound.ok()) return fail(fmt::format("bind {}: {}", key, std::string(bound.message())));
  // The label that mirrors hami.io/vgpu-node, now that kube-scheduler no longer queues the pod
  // (an assigned pod's updates only refresh its cache). Best effort: the pod is bound, and
  // nothing of dynmig's reads the label.
  if (kube::Label(*pod, protocol::kVgpuNodeLabel) != args.node) {
    kube::MetadataPatch label;
    label.labels[std::string(protocol::kVgpuNodeLabel)] = args.node;
    if (auto st = client_.PatchPodMetadata(ns, name, label); !st.ok()) {
      spdlog::warn("bind {}: cannot label the pod {}={}: {}", key, protocol::kVgpuNodeLabel,
                   args.node, std::string(st.status().message()));
    }
  }
  if (metrics_ != nullptr) ObserveBound(*pod, key, *reservation, clock_.Now());
  return finish("");
}

void Extender::CountFilter(std::string_view outcome, const kube::Object& pod, std::string_view why,
                           absl::Duration took, std::string_view detail) {
  if (metrics_ == nullptr) return;
  metrics_->ObserveFilter(outcome, took);
  if (kube::Name(pod).empty() || outcome == "error") return;
  const std::string key = PodNamespace(pod) + "/" + kube::Name(pod);
  if (outcome == "pending") {
    metrics_->PodPending(key, why, clock_.Now(), detail);
  } else {
    metrics_->PodDone(key);
  }
}

void Extender::ObserveBound(const kube::Object& pod, const std::string& key,
                            const std::optional<Reservation>& written, absl::Time now) {
  metrics_->PodDone(key);
  std::vector<std::string> profiles;
  if (written.has_value()) {
    for (const auto& a : written->allocations) profiles.push_back(a.profile);
  } else if (auto carried = protocol::DecodeMigAllocations(
                 AnnotationOr(pod, protocol::kMigAllocationsAnnotation));
             carried.ok()) {
    for (const auto& a : *carried) profiles.push_back(a.profile);
  }
  const auto meta = pod.find("metadata");
  if (profiles.empty() || meta == pod.end() || !meta->is_object()) return;
  const auto created = meta->find("creationTimestamp");
  if (created == meta->end() || !created->is_string()) return;
  auto at = kube::ParseRfc3339(created->get<std::string>());
  if (at.ok()) metrics_->ObserveWait(profiles, now - *at);
}

Extender::ExpiryResult Extender::ExpireReservations() {
  ExpiryResult out;
  if (!Gate().empty()) return out;
  const absl::Time now = clock_.Now();
  const absl::Time deadline = now - options_.reservation_ttl;
  const int64_t cutoff = absl::ToUnixSeconds(deadline);
  const std::string ttl = absl::FormatDuration(options_.reservation_ttl);
  for (const std::string& key : state_.UnrealizedBefore(deadline)) {
    const size_t slash = key.find('/');
    const std::string ns = key.substr(0, slash);
    const std::string name = key.substr(slash + 1);
    auto pod = client_.GetPod(ns, name);
    if (!pod.ok()) {
      if (pod.status().code() == absl::StatusCode::kNotFound) {
        state_.Forget(key);
        if (metrics_ != nullptr) metrics_->CountExpiry("forgotten");
        out.released.push_back(key);
      } else {
        out.errors.push_back(fmt::format("{}: {}", key, std::string(pod.status().message())));
      }
      continue;
    }
    const std::string allocations = AnnotationOr(*pod, protocol::kMigAllocationsAnnotation);
    if (allocations.empty() && !WholeGpuReservationNode(*pod).has_value()) {
      // Our assumption never reached the pod.
      state_.Forget(key);
      if (metrics_ != nullptr) metrics_->CountExpiry("forgotten");
      out.released.push_back(key);
      continue;
    }
    const std::string time_text = AnnotationOr(*pod, protocol::kVgpuTimeAnnotation);
    const int64_t reserved_at = std::atoll(time_text.c_str());
    if (reserved_at >= cutoff) {
      out.kept.push_back(key);  // reserved again since our cache saw it
      continue;
    }
    const std::string phase = AnnotationOr(*pod, protocol::kBindPhaseAnnotation);
    if (kube::NodeName(*pod).empty()) {
      const int64_t bind_time =
          std::atoll(AnnotationOr(*pod, protocol::kBindTimeAnnotation).c_str());
      if (phase == protocol::kBindPhaseAllocating && bind_time >= cutoff) {
        out.kept.push_back(key);  // a bind is in progress
        continue;
      }
      const std::string node = AnnotationOr(*pod, protocol::kVgpuNodeAnnotation);
      if (absl::Status st = ClearReservation(*pod); !st.ok()) {
        out.errors.push_back(fmt::format("{}: {}", key, std::string(st.message())));
        continue;
      }
      if (metrics_ != nullptr) metrics_->CountExpiry("released");
      Event(*pod, "Warning", "MigReservationExpired",
            fmt::format("released the MIG reservation on node {}: the pod was not bound within "
                        "the reservation TTL ({})",
                        node, ttl));
      out.released.push_back(key);
      continue;
    }
    if (phase == protocol::kBindPhaseFailed) {
      state_.ReleaseUnrealized(key);
      if (metrics_ != nullptr) metrics_->CountExpiry("bind-failed");
      Event(*pod, "Warning", "MigReservationReleased",
            fmt::format("released the unrealized MIG reservations on node {}: the device plugin "
                        "reported hami.io/bind-phase=failed",
                        kube::NodeName(*pod)));
      out.released.push_back(key);
      continue;
    }
    out.kept.push_back(key);
    spdlog::warn(
        "pod {} is bound to {} with an unrealized MIG reservation older than {} "
        "(bind-phase \"{}\"): kept until the device plugin finishes or the pod ends",
        key, kube::NodeName(*pod), ttl, phase);
  }
  return out;
}

}  // namespace dynmig::scheduler
