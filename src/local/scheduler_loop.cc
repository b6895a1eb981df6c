#include "local/scheduler_loop.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <set>

#include "common/bounded_json.h"
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
  // The extender's answer lists the nodes of the request: sized like the request.
  auto doc = ParseBoundedJson(res->body, kExtenderArgsJsonLimits,
                              fmt::format("extender {}: malformed response", verb));
  if (!doc.ok()) return absl::DataLossError(doc.status().message());
  return doc;
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

int32_t Priority(const kube::Object& pod) {
  const auto spec = pod.find("spec");
  if (spec == pod.end() || !spec->is_object()) return 0;
  const auto p = spec->find("priority");
  return p != spec->end() && p->is_number_integer() ? p->get<int32_t>() : 0;
}

// The pod without the fields whose change cannot make it schedulable (kube-scheduler's
// isPodUpdated: resourceVersion, generation, status).
json WithoutStatus(const kube::Object& pod) {
  json p = pod;
  if (p.contains("metadata")) {
    p["metadata"].erase("resourceVersion");
    p["metadata"].erase("generation");
    p["metadata"].erase("managedFields");
  }
  p.erase("status");
  return p;
}

// What kube-scheduler's skipPodUpdate ignores for an assumed pod: resourceVersion, nodeName,
// annotations.
json WithoutBindingNoise(const kube::Object& pod) {
  json p = pod;
  if (p.contains("metadata")) {
    p["metadata"].erase("resourceVersion");
    p["metadata"].erase("annotations");
    p["metadata"].erase("managedFields");
  }
  if (p.contains("spec")) p["spec"].erase("nodeName");
  return p;
}

// kube-scheduler's nodeSchedulingPropertiesChange: unschedulable, allocatable, labels, taints,
// condition statuses. Annotations and heartbeats are not among them.
bool SchedulingPropertiesChanged(const kube::Object& a, const kube::Object& b) {
  auto at = [](const kube::Object& o, const char* pointer) {
    const json::json_pointer ptr(pointer);
    return o.contains(ptr) ? o.at(ptr) : json();
  };
  for (const char* ptr :
       {"/spec/unschedulable", "/status/allocatable", "/metadata/labels", "/spec/taints"}) {
    if (at(a, ptr) != at(b, ptr)) return true;
  }
  auto statuses = [&](const kube::Object& o) {
    std::map<std::string, std::string> out;
    const json c = at(o, "/status/conditions");
    if (!c.is_array()) return out;
    for (const auto& cond : c) {
      if (cond.is_object()) out[cond.value("type", "")] = cond.value("status", "");
    }
    return out;
  };
  return statuses(a) != statuses(b);
}

// The pod's PodScheduled=False condition as (reason, message), empty when none.
std::pair<std::string, std::string> SchedulingCondition(const kube::Object& pod) {
  const json::json_pointer ptr("/status/conditions");
  if (!pod.contains(ptr) || !pod.at(ptr).is_array()) return {};
  for (const auto& c : pod.at(ptr)) {
    if (c.is_object() && c.value("type", "") == "PodScheduled" && c.value("status", "") == "False")
      return {c.value("reason", ""), c.value("message", "")};
  }
  return {};
}

}  // namespace

struct SchedulerLoop::Binder {
  std::thread thread;
  std::atomic<bool> done{false};
};

SchedulerLoop::SchedulerLoop(kube::KubeClient& client, const Clock& clock,
                             SchedulerLoopOptions options)
    : client_(client),
      clock_(clock),
      options_(std::move(options)),
      pods_(client, kube::Resource::kPods),
      nodes_(client, kube::Resource::kNodes),
      queue_(options_.timing) {
  kube::InformerHandlers p;
  p.on_add = [this](const kube::Object& o) { OnPodAdd(o); };
  p.on_update = [this](const kube::Object& a, const kube::Object& b) { OnPodUpdate(a, b); };
  p.on_delete = [this](const kube::Object& o) { OnPodDelete(o); };
  pods_.AddHandlers(p);
  kube::InformerHandlers n;
  n.on_add = [this](const kube::Object& node) {
    MoveAll();
    if (options_.observe) options_.observe(fmt::format("node {} added: requeue", kube::Name(node)));
  };
  n.on_update = [this](const kube::Object& a, const kube::Object& b) { OnNodeUpdate(a, b); };
  // A node deleted helps no pending pod (kube-scheduler requeues nothing).
  nodes_.AddHandlers(n);
}

SchedulerLoop::~SchedulerLoop() { Stop(); }

void SchedulerLoop::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

bool SchedulerLoop::Responsible(const kube::Object& pod) const {
  const std::string name = kube::StringAt(pod, "/spec/schedulerName");
  return name == options_.config.scheduler_name ||
         (options_.default_scheduler && (name == "default-scheduler" || name.empty()));
}

bool SchedulerLoop::Pending(const kube::Object& pod) const {
  return kube::NodeName(pod).empty() && Responsible(pod);
}

void SchedulerLoop::OnPodAdd(const kube::Object& pod) {
  if (!Pending(pod)) return;  // an assigned pod helps only pods with inter-pod affinity
  dynmig::MutexLock lock(&mu_);
  queue_.Add(kube::ObjectKey(pod), Priority(pod), clock_.Now());
  cv_.SignalAll();
}

void SchedulerLoop::OnPodUpdate(const kube::Object& old_pod, const kube::Object& new_pod) {
  const bool was = Pending(old_pod), is = Pending(new_pod);
  dynmig::MutexLock lock(&mu_);
  const std::string key = kube::ObjectKey(new_pod);
  if (was && !is) {
    queue_.Delete(key);  // bound (or handed to another scheduler)
  } else if (is) {
    // An assumed pod's binding writes (annotations, nodeName) are not news (skipPodUpdate).
    if (assumed_.count(kube::Uid(new_pod)) &&
        WithoutBindingNoise(old_pod) == WithoutBindingNoise(new_pod)) {
      return;
    }
    queue_.Update(key, Priority(new_pod), WithoutStatus(old_pod) != WithoutStatus(new_pod),
                  clock_.Now());
  }
  if (!kube::NodeName(new_pod).empty()) assumed_.erase(kube::Uid(new_pod));
  cv_.SignalAll();
}

void SchedulerLoop::OnPodDelete(const kube::Object& pod) {
  const bool assigned = !kube::NodeName(pod).empty();
  {
    dynmig::MutexLock lock(&mu_);
    assumed_.erase(kube::Uid(pod));
    if (!assigned) {
      queue_.Delete(kube::ObjectKey(pod));
    } else {
      queue_.MoveAll(clock_.Now());  // its node has room again
    }
    cv_.SignalAll();
  }
  if (options_.observe && assigned) {
    options_.observe(fmt::format("pod {} deleted: requeue", kube::ObjectKey(pod)));
  }
}

void SchedulerLoop::OnNodeUpdate(const kube::Object& old_node, const kube::Object& new_node) {
  bool moved = false;
  {
    dynmig::MutexLock lock(&mu_);
    // kube-scheduler compares the properties only while some pod is unschedulable; otherwise any
    // update is a move request (so a pod being tried meanwhile backs off instead of waiting).
    if (queue_.UnschedulableCount() == 0 || SchedulingPropertiesChanged(old_node, new_node)) {
      queue_.MoveAll(clock_.Now());
      cv_.SignalAll();
      moved = true;
    }
  }
  if (options_.observe) {
    options_.observe(
        fmt::format("node {} updated: {}", kube::Name(new_node), moved ? "requeue" : "no requeue"));
  }
}

void SchedulerLoop::MoveAll() {
  dynmig::MutexLock lock(&mu_);
  queue_.MoveAll(clock_.Now());
  cv_.SignalAll();
}

SchedulingQueue::Where SchedulerLoop::QueueOf(const std::string& key) {
  dynmig::MutexLock lock(&mu_);
  return queue_.Find(key);
}

int SchedulerLoop::Attempts(const std::string& key) {
  dynmig::MutexLock lock(&mu_);
  return queue_.Attempts(key);
}

void SchedulerLoop::Start() {
  pods_.Start();
  nodes_.Start();
  thread_ = std::thread([this] { Run(); });
}

void SchedulerLoop::Run() {
  pods_.WaitForSync(absl::Seconds(30));
  nodes_.WaitForSync(absl::Seconds(30));
  const SchedulingQueueTiming& t = options_.timing;
  absl::Time next_backoff_flush = clock_.Now() + t.backoff_flush;
  absl::Time next_leftover_flush = clock_.Now() + t.unschedulable_flush;
  mu_.Lock();
  while (!stop_) {
    const absl::Time now = clock_.Now();
    if (now >= next_backoff_flush) {
      queue_.FlushBackoffCompleted(now);
      next_backoff_flush = now + t.backoff_flush;
    }
    if (now >= next_leftover_flush) {
      queue_.FlushUnschedulableLeftover(now);
      next_leftover_flush = now + t.unschedulable_flush;
    }
    if (auto key = queue_.Pop()) {
      mu_.Unlock();
      ScheduleOne(*key);
      mu_.Lock();
      ReapBinders(false);
      continue;
    }
    const absl::Time wake = std::min(next_backoff_flush, next_leftover_flush);
    clock_.WaitFor(
        cv_, mu_, std::max(wake - clock_.Now(), absl::ZeroDuration()),
        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || queue_.ActiveCount() > 0; });
  }
  mu_.Unlock();
}

void SchedulerLoop::ReapBinders(bool all) {
  for (auto it = binders_.begin(); it != binders_.end();) {
    if (all || (*it)->done) {
      if ((*it)->thread.joinable()) (*it)->thread.join();
      it = binders_.erase(it);
    } else {
      ++it;
    }
  }
}

void SchedulerLoop::Stop() {
  {
    dynmig::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  std::list<std::unique_ptr<Binder>> binders;
  {
    dynmig::MutexLock lock(&mu_);
    binders.swap(binders_);
  }
  for (auto& b : binders) {
    if (b->thread.joinable()) b->thread.join();
  }
  pods_.Stop();
  nodes_.Stop();
}

std::string SchedulerLoop::ExtenderBase() const {
  if (options_.extender_url_source) {
    std::string url = options_.extender_url_source();
    if (!url.empty()) return url;
  }
  return options_.extender_url.empty() ? options_.config.extender.url_prefix
                                       : options_.extender_url;
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

void SchedulerLoop::ScheduleOne(const std::string& key) {
  const kube::ObjectPtr pod = pods_.Get(key);
  if (pod == nullptr || !Pending(*pod)) {
    dynmig::MutexLock lock(&mu_);
    queue_.Delete(key);
    return;
  }
  // kube-scheduler skips a pod being deleted (it is not queued again), and one that ended.
  if (kube::IsBeingDeleted(*pod) || kube::IsTerminated(*pod)) return;
  if (AlreadyAssumed(key, *pod)) return;
  // A pod updated between the start of its cycle and its assume is requeued by the update and
  // tried again while the first cycle binds it; that attempt fails as above, a Warning on a pod
  // that schedules fine. Whether the informer delivers the update before or after the bind is a
  // race, so the stand-in compares the pod's resourceVersion on the API server at both points
  // and has the binder report it.
  const std::string version_at_start = ResourceVersionNow(*pod);
  const std::vector<std::string> nodes = FeasibleNodes(key, *pod);
  if (nodes.empty()) return;
  const ExtenderConfig& x = options_.config.extender;
  const bool managed = UsesManagedResources(*pod);
  const std::optional<std::string> chosen =
      managed && !x.filter_verb.empty() ? FilterByExtender(key, *pod, nodes) : nodes.front();
  if (!chosen) return;
  const std::string version_at_assume = ResourceVersionNow(*pod);
  std::string updated_in_cycle;  // "A -> B" when the pod changed during the cycle
  if (!version_at_start.empty() && !version_at_assume.empty() &&
      version_at_start != version_at_assume) {
    updated_in_cycle = fmt::format("{} -> {}", version_at_start, version_at_assume);
  }
  AssumeAndBind(pod, *chosen, managed && !x.bind_verb.empty(), updated_in_cycle);
}

bool SchedulerLoop::AlreadyAssumed(const std::string& key, const kube::Object& pod) {
  // Queued again while its bind is in flight (the pod was updated meanwhile): kube-scheduler's
  // assume fails.
  bool in_cache = false;
  bool binder_reports = false;
  {
    dynmig::MutexLock lock(&mu_);
    const auto it = assumed_.find(kube::Uid(pod));
    in_cache = it != assumed_.end();
    binder_reports = in_cache && it->second;
  }
  if (!in_cache) return false;
  // Updated during its own cycle: the binder reports it once the bind is done (Bind).
  if (binder_reports) return true;
  Failed(key, "SchedulerError",
         fmt::format("pod {} is in the cache, so can't be assumed", kube::Uid(pod)));
  return true;
}

std::string SchedulerLoop::ResourceVersionNow(const kube::Object& pod) {
  auto current = client_.GetPod(kube::Namespace(pod), kube::Name(pod));
  return current.ok() ? kube::ResourceVersion(*current) : "";
}

std::vector<std::string> SchedulerLoop::FeasibleNodes(const std::string& key,
                                                      const kube::Object& pod) {
  const bool tolerates_cordon = ToleratesCordon(pod);
  const std::vector<kube::ObjectPtr> all_nodes = nodes_.List();
  std::vector<std::string> nodes;
  for (const auto& n : all_nodes) {
    if (NodeCordoned(*n) && !tolerates_cordon) continue;
    if (!PodFitsNode(pod, *n)) continue;
    nodes.push_back(kube::Name(*n));
  }
  if (nodes.empty()) {
    Failed(key, "Unschedulable",
           fmt::format("0/{} nodes are available: no node passes kube-scheduler's own filters "
                       "(cordoned without a toleration, nodeSelector, required node affinity)",
                       all_nodes.size()));
  }
  return nodes;
}

std::optional<std::string> SchedulerLoop::FilterByExtender(const std::string& key,
                                                           const kube::Object& pod,
                                                           const std::vector<std::string>& nodes) {
  const ExtenderConfig& x = options_.config.extender;
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
  auto res = Post(ExtenderBase(), x.filter_verb, args, x.http_timeout_seconds, Tls());
  if (!res.ok()) {
    Failed(key, "SchedulerError", std::string(res.status().message()));
    return std::nullopt;
  }
  const json& r = *res;
  if (r.contains("Error") && r["Error"].is_string() && !r["Error"].get<std::string>().empty()) {
    Failed(key, "SchedulerError", "extender: " + r["Error"].get<std::string>());
    return std::nullopt;
  }
  std::vector<std::string> passed;
  if (r.contains("NodeNames") && r["NodeNames"].is_array()) {
    for (const auto& n : r["NodeNames"]) passed.push_back(n.get<std::string>());
  } else if (r.contains("Nodes") && r["Nodes"].is_object() && r["Nodes"].contains("items")) {
    for (const auto& n : r["Nodes"]["items"]) passed.push_back(kube::Name(n));
  }
  if (!passed.empty()) return passed.front();
  std::vector<std::string> reasons;
  for (const char* field : {"FailedNodes", "FailedAndUnresolvableNodes"}) {
    if (!r.contains(field) || !r[field].is_object()) continue;
    for (auto it = r[field].begin(); it != r[field].end(); ++it) {
      reasons.push_back(
          fmt::format("{}: {}", it.key(), it->is_string() ? it->get<std::string>() : it->dump()));
    }
  }
  Failed(key, "Unschedulable",
         fmt::format("0/{} nodes are available: {}", nodes.size(), fmt::join(reasons, "; ")));
  return std::nullopt;
}

void SchedulerLoop::AssumeAndBind(kube::ObjectPtr pod, const std::string& node, bool extender,
                                  const std::string& updated_in_cycle) {
  dynmig::MutexLock lock(&mu_);
  if (stop_) return;
  assumed_[kube::Uid(*pod)] = !updated_in_cycle.empty();
  auto binder = std::make_unique<Binder>();
  Binder* b = binder.get();
  b->thread = std::thread([this, b, pod, node, extender, updated_in_cycle] {
    Bind(pod, node, extender, updated_in_cycle);
    b->done = true;
  });
  binders_.push_back(std::move(binder));
}

void SchedulerLoop::Bind(kube::ObjectPtr pod, std::string node, bool extender,
                         std::string updated_in_cycle) {
  const std::string key = kube::ObjectKey(*pod);
  std::string error;
  if (extender) {
    const ExtenderConfig& x = options_.config.extender;
    const std::string base = ExtenderBase();
    json args = {{"PodName", kube::Name(*pod)},
                 {"PodNamespace", kube::Namespace(*pod)},
                 {"PodUID", kube::Uid(*pod)},
                 {"Node", node}};
    auto res = Post(base, x.bind_verb, args, x.http_timeout_seconds, Tls());
    if (!res.ok()) {
      error = std::string(res.status().message());
    } else if (res->contains("Error") && (*res)["Error"].is_string() &&
               !(*res)["Error"].get<std::string>().empty()) {
      error = (*res)["Error"].get<std::string>();
    }
  } else {
    auto st = client_.BindPod(kube::Namespace(*pod), kube::Name(*pod), node, kube::Uid(*pod));
    if (!st.ok()) error = std::string(st.message());
  }
  if (!error.empty()) {
    {
      dynmig::MutexLock lock(&mu_);
      assumed_.erase(kube::Uid(*pod));  // ForgetPod
    }
    Failed(key, "SchedulerError", "Binding rejected: " + error);
    return;
  }
  Log(fmt::format("scheduled {} to {}", key, node));
  if (!updated_in_cycle.empty()) {
    const std::string message =
        fmt::format("pod {} is in the cache, so can't be assumed", kube::Uid(*pod));
    Log(fmt::format("{} was updated during its scheduling cycle (resourceVersion {}): {}", key,
                    updated_in_cycle, message));
    (void)client_.CreateEvent(kube::NewEvent(*pod, "Warning", "FailedScheduling", message,
                                             "dynmig-local-scheduler", clock_.Now()));
  }
}

void SchedulerLoop::Failed(const std::string& key, const std::string& reason,
                           const std::string& message) {
  // kube-scheduler's error handler: queued again only while the pod still exists unbound.
  const kube::ObjectPtr pod = pods_.Get(key);
  if (pod == nullptr || !kube::NodeName(*pod).empty()) {
    dynmig::MutexLock lock(&mu_);
    queue_.Delete(key);
    return;
  }
  {
    dynmig::MutexLock lock(&mu_);
    queue_.AddUnschedulable(key, Priority(*pod), clock_.Now());
    cv_.SignalAll();
  }
  // The condition is written when it changes (kube-scheduler's updatePod), with the event.
  if (SchedulingCondition(*pod) == std::make_pair(reason, message)) return;
  Log(fmt::format("{} stays Pending: {}", key, message));
  json patch = {
      {"status",
       {{"conditions", json::array({{{"type", "PodScheduled"},
                                     {"status", "False"},
                                     {"reason", reason},
                                     {"message", message},
                                     {"lastTransitionTime", kube::Rfc3339(clock_.Now())}}})}}}};
  (void)client_.PatchPodStatus(kube::Namespace(*pod), kube::Name(*pod), patch);
  (void)client_.CreateEvent(kube::NewEvent(*pod, "Warning", "FailedScheduling", message,
                                           "dynmig-local-scheduler", clock_.Now()));
}

}  // namespace dynmig::local
