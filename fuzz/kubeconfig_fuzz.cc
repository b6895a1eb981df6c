// kubeconfig YAML: parsing (current context and a named one) never crashes.
#include "fuzz/fuzz_util.h"
#include "kube/rest_config.h"

namespace dynmig::fuzz {

int FuzzKubeconfig(const uint8_t* data, size_t size) {
  const std::string_view yaml = AsText(data, size);
  (void)kube::ParseKubeconfig(yaml, "/nonexistent");
  (void)kube::ParseKubeconfig(yaml, "", "dev");
  return 0;
}

}  // namespace dynmig::fuzz
