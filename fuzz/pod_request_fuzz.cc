// Pod requests: any JSON document (a pod, or not) is parsed or refused without crashing, and the
// three pod predicates agree (a MIG pod requests GPU resources).
#include "fuzz/fuzz_util.h"
#include "nlohmann/json.hpp"
#include "protocol/pod_request.h"

namespace dynmig::fuzz {

int FuzzPodRequest(const uint8_t* data, size_t size) {
  const auto pod = nlohmann::json::parse(AsText(data, size), nullptr, /*allow_exceptions=*/false);
  if (pod.is_discarded()) return 0;
  std::vector<std::string> warnings;
  (void)protocol::ParsePodRequest(pod, {}, &warnings);
  const bool requests = protocol::RequestsGpuResources(pod);
  const bool mig = protocol::IsMigPod(pod);
  Check(!mig || requests, "IsMigPod without RequestsGpuResources");
  (void)protocol::PodAnnotation(pod, "nvidia.com/mig-profile-preference");
  return 0;
}

}  // namespace dynmig::fuzz
