#include "protocol/device_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "mig/catalogue.h"
#include "yaml-cpp/yaml.h"

namespace dynmig::protocol {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

// The spec's legacy configuration.
constexpr char kSpecLegacy[] = R"(nvidia:
  knownMigGeometries:
    - models: ["A100-SXM4-40GB"]
      allowedGeometries:
        - - name: 1g.5gb
            core: 14
            memory: 5120
            count: 7
        - - name: 2g.10gb
            core: 28
            memory: 10240
            count: 3
          - name: 1g.5gb
            core: 14
            memory: 5120
            count: 1
)";

// The spec's allowlist.
constexpr char kSpecAllowlist[] = R"(nvidia:
  migProfileAllowlist:
    - models: ["A100-SXM4-40GB"]
      profiles: ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]
)";

// HAMi's legacy chart default (reference section 3): four geometries.
constexpr char kHamiLegacyDefault[] = R"(nvidia:
  resourceCountName: nvidia.com/gpu
  resourceMemoryName: nvidia.com/gpumem
  deviceSplitCount: 10
  knownMigGeometries:
    - models: ["A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"]
      allowedGeometries:
        - - {name: 1g.5gb,  core: 14, memory: 5120,  count: 7}
        - - {name: 1g.5gb,  core: 14, memory: 5120,  count: 1}
          - {name: 2g.10gb, core: 28, memory: 10240, count: 3}
        - - {name: 3g.20gb, core: 42, memory: 20480, count: 2}
        - - {name: 7g.40gb, core: 100, memory: 40960, count: 1}
  defaultMemory: 0
cambricon:
  resourceCountName: cambricon.com/vmlu
)";

absl::Status ParseError(const std::string& yaml) {
  auto cfg = ParseDeviceConfig(yaml);
  EXPECT_FALSE(cfg.ok()) << yaml;
  return cfg.status();
}

TEST(DeviceConfigTest, ParsesTheSpecAllowlist) {
  auto cfg = ParseDeviceConfig(kSpecAllowlist);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  ASSERT_THAT(cfg->allowlist.entries, SizeIs(1));
  EXPECT_THAT(cfg->allowlist.entries[0].models, ElementsAre("A100-SXM4-40GB"));
  EXPECT_THAT(cfg->allowlist.entries[0].profiles,
              ElementsAre("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"));
  EXPECT_THAT(cfg->legacy_geometries, IsEmpty());
  EXPECT_THAT(cfg->warnings, IsEmpty());
  EXPECT_EQ(cfg->resources, ResourceNames{});
}

TEST(DeviceConfigTest, ParsesLegacyGeometries) {
  auto cfg = ParseDeviceConfig(kSpecLegacy);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  ASSERT_THAT(cfg->legacy_geometries, SizeIs(1));
  const auto& e = cfg->legacy_geometries[0];
  EXPECT_THAT(e.models, ElementsAre("A100-SXM4-40GB"));
  ASSERT_THAT(e.geometries, SizeIs(2));
  ASSERT_THAT(e.geometries[1], SizeIs(2));
  EXPECT_EQ(e.geometries[1][0].name, "2g.10gb");
  EXPECT_EQ(e.geometries[1][0].core, 28u);
  EXPECT_EQ(e.geometries[1][0].memory, 10240u);
  EXPECT_EQ(e.geometries[1][0].count, 3u);
  EXPECT_THAT(cfg->allowlist.entries, IsEmpty());
  EXPECT_THAT(cfg->warnings, Contains(HasSubstr("dynmig config migrate")));
  EXPECT_THAT(cfg->warnings, Contains(HasSubstr("no MIG profile will be offered")));
}

TEST(DeviceConfigTest, VolcanoGroupedGeometries) {
  auto cfg = ParseDeviceConfig(R"(nvidia:
  knownMigGeometries:
  - models: [ "A30" ]
    allowedGeometries:
      - group: group1
        geometries:
        - name: 1g.6gb
          memory: 6144
          count: 4
)");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  ASSERT_THAT(cfg->legacy_geometries, SizeIs(1));
  ASSERT_THAT(cfg->legacy_geometries[0].geometries, SizeIs(1));
  EXPECT_EQ(cfg->legacy_geometries[0].geometries[0][0].name, "1g.6gb");
}

TEST(DeviceConfigTest, ResourceNamesAndUnknownKeys) {
  auto cfg = ParseDeviceConfig(R"(
nvidia:
  resourceCountName: hami.io/gpu
  resourceMemoryName: hami.io/gpumem
  resourceMemoryPercentageName: hami.io/gpumem-percentage
  resourceCoreName: hami.io/gpucores
  defaultGPUNum: 2
  overwriteEnv: false
  somethingNew: {a: [1, 2]}
  migProfileAllowlist:
    - models: [A30]
      profiles: [1g.6gb]
      futureField: 1
hygon:
  resourceCountName: hygon.com/dcunum
)");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->resources.count, "hami.io/gpu");
  EXPECT_EQ(cfg->resources.memory, "hami.io/gpumem");
  EXPECT_EQ(cfg->resources.memory_percentage, "hami.io/gpumem-percentage");
  EXPECT_EQ(cfg->resources.cores, "hami.io/gpucores");
  EXPECT_EQ(cfg->resources.default_count, 2u);
}

struct BadConfig {
  const char* name;
  const char* yaml;
  const char* want;
};

class DeviceConfigBadInputTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(DeviceConfigBadInputTest, NamesTheFieldPath) {
  absl::Status s = ParseError(GetParam().yaml);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr(GetParam().want));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DeviceConfigBadInputTest,
    ::testing::Values(
        BadConfig{"Empty", "", "the document is empty"},
        BadConfig{"Syntax", "nvidia:\n  a: [1, 2\n", "invalid YAML at line"},
        BadConfig{"NotMapping", "- 1\n- 2\n", "must be a mapping"},
        BadConfig{"NoNvidia", "cambricon: {}\n", "nvidia: section is missing"},
        BadConfig{"NvidiaScalar", "nvidia: 5\n", "nvidia: must be a mapping"},
        BadConfig{"TwoDocuments", "nvidia: {}\n---\nnvidia: {}\n", "2 YAML documents"},
        // Found by fuzzing: yaml-cpp's LoadAll never returned on this (endless empty documents).
        BadConfig{"ParserStuck", "- a\n,\n",
                  "invalid YAML at line 2, column 1: the parser cannot get past this point"},
        BadConfig{
            "BadMemoryMatch", "nvidia:\n  migMemoryMatch: exact\n",
            "nvidia.migMemoryMatch: must be \"nominal\" (a profile covers the GB of its name) "
            "or \"nvml\" (the memory NVML reports), got \"exact\""},
        BadConfig{"BadProfileName",
                  "nvidia:\n  migProfileAllowlist:\n    - models: [A30]\n      profiles: [1g.6gb]\n"
                  "    - models: [A100]\n      profiles: [5gb]\n",
                  "nvidia.migProfileAllowlist[1].profiles[0]: invalid MIG profile name \"5gb\""},
        BadConfig{"NoModels", "nvidia:\n  migProfileAllowlist:\n    - profiles: [1g.6gb]\n",
                  "nvidia.migProfileAllowlist[0].models: at least one GPU model is required"},
        BadConfig{"NoProfiles",
                  "nvidia:\n  migProfileAllowlist:\n    - models: [A30]\n      profiles: []\n",
                  "nvidia.migProfileAllowlist[0].profiles: at least one MIG profile is required"},
        BadConfig{"ProfilesScalar",
                  "nvidia:\n  migProfileAllowlist:\n    - models: [A30]\n      profiles: 1g.6gb\n",
                  "nvidia.migProfileAllowlist[0].profiles: must be a list, got \"1g.6gb\""},
        BadConfig{
            "ProfileMapping",
            "nvidia:\n  migProfileAllowlist:\n    - models: [A30]\n      profiles: [{a: 1}]\n",
            "nvidia.migProfileAllowlist[0].profiles[0]: must be a string, got a mapping"},
        BadConfig{"Duplicate",
                  "nvidia:\n  migProfileAllowlist:\n    - models: [A30]\n      profiles: [1g.6gb, "
                  "1g.6gb]\n",
                  "nvidia.migProfileAllowlist[0].profiles[1]: \"1g.6gb\" is listed twice"},
        BadConfig{"AllowlistNotList", "nvidia:\n  migProfileAllowlist: {models: [A30]}\n",
                  "nvidia.migProfileAllowlist: must be a list, got a mapping"},
        BadConfig{"LegacyMemoryNotInteger",
                  "nvidia:\n  knownMigGeometries:\n    - models: [A30]\n      allowedGeometries:\n"
                  "        - - {name: 1g.6gb, memory: 6144}\n"
                  "        - - {name: 2g.12gb, memory: lots}\n",
                  "nvidia.knownMigGeometries[0].allowedGeometries[1][0].memory: must be a "
                  "non-negative integer, got \"lots\""},
        BadConfig{"LegacyNegativeCount",
                  "nvidia:\n  knownMigGeometries:\n    - models: [A30]\n      allowedGeometries:\n"
                  "        - - {name: 1g.6gb, count: -1}\n",
                  "nvidia.knownMigGeometries[0].allowedGeometries[0][0].count: must be a "
                  "non-negative integer"},
        BadConfig{"LegacyNoName",
                  "nvidia:\n  knownMigGeometries:\n    - models: [A30]\n      allowedGeometries:\n"
                  "        - - {memory: 6144}\n",
                  "nvidia.knownMigGeometries[0].allowedGeometries[0][0].name: is required"},
        BadConfig{"LegacyGeometryScalar",
                  "nvidia:\n  knownMigGeometries:\n    - models: [A30]\n      allowedGeometries:\n"
                  "        - 1g.6gb\n",
                  "nvidia.knownMigGeometries[0].allowedGeometries[0]: must be a list, got "
                  "\"1g.6gb\""},
        BadConfig{"ResourceNameMapping", "nvidia:\n  resourceCountName: {a: b}\n",
                  "nvidia.resourceCountName: must be a non-empty string"},
        BadConfig{"DefaultGpuNumText", "nvidia:\n  defaultGPUNum: one\n",
                  "nvidia.defaultGPUNum: must be a non-negative integer"}),
    [](const ::testing::TestParamInfo<BadConfig>& param_info) {
      return std::string(param_info.param.name);
    });

TEST(DeviceConfigTest, DefaultAllowlistCoversEveryCatalogueBoard) {
  mig::Allowlist allowlist = DefaultAllowlist();
  ASSERT_TRUE(allowlist.Validate().ok()) << allowlist.Validate();
  EXPECT_EQ(allowlist.entries.size(), mig::Catalogue().size());
  for (const auto& m : mig::Catalogue()) {
    for (const auto& board : m.names) {
      SCOPED_TRACE(board);
      const mig::AllowlistEntry* e = allowlist.Match(board);
      ASSERT_NE(e, nullptr);
      // First match wins: the entry must be this model's own (its profiles all exist here).
      for (const auto& p : e->profiles) {
        EXPECT_NE(m.capability.FindProfile(p), nullptr) << p;
      }
      std::string_view stripped = board;
      if (stripped.starts_with("NVIDIA ")) stripped.remove_prefix(7);
      EXPECT_THAT(e->models, Contains(std::string(stripped)));
    }
  }
}

TEST(DeviceConfigTest, DefaultAllowlistListsBaseProfilesBySize) {
  mig::Allowlist allowlist = DefaultAllowlist();
  const mig::AllowlistEntry* a100 = allowlist.Match("NVIDIA A100-SXM4-40GB");
  ASSERT_NE(a100, nullptr);
  EXPECT_THAT(a100->models, Contains("A100-SXM4-40GB"));
  EXPECT_THAT(a100->models, Contains("A100-PCIE-40GB"));
  EXPECT_THAT(a100->profiles, ElementsAre("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"));
  const mig::AllowlistEntry* rtx = allowlist.Match("NVIDIA RTX PRO 6000 Blackwell Server Edition");
  ASSERT_NE(rtx, nullptr);
  EXPECT_THAT(rtx->profiles, ElementsAre("1g.24gb", "2g.48gb", "4g.96gb"));
  // "H200" must not capture the GH200 boards, nor "B200" the GB200.
  const mig::AllowlistEntry* gh200 = allowlist.Match("NVIDIA GH200 120GB");
  ASSERT_NE(gh200, nullptr);
  EXPECT_THAT(gh200->profiles, Contains("7g.96gb"));
  const mig::AllowlistEntry* gb200 = allowlist.Match("NVIDIA GB200");
  ASSERT_NE(gb200, nullptr);
  EXPECT_THAT(gb200->profiles, Contains("7g.186gb"));
}

TEST(DeviceConfigTest, DefaultYamlParsesBackToTheDefaultAllowlist) {
  const std::string yaml = DefaultDeviceConfigYaml();
  auto cfg = ParseDeviceConfig(yaml);
  ASSERT_TRUE(cfg.ok()) << cfg.status() << "\n" << yaml;
  mig::Allowlist want = DefaultAllowlist();
  ASSERT_EQ(cfg->allowlist.entries.size(), want.entries.size());
  for (size_t i = 0; i < want.entries.size(); ++i) {
    EXPECT_EQ(cfg->allowlist.entries[i].models, want.entries[i].models);
    EXPECT_EQ(cfg->allowlist.entries[i].profiles, want.entries[i].profiles);
  }
  EXPECT_EQ(cfg->resources, ResourceNames{});
  EXPECT_THAT(cfg->warnings, IsEmpty());
  EXPECT_THAT(yaml, HasSubstr("profiles: [\"1g.5gb\", \"2g.10gb\""));
}

TEST(DeviceConfigTest, MigratesTheSpecExampleToTheSpecAllowlist) {
  // The spec's four geometries (7 x 1g | 3 x 2g + 1 x 1g | 2 x 3g | 1 x 7g).
  auto migrated = MigrateDeviceConfig(kHamiLegacyDefault);
  ASSERT_TRUE(migrated.ok()) << migrated.status();
  EXPECT_TRUE(migrated->changed);
  auto cfg = ParseDeviceConfig(migrated->yaml);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_THAT(cfg->legacy_geometries, IsEmpty());
  ASSERT_THAT(cfg->allowlist.entries, SizeIs(1));
  EXPECT_THAT(cfg->allowlist.entries[0].models,
              ElementsAre("A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"));
  EXPECT_THAT(cfg->allowlist.entries[0].profiles,
              ElementsAre("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"));
  EXPECT_THAT(migrated->yaml,
              HasSubstr("profiles: [\"1g.5gb\", \"2g.10gb\", \"3g.20gb\", \"7g.40gb\"]"));
  EXPECT_THAT(migrated->yaml, Not(HasSubstr("knownMigGeometries")));
  // Every other key and section stays, in place.
  YAML::Node root = YAML::Load(migrated->yaml);
  EXPECT_EQ(root["nvidia"]["deviceSplitCount"].as<int>(), 10);
  EXPECT_EQ(root["nvidia"]["defaultMemory"].as<int>(), 0);
  EXPECT_EQ(root["nvidia"]["resourceMemoryName"].as<std::string>(), "nvidia.com/gpumem");
  EXPECT_EQ(root["cambricon"]["resourceCountName"].as<std::string>(), "cambricon.com/vmlu");
  std::vector<std::string> keys;
  for (auto it = root["nvidia"].begin(); it != root["nvidia"].end(); ++it) {
    keys.push_back(it->first.as<std::string>());
  }
  EXPECT_THAT(keys, ElementsAre("resourceCountName", "resourceMemoryName", "deviceSplitCount",
                                "migProfileAllowlist", "defaultMemory"));
  // The report says what was dropped.
  EXPECT_THAT(migrated->report, Contains(HasSubstr("dropped 4 geometries")));
  EXPECT_THAT(migrated->report, Contains(HasSubstr("3g.20gb core=42 memory=20480 count=2")));
}

TEST(DeviceConfigTest, MigrateKeepsQuotedScalarsQuoted) {
  auto migrated = MigrateDeviceConfig(R"(nvidia:
  overwriteEnv: "true"
  label: 'yes'
  knownMigGeometries:
    - models: [A30]
      allowedGeometries:
        - - {name: 1g.6gb, count: 4}
)");
  ASSERT_TRUE(migrated.ok()) << migrated.status();
  EXPECT_THAT(migrated->yaml, HasSubstr("overwriteEnv: \"true\""));
  EXPECT_THAT(migrated->yaml, HasSubstr("label: \"yes\""));
}

TEST(DeviceConfigTest, MigrateMergesIntoAnExistingAllowlist) {
  auto migrated = MigrateDeviceConfig(R"(nvidia:
  migProfileAllowlist:
    - models: ["A100-SXM4-40GB"]
      profiles: ["1g.5gb", "3g.20gb"]
  knownMigGeometries:
    - models: ["A100-SXM4-40GB", "A30"]
      allowedGeometries:
        - - {name: 1g.5gb, count: 7}
    - models: ["A100-SXM4-40GB"]
      allowedGeometries:
        - - {name: 7g.40gb, count: 1}
)");
  ASSERT_TRUE(migrated.ok()) << migrated.status();
  auto cfg = ParseDeviceConfig(migrated->yaml);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  ASSERT_THAT(cfg->allowlist.entries, SizeIs(2));
  EXPECT_THAT(cfg->allowlist.entries[0].profiles, ElementsAre("1g.5gb", "3g.20gb"));
  EXPECT_THAT(cfg->allowlist.entries[1].models, ElementsAre("A30"));
  EXPECT_THAT(cfg->allowlist.entries[1].profiles, ElementsAre("1g.5gb"));
  EXPECT_THAT(migrated->report, Contains(HasSubstr("already exists")));
  EXPECT_THAT(migrated->report, Contains(AllOf(HasSubstr("knownMigGeometries[1]"),
                                               HasSubstr("model \"A100-SXM4-40GB\" is already in"),
                                               HasSubstr("legacy profiles [7g.40gb] not added"))));
  EXPECT_THAT(migrated->report, Contains(HasSubstr("appended an entry for models [A30]")));
  // 1g.5gb is not an A30 profile: the conversion warns.
  EXPECT_THAT(migrated->report,
              Contains(HasSubstr("profile \"1g.5gb\" is not a MIG profile of NVIDIA A30")));
}

TEST(DeviceConfigTest, MigrateWithoutLegacyGeometriesChangesNothing) {
  auto migrated = MigrateDeviceConfig(kSpecAllowlist);
  ASSERT_TRUE(migrated.ok()) << migrated.status();
  EXPECT_FALSE(migrated->changed);
  EXPECT_EQ(migrated->yaml, kSpecAllowlist);
  EXPECT_THAT(migrated->report, Contains(HasSubstr("nothing to migrate")));
}

TEST(DeviceConfigTest, MigrateRefusesInvalidInput) {
  auto migrated = MigrateDeviceConfig("nvidia:\n  knownMigGeometries: [1\n");
  ASSERT_FALSE(migrated.ok());
  EXPECT_EQ(migrated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(migrated.status().message()), HasSubstr("invalid YAML"));
}

TEST(DeviceConfigTest, LoadDeviceConfigNamesTheFile) {
  auto missing = LoadDeviceConfig("/nonexistent/device-config.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("/nonexistent/device-config.yaml"));
}

TEST(DeviceConfigTest, WarmInstancesAreOffByDefault) {
  auto cfg = ParseDeviceConfig(kSpecAllowlist);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_FALSE(cfg->warm_instances.enabled);
}

TEST(DeviceConfigTest, WarmInstancesParse) {
  auto cfg = ParseDeviceConfig(std::string(kSpecAllowlist) +
                               "  migWarmInstances: {ttl: 90s, maxPerGpu: 7}\n");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_TRUE(cfg->warm_instances.enabled);
  EXPECT_EQ(cfg->warm_instances.ttl, absl::Seconds(90));
  EXPECT_EQ(cfg->warm_instances.max_per_gpu, 7u);

  auto defaults = ParseDeviceConfig(std::string(kSpecAllowlist) + "  migWarmInstances: {}\n");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_TRUE(defaults->warm_instances.enabled);
  EXPECT_EQ(defaults->warm_instances.ttl, absl::Minutes(5));
  EXPECT_EQ(defaults->warm_instances.max_per_gpu, 2u);

  auto off = ParseDeviceConfig(std::string(kSpecAllowlist) +
                               "  migWarmInstances: {enabled: false, ttl: 1h}\n");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->warm_instances.enabled);
}

TEST(DeviceConfigTest, WarmInstancesErrorsNameTheKey) {
  auto error = [](const std::string& value) {
    auto cfg =
        ParseDeviceConfig(std::string(kSpecAllowlist) + "  migWarmInstances: " + value + "\n");
    EXPECT_FALSE(cfg.ok()) << value;
    return cfg.ok() ? std::string() : std::string(cfg.status().message());
  };
  EXPECT_THAT(error("{ttl: soon}"),
              HasSubstr("nvidia.migWarmInstances.ttl: must be a duration such as 90s, 5m or 1h, "
                        "got \"soon\""));
  EXPECT_THAT(error("{ttl: 0s}"), HasSubstr("nvidia.migWarmInstances.ttl: must be between 1s"));
  EXPECT_THAT(error("{ttl: 48h}"), HasSubstr("nvidia.migWarmInstances.ttl: must be between"));
  EXPECT_THAT(error("{maxPerGpu: 0}"),
              HasSubstr("nvidia.migWarmInstances.maxPerGpu: must be between 1 and 64, got 0"));
  EXPECT_THAT(error("{maxPerGpu: -1}"),
              HasSubstr("nvidia.migWarmInstances.maxPerGpu: must be a non-negative integer"));
  EXPECT_THAT(error("{enabled: yes please}"),
              HasSubstr("nvidia.migWarmInstances.enabled: must be true or false"));
  EXPECT_THAT(error("{maxPerGPU: 2}"),
              HasSubstr("nvidia.migWarmInstances: unknown key \"maxPerGPU\""));
  EXPECT_THAT(error("[5m]"), HasSubstr("nvidia.migWarmInstances: must be a mapping"));
}

}  // namespace
}  // namespace dynmig::protocol
