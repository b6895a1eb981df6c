// SimNvml beyond the conformance suite: specs, identities, persistence, concurrency, faults,
// layouts and model-specific rules.
#include "nvml/sim_nvml.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "common/clock.h"
#include "common/mutex.h"
#include "nvml_test_util.h"

namespace dynmig::nvml {
namespace {

using testing::IsNvmlError;
using testing::TempStateFile;

// A simulated clock (FakeClock) that records the simulator's sleeps. `instant`: a sleep moves the
// simulated time by its length and returns at once; otherwise it lasts until the test advances
// the time past it.
class SleepLog final : public Clock {
 public:
  explicit SleepLog(bool instant) : instant_(instant) {}

  absl::Time Now() const override { return fake_.Now(); }
  absl::Duration Monotonic() const override { return fake_.Monotonic(); }
  bool WaitUntil(dynmig::CondVar& cv, dynmig::Mutex& mu, absl::Duration monotonic_deadline,
                 absl::FunctionRef<bool()> done) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return fake_.WaitUntil(cv, mu, monotonic_deadline, done);
  }
  void SleepFor(absl::Duration d) const override {
    bool instant = false;
    {
      dynmig::MutexLock lock(&mu_);
      slept_.push_back(d);
      most_ = std::max(most_, ++inside_);
      instant = instant_;
    }
    if (instant) {
      fake_.Advance(d);
    } else {
      fake_.SleepFor(d);
    }
    dynmig::MutexLock lock(&mu_);
    --inside_;
  }

  FakeClock& fake() { return fake_; }
  std::vector<absl::Duration> slept() const {
    dynmig::MutexLock lock(&mu_);
    return slept_;
  }
  void clear() {
    dynmig::MutexLock lock(&mu_);
    slept_.clear();
    most_ = 0;
  }
  // The most sleeps that were under way at once.
  int most() const {
    dynmig::MutexLock lock(&mu_);
    return most_;
  }
  void set_instant(bool instant) {
    dynmig::MutexLock lock(&mu_);
    instant_ = instant;
  }
  // Waits (real time) until `n` sleeps began since the last clear(); whether they did.
  bool AwaitSlept(size_t n, absl::Duration real_timeout) const {
    dynmig::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return slept_.size() >= n; };
    return mu_.AwaitWithTimeout(dynmig::Condition(&done), real_timeout);
  }
  // Waits (real time) until `n` sleeps are under way at once; whether they are.
  bool AwaitInside(int n, absl::Duration real_timeout) const {
    dynmig::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return inside_ >= n; };
    return mu_.AwaitWithTimeout(dynmig::Condition(&done), real_timeout);
  }

 private:
  mutable FakeClock fake_;
  mutable dynmig::Mutex mu_;
  bool instant_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<absl::Duration> slept_ ABSL_GUARDED_BY(mu_);
  mutable int inside_ ABSL_GUARDED_BY(mu_) = 0;
  mutable int most_ ABSL_GUARDED_BY(mu_) = 0;
};

std::unique_ptr<SimNvml> MakeSim(const std::string& spec, const std::string& state = "",
                                 std::vector<uint32_t> swapped = {}) {
  SimNvmlOptions o;
  o.spec = spec;
  o.state_file = state;
  o.swapped_halves_gpus = std::move(swapped);
  auto sim = SimNvml::Create(std::move(o));
  EXPECT_TRUE(sim.ok()) << sim.status();
  return sim.ok() ? std::move(*sim) : nullptr;
}

const mig::ProfileSpec& Profile(const std::string& model, const std::string& name) {
  const auto* m = *mig::FindModel(model);
  const auto* p = m->capability.FindProfile(name);
  EXPECT_NE(p, nullptr) << model << " " << name;
  return *p;
}

// --- Specs and identities -------------------------------------------------------------------

TEST(SimSpecTest, ParsesModelsAndCounts) {
  ASSERT_OK_AND_ASSIGN(const auto gpus, ParseSimSpec("A100-SXM4-40GBx2, H100 80GBx1"));
  ASSERT_EQ(gpus.size(), 3u);
  EXPECT_EQ(gpus[0]->capability.model, "NVIDIA A100-SXM4-40GB");
  EXPECT_EQ(gpus[1]->capability.model, "NVIDIA A100-SXM4-40GB");
  EXPECT_EQ(gpus[2]->capability.model, "NVIDIA H100 80GB HBM3");
  ASSERT_OK_AND_ASSIGN(const auto one, ParseSimSpec("A30"));
  EXPECT_EQ(one.size(), 1u);
  // A model whose own name has an 'x' ("Max-Q"), with and without a count.
  ASSERT_OK_AND_ASSIGN(const auto maxq,
                       ParseSimSpec("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"));
  EXPECT_EQ(maxq[0]->capability.placement_units, 12u);
  ASSERT_OK_AND_ASSIGN(const auto maxq2,
                       ParseSimSpec("RTX PRO 6000 Blackwell Max-Q Workstation Editionx2"));
  EXPECT_EQ(maxq2.size(), 2u);
}

TEST(SimSpecTest, RejectsBadSpecsClearly) {
  struct Case {
    std::string spec;
    absl::StatusCode code;
    std::string needle;
  };
  for (const auto& c : std::vector<Case>{
           {"A30x0", absl::StatusCode::kInvalidArgument, "bad GPU count \"0\""},
           {"A30xfoo", absl::StatusCode::kInvalidArgument, "bad GPU count \"foo\""},
           {"A30x", absl::StatusCode::kInvalidArgument, "bad GPU count \"\""},
           {"V100x1", absl::StatusCode::kNotFound, "unknown GPU model \"V100\""},
           {"H100x1", absl::StatusCode::kInvalidArgument, "ambiguous"},
           {"", absl::StatusCode::kInvalidArgument, "names no GPU"},
           {"A30x20,A30x13", absl::StatusCode::kInvalidArgument, "more than 32 GPUs"},
       }) {
    auto r = ParseSimSpec(c.spec);
    ASSERT_FALSE(r.ok()) << c.spec;
    EXPECT_EQ(r.status().code(), c.code) << c.spec << ": " << r.status();
    EXPECT_NE(std::string(r.status().message()).find(c.needle), std::string::npos)
        << c.spec << ": " << r.status();
  }
}

TEST(SimIdentityTest, DeterministicPerSeedAndIndex) {
  EXPECT_EQ(SimGpuUuid("node-a", 0), SimGpuUuid("node-a", 0));
  EXPECT_NE(SimGpuUuid("node-a", 0), SimGpuUuid("node-a", 1));
  EXPECT_NE(SimGpuUuid("node-a", 0), SimGpuUuid("node-b", 0));
  EXPECT_TRUE(std::regex_match(
      SimGpuUuid("x", 3),
      std::regex("GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")));
  EXPECT_EQ(SimPciBusId(0), "00000000:07:00.0");
  EXPECT_EQ(SimPciBusId(7), "00000000:BD:00.0");
  EXPECT_EQ(SimPciBusId(8), "00000000:C0:00.0");
  const std::string gpu = SimGpuUuid("x", 0);
  const std::string mig = SimMigUuid(gpu, 13, 0);
  EXPECT_TRUE(std::regex_match(
      mig, std::regex("MIG-[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")))
      << mig;
  EXPECT_EQ(mig, SimMigUuid(gpu, 13, 0));
  EXPECT_NE(mig, SimMigUuid(gpu, 13, 1));
  EXPECT_NE(mig, SimMigUuid(gpu, 12, 0));
  EXPECT_NE(mig, SimMigUuid(SimGpuUuid("x", 1), 13, 0));
}

TEST(SimIdentityTest, GpusGetSeededUuidsBusIdsAndMinors) {
  SimNvmlOptions o = testing::SimOptions("A30x3");
  o.seed = "worker-7";
  ASSERT_OK_AND_ASSIGN(auto sim, SimNvml::Create(o));
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(const GpuInfo info, sim->GetGpu(i));
    EXPECT_EQ(info.uuid, SimGpuUuid("worker-7", i));
    EXPECT_EQ(info.pci_bus_id, SimPciBusId(i));
    EXPECT_EQ(info.minor, i);
    EXPECT_EQ(info.name, "NVIDIA A30");
    EXPECT_EQ(info.pci_device_id, 0x20B710DEu);
  }
  EXPECT_EQ(sim->Description(), "simulator A30x3 (in memory)");
}

TEST(SimDiscoveryTest, A100FortyGigabyteNamesFromMemoryAndIndex) {
  auto sim = MakeSim("A100-SXM4-40GBx1");
  ASSERT_OK_AND_ASSIGN(const auto cap, DiscoverCapability(*sim, 0));
  std::vector<std::string> names;
  for (const auto& p : cap.profiles) names.push_back(p.name);
  // Ordered by profile index: 0 1 2 3 4 7 9.
  EXPECT_EQ(names, (std::vector<std::string>{"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb",
                                             "1g.5gb+me", "1g.10gb"}));
  EXPECT_EQ(cap.placement_units, 8u);
  EXPECT_EQ(cap.memory_slices, 8u);
  EXPECT_EQ(cap.compute_slices, 7u);
  EXPECT_EQ(cap.FindProfile("1g.10gb")->nvml_id, 15u);
  EXPECT_EQ(cap.FindProfile("1g.10gb")->nvml_index, 9u);
}

// --- Persistence -----------------------------------------------------------------------------

TEST(SimPersistenceTest, SecondObjectSeesTheFirstOnesInstances) {
  TempStateFile state;
  auto a = MakeSim("A100-SXM4-40GBx2", state.path());
  const auto& p3g = Profile("A100-SXM4-40GB", "3g.20gb");
  ASSERT_OK_AND_ASSIGN(const auto gi, a->CreateGpuInstance(1, p3g.nvml_id, {4, 4}));
  ASSERT_OK_AND_ASSIGN(const auto ci, a->CreateComputeInstance(1, gi.id));
  ASSERT_OK(a->AttachProcess(ci.mig_uuid, 99));
  ASSERT_OK(a->InjectFault(testing::Fault("DestroyGpuInstance", 1, NvmlReturn::kGpuIsLost)));

  // A restarted process: no spec needed, the file says what the GPUs are.
  ASSERT_OK_AND_ASSIGN(auto b, SimNvml::Create(testing::SimOptions("", state.path())));
  EXPECT_EQ(b->spec(), "A100-SXM4-40GBx2");
  ASSERT_OK_AND_ASSIGN(const auto gis, b->ListGpuInstances(1));
  ASSERT_EQ(gis.size(), 1u);
  EXPECT_EQ(gis[0].id, 2u);
  EXPECT_EQ(gis[0].placement, (mig::Placement{4, 4}));
  ASSERT_OK_AND_ASSIGN(const auto uuid, b->GetMigDeviceUuid(1, gi.id, ci.id));
  EXPECT_EQ(uuid, ci.mig_uuid);
  ASSERT_OK_AND_ASSIGN(const auto procs, b->GetMigDeviceProcesses(1, gi.id, ci.id));
  ASSERT_EQ(procs.size(), 1u);
  EXPECT_EQ(procs[0].pid, 99u);
  // The fault injected through a fires in b.
  EXPECT_TRUE(IsNvmlError(b->DestroyGpuInstance(1, gi.id), NvmlReturn::kGpuIsLost));

  // Changes through b show up in a without re-creating it.
  ASSERT_OK(b->DetachProcess(ci.mig_uuid, 99));
  ASSERT_OK(b->DestroyComputeInstance(1, gi.id, ci.id));
  ASSERT_OK(b->DestroyGpuInstance(1, gi.id));
  ASSERT_OK_AND_ASSIGN(const auto after, a->ListGpuInstances(1));
  EXPECT_TRUE(after.empty());
  ASSERT_OK_AND_ASSIGN(const auto faults, a->Faults());
  EXPECT_TRUE(faults.empty());
}

TEST(SimPersistenceTest, StateFileIsVersionedJsonAndNoTemporaryFilesRemain) {
  TempStateFile state;
  auto sim = MakeSim("A30x1", state.path());
  const auto& p = Profile("A30", "2g.12gb");
  ASSERT_OK_AND_ASSIGN(const auto gi, sim->CreateGpuInstance(0, p.nvml_id, {2, 2}));
  ASSERT_OK(sim->CreateComputeInstance(0, gi.id).status());
  ASSERT_OK(sim->SetLatency("ListGpuInstances", std::chrono::milliseconds(5)));
  std::ifstream in(state.path());
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["spec"], "A30x1");
  EXPECT_EQ(j["gpus"][0]["model"], "NVIDIA A30");
  EXPECT_EQ(j["gpus"][0]["gpuInstances"][0]["id"], 2);
  EXPECT_EQ(j["gpus"][0]["gpuInstances"][0]["computeInstances"][0]["id"], 0);
  EXPECT_EQ(j["latencyMs"]["ListGpuInstances"], 5);
  std::set<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(state.dir())) {
    files.insert(e.path().filename().string());
  }
  EXPECT_EQ(files, (std::set<std::string>{"state.json", "state.json.lock"}));
}

TEST(SimPersistenceTest, MismatchedOrMissingOrCorruptStateIsAClearError) {
  TempStateFile state;
  ASSERT_NE(MakeSim("A30x1", state.path()), nullptr);
  auto other = SimNvml::Create(testing::SimOptions("A30x2", state.path()));
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(other.status().message()).find(state.path()), std::string::npos);
  // The same spec attaches to the existing state.
  EXPECT_NE(MakeSim("A30x1", state.path()), nullptr);

  TempStateFile missing;
  auto none = SimNvml::Create(testing::SimOptions("", missing.path()));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);

  TempStateFile corrupt;
  std::ofstream(corrupt.path()) << "{\"version\": 1, \"gpus\": [";
  auto bad = SimNvml::Create(testing::SimOptions("", corrupt.path()));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(bad.status().message()).find(corrupt.path()), std::string::npos);
}

TEST(SimPersistenceTest, MissingDirectoriesAreCreatedOnlyWhenTheSpecCreatesTheState) {
  TempStateFile base;
  const std::string nested = base.dir() + "/device-plugins/dynmig/sim.json";
  // Without a spec there is nothing to create: a clear error, and no directory appears.
  auto none = SimNvml::Create(testing::SimOptions("", nested));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(none.status().message()).find(nested), std::string::npos) << none.status();
  EXPECT_FALSE(std::filesystem::exists(base.dir() + "/device-plugins"));

  auto sim = MakeSim("A30x1", nested);
  ASSERT_NE(sim, nullptr);
  EXPECT_TRUE(std::filesystem::is_regular_file(nested));
  ASSERT_OK(sim->CreateGpuInstance(0, Profile("A30", "1g.6gb").nvml_id, {0, 1}).status());
  // A restart finds the state it made.
  ASSERT_OK_AND_ASSIGN(auto again, SimNvml::Create(testing::SimOptions("", nested)));
  ASSERT_OK_AND_ASSIGN(const auto gis, again->ListGpuInstances(0));
  EXPECT_EQ(gis.size(), 1u);

  // A parent that is a file is an error naming the directory.
  const std::string blocked = base.dir() + "/state.json/sim.json";
  std::ofstream(base.dir() + "/state.json") << "x";
  auto refused = SimNvml::Create(testing::SimOptions("A30x1", blocked));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(std::string(refused.status().message()).find(base.dir() + "/state.json"),
            std::string::npos)
      << refused.status();
}

// Every worker tries to create a 1g GI at every placement, in its own order. With locking,
// exactly one creation per placement succeeds and the file holds all seven.
int CreateAllOneSliceGis(const std::string& path, uint32_t worker) {
  auto sim = SimNvml::Create(testing::SimOptions("", path));
  if (!sim.ok()) return 100;
  const auto& p = Profile("A100-SXM4-40GB", "1g.5gb");
  int created = 0;
  for (uint32_t i = 0; i < 7; ++i) {
    const uint32_t start = (i + worker * 3) % 7;
    auto gi = (*sim)->CreateGpuInstance(0, p.nvml_id, {start, 1});
    if (gi.ok()) {
      ++created;
    } else if (gi.status().code() != absl::StatusCode::kResourceExhausted) {
      return 101;
    }
  }
  return created;
}

int DestroyAllGis(const std::string& path) {
  auto sim = SimNvml::Create(testing::SimOptions("", path));
  if (!sim.ok()) return 100;
  int destroyed = 0;
  for (uint32_t id = 7; id <= 13; ++id) {
    const absl::Status st = (*sim)->DestroyGpuInstance(0, id);
    if (st.ok()) {
      ++destroyed;
    } else if (st.code() != absl::StatusCode::kNotFound) {
      return 101;
    }
  }
  return destroyed;
}

TEST(SimConcurrencyTest, ConcurrentProcessesNeverLoseAnUpdate) {
  TempStateFile state;
  ASSERT_NE(MakeSim("A100-SXM4-40GBx1", state.path()), nullptr);
  constexpr int kWorkers = 4;
  for (int phase = 0; phase < 2; ++phase) {
    std::vector<pid_t> children;
    for (int w = 0; w < kWorkers; ++w) {
      const pid_t pid = fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        _exit(phase == 0 ? CreateAllOneSliceGis(state.path(), w) : DestroyAllGis(state.path()));
      }
      children.push_back(pid);
    }
    int total = 0;
    for (pid_t pid : children) {
      int status = 0;
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
      ASSERT_TRUE(WIFEXITED(status));
      ASSERT_LT(WEXITSTATUS(status), 100) << "worker failed with " << WEXITSTATUS(status);
      total += WEXITSTATUS(status);
    }
    EXPECT_EQ(total, 7) << "phase " << phase;
    auto check = MakeSim("", state.path());
    ASSERT_OK_AND_ASSIGN(const auto gis, check->ListGpuInstances(0));
    EXPECT_EQ(gis.size(), phase == 0 ? 7u : 0u);
  }
}

TEST(SimConcurrencyTest, ThreadsOnSeveralObjectsNeverLoseAnUpdate) {
  TempStateFile state;
  ASSERT_NE(MakeSim("A100-SXM4-40GBx1", state.path()), nullptr);
  std::vector<int> results(4, -1);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] { results[w] = CreateAllOneSliceGis(state.path(), w); });
  }
  for (auto& t : threads) t.join();
  int total = 0;
  for (int r : results) {
    ASSERT_GE(r, 0);
    ASSERT_LT(r, 100);
    total += r;
  }
  EXPECT_EQ(total, 7);
  // One object shared by threads.
  auto shared = MakeSim("", state.path());
  std::atomic<int> destroyed{0};
  threads.clear();
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&] {
      for (uint32_t id = 7; id <= 13; ++id) {
        if (shared->DestroyGpuInstance(0, id).ok()) ++destroyed;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(destroyed.load(), 7);
}

// --- Faults and latency ----------------------------------------------------------------------

TEST(SimFaultTest, CountsCallsAcrossObjectsAndFiltersByGpu) {
  TempStateFile state;
  auto a = MakeSim("A30x2", state.path());
  auto b = MakeSim("A30x2", state.path());
  ASSERT_OK(a->InjectFault(testing::Fault("GetGpu", 2, NvmlReturn::kGpuIsLost, 2, 1)));
  EXPECT_OK(a->GetGpu(0).status());                                // other GPU: not counted
  EXPECT_OK(a->GetGpu(1).status());                                // call 1
  EXPECT_TRUE(IsNvmlError(b->GetGpu(1), NvmlReturn::kGpuIsLost));  // call 2, another object
  EXPECT_TRUE(IsNvmlError(a->GetGpu(1), NvmlReturn::kGpuIsLost));  // call 3
  EXPECT_OK(b->GetGpu(1).status());                                // exhausted
  ASSERT_OK_AND_ASSIGN(const auto faults, a->Faults());
  EXPECT_TRUE(faults.empty());
}

TEST(SimFaultTest, PermanentFaultsLastUntilCleared) {
  auto sim = MakeSim("A30x1");
  ASSERT_OK(sim->InjectFault(testing::Fault("DeviceCount", 1, NvmlReturn::kUninitialized, 0)));
  for (int i = 0; i < 3; ++i) {
    auto count = sim->DeviceCount();
    EXPECT_TRUE(IsNvmlError(count, NvmlReturn::kUninitialized));
    EXPECT_EQ(count.status().code(), absl::StatusCode::kFailedPrecondition);
  }
  ASSERT_OK_AND_ASSIGN(const auto faults, sim->Faults());
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_EQ(faults[0].calls, 3u);
  ASSERT_OK(sim->ClearFaults());
  EXPECT_OK(sim->DeviceCount().status());
}

TEST(SimFaultTest, RejectsBadFaults) {
  auto sim = MakeSim("A30x1");
  auto unknown = sim->InjectFault(testing::Fault("CreateGi", 1, NvmlReturn::kUnknown));
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(unknown.message()).find("CreateGpuInstance"), std::string::npos);
  EXPECT_EQ(sim->InjectFault(testing::Fault("GetGpu", 0, NvmlReturn::kUnknown)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sim->InjectFault(testing::Fault("GetGpu", 1, NvmlReturn::kSuccess)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sim->SetLatency("Nope", std::chrono::milliseconds(1)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SimFaultTest, LatencyDelaysOnlyItsOperationAndPersists) {
  TempStateFile state;
  SleepLog clock(/*instant=*/true);
  SimNvmlOptions o = testing::SimOptions("A30x1", state.path());
  o.clock = &clock;
  ASSERT_OK_AND_ASSIGN(auto sim, SimNvml::Create(o));
  ASSERT_OK(sim->SetLatency("CreateGpuInstance", std::chrono::milliseconds(250)));
  const auto& p = Profile("A30", "1g.6gb");
  const absl::Duration start = clock.Monotonic();
  ASSERT_OK(sim->CreateGpuInstance(0, p.nvml_id, {0, 1}).status());
  ASSERT_OK(sim->ListGpuInstances(0).status());
  EXPECT_EQ(clock.slept(), (std::vector<absl::Duration>{absl::Milliseconds(250)}));
  EXPECT_EQ(clock.Monotonic() - start, absl::Milliseconds(250));
  // Another process sees the latency.
  SleepLog other_clock(/*instant=*/true);
  SimNvmlOptions o2 = testing::SimOptions("", state.path());
  o2.clock = &other_clock;
  ASSERT_OK_AND_ASSIGN(auto other, SimNvml::Create(o2));
  ASSERT_OK(other->CreateGpuInstance(0, p.nvml_id, {1, 1}).status());
  EXPECT_EQ(other_clock.slept().size(), 1u);
  ASSERT_OK(sim->SetLatency("CreateGpuInstance", std::chrono::milliseconds(0)));
  ASSERT_OK(other->CreateGpuInstance(0, p.nvml_id, {2, 1}).status());
  EXPECT_EQ(other_clock.slept().size(), 1u);
}

// --- Layouts and model rules -----------------------------------------------------------------

TEST(SimLayoutTest, SwappedHalvesGpuReportsSwappedGiIds) {
  auto sim = MakeSim("H100 80GBx2", "", {1});
  const std::string m = "H100 80GB HBM3";
  const uint32_t p1g = Profile(m, "1g.10gb").nvml_id;
  const uint32_t p2g = Profile(m, "2g.20gb").nvml_id;
  const uint32_t p3g = Profile(m, "3g.40gb").nvml_id;
  // NVIDIA/DCGM#138, GPU1: 1g at 2:1 = GI 13, 1g at 3:1 = GI 14, 2g at 0:2 = GI 5, 3g at 4:4 =
  // GI 1.
  EXPECT_EQ(sim->CreateGpuInstance(1, p1g, {2, 1})->id, 13u);
  EXPECT_EQ(sim->CreateGpuInstance(1, p1g, {3, 1})->id, 14u);
  EXPECT_EQ(sim->CreateGpuInstance(1, p2g, {0, 2})->id, 5u);
  EXPECT_EQ(sim->CreateGpuInstance(1, p3g, {4, 4})->id, 1u);
  // GPU0 keeps the identity layout: 3g at 4:4 = GI 2.
  EXPECT_EQ(sim->CreateGpuInstance(0, p3g, {4, 4})->id, 2u);
  // Placements come back as created, never derived from the id.
  ASSERT_OK_AND_ASSIGN(const auto gis, sim->ListGpuInstances(1));
  ASSERT_EQ(gis.size(), 4u);
  EXPECT_EQ(gis[0].id, 1u);
  EXPECT_EQ(gis[0].placement, (mig::Placement{4, 4}));
}

TEST(SimLayoutTest, RtxProUsesTheTwelveUnitAxis) {
  auto sim = MakeSim("RTX PRO 6000 Blackwell Server Editionx1");
  const std::string m = "RTX PRO 6000 Blackwell Server Edition";
  const uint32_t p1g = Profile(m, "1g.24gb").nvml_id;
  const uint32_t p2g = Profile(m, "2g.48gb").nvml_id;
  EXPECT_EQ(p1g, 14u);
  EXPECT_EQ(p2g, 5u);
  ASSERT_OK_AND_ASSIGN(const auto placements, sim->GetGpuInstancePossiblePlacements(0, p2g));
  EXPECT_EQ(placements, (std::vector<mig::Placement>{{0, 6}, {6, 6}}));
  // 1g at 3:3 and 6:3 (GI 4 and 5) leave half the card free, but no 2g fits.
  EXPECT_EQ(sim->CreateGpuInstance(0, p1g, {3, 3})->id, 4u);
  EXPECT_EQ(sim->CreateGpuInstance(0, p1g, {6, 3})->id, 5u);
  EXPECT_TRUE(
      IsNvmlError(sim->CreateGpuInstance(0, p2g, {0, 6}), NvmlReturn::kInsufficientResources));
  EXPECT_TRUE(
      IsNvmlError(sim->CreateGpuInstance(0, p2g, {6, 6}), NvmlReturn::kInsufficientResources));
  EXPECT_TRUE(IsNvmlError(sim->CreateGpuInstance(0, p1g, {1, 3}), NvmlReturn::kInvalidArgument));
  EXPECT_EQ(sim->CreateGpuInstance(0, p1g, {0, 3})->id, 3u);
  EXPECT_EQ(sim->CreateGpuInstance(0, p1g, {9, 3})->id, 6u);
  ASSERT_OK(sim->DestroyGpuInstance(0, 3));
  ASSERT_OK(sim->DestroyGpuInstance(0, 4));
  EXPECT_EQ(sim->CreateGpuInstance(0, p2g, {0, 6})->id, 1u);
}

TEST(SimRulesTest, AllMediaEnginesProfileAdmitsOnlyNoMediaProfiles) {
  auto sim = MakeSim("RTX PRO 6000 Blackwell Server Editionx1");
  const std::string m = "RTX PRO 6000 Blackwell Server Edition";
  ASSERT_OK(sim->CreateGpuInstance(0, Profile(m, "1g.24gb+me.all").nvml_id, {0, 3}).status());
  EXPECT_TRUE(IsNvmlError(sim->CreateGpuInstance(0, Profile(m, "1g.24gb").nvml_id, {3, 3}),
                          NvmlReturn::kInsufficientResources));
  EXPECT_OK(sim->CreateGpuInstance(0, Profile(m, "1g.24gb-me").nvml_id, {3, 3}).status());
  EXPECT_OK(sim->CreateGpuInstance(0, Profile(m, "1g.24gb-me").nvml_id, {6, 3}).status());
  EXPECT_TRUE(IsNvmlError(sim->CreateGpuInstance(0, Profile(m, "1g.24gb+me.all").nvml_id, {9, 3}),
                          NvmlReturn::kInsufficientResources));
}

TEST(SimRulesTest, A100HalvesAndComputeSlices) {
  auto sim = MakeSim("A100-SXM4-40GBx1");
  const std::string m = "A100-SXM4-40GB";
  // 3g at 0:4 rules out the 4g; 4g + 3g works only as 4g@0:4 + 3g@4:4.
  ASSERT_OK_AND_ASSIGN(const auto g3,
                       sim->CreateGpuInstance(0, Profile(m, "3g.20gb").nvml_id, {0, 4}));
  EXPECT_EQ(g3.id, 1u);
  EXPECT_TRUE(IsNvmlError(sim->CreateGpuInstance(0, Profile(m, "4g.20gb").nvml_id, {0, 4}),
                          NvmlReturn::kInsufficientResources));
  ASSERT_OK(sim->DestroyGpuInstance(0, g3.id));
  EXPECT_EQ(sim->CreateGpuInstance(0, Profile(m, "4g.20gb").nvml_id, {0, 4})->id, 1u);
  EXPECT_EQ(sim->CreateGpuInstance(0, Profile(m, "3g.20gb").nvml_id, {4, 4})->id, 2u);
  // A 4g GI offers 1c, 2c and the full 4g, but no 3c.
  EXPECT_TRUE(
      IsNvmlError(sim->CreateComputeInstanceWithSlices(0, 1, 3), NvmlReturn::kNotSupported));
  ASSERT_OK_AND_ASSIGN(const auto c2, sim->CreateComputeInstanceWithSlices(0, 1, 2));
  EXPECT_EQ(c2.profile_id, 1u);
  EXPECT_EQ(c2.placement, (mig::Placement{0, 2}));
  ASSERT_OK_AND_ASSIGN(const auto c1, sim->CreateComputeInstanceWithSlices(0, 1, 1));
  EXPECT_EQ(c1.placement, (mig::Placement{2, 1}));
}

TEST(SimRulesTest, ProcessesAndMigModeChanges) {
  auto sim = MakeSim("H100 80GBx1");
  ASSERT_OK_AND_ASSIGN(const GpuInfo gpu, sim->GetGpu(0));
  EXPECT_TRUE(IsNvmlError(sim->AttachProcess("MIG-nope", 1), NvmlReturn::kNotFound));
  ASSERT_OK(sim->AttachProcess(gpu.uuid, 7, 100));
  ASSERT_OK_AND_ASSIGN(const auto procs, sim->GetComputeProcesses(0));
  ASSERT_EQ(procs.size(), 1u);
  EXPECT_FALSE(procs[0].gpu_instance_id.has_value());
  EXPECT_TRUE(IsNvmlError(sim->SetMigMode(0, false), NvmlReturn::kInUse));
  EXPECT_TRUE(IsNvmlError(sim->DetachProcess(gpu.uuid, 8), NvmlReturn::kNotFound));
  ASSERT_OK(sim->DetachProcess(gpu.uuid, 7));
  const auto& p = Profile("H100 80GB HBM3", "7g.80gb");
  ASSERT_OK_AND_ASSIGN(const auto gi, sim->CreateGpuInstance(0, p.nvml_id, {0, 8}));
  EXPECT_TRUE(IsNvmlError(sim->SetMigMode(0, false), NvmlReturn::kInUse));
  ASSERT_OK(sim->DestroyGpuInstance(0, gi.id));
  // Hopper applies the change at once.
  ASSERT_OK(sim->SetMigMode(0, false));
  ASSERT_OK_AND_ASSIGN(const GpuInfo off, sim->GetGpu(0));
  EXPECT_FALSE(off.mig.current);
  EXPECT_FALSE(off.mig.pending);
}

TEST(SimRulesTest, HoldersPersistBlockGiDestroyAndResetAndAreBounded) {
  TempStateFile state;
  auto a = MakeSim("H200x1", state.path());
  const auto& p = Profile("NVIDIA H200", "1g.18gb");
  ASSERT_OK_AND_ASSIGN(const auto gi, a->CreateGpuInstance(0, p.nvml_id, {0, 1}));
  EXPECT_TRUE(IsNvmlError(a->HoldGpuInstance(0, gi.id + 1, "dcgm"), NvmlReturn::kNotFound));
  EXPECT_TRUE(IsNvmlError(a->HoldGpuInstance(0, gi.id, ""), NvmlReturn::kInvalidArgument));
  EXPECT_TRUE(IsNvmlError(a->HoldGpuInstance(0, gi.id, "dc gm"), NvmlReturn::kInvalidArgument));
  EXPECT_TRUE(IsNvmlError(a->HoldGpuInstance(0, gi.id, std::string(65, 'd')),
                          NvmlReturn::kInvalidArgument));
  EXPECT_TRUE(IsNvmlError(a->HoldGpuInstance(7, gi.id, "dcgm"), NvmlReturn::kInvalidArgument));
  ASSERT_OK(a->HoldGpuInstance(0, gi.id, "dcgm"));
  ASSERT_OK(a->HoldGpuInstance(0, gi.id, "dcgm"));  // idempotent
  for (int i = 1; i < 16; ++i) ASSERT_OK(a->HoldGpuInstance(0, gi.id, fmt::format("agent{}", i)));
  EXPECT_TRUE(
      IsNvmlError(a->HoldGpuInstance(0, gi.id, "one-too-many"), NvmlReturn::kInvalidArgument));
  // Another process sees the holders.
  ASSERT_OK_AND_ASSIGN(auto b, SimNvml::Create(testing::SimOptions("", state.path())));
  ASSERT_OK_AND_ASSIGN(const auto holders, b->Holders());
  ASSERT_EQ(holders.size(), 16u);
  EXPECT_EQ(holders[0].name, "dcgm");
  EXPECT_EQ(holders[0].gi, gi.id);
  EXPECT_TRUE(IsNvmlError(b->DestroyGpuInstance(0, gi.id), NvmlReturn::kInUse));
  EXPECT_TRUE(IsNvmlError(b->ResetGpu(0), NvmlReturn::kInUse));
  ASSERT_OK(b->ReleaseGpuInstance(0, gi.id, "dcgm"));
  EXPECT_TRUE(IsNvmlError(b->ReleaseGpuInstance(0, gi.id, "dcgm"), NvmlReturn::kNotFound));
  EXPECT_TRUE(IsNvmlError(a->DestroyGpuInstance(0, gi.id), NvmlReturn::kInUse))
      << "the other 15 still hold it";
  ASSERT_OK(a->ReleaseGpuInstance(0, gi.id, ""));
  ASSERT_OK(a->DestroyGpuInstance(0, gi.id));
}

TEST(SimRulesTest, MigMinorsComeFromTheFormula) {
  auto sim = MakeSim("A30x2");
  ASSERT_OK_AND_ASSIGN(const MigMinors minors, sim->GetMigMinors());
  EXPECT_EQ(*minors.GpuInstanceAccess(0, 1), 12u);
  EXPECT_EQ(*minors.ComputeInstanceAccess(0, 1, 0), 13u);
  EXPECT_EQ(*minors.ComputeInstanceAccess(0, 1, 2), 15u);
  ASSERT_OK_AND_ASSIGN(const auto nodes, minors.DeviceNodes(1, 3, 0));
  EXPECT_EQ(nodes.gpu_instance_cap, "/dev/nvidia-caps/nvidia-cap165");  // 3+135+27
}

TEST(SimRulesTest, EveryCataloguePlacementHasAGiIdInBothLayouts) {
  for (const auto& m : mig::Catalogue()) {
    const std::string spec = m.capability.model + "x2";
    auto sim = MakeSim(spec, "", {1});
    for (const auto& p : m.capability.profiles) {
      for (const auto& pl : p.placements) {
        for (uint32_t gpu : {0u, 1u}) {
          auto gi = sim->CreateGpuInstance(gpu, p.nvml_id, pl);
          ASSERT_TRUE(gi.ok()) << m.capability.model << " " << p.name << " GPU " << gpu << ": "
                               << gi.status();
          ASSERT_OK(sim->DestroyGpuInstance(gpu, gi->id));
        }
      }
    }
  }
}

}  // namespace
}  // namespace dynmig::nvml

namespace dynmig::nvml {
namespace {

// The latency model: GI/CI create and destroy take the GPU model's time; other calls none.
TEST(SimLatencyModelTest, ReconfigurationsTakeTheModelsTimePerModel) {
  SleepLog clock(/*instant=*/true);
  SimNvmlOptions o;
  o.spec = "A30x1,A100-SXM4-40GBx1";
  o.clock = &clock;
  auto latency = mig::ParseNvmlLatency(
      "create-gi=250ms,create-ci=50ms,destroy-ci=20ms,destroy-gi=30ms,A30:create-gi=100ms");
  ASSERT_TRUE(latency.ok()) << latency.status();
  o.latency = *latency;
  ASSERT_OK_AND_ASSIGN(auto sim, SimNvml::Create(o));
  using Ms = std::vector<absl::Duration>;
  const auto& a30 = Profile("A30", "1g.6gb");
  ASSERT_OK_AND_ASSIGN(const auto gi, sim->CreateGpuInstance(0, a30.nvml_id, {0, 1}));
  ASSERT_OK_AND_ASSIGN(const auto ci, sim->CreateComputeInstance(0, gi.id));
  ASSERT_OK(sim->ListGpuInstances(0).status());
  ASSERT_OK(sim->GetMigDeviceUuid(0, gi.id, ci.id).status());
  ASSERT_OK(sim->DestroyComputeInstance(0, gi.id, ci.id));
  ASSERT_OK(sim->DestroyGpuInstance(0, gi.id));
  EXPECT_EQ(clock.slept(), (Ms{absl::Milliseconds(100), absl::Milliseconds(50),
                               absl::Milliseconds(20), absl::Milliseconds(30)}));
  clock.clear();
  const auto& a100 = Profile("A100-SXM4-40GB", "1g.5gb");
  ASSERT_OK_AND_ASSIGN(const auto gi2, sim->CreateGpuInstance(1, a100.nvml_id, {0, 1}));
  EXPECT_EQ(clock.slept(), (Ms{absl::Milliseconds(250)}));
  // A failed call still took its time (the driver was asked).
  clock.clear();
  EXPECT_FALSE(sim->CreateGpuInstance(1, a100.nvml_id, {0, 1}).ok());
  EXPECT_EQ(clock.slept(), (Ms{absl::Milliseconds(250)}));
  (void)gi2;
}

// Reconfigurations of one GPU run one at a time; two GPUs overlap.
TEST(SimLatencyModelTest, OneReconfigurationPerGpuAtATime) {
  SimNvmlOptions o;
  o.spec = "A100-SXM4-40GBx2";
  SleepLog clock(/*instant=*/false);  // each delay lasts until the test moves the time
  o.clock = &clock;
  ASSERT_OK_AND_ASSIGN(o.latency, mig::ParseNvmlLatency("create-gi=20ms"));
  ASSERT_OK_AND_ASSIGN(auto sim, SimNvml::Create(o));
  const auto& p = Profile("A100-SXM4-40GB", "1g.5gb");
  // Ends every delay (now and later), so that no thread is left waiting when a check failed.
  auto release = [&] {
    clock.set_instant(true);
    clock.fake().Advance(absl::Hours(1));
  };
  std::vector<std::thread> threads;
  for (uint32_t s : {0u, 1u, 2u}) {
    threads.emplace_back([&, s] {
      EXPECT_TRUE(sim->CreateGpuInstance(0, p.nvml_id, {s, 1}).ok());
    });
  }
  for (size_t round = 1; round <= 3; ++round) {
    // The round's reconfiguration is inside its delay ...
    EXPECT_TRUE(clock.AwaitSlept(round, absl::Seconds(10)));
    EXPECT_TRUE(clock.fake().AwaitWaiters(1));
    // ... and the others, given a moment, do not start theirs.
    EXPECT_FALSE(clock.AwaitInside(2, absl::Milliseconds(50)))
        << "two reconfigurations of GPU 0 ran at once";
    clock.fake().Advance(absl::Milliseconds(20));
  }
  if (HasFailure()) release();
  for (auto& t : threads) t.join();
  EXPECT_EQ(clock.most(), 1) << "two reconfigurations of GPU 0 ran at once";
  // One on each GPU: both are inside their delay before the time moves.
  clock.clear();
  threads.clear();
  for (uint32_t g : {0u, 1u}) {
    threads.emplace_back([&, g] {
      EXPECT_TRUE(sim->CreateGpuInstance(g, p.nvml_id, {4, 1}).ok());
    });
  }
  EXPECT_TRUE(clock.AwaitInside(2, absl::Seconds(10)))
      << "reconfigurations of different GPUs did not overlap";
  EXPECT_TRUE(clock.fake().AwaitWaiters(2));
  clock.fake().Advance(absl::Milliseconds(20));
  if (HasFailure()) release();
  for (auto& t : threads) t.join();
  EXPECT_EQ(clock.most(), 2) << "reconfigurations of different GPUs did not overlap";
  ASSERT_OK_AND_ASSIGN(auto gis, sim->ListGpuInstances(0));
  EXPECT_EQ(gis.size(), 4u);
}

}  // namespace
}  // namespace dynmig::nvml

namespace dynmig::nvml {
namespace {

// --- MIG mode per GPU ------------------------------------------------------------------------

// Simulated GPUs without MIG: every MIG call says so, nothing else changes.
TEST(SimMigModeTest, GpusWithoutMigRefuseEveryMigCall) {
  TempStateFile state;
  auto sim = MakeSim("T4x1, NVIDIA L4, A100-SXM4-40GBx1", state.path());
  ASSERT_NE(sim, nullptr);
  ASSERT_OK_AND_ASSIGN(const uint32_t count, sim->DeviceCount());
  ASSERT_EQ(count, 3u);
  ASSERT_OK_AND_ASSIGN(const auto t4, sim->GetGpu(0));
  EXPECT_EQ(t4.name, "Tesla T4");
  EXPECT_EQ(t4.pci_device_id, 0x1EB810DEu);
  EXPECT_EQ(t4.total_memory_mib, 15360u);
  EXPECT_FALSE(t4.mig.supported);
  EXPECT_FALSE(t4.mig.current);
  ASSERT_OK_AND_ASSIGN(const auto l4, sim->GetGpu(1));
  EXPECT_EQ(l4.name, "NVIDIA L4");
  for (uint32_t gpu : {0u, 1u}) {
    ASSERT_OK_AND_ASSIGN(const auto mode, sim->GetMigMode(gpu));
    EXPECT_EQ(mode, MigModeState{}) << "GPU " << gpu;
    EXPECT_TRUE(IsNvmlError(sim->SetMigMode(gpu, true), NvmlReturn::kNotSupported));
    for (uint32_t index = 0; index < kGpuInstanceProfileCount; ++index) {
      EXPECT_TRUE(
          IsNvmlError(sim->GetGpuInstanceProfileInfo(gpu, index), NvmlReturn::kNotSupported));
    }
    EXPECT_TRUE(IsNvmlError(sim->GetGpuInstanceProfileInfo(gpu, kGpuInstanceProfileCount),
                            NvmlReturn::kInvalidArgument));
    EXPECT_TRUE(
        IsNvmlError(sim->GetGpuInstancePossiblePlacements(gpu, 19), NvmlReturn::kNotSupported));
    EXPECT_TRUE(IsNvmlError(sim->CreateGpuInstance(gpu, 19, {0, 1}), NvmlReturn::kNotSupported));
    EXPECT_TRUE(IsNvmlError(sim->ListGpuInstances(gpu), NvmlReturn::kNotSupported));
    auto cap = DiscoverCapability(*sim, gpu);
    EXPECT_EQ(cap.status().code(), absl::StatusCode::kUnimplemented) << cap.status();
    // A whole GPU still runs processes and can be reset.
    EXPECT_OK(sim->ResetGpu(gpu));
  }
  ASSERT_OK(sim->AttachProcess(t4.uuid, 4242, 1000));
  ASSERT_OK_AND_ASSIGN(const auto procs, sim->GetComputeProcesses(0));
  ASSERT_EQ(procs.size(), 1u);
  EXPECT_FALSE(procs[0].gpu_instance_id.has_value());
  // The MIG GPU beside them is unaffected.
  ASSERT_OK_AND_ASSIGN(const auto a100, sim->GetMigMode(2));
  EXPECT_TRUE(a100.supported && a100.current && a100.pending);
  const auto& p = Profile("A100-SXM4-40GB", "1g.5gb");
  ASSERT_OK(sim->CreateGpuInstance(2, p.nvml_id, {0, 1}).status());
  // Another process reads the same GPUs back from the state file.
  auto again = MakeSim("", state.path());
  ASSERT_NE(again, nullptr);
  ASSERT_OK_AND_ASSIGN(const auto t4_again, again->GetGpu(0));
  EXPECT_EQ(t4_again.name, "Tesla T4");
  EXPECT_FALSE(t4_again.mig.supported);
}

TEST(SimMigModeTest, NonMigSpecNamesAndAttacks) {
  for (const char* spec : {"T4", "Tesla T4x2", "nvidia l4", "L4x1,T4x1"}) {
    auto gpus = ParseSimSpec(spec);
    ASSERT_TRUE(gpus.ok()) << spec << ": " << gpus.status();
    for (const auto* m : *gpus) EXPECT_TRUE(m->capability.profiles.empty()) << spec;
  }
  // Names that are neither: still the catalogue's error (no guessing from a prefix or substring).
  for (const char* spec : {"T", "T40", "L4 Max", "V100", "Tesla", "T4x0", "T4x33"}) {
    EXPECT_FALSE(ParseSimSpec(spec).ok()) << spec;
  }
  EXPECT_EQ(FindNonMigSimModel("t4"), &NonMigSimModels()[0]);
  EXPECT_EQ(FindNonMigSimModel(std::string(4096, 'x')), nullptr);
  // None of them is in the MIG catalogue, whose models all have MIG.
  for (const auto& m : NonMigSimModels()) {
    EXPECT_EQ(mig::FindModelByNvmlName(m.capability.model), nullptr) << m.capability.model;
  }
}

// A state file that claims MIG on a GPU without it is refused, naming the GPU.
TEST(SimMigModeTest, StateFileWithMigOnANonMigGpuIsRefused) {
  TempStateFile state;
  ASSERT_NE(MakeSim("T4x1", state.path()), nullptr);
  std::ifstream in(state.path());
  auto j = nlohmann::json::parse(in);
  j["gpus"][0]["migMode"]["pending"] = true;
  std::ofstream(state.path()) << j.dump();
  SimNvmlOptions o;
  o.state_file = state.path();
  auto sim = SimNvml::Create(o);
  ASSERT_FALSE(sim.ok());
  EXPECT_NE(std::string(sim.status().message()).find("GPU 0: Tesla T4 has no MIG"),
            std::string::npos)
      << sim.status();
}

TEST(SimMigModeTest, ActivationFollowsTheArchitecture) {
  auto sim = MakeSim("A100-SXM4-40GBx1,A30x1,H100 80GBx1,B200x1");
  ASSERT_NE(sim, nullptr);
  for (uint32_t gpu = 0; gpu < 4; ++gpu) {
    const bool ampere = gpu < 2;
    ASSERT_OK_AND_ASSIGN(const auto off, sim->SetMigMode(gpu, false));
    EXPECT_EQ(off.activation, ampere ? NvmlReturn::kInUse : NvmlReturn::kSuccess) << gpu;
    EXPECT_EQ(off.Active(), !ampere);
    EXPECT_FALSE(off.NeedsReboot());
    EXPECT_EQ(off.mode.current, ampere) << "Ampere keeps MIG on until a reset";
    EXPECT_FALSE(off.mode.pending);
    ASSERT_OK_AND_ASSIGN(const auto read, sim->GetMigMode(gpu));
    EXPECT_EQ(read, off.mode);
    // Asking again changes nothing and says the same.
    ASSERT_OK_AND_ASSIGN(const auto again, sim->SetMigMode(gpu, false));
    EXPECT_EQ(again.activation, off.activation);
    ASSERT_OK(sim->ResetGpu(gpu));
    ASSERT_OK_AND_ASSIGN(const auto after_reset, sim->GetMigMode(gpu));
    EXPECT_FALSE(after_reset.current);
    // Back on; setting the mode a GPU already has is active at once, on every architecture.
    ASSERT_OK_AND_ASSIGN(const auto on, sim->SetMigMode(gpu, true));
    EXPECT_EQ(on.activation, ampere ? NvmlReturn::kInUse : NvmlReturn::kSuccess);
    if (ampere) ASSERT_OK(sim->ResetGpu(gpu));
    ASSERT_OK_AND_ASSIGN(const auto same, sim->SetMigMode(gpu, true));
    EXPECT_TRUE(same.Active()) << gpu;
  }
  // A pending change taken back before the reset: nothing is pending any more.
  ASSERT_OK(sim->SetMigMode(0, false));
  ASSERT_OK_AND_ASSIGN(const auto undo, sim->SetMigMode(0, true));
  EXPECT_TRUE(undo.Active());
  EXPECT_TRUE(undo.mode.current && undo.mode.pending);
  EXPECT_TRUE(IsNvmlError(sim->SetMigMode(4, true), NvmlReturn::kInvalidArgument));
  EXPECT_TRUE(IsNvmlError(sim->ResetGpu(4), NvmlReturn::kInvalidArgument));
}

TEST(SimMigModeTest, SwitchAndResetRefusedWhileTheGpuIsUsed) {
  auto sim = MakeSim("H100 80GBx1,A100-SXM4-40GBx1");
  ASSERT_NE(sim, nullptr);
  const auto& p = Profile("H100 80GB", "1g.10gb");
  ASSERT_OK_AND_ASSIGN(const auto gi, sim->CreateGpuInstance(0, p.nvml_id, {0, 1}));
  auto refused = sim->SetMigMode(0, false);
  EXPECT_TRUE(IsNvmlError(refused, NvmlReturn::kInUse));
  EXPECT_NE(std::string(refused.status().message()).find("1 GPU instances exist"),
            std::string::npos)
      << refused.status();
  ASSERT_OK_AND_ASSIGN(auto mode, sim->GetMigMode(0));
  EXPECT_TRUE(mode.current && mode.pending) << "a refused switch changes nothing";
  // Another client holding the GI blocks a reset too; so does a process.
  ASSERT_OK(sim->HoldGpuInstance(0, gi.id, "dcgm"));
  EXPECT_TRUE(IsNvmlError(sim->ResetGpu(0), NvmlReturn::kInUse));
  ASSERT_OK(sim->ReleaseGpuInstance(0, gi.id, "dcgm"));
  ASSERT_OK(sim->DestroyGpuInstance(0, gi.id));
  ASSERT_OK_AND_ASSIGN(const auto gpu, sim->GetGpu(0));
  ASSERT_OK(sim->AttachProcess(gpu.uuid, 77));
  EXPECT_TRUE(IsNvmlError(sim->SetMigMode(0, false), NvmlReturn::kInUse));
  EXPECT_TRUE(IsNvmlError(sim->ResetGpu(0), NvmlReturn::kInUse));
  ASSERT_OK(sim->DetachProcess(gpu.uuid, 77));
  ASSERT_OK_AND_ASSIGN(const auto off, sim->SetMigMode(0, false));
  EXPECT_TRUE(off.Active());
  // An Ampere GPU with a pending change: a process started meanwhile blocks the reset, and the
  // mode stays pending.
  ASSERT_OK(sim->SetMigMode(1, false));
  ASSERT_OK_AND_ASSIGN(const auto a100, sim->GetGpu(1));
  ASSERT_OK(sim->AttachProcess(a100.uuid, 78));
  EXPECT_TRUE(IsNvmlError(sim->ResetGpu(1), NvmlReturn::kInUse));
  ASSERT_OK_AND_ASSIGN(mode, sim->GetMigMode(1));
  EXPECT_TRUE(mode.current);
  EXPECT_FALSE(mode.pending);
}

TEST(SimMigModeTest, RebootRequiredHostKeepsTheModePendingUntilReboot) {
  TempStateFile state;
  SimNvmlOptions o = testing::SimOptions("H100 80GBx1,A100-SXM4-40GBx1,H100 80GBx1", state.path());
  o.reboot_required_gpus = {0, 1};
  ASSERT_OK_AND_ASSIGN(auto sim, SimNvml::Create(o));
  // Hopper and Ampere alike: a host without GPU reset needs a reboot.
  for (uint32_t gpu : {0u, 1u}) {
    ASSERT_OK_AND_ASSIGN(const auto change, sim->SetMigMode(gpu, false));
    EXPECT_EQ(change.activation, NvmlReturn::kResetRequired);
    EXPECT_TRUE(change.NeedsReboot());
    EXPECT_FALSE(change.Active());
    EXPECT_TRUE(change.mode.current);
    EXPECT_FALSE(change.mode.pending);
    auto reset = sim->ResetGpu(gpu);
    EXPECT_TRUE(IsNvmlError(reset, NvmlReturn::kNotSupported));
    EXPECT_NE(std::string(reset.message()).find("reboot"), std::string::npos) << reset;
  }
  // The mark is in the state file: another process sees it.
  {
    std::ifstream in(state.path());
    const auto j = nlohmann::json::parse(in);
    EXPECT_EQ(j["gpus"][0]["rebootRequired"], true);
    EXPECT_EQ(j["gpus"][2]["rebootRequired"], false);
  }
  auto other = MakeSim("", state.path());
  ASSERT_NE(other, nullptr);
  ASSERT_OK_AND_ASSIGN(const auto pending, other->GetMigMode(0));
  EXPECT_TRUE(pending.current && !pending.pending);
  // GPU 2 switches at once; the reboot applies the others' modes and clears every GPU's use.
  ASSERT_OK_AND_ASSIGN(const auto gpu2, other->GetGpu(2));
  ASSERT_OK(other->AttachProcess(gpu2.uuid, 99));
  ASSERT_OK(other->RebootHost());
  for (uint32_t gpu : {0u, 1u}) {
    ASSERT_OK_AND_ASSIGN(const auto mode, sim->GetMigMode(gpu));
    EXPECT_FALSE(mode.current) << gpu;
  }
  ASSERT_OK_AND_ASSIGN(const auto procs, sim->GetComputeProcesses(2));
  EXPECT_TRUE(procs.empty()) << "a reboot ends every process";
  // The mark can be cleared; then a reset works again.
  ASSERT_OK(sim->SetRebootRequired(1, false));
  ASSERT_OK(sim->SetMigMode(1, true));
  ASSERT_OK(sim->ResetGpu(1));
  ASSERT_OK_AND_ASSIGN(const auto back, sim->GetMigMode(1));
  EXPECT_TRUE(back.current);
  EXPECT_TRUE(IsNvmlError(sim->SetRebootRequired(3, true), NvmlReturn::kInvalidArgument));
  // A reboot-required GPU that does not exist is a bad option.
  SimNvmlOptions bad = testing::SimOptions("A30x1");
  bad.reboot_required_gpus = {1};
  auto created = SimNvml::Create(bad);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument);
}

// A switch takes the model's time on the injected clock: SetMigMode, plus the reset on Ampere.
TEST(SimMigModeTest, SwitchTakesTheModelsTimeOnTheClock) {
  SleepLog clock(/*instant=*/true);
  SimNvmlOptions o = testing::SimOptions("H100 80GBx1,A100-SXM4-40GBx1");
  o.clock = &clock;
  o.latency = mig::RealisticNvmlLatency();
  ASSERT_OK_AND_ASSIGN(auto sim, SimNvml::Create(o));
  using Ms = std::vector<absl::Duration>;
  const absl::Time start = clock.Now();
  ASSERT_OK(sim->SetMigMode(0, false));
  EXPECT_EQ(clock.slept(), (Ms{absl::Seconds(2)}));
  ASSERT_OK(sim->GetMigMode(0).status());  // reads take no time
  EXPECT_EQ(clock.slept().size(), 1u);
  clock.clear();
  ASSERT_OK(sim->SetMigMode(1, false));
  ASSERT_OK(sim->ResetGpu(1));
  EXPECT_EQ(clock.slept(), (Ms{absl::Seconds(2), absl::Seconds(10)}));
  EXPECT_EQ(clock.Now() - start, absl::Seconds(14));
  EXPECT_EQ(o.latency.MigModeSwitch("NVIDIA H100 80GB HBM3", false), absl::Seconds(2));
  EXPECT_EQ(o.latency.MigModeSwitch("NVIDIA A100-SXM4-40GB", true), absl::Seconds(12));
  // Per-model overrides, as for instances.
  ASSERT_OK_AND_ASSIGN(const auto custom,
                       mig::ParseNvmlLatency("set-mig-mode=1s,A30:reset-gpu=3s"));
  EXPECT_EQ(custom.MigModeSwitch("NVIDIA A30", true), absl::Seconds(4));
  EXPECT_EQ(custom.MigModeSwitch("NVIDIA A100-SXM4-40GB", true), absl::Seconds(1));
}

TEST(SimMigModeTest, InjectedFaultsOnSwitchAndResetChangeNothing) {
  auto sim = MakeSim("A100-SXM4-40GBx1");
  ASSERT_NE(sim, nullptr);
  ASSERT_OK(sim->InjectFault(testing::Fault("SetMigMode", 1, NvmlReturn::kNoPermission)));
  EXPECT_TRUE(IsNvmlError(sim->SetMigMode(0, false), NvmlReturn::kNoPermission));
  ASSERT_OK_AND_ASSIGN(auto mode, sim->GetMigMode(0));
  EXPECT_TRUE(mode.pending) << "a failed call changed nothing";
  ASSERT_OK(sim->SetMigMode(0, false));
  ASSERT_OK(sim->InjectFault(testing::Fault("ResetGpu", 1, NvmlReturn::kGpuIsLost)));
  EXPECT_TRUE(IsNvmlError(sim->ResetGpu(0), NvmlReturn::kGpuIsLost));
  ASSERT_OK_AND_ASSIGN(mode, sim->GetMigMode(0));
  EXPECT_TRUE(mode.current);
  ASSERT_OK(sim->InjectFault(testing::Fault("GetMigMode", 1, NvmlReturn::kGpuIsLost)));
  EXPECT_TRUE(IsNvmlError(sim->GetMigMode(0), NvmlReturn::kGpuIsLost));
  ASSERT_OK(sim->ResetGpu(0));
  ASSERT_OK_AND_ASSIGN(mode, sim->GetMigMode(0));
  EXPECT_FALSE(mode.current);
}

}  // namespace
}  // namespace dynmig::nvml
