// The device plugin's MIG mode switches (deviceplugin/mode_switch.h): dynmig.io/gpu-mode-request
// read from the Node, carried out on the simulator per architecture, refused while anything uses
// the GPU or where the host cannot apply it, resumed or rolled back after a restart at every step,
// and dynmig.io/gpu-mode published only when nvidia.migModeSwitching is configured.
#include "deviceplugin/mode_switch.h"

#include <string>
#include <vector>

#include "deviceplugin/state_store.h"
#include "dp_test_util.h"
#include "protocol/gpu_mode_switch.h"

namespace dynmig::deviceplugin::testing {
namespace {

using protocol::GpuMode;
using protocol::GpuModePhase;
using protocol::GpuModeRequest;
using protocol::GpuModeStatus;

class ModeSwitchTest : public PluginTest {
 protected:
  std::string Spec() const override { return "A100-SXM4-40GBx1"; }

  // Switching on for every GPU (no rules), unless a test says otherwise.
  void Configure(DevicePluginOptions& o) const {
    o.core.allowlist.entries.push_back({{"H100"}, {"1g.10gb", "7g.80gb"}});
    o.core.mig_mode_switching.present = present_;
    o.core.mig_mode_switching.enabled = enabled_;
    o.core.mig_mode_switching.rules = rules_;
    if (crash_.has_value()) {
      o.core.crash_point = [point = *crash_](std::string_view p) { return p == point; };
    }
  }

  // StartPlugin without waiting for every device to be healthy (a GPU outside MIG mode is not).
  DevicePlugin* Start() {
    StopPlugin();
    plugin_sim_ = OpenSim("", plugin_device_nodes_);
    DevicePluginOptions o = Options();
    Configure(o);
    auto plugin = DevicePlugin::Start(std::move(o), *plugin_sim_, *plugin_kube_, pod_resources_);
    EXPECT_TRUE(plugin.ok()) << plugin.status();
    if (!plugin.ok()) return nullptr;
    plugin_ = std::move(*plugin);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (plugin_->cycles() < 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    EXPECT_GE(plugin_->cycles(), 1u);
    EXPECT_TRUE(kubelet_->WaitForRegistrations(++expected_registrations_, absl::Seconds(10)));
    return plugin_.get();
  }

  void SetRequestValue(const std::string& value) {
    kube::KeyPatch patch;
    patch[std::string(protocol::kGpuModeRequestAnnotation)] = value;
    ASSERT_TRUE(kube_->PatchNodeAnnotations(kNode, patch).ok());
  }
  void Request(int gpu, GpuMode to, int64_t at) {
    SetRequestValue(protocol::EncodeGpuModeRequests(
        {GpuModeRequest{GpuUuid(gpu), to, at, "operator:test", "test"}}));
  }

  std::optional<std::string> StatusValue() {
    auto node = kube_->GetNode(kNode);
    EXPECT_TRUE(node.ok());
    if (!node.ok()) return std::nullopt;
    return kube::Annotation(*node, protocol::kGpuModeStatusAnnotation);
  }
  GpuModeStatus Status(int gpu) {
    auto value = StatusValue();
    EXPECT_TRUE(value.has_value()) << "no dynmig.io/gpu-mode on the node";
    if (!value.has_value()) return {};
    auto statuses = protocol::DecodeGpuModeStatuses(*value);
    EXPECT_TRUE(statuses.ok()) << statuses.status();
    if (!statuses.ok()) return {};
    for (const auto& s : *statuses) {
      if (s.gpu_uuid == GpuUuid(gpu)) return s;
    }
    ADD_FAILURE() << "no status for GPU " << gpu << " in " << *value;
    return {};
  }

  nvml::MigModeState Mode(int gpu) {
    auto m = sim_->GetMigMode(gpu);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *m : nvml::MigModeState{};
  }

  PluginState SavedState() {
    StateStore store(dir_.path() + "/state/state.json", false);
    auto state = store.Load();
    EXPECT_TRUE(state.ok()) << state.status();
    return state.ok() ? *state : PluginState{};
  }

  bool DevicesHealthy() {
    for (const auto& d : plugin_->core().Devices()) {
      if (d.health() != "Healthy") return false;
    }
    return true;
  }

  bool present_ = true;
  bool enabled_ = true;
  std::vector<protocol::MigModeSwitchRule> rules_;
  std::optional<std::string> crash_;
};

class HopperModeSwitchTest : public ModeSwitchTest {
 protected:
  std::string Spec() const override { return "H100 80GBx1"; }
};

TEST_F(HopperModeSwitchTest, SwitchesAtOnceBothWaysAndSinceSurvivesARestart) {
  ASSERT_NE(Start(), nullptr);
  GpuModeStatus before = Status(0);
  EXPECT_EQ(before.mode, GpuMode::kMig);
  EXPECT_TRUE(before.mig_capable);
  EXPECT_TRUE(before.switchable);
  EXPECT_EQ(before.phase, GpuModePhase::kSteady);
  EXPECT_GT(before.since_ms, 0);

  Request(0, GpuMode::kWholeGpu, 1000);
  EXPECT_TRUE(plugin_->core().SwitchModes());
  GpuModeStatus after = Status(0);
  EXPECT_EQ(after.mode, GpuMode::kWholeGpu);
  EXPECT_EQ(after.phase, GpuModePhase::kSteady);
  EXPECT_EQ(after.answers_ms, 1000);
  EXPECT_TRUE(after.switchable);
  EXPECT_GE(after.since_ms, before.since_ms);
  EXPECT_TRUE(protocol::StatusAnswers(after, {GpuUuid(0), GpuMode::kWholeGpu, 1000, "", ""}));
  EXPECT_EQ(Mode(0), (nvml::MigModeState{true, false, false}));
  EXPECT_TRUE(HasEvent(kReasonModeSwitched, "hami-core"));
  EXPECT_TRUE(SavedState().mode_switches.empty());
  // Answered: nothing more to do in the next cycle.
  EXPECT_FALSE(plugin_->core().SwitchModes());

  // A restart keeps `since` (the state file), and the answer.
  ASSERT_NE(Start(), nullptr);
  GpuModeStatus restarted = Status(0);
  EXPECT_EQ(restarted.since_ms, after.since_ms);
  EXPECT_EQ(restarted.answers_ms, 1000);
  EXPECT_EQ(restarted.mode, GpuMode::kWholeGpu);

  Request(0, GpuMode::kMig, 2000);
  EXPECT_TRUE(plugin_->core().SwitchModes());
  EXPECT_EQ(Status(0).mode, GpuMode::kMig);
  EXPECT_EQ(Status(0).answers_ms, 2000);
  EXPECT_EQ(Mode(0), (nvml::MigModeState{true, true, true}));
  EXPECT_TRUE(DevicesHealthy());
}

TEST_F(ModeSwitchTest, AmpereSwitchIsAppliedByAResetOfTheIdleGpu) {
  ASSERT_NE(Start(), nullptr);
  Request(0, GpuMode::kWholeGpu, 1000);
  EXPECT_TRUE(plugin_->core().SwitchModes());
  EXPECT_EQ(Mode(0), (nvml::MigModeState{true, false, false}));
  GpuModeStatus s = Status(0);
  EXPECT_EQ(s.mode, GpuMode::kWholeGpu);
  EXPECT_EQ(s.phase, GpuModePhase::kSteady);
  EXPECT_EQ(s.answers_ms, 1000);
  EXPECT_TRUE(s.switchable);
  EXPECT_TRUE(SavedState().mode_switches.empty());
}

TEST_F(ModeSwitchTest, AmpereWithoutAResetIsSetBackAndMarkedUntilRestart) {
  ASSERT_NE(Start(), nullptr);
  ASSERT_TRUE(
      sim_->InjectFault({"ResetGpu", 1, 100, nvml::NvmlReturn::kNotSupported, std::nullopt}).ok());
  Request(0, GpuMode::kWholeGpu, 1000);
  EXPECT_TRUE(plugin_->core().SwitchModes());
  // Set back: nothing pending, the GPU keeps MIG and serves again.
  EXPECT_EQ(Mode(0), (nvml::MigModeState{true, true, true}));
  GpuModeStatus s = Status(0);
  EXPECT_EQ(s.mode, GpuMode::kMig);
  EXPECT_EQ(s.phase, GpuModePhase::kRefused);
  EXPECT_EQ(s.answers_ms, 1000);
  EXPECT_EQ(s.reason, kNeedsReset);
  EXPECT_FALSE(s.switchable);
  EXPECT_TRUE(DevicesHealthy());
  EXPECT_TRUE(HasEvent(kReasonModeRefused, std::string(kNeedsReset)));
  // A later request is refused without touching NVML.
  Request(0, GpuMode::kWholeGpu, 2000);
  EXPECT_TRUE(plugin_->core().SwitchModes());
  EXPECT_EQ(Status(0).phase, GpuModePhase::kRefused);
  EXPECT_EQ(Status(0).answers_ms, 2000);
  EXPECT_NE(Status(0).reason.find("until the device plugin restarts"), std::string::npos);
  // The mark lasts until the plugin restarts, and the status says so no longer.
  ASSERT_TRUE(sim_->ClearFaults().ok());
  ASSERT_NE(Start(), nullptr);
  EXPECT_TRUE(Status(0).switchable);
  EXPECT_EQ(Status(0).phase, GpuModePhase::kSteady);
  EXPECT_EQ(Status(0).answers_ms, 2000);
}

TEST_F(ModeSwitchTest, RebootRequiredIsSetBackAndReported) {
  ASSERT_TRUE(sim_->SetRebootRequired(0, true).ok());
  ASSERT_NE(Start(), nullptr);
  Request(0, GpuMode::kWholeGpu, 1000);
  EXPECT_TRUE(plugin_->core().SwitchModes());
  EXPECT_EQ(Mode(0), (nvml::MigModeState{true, true, true}));
  GpuModeStatus s = Status(0);
  EXPECT_EQ(s.phase, GpuModePhase::kRefused);
  EXPECT_EQ(s.reason, kNeedsReboot);
  EXPECT_FALSE(s.switchable);
  EXPECT_EQ(s.mode, GpuMode::kMig);
  // After a restart (the host rebooted, say) the refusal no longer holds: the status is steady,
  // still answering the request, and the GPU may switch again.
  ASSERT_TRUE(sim_->SetRebootRequired(0, false).ok());
  ASSERT_NE(Start(), nullptr);
  s = Status(0);
  EXPECT_EQ(s.phase, GpuModePhase::kSteady);
  EXPECT_EQ(s.reason, "");
  EXPECT_EQ(s.answers_ms, 1000);
  EXPECT_TRUE(s.switchable);
  Request(0, GpuMode::kWholeGpu, 3000);
  EXPECT_TRUE(plugin_->core().SwitchModes());
  EXPECT_EQ(Mode(0), (nvml::MigModeState{true, false, false}));
}

TEST_F(ModeSwitchTest, BusyGpuIsRefusedNamingWhatUsesIt) {
  ASSERT_NE(Start(), nullptr);
  // A reservation (nothing created yet).
  CreatePod("reserved", {{0, 0, 0, "1g.5gb", 0}});
  Request(0, GpuMode::kWholeGpu, 1000);
  EXPECT_TRUE(plugin_->core().SwitchModes());
  GpuModeStatus s = Status(0);
  EXPECT_EQ(s.phase, GpuModePhase::kRefused);
  EXPECT_NE(s.reason.find("pod default/reserved reserves it"), std::string::npos) << s.reason;
  EXPECT_TRUE(s.switchable);
  EXPECT_EQ(Mode(0), (nvml::MigModeState{true, true, true}));

  // Its instance, once allocated.
  DP_ASSERT_OK(Allocate("reserved", 0, 1));
  Request(0, GpuMode::kWholeGpu, 2000);
  EXPECT_TRUE(plugin_->core().SwitchModes());
  s = Status(0);
  EXPECT_EQ(s.answers_ms, 2000);
  EXPECT_EQ(s.phase, GpuModePhase::kRefused);
  EXPECT_NE(s.reason.find("in use"), std::string::npos) << s.reason;
  EXPECT_EQ(Mode(0), (nvml::MigModeState{true, true, true}));
  EXPECT_EQ(Gis(0).size(), 1u);
}

TEST_F(ModeSwitchTest, UntrackedInstanceOrProcessRefuses) {
  ASSERT_NE(Start(), nullptr);
  const nvml::ComputeInstanceInfo raw = CreateRaw(0, "1g.5gb", 0);
  Request(0, GpuMode::kWholeGpu, 1000);
  EXPECT_TRUE(plugin_->core().SwitchModes());
  EXPECT_EQ(Status(0).phase, GpuModePhase::kRefused);
  EXPECT_NE(Status(0).reason.find("GPU instance"), std::string::npos) << Status(0).reason;
  EXPECT_EQ(Mode(0), (nvml::MigModeState{true, true, true}));
  ASSERT_TRUE(sim_->DestroyComputeInstance(0, raw.gpu_instance_id, raw.id).ok());
  ASSERT_TRUE(sim_->DestroyGpuInstance(0, raw.gpu_instance_id).ok());

  ASSERT_TRUE(sim_->AttachProcess(GpuUuid(0), 4242).ok());
  Request(0, GpuMode::kWholeGpu, 2000);
  EXPECT_TRUE(plugin_->core().SwitchModes());
  EXPECT_EQ(Status(0).phase, GpuModePhase::kRefused);
  EXPECT_NE(Status(0).reason.find("process"), std::string::npos) << Status(0).reason;
  EXPECT_EQ(Mode(0), (nvml::MigModeState{true, true, true}));
}

TEST_F(ModeSwitchTest, ConfigThatDoesNotAllowItRefuses) {
  enabled_ = false;
  ASSERT_NE(Start(), nullptr);
  EXPECT_FALSE(Status(0).switchable);
  Request(0, GpuMode::kWholeGpu, 1000);
  EXPECT_TRUE(plugin_->core().SwitchModes());
  EXPECT_EQ(Status(0).phase, GpuModePhase::kRefused);
  EXPECT_NE(Status(0).reason.find("switching is off"), std::string::npos);
  EXPECT_EQ(Mode(0), (nvml::MigModeState{true, true, true}));

  enabled_ = true;
  rules_ = {protocol::MigModeSwitchRule{{"H100"}, {}}};
  ASSERT_NE(Start(), nullptr);
  Request(0, GpuMode::kWholeGpu, 2000);
  EXPECT_TRUE(plugin_->core().SwitchModes());
  EXPECT_EQ(Status(0).phase, GpuModePhase::kRefused);
  EXPECT_NE(Status(0).reason.find("no nvidia.migModeSwitching rule"), std::string::npos);
  EXPECT_EQ(Mode(0), (nvml::MigModeState{true, true, true}));
}

TEST_F(ModeSwitchTest, AbsentConfigWritesNoAnnotationAndSwitchesNothing) {
  present_ = false;
  enabled_ = false;
  ASSERT_NE(Start(), nullptr);
  Request(0, GpuMode::kWholeGpu, 1000);
  EXPECT_FALSE(plugin_->core().SwitchModes());
  DP_ASSERT_OK(plugin_->core().PublishNode());
  EXPECT_FALSE(StatusValue().has_value());
  EXPECT_EQ(Mode(0), (nvml::MigModeState{true, true, true}));
  EXPECT_TRUE(plugin_->core().ModeStatuses().empty());
  // The state file has no mode keys either.
  const PluginState state = SavedState();
  EXPECT_TRUE(state.gpu_modes.empty());
  EXPECT_TRUE(state.mode_switches.empty());
}

TEST_F(ModeSwitchTest, TurnedOffTheStatusALastRunPublishedIsRemoved) {
  ASSERT_NE(Start(), nullptr);
  DP_ASSERT_OK(plugin_->core().PublishNode());
  ASSERT_TRUE(StatusValue().has_value());
  // The operator removes nvidia.migModeSwitching; the plugin restarts: the scheduler must not read
  // a status (and so a request) that nobody answers any more.
  present_ = false;
  enabled_ = false;
  ASSERT_NE(Start(), nullptr);
  DP_ASSERT_OK(plugin_->core().PublishNode());
  EXPECT_FALSE(StatusValue().has_value());
}

TEST_F(ModeSwitchTest, HostileRequestsChangeNothing) {
  ASSERT_NE(Start(), nullptr);
  const GpuModeStatus before = Status(0);
  const std::string uuid = GpuUuid(0);
  const std::vector<std::string> hostile = {
      "{{{ not json",
      "[" + std::string(70 * 1024, ' ') + "]",
      fmt::format(R"([{{"gpuUUID":"{0}","to":"hami-core","at":5}},)"
                  R"({{"gpuUUID":"{0}","to":"hami-core","at":6}}])",
                  uuid),
      fmt::format(R"([{{"gpuUUID":"{}","to":"off","at":5}}])", uuid),
      fmt::format(R"([{{"gpuUUID":"{}","to":"hami-core"}}])", uuid),
  };
  for (const auto& value : hostile) {
    SetRequestValue(value);
    plugin_->core().SwitchModes();
    EXPECT_EQ(Mode(0), (nvml::MigModeState{true, true, true})) << value.substr(0, 80);
    EXPECT_EQ(Status(0), before) << value.substr(0, 80);
  }
  EXPECT_TRUE(HasEvent(kReasonModeRequestInvalid, "not valid"));
  // A GPU this node does not have: ignored, reported.
  SetRequestValue(protocol::EncodeGpuModeRequests({GpuModeRequest{
      "GPU-00000000-0000-0000-0000-000000000000", GpuMode::kWholeGpu, 7, "x", ""}}));
  plugin_->core().SwitchModes();
  EXPECT_TRUE(HasEvent(kReasonModeRequestInvalid, "does not expose"));
  EXPECT_EQ(Mode(0), (nvml::MigModeState{true, true, true}));
  EXPECT_TRUE(DevicesHealthy());
}

TEST(ModeSwitchStateTest, RoundTripsAndStaysAbsentUntilUsed) {
  PluginState empty;
  const std::string text = EncodeState(empty);
  EXPECT_EQ(text.find("modeSwitches"), std::string::npos);
  EXPECT_EQ(text.find("gpuModes"), std::string::npos);

  PluginState state;
  state.mode_switches.push_back({"GPU-a", true, false, 1000, "reset", "", false});
  state.mode_switches.push_back({"GPU-b", false, true, 2000, "set-back", "needs a reboot", true});
  state.gpu_modes.push_back({"GPU-a", false, 1234, "steady", 1000, ""});
  state.gpu_modes.push_back({"GPU-b", false, 99, "refused", 2000, "needs a reboot"});
  auto back = DecodeState(EncodeState(state));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, state);
}

TEST(ModeSwitchStateTest, BadModeEntriesAreDataLossNamingTheField) {
  const std::string head = R"({"version":1,"nextIntentId":1,"instances":[],"intents":[],)";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("modeSwitches":{})", "state.modeSwitches"},
      {R"("modeSwitches":[{"gpuUUID":"G","from":"on","to":"mig","requestAt":1,"step":"set-mode",)"
       R"("reason":"","markUnswitchable":false}])",
       "state.modeSwitches[0].from"},
      {R"("modeSwitches":[{"gpuUUID":"G","from":"mig","to":"hami-core","requestAt":1,)"
       R"("step":"explode","reason":"","markUnswitchable":false}])",
       "state.modeSwitches[0].step"},
      {R"("modeSwitches":[{"gpuUUID":"G","from":"mig","to":"hami-core","requestAt":1,)"
       R"("step":"reset","reason":"","markUnswitchable":"yes"}])",
       "state.modeSwitches[0].markUnswitchable"},
      {R"("gpuModes":[{"gpuUUID":"G","mode":"mig","since":1,"phase":"switching","answers":0,)"
       R"("reason":""}])",
       "state.gpuModes[0].phase"},
      {R"("gpuModes":[{"gpuUUID":"G","mode":"mig","phase":"steady","answers":0,"reason":""}])",
       "state.gpuModes[0].since"},
  };
  for (const auto& [body, field] : cases) {
    auto state = DecodeState(head + body + "}");
    ASSERT_FALSE(state.ok()) << body;
    EXPECT_EQ(state.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(state.status().message().find(field), std::string::npos) << state.status();
  }
}

// A restart at every step of a switch: afterwards the switch is either applied or rolled back,
// never left pending, and the status answers the request.
struct CrashCase {
  std::string point;
  bool reset_unsupported = false;  // the set-back path
};

class ModeSwitchCrashTest : public ModeSwitchTest,
                            public ::testing::WithParamInterface<CrashCase> {};

TEST_P(ModeSwitchCrashTest, RestartResumesOrRollsBack) {
  const CrashCase& c = GetParam();
  crash_ = c.point;
  ASSERT_NE(Start(), nullptr);
  if (c.reset_unsupported) {
    ASSERT_TRUE(
        sim_->InjectFault({"ResetGpu", 1, 100, nvml::NvmlReturn::kNotSupported, std::nullopt})
            .ok());
  }
  Request(0, GpuMode::kWholeGpu, 1000);
  EXPECT_TRUE(plugin_->core().SwitchModes());
  // "switching" was published before the GPU was touched, and the GPU takes nothing.
  EXPECT_EQ(Status(0).phase, GpuModePhase::kSwitching);
  EXPECT_EQ(Status(0).answers_ms, 1000);
  EXPECT_FALSE(DevicesHealthy());
  if (c.point != kCrashModeBeforePublish) {
    EXPECT_EQ(SavedState().mode_switches.size(), 1u);
  }

  crash_.reset();
  ASSERT_NE(Start(), nullptr);  // its first cycle carries the request out again if needed
  plugin_->core().SwitchModes();
  const nvml::MigModeState mode = Mode(0);
  EXPECT_EQ(mode.current, mode.pending) << "half-applied after a restart at " << c.point;
  const GpuModeStatus s = Status(0);
  EXPECT_TRUE(protocol::StatusAnswers(s, {GpuUuid(0), GpuMode::kWholeGpu, 1000, "", ""}))
      << c.point << ": phase " << protocol::GpuModePhaseName(s.phase) << " " << s.reason;
  EXPECT_TRUE(SavedState().mode_switches.empty());
  if (c.reset_unsupported) {
    EXPECT_EQ(s.phase, GpuModePhase::kRefused);
    EXPECT_EQ(s.reason, kNeedsReset);
    EXPECT_TRUE(mode.current);
    EXPECT_TRUE(DevicesHealthy());
  } else {
    EXPECT_EQ(s.phase, GpuModePhase::kSteady);
    EXPECT_FALSE(mode.current);
    EXPECT_EQ(s.mode, GpuMode::kWholeGpu);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryStep, ModeSwitchCrashTest,
                         ::testing::Values(CrashCase{std::string(kCrashModeBeforeSet)},
                                           CrashCase{std::string(kCrashModeAfterSet)},
                                           CrashCase{std::string(kCrashModeBeforeReset)},
                                           CrashCase{std::string(kCrashModeBeforePublish)},
                                           CrashCase{std::string(kCrashModeBeforeSetBack), true}),
                         [](const ::testing::TestParamInfo<CrashCase>& param) {
                           std::string name;
                           for (char ch : param.param.point) name += ch == '-' ? '_' : ch;
                           return name;
                         });

}  // namespace
}  // namespace dynmig::deviceplugin::testing
