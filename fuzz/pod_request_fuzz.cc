// Pod requests: any JSON document (a pod, or not) is parsed or refused without crashing, and the
// three pod predicates agree (a MIG pod requests GPU resources).
#include "common/bounded_json.h"
#include "fuzz/fuzz_util.h"
#include "nlohmann/json.hpp"
#include "protocol/pod_request.h"

namespace dynmig::fuzz {

int FuzzPodRequest(const uint8_t* data, size_t size) {
  // Pods reach these functions only through the bounded parsers (API responses, webhook bodies).
  const auto parsed = ParseBoundedJson(AsText(data, size), kKubeObjectJsonLimits, "pod");
  if (!parsed.ok()) return 0;
  const nlohmann::json& pod = *parsed;
  std::vector<std::string> warnings;
  (void)protocol::ParsePodRequest(pod, {}, &warnings);
  const bool requests = protocol::RequestsGpuResources(pod);
  const bool mig = protocol::IsMigPod(pod);
  Check(!mig || requests, "IsMigPod without RequestsGpuResources");
  (void)protocol::PodAnnotation(pod, "nvidia.com/mig-profile-preference");
  return 0;
}

}  // namespace dynmig::fuzz
