#include "protocol/gpu_mode_switch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace dynmig::protocol {
namespace {

using ::testing::HasSubstr;

std::string SwitchRequestError(std::string_view value) {
  return std::string(DecodeGpuModeRequests(value).status().message());
}
std::string SwitchStatusError(std::string_view value) {
  return std::string(DecodeGpuModeStatuses(value).status().message());
}

TEST(GpuModeRequestTest, RoundTripsSortedOnePerGpu) {
  std::vector<GpuModeRequest> in = {
      {"GPU-b", GpuMode::kWholeGpu, 200, "scheduler", "2 whole-GPU pods wait"},
      {"GPU-a", GpuMode::kMig, 100, "operator:alice", ""},
      {"GPU-b", GpuMode::kMig, 300, "scheduler", "later"}};
  const std::string text = EncodeGpuModeRequests(in);
  EXPECT_EQ(text, R"([{"at":100,"by":"operator:alice","gpuUUID":"GPU-a","reason":"","to":"mig"},)"
                  R"({"at":300,"by":"scheduler","gpuUUID":"GPU-b","reason":"later","to":"mig"}])");
  auto back = DecodeGpuModeRequests(text);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0], in[1]);
  EXPECT_EQ((*back)[1], in[2]);
  EXPECT_TRUE(DecodeGpuModeRequests("")->empty());
  EXPECT_TRUE(DecodeGpuModeRequests("[]")->empty());
  EXPECT_EQ(EncodeGpuModeRequests({}), "[]");
}

TEST(GpuModeRequestTest, HostileValuesAreRefusedNamingTheField) {
  EXPECT_THAT(SwitchRequestError("{"), HasSubstr("dynmig.io/gpu-mode-request"));
  EXPECT_THAT(SwitchRequestError("{}"), HasSubstr("JSON array"));
  EXPECT_THAT(SwitchRequestError("[1]"), HasSubstr("[0]: must be an object"));
  EXPECT_THAT(SwitchRequestError(R"([{"to":"mig","at":1}])"), HasSubstr("[0].gpuUUID"));
  EXPECT_THAT(SwitchRequestError(R"([{"gpuUUID":"GPU-a","to":"mps","at":1}])"),
              HasSubstr("[0].to"));
  EXPECT_THAT(SwitchRequestError(R"([{"gpuUUID":"GPU-a","to":"mig"}])"),
              HasSubstr("[0].at: missing"));
  EXPECT_THAT(SwitchRequestError(R"([{"gpuUUID":"GPU-a","to":"mig","at":0}])"),
              HasSubstr("[0].at"));
  EXPECT_THAT(SwitchRequestError(R"([{"gpuUUID":"GPU-a","to":"mig","at":1.5}])"),
              HasSubstr("[0].at"));
  EXPECT_THAT(SwitchRequestError(R"([{"gpuUUID":"GPU-a","to":"mig","at":1},)"
                                 R"({"gpuUUID":"GPU-a","to":"hami-core","at":2}])"),
              HasSubstr("[1].gpuUUID: GPU-a appears twice"));
  EXPECT_THAT(SwitchRequestError(R"([{"gpuUUID":"GPU a","to":"mig","at":1}])"),
              HasSubstr("printable ASCII"));
  EXPECT_THAT(SwitchRequestError(R"([{"gpuUUID":"GPU-a","to":"mig","at":1,"reason":"a\nb"}])"),
              HasSubstr("[0].reason: control character 0x0a"));
  EXPECT_THAT(SwitchRequestError(R"([{"gpuUUID":"GPU-a","to":"mig","at":1,"by":")" +
                                 std::string(300, 'x') + "\"}]"),
              HasSubstr("[0].by: 300 characters"));
  EXPECT_THAT(
      SwitchRequestError(R"([{"gpuUUID":")" + std::string(200, 'G') + R"(","to":"mig","at":1}])"),
      HasSubstr("200 characters"));
  std::string many = "[";
  for (int i = 0; i < 65; ++i) {
    many += (i ? "," : "") + std::string(R"({"gpuUUID":"GPU-)") + std::to_string(i) +
            R"(","to":"mig","at":1})";
  }
  many += "]";
  EXPECT_THAT(SwitchRequestError(many), HasSubstr("65 entries (at most 64)"));
  EXPECT_THAT(SwitchRequestError(std::string(70 * 1024, ' ')), HasSubstr("bytes (at most 65536)"));
  // Deep nesting is refused by the shared JSON limits, not recursed into.
  EXPECT_FALSE(DecodeGpuModeRequests(std::string(5000, '[') + std::string(5000, ']')).ok());
}

TEST(GpuModeStatusTest, RoundTripsWithDefaults) {
  std::vector<GpuModeStatus> in = {
      {"GPU-b", GpuMode::kWholeGpu, true, true, 1000, GpuModePhase::kSwitching, 900, ""},
      {"GPU-a", GpuMode::kMig, true, false, 5, GpuModePhase::kRefused, 7, "needs a reboot"}};
  auto back = DecodeGpuModeStatuses(EncodeGpuModeStatuses(in));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0], in[1]);
  EXPECT_EQ((*back)[1], in[0]);
  auto minimal = DecodeGpuModeStatuses(R"([{"gpuUUID":"GPU-c","mode":"hami-core"}])");
  ASSERT_TRUE(minimal.ok()) << minimal.status();
  EXPECT_EQ((*minimal)[0], (GpuModeStatus{"GPU-c", GpuMode::kWholeGpu, false, false, 0,
                                          GpuModePhase::kSteady, 0, ""}));
  // An encoder never writes what its decoder refuses: long reasons are cut, controls replaced.
  GpuModeStatus loud{"GPU-d", GpuMode::kMig,          true, true,
                     1,       GpuModePhase::kRefused, 2,    std::string(400, 'r') + "\n"};
  auto cut = DecodeGpuModeStatuses(EncodeGpuModeStatuses({loud}));
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ((*cut)[0].reason.size(), kMaxModeText);
}

TEST(GpuModeStatusTest, HostileValuesAreRefusedNamingTheField) {
  EXPECT_THAT(SwitchStatusError(R"([{"gpuUUID":"GPU-a"}])"), HasSubstr("[0].mode: missing"));
  EXPECT_THAT(SwitchStatusError(R"([{"gpuUUID":"GPU-a","mode":"mig","phase":"done"}])"),
              HasSubstr("[0].phase"));
  EXPECT_THAT(SwitchStatusError(R"([{"gpuUUID":"GPU-a","mode":"mig","switchable":"yes"}])"),
              HasSubstr("[0].switchable"));
  EXPECT_THAT(SwitchStatusError(R"([{"gpuUUID":"GPU-a","mode":"mig","since":-1}])"),
              HasSubstr("[0].since"));
  EXPECT_THAT(SwitchStatusError(R"([{"gpuUUID":"GPU-a","mode":"mig","answers":1e300}])"),
              HasSubstr("[0].answers"));
  EXPECT_THAT(
      SwitchStatusError(R"([{"gpuUUID":"GPU-a","mode":"mig"},{"gpuUUID":"GPU-a","mode":"mig"}])"),
      HasSubstr("appears twice"));
}

TEST(GpuModeSwitchTest, AGpuIsHeldUntilTheStatusAnswersItsRequest) {
  const GpuModeRequest req{"GPU-a", GpuMode::kWholeGpu, 500, "scheduler", ""};
  EXPECT_TRUE(HeldForSwitch(req, nullptr));
  GpuModeStatus s{"GPU-a", GpuMode::kMig, true, true, 1, GpuModePhase::kSteady, 0, ""};
  EXPECT_TRUE(HeldForSwitch(req, &s));  // not answered yet
  s.phase = GpuModePhase::kSwitching;
  s.answers_ms = 500;
  EXPECT_TRUE(HeldForSwitch(req, &s));  // under way
  s.phase = GpuModePhase::kSteady;
  EXPECT_TRUE(HeldForSwitch(req, &s));  // steady but still in the old mode: not done
  s.mode = GpuMode::kWholeGpu;
  EXPECT_FALSE(HeldForSwitch(req, &s));
  EXPECT_TRUE(StatusAnswers(s, req));
  s.answers_ms = 499;  // an older request's answer does not answer this one
  EXPECT_TRUE(HeldForSwitch(req, &s));
  s = {"GPU-a", GpuMode::kMig, true, false, 1, GpuModePhase::kRefused, 500, "needs a reboot"};
  EXPECT_TRUE(StatusAnswers(s, req));
  s.gpu_uuid = "GPU-b";  // another GPU's status answers nothing of this GPU
  EXPECT_FALSE(StatusAnswers(s, req));
}

}  // namespace
}  // namespace dynmig::protocol
