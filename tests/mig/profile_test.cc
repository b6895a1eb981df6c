#include "mig/profile.h"

#include <gtest/gtest.h>

namespace dynmig::mig {
namespace {

TEST(ProfileNameTest, ParsesBaseAndVariants) {
  auto base = ParseProfileName("3g.20gb");
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ(base->compute_slices, 3u);
  EXPECT_EQ(base->memory_gb, 20u);
  EXPECT_EQ(base->suffix, "");
  for (auto [name, suffix] :
       std::vector<std::pair<std::string, std::string>>{{"1g.10gb+me", "+me"},
                                                        {"1g.24gb+me.all", "+me.all"},
                                                        {"2g.48gb-me", "-me"},
                                                        {"4g.96gb+gfx", "+gfx"}}) {
    auto p = ParseProfileName(name);
    ASSERT_TRUE(p.ok()) << name << ": " << p.status();
    EXPECT_EQ(p->suffix, suffix) << name;
  }
}

TEST(ProfileNameTest, RejectsMalformedNamesWithReason) {
  for (std::string bad :
       {"5gb", "g.5gb", "3x.20gb", "3g.20", "3g.gb", "0g.5gb", "3g.20gb+xx", ""}) {
    auto p = ParseProfileName(bad);
    EXPECT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(p.status().message().find(bad), std::string::npos) << p.status();
  }
}

TEST(ProfileNameTest, SliceClassIsTextBeforeFirstDot) {
  EXPECT_EQ(SliceClass("4g.20gb"), "4g");
  EXPECT_EQ(SliceClass("1g.10gb+me"), "1g");
  EXPECT_EQ(SliceClass("1g.24gb+me.all"), "1g");
  EXPECT_EQ(SliceClass("4g"), "4g");
  EXPECT_EQ(SliceClass(".x"), ".x");
}

TEST(PlacementTest, HalfOpenOverlap) {
  EXPECT_TRUE((Placement{0, 4}).Overlaps({3, 1}));
  EXPECT_FALSE((Placement{0, 4}).Overlaps({4, 4}));
  EXPECT_FALSE((Placement{4, 4}).Overlaps({0, 4}));
  EXPECT_TRUE((Placement{6, 2}).Overlaps({7, 1}));
  EXPECT_EQ((Placement{4, 4}).Mask(), 0xF0u);
  EXPECT_EQ((Placement{9, 3}).Mask(), 0xE00u);
  EXPECT_EQ((Placement{4, 4}).ToString(), "4-7");
}

}  // namespace
}  // namespace dynmig::mig
