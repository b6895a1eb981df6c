// `nvidia.com/mig-profile-preference`: an ordered, comma-separated list of exact profile names
// ("4g.20gb") or slice classes ("4g"). A bias among the profiles that cover a request, never a
// reason to reject. Pure.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dynmig::mig {

struct Preference {
  std::vector<std::string> entries;  // trimmed, non-empty, first occurrence kept
  bool empty() const { return entries.empty(); }
};

// Splits on ',', trims, drops empty pieces and duplicates: " 4g , 3g.20gb ,, 4g " -> [4g, 3g.20gb].
Preference ParsePreference(std::string_view value);

// Whether `entry` names `profile`: equal to the full name or to its slice class.
bool PreferenceEntryMatches(std::string_view entry, std::string_view profile);

}  // namespace dynmig::mig
