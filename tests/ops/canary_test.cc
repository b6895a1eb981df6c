// `dynmig validate --canary` through the whole lifecycle.
//
// The canary only talks to the Kubernetes API and the NVML view endpoint, so the tests run it
// against a CanaryCluster. FakeCanaryCluster plays the scheduler, the kubelet and the device plugin
// on the in-memory API server (reserve 1g.5gb, bind, write the runtime identity, run, record the
// visible devices, reclaim on delete), with faults to exercise each failure. The same command runs
// against the real system (the local mode) in tests/e2e/ops_e2e_test.cc.
#include "ops/canary.h"

#include <atomic>
#include <functional>

#include "common/clock.h"
#include "ops/cluster.h"
#include "ops/ops_test_util.h"

namespace dynmig::ops::testing {
namespace {

// What the canary runs against.
class CanaryCluster {
 public:
  virtual ~CanaryCluster() = default;
  virtual std::string Kubeconfig() const = 0;
  virtual std::string NvmlEndpointTemplate() const = 0;  // "" = no NVML view
  virtual std::string Node() const = 0;
};

struct Faults {
  bool never_schedule = false;  // the pod stays Pending
  bool fail_allocate = false;   // the kubelet fails the pod (UnexpectedAdmissionError)
  bool no_identity = false;     // the device plugin does not record MIG UUID/GI/CI
  bool wrong_visible = false;   // the container sees another MIG device
  bool keep_instance = false;   // the device plugin does not reclaim after the delete
};

// Scheduler + kubelet + device plugin stand-in over the store, one pass every 5 ms.
class FakeCanaryCluster : public CanaryCluster {
 public:
  // `base`: instances of other pods NVML also shows.
  FakeCanaryCluster(kube::InMemoryApiServer& server, FakeNvmlEndpoint& nvml, std::string kubeconfig,
                    Faults faults, std::vector<NvmlInstance> base)
      : server_(server),
        nvml_(nvml),
        kubeconfig_(std::move(kubeconfig)),
        faults_(faults),
        base_(std::move(base)) {
    Publish();
    thread_ = std::thread([this] { Loop(); });
  }
  ~FakeCanaryCluster() override {
    {
      dynmig::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  std::string Kubeconfig() const override { return kubeconfig_; }
  std::string NvmlEndpointTemplate() const override { return nvml_.Template(); }
  std::string Node() const override { return "node-a"; }

  std::vector<std::string> log() {
    dynmig::MutexLock lock(&mu_);
    return log_;
  }

  // Blocks (real time, at most 10 s) until the loop has made one more full pass over the pods:
  // whatever the canary did before the call has been answered.
  bool AwaitPass() {
    dynmig::MutexLock lock(&mu_);
    const uint64_t seen = passes_;
    auto next = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return passes_ > seen + 1 || stop_; };
    return mu_.AwaitWithTimeout(dynmig::Condition(&next), absl::Seconds(10));
  }

 private:
  void Publish() {
    std::vector<NvmlInstance> list = base_;
    for (const auto& [pod, inst] : instances_) list.push_back(inst);
    nvml_.Set("node-a", NvmlDoc("node-a", {{"GPU-a0"}}, list));
  }
  void Note(const std::string& line) {
    dynmig::MutexLock lock(&mu_);
    log_.push_back(line);
  }
  void Loop() {
    while (true) {
      {
        // One pass every 5 ms of real time: the cluster runs beside the canary, not on its clock.
        dynmig::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(dynmig::Condition(&stop_), absl::Milliseconds(5))) return;
      }
      auto pods = server_.store().List(kube::Resource::kPods, {});
      if (pods.ok()) {
        for (const auto& stored : pods->items) Handle(stored->object);
      }
      dynmig::MutexLock lock(&mu_);
      ++passes_;
    }
  }
  void Handle(const json& pod) {
    const std::string ns = kube::Namespace(pod), name = kube::Name(pod), key = ns + "/" + name;
    if (name != "mig-canary") return;
    auto& store = server_.store();
    if (kube::IsBeingDeleted(pod)) {
      if (!faults_.keep_instance && instances_.erase(key)) Publish();
      (void)store.Delete(kube::Resource::kPods, ns, name, {.grace_period_seconds = 0});
      Note("deleted " + key);
      return;
    }
    if (!kube::NodeName(pod).empty() || faults_.never_schedule) return;
    // Scheduler: 1g.5gb at slice 3 (slices 0-1 are held by another pod in the fixture).
    Alloc a{"GPU-a0", "1g.5gb", 3, 1};
    if (!faults_.no_identity) a.runtime = Runtime{"MIG-canary", 9, 0};
    json patch = {{"metadata",
                   {{"annotations",
                     {{std::string(protocol::kMigAllocationsAnnotation), Allocations({a})},
                      {std::string(protocol::kVgpuNodeAnnotation), "node-a"},
                      {std::string(protocol::kBindPhaseAnnotation), "success"}}}}}};
    if (!faults_.wrong_visible) {
      patch["metadata"]["annotations"][std::string(kVisibleDevicesAnnotation)] =
          json{{"workload", faults_.no_identity ? "" : "MIG-canary"}}.dump();
    } else {
      patch["metadata"]["annotations"][std::string(kVisibleDevicesAnnotation)] =
          R"({"workload":"MIG-someone-else"})";
    }
    ASSERT_TRUE(
        store.Patch(kube::Resource::kPods, ns, name, patch, kube::PatchType::kMerge, "").ok());
    json binding = {{"apiVersion", "v1"},
                    {"kind", "Binding"},
                    {"metadata", {{"name", name}, {"namespace", ns}}},
                    {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", "node-a"}}}};
    ASSERT_TRUE(store.Bind(ns, name, binding).ok());
    if (faults_.fail_allocate) {
      (void)store.Patch(kube::Resource::kPods, ns, name,
                        {{"status",
                          {{"phase", "Failed"},
                           {"reason", "UnexpectedAdmissionError"},
                           {"message", "Allocate failed: injected"}}}},
                        kube::PatchType::kMerge, "status");
      Note("failed " + key);
      return;
    }
    if (!faults_.no_identity) {
      instances_[key] = {"GPU-a0", "1g.5gb", 3, 1, 9, 0, "MIG-canary"};
      Publish();
    }
    (void)store.Patch(kube::Resource::kPods, ns, name, {{"status", {{"phase", "Running"}}}},
                      kube::PatchType::kMerge, "status");
    Note("running " + key);
  }

  kube::InMemoryApiServer& server_;
  FakeNvmlEndpoint& nvml_;
  const std::string kubeconfig_;
  const Faults faults_;
  const std::vector<NvmlInstance> base_;
  std::map<std::string, NvmlInstance> instances_;  // loop thread only
  dynmig::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
  uint64_t passes_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

// Moves a FakeClock to the next deadline each time the code under test sleeps or waits on it, once
// `settle` returns (the world it polls has answered), until destroyed: the canary's polls and
// timeouts run in simulated time.
class ClockDriver {
 public:
  ClockDriver(FakeClock& clock, std::function<void()> settle)
      : clock_(clock), settle_(std::move(settle)), thread_([this] { Loop(); }) {}
  ~ClockDriver() {
    stop_ = true;
    thread_.join();
  }

 private:
  void Loop() {
    while (!stop_) {
      if (!clock_.AwaitWaiters(1, absl::Milliseconds(10))) continue;
      settle_();
      clock_.AdvanceToNextDeadline();
    }
  }

  FakeClock& clock_;
  const std::function<void()> settle_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class CanaryTest : public OpsTest {
 protected:
  void SetUp() override {
    OpsTest::SetUp();
    AddDeviceConfig();
    Add(Node("node-a", Register({{"GPU-a0"}}, {"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"}),
             json::object(), /*cordoned=*/true));
    // Another pod holds slices 0-1 (the canary's release must not disturb it).
    Add(PlacedPod("neighbour", "node-a", 9000,
                  {{"GPU-a0", "2g.10gb", 0, 2, Runtime{"MIG-n", 3, 0}}}));
  }
  // `clock`: run on it (null: the real clock).
  json RunCanary(CanaryCluster& cluster, int code, const Clock* clock = nullptr) {
    std::vector<std::string> args = {"validate",
                                     "--canary",
                                     "--node",
                                     cluster.Node(),
                                     "--nvml-endpoint",
                                     cluster.NvmlEndpointTemplate(),
                                     "--timeout",
                                     "3s",
                                     "--canary-poll",
                                     "20ms",
                                     "--kubeconfig",
                                     cluster.Kubeconfig(),
                                     "-o",
                                     "json"};
    auto r =
        clock != nullptr ? cli::testing::RunDynmig(args, *clock) : cli::testing::RunDynmig(args);
    EXPECT_EQ(r.code, code) << r.out << r.err;
    try {
      return json::parse(r.out);
    } catch (...) {
      ADD_FAILURE() << r.out << r.err;
      return json();
    }
  }
  bool CanaryGone() {
    return server_->store().Get(kube::Resource::kPods, "default", "mig-canary").status().code() ==
           absl::StatusCode::kNotFound;
  }
  FakeNvmlEndpoint nvml_;
};

TEST_F(CanaryTest, FullLifecyclePasses) {
  FakeCanaryCluster cluster(*server_, nvml_, kubeconfig_, {},
                            {{"GPU-a0", "2g.10gb", 0, 2, 3, 0, "MIG-n"}});
  const json r = RunCanary(cluster, 0);
  for (const char* check :
       {"canary-create", "canary-running", "canary-reservation", "canary-profile", "canary-overlap",
        "canary-runtime", "canary-visible", "canary-nvml", "canary-delete", "canary-released",
        "canary-reclaimed"}) {
    EXPECT_EQ(Result(r, check, "default/mig-canary"), "PASS") << check << "\n" << r.dump(2);
  }
  EXPECT_TRUE(Items(r, "canary-cleanup").empty());
  EXPECT_NE(Evidence(r, "canary-profile").find("1g.5gb (4864 MiB in NVML) covers 4500 MiB"),
            std::string::npos);
  EXPECT_NE(Evidence(r, "canary-reclaimed").find("NVML no longer has MIG-canary"),
            std::string::npos);
  // The step log is in the JSON notes.
  ASSERT_TRUE(r.contains("notes"));
  EXPECT_GE(r["notes"].size(), 5u);
  EXPECT_TRUE(CanaryGone());
  // The neighbour was not touched.
  EXPECT_TRUE(server_->store().Get(kube::Resource::kPods, "default", "neighbour").ok());
}

TEST_F(CanaryTest, CanaryPodAsTheGuideWritesIt) {
  CanaryOptions options;
  options.node = "node-a";
  const json pod = CanaryPod(options, {});
  EXPECT_EQ(pod["metadata"]["name"], "mig-canary");
  EXPECT_EQ(pod["metadata"]["annotations"]["nvidia.com/vgpu-mode"], "mig");
  EXPECT_EQ(pod["spec"]["restartPolicy"], "Never");
  EXPECT_EQ(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "1");
  EXPECT_EQ(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"], "4500");
  EXPECT_EQ(pod["spec"]["containers"][0]["command"][2], "sleep 3600");
  EXPECT_EQ(pod["spec"]["tolerations"][0]["key"], "node.kubernetes.io/unschedulable");
  EXPECT_EQ(
      pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
         ["nodeSelectorTerms"][0]["matchFields"][0]["values"][0],
      "node-a");
}

TEST_F(CanaryTest, NeverRunningTimesOutAndCleansUp) {
  FakeCanaryCluster cluster(*server_, nvml_, kubeconfig_, {.never_schedule = true},
                            {{"GPU-a0", "2g.10gb", 0, 2, 3, 0, "MIG-n"}});
  // The 3 s bound passes in simulated time, one poll per pass of the cluster.
  FakeClock clock;
  ClockDriver driver(clock, [&] { cluster.AwaitPass(); });
  const json r = RunCanary(cluster, 1, &clock);
  EXPECT_EQ(Result(r, "canary-running"), "FAIL");
  EXPECT_NE(Evidence(r, "canary-running").find("not bound to a node"), std::string::npos)
      << Evidence(r, "canary-running");
  EXPECT_EQ(Result(r, "canary-cleanup"), "PASS");
  EXPECT_EQ(Result(r, "canary-delete"), "absent");
  EXPECT_TRUE(CanaryGone());
}

TEST_F(CanaryTest, FailedAllocateIsReportedAndCleanedUp) {
  FakeCanaryCluster cluster(*server_, nvml_, kubeconfig_, {.fail_allocate = true},
                            {{"GPU-a0", "2g.10gb", 0, 2, 3, 0, "MIG-n"}});
  const json r = RunCanary(cluster, 1);
  EXPECT_EQ(Result(r, "canary-running"), "FAIL");
  EXPECT_NE(
      Evidence(r, "canary-running").find("UnexpectedAdmissionError: Allocate failed: injected"),
      std::string::npos)
      << Evidence(r, "canary-running");
  EXPECT_EQ(Result(r, "canary-cleanup"), "PASS");
  EXPECT_TRUE(CanaryGone());
}

TEST_F(CanaryTest, MissingRuntimeIdentityFails) {
  FakeCanaryCluster cluster(*server_, nvml_, kubeconfig_, {.no_identity = true},
                            {{"GPU-a0", "2g.10gb", 0, 2, 3, 0, "MIG-n"}});
  const json r = RunCanary(cluster, 1);
  EXPECT_EQ(Result(r, "canary-reservation"), "PASS");
  EXPECT_EQ(Result(r, "canary-runtime"), "FAIL");
  EXPECT_EQ(Result(r, "canary-delete"), "PASS");
  EXPECT_EQ(Result(r, "canary-reclaimed"), "SKIP");
  EXPECT_TRUE(CanaryGone());
}

TEST_F(CanaryTest, MismatchedVisibleUuidFails) {
  FakeCanaryCluster cluster(*server_, nvml_, kubeconfig_, {.wrong_visible = true},
                            {{"GPU-a0", "2g.10gb", 0, 2, 3, 0, "MIG-n"}});
  const json r = RunCanary(cluster, 1);
  EXPECT_EQ(Result(r, "canary-visible"), "FAIL");
  EXPECT_NE(
      Evidence(r, "canary-visible").find("sees MIG-someone-else, the annotation says MIG-canary"),
      std::string::npos);
  EXPECT_EQ(Result(r, "canary-nvml"), "PASS");
}

TEST_F(CanaryTest, InstanceNotReclaimedFails) {
  FakeCanaryCluster cluster(*server_, nvml_, kubeconfig_, {.keep_instance = true},
                            {{"GPU-a0", "2g.10gb", 0, 2, 3, 0, "MIG-n"}});
  FakeClock clock;
  ClockDriver driver(clock, [&] { cluster.AwaitPass(); });
  const json r = RunCanary(cluster, 1, &clock);
  EXPECT_EQ(Result(r, "canary-released"), "PASS");
  EXPECT_EQ(Result(r, "canary-reclaimed"), "FAIL");
  EXPECT_NE(Evidence(r, "canary-reclaimed").find("NVML still has MIG-canary"), std::string::npos);
}

TEST_F(CanaryTest, ExistingPodOfThatNameIsNeverTouched) {
  json mine = Pod("mig-canary", "", 4000, "Pending");
  mine["metadata"]["labels"] = {{"owner", "someone"}};
  Add(mine);
  FakeCanaryCluster cluster(*server_, nvml_, kubeconfig_, {.never_schedule = true},
                            {{"GPU-a0", "2g.10gb", 0, 2, 3, 0, "MIG-n"}});
  const json r = RunCanary(cluster, 1);
  EXPECT_EQ(Result(r, "canary-create"), "FAIL");
  EXPECT_EQ(r["items"].back()["check"], "canary-create");
  auto still = server_->store().Get(kube::Resource::kPods, "default", "mig-canary");
  ASSERT_TRUE(still.ok());
  EXPECT_EQ((*still)["metadata"]["labels"]["owner"], "someone");
}

// End to end against the local mode: tests/e2e/ops_e2e_test.cc (OpsE2eTest.Validate*).

}  // namespace
}  // namespace dynmig::ops::testing
