// The link between the test executable and the fake libnvidia-ml (fake_libnvml.cc).
//
// The fake library implements the NVML C entry points DlopenNvml resolves, on top of an Nvml
// object (a SimNvml) that the test process owns. It finds that object through this exported
// function of the test executable (linked with ENABLE_EXPORTS), looked up with dlsym at nvmlInit.
#pragma once

#include <optional>

#include "absl/status/status.h"
#include "nvml/nvml.h"

namespace dynmig::nvml::testing {

struct FakeNvmlHost {
  Nvml* nvml = nullptr;  // what the fake library serves; null makes nvmlInit fail
  // NvmlReturnOf, so the library needs none of dynmig_nvml's code.
  std::optional<NvmlReturn> (*return_of)(const absl::Status&) = nullptr;
};

}  // namespace dynmig::nvml::testing

// Defined by the test executable.
extern "C" dynmig::nvml::testing::FakeNvmlHost* DynmigFakeNvmlHost();
