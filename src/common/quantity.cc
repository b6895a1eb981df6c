#include "common/quantity.h"

#include <array>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "fmt/format.h"

namespace dynmig {
namespace {

using u128 = QuantityMantissa;

constexpr u128 kMaxMantissa = ~u128{0};
constexpr std::string_view kGrammar =
    "a number with an optional suffix (Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or e<exponent>)";

absl::Status Bad(std::string_view text, std::string_view why) {
  return absl::InvalidArgumentError(
      fmt::format("\"{}\" is not a Kubernetes quantity ({}): write {}", text, why, kGrammar));
}

bool MulAdd(u128& value, unsigned mul, unsigned add) {
  if (value > (kMaxMantissa - add) / mul) return false;
  value = value * mul + add;
  return true;
}

std::string Digits(u128 v) {
  if (v == 0) return "0";
  std::string out;
  while (v != 0) {
    out.push_back(static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  }
  return std::string(out.rbegin(), out.rend());
}

// 10^n for n in 0..38; nullopt beyond.
std::optional<u128> Pow10(int n) {
  if (n < 0 || n > 38) return std::nullopt;
  u128 v = 1;
  for (int i = 0; i < n; ++i) v *= 10;
  return v;
}

void Normalize(Quantity& q) {
  if (q.mantissa == 0) {
    q.exponent10 = 0;
    q.negative = false;
    return;
  }
  while (q.mantissa % 10 == 0) {
    q.mantissa /= 10;
    ++q.exponent10;
  }
}

int FloorTo3(int e) { return e >= 0 ? e / 3 * 3 : -((-e + 2) / 3 * 3); }

std::string DecimalText(Quantity q, QuantityFormat format) {
  if (q.mantissa == 0) return "0";
  // Finer than 1n: round the magnitude up to whole nanos, as the API server does.
  if (q.exponent10 < -9) {
    const auto div = Pow10(-9 - q.exponent10);
    q.mantissa = div.has_value() ? (q.mantissa + *div - 1) / *div : 1;
    q.exponent10 = -9;
    Normalize(q);
  }
  int e3 = FloorTo3(q.exponent10);
  if (format == QuantityFormat::kDecimalSI && e3 > 18) e3 = 18;
  std::string number = Digits(q.mantissa);
  number.append(static_cast<size_t>(q.exponent10 - e3), '0');
  std::string suffix;
  if (format == QuantityFormat::kDecimalExponent) {
    if (e3 != 0) suffix = fmt::format("e{}", e3);
  } else {
    static constexpr std::array<std::string_view, 10> kSuffixes = {"n", "u", "m", "",  "k",
                                                                   "M", "G", "T", "P", "E"};
    suffix = std::string(kSuffixes[static_cast<size_t>((e3 + 9) / 3)]);
  }
  return fmt::format("{}{}{}", q.negative ? "-" : "", number, suffix);
}

}  // namespace

bool Quantity::IsInteger() const { return mantissa == 0 || exponent10 >= 0; }

std::optional<int64_t> Quantity::AsInt64() const {
  if (!IsInteger()) return std::nullopt;
  u128 v = mantissa;
  for (int i = 0; i < exponent10; ++i) {
    if (v > std::numeric_limits<int64_t>::max() / 10) return std::nullopt;
    v *= 10;
  }
  if (v > static_cast<u128>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  const auto i = static_cast<int64_t>(v);
  return negative ? -i : i;
}

int64_t Quantity::Ceil() const {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (IsInteger()) {
    if (auto v = AsInt64()) return *v;
    return negative ? std::numeric_limits<int64_t>::min() : kMax;
  }
  const auto div = Pow10(-exponent10);
  const u128 whole = div.has_value() ? mantissa / *div : 0;
  if (negative) return whole > static_cast<u128>(kMax) ? -kMax : -static_cast<int64_t>(whole);
  return whole >= static_cast<u128>(kMax) ? kMax : static_cast<int64_t>(whole) + 1;
}

absl::StatusOr<Quantity> ParseQuantity(std::string_view text) {
  Quantity q;
  size_t i = 0;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) q.negative = text[i++] == '-';
  int digits = 0;
  bool point = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '.') {
      if (point) return Bad(text, "two decimal points");
      point = true;
      continue;
    }
    if (c < '0' || c > '9') break;
    ++digits;
    if (!MulAdd(q.mantissa, 10, static_cast<unsigned>(c - '0'))) return Bad(text, "too large");
    if (point) --q.exponent10;
  }
  if (digits == 0) return Bad(text, "no digits");
  const std::string_view suffix = text.substr(i);
  static constexpr std::array<std::pair<std::string_view, int>, 10> kDecimal = {{{"n", -9},
                                                                                 {"u", -6},
                                                                                 {"m", -3},
                                                                                 {"", 0},
                                                                                 {"k", 3},
                                                                                 {"M", 6},
                                                                                 {"G", 9},
                                                                                 {"T", 12},
                                                                                 {"P", 15},
                                                                                 {"E", 18}}};
  static constexpr std::array<std::string_view, 6> kBinary = {"Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
  bool known = false;
  for (const auto& [s, e] : kDecimal) {
    if (suffix == s) {
      q.exponent10 += e;
      q.format = QuantityFormat::kDecimalSI;
      known = true;
    }
  }
  for (size_t p = 0; p < kBinary.size() && !known; ++p) {
    if (suffix != kBinary[p]) continue;
    for (size_t k = 0; k <= p; ++k) {
      if (!MulAdd(q.mantissa, 1024, 0)) return Bad(text, "too large");
    }
    q.format = QuantityFormat::kBinarySI;
    known = true;
  }
  if (!known && suffix.size() >= 2 && (suffix[0] == 'e' || suffix[0] == 'E')) {
    size_t j = 1;
    bool negative_exponent = false;
    if (suffix[j] == '+' || suffix[j] == '-') negative_exponent = suffix[j++] == '-';
    int exponent = 0;
    const size_t first = j;
    for (; j < suffix.size() && suffix[j] >= '0' && suffix[j] <= '9'; ++j) {
      exponent = exponent * 10 + (suffix[j] - '0');
      if (exponent > 1000) return Bad(text, "exponent out of range");
    }
    if (j == first || j != suffix.size()) return Bad(text, "bad exponent");
    q.exponent10 += negative_exponent ? -exponent : exponent;
    q.format = QuantityFormat::kDecimalExponent;
    known = true;
  }
  if (!known) return Bad(text, fmt::format("unknown suffix \"{}\"", suffix));
  Normalize(q);
  return q;
}

std::string CanonicalQuantity(const Quantity& q) {
  if (q.format != QuantityFormat::kBinarySI) return DecimalText(q, q.format);
  // Binary: whole values of at least 1024 in the largest power-of-1024 suffix that divides them;
  // anything else reads better (and exactly) in decimal.
  const auto integer = q.IsInteger() ? Pow10(q.exponent10) : std::nullopt;
  if (!integer.has_value() || q.mantissa > kMaxMantissa / *integer) {
    return DecimalText(q, QuantityFormat::kDecimalSI);
  }
  u128 v = q.mantissa * *integer;
  if (v < 1024) return DecimalText(q, QuantityFormat::kDecimalSI);
  static constexpr std::array<std::string_view, 7> kSuffixes = {"",   "Ki", "Mi", "Gi",
                                                                "Ti", "Pi", "Ei"};
  size_t p = 0;
  while (p + 1 < kSuffixes.size() && v % 1024 == 0) {
    v /= 1024;
    ++p;
  }
  return fmt::format("{}{}{}", q.negative ? "-" : "", Digits(v), kSuffixes[p]);
}

absl::StatusOr<std::string> CanonicalizeQuantity(std::string_view text) {
  auto q = ParseQuantity(text);
  if (!q.ok()) return q.status();
  return CanonicalQuantity(*q);
}

}  // namespace dynmig
