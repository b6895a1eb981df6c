#include "mig/request.h"

#include <string_view>

#include "fmt/format.h"

namespace dynmig::mig {

std::string PlanKey(const PodRequest& r) {
  std::string key;
  key.reserve(64);
  auto add = [&key](std::string_view s) {
    key.append(std::to_string(s.size())).push_back(':');
    key.append(s);
  };
  for (const auto& c : r.containers) {
    key.append(
        fmt::format("c{},{},{},{};", c.init ? 1 : 0, c.count, c.memory.mib, c.memory.percent));
  }
  key.push_back('|');
  for (const auto& e : r.preference.entries) add(e);
  for (const auto* list :
       {&r.filter.use_uuids, &r.filter.nouse_uuids, &r.filter.use_types, &r.filter.nouse_types}) {
    key.push_back('|');
    for (const auto& e : *list) add(e);
  }
  key.push_back('|');
  add(r.filter.vgpu_mode);
  key.append(fmt::format("|{}{}", static_cast<int>(r.gpu_policy), static_cast<int>(r.node_policy)));
  return key;
}

}  // namespace dynmig::mig
