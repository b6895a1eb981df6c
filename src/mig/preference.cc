#include "mig/preference.h"

#include <unordered_set>

#include "common/strings.h"
#include "mig/profile.h"

namespace dynmig::mig {

Preference ParsePreference(std::string_view value) {
  Preference out;
  // Linear in the value's length: the value is a user's annotation (up to 256 KiB).
  std::unordered_set<std::string> seen;
  for (auto& piece : SplitTrimmed(value, ',')) {
    if (seen.insert(piece).second) out.entries.push_back(std::move(piece));
  }
  return out;
}

bool PreferenceEntryMatches(std::string_view entry, std::string_view profile) {
  return entry == profile || entry == SliceClass(profile);
}

}  // namespace dynmig::mig
