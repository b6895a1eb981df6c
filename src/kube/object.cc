#include "kube/object.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <random>

namespace dynmig::kube {
namespace {

constexpr std::array<ResourceInfo, kNumResources> kResources = {{
    {Resource::kPods, "", "v1", "v1", "/api/v1", "pods", "pod", "Pod", "PodList", "po", true},
    {Resource::kNodes, "", "v1", "v1", "/api/v1", "nodes", "node", "Node", "NodeList", "no", false},
    {Resource::kEvents, "", "v1", "v1", "/api/v1", "events", "event", "Event", "EventList", "ev",
     true},
    {Resource::kLeases, "coordination.k8s.io", "v1", "coordination.k8s.io/v1",
     "/apis/coordination.k8s.io/v1", "leases", "lease", "Lease", "LeaseList", "", true},
    {Resource::kNamespaces, "", "v1", "v1", "/api/v1", "namespaces", "namespace", "Namespace",
     "NamespaceList", "ns", false},
    {Resource::kConfigMaps, "", "v1", "v1", "/api/v1", "configmaps", "configmap", "ConfigMap",
     "ConfigMapList", "cm", true},
    {Resource::kPodDisruptionBudgets, "policy", "v1", "policy/v1", "/apis/policy/v1",
     "poddisruptionbudgets", "poddisruptionbudget", "PodDisruptionBudget",
     "PodDisruptionBudgetList", "pdb", true},
    {Resource::kPodDisruptionBudgetsV1beta1, "policy", "v1beta1", "policy/v1beta1",
     "/apis/policy/v1beta1", "poddisruptionbudgets", "poddisruptionbudget", "PodDisruptionBudget",
     "PodDisruptionBudgetList", "pdb", true},
    {Resource::kReplicaSets, "apps", "v1", "apps/v1", "/apis/apps/v1", "replicasets", "replicaset",
     "ReplicaSet", "ReplicaSetList", "rs", true},
}};

const Object* Field(const Object& obj, std::string_view a) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(a);
  return it == obj.end() ? nullptr : &*it;
}

const Object* Field(const Object& obj, std::string_view a, std::string_view b) {
  const Object* first = Field(obj, a);
  return first == nullptr ? nullptr : Field(*first, b);
}

std::string StringOf(const Object* value) {
  if (value == nullptr || !value->is_string()) return "";
  return value->get<std::string>();
}

std::map<std::string, std::string> StringMap(const Object* value) {
  std::map<std::string, std::string> out;
  if (value == nullptr || !value->is_object()) return out;
  for (const auto& [k, v] : value->items()) {
    if (v.is_string()) out.emplace(k, v.get<std::string>());
  }
  return out;
}

std::optional<std::string> MapValue(const Object* map, std::string_view key) {
  if (map == nullptr || !map->is_object()) return std::nullopt;
  auto it = map->find(key);
  if (it == map->end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

}  // namespace

const ResourceInfo& InfoFor(Resource resource) {
  for (const auto& info : kResources) {
    if (info.resource == resource) return info;
  }
  return kResources[0];
}

std::string_view ResourceName(Resource resource) { return InfoFor(resource).plural; }

std::string Name(const Object& obj) { return StringOf(Field(obj, "metadata", "name")); }
std::string Namespace(const Object& obj) { return StringOf(Field(obj, "metadata", "namespace")); }
std::string ResourceVersion(const Object& obj) {
  return StringOf(Field(obj, "metadata", "resourceVersion"));
}
std::string Uid(const Object& obj) { return StringOf(Field(obj, "metadata", "uid")); }
std::string Kind(const Object& obj) { return StringOf(Field(obj, "kind")); }

std::map<std::string, std::string> Annotations(const Object& obj) {
  return StringMap(Field(obj, "metadata", "annotations"));
}
std::map<std::string, std::string> Labels(const Object& obj) {
  return StringMap(Field(obj, "metadata", "labels"));
}
std::optional<std::string> Annotation(const Object& obj, std::string_view key) {
  return MapValue(Field(obj, "metadata", "annotations"), key);
}
std::optional<std::string> Label(const Object& obj, std::string_view key) {
  return MapValue(Field(obj, "metadata", "labels"), key);
}

std::optional<std::string> DeletionTimestamp(const Object& obj) {
  const Object* ts = Field(obj, "metadata", "deletionTimestamp");
  if (ts == nullptr || !ts->is_string()) return std::nullopt;
  return ts->get<std::string>();
}
bool IsBeingDeleted(const Object& obj) { return DeletionTimestamp(obj).has_value(); }

std::string NodeName(const Object& pod) { return StringOf(Field(pod, "spec", "nodeName")); }
std::string Phase(const Object& pod) { return StringOf(Field(pod, "status", "phase")); }

bool IsTerminated(const Object& pod) {
  const std::string phase = Phase(pod);
  return phase == "Succeeded" || phase == "Failed";
}

bool IsDnsSubdomain(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  auto alnum = [](char c) {
    return std::islower(static_cast<unsigned char>(c)) ||
           std::isdigit(static_cast<unsigned char>(c));
  };
  if (!alnum(name.front()) || !alnum(name.back())) return false;
  return std::all_of(name.begin(), name.end(),
                     [&](char c) { return alnum(c) || c == '-' || c == '.'; });
}

bool IsDnsLabel(std::string_view name) {
  return IsDnsSubdomain(name) && name.size() <= 63 && name.find('.') == std::string_view::npos;
}

std::string ObjectKey(std::string_view ns, std::string_view name) {
  if (ns.empty()) return std::string(name);
  return fmt::format("{}/{}", ns, name);
}

std::string ObjectKey(const Object& obj) { return ObjectKey(Namespace(obj), Name(obj)); }

std::string StringAt(const Object& obj, std::string_view json_pointer) {
  const Object* cur = &obj;
  std::string_view rest = json_pointer;
  if (!rest.empty() && rest.front() == '/') rest.remove_prefix(1);
  while (!rest.empty()) {
    const size_t slash = rest.find('/');
    std::string token(rest.substr(0, slash));
    // Unescape ~1 and ~0 (RFC 6901).
    std::string unescaped;
    for (size_t i = 0; i < token.size(); ++i) {
      if (token[i] == '~' && i + 1 < token.size() && (token[i + 1] == '0' || token[i + 1] == '1')) {
        unescaped.push_back(token[i + 1] == '0' ? '~' : '/');
        ++i;
      } else {
        unescaped.push_back(token[i]);
      }
    }
    cur = Field(*cur, unescaped);
    if (cur == nullptr) return "";
    if (slash == std::string_view::npos) break;
    rest.remove_prefix(slash + 1);
  }
  return StringOf(cur);
}

int64_t ResourceVersionNumber(const Object& obj) {
  const std::string rv = ResourceVersion(obj);
  int64_t value = 0;
  auto [ptr, ec] = std::from_chars(rv.data(), rv.data() + rv.size(), value);
  if (ec != std::errc() || ptr != rv.data() + rv.size()) return 0;
  return value;
}

std::string Rfc3339(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

std::string MicroTime(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", t, absl::UTCTimeZone());
}

absl::StatusOr<absl::Time> ParseRfc3339(std::string_view rfc3339) {
  absl::Time t;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, std::string(rfc3339), &t, &err)) {
    return absl::InvalidArgumentError(fmt::format("bad RFC 3339 time '{}': {}", rfc3339, err));
  }
  return t;
}

absl::StatusOr<Object> ParseObject(std::string_view text, std::string_view what,
                                   const JsonLimits& limits) {
  if (absl::Status st = CheckJsonLimits(text, limits, what); !st.ok()) {
    return absl::DataLossError(st.message());
  }
  Object parsed = Object::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    // Re-parse with exceptions only to obtain the parser's message (position and token).
    std::string detail = "invalid JSON";
    try {
      Object ignored = Object::parse(text.begin(), text.end());
    } catch (const nlohmann::json::exception& e) {
      detail = PrintableText(e.what());
    }
    const std::string excerpt = PrintableText(text.substr(0, 80));
    return absl::DataLossError(fmt::format("malformed JSON in {} ({} bytes, starts '{}'): {}", what,
                                           text.size(), excerpt, detail));
  }
  return parsed;
}

Object NewEvent(const Object& involved, std::string_view type, std::string_view reason,
                std::string_view message, std::string_view component, absl::Time now) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const std::string ns = Namespace(involved).empty() ? "default" : Namespace(involved);
  const std::string name = fmt::format("{}.{:016x}", Name(involved), rng());
  Object involved_ref = {{"kind", Kind(involved)},
                         {"name", Name(involved)},
                         {"uid", Uid(involved)},
                         {"apiVersion", "v1"}};
  if (!Namespace(involved).empty()) involved_ref["namespace"] = Namespace(involved);
  if (!ResourceVersion(involved).empty()) {
    involved_ref["resourceVersion"] = ResourceVersion(involved);
  }
  const std::string ts = Rfc3339(now);
  return Object{{"apiVersion", "v1"},
                {"kind", "Event"},
                {"metadata", {{"name", name}, {"namespace", ns}}},
                {"involvedObject", involved_ref},
                {"type", std::string(type)},
                {"reason", std::string(reason)},
                {"message", std::string(message)},
                {"source", {{"component", std::string(component)}}},
                {"reportingComponent", std::string(component)},
                {"firstTimestamp", ts},
                {"lastTimestamp", ts},
                {"count", 1}};
}

}  // namespace dynmig::kube
