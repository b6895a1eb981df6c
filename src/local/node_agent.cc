#include "local/node_agent.h"

#include <algorithm>
#include <regex>
#include <set>

#include "common/quantity.h"
#include "common/strings.h"
#include "fmt/format.h"
#include "protocol/annotations.h"
#include "protocol/devices.h"

namespace dynmig::local {
namespace {

using nlohmann::json;

uint32_t CountOf(const json& container, const std::string& resource) {
  for (const char* kind : {"limits", "requests"}) {
    if (!container.contains("resources") || !container["resources"].contains(kind)) continue;
    const json& r = container["resources"][kind];
    if (!r.is_object() || !r.contains(resource)) continue;
    const json& v = r[resource];
    if (v.is_number_integer()) {
      return static_cast<uint32_t>(std::clamp<int64_t>(v.get<int64_t>(), 0, UINT32_MAX));
    }
    // A quantity as the API server serves it ("2", "1k" for 1000).
    if (!v.is_string()) return 0;
    auto q = ParseQuantity(v.get_ref<const std::string&>());
    if (!q.ok()) return 0;
    const auto n = q->AsInt64();
    return n.has_value() ? static_cast<uint32_t>(std::clamp<int64_t>(*n, 0, UINT32_MAX)) : 0;
  }
  return 0;
}

// The spec of the pod's (init or app) container `name`, or null.
const json* ContainerSpec(const kube::Object& pod, const std::string& name) {
  if (!pod.contains("spec") || !pod["spec"].is_object()) return nullptr;
  for (const char* list : {"initContainers", "containers"}) {
    const auto it = pod["spec"].find(list);
    if (it == pod["spec"].end() || !it->is_array()) continue;
    for (const auto& c : *it) {
      if (c.is_object() && c.value("name", "") == name) return &c;
    }
  }
  return nullptr;
}

}  // namespace

std::map<std::string, std::string> SpecEnv(const kube::Object& container) {
  std::map<std::string, std::string> out;
  const auto env = container.find("env");
  if (env == container.end() || !env->is_array()) return out;
  for (const auto& e : *env) {
    if (out.size() >= kMaxSpecEnv) break;
    if (!e.is_object()) continue;
    const auto n = e.find("name");
    const auto v = e.find("value");
    if (n == e.end() || v == e.end() || !n->is_string() || !v->is_string()) continue;
    const auto& name = n->get_ref<const std::string&>();
    const auto& value = v->get_ref<const std::string&>();
    if (name.empty() || name.size() > 256 || value.size() > 4096) continue;
    out.emplace(name, value);
  }
  return out;
}

std::vector<std::string> MigResources(const kube::Object& container) {
  std::set<std::string> found;
  const auto res = container.find("resources");
  if (res == container.end() || !res->is_object()) return {};
  for (const char* kind : {"limits", "requests"}) {
    const auto r = res->find(kind);
    if (r == res->end() || !r->is_object()) continue;
    for (auto it = r->begin(); it != r->end() && found.size() < 16; ++it) {
      if (protocol::MigResourceProfile(it.key()).has_value() && CountOf(container, it.key()) > 0)
        found.insert(it.key());
    }
  }
  return {found.begin(), found.end()};
}

std::optional<int64_t> SleepSeconds(const kube::Object& container) {
  std::string text;
  for (const char* field : {"command", "args"}) {
    if (!container.contains(field) || !container[field].is_array()) continue;
    for (const auto& part : container[field]) {
      if (part.is_string()) text += part.get<std::string>() + " ";
    }
  }
  static const std::regex kSleep(R"(\bsleep\s+([0-9]+)\b)");
  std::smatch m;
  if (std::regex_search(text, m, kSleep)) return std::stoll(m[1].str());
  return std::nullopt;
}

NodeAgent::NodeAgent(kube::KubeClient& client, DeviceAllocator& allocator, const Clock& clock,
                     NodeAgentOptions options)
    : client_(client),
      allocator_(allocator),
      clock_(clock),
      options_(std::move(options)),
      pods_(client, kube::Resource::kPods,
            kube::InformerOptions{.filter = {.field_selector = "spec.nodeName=" + options_.node}}),
      next_pid_(options_.first_pid) {
  auto poke = [this] {
    dynmig::MutexLock lock(&mu_);
    dirty_ = true;
    cv_.SignalAll();
  };
  kube::InformerHandlers h;
  h.on_add = [poke](const kube::Object&) { poke(); };
  h.on_update = [poke](const kube::Object&, const kube::Object&) { poke(); };
  h.on_delete = [poke](const kube::Object&) { poke(); };
  pods_.AddHandlers(h);
}

NodeAgent::~NodeAgent() { Stop(); }

void NodeAgent::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

void NodeAgent::Start() {
  pods_.Start();
  thread_ = std::thread([this] { Loop(); });
}

void NodeAgent::Loop() {
  pods_.WaitForSync(absl::Seconds(30));
  while (true) {
    {
      dynmig::MutexLock lock(&mu_);
      if (stop_) return;
      dirty_ = false;
    }
    Reconcile();
    const absl::Duration wait = NextWake() + absl::Milliseconds(5);
    dynmig::MutexLock lock(&mu_);
    clock_.WaitFor(cv_, mu_, wait,
                   [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || dirty_; });
  }
}

absl::Duration NodeAgent::NextWake() const {
  // The next pod whose sleep ends, and every second to retry.
  absl::Duration wait = absl::Seconds(1);
  const absl::Time now = clock_.Now();
  for (const auto& [uid, r] : running_) {
    if (r.ends_at) wait = std::min(wait, std::max(absl::ZeroDuration(), *r.ends_at - now));
    if (!r.waiting.empty()) wait = std::min(wait, std::max(absl::ZeroDuration(), r.retry_at - now));
  }
  // And the next pod to admit.
  if (next_admission_ != absl::InfiniteFuture()) {
    wait = std::min(wait, std::max(absl::ZeroDuration(), next_admission_ - now));
  }
  return wait;
}

void NodeAgent::Stop() {
  {
    dynmig::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  pods_.Stop();
}

void NodeAgent::WriteStatus(const kube::Object& pod, nlohmann::json status) {
  const std::string uid = kube::Uid(pod);
  auto written = client_.PatchPodStatus(kube::Namespace(pod), kube::Name(pod), status);
  if (written.ok() || absl::IsNotFound(written.status())) {
    unsynced_.erase(uid);
    return;
  }
  Log(fmt::format("{}: status not written ({}); retrying", kube::ObjectKey(pod),
                  std::string(written.status().message())));
  unsynced_[uid] = {kube::Namespace(pod), kube::Name(pod), std::move(status)};
}

void NodeAgent::Reconcile() {
  std::set<std::string> present;
  next_admission_ = absl::InfiniteFuture();
  for (const auto& pod : pods_.List()) {
    const std::string uid = kube::Uid(*pod);
    present.insert(uid);
    if (auto unsynced = unsynced_.find(uid);
        unsynced != unsynced_.end() && !kube::IsBeingDeleted(*pod)) {
      WriteStatus(*pod, unsynced->second.status);
    }
    if (kube::IsBeingDeleted(*pod)) {
      FinishPod(*pod, "");
      // Confirm the deletion, as the kubelet does once the containers stopped.
      kube::DeleteOptions opts;
      opts.grace_period_seconds = 0;
      opts.precondition_uid = uid;
      auto st = client_.DeletePod(kube::Namespace(*pod), kube::Name(*pod), opts);
      if (st.ok()) Log(fmt::format("{} deleted on {}", kube::ObjectKey(*pod), options_.node));
      continue;
    }
    const std::string phase = kube::Phase(*pod);
    if ((phase.empty() || phase == "Pending") && !started_uid_.count(uid)) {
      if (options_.admission_delay > absl::ZeroDuration()) {
        const absl::Time now = clock_.Now();
        const absl::Time admit =
            first_seen_.emplace(uid, now).first->second + options_.admission_delay;
        if (now < admit) {
          next_admission_ = std::min(next_admission_, admit);
          continue;
        }
        first_seen_.erase(uid);
      }
      StartPod(*pod);
      continue;
    }
    auto it = running_.find(uid);
    if (it != running_.end() && !it->second.waiting.empty() &&
        it->second.retry_at <= clock_.Now()) {
      StartContainers(*pod, it->second);  // the pod worker's next sync
    }
    if (it != running_.end() && it->second.ends_at && *it->second.ends_at <= clock_.Now()) {
      FinishPod(*pod, "Succeeded");
    }
  }
  for (auto it = unsynced_.begin(); it != unsynced_.end();) {
    it = present.count(it->first) ? std::next(it) : unsynced_.erase(it);
  }
  for (auto it = first_seen_.begin(); it != first_seen_.end();) {
    it = present.count(it->first) ? std::next(it) : first_seen_.erase(it);
  }
  // Pods removed without a graceful deletion: their processes end too.
  for (auto it = running_.begin(); it != running_.end();) {
    if (present.count(it->first)) {
      ++it;
      continue;
    }
    for (const auto& [uuid, pid] : it->second.processes) {
      if (options_.processes.detach) (void)options_.processes.detach(uuid, pid);
    }
    if (auto key = started_uid_.find(it->first); key != started_uid_.end()) {
      allocator_.Release(key->second);
    }
    started_uid_.erase(it->first);
    it = running_.erase(it);
  }
}

void NodeAgent::StartPod(const kube::Object& pod) {
  const std::string key = kube::ObjectKey(pod);
  const std::string uid = kube::Uid(pod);
  const std::string own = allocator_.ResourceName();
  const std::vector<std::string> registered = allocator_.ResourceNames();
  std::vector<std::pair<const json*, bool>> containers;  // (container, init), in start order
  std::vector<std::string> app_names, init_names;
  for (const char* list : {"initContainers", "containers"}) {
    const json* cs = nullptr;
    if (pod.contains("spec") && pod["spec"].contains(list)) cs = &pod["spec"][list];
    if (cs == nullptr || !cs->is_array()) continue;
    const bool init = std::string_view(list) == "initContainers";
    for (const auto& c : *cs) {
      containers.push_back({&c, init});
      (init ? init_names : app_names).push_back(c.value("name", ""));
    }
  }
  // A pod waits while a device resource it asks for has no registered plugin yet: dynmig's, or
  // NVIDIA's per-profile ones.
  for (const auto& [c, init] : containers) {
    if (own.empty() && CountOf(*c, std::string(protocol::kResourceCount)) > 0) return;
    for (const auto& r : MigResources(*c)) {
      if (std::find(registered.begin(), registered.end(), r) == registered.end()) return;
    }
  }

  // Admission: the kubelet knows the pod, then allocates each container's devices.
  allocator_.PodUid(key, uid);
  allocator_.Admit(key, app_names, init_names);
  Running running;
  std::map<std::string, std::set<std::string>> used;  // by resource
  for (const auto& [c, init] : containers) {
    Admitted admitted{c->value("name", ""), init, "", ""};
    auto devices = AllocateContainer(key, *c, admitted.name, registered, used);
    if (!devices.ok()) {
      FailAdmission(pod, std::string(devices.status().message()));
      started_uid_[uid] = key;
      return;
    }
    admitted.devices = *devices;
    running.waiting.push_back(std::move(admitted));
  }
  started_uid_[uid] = key;
  StartContainers(pod, running_[uid] = std::move(running));
}

absl::StatusOr<std::string> NodeAgent::AllocateContainer(
    const std::string& key, const kube::Object& container, const std::string& name,
    const std::vector<std::string>& resources, std::map<std::string, std::set<std::string>>& used) {
  std::vector<std::string> parts;
  for (const auto& resource : resources) {
    const uint32_t n = CountOf(container, resource);
    if (n == 0) continue;
    const std::vector<std::string> ids = allocator_.ResourceDeviceIds(resource);
    std::vector<std::string> chosen;
    for (const auto& id : ids) {
      if (chosen.size() == n) break;
      if (!used[resource].count(id)) chosen.push_back(id);
    }
    absl::StatusOr<ContainerAllocation> alloc =
        chosen.size() < n
            ? absl::ResourceExhaustedError(fmt::format(
                  "the node advertises {} {} devices, {} asked", ids.size(), resource, n))
            : allocator_.AllocateResource(key, name, chosen, resource);
    if (!alloc.ok()) {
      return absl::Status(alloc.status().code(),
                          fmt::format("Allocate failed for container {}: {}", name,
                                      std::string(alloc.status().message())));
    }
    for (const auto& id : chosen) used[resource].insert(id);
    const auto visible = alloc->envs.find(std::string(protocol::kVisibleDevicesEnv));
    parts.push_back(visible != alloc->envs.end()
                        ? visible->second
                        : fmt::format("{}", fmt::join(alloc->cdi_devices, ",")));
  }
  return fmt::format("{}", fmt::join(parts, ","));
}

void NodeAgent::FailAdmission(const kube::Object& pod, const std::string& msg) {
  const std::string key = kube::ObjectKey(pod);
  Log(fmt::format("{} failed on {}: {}", key, options_.node, msg));
  json status = {
      {"status", {{"phase", "Failed"}, {"reason", "UnexpectedAdmissionError"}, {"message", msg}}}};
  WriteStatus(pod, std::move(status));
  (void)client_.CreateEvent(kube::NewEvent(pod, "Warning", "UnexpectedAdmissionError", msg,
                                           "dynmig-local-kubelet", clock_.Now()));
  allocator_.Release(key);
}

void NodeAgent::StartContainers(const kube::Object& pod, Running& running) {
  const std::string key = kube::ObjectKey(pod);
  const absl::Time now = clock_.Now();
  bool started_any = false;
  for (auto it = running.waiting.begin(); it != running.waiting.end();) {
    if (auto st = allocator_.PreStart(key, it->name); !st.ok()) {
      // The container is not created: it gets nothing, and the pod waits for it.
      it->error = std::string(st.message());
      Log(fmt::format("{}: container {} does not start: {}", key, it->name, it->error));
      (void)client_.CreateEvent(kube::NewEvent(pod, "Warning", "Failed", "Error: " + it->error,
                                               "dynmig-local-kubelet", now));
      if (it->init) break;  // init containers run one after the other, before the app ones
      ++it;
      continue;
    }
    if (const json* spec = ContainerSpec(pod, it->name); spec != nullptr) {
      auto env = SpecEnv(*spec);
      if (!env.empty()) allocator_.ContainerEnv(key, it->name, env);
    }
    if (!it->devices.empty()) {
      running.visible[it->name] = it->devices;
      started_any = true;
    }
    for (const auto& part : SplitTrimmed(it->devices, ',')) {
      const std::string uuid =
          part.substr(part.rfind('=') == std::string::npos ? 0 : part.rfind('=') + 1);
      if (uuid.rfind("MIG-", 0) != 0) continue;
      const uint32_t pid = next_pid_++;
      if (options_.processes.attach) {
        auto st = options_.processes.attach(uuid, pid);
        if (!st.ok())
          Log(fmt::format("{}: cannot attach a process to {}: {}", key, uuid,
                          std::string(st.message())));
      }
      running.processes.push_back({uuid, pid});
    }
    it = running.waiting.erase(it);
  }
  if (started_any) {
    (void)client_.PatchPodAnnotations(
        kube::Namespace(pod), kube::Name(pod),
        {{std::string(kVisibleDevicesAnnotation), running.visible.dump()}});
  }
  running.retry_at = absl::InfiniteFuture();
  if (!running.waiting.empty()) {
    running.retry_at = now + options_.prestart_retry;
  } else {
    std::optional<int64_t> longest;
    bool forever = false;
    if (pod.contains("spec") && pod["spec"].contains("containers")) {
      for (const auto& c : pod["spec"]["containers"]) {
        auto s = SleepSeconds(c);
        if (!s)
          forever = true;
        else
          longest = std::max(longest.value_or(0), *s);
      }
    }
    if (!forever && longest) running.ends_at = now + absl::Seconds(*longest);
  }
  WriteStartedStatus(pod, running);
}

void NodeAgent::WriteStartedStatus(const kube::Object& pod, const Running& running) {
  const std::string now = kube::Rfc3339(clock_.Now());
  json statuses = json::array();
  if (pod["spec"].contains("containers")) {
    for (const auto& c : pod["spec"]["containers"]) {
      const std::string name = c.value("name", "");
      auto waiting = std::find_if(running.waiting.begin(), running.waiting.end(),
                                  [&](const Admitted& a) { return a.name == name; });
      json state = {{"running", {{"startedAt", now}}}};
      if (waiting != running.waiting.end()) {
        state =
            waiting->error.empty()
                ? json{{"waiting", {{"reason", "PodInitializing"}}}}
                : json{{"waiting",
                        {{"reason", "CreateContainerConfigError"}, {"message", waiting->error}}}};
      }
      statuses.push_back({{"name", name},
                          {"ready", waiting == running.waiting.end()},
                          {"restartCount", 0},
                          {"image", c.value("image", "")},
                          {"state", state}});
    }
  }
  const bool all = running.waiting.empty();
  json status = {
      {"status",
       {{"phase", all ? "Running" : "Pending"},
        {"startTime", now},
        {"conditions", json::array({{{"type", "Ready"}, {"status", all ? "True" : "False"}},
                                    {{"type", "PodScheduled"}, {"status", "True"}}})},
        {"containerStatuses", statuses}}}};
  WriteStatus(pod, std::move(status));
  const std::string key = kube::ObjectKey(pod);
  if (all) {
    Log(fmt::format("{} running on {}{}", key, options_.node,
                    running.visible.empty() ? "" : " with " + running.visible.dump()));
  } else {
    Log(fmt::format("{} pending on {}: {} container(s) not started", key, options_.node,
                    running.waiting.size()));
  }
}

void NodeAgent::FinishPod(const kube::Object& pod, const std::string& phase) {
  const std::string uid = kube::Uid(pod);
  auto it = running_.find(uid);
  if (it != running_.end()) {
    for (const auto& [uuid, pid] : it->second.processes) {
      if (options_.processes.detach) (void)options_.processes.detach(uuid, pid);
    }
    running_.erase(it);
    allocator_.Release(kube::ObjectKey(pod));
  }
  if (phase.empty()) return;
  const std::string now = kube::Rfc3339(clock_.Now());
  json statuses = json::array();
  if (pod.contains("spec") && pod["spec"].contains("containers")) {
    for (const auto& c : pod["spec"]["containers"]) {
      statuses.push_back(
          {{"name", c.value("name", "")},
           {"ready", false},
           {"restartCount", 0},
           {"image", c.value("image", "")},
           {"state",
            {{"terminated", {{"exitCode", 0}, {"reason", "Completed"}, {"finishedAt", now}}}}}});
    }
  }
  json status = {{"status",
                  {{"phase", phase},
                   {"conditions", json::array({{{"type", "Ready"}, {"status", "False"}}})},
                   {"containerStatuses", statuses}}}};
  WriteStatus(pod, std::move(status));
  Log(fmt::format("{} {} on {}", kube::ObjectKey(pod), phase, options_.node));
}

}  // namespace dynmig::local
