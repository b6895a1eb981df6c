// The bounded JSON parser (common/bounded_json.h): any text is parsed or refused without crashing,
// and whatever it accepts is within its limits, so that walking it (dump(), copies) cannot
// recurse deeper than the limit.
#include "common/bounded_json.h"
#include "fuzz/fuzz_util.h"

namespace dynmig::fuzz {

int FuzzBoundedJson(const uint8_t* data, size_t size) {
  constexpr JsonLimits kLimits{kMiB, 16};
  const std::string_view text = AsText(data, size);
  auto parsed = ParseBoundedJson(text, kLimits, "input");
  if (!parsed.ok()) return 0;
  Check(JsonNestingDepth(text, kLimits.max_depth) <= kLimits.max_depth,
        "accepted text deeper than the limit");
  const std::string again = parsed->dump();
  Check(JsonNestingDepth(again, kLimits.max_depth) <= kLimits.max_depth,
        "an accepted document is deeper than the limit");
  auto reparsed = ParseBoundedJson(again, {again.size(), kLimits.max_depth}, "dump");
  Check(reparsed.ok() && *reparsed == *parsed, "an accepted document changes through dump/parse");
  return 0;
}

}  // namespace dynmig::fuzz
