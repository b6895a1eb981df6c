#include "kube/in_memory_api_server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <map>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "common/strings.h"
#include "kube/api_status.h"
#include "kube/patch.h"
#include "kube/table.h"

namespace dynmig::kube {
namespace {

constexpr size_t kMaxEventsPerChunk = 1000;
constexpr absl::Duration kWatchPoll = absl::Milliseconds(100);

constexpr std::string_view kJson = "application/json";
// A request body as the real apiserver takes it: at most 3 MiB (MaxRequestBodyBytes; more is 413
// RequestEntityTooLarge "limit is 3145728"). Its JSON decoder allows 10000 levels of nesting and
// answers deeper bodies 400 BadRequest; this double refuses from 64 levels, deeper than any object
// it stores, so that no request can recurse through its store.
constexpr JsonLimits kRequestBodyLimits{kApiRequestBytes, kKubeObjectDepth};
constexpr std::string_view kWatchContentType = "application/json;stream=watch";

int HttpCodeOf(const absl::Status& status) {
  const int code = KubeHttpCode(status);
  if (code != 0) return code;
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kInvalidArgument:
      return 400;
    case absl::StatusCode::kOutOfRange:
      return 410;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
      return 503;
    default:
      return 500;
  }
}

void SendError(httplib::Response& res, const absl::Status& status) {
  const int code = HttpCodeOf(status);
  std::string reason = KubeReason(status);
  if (reason.empty()) reason = std::string(ReasonForCode(code));
  res.status = code;
  res.set_content(MakeApiStatus(code, reason, std::string(status.message())).dump(),
                  std::string(kJson));
}

void SendJson(httplib::Response& res, int code, const std::string& body) {
  res.status = code;
  res.set_content(body, std::string(kJson));
}

std::string Param(const httplib::Request& req, const char* key) {
  return req.has_param(key) ? req.get_param_value(key) : "";
}

bool ParamTrue(const httplib::Request& req, const char* key) {
  const std::string v = Param(req, key);
  return v == "true" || v == "1";
}

absl::StatusOr<int64_t> IntParam(const httplib::Request& req, const char* key) {
  const std::string v = Param(req, key);
  if (v.empty()) return 0;
  char* end = nullptr;
  const long long value = std::strtoll(v.c_str(), &end, 10);
  if (end == nullptr || *end != '\0') {
    return ApiError(400, "BadRequest", fmt::format("invalid {} \"{}\": not an integer", key, v));
  }
  return static_cast<int64_t>(value);
}

std::vector<std::string> Segments(const std::string& path) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    if (slash > start) out.push_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return out;
}

// ---- Versioned APIs. ----

// Whether a server of Kubernetes 1.`minor` serves `r` (PodDisruptionBudgets: policy/v1 from 1.21,
// policy/v1beta1 until 1.24).
bool Serves(Resource r, int minor) {
  if (r == Resource::kPodDisruptionBudgets) return minor >= 21;
  if (r == Resource::kPodDisruptionBudgetsV1beta1) return minor <= 24;
  return true;
}

// The group version of the Eviction the pods/eviction subresource is documented with.
std::string_view EvictionGroupVersion(int minor) { return minor >= 22 ? "v1" : "v1beta1"; }

constexpr Resource kServedResources[] = {Resource::kPods,
                                         Resource::kNodes,
                                         Resource::kEvents,
                                         Resource::kNamespaces,
                                         Resource::kConfigMaps,
                                         Resource::kLeases,
                                         Resource::kPodDisruptionBudgets,
                                         Resource::kPodDisruptionBudgetsV1beta1,
                                         Resource::kReplicaSets};

// ---- Discovery documents. ----

Object ResourceEntry(std::string_view name, std::string_view singular, bool namespaced,
                     std::string_view kind, std::vector<std::string> verbs,
                     std::string_view short_names) {
  Object entry = {{"name", std::string(name)},
                  {"singularName", std::string(singular)},
                  {"namespaced", namespaced},
                  {"kind", std::string(kind)},
                  {"verbs", verbs}};
  if (!short_names.empty()) entry["shortNames"] = {std::string(short_names)};
  return entry;
}

Object ResourceList(std::string_view group_version, int minor) {
  static const std::vector<std::string> kAll = {"create", "delete", "get",  "list",
                                                "patch",  "update", "watch"};
  static const std::vector<std::string> kStatusVerbs = {"get", "patch", "update"};
  Object resources = Object::array();
  for (Resource r : kServedResources) {
    const ResourceInfo& info = InfoFor(r);
    if (info.api_version != group_version || !Serves(r, minor)) continue;
    Object entry = ResourceEntry(info.plural, info.singular, info.namespaced, info.kind, kAll,
                                 info.short_names);
    if (r == Resource::kPods || r == Resource::kNodes) entry["categories"] = {"all"};
    resources.push_back(entry);
    if (r == Resource::kPods || r == Resource::kNodes || r == Resource::kNamespaces ||
        r == Resource::kPodDisruptionBudgets || r == Resource::kPodDisruptionBudgetsV1beta1 ||
        r == Resource::kReplicaSets) {
      resources.push_back(ResourceEntry(fmt::format("{}/status", info.plural), "", info.namespaced,
                                        info.kind, kStatusVerbs, ""));
    }
    if (r == Resource::kPods) {
      resources.push_back(ResourceEntry("pods/binding", "", true, "Binding", {"create"}, ""));
      // As kubectl drain reads it: the Eviction's group and version.
      Object eviction = ResourceEntry("pods/eviction", "", true, "Eviction", {"create"}, "");
      eviction["group"] = "policy";
      eviction["version"] = std::string(EvictionGroupVersion(minor));
      resources.push_back(eviction);
    }
  }
  return Object{{"kind", "APIResourceList"},
                {"apiVersion", "v1"},
                {"groupVersion", std::string(group_version)},
                {"resources", resources}};
}

Object PolicyGroup(int minor) {
  Object versions = Object::array();
  for (Resource r : {Resource::kPodDisruptionBudgets, Resource::kPodDisruptionBudgetsV1beta1}) {
    if (!Serves(r, minor)) continue;
    const ResourceInfo& info = InfoFor(r);
    versions.push_back(Object{{"groupVersion", std::string(info.api_version)},
                              {"version", std::string(info.version)}});
  }
  return Object{{"kind", "APIGroup"},
                {"apiVersion", "v1"},
                {"name", "policy"},
                {"versions", versions},
                {"preferredVersion", versions.at(0)}};
}

// apps/v1, for ReplicaSets only (the local mode's ReplicaSet controller).
Object AppsGroup() {
  Object version = {{"groupVersion", "apps/v1"}, {"version", "v1"}};
  return Object{{"kind", "APIGroup"},
                {"apiVersion", "v1"},
                {"name", "apps"},
                {"versions", {version}},
                {"preferredVersion", version}};
}

Object CoordinationGroup() {
  Object version = {{"groupVersion", "coordination.k8s.io/v1"}, {"version", "v1"}};
  return Object{{"kind", "APIGroup"},
                {"apiVersion", "v1"},
                {"name", "coordination.k8s.io"},
                {"versions", {version}},
                {"preferredVersion", version}};
}

// ---- OpenAPI v3: only the paths and their query parameters. ----
//
// kubectl (v1.24+) validates manifests on the server when the group-version's OpenAPI v3 document
// lists `fieldValidation` among the parameters of the kind's PATCH operation; it then sends
// `fieldValidation=Strict` instead of downloading /openapi/v2 for client-side validation. The
// PATCH operations declare no request body, so `kubectl apply` computes its strategic merge
// patches from its built-in types as it does without OpenAPI.

Object OpenApiQueryParam(std::string_view name, std::string_view type, std::string_view text) {
  return Object{{"name", std::string(name)},
                {"in", "query"},
                {"description", std::string(text)},
                {"schema", {{"type", std::string(type)}, {"uniqueItems", true}}}};
}

Object OpenApiOperation(const ResourceInfo& info, std::string_view action, std::string_view verb,
                        std::string_view scope) {
  Object params = Object::array();
  const bool write = action == "post" || action == "put" || action == "patch" || action == "delete";
  if (write) {
    params.push_back(OpenApiQueryParam(
        "dryRun", "string", "When present, indicates that modifications should not be persisted."));
  }
  if (action == "post" || action == "put" || action == "patch") {
    params.push_back(OpenApiQueryParam("fieldManager", "string",
                                       "a name associated with the actor making these changes"));
    params.push_back(OpenApiQueryParam(
        "fieldValidation", "string",
        "how the server handles unknown or duplicate fields: Ignore, Warn or Strict (accepted; "
        "the in-memory API server does not check fields)"));
  }
  if (action == "patch") {
    params.push_back(OpenApiQueryParam("force", "boolean", "force apply (server-side apply)"));
  }
  if (action == "get" && verb == "list") {
    for (const char* p : {"labelSelector", "fieldSelector", "continue", "resourceVersion"}) {
      params.push_back(OpenApiQueryParam(p, "string", p));
    }
    params.push_back(OpenApiQueryParam("limit", "integer", "limit"));
    params.push_back(OpenApiQueryParam("watch", "boolean", "watch"));
  }
  return Object{{"operationId", fmt::format("{}{}{}", verb, scope, info.kind)},
                {"parameters", params},
                {"responses", {{"200", {{"description", "OK"}}}}},
                {"x-kubernetes-action", std::string(verb)},
                {"x-kubernetes-group-version-kind",
                 {{"group", std::string(info.group)},
                  {"version", std::string(info.version)},
                  {"kind", std::string(info.kind)}}}};
}

Object OpenApiPathParams(bool namespaced, bool named) {
  Object params = Object::array();
  auto path_param = [](const char* name) {
    return Object{{"name", name},
                  {"in", "path"},
                  {"required", true},
                  {"description", name},
                  {"schema", {{"type", "string"}, {"uniqueItems", true}}}};
  };
  if (named) params.push_back(path_param("name"));
  if (namespaced) params.push_back(path_param("namespace"));
  return params;
}

Object OpenApiV3Document(std::string_view group_version) {
  Object paths = Object::object();
  for (Resource r : kServedResources) {
    const ResourceInfo& info = InfoFor(r);
    if (info.api_version != group_version) continue;
    const std::string scope = info.namespaced ? "Namespaced" : "";
    const std::string collection =
        info.namespaced ? fmt::format("{}/namespaces/{{namespace}}/{}", info.prefix, info.plural)
                        : fmt::format("{}/{}", info.prefix, info.plural);
    paths[collection] = {{"parameters", OpenApiPathParams(info.namespaced, false)},
                         {"get", OpenApiOperation(info, "get", "list", scope)},
                         {"post", OpenApiOperation(info, "post", "create", scope)}};
    const std::string item = collection + "/{name}";
    paths[item] = {{"parameters", OpenApiPathParams(info.namespaced, true)},
                   {"get", OpenApiOperation(info, "get", "get", scope)},
                   {"put", OpenApiOperation(info, "put", "update", scope)},
                   {"patch", OpenApiOperation(info, "patch", "patch", scope)},
                   {"delete", OpenApiOperation(info, "delete", "delete", scope)}};
    if (r == Resource::kPods || r == Resource::kNodes || r == Resource::kNamespaces ||
        r == Resource::kPodDisruptionBudgets || r == Resource::kPodDisruptionBudgetsV1beta1 ||
        r == Resource::kReplicaSets) {
      const std::string status_scope = scope + "Status";
      Object get = OpenApiOperation(info, "get", "get", status_scope);
      Object put = OpenApiOperation(info, "put", "update", status_scope);
      Object patch = OpenApiOperation(info, "patch", "patch", status_scope);
      paths[item + "/status"] = {{"parameters", OpenApiPathParams(info.namespaced, true)},
                                 {"get", get},
                                 {"put", put},
                                 {"patch", patch}};
    }
  }
  return Object{
      {"openapi", "3.0.0"},
      {"info", {{"title", "Kubernetes (dynmig in-memory API server)"}, {"version", "v1.32.0"}}},
      {"paths", paths},
      {"components", {{"schemas", Object::object()}}}};
}

struct OpenApiV3 {
  std::string index;                        // GET /openapi/v3
  std::map<std::string, std::string> docs;  // "api/v1" -> document
};

const OpenApiV3& OpenApi() {
  static const OpenApiV3 kOpenApi = [] {
    OpenApiV3 out;
    Object index_paths = Object::object();
    for (const auto& [path, gv] : {std::pair<std::string, std::string>{"api/v1", "v1"},
                                   {"apis/coordination.k8s.io/v1", "coordination.k8s.io/v1"},
                                   {"apis/apps/v1", "apps/v1"},
                                   {"apis/policy/v1", "policy/v1"},
                                   {"apis/policy/v1beta1", "policy/v1beta1"}}) {
      const std::string doc = OpenApiV3Document(gv).dump();
      out.docs[path] = doc;
      index_paths[path] = {{"serverRelativeURL", fmt::format("/openapi/v3/{}?hash={:016X}", path,
                                                             std::hash<std::string>{}(doc))}};
    }
    out.index = Object{{"paths", index_paths}}.dump();
    return out;
  }();
  return kOpenApi;
}

}  // namespace

// ---- Routing. ----

namespace apiserver_detail {

// A resource path: /api/v1/[namespaces/NS/]PLURAL[/NAME[/SUBRESOURCE]], or the same under
// /apis/coordination.k8s.io/v1.
struct Route {
  Resource resource;
  std::string ns;
  std::string name;
  std::string subresource;
};

// A request after authentication and fault injection, as the route table dispatches it.
struct Call {
  const httplib::Request& req;
  httplib::Response& res;
  std::vector<std::string> seg;  // the path's non-empty segments
};

// A request on a resource path. For writes (any method but GET) also the JSON body, dryRun and
// the admission attributes built from them (see ReadWriteRequest).
struct ResourceCall {
  ResourceCall(const httplib::Request& request, httplib::Response& response, Route r,
               const UserInfo& user)
      : req(request), res(response), route(std::move(r)), info(InfoFor(route.resource)) {
    attrs.resource = route.resource;
    attrs.subresource = route.subresource;
    attrs.ns = route.ns;
    attrs.name = route.name;
    attrs.user = user;
  }

  bool is_collection() const { return route.name.empty(); }
  // The CreateOptions/UpdateOptions/PatchOptions/DeleteOptions object admission sees.
  Object OptionsObject(std::string_view kind) const;
  // `obj` as admission sees it: kind, apiVersion and namespace filled in (quantities are
  // canonical already: the real server decodes the body first, so webhooks get "8k" for 8000).
  Object Complete(Object obj) const;
  // Answers `result` (code on success, its Status otherwise) with the webhooks' warnings.
  void Send(int code, const absl::StatusOr<Object>& result);

  const httplib::Request& req;
  httplib::Response& res;
  Route route;
  const ResourceInfo& info;
  std::optional<Object> body;
  bool dry_run = false;
  AdmissionAttributes attrs;
  std::vector<std::string> warnings;  // from the webhooks, sent as Warning headers
};

}  // namespace apiserver_detail

namespace {

using apiserver_detail::Call;
using apiserver_detail::ResourceCall;
using apiserver_detail::Route;

// Non-resource endpoints: method + path pattern -> handler.
struct PathRoute {
  std::string_view method;
  std::string_view pattern;  // "/a/b"; a last segment "**" stands for one or more segments
  void (InMemoryApiServer::*handler)(Call&);
};

// Which resource paths a route serves.
enum class Target {
  kCollection,   // no name
  kObject,       // a name, any subresource
  kPodBinding,   // pods/NAME/binding
  kPodEviction,  // pods/NAME/eviction
  kAny,
};

// Resource paths: method + target -> handler.
struct ResourceRoute {
  std::string_view method;
  Target target;
  void (InMemoryApiServer::*handler)(ResourceCall&);
};

bool PathMatches(std::string_view pattern, const std::vector<std::string>& seg) {
  size_t i = 0;
  while (!pattern.empty()) {
    pattern.remove_prefix(1);  // the '/'
    const size_t end = std::min(pattern.find('/'), pattern.size());
    const std::string_view part = pattern.substr(0, end);
    pattern.remove_prefix(end);
    if (part == "**") return seg.size() > i;
    if (i >= seg.size() || seg[i] != part) return false;
    ++i;
  }
  return i == seg.size();
}

bool TargetMatches(Target target, const Route& route) {
  switch (target) {
    case Target::kCollection:
      return route.name.empty();
    case Target::kObject:
      return !route.name.empty();
    case Target::kPodBinding:
      return route.resource == Resource::kPods && !route.name.empty() &&
             route.subresource == "binding";
    case Target::kPodEviction:
      return route.resource == Resource::kPods && !route.name.empty() &&
             route.subresource == "eviction";
    case Target::kAny:
      return true;
  }
  return false;
}

std::optional<Resource> ResourceByPlural(std::string_view api_version, std::string_view plural,
                                         int minor) {
  for (Resource r : kServedResources) {
    const ResourceInfo& info = InfoFor(r);
    if (info.api_version == api_version && info.plural == plural && Serves(r, minor)) return r;
  }
  return std::nullopt;
}

// Parses the segments after the group-version prefix. nullopt: not a resource path we serve.
std::optional<Route> ParseRoute(std::string_view api_version, const std::vector<std::string>& rest,
                                int minor) {
  if (rest.empty()) return std::nullopt;
  if (rest[0] == "namespaces" && rest.size() >= 3) {
    if (auto r = ResourceByPlural(api_version, rest[2], minor); r && InfoFor(*r).namespaced) {
      if (rest.size() > 5) return std::nullopt;
      Route route{*r, rest[1], rest.size() >= 4 ? rest[3] : "", rest.size() == 5 ? rest[4] : ""};
      return route;
    }
  }
  auto r = ResourceByPlural(api_version, rest[0], minor);
  if (!r || rest.size() > 3) return std::nullopt;
  if (InfoFor(*r).namespaced && rest.size() > 1) return std::nullopt;
  return Route{*r, "", rest.size() >= 2 ? rest[1] : "", rest.size() == 3 ? rest[2] : ""};
}

// The resource path `seg` names under one of the served group-versions, or nullopt.
std::optional<Route> ResourceRouteOf(const std::vector<std::string>& seg, int minor) {
  std::string api_version;
  std::vector<std::string> rest;
  if (seg.size() >= 2 && seg[0] == "api" && seg[1] == "v1") {
    api_version = "v1";
    rest.assign(seg.begin() + 2, seg.end());
  } else if (seg.size() >= 3 && seg[0] == "apis") {
    api_version = seg[1] + "/" + seg[2];
    rest.assign(seg.begin() + 3, seg.end());
  }
  if (rest.empty()) return std::nullopt;
  return ParseRoute(api_version, rest, minor);
}

std::string WatchLine(WatchEventType type, const std::string& object_json) {
  std::string line;
  line.reserve(object_json.size() + 40);
  line += R"({"type":")";
  line += WatchEventTypeName(type);
  line += R"(","object":)";
  line += object_json;
  line += "}\n";
  return line;
}

std::string BookmarkLine(Resource resource, int64_t rv, bool initial_events_end) {
  const ResourceInfo& info = InfoFor(resource);
  Object meta = {{"resourceVersion", std::to_string(rv)}, {"creationTimestamp", nullptr}};
  if (initial_events_end) meta["annotations"] = {{"k8s.io/initial-events-end", "true"}};
  Object obj = {{"kind", info.kind}, {"apiVersion", info.api_version}, {"metadata", meta}};
  return WatchLine(WatchEventType::kBookmark, obj.dump());
}

std::string ErrorLine(const absl::Status& status) {
  const int code = HttpCodeOf(status);
  std::string reason = KubeReason(status);
  if (reason.empty()) reason = std::string(ReasonForCode(code));
  return WatchLine(WatchEventType::kError,
                   MakeApiStatus(code, reason, std::string(status.message())).dump());
}

bool WantsTable(const httplib::Request& req) {
  return req.get_header_value("Accept").find("as=Table") != std::string::npos;
}

// One open watch stream: its cursor in the store and when it next sends a bookmark or heartbeat.
// Times are the server clock's monotonic time.
struct WatchFeed {
  const Clock* clock = nullptr;
  std::unique_ptr<ApiStore::Watch> watch;
  absl::Duration deadline;
  absl::Duration next_bookmark;
  absl::Duration next_heartbeat;
  absl::Duration bookmark_interval;
  absl::Duration heartbeat;
  bool bookmarks = false;
  bool send_initial = false;
  bool started = false;
  bool table = false;  // kubectl get -w: each object as a one-row Table
  std::string include_object;

  std::string Line(const StoreEvent& ev) const {
    if (!table) return WatchLine(ev.type, ev.object->json);
    return WatchLine(ev.type,
                     MakeTable(watch->resource(), {&ev.object->object},
                               ResourceVersion(ev.object->object), "", include_object, clock->Now())
                         .dump());
  }

  // Writes the next chunk of the stream (initial events, changes, a bookmark or a heartbeat),
  // waiting up to kWatchPoll for changes. false ends the connection.
  bool Pump(httplib::DataSink& sink) {
    std::string buf;
    if (!started) {
      started = true;
      for (const StoreEvent& ev : watch->TakeInitialEvents()) buf += Line(ev);
      if (send_initial) buf += BookmarkLine(watch->resource(), watch->cursor(), true);
      if (!buf.empty()) return sink.write(buf.data(), buf.size());
    }
    absl::Duration now = clock->Monotonic();
    if (now >= deadline) {
      sink.done();
      return true;
    }
    auto events = watch->Next(*clock, std::min(kWatchPoll, deadline - now), kMaxEventsPerChunk);
    if (!events.ok()) {
      if (HttpCodeOf(events.status()) != 410) return false;  // cut or shutdown
      const std::string line = ErrorLine(events.status());
      sink.write(line.data(), line.size());
      sink.done();
      return true;
    }
    for (const StoreEvent& ev : *events) buf += Line(ev);
    now = clock->Monotonic();
    if (bookmarks && now >= next_bookmark) {
      buf += BookmarkLine(watch->resource(), watch->cursor(), false);
      next_bookmark = now + bookmark_interval;
    }
    if (buf.empty() && now >= next_heartbeat) buf.push_back('\n');
    if (buf.empty()) return true;
    next_heartbeat = now + heartbeat;
    return sink.write(buf.data(), buf.size());
  }
};

// A watch from an expired resourceVersion as a real server usually answers it: 200, then one
// ERROR event.
void SendExpiredWatch(httplib::Response& res, const absl::Status& status) {
  const std::string line = ErrorLine(status);
  res.status = 200;
  res.set_chunked_content_provider(std::string(kWatchContentType),
                                   [line](size_t, httplib::DataSink& sink) {
                                     sink.write(line.data(), line.size());
                                     sink.done();
                                     return true;
                                   });
}

// A list response: the stored JSON of each item spliced in as it is.
std::string ListBody(const ResourceInfo& info, const ApiStore::ListResult& list) {
  std::string body;
  size_t size = 256;
  for (const auto& item : list.items) size += item->json.size() + 1;
  body.reserve(size);
  Object meta = {{"resourceVersion", std::to_string(list.resource_version)}};
  if (!list.continue_token.empty()) {
    meta["continue"] = list.continue_token;
    meta["remainingItemCount"] = list.remaining;
  }
  body += fmt::format(R"({{"kind":"{}","apiVersion":"{}","metadata":{},"items":[)", info.list_kind,
                      info.api_version, meta.dump());
  for (size_t i = 0; i < list.items.size(); ++i) {
    if (i > 0) body += ',';
    body += list.items[i]->json;
  }
  body += "]}";
  return body;
}

// The JSON body of a write, when it has one. false: answered (415, 400).
bool ReadWriteBody(ResourceCall& call) {
  if (call.req.body.empty()) return true;
  const std::string content_type = call.req.get_header_value("Content-Type");
  if (content_type.find("yaml") != std::string::npos ||
      content_type.find("protobuf") != std::string::npos) {
    SendError(call.res, ApiError(415, "UnsupportedMediaType",
                                 fmt::format("the body of the request was in an unknown "
                                             "format - accepted media types include: "
                                             "application/json (got {})",
                                             content_type)));
    return false;
  }
  auto parsed = ParseObject(call.req.body, "request body", kRequestBodyLimits);
  if (!parsed.ok()) {
    SendError(call.res, ApiError(400, "BadRequest", std::string(parsed.status().message())));
    return false;
  }
  call.body = std::move(*parsed);
  return true;
}

// What every write (any method but GET) carries before its route runs: the JSON body (DELETE
// may have none), dryRun=All (check and admit, store nothing) and fieldValidation (accepted,
// fields not checked). false: answered with the error.
bool ReadWriteRequest(ResourceCall& call) {
  const httplib::Request& req = call.req;
  if (!ReadWriteBody(call)) return false;
  if (req.has_param("dryRun")) {
    for (size_t i = 0; i < req.get_param_value_count("dryRun"); ++i) {
      const std::string v = req.get_param_value("dryRun", i);
      if (v != "All") {
        SendError(call.res,
                  ApiError(400, "BadRequest",
                           fmt::format("Invalid value: \"{}\": supported values: \"All\"", v)));
        return false;
      }
      call.dry_run = true;
    }
  }
  if (req.has_param("fieldValidation")) {
    const std::string v = Param(req, "fieldValidation");
    if (v != "Ignore" && v != "Warn" && v != "Strict") {
      SendError(call.res,
                ApiError(400, "BadRequest",
                         fmt::format("fieldValidation: Invalid value: \"{}\": must be one "
                                     "of Ignore, Warn or Strict",
                                     v)));
      return false;
    }
  }
  if (call.dry_run && call.route.subresource == "binding") {
    SendError(call.res, ApiError(400, "BadRequest",
                                 "dryRun is not supported on pods/binding by the in-memory API "
                                 "server"));
    return false;
  }
  call.attrs.dry_run = call.dry_run;
  return true;
}

// POST and PUT need a body, with its quantities in canonical form. false: answered.
bool RequireBody(ResourceCall& call) {
  if (!call.body) {
    SendError(call.res, ApiError(400, "BadRequest", "the request body is empty"));
    return false;
  }
  if (auto st = CanonicalizeQuantities(call.route.resource, &*call.body); !st.ok()) {
    SendError(call.res, st);
    return false;
  }
  return true;
}

// The patch type a PATCH's Content-Type names, or nullopt.
std::optional<PatchType> PatchTypeOf(const std::string& content_type) {
  if (content_type.rfind("application/merge-patch+json", 0) == 0) return PatchType::kMerge;
  if (content_type.rfind("application/strategic-merge-patch+json", 0) == 0) {
    return PatchType::kStrategicMerge;
  }
  if (content_type.rfind("application/json-patch+json", 0) == 0) return PatchType::kJson;
  return std::nullopt;
}

// A DELETE's options: the body's gracePeriodSeconds and preconditions, then the query's
// gracePeriodSeconds.
absl::StatusOr<DeleteOptions> DeleteOptionsOf(const ResourceCall& call) {
  DeleteOptions options;
  if (call.body && call.body->is_object()) {
    const Object& body = *call.body;
    if (body.contains("gracePeriodSeconds") && body["gracePeriodSeconds"].is_number_integer()) {
      options.grace_period_seconds = body["gracePeriodSeconds"].get<int64_t>();
    }
    options.precondition_uid = StringAt(body, "/preconditions/uid");
    options.precondition_resource_version = StringAt(body, "/preconditions/resourceVersion");
  }
  if (call.req.has_param("gracePeriodSeconds")) {
    auto grace = IntParam(call.req, "gracePeriodSeconds");
    if (!grace.ok()) return grace.status();
    options.grace_period_seconds = *grace;
  }
  return options;
}

// A write no route serves: 405.
void RefuseMethod(ResourceCall& call) {
  const httplib::Request& req = call.req;
  if (call.is_collection()) {
    return SendError(call.res, ApiError(405, "MethodNotAllowed",
                                        fmt::format("{} is not supported on a collection ({})",
                                                    req.method, req.path)));
  }
  SendError(call.res, ApiError(405, "MethodNotAllowed",
                               fmt::format("method {} is not supported", req.method)));
}

}  // namespace

namespace apiserver_detail {

Object ResourceCall::OptionsObject(std::string_view kind) const {
  Object options = {{"kind", std::string(kind)}, {"apiVersion", "meta.k8s.io/v1"}};
  if (dry_run) options["dryRun"] = {"All"};
  if (req.has_param("fieldManager")) options["fieldManager"] = Param(req, "fieldManager");
  return options;
}

Object ResourceCall::Complete(Object obj) const {
  if (!obj.is_object()) return obj;
  if (!obj.contains("kind")) obj["kind"] = info.kind;
  if (!obj.contains("apiVersion")) obj["apiVersion"] = info.api_version;
  if (info.namespaced && !route.ns.empty()) {
    if (!obj.contains("metadata")) obj["metadata"] = Object::object();
    if (obj["metadata"].is_object() && !obj["metadata"].contains("namespace")) {
      obj["metadata"]["namespace"] = route.ns;
    }
  }
  return obj;
}

void ResourceCall::Send(int code, const absl::StatusOr<Object>& result) {
  for (const std::string& w : warnings) {
    res.set_header("Warning", fmt::format("299 - {}", Object(w).dump()));
  }
  if (!result.ok()) return SendError(res, result.status());
  SendJson(res, code, result->dump());
}

}  // namespace apiserver_detail

absl::StatusOr<FaultSpec> FaultSpecFromJson(const Object& json) {
  if (!json.is_object()) return absl::InvalidArgumentError("fault spec must be a JSON object");
  FaultSpec spec;
  try {
    spec.method = json.value("method", "");
    spec.path_prefix = json.value("pathPrefix", "");
    spec.user = json.value("user", "");
    spec.count = json.value("count", 1);
    spec.status = json.value("status", 500);
    spec.retry_after_seconds = json.value("retryAfterSeconds", -1);
    spec.latency = absl::Milliseconds(json.value("latencyMs", 0));
    spec.message = json.value("message", "");
    spec.window = absl::Milliseconds(json.value("windowMs", 0));
    const std::string action = json.value("action", "status");
    if (action == "status") {
      spec.action = FaultSpec::Action::kStatus;
    } else if (action == "malformed") {
      spec.action = FaultSpec::Action::kMalformed;
    } else if (action == "truncate") {
      spec.action = FaultSpec::Action::kTruncate;
    } else if (action == "delay") {
      spec.action = FaultSpec::Action::kDelay;
    } else {
      return absl::InvalidArgumentError(fmt::format(
          "unknown fault action '{}' (want status, malformed, truncate or delay)", action));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("bad fault spec: {}", e.what()));
  }
  if (spec.count == 0 || spec.count < -1) {
    return absl::InvalidArgumentError("fault count must be positive or -1 (until cleared)");
  }
  if (spec.action == FaultSpec::Action::kStatus && (spec.status < 400 || spec.status > 599)) {
    return absl::InvalidArgumentError(
        fmt::format("fault status {} is not an HTTP error (400-599)", spec.status));
  }
  return spec;
}

InMemoryApiServer::InMemoryApiServer(InMemoryApiServerOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : RealClock()),
      audit_(options_.audit_max_records, options_.audit_max_names) {
  if (options_.store.clock == nullptr) options_.store.clock = &clock_;
  store_ =
      options_.shared_store ? options_.shared_store : std::make_shared<ApiStore>(options_.store);
  dynmig::MutexLock lock(&mu_);
  bearer_token_ = options_.bearer_token;
  token_users_ = options_.token_users;
  webhooks_ = options_.admission_webhooks;
}

void InMemoryApiServer::SetBearerToken(std::string token) {
  dynmig::MutexLock lock(&mu_);
  bearer_token_ = std::move(token);
}

void InMemoryApiServer::SetTokenUsers(std::map<std::string, std::string> token_users) {
  dynmig::MutexLock lock(&mu_);
  token_users_ = std::move(token_users);
}

void InMemoryApiServer::SetAdmissionWebhooks(std::vector<AdmissionWebhook> webhooks) {
  dynmig::MutexLock lock(&mu_);
  webhooks_ = std::move(webhooks);
}

std::vector<AdmissionWebhook> InMemoryApiServer::admission_webhooks() const {
  dynmig::MutexLock lock(&mu_);
  return webhooks_;
}

absl::StatusOr<UserInfo> InMemoryApiServer::Authenticate(const httplib::Request& req) const {
  const std::string header = req.get_header_value("Authorization");
  std::string token;
  if (header.size() > 7 && absl::EqualsIgnoreCase(header.substr(0, 7), "bearer ")) {
    token = std::string(Trim(std::string_view(header).substr(7)));
  }
  dynmig::MutexLock lock(&mu_);
  const bool checking = !bearer_token_.empty() || !token_users_.empty();
  if (!token.empty()) {
    if (auto it = token_users_.find(token); it != token_users_.end()) {
      return UserInfo{it->second, {"system:authenticated"}};
    }
    if (token == bearer_token_) return UserInfo{"system:admin", {"system:authenticated"}};
    if (checking) return ApiError(401, "Unauthorized", "Unauthorized");
  } else if (!bearer_token_.empty()) {
    return ApiError(401, "Unauthorized", "Unauthorized");
  }
  return UserInfo{std::string(kAnonymousUser), {"system:unauthenticated"}};
}

std::vector<AdmissionWebhook> InMemoryApiServer::MatchingWebhooks(
    const AdmissionAttributes& attrs) const {
  dynmig::MutexLock lock(&mu_);
  std::vector<AdmissionWebhook> out;
  for (const AdmissionWebhook& hook : webhooks_) {
    if (WebhookMatches(hook, attrs)) out.push_back(hook);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<InMemoryApiServer>> InMemoryApiServer::Start(
    InMemoryApiServerOptions options) {
  std::unique_ptr<InMemoryApiServer> server(new InMemoryApiServer(std::move(options)));
  absl::Status st = server->Listen();
  if (!st.ok()) return st;
  return server;
}

std::string InMemoryApiServer::url() const {
  const bool tls = !options_.tls_cert_file.empty();
  return fmt::format("{}://{}:{}", tls ? "https" : "http", options_.host, port_);
}

absl::Status InMemoryApiServer::Listen() {
  if (!options_.tls_cert_file.empty() || !options_.tls_key_file.empty()) {
    if (options_.tls_cert_file.empty() || options_.tls_key_file.empty()) {
      return absl::InvalidArgumentError("TLS needs both tls_cert_file and tls_key_file");
    }
    http_ = std::make_unique<httplib::SSLServer>(
        options_.tls_cert_file.c_str(), options_.tls_key_file.c_str(),
        options_.tls_client_ca_file.empty() ? nullptr : options_.tls_client_ca_file.c_str());
    if (!http_->is_valid()) {
      return absl::InvalidArgumentError(
          fmt::format("cannot load TLS certificate '{}' / key '{}' / client CA '{}'",
                      options_.tls_cert_file, options_.tls_key_file, options_.tls_client_ca_file));
    }
  } else {
    http_ = std::make_unique<httplib::Server>();
  }
  const int threads = std::max(4, options_.threads);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_keep_alive_max_count(100000);
  http_->set_keep_alive_timeout(
      std::max<time_t>(1, absl::ToInt64Seconds(options_.keep_alive_timeout)));
  http_->set_read_timeout(30, 0);
  http_->set_write_timeout(30, 0);
  http_->set_tcp_nodelay(true);
  http_->set_payload_max_length(kRequestBodyLimits.max_bytes);
  http_->set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
        if (res.status != 413 || !res.body.empty())
          return httplib::Server::HandlerResponse::Unhandled;
        const std::string message =
            fmt::format("Request entity too large: limit is {}", kRequestBodyLimits.max_bytes);
        res.set_content(MakeApiStatus(413, "RequestEntityTooLarge", message).dump(),
                        std::string(kJson));
        return httplib::Server::HandlerResponse::Handled;
      }));
  auto handler = [this](const httplib::Request& req, httplib::Response& res) { Handle(req, res); };
  http_->Get(".*", handler);
  http_->Post(".*", handler);
  http_->Put(".*", handler);
  http_->Patch(".*", handler);
  http_->Delete(".*", handler);
  http_->Options(".*", handler);

  if (options_.port == 0) {
    port_ = http_->bind_to_any_port(options_.host);
    if (port_ <= 0) {
      return absl::UnavailableError(fmt::format("cannot bind {}:0", options_.host));
    }
  } else {
    if (!http_->bind_to_port(options_.host, options_.port)) {
      return absl::UnavailableError(
          fmt::format("cannot bind {}:{} (in use?)", options_.host, options_.port));
    }
    port_ = options_.port;
  }
  listener_ = std::thread([this] { http_->listen_after_bind(); });
  // The listener thread starts on real time whatever the server's clock (httplib has no
  // readiness signal to wait on, so this polls).
  const Clock& real = RealClock();
  const absl::Duration deadline = real.Monotonic() + absl::Seconds(10);
  while (!http_->is_running() && real.Monotonic() < deadline) real.SleepFor(absl::Milliseconds(1));
  if (!http_->is_running()) {
    Stop();
    return absl::UnavailableError(fmt::format("API server on port {} did not start", port_));
  }
  if (options_.gc_interval > absl::ZeroDuration()) {
    gc_thread_ = std::thread([this] { RunGarbageCollector(); });
  }
  spdlog::debug("in-memory API server listening on {}", url());
  return absl::OkStatus();
}

void InMemoryApiServer::RunGarbageCollector() {
  while (true) {
    {
      dynmig::MutexLock lock(&mu_);
      if (clock_.WaitFor(stop_cv_, mu_, options_.gc_interval,
                         [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopped_; })) {
        return;
      }
    }
    store_->CollectGarbage();
  }
}

InMemoryApiServer::~InMemoryApiServer() { Stop(); }

void InMemoryApiServer::Stop() {
  {
    dynmig::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stop_cv_.SignalAll();
  }
  stopping_ = true;
  if (gc_thread_.joinable()) gc_thread_.join();
  // Wake the watch streams so they see stopping_ now; the store itself lives on (it may be
  // served again by another server, as after a restart).
  store_->CutWatches();
  // httplib 0.11 closes an idle keep-alive connection only when its keep_alive_timeout passes
  // (stop() does not wake it), so this waits up to that long for connections clients keep open.
  if (http_) http_->stop();
  if (listener_.joinable()) listener_.join();
}

void InMemoryApiServer::AddFault(FaultSpec fault) {
  const absl::Duration until = fault.window > absl::ZeroDuration()
                                   ? clock_.Monotonic() + fault.window
                                   : absl::InfiniteDuration();
  dynmig::MutexLock lock(&mu_);
  faults_.push_back({std::move(fault), until});
}

void InMemoryApiServer::ClearFaults() {
  dynmig::MutexLock lock(&mu_);
  faults_.clear();
}

int InMemoryApiServer::CutWatches() { return store_->CutWatches(); }

bool InMemoryApiServer::ApplyFault(const httplib::Request& req, httplib::Response& res,
                                   const std::string& user) {
  FaultSpec fault;
  {
    dynmig::MutexLock lock(&mu_);
    const absl::Duration now = clock_.Monotonic();
    std::erase_if(faults_, [&](const FaultRule& r) { return r.until <= now; });
    auto it = std::find_if(faults_.begin(), faults_.end(), [&](const FaultRule& r) {
      const FaultSpec& f = r.spec;
      return (f.method.empty() || f.method == req.method) && (f.user.empty() || f.user == user) &&
             req.path.compare(0, f.path_prefix.size(), f.path_prefix) == 0;
    });
    if (it == faults_.end()) return false;
    fault = it->spec;
    if (it->spec.count > 0 && --it->spec.count == 0) faults_.erase(it);
  }
  if (fault.latency > absl::ZeroDuration()) {  // cut short by Stop()
    dynmig::MutexLock lock(&mu_);
    clock_.WaitFor(stop_cv_, mu_, fault.latency,
                   [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopped_; });
  }
  const bool watch = ParamTrue(req, "watch");
  switch (fault.action) {
    case FaultSpec::Action::kDelay:
      return false;
    case FaultSpec::Action::kStatus: {
      const std::string message = fault.message.empty()
                                      ? fmt::format("injected fault: HTTP {}", fault.status)
                                      : fault.message;
      SendError(res, ApiError(fault.status, "", message));
      if (fault.retry_after_seconds >= 0) {
        res.set_header("Retry-After", std::to_string(fault.retry_after_seconds));
      }
      return true;
    }
    case FaultSpec::Action::kMalformed:
      res.status = 200;
      if (watch) {
        res.set_chunked_content_provider(
            std::string(kWatchContentType), [](size_t, httplib::DataSink& sink) {
              const std::string bad = "{\"type\":\"ADDED\",\"object\":{\"kind\":\"Pod\",oops}}\n";
              sink.write(bad.data(), bad.size());
              sink.done();
              return true;
            });
      } else {
        res.set_content(R"({"kind":"PodList","apiVersion":"v1","items":[{"metadata": oops)",
                        std::string(kJson));
      }
      return true;
    case FaultSpec::Action::kTruncate:
      res.status = 200;
      if (watch) {
        auto sent = std::make_shared<bool>(false);
        res.set_chunked_content_provider(std::string(kWatchContentType), [sent](size_t,
                                                                                httplib::DataSink&
                                                                                    sink) {
          if (*sent) return false;  // abort: the connection closes mid-stream
          *sent = true;
          const std::string partial =
              R"({"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"trunc)";
          return sink.write(partial.data(), partial.size());
        });
      } else {
        res.set_content_provider(
            4096, std::string(kJson), [](size_t offset, size_t, httplib::DataSink& sink) {
              if (offset > 0) return false;
              const std::string partial = R"({"kind":"PodList","apiVersion":"v1","items":[{"met)";
              return sink.write(partial.data(), partial.size());
            });
      }
      return true;
  }
  return false;
}

void InMemoryApiServer::HandleAdmin(const httplib::Request& req, httplib::Response& res) {
  const std::string& path = req.path;
  if (path == "/_dynmig/faults" && req.method == "POST") {
    auto body = ParseObject(req.body, "fault spec", kRequestBodyLimits);
    if (!body.ok())
      return SendError(res, ApiError(400, "BadRequest", std::string(body.status().message())));
    auto spec = FaultSpecFromJson(*body);
    if (!spec.ok())
      return SendError(res, ApiError(400, "BadRequest", std::string(spec.status().message())));
    AddFault(*spec);
    return SendJson(res, 201, R"({"ok":true})");
  }
  if (path == "/_dynmig/faults" && req.method == "DELETE") {
    ClearFaults();
    return SendJson(res, 200, R"({"ok":true})");
  }
  if (path == "/_dynmig/cut-watches" && req.method == "POST") {
    const int cut = CutWatches();
    return SendJson(res, 200, Object{{"cut", cut}}.dump());
  }
  if (path == "/_dynmig/compact" && req.method == "POST") {
    CompactHistory();
    return SendJson(res, 200, R"({"ok":true})");
  }
  if (path == "/_dynmig/gc" && req.method == "POST") {
    return SendJson(res, 200, Object{{"removed", CollectGarbage()}}.dump());
  }
  if (path == "/_dynmig/stats" && req.method == "GET") {
    return SendJson(res, 200,
                    Object{{"requests", requests_.load()},
                           {"openWatches", open_watches()},
                           {"resourceVersion", std::to_string(store_->resource_version())}}
                        .dump());
  }
  SendError(res,
            ApiError(404, "NotFound", fmt::format("no admin endpoint {} {}", req.method, path)));
}

void InMemoryApiServer::Handle(const httplib::Request& req, httplib::Response& res) {
  ++requests_;
  if (options_.log_requests) spdlog::debug("apiserver: {} {}", req.method, req.target);
  const std::string& path = req.path;
  if (path.rfind("/_dynmig/", 0) == 0) return HandleAdmin(req, res);
  const bool probe = path == "/healthz" || path == "/readyz" || path == "/livez";
  // Authenticated before a fault applies (a faulted request is still audited); a bad token is
  // still answered after the fault, as before.
  absl::StatusOr<UserInfo> who = probe
                                     ? absl::StatusOr<UserInfo>(UserInfo{
                                           std::string(kAnonymousUser), {"system:unauthenticated"}})
                                     : Authenticate(req);
  if (!ApplyFault(req, res, who.ok() ? who->username : std::string())) {
    if (who.ok()) {
      Serve(req, res, *who);
    } else {
      SendError(res, who.status());
    }
  }
  if (options_.audit && !probe && who.ok()) {
    audit_.Record(
        who->username,
        ParseRequestAttributes(req.method, path, Param(req, "watch"), Param(req, "fieldSelector")),
        res.status);
  }
}

void InMemoryApiServer::Serve(const httplib::Request& req, httplib::Response& res,
                              const UserInfo& user) {
  // Non-resource endpoints, first match wins.
  static constexpr PathRoute kPathRoutes[] = {
      {"GET", "/api", &InMemoryApiServer::ServeApiVersions},
      {"GET", "/api/v1", &InMemoryApiServer::ServeCoreResources},
      {"GET", "/apis", &InMemoryApiServer::ServeApiGroups},
      {"GET", "/apis/coordination.k8s.io", &InMemoryApiServer::ServeCoordinationGroup},
      {"GET", "/apis/coordination.k8s.io/v1", &InMemoryApiServer::ServeCoordinationResources},
      {"GET", "/apis/apps", &InMemoryApiServer::ServeAppsGroup},
      {"GET", "/apis/apps/v1", &InMemoryApiServer::ServeAppsResources},
      {"GET", "/apis/policy", &InMemoryApiServer::ServePolicyGroup},
      {"GET", "/apis/policy/v1", &InMemoryApiServer::ServePolicyResources},
      {"GET", "/apis/policy/v1beta1", &InMemoryApiServer::ServePolicyResources},
      {"GET", "/version", &InMemoryApiServer::ServeVersion},
      {"GET", "/openapi/v3", &InMemoryApiServer::ServeOpenApiIndex},
      {"GET", "/openapi/v3/**", &InMemoryApiServer::ServeOpenApiDocument},
      {"GET", "/healthz", &InMemoryApiServer::ServeHealth},
      {"GET", "/readyz", &InMemoryApiServer::ServeHealth},
      {"GET", "/livez", &InMemoryApiServer::ServeHealth},
  };
  // Resource paths (ResourceRouteOf), first match wins; a write no route serves gets 405
  // (RefuseMethod). Every write (any method but GET) has its body and parameters read first
  // (ReadWriteRequest).
  static constexpr ResourceRoute kResourceRoutes[] = {
      {"GET", Target::kCollection, &InMemoryApiServer::ServeList},  // and watch=true
      {"GET", Target::kObject, &InMemoryApiServer::ServeGet},
      {"POST", Target::kCollection, &InMemoryApiServer::ServeCreate},
      {"POST", Target::kPodBinding, &InMemoryApiServer::ServeBind},
      {"POST", Target::kPodEviction, &InMemoryApiServer::ServeEvict},
      {"POST", Target::kAny, &InMemoryApiServer::RefusePost},
      {"PUT", Target::kObject, &InMemoryApiServer::ServeUpdate},
      {"PATCH", Target::kObject, &InMemoryApiServer::ServePatch},
      {"DELETE", Target::kObject, &InMemoryApiServer::ServeDelete},
  };

  Call call{req, res, Segments(req.path)};
  for (const PathRoute& r : kPathRoutes) {
    if (r.method == req.method && PathMatches(r.pattern, call.seg)) {
      return (this->*r.handler)(call);
    }
  }
  std::optional<Route> route = ResourceRouteOf(call.seg, options_.minor_version);
  if (!route) {
    return SendError(res,
                     ApiError(404, "NotFound", "the server could not find the requested resource"));
  }
  ResourceCall resource_call(req, res, std::move(*route), user);
  if (req.method != "GET" && !ReadWriteRequest(resource_call)) return;
  for (const ResourceRoute& r : kResourceRoutes) {
    if (r.method == req.method && TargetMatches(r.target, resource_call.route)) {
      return (this->*r.handler)(resource_call);
    }
  }
  RefuseMethod(resource_call);
}

// ---- Non-resource endpoints. ----

void InMemoryApiServer::ServeApiVersions(Call& call) {
  SendJson(call.res, 200,
           Object{{"kind", "APIVersions"},
                  {"versions", {"v1"}},
                  {"serverAddressByClientCIDRs",
                   {{{"clientCIDR", "0.0.0.0/0"},
                     {"serverAddress", fmt::format("{}:{}", options_.host, port_)}}}}}
               .dump());
}

void InMemoryApiServer::ServeCoreResources(Call& call) {
  SendJson(call.res, 200, ResourceList("v1", options_.minor_version).dump());
}

void InMemoryApiServer::ServeApiGroups(Call& call) {
  SendJson(
      call.res, 200,
      Object{{"kind", "APIGroupList"},
             {"apiVersion", "v1"},
             {"groups", {AppsGroup(), CoordinationGroup(), PolicyGroup(options_.minor_version)}}}
          .dump());
}

void InMemoryApiServer::ServePolicyGroup(Call& call) {
  SendJson(call.res, 200, PolicyGroup(options_.minor_version).dump());
}

// GET /apis/policy/v1 and /apis/policy/v1beta1: the resource list of a version this server serves,
// else 404 (what a v1.20 apiserver answers for policy/v1).
void InMemoryApiServer::ServePolicyResources(Call& call) {
  const std::string group_version = call.seg.size() == 3 ? "policy/" + call.seg[2] : "";
  for (Resource r : {Resource::kPodDisruptionBudgets, Resource::kPodDisruptionBudgetsV1beta1}) {
    if (InfoFor(r).api_version == group_version && Serves(r, options_.minor_version)) {
      return SendJson(call.res, 200, ResourceList(group_version, options_.minor_version).dump());
    }
  }
  call.res.status = 404;
  call.res.set_content("404 page not found\n", "text/plain; charset=utf-8");
}

void InMemoryApiServer::ServeAppsGroup(Call& call) { SendJson(call.res, 200, AppsGroup().dump()); }

void InMemoryApiServer::ServeAppsResources(Call& call) {
  SendJson(call.res, 200, ResourceList("apps/v1", options_.minor_version).dump());
}

void InMemoryApiServer::ServeCoordinationGroup(Call& call) {
  SendJson(call.res, 200, CoordinationGroup().dump());
}

void InMemoryApiServer::ServeCoordinationResources(Call& call) {
  SendJson(call.res, 200, ResourceList("coordination.k8s.io/v1", options_.minor_version).dump());
}

void InMemoryApiServer::ServeVersion(Call& call) {
  SendJson(call.res, 200,
           Object{{"major", "1"},
                  {"minor", std::to_string(options_.minor_version)},
                  {"gitVersion", fmt::format("v1.{}.0-dynmig-inmemory", options_.minor_version)},
                  {"gitCommit", "0000000000000000000000000000000000000000"},
                  {"gitTreeState", "clean"},
                  {"buildDate", "2026-01-01T00:00:00Z"},
                  {"goVersion", "none"},
                  {"compiler", "c++"},
                  {"platform", "linux/amd64"}}
               .dump());
}

void InMemoryApiServer::ServeOpenApiIndex(Call& call) { SendJson(call.res, 200, OpenApi().index); }

void InMemoryApiServer::ServeOpenApiDocument(Call& call) {
  const OpenApiV3& openapi = OpenApi();
  std::string gv_path = call.seg[2];
  for (size_t i = 3; i < call.seg.size(); ++i) gv_path += "/" + call.seg[i];
  if (auto it = openapi.docs.find(gv_path); it != openapi.docs.end()) {
    if (call.req.has_param("hash")) call.res.set_header("Cache-Control", "public, immutable");
    return SendJson(call.res, 200, it->second);
  }
  SendError(call.res,
            ApiError(404, "NotFound", fmt::format("no OpenAPI v3 document for {}", gv_path)));
}

void InMemoryApiServer::ServeHealth(Call& call) {
  call.res.status = 200;
  call.res.set_content("ok", "text/plain");
}

// ---- Reads. ----

void InMemoryApiServer::ServeList(ResourceCall& call) {
  const httplib::Request& req = call.req;
  ListQuery query;
  query.ns = call.route.ns;
  query.label_selector = Param(req, "labelSelector");
  query.field_selector = Param(req, "fieldSelector");
  query.continue_token = Param(req, "continue");
  auto limit = IntParam(req, "limit");
  if (!limit.ok()) return SendError(call.res, limit.status());
  query.limit = *limit;
  if (ParamTrue(req, "watch")) return ServeWatch(call, query);
  auto list = store_->List(call.route.resource, query);
  if (!list.ok()) return SendError(call.res, list.status());
  if (WantsTable(req)) {
    std::vector<const Object*> objects;
    for (const auto& item : list->items) objects.push_back(&item->object);
    return SendJson(call.res, 200,
                    MakeTable(call.route.resource, objects, std::to_string(list->resource_version),
                              list->continue_token, Param(req, "includeObject"), clock_.Now())
                        .dump());
  }
  SendJson(call.res, 200, ListBody(call.info, *list));
}

void InMemoryApiServer::ServeWatch(ResourceCall& call, const ListQuery& query) {
  const httplib::Request& req = call.req;
  auto timeout = IntParam(req, "timeoutSeconds");
  if (!timeout.ok()) return SendError(call.res, timeout.status());
  const bool send_initial = ParamTrue(req, "sendInitialEvents");
  const std::string rv = send_initial ? "" : Param(req, "resourceVersion");
  auto watch = store_->StartWatch(call.route.resource, query, rv);
  if (!watch.ok()) {
    if (HttpCodeOf(watch.status()) != 410 || options_.expired_watch_as_http_error) {
      return SendError(call.res, watch.status());
    }
    return SendExpiredWatch(call.res, watch.status());
  }
  auto feed = std::make_shared<WatchFeed>();
  feed->clock = &clock_;
  feed->watch = std::move(*watch);
  const absl::Duration start = clock_.Monotonic();
  feed->deadline =
      start + (*timeout > 0 ? absl::Seconds(*timeout) : options_.default_watch_timeout);
  feed->bookmarks = ParamTrue(req, "allowWatchBookmarks");
  feed->send_initial = send_initial;
  feed->table = WantsTable(req);
  feed->include_object = Param(req, "includeObject");
  feed->bookmark_interval = options_.bookmark_interval;
  feed->heartbeat = options_.watch_heartbeat;
  feed->next_bookmark = start + feed->bookmark_interval;
  feed->next_heartbeat = start + feed->heartbeat;
  call.res.status = 200;
  call.res.set_chunked_content_provider(std::string(kWatchContentType),
                                        [this, feed](size_t, httplib::DataSink& sink) {
                                          if (stopping_) return false;
                                          return feed->Pump(sink);
                                        });
}

void InMemoryApiServer::ServeGet(ResourceCall& call) {
  const Route& route = call.route;
  if (!route.subresource.empty() && route.subresource != "status") {
    return SendError(call.res,
                     ApiError(404, "NotFound", "the server could not find the requested resource"));
  }
  auto obj = store_->Get(route.resource, route.ns, route.name);
  if (!obj.ok()) return SendError(call.res, obj.status());
  if (WantsTable(call.req)) {
    return SendJson(call.res, 200,
                    MakeTable(route.resource, {&*obj}, ResourceVersion(*obj), "",
                              Param(call.req, "includeObject"), clock_.Now())
                        .dump());
  }
  SendJson(call.res, 200, obj->dump());
}

// ---- Writes: admission (the matching webhooks; none: the plain store call), then the store. ----

void InMemoryApiServer::ServeCreate(ResourceCall& call) {
  if (!RequireBody(call)) return;
  call.attrs.operation = "CREATE";
  call.attrs.name = call.body->is_object() ? Name(*call.body) : "";
  std::vector<AdmissionWebhook> hooks = MatchingWebhooks(call.attrs);
  if (!hooks.empty()) {
    call.attrs.object = call.Complete(*call.body);
    call.attrs.options = call.OptionsObject("CreateOptions");
    auto admitted = RunAdmission(hooks, call.attrs, &call.warnings);
    if (!admitted.ok()) return call.Send(0, admitted.status());
    call.body = std::move(*admitted);
  }
  call.Send(201, store_->Create(call.route.resource, call.route.ns, *call.body, call.dry_run));
}

// Admitted as kube-apiserver does: a CREATE of the Binding (kind Binding, resource pods,
// subresource binding, named after the pod).
void InMemoryApiServer::ServeBind(ResourceCall& call) {
  if (!RequireBody(call)) return;
  call.attrs.operation = "CREATE";
  std::vector<AdmissionWebhook> hooks = MatchingWebhooks(call.attrs);
  if (!hooks.empty()) {
    Object binding = *call.body;
    if (binding.is_object()) {
      if (!binding.contains("kind")) binding["kind"] = "Binding";
      if (!binding.contains("apiVersion")) binding["apiVersion"] = "v1";
    }
    call.attrs.object = std::move(binding);
    call.attrs.options = call.OptionsObject("CreateOptions");
    auto admitted = RunAdmission(hooks, call.attrs, &call.warnings);
    if (!admitted.ok()) return call.Send(0, admitted.status());
    call.body = std::move(*admitted);
  }
  auto bound = store_->Bind(call.route.ns, call.route.name, *call.body);
  if (!bound.ok()) return SendError(call.res, bound.status());
  SendJson(call.res, 201, bound->dump());
}

// POST pods/NAME/eviction: the Eviction (policy/v1beta1, or policy/v1 from 1.22) is checked as
// the apiserver does, admitted as a CREATE of the pods/eviction subresource, then ApiStore::Evict
// applies the budgets. A refusal by a budget is a 429 whose Status names the budget in
// details.causes, as the real one.
void InMemoryApiServer::ServeEvict(ResourceCall& call) {
  if (!RequireBody(call)) return;
  const Object& body = *call.body;
  if (!body.is_object()) {
    return SendError(call.res, ApiError(400, "BadRequest", "the Eviction must be a JSON object"));
  }
  const std::string kind = body.value("kind", Object()).is_string() ? Kind(body) : "";
  const Object api_version = body.value("apiVersion", Object());
  const std::string version = api_version.is_string() ? api_version.get<std::string>() : "";
  const bool v1 = version == "policy/v1" && options_.minor_version >= 22;
  if (kind != "Eviction" || !(version == "policy/v1beta1" || v1)) {
    return SendError(
        call.res,
        ApiError(400, "BadRequest",
                 fmt::format("{} in version \"{}\" cannot be handled as a Eviction: "
                             "no kind \"{}\" is registered for version \"{}\" in "
                             "scheme \"dynmig in-memory API server\"",
                             kind.substr(0, 64), version.substr(version.find('/') + 1, 64),
                             kind.substr(0, 64), version.substr(0, 64))));
  }
  const std::string body_name = Name(body);
  if (body_name != call.route.name) {
    return SendError(call.res, ApiError(400, "BadRequest",
                                        "name in URL does not match name in Eviction object"));
  }
  const std::string body_ns = Namespace(body);
  if (!body_ns.empty() && body_ns != call.route.ns) {
    return SendError(call.res, ApiError(400, "BadRequest",
                                        "the namespace of the provided object does not match the "
                                        "namespace sent on the request"));
  }
  DeleteOptions options;
  bool dry_run = call.dry_run;
  if (auto it = body.find("deleteOptions"); it != body.end() && !it->is_null()) {
    const Object& d = *it;
    if (!d.is_object()) {
      return SendError(call.res,
                       ApiError(400, "BadRequest", "deleteOptions must be a DeleteOptions object"));
    }
    if (auto g = d.find("gracePeriodSeconds"); g != d.end() && !g->is_null()) {
      if (!g->is_number_integer()) {
        return SendError(call.res, ApiError(400, "BadRequest",
                                            "deleteOptions.gracePeriodSeconds must be an integer"));
      }
      options.grace_period_seconds = g->get<int64_t>();
    }
    options.precondition_uid = StringAt(d, "/preconditions/uid");
    options.precondition_resource_version = StringAt(d, "/preconditions/resourceVersion");
    if (auto dr = d.find("dryRun"); dr != d.end() && !dr->is_null()) {
      if (!dr->is_array() || dr->size() > 1 || (dr->size() == 1 && (*dr)[0] != "All")) {
        return SendError(call.res,
                         ApiError(400, "BadRequest",
                                  "deleteOptions.dryRun: Unsupported value: supported values: "
                                  "\"All\""));
      }
      if (dr->size() == 1) dry_run = true;
    }
  }
  call.attrs.operation = "CREATE";
  call.attrs.dry_run = dry_run;
  std::vector<AdmissionWebhook> hooks = MatchingWebhooks(call.attrs);
  if (!hooks.empty()) {
    call.attrs.object = body;
    call.attrs.options = call.OptionsObject("CreateOptions");
    auto admitted = RunAdmission(hooks, call.attrs, &call.warnings);
    if (!admitted.ok()) return call.Send(0, admitted.status());
  }
  auto evicted = store_->Evict(call.route.ns, call.route.name, options, dry_run);
  if (evicted.ok()) return call.Send(201, evicted);
  const absl::Status& st = evicted.status();
  absl::optional<absl::Cord> cause = st.GetPayload(kEvictionCausePayload);
  if (!cause) return call.Send(0, st);
  const int code = HttpCodeOf(st);
  Object status = MakeApiStatus(code, KubeReason(st), std::string(st.message()));
  status["details"] = {
      {"causes", {{{"reason", "DisruptionBudget"}, {"message", std::string(*cause)}}}}};
  SendJson(call.res, code, status.dump());
}

// A POST on an object or subresource other than pods/NAME/binding: 405, after the body checks
// every POST gets.
void InMemoryApiServer::RefusePost(ResourceCall& call) {
  if (!RequireBody(call)) return;
  SendError(call.res, ApiError(405, "MethodNotAllowed",
                               fmt::format("POST is not supported on {}", call.req.path)));
}

void InMemoryApiServer::ServeUpdate(ResourceCall& call) {
  if (!RequireBody(call)) return;
  const Route& route = call.route;
  call.attrs.operation = "UPDATE";
  std::vector<AdmissionWebhook> hooks = MatchingWebhooks(call.attrs);
  if (!hooks.empty()) {
    auto old = store_->Get(route.resource, route.ns, route.name);
    if (!old.ok()) return SendError(call.res, old.status());
    call.attrs.old_object = std::move(*old);
    call.attrs.object = call.Complete(*call.body);
    call.attrs.options = call.OptionsObject("UpdateOptions");
    auto admitted = RunAdmission(hooks, call.attrs, &call.warnings);
    if (!admitted.ok()) return call.Send(0, admitted.status());
    call.body = std::move(*admitted);
  }
  call.Send(200, store_->Update(route.resource, route.ns, route.name, *call.body, route.subresource,
                                call.dry_run));
}

void InMemoryApiServer::ServePatch(ResourceCall& call) {
  if (!call.body) {
    return SendError(call.res, ApiError(400, "BadRequest", "the patch body is empty"));
  }
  const std::string content_type = call.req.get_header_value("Content-Type");
  const std::optional<PatchType> type = PatchTypeOf(content_type);
  if (!type) {
    return SendError(call.res, ApiError(415, "UnsupportedMediaType",
                                        fmt::format("the body of the request was in an unknown "
                                                    "format - accepted media types include: "
                                                    "application/json-patch+json, "
                                                    "application/merge-patch+json, "
                                                    "application/strategic-merge-patch+json (got "
                                                    "'{}')",
                                                    content_type)));
  }
  const Route& route = call.route;
  call.attrs.operation = "UPDATE";  // admission sees a patch as an UPDATE of the patched object
  std::vector<AdmissionWebhook> hooks = MatchingWebhooks(call.attrs);
  if (hooks.empty()) {
    return call.Send(200, store_->Patch(route.resource, route.ns, route.name, *call.body, *type,
                                        route.subresource, call.dry_run));
  }
  call.attrs.options = call.OptionsObject("PatchOptions");
  auto patched = store_->PatchWithAdmission(
      route.resource, route.ns, route.name, *call.body, *type, route.subresource,
      [&](const Object& current, const Object& next) {
        call.attrs.old_object = current;
        call.attrs.object = next;
        (void)CanonicalizeQuantities(route.resource, &call.attrs.object);
        call.warnings.clear();
        return RunAdmission(hooks, call.attrs, &call.warnings);
      },
      call.dry_run);
  call.Send(200, patched);
}

void InMemoryApiServer::ServeDelete(ResourceCall& call) {
  const Route& route = call.route;
  if (!route.subresource.empty()) {
    return SendError(call.res, ApiError(405, "MethodNotAllowed", "DELETE on a subresource"));
  }
  absl::StatusOr<DeleteOptions> options = DeleteOptionsOf(call);
  if (!options.ok()) return SendError(call.res, options.status());
  call.attrs.operation = "DELETE";
  std::vector<AdmissionWebhook> hooks = MatchingWebhooks(call.attrs);
  if (!hooks.empty()) {
    auto old = store_->Get(route.resource, route.ns, route.name);
    if (!old.ok()) return SendError(call.res, old.status());
    call.attrs.old_object = std::move(*old);
    call.attrs.options = call.OptionsObject("DeleteOptions");
    if (options->grace_period_seconds) {
      call.attrs.options["gracePeriodSeconds"] = *options->grace_period_seconds;
    }
    auto admitted = RunAdmission(hooks, call.attrs, &call.warnings);
    if (!admitted.ok()) return call.Send(0, admitted.status());
  }
  call.Send(200, store_->Delete(route.resource, route.ns, route.name, *options, call.dry_run));
}

}  // namespace dynmig::kube
