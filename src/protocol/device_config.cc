#include "protocol/device_config.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "mig/catalogue.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace dynmig::protocol {
namespace {

constexpr std::string_view kAllowlistPath = "nvidia.migProfileAllowlist";
constexpr std::string_view kLegacyPath = "nvidia.knownMigGeometries";

absl::Status FieldError(std::string_view path, std::string_view what) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", path, what));
}

std::string Describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Scalar:
      return fmt::format("\"{}\"", n.Scalar());
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "nothing";
  }
}

// A sequence node, or an empty one for null/absent. Anything else is an error.
absl::StatusOr<std::vector<YAML::Node>> SequenceItems(const YAML::Node& n, std::string_view path) {
  std::vector<YAML::Node> out;
  if (!n.IsDefined() || n.IsNull()) return out;
  if (!n.IsSequence()) return FieldError(path, fmt::format("must be a list, got {}", Describe(n)));
  for (const auto& item : n) out.push_back(item);
  return out;
}

absl::StatusOr<std::string> ScalarString(const YAML::Node& n, std::string_view path) {
  if (!n.IsScalar()) return FieldError(path, fmt::format("must be a string, got {}", Describe(n)));
  return n.Scalar();
}

absl::StatusOr<std::vector<std::string>> StringList(const YAML::Node& n, std::string_view path) {
  DYNMIG_ASSIGN_OR_RETURN(auto items, SequenceItems(n, path));
  std::vector<std::string> out;
  for (size_t i = 0; i < items.size(); ++i) {
    DYNMIG_ASSIGN_OR_RETURN(auto s, ScalarString(items[i], fmt::format("{}[{}]", path, i)));
    out.push_back(std::move(s));
  }
  return out;
}

// A non-negative integer scalar (absent or null: `fallback`).
absl::StatusOr<uint32_t> UintValue(const YAML::Node& n, std::string_view path, uint32_t fallback) {
  if (!n.IsDefined() || n.IsNull()) return fallback;
  const std::string what = fmt::format("must be a non-negative integer, got {}", Describe(n));
  if (!n.IsScalar()) return FieldError(path, what);
  const std::string& s = n.Scalar();
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) {
    return FieldError(path, what);
  }
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
  if (errno == ERANGE || v > std::numeric_limits<uint32_t>::max()) {
    return FieldError(path, fmt::format("{} is too large", s));
  }
  return static_cast<uint32_t>(v);
}

YAML::Node Child(const YAML::Node& map, const char* key) {
  // REQUIRES: map.IsMap(). A const lookup never inserts.
  return map[key];
}

absl::StatusOr<mig::AllowlistEntry> ParseAllowlistEntry(const YAML::Node& n,
                                                        const std::string& path) {
  if (!n.IsMap()) return FieldError(path, fmt::format("must be a mapping, got {}", Describe(n)));
  mig::AllowlistEntry e;
  DYNMIG_ASSIGN_OR_RETURN(e.models, StringList(Child(n, "models"), path + ".models"));
  DYNMIG_ASSIGN_OR_RETURN(e.profiles, StringList(Child(n, "profiles"), path + ".profiles"));
  return e;
}

absl::StatusOr<std::vector<mig::LegacyTemplate>> ParseGeometry(const YAML::Node& n,
                                                               const std::string& path) {
  YAML::Node list = n;
  std::string list_path = path;
  if (n.IsMap()) {  // volcano-vgpu's grouped form: {group: ..., geometries: [...]}
    list = Child(n, "geometries");
    list_path = path + ".geometries";
    if (!list.IsDefined()) {
      return FieldError(path, "must be a list of templates (or a mapping with \"geometries\")");
    }
  }
  DYNMIG_ASSIGN_OR_RETURN(auto items, SequenceItems(list, list_path));
  std::vector<mig::LegacyTemplate> out;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string tpath = fmt::format("{}[{}]", list_path, i);
    const YAML::Node& t = items[i];
    if (!t.IsMap()) return FieldError(tpath, fmt::format("must be a mapping, got {}", Describe(t)));
    mig::LegacyTemplate tmpl;
    const YAML::Node name = Child(t, "name");
    if (!name.IsDefined() || name.IsNull()) return FieldError(tpath + ".name", "is required");
    DYNMIG_ASSIGN_OR_RETURN(tmpl.name, ScalarString(name, tpath + ".name"));
    DYNMIG_ASSIGN_OR_RETURN(tmpl.core, UintValue(Child(t, "core"), tpath + ".core", 0));
    DYNMIG_ASSIGN_OR_RETURN(tmpl.memory, UintValue(Child(t, "memory"), tpath + ".memory", 0));
    DYNMIG_ASSIGN_OR_RETURN(tmpl.count, UintValue(Child(t, "count"), tpath + ".count", 0));
    out.push_back(std::move(tmpl));
  }
  return out;
}

absl::StatusOr<mig::LegacyGeometryEntry> ParseLegacyEntry(const YAML::Node& n,
                                                          const std::string& path) {
  if (!n.IsMap()) return FieldError(path, fmt::format("must be a mapping, got {}", Describe(n)));
  mig::LegacyGeometryEntry e;
  DYNMIG_ASSIGN_OR_RETURN(e.models, StringList(Child(n, "models"), path + ".models"));
  const std::string gpath = path + ".allowedGeometries";
  DYNMIG_ASSIGN_OR_RETURN(auto geometries, SequenceItems(Child(n, "allowedGeometries"), gpath));
  for (size_t g = 0; g < geometries.size(); ++g) {
    DYNMIG_ASSIGN_OR_RETURN(auto geometry,
                            ParseGeometry(geometries[g], fmt::format("{}[{}]", gpath, g)));
    e.geometries.push_back(std::move(geometry));
  }
  return e;
}

absl::Status ParseResourceName(const YAML::Node& nvidia, const char* key, std::string& out) {
  const YAML::Node n = Child(nvidia, key);
  if (!n.IsDefined() || n.IsNull()) return absl::OkStatus();
  const std::string path = fmt::format("nvidia.{}", key);
  if (!n.IsScalar() || n.Scalar().empty()) {
    return FieldError(path, fmt::format("must be a non-empty string, got {}", Describe(n)));
  }
  out = n.Scalar();
  return absl::OkStatus();
}

constexpr std::string_view kWarmPath = "nvidia.migWarmInstances";

// nvidia.migWarmInstances: {enabled: true|false (default true), ttl: <duration>, maxPerGpu: <n>}.
// Strict (it is dynmig's own key): unknown keys and out-of-range values are errors.
absl::StatusOr<WarmInstances> ParseWarmInstances(const YAML::Node& n) {
  WarmInstances warm;
  if (!n.IsDefined() || n.IsNull()) return warm;
  if (!n.IsMap()) {
    return FieldError(kWarmPath, fmt::format("must be a mapping such as {{ttl: 5m, maxPerGpu: 2}}, "
                                             "got {}",
                                             Describe(n)));
  }
  warm.enabled = true;
  for (auto it = n.begin(); it != n.end(); ++it) {
    const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
    const std::string path = fmt::format("{}.{}", kWarmPath, key);
    const YAML::Node v = it->second;  // a copy: `it->` points into a temporary
    if (key == "enabled") {
      if (!v.IsScalar() || (v.Scalar() != "true" && v.Scalar() != "false")) {
        return FieldError(path, fmt::format("must be true or false, got {}", Describe(v)));
      }
      warm.enabled = v.Scalar() == "true";
    } else if (key == "ttl") {
      absl::Duration d;
      if (!v.IsScalar() || !absl::ParseDuration(v.Scalar(), &d)) {
        return FieldError(
            path, fmt::format("must be a duration such as 90s, 5m or 1h, got {}", Describe(v)));
      }
      if (d < WarmInstances::kMinTtl || d > WarmInstances::kMaxTtl) {
        return FieldError(path,
                          fmt::format("must be between {} and {}, got {}",
                                      absl::FormatDuration(WarmInstances::kMinTtl),
                                      absl::FormatDuration(WarmInstances::kMaxTtl), v.Scalar()));
      }
      warm.ttl = d;
    } else if (key == "maxPerGpu") {
      DYNMIG_ASSIGN_OR_RETURN(const uint32_t max, UintValue(v, path, warm.max_per_gpu));
      if (max < 1 || max > WarmInstances::kMaxPerGpuLimit) {
        return FieldError(path, fmt::format("must be between 1 and {}, got {} (to turn warm "
                                            "instances off, set enabled: false or remove {})",
                                            WarmInstances::kMaxPerGpuLimit, max, kWarmPath));
      }
      warm.max_per_gpu = max;
    } else {
      return FieldError(kWarmPath, fmt::format("unknown key {}; the keys are enabled, ttl and "
                                               "maxPerGpu",
                                               Describe(it->first)));
    }
  }
  return warm;
}

constexpr std::string_view kSwitchPath = "nvidia.migModeSwitching";

absl::StatusOr<bool> SwitchBool(const YAML::Node& v, std::string_view path) {
  if (!v.IsScalar() || (v.Scalar() != "true" && v.Scalar() != "false")) {
    return FieldError(path, fmt::format("must be true or false, got {}", Describe(v)));
  }
  return v.Scalar() == "true";
}

std::string SwitchKey(const YAML::const_iterator& it) {
  return it->first.IsScalar() ? it->first.Scalar() : "";
}

absl::StatusOr<MigModeSwitchRule> ParseSwitchRule(const YAML::Node& n, const std::string& path) {
  if (!n.IsMap()) {
    return FieldError(path, fmt::format("must be a mapping such as {{models: [H100], nodeSelector: "
                                        "{{pool: flex}}}}, got {}",
                                        Describe(n)));
  }
  MigModeSwitchRule rule;
  for (auto it = n.begin(); it != n.end(); ++it) {
    const std::string key = SwitchKey(it);
    const std::string kpath = fmt::format("{}.{}", path, key);
    const YAML::Node v = it->second;
    if (key == "models") {
      DYNMIG_ASSIGN_OR_RETURN(rule.models, StringList(v, kpath));
      if (rule.models.size() > MigModeSwitching::kMaxModels) {
        return FieldError(kpath, fmt::format("{} models; at most {}", rule.models.size(),
                                             MigModeSwitching::kMaxModels));
      }
      for (size_t i = 0; i < rule.models.size(); ++i) {
        const std::string& m = rule.models[i];
        if (m.empty() || m.size() > MigModeSwitching::kMaxModelLength) {
          return FieldError(fmt::format("{}[{}]", kpath, i),
                            fmt::format("must be 1 to {} characters of an NVML name, such as "
                                        "\"H100\", got {} characters",
                                        MigModeSwitching::kMaxModelLength, m.size()));
        }
      }
    } else if (key == "nodeSelector") {
      if (v.IsNull()) continue;
      if (!v.IsMap()) {
        return FieldError(kpath, fmt::format("must be a mapping of node labels, such as "
                                             "{{pool: flex}}, got {}",
                                             Describe(v)));
      }
      for (auto l = v.begin(); l != v.end(); ++l) {
        if (rule.node_selector.size() == MigModeSwitching::kMaxSelectorLabels) {
          return FieldError(
              kpath, fmt::format("more than {} labels", MigModeSwitching::kMaxSelectorLabels));
        }
        if (!l->first.IsScalar() || !l->second.IsScalar()) {
          return FieldError(kpath, fmt::format("label {}: key and value must be strings, got {}",
                                               Describe(l->first), Describe(l->second)));
        }
        const std::string lkey = l->first.Scalar();
        const std::string lvalue = l->second.Scalar();
        if (auto st = ValidateLabelKey(lkey); !st.ok())
          return FieldError(kpath, std::string(st.message()));
        if (auto st = ValidateLabelValue(lvalue); !st.ok()) {
          return FieldError(fmt::format("{}.{}", kpath, lkey), std::string(st.message()));
        }
        rule.node_selector.emplace_back(lkey, lvalue);
      }
    } else {
      return FieldError(path, fmt::format("unknown key {}; the keys are models and nodeSelector",
                                          Describe(it->first)));
    }
  }
  return rule;
}

// nvidia.migModeSwitching: {enabled, minModeDuration, rules}. Strict like migWarmInstances.
absl::StatusOr<MigModeSwitching> ParseMigModeSwitching(const YAML::Node& n) {
  MigModeSwitching sw;
  if (!n.IsDefined() || n.IsNull()) return sw;
  if (!n.IsMap()) {
    return FieldError(kSwitchPath, fmt::format("must be a mapping such as {{enabled: true, rules: "
                                               "[{{models: [H100]}}]}}, got {}",
                                               Describe(n)));
  }
  sw.present = true;
  sw.enabled = true;
  for (auto it = n.begin(); it != n.end(); ++it) {
    const std::string key = SwitchKey(it);
    const std::string path = fmt::format("{}.{}", kSwitchPath, key);
    const YAML::Node v = it->second;
    if (key == "enabled") {
      DYNMIG_ASSIGN_OR_RETURN(sw.enabled, SwitchBool(v, path));
    } else if (key == "minModeDuration") {
      absl::Duration d;
      if (!v.IsScalar() || !absl::ParseDuration(v.Scalar(), &d)) {
        return FieldError(
            path, fmt::format("must be a duration such as 90s, 10m or 1h, got {}", Describe(v)));
      }
      if (d < MigModeSwitching::kMinMinModeDuration || d > MigModeSwitching::kMaxMinModeDuration) {
        return FieldError(
            path,
            fmt::format("must be between {} and {}, got {}",
                        absl::FormatDuration(MigModeSwitching::kMinMinModeDuration),
                        absl::FormatDuration(MigModeSwitching::kMaxMinModeDuration), v.Scalar()));
      }
      sw.min_mode_duration = d;
    } else if (key == "rules") {
      DYNMIG_ASSIGN_OR_RETURN(auto items, SequenceItems(v, path));
      if (items.size() > MigModeSwitching::kMaxRules) {
        return FieldError(
            path, fmt::format("{} rules; at most {}", items.size(), MigModeSwitching::kMaxRules));
      }
      for (size_t i = 0; i < items.size(); ++i) {
        DYNMIG_ASSIGN_OR_RETURN(auto rule,
                                ParseSwitchRule(items[i], fmt::format("{}[{}]", path, i)));
        sw.rules.push_back(std::move(rule));
      }
    } else {
      return FieldError(kSwitchPath, fmt::format("unknown key {}; the keys are enabled, "
                                                 "minModeDuration and rules",
                                                 Describe(it->first)));
    }
  }
  return sw;
}

absl::StatusOr<DeviceConfig> ParseNvidia(const YAML::Node& root) {
  if (!root.IsDefined() || root.IsNull()) {
    return absl::InvalidArgumentError("device-config.yaml: the document is empty");
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        fmt::format("device-config.yaml: must be a mapping, got {}", Describe(root)));
  }
  const YAML::Node nvidia = Child(root, "nvidia");
  if (!nvidia.IsDefined() || nvidia.IsNull()) {
    return absl::InvalidArgumentError("nvidia: section is missing");
  }
  if (!nvidia.IsMap()) {
    return FieldError("nvidia", fmt::format("must be a mapping, got {}", Describe(nvidia)));
  }
  DeviceConfig cfg;
  DYNMIG_RETURN_IF_ERROR(ParseResourceName(nvidia, "resourceCountName", cfg.resources.count));
  DYNMIG_RETURN_IF_ERROR(ParseResourceName(nvidia, "resourceMemoryName", cfg.resources.memory));
  DYNMIG_RETURN_IF_ERROR(
      ParseResourceName(nvidia, "resourceMemoryPercentageName", cfg.resources.memory_percentage));
  DYNMIG_RETURN_IF_ERROR(ParseResourceName(nvidia, "resourceCoreName", cfg.resources.cores));
  DYNMIG_ASSIGN_OR_RETURN(cfg.resources.default_count,
                          UintValue(Child(nvidia, "defaultGPUNum"), "nvidia.defaultGPUNum",
                                    cfg.resources.default_count));

  std::string match;
  DYNMIG_RETURN_IF_ERROR(ParseResourceName(nvidia, "migMemoryMatch", match));
  if (match == "nvml") {
    cfg.memory_match = mig::MemoryMatch::kNvml;
  } else if (!match.empty() && match != "nominal") {
    return FieldError("nvidia.migMemoryMatch",
                      fmt::format("must be \"nominal\" (a profile covers the GB of its name) or "
                                  "\"nvml\" (the memory NVML reports), got \"{}\"",
                                  match));
  }

  DYNMIG_ASSIGN_OR_RETURN(cfg.warm_instances,
                          ParseWarmInstances(Child(nvidia, "migWarmInstances")));
  DYNMIG_ASSIGN_OR_RETURN(cfg.mig_mode_switching,
                          ParseMigModeSwitching(Child(nvidia, "migModeSwitching")));

  const YAML::Node allowlist = Child(nvidia, "migProfileAllowlist");
  DYNMIG_ASSIGN_OR_RETURN(auto entries, SequenceItems(allowlist, kAllowlistPath));
  for (size_t i = 0; i < entries.size(); ++i) {
    DYNMIG_ASSIGN_OR_RETURN(
        auto e, ParseAllowlistEntry(entries[i], fmt::format("{}[{}]", kAllowlistPath, i)));
    cfg.allowlist.entries.push_back(std::move(e));
  }
  DYNMIG_RETURN_IF_ERROR(cfg.allowlist.Validate(kAllowlistPath));

  const YAML::Node legacy = Child(nvidia, "knownMigGeometries");
  DYNMIG_ASSIGN_OR_RETURN(auto legacy_entries, SequenceItems(legacy, kLegacyPath));
  for (size_t i = 0; i < legacy_entries.size(); ++i) {
    DYNMIG_ASSIGN_OR_RETURN(
        auto e, ParseLegacyEntry(legacy_entries[i], fmt::format("{}[{}]", kLegacyPath, i)));
    cfg.legacy_geometries.push_back(std::move(e));
  }

  if (!cfg.legacy_geometries.empty()) {
    cfg.warnings.push_back(fmt::format(
        "{}: legacy geometries are not used by dynamic MIG; convert them with `dynmig config "
        "migrate`",
        kLegacyPath));
  }
  if (cfg.allowlist.entries.empty()) {
    cfg.warnings.push_back(
        fmt::format("{}: no allowlist: no MIG profile will be offered on any GPU", kAllowlistPath));
  }
  return cfg;
}

// Counts documents without building them. yaml-cpp's LoadAll never returns on some invalid input
// (found by fuzzing): its parser keeps reporting a new, empty document at the same place, and
// LoadAll keeps allocating. A document that starts where the previous one started is that case.
class DocumentCounter : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> starts;

  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

absl::Status YamlError(const YAML::Mark& mark, std::string_view message) {
  if (mark.is_null()) {
    return absl::InvalidArgumentError(fmt::format("device-config.yaml: invalid YAML: {}", message));
  }
  return absl::InvalidArgumentError(
      fmt::format("device-config.yaml: invalid YAML at line {}, column {}: {}", mark.line + 1,
                  mark.column + 1, message));
}

absl::StatusOr<YAML::Node> LoadYaml(std::string_view yaml) {
  try {
    std::istringstream in{std::string(yaml)};
    YAML::Parser parser(in);
    DocumentCounter counter;
    while (parser.HandleNextDocument(counter)) {
      const auto& s = counter.starts;
      if (s.size() >= 2 && s[s.size() - 1].pos == s[s.size() - 2].pos) {
        return YamlError(s.back(), "the parser cannot get past this point");
      }
    }
    if (counter.starts.size() > 1) {
      return absl::InvalidArgumentError(
          fmt::format("device-config.yaml: {} YAML documents in one file; expected one",
                      counter.starts.size()));
    }
    if (counter.starts.empty()) return YAML::Node();
    return YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return YamlError(e.mark, e.msg);
  }
}

// A scalar that emits double-quoted, like the quoted strings of HAMi's chart.
YAML::Node QuotedScalar(const std::string& value) {
  YAML::Node n(value);
  n.SetTag("!");
  return n;
}

YAML::Node AllowlistNode(const mig::Allowlist& allowlist) {
  YAML::Node seq(YAML::NodeType::Sequence);
  for (const auto& e : allowlist.entries) {
    YAML::Node entry(YAML::NodeType::Map);
    YAML::Node models(YAML::NodeType::Sequence);
    for (const auto& m : e.models) models.push_back(QuotedScalar(m));
    models.SetStyle(YAML::EmitterStyle::Flow);
    YAML::Node profiles(YAML::NodeType::Sequence);
    for (const auto& p : e.profiles) profiles.push_back(QuotedScalar(p));
    profiles.SetStyle(YAML::EmitterStyle::Flow);
    entry["models"] = models;
    entry["profiles"] = profiles;
    seq.push_back(entry);
  }
  return seq;
}

// Emits a node tree keeping what yaml-cpp's own emitter loses: scalars that were quoted in the
// input stay quoted (so "true" stays a string), explicit tags stay, flow collections stay flow.
// Anchors and aliases are expanded.
void EmitNode(YAML::Emitter& e, const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Scalar: {
      const std::string& tag = n.Tag();
      if (!tag.empty() && tag != "?" && tag != "!") e << YAML::VerbatimTag(tag);
      if (tag == "!") {
        e << (n.Scalar().find('\n') != std::string::npos ? YAML::Literal : YAML::DoubleQuoted);
      }
      e << n.Scalar();
      break;
    }
    case YAML::NodeType::Sequence:
      if (n.Style() == YAML::EmitterStyle::Flow) e << YAML::Flow;
      e << YAML::BeginSeq;
      for (const auto& item : n) EmitNode(e, item);
      e << YAML::EndSeq;
      break;
    case YAML::NodeType::Map:
      if (n.Style() == YAML::EmitterStyle::Flow) e << YAML::Flow;
      e << YAML::BeginMap;
      for (auto it = n.begin(); it != n.end(); ++it) {
        e << YAML::Key;
        EmitNode(e, it->first);
        e << YAML::Value;
        EmitNode(e, it->second);
      }
      e << YAML::EndMap;
      break;
    default:
      e << YAML::Null;
      break;
  }
}

// Whether entry `a`'s models would steal a board of entry `b` (first match wins).
bool Shadows(const mig::AllowlistEntry& a, const std::vector<std::string>& b_boards) {
  for (const auto& m : a.models) {
    for (const auto& board : b_boards) {
      if (board.find(m) != std::string::npos) return true;
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<DeviceConfig> ParseDeviceConfig(std::string_view yaml) {
  try {
    DYNMIG_ASSIGN_OR_RETURN(YAML::Node root, LoadYaml(yaml));
    return ParseNvidia(root);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(fmt::format("device-config.yaml: {}", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(fmt::format("device-config.yaml: {}", e.what()));
  }
}

absl::StatusOr<DeviceConfig> LoadDeviceConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string why = fmt::format("cannot read {}: {}", path, std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(why);
    if (err == EACCES) return absl::PermissionDeniedError(why);
    return absl::InvalidArgumentError(why);
  }
  std::stringstream buf;
  buf << in.rdbuf();
  auto cfg = ParseDeviceConfig(buf.str());
  if (!cfg.ok()) return Annotate(cfg.status(), path);
  return cfg;
}

mig::Allowlist DefaultAllowlist() {
  struct Item {
    mig::AllowlistEntry entry;
    std::vector<std::string> boards;
  };
  std::vector<Item> items;
  for (const auto& m : mig::Catalogue()) {
    Item item;
    for (const auto& n : m.names) {
      std::string_view name = n;
      if (name.starts_with("NVIDIA ")) name.remove_prefix(7);
      item.entry.models.emplace_back(name);
      item.boards.push_back(n);
    }
    // HAMi's chart default: the base profiles (1g, 2g, 3g, 4g, 7g), without the variants and
    // without the double-memory 1g (NVML index 9, 1_SLICE_REV2: 1g.10gb on an A100-40GB), which
    // would otherwise take every request between 1g and 2g memory with one compute slice.
    constexpr uint32_t kOneSliceRev2 = 9;
    for (const auto& p : m.capability.profiles) {
      auto parsed = mig::ParseProfileName(p.name);
      if (parsed.ok() && parsed->suffix.empty() && p.nvml_index != kOneSliceRev2) {
        item.entry.profiles.push_back(p.name);
      }
    }
    mig::SortProfileNamesBySize(item.entry.profiles);
    items.push_back(std::move(item));
  }
  // Kahn's algorithm, stable on catalogue order: entry i waits for every entry j whose boards
  // i's models would match.
  std::vector<bool> placed(items.size(), false);
  mig::Allowlist out;
  while (out.entries.size() < items.size()) {
    bool progress = false;
    for (size_t i = 0; i < items.size(); ++i) {
      if (placed[i]) continue;
      bool blocked = false;
      for (size_t j = 0; j < items.size() && !blocked; ++j) {
        if (j != i && !placed[j] && Shadows(items[i].entry, items[j].boards)) blocked = true;
      }
      if (blocked) continue;
      placed[i] = true;
      out.entries.push_back(items[i].entry);
      progress = true;
      break;
    }
    if (!progress) {  // mutual shadowing: keep catalogue order for the rest
      for (size_t i = 0; i < items.size(); ++i) {
        if (!placed[i]) {
          placed[i] = true;
          out.entries.push_back(items[i].entry);
        }
      }
    }
  }
  return out;
}

std::string DefaultDeviceConfigYaml() {
  const ResourceNames names;
  YAML::Emitter e;
  e << YAML::Comment(
           "dynmig default device-config.yaml (generated by `dynmig config default`).\n"
           "HAMi resource names and a MIG profile allowlist for every catalogued GPU model:\n"
           "base profiles, smallest first. Models are NVML name substrings; the first\n"
           "matching entry wins. Trim each list to the profiles your cluster should offer.")
    << YAML::Newline;
  e << YAML::BeginMap << YAML::Key << "nvidia" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "resourceCountName" << YAML::Value << names.count;
  e << YAML::Key << "resourceMemoryName" << YAML::Value << names.memory;
  e << YAML::Key << "resourceMemoryPercentageName" << YAML::Value << names.memory_percentage;
  e << YAML::Key << "resourceCoreName" << YAML::Value << names.cores;
  e << YAML::Key << "defaultGPUNum" << YAML::Value << names.default_count;
  e << YAML::Key << "migMemoryMatch" << YAML::Value << "nominal";
  e << YAML::Key << "migProfileAllowlist" << YAML::Value << YAML::BeginSeq;
  for (const auto& entry : DefaultAllowlist().entries) {
    e << YAML::BeginMap;
    e << YAML::Key << "models" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (const auto& m : entry.models) e << YAML::DoubleQuoted << m;
    e << YAML::EndSeq;
    e << YAML::Key << "profiles" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (const auto& p : entry.profiles) e << YAML::DoubleQuoted << p;
    e << YAML::EndSeq;
    e << YAML::EndMap;
  }
  e << YAML::EndSeq << YAML::EndMap << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

absl::StatusOr<ConfigMigration> MigrateDeviceConfig(std::string_view yaml) {
  DYNMIG_ASSIGN_OR_RETURN(DeviceConfig cfg, ParseDeviceConfig(yaml));
  ConfigMigration out;
  try {
    DYNMIG_ASSIGN_OR_RETURN(YAML::Node root, LoadYaml(yaml));
    const YAML::Node nvidia = Child(root, "nvidia");
    const bool has_legacy_key = Child(nvidia, "knownMigGeometries").IsDefined();
    const bool has_allowlist_key = Child(nvidia, "migProfileAllowlist").IsDefined();
    if (!has_legacy_key) {
      out.yaml = std::string(yaml);
      out.report.push_back(
          fmt::format("nothing to migrate: there is no {}; the file is unchanged", kLegacyPath));
      return out;
    }

    const mig::LegacyConversion conv = mig::ConvertLegacyGeometries(cfg.legacy_geometries);
    for (auto& line : conv.Lines()) out.report.push_back(std::move(line));

    mig::Allowlist merged = cfg.allowlist;
    const bool merging = !cfg.allowlist.entries.empty();
    if (merging) {
      out.report.push_back(fmt::format(
          "{} already exists: its {} entr{} are kept unchanged; legacy entries are added only for "
          "models it does not name",
          kAllowlistPath, cfg.allowlist.entries.size(),
          cfg.allowlist.entries.size() == 1 ? "y" : "ies"));
    }
    for (const auto& r : conv.reports) {
      if (r.models.empty() || r.profiles.empty()) continue;
      std::vector<std::string> remaining;
      for (const auto& m : r.models) {
        bool named = false;
        for (const auto& e : cfg.allowlist.entries) {
          if (std::find(e.models.begin(), e.models.end(), m) != e.models.end()) named = true;
        }
        if (named) {
          const mig::AllowlistEntry* existing = cfg.allowlist.Match(m);
          out.report.push_back(
              fmt::format("{}: model \"{}\" is already in {} with profiles [{}]; legacy profiles "
                          "[{}] not added",
                          r.path, m, kAllowlistPath,
                          existing ? fmt::format("{}", fmt::join(existing->profiles, ", ")) : "",
                          fmt::join(r.profiles, ", ")));
        } else if (std::find(remaining.begin(), remaining.end(), m) == remaining.end()) {
          remaining.push_back(m);
        }
      }
      if (remaining.empty()) continue;
      merged.entries.push_back(mig::AllowlistEntry{remaining, r.profiles});
      out.report.push_back(fmt::format("{}: {} entry for models [{}] with profiles [{}]", r.path,
                                       merging ? "appended an" : "wrote an",
                                       fmt::join(remaining, ", "), fmt::join(r.profiles, ", ")));
    }
    if (merged.entries.empty()) {
      out.report.push_back(fmt::format(
          "warning: no profile survived the conversion; {} is empty and no MIG profile will be "
          "offered",
          kAllowlistPath));
    }

    // Rebuild the nvidia mapping in its original key order, the allowlist taking the place of the
    // legacy key (or of the existing allowlist).
    YAML::Node rebuilt(YAML::NodeType::Map);
    const YAML::Node allowlist_node = AllowlistNode(merged);
    for (auto it = nvidia.begin(); it != nvidia.end(); ++it) {
      const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
      if (key == "knownMigGeometries") {
        if (!has_allowlist_key) rebuilt["migProfileAllowlist"] = allowlist_node;
      } else if (key == "migProfileAllowlist") {
        rebuilt["migProfileAllowlist"] = allowlist_node;
      } else {
        rebuilt[it->first] = it->second;
      }
    }
    root["nvidia"] = rebuilt;

    YAML::Emitter emitter;
    EmitNode(emitter, root);
    if (!emitter.good()) {
      return absl::InternalError(
          fmt::format("cannot emit the migrated YAML: {}", emitter.GetLastError()));
    }
    out.yaml = std::string(emitter.c_str()) + "\n";
    out.changed = true;
    if (yaml.find('#') != std::string_view::npos) {
      out.report.push_back("note: comments of the input are not preserved in the output");
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(fmt::format("device-config.yaml: {}", e.what()));
  }
  // The output must be a valid config without legacy geometries.
  auto check = ParseDeviceConfig(out.yaml);
  if (!check.ok()) {
    return absl::InternalError(fmt::format("the migrated config does not validate: {}",
                                           std::string(check.status().message())));
  }
  return out;
}

}  // namespace dynmig::protocol
