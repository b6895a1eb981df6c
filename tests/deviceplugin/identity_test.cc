// Whom the device plugin serves (issue 27, behaviour 3): the ledger of served Allocates,
// PreStartContainer's proof against the kubelet's PodResources API and the API's UID, and the
// Allocate-time check that the kubelet knows the lock owner. Through the real gRPC path (test
// kubelet -> plugin -> SimNvml + API) and on the pure check (identity.h).
#include "deviceplugin/identity.h"

#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "deviceplugin/pod_resources.h"
#include "dp_test_util.h"
#include "podresources/v1/api.grpc.pb.h"
#include "podresources/v1alpha1/api.grpc.pb.h"

namespace dynmig::deviceplugin::testing {
namespace {

class IdentityTest : public PluginTest {
 protected:
  // A pod in the API that asks for a device but carries no reservation (it reached the node
  // around the scheduler).
  void CreateThief(const std::string& name) {
    kube::Object pod = {
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", {{"name", name}, {"namespace", "default"}}},
        {"spec",
         {{"nodeName", kNode},
          {"containers",
           kube::Object::array({{{"name", "main"},
                                 {"image", "cuda"},
                                 {"resources", {{"limits", {{"nvidia.com/gpu", "1"}}}}}}})}}},
        {"status", {{"phase", "Pending"}}}};
    ASSERT_TRUE(kube_->CreatePod(pod).ok());
  }
  double Refusals(std::string_view reason) {
    return plugin_->metrics().Value("dynmig_deviceplugin_prestart_refusals_total", "reason",
                                    reason);
  }
};

TEST_F(IdentityTest, PreStartProvesTheReservedPodAndRecordsTheLedger) {
  StartPlugin();
  const kube::Object pod = CreatePod("p", {{0, 0, 0, "1g.5gb", 6}});
  auto a = Allocate("p", 0, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string uuid = a->response.envs().at("NVIDIA_VISIBLE_DEVICES");

  auto ledger = plugin_->core().Ledger();
  ASSERT_EQ(ledger.size(), 1u);
  EXPECT_EQ(ledger[0].device_ids, a->device_ids);
  EXPECT_EQ(ledger[0].pod_uid, kube::Uid(pod));
  EXPECT_EQ(ledger[0].PodKey(), "default/p");
  EXPECT_EQ(ledger[0].container, "c0");
  EXPECT_FALSE(ledger[0].init_container);
  EXPECT_EQ(ledger[0].mig_uuids, std::vector<std::string>{uuid});

  DP_ASSERT_OK(kubelet_->PreStart("default/p", "c0"));
  EXPECT_EQ(kubelet_->prestart_calls(), 1);
  EXPECT_EQ(plugin_->metrics().Value("dynmig_deviceplugin_prestart_refusals_total"), 0);
}

TEST_F(IdentityTest, PreStartStillProvesAfterAPluginRestart) {
  StartPlugin();
  CreatePod("p", {{0, 0, 0, "2g.10gb", 0}, {0, 1, 1, "1g.5gb", 6}});
  auto a = Allocate("p", 0, 2);
  ASSERT_TRUE(a.ok()) << a.status();
  StartPlugin();  // a new process: the ledger comes from the state file
  ASSERT_EQ(plugin_->core().Ledger().size(), 1u);
  DP_ASSERT_OK(kubelet_->PreStart("default/p", "c0"));
  // And a container restart later proves it again.
  DP_ASSERT_OK(kubelet_->PreStart("default/p", "c0"));
}

// Behaviour 3 replayed: the victim holds the node lock and the kubelet knows it (it is being
// admitted); a thief pod's Allocate is served the victim's reservation. The thief's container
// does not start, and the victim's instance is neither given away nor destroyed.
TEST_F(IdentityTest, AThiefServedTheVictimsReservationIsRefusedAtPreStart) {
  StartPlugin();
  const kube::Object victim = CreatePod("victim", {{0, 0, 0, "3g.20gb", 4}});
  CreateThief("thief");
  kubelet_->AddPod("default/victim", {"c0"});
  auto stolen = kubelet_->AllocateCount("default/thief", "main", 1);
  ASSERT_TRUE(stolen.ok()) << stolen.status();  // Allocate alone cannot tell
  const std::string uuid = stolen->response.envs().at("NVIDIA_VISIBLE_DEVICES");
  ASSERT_TRUE(GiAt(0, 4).has_value());

  auto st = kubelet_->PreStart("default/thief", "main");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("device plugin PreStartContainer rpc failed with err: rpc error: "
                              "code = FailedPrecondition desc = "),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("served for pod default/victim (uid " + kube::Uid(victim)),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("the kubelet gave them to pod default/thief container main"),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find(uuid), std::string::npos) << st;
  EXPECT_EQ(Refusals(kIdentityOtherPod), 1);
  plugin_->events().Flush(absl::Seconds(5));
  EXPECT_TRUE(HasEvent(kReasonIdentityMismatch, "default/thief"));
  bool on_thief = false, on_victim = false;
  for (const auto& e : plugin_->events().Recent()) {
    if (e.reason != kReasonIdentityMismatch) continue;
    on_thief = on_thief || e.object == "Pod default/thief";
    on_victim = on_victim || e.object == "Pod default/victim";
  }
  EXPECT_TRUE(on_thief);
  EXPECT_TRUE(on_victim);

  // Nothing destroyed, still the victim's, also after a reconcile; every retry is refused.
  plugin_->core().Reconcile();
  ASSERT_TRUE(GiAt(0, 4).has_value());
  auto managed = plugin_->core().Managed();
  ASSERT_EQ(managed.size(), 1u);
  EXPECT_EQ(managed[0].owner.pod_uid, kube::Uid(victim));
  EXPECT_EQ(managed[0].mig_uuid, uuid);
  EXPECT_FALSE(kubelet_->PreStart("default/thief", "main").ok());
  EXPECT_EQ(Refusals(kIdentityOtherPod), 2);
}

// The Allocate-time check: the kubelet always knows the pod it admits, so an Allocate while it
// does not list the lock owner is another pod's. Refused without touching the owner, which is
// then served.
TEST_F(IdentityTest, AnAllocateWhileTheKubeletDoesNotKnowTheLockOwnerIsRefused) {
  StartPlugin();
  CreatePod("victim", {{0, 0, 0, "1g.5gb", 6}});
  CreateThief("thief");
  auto stolen = kubelet_->AllocateCount("default/thief", "main", 1);
  ASSERT_FALSE(stolen.ok());
  EXPECT_EQ(stolen.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stolen.status().message().find("does not list it"), std::string::npos)
      << stolen.status();
  EXPECT_EQ(TotalGis(), 0u);
  EXPECT_TRUE(NodeLock().has_value()) << "the lock stays the owner's";
  EXPECT_EQ(PodAnnotation("victim", protocol::kBindPhaseAnnotation), "allocating");
  EXPECT_EQ(plugin_->metrics().Value("dynmig_deviceplugin_refusals_total", "reason",
                                     "owner_unknown_to_kubelet"),
            1);
  kubelet_->ReleasePod("default/thief");  // rejected at admission

  auto served = Allocate("victim", 0, 1);
  ASSERT_TRUE(served.ok()) << served.status();
  DP_ASSERT_OK(kubelet_->PreStart("default/victim", "c0"));
}

TEST_F(IdentityTest, APodRecreatedUnderTheVictimsNameIsRefused) {
  StartPlugin();
  const kube::Object victim = CreatePod("p", {{0, 0, 0, "1g.5gb", 6}});
  ASSERT_TRUE(Allocate("p", 0, 1).ok());
  kube::DeleteOptions now;
  now.grace_period_seconds = 0;
  ASSERT_TRUE(kube_->DeletePod("default", "p", now).ok());
  const kube::Object other = CreatePod("p", {{0, 0, 0, "1g.5gb", 6}}, 1, /*lock=*/false);
  ASSERT_NE(kube::Uid(other), kube::Uid(victim));

  auto st = kubelet_->PreStart("default/p", "c0");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("pod default/p is now uid " + kube::Uid(other)), std::string::npos)
      << st;
  EXPECT_EQ(Refusals(kIdentityUidMismatch), 1);
  EXPECT_TRUE(GiAt(0, 6).has_value()) << "a refusal destroys nothing";
}

TEST_F(IdentityTest, PodResourcesUnreachableIsRefusedWithAClearMessage) {
  const std::string missing = dir_.path() + "/nowhere/kubelet.sock";
  StartPlugin([&](DevicePluginOptions& o) {
    o.pod_resources_socket = missing;
    o.pod_resources_timeout = absl::Milliseconds(300);
  });
  CreatePod("p", {{0, 0, 0, "1g.5gb", 6}});
  // Allocate goes on (its check is an extra; PreStartContainer is the proof).
  auto a = Allocate("p", 0, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  auto st = kubelet_->PreStart("default/p", "c0");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("cannot prove that devices nvidia.com/gpu " + a->device_ids[0] +
                              " went to pod default/p"),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("unix://" + missing), std::string::npos) << st;
  EXPECT_EQ(Refusals(kIdentityKubeletUnreachable), 1);
  EXPECT_TRUE(GiAt(0, 6).has_value());
}

TEST_F(IdentityTest, TheLedgerForgetsEndedPodsAndReusedIdsReplaceAnEntry) {
  StartPlugin();
  CreatePod("a", {{0, 0, 0, "1g.5gb", 6}});
  auto first = Allocate("a", 0, 1);
  ASSERT_TRUE(first.ok());
  SetPhase("a", "Succeeded");
  plugin_->core().Reconcile();
  EXPECT_TRUE(plugin_->core().Ledger().empty());

  // The same device IDs handed to the next pod: the entry is the new pod's.
  DeletePod("a");
  const kube::Object b = CreatePod("b", {{0, 0, 0, "1g.5gb", 6}});
  auto second = kubelet_->Allocate("default/b", "c0", first->device_ids);
  ASSERT_TRUE(second.ok()) << second.status();
  auto ledger = plugin_->core().Ledger();
  ASSERT_EQ(ledger.size(), 1u);
  EXPECT_EQ(ledger[0].pod_uid, kube::Uid(b));
  DP_ASSERT_OK(kubelet_->PreStart("default/b", "c0"));
}

// ---- the PodResources client against hostile kubelets ----

// Answers List with `pods` pods named by a `name_bytes`-long string each.
class BigV1 final : public ::v1::PodResourcesLister::Service {
 public:
  BigV1(int pods, size_t name_bytes) : pods_(pods), name_bytes_(name_bytes) {}
  grpc::Status List(grpc::ServerContext*, const ::v1::ListPodResourcesRequest*,
                    ::v1::ListPodResourcesResponse* out) override {
    for (int i = 0; i < pods_; ++i) {
      auto* p = out->add_pod_resources();
      p->set_namespace_("default");
      p->set_name(std::string(name_bytes_, 'x'));
    }
    return grpc::Status::OK;
  }

 private:
  int pods_;
  size_t name_bytes_;
};

// Only the older version, as a kubelet before v1.20.
class OnlyV1alpha1 final : public ::v1alpha1::PodResourcesLister::Service {
 public:
  grpc::Status List(grpc::ServerContext*, const ::v1alpha1::ListPodResourcesRequest*,
                    ::v1alpha1::ListPodResourcesResponse* out) override {
    auto* p = out->add_pod_resources();
    p->set_namespace_("ns");
    p->set_name("p");
    auto* c = p->add_containers();
    c->set_name("main");
    for (const char* id : {"GPU-b::1", "GPU-a::0"}) {
      auto* d = c->add_devices();  // one entry per NUMA node, as the kubelet sends them
      d->set_resource_name("nvidia.com/gpu");
      d->add_device_ids(id);
    }
    return grpc::Status::OK;
  }
};

std::unique_ptr<grpc::Server> ServeOn(const std::string& path, grpc::Service* service) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix://" + path, grpc::InsecureServerCredentials());
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

TEST(PodResourcesClientTest, AHugeAnswerIsRefusedAtTheSizeLimit) {
  TempDir dir;
  const std::string path = dir.path() + "/pr.sock";
  BigV1 big(6, 1 << 20);  // 6 MiB
  auto server = ServeOn(path, &big);
  ASSERT_NE(server, nullptr);
  GrpcPodResources client({.socket = path, .timeout = absl::Seconds(10)});
  auto listed = client.List();
  ASSERT_FALSE(listed.ok());
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kResourceExhausted) << listed.status();
  EXPECT_NE(listed.status().message().find("limited to 4194304 bytes"), std::string::npos)
      << listed.status();
  // And the identity check refuses on it, naming the limit.
  LedgerEntry e{{"GPU-a::0"}, "uid-1", "default", "p", "main", 0, false, {"MIG-1"}, 0, {}};
  auto v = CheckIdentity({"GPU-a::0"}, &e, listed, "nvidia.com/gpu", std::vector<PodMig>{});
  EXPECT_EQ(v.reason, kIdentityKubeletUnreachable);
  EXPECT_NE(v.message.find("limited to 4194304 bytes"), std::string::npos) << v.message;
  server->Shutdown();
}

TEST(PodResourcesClientTest, AGarbageAnswerIsAnErrorWithinTheDeadline) {
  TempDir dir;
  const std::string path = dir.path() + "/junk.sock";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 8), 0);
  std::atomic<bool> stop{false};
  std::thread junk([&] {
    while (!stop) {
      const int c = ::accept(fd, nullptr, nullptr);
      if (c < 0) return;
      const std::string garbage(64 << 10, '\xff');
      (void)!::write(c, garbage.data(), garbage.size());
      ::close(c);
    }
  });
  GrpcPodResources client({.socket = path, .timeout = absl::Milliseconds(500)});
  const absl::Time start = absl::Now();
  auto listed = client.List();
  EXPECT_FALSE(listed.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_NE(listed.status().message().find("unix://" + path), std::string::npos) << listed.status();
  stop = true;
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
  junk.join();
}

TEST(PodResourcesClientTest, FallsBackToV1alpha1AndJoinsNumaEntries) {
  TempDir dir;
  const std::string path = dir.path() + "/old.sock";
  OnlyV1alpha1 old;
  auto server = ServeOn(path, &old);
  ASSERT_NE(server, nullptr);
  GrpcPodResources client({.socket = path});
  auto listed = client.List();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].Key(), "ns/p");
  ASSERT_EQ((*listed)[0].containers.size(), 1u);
  EXPECT_EQ((*listed)[0].containers[0].devices.at("nvidia.com/gpu"),
            (std::vector<std::string>{"GPU-a::0", "GPU-b::1"}));
  EXPECT_TRUE(client.List().ok());  // the second call goes to v1alpha1 at once
  server->Shutdown();
}

TEST(PodResourcesClientTest, TheSocketBesideTheDevicePluginDirectory) {
  EXPECT_EQ(PodResourcesSocketBeside("/var/lib/kubelet/device-plugins"),
            "/var/lib/kubelet/pod-resources/kubelet.sock");
  EXPECT_EQ(PodResourcesSocketBeside("/var/lib/kubelet/device-plugins/"),
            "/var/lib/kubelet/pod-resources/kubelet.sock");
  EXPECT_EQ(PodResourcesSocketBeside("/tmp/x/kl"), "/tmp/x/pod-resources/kubelet.sock");
}

// ---- the pure check ----

PodMig ApiPod(const std::string& name, const std::string& uid, const std::string& phase = "") {
  kube::Object pod = {{"metadata", {{"name", name}, {"namespace", "default"}, {"uid", uid}}},
                      {"status", {{"phase", phase}}}};
  return AnalyzePod(pod);
}

PodResourcesList Kubelet(
    std::vector<std::tuple<std::string, std::string, std::vector<std::string>>> holders) {
  PodResourcesList out;
  for (auto& [pod, container, ids] : holders) {
    PodResourcesPod p{"default", pod, {}};
    p.containers.push_back({container, {{"nvidia.com/gpu", ids}}});
    out.push_back(std::move(p));
  }
  return out;
}

class CheckIdentityTest : public ::testing::Test {
 protected:
  IdentityVerdict Check(const PodResourcesList& kubelet, const std::vector<PodMig>& pods,
                        const LedgerEntry* entry = nullptr) {
    return CheckIdentity({"GPU-a::1", "GPU-a::0"}, entry != nullptr ? entry : &entry_, kubelet,
                         "nvidia.com/gpu", pods);
  }
  LedgerEntry entry_{{"GPU-a::0", "GPU-a::1"}, "uid-v", "default", "victim", "main", 0, false,
                     {"MIG-1", "MIG-2"},       0,       {}};
};

TEST_F(CheckIdentityTest, AgreesWhenLedgerKubeletAndApiSayTheSame) {
  auto v =
      Check(Kubelet({{"victim", "main", {"GPU-a::0", "GPU-a::1"}}}), {ApiPod("victim", "uid-v")});
  EXPECT_TRUE(v.ok()) << v.message;
}

TEST_F(CheckIdentityTest, RefusesEverythingThatDoesNotAgree) {
  const std::vector<PodMig> api = {ApiPod("victim", "uid-v"), ApiPod("thief", "uid-t")};
  // No record of these IDs.
  auto v = CheckIdentity({"GPU-a::5"}, nullptr, Kubelet({}), "nvidia.com/gpu", api);
  EXPECT_EQ(v.reason, kIdentityNoRecord);
  // No devices named at all.
  EXPECT_EQ(CheckIdentity({}, &entry_, Kubelet({}), "nvidia.com/gpu", api).reason,
            kIdentityNoDevices);
  // Nobody holds exactly these (one holds only some).
  v = Check(Kubelet({{"thief", "main", {"GPU-a::0"}}}), api);
  EXPECT_EQ(v.reason, kIdentityNoHolder);
  EXPECT_NE(v.message.find("some of them: pod default/thief container main"), std::string::npos)
      << v.message;
  // Another pod holds them.
  v = Check(Kubelet({{"thief", "main", {"GPU-a::0", "GPU-a::1"}}}), api);
  EXPECT_EQ(v.reason, kIdentityOtherPod);
  EXPECT_EQ(v.pods, (std::vector<std::string>{"default/victim", "default/thief"}));
  // Two pods hold them.
  v = Check(Kubelet({{"victim", "main", {"GPU-a::0", "GPU-a::1"}},
                     {"thief", "main", {"GPU-a::0", "GPU-a::1"}}}),
            api);
  EXPECT_EQ(v.reason, kIdentityAmbiguous);
  // Another container of the same pod holds them.
  v = Check(Kubelet({{"victim", "sidecar", {"GPU-a::0", "GPU-a::1"}}}), api);
  EXPECT_EQ(v.reason, kIdentityOtherContainer);
  // The API's pod of that name has another UID; the pod is gone; it is being deleted.
  const auto held = Kubelet({{"victim", "main", {"GPU-a::0", "GPU-a::1"}}});
  EXPECT_EQ(Check(held, {ApiPod("victim", "uid-new")}).reason, kIdentityUidMismatch);
  EXPECT_EQ(Check(held, {}).reason, kIdentityPodGone);
  EXPECT_EQ(Check(held, {ApiPod("victim", "uid-v", "Succeeded")}).reason, kIdentityPodGone);
  // The API cannot be read.
  EXPECT_EQ(CheckIdentity({"GPU-a::0", "GPU-a::1"}, &entry_, held, "nvidia.com/gpu",
                          absl::UnavailableError("down"))
                .reason,
            kIdentityApiUnreachable);
}

// The v1.20 kubelet does not list init containers: an init container's devices are proven by the
// weaker evidence (the kubelet knows the recorded pod, no container it lists holds any of them, the
// UID agrees), and refused when any of that fails.
TEST_F(CheckIdentityTest, AnInitContainersDevicesNeedThePodKnownAndNoOtherHolder) {
  LedgerEntry init = entry_;
  init.container = "setup";
  init.init_container = true;
  auto v = Check(Kubelet({{"victim", "main", {}}}), {ApiPod("victim", "uid-v")}, &init);
  EXPECT_TRUE(v.ok()) << v.message;
  // The kubelet hands them on to an app container of the same pod.
  v = Check(Kubelet({{"victim", "main", {"GPU-a::0", "GPU-a::1"}}}), {ApiPod("victim", "uid-v")},
            &init);
  EXPECT_TRUE(v.ok()) << v.message;
  // The kubelet does not know the pod.
  v = Check(Kubelet({{"thief", "main", {}}}), {ApiPod("victim", "uid-v")}, &init);
  EXPECT_EQ(v.reason, kIdentityInitContainer);
  EXPECT_NE(v.message.find("lists no init containers"), std::string::npos) << v.message;
  // Another pod holds some of them.
  v = Check(Kubelet({{"victim", "main", {}}, {"thief", "main", {"GPU-a::0"}}}),
            {ApiPod("victim", "uid-v")}, &init);
  EXPECT_EQ(v.reason, kIdentityInitContainer);
  // Another pod holds exactly them.
  v = Check(Kubelet({{"victim", "main", {}}, {"thief", "main", {"GPU-a::0", "GPU-a::1"}}}),
            {ApiPod("victim", "uid-v")}, &init);
  EXPECT_EQ(v.reason, kIdentityOtherPod);
  // A recreated pod under the name.
  v = Check(Kubelet({{"victim", "main", {}}}), {ApiPod("victim", "uid-new")}, &init);
  EXPECT_EQ(v.reason, kIdentityUidMismatch);
}

// Devices allocated before the plugin kept a ledger (an upgrade): a container restart is proven
// when the kubelet's single holder is a pod whose whole reservation the device plugin realized; a
// pod without one (a thief served another pod's reservation) is still refused.
TEST_F(CheckIdentityTest, AnUnrecordedAllocationIsAdoptedOnlyForARealizedReservation) {
  const std::string realized =
      R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",)"
      R"("placement":{"start":0,"size":1},"migUUID":"MIG-1","gpuInstanceID":7,"computeInstanceID":0}])";
  auto pod = [&](const std::string& name, const std::string& phase, const std::string& alloc) {
    kube::Object p = {{"metadata",
                       {{"name", name},
                        {"namespace", "default"},
                        {"uid", "uid-" + name},
                        {"annotations", kube::Object::object()}}},
                      {"status", {{"phase", "Running"}}}};
    if (!phase.empty()) p["metadata"]["annotations"]["hami.io/bind-phase"] = phase;
    if (!alloc.empty()) p["metadata"]["annotations"]["hami.io/vgpu-mig-allocations"] = alloc;
    return AnalyzePod(p);
  };
  const auto held = Kubelet({{"old", "main", {"GPU-a::0", "GPU-a::1"}}});
  auto check = [&](const PodMig& p) {
    return CheckIdentity({"GPU-a::0", "GPU-a::1"}, nullptr, held, "nvidia.com/gpu",
                         std::vector<PodMig>{p});
  };
  EXPECT_TRUE(check(pod("old", "success", realized)).ok());
  std::string unrealized = realized;
  unrealized.erase(
      unrealized.find(R"(,"migUUID")"),
      std::string(R"(,"migUUID":"MIG-1","gpuInstanceID":7,"computeInstanceID":0)").size());
  EXPECT_EQ(check(pod("old", "success", unrealized)).reason, kIdentityNoRecord);
  EXPECT_EQ(check(pod("old", "allocating", realized)).reason, kIdentityNoRecord);
  EXPECT_EQ(check(pod("old", "", "")).reason, kIdentityNoRecord);
  EXPECT_EQ(check(pod("other", "success", realized)).reason, kIdentityNoRecord);
}

TEST(LedgerStateTest, RoundTripsAndReadsFilesWithoutALedger) {
  PluginState state;
  state.ledger.push_back(
      {{"GPU-a::0", "GPU-a::1"}, "uid", "ns", "p", "main", 2, true, {"MIG-1", "MIG-2"}, 1800, {}});
  auto decoded = DecodeState(EncodeState(state));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, state);
  auto old = DecodeState(R"({"version":1,"nextIntentId":1,"instances":[],"intents":[]})");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_TRUE(old->ledger.empty());
}

TEST(LedgerStateTest, AMalformedLedgerNamesTheField) {
  auto bad = DecodeState(
      R"({"version":1,"nextIntentId":1,"instances":[],"intents":[],
          "ledger":[{"deviceIDs":["a",7],"podUID":"u","namespace":"n","name":"p",
                     "container":"c","containerIndex":0,"initContainer":false,
                     "migUUIDs":[],"since":0}]})");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("state.ledger[0].deviceIDs: must be an array of strings"),
            std::string::npos)
      << bad.status();
  EXPECT_FALSE(DecodeState(R"({"version":1,"nextIntentId":1,"instances":[],"intents":[],
                               "ledger":{}})")
                   .ok());
}

}  // namespace
}  // namespace dynmig::deviceplugin::testing
