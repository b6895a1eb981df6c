// hami.io/device-cordon and dynmig.io/device-cordon-reasons (protocol/device_cordon.h): HAMi's
// format, and hostile values refused with the entry named.
#include "protocol/device_cordon.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dynmig::protocol {
namespace {

TEST(DeviceCordonTest, ReadsHamisCommaListTrimmedAndWritesItBack) {
  auto none = ParseDeviceCordon("");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  auto two = ParseDeviceCordon(" GPU-b ,, GPU-a\t,GPU-b");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(*two, (std::set<std::string>{"GPU-a", "GPU-b"}));
  EXPECT_EQ(EncodeDeviceCordon(*two), "GPU-a,GPU-b");
  EXPECT_EQ(*ParseDeviceCordon(EncodeDeviceCordon(*two)), *two);
  EXPECT_EQ(EncodeDeviceCordon({}), "");
}

TEST(DeviceCordonTest, HostileValuesAreRefusedNamingTheEntry) {
  auto spaced = ParseDeviceCordon("GPU-a,GPU b");
  ASSERT_FALSE(spaced.ok());
  EXPECT_EQ(spaced.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spaced.status().message().find("hami.io/device-cordon: entry 1"), std::string::npos)
      << spaced.status();
  EXPECT_FALSE(ParseDeviceCordon(std::string("GPU-\x01")).ok());
  EXPECT_FALSE(ParseDeviceCordon("GPU-\xc3\xa9").ok());
  auto long_entry = ParseDeviceCordon("GPU-" + std::string(200, 'f'));
  ASSERT_FALSE(long_entry.ok());
  EXPECT_NE(long_entry.status().message().find("at most 128"), std::string::npos);
  EXPECT_LT(long_entry.status().message().size(), 200u) << "the entry is shortened in the error";
  auto huge = ParseDeviceCordon(std::string(1 << 20, ','));
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("bytes"), std::string::npos);
  std::string many;
  for (int i = 0; i < 65; ++i) many += "GPU-" + std::to_string(i) + ",";
  auto too_many = ParseDeviceCordon(many);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("more than 64"), std::string::npos);
}

TEST(CordonReasonsTest, RoundTripsAndRefusesHostileValues) {
  std::map<std::string, std::string> reasons = {{"GPU-a", "bad ECC (by alice)"}, {"GPU-b", ""}};
  auto back = ParseCordonReasons(EncodeCordonReasons(reasons));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, reasons);
  for (const std::string& bad : std::vector<std::string>{
           std::string("[]"),
           std::string("{\"GPU-a\":7}"),
           std::string("{\"\":\"x\"}"),
           std::string("{\"GPU a\":\"x\"}"),
           std::string("{\"GPU-a\":\"line\\nbreak\"}"),
           "{\"GPU-a\":\"" + std::string(300, 'r') + "\"}",
           std::string("{\"GPU-a\":{\"deep\":{\"deeper\":1}}}"),
           std::string("not json"),
           std::string(40 * 1024, ' '),
       }) {
    auto r = ParseCordonReasons(bad);
    ASSERT_FALSE(r.ok()) << bad.substr(0, 60);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("dynmig.io/device-cordon-reasons"), std::string::npos)
        << r.status();
  }
  std::string many = "{";
  for (int i = 0; i < 65; ++i)
    many += (i ? "," : "") + std::string("\"GPU-") + std::to_string(i) + "\":\"\"";
  EXPECT_FALSE(ParseCordonReasons(many + "}").ok());
  EXPECT_EQ(CheckCordonReason("fine"), "");
  EXPECT_NE(CheckCordonReason(std::string(257, 'x')), "");
}

}  // namespace
}  // namespace dynmig::protocol
