// kube-scheduler v1.20's retry behaviour, step by step on a hand-driven clock.
#include "local/scheduling_queue.h"

#include <gtest/gtest.h>

namespace dynmig::local {
namespace {

using Where = SchedulingQueue::Where;

class SchedulingQueueTest : public ::testing::Test {
 protected:
  absl::Time t0_ = absl::FromUnixSeconds(1000);
  absl::Time At(double s) { return t0_ + absl::Seconds(s); }
  SchedulingQueue q_{SchedulingQueueTiming{}};
};

TEST_F(SchedulingQueueTest, DefaultsAreKubeSchedulers) {
  const SchedulingQueueTiming t;
  EXPECT_EQ(t.initial_backoff, absl::Seconds(1));
  EXPECT_EQ(t.max_backoff, absl::Seconds(10));
  EXPECT_EQ(t.backoff_flush, absl::Seconds(1));
  EXPECT_EQ(t.unschedulable_flush, absl::Seconds(30));
  EXPECT_EQ(t.unschedulable_timeout, absl::Seconds(60));
  EXPECT_EQ(t.Scaled(20).unschedulable_timeout, absl::Seconds(3));
}

TEST_F(SchedulingQueueTest, PopsByPriorityThenArrival) {
  q_.Add("ns/a", 0, At(0));
  q_.Add("ns/b", 0, At(1));
  q_.Add("ns/high", 100, At(2));
  EXPECT_EQ(q_.Pop(), "ns/high");
  EXPECT_EQ(q_.Pop(), "ns/a");
  EXPECT_EQ(q_.Pop(), "ns/b");
  EXPECT_EQ(q_.Pop(), std::nullopt);
  EXPECT_EQ(q_.Attempts("ns/a"), 1);
}

// A failure with no cluster event waits among the unschedulable pods: a Node annotation change is
// no event, so only the leftover flush (unschedulable for over 60 s) brings it back.
TEST_F(SchedulingQueueTest, FailedPodWaitsForTheLeftoverFlushWithoutAnEvent) {
  q_.Add("ns/p", 0, At(0));
  ASSERT_EQ(q_.Pop(), "ns/p");
  q_.AddUnschedulable("ns/p", 0, At(0.1));
  EXPECT_EQ(q_.Find("ns/p"), Where::kUnschedulable);
  q_.FlushBackoffCompleted(At(20));
  EXPECT_EQ(q_.Find("ns/p"), Where::kUnschedulable) << "backoff does not apply to it";
  q_.FlushUnschedulableLeftover(At(30));
  EXPECT_EQ(q_.Find("ns/p"), Where::kUnschedulable) << "only 30 s there";
  q_.FlushUnschedulableLeftover(At(60));
  EXPECT_EQ(q_.Find("ns/p"), Where::kUnschedulable) << "exactly 60 s is not over 60 s";
  q_.FlushUnschedulableLeftover(At(60.2));
  EXPECT_EQ(q_.Find("ns/p"), Where::kActive);
  EXPECT_EQ(q_.Pop(), "ns/p");
}

// A relevant event moves unschedulable pods: to backoffQ while their backoff (1 s doubling per
// attempt, at most 10 s) runs, else to activeQ.
TEST_F(SchedulingQueueTest, EventMovesToBackoffThenActiveAfterTheDoublingBackoff) {
  q_.Add("ns/p", 0, At(0));
  double now = 0;
  const double expected[] = {1, 2, 4, 8, 10, 10};
  for (double backoff : expected) {
    ASSERT_EQ(q_.Pop(), "ns/p");
    q_.AddUnschedulable("ns/p", 0, At(now));
    EXPECT_EQ(q_.BackoffEnds("ns/p"), At(now + backoff)) << "attempt " << q_.Attempts("ns/p");
    q_.MoveAll(At(now + 0.5));
    ASSERT_EQ(q_.Find("ns/p"), Where::kBackoff);
    q_.FlushBackoffCompleted(At(now + backoff - 0.01));
    EXPECT_EQ(q_.Find("ns/p"), Where::kBackoff);
    q_.FlushBackoffCompleted(At(now + backoff));
    EXPECT_EQ(q_.Find("ns/p"), Where::kActive);
    now += backoff + 1;
  }
  // An event after the backoff ended goes straight to activeQ.
  ASSERT_EQ(q_.Pop(), "ns/p");
  q_.AddUnschedulable("ns/p", 0, At(now));
  q_.MoveAll(At(now + 11));
  EXPECT_EQ(q_.Find("ns/p"), Where::kActive);
}

// A move request while the pod was being tried: its failure goes to backoffQ, not to wait for the
// flush (the cluster changed under the attempt). A move request before the Pop does not count.
TEST_F(SchedulingQueueTest, MoveRequestDuringTheAttemptSendsTheFailureToBackoff) {
  q_.Add("ns/a", 0, At(0));
  q_.Add("ns/b", 0, At(0));
  q_.MoveAll(At(0));  // before either attempt
  ASSERT_EQ(q_.Pop(), "ns/a");
  q_.AddUnschedulable("ns/a", 0, At(0.1));
  EXPECT_EQ(q_.Find("ns/a"), Where::kUnschedulable);
  ASSERT_EQ(q_.Pop(), "ns/b");
  q_.MoveAll(At(0.2));  // e.g. a node update while b is tried: a goes to backoff too
  EXPECT_EQ(q_.Find("ns/a"), Where::kBackoff);
  q_.AddUnschedulable("ns/b", 0, At(0.3));
  EXPECT_EQ(q_.Find("ns/b"), Where::kBackoff);
  EXPECT_EQ(q_.UnschedulableCount(), 0u);
}

// Updates of a pending pod: a status-only update leaves an unschedulable pod where it is, a spec
// or metadata change queues it; a backoff pod goes active on any update; a pod being tried is
// queued again (kube-scheduler's Update).
TEST_F(SchedulingQueueTest, PodUpdates) {
  q_.Add("ns/p", 0, At(0));
  ASSERT_EQ(q_.Pop(), "ns/p");
  q_.AddUnschedulable("ns/p", 0, At(0));
  q_.Update("ns/p", 0, /*spec_changed=*/false, At(1));
  EXPECT_EQ(q_.Find("ns/p"), Where::kUnschedulable);
  q_.Update("ns/p", 0, /*spec_changed=*/true, At(1));
  EXPECT_EQ(q_.Find("ns/p"), Where::kActive);
  ASSERT_EQ(q_.Pop(), "ns/p");
  q_.Update("ns/p", 0, false, At(2));  // updated while being tried
  EXPECT_EQ(q_.Find("ns/p"), Where::kActive);
  q_.AddUnschedulable("ns/p", 0, At(2));  // the attempt's failure does not move it back
  EXPECT_EQ(q_.Find("ns/p"), Where::kActive);
  ASSERT_EQ(q_.Pop(), "ns/p");
  q_.MoveAll(At(3));
  q_.AddUnschedulable("ns/p", 0, At(3));
  ASSERT_EQ(q_.Find("ns/p"), Where::kBackoff);
  q_.Update("ns/p", 0, false, At(3.1));
  EXPECT_EQ(q_.Find("ns/p"), Where::kActive);
  q_.Delete("ns/p");
  EXPECT_EQ(q_.Find("ns/p"), Where::kNone);
  EXPECT_EQ(q_.Pop(), std::nullopt);
}

}  // namespace
}  // namespace dynmig::local
