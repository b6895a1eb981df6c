// The defragmenter's two annotations (docs/scheduler.md, "Defragmenter").
//
// `dynmig.io/defrag` on a Pod, set by its owner: "allow" (the pod may be moved, and is preferred
// when a plan has a choice) or "never" (the defragmenter never evicts it). Absent: the pod may be
// moved under the default rules. Any other value is refused by ParseDefragPolicy; the
// defragmenter treats a pod with such a value as "never" (an unclear wish protects the pod) and
// says so in its events.
//
// `dynmig.io/defrag-reservation` on a Node, written by the scheduler's defragmenter (and
// `dynmig defrag --apply`) alone: the slices a defragmentation freed, reserved for the waiting pod
// until it lands there or the reservation expires. A JSON array, sorted by GPU and start:
//   [{"gpuUUID":"GPU-…","placement":{"start":0,"size":8},"profile":"7g.80gb",
//     "pod":"ns/name","podUID":"…","created":1700000000,"expires":1700000600,
//     "evicted":["ns/a","ns/b"]}]
// At most kMaxDefragReservations entries of at most kMaxDefragEvicted evicted pods each.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "mig/placement.h"

namespace dynmig::protocol {

inline constexpr std::string_view kDefragPodAnnotation = "dynmig.io/defrag";
inline constexpr std::string_view kDefragAllow = "allow";
inline constexpr std::string_view kDefragNever = "never";

enum class DefragPolicy {
  kDefault,  // absent: movable under the default rules
  kAllow,    // opted in: preferred
  kNever,    // opted out: never evicted
};

// The value of dynmig.io/defrag: exactly "allow" or "never" (surrounding blanks ignored).
// Errors: kInvalidArgument naming the annotation, the value (cut to 64 bytes) and the choices.
absl::StatusOr<DefragPolicy> ParseDefragPolicy(std::string_view value);

inline constexpr std::string_view kNodeDefragReservationAnnotation = "dynmig.io/defrag-reservation";
inline constexpr size_t kMaxDefragReservations = 16;  // per node
inline constexpr size_t kMaxDefragEvicted = 64;       // per reservation

struct DefragReservation {
  std::string gpu_uuid;
  mig::Placement placement;
  std::string profile;               // exact profile name the slices were freed for
  std::string pod;                   // namespace/name of the waiting pod
  std::string pod_uid;               // its uid ("" when unknown: any pod of that name)
  int64_t created = 0;               // unix seconds
  int64_t expires = 0;               // unix seconds: no longer honoured from then on
  std::vector<std::string> evicted;  // namespace/name of the pods evicted for it

  friend bool operator==(const DefragReservation&, const DefragReservation&) = default;
};

// Strict: kInvalidArgument naming the element and field for anything that is not such an array
// (a missing GPU, pod or profile, a pod that is not namespace/name, a bad placement, expires not
// after created, more than the bounds above).
absl::StatusOr<std::vector<DefragReservation>> DecodeDefragReservations(std::string_view value);

// Sorted by GPU UUID, then start.
std::string EncodeDefragReservations(std::vector<DefragReservation> reservations);

}  // namespace dynmig::protocol
