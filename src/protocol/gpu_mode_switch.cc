#include "protocol/gpu_mode_switch.h"

#include <algorithm>
#include <set>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "protocol/annotations.h"
#include "protocol/json_fields.h"

namespace dynmig::protocol {
namespace {

using nlohmann::json;

constexpr int64_t kMaxTimeMs = (int64_t{1} << 53) - 1;

absl::Status Invalid(std::string_view path, std::string_view what) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", path, what));
}

// A bounded, printable text field; "" when absent.
absl::StatusOr<std::string> TextField(const json& obj, std::string_view key, std::string_view ctx,
                                      size_t max) {
  auto s = internal::StringField(obj, key, ctx);
  if (!s.ok()) return s.status();
  std::string v = s->value_or("");
  if (v.size() > max) {
    return Invalid(internal::FieldPath(ctx, key),
                   fmt::format("{} characters (at most {})", v.size(), max));
  }
  for (char c : v) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      return Invalid(internal::FieldPath(ctx, key), fmt::format("control character 0x{:02x}", u));
    }
  }
  return v;
}

absl::StatusOr<std::string> UuidField(const json& obj, std::string_view ctx,
                                      std::set<std::string>& seen) {
  auto uuid = internal::RequiredStringField(obj, "gpuUUID", ctx);
  if (!uuid.ok()) return uuid.status();
  const std::string path = internal::FieldPath(ctx, "gpuUUID");
  if (uuid->size() > kMaxModeUuid) {
    return Invalid(path, fmt::format("{} characters (at most {})", uuid->size(), kMaxModeUuid));
  }
  for (char c : *uuid) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f) return Invalid(path, "must be printable ASCII without spaces");
  }
  if (!seen.insert(*uuid).second) return Invalid(path, fmt::format("{} appears twice", *uuid));
  return uuid;
}

absl::StatusOr<GpuMode> ModeField(const json& obj, std::string_view key, std::string_view ctx) {
  auto s = internal::RequiredStringField(obj, key, ctx);
  if (!s.ok()) return s.status();
  if (auto mode = GpuModeFromName(*s)) return *mode;
  return Invalid(internal::FieldPath(ctx, key),
                 fmt::format("must be \"{}\" or \"{}\"", kVgpuModeMig, kVgpuModeHamiCore));
}

// The array of an annotation's value within the bounds both share; "" is an empty array.
absl::StatusOr<json> BoundedArray(std::string_view value, std::string_view what) {
  if (value.size() > kMaxModeAnnotation) {
    return Invalid(what, fmt::format("{} bytes (at most {})", value.size(), kMaxModeAnnotation));
  }
  if (value.empty()) return json::array();
  auto doc = internal::ParseJsonArray(value, what);
  if (!doc.ok()) return doc.status();
  if (doc->size() > kMaxModeGpus) {
    return Invalid(what, fmt::format("{} entries (at most {})", doc->size(), kMaxModeGpus));
  }
  return doc;
}

std::string Cut(std::string s) {
  if (s.size() > kMaxModeText) s.resize(kMaxModeText);
  for (char& c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) c = ' ';
  }
  return s;
}

}  // namespace

std::string_view GpuModePhaseName(GpuModePhase phase) {
  switch (phase) {
    case GpuModePhase::kSteady:
      return "steady";
    case GpuModePhase::kSwitching:
      return "switching";
    case GpuModePhase::kRefused:
      return "refused";
  }
  return "steady";
}

absl::StatusOr<std::vector<GpuModeRequest>> DecodeGpuModeRequests(std::string_view value) {
  auto doc = BoundedArray(value, kGpuModeRequestAnnotation);
  if (!doc.ok()) return doc.status();
  std::vector<GpuModeRequest> out;
  std::set<std::string> seen;
  for (size_t i = 0; i < doc->size(); ++i) {
    const json& e = (*doc)[i];
    const std::string ctx = fmt::format("{}[{}]", kGpuModeRequestAnnotation, i);
    if (!e.is_object()) return Invalid(ctx, "must be an object");
    GpuModeRequest r;
    auto uuid = UuidField(e, ctx, seen);
    if (!uuid.ok()) return uuid.status();
    r.gpu_uuid = std::move(*uuid);
    auto to = ModeField(e, "to", ctx);
    if (!to.ok()) return to.status();
    r.to = *to;
    auto at = internal::IntField(e, "at", ctx, 1, kMaxTimeMs);
    if (!at.ok()) return at.status();
    if (!at->has_value()) return Invalid(internal::FieldPath(ctx, "at"), "missing");
    r.at_ms = **at;
    auto by = TextField(e, "by", ctx, kMaxModeText);
    if (!by.ok()) return by.status();
    r.by = std::move(*by);
    auto reason = TextField(e, "reason", ctx, kMaxModeText);
    if (!reason.ok()) return reason.status();
    r.reason = std::move(*reason);
    out.push_back(std::move(r));
  }
  return out;
}

std::string EncodeGpuModeRequests(std::vector<GpuModeRequest> requests) {
  // Last one per GPU wins: stable sort, then keep the last of each run.
  std::stable_sort(
      requests.begin(), requests.end(),
      [](const GpuModeRequest& a, const GpuModeRequest& b) { return a.gpu_uuid < b.gpu_uuid; });
  json out = json::array();
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i + 1 < requests.size() && requests[i + 1].gpu_uuid == requests[i].gpu_uuid) continue;
    const GpuModeRequest& r = requests[i];
    out.push_back({{"gpuUUID", r.gpu_uuid},
                   {"to", GpuModeName(r.to)},
                   {"at", r.at_ms},
                   {"by", Cut(r.by)},
                   {"reason", Cut(r.reason)}});
  }
  return out.dump();
}

absl::StatusOr<std::vector<GpuModeStatus>> DecodeGpuModeStatuses(std::string_view value) {
  auto doc = BoundedArray(value, kGpuModeStatusAnnotation);
  if (!doc.ok()) return doc.status();
  std::vector<GpuModeStatus> out;
  std::set<std::string> seen;
  for (size_t i = 0; i < doc->size(); ++i) {
    const json& e = (*doc)[i];
    const std::string ctx = fmt::format("{}[{}]", kGpuModeStatusAnnotation, i);
    if (!e.is_object()) return Invalid(ctx, "must be an object");
    GpuModeStatus s;
    auto uuid = UuidField(e, ctx, seen);
    if (!uuid.ok()) return uuid.status();
    s.gpu_uuid = std::move(*uuid);
    auto mode = ModeField(e, "mode", ctx);
    if (!mode.ok()) return mode.status();
    s.mode = *mode;
    auto capable = internal::BoolField(e, "migCapable", ctx);
    if (!capable.ok()) return capable.status();
    s.mig_capable = capable->value_or(false);
    auto switchable = internal::BoolField(e, "switchable", ctx);
    if (!switchable.ok()) return switchable.status();
    s.switchable = switchable->value_or(false);
    auto since = internal::IntField(e, "since", ctx, 0, kMaxTimeMs);
    if (!since.ok()) return since.status();
    s.since_ms = since->value_or(0);
    auto phase = internal::StringField(e, "phase", ctx);
    if (!phase.ok()) return phase.status();
    const std::string p = phase->value_or("steady");
    if (p == "steady") {
      s.phase = GpuModePhase::kSteady;
    } else if (p == "switching") {
      s.phase = GpuModePhase::kSwitching;
    } else if (p == "refused") {
      s.phase = GpuModePhase::kRefused;
    } else {
      return Invalid(internal::FieldPath(ctx, "phase"),
                     "must be \"steady\", \"switching\" or \"refused\"");
    }
    auto answers = internal::IntField(e, "answers", ctx, 0, kMaxTimeMs);
    if (!answers.ok()) return answers.status();
    s.answers_ms = answers->value_or(0);
    auto reason = TextField(e, "reason", ctx, kMaxModeText);
    if (!reason.ok()) return reason.status();
    s.reason = std::move(*reason);
    out.push_back(std::move(s));
  }
  return out;
}

std::string EncodeGpuModeStatuses(std::vector<GpuModeStatus> statuses) {
  std::stable_sort(
      statuses.begin(), statuses.end(),
      [](const GpuModeStatus& a, const GpuModeStatus& b) { return a.gpu_uuid < b.gpu_uuid; });
  json out = json::array();
  for (size_t i = 0; i < statuses.size(); ++i) {
    if (i + 1 < statuses.size() && statuses[i + 1].gpu_uuid == statuses[i].gpu_uuid) continue;
    const GpuModeStatus& s = statuses[i];
    out.push_back({{"gpuUUID", s.gpu_uuid},
                   {"mode", GpuModeName(s.mode)},
                   {"migCapable", s.mig_capable},
                   {"switchable", s.switchable},
                   {"since", s.since_ms},
                   {"phase", GpuModePhaseName(s.phase)},
                   {"answers", s.answers_ms},
                   {"reason", Cut(s.reason)}});
  }
  return out.dump();
}

bool StatusAnswers(const GpuModeStatus& status, const GpuModeRequest& request) {
  if (status.gpu_uuid != request.gpu_uuid || status.answers_ms != request.at_ms) return false;
  if (status.phase == GpuModePhase::kRefused) return true;
  return status.phase == GpuModePhase::kSteady && status.mode == request.to;
}

bool HeldForSwitch(const GpuModeRequest& request, const GpuModeStatus* status) {
  return status == nullptr || !StatusAnswers(*status, request);
}

}  // namespace dynmig::protocol
