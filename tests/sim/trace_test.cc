#include "sim/trace.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace dynmig::sim {
namespace {

using ::testing::HasSubstr;

constexpr const char* kHeader =
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
    "deletion_time,scheduled_time\n";

TEST(ParseAlibabaCsv, MapsPodsToInstancesAndShares) {
  const std::string csv = std::string(kHeader) +
                          "p0,1000,100,1,1000,,LS,Running,0,100,0\n"
                          "p1,1000,100,1,460,,LS,Running,50,80,50\n"
                          "p2,1000,100,0,0,,LS,Running,10,20,10\n"
                          "p3,1000,100,8,1000,,LS,Running,5,,5\n"
                          "p4,1000,100,1,0,,LS,Running,20,30,20\n"
                          "p5,1000,100,1,5,,BE,Pending,30,40,\n";
  auto t = ParseAlibabaCsv(csv, "pods.csv");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->rows, 6u);
  EXPECT_EQ(t->cpu_only, 1u);
  EXPECT_EQ(t->never_deleted, 1u);
  ASSERT_EQ(t->pods.size(), 5u);
  // Sorted by arrival: p0 (0), p3 (5), p4 (20), p5 (30), p1 (50).
  EXPECT_EQ(t->pods[0].percent, 100u);
  EXPECT_EQ(t->pods[0].count, 1u);
  EXPECT_EQ(t->pods[1].count, 8u);
  EXPECT_EQ(t->pods[1].percent, 100u);
  EXPECT_DOUBLE_EQ(t->pods[1].departure, 100);  // never deleted: runs to the end
  EXPECT_EQ(t->pods[2].percent, 100u);          // gpu_milli 0 with num_gpu 1: whole GPU
  EXPECT_EQ(t->pods[3].percent, 1u);            // 5 milli rounds up to 1 %
  EXPECT_EQ(t->pods[4].percent, 46u);
  EXPECT_EQ(t->pods[4].line, 3u);
  EXPECT_DOUBLE_EQ(t->start, 0);
  EXPECT_DOUBLE_EQ(t->end, 100);
}

TEST(ParseAlibabaCsv, AListWithoutCreationTimeIsASnapshotInRowOrder) {
  // The v2023 multigpu* lists: no creation_time or deletion_time.
  const std::string csv =
      "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase\n"
      "a,1000,100,2,1000,,LS,Running\n"
      "b,1000,100,0,0,,LS,Running\n"
      "c,1000,100,1,300,,BE,Pending\n";
  auto t = ParseAlibabaCsv(csv, "multigpu50.csv");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->snapshot);
  EXPECT_EQ(t->rows, 3u);
  EXPECT_EQ(t->cpu_only, 1u);
  ASSERT_EQ(t->pods.size(), 2u);
  EXPECT_EQ(t->pods[0].count, 2u);
  EXPECT_DOUBLE_EQ(t->pods[0].arrival, 0);
  EXPECT_EQ(t->pods[1].percent, 30u);
  EXPECT_DOUBLE_EQ(t->pods[1].arrival, 2);  // row order
  EXPECT_DOUBLE_EQ(t->pods[0].departure, t->end);
  EXPECT_DOUBLE_EQ(t->pods[1].departure, t->end);
  // A timed list is not a snapshot; creation_time without deletion_time is still an error.
  EXPECT_FALSE(
      ParseAlibabaCsv(std::string(kHeader) + "p,1,1,1,1000,,LS,Running,0,5,0\n", "x")->snapshot);
  auto half = ParseAlibabaCsv("name,num_gpu,gpu_milli,creation_time\nx,1,1000,0\n", "h.csv");
  ASSERT_FALSE(half.ok());
  EXPECT_THAT(std::string(half.status().message()),
              HasSubstr("h.csv:1: missing column \"deletion_time\""));
}

TEST(ParseAlibabaCsv, ColumnsAreFoundByName) {
  const std::string csv =
      "deletion_time,gpu_milli,name,creation_time,num_gpu\r\n"
      "9,250,a,1,1\r\n";
  auto t = ParseAlibabaCsv(csv, "x.csv");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->pods.size(), 1u);
  EXPECT_EQ(t->pods[0].percent, 25u);
  EXPECT_DOUBLE_EQ(t->pods[0].arrival, 1);
  EXPECT_DOUBLE_EQ(t->pods[0].departure, 9);
}

TEST(ParseAlibabaCsv, MissingColumnIsNamed) {
  auto t = ParseAlibabaCsv("name,num_gpu,creation_time,deletion_time\np,1,0,1\n", "pods.csv");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr("pods.csv:1: missing column \"gpu_milli\""));
}

// A snapshot (no timing columns) that also lacks num_gpu: the missing column is named (the
// trace_csv fuzz target found it read column -1: the check took -1 for a timing column).
TEST(ParseAlibabaCsv, MissingColumnOfASnapshotIsNamed) {
  for (const char* csv : {"name,gpu_milli\np,1000\n", "gpu_milli,num_gpu\n1000,1\n"}) {
    auto t = ParseAlibabaCsv(csv, "snap.csv");
    ASSERT_FALSE(t.ok()) << csv;
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("snap.csv:1: missing column")) << csv;
  }
}

TEST(ParseAlibabaCsv, BadNumberNamesLineAndColumn) {
  const std::string csv =
      std::string(kHeader) + "p0,1,1,1,1000,,LS,Running,0,100,0\np1,1,1,1,abc,,LS,Running,0,1,0\n";
  auto t = ParseAlibabaCsv(csv, "pods.csv");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(std::string(t.status().message()), "pods.csv:3: gpu_milli \"abc\" is not a number");
}

TEST(ParseAlibabaCsv, OtherBadRows) {
  auto fields = ParseAlibabaCsv(std::string(kHeader) + "p0,1,1,1,1000,,LS,Running,0,100\n", "f");
  ASSERT_FALSE(fields.ok());
  EXPECT_EQ(std::string(fields.status().message()), "f:2: 10 field(s) where the header has 11");

  auto order = ParseAlibabaCsv(std::string(kHeader) + "p0,1,1,1,1000,,LS,Running,50,10,0\n", "f");
  ASSERT_FALSE(order.ok());
  EXPECT_EQ(std::string(order.status().message()),
            "f:2: deletion_time \"10\" is before creation_time 50");

  auto milli = ParseAlibabaCsv(std::string(kHeader) + "p0,1,1,1,1200,,LS,Running,0,10,0\n", "f");
  ASSERT_FALSE(milli.ok());
  EXPECT_EQ(std::string(milli.status().message()), "f:2: gpu_milli \"1200\" is above 1000");

  auto neg = ParseAlibabaCsv(std::string(kHeader) + "p0,1,1,-1,1000,,LS,Running,0,10,0\n", "f");
  ASSERT_FALSE(neg.ok());
  EXPECT_EQ(std::string(neg.status().message()), "f:2: num_gpu \"-1\" is not a number");

  auto empty = ParseAlibabaCsv("", "f");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(std::string(empty.status().message()), "f: empty (no header line)");
}

TEST(ResolveTracePath, FlagEnvAndRoots) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("dynmig-sim-trace-test-" + std::to_string(::getpid()));
  fs::create_directories(dir / "repo");
  fs::create_directories(dir / "shared/data/alibaba-gpu-v2023");
  std::ofstream(dir / "shared/data/alibaba-gpu-v2023/openb_pod_list_default.csv") << kHeader;
  std::ofstream(dir / "shared/data/alibaba-gpu-v2023/openb_pod_list_gpushare100.csv") << kHeader;

  TraceLookup roots;
  roots.roots = {(dir / "repo").string()};
  auto found = ResolveTracePath(roots);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(fs::path(*found).filename(), "openb_pod_list_default.csv");

  TraceLookup short_name = roots;
  short_name.flag = "gpushare100";
  auto share = ResolveTracePath(short_name);
  ASSERT_TRUE(share.ok()) << share.status();
  EXPECT_EQ(fs::path(*share).filename(), "openb_pod_list_gpushare100.csv");

  TraceLookup in_dir;
  in_dir.flag = (dir / "shared/data/alibaba-gpu-v2023").string();
  EXPECT_TRUE(ResolveTracePath(in_dir).ok());

  TraceLookup none;
  none.roots = {(dir / "nowhere" / "deeper").string()};
  auto missing = ResolveTracePath(none);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("openb_pod_list_default.csv was not found"));
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("DYNMIG_TRACE_DIR"));

  TraceLookup bad;
  bad.flag = "no-such-trace";
  bad.roots = roots.roots;
  auto nope = ResolveTracePath(bad);
  ASSERT_FALSE(nope.ok());
  EXPECT_EQ(std::string(nope.status().message()), "--trace: no trace file \"no-such-trace\"");
  fs::remove_all(dir);
}

// The shipped traces, when the shared data directory is next to the repository.
TEST(LoadTrace, ShippedTraces) {
  const char* src = std::getenv("DYNMIG_SOURCE_DIR");
  TraceLookup lookup;
  if (src != nullptr) lookup.roots = {src};
  auto path = ResolveTracePath(lookup);
  if (!path.ok()) GTEST_SKIP() << path.status();
  auto t = LoadTrace(*path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->rows, 8152u);
  EXPECT_EQ(t->cpu_only, 1088u);
  EXPECT_EQ(t->pods.size(), 7064u);
  size_t fractional = 0;
  for (const auto& p : t->pods) fractional += p.percent < 100;
  EXPECT_EQ(fractional, 3078u);
}

}  // namespace
}  // namespace dynmig::sim
