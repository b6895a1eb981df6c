#include "local/chaos.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <set>

#include "common/bounded_json.h"
#include "deviceplugin/plugin_core.h"
#include "deviceplugin/test_kubelet.h"
#include "fmt/format.h"
#include "kube/in_memory_api_server.h"
#include "kube/kube_client.h"
#include "kube/object.h"
#include "local/local_cluster.h"
#include "local/node_agent.h"
#include "protocol/annotations.h"
#include "protocol/gpu_mode_switch.h"
#include "protocol/held_slices.h"
#include "protocol/mig_allocations.h"
#include "protocol/node_register.h"

namespace dynmig::local {
namespace {

using nlohmann::json;

// A TCP port free on 127.0.0.1 now, for the device plugins' /nvml listeners.
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

// NVML operations a fault is injected into: every call the device plugin makes to create,
// verify, reclaim or adopt instances.
constexpr const char* kNvmlFaultOps[] = {
    "CreateGpuInstance",      "CreateComputeInstance",
    "DestroyComputeInstance", "DestroyGpuInstance",
    "ListGpuInstances",       "ListComputeInstances",
    "GetMigDeviceUuid",       "GetComputeProcesses",
    "GetMigDeviceProcesses",  "GetGpuInstancePossiblePlacements"};

// The components whose API requests get faults (never the checker's own admin client).
constexpr std::string_view kFaultUsers[] = {kSchedulerUser, kDevicePluginUser, kKubeSchedulerUser};

// Where a device plugin's Allocate can crash (deviceplugin/plugin_core.h).
constexpr std::string_view kCrashPoints[] = {
    deviceplugin::kCrashAfterIntent, deviceplugin::kCrashAfterGpuInstance,
    deviceplugin::kCrashAfterComputeInstance, deviceplugin::kCrashBeforeRollback,
    deviceplugin::kCrashAfterAnnotation};
// Where a MIG mode switch can crash (deviceplugin/plugin_options.h), with mode_switches.
constexpr std::string_view kModeCrashPoints[] = {
    deviceplugin::kCrashModeBeforeSet, deviceplugin::kCrashModeAfterSet,
    deviceplugin::kCrashModeBeforeReset, deviceplugin::kCrashModeBeforeSetBack,
    deviceplugin::kCrashModeBeforePublish};

// The components give up on an API request after this; a timeout fault delays one beyond it.
constexpr absl::Duration kApiRequestTimeout = absl::Seconds(3);
// Reservations expire after this (short, so that expiry happens on its own and clock jumps
// cross it).
constexpr absl::Duration kReservationTtl = absl::Seconds(30);

class Chaos {
 public:
  Chaos(const ChaosOptions& options, const Clock& clock)
      : o_(options),
        base_clock_(clock),
        clock_(clock),
        actions_rng_(options.seed),
        rng_(options.seed ^ 0x9e3779b97f4a7c15ULL) {
    report_.seed = options.seed;
  }

  absl::StatusOr<ChaosReport> Run() {
    if (o_.state_dir.empty())
      return absl::InvalidArgumentError("chaos: a state directory is required");
    std::error_code ec;
    // Never someone's data: a new directory (removed at the end) or an empty one (left as is).
    const bool created = !std::filesystem::exists(o_.state_dir, ec);
    if (!created && !std::filesystem::is_empty(o_.state_dir, ec)) {
      return absl::InvalidArgumentError(fmt::format(
          "chaos: the state directory {} is not empty; give a new or an empty one", o_.state_dir));
    }
    auto nodes = ParseNodes(o_.nodes);
    if (!nodes.ok()) return nodes.status();
    LocalClusterOptions c;
    c.api_port = 0;
    c.nodes = *nodes;
    c.state_dir = o_.state_dir;
    c.node_address_prefix = fmt::format("127.2.{}.", ::getpid() % 250);
    c.nvml_port = FreePort();
    c.reconcile_interval = absl::Milliseconds(300);
    c.register_interval = absl::Seconds(1);
    c.scheduler_timing = SchedulingQueueTiming{}.Scaled(20);
    c.expiry_interval = absl::Seconds(2);
    c.reservation_ttl = kReservationTtl;
    c.api_request_timeout = kApiRequestTimeout;
    // Two scheduler replicas under leader election, on timings short enough that a crashed
    // leader's Lease runs out within a few steps.
    c.scheduler_replicas = 2;
    c.election.lease_duration = absl::Seconds(3);
    c.election.renew_deadline = absl::Seconds(2);
    c.election.retry_period = absl::Milliseconds(500);
    c.scheduler_clock = &clock_;
    c.log = o_.component_log;
    if (o_.mode_switches) {
      c.device_config_yaml = protocol::DefaultDeviceConfigYaml();
      if (!c.device_config_yaml.empty() && c.device_config_yaml.back() != '\n')
        c.device_config_yaml += '\n';
      c.device_config_yaml += "  migModeSwitching: {enabled: true}\n";
      auto parsed = protocol::ParseDeviceConfig(c.device_config_yaml);
      if (!parsed.ok() || !parsed->mig_mode_switching.enabled) {
        return absl::InternalError(
            "chaos: cannot turn nvidia.migModeSwitching on in the default "
            "device config");
      }
    }
    if (o_.handover) {
      c.legacy_geometry[nodes->front().name] = o_.handover_geometry;
      c.nvidia_standin_nodes = {nodes->front().name};
      c.device_plugins_stopped = {nodes->front().name};
    }
    auto cluster = LocalCluster::Start(c);
    if (!cluster.ok()) return cluster.status();
    cluster_ = std::move(*cluster);
    auto client = cluster_->Client(kAdminUser);
    if (!client.ok()) return client.status();
    kube_ = std::move(*client);
    for (const auto& n : cluster_->nodes()) node_names_.push_back(n.name);
    if (o_.handover) {
      if (auto st = HandOver(); !st.ok()) return st;
    }

    Log(fmt::format("chaos: seed {}, {} of random work on {}", o_.seed,
                    absl::FormatDuration(o_.duration), o_.nodes));
    const absl::Duration end = base_clock_.Monotonic() + o_.duration;
    while (base_clock_.Monotonic() < end) {
      ++step_;
      Act();
      Check();
      base_clock_.SleepFor(o_.step);
    }
    report_.steps = step_;
    Quiesce();
    for (const auto& [what, n] : cluster_->Crashes()) report_.actions[what] += n;
    kube_.reset();
    cluster_->Stop();
    cluster_.reset();
    if (created) std::filesystem::remove_all(o_.state_dir, ec);
    return report_;
  }

 private:
  size_t Pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  void Log(const std::string& line) {
    if (o_.log) o_.log(line);
  }
  void Count(const std::string& action) { ++report_.actions[action]; }
  void Violation(const std::string& what) {
    report_.violations.push_back({o_.seed, step_, what});
    Log(fmt::format("chaos: VIOLATION (seed {}, step {}): {}", o_.seed, step_, what));
  }

  // ---- the workload and the faults ----

  // ---- handover ----

  // Legacy pods on the first node's instances under NVIDIA's stand-in, then dynmig takes over.
  absl::Status HandOver() {
    const std::string& node = node_names_.front();
    deviceplugin::TestKubelet* kubelet = cluster_->kubelet(node);
    int n = 0;
    for (const auto& resource : kubelet->resources()) {
      if (resource.rfind(protocol::kMigResourcePrefix, 0) != 0) continue;
      for (size_t i = 0; i < kubelet->devices(resource).size(); ++i) {
        const std::string name = fmt::format("legacy-{}", n++);
        const json pod = {
            {"apiVersion", "v1"},
            {"kind", "Pod"},
            {"metadata", {{"name", name}, {"namespace", "default"}}},
            {"spec",
             {{"restartPolicy", "Never"},
              {"nodeSelector", {{"kubernetes.io/hostname", node}}},
              {"containers", json::array({{{"name", "main"},
                                           {"image", "ubuntu:22.04"},
                                           {"command", json::array({"sleep", "3600"})},
                                           {"resources", {{"limits", {{resource, 1}}}}}}})}}}};
        if (auto created = kube_->CreatePod(pod); !created.ok()) return created.status();
      }
    }
    const absl::Duration deadline = base_clock_.Monotonic() + absl::Seconds(60);
    while (legacy_.size() < static_cast<size_t>(n)) {
      if (base_clock_.Monotonic() > deadline) {
        return absl::DeadlineExceededError(fmt::format(
            "chaos: {} of {} legacy pods ran under NVIDIA's stand-in", legacy_.size(), n));
      }
      base_clock_.SleepFor(absl::Milliseconds(100));
      auto pods = kube_->ListPods({.ns = "default"});
      if (!pods.ok()) continue;
      for (const auto& p : pods->items) {
        auto visible = kube::Annotation(p, kVisibleDevicesAnnotation);
        if (kube::Phase(p) != "Running" || !visible) continue;
        const auto v = ParseBoundedJson(*visible, kAnnotationJsonLimits, kVisibleDevicesAnnotation);
        if (v.ok() && v->contains("main") && (*v)["main"].is_string())
          legacy_[kube::Name(p)] = (*v)["main"].get<std::string>();
      }
    }
    if (auto st = cluster_->StopNvidiaStandin(node); !st.ok()) return st;
    if (auto st = cluster_->StartDevicePlugin(node); !st.ok()) return st;
    report_.actions["legacy pods"] = n;
    Log(fmt::format("chaos: {} legacy pods run on {}; dynmig's device plugin took it over", n,
                    node));
    return absl::OkStatus();
  }

  void RestartKubelet() {
    const std::string& node = node_names_.front();
    Count("restart kubelet");
    if (auto st = cluster_->kubelet(node)->Restart(); !st.ok())
      Log(fmt::format("chaos: restart of {}'s kubelet: {}", node, std::string(st.message())));
  }

  // As `dynmig gpu mode` does: one request for a random GPU of a random node, the others kept.
  void ModeRequest() {
    const std::string& name = node_names_[Pick(node_names_.size())];
    const bool to_mig = Chance(0.5);
    auto node = kube_->GetNode(name);
    if (!node.ok()) return;
    auto gpus = protocol::DecodeNodeRegister(
        kube::Annotation(*node, protocol::kNodeRegisterAnnotation).value_or("[]"));
    if (!gpus.ok() || gpus->empty()) return;
    const std::string uuid = (*gpus)[Pick(gpus->size())].id;
    auto requests = protocol::DecodeGpuModeRequests(
        kube::Annotation(*node, protocol::kGpuModeRequestAnnotation).value_or(""));
    std::vector<protocol::GpuModeRequest> next;
    if (requests.ok()) {
      for (const auto& r : *requests) {
        if (r.gpu_uuid != uuid) next.push_back(r);
      }
    }
    next.push_back({uuid, to_mig ? protocol::GpuMode::kMig : protocol::GpuMode::kWholeGpu,
                    absl::ToUnixMillis(base_clock_.Now()) + step_, "operator:chaos", "chaos"});
    kube::KeyPatch patch;
    patch[std::string(protocol::kGpuModeRequestAnnotation)] = protocol::EncodeGpuModeRequests(next);
    if (kube_->PatchNodeAnnotations(name, patch, kube::ResourceVersion(*node)).ok())
      Count(to_mig ? "mode request mig" : "mode request hami-core");
  }

  void Act() {
    if (o_.handover && Chance(0.04)) RestartKubelet();
    if (o_.mode_switches && Chance(0.08)) ModeRequest();
    // The kind of action comes from its own stream, one draw per step, so step k does the same
    // kind of thing in every run of a seed however the timing shifts the other draws.
    const size_t roll = std::uniform_int_distribution<size_t>(0, 99)(actions_rng_);
    if (roll < 36) {
      CreatePod();
    } else if (roll < 58) {
      DeletePod();
    } else if (roll < 68) {
      NvmlFault();
    } else if (roll < 75) {
      ApiFault();
    } else if (roll < 77) {
      ApiTimeout();
    } else if (roll < 79) {
      cluster_->api().CutWatches();  // informers re-watch from where they were
      Count("watch-cut");
    } else if (roll < 81) {
      // The history compacted first: the re-watch gets 410 Gone and the informers relist.
      cluster_->api().CompactHistory();
      cluster_->api().CutWatches();
      Count("watch-410-relist");
    } else if (roll < 82) {
      ApiOutage();
    } else if (roll < 87) {
      const std::string& node = node_names_[Pick(node_names_.size())];
      const bool mode = o_.mode_switches && Chance(0.5);
      const std::string_view point = mode ? kModeCrashPoints[Pick(std::size(kModeCrashPoints))]
                                          : kCrashPoints[Pick(std::size(kCrashPoints))];
      if (cluster_->ArmDevicePluginCrash(node, point).ok())
        Count(fmt::format("crash armed {}", point));
    } else if (roll < 89) {
      ClockJump();
    } else if (roll < 93) {
      const std::string& node = node_names_[Pick(node_names_.size())];
      auto st = cluster_->RestartDevicePlugin(node);
      Count("restart device-plugin");
      if (!st.ok())
        Log(fmt::format("chaos: restart of {}'s device plugin: {}", node,
                        std::string(st.message())));
    } else if (roll < 96) {
      (void)cluster_->CrashSchedulerLeader();  // counted by the cluster ("scheduler crash")
    } else {
      Count("restart scheduler");
      auto stopped = cluster_->StopScheduler();
      auto started = cluster_->StartScheduler();
      if (!stopped.ok() || !started.ok()) {
        Log(fmt::format("chaos: scheduler restart: {} / {}", std::string(stopped.message()),
                        std::string(started.message())));
      }
    }
  }

  json Container(const std::string& name, bool percentage, int gpus, const std::string& command) {
    static constexpr int64_t kMemories[] = {4000, 9000, 19000, 39000, 70000};
    static constexpr int64_t kPercents[] = {10, 25, 50, 100};
    json limits = {{std::string(protocol::kResourceCount), gpus}};
    if (percentage) {
      limits[std::string(protocol::kResourceMemoryPercentage)] =
          kPercents[Pick(std::size(kPercents))];
    } else {
      limits[std::string(protocol::kResourceMemory)] = kMemories[Pick(std::size(kMemories))];
    }
    return {{"name", name},
            {"image", "ubuntu:22.04"},
            {"command", json::array({"bash", "-c", command})},
            {"resources", {{"limits", limits}}}};
  }

  void CreatePod() {
    auto pods = kube_->ListPods({.ns = "default"});
    if (pods.ok() && pods->items.size() >= o_.max_pods) return;
    // Names come from a small pool, so a deleted pod's name comes back (StatefulSet-style).
    const std::string name = fmt::format("chaos-{}", Pick(2 * o_.max_pods));
    const std::string command =
        Chance(0.3) ? fmt::format("sleep {}", 1 + Pick(3)) : std::string("sleep 3600");
    json annotations = {
        {std::string(protocol::kVgpuModeAnnotation), std::string(protocol::kVgpuModeMig)}};
    if (Chance(0.2)) {
      static constexpr const char* kPreferences[] = {"1g", "2g", "3g", "1g.5gb,2g.10gb", "1g.10gb"};
      annotations[std::string(protocol::kMigProfilePreferenceAnnotation)] =
          kPreferences[Pick(std::size(kPreferences))];
    }
    // One draw per statement: argument evaluation order is unspecified, the sequence must not be.
    const bool by_percentage = Chance(0.3);
    const int gpus = Chance(0.15) ? 2 : 1;
    json containers = json::array({Container("workload", by_percentage, gpus, command)});
    if (Chance(0.15)) {
      const bool sidecar_by_percentage = Chance(0.5);
      containers.push_back(Container("sidecar", sidecar_by_percentage, 1, command));
    }
    json spec = {{"restartPolicy", "Never"}, {"containers", containers}};
    if (Chance(0.1)) spec["initContainers"] = json::array({Container("init", false, 1, "sleep 0")});
    const json pod = {
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", {{"name", name}, {"namespace", "default"}, {"annotations", annotations}}},
        {"spec", spec}};
    auto created = kube_->CreatePod(pod);
    if (created.ok()) {
      ++report_.pods_created;
      Count("create");
    } else {
      Count(absl::IsAlreadyExists(created.status()) ? "create (name in use)" : "create refused");
    }
  }

  void DeletePod() {
    auto pods = kube_->ListPods({.ns = "default"});
    if (!pods.ok() || pods->items.empty()) return;
    const json& pod = pods->items[Pick(pods->items.size())];
    const std::string phase = kube::Phase(pod);
    auto deleted = kube_->DeletePod("default", kube::Name(pod));
    Count(fmt::format("delete {}", phase.empty() ? "Pending" : phase));
    if (!deleted.ok() && !absl::IsNotFound(deleted.status())) {
      Log(fmt::format("chaos: delete {}: {}", kube::Name(pod),
                      std::string(deleted.status().message())));
    }
  }

  void NvmlFault() {
    const std::string& node = node_names_[Pick(node_names_.size())];
    auto nvml = cluster_->OpenNvml(node);
    if (!nvml.ok()) return;
    nvml::SimFault f;
    f.op = kNvmlFaultOps[Pick(std::size(kNvmlFaultOps))];
    f.nth = 1 + static_cast<uint32_t>(Pick(3));
    f.times = 1 + static_cast<uint32_t>(Pick(2));
    f.code = Chance(0.5) ? nvml::NvmlReturn::kUnknown : nvml::NvmlReturn::kGpuIsLost;
    if ((*nvml)->InjectFault(f).ok()) Count("nvml-fault " + f.op);
  }

  void ApiFault() {
    static constexpr int kStatuses[] = {500, 503, 409, 429};
    static constexpr const char* kMethods[] = {"", "GET", "PATCH", "PUT", "POST"};
    static constexpr const char* kPaths[] = {"", "/api/v1/namespaces/default/pods", "/api/v1/pods",
                                             "/api/v1/nodes"};
    kube::FaultSpec f;
    f.user = std::string(kFaultUsers[Pick(std::size(kFaultUsers))]);
    f.method = kMethods[Pick(std::size(kMethods))];
    f.path_prefix = kPaths[Pick(std::size(kPaths))];
    f.status = kStatuses[Pick(std::size(kStatuses))];
    if (f.status == 429) f.retry_after_seconds = 1;
    f.count = 1 + static_cast<int>(Pick(3));
    f.message = "chaos: injected";
    cluster_->api().AddFault(f);
    Count(fmt::format("api-fault {}", f.status));
  }

  // A request of a component held beyond its client's timeout: the client gives up (and retries)
  // while the API server still carries the request out afterwards.
  void ApiTimeout() {
    static constexpr const char* kMethods[] = {"", "GET", "PATCH", "PUT", "POST", "DELETE"};
    kube::FaultSpec f;
    f.user = std::string(kFaultUsers[Pick(std::size(kFaultUsers))]);
    f.method = kMethods[Pick(std::size(kMethods))];
    f.action = kube::FaultSpec::Action::kDelay;
    f.latency = kApiRequestTimeout + absl::Milliseconds(500 + 500 * static_cast<int64_t>(Pick(3)));
    f.count = 1 + static_cast<int>(Pick(2));
    cluster_->api().AddFault(f);
    Count("api-timeout");
  }

  // Every request of everyone (the checker's too) answered 503 for some seconds.
  void ApiOutage() {
    kube::FaultSpec f;
    f.count = -1;
    f.status = 503;
    f.window = absl::Seconds(2 + static_cast<int64_t>(Pick(4)));
    f.message = "chaos: API outage";
    cluster_->api().AddFault(f);
    Count("api-outage");
  }

  // The scheduler's clock steps to a new offset: past the reservation TTL (reservations expire at
  // once), half of it, back to true time, or behind it.
  void ClockJump() {
    const absl::Duration kOffsets[] = {kReservationTtl + absl::Seconds(10), kReservationTtl / 2,
                                       absl::ZeroDuration(), absl::Seconds(-10)};
    const absl::Duration before = clock_.offset();
    const absl::Duration after = kOffsets[Pick(std::size(kOffsets))];
    if (after == before) return;
    clock_.set_offset(after);
    Count(after > before ? "clock-jump forward" : "clock-jump back");
  }

  // ---- the invariants ----

  struct Live {
    std::string node;
    LiveInstance instance;
  };

  bool ReadLive(std::vector<Live>* out) {
    for (const auto& node : node_names_) {
      auto live = cluster_->Instances(node);
      if (!live.ok()) {
        Log(fmt::format("chaos: reading {}'s NVML state: {}", node,
                        std::string(live.status().message())));
        return false;
      }
      for (auto& li : *live) out->push_back({node, li});
    }
    return true;
  }

  static std::vector<protocol::MigAllocation> Allocations(const json& pod) {
    auto value = kube::Annotation(pod, protocol::kMigAllocationsAnnotation);
    if (!value) return {};
    auto decoded = protocol::DecodeMigAllocations(*value);
    return decoded.ok() ? *decoded : std::vector<protocol::MigAllocation>{};
  }

  // A legacy pod Running before and after the NVML read keeps its instance, and no other pod's
  // reservation overlaps it.
  void CheckLegacy(const std::string& name, const std::vector<Live>& live,
                   const std::vector<json>& after) {
    const std::string& uuid = legacy_.at(name);
    const Live* found = nullptr;
    for (const auto& l : live) {
      if (l.instance.mig_uuid == uuid) found = &l;
    }
    if (found == nullptr) {
      Violation(fmt::format("running legacy pod {} lost its instance {}", name, uuid));
      return;
    }
    for (const auto& pod : after) {
      if (kube::IsTerminated(pod)) continue;
      for (const auto& a : Allocations(pod)) {
        if (a.gpu_uuid == found->instance.gpu_uuid &&
            a.placement.Overlaps(found->instance.placement)) {
          Violation(fmt::format("pod {} reserves {} {}, overlapping legacy pod {}'s instance {}",
                                kube::Name(pod), a.gpu_uuid, a.placement.ToString(), name, uuid));
        }
      }
    }
  }

  void Check() {
    auto before = kube_->ListPods({.ns = "default"});
    std::vector<Live> live;
    if (!before.ok() || !ReadLive(&live)) return;
    auto after = kube_->ListPods({.ns = "default"});
    if (!after.ok()) return;
    ++report_.checks;

    // No two live instances overlap.
    for (size_t i = 0; i < live.size(); ++i) {
      for (size_t j = i + 1; j < live.size(); ++j) {
        const LiveInstance& a = live[i].instance;
        const LiveInstance& b = live[j].instance;
        if (a.gpu_uuid == b.gpu_uuid && a.placement.Overlaps(b.placement)) {
          Violation(fmt::format("instances {} ({}) and {} ({}) overlap on {}", a.mig_uuid,
                                a.placement.ToString(), b.mig_uuid, b.placement.ToString(),
                                a.gpu_uuid));
        }
      }
    }

    // A pod Running (and not being deleted) before and after the NVML read has its instances.
    std::map<std::string, const json*> after_by_uid;
    for (const auto& p : after->items) after_by_uid[kube::Uid(p)] = &p;
    for (const auto& pod : before->items) {
      if (kube::Phase(pod) != "Running" || kube::IsBeingDeleted(pod)) continue;
      auto it = after_by_uid.find(kube::Uid(pod));
      if (it == after_by_uid.end() || kube::Phase(*it->second) != "Running" ||
          kube::IsBeingDeleted(*it->second)) {
        continue;
      }
      if (seen_running_.insert(kube::Uid(pod)).second) ++report_.pods_running_seen;
      const std::string name = kube::Name(pod);
      if (legacy_.contains(name)) {  // no annotation: NVIDIA's allocator gave it its instance
        CheckLegacy(name, live, after->items);
        continue;
      }
      std::set<std::string> own;
      for (const auto& a : Allocations(*it->second)) {
        if (!a.runtime) continue;
        own.insert(a.runtime->mig_uuid);
        const Live* found = nullptr;
        for (const auto& l : live) {
          if (l.instance.mig_uuid == a.runtime->mig_uuid) found = &l;
        }
        if (found == nullptr) {
          Violation(fmt::format("running pod {} lost its instance {} ({} {})", name,
                                a.runtime->mig_uuid, a.gpu_uuid, a.placement.ToString()));
        } else if (found->instance.gpu_uuid != a.gpu_uuid ||
                   found->instance.placement != a.placement) {
          Violation(fmt::format("running pod {}: {} is on {} {}, its annotation says {} {}", name,
                                a.runtime->mig_uuid, found->instance.gpu_uuid,
                                found->instance.placement.ToString(), a.gpu_uuid,
                                a.placement.ToString()));
        }
      }
      auto visible = kube::Annotation(*it->second, kVisibleDevicesAnnotation);
      if (!visible) continue;
      const auto v = ParseBoundedJson(*visible, kAnnotationJsonLimits, kVisibleDevicesAnnotation);
      if (!v.ok() || !v->is_object()) continue;
      for (const auto& [container, devices] : v->items()) {
        if (!devices.is_string()) continue;
        const std::string text = devices.get<std::string>();
        for (size_t at = text.find("MIG-"); at != std::string::npos;
             at = text.find("MIG-", at + 1)) {
          const std::string uuid = text.substr(at, text.find(',', at) - at);
          if (!own.contains(uuid)) {
            Violation(fmt::format("pod {} container {} sees {}, which its annotation does not name",
                                  name, container, uuid));
          }
        }
      }
    }

    if (o_.mode_switches) CheckModes(live, *before, *after);

    // No two reservations share a slice.
    struct Reserved {
      std::string pod;
      protocol::MigAllocation a;
    };
    std::vector<Reserved> reserved;
    for (const auto& pod : after->items) {
      if (kube::IsTerminated(pod)) continue;
      for (auto& a : Allocations(pod)) reserved.push_back({kube::Name(pod), a});
    }
    for (size_t i = 0; i < reserved.size(); ++i) {
      for (size_t j = i + 1; j < reserved.size(); ++j) {
        const auto& a = reserved[i];
        const auto& b = reserved[j];
        if (a.pod != b.pod && a.a.gpu_uuid == b.a.gpu_uuid &&
            a.a.placement.Overlaps(b.a.placement)) {
          Violation(fmt::format("pods {} and {} both reserve {} {} / {}", a.pod, b.pod,
                                a.a.gpu_uuid, a.a.placement.ToString(), b.a.placement.ToString()));
        }
      }
    }
  }

  // MIG modes: no live instance on a GPU with MIG off; a pod Running before and after the read
  // is on GPUs whose MIG mode is on and not pending a change (nothing in use is ever switched).
  void CheckModes(const std::vector<Live>& live, const kube::ObjectList& before,
                  const kube::ObjectList& after) {
    std::map<std::string, nvml::MigModeState> modes;  // by GPU UUID
    for (const auto& node : node_names_) {
      auto nvml = cluster_->OpenNvml(node);
      if (!nvml.ok()) return;
      auto count = (*nvml)->DeviceCount();
      if (!count.ok()) return;
      for (uint32_t i = 0; i < *count; ++i) {
        auto gpu = (*nvml)->GetGpu(i);
        if (!gpu.ok()) return;  // an injected fault: no verdict this round
        modes[gpu->uuid] = gpu->mig;
      }
    }
    for (const auto& [uuid, m] : modes) {
      if (m.current != m.pending) continue;
      auto [seen, fresh] = last_mig_.try_emplace(uuid, m.current);
      if (!fresh && seen->second != m.current) {
        Count(m.current ? "mode switched to mig" : "mode switched to hami-core");
        seen->second = m.current;
      }
    }
    for (const auto& l : live) {
      auto it = modes.find(l.instance.gpu_uuid);
      if (it != modes.end() && !it->second.current) {
        Violation(fmt::format("instance {} lives on {}, whose MIG mode is off", l.instance.mig_uuid,
                              l.instance.gpu_uuid));
      }
    }
    std::set<std::string> running_before;
    for (const auto& p : before.items) {
      if (kube::Phase(p) == "Running" && !kube::IsBeingDeleted(p))
        running_before.insert(kube::Uid(p));
    }
    for (const auto& p : after.items) {
      if (kube::Phase(p) != "Running" || !running_before.contains(kube::Uid(p))) continue;
      for (const auto& a : Allocations(p)) {
        auto it = modes.find(a.gpu_uuid);
        if (it != modes.end() && (!it->second.current || !it->second.pending)) {
          Violation(
              fmt::format("running pod {} is on {}, whose MIG mode was switched (current "
                          "{}, pending {})",
                          kube::Name(p), a.gpu_uuid, it->second.current, it->second.pending));
        }
      }
    }
  }

  // ---- quiescence ----

  void Quiesce() {
    Log(fmt::format("chaos: {} steps done; faults off, deleting every pod", step_));
    cluster_->api().ClearFaults();
    cluster_->DisarmCrashes();
    clock_.set_offset(absl::ZeroDuration());
    for (int i = 0; i < 300 && !cluster_->CrashesRestarted(); ++i)
      base_clock_.SleepFor(absl::Milliseconds(100));
    for (const auto& node : node_names_) {
      if (auto nvml = cluster_->OpenNvml(node); nvml.ok()) (void)(*nvml)->ClearFaults();
      if (!cluster_->DevicePluginRunning(node)) (void)cluster_->StartDevicePlugin(node);
    }
    if (!cluster_->SchedulerRunning()) (void)cluster_->StartScheduler();
    const absl::Duration start = base_clock_.Monotonic();
    const absl::Duration deadline = start + o_.quiesce_timeout;
    std::string remaining;
    while (true) {
      remaining = Remaining();
      if (remaining.empty() || base_clock_.Monotonic() >= deadline) break;
      base_clock_.SleepFor(absl::Milliseconds(200));
    }
    report_.quiesce_time = base_clock_.Monotonic() - start;
    if (!remaining.empty()) {
      step_ = -1;
      Violation(fmt::format("after {} without faults: {}", absl::FormatDuration(o_.quiesce_timeout),
                            remaining));
    }
  }

  // What is left ("" when nothing): pods (deleted again on every call), instances, locks, holds.
  std::string Remaining() {
    std::vector<std::string> left;
    auto pods = kube_->ListPods({.ns = "default"});
    if (!pods.ok()) return "pods cannot be listed";
    for (const auto& p : pods->items) {
      left.push_back("pod " + kube::Name(p));
      if (!kube::IsBeingDeleted(p)) (void)kube_->DeletePod("default", kube::Name(p));
    }
    std::vector<Live> live;
    if (!ReadLive(&live)) return "NVML cannot be read";
    for (const auto& l : live) {
      left.push_back(fmt::format("instance {} on {} {} ({} processes)", l.instance.mig_uuid, l.node,
                                 l.instance.placement.ToString(), l.instance.processes));
    }
    for (const auto& node : node_names_) {
      auto n = kube_->GetNode(node);
      if (!n.ok()) continue;
      if (auto lock = kube::Annotation(*n, protocol::kNodeLockAnnotation))
        left.push_back(fmt::format("lock on {} ({})", node, *lock));
      if (o_.mode_switches) {
        if (auto nvml = cluster_->OpenNvml(node); nvml.ok()) {
          for (uint32_t i = 0; i < (*nvml)->DeviceCount().value_or(0); ++i) {
            auto m = (*nvml)->GetMigMode(i);
            if (m.ok() && m->current != m->pending)
              left.push_back(fmt::format("GPU {} of {} has a pending MIG mode", i, node));
          }
        }
      }
      if (auto held = kube::Annotation(*n, protocol::kNodeHeldSlicesAnnotation)) {
        auto decoded = protocol::DecodeHeldSlices(*held);
        if (!decoded.ok() || !decoded->empty())
          left.push_back("held slices on " + node + ": " + *held);
      }
    }
    std::string out;
    for (const auto& l : left) out += (out.empty() ? "" : "; ") + l;
    return out;
  }

  // mode_switches: each GPU's MIG mode as the last check saw it settled (switches counted).
  std::map<std::string, bool> last_mig_;
  const ChaosOptions& o_;
  const Clock& base_clock_;  // the steps, the waits
  // The scheduler's clock: base_clock_ plus an offset that the chaos steps (an NTP step, a VM
  // resumed from suspension). The offset stays within [-10 s, TTL + 10 s], well inside the node
  // lock's 5-minute expiry, as two machines' clocks do after the step. Outlives cluster_ (declared
  // before it).
  SteppedClock clock_;
  std::mt19937_64 actions_rng_;
  std::mt19937_64 rng_;  // everything else
  ChaosReport report_;
  int64_t step_ = 0;
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<kube::KubeClient> kube_;
  std::vector<std::string> node_names_;
  std::set<std::string> seen_running_;
  std::map<std::string, std::string> legacy_;  // legacy pod name -> its MIG UUID
};

}  // namespace

int64_t ChaosReport::Total(std::string_view prefix) const {
  int64_t n = 0;
  for (const auto& [action, count] : actions) {
    if (action.starts_with(prefix)) n += count;
  }
  return n;
}

std::string ChaosReport::Summary() const {
  std::string out = fmt::format(
      "chaos seed {}: {} steps, {} pods created, {} seen running, {} invariant checks, quiescent "
      "after {}\n",
      seed, steps, pods_created, pods_running_seen, checks, absl::FormatDuration(quiesce_time));
  out += fmt::format(
      "faults: {} NVML errors, {} API errors, {} API timeouts, {} API outages, {} watch cuts, {} "
      "410 relists, {} device-plugin crashes ({} armed), {} scheduler leader crashes, {} clock "
      "jumps\n",
      Total("nvml-fault"), Total("api-fault"), Total("api-timeout"), Total("api-outage"),
      Total("watch-cut"), Total("watch-410-relist"), Total("device-plugin crash"),
      Total("crash armed"), Total("scheduler crash"), Total("clock-jump"));
  out += fmt::format("restarts: {} device-plugin, {} scheduler, and every crashed process once\n",
                     Total("restart device-plugin"), Total("restart scheduler"));
  for (const auto& [action, n] : actions) out += fmt::format("  {:<40} {}\n", action, n);
  if (violations.empty()) {
    out += "0 violations\n";
  } else {
    out += fmt::format("{} violations:\n", violations.size());
    for (const auto& v : violations) {
      out += fmt::format("  seed {} step {}: {}\n", v.seed,
                         v.step < 0 ? std::string("quiescence") : std::to_string(v.step), v.what);
    }
  }
  return out;
}

absl::StatusOr<ChaosReport> RunChaos(const ChaosOptions& options, const Clock& clock) {
  return Chaos(options, clock).Run();
}

}  // namespace dynmig::local
