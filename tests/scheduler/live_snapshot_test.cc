// What the live page is fed: the events the recorder keeps (EventRecorder::Recent) and the pending
// pods the filter left (SchedulerMetrics::PendingPods), each bounded.
#include <gmock/gmock.h>

#include "scheduler/events.h"
#include "scheduler/metrics.h"
#include "scheduler_test_util.h"

namespace dynmig::scheduler::testing {
namespace {

TEST_F(SchedulerTest, RecentEventsAreTheLastRecordedNewestFirstAndBounded) {
  EventRecorder events(*client_, RealClock(), EventRecorderOptions{.max_recent = 3});
  for (int i = 0; i < 5; ++i) {
    events.Record(MigPod(fmt::format("p{}", i), 4000), "Warning", "MigPending",
                  fmt::format("message {}", i));
  }
  // A repeat within the dedupe window is dropped here too.
  events.Record(MigPod("p4", 4000), "Warning", "MigPending", "message 4");
  const std::vector<RecentEvent> recent = events.Recent();
  ASSERT_EQ(recent.size(), 3u);
  EXPECT_EQ(recent[0].pod, "default/p4");
  EXPECT_EQ(recent[0].message, "message 4");
  EXPECT_EQ(recent[0].type, "Warning");
  EXPECT_EQ(recent[0].reason, "MigPending");
  EXPECT_EQ(recent[2].pod, "default/p2");
  // Messages are cut as the events are.
  events.Record(MigPod("long", 4000), "Normal", "MigReserved", std::string(5000, 'x'));
  EXPECT_EQ(events.Recent()[0].message.size(), 1024u);
  EventRecorder none(*client_, RealClock(), EventRecorderOptions{.max_recent = 0});
  none.Record(MigPod("p", 4000), "Normal", "MigReserved", "m");
  EXPECT_TRUE(none.Recent().empty());
}

TEST(PendingPodsTest, LongestWaitingFirstLimitedWithTheirDetail) {
  SchedulerMetrics metrics;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  metrics.PodPending("ns/b", "fragmented", t0 + absl::Seconds(5), "b waits");
  metrics.PodPending("ns/a", "capacity-exhausted", t0, "a waits");
  metrics.PodPending("ns/c", "no-candidates", t0 + absl::Seconds(9));
  // A later filter keeps the first time, updates reason and detail.
  metrics.PodPending("ns/a", "fragmented", t0 + absl::Seconds(10), "a still waits");
  size_t total = 0;
  std::vector<PendingPod> pods = metrics.PendingPods(t0 + absl::Seconds(11), 2, &total);
  EXPECT_EQ(total, 3u);
  ASSERT_EQ(pods.size(), 2u);
  EXPECT_EQ(pods[0].pod, "ns/a");
  EXPECT_EQ(pods[0].reason, "fragmented");
  EXPECT_EQ(pods[0].detail, "a still waits");
  EXPECT_EQ(pods[0].since, t0);
  EXPECT_EQ(pods[1].pod, "ns/b");
  metrics.PodDone("ns/a");
  pods = metrics.PendingPods(t0 + absl::Seconds(11), 10);
  ASSERT_EQ(pods.size(), 2u);
  EXPECT_EQ(pods[1].pod, "ns/c");
  // Entries not refreshed for kPendingTtl are not shown.
  EXPECT_TRUE(metrics
                  .PendingPods(
                      t0 + absl::Seconds(10) + SchedulerMetrics::kPendingTtl + absl::Seconds(1), 10)
                  .empty());
  // A detail is cut to its bound on a UTF-8 character boundary.
  std::string text = "x";
  for (int i = 0; i < 1000; ++i) text += "\xc3\xa9";  // é
  SchedulerMetrics fresh;
  fresh.PodPending("ns/long", "fragmented", t0, text);
  pods = fresh.PendingPods(t0, 10);
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_LE(pods[0].detail.size(), SchedulerMetrics::kMaxPendingDetail);
  EXPECT_EQ(pods[0].detail.size() % 2, 1u);  // "x" then whole two-byte characters
}

}  // namespace
}  // namespace dynmig::scheduler::testing
