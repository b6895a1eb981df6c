// One libFuzzer binary, one target per parser: the target is the binary's name (the build links
// <name>_fuzz -> dynmig_fuzz) or $DYNMIG_FUZZ_TARGET. One binary keeps the sanitizer build small
// on a busy machine; each target keeps its own corpus and crash files (tools/run-fuzz.sh).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"

namespace dynmig::fuzz {

int FuzzAdmissionReview(const uint8_t* data, size_t size);
int FuzzBoundedJson(const uint8_t* data, size_t size);
int FuzzDeviceConfig(const uint8_t* data, size_t size);
int FuzzExtenderArgs(const uint8_t* data, size_t size);
int FuzzGeometry(const uint8_t* data, size_t size);
int FuzzHeldSlices(const uint8_t* data, size_t size);
int FuzzIdleInstances(const uint8_t* data, size_t size);
int FuzzKubeconfig(const uint8_t* data, size_t size);
int FuzzMigAllocations(const uint8_t* data, size_t size);
int FuzzMigMinors(const uint8_t* data, size_t size);
int FuzzNodeRegister(const uint8_t* data, size_t size);
int FuzzPodDevices(const uint8_t* data, size_t size);
int FuzzPodRequest(const uint8_t* data, size_t size);
int FuzzRuntimeInfo(const uint8_t* data, size_t size);
int FuzzTraceCsv(const uint8_t* data, size_t size);

namespace {

using Target = int (*)(const uint8_t*, size_t);

struct Entry {
  std::string_view name;
  Target fn;
};

constexpr Entry kTargets[] = {
    {"admission_review", FuzzAdmissionReview},
    {"bounded_json", FuzzBoundedJson},
    {"device_config", FuzzDeviceConfig},
    {"extender_args", FuzzExtenderArgs},
    {"geometry", FuzzGeometry},
    {"held_slices", FuzzHeldSlices},
    {"idle_instances", FuzzIdleInstances},
    {"kubeconfig", FuzzKubeconfig},
    {"mig_allocations", FuzzMigAllocations},
    {"mig_minors", FuzzMigMinors},
    {"node_register", FuzzNodeRegister},
    {"pod_devices", FuzzPodDevices},
    {"pod_request", FuzzPodRequest},
    {"runtime_info", FuzzRuntimeInfo},
    {"trace_csv", FuzzTraceCsv},
};

Target chosen = nullptr;

}  // namespace
}  // namespace dynmig::fuzz

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  using namespace dynmig::fuzz;
  std::string name;
  if (const char* env = std::getenv("DYNMIG_FUZZ_TARGET"); env != nullptr && *env != '\0') {
    name = env;
  } else if (*argc > 0) {
    name = (*argv)[0];
    if (auto slash = name.rfind('/'); slash != std::string::npos) name.erase(0, slash + 1);
    if (name.ends_with("_fuzz")) name.resize(name.size() - 5);
  }
  for (const Entry& e : kTargets) {
    if (e.name == name) chosen = e.fn;
  }
  if (chosen == nullptr) {
    std::fprintf(stderr,
                 "dynmig_fuzz: no fuzz target '%s'; run it as <target>_fuzz or set "
                 "DYNMIG_FUZZ_TARGET to one of:",
                 name.c_str());
    for (const Entry& e : kTargets)
      std::fprintf(stderr, " %.*s", int(e.name.size()), e.name.data());
    std::fprintf(stderr, "\n");
    std::exit(2);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dynmig::fuzz::chosen(data, size);
}
