// Which profile a memory request resolves to on a GPU model, and the notes a user should read when
// that is surprising: a profile with less memory than asked (nominal matching: 20000 MiB gets
// 3g.20gb, whose NVML memory on an A100-40GB is 19968 MiB), or one more than twice the request
// (NVML matching: 20000 MiB needs 7g.40gb there). The admission webhook returns the notes as
// AdmissionReview warnings; `dynmig plan` and `explain` print them. Pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mig/preference.h"
#include "mig/profile.h"

namespace dynmig::mig {

// The profile one instance of `request_mib` gets on `cap` (sized as `match` says), among the
// `allowed` profile names: the first preferred profile that covers it, else the smallest that
// does (DefaultProfileLess). nullptr when none covers it.
const ProfileSpec* ResolveProfile(const GpuCapability& cap, const std::vector<std::string>& allowed,
                                  uint64_t request_mib, const Preference& preference,
                                  MemoryMatch match);

// The note for `cap`, one short line naming the model, or nullopt when the resolution is as
// expected. `resource` names the request in the note (nvidia.com/gpumem).
std::optional<std::string> SizingNote(const GpuCapability& cap,
                                      const std::vector<std::string>& allowed, uint64_t request_mib,
                                      const Preference& preference, MemoryMatch match,
                                      std::string_view resource);

// A model's display name: the NVML name without its "NVIDIA " prefix.
std::string ModelDisplayName(std::string_view nvml_name);

}  // namespace dynmig::mig
