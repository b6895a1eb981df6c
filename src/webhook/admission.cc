#include "webhook/admission.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <span>

#include "absl/strings/escaping.h"
#include "common/bounded_json.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "mig/capacity.h"
#include "mig/catalogue.h"
#include "mig/preference.h"
#include "mig/sizing.h"
#include "protocol/annotations.h"
#include "protocol/gpu_mode.h"
#include "protocol/pod_request.h"

namespace dynmig::webhook {
namespace {

using nlohmann::json;

std::string SliceClass(std::string_view profile) {
  const size_t dot = profile.find('.');
  if (dot == std::string_view::npos || dot == 0) return std::string(profile);
  return std::string(profile.substr(0, dot));
}

const json* Member(const json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(std::string(key));
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::string StringMember(const json& obj, std::string_view key) {
  const json* v = Member(obj, key);
  return v != nullptr && v->is_string() ? v->get<std::string>() : "";
}

// The annotation value, or nullopt when absent (a non-string value reads as its JSON text).
std::optional<std::string> PodAnnotation(const json& pod, std::string_view key) {
  const json* meta = Member(pod, "metadata");
  if (meta == nullptr) return std::nullopt;
  const json* ann = Member(*meta, "annotations");
  if (ann == nullptr) return std::nullopt;
  const json* v = Member(*ann, key);
  if (v == nullptr) return std::nullopt;
  return v->is_string() ? v->get<std::string>() : v->dump();
}

// reason is never "Invalid": kubectl before v1.2x prints only "The request is invalid" for an
// Invalid status without details, hiding the message; BadRequest and Forbidden show it on every
// kubectl.
void Deny(json& response, int code, std::string_view reason, std::string message) {
  response["allowed"] = false;
  response["status"] = {{"code", code},
                        {"status", "Failure"},
                        {"reason", std::string(reason)},
                        {"message", std::move(message)}};
}

bool Listed(const std::vector<std::string>& list, std::string_view value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

// The keys whose annotation differs between `object` and `old_object` (added, changed or removed);
// without `old_object` (a CREATE), the keys `object` carries.
std::vector<std::string> ChangedAnnotations(std::span<const std::string_view> keys,
                                            const json& object, const json* old_object) {
  std::vector<std::string> out;
  for (const std::string_view key : keys) {
    const auto value = PodAnnotation(object, key);
    if (old_object == nullptr ? value.has_value() : value != PodAnnotation(*old_object, key)) {
      out.emplace_back(key);
    }
  }
  return out;
}

// "nvidia.com/gpu, nvidia.com/gpumem, ...": what makes a pod dynmig's.
std::string ManagedResources(const protocol::ResourceNames& r) {
  return fmt::format("{}, {}, {} or {}", r.count, r.memory, r.memory_percentage, r.cores);
}

// The refusal of protocol annotations written by someone other than `writers`.
std::string SystemAnnotationsMessage(std::string_view subject,
                                     const std::vector<std::string>& written,
                                     const std::vector<std::string>& writers,
                                     std::string_view username, std::string_view verb) {
  return fmt::format(
      "{}: {} {} written only by the dynmig scheduler and device plugin ({}); user \"{}\" may not "
      "{} {}",
      subject, fmt::join(written, ", "), written.size() == 1 ? "is" : "are",
      fmt::join(writers, ", "), username, verb, written.size() == 1 ? "it" : "them");
}

}  // namespace

int NodeInstanceCapacity(const std::vector<protocol::DeviceInfo>& gpus,
                         const mig::Allowlist& allowlist) {
  int64_t total = 0;
  for (const auto& gpu : gpus) {
    if (gpu.mode.find(protocol::kVgpuModeMig) == std::string::npos || gpu.mig_profiles.empty()) {
      continue;
    }
    const mig::AllowlistEntry* entry = allowlist.Match(gpu.type);
    if (entry == nullptr) continue;
    total = std::min<int64_t>(
        total + mig::MostInstances(protocol::ToCapability(gpu), entry->profiles), INT_MAX);
  }
  return static_cast<int>(total);
}

void NodeCapacityIndex::Upsert(const std::string& node, std::string_view register_value) {
  const size_t hash = std::hash<std::string_view>{}(register_value);
  dynmig::MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  if (it != nodes_.end() && it->second.hash == hash) return;
  auto gpus = protocol::DecodeNodeRegister(register_value);
  const int capacity = gpus.ok() ? NodeInstanceCapacity(*gpus, allowlist_) : 0;
  if (it != nodes_.end()) {
    capacities_.erase(capacities_.find(it->second.capacity));
    it->second = Entry{hash, capacity};
  } else {
    nodes_.emplace(node, Entry{hash, capacity});
  }
  capacities_.insert(capacity);
}

void NodeCapacityIndex::Remove(const std::string& node) {
  dynmig::MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return;
  capacities_.erase(capacities_.find(it->second.capacity));
  nodes_.erase(it);
}

int NodeCapacityIndex::Max() const {
  dynmig::MutexLock lock(&mu_);
  return capacities_.empty() ? 0 : *capacities_.rbegin();
}

std::vector<std::string> PreferenceChoices(const mig::Allowlist& allowlist) {
  std::vector<std::string> out = allowlist.AllProfileNames();
  std::vector<std::string> classes;
  for (const auto& name : out) {
    std::string c = SliceClass(name);
    if (std::find(classes.begin(), classes.end(), c) == classes.end()) {
      classes.push_back(std::move(c));
    }
  }
  for (auto& c : classes) {
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(std::move(c));
  }
  return out;
}

namespace {

// Edit distance (case-insensitive), for "did you mean".
size_t Distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                        std::tolower(static_cast<unsigned char>(b[j - 1]));
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (same ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The nominal memory of a profile name ("4g.20gb" -> 20480 MiB), 0 when the name has none.
uint64_t NominalMib(std::string_view profile) {
  const size_t dot = profile.find('.');
  if (dot == std::string_view::npos) return 0;
  uint64_t gb = 0;
  size_t i = dot + 1;
  for (; i < profile.size() && std::isdigit(static_cast<unsigned char>(profile[i])); ++i) {
    gb = gb * 10 + static_cast<uint64_t>(profile[i] - '0');
  }
  return i + 1 < profile.size() && profile.substr(i, 2) == "gb" ? gb * 1024 : 0;
}

bool ContainsNoCase(std::string_view haystack, std::string_view needle) {
  if (needle.empty()) return true;
  auto it = std::search(haystack.begin(), haystack.end(), needle.begin(), needle.end(),
                        [](char x, char y) {
                          return std::tolower(static_cast<unsigned char>(x)) ==
                                 std::tolower(static_cast<unsigned char>(y));
                        });
  return it != haystack.end();
}

// What the pod could run on: the allowlist entries (models) its use/nouse-gputype annotations
// leave, and their profiles that cover its largest per-instance memory request. Also a line
// saying why the list is short ("" when it is the whole allowlist's).
struct PodChoices {
  std::vector<std::string> choices;
  std::string scope;
};

// The allowlist entries that match a GPU model of the cluster (`present`, NVML names); the whole
// allowlist when `present` is empty or none matches (a new cluster).
mig::Allowlist PresentEntries(const mig::Allowlist& full, const std::vector<std::string>& present) {
  mig::Allowlist out;
  for (const auto& e : full.entries) {
    const bool matched = std::any_of(present.begin(), present.end(),
                                     [&](const std::string& m) { return full.Match(m) == &e; });
    if (matched) out.entries.push_back(e);
  }
  return out.entries.empty() ? full : out;
}

PodChoices ChoicesForPod(const mig::Allowlist& full, const json* pod,
                         const protocol::ResourceNames& resources,
                         const std::vector<std::string>& present) {
  PodChoices out;
  const mig::Allowlist allowlist = PresentEntries(full, present);
  const bool in_cluster = allowlist.entries.size() < full.entries.size();
  const std::string cluster_scope =
      in_cluster ? fmt::format(" for the GPU models in the cluster ({})", fmt::join(present, ", "))
                 : "";
  if (pod == nullptr) {
    out.choices = PreferenceChoices(allowlist);
    out.scope = cluster_scope;
    return out;
  }
  auto request = protocol::ParsePodRequest(*pod, resources);
  if (!request.ok()) {
    out.choices = PreferenceChoices(allowlist);
    out.scope = cluster_scope;
    return out;
  }
  uint64_t mib = 0;
  for (const auto& c : request->containers) {
    if (c.count > 0) mib = std::max(mib, c.memory.mib);
  }
  const auto& filter = request->filter;
  mig::Allowlist usable;
  std::vector<std::string> models;
  for (const auto& e : allowlist.entries) {
    mig::AllowlistEntry kept;
    for (const auto& m : e.models) {
      bool ok = filter.use_types.empty();
      for (const auto& t : filter.use_types)
        ok = ok || ContainsNoCase(m, t) || ContainsNoCase(t, m);
      for (const auto& t : filter.nouse_types) ok = ok && !ContainsNoCase(m, t);
      if (ok) kept.models.push_back(m);
    }
    if (kept.models.empty()) continue;
    for (const auto& p : e.profiles) {
      const uint64_t nominal = NominalMib(p);
      if (mib == 0 || nominal == 0 || nominal >= mib) kept.profiles.push_back(p);
    }
    if (kept.profiles.empty()) continue;
    for (const auto& m : kept.models) models.push_back(m);
    usable.entries.push_back(std::move(kept));
  }
  if (usable.entries.empty()) {
    out.choices = PreferenceChoices(allowlist);
    out.scope = cluster_scope + " (no allowlisted model" + (in_cluster ? " of the cluster" : "") +
                " covers this pod's request)";
    return out;
  }
  out.choices = PreferenceChoices(usable);
  const bool narrowed = out.choices != PreferenceChoices(allowlist);
  if (narrowed) {
    std::vector<std::string> why;
    if (in_cluster)
      why.push_back(fmt::format("GPU models in the cluster: {}", fmt::join(present, ", ")));
    if (mib > 0) why.push_back(fmt::format("{} MiB per instance", mib));
    if (!filter.use_types.empty() || !filter.nouse_types.empty()) {
      why.push_back(fmt::format("models {}", fmt::join(models, ", ")));
    }
    out.scope = fmt::format(" for this pod ({})", fmt::join(why, "; "));
  } else {
    out.scope = cluster_scope;
  }
  return out;
}

std::string ChoicesText(const PodChoices& c) {
  return fmt::format("valid choices{}: {}", c.scope, fmt::join(c.choices, ", "));
}

}  // namespace

absl::Status ValidatePreference(std::string_view value, const mig::Allowlist& allowlist,
                                const json* pod, const protocol::ResourceNames& resources,
                                const std::vector<std::string>& present_models) {
  const std::string key(protocol::kMigProfilePreferenceAnnotation);
  const mig::Preference preference = mig::ParsePreference(value);
  if (preference.empty()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: \"{}\" lists no profile; {}", key, std::string(value),
                    ChoicesText(ChoicesForPod(allowlist, pod, resources, present_models))));
  }
  for (const auto& entry : preference.entries) {
    if (!allowlist.KnowsPreferenceEntry(entry)) {
      const PodChoices choices = ChoicesForPod(allowlist, pod, resources, present_models);
      // The closest valid name, when it is close enough to be a typo of it.
      std::string best;
      size_t best_distance = std::string::npos;
      for (const auto& c : choices.choices) {
        const size_t d = Distance(entry, c);
        if (d < best_distance) {
          best_distance = d;
          best = c;
        }
      }
      const size_t limit = std::max<size_t>(2, entry.size() / 3);
      const std::string hint =
          best_distance <= limit ? fmt::format("did you mean \"{}\"? ", best) : "";
      return absl::InvalidArgumentError(fmt::format(
          "{}: \"{}\" matches no profile of the MIG profile allowlist (exact profile names or "
          "slice classes); {}{}",
          key, entry, hint, ChoicesText(choices)));
    }
  }
  return absl::OkStatus();
}

AdmissionHandler::AdmissionHandler(AdmissionOptions options) : options_(std::move(options)) {}

std::string AdmissionHandler::Review(std::string_view body, bool mutate) const {
  // Bounded before anything walks the tree: dump() and copies recurse once per nesting level.
  auto review =
      ParseBoundedJson(body, kAdmissionReviewJsonLimits, "AdmissionReview: the request body");
  if (!review.ok()) {
    json response = {{"uid", ""}};
    Deny(response, 400, "BadRequest", std::string(review.status().message()));
    return json{
        {"apiVersion", "admission.k8s.io/v1"}, {"kind", "AdmissionReview"}, {"response", response}}
        .dump();
  }
  return ReviewJson(*review, mutate).dump();
}

json AdmissionHandler::ReviewJson(const json& review, bool mutate) const {
  std::string api_version = "admission.k8s.io/v1";
  json response = {{"uid", ""}, {"allowed", true}};
  auto answer = [&]() {
    return json{{"apiVersion", api_version}, {"kind", "AdmissionReview"}, {"response", response}};
  };
  if (!review.is_object()) {
    Deny(response, 400, "BadRequest", "AdmissionReview: the body must be a JSON object");
    return answer();
  }
  const std::string sent_version = StringMember(review, "apiVersion");
  if (sent_version == "admission.k8s.io/v1beta1") api_version = sent_version;
  if (StringMember(review, "kind") != "AdmissionReview" ||
      (sent_version != "admission.k8s.io/v1" && sent_version != "admission.k8s.io/v1beta1")) {
    Deny(response, 400, "BadRequest",
         fmt::format("expected an admission.k8s.io/v1 AdmissionReview, got kind \"{}\" "
                     "apiVersion \"{}\"",
                     StringMember(review, "kind"), sent_version));
    return answer();
  }
  const json* request = Member(review, "request");
  if (request == nullptr || !request->is_object()) {
    Deny(response, 400, "BadRequest", "AdmissionReview: request is missing");
    return answer();
  }
  response["uid"] = StringMember(*request, "uid");
  if (StringMember(*request, "uid").empty()) {
    Deny(response, 400, "BadRequest", "AdmissionReview: request.uid is missing");
    return answer();
  }
  const json* kind = Member(*request, "kind");
  const std::string kind_name = kind != nullptr ? StringMember(*kind, "kind") : "";
  const bool core = kind != nullptr && StringMember(*kind, "group").empty();
  const json* resource = Member(*request, "resource");
  const std::string resource_name = resource != nullptr ? StringMember(*resource, "resource") : "";
  const std::string sub = StringMember(*request, "subResource");
  if (core && kind_name == "Pod" && sub.empty()) {
    ReviewPod(*request, mutate, response);
  } else if (core && kind_name == "Binding" &&
             ((resource_name == "pods" && sub == "binding") ||
              (resource_name == "bindings" && sub.empty()))) {
    ReviewBinding(*request, response);
  }
  return answer();
}

void AdmissionHandler::ReviewPod(const json& request, bool mutate, json& response) const {
  const std::string operation = StringMember(request, "operation");
  if (operation != "CREATE" && operation != "UPDATE") return;
  const bool create = operation == "CREATE";
  const json* object = Member(request, "object");
  if (object == nullptr || !object->is_object()) {
    Deny(response, 400, "BadRequest", fmt::format("{} of a pod without request.object", operation));
    return;
  }
  const json empty = json::object();
  const json* old_object = Member(request, "oldObject");
  if (old_object == nullptr) old_object = &empty;
  const json* user = Member(request, "userInfo");
  const std::string username = user != nullptr ? StringMember(*user, "username") : "";
  std::string ns = StringMember(request, "namespace");
  std::string name = StringMember(request, "name");
  if (name.empty()) {
    if (const json* meta = Member(*object, "metadata"); meta != nullptr) {
      name = StringMember(*meta, "name");
      if (name.empty()) name = StringMember(*meta, "generateName") + "*";
    }
  }
  const std::string pod = fmt::format("pod {}/{}", ns.empty() ? "default" : ns, name);

  // The protocol's pod annotations are written only by the system's own identities.
  const std::vector<std::string> written =
      ChangedAnnotations(protocol::kSystemPodAnnotations, *object, create ? nullptr : old_object);
  if (!written.empty() && !Listed(options_.annotation_writers, username)) {
    Deny(response, 403, "Forbidden",
         SystemAnnotationsMessage(pod, written, options_.annotation_writers, username,
                                  create ? "set" : "change or remove"));
    return;
  }

  // A GPU pod's routing annotations are fixed at creation, for everyone: a pod that leaves MIG
  // mode (or changes its GPUs) after its reservation was made would be misread by the scheduler
  // and the device plugin. A pod that requests no managed resource at creation cannot gain one
  // (container resources are immutable; in-place resize covers only cpu and memory), so its
  // routing annotations decide nothing and stay free.
  if (!create && (protocol::RequestsGpuResources(*object, options_.resources) ||
                  protocol::RequestsGpuResources(*old_object, options_.resources))) {
    const std::vector<std::string> changed =
        ChangedAnnotations(protocol::kRoutingPodAnnotations, *object, old_object);
    if (!changed.empty()) {
      Deny(response, 403, "Forbidden",
           fmt::format("{}: {} {} fixed at creation for a pod that requests {}; user \"{}\" may "
                       "not add, change or remove {} (delete the pod and create it again with the "
                       "annotations it needs)",
                       pod, fmt::join(changed, ", "), changed.size() == 1 ? "is" : "are",
                       ManagedResources(options_.resources), username,
                       changed.size() == 1 ? "it" : "them"));
      return;
    }
  }

  // The preference must name allowlisted profiles (typos are caught when the pod is created).
  const std::string preference_key(protocol::kMigProfilePreferenceAnnotation);
  const auto preference = PodAnnotation(*object, preference_key);
  if (preference.has_value() &&
      (create || preference != PodAnnotation(*old_object, preference_key))) {
    if (absl::Status st = ValidatePreference(
            *preference, options_.allowlist, &*object, options_.resources,
            options_.cluster_models ? options_.cluster_models() : std::vector<std::string>{});
        !st.ok()) {
      Deny(response, 400, "BadRequest", fmt::format("{}: {}", pod, std::string(st.message())));
      return;
    }
  }
  if (!create || !protocol::RequestsGpuResources(*object, options_.resources)) return;
  ReviewGpuPodCreate(*object, pod, mutate, response);
}

void AdmissionHandler::ReviewGpuPodCreate(const json& object, const std::string& pod, bool mutate,
                                          json& response) const {
  std::vector<std::string> warnings;
  auto parsed = protocol::ParsePodRequest(object, options_.resources, &warnings);
  if (!parsed.ok()) {
    Deny(response, 400, "BadRequest",
         fmt::format("{}: {}", pod, std::string(parsed.status().message())));
    return;
  }
  if (options_.whole_gpu_pods && protocol::IsWholeGpuPod(object, options_.resources)) {
    if (auto whole = protocol::ParseWholeGpuRequest(object, options_.resources); !whole.ok()) {
      Deny(response, 400, "BadRequest",
           fmt::format("{}: {}", pod, std::string(whole.status().message())));
      return;
    }
  }
  if (const std::string too_many = InstanceBoundError(*parsed); !too_many.empty()) {
    Deny(response, 400, "BadRequest", fmt::format("{}: {}", pod, too_many));
    return;
  }
  const json* spec = Member(object, "spec");
  const std::string node_name = spec != nullptr ? StringMember(*spec, "nodeName") : "";
  if (!node_name.empty()) {
    Deny(
        response, 400, "BadRequest",
        fmt::format("{}: spec.nodeName is set ({}): a pod that requests {} must be placed by {}, "
                    "which reserves its devices and holds the node's lock until the device "
                    "plugin served it; leave spec.nodeName out (choose nodes with a nodeSelector "
                    "or node affinity)",
                    pod, node_name, ManagedResources(options_.resources), options_.scheduler_name));
    return;
  }
  const std::string current = spec != nullptr ? StringMember(*spec, "schedulerName") : "";
  if (!mutate && current != options_.scheduler_name) {
    // The mutating answer sets it; seeing another one here means that answer was bypassed or
    // overridden by a later mutating webhook.
    Deny(response, 400, "BadRequest",
         fmt::format("{}: spec.schedulerName is \"{}\": a pod that requests {} is placed only by "
                     "{} (the mutating webhook sets it; remove spec.schedulerName or set it to "
                     "\"{}\")",
                     pod, current.empty() ? "default-scheduler" : current,
                     ManagedResources(options_.resources), options_.scheduler_name,
                     options_.scheduler_name));
    return;
  }
  if (mutate && protocol::IsMigPod(object, options_.resources)) {
    for (std::string& w : SizingWarnings(*parsed)) warnings.push_back(std::move(w));
  }
  if (!warnings.empty()) response["warnings"] = warnings;
  if (!mutate || current == options_.scheduler_name) return;
  json patch = json::array();
  patch.push_back(
      {{"op", current.empty() && (spec == nullptr || !spec->contains("schedulerName")) ? "add"
                                                                                       : "replace"},
       {"path", "/spec/schedulerName"},
       {"value", options_.scheduler_name}});
  response["patchType"] = "JSONPatch";
  response["patch"] = absl::Base64Escape(patch.dump());
}

std::string AdmissionHandler::InstanceBoundError(const mig::PodRequest& request) const {
  const int known = options_.max_instances_per_node ? options_.max_instances_per_node() : 0;
  const bool from_cluster = known > 0 && known < kMaxInstancesCeiling;
  const uint64_t limit = static_cast<uint64_t>(from_cluster ? known : kMaxInstancesCeiling);
  const std::string why =
      from_cluster ? fmt::format("the most MIG instances one node of this cluster can hold")
                   : fmt::format("dynmig's ceiling of MIG instances per pod");
  const std::string& count_name = options_.resources.count;
  uint64_t total = 0;
  size_t init_index = 0, app_index = 0;
  for (const auto& c : request.containers) {
    const std::string where = c.init ? fmt::format("initContainers[{}]", init_index++)
                                     : fmt::format("containers[{}]", app_index++);
    if (c.count > limit) {
      return fmt::format("container \"{}\" ({}): {}: {} is more than {}, {}", c.name, where,
                         count_name, c.count, limit, why);
    }
    if (c.memory.mib > kMaxMemoryMibPerInstance) {
      return fmt::format(
          "container \"{}\" ({}): {}: {} MiB per instance is more than {} MiB (1 TiB), more "
          "than any GPU has",
          c.name, where, options_.resources.memory, c.memory.mib, kMaxMemoryMibPerInstance);
    }
    total += c.count;
  }
  if (total > limit) {
    return fmt::format("its containers ask for {} {} in all, more than {}, {}", total, count_name,
                       limit, why);
  }
  return "";
}

void AdmissionHandler::ReviewBinding(const json& request, json& response) const {
  if (StringMember(request, "operation") != "CREATE") return;
  const json* object = Member(request, "object");
  if (object == nullptr || !object->is_object()) {
    Deny(response, 400, "BadRequest", "CREATE of a binding without request.object");
    return;
  }
  const json* meta = Member(*object, "metadata");
  std::string ns = StringMember(request, "namespace");
  if (ns.empty() && meta != nullptr) ns = StringMember(*meta, "namespace");
  if (ns.empty()) ns = "default";
  const std::string name = meta != nullptr ? StringMember(*meta, "name") : "";
  const std::string url_name = StringMember(request, "name");
  if (name.empty() || (!url_name.empty() && url_name != name)) {
    Deny(response, 400, "BadRequest",
         fmt::format("binding in {}: metadata.name must name the pod (got \"{}\", request for "
                     "\"{}\")",
                     ns, name, url_name));
    return;
  }
  const std::string pod = fmt::format("pod {}/{}", ns, name);
  const json* target = Member(*object, "target");
  const std::string node = target != nullptr ? StringMember(*target, "name") : "";
  const json* user = Member(request, "userInfo");
  const std::string username = user != nullptr ? StringMember(*user, "username") : "";

  // The API server copies a Binding's annotations onto the pod.
  const std::vector<std::string> written =
      ChangedAnnotations(protocol::kSystemPodAnnotations, *object, nullptr);
  if (!written.empty() && !Listed(options_.annotation_writers, username)) {
    Deny(response, 403, "Forbidden",
         SystemAnnotationsMessage("binding of " + pod, written, options_.annotation_writers,
                                  username, "set"));
    return;
  }
  if (Listed(options_.binders, username)) return;
  const std::string managed = ManagedResources(options_.resources);
  absl::StatusOr<json> found =
      options_.pod_lookup ? options_.pod_lookup(ns, name)
                          : absl::StatusOr<json>(absl::UnavailableError("no pod lookup is set"));
  if (!found.ok()) {
    Deny(response, 403, "Forbidden",
         fmt::format("binding of {} to node {} refused: the pod could not be read to check "
                     "whether it requests {} ({}); bindings are refused while it cannot be read",
                     pod, node, managed, std::string(found.status().message())));
    return;
  }
  if (!protocol::RequestsGpuResources(*found, options_.resources)) return;
  Deny(response, 403, "Forbidden",
       fmt::format("{}: only {} may bind a pod that requests {} (the extender reserves its "
                   "devices first); user \"{}\" may not bind it to node {}",
                   pod, fmt::join(options_.binders, ", "), managed, username, node));
}

std::vector<std::string> AdmissionHandler::SizingWarnings(const mig::PodRequest& request) const {
  std::vector<std::string> models;
  if (options_.cluster_models) models = options_.cluster_models();
  std::vector<const mig::CatalogueModel*> considered;
  for (const auto& m : mig::Catalogue()) {
    const bool present =
        models.empty() || std::any_of(m.names.begin(), m.names.end(), [&](const std::string& n) {
          return std::find(models.begin(), models.end(), n) != models.end();
        });
    if (present && options_.allowlist.Match(m.names.front()) != nullptr) considered.push_back(&m);
  }
  std::vector<std::string> out;
  for (const mig::CatalogueModel* m : considered) {
    const mig::AllowlistEntry* entry = options_.allowlist.Match(m->names.front());
    std::optional<std::string> note;
    for (const auto& c : request.containers) {
      if (c.count == 0 || c.memory.mib == 0 || note.has_value()) continue;
      note = mig::SizingNote(m->capability, entry->profiles, c.memory.mib, request.preference,
                             options_.memory_match, options_.resources.memory);
      if (note.has_value() && request.containers.size() > 1) {
        *note = fmt::format("container \"{}\": {}", c.name, *note);
      }
    }
    if (note.has_value()) out.push_back(*std::move(note));
  }
  return out;
}

}  // namespace dynmig::webhook
