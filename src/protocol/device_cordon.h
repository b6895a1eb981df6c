// Per-GPU cordon, compatible with HAMi's: the `hami.io/device-cordon` Node annotation is a comma
// list of physical GPU UUIDs that take no new reservation (pods already running on them stay),
// read live by the scheduler (HAMi PR #2298, issue #2289: "GPU-xxxx,GPU-yyyy", entries trimmed).
// dynmig adds `dynmig.io/device-cordon-reasons`, a JSON object GPU UUID -> why and by whom
// ({"GPU-…":"bad ECC (by alice)"}), written with it by `dynmig gpu cordon` and shown by
// `dynmig explain`; HAMi ignores it.
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "protocol/annotations.h"

namespace dynmig::protocol {

inline constexpr std::string_view kDeviceCordonReasonsAnnotation =
    "dynmig.io/device-cordon-reasons";

// Bounds of both annotations: a node has at most a few dozen GPUs.
inline constexpr size_t kMaxCordonBytes = 8 * 1024;
inline constexpr size_t kMaxCordonedGpus = 64;
inline constexpr size_t kMaxCordonUuid = 128;
inline constexpr size_t kMaxCordonReasonsBytes = 32 * 1024;
inline constexpr size_t kMaxCordonReason = 256;

// Entries are trimmed of spaces and tabs and empty ones skipped, as HAMi does. kInvalidArgument
// naming the annotation and the entry for: a value over kMaxCordonBytes, more than
// kMaxCordonedGpus entries, an entry over kMaxCordonUuid characters or with a character that is
// not printable ASCII or is a space inside it. A UUID no GPU of the node has is not an error here
// (the caller decides: the scheduler ignores it, the CLI refuses to write it).
absl::StatusOr<std::set<std::string>> ParseDeviceCordon(std::string_view value);
// "GPU-a,GPU-b" (sorted); "" for none.
std::string EncodeDeviceCordon(const std::set<std::string>& uuids);

// The reasons object. kInvalidArgument naming the key for: not a JSON object of strings, over
// kMaxCordonReasonsBytes, more than kMaxCordonedGpus keys, a key that is not a valid entry (as
// above) or a reason over kMaxCordonReason characters or with control characters.
absl::StatusOr<std::map<std::string, std::string>> ParseCordonReasons(std::string_view value);
std::string EncodeCordonReasons(const std::map<std::string, std::string>& reasons);

// Whether `reason` is one ParseCordonReasons accepts ("" = why not).
std::string CheckCordonReason(std::string_view reason);

}  // namespace dynmig::protocol
