#include "local/local_cluster.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <utility>

#include "common/strings.h"
#include "deviceplugin/device_plugin.h"
#include "deviceplugin/nvidia_standin.h"
#include "deviceplugin/test_kubelet.h"
#include "deviceplugin/test_runtime.h"
#include "fmt/format.h"
#include "kube/object.h"
#include "kube/rest_kube_client.h"
#include "local/embedded_config.h"
#include "local/node_agent.h"
#include "local/replicaset_controller.h"
#include "local/scheduler_loop.h"
#include "nvml/geometry.h"
#include "ops/layout.h"
#include "ops/live_page.h"
#include "protocol/annotations.h"
#include "protocol/device_config.h"
#include "protocol/devices.h"
#include "scheduler/server.h"
#include "webhook/pki.h"

namespace dynmig::local {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr size_t kMaxSocketPath = 100;  // sun_path holds 108 bytes; keep a margin

std::string RandomToken() {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < 4; ++i) out += fmt::format("{:08x}", rd());
  return out;
}

std::string Kubeconfig(const std::string& url, const std::string& token) {
  return fmt::format(
      "# Written by `dynmig local`: the cluster admin of the local mode's API server.\n"
      "apiVersion: v1\n"
      "kind: Config\n"
      "clusters:\n"
      "- name: dynmig-local\n"
      "  cluster:\n"
      "    server: {}\n"
      "contexts:\n"
      "- name: dynmig-local\n"
      "  context:\n"
      "    cluster: dynmig-local\n"
      "    user: {}\n"
      "    namespace: default\n"
      "current-context: dynmig-local\n"
      "users:\n"
      "- name: {}\n"
      "  user:\n"
      "    token: {}\n",
      url, kAdminUser, kAdminUser, token);
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& text, mode_t mode) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.close();
    if (!out) return absl::PermissionDeniedError(fmt::format("cannot write {}", tmp));
  }
  ::chmod(tmp.c_str(), mode);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::PermissionDeniedError(
        fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(errno)));
  }
  return absl::OkStatus();
}

// The container runtime's socket beside the kubelet's: <root>/containerd/containerd.sock for the
// device-plugin directory <root>/kubelet (its parent is as short as the PodResources socket's).
std::string RuntimeSocketOf(const std::string& kubelet_dir) {
  return fs::path(kubelet_dir).parent_path().string() + "/containerd/containerd.sock";
}

// The kubelet's side of the device-plugin API, over the test kubelet's real gRPC client: every
// resource a registered plugin serves (dynmig's, NVIDIA's stand-in's nvidia.com/mig-<profile>).
class KubeletAllocator : public DeviceAllocator {
 public:
  // `resource`: dynmig's resource name.
  KubeletAllocator(deviceplugin::TestKubelet& kubelet, deviceplugin::TestRuntime& runtime,
                   std::string resource)
      : kubelet_(kubelet), runtime_(runtime), resource_(std::move(resource)) {}

  std::string ResourceName() override {
    auto info = kubelet_.plugin(resource_);
    return info && info->stream_open ? info->resource_name : "";
  }
  std::vector<std::string> ResourceNames() override { return kubelet_.resources(); }
  std::vector<std::string> DeviceIds() override { return kubelet_.FreeDevices(resource_); }
  std::vector<std::string> ResourceDeviceIds(const std::string& resource) override {
    return kubelet_.FreeDevices(resource);
  }
  absl::StatusOr<ContainerAllocation> Allocate(const std::string& pod, const std::string& container,
                                               const std::vector<std::string>& ids) override {
    return AllocateResource(pod, container, ids, resource_);
  }
  absl::StatusOr<ContainerAllocation> AllocateResource(const std::string& pod,
                                                       const std::string& container,
                                                       const std::vector<std::string>& ids,
                                                       const std::string& resource) override {
    auto response = kubelet_.Allocate(pod, container, ids, resource);
    if (!response.ok()) return response.status();
    ContainerAllocation out;
    for (const auto& [k, v] : response->envs()) out.envs[k] = v;
    for (const auto& d : response->devices()) out.devices.push_back(d.host_path());
    for (const auto& d : response->cdi_devices()) out.cdi_devices.push_back(d.name());
    return out;
  }
  void Release(const std::string& pod) override {
    kubelet_.ReleasePod(pod);
    dynmig::MutexLock lock(&mu_);
    uids_.erase(pod);
  }
  void PodUid(const std::string& pod, const std::string& uid) override {
    dynmig::MutexLock lock(&mu_);
    uids_[pod] = uid;
    kubelet_.SetPodUid(pod, uid);
  }
  void Admit(const std::string& pod, const std::vector<std::string>& containers,
             const std::vector<std::string>& init_containers) override {
    kubelet_.AddPod(pod, containers, init_containers);
  }
  absl::Status PreStart(const std::string& pod, const std::string& container) override {
    // A no-op for a resource whose devices the container does not hold.
    for (const auto& resource : kubelet_.resources()) {
      if (auto st = kubelet_.PreStart(pod, container, resource); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  void ContainerEnv(const std::string& pod, const std::string& container,
                    const std::map<std::string, std::string>& env) override {
    std::string uid;
    {
      dynmig::MutexLock lock(&mu_);
      auto it = uids_.find(pod);
      if (it != uids_.end()) uid = it->second;
    }
    runtime_.AddEnvs(pod, uid, container, env);
  }

 private:
  deviceplugin::TestKubelet& kubelet_;
  deviceplugin::TestRuntime& runtime_;
  const std::string resource_;
  dynmig::Mutex mu_;
  std::map<std::string, std::string> uids_ ABSL_GUARDED_BY(mu_);  // by "namespace/name"
};

// A component's API client that can be cut off, as a crashed process's connections are: once
// fenced, every request fails with kUnavailable and nothing reaches the API server.
class FencedKubeClient : public kube::KubeClient {
 public:
  explicit FencedKubeClient(std::unique_ptr<kube::KubeClient> inner) : inner_(std::move(inner)) {}
  void Fence() { fenced_ = true; }

  absl::StatusOr<kube::Object> Get(kube::Resource resource, std::string_view ns,
                                   std::string_view name) override {
    if (fenced_) return Fenced();
    return inner_->Get(resource, ns, name);
  }
  absl::StatusOr<kube::ObjectList> List(kube::Resource resource,
                                        const kube::ListOptions& options) override {
    if (fenced_) return Fenced();
    return inner_->List(resource, options);
  }
  absl::StatusOr<std::string> ListPages(
      kube::Resource resource, const kube::ListOptions& options,
      const std::function<absl::Status(std::vector<kube::Object>& items)>& page) override {
    if (fenced_) return Fenced();
    return inner_->ListPages(resource, options, page);
  }
  absl::StatusOr<std::unique_ptr<kube::WatchStream>> Watch(kube::Resource resource,
                                                           const kube::ListOptions& options,
                                                           kube::WatchHandler handler) override {
    if (fenced_) return Fenced();
    return inner_->Watch(resource, options, std::move(handler));
  }
  absl::StatusOr<kube::Object> Create(kube::Resource resource, const kube::Object& obj) override {
    if (fenced_) return Fenced();
    return inner_->Create(resource, obj);
  }
  absl::StatusOr<kube::Object> Update(kube::Resource resource, const kube::Object& obj,
                                      std::string_view subresource) override {
    if (fenced_) return Fenced();
    return inner_->Update(resource, obj, subresource);
  }
  absl::StatusOr<kube::Object> Patch(kube::Resource resource, std::string_view ns,
                                     std::string_view name, const kube::Object& patch,
                                     kube::PatchType type, std::string_view subresource) override {
    if (fenced_) return Fenced();
    return inner_->Patch(resource, ns, name, patch, type, subresource);
  }
  absl::StatusOr<kube::Object> Delete(kube::Resource resource, std::string_view ns,
                                      std::string_view name,
                                      const kube::DeleteOptions& options) override {
    if (fenced_) return Fenced();
    return inner_->Delete(resource, ns, name, options);
  }
  absl::Status BindPod(std::string_view ns, std::string_view pod_name, std::string_view node_name,
                       std::string_view pod_uid) override {
    if (fenced_) return Fenced();
    return inner_->BindPod(ns, pod_name, node_name, pod_uid);
  }
  absl::Status EvictPod(std::string_view ns, std::string_view pod_name,
                        const kube::EvictOptions& options) override {
    if (fenced_) return Fenced();
    return inner_->EvictPod(ns, pod_name, options);
  }

 private:
  static absl::Status Fenced() {
    return absl::UnavailableError("the process crashed: its connections are gone");
  }
  std::unique_ptr<kube::KubeClient> inner_;
  std::atomic<bool> fenced_{false};
};

// Detaches the simulated processes from the GPUs and MIG devices (only from the MIG device
// `mig_uuid` when given); returns how many.
int EndProcessesOn(nvml::SimNvml& sim, std::string_view mig_uuid = "") {
  int ended = 0;
  auto count = sim.DeviceCount();
  if (!count.ok()) return 0;
  for (uint32_t g = 0; g < *count; ++g) {
    auto gpu = sim.GetGpu(g);
    if (!gpu.ok()) continue;
    if (auto procs = sim.GetComputeProcesses(g); procs.ok() && mig_uuid.empty()) {
      for (const auto& p : *procs) ended += sim.DetachProcess(gpu->uuid, p.pid).ok() ? 1 : 0;
    }
    auto gis = sim.ListGpuInstances(g);
    if (!gis.ok()) continue;
    for (const auto& gi : *gis) {
      auto cis = sim.ListComputeInstances(g, gi.id);
      if (!cis.ok()) continue;
      for (const auto& ci : *cis) {
        if (!mig_uuid.empty() && ci.mig_uuid != mig_uuid) continue;
        auto procs = sim.GetMigDeviceProcesses(g, gi.id, ci.id);
        if (!procs.ok()) continue;
        for (const auto& p : *procs) ended += sim.DetachProcess(ci.mig_uuid, p.pid).ok() ? 1 : 0;
      }
    }
  }
  return ended;
}

}  // namespace

absl::StatusOr<std::vector<LocalNode>> ParseNodes(std::string_view text) {
  std::vector<LocalNode> nodes;
  std::set<std::string> names;
  for (const std::string& item : SplitTrimmed(text, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      if (nodes.empty()) {
        return absl::InvalidArgumentError(
            fmt::format("--nodes: \"{}\" has no node name: write NAME=MODELxCOUNT (e.g. "
                        "node-a=A100-SXM4-40GBx2)",
                        item));
      }
      nodes.back().gpus += "," + item;
      continue;
    }
    LocalNode node{std::string(Trim(std::string_view(item).substr(0, eq))),
                   std::string(Trim(std::string_view(item).substr(eq + 1)))};
    if (!kube::IsDnsSubdomain(node.name)) {
      return absl::InvalidArgumentError(fmt::format(
          "--nodes: node name \"{}\" is not a valid Kubernetes name (lower-case letters, digits, "
          "'-' and '.')",
          node.name));
    }
    if (!names.insert(node.name).second) {
      return absl::InvalidArgumentError(
          fmt::format("--nodes: node \"{}\" is given twice", node.name));
    }
    if (node.gpus.empty()) {
      return absl::InvalidArgumentError(fmt::format(
          "--nodes: node \"{}\" has no GPUs (e.g. {}=A100-SXM4-40GBx2)", node.name, node.name));
    }
    nodes.push_back(std::move(node));
  }
  if (nodes.empty()) return absl::InvalidArgumentError("--nodes: no node given");
  for (const auto& n : nodes) {
    auto models = nvml::ParseSimSpec(n.gpus);
    if (!models.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("--nodes: node \"{}\": {}", n.name, std::string(models.status().message())));
    }
  }
  return nodes;
}

struct LocalCluster::Node {
  LocalNode spec;
  int index = 0;
  std::string address;
  std::string dir;          // <state_dir>/nodes/<name>
  std::string kubelet_dir;  // the device-plugin socket directory
  std::unique_ptr<deviceplugin::TestKubelet> kubelet;
  std::unique_ptr<deviceplugin::TestRuntime> runtime;  // the container runtime's CRI
  std::unique_ptr<KubeletAllocator> allocator;
  // NVIDIA's device plugin "process" (LocalClusterOptions::nvidia_standin_nodes).
  std::unique_ptr<nvml::SimNvml> standin_nvml;
  std::unique_ptr<deviceplugin::NvidiaStandin> standin;
  std::vector<std::string> mig_resources;  // what the node's status shows of the stand-in's
  // HAMi's legacy device plugin "process" (StartHamiStandin).
  std::unique_ptr<nvml::SimNvml> hami_nvml;
  std::unique_ptr<kube::KubeClient> hami_client;
  std::unique_ptr<deviceplugin::NvidiaStandin> hami;
  std::unique_ptr<kube::KubeClient> agent_client;
  std::unique_ptr<nvml::SimNvml> workload_nvml;  // the workloads' processes attach through it
  std::unique_ptr<NodeAgent> agent;
  // The device plugin "process": everything it owns goes away on stop.
  std::unique_ptr<FencedKubeClient> plugin_client;
  std::unique_ptr<nvml::SimNvml> plugin_nvml;
  std::unique_ptr<deviceplugin::DevicePlugin> plugin;
};

// A scheduler replica "process".
struct LocalCluster::Replica {
  int index = 0;
  int generation = 0;  // starts so far: a restarted replica has a new identity, as a new pod
  int port = 0;        // kept across restarts (webhooks, kube-scheduler)
  std::unique_ptr<FencedKubeClient> client;
  std::unique_ptr<scheduler::SchedulerServer> server;
};

LocalCluster::LocalCluster(LocalClusterOptions options) : options_(std::move(options)) {
  scheduler_clock_ = options_.scheduler_clock != nullptr ? options_.scheduler_clock : &clock_;
}

LocalCluster::~LocalCluster() { Stop(); }

void LocalCluster::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(LocalClusterOptions options) {
  if (options.state_dir.empty())
    return absl::InvalidArgumentError("the state directory is required");
  if (options.nodes.empty()) return absl::InvalidArgumentError("at least one node is required");
  if (options.scheduler_replicas < 1)
    return absl::InvalidArgumentError("at least one scheduler replica is required");
  std::unique_ptr<LocalCluster> cluster(new LocalCluster(std::move(options)));
  if (auto st = cluster->Init(); !st.ok()) {
    cluster->Stop();
    return st;
  }
  return cluster;
}

absl::Status LocalCluster::Init() {
  if (auto st = PrepareStateDir(); !st.ok()) return st;
  // Configurations first: bad input is reported before anything listens.
  auto sched_config = LoadConfigs();
  if (!sched_config.ok()) return sched_config.status();
  // TLS: a CA of this run, the scheduler's serving certificate, kube-scheduler's client
  // certificate (the extender requires it, as deploy/ configures it).
  if (auto st = MakeTls(); !st.ok()) return st;
  MakeIdentities();
  if (auto st = StartApiServer(); !st.ok()) return st;
  auto admin = Client(kAdminUser);
  if (!admin.ok()) return admin.status();
  if (auto st = CreateSystemObjects(**admin); !st.ok()) return st;
  for (size_t i = 0; i < options_.nodes.size(); ++i) {
    auto node = AddNode(i, **admin);
    if (!node.ok()) return node.status();
    nodes_.push_back(std::move(*node));
  }

  dynmig::MutexLock lock(&mu_);
  if (auto st = StartControlPlaneLocked(*sched_config); !st.ok()) return st;
  // The nodes: device plugins, then the kubelets' pod loops.
  for (auto& node : nodes_) {
    if (!HeldBack(node->spec.name)) {
      if (auto st = StartDevicePluginLocked(*node); !st.ok()) return st;
    }
    node->agent->Start();
  }
  if (auto st = AwaitReadyLocked(**admin); !st.ok()) return st;
  supervisor_ = std::thread([this] { Supervise(); });
  return absl::OkStatus();
}

absl::Status LocalCluster::PrepareStateDir() {
  std::error_code ec;
  fs::create_directories(options_.state_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(fmt::format("cannot create the state directory {}: {}",
                                                   options_.state_dir, std::string(ec.message())));
  }
  options_.state_dir = fs::absolute(options_.state_dir).lexically_normal().string();
  while (options_.state_dir.size() > 1 && options_.state_dir.back() == '/')
    options_.state_dir.pop_back();
  return absl::OkStatus();
}

absl::StatusOr<SchedulerConfig> LocalCluster::LoadConfigs() {
  device_config_yaml_ = options_.device_config_yaml.empty() ? protocol::DefaultDeviceConfigYaml()
                                                            : options_.device_config_yaml;
  auto device_config = protocol::ParseDeviceConfig(device_config_yaml_);
  if (!device_config.ok()) return device_config.status();
  device_config_ = *std::move(device_config);
  auto sched_config = ParseSchedulerConfig(options_.scheduler_config_yaml.empty()
                                               ? std::string(kEmbeddedSchedulerConfig)
                                               : options_.scheduler_config_yaml);
  if (!sched_config.ok()) return sched_config.status();
  scheduler_name_ = sched_config->scheduler_name;
  return sched_config;
}

void LocalCluster::MakeIdentities() {
  admin_token_ = RandomToken();
  tokens_[std::string(kAdminUser)] = admin_token_;
  tokens_[std::string(kSchedulerUser)] = RandomToken();
  tokens_[std::string(kDevicePluginUser)] = RandomToken();
  tokens_[std::string(kKubeSchedulerUser)] = RandomToken();
  tokens_[std::string(kReplicaSetControllerUser)] = RandomToken();
  for (const auto& n : options_.nodes) tokens_["system:node:" + n.name] = RandomToken();
  for (const auto& user : options_.users) tokens_[user] = RandomToken();
}

absl::Status LocalCluster::StartApiServer() {
  kube::InMemoryApiServerOptions api;
  api.host = options_.api_host;
  api.port = options_.api_port;
  for (const auto& [user, token] : tokens_) api.token_users[token] = user;
  auto server = kube::InMemoryApiServer::Start(api);
  if (!server.ok()) {
    return absl::UnavailableError(fmt::format("the API server cannot listen on {}:{}: {}",
                                              options_.api_host, options_.api_port,
                                              std::string(server.status().message())));
  }
  api_ = std::move(*server);
  kubeconfig_path_ = options_.state_dir + "/kubeconfig";
  if (auto st = WriteFileAtomically(kubeconfig_path_, Kubeconfig(api_url(), admin_token_), 0600);
      !st.ok()) {
    return st;
  }
  Log(fmt::format("apiserver: serving {} (kubeconfig {})", api_url(), kubeconfig_path_));
  return absl::OkStatus();
}

absl::Status LocalCluster::CreateSystemObjects(kube::KubeClient& admin) {
  for (const char* ns : {"default", "kube-system", "dynmig-system"}) {
    auto created = admin.Create(
        kube::Resource::kNamespaces,
        {{"apiVersion", "v1"},
         {"kind", "Namespace"},
         {"metadata", {{"name", ns}, {"labels", {{"kubernetes.io/metadata.name", ns}}}}}});
    if (!created.ok() && !absl::IsAlreadyExists(created.status())) return created.status();
  }
  auto created =
      admin.Create(kube::Resource::kConfigMaps,
                   {{"apiVersion", "v1"},
                    {"kind", "ConfigMap"},
                    {"metadata", {{"name", kDeviceConfigMap}, {"namespace", kSystemNamespace}}},
                    {"data", {{"device-config.yaml", device_config_yaml_}}}});
  if (!created.ok() && !absl::IsAlreadyExists(created.status())) return created.status();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LocalCluster::Node>> LocalCluster::AddNode(size_t i,
                                                                          kube::KubeClient& admin) {
  auto node = std::make_unique<Node>();
  node->spec = options_.nodes[i];
  node->index = static_cast<int>(i);
  node->address = options_.node_address_prefix +
                  std::to_string(options_.node_address_first + static_cast<int>(i));
  if (auto st = PrepareNodeDirs(*node); !st.ok()) return st;
  if (auto st = CreateGpus(*node); !st.ok()) return st;
  if (auto st = CreateNodeObject(*node, admin); !st.ok()) return st;
  if (auto st = StartKubelet(*node); !st.ok()) return st;
  return node;
}

absl::Status LocalCluster::PrepareNodeDirs(Node& node) {
  node.dir = options_.state_dir + "/nodes/" + node.spec.name;
  std::error_code ec;
  fs::create_directories(node.dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        fmt::format("cannot create {}: {}", node.dir, std::string(ec.message())));
  }
  // The kubelet's layout: <root>/kubelet is the device-plugin directory, the PodResources
  // socket is <root>/pod-resources/kubelet.sock beside it.
  node.kubelet_dir = node.dir + "/kubelet";
  if (deviceplugin::PodResourcesSocketBeside(node.kubelet_dir).size() > kMaxSocketPath) {
    std::string tmpl = "/tmp/dynmig-local-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      return absl::PermissionDeniedError(fmt::format("mkdtemp: {}", std::strerror(errno)));
    }
    node.kubelet_dir = tmpl + "/kubelet";
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::CreateGpus(Node& node) {
  // The GPUs exist before anything runs (the simulated hardware).
  nvml::SimNvmlOptions o;
  o.spec = node.spec.gpus;
  o.state_file = nvml_state_file(node.spec.name);
  o.seed = node.spec.name;
  auto sim = nvml::SimNvml::Create(std::move(o));
  if (!sim.ok()) {
    return absl::FailedPreconditionError(
        fmt::format("node {}: {} (remove {} to start from new GPUs)", node.spec.name,
                    std::string(sim.status().message()), node.dir));
  }
  node.workload_nvml = std::move(*sim);
  if (auto st = ApplyLegacyGeometry(node); !st.ok()) return st;
  // The workloads of an earlier run ended with it (its API objects are gone too): as after a node
  // reboot, no process is left on the GPUs. The device plugin then finds idle GPUs.
  if (int ended = EndProcessesOn(*node.workload_nvml); ended > 0) {
    Log(fmt::format("{}: {} simulated process(es) of an earlier run ended", node.spec.name, ended));
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::CreateNodeObject(const Node& node, kube::KubeClient& admin) {
  json obj = {{"apiVersion", "v1"},
              {"kind", "Node"},
              {"metadata",
               {{"name", node.spec.name},
                {"labels",
                 {{"kubernetes.io/hostname", node.spec.name},
                  {"kubernetes.io/os", "linux"},
                  {std::string(protocol::kMigServiceLabel), "enabled"}}}}},
              {"status",
               {{"addresses", json::array({{{"type", "InternalIP"}, {"address", node.address}},
                                           {{"type", "Hostname"}, {"address", node.spec.name}}})},
                {"capacity", {{"cpu", "64"}, {"memory", "512Gi"}, {"pods", "110"}}},
                {"allocatable", {{"cpu", "64"}, {"memory", "512Gi"}, {"pods", "110"}}},
                {"conditions", json::array({{{"type", "Ready"},
                                             {"status", "True"},
                                             {"reason", "KubeletReady"},
                                             {"message", "dynmig local kubelet stand-in"}}})}}}};
  auto created = admin.CreateNode(obj);
  if (!created.ok() && !absl::IsAlreadyExists(created.status())) return created.status();
  return absl::OkStatus();
}

absl::Status LocalCluster::StartKubelet(Node& node) {
  auto kubelet = deviceplugin::TestKubelet::Start(node.kubelet_dir);
  if (!kubelet.ok()) {
    return absl::UnavailableError(fmt::format("node {}: kubelet: {}", node.spec.name,
                                              std::string(kubelet.status().message())));
  }
  node.kubelet = std::move(*kubelet);
  auto runtime = deviceplugin::TestRuntime::Start(RuntimeSocketOf(node.kubelet_dir));
  if (!runtime.ok()) {
    return absl::UnavailableError(fmt::format("node {}: container runtime: {}", node.spec.name,
                                              std::string(runtime.status().message())));
  }
  node.runtime = std::move(*runtime);
  node.kubelet->AttachRuntime(node.runtime.get());
  node.allocator = std::make_unique<KubeletAllocator>(*node.kubelet, *node.runtime,
                                                      device_config_.resources.count);
  if (auto st = StartNvidiaStandin(node); !st.ok()) return st;
  auto agent_client = Client("system:node:" + node.spec.name);
  if (!agent_client.ok()) return agent_client.status();
  node.agent_client = std::move(*agent_client);
  NodeAgentOptions ao;
  ao.node = node.spec.name;
  nvml::SimNvml* workload = node.workload_nvml.get();
  ao.processes.attach = [workload](const std::string& uuid, uint32_t pid) {
    return workload->AttachProcess(uuid, pid, 1024);
  };
  ao.processes.detach = [workload](const std::string& uuid, uint32_t pid) {
    return workload->DetachProcess(uuid, pid);
  };
  const std::string prefix = node.spec.name + "/kubelet: ";
  ao.log = [this, prefix](const std::string& line) { Log(prefix + line); };
  ao.first_pid = 10000 + 1000 * static_cast<uint32_t>(node.index);
  ao.admission_delay = options_.kubelet_admission_delay;
  node.agent =
      std::make_unique<NodeAgent>(*node.agent_client, *node.allocator, clock_, std::move(ao));
  return absl::OkStatus();
}

absl::Status LocalCluster::StartControlPlaneLocked(const SchedulerConfig& config) {
  // The extender and webhooks, then kube-scheduler.
  for (int i = 0; i < options_.scheduler_replicas; ++i) {
    replicas_.push_back(std::make_unique<Replica>());
    replicas_.back()->index = i;
    if (auto st = StartSchedulerLocked(*replicas_.back()); !st.ok()) return st;
  }
  RouteLocked();
  auto loop_client = Client(kKubeSchedulerUser);
  if (!loop_client.ok()) return loop_client.status();
  loop_client_ = std::move(*loop_client);
  SchedulerLoopOptions lo;
  lo.config = config;
  lo.extender_url = replicas_.front()->server->url();
  lo.extender_url_source = [this] { return ExtenderUrl(); };
  lo.tls = config.extender.tls;
  lo.tls->insecure = false;
  lo.tls->ca_file = tls_.ca_file;
  lo.tls->cert_file = tls_.client_cert_file;
  lo.tls->key_file = tls_.client_key_file;
  lo.timing = options_.scheduler_timing;
  lo.default_scheduler = options_.default_scheduler;
  lo.log = [this](const std::string& line) { Log("kube-scheduler: " + line); };
  loop_ = std::make_unique<SchedulerLoop>(*loop_client_, clock_, std::move(lo));
  loop_->Start();
  // kube-controller-manager's ReplicaSet controller: evicted or deleted pods of a ReplicaSet come
  // back (the defragmenter relies on it).
  auto rs_client = Client(kReplicaSetControllerUser);
  if (!rs_client.ok()) return rs_client.status();
  replicaset_client_ = std::move(*rs_client);
  ReplicaSetControllerOptions ro;
  ro.log = [this](const std::string& line) { Log(line); };
  replicasets_ = std::make_unique<ReplicaSetController>(*replicaset_client_, clock_, std::move(ro));
  replicasets_->Start();
  return absl::OkStatus();
}

absl::Status LocalCluster::AwaitReadyLocked(kube::KubeClient& admin) {
  const absl::Duration deadline = clock_.Monotonic() + absl::Seconds(30);
  for (auto& node : nodes_) {
    if (auto st = AwaitNodeReady(*node, admin, deadline); !st.ok()) return st;
  }
  for (auto& r : replicas_) {
    if (!r->server->WaitUntilReady(deadline - clock_.Monotonic())) {
      return absl::DeadlineExceededError("the scheduler's caches did not sync");
    }
  }
  return absl::OkStatus();
}

bool LocalCluster::HeldBack(std::string_view node) const {
  const auto& names = options_.device_plugins_stopped;
  return std::find(names.begin(), names.end(), node) != names.end();
}

absl::Status LocalCluster::AwaitNodeReady(Node& node, kube::KubeClient& admin,
                                          absl::Duration monotonic_deadline) {
  if (HeldBack(node.spec.name)) return absl::OkStatus();  // nothing of dynmig's runs there yet
  if (!node.kubelet->WaitForRegistrations(1, monotonic_deadline - clock_.Monotonic(),
                                          device_config_.resources.count)) {
    return absl::DeadlineExceededError(fmt::format(
        "node {}: the device plugin did not register with the kubelet", node.spec.name));
  }
  while (true) {
    auto obj = admin.GetNode(node.spec.name);
    if (obj.ok() && kube::Annotation(*obj, protocol::kNodeRegisterAnnotation)) break;
    if (clock_.Monotonic() > monotonic_deadline) {
      return absl::DeadlineExceededError(
          fmt::format("node {}: the device plugin did not publish {}", node.spec.name,
                      protocol::kNodeRegisterAnnotation));
    }
    clock_.SleepFor(absl::Milliseconds(20));
  }
  // The kubelet reports the plugin's devices in the node's capacity.
  const std::string count = std::to_string(node.kubelet->devices().size());
  const std::string resource = node.allocator->ResourceName().empty()
                                   ? std::string(protocol::kResourceCount)
                                   : node.allocator->ResourceName();
  (void)node.agent_client->PatchNodeStatus(
      node.spec.name,
      {{"status", {{"capacity", {{resource, count}}}, {"allocatable", {{resource, count}}}}}});
  return absl::OkStatus();
}

absl::Status LocalCluster::MakeTls() {
  const std::string dir = options_.state_dir + "/pki";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        fmt::format("cannot create {}: {}", dir, std::string(ec.message())));
  }
  auto ca = webhook::MakeCa("dynmig-local-ca");
  if (!ca.ok()) return ca.status();
  webhook::CertSpec serving;
  serving.common_name = "dynmig-scheduler.dynmig-system.svc";
  serving.sans = {"IP:127.0.0.1", "DNS:localhost", "DNS:dynmig-scheduler.dynmig-system.svc",
                  "DNS:dynmig-webhook.dynmig-system.svc"};
  auto server = webhook::IssueCert(*ca, serving);
  if (!server.ok()) return server.status();
  webhook::CertSpec client;
  client.common_name = std::string(kKubeSchedulerUser);
  client.usage = webhook::CertUsage::kClient;
  auto kube_scheduler = webhook::IssueCert(*ca, client);
  if (!kube_scheduler.ok()) return kube_scheduler.status();
  tls_.ca_file = dir + "/ca.crt";
  tls_.serving_cert_file = dir + "/tls.crt";
  tls_.serving_key_file = dir + "/tls.key";
  tls_.client_cert_file = dir + "/kube-scheduler.crt";
  tls_.client_key_file = dir + "/kube-scheduler.key";
  // The CA key is not kept: every run makes new certificates.
  for (const auto& [path, text] :
       {std::pair{tls_.ca_file, ca->cert_pem}, std::pair{tls_.serving_cert_file, server->cert_pem},
        std::pair{tls_.serving_key_file, server->key_pem},
        std::pair{tls_.client_cert_file, kube_scheduler->cert_pem},
        std::pair{tls_.client_key_file, kube_scheduler->key_pem}}) {
    if (auto st = webhook::WritePrivateFile(path, text); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<kube::KubeClient>> LocalCluster::Client(
    std::string_view user) const {
  auto it = tokens_.find(user);
  if (it == tokens_.end()) return absl::NotFoundError(fmt::format("no identity {}", user));
  kube::RestConfig cfg;
  cfg.server = api_url();
  cfg.token = it->second;
  cfg.user_agent = fmt::format("dynmig-local/{}", user);
  cfg.request_timeout = options_.api_request_timeout;
  auto client = kube::RestKubeClient::Create(cfg);
  if (!client.ok()) return client.status();
  return std::unique_ptr<kube::KubeClient>(std::move(*client));
}

absl::Status LocalCluster::StartSchedulerLocked(Replica& replica) {
  if (replica.server != nullptr) return absl::OkStatus();
  const protocol::DeviceConfig* config = &device_config_;
  auto client = Client(kSchedulerUser);
  if (!client.ok()) return client.status();
  replica.client = std::make_unique<FencedKubeClient>(std::move(*client));
  scheduler::SchedulerServerOptions o;
  o.host = "127.0.0.1";
  o.port = replica.port;  // a restarted scheduler keeps its address (webhooks, kube-scheduler)
  if (options_.scheduler_replicas > 1) {
    o.leader_elect = true;
    o.election = options_.election;
    o.election.identity =
        fmt::format("dynmig-scheduler-{}_{}", replica.index, ++replica.generation);
  }
  o.tls_cert_file = tls_.serving_cert_file;
  o.tls_key_file = tls_.serving_key_file;
  o.extender_client_ca_file = tls_.ca_file;
  o.extender.scheduler_name = scheduler_name_;
  o.admission.scheduler_name = scheduler_name_;
  o.state.allowlist = config->allowlist;
  o.state.memory_match = config->memory_match;
  o.state.resources = config->resources;
  o.extender.resources = config->resources;
  o.extender.reservation_ttl = options_.reservation_ttl;
  // Whole-GPU pods are placed only where GPUs may change mode (as cmd_scheduler.cc does).
  o.extender.whole_gpu_pods = config->mig_mode_switching.enabled;
  o.expiry_interval = options_.expiry_interval;
  o.defrag = options_.defrag;
  o.defrag_interval = options_.defrag_interval;
  o.mode_switch.config = config->mig_mode_switching;  // absent or disabled: no loop
  o.admission.allowlist = config->allowlist;
  o.admission.memory_match = config->memory_match;
  o.admission.resources = config->resources;
  o.admission.annotation_writers = {std::string(kSchedulerUser), std::string(kDevicePluginUser)};
  // The kubelet stand-ins write dynmig.io/visible-devices, one of the system's annotations.
  for (const auto& n : options_.nodes)
    o.admission.annotation_writers.push_back("system:node:" + n.name);
  o.admission.binders = {std::string(kSchedulerUser)};
  o.threads = options_.scheduler_threads;
  o.layout_html = ops::RenderLayoutHtml;  // GET /layout, as `dynmig scheduler` serves it
  o.layout_json = [](const std::vector<scheduler::NodeReport>& n) {
    return ops::LayoutJson(n).dump(2);
  };
  o.live = ops::LivePageRenderer();  // GET /live
  auto server = scheduler::SchedulerServer::Start(*replica.client, *scheduler_clock_, std::move(o));
  if (!server.ok()) {
    replica.client.reset();
    return server.status();
  }
  replica.server = std::move(*server);
  replica.port = replica.server->port();
  Log(fmt::format("scheduler{}: extender and webhooks serving {}",
                  options_.scheduler_replicas > 1 ? fmt::format("-{}", replica.index) : "",
                  replica.server->url()));
  return absl::OkStatus();
}

void LocalCluster::StopReplicaLocked(Replica& replica) {
  if (replica.server == nullptr) return;
  {
    dynmig::MutexLock lock(&route_mu_);
    std::erase_if(routes_, [&](const auto& r) { return r.first == replica.server->url(); });
  }
  replica.server->Stop();
  replica.server.reset();
  replica.client.reset();
}

LocalCluster::Replica* LocalCluster::RouteTarget() const {
  Replica* running = nullptr;
  for (const auto& r : replicas_) {
    if (r->server == nullptr) continue;
    if (r->server->elector() == nullptr || r->server->elector()->IsLeader()) return r.get();
    if (running == nullptr) running = r.get();
  }
  return running;
}

std::string LocalCluster::ExtenderUrl() const {
  dynmig::MutexLock lock(&route_mu_);
  for (const auto& [url, elector] : routes_) {
    if (elector == nullptr || elector->IsLeader()) return url;
  }
  return routes_.empty() ? "" : routes_.front().first;
}

void LocalCluster::RouteLocked() {
  {
    dynmig::MutexLock lock(&route_mu_);
    routes_.clear();
    for (const auto& r : replicas_) {
      if (r->server != nullptr) routes_.emplace_back(r->server->url(), r->server->elector());
    }
  }
  const Replica* target = RouteTarget();
  if (target == nullptr) return;  // the webhooks keep the last address: calls fail, as in a cluster
  if (webhooks_removed_) return;
  // The webhook configurations of deploy/base/webhook/webhooks.yaml, pointed at this scheduler.
  std::vector<kube::AdmissionWebhook> hooks(3);
  hooks[0].name = "mutate.dynmig.io";
  hooks[0].url = target->server->url() + "/webhook";
  hooks[0].mutating = true;
  hooks[0].operations = {"CREATE"};
  hooks[0].resources = {"pods"};
  hooks[1].name = "validate.dynmig.io";
  hooks[1].url = target->server->url() + "/validate";
  hooks[1].mutating = false;
  hooks[1].operations = {"CREATE", "UPDATE"};
  hooks[1].excluded_users = {std::string(kSchedulerUser), std::string(kDevicePluginUser)};
  hooks[1].resources = {"pods"};
  // Its pods/binding rule (matchConditions: the kube-scheduler stand-in's bindings are not sent).
  hooks[2] = hooks[1];
  hooks[2].operations = {"CREATE"};
  hooks[2].excluded_users.push_back(std::string(kKubeSchedulerUser));
  hooks[2].resources = {"pods/binding"};
  for (auto& h : hooks) {
    h.ca_file = tls_.ca_file;  // the API server verifies the webhook's serving certificate
    h.excluded_namespaces = {"dynmig-system", "kube-system"};
    h.failure_policy_fail = true;
    h.timeout = absl::Seconds(10);
  }
  api_->SetAdmissionWebhooks(std::move(hooks));
}

absl::Status LocalCluster::StartDevicePluginLocked(Node& node) {
  if (node.plugin != nullptr) return absl::OkStatus();
  const protocol::DeviceConfig* config = &device_config_;
  nvml::SimNvmlOptions so;
  so.state_file = nvml_state_file(node.spec.name);
  so.seed = node.spec.name;
  so.latency = options_.nvml_latency;
  auto sim = nvml::SimNvml::Create(std::move(so));
  if (!sim.ok()) return sim.status();
  auto client = Client(kDevicePluginUser);
  if (!client.ok()) return client.status();
  node.plugin_nvml = std::move(*sim);
  node.plugin_client = std::make_unique<FencedKubeClient>(std::move(*client));
  deviceplugin::DevicePluginOptions o;
  o.core.node_name = node.spec.name;
  o.core.resource_name = config->resources.count;
  o.core.allowlist = config->allowlist;
  o.core.warm = config->warm_instances;
  o.core.mig_mode_switching = config->mig_mode_switching;
  o.core.state_file = node.dir + "/device-plugin-state.json";
  o.kubelet_dir = node.kubelet_dir;
  o.pod_resources_socket = node.kubelet->pod_resources_socket();
  o.cri_socket = RuntimeSocketOf(node.kubelet_dir);  // handover's runtime evidence
  o.reconcile_interval = options_.reconcile_interval;
  o.register_interval = options_.register_interval;
  o.kubelet_poll_interval = absl::Milliseconds(200);
  o.metrics_listen = fmt::format("{}:{}", node.address, options_.nvml_port);
  o.metrics_pod_identity = true;  // a sandbox on loopback: the pod-attributed instance series too
  // A crash point armed for this node crashes this process once: fenced at once, restarted by the
  // supervisor.
  FencedKubeClient* fence = node.plugin_client.get();
  o.core.crash_point = [this, fence, name = node.spec.name](std::string_view point) {
    dynmig::MutexLock lock(&crash_mu_);
    auto it = armed_.find(name);
    if (it == armed_.end() || it->second != point) return false;
    armed_.erase(it);
    fence->Fence();
    ++crashes_[fmt::format("device-plugin crash {}", point)];
    crashed_plugins_.push_back(name);
    crash_cv_.SignalAll();
    return true;
  };
  auto plugin =
      deviceplugin::DevicePlugin::Start(std::move(o), *node.plugin_nvml, *node.plugin_client);
  if (!plugin.ok()) {
    node.plugin_client.reset();
    node.plugin_nvml.reset();
    return absl::Status(plugin.status().code(),
                        fmt::format("node {}: device plugin: {}", node.spec.name,
                                    std::string(plugin.status().message())));
  }
  node.plugin = std::move(*plugin);
  Log(fmt::format("{}/device-plugin: serving {} on {}, metrics and NVML view on http://{}:{}",
                  node.spec.name, node.plugin->options().core.resource_name,
                  node.plugin->endpoint().socket_path(), node.address, options_.nvml_port));
  return absl::OkStatus();
}

void LocalCluster::Stop() {
  {
    dynmig::MutexLock lock(&crash_mu_);
    supervisor_stop_ = true;
  }
  crash_cv_.SignalAll();
  if (supervisor_.joinable() && supervisor_.get_id() != std::this_thread::get_id())
    supervisor_.join();
  dynmig::MutexLock lock(&mu_);
  if (stopped_) return;
  stopped_ = true;
  // Components stop, then their API clients go, closing their idle keep-alive connections: the
  // API server's Stop() would otherwise wait each one's keep-alive timeout out (httplib cannot
  // wake an idle connection).
  if (loop_) loop_->Stop();
  loop_.reset();
  loop_client_.reset();
  if (replicasets_) replicasets_->Stop();
  replicasets_.reset();
  replicaset_client_.reset();
  for (auto& node : nodes_) {
    if (node->agent) node->agent->Stop();
    node->agent.reset();
    node->agent_client.reset();
  }
  for (auto& node : nodes_) {
    if (node->plugin) node->plugin->Stop();
    node->plugin.reset();
    node->plugin_client.reset();
    node->plugin_nvml.reset();
    node->standin.reset();
    node->standin_nvml.reset();
    node->hami.reset();
    node->hami_client.reset();
    node->hami_nvml.reset();
    if (node->kubelet) {
      node->kubelet->Stop();
      node->kubelet->AttachRuntime(nullptr);
    }
    if (node->runtime) node->runtime->Stop();
  }
  for (auto& r : replicas_) StopReplicaLocked(*r);
  if (api_) api_->Stop();
  for (auto& node : nodes_) {
    if (node->kubelet_dir.rfind("/tmp/dynmig-local-", 0) == 0) {
      std::error_code ec;
      fs::remove_all(fs::path(node->kubelet_dir).parent_path(), ec);
    }
  }
}

std::string LocalCluster::api_url() const { return api_ ? api_->url() : ""; }

std::string LocalCluster::scheduler_url() const {
  dynmig::MutexLock lock(&mu_);
  const Replica* r = RouteTarget();
  return r != nullptr ? r->server->url() : "";
}

std::string LocalCluster::node_address(std::string_view node) const {
  const Node* n = FindNode(node);
  return n != nullptr ? n->address : "";
}

std::string LocalCluster::nvml_endpoint_template() const {
  return fmt::format("http://{{node}}:{}/nvml", options_.nvml_port);
}

std::string LocalCluster::nvml_state_file(std::string_view node) const {
  return fmt::format("{}/nodes/{}/nvml.json", options_.state_dir, node);
}

LocalCluster::Node* LocalCluster::FindNode(std::string_view name) const {
  for (const auto& n : nodes_) {
    if (n->spec.name == name) return n.get();
  }
  return nullptr;
}

std::vector<scheduler::NodeReport> LocalCluster::Layout() const {
  dynmig::MutexLock lock(&mu_);
  const Replica* r = RouteTarget();
  if (r == nullptr) return {};
  return r->server->state().Report(scheduler_clock_->Now());
}

scheduler::SchedulerServer* LocalCluster::scheduler() {
  dynmig::MutexLock lock(&mu_);
  const Replica* r = RouteTarget();
  return r != nullptr ? r->server.get() : nullptr;
}

absl::Status LocalCluster::StopDevicePlugin(std::string_view name) {
  dynmig::MutexLock lock(&mu_);
  Node* node = FindNode(name);
  if (node == nullptr) return absl::NotFoundError(fmt::format("no node {}", name));
  if (node->plugin == nullptr) return absl::OkStatus();
  node->plugin->Stop();
  node->plugin.reset();
  node->plugin_client.reset();
  node->plugin_nvml.reset();
  Log(fmt::format("{}/device-plugin: stopped", name));
  return absl::OkStatus();
}

absl::Status LocalCluster::StartDevicePlugin(std::string_view name) {
  dynmig::MutexLock lock(&mu_);
  if (stopped_) return absl::FailedPreconditionError("the local cluster is stopped");
  Node* node = FindNode(name);
  if (node == nullptr) return absl::NotFoundError(fmt::format("no node {}", name));
  // Already running (the supervisor restarted it after a crash meanwhile): nothing to wait for.
  if (node->plugin != nullptr) return absl::OkStatus();
  const int before = node->kubelet->registrations(device_config_.resources.count);
  if (auto st = StartDevicePluginLocked(*node); !st.ok()) return st;
  if (!node->kubelet->WaitForRegistrations(before + 1, absl::Seconds(30),
                                           device_config_.resources.count)) {
    return absl::DeadlineExceededError(
        fmt::format("node {}: the restarted device plugin did not register", name));
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::RestartDevicePlugin(std::string_view name) {
  if (auto st = StopDevicePlugin(name); !st.ok()) return st;
  return StartDevicePlugin(name);
}

bool LocalCluster::DevicePluginRunning(std::string_view name) const {
  dynmig::MutexLock lock(&mu_);
  const Node* node = FindNode(name);
  return node != nullptr && node->plugin != nullptr;
}

deviceplugin::DevicePlugin* LocalCluster::device_plugin(std::string_view name) {
  dynmig::MutexLock lock(&mu_);
  Node* node = FindNode(name);
  return node != nullptr ? node->plugin.get() : nullptr;
}

deviceplugin::TestKubelet* LocalCluster::kubelet(std::string_view name) {
  Node* node = FindNode(name);
  return node != nullptr ? node->kubelet.get() : nullptr;
}

deviceplugin::TestRuntime* LocalCluster::runtime(std::string_view name) {
  Node* node = FindNode(name);
  return node != nullptr ? node->runtime.get() : nullptr;
}

std::string LocalCluster::runtime_socket(std::string_view name) const {
  const Node* node = FindNode(name);
  return node != nullptr ? RuntimeSocketOf(node->kubelet_dir) : "";
}

deviceplugin::NvidiaStandin* LocalCluster::nvidia_standin(std::string_view name) {
  dynmig::MutexLock lock(&mu_);
  Node* node = FindNode(name);
  return node != nullptr ? node->standin.get() : nullptr;
}

absl::Status LocalCluster::StartNvidiaStandin(std::string_view name) {
  dynmig::MutexLock lock(&mu_);
  if (stopped_) return absl::FailedPreconditionError("the local cluster is stopped");
  Node* node = FindNode(name);
  if (node == nullptr) return absl::NotFoundError(fmt::format("no node {}", name));
  if (node->standin != nullptr) return absl::OkStatus();
  return StartNvidiaStandinOn(*node);
}

absl::Status LocalCluster::StopNvidiaStandin(std::string_view name) {
  dynmig::MutexLock lock(&mu_);
  Node* node = FindNode(name);
  if (node == nullptr || node->standin == nullptr) {
    return absl::NotFoundError(fmt::format("no NVIDIA device plugin stand-in runs on {}", name));
  }
  node->standin->Stop();
  node->standin.reset();
  node->standin_nvml.reset();
  PublishMigResources(*node, /*serving=*/false);
  Log(fmt::format("{}/nvidia-device-plugin: stopped", name));
  return absl::OkStatus();
}

absl::Status LocalCluster::StartHamiStandin(std::string_view name, const std::string& config_path) {
  auto config = protocol::LoadDeviceConfig(config_path);
  if (!config.ok()) return absl::InvalidArgumentError(std::string(config.status().message()));
  dynmig::MutexLock lock(&mu_);
  if (stopped_) return absl::FailedPreconditionError("the local cluster is stopped");
  Node* node = FindNode(name);
  if (node == nullptr) return absl::NotFoundError(fmt::format("no node {}", name));
  if (node->hami != nullptr) return absl::OkStatus();
  if (node->plugin != nullptr) {
    return absl::FailedPreconditionError(
        fmt::format("dynmig's device plugin serves nvidia.com/gpu on {}: stop it first", name));
  }
  auto client = Client("system:node:" + node->spec.name);
  if (!client.ok()) return client.status();
  nvml::SimNvmlOptions so;  // its own "process": a simulator object over the node's GPU state
  so.state_file = nvml_state_file(node->spec.name);
  so.seed = node->spec.name;
  auto sim = nvml::SimNvml::Create(std::move(so));
  if (!sim.ok()) return sim.status();
  deviceplugin::NvidiaStandinOptions o;
  o.mode = deviceplugin::StandinMode::kHamiLegacy;
  o.kubelet_dir = node->kubelet_dir;
  o.node = node->spec.name;
  o.kube = client->get();
  o.legacy_geometries = config->legacy_geometries;
  auto standin = deviceplugin::NvidiaStandin::Start(o, **sim, clock_);
  if (!standin.ok()) {
    return absl::Status(standin.status().code(),
                        fmt::format("node {}: HAMi's device plugin stand-in: {}", name,
                                    std::string(standin.status().message())));
  }
  node->hami_nvml = std::move(*sim);
  node->hami_client = std::move(*client);
  node->hami = std::move(*standin);
  if (node->hami->WaitForRegistrations(1, absl::Seconds(10))) {
    node->kubelet->WaitForDevices([](const auto& d) { return !d.empty(); }, absl::Seconds(5),
                                  std::string(protocol::kResourceCount));
  }
  Log(fmt::format("{}/hami-device-plugin: serving {}", name, protocol::kResourceCount));
  return absl::OkStatus();
}

absl::Status LocalCluster::StopHamiStandin(std::string_view name) {
  dynmig::MutexLock lock(&mu_);
  Node* node = FindNode(name);
  if (node == nullptr || node->hami == nullptr) {
    return absl::NotFoundError(fmt::format("no HAMi device plugin stand-in runs on {}", name));
  }
  node->hami->Stop();
  node->hami.reset();
  node->hami_client.reset();
  node->hami_nvml.reset();
  Log(fmt::format("{}/hami-device-plugin: stopped", name));
  return absl::OkStatus();
}

void LocalCluster::SetWebhooks(bool installed) {
  dynmig::MutexLock lock(&mu_);
  webhooks_removed_ = !installed;
  if (installed) {
    RouteLocked();
  } else {
    api_->SetAdmissionWebhooks({});
  }
  Log(installed ? "dynmig's admission webhooks installed" : "dynmig's admission webhooks removed");
}

void LocalCluster::PublishMigResources(Node& node, bool serving) {
  auto client = Client("system:node:" + node.spec.name);
  if (!client.ok()) return;
  nlohmann::json capacity = nlohmann::json::object();
  nlohmann::json allocatable = nlohmann::json::object();
  for (const auto& resource : serving ? node.kubelet->resources() : node.mig_resources) {
    if (!protocol::MigResourceProfile(resource).has_value()) continue;
    const std::string count = std::to_string(node.kubelet->devices(resource).size());
    if (serving) {
      capacity[resource] = count;
      node.mig_resources.push_back(resource);
    }
    allocatable[resource] = serving ? count : "0";
  }
  if (!serving) node.mig_resources.clear();
  if (allocatable.empty()) return;
  nlohmann::json status = {{"allocatable", allocatable}};
  if (serving) status["capacity"] = capacity;
  (void)(*client)->PatchNodeStatus(node.spec.name, {{"status", status}});
}

absl::Status LocalCluster::ApplyLegacyGeometry(Node& node) {
  auto it = options_.legacy_geometry.find(node.spec.name);
  if (it == options_.legacy_geometry.end()) return absl::OkStatus();
  auto spec = mig::ParseGeometry(it->second);
  if (!spec.ok())
    return absl::InvalidArgumentError(
        fmt::format("node {}: {}", node.spec.name, std::string(spec.status().message())));
  auto count = node.workload_nvml->DeviceCount();
  if (!count.ok()) return count.status();
  for (uint32_t gpu = 0; gpu < *count; ++gpu) {
    auto r = nvml::ApplyGeometry(*node.workload_nvml, gpu, *spec);
    if (r.ok()) {
      Log(fmt::format("{}: GPU {} geometry {} {}", node.spec.name, gpu, spec->ToString(),
                      r->unchanged ? "already there" : "applied"));
    } else if (r.status().code() == absl::StatusCode::kFailedPrecondition) {
      Log(fmt::format("{}: GPU {} left as it is: {}", node.spec.name, gpu,
                      std::string(r.status().message())));
    } else {
      return absl::Status(r.status().code(), fmt::format("node {}: {}", node.spec.name,
                                                         std::string(r.status().message())));
    }
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::StartNvidiaStandin(Node& node) {
  const auto& names = options_.nvidia_standin_nodes;
  if (std::find(names.begin(), names.end(), node.spec.name) == names.end()) {
    return absl::OkStatus();
  }
  return StartNvidiaStandinOn(node);
}

absl::Status LocalCluster::StartNvidiaStandinOn(Node& node) {
  // Its own "process": a simulator object of its own over the node's GPU state.
  nvml::SimNvmlOptions so;
  so.state_file = nvml_state_file(node.spec.name);
  so.seed = node.spec.name;
  auto sim = nvml::SimNvml::Create(std::move(so));
  if (!sim.ok()) return sim.status();
  deviceplugin::NvidiaStandinOptions o;
  o.kubelet_dir = node.kubelet_dir;
  auto standin = deviceplugin::NvidiaStandin::Start(o, **sim, clock_);
  if (!standin.ok()) {
    return absl::Status(standin.status().code(),
                        fmt::format("node {}: NVIDIA device plugin stand-in: {}", node.spec.name,
                                    std::string(standin.status().message())));
  }
  node.standin_nvml = std::move(*sim);
  node.standin = std::move(*standin);
  // The kubelet shows what it serves in the node's capacity and allocatable, as the kubelet does
  // (and keeps the capacity, allocatable 0, once it stops).
  if (node.standin->WaitForRegistrations(1, absl::Seconds(10))) {
    for (const auto& profile : node.standin->profiles()) {
      node.kubelet->WaitForDevices([](const auto& d) { return !d.empty(); }, absl::Seconds(5),
                                   *protocol::MigResourceName(profile));
    }
    PublishMigResources(node, /*serving=*/true);
  }
  Log(fmt::format("{}/nvidia-device-plugin: serving {} profile(s)", node.spec.name,
                  node.standin->profiles().size()));
  return absl::OkStatus();
}

absl::Status LocalCluster::StopScheduler() {
  dynmig::MutexLock lock(&mu_);
  bool any = false;
  for (auto& r : replicas_) {
    any = any || r->server != nullptr;
    StopReplicaLocked(*r);
  }
  if (any) Log("scheduler: stopped");
  return absl::OkStatus();
}

absl::Status LocalCluster::StartScheduler() {
  dynmig::MutexLock lock(&mu_);
  if (stopped_) return absl::FailedPreconditionError("the local cluster is stopped");
  for (auto& r : replicas_) {
    if (r->server != nullptr) continue;
    if (auto st = StartSchedulerLocked(*r); !st.ok()) {
      RouteLocked();
      return st;
    }
    if (!r->server->WaitUntilReady(absl::Seconds(30))) {
      RouteLocked();
      return absl::DeadlineExceededError("the restarted scheduler's caches did not sync");
    }
  }
  RouteLocked();
  return absl::OkStatus();
}

bool LocalCluster::SchedulerRunning() const {
  dynmig::MutexLock lock(&mu_);
  for (const auto& r : replicas_) {
    if (r->server == nullptr) return false;
  }
  return true;
}

int LocalCluster::SchedulerLeader() const {
  dynmig::MutexLock lock(&mu_);
  for (const auto& r : replicas_) {
    if (r->server == nullptr) continue;
    if (r->server->elector() == nullptr || r->server->elector()->IsLeader()) return r->index;
  }
  return -1;
}

absl::Status LocalCluster::ArmDevicePluginCrash(std::string_view node, std::string_view point) {
  if (FindNode(node) == nullptr) return absl::NotFoundError(fmt::format("no node {}", node));
  dynmig::MutexLock lock(&crash_mu_);
  if (point.empty()) {
    armed_.erase(std::string(node));
  } else {
    armed_[std::string(node)] = std::string(point);
  }
  return absl::OkStatus();
}

void LocalCluster::DisarmCrashes() {
  dynmig::MutexLock lock(&crash_mu_);
  armed_.clear();
}

absl::StatusOr<int> LocalCluster::CrashSchedulerLeader() {
  dynmig::MutexLock lock(&mu_);
  Replica* target = RouteTarget();
  if (target == nullptr) return absl::FailedPreconditionError("no scheduler replica runs");
  // The process is gone: no request of it reaches the API server any more (so a leader does not
  // hand its Lease back: the others wait out the lease), and nobody can call it.
  target->client->Fence();
  StopReplicaLocked(*target);
  RouteLocked();
  Log(fmt::format("scheduler-{}: crashed", target->index));
  dynmig::MutexLock crash(&crash_mu_);
  ++crashes_["scheduler crash"];
  crashed_replicas_.push_back(target->index);
  crash_cv_.SignalAll();
  return target->index;
}

std::map<std::string, int64_t> LocalCluster::Crashes() const {
  dynmig::MutexLock lock(&crash_mu_);
  return crashes_;
}

bool LocalCluster::CrashesRestarted() const {
  dynmig::MutexLock lock(&crash_mu_);
  return crashed_plugins_.empty() && crashed_replicas_.empty() && !supervising_;
}

void LocalCluster::Supervise() {
  CrashBatch batch;
  while (NextCrashes(&batch)) {
    RestartCrashed(batch);
    dynmig::MutexLock lock(&crash_mu_);
    supervising_ = false;
  }
}

bool LocalCluster::NextCrashes(CrashBatch* batch) {
  dynmig::MutexLock lock(&crash_mu_);
  while (!supervisor_stop_ && crashed_plugins_.empty() && crashed_replicas_.empty()) {
    crash_cv_.Wait(&crash_mu_);
  }
  if (supervisor_stop_) return false;
  batch->plugins = std::exchange(crashed_plugins_, {});
  batch->replicas = std::exchange(crashed_replicas_, {});
  supervising_ = true;
  return true;
}

void LocalCluster::RestartCrashed(const CrashBatch& batch) {
  for (const auto& node : batch.plugins) {
    // The crashed process is gone; its replacement recovers from the state file and NVML.
    absl::Status st = StopDevicePlugin(node);
    if (st.ok()) st = StartDevicePlugin(node);
    if (!st.ok())
      Log(fmt::format("{}/device-plugin: restart after a crash: {}", node,
                      std::string(st.message())));
  }
  for (int index : batch.replicas) {
    dynmig::MutexLock lock(&mu_);
    if (stopped_) break;
    Replica& r = *replicas_[static_cast<size_t>(index)];
    absl::Status st = StartSchedulerLocked(r);
    if (st.ok() && !r.server->WaitUntilReady(absl::Seconds(30)))
      st = absl::DeadlineExceededError("caches did not sync");
    RouteLocked();
    if (!st.ok())
      Log(fmt::format("scheduler-{}: restart after a crash: {}", index, std::string(st.message())));
  }
}

absl::StatusOr<std::unique_ptr<nvml::SimNvml>> LocalCluster::OpenNvml(std::string_view node) const {
  if (FindNode(node) == nullptr) return absl::NotFoundError(fmt::format("no node {}", node));
  nvml::SimNvmlOptions o;
  o.state_file = nvml_state_file(node);
  o.seed = std::string(node);
  return nvml::SimNvml::Create(std::move(o));
}

absl::StatusOr<std::vector<LiveInstance>> LocalCluster::Instances(std::string_view node) const {
  auto sim = OpenNvml(node);
  if (!sim.ok()) return sim.status();
  nvml::Nvml& n = **sim;
  auto count = n.DeviceCount();
  if (!count.ok()) return count.status();
  std::vector<LiveInstance> out;
  for (uint32_t g = 0; g < *count; ++g) {
    auto gpu = n.GetGpu(g);
    if (!gpu.ok()) return gpu.status();
    if (!gpu->mig.current) continue;  // MIG off (a whole GPU, issue 31): NVML lists no instance
    auto gis = n.ListGpuInstances(g);
    if (!gis.ok()) return gis.status();
    for (const auto& gi : *gis) {
      auto cis = n.ListComputeInstances(g, gi.id);
      if (!cis.ok()) return cis.status();
      for (const auto& ci : *cis) {
        LiveInstance li;
        li.gpu_uuid = gpu->uuid;
        li.gpu_index = g;
        li.gi_id = gi.id;
        li.ci_id = ci.id;
        li.gi_profile_id = gi.profile_id;
        li.placement = gi.placement;
        li.mig_uuid = ci.mig_uuid;
        auto procs = n.GetMigDeviceProcesses(g, gi.id, ci.id);
        if (procs.ok()) li.processes = procs->size();
        out.push_back(std::move(li));
      }
    }
  }
  return out;
}

absl::StatusOr<int> LocalCluster::EndProcesses(std::string_view node,
                                               std::string_view mig_uuid) const {
  auto sim = OpenNvml(node);
  if (!sim.ok()) return sim.status();
  return EndProcessesOn(**sim, mig_uuid);
}

}  // namespace dynmig::local
