// Kubernetes quantities, read and written as kube-apiserver does (resource.Quantity).
#include "common/quantity.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace dynmig {
namespace {

// What kube-apiserver serves for what was written (observed on v1.20 and in resource.Quantity's
// own tests): the canonical form keeps the suffix family and uses the largest suffix that keeps
// an integer mantissa.
TEST(QuantityTest, CanonicalFormsAsTheApiServerWritesThem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"8000", "8k"},    {"20000", "20k"},     {"19000", "19k"}, {"1024", "1024"},
      {"1500", "1500"},  {"0", "0"},           {"0.5", "500m"},  {"1", "1"},
      {"100m", "100m"},  {"1000m", "1"},       {"1.5", "1500m"}, {"8Gi", "8Gi"},
      {"1024Mi", "1Gi"}, {"1536Mi", "1536Mi"}, {"0.5Ki", "512"}, {"1Ki", "1Ki"},
      {"8e3", "8e3"},    {"12e4", "120e3"},    {"1E3", "1e3"},   {"8M", "8M"},
      {"8000k", "8M"},   {"-8000", "-8k"},     {"+8000", "8k"},  {"0.1n", "1n"},
      {"1E", "1E"},      {"007", "7"},         {"5.", "5"},      {".5", "500m"},
      {"2048", "2048"},  {"4096Ki", "4Mi"},    {"1e0", "1"},     {"1e-3", "1e-3"},
  };
  for (const auto& [in, want] : cases) {
    auto got = CanonicalizeQuantity(in);
    ASSERT_TRUE(got.ok()) << in << ": " << got.status();
    EXPECT_EQ(*got, want) << in;
    // Canonical text is a fixed point.
    auto again = CanonicalizeQuantity(*got);
    ASSERT_TRUE(again.ok()) << *got;
    EXPECT_EQ(*again, *got) << in;
  }
}

TEST(QuantityTest, ExactValues) {
  auto q = ParseQuantity("8k");
  ASSERT_TRUE(q.ok());
  EXPECT_TRUE(q->IsInteger());
  EXPECT_EQ(q->AsInt64(), 8000);
  q = ParseQuantity("1.5k");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->AsInt64(), 1500);
  q = ParseQuantity("500m");
  ASSERT_TRUE(q.ok());
  EXPECT_FALSE(q->IsInteger());
  EXPECT_EQ(q->AsInt64(), std::nullopt);
  EXPECT_EQ(q->Ceil(), 1);
  q = ParseQuantity("-1.5");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->Ceil(), -1);
  q = ParseQuantity("8Gi");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->format, QuantityFormat::kBinarySI);
  EXPECT_EQ(q->AsInt64(), int64_t{8} << 30);
  q = ParseQuantity("10E");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->AsInt64(), std::nullopt);  // beyond int64
}

TEST(QuantityTest, BadTextNamesWhatIsWrong) {
  for (const auto& [in, why] : std::vector<std::pair<std::string, std::string>>{
           {"", "no digits"},
           {"abc", "no digits"},
           {"8GB", "unknown suffix \"GB\""},
           {"8 k", "unknown suffix \" k\""},
           {" 8", "no digits"},
           {"1.2.3", "two decimal points"},
           {"1e", "unknown suffix \"e\""},
           {"1e+", "bad exponent"},
           {"1e3x", "bad exponent"},
           {"1e99999", "exponent out of range"},
           {"99999999999999999999999999999999999999999", "too large"},
           {"1ki", "unknown suffix \"ki\""}}) {
    auto q = ParseQuantity(in);
    ASSERT_FALSE(q.ok()) << in;
    EXPECT_NE(q.status().message().find(why), std::string::npos) << in << ": " << q.status();
    EXPECT_NE(q.status().message().find("is not a Kubernetes quantity"), std::string::npos);
  }
}

}  // namespace
}  // namespace dynmig
