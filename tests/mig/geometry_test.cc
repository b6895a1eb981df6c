// Fixed geometries (mig/geometry.h): their text, HAMi's legacy templates, the driver's placement
// order and mig-parted's layout, on plain values.
#include "mig/geometry.h"

#include <gtest/gtest.h>

#include "mig/test_util.h"

namespace dynmig::mig {
namespace {

TEST(GeometryParse, AllAndCounts) {
  auto all_or = ParseGeometry("all-1g.18gb");
  ASSERT_TRUE(all_or.ok()) << all_or.status();
  const GeometrySpec all = *all_or;
  EXPECT_EQ(all.all_of, "1g.18gb");
  EXPECT_TRUE(all.counts.empty());
  EXPECT_EQ(all.ToString(), "all-1g.18gb");
  auto mixed_or = ParseGeometry("1g.18gb=1,2g.35gb=3");
  ASSERT_TRUE(mixed_or.ok()) << mixed_or.status();
  const GeometrySpec mixed = *mixed_or;
  ASSERT_EQ(mixed.counts.size(), 2u);
  EXPECT_EQ(mixed.counts[1], (std::pair<std::string, uint32_t>{"2g.35gb", 3}));
  EXPECT_EQ(mixed.ToString(), "1g.18gb=1,2g.35gb=3");
}

TEST(GeometryParse, HostileTextIsRefusedWithTheReason) {
  struct Case {
    std::string text;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {"", "empty"},
           {std::string(600, 'x'), "at most 512"},
           {"1g.18gb=1,", "is not <profile>=<count>"},
           {",1g.18gb=1", "is not <profile>=<count>"},
           {"1g.18gb", "is not <profile>=<count>"},
           {"1g.18gb=0", "count 0 is not 1..8"},
           {"1g.18gb=9", "count 9 is not 1..8"},
           {"1g.18gb=-1", "is not a number"},
           {"1g.18gb=4294967297", "is not a number"},
           {"1g.18gb=1x", "is not a number"},
           {"1g.18gb=1,1g.18gb=2", "named twice"},
           {"1g.18gb=5,2g.35gb=4", "9 instances"},
           {"bogus=1", "is not a profile name"},
           {"all-", "is not a profile name"},
           {"all-../../etc", "is not a profile name"},
       }) {
    auto spec = ParseGeometry(c.text);
    ASSERT_FALSE(spec.ok()) << c.text;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(spec.status().message().find(c.says), std::string_view::npos)
        << c.text.substr(0, 40) << ": " << spec.status();
  }
}

TEST(GeometryLegacy, HamiTemplatesBecomeCounts) {
  std::vector<LegacyGeometryEntry> entries = {
      {{"A30"}, {{{"1g.6gb", 25, 6144, 4}}}},
      {{"A100-SXM4-40GB", "A100-PCIE-40GB"},
       {{{"1g.5gb", 14, 5120, 7}},
        {{"1g.5gb", 14, 5120, 1}, {"2g.10gb", 28, 10240, 3}},
        {{"3g.20gb", 42, 20480, 2}}}}};
  auto spec_or = SelectLegacyGeometry(entries, "NVIDIA A100-SXM4-40GB", 1);
  ASSERT_TRUE(spec_or.ok()) << spec_or.status();
  const GeometrySpec spec = *spec_or;
  EXPECT_EQ(spec.ToString(), "1g.5gb=1,2g.10gb=3");
  auto missing = SelectLegacyGeometry(entries, "NVIDIA H100 80GB HBM3", 0);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("H100 80GB HBM3"), std::string_view::npos);
  auto beyond = SelectLegacyGeometry(entries, "NVIDIA A100-SXM4-40GB", 3);
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kInvalidArgument);
  // A template with count 0 or a bad name is refused, naming it.
  auto zero = GeometryFromLegacy({{"1g.5gb", 14, 5120, 0}});
  EXPECT_NE(zero.status().message().find("legacy template 0 (1g.5gb)"), std::string_view::npos)
      << zero.status();
  EXPECT_FALSE(GeometryFromLegacy({}).ok());
  EXPECT_FALSE(GeometryFromLegacy({{"7g.40gb\n", 100, 40960, 1}}).ok());
}

TEST(GeometryDriverOrder, UpperHalfFirstElsewhere) {
  ProfileSpec two;
  two.placements = {{0, 2}, {2, 2}, {4, 2}};
  std::vector<uint32_t> starts;
  for (const auto& p : DriverPlacementOrder(two, 8)) starts.push_back(p.start);
  EXPECT_EQ(starts, (std::vector<uint32_t>{4, 0, 2}));
  ProfileSpec one;
  one.placements = {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}};
  starts.clear();
  for (const auto& p : DriverPlacementOrder(one, 8)) starts.push_back(p.start);
  EXPECT_EQ(starts, (std::vector<uint32_t>{6, 4, 5, 0, 1, 2, 3}));
}

TEST(GeometryLayOut, TriesDistinctOrderingsUntilTheDriversPicksFit) {
  // Largest first, `big` takes the upper half (the driver's pick) and `small`, which fits only at
  // 4:2, is left out; the second ordering fits. Two instances of one profile are one item.
  ProfileSpec big;
  big.name = "4g";
  big.placements = {{0, 4}, {4, 4}};
  ProfileSpec small;
  small.name = "2g";
  small.placements = {{4, 2}};
  size_t tried = 0;
  auto layout = LayOutGeometry({&big, &small}, 8, &tried);
  ASSERT_TRUE(layout.has_value());
  EXPECT_EQ(tried, 2u);
  EXPECT_EQ(layout->order, (std::vector<size_t>{1, 0}));
  ASSERT_EQ(layout->placements.size(), 2u);
  EXPECT_EQ(layout->placements[0].start, 4u);
  EXPECT_EQ(layout->placements[1].start, 0u);
  // {big, big, small} has three distinct orderings and none fits.
  EXPECT_FALSE(LayOutGeometry({&big, &big, &small}, 8, &tried).has_value());
  EXPECT_EQ(tried, 3u);
  // A catalogued geometry as mig-parted lays it out on an A100 40GB: 3g upper, 2g at 0, 1g at 2, 3.
  const auto& cap = testing::Model("A100-SXM4-40GB");
  auto profile = [&](const std::string& name) {
    for (const auto& p : cap.profiles) {
      if (p.name == name) return &p;
    }
    ADD_FAILURE() << name;
    return &cap.profiles.front();
  };
  layout = LayOutGeometry(
      {profile("3g.20gb"), profile("2g.10gb"), profile("1g.5gb"), profile("1g.5gb")}, 8, &tried);
  ASSERT_TRUE(layout.has_value());
  EXPECT_EQ(tried, 1u);
  std::vector<uint32_t> starts;
  for (const auto& pl : layout->placements) starts.push_back(pl.start);
  EXPECT_EQ(starts, (std::vector<uint32_t>{4, 0, 2, 3}));
}

}  // namespace
}  // namespace dynmig::mig
