#include "mig/preference.h"

#include <algorithm>

#include "common/strings.h"
#include "mig/profile.h"

namespace dynmig::mig {

Preference ParsePreference(std::string_view value) {
  Preference out;
  for (auto& piece : SplitTrimmed(value, ',')) {
    if (std::find(out.entries.begin(), out.entries.end(), piece) == out.entries.end()) {
      out.entries.push_back(std::move(piece));
    }
  }
  return out;
}

bool PreferenceEntryMatches(std::string_view entry, std::string_view profile) {
  return entry == profile || entry == SliceClass(profile);
}

}  // namespace dynmig::mig
