// Request sizing: nominal matching (the GB of the profile name x 1024, the default) and NVML
// matching (the memory NVML reports), pinned at the boundaries of every profile of every
// catalogued model, through the planner that the scheduler uses.
#include "mig/sizing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fmt/format.h"
#include "mig/catalogue.h"
#include "mig/planner.h"

namespace dynmig::mig {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> AllNames(const GpuCapability& cap) {
  std::vector<std::string> out;
  for (const auto& p : cap.profiles) out.push_back(p.name);
  return out;
}

// The profile the planner gives one instance of `mib` on an empty GPU.
std::string Planned(const GpuCapability& base, MemoryMatch match, uint64_t mib,
                    const std::string& prefer = "", std::vector<std::string> allowed = {}) {
  GpuCapability cap = base;
  ApplyMemoryMatch(cap, match);
  if (allowed.empty()) allowed = AllNames(cap);
  auto planner = GpuPlanner::Create(cap, allowed);
  EXPECT_TRUE(planner.ok()) << planner.status();
  const uint64_t memories[1] = {mib};
  const GpuPlan plan = (*planner)->Plan(GpuUsage{}, memories, ParsePreference(prefer));
  if (plan.verdict != Verdict::kFits) return "";
  return cap.profiles[plan.instances[0].profile_index].name;
}

TEST(SizingTest, NominalMemoryIsTheNameTimes1024) {
  EXPECT_EQ(NominalMemoryMib("1g.5gb"), 5120u);
  EXPECT_EQ(NominalMemoryMib("3g.20gb"), 20480u);
  EXPECT_EQ(NominalMemoryMib("1g.10gb+me"), 10240u);
  EXPECT_EQ(NominalMemoryMib("7g.141gb"), 144384u);
  EXPECT_EQ(NominalMemoryMib("not-a-profile"), 0u);
}

// The migration guide's examples on an A100-40GB.
TEST(SizingTest, TheSpecsExamplesComeOutAsTheSpecSays) {
  const GpuCapability& a100 = (*FindModel("A100-SXM4-40GB"))->capability;
  // The guide's allowlist (with 4g.20gb for its preference example).
  const std::vector<std::string> guide = {"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"};
  EXPECT_EQ(Planned(a100, MemoryMatch::kNominal, 8000, "", guide), "2g.10gb");
  // With every profile allowed, the smaller-compute 1g.10gb covers 8000 too.
  EXPECT_EQ(Planned(a100, MemoryMatch::kNominal, 8000), "1g.10gb");
  EXPECT_EQ(Planned(a100, MemoryMatch::kNominal, 20000), "3g.20gb");
  EXPECT_EQ(Planned(a100, MemoryMatch::kNominal, 20000, "4g"), "4g.20gb");
  EXPECT_EQ(Planned(a100, MemoryMatch::kNominal, 40000), "7g.40gb");
  EXPECT_EQ(Planned(a100, MemoryMatch::kNominal, 5000), "1g.5gb");
  // NVML matching: never less than NVML's memory (3g.20gb has 19968 MiB).
  EXPECT_EQ(Planned(a100, MemoryMatch::kNvml, 8000, "", guide), "2g.10gb");
  EXPECT_EQ(Planned(a100, MemoryMatch::kNvml, 20000), "7g.40gb");
  EXPECT_EQ(Planned(a100, MemoryMatch::kNvml, 20000, "4g"), "7g.40gb");
  EXPECT_EQ(Planned(a100, MemoryMatch::kNvml, 19968), "3g.20gb");
}

// For every catalogued model and profile: the profile covers up to its nominal memory (nominal
// matching) or its NVML memory (NVML matching), and one MiB more needs a larger profile.
TEST(SizingTest, BoundariesOfEveryProfileOfEveryModel) {
  for (const auto& model : Catalogue()) {
    const GpuCapability& cap = model.capability;
    for (const auto& p : cap.profiles) {
      for (MemoryMatch match : {MemoryMatch::kNominal, MemoryMatch::kNvml}) {
        const uint64_t limit =
            match == MemoryMatch::kNominal ? NominalMemoryMib(p.name) : p.memory_mib;
        const std::string where =
            fmt::format("{} {} {}", cap.model, p.name, MemoryMatchName(match));
        GpuCapability sized = cap;
        ApplyMemoryMatch(sized, match);
        const ProfileSpec* spec = sized.FindProfile(p.name);
        ASSERT_NE(spec, nullptr);
        EXPECT_EQ(spec->SizingMib(), limit) << where;
        // The request at the limit resolves to a profile covering it, never to a smaller one.
        const std::string at = Planned(cap, match, limit);
        ASSERT_FALSE(at.empty()) << where;
        const ProfileSpec* got = sized.FindProfile(at);
        EXPECT_GE(got->SizingMib(), limit) << where << " -> " << at;
        EXPECT_LE(got->SizingMib(), limit) << where << " -> " << at << ": not the smallest";
        // One MiB more never gets a profile that covers only `limit`.
        const std::string above = Planned(cap, match, limit + 1);
        if (!above.empty()) {
          EXPECT_GT(sized.FindProfile(above)->SizingMib(), limit) << where << " -> " << above;
        }
        // The preference for this profile's exact name is honoured at the limit.
        EXPECT_EQ(Planned(cap, match, limit, p.name), p.name) << where;
      }
    }
  }
}

TEST(SizingTest, NotesSayWhatIsSurprising) {
  const GpuCapability& a100 = (*FindModel("A100-SXM4-40GB"))->capability;
  const auto names = AllNames(a100);
  const auto nominal =
      SizingNote(a100, names, 20000, {}, MemoryMatch::kNominal, "nvidia.com/gpumem");
  ASSERT_TRUE(nominal.has_value());
  EXPECT_EQ(*nominal,
            "3g.20gb has 19968 MiB on A100-SXM4-40GB, 32 MiB less than nvidia.com/gpumem 20000");
  const auto strict = SizingNote(a100, names, 20000, {}, MemoryMatch::kNvml, "nvidia.com/gpumem");
  ASSERT_TRUE(strict.has_value());
  EXPECT_EQ(*strict, "20000 MiB needs 7g.40gb on A100-SXM4-40GB; 3g.20gb has 19968");
  // With the preference the note names what the pod gets.
  const auto preferred =
      SizingNote(a100, names, 20000, ParsePreference("4g"), MemoryMatch::kNominal, "gpumem");
  ASSERT_TRUE(preferred.has_value());
  EXPECT_THAT(*preferred, HasSubstr("4g.20gb has 19968 MiB"));
  // Nothing surprising: no note.
  EXPECT_FALSE(SizingNote(a100, names, 8000, {}, MemoryMatch::kNominal, "m").has_value());
  EXPECT_FALSE(SizingNote(a100, names, 19000, {}, MemoryMatch::kNvml, "m").has_value());
  EXPECT_FALSE(SizingNote(a100, names, 0, {}, MemoryMatch::kNominal, "m").has_value());
  // Only the allowlisted profiles count.
  EXPECT_FALSE(SizingNote(a100, {"1g.5gb"}, 20000, {}, MemoryMatch::kNominal, "m").has_value());
}

}  // namespace
}  // namespace dynmig::mig
