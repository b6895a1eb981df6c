#include "protocol/pod_request.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <optional>

#include "absl/status/status.h"
#include "common/quantity.h"
#include "common/status_macros.h"
#include "common/strings.h"
#include "fmt/format.h"
#include "mig/preference.h"

namespace dynmig::protocol {
namespace {

using nlohmann::json;

constexpr int64_t kMaxValue = std::numeric_limits<int32_t>::max();

const json* Member(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// What to write instead of a binary-suffixed quantity: for the memory resource (MiB), the same
// size in MiB when it is whole ("8Gi" -> 8192); otherwise a plain count.
std::string BinaryHint(const Quantity& q, bool mebibytes) {
  if (mebibytes) {
    if (auto bytes = q.AsInt64(); bytes && *bytes % (1 << 20) == 0) {
      return fmt::format("it counts MiB: write {} for {}", *bytes / (1 << 20),
                         CanonicalQuantity(q));
    }
    return "it counts MiB: write the size in MiB as a plain number";
  }
  return "write a plain number";
}

// A resource value: a JSON integer, or a Kubernetes quantity string that is a whole number in
// decimal form. The API server serves quantities canonically ("8000" as "8k", "20000" as "20k"),
// so every decimal form is read; binary suffixes and fractions are refused with what to write.
absl::StatusOr<int64_t> QuantityValue(const json& v, std::string_view where, bool mebibytes) {
  std::optional<int64_t> value;
  std::string shown;
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    value = v.get<int64_t>();
    shown = v.dump();
  } else if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(kMaxValue)) {
      return absl::InvalidArgumentError(fmt::format("{}: {} is too large", where, u));
    }
    value = static_cast<int64_t>(u);
    shown = v.dump();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    // Range first: converting a double beyond int64 (or NaN) to an integer is undefined.
    if (!(std::fabs(d) <= static_cast<double>(kMaxValue))) {
      return absl::InvalidArgumentError(fmt::format("{}: {} is too large", where, v.dump()));
    }
    if (d != static_cast<double>(static_cast<int64_t>(d))) {
      return absl::InvalidArgumentError(
          fmt::format("{}: {} is not a whole number: write a whole number such as {}", where,
                      v.dump(), static_cast<int64_t>(d) + (d > 0 ? 1 : 0)));
    }
    value = static_cast<int64_t>(d);
    shown = v.dump();
  } else if (v.is_string()) {
    const std::string s = v.get<std::string>();
    shown = fmt::format("\"{}\"", s);
    auto q = ParseQuantity(s);
    if (!q.ok())
      return absl::InvalidArgumentError(
          fmt::format("{}: {}", where, std::string(q.status().message())));
    if (q->format == QuantityFormat::kBinarySI) {
      return absl::InvalidArgumentError(
          fmt::format("{}: {} has a binary suffix; {}", where, shown, BinaryHint(*q, mebibytes)));
    }
    if (!q->IsInteger()) {
      return absl::InvalidArgumentError(
          fmt::format("{}: {} is not a whole number: write a whole number such as {}", where, shown,
                      q->Ceil()));
    }
    value = q->AsInt64();
    if (!value.has_value()) {
      return absl::InvalidArgumentError(fmt::format("{}: {} is too large", where, shown));
    }
  } else {
    return absl::InvalidArgumentError(fmt::format("{}: {} is not an integer", where, v.dump()));
  }
  if (*value < 0)
    return absl::InvalidArgumentError(fmt::format("{}: {} is negative", where, shown));
  if (*value > kMaxValue) {
    return absl::InvalidArgumentError(fmt::format("{}: {} is too large", where, shown));
  }
  return *value;
}

// The value of `resource` in the container's limits, else its requests; nullopt when absent.
absl::StatusOr<std::optional<int64_t>> ResourceValue(const json& container,
                                                     const std::string& resource,
                                                     const std::string& who,
                                                     bool mebibytes = false) {
  const json* resources = Member(container, "resources");
  if (resources == nullptr) return std::optional<int64_t>();
  for (const char* section : {"limits", "requests"}) {
    const json* list = Member(*resources, section);
    if (list == nullptr) continue;
    if (!list->is_object()) {
      return absl::InvalidArgumentError(
          fmt::format("{}: resources.{} must be an object", who, section));
    }
    if (const json* v = Member(*list, resource.c_str())) {
      DYNMIG_ASSIGN_OR_RETURN(int64_t value,
                              QuantityValue(*v, fmt::format("{}: {}", who, resource), mebibytes));
      return std::optional<int64_t>(value);
    }
  }
  return std::optional<int64_t>();
}

bool NamesResource(const json& container, const ResourceNames& names) {
  const json* resources = Member(container, "resources");
  if (resources == nullptr) return false;
  for (const char* section : {"limits", "requests"}) {
    const json* list = Member(*resources, section);
    if (list == nullptr || !list->is_object()) continue;
    for (const std::string* r :
         {&names.count, &names.memory, &names.memory_percentage, &names.cores}) {
      if (!r->empty() && list->contains(*r)) return true;
    }
  }
  return false;
}

absl::StatusOr<mig::ContainerRequest> ParseContainer(const json& c, const std::string& where,
                                                     bool init, const ResourceNames& names) {
  mig::ContainerRequest out;
  out.init = init;
  if (!c.is_object()) {
    return absl::InvalidArgumentError(fmt::format("{}: must be an object", where));
  }
  if (const json* name = Member(c, "name"); name != nullptr && name->is_string()) {
    out.name = name->get<std::string>();
  }
  const std::string who = fmt::format("container \"{}\" ({})", out.name, where);

  DYNMIG_ASSIGN_OR_RETURN(auto count, ResourceValue(c, names.count, who));
  std::optional<int64_t> memory;
  std::optional<int64_t> percent;
  std::optional<int64_t> cores;
  if (!names.memory.empty()) {
    DYNMIG_ASSIGN_OR_RETURN(memory, ResourceValue(c, names.memory, who, /*mebibytes=*/true));
  }
  if (!names.memory_percentage.empty()) {
    DYNMIG_ASSIGN_OR_RETURN(percent, ResourceValue(c, names.memory_percentage, who));
  }
  if (!names.cores.empty()) {
    DYNMIG_ASSIGN_OR_RETURN(cores, ResourceValue(c, names.cores, who));
  }
  if (percent && (*percent < 1 || *percent > 100)) {
    return absl::InvalidArgumentError(
        fmt::format("{}: {}: {} is outside 1..100", who, names.memory_percentage, *percent));
  }
  if (cores && *cores > 100) {
    return absl::InvalidArgumentError(
        fmt::format("{}: {}: {} is outside 0..100", who, names.cores, *cores));
  }
  if (count && *count == 0 && ((memory && *memory > 0) || percent)) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: {}: 0 instances but {} is set; ask for at least 1 or drop the memory "
        "request",
        who, names.count, memory && *memory > 0 ? names.memory : names.memory_percentage));
  }
  if (count) {
    out.count = static_cast<uint32_t>(*count);
  } else if (memory || percent || cores) {
    out.count = names.default_count;
  }
  if (memory) out.memory.mib = static_cast<uint64_t>(*memory);
  if (percent) out.memory.percent = static_cast<uint32_t>(*percent);
  return out;
}

absl::StatusOr<mig::GpuPolicy> ParseGpuPolicy(std::string_view value,
                                              std::vector<std::string>* warnings) {
  std::optional<mig::GpuPolicy> policy;
  for (const auto& piece : SplitTrimmed(value, ',')) {
    std::optional<mig::GpuPolicy> p;
    if (piece == kPolicyBinpack) {
      p = mig::GpuPolicy::kBinpack;
    } else if (piece == kPolicySpread) {
      p = mig::GpuPolicy::kSpread;
    } else if (piece == "topology-aware" || piece == "mutex" || piece == "numa") {
      if (warnings != nullptr) {
        warnings->push_back(fmt::format("{}: \"{}\" is not applied to MIG placement; ignored",
                                        kGpuSchedulerPolicyAnnotation, piece));
      }
      continue;
    } else {
      return absl::InvalidArgumentError(
          fmt::format("{}: unknown policy \"{}\" (want binpack or spread)",
                      kGpuSchedulerPolicyAnnotation, piece));
    }
    if (policy && *policy != *p) {
      return absl::InvalidArgumentError(fmt::format("{}: \"{}\" names both binpack and spread",
                                                    kGpuSchedulerPolicyAnnotation, value));
    }
    policy = p;
  }
  return policy.value_or(mig::PodRequest{}.gpu_policy);
}

absl::StatusOr<mig::NodePolicy> ParseNodePolicy(std::string_view value) {
  const std::string_view v = Trim(value);
  if (v.empty() || v == kPolicyBinpack) return mig::NodePolicy::kBinpack;
  if (v == kPolicySpread) return mig::NodePolicy::kSpread;
  return absl::InvalidArgumentError(fmt::format(
      "{}: unknown policy \"{}\" (want binpack or spread)", kNodeSchedulerPolicyAnnotation, value));
}

const json* Annotations(const json& pod) {
  const json* metadata = Member(pod, "metadata");
  if (metadata == nullptr) return nullptr;
  const json* annotations = Member(*metadata, "annotations");
  if (annotations == nullptr || !annotations->is_object()) return nullptr;
  return annotations;
}

// Calls f(container, where, init) for init containers, then containers.
template <typename F>
absl::Status ForEachContainer(const json& pod, F&& f) {
  const json* spec = Member(pod, "spec");
  if (spec == nullptr) return absl::OkStatus();
  if (!spec->is_object()) return absl::InvalidArgumentError("pod spec must be an object");
  for (const char* list_name : {"initContainers", "containers"}) {
    const json* list = Member(*spec, list_name);
    if (list == nullptr) continue;
    if (!list->is_array()) {
      return absl::InvalidArgumentError(fmt::format("spec.{} must be an array", list_name));
    }
    const bool init = std::string_view(list_name) == "initContainers";
    for (size_t i = 0; i < list->size(); ++i) {
      DYNMIG_RETURN_IF_ERROR(f((*list)[i], fmt::format("{}[{}]", list_name, i), init));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string PodAnnotation(const json& pod, std::string_view key) {
  const json* annotations = Annotations(pod);
  if (annotations == nullptr) return "";
  const json* v = Member(*annotations, std::string(key).c_str());
  if (v == nullptr || !v->is_string()) return "";
  return v->get<std::string>();
}

absl::StatusOr<mig::PodRequest> ParsePodRequest(const json& pod, const ResourceNames& names,
                                                std::vector<std::string>* warnings) {
  if (!pod.is_object()) return absl::InvalidArgumentError("pod must be a JSON object");
  mig::PodRequest out;
  DYNMIG_RETURN_IF_ERROR(
      ForEachContainer(pod, [&](const json& c, const std::string& where, bool init) {
        auto parsed = ParseContainer(c, where, init, names);
        if (!parsed.ok()) return parsed.status();
        out.containers.push_back(std::move(*parsed));
        return absl::OkStatus();
      }));

  if (const json* annotations = Annotations(pod)) {
    for (auto it = annotations->begin(); it != annotations->end(); ++it) {
      const std::string& key = it.key();
      const bool ours = key == kMigProfilePreferenceAnnotation ||
                        key == kGpuSchedulerPolicyAnnotation ||
                        key == kNodeSchedulerPolicyAnnotation || key == kUseGpuUuidAnnotation ||
                        key == kNoUseGpuUuidAnnotation || key == kUseGpuTypeAnnotation ||
                        key == kNoUseGpuTypeAnnotation || key == kVgpuModeAnnotation;
      if (ours && !it->is_string()) {
        return absl::InvalidArgumentError(
            fmt::format("annotation {}: must be a string, got {}", key, it->type_name()));
      }
    }
  }
  out.preference = mig::ParsePreference(PodAnnotation(pod, kMigProfilePreferenceAnnotation));
  DYNMIG_ASSIGN_OR_RETURN(
      out.gpu_policy, ParseGpuPolicy(PodAnnotation(pod, kGpuSchedulerPolicyAnnotation), warnings));
  DYNMIG_ASSIGN_OR_RETURN(out.node_policy,
                          ParseNodePolicy(PodAnnotation(pod, kNodeSchedulerPolicyAnnotation)));
  out.filter.use_uuids = SplitTrimmed(PodAnnotation(pod, kUseGpuUuidAnnotation), ',');
  out.filter.nouse_uuids = SplitTrimmed(PodAnnotation(pod, kNoUseGpuUuidAnnotation), ',');
  out.filter.use_types = SplitTrimmed(PodAnnotation(pod, kUseGpuTypeAnnotation), ',');
  out.filter.nouse_types = SplitTrimmed(PodAnnotation(pod, kNoUseGpuTypeAnnotation), ',');
  out.filter.vgpu_mode = std::string(Trim(PodAnnotation(pod, kVgpuModeAnnotation)));
  return out;
}

bool RequestsGpuResources(const json& pod, const ResourceNames& names) {
  bool found = false;
  (void)ForEachContainer(pod, [&](const json& c, const std::string&, bool) {
    if (NamesResource(c, names)) found = true;
    return absl::OkStatus();
  });
  return found;
}

bool IsMigPod(const json& pod, const ResourceNames& names) {
  if (!RequestsGpuResources(pod, names)) return false;
  const std::string mode(Trim(PodAnnotation(pod, kVgpuModeAnnotation)));
  return mode.empty() || mode.find(kVgpuModeMig) != std::string::npos;
}

}  // namespace dynmig::protocol
