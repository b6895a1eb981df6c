#include "mig/catalogue.h"

#include <gtest/gtest.h>

#include <set>

namespace dynmig::mig {
namespace {

TEST(CatalogueTest, CoversEveryModelOfTheFactsTable) {
  std::set<std::string> models;
  for (const auto& m : Catalogue()) models.insert(m.capability.model);
  for (const char* want :
       {"NVIDIA A30", "NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3",
        "NVIDIA H100 NVL", "NVIDIA H200", "NVIDIA GH200 120GB", "NVIDIA GH200 144G HBM3e",
        "NVIDIA B200", "NVIDIA GB200", "NVIDIA RTX PRO 6000 Blackwell Server Edition"}) {
    EXPECT_TRUE(models.count(want)) << want;
  }
}

TEST(CatalogueTest, EveryProfileIsConsistent) {
  for (const auto& m : Catalogue()) {
    const auto& cap = m.capability;
    EXPECT_GT(cap.total_memory_mib, 0u) << cap.model;
    std::set<std::string> names;
    for (const auto& p : cap.profiles) {
      SCOPED_TRACE(cap.model + " " + p.name);
      EXPECT_TRUE(names.insert(p.name).second) << "duplicate profile";
      auto parsed = ParseProfileName(p.name);
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(parsed->compute_slices, p.compute_slices);
      EXPECT_GT(p.memory_mib, 0u);
      EXPECT_LE(p.memory_mib, cap.total_memory_mib);
      ASSERT_FALSE(p.placements.empty());
      for (const auto& pl : p.placements) {
        EXPECT_EQ(pl.size, p.memory_slices);
        EXPECT_LE(pl.end(), cap.placement_units);
      }
    }
  }
}

TEST(CatalogueTest, ProfileIdIsNotProfileIndex) {
  auto a100 = FindModel("A100-SXM4-40GB");
  ASSERT_TRUE(a100.ok()) << a100.status();
  const auto* p = (*a100)->capability.FindProfile("1g.5gb");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->nvml_index, 0u);
  EXPECT_EQ(p->nvml_id, 19u);
  const auto* rev2 = (*a100)->capability.FindProfile("1g.10gb");
  ASSERT_NE(rev2, nullptr);
  EXPECT_EQ(rev2->nvml_index, 9u);
  EXPECT_EQ(rev2->nvml_id, 15u);
  EXPECT_EQ(rev2->memory_slices, 2u);
  EXPECT_EQ(rev2->compute_slices, 1u);
}

TEST(CatalogueTest, RtxProUsesATwelveUnitAxis) {
  auto rtx = FindModel("RTX PRO 6000");
  ASSERT_TRUE(rtx.ok()) << rtx.status();
  EXPECT_EQ((*rtx)->capability.placement_units, 12u);
  const auto* p = (*rtx)->capability.FindProfile("2g.48gb");
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->IsLegal({6, 6}));
  EXPECT_FALSE(p->IsLegal({3, 6}));
}

TEST(CatalogueTest, FindModelMatchesLikeTheAllowlist) {
  auto h100 = FindModel("H100 80GB");
  ASSERT_TRUE(h100.ok()) << h100.status();
  EXPECT_EQ((*h100)->capability.model, "NVIDIA H100 80GB HBM3");
  auto pcie = FindModel("NVIDIA A100-PCIE-40GB");
  ASSERT_TRUE(pcie.ok());
  EXPECT_EQ((*pcie)->capability.model, "NVIDIA A100-SXM4-40GB");
  auto ambiguous = FindModel("H100");
  ASSERT_FALSE(ambiguous.ok());
  EXPECT_NE(ambiguous.status().message().find("ambiguous"), std::string::npos);
  auto unknown = FindModel("V100");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("NVIDIA A30"), std::string::npos);
}

}  // namespace
}  // namespace dynmig::mig
