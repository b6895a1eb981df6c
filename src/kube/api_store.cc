#include "kube/api_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>

#include "absl/strings/cord.h"
#include "common/quantity.h"
#include "common/status_macros.h"
#include "kube/api_status.h"
#include "kube/patch.h"

namespace dynmig::kube {
namespace {

constexpr int64_t kDefaultGracePeriodSeconds = 30;

std::string QualifiedName(Resource resource, std::string_view name) {
  const ResourceInfo& info = InfoFor(resource);
  if (info.group.empty()) return fmt::format("{} \"{}\"", info.plural, name);
  return fmt::format("{}.{} \"{}\"", info.plural, info.group, name);
}

absl::Status NotFound(Resource resource, std::string_view name) {
  return ApiError(404, "NotFound", fmt::format("{} not found", QualifiedName(resource, name)));
}

absl::Status Conflict(Resource resource, std::string_view name, std::string_view why) {
  return ApiError(
      409, "Conflict",
      fmt::format("Operation cannot be fulfilled on {}: {}", QualifiedName(resource, name), why));
}

absl::Status Invalid(Resource resource, std::string_view name, std::string_view detail) {
  return ApiError(422, "Invalid",
                  fmt::format("{} \"{}\" is invalid: {}", InfoFor(resource).kind, name, detail));
}

constexpr std::string_view kModified =
    "the object has been modified; please apply your changes to the latest version and try again";

bool ParseInt64(std::string_view s, int64_t* out) {
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

StoredPtr MakeStored(Object obj) {
  auto stored = std::make_shared<StoredObject>();
  stored->json = obj.dump();
  stored->object = std::move(obj);
  return stored;
}

// Metadata fields the server owns; a client cannot change them with PUT or PATCH.
void KeepSystemMetadata(const Object& old_obj, Object* obj) {
  Object& meta = (*obj)["metadata"];
  const Object& old_meta = old_obj["metadata"];
  for (const char* field : {"name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                            "deletionGracePeriodSeconds", "generation", "selfLink"}) {
    if (old_meta.contains(field)) {
      meta[field] = old_meta[field];
    } else {
      meta.erase(field);
    }
  }
}

// The API server decodes every resource quantity and serves it canonically ("8000" and 8000 as
// "8k", 0.5 as "500m", "1024Mi" as "1Gi"); so does this store, so code tested here sees what a
// real cluster sends. A value that is not a quantity fails the request, as there.
absl::Status CanonicalizeQuantityMap(Object* map, std::string_view kind) {
  if (map == nullptr || !map->is_object()) return absl::OkStatus();
  for (auto& [key, value] : map->items()) {
    std::string text;
    if (value.is_number_integer() || value.is_number_unsigned()) {
      text = value.dump();
    } else if (value.is_number_float()) {
      text = fmt::format("{}", value.get<double>());
    } else if (value.is_string()) {
      text = value.get<std::string>();
    } else {
      return ApiError(400, "BadRequest",
                      fmt::format("{} in version \"v1\" cannot be handled as a {}: {}: {} is not "
                                  "a quantity",
                                  kind, kind, key, value.dump()));
    }
    auto canonical = CanonicalizeQuantity(text);
    if (!canonical.ok()) {
      return ApiError(400, "BadRequest",
                      fmt::format("{} in version \"v1\" cannot be handled as a {}: {}: quantities "
                                  "must match the regular expression "
                                  "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' ({})",
                                  kind, kind, key, std::string(canonical.status().message())));
    }
    value = *std::move(canonical);
  }
  return absl::OkStatus();
}

Object* Find(Object* obj, std::string_view key) {
  if (obj == nullptr || !obj->is_object()) return nullptr;
  auto it = obj->find(key);
  return it == obj->end() ? nullptr : &*it;
}

// PodDisruptionBudgets: one stored resource (policy/v1) served in two group versions.
Resource Stored(Resource served) {
  return served == Resource::kPodDisruptionBudgetsV1beta1 ? Resource::kPodDisruptionBudgets
                                                          : served;
}
bool Converted(Resource served) { return Stored(served) != served; }

// `obj` (stored) as the served version shows it.
Object Served(Resource served, Object obj) {
  if (Converted(served) && obj.is_object() && Kind(obj) == InfoFor(served).kind) {
    obj["apiVersion"] = InfoFor(served).api_version;
  }
  return obj;
}
StoredPtr Served(Resource served, const StoredPtr& stored) {
  if (!Converted(served) || stored == nullptr) return stored;
  return MakeStored(Served(served, stored->object));
}
absl::StatusOr<Object> Served(Resource served, absl::StatusOr<Object> result) {
  if (!result.ok() || !Converted(served)) return result;
  return Served(served, std::move(*result));
}

// A body written to `served`, as the store keeps it: an apiVersion must be the served one.
absl::StatusOr<Object> Incoming(Resource served, const Object& obj) {
  if (!Converted(served) || !obj.is_object() || !obj.contains("apiVersion")) return obj;
  const ResourceInfo& info = InfoFor(served);
  if (obj["apiVersion"] != info.api_version) {
    return ApiError(400, "BadRequest",
                    fmt::format("the API version in the data ({}) does not match the expected API "
                                "version ({})",
                                obj["apiVersion"].is_string() ? obj["apiVersion"].get<std::string>()
                                                              : obj["apiVersion"].dump(),
                                info.api_version));
  }
  Object out = obj;
  out["apiVersion"] = InfoFor(Stored(served)).api_version;
  return out;
}

// A budget's minAvailable/maxUnavailable: an integer or "N%".
struct IntOrPercent {
  int64_t value = 0;
  bool percent = false;
};

// nullopt when absent (or null); an error names a malformed value.
absl::StatusOr<std::optional<IntOrPercent>> ReadIntOrPercent(const Object& spec,
                                                             const char* field) {
  if (!spec.is_object()) return std::optional<IntOrPercent>();
  auto it = spec.find(field);
  if (it == spec.end() || it->is_null()) return std::optional<IntOrPercent>();
  if (it->is_number_integer()) {
    const int64_t v = it->get<int64_t>();
    if (v < 0 || v > (int64_t{1} << 31)) {
      return absl::InvalidArgumentError(
          fmt::format("spec.{}: Invalid value: {}: must be greater than or equal to 0", field, v));
    }
    return std::optional<IntOrPercent>(IntOrPercent{v, false});
  }
  if (it->is_string()) {
    const std::string text = it->get<std::string>();
    int64_t v = 0;
    if (text.size() >= 2 && text.size() <= 5 && text.back() == '%' &&
        ParseInt64(std::string_view(text).substr(0, text.size() - 1), &v) && v >= 0 && v <= 100) {
      return std::optional<IntOrPercent>(IntOrPercent{v, true});
    }
    return absl::InvalidArgumentError(fmt::format(
        "spec.{}: Invalid value: \"{}\": must be an integer or a percentage between 0% and 100%",
        field, text.substr(0, 64)));
  }
  return absl::InvalidArgumentError(
      fmt::format("spec.{}: Invalid value: must be an integer or a percentage", field));
}

// A percentage of `total`, rounded up (as intstr.GetScaledValueFromIntOrPercent(.., true)).
int64_t Scaled(const IntOrPercent& v, int64_t total) {
  if (!v.percent) return v.value;
  return (v.value * total + 99) / 100;
}

bool PodReady(const Object& pod) {
  if (!pod.is_object() || !pod.contains("status") || !pod["status"].is_object()) return false;
  const Object& status = pod["status"];
  if (!status.contains("conditions") || !status["conditions"].is_array()) return false;
  for (const Object& c : status["conditions"]) {
    if (c.is_object() && c.value("type", Object()) == "Ready") {
      return c.value("status", Object()) == "True";
    }
  }
  return false;
}

// The budget's selector, or nullopt when it selects no pod (no selector, null, or malformed:
// validation refuses those on create).
std::optional<LabelSelector> BudgetSelector(const Object& pdb) {
  if (!pdb.is_object() || !pdb.contains("spec")) return std::nullopt;
  const Object* spec = &pdb["spec"];
  if (!spec->is_object()) return std::nullopt;
  auto it = spec->find("selector");
  if (it == spec->end() || it->is_null()) return std::nullopt;
  auto selector = LabelSelector::FromObject(*it);
  if (!selector.ok()) return std::nullopt;
  return std::move(*selector);
}

// Checks a budget's spec on create and update (422 Invalid as the apiserver's validation) and
// defaults it (neither minAvailable nor maxUnavailable: minAvailable 1).
absl::Status CheckBudgetSpec(Resource resource, std::string_view name, Object* pdb) {
  Object& spec = (*pdb)["spec"];
  if (spec.is_null()) spec = Object::object();
  if (!spec.is_object()) return Invalid(resource, name, "spec: must be an object");
  auto min = ReadIntOrPercent(spec, "minAvailable");
  if (!min.ok()) return Invalid(resource, name, std::string(min.status().message()));
  auto max = ReadIntOrPercent(spec, "maxUnavailable");
  if (!max.ok()) return Invalid(resource, name, std::string(max.status().message()));
  if (min->has_value() && max->has_value()) {
    return Invalid(resource, name,
                   "spec: Invalid value: minAvailable and maxUnavailable cannot be both set");
  }
  if (!min->has_value() && !max->has_value()) spec["minAvailable"] = 1;
  if (spec.contains("selector") && !spec["selector"].is_null()) {
    auto selector = LabelSelector::FromObject(spec["selector"]);
    if (!selector.ok()) {
      return Invalid(resource, name,
                     fmt::format("spec.selector: {}", std::string(selector.status().message())));
    }
  }
  return absl::OkStatus();
}

// apps/v1 ReplicaSet validation, as the API server's: a selector that is not empty, template labels
// it matches, replicas an int32 of at least 0 (1 when absent).
absl::Status CheckReplicaSetSpec(Resource resource, std::string_view name, Object* rs) {
  Object& spec = (*rs)["spec"];
  if (!spec.is_object()) return Invalid(resource, name, "spec: must be an object");
  if (!spec.contains("replicas") || spec["replicas"].is_null()) spec["replicas"] = 1;
  const Object& replicas = spec["replicas"];
  if (!replicas.is_number_integer() || replicas.get<int64_t>() < 0 ||
      replicas.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
    return Invalid(resource, name,
                   fmt::format("spec.replicas: Invalid value: {}: must be an integer from 0 to "
                               "2147483647",
                               replicas.dump().substr(0, 32)));
  }
  if (!spec.contains("selector") || !spec["selector"].is_object() || spec["selector"].empty()) {
    return Invalid(resource, name, "spec.selector: Required value");
  }
  auto selector = LabelSelector::FromObject(spec["selector"]);
  if (!selector.ok()) {
    return Invalid(resource, name,
                   fmt::format("spec.selector: {}", std::string(selector.status().message())));
  }
  if (selector->empty()) {
    return Invalid(resource, name, "spec.selector: Invalid value: empty selector is not valid");
  }
  const Object* tmpl = spec.contains("template") ? &spec["template"] : nullptr;
  if (tmpl == nullptr || !tmpl->is_object() || !tmpl->contains("spec") ||
      !(*tmpl)["spec"].is_object()) {
    return Invalid(resource, name, "spec.template.spec: Required value");
  }
  if (!tmpl->contains("metadata") || !selector->Matches(*tmpl)) {
    return Invalid(resource, name,
                   "spec.template.metadata.labels: Invalid value: `selector` does not match "
                   "template `labels`");
  }
  return absl::OkStatus();
}

constexpr std::string_view kBudgetViolated =
    "Cannot evict pod as it would violate the pod's disruption budget.";
constexpr std::string_view kMoreThanOneBudget =
    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not "
    "support.";
// How long a disruptedPods entry holds its pod out of the healthy count (the disruption
// controller's DeletionTimeout).
constexpr absl::Duration kDisruptedPodTimeout = absl::Minutes(2);

}  // namespace

absl::Status CanonicalizeQuantities(Resource resource, Object* obj) {
  if (resource == Resource::kPods) {
    Object* spec = Find(obj, "spec");
    for (const char* list : {"containers", "initContainers"}) {
      Object* containers = Find(spec, list);
      if (containers == nullptr || !containers->is_array()) continue;
      for (auto& c : *containers) {
        Object* resources = Find(&c, "resources");
        DYNMIG_RETURN_IF_ERROR(CanonicalizeQuantityMap(Find(resources, "limits"), "Pod"));
        DYNMIG_RETURN_IF_ERROR(CanonicalizeQuantityMap(Find(resources, "requests"), "Pod"));
      }
    }
    DYNMIG_RETURN_IF_ERROR(CanonicalizeQuantityMap(Find(spec, "overhead"), "Pod"));
  } else if (resource == Resource::kNodes) {
    Object* status = Find(obj, "status");
    DYNMIG_RETURN_IF_ERROR(CanonicalizeQuantityMap(Find(status, "capacity"), "Node"));
    DYNMIG_RETURN_IF_ERROR(CanonicalizeQuantityMap(Find(status, "allocatable"), "Node"));
  }
  return absl::OkStatus();
}

namespace {

bool HasStatusSubresource(Resource r) {
  return r == Resource::kPods || r == Resource::kNodes || r == Resource::kNamespaces ||
         r == Resource::kPodDisruptionBudgets || r == Resource::kReplicaSets;
}

}  // namespace

ApiStore::ApiStore(ApiStoreOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : RealClock()),
      rng_(std::random_device{}()) {
  if (options_.watch_history == 0) options_.watch_history = 1;
  dynmig::MutexLock lock(&mu_);
  rv_ = 1000;
  for (const char* ns : {"default", "kube-system", "kube-public", "kube-node-lease"}) {
    (void)EnsureNamespaceLocked(ns);
  }
  // Namespaces existing at startup are part of the initial state, not history.
  history_.clear();
  min_cursor_ = rv_;
}

ApiStore::~ApiStore() { Shutdown(); }

std::string ApiStore::NewUid() {
  const uint64_t a = rng_();
  const uint64_t b = rng_();
  // RFC 4122 version 4 layout.
  return fmt::format("{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}", a >> 32, (a >> 16) & 0xffff, a & 0xfff,
                     ((b >> 48) & 0x3fff) | 0x8000, b & 0xffffffffffffULL);
}

int64_t ApiStore::resource_version() const {
  dynmig::MutexLock lock(&mu_);
  return rv_;
}

StoredPtr ApiStore::CommitLocked(Resource resource, const std::string& key, Object obj,
                                 const StoredPtr& previous) {
  ++rv_;
  obj["metadata"]["resourceVersion"] = std::to_string(rv_);
  StoredPtr stored = MakeStored(std::move(obj));
  Objects(resource)[key] = stored;
  history_.push_back({rv_, resource, previous ? WatchEventType::kModified : WatchEventType::kAdded,
                      stored, previous});
  TrimHistoryLocked();
  changed_.SignalAll();
  if (resource == Resource::kPods) {
    RefreshBudgetsLocked(stored->object, previous ? &previous->object : nullptr);
  }
  return stored;
}

StoredPtr ApiStore::RemoveLocked(Resource resource, const std::string& key) {
  ObjectMap& map = Objects(resource);
  auto it = map.find(key);
  if (it == map.end()) return nullptr;
  ++rv_;
  // The DELETED event carries the final state at the deletion's resourceVersion.
  Object final_obj = it->second->object;
  final_obj["metadata"]["resourceVersion"] = std::to_string(rv_);
  StoredPtr stored = MakeStored(std::move(final_obj));
  map.erase(it);
  if (resource == Resource::kPods) pending_deletions_.erase(key);
  history_.push_back({rv_, resource, WatchEventType::kDeleted, stored, nullptr});
  TrimHistoryLocked();
  changed_.SignalAll();
  if (resource == Resource::kPods) RefreshBudgetsLocked(stored->object, nullptr);
  return stored;
}

void ApiStore::TrimHistoryLocked() {
  while (history_.size() > options_.watch_history) {
    min_cursor_ = history_.front().rv;
    history_.pop_front();
  }
}

absl::Status ApiStore::EnsureNamespaceLocked(std::string_view ns) {
  if (ns.empty()) return absl::OkStatus();
  if (Objects(Resource::kNamespaces).count(std::string(ns)) > 0) return absl::OkStatus();
  if (!IsDnsLabel(ns)) {
    return ApiError(422, "Invalid",
                    fmt::format("namespace \"{}\" is invalid: must be a DNS-1123 label", ns));
  }
  Object obj = {{"apiVersion", "v1"},
                {"kind", "Namespace"},
                {"metadata",
                 {{"name", std::string(ns)},
                  {"uid", NewUid()},
                  {"creationTimestamp", Rfc3339(Now())},
                  {"labels", {{"kubernetes.io/metadata.name", std::string(ns)}}}}},
                {"spec", {{"finalizers", {"kubernetes"}}}},
                {"status", {{"phase", "Active"}}}};
  CommitLocked(Resource::kNamespaces, std::string(ns), std::move(obj), nullptr);
  return absl::OkStatus();
}

absl::StatusOr<Object> ApiStore::Create(Resource resource, std::string_view ns, const Object& obj,
                                        bool dry_run) {
  auto body = Incoming(resource, obj);
  if (!body.ok()) return body.status();
  dynmig::MutexLock lock(&mu_);
  return Served(resource, CreateLocked(Stored(resource), ns, *body, dry_run));
}

absl::StatusOr<Object> ApiStore::CreateLocked(Resource resource, std::string_view ns,
                                              const Object& in, bool dry_run) {
  const ResourceInfo& info = InfoFor(resource);
  if (!in.is_object()) {
    return ApiError(400, "BadRequest",
                    fmt::format("the body of a {} create must be a JSON object", info.kind));
  }
  Object obj = in;
  if (obj.contains("kind") && obj["kind"] != info.kind) {
    return ApiError(400, "BadRequest",
                    fmt::format("the kind \"{}\" of the object does not match the resource {} "
                                "(kind {})",
                                obj["kind"].is_string() ? obj["kind"].get<std::string>() : "?",
                                info.plural, info.kind));
  }
  if (obj.contains("apiVersion") && obj["apiVersion"] != info.api_version) {
    return ApiError(
        400, "BadRequest",
        fmt::format("apiVersion {} does not match {}", obj["apiVersion"].dump(), info.api_version));
  }
  obj["kind"] = info.kind;
  obj["apiVersion"] = info.api_version;
  if (!obj.contains("metadata") || !obj["metadata"].is_object()) obj["metadata"] = Object::object();
  Object& meta = obj["metadata"];

  std::string name = Name(obj);
  if (name.empty()) {
    const std::string generate = StringAt(obj, "/metadata/generateName");
    if (generate.empty()) {
      return Invalid(resource, "",
                     "metadata.name: Required value: name or generateName is required");
    }
    static constexpr char kAlphabet[] = "bcdfghjklmnpqrstvwxz2456789";
    std::string suffix;
    for (int i = 0; i < 5; ++i) suffix.push_back(kAlphabet[rng_() % (sizeof(kAlphabet) - 1)]);
    name = generate + suffix;
    meta["name"] = name;
  }
  const bool name_ok = resource == Resource::kNamespaces ? IsDnsLabel(name) : IsDnsSubdomain(name);
  if (!name_ok) {
    return Invalid(resource, name,
                   fmt::format("metadata.name: Invalid value: \"{}\": a lowercase RFC 1123 {} must "
                               "consist of lower case alphanumeric characters, '-' or '.', and "
                               "must start and end with an alphanumeric character",
                               name, resource == Resource::kNamespaces ? "label" : "subdomain"));
  }
  std::string key = name;
  if (info.namespaced) {
    const std::string body_ns = Namespace(obj);
    if (!body_ns.empty() && body_ns != ns) {
      return ApiError(400, "BadRequest",
                      "the namespace of the provided object does not match the namespace sent "
                      "on the request");
    }
    if (ns.empty()) {
      return ApiError(400, "BadRequest",
                      fmt::format("{} must be created in a namespace", info.plural));
    }
    meta["namespace"] = std::string(ns);
    key = ObjectKey(ns, name);
  } else {
    meta.erase("namespace");
  }
  if (Objects(resource).count(key) > 0) {
    return ApiError(409, "AlreadyExists",
                    fmt::format("{} already exists", QualifiedName(resource, name)));
  }
  if (resource == Resource::kPods) {
    const Object* containers = nullptr;
    if (obj.contains("spec") && obj["spec"].is_object() && obj["spec"].contains("containers")) {
      containers = &obj["spec"]["containers"];
    }
    if (containers == nullptr || !containers->is_array() || containers->empty()) {
      return Invalid(resource, name, "spec.containers: Required value");
    }
    for (size_t i = 0; i < containers->size(); ++i) {
      const Object& c = (*containers)[i];
      if (!c.is_object() || StringAt(c, "/name").empty()) {
        return Invalid(resource, name, fmt::format("spec.containers[{}].name: Required value", i));
      }
      if (StringAt(c, "/image").empty()) {
        return Invalid(resource, name, fmt::format("spec.containers[{}].image: Required value", i));
      }
    }
    Object& spec = obj["spec"];
    if (!spec.contains("schedulerName")) spec["schedulerName"] = "default-scheduler";
    if (!spec.contains("restartPolicy")) spec["restartPolicy"] = "Always";
    if (!spec.contains("terminationGracePeriodSeconds")) {
      spec["terminationGracePeriodSeconds"] = kDefaultGracePeriodSeconds;
    }
    if (!obj.contains("status") || !obj["status"].is_object()) obj["status"] = Object::object();
    if (!obj["status"].contains("phase")) obj["status"]["phase"] = "Pending";
  } else if (resource == Resource::kNamespaces) {
    obj["spec"] = {{"finalizers", {"kubernetes"}}};
    obj["status"] = {{"phase", "Active"}};
    if (!meta.contains("labels") || !meta["labels"].is_object()) meta["labels"] = Object::object();
    meta["labels"]["kubernetes.io/metadata.name"] = name;
  } else if (resource == Resource::kPodDisruptionBudgets) {
    DYNMIG_RETURN_IF_ERROR(CheckBudgetSpec(resource, name, &obj));
  } else if (resource == Resource::kReplicaSets) {
    DYNMIG_RETURN_IF_ERROR(CheckReplicaSetSpec(resource, name, &obj));
  }
  for (const char* field :
       {"deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion", "selfLink"}) {
    meta.erase(field);
  }
  if (auto st = CanonicalizeQuantities(resource, &obj); !st.ok()) return st;
  meta["uid"] = NewUid();
  meta["creationTimestamp"] = Rfc3339(Now());
  meta["generation"] = 1;
  // The disruption controller's part, done at once.
  if (resource == Resource::kPodDisruptionBudgets) obj["status"] = PdbStatusLocked(obj);
  if (dry_run) return obj;
  if (info.namespaced) {
    absl::Status ns_status = EnsureNamespaceLocked(ns);
    if (!ns_status.ok()) return ns_status;
  }
  return CommitLocked(resource, key, std::move(obj), nullptr)->object;
}

absl::StatusOr<Object> ApiStore::Get(Resource served, std::string_view ns,
                                     std::string_view name) const {
  const Resource resource = Stored(served);
  dynmig::MutexLock lock(&mu_);
  const std::string key = ObjectKey(InfoFor(resource).namespaced ? ns : "", name);
  const ObjectMap& map = Objects(resource);
  auto it = map.find(key);
  if (it == map.end()) return NotFound(resource, name);
  return Served(served, it->second->object);
}

absl::StatusOr<ApiStore::ListResult> ApiStore::List(Resource served, const ListQuery& query) {
  auto result = ListStored(Stored(served), query);
  if (result.ok() && Converted(served)) {
    for (StoredPtr& item : result->items) item = Served(served, item);
  }
  return result;
}

absl::StatusOr<ApiStore::ListResult> ApiStore::ListStored(Resource resource,
                                                          const ListQuery& query) {
  auto labels = LabelSelector::Parse(query.label_selector);
  if (!labels.ok()) return ApiError(400, "BadRequest", std::string(labels.status().message()));
  auto fields = FieldSelector::Parse(query.field_selector, resource);
  if (!fields.ok()) return ApiError(400, "BadRequest", std::string(fields.status().message()));
  if (query.limit < 0) return ApiError(400, "BadRequest", "limit must not be negative");

  dynmig::MutexLock lock(&mu_);
  const absl::Time now = Now();
  // Expire old snapshots.
  for (auto it = snapshots_.begin(); it != snapshots_.end();) {
    if (now - it->second.created > options_.continue_ttl) {
      it = snapshots_.erase(it);
    } else {
      ++it;
    }
  }

  uint64_t snapshot_id = 0;
  size_t offset = 0;
  if (!query.continue_token.empty()) {
    const std::string& token = query.continue_token;
    const size_t colon = token.find(':');
    int64_t id = 0;
    int64_t off = 0;
    if (colon == std::string::npos || !ParseInt64(std::string_view(token).substr(0, colon), &id) ||
        !ParseInt64(std::string_view(token).substr(colon + 1), &off) || off < 0) {
      return ApiError(400, "BadRequest", fmt::format("invalid continue token '{}'", token));
    }
    if (snapshots_.count(static_cast<uint64_t>(id)) == 0) {
      return ApiError(410, "Expired",
                      "The provided continue parameter is too old to display a consistent list "
                      "result. You can start a new list without the continue parameter.");
    }
    snapshot_id = static_cast<uint64_t>(id);
    offset = static_cast<size_t>(off);
  } else {
    Snapshot snap{now, rv_, {}};
    const ObjectMap& map = Objects(resource);
    const bool by_ns = InfoFor(resource).namespaced && !query.ns.empty();
    const std::string prefix = by_ns ? query.ns + "/" : "";
    for (auto it = by_ns ? map.lower_bound(prefix) : map.begin(); it != map.end(); ++it) {
      if (by_ns && it->first.compare(0, prefix.size(), prefix) != 0) break;
      const Object& obj = it->second->object;
      if (labels->Matches(obj) && fields->Matches(obj)) snap.items.push_back(it->second);
    }
    if (query.limit == 0 || static_cast<size_t>(query.limit) >= snap.items.size()) {
      return ListResult{std::move(snap.items), snap.rv, "", 0};
    }
    snapshot_id = next_snapshot_++;
    snapshots_.emplace(snapshot_id, std::move(snap));
    while (snapshots_.size() > options_.max_continuations) snapshots_.erase(snapshots_.begin());
  }
  Snapshot& snap = snapshots_.at(snapshot_id);
  ListResult result;
  result.resource_version = snap.rv;
  const size_t end =
      query.limit == 0 ? snap.items.size() : std::min(snap.items.size(), offset + query.limit);
  for (size_t i = std::min(offset, snap.items.size()); i < end; ++i) {
    result.items.push_back(snap.items[i]);
  }
  result.remaining = static_cast<int64_t>(snap.items.size() - end);
  if (end < snap.items.size()) {
    result.continue_token = fmt::format("{}:{}", snapshot_id, end);
  } else {
    snapshots_.erase(snapshot_id);
  }
  return result;
}

absl::StatusOr<Object> ApiStore::Update(Resource resource, std::string_view ns,
                                        std::string_view name, const Object& obj,
                                        std::string_view subresource, bool dry_run) {
  auto body = Incoming(resource, obj);
  if (!body.ok()) return body.status();
  dynmig::MutexLock lock(&mu_);
  return Served(resource, UpdateLocked(Stored(resource), ns, name, *body, subresource,
                                       /*from_patch=*/false, dry_run));
}

absl::StatusOr<Object> ApiStore::UpdateLocked(Resource resource, std::string_view ns,
                                              std::string_view name, Object obj,
                                              std::string_view subresource, bool from_patch,
                                              bool dry_run) {
  const ResourceInfo& info = InfoFor(resource);
  if (!subresource.empty() && !(subresource == "status" && HasStatusSubresource(resource))) {
    return ApiError(404, "NotFound",
                    fmt::format("the server could not find the requested resource ({}/{})",
                                info.plural, subresource));
  }
  if (!obj.is_object()) {
    return ApiError(400, "BadRequest", "the body of an update must be a JSON object");
  }
  const std::string key = ObjectKey(info.namespaced ? ns : "", name);
  ObjectMap& map = Objects(resource);
  auto it = map.find(key);
  if (it == map.end()) return NotFound(resource, name);
  StoredPtr current = it->second;
  const Object& old_obj = current->object;

  if (obj.contains("kind") && obj["kind"] != info.kind) {
    return ApiError(400, "BadRequest",
                    fmt::format("the kind of the object does not match {}", info.kind));
  }
  if (!obj.contains("metadata") || !obj["metadata"].is_object()) obj["metadata"] = Object::object();
  const std::string body_name = Name(obj);
  if (!from_patch && !body_name.empty() && body_name != name) {
    return ApiError(400, "BadRequest",
                    fmt::format("the name of the object ({}) does not match the name on the URL "
                                "({})",
                                body_name, name));
  }
  if (!from_patch && info.namespaced && !Namespace(obj).empty() && Namespace(obj) != ns) {
    return ApiError(400, "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request");
  }
  // Optimistic concurrency: a resourceVersion in the body must be the current one.
  const std::string want_rv = ResourceVersion(obj);
  if (!want_rv.empty() && want_rv != ResourceVersion(old_obj)) {
    return Conflict(resource, name, kModified);
  }

  Object next;
  if (subresource == "status") {
    next = old_obj;
    if (obj.contains("status")) {
      next["status"] = obj["status"];
    } else {
      next.erase("status");
    }
  } else {
    next = std::move(obj);
    next["kind"] = info.kind;
    next["apiVersion"] = info.api_version;
    if (HasStatusSubresource(resource)) {
      if (old_obj.contains("status")) {
        next["status"] = old_obj["status"];
      } else {
        next.erase("status");
      }
    }
    KeepSystemMetadata(old_obj, &next);
    if (resource == Resource::kPods && NodeName(next) != NodeName(old_obj)) {
      return Invalid(resource, name,
                     "spec.nodeName: Forbidden: pod updates may not change spec.nodeName (use "
                     "the pods/binding subresource)");
    }
    if (resource == Resource::kNamespaces) next["spec"] = old_obj.value("spec", Object::object());
    if (resource == Resource::kPodDisruptionBudgets) {
      DYNMIG_RETURN_IF_ERROR(CheckBudgetSpec(resource, name, &next));
    }
    if (resource == Resource::kReplicaSets) {
      DYNMIG_RETURN_IF_ERROR(CheckReplicaSetSpec(resource, name, &next));
    }
  }
  next["metadata"]["resourceVersion"] = ResourceVersion(old_obj);
  if (auto st = CanonicalizeQuantities(resource, &next); !st.ok()) return st;
  if (next == old_obj) return old_obj;  // no-op: no new resourceVersion, no event
  if (subresource.empty() && next.value("spec", Object()) != old_obj.value("spec", Object())) {
    next["metadata"]["generation"] = old_obj["metadata"].value("generation", 1) + 1;
  }
  // The disruption controller's part, done at once: a new spec gets its status.
  if (resource == Resource::kPodDisruptionBudgets && subresource.empty() &&
      next.value("spec", Object()) != old_obj.value("spec", Object())) {
    next["status"] = PdbStatusLocked(next);
  }
  if (dry_run) return next;
  return CommitLocked(resource, key, std::move(next), current)->object;
}

absl::StatusOr<std::pair<Object, Object>> ApiStore::PatchedLocked(Resource resource,
                                                                  std::string_view ns,
                                                                  std::string_view name,
                                                                  const Object& patch,
                                                                  PatchType type) {
  const std::string key = ObjectKey(InfoFor(resource).namespaced ? ns : "", name);
  const ObjectMap& map = Objects(resource);
  auto it = map.find(key);
  if (it == map.end()) return NotFound(resource, name);
  const Object& current = it->second->object;
  auto patched = ApplyPatch(current, patch, type);
  if (!patched.ok()) {
    return ApiError(type == PatchType::kJson ? 422 : 400,
                    type == PatchType::kJson ? "Invalid" : "BadRequest",
                    std::string(patched.status().message()));
  }
  if (!patched->is_object()) {
    return ApiError(422, "Invalid", "the patched object is not a JSON object");
  }
  if (Name(*patched) != Name(current) || Namespace(*patched) != Namespace(current) ||
      Uid(*patched) != Uid(current)) {
    return Invalid(resource, name,
                   "metadata.name, metadata.namespace and metadata.uid cannot be changed");
  }
  return std::make_pair(current, std::move(*patched));
}

absl::StatusOr<Object> ApiStore::Patch(Resource resource, std::string_view ns,
                                       std::string_view name, const Object& patch, PatchType type,
                                       std::string_view subresource, bool dry_run) {
  const Resource served = resource;
  resource = Stored(served);
  dynmig::MutexLock lock(&mu_);
  auto patched = PatchedLocked(resource, ns, name, patch, type);
  if (!patched.ok()) return patched.status();
  // A resourceVersion left in the patched object by the patch is a precondition; the current one
  // passes through unchanged.
  return Served(served, UpdateLocked(resource, ns, name, std::move(patched->second), subresource,
                                     /*from_patch=*/true, dry_run));
}

absl::StatusOr<Object> ApiStore::PatchWithAdmission(Resource resource, std::string_view ns,
                                                    std::string_view name, const Object& patch,
                                                    PatchType type, std::string_view subresource,
                                                    const AdmitFn& admit, bool dry_run) {
  const Resource served = resource;
  resource = Stored(served);
  constexpr int kMaxAttempts = 5;
  for (int attempt = 1;; ++attempt) {
    std::pair<Object, Object> versions;
    {
      dynmig::MutexLock lock(&mu_);
      auto patched = PatchedLocked(resource, ns, name, patch, type);
      if (!patched.ok()) return patched.status();
      versions = std::move(*patched);
    }
    const auto& [current, patched] = versions;
    auto admitted = admit(Served(served, current), Served(served, patched));
    if (!admitted.ok()) return admitted.status();
    if (Converted(served)) {
      admitted = Incoming(served, *admitted);
      if (!admitted.ok()) return admitted.status();
    }
    if (!admitted->is_object() || Name(*admitted) != Name(current) ||
        Namespace(*admitted) != Namespace(current) || Uid(*admitted) != Uid(current)) {
      return Invalid(resource, name,
                     "metadata.name, metadata.namespace and metadata.uid cannot be changed");
    }
    dynmig::MutexLock lock(&mu_);
    auto it = Objects(resource).find(ObjectKey(InfoFor(resource).namespaced ? ns : "", name));
    if (it == Objects(resource).end()) return NotFound(resource, name);
    const bool changed = ResourceVersion(it->second->object) != ResourceVersion(current);
    const bool pinned = ResourceVersion(patched) != ResourceVersion(current);
    if (changed && !pinned && attempt < kMaxAttempts) continue;
    return Served(served, UpdateLocked(resource, ns, name, std::move(*admitted), subresource,
                                       /*from_patch=*/true, dry_run));
  }
}

absl::StatusOr<Object> ApiStore::Delete(Resource resource, std::string_view ns,
                                        std::string_view name, const DeleteOptions& options,
                                        bool dry_run) {
  dynmig::MutexLock lock(&mu_);
  return Served(resource, DeleteLocked(Stored(resource), ns, name, options, dry_run));
}

absl::StatusOr<Object> ApiStore::DeleteLocked(Resource resource, std::string_view ns,
                                              std::string_view name, const DeleteOptions& options,
                                              bool dry_run) {
  const ResourceInfo& info = InfoFor(resource);
  const std::string key = ObjectKey(info.namespaced ? ns : "", name);
  ObjectMap& map = Objects(resource);
  auto it = map.find(key);
  if (it == map.end()) return NotFound(resource, name);
  StoredPtr current = it->second;
  const Object& obj = current->object;
  if (!options.precondition_uid.empty() && options.precondition_uid != Uid(obj)) {
    return Conflict(resource, name,
                    fmt::format("Precondition failed: UID in precondition: {}, UID in object "
                                "meta: {}",
                                options.precondition_uid, Uid(obj)));
  }
  if (!options.precondition_resource_version.empty() &&
      options.precondition_resource_version != ResourceVersion(obj)) {
    return Conflict(resource, name,
                    fmt::format("Precondition failed: ResourceVersion in precondition: {}, "
                                "ResourceVersion in object meta: {}",
                                options.precondition_resource_version, ResourceVersion(obj)));
  }
  if (options.grace_period_seconds && *options.grace_period_seconds < 0) {
    return Invalid(resource, name, "gracePeriodSeconds must not be negative");
  }

  if (resource == Resource::kNamespaces) {
    if (name == "default" || name == "kube-system" || name == "kube-public") {
      return ApiError(403, "Forbidden",
                      fmt::format("namespaces \"{}\" is forbidden: this namespace may not be "
                                  "deleted",
                                  name));
    }
    if (dry_run) return obj;
    // Remove everything in the namespace first (the real server does this asynchronously).
    const std::string prefix = std::string(name) + "/";
    for (Resource r : {Resource::kPods, Resource::kEvents, Resource::kLeases, Resource::kConfigMaps,
                       Resource::kPodDisruptionBudgets, Resource::kReplicaSets}) {
      ObjectMap& objs = Objects(r);
      std::vector<std::string> keys;
      for (auto o = objs.lower_bound(prefix);
           o != objs.end() && o->first.compare(0, prefix.size(), prefix) == 0; ++o) {
        keys.push_back(o->first);
      }
      for (const auto& k : keys) RemoveLocked(r, k);
    }
    return RemoveLocked(resource, key)->object;
  }

  if (resource == Resource::kPods) {
    int64_t grace = kDefaultGracePeriodSeconds;
    if (options.grace_period_seconds) {
      grace = *options.grace_period_seconds;
    } else if (obj.contains("spec") && obj["spec"].contains("terminationGracePeriodSeconds") &&
               obj["spec"]["terminationGracePeriodSeconds"].is_number_integer()) {
      grace = obj["spec"]["terminationGracePeriodSeconds"].get<int64_t>();
    }
    // Like the API server: a pod no kubelet runs (unbound) or that has finished goes at once.
    if (NodeName(obj).empty() || IsTerminated(obj)) grace = 0;
    if (grace > 0) {
      const absl::Time deadline = Now() + absl::Seconds(grace);
      auto pending = pending_deletions_.find(key);
      if (pending != pending_deletions_.end() && pending->second <= deadline) {
        return obj;  // already being deleted at least as soon
      }
      Object next = obj;
      next["metadata"]["deletionTimestamp"] = Rfc3339(deadline);
      next["metadata"]["deletionGracePeriodSeconds"] = grace;
      if (dry_run) return next;
      pending_deletions_[key] = deadline;
      return CommitLocked(resource, key, std::move(next), current)->object;
    }
  }
  if (dry_run) return obj;
  return RemoveLocked(resource, key)->object;
}

absl::StatusOr<Object> ApiStore::Bind(std::string_view ns, std::string_view name,
                                      const Object& binding) {
  if (!binding.is_object()) {
    return ApiError(400, "BadRequest", "the body of a binding must be a JSON object");
  }
  const std::string body_name = Name(binding);
  if (!body_name.empty() && body_name != name) {
    return ApiError(400, "BadRequest",
                    fmt::format("the name of the object ({}) does not match the name on the URL "
                                "({})",
                                body_name, name));
  }
  const std::string node = StringAt(binding, "/target/name");
  const std::string target_kind = StringAt(binding, "/target/kind");
  if (node.empty()) {
    return ApiError(422, "Invalid",
                    fmt::format("Binding \"{}\" is invalid: target.name: Required value", name));
  }
  if (!target_kind.empty() && target_kind != "Node") {
    return ApiError(422, "Invalid",
                    fmt::format("Binding \"{}\" is invalid: target.kind: Unsupported value: "
                                "\"{}\": supported values: \"Node\"",
                                name, target_kind));
  }
  dynmig::MutexLock lock(&mu_);
  const std::string key = ObjectKey(ns, name);
  ObjectMap& map = Objects(Resource::kPods);
  auto it = map.find(key);
  if (it == map.end()) return NotFound(Resource::kPods, name);
  StoredPtr current = it->second;
  const Object& pod = current->object;
  const std::string want_uid = StringAt(binding, "/metadata/uid");
  if (!want_uid.empty() && want_uid != Uid(pod)) {
    return Conflict(Resource::kPods, name,
                    fmt::format("Precondition failed: UID in precondition: {}, UID in object "
                                "meta: {}",
                                want_uid, Uid(pod)));
  }
  const std::string want_rv = StringAt(binding, "/metadata/resourceVersion");
  if (!want_rv.empty() && want_rv != ResourceVersion(pod)) {
    return Conflict(Resource::kPods, name, kModified);
  }
  if (IsBeingDeleted(pod)) {
    return Conflict(Resource::kPods, name,
                    fmt::format("pod {} is being deleted, cannot be assigned to a host", name));
  }
  if (!NodeName(pod).empty()) {
    return Conflict(Resource::kPods, name,
                    fmt::format("pod {} is already assigned to node \"{}\"", name, NodeName(pod)));
  }
  Object next = pod;
  next["spec"]["nodeName"] = node;
  if (binding.contains("metadata") && binding["metadata"].contains("annotations") &&
      binding["metadata"]["annotations"].is_object()) {
    for (const auto& [k, v] : binding["metadata"]["annotations"].items()) {
      next["metadata"]["annotations"][k] = v;
    }
  }
  Object& status = next["status"];
  if (!status.contains("conditions") || !status["conditions"].is_array()) {
    status["conditions"] = Object::array();
  }
  Object& conditions = status["conditions"];
  Object scheduled = {{"type", "PodScheduled"},
                      {"status", "True"},
                      {"lastProbeTime", nullptr},
                      {"lastTransitionTime", Rfc3339(Now())}};
  auto cond = std::find_if(conditions.begin(), conditions.end(), [](const Object& c) {
    return c.is_object() && c.value("type", "") == "PodScheduled";
  });
  if (cond == conditions.end()) {
    conditions.push_back(scheduled);
  } else {
    *cond = scheduled;
  }
  CommitLocked(Resource::kPods, key, std::move(next), current);
  return MakeApiStatus(201, "", "");
}

Object ApiStore::PdbStatusLocked(const Object& pdb) const {
  const std::string ns = Namespace(pdb);
  std::vector<const Object*> pods;
  if (std::optional<LabelSelector> selector = BudgetSelector(pdb)) {
    const ObjectMap& map = Objects(Resource::kPods);
    const std::string prefix = ns + "/";
    for (auto it = map.lower_bound(prefix);
         it != map.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
      if (selector->Matches(it->second->object)) pods.push_back(&it->second->object);
    }
  }
  const int64_t expected = static_cast<int64_t>(pods.size());
  const absl::Time now = Now();
  // disruptedPods: kept while the pod exists, is not yet being deleted and the entry is young.
  Object disrupted = Object::object();
  const Object old_disrupted =
      pdb.is_object() && pdb.contains("status") && pdb["status"].is_object()
          ? pdb["status"].value("disruptedPods", Object::object())
          : Object::object();
  if (old_disrupted.is_object()) {
    for (const Object* pod : pods) {
      auto entry = old_disrupted.find(Name(*pod));
      if (entry == old_disrupted.end() || !entry->is_string() || IsBeingDeleted(*pod)) continue;
      auto at = ParseRfc3339(entry->get<std::string>());
      if (at.ok() && *at + kDisruptedPodTimeout > now) disrupted[Name(*pod)] = *entry;
    }
  }
  int64_t healthy = 0;
  for (const Object* pod : pods) {
    if (Phase(*pod) == "Running" && PodReady(*pod) && !IsBeingDeleted(*pod) &&
        !disrupted.contains(Name(*pod))) {
      ++healthy;
    }
  }
  const Object spec = pdb.is_object() ? pdb.value("spec", Object::object()) : Object::object();
  int64_t desired = 0;
  auto min = ReadIntOrPercent(spec, "minAvailable");
  auto max = ReadIntOrPercent(spec, "maxUnavailable");
  if (min.ok() && min->has_value()) {
    desired = Scaled(**min, expected);
  } else if (max.ok() && max->has_value()) {
    desired = std::max<int64_t>(0, expected - Scaled(**max, expected));
  }
  Object status = {
      {"observedGeneration",
       pdb.is_object() && pdb.contains("metadata") ? pdb["metadata"].value("generation", 1) : 1},
      {"disruptionsAllowed", std::max<int64_t>(0, healthy - desired)},
      {"currentHealthy", healthy},
      {"desiredHealthy", desired},
      {"expectedPods", expected}};
  if (!disrupted.empty()) status["disruptedPods"] = std::move(disrupted);
  return status;
}

void ApiStore::RefreshBudgetsLocked(const Object& pod, const Object* previous) {
  ObjectMap& budgets = Objects(Resource::kPodDisruptionBudgets);
  if (budgets.empty()) return;
  const std::string prefix = Namespace(pod) + "/";
  std::vector<std::pair<std::string, StoredPtr>> touched;
  for (auto b = budgets.lower_bound(prefix);
       b != budgets.end() && b->first.compare(0, prefix.size(), prefix) == 0; ++b) {
    std::optional<LabelSelector> selector = BudgetSelector(b->second->object);
    if (selector &&
        (selector->Matches(pod) || (previous != nullptr && selector->Matches(*previous)))) {
      touched.emplace_back(b->first, b->second);
    }
  }
  for (const auto& [key, current] : touched) {
    Object status = PdbStatusLocked(current->object);
    if (current->object.value("status", Object()) == status) continue;
    Object next = current->object;
    next["status"] = std::move(status);
    CommitLocked(Resource::kPodDisruptionBudgets, key, std::move(next), current);
  }
}

absl::StatusOr<Object> ApiStore::Evict(std::string_view ns, std::string_view name,
                                       const DeleteOptions& options, bool dry_run) {
  dynmig::MutexLock lock(&mu_);
  const std::string key = ObjectKey(ns, name);
  ObjectMap& pods = Objects(Resource::kPods);
  auto it = pods.find(key);
  if (it == pods.end()) return NotFound(Resource::kPods, name);
  const Object pod = it->second->object;
  if (!options.precondition_uid.empty() && options.precondition_uid != Uid(pod)) {
    return Conflict(Resource::kPods, name,
                    fmt::format("Precondition failed: UID in precondition: {}, UID in object "
                                "meta: {}",
                                options.precondition_uid, Uid(pod)));
  }
  auto evict = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<Object> {
    auto deleted = DeleteLocked(Resource::kPods, ns, name, options, dry_run);
    if (!deleted.ok()) return deleted.status();
    return MakeApiStatus(201, "", "");
  };
  // A pod that does not run (or no longer will) is evicted without looking at budgets.
  const std::string phase = Phase(pod);
  if (phase == "Pending" || phase == "Succeeded" || phase == "Failed" || IsBeingDeleted(pod)) {
    return evict();
  }
  std::vector<std::pair<std::string, StoredPtr>> budgets;
  {
    const ObjectMap& map = Objects(Resource::kPodDisruptionBudgets);
    const std::string prefix = std::string(ns) + "/";
    for (auto b = map.lower_bound(prefix);
         b != map.end() && b->first.compare(0, prefix.size(), prefix) == 0; ++b) {
      std::optional<LabelSelector> selector = BudgetSelector(b->second->object);
      if (selector && selector->Matches(pod)) budgets.emplace_back(b->first, b->second);
    }
  }
  if (budgets.empty()) return evict();
  if (budgets.size() > 1) return ApiError(500, "InternalError", std::string(kMoreThanOneBudget));
  const auto& [budget_key, budget] = budgets.front();
  Object status = PdbStatusLocked(budget->object);
  const int64_t healthy = status.value("currentHealthy", int64_t{0});
  const int64_t desired = status.value("desiredHealthy", int64_t{0});
  // A running pod that is not ready is not counted healthy: evicting it takes nothing from the
  // budget, allowed while the application has its healthy pods.
  if (!PodReady(pod) && healthy >= desired && desired > 0) return evict();
  if (status.value("disruptionsAllowed", int64_t{0}) <= 0) {
    absl::Status refused = ApiError(429, "TooManyRequests", std::string(kBudgetViolated));
    refused.SetPayload(kEvictionCausePayload,
                       absl::Cord(fmt::format("The disruption budget {} needs {} healthy pods and "
                                              "has {} currently",
                                              Name(budget->object), desired, healthy)));
    return refused;
  }
  status["disruptionsAllowed"] = status.value("disruptionsAllowed", int64_t{0}) - 1;
  if (dry_run) return evict();
  if (!status.contains("disruptedPods")) status["disruptedPods"] = Object::object();
  status["disruptedPods"][std::string(name)] = Rfc3339(Now());
  if (options.grace_period_seconds && *options.grace_period_seconds < 0) {
    return Invalid(Resource::kPods, name, "gracePeriodSeconds must not be negative");
  }
  // The budget first, as the apiserver does; the pod's deletion then refreshes it (the pod no
  // longer counts as healthy, and its disruptedPods entry goes once it is being deleted).
  Object next = budget->object;
  next["status"] = std::move(status);
  CommitLocked(Resource::kPodDisruptionBudgets, budget_key, std::move(next), budget);
  auto deleted = DeleteLocked(Resource::kPods, ns, name, options, /*dry_run=*/false);
  if (!deleted.ok()) return deleted.status();
  return MakeApiStatus(201, "", "");
}

int ApiStore::CollectGarbage() {
  dynmig::MutexLock lock(&mu_);
  const absl::Time now = Now();
  std::vector<std::string> due;
  for (const auto& [key, deadline] : pending_deletions_) {
    if (deadline <= now) due.push_back(key);
  }
  for (const auto& key : due) RemoveLocked(Resource::kPods, key);
  return static_cast<int>(due.size());
}

void ApiStore::CompactHistory() {
  dynmig::MutexLock lock(&mu_);
  history_.clear();
  min_cursor_ = rv_;
  changed_.SignalAll();
}

absl::StatusOr<std::unique_ptr<ApiStore::Watch>> ApiStore::StartWatch(
    Resource served, const ListQuery& query, std::string_view resource_version) {
  const Resource resource = Stored(served);
  auto labels = LabelSelector::Parse(query.label_selector);
  if (!labels.ok()) return ApiError(400, "BadRequest", std::string(labels.status().message()));
  auto fields = FieldSelector::Parse(query.field_selector, resource);
  if (!fields.ok()) return ApiError(400, "BadRequest", std::string(fields.status().message()));
  int64_t from = 0;
  const bool initial = resource_version.empty() || resource_version == "0";
  if (!initial && (!ParseInt64(resource_version, &from) || from < 0)) {
    return ApiError(400, "BadRequest",
                    fmt::format("invalid resourceVersion \"{}\"", resource_version));
  }
  dynmig::MutexLock lock(&mu_);
  if (shutdown_) return ApiError(503, "ServiceUnavailable", "the server is shutting down");
  const std::string ns = InfoFor(resource).namespaced ? query.ns : "";
  if (initial) {
    from = rv_;
  } else if (from < min_cursor_) {
    return ApiError(410, "Expired",
                    fmt::format("too old resource version: {} ({})", from, min_cursor_ + 1));
  } else if (from > rv_) {
    return ApiError(410, "Expired",
                    fmt::format("too large resource version: {} (current {}); relist", from, rv_));
  }
  std::unique_ptr<Watch> watch(
      new Watch(this, resource, ns, std::move(*labels), std::move(*fields), from, cut_generation_));
  watch->served_ = served;
  if (initial) {
    const ObjectMap& map = Objects(resource);
    for (const auto& [key, stored] : map) {
      if (watch->Matches(stored->object)) {
        watch->initial_.push_back({WatchEventType::kAdded, Served(served, stored)});
      }
    }
  }
  ++open_watches_;
  return watch;
}

int ApiStore::CutWatches() {
  dynmig::MutexLock lock(&mu_);
  ++cut_generation_;
  changed_.SignalAll();
  return static_cast<int>(open_watches_);
}

void ApiStore::Shutdown() {
  dynmig::MutexLock lock(&mu_);
  shutdown_ = true;
  changed_.SignalAll();
}

size_t ApiStore::open_watches() const {
  dynmig::MutexLock lock(&mu_);
  return open_watches_;
}

ApiStore::Watch::Watch(ApiStore* store, Resource resource, std::string ns, LabelSelector labels,
                       FieldSelector fields, int64_t cursor, uint64_t cut_generation)
    : store_(store),
      resource_(resource),
      served_(resource),
      ns_(std::move(ns)),
      labels_(std::move(labels)),
      fields_(std::move(fields)),
      cursor_(cursor),
      cut_generation_(cut_generation) {}

ApiStore::Watch::~Watch() {
  dynmig::MutexLock lock(&store_->mu_);
  --store_->open_watches_;
}

std::vector<StoreEvent> ApiStore::Watch::TakeInitialEvents() { return std::move(initial_); }

bool ApiStore::Watch::Matches(const Object& obj) const {
  if (!ns_.empty() && Namespace(obj) != ns_) return false;
  return labels_.Matches(obj) && fields_.Matches(obj);
}

absl::StatusOr<std::vector<StoreEvent>> ApiStore::Watch::Next(const Clock& clock,
                                                              absl::Duration max_wait,
                                                              size_t max_events) {
  dynmig::MutexLock lock(&store_->mu_);
  clock.WaitFor(store_->changed_, store_->mu_, max_wait,
                [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(store_->mu_) {
                  return store_->shutdown_ || store_->cut_generation_ != cut_generation_ ||
                         store_->rv_ > cursor_;
                });
  if (store_->shutdown_) return ApiError(503, "ServiceUnavailable", "server shutting down");
  if (store_->cut_generation_ != cut_generation_) {
    return absl::CancelledError("watch cut by fault injection");
  }
  std::vector<StoreEvent> out;
  if (store_->rv_ <= cursor_) return out;
  if (cursor_ < store_->min_cursor_) {
    return ApiError(
        410, "Expired",
        fmt::format("too old resource version: {} ({})", cursor_, store_->min_cursor_ + 1));
  }
  const int64_t first_rv = store_->history_.front().rv;
  size_t index = static_cast<size_t>(cursor_ + 1 - first_rv);
  while (index < store_->history_.size() && out.size() < max_events) {
    const HistoryEvent& ev = store_->history_[index++];
    cursor_ = ev.rv;
    if (ev.resource != resource_) continue;
    const bool now_matches = Matches(ev.object->object);
    switch (ev.type) {
      case WatchEventType::kAdded:
        if (now_matches) out.push_back({WatchEventType::kAdded, ev.object});
        break;
      case WatchEventType::kDeleted:
        if (now_matches) out.push_back({WatchEventType::kDeleted, ev.object});
        break;
      case WatchEventType::kModified: {
        const bool was_matching = ev.previous && Matches(ev.previous->object);
        if (now_matches && was_matching) {
          out.push_back({WatchEventType::kModified, ev.object});
        } else if (now_matches) {
          out.push_back({WatchEventType::kAdded, ev.object});
        } else if (was_matching) {
          out.push_back({WatchEventType::kDeleted, ev.object});
        }
        break;
      }
      default:
        break;
    }
  }
  if (Converted(served_)) {
    for (StoreEvent& ev : out) ev.object = Served(served_, ev.object);
  }
  return out;
}

}  // namespace dynmig::kube
