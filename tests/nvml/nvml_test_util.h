// Helpers shared by the NVML tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fmt/format.h"
#include "nvml/nvml.h"
#include "nvml/sim_nvml.h"

namespace dynmig::nvml::testing {

// ASSERT_OK and EXPECT_OK accept an absl::Status or an absl::StatusOr.
inline absl::Status StatusOf(const absl::Status& s) { return s; }
template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

}  // namespace dynmig::nvml::testing

#define DYNMIG_TEST_CONCAT_INNER_(a, b) a##b
#define DYNMIG_TEST_CONCAT_(a, b) DYNMIG_TEST_CONCAT_INNER_(a, b)

#define ASSERT_OK(expr)                                                                 \
  do {                                                                                  \
    const ::absl::Status dynmig_test_status_ = ::dynmig::nvml::testing::StatusOf(expr); \
    ASSERT_TRUE(dynmig_test_status_.ok()) << dynmig_test_status_;                       \
  } while (false)

#define EXPECT_OK(expr)                                                                 \
  do {                                                                                  \
    const ::absl::Status dynmig_test_status_ = ::dynmig::nvml::testing::StatusOf(expr); \
    EXPECT_TRUE(dynmig_test_status_.ok()) << dynmig_test_status_;                       \
  } while (false)

#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL_(DYNMIG_TEST_CONCAT_(dynmig_statusor_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                               \
  ASSERT_TRUE(statusor.ok()) << statusor.status();      \
  lhs = std::move(statusor).value()

namespace dynmig::nvml::testing {

// Checks both the canonical code and the NVML code a status carries, and that the message names
// the NVML code.
template <typename S>
::testing::AssertionResult IsNvmlError(const S& result, NvmlReturn want) {
  const absl::Status s = StatusOf(result);
  const absl::Status expected = NvmlStatus(want, "x");
  if (s.code() != expected.code()) {
    return ::testing::AssertionFailure()
           << "status " << s << " has code " << absl::StatusCodeToString(s.code()) << ", want "
           << absl::StatusCodeToString(expected.code());
  }
  if (NvmlReturnOf(s) != want) {
    return ::testing::AssertionFailure()
           << "status " << s << " does not carry " << NvmlReturnName(want);
  }
  if (std::string(s.message()).find(NvmlReturnName(want)) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "message of " << s << " does not name " << NvmlReturnName(want);
  }
  return ::testing::AssertionSuccess();
}

// Options and faults without designated initializers (GCC 12 warns about omitted members).
inline SimNvmlOptions SimOptions(const std::string& spec, const std::string& state_file = "") {
  SimNvmlOptions o;
  o.spec = spec;
  o.state_file = state_file;
  return o;
}

inline SimFault Fault(const std::string& op, uint32_t nth, NvmlReturn code, uint32_t times = 1,
                      std::optional<uint32_t> gpu = std::nullopt) {
  SimFault f;
  f.op = op;
  f.nth = nth;
  f.code = code;
  f.times = times;
  f.gpu = gpu;
  return f;
}

// A fresh path under the test temp dir; removes the file and its lock file on destruction.
class TempStateFile {
 public:
  TempStateFile() {
    static std::atomic<int> counter{0};
    dir_ = std::filesystem::path(::testing::TempDir()) /
           fmt::format("dynmig-nvml-{}-{}", getpid(), counter++);
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "state.json").string();
  }
  ~TempStateFile() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const std::string& path() const { return path_; }
  std::string dir() const { return dir_.string(); }

 private:
  std::filesystem::path dir_;
  std::string path_;
};

}  // namespace dynmig::nvml::testing
