#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "common/clock.h"
#include "common/mutex.h"
#include "fmt/format.h"
#include "kube/in_memory_api_server.h"
#include "kube/rest_kube_client.h"
#include "local/local_cluster.h"
#include "local/node_agent.h"
#include "local/scheduler_loop.h"

namespace dynmig::local {
namespace {

using nlohmann::json;

constexpr char kConfig[] = R"(apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
  - schedulerName: dynmig-scheduler
extenders:
  - urlPrefix: "https://dynmig-scheduler.dynmig-system.svc:443"
    filterVerb: filter
    bindVerb: bind
    nodeCacheCapable: true
    enableHTTPS: true
    httpTimeout: 30s
    managedResources:
      - name: nvidia.com/gpu
        ignoredByScheduler: true
      - name: nvidia.com/gpumem
        ignoredByScheduler: true
)";

template <typename F>
bool WaitUntil(F f, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return f();
}

// Moves `clock` to its next waiter's deadline (the component under test sleeping until its next
// timer) until `done` holds, or 10 s of real time passed.
template <typename F>
bool AdvanceUntil(FakeClock& clock, F done) {
  return WaitUntil([&] {
    if (done()) return true;
    clock.AdvanceToNextDeadline();
    return done();
  });
}

json GpuPod(const std::string& name, const std::string& cmd = "sleep 3600") {
  return {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", name}, {"namespace", "default"}}},
      {"spec",
       {{"schedulerName", "dynmig-scheduler"},
        {"containers",
         json::array({{{"name", "main"},
                       {"image", "ubuntu:22.04"},
                       {"command", json::array({"bash", "-c", cmd})},
                       {"resources",
                        {{"limits", {{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem", 4000}}}}}}})}}}};
}

class LocalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = kube::InMemoryApiServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    kube::RestConfig cfg;
    cfg.server = server_->url();
    auto client = kube::RestKubeClient::Create(cfg);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    for (const char* n : {"node-a", "node-b"}) {
      ASSERT_TRUE(
          client_->CreateNode({{"apiVersion", "v1"}, {"kind", "Node"}, {"metadata", {{"name", n}}}})
              .ok());
    }
  }

  std::unique_ptr<kube::InMemoryApiServer> server_;
  std::unique_ptr<kube::RestKubeClient> client_;
};

TEST(ParseNodesTest, NodesWithTheirGpusAndItemsThatAddGpus) {
  auto nodes = ParseNodes(" node-a=A100-SXM4-40GBx2 , node-b=H100 80GBx1,A30 ");
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_EQ((*nodes)[0].name, "node-a");
  EXPECT_EQ((*nodes)[0].gpus, "A100-SXM4-40GBx2");
  EXPECT_EQ((*nodes)[1].name, "node-b");
  EXPECT_EQ((*nodes)[1].gpus, "H100 80GBx1,A30");
}

TEST(ParseNodesTest, BadInputNamesTheItem) {
  auto message = [](std::string_view text) {
    return std::string(ParseNodes(text).status().message());
  };
  EXPECT_EQ(message("A30"),
            "--nodes: \"A30\" has no node name: write NAME=MODELxCOUNT (e.g. "
            "node-a=A100-SXM4-40GBx2)");
  EXPECT_NE(message("Node_A=A30").find("node name \"Node_A\" is not a valid Kubernetes name"),
            std::string::npos);
  EXPECT_EQ(message("a=A30,a=A30"), "--nodes: node \"a\" is given twice");
  EXPECT_EQ(message("a="), "--nodes: node \"a\" has no GPUs (e.g. a=A100-SXM4-40GBx2)");
  EXPECT_EQ(message(" , "), "--nodes: no node given");
  EXPECT_NE(message("a=NoSuchGPUx1").find("--nodes: node \"a\": "), std::string::npos)
      << message("a=NoSuchGPUx1");
}

TEST(SchedulerConfigTest, ParsesTheExtenderStanza) {
  auto cfg = ParseSchedulerConfig(kConfig);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->scheduler_name, "dynmig-scheduler");
  EXPECT_EQ(cfg->extender.filter_verb, "filter");
  EXPECT_EQ(cfg->extender.bind_verb, "bind");
  EXPECT_TRUE(cfg->extender.node_cache_capable);
  ASSERT_EQ(cfg->extender.managed_resources.size(), 2u);
  EXPECT_TRUE(cfg->extender.managed_resources[0].ignored_by_scheduler);
  EXPECT_FALSE(ParseSchedulerConfig("kind: Pod").ok());
  EXPECT_NE(
      std::string(ParseSchedulerConfig("kind: KubeSchedulerConfiguration\n").status().message())
          .find("schedulerName"),
      std::string::npos);
}

TEST_F(LocalTest, SchedulerLoopCallsFilterThenBindLikeKubeScheduler) {
  // A fake extender: passes node-b only for pod "fits"; binds through the API.
  httplib::Server ext;
  std::atomic<int> filters{0}, binds{0};
  json seen_args;
  std::mutex mu;
  ext.Post("/filter", [&](const httplib::Request& req, httplib::Response& res) {
    ++filters;
    json args = json::parse(req.body);
    {
      std::lock_guard<std::mutex> lock(mu);
      seen_args = args;
    }
    json out;
    if (args["Pod"]["metadata"]["name"] == "fits") {
      out = {{"NodeNames", {"node-b"}},
             {"FailedNodes", {{"node-a", "capacity-exhausted: full"}}},
             {"Error", ""}};
    } else {
      out = {{"NodeNames", json::array()},
             {"FailedNodes", {{"node-a", "fragmented: x"}, {"node-b", "fragmented: y"}}},
             {"Error", ""}};
    }
    res.set_content(out.dump(), "application/json");
  });
  ext.Post("/bind", [&](const httplib::Request& req, httplib::Response& res) {
    ++binds;
    json args = json::parse(req.body);
    auto st = client_->BindPod(args["PodNamespace"].get<std::string>(),
                               args["PodName"].get<std::string>(), args["Node"].get<std::string>(),
                               args["PodUID"].get<std::string>());
    res.set_content(json({{"Error", st.ok() ? "" : std::string(st.message())}}).dump(),
                    "application/json");
  });
  const int port = ext.bind_to_any_port("127.0.0.1");
  std::thread t([&] { ext.listen_after_bind(); });

  SchedulerLoopOptions opts;
  opts.config = *ParseSchedulerConfig(kConfig);
  opts.extender_url = "http://127.0.0.1:" + std::to_string(port);
  opts.timing = SchedulingQueueTiming{}.Scaled(20);
  SchedulerLoop loop(*client_, RealClock(), opts);
  loop.Start();
  ASSERT_TRUE(client_->CreatePod(GpuPod("fits")).ok());
  ASSERT_TRUE(client_->CreatePod(GpuPod("stuck")).ok());
  auto other = GpuPod("other-scheduler");
  other["spec"]["schedulerName"] = "default-scheduler";
  ASSERT_TRUE(client_->CreatePod(other).ok());

  EXPECT_TRUE(WaitUntil([&] {
    auto p = client_->GetPod("default", "fits");
    return p.ok() && kube::NodeName(*p) == "node-b";
  }));
  EXPECT_TRUE(WaitUntil([&] {
    auto p = client_->GetPod("default", "stuck");
    return p.ok() && p->dump().find("0/2 nodes are available") != std::string::npos;
  }));
  auto stuck = client_->GetPod("default", "stuck");
  EXPECT_TRUE(kube::NodeName(*stuck).empty());
  EXPECT_NE(stuck->dump().find("fragmented: y"), std::string::npos);
  auto foreign = client_->GetPod("default", "other-scheduler");
  EXPECT_TRUE(kube::NodeName(*foreign).empty());
  loop.Stop();
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(seen_args.contains("NodeNames"));
    EXPECT_FALSE(seen_args.contains("Nodes"));
  }
  EXPECT_GE(binds.load(), 1);
  ext.stop();
  t.join();
}

// Like kube-scheduler, the stand-in reports a pod updated during its scheduling cycle (between
// the start of the cycle and the bind): kube-scheduler requeues it and the second attempt fails
// with "pod <uid> is in the cache, so can't be assumed", a Warning on a pod that scheduled fine.
TEST_F(LocalTest, SchedulerLoopWarnsLikeKubeSchedulerWhenTheFilterUpdatesThePod) {
  // A fake extender that writes an annotation on pod "annotated" during filter.
  httplib::Server ext;
  ext.Post("/filter", [&](const httplib::Request& req, httplib::Response& res) {
    json args = json::parse(req.body);
    const std::string name = args["Pod"]["metadata"]["name"];
    if (name == "annotated") {
      (void)client_->PatchPodAnnotations("default", name, {{"example.com/decided", "node-b"}});
    }
    res.set_content(json({{"NodeNames", {"node-b"}}, {"Error", ""}}).dump(), "application/json");
  });
  ext.Post("/bind", [&](const httplib::Request& req, httplib::Response& res) {
    json args = json::parse(req.body);
    auto st = client_->BindPod(args["PodNamespace"].get<std::string>(),
                               args["PodName"].get<std::string>(), args["Node"].get<std::string>(),
                               args["PodUID"].get<std::string>());
    res.set_content(json({{"Error", st.ok() ? "" : std::string(st.message())}}).dump(),
                    "application/json");
  });
  const int port = ext.bind_to_any_port("127.0.0.1");
  std::thread t([&] { ext.listen_after_bind(); });
  SchedulerLoopOptions opts;
  opts.config = *ParseSchedulerConfig(kConfig);
  opts.extender_url = "http://127.0.0.1:" + std::to_string(port);
  opts.timing = SchedulingQueueTiming{}.Scaled(20);
  SchedulerLoop loop(*client_, RealClock(), opts);
  loop.Start();
  auto annotated = client_->CreatePod(GpuPod("annotated"));
  auto quiet = client_->CreatePod(GpuPod("quiet"));
  ASSERT_TRUE(annotated.ok() && quiet.ok());
  for (const char* name : {"annotated", "quiet"}) {
    EXPECT_TRUE(WaitUntil([&] {
      auto p = client_->GetPod("default", name);
      return p.ok() && kube::NodeName(*p) == "node-b";
    })) << name;
  }
  loop.Stop();
  ext.stop();
  t.join();
  auto warnings = [&](const std::string& name) {
    std::vector<std::string> out;
    auto events = client_->List(kube::Resource::kEvents, {});
    EXPECT_TRUE(events.ok()) << events.status();
    if (!events.ok()) return out;
    for (const auto& e : events->items) {
      if (kube::StringAt(e, "/involvedObject/name") == name &&
          e.value("reason", "") == "FailedScheduling") {
        out.push_back(e.value("message", ""));
      }
    }
    return out;
  };
  EXPECT_EQ(warnings("annotated"),
            std::vector<std::string>{"pod " + kube::Uid(*annotated) +
                                     " is in the cache, so can't be assumed"});
  EXPECT_TRUE(warnings("quiet").empty());
}

// kube-scheduler's own filters run before the extender: cordoned nodes only for pods that
// tolerate it, nodeSelector and required node affinity.
TEST_F(LocalTest, SchedulerLoopFiltersNodesLikeKubeSchedulerBeforeTheExtender) {
  httplib::Server ext;
  std::mutex mu;
  std::map<std::string, json> seen;  // pod -> NodeNames
  ext.Post("/filter", [&](const httplib::Request& req, httplib::Response& res) {
    json args = json::parse(req.body);
    {
      std::lock_guard<std::mutex> lock(mu);
      seen[args["Pod"]["metadata"]["name"].get<std::string>()] = args["NodeNames"];
    }
    res.set_content(
        json({{"NodeNames", json::array()}, {"FailedNodes", json::object()}, {"Error", ""}}).dump(),
        "application/json");
  });
  const int port = ext.bind_to_any_port("127.0.0.1");
  std::thread t([&] { ext.listen_after_bind(); });
  // node-a cordoned, node-b labelled zone=x.
  ASSERT_TRUE(client_->PatchNodeMetadata("node-b", {.labels = {{"zone", "x"}}}).ok());
  auto node_a = client_->GetNode("node-a");
  ASSERT_TRUE(node_a.ok());
  (*node_a)["spec"]["unschedulable"] = true;
  ASSERT_TRUE(client_->UpdateNode(*node_a).ok());

  auto plain = GpuPod("plain");
  auto pinned = GpuPod("pinned");  // the canary's shape: tolerates the cordon, pinned by name
  pinned["spec"]["tolerations"] = json::array({{{"key", "node.kubernetes.io/unschedulable"},
                                                {"operator", "Exists"},
                                                {"effect", "NoSchedule"}}});
  pinned["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"] = json::array(
            {{{"matchFields",
               json::array(
                   {{{"key", "metadata.name"}, {"operator", "In"}, {"values", {"node-a"}}}})}}});
  auto zoned = GpuPod("zoned");
  zoned["spec"]["nodeSelector"] = {{"zone", "y"}};
  auto expr = GpuPod("expr");
  expr["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
      ["nodeSelectorTerms"] = json::array(
          {{{"matchExpressions",
             json::array({{{"key", "zone"}, {"operator", "In"}, {"values", {"x"}}}})}}});
  for (const auto& p : {plain, pinned, zoned, expr}) ASSERT_TRUE(client_->CreatePod(p).ok());

  SchedulerLoopOptions opts;
  opts.config = *ParseSchedulerConfig(kConfig);
  opts.extender_url = "http://127.0.0.1:" + std::to_string(port);
  opts.timing = SchedulingQueueTiming{}.Scaled(20);
  SchedulerLoop loop(*client_, RealClock(), opts);
  loop.Start();
  EXPECT_TRUE(WaitUntil([&] {
    std::lock_guard<std::mutex> lock(mu);
    return seen.count("plain") && seen.count("pinned") && seen.count("expr");
  }));
  EXPECT_TRUE(WaitUntil([&] {
    auto p = client_->GetPod("default", "zoned");
    return p.ok() && p->dump().find("nodeSelector") != std::string::npos;
  }));
  loop.Stop();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(seen["plain"], json::array({"node-b"}));
  EXPECT_EQ(seen["pinned"], json::array({"node-a"}));
  EXPECT_EQ(seen["expr"], json::array({"node-b"}));
  EXPECT_FALSE(seen.count("zoned")) << "no node fits: the extender is not asked";
  ext.stop();
  t.join();
}

class FakeAllocator : public DeviceAllocator {
 public:
  std::string ResourceName() override { return "nvidia.com/gpu"; }
  std::vector<std::string> DeviceIds() override { return {"GPU-0::0", "GPU-0::1", "GPU-0::2"}; }
  absl::StatusOr<ContainerAllocation> Allocate(const std::string&, const std::string&,
                                               const std::vector<std::string>& ids) override {
    if (fail) return absl::ResourceExhaustedError("NVML_ERROR_INSUFFICIENT_RESOURCES");
    ContainerAllocation a;
    std::string uuids;
    for (size_t i = 0; i < ids.size(); ++i)
      uuids += (i ? "," : "") + std::string("MIG-") + std::to_string(++n);
    a.envs["NVIDIA_VISIBLE_DEVICES"] = uuids;
    return a;
  }
  std::atomic<bool> fail{false};
  std::atomic<int> n{0};
};

// A status write the API refuses is retried, as the kubelet's status manager does: the pod does
// not stay Pending while its containers run.
TEST_F(LocalTest, NodeAgentRetriesAStatusWriteThatFailed) {
  FakeAllocator alloc;
  NodeAgentOptions opts;
  opts.node = "node-a";
  kube::FaultSpec fault;
  fault.method = "PATCH";
  fault.path_prefix = "/api/v1/namespaces/default/pods/p/status";
  // Not a status the client retries by itself (5xx and 429 are): the agent must.
  fault.count = 2;
  fault.status = 422;
  server_->AddFault(fault);
  NodeAgent agent(*client_, alloc, RealClock(), opts);
  agent.Start();
  auto pod = GpuPod("p");
  pod["spec"]["nodeName"] = "node-a";
  ASSERT_TRUE(client_->CreatePod(pod).ok());
  EXPECT_TRUE(WaitUntil([&] {
    auto p = client_->GetPod("default", "p");
    return p.ok() && kube::Phase(*p) == "Running";
  }));
  EXPECT_EQ(alloc.n.load(), 1) << "the pod was started once; only its status was written again";
  agent.Stop();
}

TEST_F(LocalTest, NodeAgentRunsPodsAttachesProcessesAndEndsThem) {
  FakeAllocator alloc;
  std::mutex mu;
  std::set<std::string> attached;
  NodeAgentOptions opts;
  opts.node = "node-a";
  opts.processes.attach = [&](const std::string& uuid, uint32_t) {
    std::lock_guard<std::mutex> lock(mu);
    attached.insert(uuid);
    return absl::OkStatus();
  };
  opts.processes.detach = [&](const std::string& uuid, uint32_t) {
    std::lock_guard<std::mutex> lock(mu);
    attached.erase(uuid);
    return absl::OkStatus();
  };
  FakeClock clock;  // the pods' sleeps end when the test moves it
  NodeAgent agent(*client_, alloc, clock, opts);
  agent.Start();
  auto short_pod = GpuPod("short", "sleep 1");
  short_pod["spec"]["nodeName"] = "node-a";
  auto long_pod = GpuPod("long");
  long_pod["spec"]["nodeName"] = "node-a";
  ASSERT_TRUE(client_->CreatePod(short_pod).ok());
  ASSERT_TRUE(client_->CreatePod(long_pod).ok());
  EXPECT_TRUE(WaitUntil([&] {
    auto p = client_->GetPod("default", "long");
    return p.ok() && kube::Phase(*p) == "Running";
  }));
  auto running = client_->GetPod("default", "long");
  auto visible = kube::Annotation(*running, kVisibleDevicesAnnotation);
  ASSERT_TRUE(visible.has_value());
  EXPECT_NE(visible->find("MIG-"), std::string::npos);
  EXPECT_TRUE(WaitUntil([&] {
    auto p = client_->GetPod("default", "short");
    return p.ok() && kube::Phase(*p) == "Running";
  }));
  // Its `sleep 1` is over once a second of the agent's clock has passed.
  const absl::Time started = clock.Now();
  EXPECT_TRUE(AdvanceUntil(clock, [&] {
    auto p = client_->GetPod("default", "short");
    return p.ok() && kube::Phase(*p) == "Succeeded";
  }));
  EXPECT_GE(clock.Now() - started, absl::Seconds(1)) << "ended before its sleep was over";
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(attached.size(), 1u);  // only the long pod's process remains
  }
  // Graceful deletion: the agent detaches and confirms.
  ASSERT_TRUE(client_->DeletePod("default", "long", {}).ok());
  EXPECT_TRUE(WaitUntil([&] {
    return client_->GetPod("default", "long").status().code() == absl::StatusCode::kNotFound;
  }));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(attached.empty());
  }
  // Allocate failures fail the pod.
  alloc.fail = true;
  auto bad = GpuPod("bad");
  bad["spec"]["nodeName"] = "node-a";
  ASSERT_TRUE(client_->CreatePod(bad).ok());
  EXPECT_TRUE(WaitUntil([&] {
    auto p = client_->GetPod("default", "bad");
    return p.ok() && kube::Phase(*p) == "Failed";
  }));
  EXPECT_NE(client_->GetPod("default", "bad")->dump().find("INSUFFICIENT_RESOURCES"),
            std::string::npos);
  agent.Stop();
}

// The kubelet's PreStartContainer: a container whose call fails does not start and gets nothing;
// it waits with the kubelet's reason and message, an event says why, and its start is tried again.
class PreStartAllocator : public FakeAllocator {
 public:
  void Admit(const std::string& pod, const std::vector<std::string>& containers,
             const std::vector<std::string>& init_containers) override {
    std::lock_guard<std::mutex> lock(mu);
    admitted[pod] = {containers, init_containers};
  }
  absl::Status PreStart(const std::string&, const std::string& container) override {
    ++prestarts;
    if (refuse && container == "main") {
      return absl::FailedPreconditionError(
          "device plugin PreStartContainer rpc failed with err: rpc error: code = "
          "FailedPrecondition desc = the container does not start: not yours");
    }
    return absl::OkStatus();
  }
  std::mutex mu;
  std::map<std::string, std::pair<std::vector<std::string>, std::vector<std::string>>> admitted;
  std::atomic<bool> refuse{true};
  std::atomic<int> prestarts{0};
};

TEST_F(LocalTest, NodeAgentDoesNotStartAContainerWhosePreStartFails) {
  PreStartAllocator alloc;
  std::mutex mu;
  std::set<std::string> attached;
  NodeAgentOptions opts;
  opts.node = "node-a";
  opts.prestart_retry = absl::Seconds(10);  // the kubelet's
  opts.processes.attach = [&](const std::string& uuid, uint32_t) {
    std::lock_guard<std::mutex> lock(mu);
    attached.insert(uuid);
    return absl::OkStatus();
  };
  FakeClock clock;  // the retries come when the test moves it
  NodeAgent agent(*client_, alloc, clock, opts);
  agent.Start();
  auto pod = GpuPod("thief");
  pod["spec"]["nodeName"] = "node-a";
  pod["spec"]["initContainers"] = json::array({{{"name", "setup"}, {"image", "busybox"}}});
  ASSERT_TRUE(client_->CreatePod(pod).ok());
  std::string message;
  ASSERT_TRUE(WaitUntil([&] {
    auto p = client_->GetPod("default", "thief");
    if (!p.ok() || !p->contains("status") || !(*p)["status"].contains("containerStatuses")) {
      return false;
    }
    const json& state = (*p)["status"]["containerStatuses"][0]["state"];
    if (!state.contains("waiting")) return false;
    EXPECT_EQ(state["waiting"].value("reason", ""), "CreateContainerConfigError");
    message = state["waiting"].value("message", "");
    return true;
  }));
  EXPECT_NE(message.find("device plugin PreStartContainer rpc failed with err"), std::string::npos)
      << message;
  auto thief = client_->GetPod("default", "thief");
  EXPECT_EQ(kube::Phase(*thief), "Pending");
  EXPECT_FALSE(kube::Annotation(*thief, kVisibleDevicesAnnotation).has_value())
      << "the container got devices";
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(attached.empty()) << "a process ran on the devices";
  }
  {
    std::lock_guard<std::mutex> lock(alloc.mu);
    EXPECT_EQ(alloc.admitted["default/thief"].first, std::vector<std::string>{"main"});
    EXPECT_EQ(alloc.admitted["default/thief"].second, std::vector<std::string>{"setup"});
  }
  EXPECT_TRUE(WaitUntil([&] {
    auto events = client_->List(kube::Resource::kEvents, {});
    if (!events.ok()) return false;
    for (const auto& e : events->items) {
      if (e.value("reason", "") == "Failed" && e.value("type", "") == "Warning" &&
          e.value("message", "").rfind("Error: device plugin PreStartContainer rpc failed", 0) ==
              0) {
        return true;
      }
    }
    return false;
  }));
  // Tried again, as the kubelet's pod worker does; once the plugin agrees, it starts.
  const int before = alloc.prestarts.load();
  const absl::Time failed = clock.Now();
  EXPECT_TRUE(AdvanceUntil(clock, [&] { return alloc.prestarts.load() >= before + 2; }));
  EXPECT_GE(clock.Now() - failed, 2 * opts.prestart_retry) << "tried again before its retry time";
  EXPECT_NE(kube::Phase(*client_->GetPod("default", "thief")), "Running");
  alloc.refuse = false;
  EXPECT_TRUE(AdvanceUntil(clock, [&] {
    auto p = client_->GetPod("default", "thief");
    return p.ok() && kube::Phase(*p) == "Running";
  }));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(attached.size(), 1u);
  }
  agent.Stop();
}

// The kubelet allocates every resource a registered plugin serves: dynmig's, and NVIDIA's
// nvidia.com/mig-<profile> (a handover's legacy pods).
class MultiAllocator : public DeviceAllocator {
 public:
  std::string ResourceName() override { return "nvidia.com/gpu"; }
  std::vector<std::string> ResourceNames() override {
    return {"nvidia.com/gpu", "nvidia.com/mig-1g.5gb"};
  }
  std::vector<std::string> DeviceIds() override { return {"GPU-0::0"}; }
  std::vector<std::string> ResourceDeviceIds(const std::string& resource) override {
    if (resource == "nvidia.com/mig-1g.5gb") return {"MIG-legacy-a", "MIG-legacy-b"};
    return DeviceIds();
  }
  absl::StatusOr<ContainerAllocation> Allocate(const std::string& pod, const std::string& c,
                                               const std::vector<std::string>& ids) override {
    return AllocateResource(pod, c, ids, "nvidia.com/gpu");
  }
  absl::StatusOr<ContainerAllocation> AllocateResource(const std::string& pod, const std::string&,
                                                       const std::vector<std::string>& ids,
                                                       const std::string& resource) override {
    dynmig::MutexLock lock(&mu);
    calls.push_back(pod + " " + resource + " " + fmt::format("{}", fmt::join(ids, ",")));
    ContainerAllocation a;
    a.envs["NVIDIA_VISIBLE_DEVICES"] =
        resource == "nvidia.com/gpu" ? "MIG-dynmig" : fmt::format("{}", fmt::join(ids, ","));
    return a;
  }
  void ContainerEnv(const std::string& pod, const std::string& container,
                    const std::map<std::string, std::string>& env) override {
    dynmig::MutexLock lock(&mu);
    envs[pod + "/" + container] = env;
  }
  dynmig::Mutex mu;
  std::vector<std::string> calls ABSL_GUARDED_BY(mu);
  std::map<std::string, std::map<std::string, std::string>> envs ABSL_GUARDED_BY(mu);
};

json MigPod(const std::string& name, const std::string& resource) {
  return {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", name}, {"namespace", "default"}}},
      {"spec",
       {{"nodeName", "node-a"},
        {"containers",
         json::array(
             {{{"name", "main"},
               {"image", "busybox"},
               {"command", json::array({"sleep", "3600"})},
               {"env", json::array({{{"name", "NVIDIA_VISIBLE_DEVICES"},
                                     {"value", "/var/run/nvidia-container-devices"}},
                                    {{"name", "FROM_API"}, {"valueFrom", {{"fieldRef", "x"}}}}})},
               {"resources", {{"limits", {{resource, 1}}}}}}})}}}};
}

TEST_F(LocalTest, NodeAgentAllocatesEveryRegisteredResource) {
  MultiAllocator alloc;
  NodeAgentOptions opts;
  opts.node = "node-a";
  NodeAgent agent(*client_, alloc, RealClock(), opts);
  agent.Start();
  ASSERT_TRUE(client_->CreatePod(MigPod("legacy", "nvidia.com/mig-1g.5gb")).ok());
  // A profile no registered plugin serves: the pod waits, as for dynmig's own resource.
  ASSERT_TRUE(client_->CreatePod(MigPod("unserved", "nvidia.com/mig-7g.40gb")).ok());
  ASSERT_TRUE(WaitUntil([&] {
    auto p = client_->GetPod("default", "legacy");
    return p.ok() && kube::Phase(*p) == "Running";
  }));
  auto p = client_->GetPod("default", "legacy");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(json::parse(kube::Annotation(*p, kVisibleDevicesAnnotation).value_or("{}")),
            json({{"main", "MIG-legacy-a"}}));
  {
    dynmig::MutexLock lock(&alloc.mu);
    EXPECT_EQ(alloc.calls,
              std::vector<std::string>({"default/legacy nvidia.com/mig-1g.5gb MIG-legacy-a"}));
    // The runtime sees the literal env of the spec (valueFrom is not resolved).
    EXPECT_EQ(alloc.envs["default/legacy/main"],
              (std::map<std::string, std::string>{
                  {"NVIDIA_VISIBLE_DEVICES", "/var/run/nvidia-container-devices"}}));
  }
  auto u = client_->GetPod("default", "unserved");
  ASSERT_TRUE(u.ok());
  EXPECT_NE(kube::Phase(*u), "Running");
  EXPECT_NE(kube::Phase(*u), "Failed");
  agent.Stop();
}

TEST(SpecEnvTest, LiteralValuesOnlyAndBounded) {
  json env = json::array();
  for (int i = 0; i < 100; ++i) env.push_back({{"name", fmt::format("V{:03}", i)}, {"value", "x"}});
  env.push_back({{"name", "LONG"}, {"value", std::string(5000, 'a')}});
  json c = {{"env", env}};
  EXPECT_EQ(SpecEnv(c).size(), kMaxSpecEnv);
  json hostile = {{"env", json::array({1,
                                       "x",
                                       {{"name", 5}, {"value", "v"}},
                                       {{"name", std::string(300, 'n')}, {"value", "v"}},
                                       {{"name", "LONG"}, {"value", std::string(5000, 'a')}},
                                       {{"name", "OK"}, {"value", "1"}}})}};
  EXPECT_EQ(SpecEnv(hostile), (std::map<std::string, std::string>{{"OK", "1"}}));
  EXPECT_TRUE(SpecEnv(json{{"env", "not a list"}}).empty());
}

TEST(MigResourcesTest, OnlyNvidiaMigRequestsAboveZeroAndBounded) {
  json limits = {
      {"nvidia.com/gpu", 1}, {"nvidia.com/mig-1g.5gb", 1}, {"nvidia.com/mig-2g.10gb", 0}};
  EXPECT_EQ(MigResources(json{{"resources", {{"limits", limits}}}}),
            std::vector<std::string>({"nvidia.com/mig-1g.5gb"}));
  json many = json::object();
  for (int i = 0; i < 100; ++i) many[fmt::format("nvidia.com/mig-{}g.x", i)] = 1;
  EXPECT_EQ(MigResources(json{{"resources", {{"requests", many}}}}).size(), 16u);
  EXPECT_TRUE(MigResources(json{{"resources", "x"}}).empty());
}

TEST(SleepSecondsTest, FindsTheSleepInCommandAndArgs) {
  EXPECT_EQ(SleepSeconds(json{{"command", {"bash", "-c", "sleep 3600"}}}), 3600);
  EXPECT_EQ(SleepSeconds(json{{"command", {"sleep"}}, {"args", {"5"}}}), 5);
  EXPECT_FALSE(SleepSeconds(json{{"command", {"bash", "-c", "nvidia-smi -L"}}}).has_value());
}

}  // namespace
}  // namespace dynmig::local

namespace dynmig::local {
namespace {

// A fake extender: filter passes node-a; bind fails while `locked` (the node's bind lock), else
// binds through the API.
class LockingExtender {
 public:
  explicit LockingExtender(kube::KubeClient& client) : client_(client) {
    server_.Post("/filter", [this](const httplib::Request&, httplib::Response& res) {
      ++filters;
      if (const Clock* c = clock.load(); c != nullptr) {
        dynmig::MutexLock lock(&mu);
        filter_times.push_back(c->Now());
      }
      res.set_content(json({{"NodeNames", {"node-a"}}, {"Error", ""}}).dump(), "application/json");
    });
    server_.Post("/bind", [this](const httplib::Request& req, httplib::Response& res) {
      ++binds;
      json args = json::parse(req.body);
      std::string error = "node node-a is locked by another bind";
      if (!locked) {
        auto st = client_.BindPod(
            args["PodNamespace"].get<std::string>(), args["PodName"].get<std::string>(),
            args["Node"].get<std::string>(), args["PodUID"].get<std::string>());
        error = st.ok() ? "" : std::string(st.message());
      }
      res.set_content(json({{"Error", error}}).dump(), "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~LockingExtender() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  std::atomic<bool> locked{true};
  std::atomic<int> filters{0}, binds{0};
  // When set before the first filter: the time of each filter call on this clock.
  std::atomic<const Clock*> clock{nullptr};  // set by a test while the server runs
  dynmig::Mutex mu;
  std::vector<absl::Time> filter_times ABSL_GUARDED_BY(mu);

 private:
  kube::KubeClient& client_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

class SchedulerQueueLoopTest : public LocalTest {
 protected:
  // Backoff short, the unschedulable flush never: only events bring a failed pod back.
  SchedulerLoopOptions Options(const std::string& url) {
    SchedulerLoopOptions o;
    o.config = *ParseSchedulerConfig(kConfig);
    o.extender_url = url;
    o.timing.initial_backoff = absl::Milliseconds(10);
    o.timing.max_backoff = absl::Milliseconds(40);
    o.timing.backoff_flush = absl::Milliseconds(10);
    o.timing.unschedulable_flush = absl::Hours(1);
    o.timing.unschedulable_timeout = absl::Hours(1);
    o.observe = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu_);
      observed_.push_back(line);
    };
    return o;
  }
  bool Observed(const std::string& line) {
    std::lock_guard<std::mutex> lock(mu_);
    return std::find(observed_.begin(), observed_.end(), line) != observed_.end();
  }
  // Starts the loop and waits until it has handled both nodes' adds (a move request, which would
  // send a pod failing meanwhile to backoff instead of the unschedulable pods).
  void StartAndSeeTheNodes(SchedulerLoop& loop) {
    loop.Start();
    ASSERT_TRUE(WaitUntil([&] {
      return Observed("node node-a added: requeue") && Observed("node node-b added: requeue");
    }));
  }
  std::string NodeOf(const std::string& pod) {
    auto p = client_->GetPod("default", pod);
    return p.ok() ? kube::NodeName(*p) : "";
  }

  std::mutex mu_;
  std::vector<std::string> observed_;
};

// A bind rejected by the node lock: the pod waits among the unschedulable pods. A Node annotation
// change (how the lock is released) does not bring it back; a label change does; so does the
// deletion of a pod assigned to a node.
TEST_F(SchedulerQueueLoopTest, BindRejectedWaitsForARelevantEventNotAnAnnotation) {
  LockingExtender ext(*client_);
  SchedulerLoop loop(*client_, RealClock(), Options(ext.url()));
  StartAndSeeTheNodes(loop);
  ASSERT_TRUE(client_->CreatePod(GpuPod("p")).ok());
  ASSERT_TRUE(WaitUntil([&] {
    return ext.binds == 1 && loop.QueueOf("default/p") == SchedulingQueue::Where::kUnschedulable;
  })) << "binds "
      << ext.binds << ", filters " << ext.filters << ", queue "
      << static_cast<int>(loop.QueueOf("default/p"));
  // The condition is written after the pod is queued: wait for it (seen late under load, ASan).
  std::string seen;
  EXPECT_TRUE(WaitUntil([&] {
    auto pod = client_->GetPod("default", "p");
    seen = pod.ok() ? pod->dump() : pod.status().ToString();
    return seen.find("Binding rejected: node node-a is locked") != std::string::npos &&
           seen.find("SchedulerError") != std::string::npos;
  })) << seen;

  ext.locked = false;
  ASSERT_TRUE(client_->PatchNodeMetadata("node-a", {.annotations = {{"lock", "released"}}}).ok());
  ASSERT_TRUE(WaitUntil([&] { return Observed("node node-a updated: no requeue"); }));
  EXPECT_EQ(loop.QueueOf("default/p"), SchedulingQueue::Where::kUnschedulable);
  EXPECT_EQ(ext.filters, 1);

  ASSERT_TRUE(client_->PatchNodeMetadata("node-a", {.labels = {{"zone", "a"}}}).ok());
  ASSERT_TRUE(WaitUntil([&] { return NodeOf("p") == "node-a"; }));
  EXPECT_EQ(ext.binds, 2);
  EXPECT_EQ(loop.Attempts("default/p"), 0) << "a bound pod leaves the queue";

  // Next pod bounces; deleting the bound pod requeues it.
  ext.locked = true;
  ASSERT_TRUE(client_->CreatePod(GpuPod("q")).ok());
  ASSERT_TRUE(WaitUntil(
      [&] { return loop.QueueOf("default/q") == SchedulingQueue::Where::kUnschedulable; }));
  ext.locked = false;
  kube::DeleteOptions now;
  now.grace_period_seconds = 0;
  ASSERT_TRUE(client_->DeletePod("default", "p", now).ok());
  ASSERT_TRUE(WaitUntil([&] { return NodeOf("q") == "node-a"; }));
  EXPECT_TRUE(Observed("pod default/p deleted: requeue"));
  loop.Stop();
}

// Without any event, a failed pod is tried again once it has been unschedulable for longer than
// the timeout, at the periodic flush.
TEST_F(SchedulerQueueLoopTest, UnschedulablePodsAreFlushedPeriodically) {
  LockingExtender ext(*client_);
  FakeClock clock;  // the flushes come when the test moves it
  ext.clock = &clock;
  SchedulerLoopOptions o = Options(ext.url());
  o.timing.unschedulable_flush = absl::Milliseconds(100);
  o.timing.unschedulable_timeout = absl::Milliseconds(300);
  SchedulerLoop loop(*client_, clock, o);
  StartAndSeeTheNodes(loop);
  const absl::Time failed = clock.Now();  // it stands still until the test moves it
  ASSERT_TRUE(client_->CreatePod(GpuPod("p")).ok());
  ASSERT_TRUE(WaitUntil([&] {
    return ext.binds == 1 && loop.QueueOf("default/p") == SchedulingQueue::Where::kUnschedulable;
  }));
  ext.locked = false;
  // Time moves from one of the loop's flushes to the next.
  ASSERT_TRUE(AdvanceUntil(clock, [&] { return NodeOf("p") == "node-a"; }));
  EXPECT_EQ(ext.binds, 2);
  loop.Stop();
  dynmig::MutexLock lock(&ext.mu);
  ASSERT_EQ(ext.filter_times.size(), 2u);
  EXPECT_GT(ext.filter_times[1] - failed, absl::Milliseconds(300))
      << "came back before the timeout";
}

// With default_scheduler the stand-in also binds pods of the default scheduler (no extender).
TEST_F(SchedulerQueueLoopTest, DefaultSchedulerPodsAreBoundWithoutTheExtender) {
  LockingExtender ext(*client_);
  SchedulerLoopOptions o = Options(ext.url());
  o.default_scheduler = true;
  SchedulerLoop loop(*client_, RealClock(), o);
  StartAndSeeTheNodes(loop);
  json plain = GpuPod("plain");
  plain["spec"].erase("schedulerName");  // the API server defaults it to default-scheduler
  plain["spec"]["containers"][0].erase("resources");
  ASSERT_TRUE(client_->CreatePod(plain).ok());
  ASSERT_TRUE(WaitUntil([&] { return !NodeOf("plain").empty(); }));
  EXPECT_EQ(ext.filters, 0);
  EXPECT_EQ(ext.binds, 0);
  loop.Stop();
}

}  // namespace
}  // namespace dynmig::local
