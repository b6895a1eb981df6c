// The scheduler extender's request bodies (ExtenderArgs for filter, ExtenderBindingArgs for bind):
// parsing never crashes.
#include "fuzz/fuzz_util.h"
#include "scheduler/extender_api.h"

namespace dynmig::fuzz {

int FuzzExtenderArgs(const uint8_t* data, size_t size) {
  const std::string_view body = AsText(data, size);
  (void)scheduler::ParseExtenderArgs(body);
  (void)scheduler::ParseExtenderBindingArgs(body);
  return 0;
}

}  // namespace dynmig::fuzz
