// `dynmig nvml`, run in-process against the simulator.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cli.h"
#include "nvml_test_util.h"

namespace dynmig::cli {
namespace {

using nvml::testing::TempStateFile;

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

Result RunDynmig(std::vector<std::string> args) {
  std::ostringstream out;
  std::ostringstream err;
  Result r;
  r.code = RunCli(args, out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

class CmdNvmlTest : public ::testing::Test {
 protected:
  // `dynmig nvml --sim <spec> --state <file> args...`
  Result Nvml(std::vector<std::string> args, const std::string& spec = "A100-SXM4-40GBx2") {
    std::vector<std::string> full = {"nvml", "--sim", spec, "--state", state_.path()};
    full.insert(full.end(), args.begin(), args.end());
    return RunDynmig(full);
  }
  nlohmann::json Json(const Result& r) {
    EXPECT_EQ(r.code, kExitOk) << r.err;
    return nlohmann::json::parse(r.out);
  }

  TempStateFile state_;
};

TEST_F(CmdNvmlTest, ListsSimulatedGpus) {
  const Result text = Nvml({"list"});
  ASSERT_EQ(text.code, kExitOk) << text.err;
  EXPECT_NE(text.out.find("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-"), std::string::npos);
  EXPECT_NE(text.out.find("GPU 1: NVIDIA A100-SXM4-40GB"), std::string::npos);
  EXPECT_NE(text.out.find("MIG enabled"), std::string::npos);
  const auto j = Json(Nvml({"list", "-o", "json"}));
  ASSERT_EQ(j["gpus"].size(), 2u);
  EXPECT_EQ(j["gpus"][0]["pciDeviceId"], "0x20B010DE");
  EXPECT_EQ(j["gpus"][0]["memoryMiB"], 40960);
  EXPECT_EQ(j["gpus"][1]["pciBusId"], "00000000:0F:00.0");
  EXPECT_EQ(j["gpus"][0]["mig"]["current"], true);
}

TEST_F(CmdNvmlTest, ProfilesJsonHasNamesIdsMemorySlicesCountsAndPlacements) {
  const auto j = Json(Nvml({"profiles", "-o", "json"}));
  ASSERT_EQ(j["gpus"].size(), 2u);
  const auto& profiles = j["gpus"][0]["profiles"];
  ASSERT_EQ(profiles.size(), 7u);
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& p : profiles) by_name[p["name"]] = p;
  ASSERT_TRUE(by_name.count("1g.5gb"));
  EXPECT_EQ(by_name["1g.5gb"]["id"], 19);
  EXPECT_EQ(by_name["1g.5gb"]["memoryMiB"], 4864);
  EXPECT_EQ(by_name["1g.5gb"]["sliceCount"], 1);
  EXPECT_EQ(by_name["1g.5gb"]["instanceCount"], 7);
  EXPECT_EQ(by_name["1g.5gb"]["placements"].size(), 7u);
  EXPECT_EQ(by_name["3g.20gb"]["placements"],
            nlohmann::json::parse(R"([{"start":0,"size":4},{"start":4,"size":4}])"));
  EXPECT_EQ(by_name["1g.10gb"]["id"], 15);
  EXPECT_EQ(by_name["1g.5gb+me"]["instanceCount"], 1);
  EXPECT_EQ(by_name["7g.40gb"]["free"], 1);
  const Result text = Nvml({"profiles", "--gpu", "1"});
  ASSERT_EQ(text.code, kExitOk) << text.err;
  EXPECT_NE(text.out.find("{0,1,2,3,4,5,6}:1"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("{0,4}:4"), std::string::npos);
  EXPECT_EQ(text.out.find("GPU 0"), std::string::npos);
}

TEST_F(CmdNvmlTest, CreateListAndDestroyAcrossInvocations) {
  const auto created = Json(
      Nvml({"create", "--gpu", "1", "--profile", "3g.20gb", "--placement", "4", "-o", "json"}));
  EXPECT_TRUE(created["migUUID"].get<std::string>().starts_with("MIG-"));
  EXPECT_EQ(created["gpuInstanceID"], 2);
  EXPECT_EQ(created["computeInstanceID"], 0);
  // By profile id, text output.
  const Result second = Nvml({"create", "--gpu", "1", "--profile", "19", "--placement", "0"});
  ASSERT_EQ(second.code, kExitOk) << second.err;
  EXPECT_NE(second.out.find("GPU instance 7 (1g.5gb at 0:1)"), std::string::npos) << second.out;

  const auto listed = Json(Nvml({"instances", "-o", "json"}));
  EXPECT_TRUE(listed["gpus"][0]["gpuInstances"].empty());
  const auto& gis = listed["gpus"][1]["gpuInstances"];
  ASSERT_EQ(gis.size(), 2u);
  EXPECT_EQ(gis[0]["id"], 2);
  EXPECT_EQ(gis[0]["profile"], "3g.20gb");
  EXPECT_EQ(gis[0]["computeInstances"][0]["migUUID"], created["migUUID"]);
  const Result text = Nvml({"instances"});
  EXPECT_NE(text.out.find(created["migUUID"].get<std::string>()), std::string::npos);
  EXPECT_NE(text.out.find("no GPU instances"), std::string::npos);

  const auto destroyed = Json(Nvml({"destroy", "--gpu", "1", "--gi", "2", "-o", "json"}));
  EXPECT_EQ(destroyed["gpuInstanceID"], 2);
  EXPECT_EQ(destroyed["destroyedComputeInstanceIDs"], nlohmann::json::parse("[0]"));
  const auto after = Json(Nvml({"instances", "--gpu", "1", "-o", "json"}));
  ASSERT_EQ(after["gpus"][0]["gpuInstances"].size(), 1u);
  EXPECT_EQ(after["gpus"][0]["gpuInstances"][0]["id"], 7);
}

TEST_F(CmdNvmlTest, CreateErrorsNameGpuProfilePlacementAndReasonAndChangeNothing) {
  ASSERT_EQ(Nvml({"create", "--gpu", "0", "--profile", "4g.20gb", "--placement", "0"}).code,
            kExitOk);
  const Result overlap = Nvml({"create", "--gpu", "0", "--profile", "3g.20gb", "--placement", "0"});
  EXPECT_EQ(overlap.code, kExitFailure);
  for (const char* needle :
       {"GPU 0", "3g.20gb", "placement 0", "NVML_ERROR_INSUFFICIENT_RESOURCES"}) {
    EXPECT_NE(overlap.err.find(needle), std::string::npos) << needle << " in " << overlap.err;
  }
  const Result bad_profile =
      Nvml({"create", "--gpu", "0", "--profile", "5g.25gb", "--placement", "0"});
  EXPECT_EQ(bad_profile.code, kExitBadInput);
  EXPECT_NE(bad_profile.err.find("3g.20gb (id 9)"), std::string::npos) << bad_profile.err;
  const Result bad_placement =
      Nvml({"create", "--gpu", "0", "--profile", "2g.10gb", "--placement", "6"});
  EXPECT_EQ(bad_placement.code, kExitBadInput);
  EXPECT_NE(bad_placement.err.find("legal starts: 0, 2, 4"), std::string::npos)
      << bad_placement.err;
  const Result bad_gpu = Nvml({"create", "--gpu", "5", "--profile", "2g.10gb", "--placement", "0"});
  EXPECT_EQ(bad_gpu.code, kExitBadInput);
  EXPECT_NE(bad_gpu.err.find("no GPU 5"), std::string::npos);
  const auto listed = Json(Nvml({"instances", "--gpu", "0", "-o", "json"}));
  EXPECT_EQ(listed["gpus"][0]["gpuInstances"].size(), 1u);
}

TEST_F(CmdNvmlTest, DestroyRefusesABusyMigDeviceAndNamesMissingInstances) {
  const auto created =
      Json(Nvml({"create", "--gpu", "0", "--profile", "1g.5gb", "--placement", "3", "-o", "json"}));
  const std::string uuid = created["migUUID"];
  ASSERT_EQ(Nvml({"attach", "--mig", uuid, "--pid", "4242"}).code, kExitOk);
  const Result busy = Nvml({"destroy", "--gpu", "0", "--gi", "10"});
  EXPECT_EQ(busy.code, kExitFailure);
  EXPECT_NE(busy.err.find("in use by process 4242"), std::string::npos) << busy.err;
  EXPECT_EQ(
      Json(Nvml({"instances", "-o", "json"}))["gpus"][0]["gpuInstances"][0]["computeInstances"]
          .size(),
      1u);
  ASSERT_EQ(Nvml({"detach", "--mig", uuid, "--pid", "4242"}).code, kExitOk);
  EXPECT_EQ(Nvml({"destroy", "--gpu", "0", "--gi", "10"}).code, kExitOk);
  const Result missing = Nvml({"destroy", "--gpu", "0", "--gi", "10"});
  EXPECT_EQ(missing.code, kExitFailure);
  EXPECT_NE(missing.err.find("GPU instance 10 on GPU 0"), std::string::npos) << missing.err;
  EXPECT_NE(missing.err.find("NVML_ERROR_NOT_FOUND"), std::string::npos) << missing.err;
}

TEST_F(CmdNvmlTest, HoldFromTheCommandLineMakesDestroyInUseUntilReleased) {
  ASSERT_EQ(
      Nvml({"create", "--gpu", "0", "--profile", "1g.5gb", "--placement", "3", "-o", "json"}).code,
      kExitOk);
  const Result held = Nvml({"hold", "--gpu", "0", "--gi", "10", "--holder", "dcgm"});
  ASSERT_EQ(held.code, kExitOk) << held.err;
  EXPECT_NE(Nvml({"hold", "--list"}).out.find("GPU 0 GI 10: held by dcgm"), std::string::npos);
  const Result busy = Nvml({"destroy", "--gpu", "0", "--gi", "10", "--yes"});
  EXPECT_EQ(busy.code, kExitFailure);
  EXPECT_NE(busy.err.find("NVML_ERROR_IN_USE"), std::string::npos) << busy.err;
  EXPECT_NE(busy.err.find("in use by another client"), std::string::npos) << busy.err;
  // Still listed, held or not.
  EXPECT_EQ(Json(Nvml({"instances", "-o", "json"}))["gpus"][0]["gpuInstances"].size(), 1u);
  // Hostile input changes nothing: a bad name, a GI that does not exist, a holder that never held.
  const Result bad_name = Nvml({"hold", "--gpu", "0", "--gi", "10", "--holder", "a b;rm"});
  EXPECT_NE(bad_name.code, kExitOk);
  EXPECT_NE(bad_name.err.find("holder name"), std::string::npos) << bad_name.err;
  const Result long_name =
      Nvml({"hold", "--gpu", "0", "--gi", "10", "--holder", std::string(65, 'x')});
  EXPECT_NE(long_name.code, kExitOk);
  const Result no_gi = Nvml({"hold", "--gpu", "0", "--gi", "3"});
  EXPECT_NE(no_gi.code, kExitOk);
  EXPECT_NE(no_gi.err.find("NVML_ERROR_NOT_FOUND"), std::string::npos) << no_gi.err;
  const Result never = Nvml({"release", "--gpu", "0", "--gi", "10", "--holder", "other"});
  EXPECT_NE(never.code, kExitOk);
  EXPECT_NE(Nvml({"hold", "--list"}).out.find("held by dcgm"), std::string::npos);
  ASSERT_EQ(Nvml({"release", "--gpu", "0", "--gi", "10"}).code, kExitOk);
  EXPECT_NE(Nvml({"hold", "--list"}).out.find("no GPU instance is held"), std::string::npos);
  const Result destroyed = Nvml({"destroy", "--gpu", "0", "--gi", "10", "--yes"});
  EXPECT_EQ(destroyed.code, kExitOk) << destroyed.err;
}

TEST_F(CmdNvmlTest, FaultsFromTheCommandLineHitTheNextProcess) {
  const Result injected = Nvml(
      {"fault", "--op", "CreateGpuInstance", "--nth", "1", "--code", "INSUFFICIENT_RESOURCES"});
  ASSERT_EQ(injected.code, kExitOk) << injected.err;
  const Result listed = Nvml({"fault", "--list"});
  EXPECT_NE(listed.out.find("CreateGpuInstance call 1 x1 -> NVML_ERROR_INSUFFICIENT_RESOURCES"),
            std::string::npos)
      << listed.out;
  const Result failed = Nvml({"create", "--gpu", "0", "--profile", "7g.40gb", "--placement", "0"});
  EXPECT_EQ(failed.code, kExitFailure);
  EXPECT_NE(failed.err.find("injected"), std::string::npos) << failed.err;
  EXPECT_EQ(Nvml({"create", "--gpu", "0", "--profile", "7g.40gb", "--placement", "0"}).code,
            kExitOk);
  EXPECT_EQ(Nvml({"fault", "--op", "ListGpuInstances", "--latency-ms", "1"}).code, kExitOk);
  EXPECT_EQ(Nvml({"instances"}).code, kExitOk);
  EXPECT_EQ(Nvml({"fault", "--clear"}).code, kExitOk);
  const Result bad_code = Nvml({"fault", "--op", "GetGpu", "--code", "BUSY"});
  EXPECT_EQ(bad_code.code, kExitBadInput);
  const Result bad_op = Nvml({"fault", "--op", "MakeCoffee", "--code", "UNKNOWN"});
  EXPECT_EQ(bad_op.code, kExitBadInput);
  EXPECT_NE(bad_op.err.find("CreateGpuInstance"), std::string::npos);
}

TEST_F(CmdNvmlTest, MigModeAndResetOnAmpere) {
  ASSERT_EQ(Nvml({"mig-mode", "--gpu", "0", "--mode", "disabled"}).code, kExitOk);
  EXPECT_NE(Nvml({"list"}).out.find("MIG enabled (disabled after reset)"), std::string::npos);
  ASSERT_EQ(Nvml({"reset", "--gpu", "0"}).code, kExitOk);
  const Result instances = Nvml({"instances", "--gpu", "0"});
  EXPECT_NE(instances.out.find("MIG disabled"), std::string::npos) << instances.out;
  const Result create = Nvml({"create", "--gpu", "0", "--profile", "7g.40gb", "--placement", "0"});
  EXPECT_EQ(create.code, kExitFailure);
  EXPECT_NE(create.err.find("NVML_ERROR_NOT_SUPPORTED"), std::string::npos) << create.err;
}

TEST_F(CmdNvmlTest, MigModeShowSetRebootRequiredAndReboot) {
  const Result shown = Nvml({"mig-mode", "--gpu", "1"});
  ASSERT_EQ(shown.code, kExitOk) << shown.err;
  EXPECT_EQ(shown.out, "GPU 1: MIG enabled\n");
  const Result set = Nvml({"mig-mode", "--gpu", "0", "--mode", "disabled"});
  ASSERT_EQ(set.code, kExitOk) << set.err;
  EXPECT_NE(set.out.find("pending: NVML_ERROR_IN_USE, a GPU reset applies it"), std::string::npos)
      << set.out;
  const auto j = Json(Nvml({"mig-mode", "--gpu", "0", "-o", "json"}));
  EXPECT_EQ(j["current"], true);
  EXPECT_EQ(j["pending"], false);
  // A host without GPU reset: the reset is refused, the reboot applies the mode.
  ASSERT_EQ(Nvml({"reboot-required", "--gpu", "1"}).code, kExitOk);
  const Result pending = Nvml({"mig-mode", "--gpu", "1", "--mode", "disabled"});
  EXPECT_NE(pending.out.find("NVML_ERROR_RESET_REQUIRED"), std::string::npos) << pending.out;
  const Result reset = Nvml({"reset", "--gpu", "1"});
  EXPECT_EQ(reset.code, kExitFailure);
  EXPECT_NE(reset.err.find("NVML_ERROR_NOT_SUPPORTED"), std::string::npos) << reset.err;
  ASSERT_EQ(Nvml({"reboot"}).code, kExitOk);
  EXPECT_EQ(Nvml({"mig-mode", "--gpu", "1"}).out, "GPU 1: MIG disabled\n");
  EXPECT_EQ(Nvml({"mig-mode", "--gpu", "0"}).out, "GPU 0: MIG disabled\n");
  ASSERT_EQ(Nvml({"reboot-required", "--gpu", "1", "--clear"}).code, kExitOk);
  // Bad input: no such GPU, a mode that is not one, a GPU without MIG.
  EXPECT_EQ(Nvml({"mig-mode", "--gpu", "7"}).code, kExitFailure);
  EXPECT_EQ(Nvml({"mig-mode", "--gpu", "0", "--mode", "on"}).code, kExitBadInput);
  EXPECT_EQ(Nvml({"reboot-required", "--gpu", "9"}).code, kExitFailure);
}

TEST_F(CmdNvmlTest, GpuWithoutMig) {
  const Result list = Nvml({"list"}, "T4x1");
  ASSERT_EQ(list.code, kExitOk) << list.err;
  EXPECT_NE(list.out.find("Tesla T4"), std::string::npos) << list.out;
  EXPECT_NE(list.out.find("MIG not supported"), std::string::npos) << list.out;
  const Result set = Nvml({"mig-mode", "--gpu", "0", "--mode", "enabled"}, "T4x1");
  EXPECT_EQ(set.code, kExitFailure);
  EXPECT_NE(set.err.find("NVML_ERROR_NOT_SUPPORTED"), std::string::npos) << set.err;
}

TEST_F(CmdNvmlTest, DeviceNodesForAMigDevice) {
  const Result r = Nvml({"devices", "--gpu", "1", "--gi", "2", "--ci", "0"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out,
            "/dev/nvidia1\n/dev/nvidia-caps/nvidia-cap156\n/dev/nvidia-caps/nvidia-cap157\n"
            "/dev/nvidiactl\n/dev/nvidia-uvm\n/dev/nvidia-uvm-tools\n");
}

TEST_F(CmdNvmlTest, BadSpecsAndSimulatorOnlyCommandsAreBadInput) {
  const Result unknown = RunDynmig({"nvml", "--sim", "V100x2", "list"});
  EXPECT_EQ(unknown.code, kExitBadInput);
  EXPECT_NE(unknown.err.find("unknown GPU model \"V100\""), std::string::npos) << unknown.err;
  const Result count = RunDynmig({"nvml", "--sim", "A30x0", "list"});
  EXPECT_EQ(count.code, kExitBadInput);
  const Result no_sim = RunDynmig({"nvml", "fault", "--op", "GetGpu", "--code", "UNKNOWN"});
  EXPECT_EQ(no_sim.code, kExitBadInput);
  EXPECT_NE(no_sim.err.find("--sim"), std::string::npos);
}

TEST_F(CmdNvmlTest, RealDriverMissingIsAClearFailure) {
  const Result r = RunDynmig({"nvml", "--library", "libdynmig-no-such-nvml.so.1", "list"});
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_NE(r.err.find("no NVIDIA driver found (libdynmig-no-such-nvml.so.1: "), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace dynmig::cli

namespace dynmig::cli {
namespace {

class CmdApplyGeometryTest : public ::testing::Test {
 protected:
  Result Nvml(const std::string& spec, std::vector<std::string> args) {
    std::vector<std::string> full = {"nvml", "--sim", spec, "--state", state_.path()};
    full.insert(full.end(), args.begin(), args.end());
    return RunDynmig(full);
  }
  nvml::testing::TempStateFile state_;
};

TEST_F(CmdApplyGeometryTest, AppliesOnEveryGpuAndIsIdempotent) {
  Result r = Nvml("H200x2", {"apply-geometry", "--geometry", "1g.18gb=1,2g.35gb=3", "-o", "json"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["gpus"].size(), 2u);
  EXPECT_EQ(j["gpus"][1]["instances"].size(), 4u);
  EXPECT_FALSE(j["gpus"][0]["unchanged"].get<bool>());
  Result again =
      Nvml("H200x2", {"apply-geometry", "--gpu", "1", "--geometry", "1g.18gb=1,2g.35gb=3"});
  ASSERT_EQ(again.code, kExitOk) << again.err;
  EXPECT_NE(again.out.find("already applied, nothing changed"), std::string::npos) << again.out;
  Result other = Nvml("H200x2", {"apply-geometry", "--gpu", "0", "--geometry", "all-1g.18gb"});
  EXPECT_EQ(other.code, kExitFailure);
  EXPECT_NE(other.err.find("GPU 0 already has GPU instances"), std::string::npos) << other.err;
}

TEST_F(CmdApplyGeometryTest, HamiLegacyGeometryFromTheDeviceConfig) {
  nvml::testing::TempStateFile config;
  {
    std::ofstream out(config.path());
    out << "nvidia:\n"
           "  knownMigGeometries:\n"
           "    - models: [\"A100-SXM4-40GB\"]\n"
           "      allowedGeometries:\n"
           "        - - {name: 1g.5gb, core: 14, memory: 5120, count: 7}\n"
           "        - - {name: 3g.20gb, core: 42, memory: 20480, count: 2}\n";
  }
  Result r = Nvml("A100-SXM4-40GBx1",
                  {"apply-geometry", "--hami-config", config.path(), "--hami-geometry", "1"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_NE(r.out.find("3g.20gb=2 applied"), std::string::npos) << r.out;
  Result beyond = Nvml("A100-SXM4-40GBx1",
                       {"apply-geometry", "--hami-config", config.path(), "--hami-geometry", "5"});
  EXPECT_EQ(beyond.code, kExitBadInput);
}

TEST_F(CmdApplyGeometryTest, BadInputChangesNothing) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"apply-geometry"},
           {"apply-geometry", "--geometry", "1g.18gb=99"},
           {"apply-geometry", "--geometry", "3g.20gb=1"},  // not an H200 profile
           {"apply-geometry", "--geometry", "all-1g.18gb", "--hami-config", "/nonexistent"},
       }) {
    Result r = Nvml("H200x1", args);
    EXPECT_EQ(r.code, kExitBadInput) << args.back() << ": " << r.err;
  }
  Result listed = Nvml("H200x1", {"instances", "-o", "json"});
  EXPECT_TRUE(nlohmann::json::parse(listed.out)["gpus"][0]["gpuInstances"].empty());
}

}  // namespace
}  // namespace dynmig::cli
