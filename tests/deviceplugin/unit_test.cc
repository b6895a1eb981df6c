// Pure parts: the state file, pod analysis, replica ids, CDI specs, metrics, the CLI's input
// checks.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "cli/cli.h"
#include "deviceplugin/cdi.h"
#include "deviceplugin/inventory.h"
#include "deviceplugin/metrics.h"
#include "deviceplugin/pods.h"
#include "deviceplugin/state_store.h"
#include "dp_test_util.h"
#include "nlohmann/json.hpp"
#include "protocol/annotations.h"

namespace dynmig::deviceplugin::testing {
namespace {

PluginState SampleState() {
  PluginState s;
  ManagedInstance m;
  m.gpu_uuid = "GPU-a";
  m.profile = "1g.5gb";
  m.profile_id = 19;
  m.placement = {6, 1};
  m.gpu_instance_id = 13;
  m.compute_instance_id = 0;
  m.mig_uuid = "MIG-x";
  m.owner = {"uid-1", "default", "p", 1, 2};
  m.origin = "created";
  m.since = 1800000000;
  s.instances.push_back(m);
  Intent i;
  i.id = 7;
  i.owner = {"uid-2", "ns", "q", 0, 0};
  i.gpu_uuid = "GPU-b";
  i.profile = "3g.20gb";
  i.placement = {4, 4};
  i.created = 1800000001;
  s.intents.push_back(i);
  s.next_intent_id = 8;
  return s;
}

TEST(StateStoreTest, RoundTripsThroughTheFileAtomically) {
  TempDir dir;
  StateStore store(dir.path() + "/sub/state.json", /*fsync=*/true);
  auto empty = store.Load();
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->instances.empty());
  ASSERT_TRUE(store.Save(SampleState()).ok());
  auto loaded = store.Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, SampleState());
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path() + "/sub")) {
    ++files;
    EXPECT_EQ(e.path().filename(), "state.json");
  }
  EXPECT_EQ(files, 1u);
}

TEST(StateStoreTest, IdleInstancesRoundTrip) {
  PluginState s = SampleState();
  s.instances[0].idle = true;
  s.instances[0].idle_since = 1800000300;
  const std::string text = EncodeState(s);
  EXPECT_NE(text.find("\"idleSince\": 1800000300"), std::string::npos) << text;
  auto back = DecodeState(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, s);
  // Not idle: no idle keys (files of older versions read the same).
  EXPECT_EQ(EncodeState(SampleState()).find("idle"), std::string::npos);
  auto bad = DecodeState(R"({"version":1,"nextIntentId":1,"intents":[],"instances":[)"
                         R"({"gpuUUID":"g","profile":"1g.5gb","profileId":19,)"
                         R"("placement":{"start":0,"size":1},"gpuInstanceID":1,)"
                         R"("computeInstanceID":0,"migUUID":"m","origin":"created","since":1,)"
                         R"("owner":{"podUID":"u","namespace":"n","name":"p","containerIndex":0,)"
                         R"("deviceIndex":0},"idle":true}]})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("state.instances[0].idleSince: missing"), std::string::npos)
      << bad.status();
}

TEST(StateStoreTest, ACorruptFileIsDataLossNamingTheField) {
  auto bad =
      DecodeState(R"({"version":1,"nextIntentId":1,"instances":[{"gpuUUID":3}],"intents":[]})");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("state.instances[0].gpuUUID: must be a string"),
            std::string::npos)
      << bad.status();
  EXPECT_EQ(DecodeState("nope").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(DecodeState(R"({"version":2,"nextIntentId":1,"instances":[],"intents":[]})")
                .status()
                .message()
                .find("version: 2 is not supported"),
            std::string::npos);
}

kube::Object Pod(const std::string& name, std::map<std::string, std::string> annotations,
                 const std::string& phase = "Pending") {
  kube::Object pod = {{"metadata",
                       {{"name", name},
                        {"namespace", "default"},
                        {"uid", "uid-" + name},
                        {"annotations", kube::Object::object()}}},
                      {"status", {{"phase", phase}}}};
  for (const auto& [k, v] : annotations) pod["metadata"]["annotations"][k] = v;
  return pod;
}

TEST(PodsTest, ReadsTheNodeLockOfANode) {
  auto node = [](const std::string& lock) {
    return kube::Object{{"metadata", {{"annotations", {{"hami.io/mutex.lock", lock}}}}}};
  };
  auto lock = NodeLockOf(node("2026-01-02T03:04:05Z,team-a,pod-1,uid-1"));
  ASSERT_TRUE(lock.has_value());
  EXPECT_EQ(lock->ns, "team-a");
  EXPECT_EQ(lock->pod, "pod-1");
  EXPECT_EQ(lock->uid, "uid-1");
  EXPECT_FALSE(NodeLockOf(node("t,,p")).has_value());
  EXPECT_FALSE(NodeLockOf(kube::Object{{"metadata", kube::Object::object()}}).has_value());
}

protocol::NodeLock Lock(const std::string& pod, std::string uid = "") {
  return protocol::NodeLock{absl::UnixEpoch(), "default", pod, std::move(uid)};
}

// bind-phase alone never picks the pod of an Allocate: the node lock, bind-phase, vgpu-node and
// the reservation must agree; an allocation in progress (lock already released) goes on.
TEST(PodsTest, ThePendingPodIsConfirmedByTheLockAndItsReservation) {
  const std::string devices = "GPU-a,NVIDIA A100-SXM4-40GB,4864,15:;";
  const std::string reservation =
      R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":0,"size":1}}])";
  auto make = [&](const std::string& name, const std::string& bind_time,
                  std::map<std::string, std::string> overrides = {}) {
    std::map<std::string, std::string> a = {{"hami.io/vgpu-devices-to-allocate", devices},
                                            {"hami.io/vgpu-mig-allocations", reservation},
                                            {"hami.io/bind-phase", "allocating"},
                                            {"hami.io/vgpu-node", "n"},
                                            {"hami.io/bind-time", bind_time}};
    for (const auto& [k, v] : overrides) {
      if (v.empty()) {
        a.erase(k);
      } else {
        a[k] = v;
      }
    }
    return AnalyzePod(Pod(name, a));
  };
  std::vector<PodMig> pods = {make("late", "200"), make("early", "100")};
  // The lock owner, whatever the bind times; the other claimant is reported.
  PendingPod found = FindPendingPod(pods, "n", Lock("late"));
  ASSERT_NE(found.pod, nullptr);
  EXPECT_EQ(found.pod->name, "late");
  EXPECT_FALSE(found.in_progress);
  ASSERT_EQ(found.mismatches.size(), 1u);
  EXPECT_EQ(found.mismatches[0].pod->name, "early");
  EXPECT_EQ(found.mismatches[0].why, "the node lock (hami.io/mutex.lock) names default/late");
  // No lock: nobody, even the oldest allocating pod; both are reported.
  found = FindPendingPod(pods, "n", std::nullopt);
  EXPECT_EQ(found.pod, nullptr);
  ASSERT_EQ(found.mismatches.size(), 2u);
  EXPECT_EQ(found.mismatches[0].why, "the node lock (hami.io/mutex.lock) is not held");
  // A lock that records the owner's UID takes only that pod, not one recreated under its name.
  found = FindPendingPod(pods, "n", Lock("late", "uid-late"));
  ASSERT_NE(found.pod, nullptr);
  EXPECT_EQ(found.pod->name, "late");
  found = FindPendingPod(pods, "n", Lock("late", "uid-of-the-deleted-late"));
  EXPECT_EQ(found.pod, nullptr);
  ASSERT_EQ(found.mismatches.size(), 2u);
  EXPECT_EQ(found.mismatches[0].why,
            "the node lock (hami.io/mutex.lock) names default/late (uid uid-of-the-deleted-late)");
  // A lock on a pod that is not here: nobody.
  EXPECT_EQ(FindPendingPod(pods, "n", Lock("gone")).pod, nullptr);
  EXPECT_EQ(FindPendingPod(pods, "other-node", Lock("late")).pod, nullptr);
  // The allocation in progress goes on without the lock (it released it), before a newer owner.
  found = FindPendingPod(pods, "n", Lock("late"), "uid-early");
  ASSERT_NE(found.pod, nullptr);
  EXPECT_EQ(found.pod->name, "early");
  EXPECT_TRUE(found.in_progress);
  EXPECT_TRUE(found.mismatches.empty());
  EXPECT_EQ(FindPendingPod(pods, "n", std::nullopt, "uid-early").pod->name, "early");

  // The lock owner must agree: bind-phase, vgpu-node, reservation.
  struct Case {
    std::string key, value, why;
  };
  for (const Case& c : {Case{"hami.io/bind-phase", "success", "bind-phase is \"success\""},
                        Case{"hami.io/bind-phase", "", "bind-phase is \"\""},
                        Case{"hami.io/vgpu-node", "m", "hami.io/vgpu-node is \"m\""},
                        Case{"hami.io/vgpu-mig-allocations", "", "it has no reservation"}}) {
    SCOPED_TRACE(c.key + "=" + c.value);
    std::vector<PodMig> one = {make("p", "100", {{c.key, c.value}})};
    found = FindPendingPod(one, "n", Lock("p"));
    EXPECT_EQ(found.pod, nullptr);
    ASSERT_EQ(found.mismatches.size(), 1u);
    EXPECT_NE(found.mismatches[0].why.find(c.why), std::string::npos) << found.mismatches[0].why;
    // Nor is it taken as the allocation in progress.
    EXPECT_EQ(FindPendingPod(one, "n", std::nullopt, "uid-p").pod, nullptr);
  }
  // A pod with nothing left to allocate is no candidate.
  std::vector<PodMig> done = {make("d", "100", {{"hami.io/vgpu-devices-to-allocate", ";"}})};
  found = FindPendingPod(done, "n", Lock("d"));
  EXPECT_EQ(found.pod, nullptr);
  EXPECT_TRUE(found.mismatches.empty());
}

TEST(PodsTest, UnreadableAnnotationsStillNameTheirGpus) {
  auto partial = AnalyzePod(Pod(
      "p",
      {{"hami.io/vgpu-mig-allocations",
        R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":0,"size":1},"migUUID":"MIG-x"}])"}}));
  EXPECT_NE(partial.unreadable.find("partial runtime identity"), std::string::npos)
      << partial.unreadable;
  EXPECT_EQ(partial.referenced_gpus, (std::set<std::string>{"GPU-a"}));
  EXPECT_FALSE(partial.gpus_unknown);

  auto garbage = AnalyzePod(Pod("p", {{"hami.io/vgpu-mig-allocations", "{{{"}}));
  EXPECT_FALSE(garbage.unreadable.empty());
  EXPECT_TRUE(garbage.gpus_unknown);

  auto missing = AnalyzePod(
      Pod("p", {{"hami.io/vgpu-devices-allocated", "GPU-b,NVIDIA A100-SXM4-40GB,4864,15:;"}}));
  EXPECT_NE(missing.unreadable.find("is missing"), std::string::npos);
  EXPECT_EQ(missing.referenced_gpus, (std::set<std::string>{"GPU-b"}));

  auto legacy = AnalyzePod(
      Pod("p", {{"hami.io/vgpu-devices-allocated", "GPU-c[1-2],NVIDIA A100-SXM4-40GB,4864,15:;"}}));
  EXPECT_TRUE(legacy.legacy);
  EXPECT_EQ(legacy.referenced_gpus, (std::set<std::string>{"GPU-c"}));
  EXPECT_TRUE(legacy.unreadable.empty());

  auto plain = AnalyzePod(Pod("p", {}, "Succeeded"));
  EXPECT_FALSE(plain.relevant);
  EXPECT_TRUE(plain.terminated);
  EXPECT_FALSE(plain.active);
}

TEST(InventoryTest, ReplicaIdsRoundTrip) {
  EXPECT_EQ(ReplicaId("GPU-a", 3), "GPU-a::3");
  EXPECT_EQ(GpuOfReplicaId("GPU-a::3"), "GPU-a");
  EXPECT_EQ(GpuOfReplicaId("GPU-a"), "");
  EXPECT_EQ(GpuOfReplicaId("GPU-a::x"), "");
  EXPECT_EQ(GpuOfReplicaId("::1"), "");
}

TEST(InventoryTest, DiscoveryExposesOnlyAllowlistedModelsWithExactProfiles) {
  nvml::SimNvmlOptions o;
  o.spec = "H100 80GB HBM3x1,A30x1";
  auto sim = nvml::SimNvml::Create(o);
  ASSERT_TRUE(sim.ok());
  mig::Allowlist allowlist;
  // "1g.20gb" is H100's double-memory 1-slice profile: its own NVML profile, not 1g.10gb.
  allowlist.entries.push_back({{"H100 80GB"}, {"1g.10gb", "1g.20gb", "7g.80gb", "5g.99gb"}});
  auto inv = DiscoverInventory(**sim, allowlist);
  ASSERT_TRUE(inv.ok()) << inv.status();
  ASSERT_EQ(inv->gpus.size(), 2u);
  const GpuEntry& h100 = inv->gpus[0];
  EXPECT_TRUE(h100.exposed);
  ASSERT_NE(h100.FindAllowed("1g.20gb"), nullptr);
  ASSERT_NE(h100.FindAllowed("1g.10gb"), nullptr);
  EXPECT_NE(h100.FindAllowed("1g.20gb")->nvml_id, h100.FindAllowed("1g.10gb")->nvml_id);
  EXPECT_GT(h100.FindAllowed("1g.20gb")->memory_mib, h100.FindAllowed("1g.10gb")->memory_mib);
  EXPECT_EQ(h100.missing_profiles, (std::vector<std::string>{"5g.99gb"}));
  EXPECT_EQ(h100.replicas, 7u);
  EXPECT_FALSE(inv->gpus[1].exposed);
  EXPECT_NE(inv->gpus[1].not_exposed_reason.find("matches no migProfileAllowlist entry"),
            std::string::npos);
  EXPECT_EQ(inv->RegisterDevices().size(), 1u);
}

// Found by the chaos soak: a device plugin started while NVML failed on one GPU's capability
// never served that GPU (nor cleaned its instances) until its next restart.
TEST(InventoryTest, AGpuWhoseDiscoveryFailedIsDiscoveredOnceNvmlAnswers) {
  nvml::SimNvmlOptions o;
  o.spec = "A100-SXM4-40GBx2";
  auto sim = nvml::SimNvml::Create(o);
  ASSERT_TRUE(sim.ok());
  nvml::SimFault f;
  f.op = "GetGpuInstancePossiblePlacements";
  f.code = nvml::NvmlReturn::kUnknown;
  f.gpu = 1;
  ASSERT_TRUE((*sim)->InjectFault(f).ok());
  mig::Allowlist allowlist;
  allowlist.entries.push_back({{"A100-SXM4-40GB"}, {"1g.5gb", "7g.40gb"}});
  auto inv = DiscoverInventory(**sim, allowlist);
  ASSERT_TRUE(inv.ok()) << inv.status();
  ASSERT_EQ(inv->gpus.size(), 2u);
  EXPECT_TRUE(inv->gpus[0].exposed);
  EXPECT_FALSE(inv->gpus[1].exposed);
  EXPECT_TRUE(inv->gpus[1].discovery_failed);
  EXPECT_NE(inv->gpus[1].not_exposed_reason.find("cannot be discovered"), std::string::npos);
  EXPECT_EQ(inv->RegisterDevices().size(), 1u);

  EXPECT_TRUE(RetryDiscovery(**sim, allowlist, *inv));
  EXPECT_TRUE(inv->gpus[1].exposed);
  EXPECT_TRUE(inv->gpus[1].healthy);
  EXPECT_FALSE(inv->gpus[1].discovery_failed);
  EXPECT_EQ(inv->RegisterDevices().size(), 2u);
  EXPECT_FALSE(RetryDiscovery(**sim, allowlist, *inv));  // nothing left to discover
}

TEST(CdiTest, SpecNamesTheDeviceByItsMigUuid) {
  EXPECT_EQ(CdiWriter::QualifiedName("MIG-1"), "dynmig.io/mig=MIG-1");
  auto spec = nlohmann::json::parse(CdiWriter::SpecJson("MIG-1", {"/dev/nvidia0", "/dev/x"}));
  EXPECT_EQ(spec["cdiVersion"], "0.5.0");
  EXPECT_EQ(spec["kind"], "dynmig.io/mig");
  EXPECT_EQ(spec["devices"][0]["containerEdits"]["deviceNodes"][1]["path"], "/dev/x");
  // Without device nodes (simulated devices): the environment only, no empty deviceNodes list.
  auto env_only = nlohmann::json::parse(CdiWriter::SpecJson("MIG-2", {}));
  EXPECT_EQ(env_only["devices"][0]["containerEdits"]["env"][0], "NVIDIA_VISIBLE_DEVICES=MIG-2");
  EXPECT_FALSE(env_only["devices"][0]["containerEdits"].contains("deviceNodes"));
  TempDir dir;
  CdiWriter writer(dir.path() + "/cdi", false);
  ASSERT_TRUE(writer.Write("MIG-1", {"/dev/nvidia0"}).ok());
  EXPECT_TRUE(std::filesystem::exists(writer.SpecPath("MIG-1")));
  ASSERT_TRUE(writer.Remove("MIG-1").ok());
  EXPECT_FALSE(std::filesystem::exists(writer.SpecPath("MIG-1")));
  EXPECT_TRUE(writer.Remove("MIG-1").ok());
}

TEST(MetricsTest, SerializesInTheTextFormat) {
  Metrics m;
  m.AllocateDone("success", 0.002);
  m.InstanceCreated("1g.5gb");
  m.SetGpuHealthy("GPU-a", true);
  const std::string text = m.Serialize();
  EXPECT_NE(text.find("dynmig_deviceplugin_allocations_total{result=\"success\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("dynmig_deviceplugin_gpu_healthy{gpu=\"GPU-a\"} 1"), std::string::npos);
  EXPECT_EQ(m.Value("dynmig_deviceplugin_instances_created_total", "profile", "1g.5gb"), 1);
  EXPECT_EQ(m.Value("dynmig_deviceplugin_allocate_duration_seconds"), 1);
}

TEST(DevicePluginCliTest, BadInputExitsTwoBeforeTouchingAnything) {
  std::ostringstream out;
  std::ostringstream err;
  EXPECT_EQ(cli::RunCli({"device-plugin", "--node", "n"}, out, err), cli::kExitBadInput);
  EXPECT_NE(err.str().find("--device-config"), std::string::npos) << err.str();

  TempDir dir;
  const std::string config = dir.path() + "/dc.yaml";
  {
    std::ofstream f(config);
    f << "nvidia:\n  migProfileAllowlist:\n    - models: [\"A100\"]\n      profiles: [\"5gb\"]\n";
  }
  std::ostringstream err2;
  EXPECT_EQ(cli::RunCli({"device-plugin", "--node", "n", "--device-config", config}, out, err2),
            cli::kExitBadInput);
  EXPECT_NE(err2.str().find("profiles[0]"), std::string::npos) << err2.str();

  {
    std::ofstream f(config);
    f << "nvidia:\n  migProfileAllowlist:\n    - models: [\"A100\"]\n      profiles: "
         "[\"1g.5gb\"]\n";
  }
  std::ostringstream err3;
  EXPECT_EQ(cli::RunCli({"device-plugin", "--node", "n", "--device-config", config,
                         "--reconcile-interval", "soon"},
                        out, err3),
            cli::kExitBadInput);
  EXPECT_NE(err3.str().find("--reconcile-interval"), std::string::npos) << err3.str();
}

TEST(DevicePluginCliTest, SimStateInAMissingDirectoryIsCreated) {
  // A fresh node: the simulator's state goes in a directory nobody made yet. The plugin makes it
  // (and the state) before it reads its kubeconfig, which is missing here so that the run ends.
  TempDir dir;
  const std::string config = dir.path() + "/dc.yaml";
  {
    std::ofstream f(config);
    f << "nvidia:\n  migProfileAllowlist:\n    - models: [\"A100\"]\n      profiles: "
         "[\"1g.5gb\"]\n";
  }
  const std::string sim_state = dir.path() + "/device-plugins/dynmig/sim.json";
  std::ostringstream out;
  std::ostringstream err;
  EXPECT_EQ(cli::RunCli({"device-plugin", "--node", "n", "--device-config", config, "--sim",
                         "A100-SXM4-40GBx1", "--sim-state", sim_state, "--kubeconfig",
                         dir.path() + "/no-kubeconfig"},
                        out, err),
            cli::kExitBadInput);
  EXPECT_NE(err.str().find("no-kubeconfig"), std::string::npos) << err.str();
  ASSERT_TRUE(std::filesystem::is_regular_file(sim_state)) << err.str();
  std::ifstream in(sim_state);
  EXPECT_EQ(nlohmann::json::parse(in)["spec"], "A100-SXM4-40GBx1");
}

}  // namespace
}  // namespace dynmig::deviceplugin::testing
