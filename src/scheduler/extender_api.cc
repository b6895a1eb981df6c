#include "scheduler/extender_api.h"

#include <cctype>

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

absl::StatusOr<json> ParseBody(std::string_view body, std::string_view what) {
  json doc = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError(fmt::format("{}: the request body is not valid JSON", what));
  }
  if (!doc.is_object()) {
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

std::vector<std::string> ExtenderArgs::Candidates() const {
  if (!nodes.has_value()) return node_names;
  std::vector<std::string> out;
  const json* items = FieldCaseInsensitive(*nodes, "items");
  if (items == nullptr || !items->is_array()) return out;
  for (const auto& item : *items) {
    std::string name = NodeItemName(item);
    if (!name.empty()) out.push_back(std::move(name));
  }
  return out;
}

absl::StatusOr<ExtenderArgs> ParseExtenderArgs(std::string_view body) {
  constexpr std::string_view kWhat = "ExtenderArgs";
  auto doc = ParseBody(body, kWhat);
  if (!doc.ok()) return doc.status();
  ExtenderArgs args;
  const json* pod = FieldCaseInsensitive(*doc, "Pod");
  if (pod == nullptr || pod->is_null()) {
    return absl::InvalidArgumentError("ExtenderArgs: Pod is missing");
  }
  if (!pod->is_object()) return absl::InvalidArgumentError("ExtenderArgs: Pod must be an object");
  args.pod = *pod;
  const json* names = FieldCaseInsensitive(*doc, "NodeNames");
  if (names != nullptr && !names->is_null()) {
    if (!names->is_array()) {
      return absl::InvalidArgumentError("ExtenderArgs: NodeNames must be a list of node names");
    }
    for (size_t i = 0; i < names->size(); ++i) {
      if (!(*names)[i].is_string()) {
        return absl::InvalidArgumentError(
            fmt::format("ExtenderArgs: NodeNames[{}] must be a string", i));
      }
      args.node_names.push_back((*names)[i].get<std::string>());
    }
  }
  const json* nodes = FieldCaseInsensitive(*doc, "Nodes");
  if (nodes != nullptr && !nodes->is_null() && (names == nullptr || names->is_null())) {
    const json* items = FieldCaseInsensitive(*nodes, "items");
    if (!nodes->is_object() || (items != nullptr && !items->is_null() && !items->is_array())) {
      return absl::InvalidArgumentError("ExtenderArgs: Nodes must be a NodeList");
    }
    args.nodes = *nodes;
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
  auto doc = ParseBody(body, kWhat);
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

json ErrorResult(std::string_view error) { return json{{"Error", std::string(error)}}; }

}  // namespace dynmig::scheduler
