#include "ops/validate.h"

#include "ops/ops_test_util.h"

namespace dynmig::ops::testing {
namespace {

const std::vector<std::string> kAllowed = {"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"};

class ValidateTest : public OpsTest {
 protected:
  // node-a: one A100 registered with the allowlisted profiles; pod "train" realized on it
  // (1g.5gb at 0, MIG-train GI 7 CI 0), the NVML view agreeing.
  void Healthy(bool with_visible = true) {
    AddDeviceConfig();
    Add(Node("node-a", Register({{"GPU-a0"}}, kAllowed), json::object(), true));
    json train = PlacedPod("train", "node-a", 4000,
                           {{"GPU-a0", "1g.5gb", 0, 1, Runtime{"MIG-train", 7, 0}}});
    if (with_visible) Annotate(train, kVisibleDevicesAnnotation, R"({"workload":"MIG-train"})");
    Add(train);
    nvml_.Set("node-a",
              NvmlDoc("node-a", {{"GPU-a0"}}, {{"GPU-a0", "1g.5gb", 0, 1, 7, 0, "MIG-train"}}));
  }
  json Validate(int code, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"validate", "--node", "node-a", "--nvml-endpoint",
                                     nvml_.Template()};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunJson(args, code);
  }
  FakeNvmlEndpoint nvml_;
};

TEST_F(ValidateTest, HealthyNodeAndPodPassEveryCheck) {
  Healthy();
  const json r = Validate(0);
  for (const char* check :
       {"registered-mode", "mig-profiles", "capability", "allowlist-exposure"}) {
    EXPECT_EQ(Result(r, check, "node-a"), "PASS") << check << "\n" << r.dump(2);
  }
  for (const char* check : {"pod-reservation", "pod-profile", "pod-overlap", "pod-runtime",
                            "pod-visible", "pod-nvml"}) {
    EXPECT_EQ(Result(r, check, "default/train"), "PASS") << check << "\n" << r.dump(2);
  }
  EXPECT_NE(Evidence(r, "capability", "node-a").find("match NVML"), std::string::npos);
  EXPECT_NE(Evidence(r, "pod-nvml", "default/train").find("MIG-train is GI 7 CI 0 in NVML"),
            std::string::npos);
}

TEST_F(ValidateTest, WithoutNvmlTheCatalogueIsTheReference) {
  Healthy(false);
  nvml_.Remove("node-a");  // unreachable (404)
  // The plugin does not serve its view: that alone fails (a registration outlives its plugin).
  const json r = Validate(1);
  EXPECT_EQ(Result(r, "device-plugin", "node-a"), "FAIL");
  EXPECT_NE(Evidence(r, "device-plugin", "node-a").find("HTTP 404"), std::string::npos)
      << Evidence(r, "device-plugin", "node-a");
  EXPECT_EQ(Result(r, "capability", "node-a"), "PASS");
  const std::string ev = Evidence(r, "capability", "node-a");
  EXPECT_NE(ev.find("match the catalogue"), std::string::npos) << ev;
  EXPECT_NE(ev.find("HTTP 404"), std::string::npos) << ev;
  EXPECT_EQ(Result(r, "pod-nvml", "default/train"), "SKIP");
  EXPECT_EQ(Result(r, "pod-visible", "default/train"), "SKIP");
  // No endpoint at all.
  const json none = RunJson({"validate", "--node", "node-a", "--nvml-endpoint", ""}, 0);
  EXPECT_EQ(Result(none, "device-plugin", "node-a"), "WARN");  // no endpoint, no handshake
  EXPECT_NE(Evidence(none, "capability", "node-a").find("no NVML endpoint configured"),
            std::string::npos);
}

TEST_F(ValidateTest, OverlappingReservationsFail) {
  Healthy();
  Add(PlacedPod("other", "node-a", 9000,
                {{"GPU-a0", "2g.10gb", 0, 2, Runtime{"MIG-other", 3, 0}}}));
  const json r = Validate(1);
  EXPECT_EQ(Result(r, "pod-overlap", "default/train"), "FAIL");
  EXPECT_EQ(Result(r, "pod-overlap", "default/other"), "FAIL");
  EXPECT_NE(
      Evidence(r, "pod-overlap", "default/train").find("overlaps 2g.10gb of default/other at 0-1"),
      std::string::npos)
      << Evidence(r, "pod-overlap", "default/train");
}

TEST_F(ValidateTest, MissingRuntimeIdentityFails) {
  Healthy();
  Add(PlacedPod("late", "node-a", 4000, {{"GPU-a0", "1g.5gb", 1, 1}}));  // Running, no identity
  Add(PlacedPod("queued", "node-a", 4000, {{"GPU-a0", "1g.5gb", 2, 1}}, "Pending"));
  const json r = Validate(1);
  EXPECT_EQ(Result(r, "pod-runtime", "default/late"), "FAIL");
  EXPECT_NE(Evidence(r, "pod-runtime", "default/late").find("no MIG UUID, GI ID or CI ID"),
            std::string::npos);
  EXPECT_EQ(Result(r, "pod-runtime", "default/queued"), "SKIP");
}

TEST_F(ValidateTest, PartialRuntimeIdentityFails) {
  Healthy();
  json partial = PlacedPod("partial", "node-a", 4000, {{"GPU-a0", "1g.5gb", 1, 1}});
  Annotate(partial, protocol::kMigAllocationsAnnotation,
           R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a0","profile":"1g.5gb",)"
           R"("placement":{"start":1,"size":1},"migUUID":"MIG-p"}])");
  Add(partial);
  const json r = Validate(1);
  EXPECT_EQ(Result(r, "pod-reservation", "default/partial"), "PASS");
  EXPECT_EQ(Result(r, "pod-runtime", "default/partial"), "FAIL");
  EXPECT_NE(Evidence(r, "pod-runtime", "default/partial").find("partial runtime identity"),
            std::string::npos);
}

TEST_F(ValidateTest, MismatchedVisibleUuidFails) {
  Healthy(false);
  json p = PlacedPod("wrong", "node-a", 4000, {{"GPU-a0", "1g.5gb", 1, 1, Runtime{"MIG-w", 8, 0}}});
  Annotate(p, kVisibleDevicesAnnotation, R"({"workload":"nvidia.com/gpu=MIG-train"})");
  Add(p);
  nvml_.Set("node-a", NvmlDoc("node-a", {{"GPU-a0"}},
                              {{"GPU-a0", "1g.5gb", 0, 1, 7, 0, "MIG-train"},
                               {"GPU-a0", "1g.5gb", 1, 1, 8, 0, "MIG-w"}}));
  const json r = Validate(1);
  EXPECT_EQ(Result(r, "pod-visible", "default/wrong"), "FAIL");
  EXPECT_NE(Evidence(r, "pod-visible", "default/wrong")
                .find("container \"workload\" sees MIG-train, the annotation says MIG-w"),
            std::string::npos)
      << Evidence(r, "pod-visible", "default/wrong");
  EXPECT_EQ(Result(r, "pod-nvml", "default/wrong"), "PASS");
}

TEST_F(ValidateTest, AnnotationThatDisagreesWithNvmlFails) {
  Healthy();
  nvml_.Set("node-a",
            NvmlDoc("node-a", {{"GPU-a0"}}, {{"GPU-a0", "1g.5gb", 6, 1, 9, 0, "MIG-train"}}));
  const json r = Validate(1);
  EXPECT_EQ(Result(r, "pod-nvml", "default/train"), "FAIL");
  const std::string ev = Evidence(r, "pod-nvml", "default/train");
  EXPECT_NE(ev.find("NVML has MIG-train GI 9, placement 6"), std::string::npos) << ev;
  nvml_.Set("node-a", NvmlDoc("node-a", {{"GPU-a0"}}));
  const json gone = Validate(1);
  EXPECT_NE(Evidence(gone, "pod-nvml", "default/train").find("NVML has no instance MIG-train"),
            std::string::npos);
}

TEST_F(ValidateTest, ProfileThatDoesNotCoverTheRequestFails) {
  Healthy();
  Add(PlacedPod("big", "node-a", 9000, {{"GPU-a0", "1g.5gb", 1, 1, Runtime{"MIG-b", 8, 0}}}));
  nvml_.Set("node-a", NvmlDoc("node-a", {{"GPU-a0"}},
                              {{"GPU-a0", "1g.5gb", 0, 1, 7, 0, "MIG-train"},
                               {"GPU-a0", "1g.5gb", 1, 1, 8, 0, "MIG-b"}}));
  const json r = Validate(1);
  EXPECT_EQ(Result(r, "pod-profile", "default/big"), "FAIL");
  EXPECT_NE(Evidence(r, "pod-profile", "default/big")
                .find("1g.5gb covers 5120 MiB, container \"workload\" asks for 9000 MiB"),
            std::string::npos)
      << Evidence(r, "pod-profile", "default/big");
}

TEST_F(ValidateTest, MigPodWithoutReservationFails) {
  Healthy();
  Add(Pod("rogue", "node-a", 4000));
  const json r = Validate(1);
  EXPECT_EQ(Result(r, "pod-reservation", "default/rogue"), "FAIL");
  EXPECT_NE(Evidence(r, "pod-reservation", "default/rogue").find("the scheduler did not reserve"),
            std::string::npos);
}

TEST_F(ValidateTest, NonMigModeAndLegacyTemplatesFail) {
  AddDeviceConfig();
  Add(Node(
      "node-a",
      R"([{"id":"GPU-a","index":0,"type":"NVIDIA A100-SXM4-40GB","mode":"hami-core","health":true},)"
      R"({"id":"GPU-b","index":1,"type":"NVIDIA A100-SXM4-40GB","mode":"mig","health":true,)"
      R"("migtemplate":[{"name":"1g.5gb"}]},)"
      R"({"id":"GPU-c","index":2,"type":"NVIDIA A100-SXM4-40GB","mode":"mig","health":true}])"));
  const json r = Validate(1);
  EXPECT_EQ(Result(r, "registered-mode", "node-a"), "FAIL");
  const std::string ev = Evidence(r, "registered-mode", "node-a");
  EXPECT_NE(ev.find("GPU 0 (GPU-a): mode \"hami-core\""), std::string::npos) << ev;
  EXPECT_NE(ev.find("GPU 1 (GPU-b): legacy migtemplate"), std::string::npos) << ev;
  EXPECT_EQ(Result(r, "mig-profiles", "node-a"), "FAIL");
  EXPECT_NE(Evidence(r, "mig-profiles", "node-a").find("GPU 2 (GPU-c): migProfiles is empty"),
            std::string::npos);
}

TEST_F(ValidateTest, CapabilityThatDiffersFromNvmlFails) {
  AddDeviceConfig();
  auto devices = protocol::DecodeNodeRegister(Register({{"GPU-a0"}}, kAllowed));
  ASSERT_TRUE(devices.ok());
  (*devices)[0].mig_profiles[0].memory_mib = 5000;      // 1g.5gb
  (*devices)[0].mig_profiles[1].placements.pop_back();  // 2g.10gb loses start 4
  Add(Node("node-a", protocol::EncodeNodeRegister(*devices)));
  nvml_.Set("node-a", NvmlDoc("node-a", {{"GPU-a0"}}));
  const json r = Validate(1);
  EXPECT_EQ(Result(r, "capability", "node-a"), "FAIL");
  const std::string ev = Evidence(r, "capability", "node-a");
  EXPECT_NE(ev.find("1g.5gb: memory 5000 MiB registered, 4864 MiB in NVML"), std::string::npos)
      << ev;
  EXPECT_NE(ev.find("2g.10gb: placements starts [0,2] registered, starts [0,2,4] in NVML"),
            std::string::npos)
      << ev;
  // Against the catalogue, the same differences.
  const json cat = RunJson({"validate", "--node", "node-a", "--nvml-endpoint", ""}, 1);
  EXPECT_NE(Evidence(cat, "capability", "node-a").find("4864 MiB in the catalogue"),
            std::string::npos);
}

TEST_F(ValidateTest, NonAllowlistedModelExposedFails) {
  AddDeviceConfig(R"(nvidia:
  migProfileAllowlist:
    - models: ["A100-SXM4-40GB"]
      profiles: ["1g.5gb", "3g.20gb"]
)");
  Add(Node("node-a",
           Register({{"GPU-a0"}, {"GPU-h0", "H100 80GB HBM3"}}, {"1g.5gb", "3g.20gb", "1g.10gb"})));
  const json r = Validate(1);
  EXPECT_EQ(Result(r, "allowlist-exposure", "node-a"), "FAIL");
  const std::string ev = Evidence(r, "allowlist-exposure", "node-a");
  EXPECT_NE(ev.find("NVIDIA H100 80GB HBM3 is exposed in MIG mode but no migProfileAllowlist "
                    "entry matches it"),
            std::string::npos)
      << ev;
  EXPECT_NE(ev.find("allowlist from ConfigMap kube-system/hami-scheduler-device"),
            std::string::npos);
}

TEST_F(ValidateTest, NoRegisteredNodeFails) {
  AddDeviceConfig();
  const json r = RunJson({"validate", "--nvml-endpoint", ""}, 1);
  EXPECT_EQ(Result(r, "registered-mode"), "FAIL");
  auto unknown = Run({"validate", "--node", "nope"});
  EXPECT_EQ(unknown.code, 2);
  auto bad_timeout = Run({"validate", "--timeout", "soon"});
  EXPECT_EQ(bad_timeout.code, 2);
  EXPECT_NE(bad_timeout.err.find("--timeout: \"soon\" is not a positive duration"),
            std::string::npos);
}

TEST(VisibleDevicesTest, Parses) {
  auto v = ParseVisibleDevices(R"({"a":"MIG-1, nvidia.com/gpu=MIG-2","b":""})");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->at("a"), (std::vector<std::string>{"MIG-1", "MIG-2"}));
  EXPECT_TRUE(v->at("b").empty());
  EXPECT_EQ(ParseVisibleDevices("[1]").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseVisibleDevices(R"({"a":1})").status().message(),
            "dynmig.io/visible-devices: container \"a\": must be a string");
}

}  // namespace
}  // namespace dynmig::ops::testing
