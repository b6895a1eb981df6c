// The scheduler extender's request bodies (ExtenderArgs for filter, ExtenderBindingArgs for bind):
// parsing never crashes, with or without the node-names cache (whose fast path parses pieces of
// the body).
#include "fuzz/fuzz_util.h"
#include "scheduler/extender_api.h"

namespace dynmig::fuzz {

int FuzzExtenderArgs(const uint8_t* data, size_t size) {
  const std::string_view body = AsText(data, size);
  (void)scheduler::ParseExtenderArgs(body);
  scheduler::NodeNamesCache cache;
  for (int i = 0; i < 2; ++i) {  // the second call finds the node names in the cache
    (void)scheduler::ParseExtenderArgs(body, &cache);
  }
  (void)scheduler::ParseExtenderBindingArgs(body);
  return 0;
}

}  // namespace dynmig::fuzz
