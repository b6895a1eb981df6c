#include "local/scheduler_loop.h"

#include <httplib.h>

#include <algorithm>
#include <optional>
#include <set>

#include "fmt/format.h"
#include "fmt/ranges.h"

namespace dynmig::local {
namespace {

using nlohmann::json;

struct Url {
  std::string scheme_host_port;
  std::string path;
};

Url SplitUrl(const std::string& url) {
  const size_t scheme = url.find("://");
  const size_t path = url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  if (path == std::string::npos) return {url, ""};
  return {url.substr(0, path), url.substr(path)};
}

// POSTs JSON to the extender; errors name the verb and what went wrong.
// Over HTTPS, as kube-scheduler's extender client: the server's certificate verified against
// tls.ca_file (none given or insecure: not verified), tls.cert_file/key_file presented as the
// client certificate. tls.server_name is not used (the URL's host is checked).
absl::StatusOr<json> Post(const std::string& base, const std::string& verb, const json& body,
                          double timeout_seconds, const ExtenderTlsConfig& tls) {
  const Url u = SplitUrl(base);
  httplib::Client cli = tls.cert_file.empty()
                            ? httplib::Client(u.scheme_host_port)
                            : httplib::Client(u.scheme_host_port, tls.cert_file, tls.key_file);
  if (!cli.is_valid()) {
    return absl::FailedPreconditionError(
        fmt::format("extender {}: cannot set up a client for {} (client certificate {}, key {})",
                    verb, u.scheme_host_port, tls.cert_file, tls.key_file));
  }
  if (!tls.ca_file.empty() && !tls.insecure) {
    cli.set_ca_cert_path(tls.ca_file);
    cli.enable_server_certificate_verification(true);
  } else {
    cli.enable_server_certificate_verification(false);
  }
  const auto secs = static_cast<time_t>(timeout_seconds);
  cli.set_read_timeout(secs, 0);
  cli.set_write_timeout(secs, 0);
  cli.set_connection_timeout(5, 0);
  std::string path = u.path;
  if (path.empty() || path.back() != '/') path += '/';
  path += verb;
  auto res = cli.Post(path, body.dump(), "application/json");
  if (!res) {
    return absl::UnavailableError(
        fmt::format("extender {}: {}", verb, httplib::to_string(res.error())));
  }
  if (res->status != 200) {
    return absl::UnavailableError(
        fmt::format("extender {}: HTTP {}: {}", verb, res->status, res->body));
  }
  try {
    return json::parse(res->body);
  } catch (const json::exception& e) {
    return absl::DataLossError(fmt::format("extender {}: malformed response: {}", verb, e.what()));
  }
}

bool NodeCordoned(const kube::Object& node) {
  const auto spec = node.find("spec");
  if (spec != node.end() && spec->is_object()) {
    const auto u = spec->find("unschedulable");
    if (u != spec->end() && u->is_boolean() && u->get<bool>()) return true;
  }
  return false;
}

// Whether the pod tolerates the taint a cordoned node carries
// (node.kubernetes.io/unschedulable:NoSchedule), as kube-scheduler's TaintToleration plugin.
bool ToleratesCordon(const kube::Object& pod) {
  const json* ts = nullptr;
  if (pod.contains("spec") && pod["spec"].contains("tolerations")) ts = &pod["spec"]["tolerations"];
  if (ts == nullptr || !ts->is_array()) return false;
  for (const auto& t : *ts) {
    if (!t.is_object()) continue;
    const std::string key = t.value("key", "");
    const std::string op = t.value("operator", "Equal");
    const std::string effect = t.value("effect", "");
    if (!effect.empty() && effect != "NoSchedule") continue;
    if (op == "Exists" && (key.empty() || key == "node.kubernetes.io/unschedulable")) return true;
    if (op == "Equal" && key == "node.kubernetes.io/unschedulable" && t.value("value", "").empty())
      return true;
  }
  return false;
}

// One node selector requirement against a value (absent: nullopt).
bool Matches(const json& req, const std::optional<std::string>& value) {
  const std::string op = req.value("operator", "");
  std::vector<std::string> values;
  if (req.contains("values") && req["values"].is_array()) {
    for (const auto& v : req["values"]) {
      if (v.is_string()) values.push_back(v.get<std::string>());
    }
  }
  const bool in = value && std::find(values.begin(), values.end(), *value) != values.end();
  if (op == "In") return in;
  if (op == "NotIn") return !in;
  if (op == "Exists") return value.has_value();
  if (op == "DoesNotExist") return !value.has_value();
  return false;  // Gt/Lt and unknown operators: not supported by the stand-in, never match
}

// spec.nodeSelector and requiredDuringSchedulingIgnoredDuringExecution node affinity.
bool PodFitsNode(const kube::Object& pod, const kube::Object& node) {
  const auto labels = kube::Labels(node);
  auto label = [&](const std::string& k) -> std::optional<std::string> {
    auto it = labels.find(k);
    return it == labels.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  if (!pod.contains("spec") || !pod["spec"].is_object()) return true;
  const json& spec = pod["spec"];
  if (spec.contains("nodeSelector") && spec["nodeSelector"].is_object()) {
    for (auto it = spec["nodeSelector"].begin(); it != spec["nodeSelector"].end(); ++it) {
      if (!it->is_string() || label(it.key()) != it->get<std::string>()) return false;
    }
  }
  const json* terms = nullptr;
  if (spec.contains("affinity") && spec["affinity"].contains("nodeAffinity") &&
      spec["affinity"]["nodeAffinity"].contains("requiredDuringSchedulingIgnoredDuringExecution")) {
    const json& r =
        spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    if (r.contains("nodeSelectorTerms")) terms = &r["nodeSelectorTerms"];
  }
  if (terms == nullptr || !terms->is_array() || terms->empty()) return true;
  for (const auto& term : *terms) {  // terms are ORed, requirements within a term ANDed
    bool ok = true;
    if (term.contains("matchExpressions") && term["matchExpressions"].is_array()) {
      for (const auto& req : term["matchExpressions"])
        ok = ok && Matches(req, label(req.value("key", "")));
    }
    if (term.contains("matchFields") && term["matchFields"].is_array()) {
      for (const auto& req : term["matchFields"]) {
        ok = ok && req.value("key", "") == "metadata.name" && Matches(req, kube::Name(node));
      }
    }
    if (ok) return true;
  }
  return false;
}

std::vector<std::pair<std::string, std::string>> Resources(const kube::Object& pod) {
  std::vector<std::pair<std::string, std::string>> out;
  const auto spec = pod.find("spec");
  if (spec == pod.end()) return out;
  for (const char* list : {"initContainers", "containers"}) {
    const auto cs = spec->find(list);
    if (cs == spec->end() || !cs->is_array()) continue;
    for (const auto& c : *cs) {
      for (const char* kind : {"limits", "requests"}) {
        const json* r = nullptr;
        if (c.contains("resources") && c["resources"].contains(kind)) r = &c["resources"][kind];
        if (r == nullptr || !r->is_object()) continue;
        for (auto it = r->begin(); it != r->end(); ++it) out.push_back({it.key(), it->dump()});
      }
    }
  }
  return out;
}

}  // namespace

struct SchedulerLoop::Outcome {
  bool bound = false;
  std::string message;  // why not
};

SchedulerLoop::SchedulerLoop(kube::KubeClient& client, SchedulerLoopOptions options)
    : client_(client),
      options_(std::move(options)),
      pods_(client, kube::Resource::kPods),
      nodes_(client, kube::Resource::kNodes) {
  auto poke = [this] {
    std::lock_guard<std::mutex> lock(mu_);
    dirty_ = true;
    cv_.notify_all();
  };
  kube::InformerHandlers h;
  h.on_add = [poke](const kube::Object&) { poke(); };
  h.on_update = [poke](const kube::Object&, const kube::Object&) { poke(); };
  h.on_delete = [poke](const kube::Object&) { poke(); };
  pods_.AddHandlers(h);
  nodes_.AddHandlers(h);
}

SchedulerLoop::~SchedulerLoop() { Stop(); }

void SchedulerLoop::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

void SchedulerLoop::Start() {
  pods_.Start();
  nodes_.Start();
  thread_ = std::thread([this] {
    pods_.WaitForSync(absl::Seconds(30));
    nodes_.WaitForSync(absl::Seconds(30));
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      dirty_ = false;
      lock.unlock();
      SchedulePending();
      lock.lock();
      cv_.wait_for(lock, absl::ToChronoSeconds(options_.retry_interval),
                   [this] { return stop_ || dirty_; });
    }
  });
}

void SchedulerLoop::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  pods_.Stop();
  nodes_.Stop();
}

const ExtenderTlsConfig& SchedulerLoop::Tls() const {
  return options_.tls.has_value() ? *options_.tls : options_.config.extender.tls;
}

bool SchedulerLoop::UsesManagedResources(const kube::Object& pod) const {
  for (const auto& [name, value] : Resources(pod)) {
    for (const auto& m : options_.config.extender.managed_resources) {
      if (m.name == name) return true;
    }
  }
  return false;
}

int SchedulerLoop::SchedulePending() {
  const std::vector<kube::ObjectPtr> all_nodes = nodes_.List();
  const std::vector<kube::ObjectPtr> pods = pods_.List();
  // Assumed bindings (kube-scheduler's assume cache): a pod bound in an earlier pass may still look
  // unbound in the cache; it is not scheduled again. Forgotten once the cache shows it bound or
  // gone.
  std::set<std::string> unbound;
  for (const auto& pod : pods) {
    if (kube::NodeName(*pod).empty()) unbound.insert(kube::Uid(*pod));
  }
  std::erase_if(assumed_bound_, [&](const std::string& uid) { return !unbound.count(uid); });
  int bound = 0;
  for (const auto& pod : pods) {
    if (!kube::NodeName(*pod).empty() || kube::IsBeingDeleted(*pod)) continue;
    if (assumed_bound_.count(kube::Uid(*pod))) continue;
    if (kube::StringAt(*pod, "/spec/schedulerName") != options_.config.scheduler_name) continue;
    const std::string phase = kube::Phase(*pod);
    if (phase == "Succeeded" || phase == "Failed") continue;
    // kube-scheduler's own filters before the extender: cordon (unless tolerated), node
    // selector and required node affinity.
    const bool tolerates_cordon = ToleratesCordon(*pod);
    std::vector<std::string> nodes;
    for (const auto& n : all_nodes) {
      if (NodeCordoned(*n) && !tolerates_cordon) continue;
      if (!PodFitsNode(*pod, *n)) continue;
      nodes.push_back(kube::Name(*n));
    }
    Outcome o = ScheduleOne(*pod, nodes);
    if (o.bound) {
      ++bound;
      assumed_bound_.insert(kube::Uid(*pod));
      last_message_.erase(kube::ObjectKey(*pod));
    } else if (!o.message.empty()) {
      MarkUnschedulable(*pod, o.message);
    }
  }
  return bound;
}

SchedulerLoop::Outcome SchedulerLoop::ScheduleOne(const kube::Object& pod,
                                                  const std::vector<std::string>& nodes) {
  const std::string key = kube::ObjectKey(pod);
  const ExtenderConfig& x = options_.config.extender;
  const std::string base = options_.extender_url.empty() ? x.url_prefix : options_.extender_url;
  if (nodes.empty()) {
    return {false,
            "no node passes kube-scheduler's own filters (cordoned without a toleration, "
            "nodeSelector, required node affinity)"};
  }
  // kube-scheduler requeues a pod that is updated while it is being scheduled (v1.20 ignores only
  // annotation-only updates of a pod it has already assumed, i.e. from bind on). The requeued copy
  // is scheduled again while the first cycle binds it, and fails with "pod <uid> is in the cache,
  // so can't be assumed": a FailedScheduling Warning on a pod that scheduled fine. The stand-in
  // compares the pod's resourceVersion before the filter and before the bind, and reports the
  // same warning.
  auto version_now = [&]() -> std::string {
    auto current = client_.GetPod(kube::Namespace(pod), kube::Name(pod));
    return current.ok() ? kube::ResourceVersion(*current) : "";
  };
  const std::string version_at_start = version_now();
  std::string chosen;
  if (UsesManagedResources(pod) && !x.filter_verb.empty()) {
    json args = {{"Pod", pod}};
    if (x.node_cache_capable) {
      args["NodeNames"] = nodes;
    } else {
      json items = json::array();
      for (const auto& n : nodes) {
        auto obj = nodes_.Get(n);
        if (obj) items.push_back(*obj);
      }
      args["Nodes"] = {{"items", items}};
    }
    auto res = Post(base, x.filter_verb, args, x.http_timeout_seconds, Tls());
    if (!res.ok()) return {false, std::string(res.status().message())};
    const json& r = *res;
    if (r.contains("Error") && r["Error"].is_string() && !r["Error"].get<std::string>().empty()) {
      return {false, "extender: " + r["Error"].get<std::string>()};
    }
    std::vector<std::string> passed;
    if (r.contains("NodeNames") && r["NodeNames"].is_array()) {
      for (const auto& n : r["NodeNames"]) passed.push_back(n.get<std::string>());
    } else if (r.contains("Nodes") && r["Nodes"].is_object() && r["Nodes"].contains("items")) {
      for (const auto& n : r["Nodes"]["items"]) passed.push_back(kube::Name(n));
    }
    if (passed.empty()) {
      std::vector<std::string> reasons;
      for (const char* field : {"FailedNodes", "FailedAndUnresolvableNodes"}) {
        if (!r.contains(field) || !r[field].is_object()) continue;
        for (auto it = r[field].begin(); it != r[field].end(); ++it) {
          reasons.push_back(fmt::format("{}: {}", it.key(),
                                        it->is_string() ? it->get<std::string>() : it->dump()));
        }
      }
      return {false,
              fmt::format("0/{} nodes are available: {}", nodes.size(), fmt::join(reasons, "; "))};
    }
    chosen = passed.front();
  } else {
    chosen = nodes.front();
  }
  const std::string version_at_bind = version_now();
  const bool updated_in_cycle =
      !version_at_start.empty() && !version_at_bind.empty() && version_at_start != version_at_bind;
  if (!x.bind_verb.empty() && UsesManagedResources(pod)) {
    json args = {{"PodName", kube::Name(pod)},
                 {"PodNamespace", kube::Namespace(pod)},
                 {"PodUID", kube::Uid(pod)},
                 {"Node", chosen}};
    auto res = Post(base, x.bind_verb, args, x.http_timeout_seconds, Tls());
    if (!res.ok()) return {false, std::string(res.status().message())};
    if (res->contains("Error") && (*res)["Error"].is_string() &&
        !(*res)["Error"].get<std::string>().empty()) {
      return {false, "bind: " + (*res)["Error"].get<std::string>()};
    }
  } else {
    auto st = client_.BindPod(kube::Namespace(pod), kube::Name(pod), chosen, kube::Uid(pod));
    if (!st.ok()) return {false, "bind: " + std::string(st.message())};
  }
  Log(fmt::format("scheduled {} to {}", key, chosen));
  if (updated_in_cycle) {
    const std::string message =
        fmt::format("pod {} is in the cache, so can't be assumed", kube::Uid(pod));
    Log(fmt::format("{} was updated during its scheduling cycle (resourceVersion {} -> {}): {}",
                    key, version_at_start, version_at_bind, message));
    (void)client_.CreateEvent(kube::NewEvent(pod, "Warning", "FailedScheduling", message,
                                             "dynmig-local-scheduler", absl::Now()));
  }
  return {true, ""};
}

void SchedulerLoop::MarkUnschedulable(const kube::Object& pod, const std::string& message) {
  const std::string key = kube::ObjectKey(pod);
  auto& last = last_message_[key];
  if (last == message) return;  // already said
  last = message;
  Log(fmt::format("{} stays Pending: {}", key, message));
  json patch = {
      {"status",
       {{"conditions", json::array({{{"type", "PodScheduled"},
                                     {"status", "False"},
                                     {"reason", "Unschedulable"},
                                     {"message", message},
                                     {"lastTransitionTime", kube::Rfc3339(absl::Now())}}})}}}};
  (void)client_.PatchPodStatus(kube::Namespace(pod), kube::Name(pod), patch);
  (void)client_.CreateEvent(kube::NewEvent(pod, "Warning", "FailedScheduling", message,
                                           "dynmig-local-scheduler", absl::Now()));
}

}  // namespace dynmig::local
