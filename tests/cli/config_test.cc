// `dynmig config migrate|validate|default`, run in-process with temporary files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cli/cli.h"
#include "protocol/device_config.h"

namespace dynmig::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr char kLegacy[] = R"(nvidia:
  resourceCountName: nvidia.com/gpu
  deviceSplitCount: 10
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
        - - name: 3g.20gb
            core: 42
            memory: 20480
            count: 2
        - - name: 7g.40gb
            core: 100
            memory: 40960
            count: 1
cambricon:
  resourceCountName: cambricon.com/vmlu
)";

class ConfigCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dynmig-config-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << content;
    return path;
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  int Run(const std::vector<std::string>& args) {
    out_.str("");
    err_.str("");
    return RunCli(args, out_, err_);
  }

  std::filesystem::path dir_;
  std::ostringstream out_;
  std::ostringstream err_;
};

TEST_F(ConfigCommandTest, MigrateToStdout) {
  const std::string in = Write("old.yaml", kLegacy);
  EXPECT_EQ(Run({"config", "migrate", "--in", in}), kExitOk) << err_.str();
  EXPECT_THAT(out_.str(),
              HasSubstr("profiles: [\"1g.5gb\", \"2g.10gb\", \"3g.20gb\", \"7g.40gb\"]"));
  EXPECT_THAT(out_.str(), HasSubstr("deviceSplitCount: 10"));
  EXPECT_THAT(out_.str(), HasSubstr("cambricon:"));
  EXPECT_THAT(out_.str(), Not(HasSubstr("knownMigGeometries")));
  EXPECT_THAT(err_.str(), HasSubstr("dropped 4 geometries"));
  EXPECT_THAT(err_.str(), HasSubstr("1g.5gb core=14 memory=5120 count=7"));
  auto cfg = protocol::ParseDeviceConfig(out_.str());
  ASSERT_TRUE(cfg.ok()) << cfg.status();
}

TEST_F(ConfigCommandTest, MigrateToAFile) {
  const std::string in = Write("old.yaml", kLegacy);
  const std::string out = (dir_ / "new.yaml").string();
  EXPECT_EQ(Run({"config", "migrate", "--in", in, "--out", out}), kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), IsEmpty());
  EXPECT_THAT(err_.str(), HasSubstr("wrote " + out));
  const std::string written = Read(out);
  EXPECT_THAT(written, HasSubstr("migProfileAllowlist"));
  // The result validates.
  EXPECT_EQ(Run({"config", "validate", "--in", out}), kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("OK"));
  EXPECT_THAT(err_.str(), IsEmpty());
}

TEST_F(ConfigCommandTest, MigrateRefusesInvalidInputAndWritesNothing) {
  const std::string in = Write("bad.yaml",
                               "nvidia:\n  knownMigGeometries:\n    - models: [A30]\n"
                               "      allowedGeometries:\n        - - {name: 1g.6gb, "
                               "memory: big}\n");
  const std::string out = (dir_ / "new.yaml").string();
  EXPECT_EQ(Run({"config", "migrate", "--in", in, "--out", out}), kExitBadInput);
  EXPECT_THAT(err_.str(), HasSubstr("nvidia.knownMigGeometries[0].allowedGeometries[0][0].memory"));
  EXPECT_THAT(err_.str(), HasSubstr("nothing was written"));
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST_F(ConfigCommandTest, MigrateUnreadableInput) {
  const std::string out = (dir_ / "new.yaml").string();
  EXPECT_EQ(Run({"config", "migrate", "--in", (dir_ / "missing.yaml").string(), "--out", out}),
            kExitBadInput);
  EXPECT_THAT(err_.str(), HasSubstr("cannot read"));
  EXPECT_THAT(err_.str(), HasSubstr("missing.yaml"));
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST_F(ConfigCommandTest, MigrateRequiresIn) {
  EXPECT_EQ(Run({"config", "migrate"}), kExitBadInput);
  EXPECT_THAT(err_.str(), HasSubstr("--in"));
}

TEST_F(ConfigCommandTest, MigrateMergesAndSaysSo) {
  const std::string in = Write("both.yaml", R"(nvidia:
  migProfileAllowlist:
    - models: ["A100-SXM4-40GB"]
      profiles: ["1g.5gb"]
  knownMigGeometries:
    - models: ["A100-SXM4-40GB"]
      allowedGeometries:
        - - {name: 7g.40gb, count: 1}
)");
  EXPECT_EQ(Run({"config", "migrate", "--in", in}), kExitOk) << err_.str();
  EXPECT_THAT(err_.str(), HasSubstr("already exists"));
  EXPECT_THAT(err_.str(), HasSubstr("legacy profiles [7g.40gb] not added"));
  EXPECT_THAT(out_.str(), HasSubstr("profiles: [\"1g.5gb\"]"));
}

TEST_F(ConfigCommandTest, ValidateReportsTheFieldPath) {
  const std::string in = Write("bad.yaml", R"(nvidia:
  migProfileAllowlist:
    - models: [A30]
      profiles: [1g.6gb]
    - models: [A100]
      profiles: [5gb]
)");
  EXPECT_EQ(Run({"config", "validate", "--in", in}), kExitBadInput);
  EXPECT_THAT(err_.str(), HasSubstr("nvidia.migProfileAllowlist[1].profiles[0]: invalid MIG "
                                    "profile name \"5gb\""));
  EXPECT_THAT(out_.str(), IsEmpty());
}

TEST_F(ConfigCommandTest, ValidateWarnsAboutLegacyGeometries) {
  const std::string in = Write("old.yaml", kLegacy);
  EXPECT_EQ(Run({"config", "validate", "--in", in}), kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("OK"));
  EXPECT_THAT(err_.str(), HasSubstr("dynmig config migrate"));
}

TEST_F(ConfigCommandTest, ValidateKnowsMigModeSwitching) {
  const std::string ok = Write("switch.yaml", R"(nvidia:
  migProfileAllowlist:
    - models: [H100]
      profiles: [1g.10gb, 7g.80gb]
  migModeSwitching:
    minModeDuration: 30m
    rules:
      - models: [H100]
        nodeSelector: {dynmig.io/gpu-mode: flex}
)");
  EXPECT_EQ(Run({"config", "validate", "--in", ok}), kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("MIG mode switching: on, 1 rule, minModeDuration 30m"));
  const std::string bad = Write("bad-switch.yaml", R"(nvidia:
  migModeSwitching:
    rules:
      - models: [H100]
        nodeSelectors: {pool: flex}
)");
  EXPECT_EQ(Run({"config", "validate", "--in", bad}), kExitBadInput);
  EXPECT_THAT(err_.str(), HasSubstr("nvidia.migModeSwitching.rules[0]: unknown key "
                                    "\"nodeSelectors\"; the keys are models and nodeSelector"));
}

TEST_F(ConfigCommandTest, ValidateUnreadableFile) {
  EXPECT_EQ(Run({"config", "validate", "--in", (dir_ / "nope.yaml").string()}), kExitBadInput);
  EXPECT_THAT(err_.str(), HasSubstr("cannot read"));
}

TEST_F(ConfigCommandTest, DefaultPrintsAValidConfig) {
  EXPECT_EQ(Run({"config", "default"}), kExitOk);
  EXPECT_EQ(out_.str(), protocol::DefaultDeviceConfigYaml());
  const std::string path = Write("default.yaml", out_.str());
  EXPECT_EQ(Run({"config", "validate", "--in", path}), kExitOk) << err_.str();
  EXPECT_THAT(err_.str(), IsEmpty());
}

TEST_F(ConfigCommandTest, ConfigNeedsASubcommand) { EXPECT_EQ(Run({"config"}), kExitBadInput); }

}  // namespace
}  // namespace dynmig::cli
