// The RBAC in deploy/ against the API calls of a real end-to-end run: a LocalCluster with two
// nodes runs every code path that talks to the API server (pods created, Running, Pending with a
// reason, deleted and reclaimed, a job that ends, device-plugin restarts with adoption and with a
// reclamation at startup, a scheduler restart, reservation expiry, leader election between two
// more scheduler replicas), the in-memory API server records each identity's calls as an
// authorizer sees them (kube/audit.h), and the test resolves deploy/base/scheduler/rbac.yaml and
// deploy/base/device-plugin/rbac.yaml (ServiceAccount -> (Cluster)RoleBindings -> rules) to check
//   (a) every call of dynmig-scheduler and dynmig-device-plugin is allowed by their rules;
//   (b) every granted (apiGroup, resource, verb, resourceName) is used at least once, or is on
//       kUnreachable below with the reason the run cannot use it (so over-grants are caught).
// Built-in roles bound to the ServiceAccounts (system:kube-scheduler, ...) are Kubernetes' and
// cover the upstream kube-scheduler container, which the local mode replaces by a stand-in with
// its own identity: they allow nothing here, so a dynmig call that only they would allow fails.
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "common/clock.h"
#include "e2e_test_util.h"
#include "kube/audit.h"
#include "scheduler/server.h"

namespace dynmig::e2e {
namespace {

// ---- RBAC, as kube-apiserver's RBAC authorizer evaluates it. ----

struct Rule {
  std::vector<std::string> api_groups;
  std::vector<std::string> resources;  // "pods", "pods/binding", "*", "*/status"
  std::vector<std::string> verbs;
  std::vector<std::string> resource_names;  // empty = any
};

// One (Cluster)RoleBinding of a subject, resolved to its role's rules.
struct Binding {
  std::string what;  // "ClusterRoleBinding dynmig-scheduler -> ClusterRole dynmig-scheduler"
  std::string ns;    // "" = ClusterRoleBinding (every namespace and cluster-scoped resources)
  std::string role_kind;
  std::string role_name;
  bool builtin = false;  // the role is not defined in the files (a role Kubernetes defines)
  std::vector<Rule> rules;
};

// A call as the authorizer sees it; name "" = none (or unknown: see AuditRecord::more_names).
struct Call {
  std::string verb;
  std::string api_group;
  std::string resource;  // RbacResource(resource, subresource)
  std::string ns;
  std::string name;
  std::string Describe() const {
    return fmt::format("{} {}{}{}{}", verb, api_group.empty() ? "" : api_group + ":", resource,
                       ns.empty() ? " (cluster)" : " in " + ns,
                       name.empty() ? "" : " name " + name);
  }
};

bool Has(const std::vector<std::string>& list, std::string_view value) {
  for (const std::string& v : list) {
    if (v == "*" || v == value) return true;
  }
  return false;
}

bool ResourceMatches(const std::vector<std::string>& rule_resources, std::string_view resource) {
  for (const std::string& r : rule_resources) {
    if (r == "*" || r == resource) return true;
    const size_t slash = resource.find('/');
    if (slash != std::string_view::npos && r == "*" + std::string(resource.substr(slash))) {
      return true;
    }
  }
  return false;
}

bool RuleAllows(const Rule& rule, const Call& call) {
  if (!Has(rule.verbs, call.verb) || !Has(rule.api_groups, call.api_group) ||
      !ResourceMatches(rule.resources, call.resource)) {
    return false;
  }
  if (rule.resource_names.empty()) return true;
  if (call.name.empty()) return false;
  for (const std::string& n : rule.resource_names) {
    if (n == call.name) return true;
  }
  return false;
}

bool ScopeAllows(const Binding& binding, const Call& call) {
  return binding.ns.empty() || binding.ns == call.ns;
}

// The bindings of a subject that allow the call, as "binding (rule #i)"; empty = forbidden.
std::vector<std::string> AllowedBy(const std::vector<Binding>& bindings, const Call& call) {
  std::vector<std::string> out;
  for (const Binding& b : bindings) {
    if (!ScopeAllows(b, call)) continue;
    for (size_t i = 0; i < b.rules.size(); ++i) {
      if (RuleAllows(b.rules[i], call)) out.push_back(fmt::format("{} (rule #{})", b.what, i + 1));
    }
  }
  return out;
}

std::vector<std::string> Strings(const YAML::Node& node) {
  std::vector<std::string> out;
  if (!node) return out;
  for (const auto& item : node) out.push_back(item.as<std::string>());
  return out;
}

// The RBAC objects of some manifest files. Errors name the file and the object.
class RbacPolicy {
 public:
  std::string Load(const std::string& path) {
    std::vector<YAML::Node> docs;
    try {
      docs = YAML::LoadAllFromFile(path);
    } catch (const YAML::Exception& e) {
      return fmt::format("{}: {}", path, e.what());
    }
    for (const YAML::Node& doc : docs) {
      if (!doc || !doc.IsMap()) continue;
      const std::string kind = doc["kind"] ? doc["kind"].as<std::string>() : "";
      const YAML::Node meta = doc["metadata"];
      const std::string name = meta && meta["name"] ? meta["name"].as<std::string>() : "";
      const std::string ns = meta && meta["namespace"] ? meta["namespace"].as<std::string>() : "";
      try {
        if (kind == "Role" || kind == "ClusterRole") {
          std::vector<Rule> rules;
          for (const auto& r : doc["rules"]) {
            if (r["nonResourceURLs"]) {
              return fmt::format("{}: {} {}: nonResourceURLs rules are not modelled", path, kind,
                                 name);
            }
            rules.push_back(Rule{Strings(r["apiGroups"]), Strings(r["resources"]),
                                 Strings(r["verbs"]), Strings(r["resourceNames"])});
          }
          roles_[RoleKey(kind, kind == "Role" ? ns : "", name)] = std::move(rules);
        } else if (kind == "RoleBinding" || kind == "ClusterRoleBinding") {
          RawBinding b;
          b.kind = kind;
          b.name = name;
          b.ns = kind == "RoleBinding" ? ns : "";
          b.role_kind = doc["roleRef"]["kind"].as<std::string>();
          b.role_name = doc["roleRef"]["name"].as<std::string>();
          if (kind == "RoleBinding" && ns.empty()) {
            return fmt::format("{}: RoleBinding {} has no namespace", path, name);
          }
          for (const auto& s : doc["subjects"]) {
            const std::string skind = s["kind"].as<std::string>();
            if (skind != "ServiceAccount") {
              return fmt::format("{}: {} {}: subject kind {} is not modelled", path, kind, name,
                                 skind);
            }
            b.users.push_back(fmt::format("system:serviceaccount:{}:{}",
                                          s["namespace"].as<std::string>(),
                                          s["name"].as<std::string>()));
          }
          bindings_.push_back(std::move(b));
        } else if (kind == "ServiceAccount") {
          service_accounts_.insert(fmt::format("system:serviceaccount:{}:{}", ns, name));
        }
      } catch (const YAML::Exception& e) {
        return fmt::format("{}: {} {}: {}", path, kind, name, e.what());
      }
    }
    return "";
  }

  bool HasServiceAccount(const std::string& user) const {
    return service_accounts_.count(user) > 0;
  }

  std::vector<Binding> BindingsOf(const std::string& user) const {
    std::vector<Binding> out;
    for (const RawBinding& raw : bindings_) {
      if (std::find(raw.users.begin(), raw.users.end(), user) == raw.users.end()) continue;
      Binding b;
      b.what = fmt::format("{} {}{} -> {} {}", raw.kind, raw.ns.empty() ? "" : raw.ns + "/",
                           raw.name, raw.role_kind, raw.role_name);
      b.ns = raw.ns;
      b.role_kind = raw.role_kind;
      b.role_name = raw.role_name;
      auto it =
          roles_.find(RoleKey(raw.role_kind, raw.role_kind == "Role" ? raw.ns : "", raw.role_name));
      if (it == roles_.end()) {
        b.builtin = true;
      } else {
        b.rules = it->second;
      }
      out.push_back(std::move(b));
    }
    return out;
  }

 private:
  struct RawBinding {
    std::string kind, name, ns, role_kind, role_name;
    std::vector<std::string> users;
  };
  static std::string RoleKey(const std::string& kind, const std::string& ns,
                             const std::string& name) {
    return kind + "/" + ns + "/" + name;
  }
  std::map<std::string, std::vector<Rule>> roles_;
  std::vector<RawBinding> bindings_;
  std::set<std::string> service_accounts_;
};

// Grants the end-to-end run cannot use, each with the reason. A grant listed here that the run
// does use fails the test too (the entry is stale: remove it).
struct Unreachable {
  std::string_view user;
  std::string_view api_group;
  std::string_view resource;
  std::string_view verb;
  std::string_view resource_name;  // "" = the rule has no resourceNames
  std::string_view why;
};
constexpr std::string_view kCoordination = "coordination.k8s.io";
const Unreachable kUnreachable[] = {
    // The Lease of the upstream kube-scheduler container (leaderElection.resourceName in
    // deploy/scheduler/kube-scheduler-config.yaml): kube-scheduler's code, not dynmig's. The local
    // mode's kube-scheduler stand-in runs as system:kube-scheduler and elects no leader.
    {local::kSchedulerUser, kCoordination, "leases", "get", "dynmig-kube-scheduler",
     "the upstream kube-scheduler container's leader election"},
    {local::kSchedulerUser, kCoordination, "leases", "update", "dynmig-kube-scheduler",
     "the upstream kube-scheduler container's leader election"},
    // The defragmenter is off by default and in this run (tests/scheduler/defragmenter_test.cc
    // and tests/ops/defrag_cmd_test.cc exercise these calls).
    {local::kSchedulerUser, "", "pods/eviction", "create", "", "the defragmenter, off in this run"},
    {local::kSchedulerUser, "policy", "poddisruptionbudgets", "list", "",
     "the defragmenter, off in this run"},
};

// Discovery and version endpoints: every authenticated user may read them (the built-in
// system:discovery and system:public-info-viewer ClusterRoles).
bool PublicNonResource(const kube::AuditRecord& r) {
  if (r.verb != "get") return false;
  for (std::string_view p :
       {"/api", "/apis", "/version", "/openapi", "/healthz", "/livez", "/readyz"}) {
    if (r.path == p || absl::StartsWith(r.path, std::string(p) + "/")) return true;
  }
  return false;
}

// The calls of a record: one per object name seen, and a nameless one when some requests named
// none (or names were not all kept, so that only a rule without resourceNames allows them).
std::vector<Call> CallsOf(const kube::AuditRecord& r) {
  std::vector<Call> out;
  const std::string resource = kube::RbacResource(r.resource, r.subresource);
  for (const std::string& n : r.names) out.push_back({r.verb, r.api_group, resource, r.ns, n});
  if (r.names.empty() || r.unnamed || r.more_names) {
    out.push_back({r.verb, r.api_group, resource, r.ns, ""});
  }
  return out;
}

std::string Table(const std::vector<kube::AuditRecord>& records, const std::string& user) {
  std::string out;
  for (const kube::AuditRecord& r : records) {
    if (r.user != user) continue;
    out += fmt::format("    {:<72} x{}{}\n", r.Describe(), r.count,
                       r.failures > 0 ? fmt::format(" ({} failed)", r.failures) : "");
  }
  return out.empty() ? "    (no calls)\n" : out;
}

// ---- The matcher itself, on hand-written rules. ----

TEST(RbacMatcher, FollowsTheRbacAuthorizer) {
  const Rule pods{{""}, {"pods"}, {"get", "patch"}, {}};
  EXPECT_TRUE(RuleAllows(pods, {"get", "", "pods", "default", "p"}));
  EXPECT_TRUE(RuleAllows(pods, {"patch", "", "pods", "default", ""}));
  EXPECT_FALSE(RuleAllows(pods, {"list", "", "pods", "", ""}));
  EXPECT_FALSE(RuleAllows(pods, {"get", "", "pods/status", "default", "p"}));  // a subresource
  EXPECT_FALSE(RuleAllows(pods, {"get", "apps", "pods", "default", "p"}));
  const Rule binding{{""}, {"pods/binding"}, {"create"}, {}};
  EXPECT_TRUE(RuleAllows(binding, {"create", "", "pods/binding", "default", "p"}));
  EXPECT_FALSE(RuleAllows(binding, {"create", "", "pods", "default", ""}));
  const Rule named{{"coordination.k8s.io"}, {"leases"}, {"get", "update"}, {"l1"}};
  EXPECT_TRUE(RuleAllows(named, {"get", "coordination.k8s.io", "leases", "ns", "l1"}));
  EXPECT_FALSE(RuleAllows(named, {"get", "coordination.k8s.io", "leases", "ns", "l2"}));
  EXPECT_FALSE(RuleAllows(named, {"list", "coordination.k8s.io", "leases", "ns", ""}));
  const Rule wild{{"*"}, {"*/status"}, {"*"}, {}};
  EXPECT_TRUE(RuleAllows(wild, {"patch", "", "pods/status", "default", "p"}));
  EXPECT_FALSE(RuleAllows(wild, {"patch", "", "pods", "default", "p"}));
  Binding role{"RoleBinding", "dynmig-system", "Role", "r", false, {pods}};
  EXPECT_TRUE(ScopeAllows(role, {"get", "", "pods", "dynmig-system", "p"}));
  EXPECT_FALSE(ScopeAllows(role, {"get", "", "pods", "default", "p"}));
  EXPECT_FALSE(ScopeAllows(role, {"get", "", "nodes", "", "n"}));
  Binding cluster{"ClusterRoleBinding", "", "ClusterRole", "c", false, {pods}};
  EXPECT_TRUE(ScopeAllows(cluster, {"get", "", "pods", "default", "p"}));
  EXPECT_TRUE(ScopeAllows(cluster, {"get", "", "nodes", "", "n"}));
}

// ---- The end-to-end run. ----

class RbacE2eTest : public E2eTest {
 protected:
  // Waits until the admin sees an Event with this reason (about any object).
  bool WaitEvent(const std::string& reason) {
    return WaitUntil([&] {
      auto events = kube_->List(kube::Resource::kEvents, {});
      if (!events.ok()) return false;
      for (const auto& e : events->items) {
        if (e.value("reason", "") == reason) return true;
      }
      return false;
    });
  }

  void WaitReclaimed(const protocol::MigAllocation& a, const std::string& node) {
    ASSERT_TRUE(a.runtime) << Where() << "no runtime identity";
    EXPECT_TRUE(WaitUntil([&] { return FindLive(Live(node), a.runtime->mig_uuid) == nullptr; }))
        << Where() << a.runtime->mig_uuid << " on " << node << " was not reclaimed";
  }

  json ReplicaPod(const std::string& name) {
    return {
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata",
         {{"name", name},
          {"namespace", "dynmig-system"},
          {"labels", {{"app.kubernetes.io/component", "scheduler"}}}}},
        {"spec", {{"containers", json::array({{{"name", "dynmig"}, {"image", "dynmig:test"}}})}}}};
  }

  // A scheduler replica with leader election, as `dynmig scheduler --leader-elect` in the
  // Deployment runs it (identity "<pod>_<hex>", its own pod labelled with its role); rounds are
  // driven by the test.
  std::unique_ptr<scheduler::SchedulerServer> StartReplica(kube::KubeClient& client,
                                                           const std::string& pod) {
    scheduler::SchedulerServerOptions o;
    o.leader_elect = true;
    o.run_election_loop = false;
    o.election.lease_namespace = "dynmig-system";
    o.election.lease_name = "dynmig-scheduler";
    o.election.identity = pod + "_0000abcd";
    o.pod_namespace = "dynmig-system";
    o.pod_name = pod;
    o.expiry_interval = absl::ZeroDuration();
    o.threads = 4;
    auto server = scheduler::SchedulerServer::Start(client, clock_, std::move(o));
    EXPECT_TRUE(server.ok()) << Where() << server.status();
    if (!server.ok()) return nullptr;
    EXPECT_TRUE((*server)->WaitUntilReady(absl::Seconds(20))) << Where() << pod << " not ready";
    return std::move(*server);
  }

  std::string RoleLabel(const std::string& pod) {
    auto obj = kube_->GetPod("dynmig-system", pod);
    if (!obj.ok()) return "";
    return kube::Label(*obj, scheduler::kRoleLabel).value_or("");
  }

  void RunWorkload() {
    Step("two whole-GPU pods, one per node");
    auto big1 = RunPod(MigPod("big-1", 39000));
    auto big2 = RunPod(MigPod("big-2", 39000));
    const std::string node1 = kube::NodeName(Get("big-1"));
    const std::string node2 = kube::NodeName(Get("big-2"));
    ASSERT_NE(node1, node2) << Where();

    Step("a pod with no room is Pending with a reason");
    Create(MigPod("waiting", 4000));
    std::string reason;
    ASSERT_TRUE(WaitUntil([&] { return !(reason = Unschedulable("waiting")).empty(); })) << Where();
    ASSERT_TRUE(WaitEvent("MigPending")) << Where();

    Step("restart both device plugins: the running instances are adopted");
    for (const auto& n : cluster_->nodes()) {
      ASSERT_TRUE(cluster_->RestartDevicePlugin(n.name).ok()) << Where() << n.name;
      ASSERT_TRUE(Plugin(n.name).RunCycle()) << Where();
    }
    for (const auto& [a, node] : {std::pair{big1, node1}, std::pair{big2, node2}}) {
      ASSERT_TRUE(a.runtime) << Where();
      bool adopted = false;
      for (const auto& m : Plugin(node).core().Managed())
        adopted |= m.mig_uuid == a.runtime->mig_uuid;
      EXPECT_TRUE(adopted) << Where() << a.runtime->mig_uuid << " on " << node << " not adopted";
    }
    EXPECT_EQ(Phase("big-1"), "Running") << Where();

    Step("delete big-1: reclaimed, the waiting pod takes its GPU");
    DeletePod("big-1");
    WaitReclaimed(big1, node1);
    auto waiting = WaitRunning("waiting");
    const std::string waiting_node = kube::NodeName(Get("waiting"));

    Step("a job that ends is reclaimed");
    DeletePod("big-2");
    WaitReclaimed(big2, node2);
    auto job = RunPod(MigPod("job", 4000, "", "sleep 1"));
    const std::string job_node = kube::NodeName(Get("job"));
    EXPECT_TRUE(WaitUntil([&] { return Phase("job") == "Succeeded"; })) << Where();
    WaitReclaimed(job, job_node);
    ASSERT_TRUE(WaitEvent(std::string(deviceplugin::kReasonDestroyed))) << Where();

    Step("a conflict while the device plugin writes the runtime identity: it re-reads the pod");
    {
      kube::FaultSpec conflict;
      conflict.method = "PATCH";
      conflict.path_prefix = "/api/v1/namespaces/default/pods/conflict";
      conflict.user = std::string(local::kDevicePluginUser);
      conflict.status = 409;
      conflict.message =
          "Operation cannot be fulfilled on pods \"conflict\": the object has been "
          "modified; please apply your changes to the latest version and try again";
      cluster_->api().AddFault(conflict);
      auto c = RunPod(MigPod("conflict", 4000));
      EXPECT_TRUE(c.runtime) << Where() << "no runtime identity after the conflict";
      const std::string c_node = kube::NodeName(Get("conflict"));
      DeletePod("conflict");
      WaitReclaimed(c, c_node);
    }

    Step("a pod deleted while its device plugin is down is reclaimed when the plugin starts");
    ASSERT_TRUE(cluster_->StopDevicePlugin(waiting_node).ok()) << Where();
    DeletePod("waiting");
    ASSERT_TRUE(cluster_->StartDevicePlugin(waiting_node).ok()) << Where();
    WaitReclaimed(waiting, waiting_node);

    Step("restart the scheduler; it schedules again");
    ASSERT_TRUE(cluster_->StopScheduler().ok()) << Where();
    ASSERT_TRUE(cluster_->StartScheduler().ok()) << Where();
    auto after = RunPod(MigPod("after-restart", 9000, "2g"));

    Step("reservation expiry (nothing unrealized is old enough: reads only)");
    ASSERT_NE(cluster_->scheduler(), nullptr) << Where();
    cluster_->scheduler()->ExpireReservations();

    Step("leader election between two more scheduler replicas");
    Create(ReplicaPod("dynmig-scheduler-a"));
    Create(ReplicaPod("dynmig-scheduler-b"));
    auto client_a = cluster_->Client(local::kSchedulerUser);
    auto client_b = cluster_->Client(local::kSchedulerUser);
    ASSERT_TRUE(client_a.ok() && client_b.ok()) << Where();
    auto replica_a = StartReplica(**client_a, "dynmig-scheduler-a");
    auto replica_b = StartReplica(**client_b, "dynmig-scheduler-b");
    ASSERT_TRUE(replica_a && replica_b) << Where();
    EXPECT_TRUE(replica_a->elector()->TryAcquireOrRenew()) << Where() << "a did not lead";
    EXPECT_FALSE(replica_b->elector()->TryAcquireOrRenew()) << Where() << "b led too";
    EXPECT_TRUE(replica_a->elector()->TryAcquireOrRenew()) << Where() << "a did not renew";
    EXPECT_EQ(RoleLabel("dynmig-scheduler-a"), "leader") << Where();
    replica_a->Stop();  // hands the Lease back
    EXPECT_TRUE(replica_b->elector()->TryAcquireOrRenew()) << Where() << "b did not take over";
    EXPECT_EQ(RoleLabel("dynmig-scheduler-b"), "leader") << Where();
    EXPECT_EQ(RoleLabel("dynmig-scheduler-a"), "follower") << Where();
    replica_b->Stop();
    replica_a.reset();
    replica_b.reset();

    Step("delete the last pod");
    const std::string after_node = kube::NodeName(Get("after-restart"));
    DeletePod("after-restart");
    WaitReclaimed(after, after_node);
  }

  SystemClock clock_;
};

// (a) Every call of `user` in the run is allowed by its bindings.
void ExpectEveryCallAllowed(const std::string& user, const std::vector<Binding>& bs,
                            const std::vector<kube::AuditRecord>& records) {
  for (const kube::AuditRecord& r : records) {
    if (r.user != user) continue;
    if (!r.resource_request()) {
      EXPECT_TRUE(PublicNonResource(r))
          << user << " calls " << r.Describe() << ", which no rule of deploy/ allows";
      continue;
    }
    for (const Call& c : CallsOf(r)) {
      EXPECT_FALSE(AllowedBy(bs, c).empty())
          << user << " calls " << c.Describe() << " (" << r.count
          << " requests of its kind: " << r.Describe()
          << "), which no rule of its bindings in deploy/ allows";
    }
  }
}

// One grant (a verb on a resource of a group, maybe of one name) of rule #i of `b`: used by one of
// `calls`, or listed in kUnreachable (and then not used).
void ExpectGrantUsedOrUnreachable(const std::string& user, const Binding& b, size_t i,
                                  const std::vector<Call>& calls, const std::string& group,
                                  const std::string& resource, const std::string& verb,
                                  const std::string& name) {
  Rule single{{group}, {resource}, {verb}, {}};
  if (!name.empty()) single.resource_names = {name};
  bool used = false;
  for (const Call& c : calls) {
    if (ScopeAllows(b, c) && RuleAllows(single, c)) used = true;
  }
  const Unreachable* allowed = nullptr;
  for (const Unreachable& u : kUnreachable) {
    if (u.user == user && u.api_group == group && u.resource == resource && u.verb == verb &&
        u.resource_name == name) {
      allowed = &u;
    }
  }
  const std::string grant =
      fmt::format("{} {}{}{} ({}, rule #{})", verb, group.empty() ? "" : group + ":", resource,
                  name.empty() ? "" : " name " + name, b.what, i + 1);
  if (allowed != nullptr) {
    EXPECT_FALSE(used) << user << ": " << grant
                       << " is on kUnreachable but the run used it: remove the entry";
  } else {
    EXPECT_TRUE(used) << user << ": " << grant
                      << " is granted but never used in the run: remove it from "
                         "deploy/ (and deploy/rbac-expected.yaml, docs/deploy.md) "
                         "or list it in kUnreachable with the reason";
  }
}

// (b) Every grant of `user`'s own bindings is used in the run, or cannot be reached and says why.
void ExpectEveryGrantUsedOrUnreachable(const std::string& user, const std::vector<Binding>& bs,
                                       const std::vector<kube::AuditRecord>& records) {
  std::vector<Call> calls;
  for (const kube::AuditRecord& r : records) {
    if (r.user != user || !r.resource_request()) continue;
    for (Call& c : CallsOf(r)) calls.push_back(std::move(c));
  }
  for (const Binding& b : bs) {
    if (b.builtin) continue;  // Kubernetes' rules: not ours to trim
    for (size_t i = 0; i < b.rules.size(); ++i) {
      const Rule& rule = b.rules[i];
      std::vector<std::string> names = rule.resource_names;
      if (names.empty()) names.push_back("");
      for (const std::string& group : rule.api_groups) {
        for (const std::string& resource : rule.resources) {
          for (const std::string& verb : rule.verbs) {
            for (const std::string& name : names) {
              ExpectGrantUsedOrUnreachable(user, b, i, calls, group, resource, verb, name);
            }
          }
        }
      }
    }
  }
}

// Stale allowlist entries that match no grant at all.
void ExpectNoStaleUnreachable(std::map<std::string, std::vector<Binding>>& bindings) {
  for (const Unreachable& u : kUnreachable) {
    bool granted = false;
    for (const Binding& b : bindings[std::string(u.user)]) {
      for (const Rule& rule : b.rules) {
        if (Has(rule.api_groups, u.api_group) && Has(rule.resources, u.resource) &&
            Has(rule.verbs, u.verb) &&
            (u.resource_name.empty()
                 ? rule.resource_names.empty()
                 : std::find(rule.resource_names.begin(), rule.resource_names.end(),
                             u.resource_name) != rule.resource_names.end())) {
          granted = true;
        }
      }
    }
    EXPECT_TRUE(granted) << "kUnreachable lists " << u.verb << " " << u.resource << " "
                         << u.resource_name << " for " << u.user
                         << ", which deploy/ does not grant: remove the entry";
  }
}

TEST_F(RbacE2eTest, DeployRbacGrantsExactlyWhatTheComponentsCall) {
  Scenario("RBAC against an end-to-end run");
  Step("read the RBAC of deploy/base");
  const char* source_dir = std::getenv("DYNMIG_SOURCE_DIR");
  ASSERT_TRUE(source_dir != nullptr && *source_dir != '\0')
      << "DYNMIG_SOURCE_DIR is not set: ctest sets it to the source tree; when running the "
         "binary by hand, run DYNMIG_SOURCE_DIR=/path/to/dynmig build/bin/e2e_test";
  RbacPolicy policy;
  for (const char* file :
       {"deploy/base/scheduler/rbac.yaml", "deploy/base/device-plugin/rbac.yaml"}) {
    const std::string path = std::string(source_dir) + "/" + file;
    ASSERT_TRUE(std::ifstream(path).good()) << path << " cannot be read (DYNMIG_SOURCE_DIR?)";
    const std::string error = policy.Load(path);
    ASSERT_TRUE(error.empty()) << error;
  }
  const std::vector<std::string> identities = {std::string(local::kSchedulerUser),
                                               std::string(local::kDevicePluginUser)};
  std::map<std::string, std::vector<Binding>> bindings;
  for (const std::string& user : identities) {
    ASSERT_TRUE(policy.HasServiceAccount(user)) << "deploy/ defines no ServiceAccount for " << user;
    bindings[user] = policy.BindingsOf(user);
    ASSERT_FALSE(bindings[user].empty()) << "no binding names " << user;
  }

  StartCluster("node-a=A100-SXM4-40GBx1,node-b=A100-SXM4-40GBx1");
  RunWorkload();
  if (HasFatalFailure()) return;

  Step("compare the observed calls with the rules");
  const std::vector<kube::AuditRecord> records = cluster_->api().AuditLog();
  ASSERT_EQ(cluster_->api().audit_dropped(), 0) << "the audit table overflowed";
  std::set<std::string> users;
  for (const auto& r : records) users.insert(r.user);
  std::string table;
  for (const std::string& user : users) {
    const bool checked = std::find(identities.begin(), identities.end(), user) != identities.end();
    table +=
        fmt::format("  {}{}:\n{}", user, checked ? "" : " (not checked)", Table(records, user));
  }
  std::cout << "observed API calls per identity (verb resource scope, requests):\n" << table;

  for (const std::string& user : identities) {
    ExpectEveryCallAllowed(user, bindings[user], records);
    ExpectEveryGrantUsedOrUnreachable(user, bindings[user], records);
  }
  ExpectNoStaleUnreachable(bindings);
}

}  // namespace
}  // namespace dynmig::e2e
