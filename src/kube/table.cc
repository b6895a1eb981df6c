#include "kube/table.h"

#include <fmt/format.h>

namespace dynmig::kube {
namespace {

Object Column(std::string_view name, std::string_view type, int priority,
              std::string_view format = "") {
  return Object{{"name", std::string(name)},
                {"type", std::string(type)},
                {"format", std::string(format)},
                {"description", std::string(name)},
                {"priority", priority}};
}

std::string Age(const Object& obj, absl::Time now) {
  auto created = ParseRfc3339(StringAt(obj, "/metadata/creationTimestamp"));
  if (!created.ok()) return "<unknown>";
  return HumanDuration(now - *created);
}

std::string OrNone(std::string s) { return s.empty() ? "<none>" : s; }

Object PodRow(const Object& pod, absl::Time now) {
  int ready = 0;
  int total = 0;
  int64_t restarts = 0;
  const Object status = pod.value("status", Object::object());
  if (pod.contains("spec") && pod["spec"].contains("containers") &&
      pod["spec"]["containers"].is_array()) {
    total = static_cast<int>(pod["spec"]["containers"].size());
  }
  if (status.contains("containerStatuses") && status["containerStatuses"].is_array()) {
    for (const auto& cs : status["containerStatuses"]) {
      if (!cs.is_object()) continue;
      if (cs.value("ready", false)) ++ready;
      if (cs.contains("restartCount") && cs["restartCount"].is_number_integer()) {
        restarts += cs["restartCount"].get<int64_t>();
      }
    }
  }
  std::string reason = StringAt(pod, "/status/reason");
  if (reason.empty()) reason = Phase(pod);
  if (IsBeingDeleted(pod)) reason = "Terminating";
  return Object::array({Name(pod), fmt::format("{}/{}", ready, total), reason, restarts,
                        Age(pod, now), OrNone(StringAt(pod, "/status/podIP")),
                        OrNone(NodeName(pod)), OrNone(StringAt(pod, "/status/nominatedNodeName")),
                        "<none>"});
}

Object NodeRow(const Object& node, absl::Time now) {
  std::string ready = "Unknown";
  std::string internal_ip;
  std::string external_ip;
  const Object status = node.value("status", Object::object());
  if (status.contains("conditions") && status["conditions"].is_array()) {
    for (const auto& c : status["conditions"]) {
      if (c.is_object() && c.value("type", "") == "Ready") {
        ready = c.value("status", "") == "True" ? "Ready" : "NotReady";
      }
    }
  }
  if (status.contains("addresses") && status["addresses"].is_array()) {
    for (const auto& a : status["addresses"]) {
      if (!a.is_object()) continue;
      if (a.value("type", "") == "InternalIP" && internal_ip.empty()) {
        internal_ip = a.value("address", "");
      }
      if (a.value("type", "") == "ExternalIP" && external_ip.empty()) {
        external_ip = a.value("address", "");
      }
    }
  }
  if (node.contains("spec") && node["spec"].is_object() &&
      node["spec"].value("unschedulable", false)) {
    ready += ",SchedulingDisabled";
  }
  std::string roles;
  for (const auto& [key, value] : Labels(node)) {
    constexpr std::string_view kRolePrefix = "node-role.kubernetes.io/";
    if (key.rfind(kRolePrefix, 0) == 0) {
      if (!roles.empty()) roles += ",";
      roles += key.substr(kRolePrefix.size());
    }
  }
  return Object::array({Name(node), ready, OrNone(roles), Age(node, now),
                        StringAt(node, "/status/nodeInfo/kubeletVersion"), OrNone(internal_ip),
                        OrNone(external_ip), StringAt(node, "/status/nodeInfo/osImage"),
                        StringAt(node, "/status/nodeInfo/kernelVersion"),
                        StringAt(node, "/status/nodeInfo/containerRuntimeVersion")});
}

}  // namespace

std::string HumanDuration(absl::Duration d) {
  const int64_t seconds = absl::ToInt64Seconds(d);
  if (seconds < -1) return "<invalid>";
  if (seconds < 0) return "0s";
  if (seconds < 120) return fmt::format("{}s", seconds);
  const int64_t minutes = seconds / 60;
  if (minutes < 10) {
    const int64_t s = seconds % 60;
    return s == 0 ? fmt::format("{}m", minutes) : fmt::format("{}m{}s", minutes, s);
  }
  if (minutes < 180) return fmt::format("{}m", minutes);
  const int64_t hours = minutes / 60;
  if (hours < 8) {
    const int64_t m = minutes % 60;
    return m == 0 ? fmt::format("{}h", hours) : fmt::format("{}h{}m", hours, m);
  }
  if (hours < 48) return fmt::format("{}h", hours);
  if (hours < 24 * 8) {
    const int64_t h = hours % 24;
    return h == 0 ? fmt::format("{}d", hours / 24) : fmt::format("{}d{}h", hours / 24, h);
  }
  if (hours < 24 * 365 * 2) return fmt::format("{}d", hours / 24);
  if (hours < 24 * 365 * 8) {
    const int64_t dy = (hours / 24) % 365;
    return dy == 0 ? fmt::format("{}y", hours / 24 / 365)
                   : fmt::format("{}y{}d", hours / 24 / 365, dy);
  }
  return fmt::format("{}y", hours / 24 / 365);
}

Object MakeTable(Resource resource, const std::vector<const Object*>& objects,
                 const std::string& resource_version, const std::string& continue_token,
                 std::string_view include_object, absl::Time now) {
  Object columns = Object::array();
  columns.push_back(Column("Name", "string", 0, "name"));
  switch (resource) {
    case Resource::kPods:
      columns.push_back(Column("Ready", "string", 0));
      columns.push_back(Column("Status", "string", 0));
      columns.push_back(Column("Restarts", "integer", 0));
      columns.push_back(Column("Age", "string", 0));
      columns.push_back(Column("IP", "string", 1));
      columns.push_back(Column("Node", "string", 1));
      columns.push_back(Column("Nominated Node", "string", 1));
      columns.push_back(Column("Readiness Gates", "string", 1));
      break;
    case Resource::kNodes:
      columns.push_back(Column("Status", "string", 0));
      columns.push_back(Column("Roles", "string", 0));
      columns.push_back(Column("Age", "string", 0));
      columns.push_back(Column("Version", "string", 0));
      columns.push_back(Column("Internal-IP", "string", 1));
      columns.push_back(Column("External-IP", "string", 1));
      columns.push_back(Column("OS-Image", "string", 1));
      columns.push_back(Column("Kernel-Version", "string", 1));
      columns.push_back(Column("Container-Runtime", "string", 1));
      break;
    case Resource::kLeases:
      columns.push_back(Column("Holder", "string", 0));
      columns.push_back(Column("Age", "string", 0));
      break;
    default:
      columns.push_back(Column("Age", "string", 0));
      break;
  }
  Object rows = Object::array();
  for (const Object* obj : objects) {
    Object cells;
    switch (resource) {
      case Resource::kPods:
        cells = PodRow(*obj, now);
        break;
      case Resource::kNodes:
        cells = NodeRow(*obj, now);
        break;
      case Resource::kLeases:
        cells = Object::array({Name(*obj), StringAt(*obj, "/spec/holderIdentity"), Age(*obj, now)});
        break;
      default:
        cells = Object::array({Name(*obj), Age(*obj, now)});
        break;
    }
    Object row = {{"cells", cells}};
    if (include_object == "Object") {
      row["object"] = *obj;
    } else if (include_object != "None") {
      row["object"] = {{"kind", "PartialObjectMetadata"},
                       {"apiVersion", "meta.k8s.io/v1"},
                       {"metadata", obj->value("metadata", Object::object())}};
    }
    rows.push_back(std::move(row));
  }
  Object meta = {{"resourceVersion", resource_version}};
  if (!continue_token.empty()) meta["continue"] = continue_token;
  return Object{{"kind", "Table"},
                {"apiVersion", "meta.k8s.io/v1"},
                {"metadata", meta},
                {"columnDefinitions", columns},
                {"rows", rows}};
}

}  // namespace dynmig::kube
