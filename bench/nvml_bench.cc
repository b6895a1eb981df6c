// Costs of the simulator's operations: in memory, file-backed (with and without fsync), a cached
// read, a read after another writer, and discovery. Figures only; nothing is asserted.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "nvml/mig_minors.h"
#include "nvml/nvml.h"
#include "nvml/sim_nvml.h"

namespace {

using dynmig::nvml::SimNvml;
using dynmig::nvml::SimNvmlOptions;

std::string TempState() {
  static int counter = 0;
  const auto dir =
      std::filesystem::temp_directory_path() /
      ("dynmig-nvml-bench-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
  std::filesystem::create_directories(dir);
  return (dir / "state.json").string();
}

std::unique_ptr<SimNvml> Make(const std::string& state, bool fsync) {
  SimNvmlOptions o;
  o.spec = "A100-SXM4-40GBx8";
  o.state_file = state;
  o.fsync = fsync;
  auto sim = SimNvml::Create(std::move(o));
  if (!sim.ok()) std::abort();
  return std::move(*sim);
}

// One MIG device's life: create GI + CI, destroy CI + GI (4 mutations).
void CreateDestroy(SimNvml& sim) {
  auto gi = sim.CreateGpuInstance(3, 9, {4, 4});
  auto ci = sim.CreateComputeInstance(3, gi->id);
  benchmark::DoNotOptimize(ci->mig_uuid);
  (void)sim.DestroyComputeInstance(3, gi->id, ci->id);
  (void)sim.DestroyGpuInstance(3, gi->id);
}

void BM_MigDeviceLifecycleInMemory(benchmark::State& state) {
  auto sim = Make("", false);
  for (auto _ : state) CreateDestroy(*sim);
}
BENCHMARK(BM_MigDeviceLifecycleInMemory);

void BM_MigDeviceLifecycleFile(benchmark::State& state) {
  const std::string path = TempState();
  auto sim = Make(path, state.range(0) != 0);
  for (auto _ : state) CreateDestroy(*sim);
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}
BENCHMARK(BM_MigDeviceLifecycleFile)
    ->ArgName("fsync")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMicrosecond);

void BM_ListGpuInstancesCachedFile(benchmark::State& state) {
  const std::string path = TempState();
  auto sim = Make(path, false);
  for (uint32_t g = 0; g < 8; ++g) (void)sim->CreateGpuInstance(g, 9, {0, 4});
  for (auto _ : state) benchmark::DoNotOptimize(sim->ListGpuInstances(5));
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}
BENCHMARK(BM_ListGpuInstancesCachedFile);

void BM_ListGpuInstancesAfterAnotherWriter(benchmark::State& state) {
  const std::string path = TempState();
  auto reader = Make(path, false);
  auto writer = Make(path, false);
  bool on = false;
  for (auto _ : state) {
    state.PauseTiming();
    if (on) {
      (void)writer->DestroyGpuInstance(0, 1);
    } else {
      (void)writer->CreateGpuInstance(0, 9, {0, 4});
    }
    on = !on;
    state.ResumeTiming();
    benchmark::DoNotOptimize(reader->ListGpuInstances(5));
  }
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}
BENCHMARK(BM_ListGpuInstancesAfterAnotherWriter)->Unit(benchmark::kMicrosecond);

void BM_DiscoverCapability(benchmark::State& state) {
  auto sim = Make("", false);
  for (auto _ : state) benchmark::DoNotOptimize(dynmig::nvml::DiscoverCapability(*sim, 0));
}
BENCHMARK(BM_DiscoverCapability)->Unit(benchmark::kMicrosecond);

void BM_ParseMigMinors(benchmark::State& state) {
  const std::string text = dynmig::nvml::MigMinors::Generate();
  for (auto _ : state) benchmark::DoNotOptimize(dynmig::nvml::MigMinors::Parse(text));
}
BENCHMARK(BM_ParseMigMinors)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
