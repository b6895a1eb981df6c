// The mode switcher (scheduler/mode_switcher.h) against the in-memory API server: requests written
// after two rounds of demand, removed when answered, withdrawn when unanswered, refusals, the
// hysteresis, the default configuration, a follower, hostile annotations; and the cluster state
// holding a GPU with an unanswered request.
#include "scheduler/mode_switcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "mig/catalogue.h"
#include "protocol/gpu_mode.h"
#include "protocol/gpu_mode_switch.h"
#include "scheduler/scheduler_test_util.h"

namespace dynmig::scheduler::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

class ModeSwitcherTest : public SchedulerTest {
 protected:
  SchedulerServerOptions SwitchOptions(bool enabled = true) {
    SchedulerServerOptions o = DefaultOptions();
    o.mode_switch.interval = absl::ZeroDuration();  // passes by hand
    o.mode_switch.config.enabled = enabled;
    o.mode_switch.config.min_mode_duration = absl::Minutes(10);
    return o;
  }
  int64_t NowMs() { return absl::ToUnixMillis(clock_.Now()); }

  protocol::GpuModeStatus Status(const std::string& uuid, protocol::GpuMode mode,
                                 int64_t since_ms) {
    protocol::GpuModeStatus s;
    s.gpu_uuid = uuid;
    s.mode = mode;
    s.mig_capable = true;
    s.switchable = true;
    s.since_ms = since_ms;
    return s;
  }
  void SetNodeAnnotation(std::string_view key, std::optional<std::string> value) {
    kube::KeyPatch patch;
    patch[std::string(key)] = std::move(value);
    auto r = client_->PatchNodeAnnotations("node-a", patch);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  void SetStatuses(std::vector<protocol::GpuModeStatus> statuses) {
    SetNodeAnnotation(protocol::kGpuModeStatusAnnotation,
                      protocol::EncodeGpuModeStatuses(std::move(statuses)));
  }
  std::optional<std::string> NodeAnnotation(std::string_view key) {
    auto node = client_->GetNode("node-a");
    EXPECT_TRUE(node.ok()) << node.status();
    return node.ok() ? kube::Annotation(*node, key) : std::nullopt;
  }
  std::vector<protocol::GpuModeRequest> Requests() {
    auto value = NodeAnnotation(protocol::kGpuModeRequestAnnotation);
    if (!value) return {};
    auto decoded = protocol::DecodeGpuModeRequests(*value);
    EXPECT_TRUE(decoded.ok()) << decoded.status();
    return decoded.ok() ? *decoded : std::vector<protocol::GpuModeRequest>{};
  }
  // node-a with two A100s in MIG mode for an hour, both switchable; a scheduler.
  SchedulerServer* TwoMigGpus(SchedulerServerOptions o) {
    CreateNode(MigNode("node-a", {"GPU-0", "GPU-1"}));
    SchedulerServer* s = StartScheduler(std::move(o));
    WaitForNodes(s, {"node-a"});
    const int64_t hour_ago = NowMs() - 3600 * 1000;
    SetStatuses({Status("GPU-0", protocol::GpuMode::kMig, hour_ago),
                 Status("GPU-1", protocol::GpuMode::kMig, hour_ago)});
    return s;
  }
  kube::Object WholeGpuPod(const std::string& name) {
    return MigPod(name, 0, {{"nvidia.com/vgpu-mode", "hami-core"}});
  }
  // A MIG pod already bound to node-a with its instance recorded: it keeps `gpu` busy.
  kube::Object PlacedMigPod(const std::string& name, int64_t mem, const std::string& gpu,
                            const std::string& profile, uint32_t start, uint32_t size) {
    kube::Object pod = MigPod(name, mem);
    pod["metadata"]["annotations"][std::string(protocol::kMigAllocationsAnnotation)] =
        Alloc(gpu, profile, start, size);
    pod["metadata"]["annotations"][std::string(protocol::kVgpuNodeAnnotation)] = "node-a";
    pod["spec"]["nodeName"] = "node-a";
    return pod;
  }
  ModeSwitcher::Outcome Pass(SchedulerServer* s) {
    auto out = s->RunModeSwitchPass();
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? std::move(*out) : ModeSwitcher::Outcome{};
  }
  std::string VerdictCode(SchedulerServer* s, const std::string& uuid) {
    for (const auto& v : s->mode_switcher().Verdicts()) {
      if (v.gpu_uuid == uuid) return v.code;
    }
    return "";
  }
  // node-a publishing GPU-0 whole and GPU-1 (an A100) in MIG mode, both for an hour, GPU-1 full
  // with the 7g pod "full"; a scheduler that has seen it.
  SchedulerServer* WholeGpuAndFullMigGpu() {
    const auto& cap = (*mig::FindModel("A100-SXM4-40GB"))->capability;
    std::vector<const mig::ProfileSpec*> base;
    for (const auto& p : cap.profiles) {
      if (p.name.find_first_of("+-") == std::string::npos) base.push_back(&p);
    }
    kube::Object node = MigNode("node-a", {});
    node["metadata"]["annotations"][std::string(protocol::kNodeRegisterAnnotation)] =
        protocol::EncodeNodeRegister(
            {protocol::WholeGpuDeviceInfo({"GPU-0", 0, 0, true}, "NVIDIA A100-SXM4-40GB", 40960),
             protocol::MigDeviceInfo({"GPU-1", 1, 0, true}, cap, base)});
    CreateNode(node);
    SchedulerServer* s = StartScheduler(SwitchOptions());
    WaitForNodes(s, {"node-a"});
    const int64_t hour_ago = NowMs() - 3600 * 1000;
    SetStatuses({Status("GPU-0", protocol::GpuMode::kWholeGpu, hour_ago),
                 Status("GPU-1", protocol::GpuMode::kMig, hour_ago)});
    CreatePod(PlacedMigPod("full", 39000, "GPU-1", "7g.40gb", 0, 8));
    WaitForReservationSeen(s, "default/full");
    return s;
  }
  // Two passes; the request the second wrote.
  protocol::GpuModeRequest RequestAfterTwoPasses(SchedulerServer* s) {
    EXPECT_THAT(Pass(s).requested, IsEmpty());
    EXPECT_THAT(Pass(s).requested, SizeIs(1));
    auto requests = Requests();
    EXPECT_THAT(requests, SizeIs(1));
    return requests.empty() ? protocol::GpuModeRequest{} : requests[0];
  }
};

TEST_F(ModeSwitcherTest, AWholeGpuPodSwitchesAnIdleMigGpuAfterTwoRounds) {
  SchedulerServer* s = TwoMigGpus(SwitchOptions());
  CreatePod(WholeGpuPod("train"));
  auto first = Pass(s);
  EXPECT_THAT(first.requested, IsEmpty()) << "one round of demand switched a GPU";
  EXPECT_EQ(VerdictCode(s, "GPU-0"), "demand-unconfirmed");
  EXPECT_FALSE(NodeAnnotation(protocol::kGpuModeRequestAnnotation).has_value());
  auto second = Pass(s);
  ASSERT_THAT(second.requested, ElementsAre("node-a: GPU-0 to hami-core")) << second.errors.size();
  auto requests = Requests();
  ASSERT_THAT(requests, SizeIs(1));
  EXPECT_EQ(requests[0].gpu_uuid, "GPU-0");
  EXPECT_EQ(requests[0].to, protocol::GpuMode::kWholeGpu);
  EXPECT_EQ(requests[0].at_ms, NowMs());
  EXPECT_EQ(requests[0].by, "scheduler");
  EXPECT_THAT(requests[0].reason, HasSubstr("default/train"));
  // Written under the node lock, released after.
  EXPECT_FALSE(NodeAnnotation(protocol::kNodeLockAnnotation).has_value());
  EXPECT_THAT(EventMessages("train", "GpuModeSwitch"),
              ElementsAre(HasSubstr("GPU 0 (GPU-0) of node-a switches to whole-GPU")));
  // The scheduler places nothing on the GPU while it is held.
  EXPECT_TRUE(kube::testing::Eventually([&] {
    auto v = s->state().View("node-a", clock_.Now());
    return v && !v->gpus[0].healthy &&
           v->gpus[0].unhealthy_reason == "GPU GPU-0 is switching to hami-core";
  }));
  auto v = s->state().View("node-a", clock_.Now());
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->gpus[1].healthy);
  // A third pass asks nothing more: the switch under way serves the pod.
  EXPECT_THAT(Pass(s).requested, IsEmpty());
  EXPECT_EQ(VerdictCode(s, "GPU-0"), "switching");
  EXPECT_THAT(
      s->MetricsText(),
      HasSubstr(R"(dynmig_scheduler_mode_switch_requests_total{node="node-a",to="hami-core"} 1)"));
}

TEST_F(ModeSwitcherTest, AnAnsweredRequestIsRemovedAndItsTimeCounted) {
  SchedulerServer* s = TwoMigGpus(SwitchOptions());
  CreatePod(WholeGpuPod("train"));
  protocol::GpuModeRequest r = RequestAfterTwoPasses(s);
  clock_.Advance(absl::Seconds(3));
  protocol::GpuModeStatus done = Status("GPU-0", protocol::GpuMode::kWholeGpu, r.at_ms + 2000);
  done.answers_ms = r.at_ms;
  SetStatuses({done, Status("GPU-1", protocol::GpuMode::kMig, 0)});
  auto out = Pass(s);
  EXPECT_THAT(out.removed, ElementsAre("node-a: GPU-0 (now hami-core)"));
  EXPECT_FALSE(NodeAnnotation(protocol::kGpuModeRequestAnnotation).has_value());
  EXPECT_THAT(s->MetricsText(),
              HasSubstr(R"(dynmig_scheduler_mode_switch_seconds_total{node="node-a"} 2)"));
  EXPECT_TRUE(kube::testing::Eventually([&] {
    for (const auto& n : s->state().Report(clock_.Now())) {
      for (const auto& g : n.gpus) {
        if (g.uuid == "GPU-0") return g.mode_request == nullptr && g.mode_status != nullptr;
      }
    }
    return false;
  }));
}

TEST_F(ModeSwitcherTest, ARefusedGpuIsNotAskedAgainWhileNotSwitchable) {
  SchedulerServer* s = TwoMigGpus(SwitchOptions());
  CreatePod(WholeGpuPod("train"));
  protocol::GpuModeRequest r = RequestAfterTwoPasses(s);
  // GPU-1 is busy, so only GPU-0 could serve; the plugin refuses: a reboot is needed.
  CreatePod(PlacedMigPod("busy", 4000, "GPU-1", "1g.5gb", 0, 1));
  protocol::GpuModeStatus refused = Status("GPU-0", protocol::GpuMode::kMig, 0);
  refused.phase = protocol::GpuModePhase::kRefused;
  refused.answers_ms = r.at_ms;
  refused.switchable = false;
  refused.reason = "needs a reboot (RESET_REQUIRED)";
  SetStatuses({refused, Status("GPU-1", protocol::GpuMode::kMig, 0)});
  auto out = Pass(s);
  EXPECT_THAT(out.refused, ElementsAre("node-a: GPU-0: needs a reboot (RESET_REQUIRED)"));
  EXPECT_FALSE(NodeAnnotation(protocol::kGpuModeRequestAnnotation).has_value());
  EXPECT_THAT(EventMessages("train", "GpuModeSwitchRefused"),
              ElementsAre(HasSubstr("needs a reboot")));
  EXPECT_THAT(
      s->MetricsText(),
      HasSubstr(
          R"(dynmig_scheduler_mode_switch_refusals_total{node="node-a",reason="needs-reboot"} 1)"));
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(absl::Hours(1));
    EXPECT_THAT(Pass(s).requested, IsEmpty());
  }
  EXPECT_EQ(VerdictCode(s, "GPU-0"), "not-switchable");
  EXPECT_EQ(VerdictCode(s, "GPU-1"), "in-use");
}

TEST_F(ModeSwitcherTest, HysteresisHoldsAGpuThatSwitchedRecently) {
  SchedulerServer* s = TwoMigGpus(SwitchOptions());
  const int64_t minute_ago = NowMs() - 60 * 1000;
  SetStatuses({Status("GPU-0", protocol::GpuMode::kMig, minute_ago),
               Status("GPU-1", protocol::GpuMode::kMig, minute_ago)});
  CreatePod(WholeGpuPod("train"));
  EXPECT_THAT(Pass(s).requested, IsEmpty());
  EXPECT_THAT(Pass(s).requested, IsEmpty());
  EXPECT_EQ(VerdictCode(s, "GPU-0"), "hysteresis");
  clock_.Advance(absl::Minutes(8));  // 9 minutes in its mode
  EXPECT_THAT(Pass(s).requested, IsEmpty());
  clock_.Advance(absl::Minutes(1));
  EXPECT_THAT(Pass(s).requested, SizeIs(1));
}

TEST_F(ModeSwitcherTest, TheDefaultConfigurationWritesNothing) {
  SchedulerServer* s = TwoMigGpus(SwitchOptions(/*enabled=*/false));
  CreatePod(WholeGpuPod("train"));
  // Even a stale request of someone else's is left alone.
  SetNodeAnnotation(protocol::kGpuModeRequestAnnotation, "not json");
  for (int i = 0; i < 3; ++i) {
    auto out = Pass(s);
    EXPECT_THAT(out.requested, IsEmpty());
    EXPECT_THAT(out.removed, IsEmpty());
    clock_.Advance(absl::Hours(1));
  }
  EXPECT_EQ(NodeAnnotation(protocol::kGpuModeRequestAnnotation), "not json");
  EXPECT_THAT(EventMessages("train", "GpuModeSwitch"), IsEmpty());
}

TEST_F(ModeSwitcherTest, AFollowerWritesNothing) {
  SchedulerServerOptions o = SwitchOptions();
  o.leader_elect = true;
  o.run_election_loop = false;  // never elected
  o.election.lease_namespace = "dynmig-system";
  o.election.identity = "sched-x_1234abcd";
  SchedulerServer* s = TwoMigGpus(o);
  CreatePod(WholeGpuPod("train"));
  for (int i = 0; i < 2; ++i) {
    auto out = s->RunModeSwitchPass();
    EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
  }
  EXPECT_FALSE(NodeAnnotation(protocol::kGpuModeRequestAnnotation).has_value());
}

TEST_F(ModeSwitcherTest, AnUnansweredRequestIsWithdrawnAfterTheTimeout) {
  SchedulerServer* s = TwoMigGpus(SwitchOptions());
  CreatePod(WholeGpuPod("train"));
  RequestAfterTwoPasses(s);
  clock_.Advance(absl::Minutes(4));
  EXPECT_THAT(Pass(s).withdrawn, IsEmpty());
  EXPECT_THAT(Requests(), SizeIs(1));
  clock_.Advance(absl::Minutes(2));
  auto out = Pass(s);
  EXPECT_THAT(out.withdrawn, SizeIs(1));
  EXPECT_THAT(out.requested, IsEmpty()) << "the timed-out GPU was asked again at once";
  EXPECT_THAT(EventMessages("train", "GpuModeSwitchTimedOut"), SizeIs(1));
  EXPECT_THAT(
      s->MetricsText(),
      HasSubstr(
          R"(dynmig_scheduler_mode_switch_refusals_total{node="node-a",reason="timeout"} 1)"));
}

TEST_F(ModeSwitcherTest, HostileAnnotationsWriteNoRequest) {
  SchedulerServer* s = TwoMigGpus(SwitchOptions());
  CreatePod(WholeGpuPod("train"));
  // An unreadable status: no GPU to plan on, the error named.
  SetNodeAnnotation(protocol::kGpuModeStatusAnnotation, R"([{"gpuUUID":"GPU-0","mode":"off"}])");
  for (int i = 0; i < 2; ++i) {
    auto out = Pass(s);
    EXPECT_THAT(out.requested, IsEmpty());
    ASSERT_THAT(out.errors, SizeIs(1));
    EXPECT_THAT(out.errors[0], HasSubstr("dynmig.io/gpu-mode[0]"));
  }
  // A status for GPUs the plugin does not publish, and one whose since is far ahead.
  SetStatuses({Status("GPU-9", protocol::GpuMode::kMig, 0),
               Status("GPU-0", protocol::GpuMode::kMig, NowMs() + 86400000),
               Status("GPU-1", protocol::GpuMode::kMig, NowMs() + 86400000)});
  for (int i = 0; i < 2; ++i) EXPECT_THAT(Pass(s).requested, IsEmpty());
  EXPECT_EQ(VerdictCode(s, "GPU-9"), "in-use");
  EXPECT_EQ(VerdictCode(s, "GPU-0"), "hysteresis");
  // 64 statuses (the most the codec takes): bounded, nothing switches.
  std::vector<protocol::GpuModeStatus> many;
  for (int i = 0; i < 64; ++i) {
    many.push_back(Status(fmt::format("GPU-x{:02}", i), protocol::GpuMode::kWholeGpu, 0));
  }
  SetStatuses(many);
  for (int i = 0; i < 2; ++i) EXPECT_THAT(Pass(s).requested, IsEmpty());
}

TEST_F(ModeSwitcherTest, AnUnreadableRequestHoldsEveryGpuAndIsRemoved) {
  SchedulerServer* s = TwoMigGpus(SwitchOptions());
  SetNodeAnnotation(protocol::kGpuModeRequestAnnotation, "[{\"gpuUUID\":1}]");
  EXPECT_TRUE(kube::testing::Eventually([&] {
    auto v = s->state().View("node-a", clock_.Now());
    return v && !v->gpus[0].healthy && !v->gpus[1].healthy &&
           v->gpus[1].unhealthy_reason.find("unreadable") != std::string::npos;
  }));
  auto out = Pass(s);
  EXPECT_THAT(out.removed, ElementsAre(HasSubstr("unreadable dynmig.io/gpu-mode-request")));
  EXPECT_FALSE(NodeAnnotation(protocol::kGpuModeRequestAnnotation).has_value());
  EXPECT_TRUE(kube::testing::Eventually([&] {
    auto v = s->state().View("node-a", clock_.Now());
    return v && v->gpus[0].healthy && v->gpus[1].healthy;
  }));
}

TEST_F(ModeSwitcherTest, MigPodsThatFitNoMigGpuSwitchAnIdleWholeGpu) {
  // GPU-0 whole, GPU-1 in MIG mode and full with a 7g pod; a 1g pod waits.
  SchedulerServer* s = WholeGpuAndFullMigGpu();
  CreatePod(MigPod("small", 4000));
  EXPECT_THAT(Pass(s).requested, IsEmpty());
  EXPECT_EQ(VerdictCode(s, "GPU-0"), "demand-unconfirmed");
  EXPECT_EQ(VerdictCode(s, "GPU-1"), "in-use");
  EXPECT_THAT(Pass(s).requested, ElementsAre("node-a: GPU-0 to mig"));
  EXPECT_THAT(EventMessages("small", "GpuModeSwitch"),
              ElementsAre(HasSubstr("GPU 0 (GPU-0) of node-a switches to MIG mode")));
  // A whole-GPU pod now waits too: GPU-0 is switching, GPU-1 in use: nothing more to ask.
  CreatePod(WholeGpuPod("train"));
  Pass(s);
  EXPECT_THAT(Pass(s).requested, IsEmpty());
  EXPECT_THAT(Requests(), SizeIs(1));
}

TEST_F(ModeSwitcherTest, AWholeGpuReservedForAPodIsInUseAndNeverSwitched) {
  // A whole-GPU pod's reservation on GPU-0 is only assumed (the filter's, not on the pod yet) when
  // MIG demand comes.
  SchedulerServer* s = WholeGpuAndFullMigGpu();
  auto whole = protocol::ParseWholeGpuRequest(WholeGpuPod("train"));
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto reserved = s->state().PlanAndReserveWhole("default/train", *whole, {"node-a"}, clock_.Now());
  ASSERT_TRUE(reserved.ok() && reserved->reservation.has_value());
  CreatePod(MigPod("small", 4000));
  Pass(s);
  EXPECT_THAT(Pass(s).requested, IsEmpty());
  EXPECT_EQ(VerdictCode(s, "GPU-0"), "in-use");
  EXPECT_FALSE(NodeAnnotation(protocol::kGpuModeRequestAnnotation).has_value());
}

TEST(RefusalCodeTest, NamesTheKindOfRefusal) {
  EXPECT_EQ(RefusalCode("needs a reboot (RESET_REQUIRED)"), "needs-reboot");
  EXPECT_EQ(RefusalCode("needs a GPU reset the node cannot do"), "needs-reset");
  EXPECT_EQ(RefusalCode("IN_USE: a process runs"), "refused");
  EXPECT_EQ(RefusalCode(std::string(100000, 'x') + "reboot"), "refused");  // bounded
}

}  // namespace
}  // namespace dynmig::scheduler::testing
