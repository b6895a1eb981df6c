#include "mig/legacy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace dynmig::mig {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

// The spec's four A100-40GB geometries: 7 x 1g | 3 x 2g + 1 x 1g | 2 x 3g | 1 x 7g.
LegacyGeometryEntry SpecA100() {
  return LegacyGeometryEntry{{"A100-SXM4-40GB"},
                             {
                                 {{"1g.5gb", 14, 5120, 7}},
                                 {{"2g.10gb", 28, 10240, 3}, {"1g.5gb", 14, 5120, 1}},
                                 {{"3g.20gb", 42, 20480, 2}},
                                 {{"7g.40gb", 100, 40960, 1}},
                             }};
}

TEST(LegacyTest, SpecExampleBecomesTheSpecAllowlist) {
  LegacyConversion c = ConvertLegacyGeometries({SpecA100()});
  ASSERT_THAT(c.entries, SizeIs(1));
  EXPECT_THAT(c.entries[0].models, ElementsAre("A100-SXM4-40GB"));
  EXPECT_THAT(c.entries[0].profiles, ElementsAre("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"));
  EXPECT_THAT(c.Warnings(), IsEmpty());
  ASSERT_THAT(c.reports, SizeIs(1));
  EXPECT_EQ(c.reports[0].path, "nvidia.knownMigGeometries[0]");
  EXPECT_THAT(c.reports[0].geometries,
              ElementsAre("7 x 1g.5gb", "3 x 2g.10gb + 1 x 1g.5gb", "2 x 3g.20gb", "1 x 7g.40gb"));
  ASSERT_THAT(c.reports[0].dropped_templates, SizeIs(5));
  EXPECT_EQ(c.reports[0].dropped_templates[1].core, 28u);
  EXPECT_EQ(c.reports[0].dropped_templates[1].memory, 10240u);
  EXPECT_EQ(c.reports[0].dropped_templates[1].count, 3u);
}

TEST(LegacyTest, ReportLinesSayWhatWasDropped) {
  LegacyConversion c = ConvertLegacyGeometries({SpecA100()});
  std::vector<std::string> lines = c.Lines();
  EXPECT_THAT(lines, Contains(HasSubstr("kept profiles [1g.5gb, 2g.10gb, 3g.20gb, 7g.40gb]")));
  EXPECT_THAT(lines, Contains(AllOf(HasSubstr("dropped 4 geometries"),
                                    HasSubstr("3 x 2g.10gb + 1 x 1g.5gb"))));
  EXPECT_THAT(lines, Contains(HasSubstr("2g.10gb core=28 memory=10240 count=3")));
}

TEST(LegacyTest, ProfilesAreOrderedByComputeThenMemory) {
  LegacyGeometryEntry e{{"A100-SXM4-80GB"},
                        {{{"7g.80gb", 0, 0, 1}},
                         {{"3g.40gb", 0, 0, 1}, {"1g.20gb", 0, 0, 1}},
                         {{"1g.10gb+me", 0, 0, 1}, {"4g.40gb", 0, 0, 1}, {"1g.10gb", 0, 0, 1}}}};
  LegacyConversion c = ConvertLegacyGeometries({e});
  ASSERT_THAT(c.entries, SizeIs(1));
  EXPECT_THAT(c.entries[0].profiles,
              ElementsAre("1g.10gb", "1g.10gb+me", "1g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"));
}

TEST(LegacyTest, InvalidNamesAreDroppedWithAWarning) {
  LegacyGeometryEntry e{{"A30"}, {{{"1g.6gb", 25, 6144, 4}}, {{"half", 50, 12288, 2}}}};
  LegacyConversion c = ConvertLegacyGeometries({e});
  ASSERT_THAT(c.entries, SizeIs(1));
  EXPECT_THAT(c.entries[0].profiles, ElementsAre("1g.6gb"));
  EXPECT_THAT(
      c.Warnings(),
      Contains(AllOf(HasSubstr("nvidia.knownMigGeometries[0]: allowedGeometries[1][0].name"),
                     HasSubstr("invalid MIG profile name \"half\""))));
}

TEST(LegacyTest, NamesUnknownForTheModelAreKeptWithAWarning) {
  // "A100" matches both A100 boards of the catalogue: 1g.5gb is no A100-80GB profile.
  LegacyGeometryEntry e{{"A100"}, {{{"1g.5gb", 14, 5120, 7}}}};
  LegacyConversion c = ConvertLegacyGeometries({e});
  ASSERT_THAT(c.entries, SizeIs(1));
  EXPECT_THAT(c.entries[0].profiles, ElementsAre("1g.5gb"));
  EXPECT_THAT(c.Warnings(),
              Contains(HasSubstr(
                  "profile \"1g.5gb\" is not a MIG profile of NVIDIA A100-SXM4-80GB (matched by "
                  "model \"A100\")")));
  EXPECT_THAT(c.Warnings(), Not(Contains(HasSubstr("NVIDIA A100-SXM4-40GB"))));
}

TEST(LegacyTest, UncataloguedModelIsWarnedAbout) {
  LegacyGeometryEntry e{{"Z9000"}, {{{"1g.5gb", 14, 5120, 7}}}};
  LegacyConversion c = ConvertLegacyGeometries({e});
  ASSERT_THAT(c.entries, SizeIs(1));
  EXPECT_THAT(c.Warnings(), Contains(HasSubstr("model \"Z9000\" matches no catalogued GPU")));
}

TEST(LegacyTest, EntriesWithoutModelsOrProfilesAreDropped) {
  LegacyGeometryEntry no_models{{}, {{{"1g.5gb", 0, 0, 1}}}};
  LegacyGeometryEntry no_profiles{{"A30"}, {}};
  LegacyGeometryEntry only_bad{{"A30"}, {{{"bad", 0, 0, 1}}}};
  LegacyConversion c = ConvertLegacyGeometries({no_models, no_profiles, only_bad}, "x");
  EXPECT_THAT(c.entries, IsEmpty());
  ASSERT_THAT(c.reports, SizeIs(3));
  EXPECT_THAT(c.Warnings(), Contains(HasSubstr("x[0]: models: no GPU model")));
  EXPECT_THAT(c.Warnings(), Contains(HasSubstr("x[1]: no valid profile name")));
  EXPECT_THAT(c.Warnings(), Contains(HasSubstr("x[2]: no valid profile name")));
}

TEST(LegacyTest, SeveralEntriesKeepTheirOrder) {
  LegacyGeometryEntry a30{{"A30"}, {{{"4g.24gb", 100, 24576, 1}}, {{"1g.6gb", 25, 6144, 4}}}};
  LegacyConversion c = ConvertLegacyGeometries({SpecA100(), a30});
  ASSERT_THAT(c.entries, SizeIs(2));
  EXPECT_THAT(c.entries[1].models, ElementsAre("A30"));
  EXPECT_THAT(c.entries[1].profiles, ElementsAre("1g.6gb", "4g.24gb"));
}

TEST(LegacyTest, SortProfileNamesBySizePutsInvalidNamesLast) {
  std::vector<std::string> names = {"zz", "7g.40gb", "1g.5gb", "aa", "2g.10gb"};
  SortProfileNamesBySize(names);
  EXPECT_THAT(names, ElementsAre("1g.5gb", "2g.10gb", "7g.40gb", "zz", "aa"));
}

}  // namespace
}  // namespace dynmig::mig
