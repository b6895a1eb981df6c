// The one parser for JSON text that may come from an attacker (HTTP bodies, API responses,
// annotation values): a byte-size limit and a nesting-depth limit are checked before nlohmann
// builds anything, so no input can drive a later recursive walk (dump(), copy, comparison) into a
// stack overflow or make the parser allocate without bound. Every limit of every JSON input is a
// named constant here, with the reason for its number.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace dynmig {

struct JsonLimits {
  size_t max_bytes = 0;  // the text's length in bytes
  int max_depth = 0;     // arrays and objects open at once: "[]" is 1 deep, "[{}]" 2
};

inline constexpr size_t kKiB = size_t{1} << 10;
inline constexpr size_t kMiB = size_t{1} << 20;

// Depth of every Kubernetes object we read (pods, nodes, leases, events, configmaps, Status) and
// of the bodies that carry them: a Pod is under 32 levels deep, its managedFields included, and a
// list or watch event adds 2. 64 is generous for all of them.
inline constexpr int kKubeObjectDepth = 64;

// The real apiserver refuses request bodies over 3 MiB (MaxRequestBodyBytes, HTTP 413), so no
// object it stores is larger.
inline constexpr size_t kApiRequestBytes = 3 * kMiB;

// An annotation value: Kubernetes caps all annotations of one object at 256 KiB together
// (TotalAnnotationSizeLimitB). The deepest JSON annotation of the protocol is the node register
// at 6 levels (GPUs, a GPU, its migProfiles, a profile, its placements, a placement); the pod
// annotations are at most 3 (allocations, an allocation, its placement). 8 leaves room for a new
// field without letting input recurse.
inline constexpr JsonLimits kAnnotationJsonLimits{256 * kKiB, 8};

// An AdmissionReview body: an UPDATE carries both object and oldObject, each at most the
// apiserver's 3 MiB, plus the envelope (userInfo, options); 7 MiB holds both.
inline constexpr JsonLimits kAdmissionReviewJsonLimits{2 * kApiRequestBytes + kMiB,
                                                       kKubeObjectDepth};

// The extender's /filter body (ExtenderArgs): the pod (at most 3 MiB) plus NodeNames (5000 nodes
// of at most 253 bytes: 1.3 MiB) or, without nodeCacheCapable, the candidate Nodes in full (a
// node object is typically 5-20 KiB, so 16 MiB holds about a thousand). It is also the scheduler
// HTTP server's body limit (ServerOptions::max_body_bytes).
inline constexpr JsonLimits kExtenderArgsJsonLimits{16 * kMiB, kKubeObjectDepth};

// The extender's /bind body (ExtenderBindingArgs): four names of at most 253 bytes each.
inline constexpr JsonLimits kExtenderBindingJsonLimits{64 * kKiB, 8};

// One object or one watch event from the API server: at most the apiserver's 3 MiB object with
// room for the event envelope and the server's own fields (status, managedFields) added after the
// write. 64 MiB stays far above that and still bounds a hostile or broken endpoint.
inline constexpr JsonLimits kKubeObjectJsonLimits{64 * kMiB, kKubeObjectDepth};

// A response of the API server: a list page of 500 items (the page size every list here uses)
// of typical 5-50 KiB pods or nodes is tens of MiB; an unpaged list of a large cluster more. 1 GiB
// bounds the buffer against a broken or hostile endpoint without refusing any real list.
inline constexpr JsonLimits kKubeResponseJsonLimits{1024 * kMiB, kKubeObjectDepth};

// A container's verbose status info from the container runtime (containerd's info["info"]: the
// container's OCI runtime spec with its env, mounts and hooks, plus a few runtime fields). A spec
// is tens of KiB and about 6 levels deep; 4 MiB and 32 levels bound a hostile runtime answer
// without refusing a real one.
inline constexpr JsonLimits kCriInfoJsonLimits{4 * kMiB, 32};

// "3 MiB", "256 KiB", "3145729 bytes (3.0 MiB)" or "1234 bytes".
std::string FormatBytes(size_t bytes);

// `text` with every byte outside printable ASCII written as \xNN, so that a message quoting
// input (a parser's "last read: '...'") is valid UTF-8 wherever it goes: nlohmann's dump() throws
// on invalid UTF-8.
std::string PrintableText(std::string_view text);

// The deepest nesting of arrays and objects in `text`, counting brackets outside strings, and
// stopping as soon as it exceeds `stop_above` (then returns stop_above + 1). O(n), no allocation.
// Does not validate the text: nlohmann does that after.
int JsonNestingDepth(std::string_view text, int stop_above);

// Whether `text` is within `limits`: kInvalidArgument "<what>: 3 MiB exceeds the 1 MiB limit" or
// "<what>: nesting deeper than 64 levels" otherwise.
absl::Status CheckJsonLimits(std::string_view text, const JsonLimits& limits,
                             std::string_view what);

// Parses `text` as JSON after checking it against `limits`. Errors (all kInvalidArgument, the
// message starting with `what`): "<what>: 3 MiB exceeds the 1 MiB limit", "<what>: nesting deeper
// than 64 levels", "<what>: invalid JSON: <the parser's message, PrintableText>".
absl::StatusOr<nlohmann::json> ParseBoundedJson(std::string_view text, const JsonLimits& limits,
                                                std::string_view what);

}  // namespace dynmig
