// MIG mode per GPU on the wire: nvidia.migModeSwitching in device-config.yaml, a whole GPU in
// hami.io/node-nvidia-register, a pod's whole-GPU request. Every input hostile.
#include "protocol/gpu_mode.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "protocol/annotations.h"
#include "protocol/device_config.h"
#include "protocol/node_register.h"

namespace dynmig::protocol {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr char kAllowlist[] = R"(nvidia:
  migProfileAllowlist:
    - models: ["A100-SXM4-40GB"]
      profiles: ["1g.5gb", "7g.40gb"]
)";

absl::StatusOr<DeviceConfig> WithSwitching(const std::string& value) {
  return ParseDeviceConfig(std::string(kAllowlist) + "  migModeSwitching: " + value + "\n");
}

std::string SwitchError(const std::string& value) {
  auto cfg = WithSwitching(value);
  EXPECT_FALSE(cfg.ok()) << value;
  EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument) << value;
  return std::string(cfg.status().message());
}

using Labels = std::map<std::string, std::string, std::less<>>;

// --- config ----------------------------------------------------------------------------------

TEST(MigModeSwitchingConfigTest, AbsentIsTodaysBehaviour) {
  auto cfg = ParseDeviceConfig(kAllowlist);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->mig_mode_switching, MigModeSwitching{});
  EXPECT_FALSE(cfg->mig_mode_switching.MaySwitch("NVIDIA H100 80GB HBM3", {}));
  // The default config every deployment ships has it off too.
  auto shipped = ParseDeviceConfig(DefaultDeviceConfigYaml());
  ASSERT_TRUE(shipped.ok()) << shipped.status();
  EXPECT_FALSE(shipped->mig_mode_switching.enabled);
  // Off explicitly, with rules kept for later.
  auto off = WithSwitching("{enabled: false, rules: [{models: [H100]}]}");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->mig_mode_switching.MaySwitch("NVIDIA H100 80GB HBM3", {}));
  // Present though off (the device plugin then reports modes), unlike absent.
  EXPECT_TRUE(off->mig_mode_switching.present);
  EXPECT_FALSE(cfg->mig_mode_switching.present);
}

TEST(MigModeSwitchingConfigTest, RulesMatchModelsAndNodeLabels) {
  auto cfg = ParseDeviceConfig(std::string(kAllowlist) + R"(  migModeSwitching:
    minModeDuration: 15m
    rules:
      - models: ["H100", "H200"]
        nodeSelector: {dynmig.io/gpu-mode: flex, pool: "a"}
      - models: ["A30"]
)");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const MigModeSwitching& sw = cfg->mig_mode_switching;
  EXPECT_TRUE(sw.enabled);
  EXPECT_EQ(sw.min_mode_duration, absl::Minutes(15));
  ASSERT_EQ(sw.rules.size(), 2u);
  EXPECT_EQ(sw.rules[0].node_selector.size(), 2u);
  const Labels flex = {{"dynmig.io/gpu-mode", "flex"}, {"pool", "a"}, {"zone", "x"}};
  EXPECT_TRUE(sw.MaySwitch("NVIDIA H100 80GB HBM3", flex));
  EXPECT_TRUE(sw.MaySwitch("NVIDIA H200", flex));
  EXPECT_FALSE(sw.MaySwitch("NVIDIA H100 80GB HBM3", {{"dynmig.io/gpu-mode", "flex"}}))
      << "every selector label must match";
  EXPECT_FALSE(
      sw.MaySwitch("NVIDIA H100 80GB HBM3", {{"dynmig.io/gpu-mode", "flex"}, {"pool", "b"}}));
  EXPECT_FALSE(sw.MaySwitch("NVIDIA A100-SXM4-40GB", flex));
  EXPECT_TRUE(sw.MaySwitch("NVIDIA A30", {})) << "a rule without a selector: every node";
  // No rules: every GPU on every node.
  auto all = WithSwitching("{}");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->mig_mode_switching.MaySwitch("anything", {}));
  EXPECT_EQ(all->mig_mode_switching.min_mode_duration, absl::Minutes(10));
}

TEST(MigModeSwitchingConfigTest, BadKeysAndValuesAreNamed) {
  EXPECT_THAT(SwitchError("yes"), HasSubstr("nvidia.migModeSwitching: must be a mapping"));
  EXPECT_THAT(SwitchError("{enable: true}"),
              HasSubstr("nvidia.migModeSwitching: unknown key \"enable\"; the keys are enabled, "
                        "minModeDuration and rules"));
  EXPECT_THAT(SwitchError("{enabled: maybe}"),
              HasSubstr("nvidia.migModeSwitching.enabled: must be true or false, got \"maybe\""));
  EXPECT_THAT(SwitchError("{minModeDuration: soon}"),
              HasSubstr("nvidia.migModeSwitching.minModeDuration: must be a duration"));
  EXPECT_THAT(SwitchError("{minModeDuration: 5s}"),
              HasSubstr("nvidia.migModeSwitching.minModeDuration: must be between 10s and 24h, "
                        "got 5s"));
  EXPECT_THAT(SwitchError("{minModeDuration: 1000000h}"), HasSubstr("must be between"));
  EXPECT_THAT(SwitchError("{minModeDuration: [1m]}"), HasSubstr("got a list"));
  EXPECT_THAT(SwitchError("{rules: {models: [H100]}}"),
              HasSubstr("nvidia.migModeSwitching.rules: must be a list"));
  EXPECT_THAT(SwitchError("{rules: [H100]}"),
              HasSubstr("nvidia.migModeSwitching.rules[0]: must be a mapping"));
  EXPECT_THAT(SwitchError("{rules: [{model: [H100]}]}"),
              HasSubstr("nvidia.migModeSwitching.rules[0]: unknown key \"model\""));
  EXPECT_THAT(SwitchError("{rules: [{models: H100}]}"),
              HasSubstr("nvidia.migModeSwitching.rules[0].models: must be a list"));
  EXPECT_THAT(SwitchError("{rules: [{models: [\"\"]}]}"),
              HasSubstr("nvidia.migModeSwitching.rules[0].models[0]: must be 1 to 96"));
  EXPECT_THAT(SwitchError("{rules: [{models: [[H100]]}]}"),
              HasSubstr("nvidia.migModeSwitching.rules[0].models[0]: must be a string"));
  EXPECT_THAT(SwitchError("{rules: [{nodeSelector: [pool]}]}"),
              HasSubstr("nvidia.migModeSwitching.rules[0].nodeSelector: must be a mapping"));
  EXPECT_THAT(SwitchError("{rules: [{nodeSelector: {-pool: a}}]}"),
              HasSubstr("nvidia.migModeSwitching.rules[0].nodeSelector: label key \"-pool\""));
  EXPECT_THAT(SwitchError("{rules: [{nodeSelector: {Bad_Prefix/x: a}}]}"),
              HasSubstr("the prefix before '/' must be a DNS subdomain"));
  EXPECT_THAT(SwitchError("{rules: [{nodeSelector: {pool: \"a b\"}}]}"),
              HasSubstr("nvidia.migModeSwitching.rules[0].nodeSelector.pool: label value \"a b\""));
  EXPECT_THAT(SwitchError("{rules: [{nodeSelector: {pool: [a]}}]}"),
              HasSubstr("key and value must be strings"));
}

TEST(MigModeSwitchingConfigTest, SizesAreBounded) {
  std::string models = "[";
  for (int i = 0; i < 65; ++i) models += (i ? ",m" : "m") + std::to_string(i);
  models += "]";
  EXPECT_THAT(SwitchError("{rules: [{models: " + models + "}]}"),
              HasSubstr("65 models; at most 64"));
  std::string rules = "[";
  for (int i = 0; i < 65; ++i) rules += i ? ",{}" : "{}";
  rules += "]";
  EXPECT_THAT(SwitchError("{rules: " + rules + "}"), HasSubstr("65 rules; at most 64"));
  std::string selector = "{";
  for (int i = 0; i < 17; ++i) selector += (i ? ",l" : "l") + std::to_string(i) + ": v";
  selector += "}";
  EXPECT_THAT(SwitchError("{rules: [{nodeSelector: " + selector + "}]}"),
              HasSubstr("more than 16 labels"));
  EXPECT_THAT(SwitchError("{rules: [{models: [\"" + std::string(97, 'H') + "\"]}]}"),
              HasSubstr("got 97 characters"));
  // A huge label key is refused, and the message does not echo all of it.
  const std::string huge(100000, 'a');
  const absl::Status st = ValidateLabelKey(huge);
  EXPECT_THAT(std::string(st.message()), HasSubstr("(100000 characters)"));
  EXPECT_LT(st.message().size(), 1000u);
  // Through the file (an explicit YAML key: plain keys stop at 1024 characters).
  EXPECT_THAT(SwitchError("\n    rules:\n      - nodeSelector:\n          ? " +
                          std::string(2000, 'k') + "\n          : v"),
              HasSubstr("(2000 characters)"));
}

TEST(LabelSyntaxTest, KeysAndValues) {
  for (const char* ok : {"pool", "dynmig.io/gpu-mode", "a", "x.y_z-1", "k8s.io/a"}) {
    EXPECT_TRUE(ValidateLabelKey(ok).ok()) << ok;
  }
  for (const char* bad :
       {"", "/x", "x/", "a..b/x", ".a/x", "A.io/x", "a/b/c", "-x", "x-", "a b", "a/-b"}) {
    EXPECT_FALSE(ValidateLabelKey(bad).ok()) << bad;
  }
  EXPECT_FALSE(ValidateLabelKey(std::string(64, 'a')).ok());
  EXPECT_TRUE(ValidateLabelKey(std::string(63, 'a')).ok());
  EXPECT_FALSE(ValidateLabelKey(std::string(254, 'a') + "/x").ok());
  EXPECT_TRUE(ValidateLabelValue("").ok());
  EXPECT_TRUE(ValidateLabelValue("flex").ok());
  EXPECT_FALSE(ValidateLabelValue("a/b").ok());
  EXPECT_FALSE(ValidateLabelValue(std::string(64, 'v')).ok());
}

// --- node annotation -------------------------------------------------------------------------

TEST(WholeGpuDeviceTest, PublishedLikeHamisNonMigDevice) {
  const DeviceIdentity id{.uuid = "GPU-1", .index = 1, .numa = 0, .health = true};
  const DeviceInfo d = WholeGpuDeviceInfo(id, "NVIDIA H100 80GB HBM3", 81559);
  EXPECT_EQ(EncodeNodeRegister({d}),
            R"([{"id":"GPU-1","index":1,"count":1,"devmem":81559,"devcore":100,)"
            R"("type":"NVIDIA H100 80GB HBM3","mode":"hami-core","health":true}])");
  auto decoded = DecodeNodeRegister(EncodeNodeRegister({d}));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->size(), 1u);
  EXPECT_EQ((*decoded)[0], d);
  EXPECT_EQ(DeviceGpuMode(d), GpuMode::kWholeGpu);
  EXPECT_FALSE(LegacyFormatReason(d).has_value()) << "a whole GPU is no legacy MIG device";
}

TEST(WholeGpuDeviceTest, ModesOfANodeWithBoth) {
  // HAMi's own annotation of a mixed node, as its device plugin writes it.
  auto devices = DecodeNodeRegister(
      R"([{"id":"GPU-a","count":7,"devmem":40960,"devcore":100,"type":"NVIDIA A100-SXM4-40GB",)"
      R"("mode":"mig","health":true,"migProfiles":[{"name":"1g.5gb","memoryMB":4864,"core":15,)"
      R"("sliceCount":1,"placements":[{"start":0,"size":1}]}]},)"
      R"({"id":"GPU-b","index":1,"count":1,"devmem":40960,"devcore":100,)"
      R"("type":"NVIDIA A100-SXM4-40GB","mode":"hami-core","health":true},)"
      R"({"id":"GPU-c","index":2,"count":10,"devmem":15360,"type":"Tesla T4","mode":"mps"},)"
      R"({"id":"GPU-d","index":3,"count":1,"type":"x"}])");
  ASSERT_TRUE(devices.ok()) << devices.status();
  EXPECT_EQ(DeviceGpuMode((*devices)[0]), GpuMode::kMig);
  EXPECT_EQ(DeviceGpuMode((*devices)[1]), GpuMode::kWholeGpu);
  EXPECT_EQ(DeviceGpuMode((*devices)[2]), std::nullopt);
  EXPECT_EQ(DeviceGpuMode((*devices)[3]), std::nullopt);
  // Near misses are not modes.
  DeviceInfo d;
  for (const char* mode : {"MIG", "hami-core ", "Hami-Core", "mig,hami-core"}) {
    d.mode = mode;
    EXPECT_EQ(DeviceGpuMode(d), std::nullopt) << mode;
  }
  EXPECT_EQ(GpuModeName(GpuMode::kMig), "mig");
  EXPECT_EQ(GpuModeName(GpuMode::kWholeGpu), "hami-core");
  // The inverse takes the two names exactly, nothing near them.
  EXPECT_EQ(GpuModeFromName("mig"), GpuMode::kMig);
  EXPECT_EQ(GpuModeFromName("hami-core"), GpuMode::kWholeGpu);
  for (const char* mode : {"", "MIG", "hami-core ", "Hami-Core", "mig,hami-core", "whole"}) {
    EXPECT_EQ(GpuModeFromName(mode), std::nullopt) << mode;
  }
}

// --- pod request -----------------------------------------------------------------------------

json Pod(const json& limits, const std::string& mode = "hami-core",
         const json& init_limits = nullptr) {
  json pod = {
      {"metadata", {{"name", "p"}, {"annotations", json::object()}}},
      {"spec",
       {{"containers", json::array({{{"name", "train"}, {"resources", {{"limits", limits}}}}})}}}};
  if (!mode.empty()) pod["metadata"]["annotations"][std::string(kVgpuModeAnnotation)] = mode;
  if (!init_limits.is_null()) {
    pod["spec"]["initContainers"] =
        json::array({{{"name", "prep"}, {"resources", {{"limits", init_limits}}}}});
  }
  return pod;
}

std::string RequestError(const json& pod) {
  auto r = ParseWholeGpuRequest(pod);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

TEST(WholeGpuRequestTest, HamiCoreModeAsksForWholeGpus) {
  auto r = ParseWholeGpuRequest(Pod({{"nvidia.com/gpu", 2}}, "hami-core", {{"nvidia.com/gpu", 1}}));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->containers.size(), 2u);
  EXPECT_TRUE(r->containers[0].init);
  EXPECT_EQ(r->containers[0].name, "prep");
  EXPECT_EQ(r->containers[1].count, 2u);
  EXPECT_EQ(r->TotalGpus(), 3u);
  // A memory floor and a 100 % share are a whole GPU too; the API server's "80k" form parses.
  auto mem = ParseWholeGpuRequest(Pod({{"nvidia.com/gpu", "1"},
                                       {"nvidia.com/gpumem", "80k"},
                                       {"nvidia.com/gpumem-percentage", 100}},
                                      "  hami-core "));
  ASSERT_TRUE(mem.ok()) << mem.status();
  EXPECT_EQ(mem->containers[0].min_memory_mib, 80000u);
  EXPECT_TRUE(IsWholeGpuPod(Pod({{"nvidia.com/gpu", 1}})));
  EXPECT_FALSE(IsMigPod(Pod({{"nvidia.com/gpu", 1}}))) << "a whole-GPU pod is no MIG pod";
}

TEST(WholeGpuRequestTest, ModeAnnotationDecides) {
  auto mode_of = [](const std::string& mode) {
    return PodGpuMode(Pod({{"nvidia.com/gpu", 1}}, mode));
  };
  EXPECT_EQ(*mode_of(""), GpuMode::kMig) << "absent: a MIG pod, as today";
  EXPECT_EQ(*mode_of("mig"), GpuMode::kMig);
  EXPECT_EQ(*mode_of("hami-core"), GpuMode::kWholeGpu);
  EXPECT_EQ(*mode_of("mps"), std::nullopt);
  EXPECT_EQ(*mode_of("HAMI-CORE"), std::nullopt) << "HAMi matches case-sensitively";
  EXPECT_FALSE(mode_of("mig,hami-core").ok());
  EXPECT_THAT(std::string(mode_of("hami-core/mig").status().message()),
              HasSubstr("names both \"mig\""));
  auto huge = mode_of(std::string(100000, 'h'));
  ASSERT_FALSE(huge.ok());
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("(100000 characters)"));
  EXPECT_LT(huge.status().message().size(), 1000u);
  // Not whole-GPU pods.
  EXPECT_FALSE(IsWholeGpuPod(Pod({{"nvidia.com/gpu", 1}}, "mig")));
  EXPECT_FALSE(IsWholeGpuPod(Pod({{"nvidia.com/gpu", 1}}, "")));
  EXPECT_FALSE(IsWholeGpuPod(Pod({{"cpu", 1}})));
  EXPECT_THAT(RequestError(Pod({{"nvidia.com/gpu", 1}}, "mig")),
              HasSubstr("a whole-GPU pod sets it to \"hami-core\", got \"mig\""));
  json not_string = Pod({{"nvidia.com/gpu", 1}});
  not_string["metadata"]["annotations"][std::string(kVgpuModeAnnotation)] = 7;
  EXPECT_FALSE(IsWholeGpuPod(not_string));
  EXPECT_FALSE(ParseWholeGpuRequest(not_string).ok());
}

TEST(WholeGpuRequestTest, SharesAndBadQuantitiesAreRefused) {
  EXPECT_THAT(RequestError(Pod({{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem-percentage", 50}})),
              HasSubstr("container \"train\": nvidia.com/gpumem-percentage: 50 asks for a share "
                        "of a GPU"));
  EXPECT_THAT(RequestError(Pod({{"nvidia.com/gpu", 17}})),
              HasSubstr("container \"train\": nvidia.com/gpu: 17 whole GPUs; at most 16"));
  EXPECT_THAT(RequestError(Pod({{"nvidia.com/gpu", 0}})),
              HasSubstr("no container asks for nvidia.com/gpu"));
  EXPECT_THAT(RequestError(Pod({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "8Gi"}})),
              HasSubstr("binary suffix"));
  EXPECT_THAT(RequestError(Pod({{"nvidia.com/gpu", -1}})), HasSubstr("nvidia.com/gpu"));
  EXPECT_THAT(RequestError(Pod({{"nvidia.com/gpu", "1e30"}})), HasSubstr("nvidia.com/gpu"));
  EXPECT_THAT(RequestError(Pod({{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem-percentage", 101}})),
              HasSubstr("nvidia.com/gpumem-percentage"));
  EXPECT_FALSE(ParseWholeGpuRequest(json::array()).ok());
  EXPECT_FALSE(ParseWholeGpuRequest(json("pod")).ok());
}

}  // namespace
}  // namespace dynmig::protocol
