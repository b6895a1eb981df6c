#include "scheduler/lock_queue.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "scheduler_test_util.h"

namespace dynmig::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::SchedulerTest;
using ::testing::UnorderedElementsAre;

class NodeLockQueueTest : public SchedulerTest {
 protected:
  void SetUp() override {
    SchedulerTest::SetUp();
    CreateNode(testing::MigNode("node-a", {"GPU-a0"}));
  }
  std::string Holder() {
    auto node = client_->GetNode("node-a");
    if (!node.ok()) return "";
    auto value = kube::Annotation(*node, protocol::kNodeLockAnnotation);
    if (!value.has_value()) return "";
    auto parsed = protocol::ParseNodeLock(*value);
    return parsed.ok() ? parsed->pod : "unreadable";
  }
  void Hold(const std::string& pod) {
    ASSERT_TRUE(
        AcquireNodeLock(*client_, "node-a", {"default", pod, "uid-" + pod}, clock_.Now()).ok());
  }
  void Release(const std::string& pod) {
    ASSERT_TRUE(ReleaseNodeLock(*client_, "node-a", {"default", pod, "uid-" + pod}).ok());
  }
  // Starts a bind of `pod` that queues; returns once it waits.
  void StartWaiting(NodeLockQueue& queue, const std::string& pod) {
    const int before = queue.Waiting("node-a");
    threads_.emplace_back([this, &queue, pod] {
      absl::Status st = queue.Acquire(*client_, "node-a", {"default", pod, "uid-" + pod}, clock_);
      dynmig::MutexLock lock(&mu_);
      results_.emplace_back(pod, st);
    });
    ASSERT_TRUE(kube::testing::Eventually([&] { return queue.Waiting("node-a") == before + 1; }));
  }
  void JoinAll() {
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  std::vector<std::string> Done() {
    dynmig::MutexLock lock(&mu_);
    std::vector<std::string> out;
    for (const auto& [pod, st] : results_) out.push_back(pod + (st.ok() ? "" : ":failed"));
    return out;
  }
  absl::Status ResultOf(const std::string& pod) {
    dynmig::MutexLock lock(&mu_);
    for (const auto& [p, st] : results_)
      if (p == pod) return st;
    return absl::NotFoundError(pod);
  }

  std::vector<std::thread> threads_;
  dynmig::Mutex mu_;
  std::vector<std::pair<std::string, absl::Status>> results_ ABSL_GUARDED_BY(mu_);
};

// Binds take the lock in the order they came, each woken by the node's change (the poll fallback
// is 30 s here, so a bind that waited for it would not finish within the check's 10 s).
TEST_F(NodeLockQueueTest, BindsTakeTheLockInTheOrderTheyCameWokenByTheNodesChange) {
  NodeLockQueue queue({.wait = absl::Seconds(60),
                       .poll = absl::Seconds(30),
                       .max_poll = absl::Seconds(30),
                       .max_waiters = 8});
  Hold("holder");
  StartWaiting(queue, "a");
  StartWaiting(queue, "b");
  StartWaiting(queue, "c");
  EXPECT_EQ(queue.Waiting(), 3);
  std::string previous = "holder";
  for (const std::string next : {"a", "b", "c"}) {
    Release(previous);
    queue.NodeChanged("node-a");  // what the node informer reports
    ASSERT_TRUE(kube::testing::Eventually([&] { return Holder() == next; })) << next;
    previous = next;
  }
  JoinAll();
  // The order is the holders' above: a thread records its result after it took the lock, so the
  // next one may record first.
  EXPECT_THAT(Done(), UnorderedElementsAre("a", "b", "c"));
  EXPECT_EQ(queue.Waiting(), 0);
}

// Only the head of the queue reads the Node; the others sleep until it leaves.
TEST_F(NodeLockQueueTest, OnlyTheHeadReadsTheNode) {
  NodeLockQueue queue({.wait = absl::Seconds(60),
                       .poll = absl::Milliseconds(100),
                       .max_poll = absl::Milliseconds(400),
                       .max_waiters = 16});
  Hold("holder");
  const int64_t base = api_->request_count();
  for (const std::string pod : {"a", "b", "c", "d", "e", "f"}) StartWaiting(queue, pod);
  // The head has read the Node once and waits for its poll; the five behind it wait their turn.
  ASSERT_TRUE(kube::testing::Eventually([&] { return api_->request_count() > base; }));
  ASSERT_TRUE(clock_.AwaitWaiters(6));
  const int64_t before = api_->request_count();
  // Two seconds of simulated time, one timer at a time: each step fires the earliest wait and
  // lets the reads it causes finish before the next.
  const absl::Duration start = clock_.Monotonic();
  while (clock_.Monotonic() - start < absl::Seconds(2)) {
    const int64_t seen = api_->request_count();
    ASSERT_TRUE(clock_.AdvanceToNextDeadline());
    ASSERT_TRUE(kube::testing::Eventually([&] { return api_->request_count() > seen; }));
    ASSERT_TRUE(clock_.AwaitWaiters(6));
  }
  const int64_t reads = api_->request_count() - before;
  // The head alone: 100 + 200 + 400 + 400 ... ms, about 6 reads in 2 s. Six binds polling on
  // their own would make six times as many.
  EXPECT_LE(reads, 10);
  EXPECT_GE(reads, 2);
  queue.Stop();
  JoinAll();
  EXPECT_EQ(ResultOf("a").code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(ResultOf("f").code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(Holder(), "holder");
}

// A lock that stays fails the bind after the wait, naming the holder and the queue; binds behind
// it fail too, saying so. Then the next bind, the lock released, takes it.
TEST_F(NodeLockQueueTest, ALockThatStaysFailsTheBindsAfterTheWait) {
  NodeLockQueue queue({.wait = absl::Milliseconds(500),
                       .poll = absl::Milliseconds(50),
                       .max_poll = absl::Milliseconds(100),
                       .max_waiters = 8});
  Hold("holder");
  StartWaiting(queue, "a");
  StartWaiting(queue, "b");
  clock_.Advance(absl::Milliseconds(600));  // past both binds' wait
  JoinAll();
  const absl::Status a = ResultOf("a");
  EXPECT_EQ(a.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(a.message(),
              HasSubstr("node node-a is locked by default/holder (uid uid-holder) since"));
  EXPECT_THAT(a.message(), HasSubstr("waited 500ms for it (0 binds to the node were ahead"));
  const absl::Status b = ResultOf("b");
  EXPECT_EQ(b.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(b.message(), HasSubstr("waited 500ms"));
  EXPECT_EQ(Holder(), "holder");
  Release("holder");
  EXPECT_TRUE(queue.Acquire(*client_, "node-a", {"default", "c", "uid-c"}, clock_).ok());
  EXPECT_EQ(Holder(), "c");
  EXPECT_EQ(queue.Waiting(), 0);
}

// Each waiting bind holds an HTTP thread: beyond max_waiters a bind fails at once.
TEST_F(NodeLockQueueTest, BindsBeyondTheCapFailAtOnce) {
  NodeLockQueue queue({.wait = absl::Seconds(60), .max_waiters = 2});
  Hold("holder");
  StartWaiting(queue, "a");
  StartWaiting(queue, "b");
  const absl::Status c = queue.Acquire(*client_, "node-a", {"default", "c", "uid-c"}, clock_);
  EXPECT_EQ(c.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.message(),
            "lock node node-a: 2 binds already wait for node locks in this scheduler (at most 2)");
  Release("holder");
  queue.NodeChanged("node-a");
  ASSERT_TRUE(kube::testing::Eventually([&] { return Holder() == "a"; }));
  Release("a");
  queue.NodeChanged("node-a");
  JoinAll();
  EXPECT_THAT(Done(), UnorderedElementsAre("a", "b"));  // the order: Holder() above and below
  EXPECT_EQ(Holder(), "b");
}

// The pod that holds the lock already (a retried bind) takes it again at once, whatever waits;
// an expired lock is taken over.
TEST_F(NodeLockQueueTest, OwnAndExpiredLocksAreTakenAtOnce) {
  NodeLockQueue queue({.wait = absl::Seconds(60), .max_waiters = 8});
  Hold("a");
  EXPECT_TRUE(queue.Acquire(*client_, "node-a", {"default", "a", "uid-a"}, clock_).ok());
  clock_.Advance(absl::Minutes(6));
  EXPECT_TRUE(queue.Acquire(*client_, "node-a", {"default", "b", "uid-b"}, clock_).ok());
  EXPECT_EQ(Holder(), "b");
  EXPECT_EQ(queue.Acquire(*client_, "node-b", {"default", "c", "uid-c"}, clock_).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(queue.Waiting(), 0);
}

}  // namespace
}  // namespace dynmig::scheduler
