#include "common/bounded_json.h"

#include "absl/status/status.h"
#include "fmt/format.h"

namespace dynmig {

std::string FormatBytes(size_t bytes) {
  if (bytes >= kMiB) {
    if (bytes % kMiB == 0) return fmt::format("{} MiB", bytes / kMiB);
    return fmt::format("{} bytes ({:.1f} MiB)", bytes, static_cast<double>(bytes) / kMiB);
  }
  if (bytes >= kKiB && bytes % kKiB == 0) return fmt::format("{} KiB", bytes / kKiB);
  return fmt::format("{} bytes", bytes);
}

std::string PrintableText(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) {
      out += c;
    } else {
      out += fmt::format("\\x{:02x}", byte);
    }
  }
  return out;
}

int JsonNestingDepth(std::string_view text, int stop_above) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, whatever it is, cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) {
        deepest = depth;
        if (deepest > stop_above) return deepest;
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

absl::Status CheckJsonLimits(std::string_view text, const JsonLimits& limits,
                             std::string_view what) {
  if (text.size() > limits.max_bytes) {
    return absl::InvalidArgumentError(fmt::format("{}: {} exceeds the {} limit", what,
                                                  FormatBytes(text.size()),
                                                  FormatBytes(limits.max_bytes)));
  }
  if (JsonNestingDepth(text, limits.max_depth) > limits.max_depth) {
    return absl::InvalidArgumentError(
        fmt::format("{}: nesting deeper than {} levels", what, limits.max_depth));
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> ParseBoundedJson(std::string_view text, const JsonLimits& limits,
                                                std::string_view what) {
  if (absl::Status st = CheckJsonLimits(text, limits, what); !st.ok()) return st;
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        fmt::format("{}: invalid JSON: {}", what, PrintableText(e.what())));
  }
}

}  // namespace dynmig
