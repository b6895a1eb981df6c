#include "scheduler/extender_api.h"

#include <cctype>

#include "common/bounded_json.h"
#include "fmt/format.h"

namespace dynmig::scheduler {
namespace {

using nlohmann::json;

bool EqualFold(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<json> ParseBody(std::string_view body, const JsonLimits& limits,
                               std::string_view what) {
  auto doc = ParseBoundedJson(body, limits, what);
  if (!doc.ok()) return doc.status();
  if (!doc->is_object()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: the request body must be a JSON object", what));
  }
  return doc;
}

absl::StatusOr<std::string> StringField(const json& doc, std::string_view key,
                                        std::string_view what, bool required) {
  const json* v = FieldCaseInsensitive(doc, key);
  if (v == nullptr || v->is_null()) {
    if (required) return absl::InvalidArgumentError(fmt::format("{}: {} is missing", what, key));
    return std::string();
  }
  if (!v->is_string()) {
    return absl::InvalidArgumentError(fmt::format("{}: {} must be a string", what, key));
  }
  std::string s = v->get<std::string>();
  if (required && s.empty()) {
    return absl::InvalidArgumentError(fmt::format("{}: {} is empty", what, key));
  }
  return s;
}

std::string NodeItemName(const json& item) {
  if (!item.is_object()) return "";
  const auto meta = item.find("metadata");
  if (meta == item.end() || !meta->is_object()) return "";
  const auto name = meta->find("name");
  return (name != meta->end() && name->is_string()) ? name->get<std::string>() : "";
}

}  // namespace

const json* FieldCaseInsensitive(const json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto exact = obj.find(std::string(key));
  if (exact != obj.end()) return &*exact;
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (EqualFold(it.key(), key)) return &it.value();
  }
  return nullptr;
}

std::shared_ptr<const std::vector<std::string>> NodeNamesCache::Find(std::string_view raw) const {
  dynmig::MutexLock lock(&mu_);
  if (names_ != nullptr && raw == raw_) return names_;
  return nullptr;
}

void NodeNamesCache::Store(std::string_view raw,
                           std::shared_ptr<const std::vector<std::string>> names) {
  dynmig::MutexLock lock(&mu_);
  raw_.assign(raw);
  names_ = std::move(names);
}

namespace {

// The members of a JSON object's text, located without parsing their values: key (raw, without
// quotes) and value text. nullopt for anything unusual (escaped keys, text that is not an object,
// unbalanced values): the caller then parses the whole text and reports what is wrong.
struct Member {
  std::string_view key;
  std::string_view value;
};

size_t SkipSpace(std::string_view t, size_t i) {
  while (i < t.size() && (t[i] == ' ' || t[i] == '\t' || t[i] == '\n' || t[i] == '\r')) ++i;
  return i;
}

// The end of the string starting at t[i] == '"' (one past the closing quote), or npos.
size_t SkipString(std::string_view t, size_t i) {
  for (++i; i < t.size(); ++i) {
    if (t[i] == '\\') {
      ++i;
    } else if (t[i] == '"') {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

size_t SkipValue(std::string_view t, size_t i) {
  if (i >= t.size()) return std::string_view::npos;
  if (t[i] == '"') return SkipString(t, i);
  if (t[i] == '{' || t[i] == '[') {
    int depth = 0;
    while (i < t.size()) {
      const char c = t[i];
      if (c == '"') {
        i = SkipString(t, i);
        if (i == std::string_view::npos) return i;
        continue;
      }
      if (c == '{' || c == '[') ++depth;
      if (c == '}' || c == ']') {
        if (--depth == 0) return i + 1;
      }
      ++i;
    }
    return std::string_view::npos;
  }
  while (i < t.size() && t[i] != ',' && t[i] != '}' && t[i] != ']' && t[i] != ' ' && t[i] != '\n' &&
         t[i] != '\r' && t[i] != '\t') {
    ++i;
  }
  return i;
}

std::optional<std::vector<Member>> LocateMembers(std::string_view t) {
  std::vector<Member> out;
  size_t i = SkipSpace(t, 0);
  if (i >= t.size() || t[i] != '{') return std::nullopt;
  i = SkipSpace(t, i + 1);
  if (i < t.size() && t[i] == '}')
    return SkipSpace(t, i + 1) == t.size() ? std::optional(out) : std::nullopt;
  while (i < t.size()) {
    if (t[i] != '"') return std::nullopt;
    const size_t key_end = SkipString(t, i);
    if (key_end == std::string_view::npos) return std::nullopt;
    const std::string_view key = t.substr(i + 1, key_end - i - 2);
    if (key.find('\\') != std::string_view::npos) return std::nullopt;
    i = SkipSpace(t, key_end);
    if (i >= t.size() || t[i] != ':') return std::nullopt;
    i = SkipSpace(t, i + 1);
    const size_t value_end = SkipValue(t, i);
    if (value_end == std::string_view::npos || value_end == i) return std::nullopt;
    out.push_back({key, t.substr(i, value_end - i)});
    i = SkipSpace(t, value_end);
    if (i >= t.size()) return std::nullopt;
    if (t[i] == '}') return SkipSpace(t, i + 1) == t.size() ? std::optional(out) : std::nullopt;
    if (t[i] != ',') return std::nullopt;
    i = SkipSpace(t, i + 1);
  }
  return std::nullopt;
}

// The fast path of ParseExtenderArgs; nullopt when the full parse must decide.
std::optional<ExtenderArgs> ParseExtenderArgsFast(std::string_view body, NodeNamesCache& cache) {
  auto members = LocateMembers(body);
  if (!members.has_value()) return std::nullopt;
  const Member* pod = nullptr;
  const Member* names = nullptr;
  for (const Member& m : *members) {
    const Member** slot = nullptr;
    if (EqualFold(m.key, "Pod")) {
      slot = &pod;
    } else if (EqualFold(m.key, "NodeNames")) {
      slot = &names;
    } else if (EqualFold(m.key, "Nodes")) {
      if (m.value != "null") return std::nullopt;  // the NodeList form: the full parse
      continue;
    } else if (!json::accept(m.value.begin(), m.value.end())) {  // no tree: no recursion
      return std::nullopt;
    } else {
      continue;
    }
    if (*slot != nullptr) return std::nullopt;  // a key twice: the full parse decides
    *slot = &m;
  }
  if (pod == nullptr || names == nullptr || names->value == "null") return std::nullopt;
  ExtenderArgs args;
  auto pod_doc = ParseBoundedJson(pod->value, kExtenderArgsJsonLimits, "ExtenderArgs.Pod");
  if (!pod_doc.ok() || !pod_doc->is_object()) return std::nullopt;
  args.pod = std::move(*pod_doc);
  args.shared_node_names = cache.Find(names->value);
  if (args.shared_node_names == nullptr) {
    auto names_doc =
        ParseBoundedJson(names->value, kExtenderArgsJsonLimits, "ExtenderArgs.NodeNames");
    if (!names_doc.ok() || !names_doc->is_array()) return std::nullopt;
    json& list = *names_doc;
    auto parsed = std::make_shared<std::vector<std::string>>();
    parsed->reserve(list.size());
    for (json& name : list) {
      if (!name.is_string()) return std::nullopt;
      parsed->push_back(std::move(name.get_ref<std::string&>()));
    }
    cache.Store(names->value, parsed);
    args.shared_node_names = std::move(parsed);
  }
  return args;
}

}  // namespace

absl::StatusOr<ExtenderArgs> ParseExtenderArgs(std::string_view body, NodeNamesCache* cache) {
  constexpr std::string_view kWhat = "ExtenderArgs";
  // Checked before the fast path, which parses pieces of this text.
  if (absl::Status st = CheckJsonLimits(body, kExtenderArgsJsonLimits, kWhat); !st.ok()) return st;
  if (cache != nullptr) {
    if (auto fast = ParseExtenderArgsFast(body, *cache); fast.has_value()) return std::move(*fast);
  }
  auto doc = ParseBody(body, kExtenderArgsJsonLimits, kWhat);
  if (!doc.ok()) return doc.status();
  ExtenderArgs args;
  // The parsed document is ours: move its parts out instead of copying them.
  json* pod = const_cast<json*>(FieldCaseInsensitive(*doc, "Pod"));
  if (pod == nullptr || pod->is_null()) {
    return absl::InvalidArgumentError("ExtenderArgs: Pod is missing");
  }
  if (!pod->is_object()) return absl::InvalidArgumentError("ExtenderArgs: Pod must be an object");
  args.pod = std::move(*pod);
  json* names = const_cast<json*>(FieldCaseInsensitive(*doc, "NodeNames"));
  if (names != nullptr && !names->is_null()) {
    if (!names->is_array()) {
      return absl::InvalidArgumentError("ExtenderArgs: NodeNames must be a list of node names");
    }
    args.node_names.reserve(names->size());
    for (size_t i = 0; i < names->size(); ++i) {
      json& name = (*names)[i];
      if (!name.is_string()) {
        return absl::InvalidArgumentError(
            fmt::format("ExtenderArgs: NodeNames[{}] must be a string", i));
      }
      args.node_names.push_back(std::move(name.get_ref<std::string&>()));
    }
    return args;
  }
  json* nodes = const_cast<json*>(FieldCaseInsensitive(*doc, "Nodes"));
  if (nodes != nullptr && !nodes->is_null()) {
    const json* items = FieldCaseInsensitive(*nodes, "items");
    if (!nodes->is_object() || (items != nullptr && !items->is_null() && !items->is_array())) {
      return absl::InvalidArgumentError("ExtenderArgs: Nodes must be a NodeList");
    }
    if (items != nullptr && items->is_array()) {
      for (const auto& item : *items) {
        std::string name = NodeItemName(item);
        if (!name.empty()) args.node_names.push_back(std::move(name));
      }
    }
    args.nodes = std::move(*nodes);
  }
  return args;
}

json ToJson(const ExtenderFilterResult& result) {
  json out = json::object();
  if (result.nodes.has_value()) {
    json list = *result.nodes;
    json items = json::array();
    const json* sent = FieldCaseInsensitive(*result.nodes, "items");
    if (sent != nullptr && sent->is_array()) {
      for (const auto& item : *sent) {
        const std::string name = NodeItemName(item);
        for (const auto& keep : result.node_names) {
          if (keep == name) {
            items.push_back(item);
            break;
          }
        }
      }
    }
    list["items"] = std::move(items);
    out["Nodes"] = std::move(list);
    out["NodeNames"] = nullptr;
  } else {
    out["Nodes"] = nullptr;
    out["NodeNames"] = result.node_names;
  }
  out["FailedNodes"] = result.failed_nodes;
  out["FailedAndUnresolvableNodes"] = result.failed_and_unresolvable_nodes;
  out["Error"] = result.error;
  return out;
}

absl::StatusOr<ExtenderBindingArgs> ParseExtenderBindingArgs(std::string_view body) {
  constexpr std::string_view kWhat = "ExtenderBindingArgs";
  auto doc = ParseBody(body, kExtenderBindingJsonLimits, kWhat);
  if (!doc.ok()) return doc.status();
  ExtenderBindingArgs args;
  auto name = StringField(*doc, "PodName", kWhat, true);
  if (!name.ok()) return name.status();
  auto ns = StringField(*doc, "PodNamespace", kWhat, true);
  if (!ns.ok()) return ns.status();
  auto uid = StringField(*doc, "PodUID", kWhat, false);
  if (!uid.ok()) return uid.status();
  auto node = StringField(*doc, "Node", kWhat, true);
  if (!node.ok()) return node.status();
  args.pod_name = std::move(*name);
  args.pod_namespace = std::move(*ns);
  args.pod_uid = std::move(*uid);
  args.node = std::move(*node);
  return args;
}

namespace {

void AppendQuoted(std::string& out, std::string_view s) {
  out += '"';
  // Runs of characters that need no escape are appended at once (node names and reasons are
  // plain text).
  size_t run = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(s.data() + run, i - run);
    run = i + 1;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    }
  }
  out.append(s.data() + run, s.size() - run);
  out += '"';
}

void AppendMap(std::string& out, const std::map<std::string, std::string>& map) {
  out += '{';
  bool first = true;
  // Thousands of failed nodes share a reason ("another node was chosen for this pod"): a value
  // equal to the previous one copies its quoted form.
  const std::string* prev = nullptr;
  size_t prev_at = 0, prev_len = 0;
  for (const auto& [k, v] : map) {
    if (!first) out += ',';
    first = false;
    AppendQuoted(out, k);
    out += ':';
    if (prev != nullptr && v == *prev) {
      out.reserve(out.size() + prev_len);  // no reallocation: the source stays valid
      out.append(out.data() + prev_at, prev_len);
      continue;
    }
    prev = &v;
    prev_at = out.size();
    AppendQuoted(out, v);
    prev_len = out.size() - prev_at;
  }
  out += '}';
}

}  // namespace

std::string ToJsonText(const ExtenderFilterResult& result) {
  if (result.nodes.has_value()) return ToJson(result).dump();
  size_t size = 128 + result.error.size();
  for (const auto& n : result.node_names) size += n.size() + 3;
  for (const auto& [k, v] : result.failed_nodes) size += k.size() + v.size() + 6;
  for (const auto& [k, v] : result.failed_and_unresolvable_nodes) size += k.size() + v.size() + 6;
  std::string out;
  out.reserve(size);
  out += "{\"Error\":";
  AppendQuoted(out, result.error);
  out += ",\"FailedAndUnresolvableNodes\":";
  AppendMap(out, result.failed_and_unresolvable_nodes);
  out += ",\"FailedNodes\":";
  AppendMap(out, result.failed_nodes);
  out += ",\"NodeNames\":[";
  for (size_t i = 0; i < result.node_names.size(); ++i) {
    if (i > 0) out += ',';
    AppendQuoted(out, result.node_names[i]);
  }
  out += "],\"Nodes\":null}";
  return out;
}

json ErrorResult(std::string_view error) { return json{{"Error", std::string(error)}}; }

}  // namespace dynmig::scheduler
