#include "protocol/node_register.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "mig/allowlist.h"
#include "mig/catalogue.h"

namespace dynmig::protocol {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

const mig::GpuCapability& A100() {
  auto m = mig::FindModel("A100-SXM4-40GB");
  EXPECT_TRUE(m.ok()) << m.status();
  return (*m)->capability;
}

TEST(NodeRegisterTest, MigProfileUsesHamisCompactWireFormat) {
  // HAMi's TestMigProfileUsesCompactWireFormat.
  MigProfileInfo p{"1g.5gb", 4864, 15, 1, {{6, 1}}};
  EXPECT_EQ(EncodeMigProfile(p), R"({"name":"1g.5gb","memoryMB":4864,"core":15,"sliceCount":1,)"
                                 R"("placements":[{"start":6,"size":1}]})");
}

TEST(NodeRegisterTest, DeviceFieldsAreOmittedWhenEmpty) {
  DeviceInfo d;
  d.id = "GPU-a";
  d.type = "NVIDIA A30";
  EXPECT_EQ(EncodeNodeRegister({d}), R"([{"id":"GPU-a","type":"NVIDIA A30"}])");
  EXPECT_EQ(EncodeNodeRegister({}), "[]");
}

TEST(NodeRegisterTest, GoldenDeviceEncoding) {
  DeviceInfo d;
  d.id = "GPU-a";
  d.index = 1;
  d.count = 7;
  d.devmem_mib = 40960;
  d.devcore = 100;
  d.type = "NVIDIA A100-SXM4-40GB";
  d.numa = 1;
  d.mode = "mig";
  d.health = true;
  d.mig_profiles = {{"2g.10gb", 9856, 29, 2, {{0, 2}, {2, 2}, {4, 2}}}};
  EXPECT_EQ(EncodeNodeRegister({d}),
            R"([{"id":"GPU-a","index":1,"count":7,"devmem":40960,"devcore":100,)"
            R"("type":"NVIDIA A100-SXM4-40GB","numa":1,"mode":"mig","health":true,)"
            R"("migProfiles":[{"name":"2g.10gb","memoryMB":9856,"core":29,"sliceCount":2,)"
            R"("placements":[{"start":0,"size":2},{"start":2,"size":2},{"start":4,"size":2}]}]}])");
}

TEST(NodeRegisterTest, RoundTrip) {
  DeviceInfo a;
  a.id = "GPU-a";
  a.count = 4;
  a.devmem_mib = 97887;
  a.devcore = 100;
  a.type = "NVIDIA RTX PRO 6000 Blackwell Server Edition";
  a.mode = "mig";
  a.health = true;
  a.mig_profiles = {{"1g.24gb", 24192, 25, 1, {{0, 3}, {3, 3}, {6, 3}, {9, 3}}},
                    {"4g.96gb", 97408, 100, 4, {{0, 12}}}};
  DeviceInfo b;
  b.id = "GPU-b";
  b.index = 1;
  b.type = "NVIDIA T4";
  b.mode = "hami-core";
  b.numa = -1;
  auto decoded = DecodeNodeRegister(EncodeNodeRegister({a, b}));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_THAT(*decoded, ElementsAre(a, b));
}

TEST(NodeRegisterTest, DecodeToleratesUnknownAndOmittedFields) {
  auto decoded =
      DecodeNodeRegister(R"([{"id":"GPU-a","type":"NVIDIA A30","mode":"mig","customInfo":{"x":1},)"
                         R"("devicepairscore":{},"migProfiles":[{"name":"1g.6gb","future":1}]}])");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_THAT(*decoded, SizeIs(1));
  const DeviceInfo& d = decoded->front();
  EXPECT_EQ(d.index, 0u);
  EXPECT_EQ(d.count, 0u);
  EXPECT_FALSE(d.health);
  ASSERT_THAT(d.mig_profiles, SizeIs(1));
  EXPECT_EQ(d.mig_profiles[0].memory_mib, 0u);
  EXPECT_THAT(d.mig_profiles[0].placements, IsEmpty());
  EXPECT_FALSE(d.legacy_mig_template);
}

TEST(NodeRegisterTest, DecodeErrorsNameDeviceAndField) {
  auto bad_type = DecodeNodeRegister(R"([{"id":"GPU-a"},{"id":"GPU-b","count":"7"}])");
  ASSERT_FALSE(bad_type.ok());
  EXPECT_EQ(bad_type.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_type.status().message()),
              HasSubstr("hami.io/node-nvidia-register[1].count: must be an integer"));

  auto bad_placement = DecodeNodeRegister(
      R"([{"id":"GPU-a","migProfiles":[{"name":"1g.5gb","placements":[{"start":0,"size":1},)"
      R"({"start":31,"size":2}]}]}])");
  ASSERT_FALSE(bad_placement.ok());
  EXPECT_THAT(std::string(bad_placement.status().message()),
              HasSubstr("[0].migProfiles[0].placements[1]: {start 31, size 2} ends beyond"));

  auto no_name = DecodeNodeRegister(R"([{"id":"GPU-a","migProfiles":[{"memoryMB":5}]}])");
  ASSERT_FALSE(no_name.ok());
  EXPECT_THAT(std::string(no_name.status().message()),
              HasSubstr("[0].migProfiles[0].name: is required"));

  auto health = DecodeNodeRegister(R"([{"id":"GPU-a","health":"true"}])");
  ASSERT_FALSE(health.ok());
  EXPECT_THAT(std::string(health.status().message()), HasSubstr("[0].health: must be a boolean"));

  auto not_array = DecodeNodeRegister(R"({"id":"GPU-a"})");
  ASSERT_FALSE(not_array.ok());
  EXPECT_THAT(std::string(not_array.status().message()), HasSubstr("must be a JSON array"));
}

TEST(NodeRegisterTest, EmptyAnnotationIsNoDevice) {
  auto decoded = DecodeNodeRegister("");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_THAT(*decoded, IsEmpty());
}

TEST(NodeRegisterTest, CapabilityToDeviceInfoMatchesHami) {
  const auto& cap = A100();
  mig::AllowlistEntry entry{{"A100-SXM4-40GB"}, {"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"}};
  auto allowed = mig::ApplyAllowlist(cap, entry);
  DeviceInfo d = MigDeviceInfo(DeviceIdentity{"GPU-a", 2, 0, true}, cap, allowed.profiles);
  EXPECT_EQ(d.id, "GPU-a");
  EXPECT_EQ(d.index, 2u);
  EXPECT_EQ(d.mode, "mig");
  EXPECT_EQ(d.devcore, 100u);
  EXPECT_EQ(d.devmem_mib, 40960u);
  EXPECT_EQ(d.count, 7u);  // max instance count (1g.5gb)
  EXPECT_EQ(d.type, "NVIDIA A100-SXM4-40GB");
  ASSERT_THAT(d.mig_profiles, SizeIs(4));
  // HAMi's wire test: 1g.5gb = 4864 MiB, core 15; the architecture doc's 2g.10gb core 29.
  EXPECT_EQ(d.mig_profiles[0].name, "1g.5gb");
  EXPECT_EQ(d.mig_profiles[0].memory_mib, 4864u);
  EXPECT_EQ(d.mig_profiles[0].core, 15u);
  EXPECT_EQ(d.mig_profiles[0].slice_count, 1u);
  EXPECT_THAT(d.mig_profiles[0].placements, SizeIs(7));
  EXPECT_EQ(d.mig_profiles[1].core, 29u);
  EXPECT_EQ(d.mig_profiles[2].core, 43u);  // ceil(42 * 100 / 98)
  EXPECT_EQ(d.mig_profiles[3].core, 100u);
}

TEST(NodeRegisterTest, ProfileCoreFallsBackToSlicesWithoutSmCounts) {
  mig::GpuCapability cap;
  cap.compute_slices = 7;
  mig::ProfileSpec small;
  small.name = "1g.5gb";
  small.compute_slices = 1;
  mig::ProfileSpec full;
  full.name = "7g.40gb";
  full.compute_slices = 7;
  cap.profiles = {small, full};
  EXPECT_EQ(ProfileCore(cap, cap.profiles[0]), 15u);  // ceil(100 / 7)
  EXPECT_EQ(ProfileCore(cap, cap.profiles[1]), 100u);
}

TEST(NodeRegisterTest, DeviceInfoToCapabilityRoundTripsTheCatalogue) {
  const auto& cap = A100();
  mig::AllowlistEntry entry{{"A100"}, {"1g.5gb", "1g.5gb+me", "2g.10gb", "3g.20gb", "7g.40gb"}};
  auto allowed = mig::ApplyAllowlist(cap, entry);
  DeviceInfo d = MigDeviceInfo(DeviceIdentity{"GPU-a"}, cap, allowed.profiles);
  auto decoded = DecodeNodeRegister(EncodeNodeRegister({d}));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  mig::GpuCapability back = ToCapability(decoded->front());
  EXPECT_EQ(back.model, cap.model);
  EXPECT_EQ(back.total_memory_mib, cap.total_memory_mib);
  EXPECT_EQ(back.placement_units, 8u);
  EXPECT_EQ(back.memory_slices, 8u);
  EXPECT_EQ(back.compute_slices, 7u);
  ASSERT_THAT(back.profiles, SizeIs(5));
  for (const auto& p : back.profiles) {
    SCOPED_TRACE(p.name);
    const mig::ProfileSpec* ref = cap.FindProfile(p.name);
    ASSERT_NE(ref, nullptr);
    EXPECT_EQ(p.memory_mib, ref->memory_mib);
    EXPECT_EQ(p.compute_slices, ref->compute_slices);
    EXPECT_EQ(p.memory_slices, ref->memory_slices);
    EXPECT_EQ(p.placements, ref->placements);
    EXPECT_EQ(p.instance_count, ref->instance_count);  // 1g.5gb+me: 1, not its 7 placements
    EXPECT_EQ(p.nvml_id, ref->nvml_id);
  }
}

TEST(NodeRegisterTest, UnknownModelCapabilityComesFromTheWireOnly) {
  DeviceInfo d;
  d.type = "NVIDIA Future GPU";
  d.devmem_mib = 50000;
  d.mig_profiles = {{"1g.6gb", 6000, 25, 1, {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 0}}},
                    {"2g.12gb", 12000, 50, 2, {{0, 2}, {2, 2}}}};
  mig::GpuCapability cap = ToCapability(d);
  EXPECT_EQ(cap.model, "NVIDIA Future GPU");
  EXPECT_EQ(cap.placement_units, 4u);
  EXPECT_EQ(cap.memory_slices, 4u);
  EXPECT_EQ(cap.compute_slices, 2u);
  ASSERT_THAT(cap.profiles, SizeIs(2));
  EXPECT_THAT(cap.profiles[0].placements, SizeIs(4));  // the zero-size row is dropped
  EXPECT_EQ(cap.profiles[0].instance_count, 4u);
  EXPECT_EQ(cap.profiles[1].memory_slices, 2u);
  EXPECT_EQ(cap.profiles[1].instance_count, 2u);
  EXPECT_EQ(cap.profiles[1].nvml_id, 0u);
}

TEST(NodeRegisterTest, DetectsLegacyFormats) {
  EXPECT_THAT(DetectLegacyNodeRegister(""), IsEmpty());
  EXPECT_THAT(DetectLegacyNodeRegister(
                  R"([{"id":"GPU-a","mode":"mig","migProfiles":[{"name":"1g.5gb"}]}])"),
              IsEmpty());
  EXPECT_THAT(DetectLegacyNodeRegister(R"([{"id":"GPU-a","mode":"hami-core"}])"), IsEmpty());

  auto no_profiles = DetectLegacyNodeRegister(R"([{"id":"GPU-a","mode":"mig"}])");
  ASSERT_THAT(no_profiles, SizeIs(1));
  EXPECT_THAT(no_profiles[0],
              HasSubstr("device 0 (GPU-a) is in MIG mode but publishes no migProfiles"));

  auto tmpl = DetectLegacyNodeRegister(
      R"([{"id":"GPU-a","mode":"mig","migtemplate":[[{"name":"1g.5gb","memory":5120}]]}])");
  ASSERT_THAT(tmpl, SizeIs(1));
  EXPECT_THAT(tmpl[0], HasSubstr("legacy \"migtemplate\""));
  // The flag is decode-only: encoding drops the legacy field, the rest round-trips (the input
  // the node_register fuzz target found).
  auto legacy = DecodeNodeRegister(
      R"([{"id":"GPU-a","mode":"mig","health":true,"migtemplate":[{"name":"2g.10gb"}],)"
      R"("migProfiles":[{"name":"2g.10gb","memoryMB":9856,"placements":[{"start":4,"size":2}]}]}])");
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  ASSERT_THAT(*legacy, SizeIs(1));
  EXPECT_TRUE((*legacy)[0].legacy_mig_template);
  const std::string encoded = EncodeNodeRegister(*legacy);
  EXPECT_THAT(encoded, Not(HasSubstr("migtemplate")));
  auto again = DecodeNodeRegister(encoded);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE((*again)[0].legacy_mig_template);
  (*legacy)[0].legacy_mig_template = false;
  EXPECT_EQ(*again, *legacy);

  auto colon = DetectLegacyNodeRegister("GPU-a,10,40960,100,NVIDIA-A100,0,true:");
  ASSERT_THAT(colon, SizeIs(1));
  EXPECT_THAT(colon[0], HasSubstr("legacy colon-separated"));

  DeviceInfo current;
  current.mode = "mig";
  current.mig_profiles = {{"1g.5gb", 4864, 15, 1, {{0, 1}}}};
  EXPECT_FALSE(LegacyFormatReason(current).has_value());
}

}  // namespace
}  // namespace dynmig::protocol
