#include "protocol/pod_request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dynmig::protocol {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// The spec's canary pod.
json CanaryPod() {
  return json::parse(R"({
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "mig-canary", "annotations": {"nvidia.com/vgpu-mode": "mig"}},
    "spec": {
      "restartPolicy": "Never",
      "containers": [{
        "name": "workload", "image": "ubuntu:22.04",
        "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000}}
      }]
    }
  })");
}

json PodWithLimits(const json& limits, const json& annotations = json::object()) {
  json pod = {
      {"metadata", {{"name", "p"}, {"annotations", annotations}}},
      {"spec",
       {{"containers", json::array({{{"name", "c"}, {"resources", {{"limits", limits}}}}})}}}};
  return pod;
}

absl::Status PodParseError(const json& pod) {
  auto r = ParsePodRequest(pod);
  EXPECT_FALSE(r.ok());
  return r.status();
}

TEST(PodRequestTest, ParsesTheSpecCanary) {
  auto r = ParsePodRequest(CanaryPod());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_THAT(r->containers, SizeIs(1));
  EXPECT_EQ(r->containers[0].name, "workload");
  EXPECT_FALSE(r->containers[0].init);
  EXPECT_EQ(r->containers[0].count, 1u);
  EXPECT_EQ(r->containers[0].memory.mib, 8000u);
  EXPECT_EQ(r->containers[0].memory.percent, 0u);
  EXPECT_EQ(r->filter.vgpu_mode, "mig");
  EXPECT_EQ(r->gpu_policy, mig::GpuPolicy::kBinpack);
  EXPECT_EQ(r->node_policy, mig::NodePolicy::kBinpack);
  EXPECT_TRUE(r->preference.empty());
  EXPECT_TRUE(r->WantsGpu());
  EXPECT_TRUE(IsMigPod(CanaryPod()));
}

TEST(PodRequestTest, SpecPreferenceExample) {
  json pod =
      PodWithLimits({{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem", 20000}},
                    {{"nvidia.com/vgpu-mode", "mig"}, {"nvidia.com/mig-profile-preference", "4g"}});
  auto r = ParsePodRequest(pod);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->preference.entries, ElementsAre("4g"));
  EXPECT_EQ(r->containers[0].memory.mib, 20000u);
}

TEST(PodRequestTest, InitContainersComeFirst) {
  json pod = json::parse(R"({
    "spec": {
      "containers": [
        {"name": "app0", "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4000"}}},
        {"name": "sidecar"}
      ],
      "initContainers": [
        {"name": "init0", "resources": {"requests": {"nvidia.com/gpu": 1}}}
      ]
    }
  })");
  auto r = ParsePodRequest(pod);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_THAT(r->containers, SizeIs(3));
  EXPECT_EQ(r->containers[0].name, "init0");
  EXPECT_TRUE(r->containers[0].init);
  EXPECT_EQ(r->containers[0].count, 1u);  // from requests
  EXPECT_EQ(r->containers[1].name, "app0");
  EXPECT_EQ(r->containers[1].count, 2u);
  EXPECT_EQ(r->containers[1].memory.mib, 4000u);
  EXPECT_EQ(r->containers[2].name, "sidecar");
  EXPECT_EQ(r->containers[2].count, 0u);
}

TEST(PodRequestTest, LimitsWinOverRequests) {
  json pod = json::parse(R"({"spec": {"containers": [{"name": "c", "resources": {
      "limits": {"nvidia.com/gpu": 2}, "requests": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100}}}]}})");
  auto r = ParsePodRequest(pod);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->containers[0].count, 2u);
  EXPECT_EQ(r->containers[0].memory.mib, 100u);  // per resource: requests when limits lack it
}

TEST(PodRequestTest, MemoryWithoutCountMeansOne) {
  auto mem = ParsePodRequest(PodWithLimits({{"nvidia.com/gpumem", 3000}}));
  ASSERT_TRUE(mem.ok()) << mem.status();
  EXPECT_EQ(mem->containers[0].count, 1u);
  auto pct = ParsePodRequest(PodWithLimits({{"nvidia.com/gpumem-percentage", "50"}}));
  ASSERT_TRUE(pct.ok()) << pct.status();
  EXPECT_EQ(pct->containers[0].count, 1u);
  EXPECT_EQ(pct->containers[0].memory.percent, 50u);
  auto cores = ParsePodRequest(PodWithLimits({{"nvidia.com/gpucores", 30}}));
  ASSERT_TRUE(cores.ok()) << cores.status();
  EXPECT_EQ(cores->containers[0].count, 1u);

  ResourceNames no_default;
  no_default.default_count = 0;
  auto none = ParsePodRequest(PodWithLimits({{"nvidia.com/gpumem", 3000}}), no_default);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->containers[0].count, 0u);
}

TEST(PodRequestTest, MemoryAndPercentageAreBothKept) {
  auto r = ParsePodRequest(PodWithLimits(
      {{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem", 5000}, {"nvidia.com/gpumem-percentage", 30}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->containers[0].memory.mib, 5000u);
  EXPECT_EQ(r->containers[0].memory.percent, 30u);
}

TEST(PodRequestTest, ZeroMemoryIsTheWholeGpu) {
  auto r = ParsePodRequest(PodWithLimits({{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem", 0}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->containers[0].memory.mib, 0u);
  EXPECT_EQ(r->containers[0].memory.percent, 0u);
}

struct BadValue {
  const char* name;
  json limits;
  const char* want;
};

class PodRequestBadValueTest : public ::testing::TestWithParam<BadValue> {};

TEST_P(PodRequestBadValueTest, NamesContainerAndResource) {
  absl::Status s = PodParseError(PodWithLimits(GetParam().limits));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("container \"c\" (containers[0])"));
  EXPECT_THAT(std::string(s.message()), HasSubstr(GetParam().want));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PodRequestBadValueTest,
    ::testing::Values(
        BadValue{"NegativeCount", {{"nvidia.com/gpu", -1}}, "nvidia.com/gpu: -1 is negative"},
        BadValue{"NegativeCountString",
                 {{"nvidia.com/gpu", "-2"}},
                 "nvidia.com/gpu: \"-2\" is negative"},
        BadValue{"GarbageCount",
                 {{"nvidia.com/gpu", "two"}},
                 "nvidia.com/gpu: \"two\" is not a Kubernetes quantity (no digits)"},
        BadValue{"UnknownSuffix",
                 {{"nvidia.com/gpumem", "8GB"}},
                 "nvidia.com/gpumem: \"8GB\" is not a Kubernetes quantity (unknown suffix \"GB\")"},
        BadValue{"FloatCount",
                 {{"nvidia.com/gpu", 1.5}},
                 "nvidia.com/gpu: 1.5 is not a whole number: write a whole number such as 2"},
        BadValue{"DecimalString",
                 {{"nvidia.com/gpu", "1.5"}},
                 "\"1.5\" is not a whole number: write a whole number such as 2"},
        BadValue{"MilliString",
                 {{"nvidia.com/gpumem", "7999500m"}},
                 "\"7999500m\" is not a whole number: write a whole number such as 8000"},
        BadValue{
            "BinarySuffix",
            {{"nvidia.com/gpumem", "8Gi"}},
            "nvidia.com/gpumem: \"8Gi\" has a binary suffix; it counts MiB: write 8192 for 8Gi"},
        BadValue{"BinarySuffixOnACount",
                 {{"nvidia.com/gpu", "1Ki"}},
                 "nvidia.com/gpu: \"1Ki\" has a binary suffix; write a plain number"},
        BadValue{"HugeQuantity", {{"nvidia.com/gpumem", "3G"}}, "\"3G\" is too large"},
        BadValue{"BoolMemory",
                 {{"nvidia.com/gpumem", true}},
                 "nvidia.com/gpumem: true is not an integer"},
        BadValue{"HugeMemory", {{"nvidia.com/gpumem", "99999999999"}}, "is too large"},
        // Beyond int64 as a JSON float (found by the pod_request fuzz target: the conversion to
        // an integer was undefined).
        BadValue{"HugeFloat",
                 {{"nvidia.com/gpumem", 2.2e124}},
                 "nvidia.com/gpumem: 2.2e+124 is too large"},
        BadValue{"HugeNegativeFloat", {{"nvidia.com/gpu", -1e30}}, "is too large"},
        BadValue{"ZeroPercent",
                 {{"nvidia.com/gpumem-percentage", 0}},
                 "nvidia.com/gpumem-percentage: 0 is outside 1..100"},
        BadValue{"BigPercent", {{"nvidia.com/gpumem-percentage", 101}}, "101 is outside 1..100"},
        BadValue{"BigCores",
                 {{"nvidia.com/gpucores", 150}},
                 "nvidia.com/gpucores: 150 is outside 0..100"},
        BadValue{"ZeroCountWithMemory",
                 {{"nvidia.com/gpu", 0}, {"nvidia.com/gpumem", 100}},
                 "nvidia.com/gpu: 0 instances but nvidia.com/gpumem is set"},
        BadValue{"ZeroCountWithPercent",
                 {{"nvidia.com/gpu", "0"}, {"nvidia.com/gpumem-percentage", 10}},
                 "0 instances but nvidia.com/gpumem-percentage is set"}),
    [](const ::testing::TestParamInfo<BadValue>& param_info) {
      return std::string(param_info.param.name);
    });

// kube-apiserver serves every quantity canonically: 8000 as "8k", 20000 as "20k", 19000 as "19k".
TEST(PodRequestTest, ReadsEveryDecimalQuantityForm) {
  for (const auto& [text, mib] : std::vector<std::pair<std::string, uint32_t>>{{"8k", 8000},
                                                                               {"20k", 20000},
                                                                               {"19k", 19000},
                                                                               {"8000", 8000},
                                                                               {"8e3", 8000},
                                                                               {"8E3", 8000},
                                                                               {"1.5k", 1500},
                                                                               {"8000000m", 8000},
                                                                               {"+4096", 4096},
                                                                               {"0.04M", 40000}}) {
    auto r = ParsePodRequest(PodWithLimits({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", text}}));
    ASSERT_TRUE(r.ok()) << text << ": " << r.status();
    EXPECT_EQ(r->containers[0].memory.mib, mib) << text;
  }
  auto whole_float = ParsePodRequest(PodWithLimits({{"nvidia.com/gpu", 2.0}}));
  ASSERT_TRUE(whole_float.ok()) << whole_float.status();
  EXPECT_EQ(whole_float->containers[0].count, 2u);
}

TEST(PodRequestTest, ZeroCountAloneIsNoGpu) {
  auto r = ParsePodRequest(PodWithLimits({{"nvidia.com/gpu", 0}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->containers[0].count, 0u);
  EXPECT_FALSE(r->WantsGpu());
}

TEST(PodRequestTest, SchedulerPolicies) {
  auto r = ParsePodRequest(
      PodWithLimits({{"nvidia.com/gpu", 1}}, {{"hami.io/gpu-scheduler-policy", "binpack"},
                                              {"hami.io/node-scheduler-policy", " spread "}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->gpu_policy, mig::GpuPolicy::kBinpack);
  EXPECT_EQ(r->node_policy, mig::NodePolicy::kSpread);

  std::vector<std::string> warnings;
  auto chain =
      ParsePodRequest(PodWithLimits({{"nvidia.com/gpu", 1}},
                                    {{"hami.io/gpu-scheduler-policy", "binpack,topology-aware"}}),
                      {}, &warnings);
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(chain->gpu_policy, mig::GpuPolicy::kBinpack);
  ASSERT_THAT(warnings, SizeIs(1));
  EXPECT_THAT(warnings[0], HasSubstr("\"topology-aware\" is not applied to MIG placement"));

  auto only_ignored = ParsePodRequest(
      PodWithLimits({{"nvidia.com/gpu", 1}}, {{"hami.io/gpu-scheduler-policy", "numa"}}));
  ASSERT_TRUE(only_ignored.ok()) << only_ignored.status();
  EXPECT_EQ(only_ignored->gpu_policy, mig::GpuPolicy::kBinpack);

  absl::Status unknown = PodParseError(
      PodWithLimits({{"nvidia.com/gpu", 1}}, {{"hami.io/gpu-scheduler-policy", "packed"}}));
  EXPECT_THAT(std::string(unknown.message()),
              HasSubstr("hami.io/gpu-scheduler-policy: unknown policy \"packed\""));
  absl::Status both = PodParseError(
      PodWithLimits({{"nvidia.com/gpu", 1}}, {{"hami.io/gpu-scheduler-policy", "binpack,spread"}}));
  EXPECT_THAT(std::string(both.message()), HasSubstr("names both binpack and spread"));
  absl::Status node = PodParseError(PodWithLimits(
      {{"nvidia.com/gpu", 1}}, {{"hami.io/node-scheduler-policy", "topology-aware"}}));
  EXPECT_THAT(std::string(node.message()),
              HasSubstr("hami.io/node-scheduler-policy: unknown policy \"topology-aware\""));
}

TEST(PodRequestTest, GpuFilterAnnotations) {
  auto r = ParsePodRequest(PodWithLimits(
      {{"nvidia.com/gpu", 1}}, {{"nvidia.com/use-gpuuuid", "GPU-a, GPU-b,"},
                                {"nvidia.com/nouse-gpuuuid", "GPU-c"},
                                {"nvidia.com/use-gputype", "A100,H100"},
                                {"nvidia.com/nouse-gputype", " A30 "},
                                {"nvidia.com/mig-profile-preference", " 4g , 3g.20gb ,, 4g "}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->filter.use_uuids, ElementsAre("GPU-a", "GPU-b"));
  EXPECT_THAT(r->filter.nouse_uuids, ElementsAre("GPU-c"));
  EXPECT_THAT(r->filter.use_types, ElementsAre("A100", "H100"));
  EXPECT_THAT(r->filter.nouse_types, ElementsAre("A30"));
  EXPECT_THAT(r->preference.entries, ElementsAre("4g", "3g.20gb"));
  EXPECT_EQ(r->filter.vgpu_mode, "");
}

TEST(PodRequestTest, NonStringAnnotationIsAnError) {
  json pod = PodWithLimits({{"nvidia.com/gpu", 1}}, {{"nvidia.com/use-gpuuuid", 5}});
  absl::Status s = PodParseError(pod);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("annotation nvidia.com/use-gpuuuid: must be a string"));
}

TEST(PodRequestTest, ConfigurableResourceNames) {
  ResourceNames names;
  names.count = "hami.io/gpu";
  names.memory = "hami.io/gpumem";
  json pod = PodWithLimits({{"hami.io/gpu", 2}, {"hami.io/gpumem", 100}, {"nvidia.com/gpu", 5}});
  auto r = ParsePodRequest(pod, names);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->containers[0].count, 2u);
  EXPECT_EQ(r->containers[0].memory.mib, 100u);
  EXPECT_TRUE(IsMigPod(pod, names));
  EXPECT_FALSE(IsMigPod(PodWithLimits({{"nvidia.com/gpu", 1}}), names));
}

TEST(PodRequestTest, IsMigPodFollowsVgpuMode) {
  EXPECT_TRUE(IsMigPod(PodWithLimits({{"nvidia.com/gpu", 1}})));
  EXPECT_TRUE(
      IsMigPod(PodWithLimits({{"nvidia.com/gpumem", 1}}, {{"nvidia.com/vgpu-mode", "mig"}})));
  EXPECT_FALSE(
      IsMigPod(PodWithLimits({{"nvidia.com/gpu", 1}}, {{"nvidia.com/vgpu-mode", "hami-core"}})));
  EXPECT_FALSE(IsMigPod(PodWithLimits({{"cpu", "1"}})));
  EXPECT_FALSE(IsMigPod(json::object()));
  EXPECT_TRUE(RequestsGpuResources(PodWithLimits({{"nvidia.com/gpucores", 10}})));
}

TEST(PodRequestTest, MalformedPodShapes) {
  EXPECT_EQ(PodParseError(json::array()).code(), absl::StatusCode::kInvalidArgument);
  absl::Status containers = PodParseError(json::parse(R"({"spec":{"containers":{}}})"));
  EXPECT_THAT(std::string(containers.message()), HasSubstr("spec.containers must be an array"));
  absl::Status limits = PodParseError(
      json::parse(R"({"spec":{"containers":[{"name":"x","resources":{"limits":[]}}]}})"));
  EXPECT_THAT(std::string(limits.message()),
              HasSubstr("container \"x\" (containers[0]): resources.limits must be an object"));
  auto no_spec = ParsePodRequest(json::object());
  ASSERT_TRUE(no_spec.ok()) << no_spec.status();
  EXPECT_THAT(no_spec->containers, IsEmpty());
}

}  // namespace
}  // namespace dynmig::protocol
