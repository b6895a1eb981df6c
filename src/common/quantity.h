// Kubernetes resource quantities ("8000", "8k", "500m", "8Gi", "12e3"), read exactly as the API
// server reads them and written in its canonical form. kube-apiserver stores and serves every
// quantity canonically: `nvidia.com/gpumem: 8000` comes back, to webhooks, watches and the
// scheduler extender alike, as "8k". Pure; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace dynmig {

// How the quantity was written; the canonical form keeps it (as the API server does).
enum class QuantityFormat {
  kDecimalSI,        // no suffix or n u m k M G T P E
  kBinarySI,         // Ki Mi Gi Ti Pi Ei
  kDecimalExponent,  // e3, E-2
};

// 128-bit mantissa (GCC and Clang; __extension__ keeps -Wpedantic quiet).
__extension__ typedef unsigned __int128 QuantityMantissa;

// An exact value: (negative ? -1 : 1) * mantissa * 10^exponent10. Quantities whose digits do not
// fit 38 decimal digits are refused as too large (no GPU resource comes near).
struct Quantity {
  bool negative = false;
  QuantityMantissa mantissa = 0;
  int exponent10 = 0;
  QuantityFormat format = QuantityFormat::kDecimalSI;

  bool IsZero() const { return mantissa == 0; }
  // Whether the value is a whole number.
  bool IsInteger() const;
  // The value when it is a whole number within int64; nullopt otherwise.
  std::optional<int64_t> AsInt64() const;
  // The smallest whole number >= the value, saturated to int64 (for "write N instead" hints).
  int64_t Ceil() const;
};

// Parses Kubernetes' quantity grammar: [+-] digits [. digits] then one suffix (binary Ki..Ei,
// decimal n u m k M G T P E, or an exponent e<int>/E<int>). Surrounding spaces are an error, as in
// the API server. kInvalidArgument names the text and the grammar.
absl::StatusOr<Quantity> ParseQuantity(std::string_view text);

// The API server's canonical text of `q` (resource.Quantity.String()): decimal values with the
// largest SI suffix that keeps an integer mantissa ("8k", "1500", "500m"); binary values at or
// above 1024 that are whole numbers in the largest power-of-1024 suffix that divides them
// ("8Gi", "1536Mi"), otherwise decimal; exponent forms as e<multiple of 3>. Values finer than
// 1n round up to 1n, as in Kubernetes.
std::string CanonicalQuantity(const Quantity& q);

// ParseQuantity then CanonicalQuantity.
absl::StatusOr<std::string> CanonicalizeQuantity(std::string_view text);

}  // namespace dynmig
