#include "kube/selector.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <set>

#include "common/strings.h"

namespace dynmig::kube {
namespace {

// Splits on commas that are not inside parentheses.
absl::StatusOr<std::vector<std::string>> SplitTopLevel(std::string_view text) {
  std::vector<std::string> parts;
  int depth = 0;
  std::string current;
  for (char c : text) {
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (depth < 0) {
      return absl::InvalidArgumentError(fmt::format("unbalanced ')' in selector '{}'", text));
    }
    if (c == ',' && depth == 0) {
      parts.push_back(current);
      current.clear();
    } else {
      current.push_back(c);
    }
  }
  if (depth != 0) {
    return absl::InvalidArgumentError(fmt::format("unbalanced '(' in selector '{}'", text));
  }
  parts.push_back(current);
  return parts;
}

bool IsKeyChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
         c == '/';
}

bool ValidKey(std::string_view key) {
  return !key.empty() && key.size() <= 317 && std::all_of(key.begin(), key.end(), IsKeyChar);
}

bool ValidValue(std::string_view value) {
  return value.size() <= 63 && std::all_of(value.begin(), value.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
         });
}

bool ParseInt(std::string_view s, int64_t* out) {
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

const std::set<std::string, std::less<>>& SupportedFields(Resource resource) {
  static const auto* const kPods = new std::set<std::string, std::less<>>{
      "metadata.name",      "metadata.namespace", "spec.nodeName",
      "spec.schedulerName", "spec.restartPolicy", "spec.serviceAccountName",
      "status.phase",       "status.podIP",       "status.nominatedNodeName",
      "spec.hostNetwork"};
  static const auto* const kNodes =
      new std::set<std::string, std::less<>>{"metadata.name", "spec.unschedulable"};
  static const auto* const kEvents =
      new std::set<std::string, std::less<>>{"metadata.name",
                                             "metadata.namespace",
                                             "involvedObject.kind",
                                             "involvedObject.namespace",
                                             "involvedObject.name",
                                             "involvedObject.uid",
                                             "involvedObject.apiVersion",
                                             "involvedObject.resourceVersion",
                                             "involvedObject.fieldPath",
                                             "reason",
                                             "reportingComponent",
                                             "source",
                                             "type"};
  static const auto* const kNamespaces =
      new std::set<std::string, std::less<>>{"metadata.name", "status.phase"};
  static const auto* const kDefault =
      new std::set<std::string, std::less<>>{"metadata.name", "metadata.namespace"};
  switch (resource) {
    case Resource::kPods:
      return *kPods;
    case Resource::kNodes:
      return *kNodes;
    case Resource::kEvents:
      return *kEvents;
    case Resource::kNamespaces:
      return *kNamespaces;
    case Resource::kLeases:
    case Resource::kConfigMaps:
    case Resource::kPodDisruptionBudgets:
    case Resource::kPodDisruptionBudgetsV1beta1:
    case Resource::kReplicaSets:
      return *kDefault;
  }
  return *kDefault;
}

}  // namespace

absl::StatusOr<LabelSelector> LabelSelector::Parse(std::string_view text) {
  LabelSelector selector;
  if (Trim(text).empty()) return selector;
  auto parts = SplitTopLevel(text);
  if (!parts.ok()) return parts.status();
  for (const std::string& raw : *parts) {
    std::string_view s = Trim(raw);
    if (s.empty()) {
      return absl::InvalidArgumentError(
          fmt::format("empty requirement in label selector '{}'", text));
    }
    Requirement req;
    if (s.front() == '!') {
      req.key = std::string(Trim(s.substr(1)));
      req.op = Op::kDoesNotExist;
      if (!ValidKey(req.key)) {
        return absl::InvalidArgumentError(
            fmt::format("invalid label key '{}' in selector '{}'", req.key, text));
      }
      selector.requirements_.push_back(std::move(req));
      continue;
    }
    size_t i = 0;
    while (i < s.size() && IsKeyChar(s[i])) ++i;
    req.key = std::string(s.substr(0, i));
    if (!ValidKey(req.key)) {
      return absl::InvalidArgumentError(
          fmt::format("invalid label key in requirement '{}' of selector '{}'", s, text));
    }
    std::string_view rest = Trim(s.substr(i));
    auto single_value = [&](size_t op_len, Op op) -> absl::Status {
      std::string_view value = Trim(rest.substr(op_len));
      if (!ValidValue(value)) {
        return absl::InvalidArgumentError(
            fmt::format("invalid label value '{}' in selector '{}'", value, text));
      }
      req.op = op;
      req.values = {std::string(value)};
      return absl::OkStatus();
    };
    absl::Status st;
    if (rest.empty()) {
      req.op = Op::kExists;
    } else if (rest.rfind("==", 0) == 0) {
      st = single_value(2, Op::kEquals);
    } else if (rest.rfind("!=", 0) == 0) {
      st = single_value(2, Op::kNotEquals);
    } else if (rest.rfind("=", 0) == 0) {
      st = single_value(1, Op::kEquals);
    } else if (rest.front() == '>' || rest.front() == '<') {
      st = single_value(1, rest.front() == '>' ? Op::kGreater : Op::kLess);
      int64_t unused = 0;
      if (st.ok() && !ParseInt(req.values[0], &unused)) {
        return absl::InvalidArgumentError(
            fmt::format("label selector '{}': '{}' needs an integer value", text, req.values[0]));
      }
    } else {
      Op op;
      std::string_view set;
      if (rest.rfind("notin", 0) == 0) {
        op = Op::kNotIn;
        set = Trim(rest.substr(5));
      } else if (rest.rfind("in", 0) == 0) {
        op = Op::kIn;
        set = Trim(rest.substr(2));
      } else {
        return absl::InvalidArgumentError(
            fmt::format("unknown operator in requirement '{}' of label selector '{}'", s, text));
      }
      if (set.size() < 2 || set.front() != '(' || set.back() != ')') {
        return absl::InvalidArgumentError(fmt::format(
            "label selector '{}': set in requirement '{}' must be '(a,b,...)'", text, s));
      }
      req.op = op;
      std::string_view inner = set.substr(1, set.size() - 2);
      size_t start = 0;
      while (true) {
        const size_t comma = inner.find(',', start);
        std::string_view value = Trim(inner.substr(start, comma - start));
        if (!ValidValue(value)) {
          return absl::InvalidArgumentError(
              fmt::format("invalid label value '{}' in selector '{}'", value, text));
        }
        req.values.emplace_back(value);
        if (comma == std::string_view::npos) break;
        start = comma + 1;
      }
    }
    if (!st.ok()) return st;
    selector.requirements_.push_back(std::move(req));
  }
  return selector;
}

absl::StatusOr<LabelSelector> LabelSelector::FromObject(const Object& selector) {
  if (!selector.is_object()) {
    return absl::InvalidArgumentError("a label selector must be a JSON object");
  }
  LabelSelector out;
  auto labels = selector.find("matchLabels");
  if (labels != selector.end() && !labels->is_null()) {
    if (!labels->is_object()) {
      return absl::InvalidArgumentError("selector.matchLabels must be an object");
    }
    for (const auto& [key, value] : labels->items()) {
      if (!ValidKey(key) || !value.is_string() || !ValidValue(value.get<std::string>())) {
        return absl::InvalidArgumentError(
            fmt::format("selector.matchLabels: invalid label '{}'", key.substr(0, 100)));
      }
      out.requirements_.push_back({key, Op::kEquals, {value.get<std::string>()}});
      if (out.requirements_.size() > kMaxObjectRequirements) break;
    }
  }
  auto expressions = selector.find("matchExpressions");
  if (expressions != selector.end() && !expressions->is_null()) {
    if (!expressions->is_array()) {
      return absl::InvalidArgumentError("selector.matchExpressions must be an array");
    }
    for (const Object& e : *expressions) {
      if (out.requirements_.size() > kMaxObjectRequirements) break;
      const std::string key = e.is_object() ? StringAt(e, "/key") : "";
      const std::string op = e.is_object() ? StringAt(e, "/operator") : "";
      if (!ValidKey(key)) {
        return absl::InvalidArgumentError(
            fmt::format("selector.matchExpressions: invalid key '{}'", key.substr(0, 100)));
      }
      Requirement req{key, Op::kIn, {}};
      if (op == "In") {
        req.op = Op::kIn;
      } else if (op == "NotIn") {
        req.op = Op::kNotIn;
      } else if (op == "Exists") {
        req.op = Op::kExists;
      } else if (op == "DoesNotExist") {
        req.op = Op::kDoesNotExist;
      } else {
        return absl::InvalidArgumentError(fmt::format(
            "selector.matchExpressions: operator '{}' is not In, NotIn, Exists or DoesNotExist",
            op.substr(0, 100)));
      }
      auto values = e.find("values");
      const bool has_values = values != e.end() && values->is_array() && !values->empty();
      if ((req.op == Op::kIn || req.op == Op::kNotIn) != has_values) {
        return absl::InvalidArgumentError(fmt::format("selector.matchExpressions: '{}' {} values",
                                                      key, has_values ? "must have no" : "needs"));
      }
      if (has_values) {
        if (values->size() > kMaxObjectRequirements) {
          return absl::InvalidArgumentError(fmt::format(
              "selector.matchExpressions: more than {} values", kMaxObjectRequirements));
        }
        for (const Object& v : *values) {
          if (!v.is_string() || !ValidValue(v.get<std::string>())) {
            return absl::InvalidArgumentError(
                fmt::format("selector.matchExpressions: invalid value for '{}'", key));
          }
          req.values.push_back(v.get<std::string>());
        }
      }
      out.requirements_.push_back(std::move(req));
    }
  }
  if (out.requirements_.size() > kMaxObjectRequirements) {
    return absl::InvalidArgumentError(
        fmt::format("the selector has more than {} requirements", kMaxObjectRequirements));
  }
  return out;
}

bool LabelSelector::MatchesLookup(
    const std::function<const std::string*(const std::string&)>& lookup) const {
  for (const Requirement& req : requirements_) {
    const std::string* value = lookup(req.key);
    switch (req.op) {
      case Op::kEquals:
        if (value == nullptr || *value != req.values[0]) return false;
        break;
      case Op::kNotEquals:
        if (value != nullptr && *value == req.values[0]) return false;
        break;
      case Op::kIn:
        if (value == nullptr ||
            std::find(req.values.begin(), req.values.end(), *value) == req.values.end()) {
          return false;
        }
        break;
      case Op::kNotIn:
        if (value != nullptr &&
            std::find(req.values.begin(), req.values.end(), *value) != req.values.end()) {
          return false;
        }
        break;
      case Op::kExists:
        if (value == nullptr) return false;
        break;
      case Op::kDoesNotExist:
        if (value != nullptr) return false;
        break;
      case Op::kGreater:
      case Op::kLess: {
        int64_t have = 0;
        int64_t want = 0;
        if (value == nullptr || !ParseInt(*value, &have) || !ParseInt(req.values[0], &want)) {
          return false;
        }
        if (req.op == Op::kGreater ? !(have > want) : !(have < want)) return false;
        break;
      }
    }
  }
  return true;
}

bool LabelSelector::Matches(const std::map<std::string, std::string>& labels) const {
  return MatchesLookup([&](const std::string& key) -> const std::string* {
    auto it = labels.find(key);
    return it == labels.end() ? nullptr : &it->second;
  });
}

bool LabelSelector::Matches(const Object& obj) const {
  if (requirements_.empty()) return true;
  const Object* labels = nullptr;
  if (obj.is_object()) {
    auto meta = obj.find("metadata");
    if (meta != obj.end() && meta->is_object()) {
      auto l = meta->find("labels");
      if (l != meta->end() && l->is_object()) labels = &*l;
    }
  }
  return MatchesLookup([&](const std::string& key) -> const std::string* {
    if (labels == nullptr) return nullptr;
    auto it = labels->find(key);
    if (it == labels->end() || !it->is_string()) return nullptr;
    return it->get_ptr<const std::string*>();
  });
}

std::string FieldValue(const Object& obj, std::string_view field) {
  const Object* cur = &obj;
  size_t start = 0;
  while (true) {
    const size_t dot = field.find('.', start);
    std::string_view part = field.substr(start, dot - start);
    if (!cur->is_object()) return "";
    auto it = cur->find(part);
    if (it == cur->end()) {
      // Unset booleans read as "false" (e.g. spec.unschedulable).
      return field == "spec.unschedulable" || field == "spec.hostNetwork" ? "false" : "";
    }
    cur = &*it;
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  if (cur->is_string()) return cur->get<std::string>();
  if (cur->is_boolean()) return cur->get<bool>() ? "true" : "false";
  if (cur->is_number()) return cur->dump();
  return "";
}

absl::StatusOr<FieldSelector> FieldSelector::Parse(std::string_view text, Resource resource) {
  FieldSelector selector;
  if (Trim(text).empty()) return selector;
  const auto& supported = SupportedFields(resource);
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    std::string_view s = Trim(text.substr(start, comma - start));
    Requirement req;
    size_t op_pos = s.find("!=");
    size_t op_len = 2;
    req.negate = true;
    if (op_pos == std::string_view::npos) {
      req.negate = false;
      op_pos = s.find("==");
      if (op_pos == std::string_view::npos) {
        op_pos = s.find('=');
        op_len = 1;
      }
    }
    if (op_pos == std::string_view::npos) {
      return absl::InvalidArgumentError(
          fmt::format("invalid field selector requirement '{}': expected field=value, "
                      "field==value or field!=value",
                      s));
    }
    req.field = std::string(Trim(s.substr(0, op_pos)));
    req.value = std::string(Trim(s.substr(op_pos + op_len)));
    if (supported.find(req.field) == supported.end()) {
      return absl::InvalidArgumentError(fmt::format("field label not supported: {} (resource {})",
                                                    req.field, ResourceName(resource)));
    }
    selector.requirements_.push_back(std::move(req));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return selector;
}

bool FieldSelector::Matches(const Object& obj) const {
  for (const Requirement& req : requirements_) {
    const bool equal = FieldValue(obj, req.field) == req.value;
    if (equal == req.negate) return false;
  }
  return true;
}

std::optional<std::string> FieldSelector::EqualsValue(std::string_view field) const {
  for (const Requirement& req : requirements_) {
    if (!req.negate && req.field == field) return req.value;
  }
  return std::nullopt;
}

}  // namespace dynmig::kube
