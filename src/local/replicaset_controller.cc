#include "local/replicaset_controller.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

namespace dynmig::local {
namespace {

using kube::Object;

// The uid of the pod's controller when it is a ReplicaSet ("" otherwise).
std::string ReplicaSetOwner(const Object& pod) {
  const Object refs = pod.value("/metadata/ownerReferences"_json_pointer, Object::array());
  if (!refs.is_array()) return "";
  for (const auto& r : refs) {
    if (r.is_object() && r.value("controller", false) && r.value("kind", "") == "ReplicaSet" &&
        r.value("apiVersion", "") == "apps/v1") {
      return r.value("uid", "");
    }
  }
  return "";
}

bool Active(const Object& pod) { return !kube::IsBeingDeleted(pod) && !kube::IsTerminated(pod); }

bool Ready(const Object& pod) {
  const Object conditions = pod.value("/status/conditions"_json_pointer, Object::array());
  if (!conditions.is_array()) return false;
  for (const auto& c : conditions) {
    if (c.is_object() && c.value("type", "") == "Ready") return c.value("status", "") == "True";
  }
  return false;
}

Object PodFromTemplate(const Object& rs) {
  const Object& tmpl = rs["spec"]["template"];
  Object meta = {{"generateName", kube::Name(rs) + "-"},
                 {"namespace", kube::Namespace(rs)},
                 {"ownerReferences", Object::array({{{"apiVersion", "apps/v1"},
                                                     {"kind", "ReplicaSet"},
                                                     {"name", kube::Name(rs)},
                                                     {"uid", kube::Uid(rs)},
                                                     {"controller", true},
                                                     {"blockOwnerDeletion", true}}})}};
  const Object tmeta = tmpl.value("metadata", Object::object());
  for (const char* field : {"labels", "annotations"}) {
    if (tmeta.is_object() && tmeta.contains(field) && tmeta[field].is_object()) {
      meta[field] = tmeta[field];
    }
  }
  return Object{{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", meta}, {"spec", tmpl["spec"]}};
}

// Which surplus pods go first: unscheduled, then not ready, then the newest.
bool DeleteFirst(const Object* a, const Object* b) {
  const bool a_placed = !kube::NodeName(*a).empty(), b_placed = !kube::NodeName(*b).empty();
  if (a_placed != b_placed) return !a_placed;
  if (Ready(*a) != Ready(*b)) return !Ready(*a);
  return kube::StringAt(*a, "/metadata/creationTimestamp") >
         kube::StringAt(*b, "/metadata/creationTimestamp");
}

}  // namespace

ReplicaSetController::ReplicaSetController(kube::KubeClient& client, const Clock& clock,
                                           ReplicaSetControllerOptions options)
    : client_(client), clock_(clock), options_(std::move(options)) {}

ReplicaSetController::~ReplicaSetController() { Stop(); }

void ReplicaSetController::Log(const std::string& line) const {
  if (options_.log) options_.log("replicaset-controller: " + line);
}

void ReplicaSetController::Start() {
  thread_ = std::thread([this] { Run(); });
}

void ReplicaSetController::Stop() {
  {
    dynmig::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

void ReplicaSetController::Run() {
  for (;;) {
    {
      dynmig::MutexLock lock(&mu_);
      if (stop_) return;
    }
    if (auto pass = Reconcile(); !pass.ok()) Log(std::string(pass.status().message()));
    dynmig::MutexLock lock(&mu_);
    if (clock_.WaitFor(cv_, mu_, options_.interval,
                       [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; })) {
      return;
    }
  }
}

absl::StatusOr<ReplicaSetController::Pass> ReplicaSetController::Reconcile() {
  dynmig::MutexLock lock(&seen_mu_);
  Pass pass;
  auto sets = client_.List(kube::Resource::kReplicaSets, {});
  if (!sets.ok()) return sets.status();
  if (sets->items.empty() && seen_.empty()) return pass;  // nothing to own or collect
  auto pods = client_.List(kube::Resource::kPods, {});
  if (!pods.ok()) return pods.status();
  std::map<std::string, std::vector<const Object*>> owned;  // ReplicaSet uid -> its pods
  for (const auto& p : pods->items) {
    if (std::string owner = ReplicaSetOwner(p); !owner.empty()) owned[owner].push_back(&p);
  }
  std::set<std::string> live;
  for (const auto& rs : sets->items) {
    const std::string uid = kube::Uid(rs);
    live.insert(uid);
    seen_.insert(uid);
    if (kube::IsBeingDeleted(rs)) continue;
    std::vector<const Object*> active;
    int64_t ready = 0;
    for (const Object* p : owned[uid]) {
      if (kube::Namespace(*p) != kube::Namespace(rs) || !Active(*p)) continue;
      active.push_back(p);
      if (Ready(*p)) ++ready;
    }
    const int64_t want =
        std::min(rs.value("/spec/replicas"_json_pointer, int64_t{1}), options_.max_replicas);
    const int64_t have = static_cast<int64_t>(active.size());
    int64_t created = 0;
    for (int64_t i = have; i < want && i - have < kBurstReplicas; ++i) {
      auto pod = client_.Create(kube::Resource::kPods, PodFromTemplate(rs));
      if (!pod.ok()) {
        Log(fmt::format("{}/{}: creating a pod: {}", kube::Namespace(rs), kube::Name(rs),
                        std::string(pod.status().message())));
        break;
      }
      ++created;
    }
    pass.created += static_cast<int>(created);
    if (have > want) {
      std::sort(active.begin(), active.end(), DeleteFirst);
      for (int64_t i = 0; i < have - want; ++i) {
        const Object& p = *active[static_cast<size_t>(i)];
        if (client_.Delete(kube::Resource::kPods, kube::Namespace(p), kube::Name(p), {}).ok())
          ++pass.deleted;
      }
    }
    const Object status = {
        {"replicas", std::min(have, want) + created},
        {"readyReplicas", ready},
        {"observedGeneration", rs.value("/metadata/generation"_json_pointer, 1)}};
    if (rs.value("status", Object::object()) != status) {
      (void)client_.Patch(kube::Resource::kReplicaSets, kube::Namespace(rs), kube::Name(rs),
                          {{"status", status}}, kube::PatchType::kMerge, "status");
    }
  }
  // The garbage collector's part: the pods of ReplicaSets that were deleted.
  for (const auto& [owner, list] : owned) {
    if (live.count(owner) || !seen_.count(owner)) continue;
    for (const Object* p : list) {
      if (kube::IsBeingDeleted(*p)) continue;
      if (client_.Delete(kube::Resource::kPods, kube::Namespace(*p), kube::Name(*p), {}).ok())
        ++pass.collected;
    }
  }
  std::erase_if(seen_,
                [&](const std::string& uid) { return !live.count(uid) && !owned.count(uid); });
  return pass;
}

}  // namespace dynmig::local
