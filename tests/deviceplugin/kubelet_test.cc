// Registration, ListAndWatch, re-registration after a kubelet restart, node publication.
#include <filesystem>

#include "common/clock.h"
#include "dp_test_util.h"
#include "protocol/node_register.h"

namespace dynmig::deviceplugin::testing {
namespace {

// "Reported_<RFC3339>" as the scheduler reads it.
std::optional<absl::Time> ParseReported(const std::string& value) {
  if (!value.starts_with("Reported_")) return std::nullopt;
  absl::Time t;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, value.substr(9), &t, &err)) return std::nullopt;
  return t;
}

class KubeletTest : public PluginTest {
 protected:
  // GPU 0 is an A100 (allowlisted), GPU 1 an A30 (not).
  std::string Spec() const override { return "A100-SXM4-40GBx1,A30x1"; }

  // The plugin's clock in the tests of (re-)registration: its kubelet watcher looks at the
  // directory only when the test moves this clock by a poll interval.
  FakeClock clock_{absl::Now()};
  void UseFakeClock(DevicePluginOptions& o) { o.clock = &clock_; }
  // Once the plugin's loop and its kubelet watcher wait on the clock, moves it one poll interval:
  // the watcher looks at the directory once.
  void PollKubelet() {
    ASSERT_TRUE(clock_.AwaitWaiters(2)) << "the plugin's loop and watcher do not wait on the clock";
    clock_.Advance(Options().kubelet_poll_interval);
  }
};

TEST_F(KubeletTest, RegistersAndListsSevenReplicasPerAllowlistedGpu) {
  StartPlugin();
  auto info = kubelet_->plugin();
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->resource_name, "nvidia.com/gpu");
  EXPECT_EQ(info->endpoint, "dynmig.sock");
  EXPECT_TRUE(info->options.get_preferred_allocation_available());
  EXPECT_TRUE(info->options.pre_start_required())
      << "PreStartContainer proves whom devices went to";
  EXPECT_TRUE(info->stream_open);
  auto devices = kubelet_->devices();
  ASSERT_EQ(devices.size(), 7u);  // A100 1g.5gb instance count; the A30 is not exposed
  for (uint32_t i = 0; i < 7; ++i) {
    EXPECT_EQ(devices[i].id(), fmt::format("{}::{}", GpuUuid(0), i));
    EXPECT_EQ(devices[i].health(), "Healthy");
    EXPECT_LE(devices[i].id().size(), 63u);
  }
  EXPECT_EQ(plugin_->metrics().Value("dynmig_deviceplugin_registrations_total"), 1);
}

TEST_F(KubeletTest, PublishesTheNodeRegisterAndARecentHandshake) {
  const absl::Time before = absl::Now() - absl::Seconds(1);
  StartPlugin();
  auto node = kube_->GetNode(kNode);
  ASSERT_TRUE(node.ok());
  auto value = kube::Annotation(*node, protocol::kNodeRegisterAnnotation);
  ASSERT_TRUE(value.has_value());
  auto devices = protocol::DecodeNodeRegister(*value);
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 1u);
  const auto& d = (*devices)[0];
  EXPECT_EQ(d.id, GpuUuid(0));
  EXPECT_EQ(d.mode, "mig");
  EXPECT_EQ(d.count, 7u);
  EXPECT_EQ(d.devcore, 100u);
  EXPECT_TRUE(d.health);
  std::vector<std::string> names;
  for (const auto& p : d.mig_profiles) names.push_back(p.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}));
  const auto& cap = (*mig::FindModel("A100-SXM4-40GB"))->capability;
  EXPECT_EQ(d.mig_profiles[0].memory_mib, cap.FindProfile("1g.5gb")->memory_mib);
  EXPECT_EQ(d.mig_profiles[0].placements.size(), 7u);
  auto handshake = kube::Annotation(*node, protocol::kNodeHandshakeAnnotation);
  ASSERT_TRUE(handshake.has_value());
  auto reported = ParseReported(*handshake);
  ASSERT_TRUE(reported.has_value()) << *handshake;
  EXPECT_GE(*reported, before - absl::Seconds(1));
}

TEST_F(KubeletTest, ReRegistersWhenTheKubeletRestarts) {
  StartPlugin([this](DevicePluginOptions& o) { UseFakeClock(o); });
  const std::string socket = plugin_->endpoint().socket_path();
  ASSERT_TRUE(std::filesystem::exists(socket));
  DP_ASSERT_OK(kubelet_->Restart());  // removes every socket, ours included
  // The watcher notices at its next poll, not before.
  EXPECT_FALSE(kubelet_->WaitForRegistrations(2, absl::Milliseconds(100)));
  EXPECT_FALSE(std::filesystem::exists(socket));
  PollKubelet();
  ASSERT_TRUE(kubelet_->WaitForRegistrations(2, absl::Seconds(10)));
  EXPECT_TRUE(plugin_->endpoint().WaitForRegistrations(2, absl::Seconds(10)));
  EXPECT_TRUE(kubelet_->WaitForDevices(
      [](const auto& d) { return d.size() == 7 && d[0].health() == "Healthy"; },
      absl::Seconds(10)));
  EXPECT_TRUE(std::filesystem::exists(socket));
  // Allocation works through the new connection.
  CreatePod("p", {{0, 0, 0, "1g.5gb", 0}});
  auto a = Allocate("p", 0, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(plugin_->metrics().Value("dynmig_deviceplugin_registrations_total"), 2);
}

TEST_F(KubeletTest, RegistersWhenTheKubeletComesUpLater) {
  kubelet_->Stop();
  DevicePluginOptions o = Options();
  UseFakeClock(o);
  plugin_sim_ = OpenSim("");
  auto plugin = DevicePlugin::Start(std::move(o), *plugin_sim_, *plugin_kube_);
  ASSERT_TRUE(plugin.ok()) << plugin.status();
  plugin_ = std::move(*plugin);
  EXPECT_FALSE(plugin_->endpoint().registered());
  auto restarted = kubelet_->Restart();
  ASSERT_TRUE(restarted.ok()) << restarted;
  PollKubelet();
  EXPECT_TRUE(kubelet_->WaitForRegistrations(1, absl::Seconds(10)));
  EXPECT_TRUE(
      kubelet_->WaitForDevices([](const auto& d) { return d.size() == 7; }, absl::Seconds(10)));
}

TEST_F(KubeletTest, StoppingThePluginEndsTheStreamAndRemovesTheSocket) {
  StartPlugin();
  const std::string socket = plugin_->endpoint().socket_path();
  StopPlugin();
  EXPECT_FALSE(std::filesystem::exists(socket));
  EXPECT_TRUE(kubelet_->WaitForDevices(
      [](const auto& d) { return !d.empty() && d[0].health() == "Unhealthy"; }, absl::Seconds(10)));
  EXPECT_FALSE(kubelet_->plugin()->stream_open);
}

TEST_F(KubeletTest, AGpuWithMigDisabledIsAdvertisedUnhealthyAndPublishedSo) {
  // Hopper applies MIG mode at once; use an A100 and a pending change: disable on GPU 0.
  DP_ASSERT_OK(sim_->SetMigMode(0, false));
  DP_ASSERT_OK(sim_->ResetGpu(0));
  plugin_sim_ = OpenSim("");
  auto plugin = DevicePlugin::Start(Options(), *plugin_sim_, *plugin_kube_);
  ASSERT_TRUE(plugin.ok()) << plugin.status();
  plugin_ = std::move(*plugin);
  ASSERT_TRUE(kubelet_->WaitForDevices(
      [](const auto& d) { return d.size() == 7 && d[0].health() == "Unhealthy"; },
      absl::Seconds(10)));
  EXPECT_TRUE(HasEvent(kReasonGpuNotReady, "MIG mode is disabled"));
  auto devices = protocol::DecodeNodeRegister(
      *kube::Annotation(*kube_->GetNode(kNode), protocol::kNodeRegisterAnnotation));
  ASSERT_TRUE(devices.ok());
  ASSERT_EQ(devices->size(), 1u);
  EXPECT_FALSE((*devices)[0].health);

  // Enabled again (and reset): the next refresh turns it healthy and republishes.
  DP_ASSERT_OK(sim_->SetMigMode(0, true));
  DP_ASSERT_OK(sim_->ResetGpu(0));
  ASSERT_TRUE(plugin_->RunCycle());
  EXPECT_TRUE(kubelet_->WaitForDevices(
      [](const auto& d) { return d.size() == 7 && d[0].health() == "Healthy"; },
      absl::Seconds(10)));
  devices = protocol::DecodeNodeRegister(
      *kube::Annotation(*kube_->GetNode(kNode), protocol::kNodeRegisterAnnotation));
  EXPECT_TRUE((*devices)[0].health);
}

}  // namespace
}  // namespace dynmig::deviceplugin::testing
