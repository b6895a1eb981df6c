// LocalCluster: the whole system on one machine, every part speaking the protocol it speaks in a
// cluster (`dynmig local`, the end-to-end tests, the ops tests):
//
//   kubectl / ops commands ──HTTP──> InMemoryApiServer ──AdmissionReview──> /webhook, /validate
//                                        ^   ^   ^                               │
//   SchedulerLoop (kube-scheduler) ─HTTPS┼───┼───┼── /filter, /bind ──> SchedulerServer (HTTPS,
//                                        │   │   │   client certificate required on these two)
//   per node:                            │   │   │
//     NodeAgent (kubelet) ── gRPC ──> TestKubelet <── gRPC ── DevicePlugin ──> SimNvml (file)
//         └── attaches a simulated process to each MIG device while the pod runs ──┘
//
// Each component has its own API client and its own identity (bearer token): the scheduler and
// the device plugins are the service accounts deploy/ gives them, so the validating webhook treats
// their writes of hami.io/vgpu-mig-allocations as a cluster does; kubectl is a cluster admin.
// The kube-scheduler stand-in reads the KubeSchedulerConfiguration shipped in
// deploy/scheduler/kube-scheduler-config.yaml (compiled in), so it calls the extender exactly as
// the deployed kube-scheduler does. Nodes get the addresses 127.0.0.<10+i> (configurable) and
// each device plugin serves /metrics and /nvml at <address>:<nvml_port>, so the ops commands'
// default `http://{node}:9400/nvml` reaches them.
//
// A device plugin or the scheduler can be stopped and started again on its own, standing for a
// process restart: the new one shares nothing in memory with the old (new SimNvml object over the
// same state file, new API client, new state-file reader).
//
// Crashes (chaos): a device plugin armed with a crash point (ArmDevicePluginCrash) crashes when
// an Allocate reaches it; a scheduler replica crashes on CrashSchedulerLeader. A crashed process
// makes no further API call (its client is fenced: every request fails, so a crashed leader does
// not hand its Lease back) and a supervisor thread restarts it at once, as a DaemonSet or a
// Deployment restarts a crashed pod. With scheduler_replicas > 1 the replicas elect a leader on a
// Lease; kube-scheduler calls the leader (the Service selecting dynmig.io/role=leader) and the API
// server calls the webhooks of a running replica.
//
// The simulated GPUs' state lives under state_dir and survives a restart of the whole local mode
// (the API server's objects do not: the device plugins then find idle GPUs and clean them).
// Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "kube/in_memory_api_server.h"
#include "kube/kube_client.h"
#include "local/scheduler_config.h"
#include "local/scheduling_queue.h"
#include "mig/nvml_latency.h"
#include "nvml/sim_nvml.h"
#include "protocol/device_config.h"
#include "scheduler/cluster_state.h"
#include "scheduler/defragmenter.h"
#include "scheduler/leader_election.h"

namespace dynmig::scheduler {
class SchedulerServer;
}
namespace dynmig::deviceplugin {
class DevicePlugin;
class NvidiaStandin;
class TestKubelet;
class TestRuntime;
}  // namespace dynmig::deviceplugin

namespace dynmig::local {

class NodeAgent;
class ReplicaSetController;
class SchedulerLoop;

// Identities of the components (userInfo.username the webhooks see).
inline constexpr std::string_view kSchedulerUser =
    "system:serviceaccount:dynmig-system:dynmig-scheduler";
inline constexpr std::string_view kDevicePluginUser =
    "system:serviceaccount:dynmig-system:dynmig-device-plugin";
inline constexpr std::string_view kKubeSchedulerUser = "system:kube-scheduler";
// kube-controller-manager's ReplicaSet controller (ReplicaSetController).
inline constexpr std::string_view kReplicaSetControllerUser =
    "system:serviceaccount:kube-system:replicaset-controller";
inline constexpr std::string_view kAdminUser = "kubernetes-admin";
// The device ConfigMap, named as deploy/ names it (the ops commands find it by its key).
inline constexpr std::string_view kSystemNamespace = "dynmig-system";
inline constexpr std::string_view kDeviceConfigMap = "dynmig-device-config";

struct LocalNode {
  std::string name;
  std::string gpus;  // SimNvml spec: "A100-SXM4-40GBx2" or "A100-SXM4-40GBx1,H100 80GBx1"
};

// "node-a=A100-SXM4-40GBx2,node-b=H100 80GBx1". An item without '=' adds GPUs to the previous
// node ("node-a=A30,A100-SXM4-40GB"). kInvalidArgument names the bad item: an empty name or
// spec, a duplicate node, a name that is not a DNS-1123 subdomain, a model the catalogue does not
// know (ParseSimSpec's message).
absl::StatusOr<std::vector<LocalNode>> ParseNodes(std::string_view text);

// A MIG device as NVML reports it.
struct LiveInstance {
  std::string gpu_uuid;
  uint32_t gpu_index = 0;
  uint32_t gi_id = 0;
  uint32_t ci_id = 0;
  uint32_t gi_profile_id = 0;
  mig::Placement placement;
  std::string mig_uuid;
  size_t processes = 0;
};

struct LocalClusterOptions {
  std::string api_host = "127.0.0.1";
  int api_port = 6443;  // 0 = a free port
  std::vector<LocalNode> nodes = {{"node-a", "A100-SXM4-40GBx2"}, {"node-b", "H100 80GBx1"}};
  // Simulated GPU state, node-local device-plugin state, kubelet sockets (when the path is short
  // enough for a unix socket; else under /tmp), the kubeconfig. Created when missing. Required.
  std::string state_dir;
  std::string device_config_yaml;     // "" = protocol::DefaultDeviceConfigYaml()
  std::string scheduler_config_yaml;  // "" = deploy/scheduler/kube-scheduler-config.yaml
  // Node i gets the address node_address_prefix + (node_address_first + i).
  std::string node_address_prefix = "127.0.0.";
  int node_address_first = 10;
  int nvml_port = 9400;  // each device plugin's /metrics, /nvml, /healthz
  absl::Duration reconcile_interval = absl::Seconds(2);
  absl::Duration register_interval = absl::Seconds(5);
  absl::Duration reservation_ttl = absl::Minutes(2);
  absl::Duration expiry_interval = absl::Seconds(10);
  // The in-process scheduler's defragmenter (`dynmig local --defrag on`): off by default.
  scheduler::DefragmenterOptions defrag;
  absl::Duration defrag_interval = absl::Seconds(15);
  // The kube-scheduler stand-in's retry timing: kube-scheduler v1.20's unless a test shrinks it.
  SchedulingQueueTiming scheduler_timing;
  // The stand-in also schedules pods of schedulerName default-scheduler (pods without GPUs), as
  // the cluster's default kube-scheduler.
  bool default_scheduler = true;
  // HTTP threads of the in-process scheduler (extender and webhooks share them; a bind waiting
  // for the node lock holds one).
  int scheduler_threads = 128;  // as dynmig scheduler's (SchedulerServerOptions::threads)
  // How long each kubelet stand-in takes from seeing a pod bound to admitting it (Allocate);
  // NodeAgentOptions::admission_delay. Zero: at once.
  absl::Duration kubelet_admission_delay = absl::ZeroDuration();
  // How long the simulated GPUs take to create and destroy instances (the device plugins' NVML).
  mig::NvmlLatency nvml_latency;
  // The components' API clients give up on a request after this (RestConfig::request_timeout).
  absl::Duration api_request_timeout = absl::Seconds(60);
  // Scheduler replicas; more than one elect a leader on the Lease with these timings (the
  // identity is set per replica and start).
  int scheduler_replicas = 1;
  scheduler::LeaderElectionOptions election;
  // The scheduler's clock (reservation expiry, node locks, leases); null = the system clock. Must
  // outlive the cluster.
  const Clock* scheduler_clock = nullptr;
  // More identities, each with a token of its own (Client(user)): tenants of tests. The
  // in-memory API server authorizes every identity; the webhooks tell them apart.
  std::vector<std::string> users;
  // The legacy world of a handover, set up before dynmig's device plugin starts on the node: a
  // fixed geometry laid out on each of the node's GPUs as MIG Manager does (nvml::ApplyGeometry;
  // by node name, e.g. {"node-a", "1g.18gb=1,2g.35gb=3"}; a GPU whose instances differ, as after
  // an earlier run, is left as it is and logged), and NVIDIA's device plugin in the mixed strategy
  // (deviceplugin::NvidiaStandin) registered with the node's kubelet stand-in.
  std::map<std::string, std::string> legacy_geometry;
  std::vector<std::string> nvidia_standin_nodes;
  // Nodes whose dynmig device plugin does not start with the cluster, only on StartDevicePlugin:
  // a handover's legacy pods run on them first, as on a node dynmig is not installed on yet.
  std::vector<std::string> device_plugins_stopped;
  // One line per event of every component ("scheduler: ...", "node-a/kubelet: ..."). May be empty.
  std::function<void(const std::string&)> log;
};

class LocalCluster {
 public:
  // Starts everything and waits (bounded) until the scheduler's caches synced, every device
  // plugin registered with its kubelet and every node published its GPUs. Errors name the part
  // that did not start (an address in use, a bad node spec or device config).
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(LocalClusterOptions options);
  ~LocalCluster();  // Stop()
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  // Stops every part, the API server last. Simulated processes stay attached (their state is on
  // disk). Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_, crash_mu_);

  std::string api_url() const;
  // A kubeconfig for the cluster admin (written to <state_dir>/kubeconfig).
  const std::string& kubeconfig_path() const { return kubeconfig_path_; }
  std::string scheduler_url() const ABSL_LOCKS_EXCLUDED(mu_);
  const std::vector<LocalNode>& nodes() const { return options_.nodes; }
  const LocalClusterOptions& options() const { return options_; }
  std::string node_address(std::string_view node) const;
  // "http://{node}:<nvml_port>/nvml", for --nvml-endpoint.
  std::string nvml_endpoint_template() const;
  const std::string& admin_token() const { return admin_token_; }
  // The clock every local part runs on (the kube-scheduler and kubelet stand-ins, the waits of
  // start and restart): the system clock. The scheduler's is options().scheduler_clock when set.
  const Clock& clock() const { return clock_; }

  // The TLS files of this run, under <state_dir>/pki: a CA made at start signs the scheduler's
  // serving certificate (127.0.0.1, localhost) and kube-scheduler's client certificate, which the
  // extender requires on /filter and /bind.
  struct TlsFiles {
    std::string ca_file;
    std::string serving_cert_file;
    std::string serving_key_file;
    std::string client_cert_file;
    std::string client_key_file;
  };
  const TlsFiles& tls() const { return tls_; }

  kube::InMemoryApiServer& api() { return *api_; }
  // A new API client acting as `user` (one of the identities above; kAdminUser by default).
  absl::StatusOr<std::unique_ptr<kube::KubeClient>> Client(
      std::string_view user = kAdminUser) const;

  // The scheduler's view, as `dynmig layout` shows it.
  std::vector<scheduler::NodeReport> Layout() const ABSL_LOCKS_EXCLUDED(mu_);
  // The scheduler, while it runs (null between StopScheduler and StartScheduler).
  scheduler::SchedulerServer* scheduler() ABSL_LOCKS_EXCLUDED(mu_);

  // A device plugin process: stop (its socket goes away; instances and processes stay), start
  // again (recovery: verify and adopt, clean idle GPUs). kNotFound for an unknown node.
  absl::Status StopDevicePlugin(std::string_view node) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status StartDevicePlugin(std::string_view node) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RestartDevicePlugin(std::string_view node) ABSL_LOCKS_EXCLUDED(mu_);
  bool DevicePluginRunning(std::string_view node) const ABSL_LOCKS_EXCLUDED(mu_);
  // The running plugin of a node, or null.
  deviceplugin::DevicePlugin* device_plugin(std::string_view node) ABSL_LOCKS_EXCLUDED(mu_);
  deviceplugin::TestKubelet* kubelet(std::string_view node);
  // The node's container runtime stand-in (CRI on runtime_socket(node), beside the kubelet's
  // sockets), which the kubelet stand-in fills as it allocates, or null for an unknown node.
  deviceplugin::TestRuntime* runtime(std::string_view node);
  std::string runtime_socket(std::string_view node) const;
  // NVIDIA's device plugin stand-in of the node, while it runs (nvidia_standin_nodes), or null.
  deviceplugin::NvidiaStandin* nvidia_standin(std::string_view node) ABSL_LOCKS_EXCLUDED(mu_);
  // Starts one on the node (a simulator object of its own over the node's GPU state: the
  // instances there now), as when NVIDIA's DaemonSet comes to the node; ok when one runs.
  // kNotFound for an unknown node.
  absl::Status StartNvidiaStandin(std::string_view node) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops it: its sockets go away, as when the legacy DaemonSet leaves the node. kNotFound when
  // the node has none running.
  absl::Status StopNvidiaStandin(std::string_view node) ABSL_LOCKS_EXCLUDED(mu_);
  // HAMi's legacy device plugin stand-in (NvidiaStandin in StandinMode::kHamiLegacy) on the node,
  // with the knownMigGeometries of the device config at `config_path`, as when HAMi's DaemonSet
  // comes to it: it serves nvidia.com/gpu on the node's kubelet (dynmig's plugin must be stopped
  // first: kFailedPrecondition) and writes the pods' HAMi annotations as the node. Ok when one
  // runs; kNotFound for an unknown node; kInvalidArgument for a config that does not load.
  absl::Status StartHamiStandin(std::string_view node, const std::string& config_path)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Stops it (its socket goes away). kNotFound when the node has none running.
  absl::Status StopHamiStandin(std::string_view node) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes dynmig's admission webhooks from the API server (false), as before dynmig was
  // installed, or puts them back (true).
  void SetWebhooks(bool installed) ABSL_LOCKS_EXCLUDED(mu_);

  // Every replica.
  absl::Status StopScheduler() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status StartScheduler() ABSL_LOCKS_EXCLUDED(mu_);
  bool SchedulerRunning() const ABSL_LOCKS_EXCLUDED(mu_);  // every replica runs
  // The replica that leads now (elector says so; the only one without election), or -1.
  int SchedulerLeader() const ABSL_LOCKS_EXCLUDED(mu_);

  // Crashes (see above). The plugin crashes when an Allocate reaches `point` (a
  // deviceplugin::kCrash* name); arming again replaces the point, "" disarms. kNotFound: no node.
  absl::Status ArmDevicePluginCrash(std::string_view node, std::string_view point)
      ABSL_LOCKS_EXCLUDED(crash_mu_);
  void DisarmCrashes() ABSL_LOCKS_EXCLUDED(crash_mu_);
  // Crashes the leading replica (or, when none leads, the first running one); returns its index.
  // kFailedPrecondition when no replica runs.
  absl::StatusOr<int> CrashSchedulerLeader() ABSL_LOCKS_EXCLUDED(mu_, crash_mu_);
  // What crashed and was restarted so far: "device-plugin crash <point>", "scheduler crash".
  std::map<std::string, int64_t> Crashes() const ABSL_LOCKS_EXCLUDED(crash_mu_);
  // No crash is waiting for its restart.
  bool CrashesRestarted() const ABSL_LOCKS_EXCLUDED(crash_mu_);

  // A new simulator object over the node's GPU state file (what `dynmig nvml --sim-state` opens).
  absl::StatusOr<std::unique_ptr<nvml::SimNvml>> OpenNvml(std::string_view node) const;
  std::string nvml_state_file(std::string_view node) const;
  // The workloads' simulated processes end: every one on the node, or only those on the MIG device
  // `mig_uuid`. Returns how many. kNotFound for an unknown node.
  absl::StatusOr<int> EndProcesses(std::string_view node, std::string_view mig_uuid = "") const;
  // Every GI/CI on the node's GPUs, read through a new simulator object (as nvidia-smi would).
  absl::StatusOr<std::vector<LiveInstance>> Instances(std::string_view node) const;

 private:
  struct Node;
  struct Replica;
  // Crashed parts the supervisor restarts in one round.
  struct CrashBatch {
    std::vector<std::string> plugins;  // node names
    std::vector<int> replicas;
  };
  explicit LocalCluster(LocalClusterOptions options);

  // Start, step by step (Init runs them in this order).
  absl::Status Init() ABSL_LOCKS_EXCLUDED(mu_);
  // Creates the state directory and makes its path absolute.
  absl::Status PrepareStateDir();
  // Parses the device configuration (kept) and the KubeSchedulerConfiguration (returned).
  absl::StatusOr<SchedulerConfig> LoadConfigs();
  absl::Status MakeTls();
  // A token per identity: the components', the nodes', options_.users.
  void MakeIdentities();
  // The API server and the admin's kubeconfig.
  absl::Status StartApiServer();
  // What an operator creates before installing: the namespaces and the device ConfigMap.
  absl::Status CreateSystemObjects(kube::KubeClient& admin);
  // Node i: its directories, its GPUs, its Node object, its kubelet and the kubelet's agent (not
  // started yet).
  absl::StatusOr<std::unique_ptr<Node>> AddNode(size_t i, kube::KubeClient& admin);
  absl::Status PrepareNodeDirs(Node& node);
  absl::Status CreateGpus(Node& node);
  absl::Status CreateNodeObject(const Node& node, kube::KubeClient& admin);
  absl::Status StartKubelet(Node& node);
  // The legacy world (LocalClusterOptions::legacy_geometry, nvidia_standin_nodes).
  absl::Status ApplyLegacyGeometry(Node& node);
  absl::Status StartNvidiaStandin(Node& node);  // when nvidia_standin_nodes names it
  absl::Status StartNvidiaStandinOn(Node& node);
  // The node's status shows the stand-in's nvidia.com/mig-* resources (serving), or allocatable 0
  // for each once it stopped.
  void PublishMigResources(Node& node, bool serving);
  bool HeldBack(std::string_view node) const;  // device_plugins_stopped names it
  // The scheduler replicas, the routes to them, then kube-scheduler.
  absl::Status StartControlPlaneLocked(const SchedulerConfig& config)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bounded: every node published its GPUs and every plugin registered, every replica synced.
  absl::Status AwaitReadyLocked(kube::KubeClient& admin) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AwaitNodeReady(Node& node, kube::KubeClient& admin,
                              absl::Duration monotonic_deadline);

  absl::Status StartDevicePluginLocked(Node& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status StartSchedulerLocked(Replica& replica) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopReplicaLocked(Replica& replica) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_)
      ABSL_LOCKS_EXCLUDED(route_mu_);
  // Points the webhooks and kube-scheduler's extender calls at running replicas.
  void RouteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) ABSL_LOCKS_EXCLUDED(route_mu_);
  std::string ExtenderUrl() const
      ABSL_LOCKS_EXCLUDED(route_mu_);  // the leader's, else a running one's
  Replica* RouteTarget() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The supervisor thread: restarts crashed parts until Stop().
  void Supervise() ABSL_LOCKS_EXCLUDED(mu_, crash_mu_);
  // Waits for crashes to restart; false once the supervisor is to stop.
  bool NextCrashes(CrashBatch* batch) ABSL_LOCKS_EXCLUDED(crash_mu_);
  void RestartCrashed(const CrashBatch& batch) ABSL_LOCKS_EXCLUDED(mu_, crash_mu_);
  Node* FindNode(std::string_view name) const;
  void Log(const std::string& line) const;

  LocalClusterOptions options_;
  std::string device_config_yaml_;        // what the ConfigMap holds
  protocol::DeviceConfig device_config_;  // parsed once
  std::string kubeconfig_path_;
  std::string admin_token_;
  TlsFiles tls_;
  std::string scheduler_name_;  // the kube-scheduler profile's schedulerName
  std::map<std::string, std::string, std::less<>> tokens_;  // user -> token
  std::unique_ptr<kube::InMemoryApiServer> api_;
  SystemClock clock_;
  const Clock* scheduler_clock_ = nullptr;

  // Guards the components below against concurrent stop/start. nodes_ itself is fixed once Init
  // added them (read without it); a node's device plugin "process" (plugin, plugin_client,
  // plugin_nvml) is guarded by it.
  mutable dynmig::Mutex mu_;
  std::vector<std::unique_ptr<Replica>> replicas_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<kube::KubeClient> loop_client_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<SchedulerLoop> loop_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<kube::KubeClient> replicaset_client_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<ReplicaSetController> replicasets_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Node>> nodes_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool webhooks_removed_ ABSL_GUARDED_BY(mu_) = false;  // SetWebhooks(false)

  // The extender routes (url, elector or null per running replica), read by kube-scheduler's
  // thread without mu_.
  mutable dynmig::Mutex route_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::vector<std::pair<std::string, const scheduler::LeaderElector*>> routes_
      ABSL_GUARDED_BY(route_mu_);

  // Crashes: armed points, crashed parts waiting for the supervisor, counts. Never held while
  // calling into a component (the crash hook runs inside a plugin's Allocate).
  mutable dynmig::Mutex crash_mu_ ABSL_ACQUIRED_AFTER(mu_);
  dynmig::CondVar crash_cv_;
  std::map<std::string, std::string, std::less<>> armed_
      ABSL_GUARDED_BY(crash_mu_);  // node -> point
  std::vector<std::string> crashed_plugins_ ABSL_GUARDED_BY(crash_mu_);
  std::vector<int> crashed_replicas_ ABSL_GUARDED_BY(crash_mu_);
  std::map<std::string, int64_t> crashes_ ABSL_GUARDED_BY(crash_mu_);
  bool supervising_ ABSL_GUARDED_BY(crash_mu_) = false;  // a restart is under way
  bool supervisor_stop_ ABSL_GUARDED_BY(crash_mu_) = false;
  std::thread supervisor_;
};

}  // namespace dynmig::local
