// Conformance suite: RestKubeClient against InMemoryApiServer over real HTTP.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "kube/api_status.h"
#include "kube_test_util.h"

namespace dynmig::kube {
namespace {

using ::testing::HasSubstr;
using testing::MakeNode;
using testing::MakePod;
using ::testing::Not;
using testing::Recorder;

std::string Msg(const absl::Status& st) { return std::string(st.message()); }

class ConformanceTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(testing::FastServerOptions()); }

  // `fake_timers`: the server's timers (GC, watch deadlines, fault windows) run on clock_ too.
  void StartServer(InMemoryApiServerOptions options, bool fake_timers = false) {
    client_.reset();
    server_.reset();
    options.store.clock = &clock_;
    if (fake_timers) options.clock = &clock_;
    auto server = InMemoryApiServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    client_ = testing::MakeClient(server_->url(), &sleeps_);
  }

  void TearDown() override {
    client_.reset();  // close its connections before the server stops
    server_.reset();
  }

  absl::Time Now() { return clock_.Now(); }
  void Advance(absl::Duration d) { clock_.Advance(d); }

  // The store's wall time (timestamps, graceful deletion, continue tokens); the server's timers
  // run on real time unless a test gives it this clock too (options.clock).
  FakeClock clock_;
  testing::SleepRecorder sleeps_;
  std::unique_ptr<InMemoryApiServer> server_;
  std::unique_ptr<RestKubeClient> client_;
};

// ---- CRUD ----

TEST_F(ConformanceTest, CreateGetListDeletePods) {
  auto created = client_->CreatePod(MakePod("web", "team-a"));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(Kind(*created), "Pod");
  EXPECT_FALSE(Uid(*created).empty());
  EXPECT_FALSE(ResourceVersion(*created).empty());
  EXPECT_EQ(Phase(*created), "Pending");
  EXPECT_EQ((*created)["metadata"]["generation"], 1);
  EXPECT_FALSE(StringAt(*created, "/metadata/creationTimestamp").empty());

  auto got = client_->GetPod("team-a", "web");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Uid(*got), Uid(*created));

  // The namespace was created on demand.
  EXPECT_TRUE(client_->Get(Resource::kNamespaces, "", "team-a").ok());

  auto dup = client_->CreatePod(MakePod("web", "team-a"));
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(Msg(dup.status()), HasSubstr("pods \"web\" already exists"));

  auto list = client_->ListPods({});
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->items.size(), 1u);
  EXPECT_EQ(Kind(list->items[0]), "Pod");  // filled in by the client
  EXPECT_EQ(list->items[0]["apiVersion"], "v1");
  EXPECT_FALSE(list->resource_version.empty());

  auto deleted = client_->DeletePod("team-a", "web");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  auto gone = client_->GetPod("team-a", "web");
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(gone.status()), HasSubstr("HTTP 404 NotFound: pods \"web\" not found"));
  EXPECT_EQ(client_->DeletePod("team-a", "web").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ConformanceTest, CreateValidatesLikeTheApiServer) {
  Object no_containers = MakePod("bad");
  no_containers["spec"]["containers"] = Object::array();
  auto st = client_->CreatePod(no_containers);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(st.status()), HasSubstr("HTTP 422 Invalid"));
  EXPECT_THAT(Msg(st.status()), HasSubstr("spec.containers: Required value"));
  auto bad_name = client_->CreatePod(MakePod("Bad_Name"));
  EXPECT_EQ(bad_name.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(bad_name.status()), HasSubstr("RFC 1123"));
  Object generated = MakePod("");
  generated["metadata"].erase("name");
  generated["metadata"]["generateName"] = "job-";
  auto gen = client_->CreatePod(generated);
  ASSERT_TRUE(gen.ok()) << gen.status();
  EXPECT_THAT(Name(*gen), ::testing::StartsWith("job-"));
  EXPECT_EQ(Name(*gen).size(), 9u);
  // Names that cannot be a path segment are refused before sending.
  EXPECT_EQ(client_->GetPod("default", "a/b").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ConformanceTest, NodesStatusSubresourceAndUpdateConflicts) {
  auto node = client_->CreateNode(MakeNode("gpu-1"));
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ((*node)["status"]["capacity"]["nvidia.com/gpu"], "8");

  // PUT of the main resource ignores status changes; PUT of /status changes only status.
  Object edit = *node;
  edit["metadata"]["labels"]["pool"] = "a100";
  edit["status"]["capacity"]["nvidia.com/gpu"] = "4";
  auto updated = client_->UpdateNode(edit);
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ(Label(*updated, "pool"), "a100");
  EXPECT_EQ((*updated)["status"]["capacity"]["nvidia.com/gpu"], "8");

  Object status_edit = *updated;
  status_edit["status"]["capacity"]["nvidia.com/gpu"] = "4";
  status_edit["metadata"]["labels"]["pool"] = "ignored";
  auto status = client_->UpdateNodeStatus(status_edit);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ((*status)["status"]["capacity"]["nvidia.com/gpu"], "4");
  EXPECT_EQ(Label(*status, "pool"), "a100");

  // The first read is stale now: 409 -> kAborted with the API's message.
  auto stale = client_->UpdateNode(edit);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(KubeReason(stale.status()), "Conflict");
  EXPECT_THAT(Msg(stale.status()), HasSubstr("the object has been modified"));

  // JSON patch on /status, as for extended resources without a device plugin.
  auto patched = client_->Patch(
      Resource::kNodes, "", "gpu-1",
      Object::parse(R"([{"op":"add","path":"/status/capacity/example.com~1foo","value":"4"}])"),
      PatchType::kJson, "status");
  ASSERT_TRUE(patched.ok()) << patched.status();
  EXPECT_EQ((*patched)["status"]["capacity"]["example.com/foo"], "4");
}

TEST_F(ConformanceTest, PatchAnnotationsWithResourceVersionPrecondition) {
  auto node = client_->CreateNode(MakeNode("n1"));
  ASSERT_TRUE(node.ok());
  const std::string rv = ResourceVersion(*node);

  auto locked = client_->PatchNodeAnnotations(
      "n1", {{"hami.io/mutex.lock", "2026-01-01T00:00:00Z,ns,pod"}}, rv);
  ASSERT_TRUE(locked.ok()) << locked.status();
  EXPECT_EQ(Annotation(*locked, "hami.io/mutex.lock"), "2026-01-01T00:00:00Z,ns,pod");
  EXPECT_NE(ResourceVersion(*locked), rv);

  // Same precondition again: the node changed since, so the lock attempt loses.
  auto lost = client_->PatchNodeAnnotations("n1", {{"hami.io/mutex.lock", "other"}}, rv);
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(KubeHttpCode(lost.status()), 409);
  EXPECT_EQ(Annotation(*client_->GetNode("n1"), "hami.io/mutex.lock"),
            "2026-01-01T00:00:00Z,ns,pod");

  // Without a precondition: last writer wins; nullopt removes the key.
  MetadataPatch patch;
  patch.annotations = {{"hami.io/mutex.lock", std::nullopt}, {"x", "1"}};
  patch.labels = {{"role", "gpu"}};
  auto unlocked = client_->PatchNodeMetadata("n1", patch);
  ASSERT_TRUE(unlocked.ok()) << unlocked.status();
  EXPECT_EQ(Annotation(*unlocked, "hami.io/mutex.lock"), std::nullopt);
  EXPECT_EQ(Annotation(*unlocked, "x"), "1");
  EXPECT_EQ(Label(*unlocked, "role"), "gpu");

  EXPECT_EQ(client_->PatchPodAnnotations("default", "nope", {{"a", "b"}}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ConformanceTest, ConcurrentOptimisticUpdatesNeverLoseWrites) {
  ASSERT_TRUE(client_->CreatePod(MakePod("counter")).ok());
  constexpr int kThreads = 6;
  constexpr int kIncrements = 10;
  std::atomic<int> conflicts{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) {
        while (true) {
          auto pod = client_->GetPod("default", "counter");
          ASSERT_TRUE(pod.ok());
          const int value = std::stoi(Annotation(*pod, "count").value_or("0"));
          auto st = client_->PatchPodAnnotations(
              "default", "counter", {{"count", std::to_string(value + 1)}}, ResourceVersion(*pod));
          if (st.ok()) break;
          ASSERT_EQ(st.status().code(), absl::StatusCode::kAborted) << st.status();
          ++conflicts;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(Annotation(*client_->GetPod("default", "counter"), "count"),
            std::to_string(kThreads * kIncrements));
}

// ---- Selectors and lists ----

TEST_F(ConformanceTest, FieldAndLabelSelectors) {
  ASSERT_TRUE(client_->CreatePod(MakePod("a", "default", "n1", {{"app", "x"}})).ok());
  ASSERT_TRUE(client_->CreatePod(MakePod("b", "default", "n2", {{"app", "y"}})).ok());
  ASSERT_TRUE(client_->CreatePod(MakePod("c", "other", "n1", {{"app", "y"}, {"gpu", "1"}})).ok());
  ASSERT_TRUE(client_->CreatePod(MakePod("d", "default", "", {})).ok());
  auto names = [&](ListOptions options) {
    std::vector<std::string> out;
    auto list = client_->ListPods(options);
    EXPECT_TRUE(list.ok()) << list.status();
    if (list.ok()) {
      for (const auto& item : list->items) out.push_back(Name(item));
    }
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(names({.field_selector = "spec.nodeName=n1"}), (V{"a", "c"}));
  EXPECT_EQ(names({.ns = "default", .field_selector = "spec.nodeName=n1"}), (V{"a"}));
  EXPECT_EQ(names({.field_selector = "spec.nodeName="}), (V{"d"}));
  EXPECT_EQ(names({.field_selector = "metadata.name=b"}), (V{"b"}));
  EXPECT_EQ(names({.field_selector = "metadata.namespace=other"}), (V{"c"}));
  EXPECT_EQ(names({.field_selector = "status.phase=Pending,spec.nodeName!=n1"}), (V{"b", "d"}));
  EXPECT_EQ(names({.label_selector = "app=y"}), (V{"b", "c"}));
  EXPECT_EQ(names({.label_selector = "app in (x,y),!gpu"}), (V{"a", "b"}));
  EXPECT_EQ(names({.label_selector = "app notin (x)"}), (V{"b", "d", "c"}));  // key order
  EXPECT_EQ(names({.label_selector = "gpu"}), (V{"c"}));
  EXPECT_EQ(names({.label_selector = "app!=y"}), (V{"a", "d"}));

  auto bad = client_->ListPods({.field_selector = "spec.priority=1"});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(bad.status()), HasSubstr("field label not supported: spec.priority"));
}

TEST_F(ConformanceTest, PaginatedListIsAConsistentSnapshot) {
  for (int i = 0; i < 25; ++i) {
    ASSERT_TRUE(client_->CreatePod(MakePod(fmt::format("p{:02}", i))).ok());
  }
  const int64_t before = client_->attempts();
  auto list = client_->ListPods({.limit = 10});
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->items.size(), 25u);
  EXPECT_EQ(client_->attempts() - before, 3);  // 10 + 10 + 5

  // Pages come from the snapshot taken by the first page.
  auto page1 = server_->store().List(Resource::kPods, {.limit = 10});
  ASSERT_TRUE(page1.ok());
  ASSERT_TRUE(client_->DeletePod("default", "p20").ok());
  ASSERT_TRUE(client_->CreatePod(MakePod("p99")).ok());
  auto page2 = server_->store().List(Resource::kPods,
                                     {.limit = 100, .continue_token = page1->continue_token});
  ASSERT_TRUE(page2.ok());
  EXPECT_EQ(page2->items.size(), 15u);
  EXPECT_EQ(page2->resource_version, page1->resource_version);

  // Continue tokens expire.
  auto page = server_->store().List(Resource::kPods, {.limit = 5});
  ASSERT_TRUE(page.ok());
  Advance(absl::Minutes(6));
  auto expired =
      server_->store().List(Resource::kPods, {.limit = 5, .continue_token = page->continue_token});
  EXPECT_EQ(expired.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(KubeHttpCode(expired.status()), 410);
}

// ---- Binding and deletion ----

TEST_F(ConformanceTest, BindPod) {
  auto pod = client_->CreatePod(MakePod("job"));
  ASSERT_TRUE(pod.ok());
  ASSERT_TRUE(client_->BindPod("default", "job", "gpu-1", Uid(*pod)).ok());
  auto bound = client_->GetPod("default", "job");
  ASSERT_TRUE(bound.ok());
  EXPECT_EQ(NodeName(*bound), "gpu-1");
  EXPECT_EQ((*bound)["status"]["conditions"][0]["type"], "PodScheduled");
  EXPECT_EQ((*bound)["status"]["conditions"][0]["status"], "True");

  absl::Status again = client_->BindPod("default", "job", "gpu-2", "");
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(KubeHttpCode(again), 409);
  EXPECT_THAT(Msg(again), HasSubstr("already assigned to node \"gpu-1\""));

  ASSERT_TRUE(client_->CreatePod(MakePod("other")).ok());
  absl::Status wrong_uid = client_->BindPod("default", "other", "gpu-1", "not-the-uid");
  EXPECT_EQ(wrong_uid.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(Msg(wrong_uid), HasSubstr("Precondition failed: UID"));
  EXPECT_EQ(client_->BindPod("default", "missing", "gpu-1", "").code(),
            absl::StatusCode::kNotFound);
  // Spec.nodeName cannot be changed by a patch: binding is the only way.
  auto patch = client_->Patch(Resource::kPods, "default", "other",
                              {{"spec", {{"nodeName", "gpu-3"}}}}, PatchType::kMerge, "");
  EXPECT_EQ(patch.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ConformanceTest, GracefulPodDeletion) {
  StartServer(testing::FastServerOptions(), /*fake_timers=*/true);
  Object pod = MakePod("running", "default", "gpu-1");
  pod["spec"]["terminationGracePeriodSeconds"] = 20;
  ASSERT_TRUE(client_->CreatePod(pod).ok());

  auto deleting = client_->DeletePod("default", "running");
  ASSERT_TRUE(deleting.ok()) << deleting.status();
  EXPECT_TRUE(IsBeingDeleted(*deleting));
  EXPECT_EQ(DeletionTimestamp(*deleting), Rfc3339(Now() + absl::Seconds(20)));
  EXPECT_EQ((*deleting)["metadata"]["deletionGracePeriodSeconds"], 20);
  auto still = client_->GetPod("default", "running");
  ASSERT_TRUE(still.ok());
  EXPECT_TRUE(IsBeingDeleted(*still));
  // A terminating pod cannot be bound.
  EXPECT_EQ(
      server_->store().Bind("default", "running", {{"target", {{"name", "n"}}}}).status().code(),
      absl::StatusCode::kAborted);

  // The grace period passes (injected clock), the collector's timer fires and it removes it.
  EXPECT_EQ(server_->CollectGarbage(), 0) << "within its grace period";
  ASSERT_TRUE(clock_.AwaitWaiters(1));  // the collector waits for its next round
  Advance(absl::Seconds(21));
  EXPECT_TRUE(testing::Eventually([&] {
    return client_->GetPod("default", "running").status().code() == absl::StatusCode::kNotFound;
  }));

  // Deleting again with gracePeriodSeconds=0 removes at once.
  ASSERT_TRUE(client_->CreatePod(MakePod("second", "default", "gpu-1")).ok());
  ASSERT_TRUE(IsBeingDeleted(*client_->DeletePod("default", "second")));
  DeleteOptions now;
  now.grace_period_seconds = 0;
  ASSERT_TRUE(client_->DeletePod("default", "second", now).ok());
  EXPECT_EQ(client_->GetPod("default", "second").status().code(), absl::StatusCode::kNotFound);

  // Unbound and finished pods go at once, as on a real API server.
  ASSERT_TRUE(client_->CreatePod(MakePod("pending")).ok());
  EXPECT_FALSE(IsBeingDeleted(*client_->DeletePod("default", "pending")));
  EXPECT_EQ(client_->GetPod("default", "pending").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(client_->CreatePod(MakePod("done", "default", "gpu-1")).ok());
  ASSERT_TRUE(
      client_->PatchPodStatus("default", "done", {{"status", {{"phase", "Succeeded"}}}}).ok());
  ASSERT_TRUE(client_->DeletePod("default", "done").ok());
  EXPECT_EQ(client_->GetPod("default", "done").status().code(), absl::StatusCode::kNotFound);

  // Preconditions.
  auto pre = client_->CreatePod(MakePod("pre"));
  ASSERT_TRUE(pre.ok());
  DeleteOptions wrong;
  wrong.precondition_uid = "nope";
  EXPECT_EQ(client_->DeletePod("default", "pre", wrong).status().code(),
            absl::StatusCode::kAborted);
}

TEST_F(ConformanceTest, EventsLeasesAndNamespaces) {
  auto pod = client_->CreatePod(MakePod("p", "jobs"));
  ASSERT_TRUE(pod.ok());
  auto event = client_->CreateEvent(
      NewEvent(*pod, "Normal", "Scheduled", "bound to gpu-1", "dynmig", absl::Now()));
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_EQ(Namespace(*event), "jobs");
  auto events = client_->List(Resource::kEvents, {.field_selector = "involvedObject.name=p"});
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_EQ(events->items.size(), 1u);

  Object lease = {{"apiVersion", "coordination.k8s.io/v1"},
                  {"kind", "Lease"},
                  {"metadata", {{"name", "dynmig-extender"}, {"namespace", "kube-system"}}},
                  {"spec",
                   {{"holderIdentity", "host-a"},
                    {"leaseDurationSeconds", 15},
                    {"renewTime", MicroTime(absl::Now())}}}};
  auto created = client_->CreateLease(lease);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(client_->CreateLease(lease).status().code(), absl::StatusCode::kAlreadyExists);
  auto got = client_->GetLease("kube-system", "dynmig-extender");
  ASSERT_TRUE(got.ok());
  Object renew = *got;
  renew["spec"]["holderIdentity"] = "host-b";
  renew["spec"]["leaseTransitions"] = 1;
  auto renewed = client_->UpdateLease(renew);
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(StringAt(*renewed, "/spec/holderIdentity"), "host-b");
  // Another candidate with the old read loses the race.
  Object race = *got;
  race["spec"]["holderIdentity"] = "host-c";
  EXPECT_EQ(client_->UpdateLease(race).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(client_->GetLease("kube-system", "absent").status().code(),
            absl::StatusCode::kNotFound);

  // Deleting a namespace removes what is in it; the system namespaces cannot be deleted.
  ASSERT_TRUE(client_->Delete(Resource::kNamespaces, "", "jobs", {}).ok());
  EXPECT_EQ(client_->GetPod("jobs", "p").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->Delete(Resource::kNamespaces, "", "default", {}).status().code(),
            absl::StatusCode::kPermissionDenied);
}

// ---- Watches ----

std::string Describe(const WatchEvent& e) {
  return fmt::format("{} {}", WatchEventTypeName(e.type), Name(e.object));
}

TEST_F(ConformanceTest, WatchDeliversChangesInOrderWithSelectorTransitions) {
  Recorder<WatchEvent> events;
  auto watch =
      client_->WatchPods({.field_selector = "spec.nodeName=gpu-1"}, [&](const WatchEvent& e) {
        if (e.type != WatchEventType::kBookmark) events.Add(e);
      });
  ASSERT_TRUE(watch.ok()) << watch.status();
  ASSERT_TRUE(client_->CreatePod(MakePod("a")).ok());               // not on gpu-1: unseen
  ASSERT_TRUE(client_->BindPod("default", "a", "gpu-1", "").ok());  // now matches: ADDED
  ASSERT_TRUE(client_->PatchPodAnnotations("default", "a", {{"k", "v"}}).ok());  // MODIFIED
  ASSERT_TRUE(client_->CreatePod(MakePod("b", "default", "gpu-1")).ok());        // ADDED
  DeleteOptions now;
  now.grace_period_seconds = 0;
  ASSERT_TRUE(client_->DeletePod("default", "a", now).ok());  // DELETED
  ASSERT_TRUE(events.WaitForSize(4));
  std::vector<std::string> got;
  for (const auto& e : events.Get()) got.push_back(Describe(e));
  EXPECT_THAT(got, ::testing::ElementsAre("ADDED a", "MODIFIED a", "ADDED b", "DELETED a"));
  EXPECT_EQ(Kind(events.Get()[0].object), "Pod");
  EXPECT_EQ(Annotation(events.Get()[1].object, "k"), "v");
  (*watch)->Stop();
  EXPECT_EQ((*watch)->Wait().code(), absl::StatusCode::kCancelled);
}

TEST_F(ConformanceTest, WatchWithoutResourceVersionStartsWithCurrentState) {
  ASSERT_TRUE(client_->CreateNode(MakeNode("n1")).ok());
  ASSERT_TRUE(client_->CreateNode(MakeNode("n2")).ok());
  Recorder<WatchEvent> events;
  auto watch = client_->WatchNodes({}, [&](const WatchEvent& e) { events.Add(e); });
  ASSERT_TRUE(watch.ok());
  ASSERT_TRUE(events.WaitForSize(2));
  EXPECT_EQ(Describe(events.Get()[0]), "ADDED n1");
  EXPECT_EQ(Describe(events.Get()[1]), "ADDED n2");
}

TEST_F(ConformanceTest, BookmarksAdvanceTheResourceVersion) {
  auto list = client_->ListPods({});
  ASSERT_TRUE(list.ok());
  Recorder<WatchEvent> events;
  auto watch = client_->WatchPods({.resource_version = list->resource_version},
                                  [&](const WatchEvent& e) { events.Add(e); });
  ASSERT_TRUE(watch.ok());
  ASSERT_TRUE(client_->CreateNode(MakeNode("elsewhere")).ok());  // a node, not a pod
  ASSERT_TRUE(events.WaitUntil([](const std::vector<WatchEvent>& v) {
    return !v.empty() && v.back().type == WatchEventType::kBookmark;
  }));
  const WatchEvent bookmark = events.Get().back();
  EXPECT_EQ(Kind(bookmark.object), "Pod");
  // The bookmark's version covers the node write, which this pod watch never saw as an event.
  EXPECT_TRUE(testing::Eventually([&] {
    return std::stoll((*watch)->last_resource_version()) >= server_->store().resource_version();
  }));
  ListOptions no_bookmarks{.resource_version = list->resource_version, .allow_bookmarks = false};
  Recorder<WatchEvent> quiet;
  auto watch2 = client_->WatchPods(no_bookmarks, [&](const WatchEvent& e) { quiet.Add(e); });
  ASSERT_TRUE(watch2.ok());
  EXPECT_FALSE(quiet.WaitForSize(1, absl::Milliseconds(300)));
}

TEST_F(ConformanceTest, WatchResumesFromResourceVersionWithoutGapsOrDuplicates) {
  Recorder<WatchEvent> first;
  auto list = client_->ListPods({});
  ASSERT_TRUE(list.ok());
  auto w1 =
      client_->WatchPods({.resource_version = list->resource_version, .allow_bookmarks = false},
                         [&](const WatchEvent& e) { first.Add(e); });
  ASSERT_TRUE(w1.ok());
  ASSERT_TRUE(client_->CreatePod(MakePod("p1")).ok());
  ASSERT_TRUE(first.WaitForSize(1));
  // The connection drops (fault injection); changes happen while nobody watches.
  EXPECT_EQ(server_->CutWatches(), 1);
  const absl::Status end = (*w1)->Wait();
  EXPECT_EQ(end.code(), absl::StatusCode::kUnavailable) << end;
  const std::string resume_from = (*w1)->last_resource_version();
  ASSERT_TRUE(client_->CreatePod(MakePod("p2")).ok());
  ASSERT_TRUE(client_->PatchPodAnnotations("default", "p1", {{"a", "b"}}).ok());

  Recorder<WatchEvent> second;
  auto w2 = client_->WatchPods({.resource_version = resume_from, .allow_bookmarks = false},
                               [&](const WatchEvent& e) { second.Add(e); });
  ASSERT_TRUE(w2.ok());
  ASSERT_TRUE(second.WaitForSize(2));
  EXPECT_FALSE(second.WaitForSize(3, absl::Milliseconds(200)));
  EXPECT_EQ(Describe(second.Get()[0]), "ADDED p2");
  EXPECT_EQ(Describe(second.Get()[1]), "MODIFIED p1");
}

TEST_F(ConformanceTest, ExpiredResourceVersionIsReportedDistinctly) {
  auto list = client_->ListPods({});
  ASSERT_TRUE(list.ok());
  ASSERT_TRUE(client_->CreatePod(MakePod("p")).ok());
  server_->CompactHistory();
  // Usual form: 200, then an ERROR event with code 410.
  Recorder<WatchEvent> events;
  auto watch = client_->WatchPods({.resource_version = list->resource_version},
                                  [&](const WatchEvent& e) { events.Add(e); });
  ASSERT_TRUE(watch.ok()) << watch.status();
  const absl::Status end = (*watch)->Wait();
  EXPECT_EQ(end.code(), absl::StatusCode::kOutOfRange) << end;
  EXPECT_EQ(KubeReason(end), "Expired");
  EXPECT_THAT(Msg(end), HasSubstr("too old resource version"));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events.Get()[0].type, WatchEventType::kError);
  EXPECT_EQ(events.Get()[0].object["code"], 410);

  // Other form: HTTP 410 on the watch request itself.
  InMemoryApiServerOptions options = testing::FastServerOptions();
  options.expired_watch_as_http_error = true;
  StartServer(options);
  auto l2 = client_->ListPods({});
  ASSERT_TRUE(client_->CreatePod(MakePod("p")).ok());
  server_->CompactHistory();
  auto refused =
      client_->WatchPods({.resource_version = l2->resource_version}, [](const WatchEvent&) {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(KubeHttpCode(refused.status()), 410);
}

TEST_F(ConformanceTest, WatchStopsPromptlyAndNeverCallsBackAfterStop) {
  std::atomic<bool> stopped{false};
  std::atomic<int> late_calls{0};
  auto watch = client_->WatchPods({}, [&](const WatchEvent&) {
    if (stopped) ++late_calls;
  });
  ASSERT_TRUE(watch.ok());
  const auto start = std::chrono::steady_clock::now();
  (*watch)->Stop();
  stopped = true;
  const auto took = std::chrono::steady_clock::now() - start;
  // Promptly: without waiting for an event, a heartbeat or the server's timeout (30 minutes). The
  // bound is loose, so that a loaded machine's scheduling delays do not fail the test.
  EXPECT_LT(took, std::chrono::seconds(5));
  ASSERT_TRUE(client_->CreatePod(MakePod("after")).ok());
  EXPECT_EQ((*watch)->WaitFor(absl::Seconds(1)).value_or(absl::UnknownError("")).code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(late_calls.load(), 0);

  // Stop from inside the handler is allowed.
  Recorder<int> calls;
  // The handler may run (ADDED events of the existing pods) before `self` is set: atomic.
  std::atomic<std::unique_ptr<WatchStream>*> self{nullptr};
  auto w2 = client_->WatchPods({}, [&](const WatchEvent&) {
    calls.Add(1);
    if (auto* s = self.load(); s != nullptr) (*s)->Stop();
  });
  ASSERT_TRUE(w2.ok());
  self = &*w2;
  ASSERT_TRUE(client_->CreatePod(MakePod("trigger")).ok());
  EXPECT_EQ((*w2)->WaitFor(absl::Seconds(5)).value_or(absl::UnknownError("")).code(),
            absl::StatusCode::kCancelled);
}

TEST_F(ConformanceTest, WatchEndsCleanlyAtServerTimeout) {
  InMemoryApiServerOptions options = testing::FastServerOptions();
  options.gc_interval = absl::ZeroDuration();  // the watch is the one timer on clock_
  StartServer(options, /*fake_timers=*/true);
  Recorder<WatchEvent> events;
  auto watch =
      client_->WatchPods({.timeout_seconds = 1}, [&](const WatchEvent& e) { events.Add(e); });
  ASSERT_TRUE(watch.ok());
  ASSERT_TRUE(clock_.AwaitWaiters(1));  // the server's watch stream waits for events
  Advance(absl::Milliseconds(900));
  ASSERT_TRUE(clock_.AwaitWaiters(1));
  EXPECT_FALSE((*watch)->WaitFor(absl::Milliseconds(100)).has_value()) << "ended before 1 s";
  Advance(absl::Milliseconds(100));
  auto end = (*watch)->WaitFor(absl::Seconds(5));
  ASSERT_TRUE(end.has_value());
  EXPECT_TRUE(end->ok()) << *end;
}

// ---- Retries and faults ----

TEST_F(ConformanceTest, RetriesHonorRetryAfterAndBackOff) {
  ASSERT_TRUE(client_->CreateNode(MakeNode("n")).ok());
  server_->AddFault({.method = "GET",
                     .path_prefix = "/api/v1/nodes",
                     .count = 2,
                     .status = 503,
                     .retry_after_seconds = 2});
  auto got = client_->GetNode("n");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(sleeps_.Get(), ::testing::ElementsAre(absl::Seconds(2), absl::Seconds(2)));

  testing::SleepRecorder backoff;
  auto client = testing::MakeClient(server_->url(), &backoff, /*max_attempts=*/4);
  server_->AddFault({.method = "GET", .count = 3, .status = 429});
  ASSERT_TRUE(client->GetNode("n").ok());
  EXPECT_THAT(backoff.Get(), ::testing::ElementsAre(absl::Milliseconds(10), absl::Milliseconds(20),
                                                    absl::Milliseconds(40)));

  // Retries are bounded: a persistent 500 ends as kUnavailable with the server's message.
  server_->AddFault({.method = "GET", .count = -1, .status = 500, .message = "etcd is sad"});
  const int64_t before = client->attempts();
  auto failed = client->GetNode("n");
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(failed.status()), HasSubstr("HTTP 500 InternalError: etcd is sad"));
  EXPECT_EQ(client->attempts() - before, 4);
  server_->ClearFaults();

  // POST is not idempotent: a 500 is not retried, a 503 is.
  server_->AddFault({.method = "POST", .count = 1, .status = 500});
  const int64_t b2 = client->attempts();
  EXPECT_EQ(client->CreateNode(MakeNode("m")).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client->attempts() - b2, 1);
  server_->AddFault({.method = "POST", .count = 1, .status = 503});
  EXPECT_TRUE(client->CreateNode(MakeNode("m")).ok());

  // Watch requests are retried too.
  server_->AddFault({.method = "GET", .path_prefix = "/api/v1/pods", .count = 1, .status = 503});
  auto watch = client->WatchPods({}, [](const WatchEvent&) {});
  EXPECT_TRUE(watch.ok()) << watch.status();
}

TEST_F(ConformanceTest, ErrorStatusesMapToCodes) {
  struct Case {
    int http;
    absl::StatusCode code;
  };
  auto client = testing::MakeClient(server_->url(), nullptr, /*max_attempts=*/1);
  for (const Case& c :
       {Case{400, absl::StatusCode::kInvalidArgument},
        Case{401, absl::StatusCode::kUnauthenticated},
        Case{403, absl::StatusCode::kPermissionDenied}, Case{404, absl::StatusCode::kNotFound},
        Case{409, absl::StatusCode::kAborted}, Case{410, absl::StatusCode::kOutOfRange},
        Case{422, absl::StatusCode::kInvalidArgument}, Case{429, absl::StatusCode::kUnavailable},
        Case{502, absl::StatusCode::kUnavailable}}) {
    server_->AddFault({.count = 1, .status = c.http, .message = "injected"});
    auto st = client->ListNodes();
    EXPECT_EQ(st.status().code(), c.code) << c.http;
    EXPECT_EQ(KubeHttpCode(st.status()), c.http);
    EXPECT_THAT(Msg(st.status()), HasSubstr("GET /api/v1/nodes: HTTP"));
  }
}

TEST_F(ConformanceTest, MalformedAndTruncatedResponsesAreClearErrors) {
  auto client = testing::MakeClient(server_->url(), nullptr, /*max_attempts=*/1);
  server_->AddFault({.count = 1, .action = FaultSpec::Action::kMalformed});
  auto malformed = client->ListPods({});
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Msg(malformed.status()), HasSubstr("malformed JSON in response to GET /api/v1/pods"));

  server_->AddFault({.count = 1, .action = FaultSpec::Action::kTruncate});
  auto truncated = client->ListPods({});
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(truncated.status()), HasSubstr("truncated"));

  // A retrying client gets through once the fault is spent.
  server_->AddFault({.count = 1, .action = FaultSpec::Action::kTruncate});
  EXPECT_TRUE(client_->ListPods({}).ok());

  // Watch stream cut in the middle of an event.
  server_->AddFault({.count = 1, .action = FaultSpec::Action::kTruncate});
  Recorder<WatchEvent> events;
  auto watch = client->WatchPods({}, [&](const WatchEvent& e) { events.Add(e); });
  ASSERT_TRUE(watch.ok()) << watch.status();
  const absl::Status cut = (*watch)->Wait();
  EXPECT_EQ(cut.code(), absl::StatusCode::kUnavailable) << cut;
  EXPECT_THAT(Msg(cut), HasSubstr("unfinished event"));
  EXPECT_EQ(events.size(), 0u);

  // A watch event that is not JSON.
  server_->AddFault({.count = 1, .action = FaultSpec::Action::kMalformed});
  auto bad = client->WatchPods({}, [&](const WatchEvent& e) { events.Add(e); });
  ASSERT_TRUE(bad.ok()) << bad.status();
  const absl::Status bad_end = (*bad)->Wait();
  EXPECT_EQ(bad_end.code(), absl::StatusCode::kDataLoss) << bad_end;
  EXPECT_THAT(Msg(bad_end), HasSubstr("malformed watch event"));
  EXPECT_EQ(events.size(), 0u);
}

TEST_F(ConformanceTest, TransportFailuresAndTimeouts) {
  RestConfig config;
  config.server = server_->url();
  config.request_timeout = absl::Milliseconds(200);
  config.retry.max_attempts = 1;
  auto slow_client = RestKubeClient::Create(config);
  ASSERT_TRUE(slow_client.ok());
  server_->AddFault(
      {.count = 1, .action = FaultSpec::Action::kDelay, .latency = absl::Milliseconds(600)});
  auto slow = (*slow_client)->ListNodes();
  EXPECT_EQ(slow.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(Msg(slow.status()), HasSubstr("timed out"));

  const std::string url = server_->url();
  slow_client->reset();
  client_.reset();
  server_.reset();
  config.server = url;
  auto orphan = RestKubeClient::Create(config);
  ASSERT_TRUE(orphan.ok());
  auto refused = (*orphan)->ListNodes();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(refused.status()), HasSubstr("transport error"));
  auto no_watch = (*orphan)->WatchNodes({}, [](const WatchEvent&) {});
  EXPECT_EQ(no_watch.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(ConformanceTest, BearerTokenFileIsReReadWhenItChanges) {
  server_->SetBearerToken("first");
  const auto dir =
      std::filesystem::temp_directory_path() / fmt::format("dynmig-token-{}", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string token_path = (dir / "token").string();
  std::ofstream(token_path) << "first\n";
  RestConfig config;
  config.server = server_->url();
  config.token_file = token_path;
  config.retry.max_attempts = 1;
  auto client = RestKubeClient::Create(config);
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE((*client)->ListNodes().ok());

  // Rotation: the server wants the new token, the file gets it (different size and mtime).
  server_->SetBearerToken("second-token");
  auto rejected = (*client)->ListNodes();
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kUnauthenticated);
  std::ofstream(token_path) << "second-token\n";
  EXPECT_TRUE((*client)->ListNodes().ok());

  auto anonymous = testing::MakeClient(server_->url(), nullptr, 1);
  EXPECT_EQ(anonymous->ListNodes().status().code(), absl::StatusCode::kUnauthenticated);
  server_->SetBearerToken("");
  std::filesystem::remove_all(dir);
}

TEST_F(ConformanceTest, AdminEndpointDrivesFaultsOverHttp) {
  httplib::Client admin("127.0.0.1", server_->port());
  auto posted = admin.Post("/_dynmig/faults",
                           R"({"method":"GET","pathPrefix":"/api/v1/nodes","count":1,
                               "status":503,"message":"maintenance"})",
                           "application/json");
  ASSERT_TRUE(posted);
  EXPECT_EQ(posted->status, 201);
  auto client = testing::MakeClient(server_->url(), nullptr, 1);
  auto failed = client->ListNodes();
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(failed.status()), HasSubstr("maintenance"));
  EXPECT_TRUE(client->ListNodes().ok());

  auto bad = admin.Post("/_dynmig/faults", R"({"action":"explode"})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_THAT(bad->body, HasSubstr("unknown fault action 'explode'"));

  Recorder<WatchEvent> events;
  auto watch = client->WatchPods({}, [&](const WatchEvent& e) { events.Add(e); });
  ASSERT_TRUE(watch.ok());
  ASSERT_TRUE(testing::Eventually([&] { return server_->open_watches() == 1; }));
  auto cut = admin.Post("/_dynmig/cut-watches", "", "application/json");
  ASSERT_TRUE(cut);
  EXPECT_EQ(Object::parse(cut->body)["cut"], 1);
  EXPECT_EQ((*watch)->Wait().code(), absl::StatusCode::kUnavailable);

  auto stats = admin.Get("/_dynmig/stats");
  ASSERT_TRUE(stats);
  EXPECT_GT(Object::parse(stats->body)["requests"].get<int>(), 3);
  auto cleared = admin.Delete("/_dynmig/faults");
  ASSERT_TRUE(cleared);
  EXPECT_EQ(cleared->status, 200);
}

TEST_F(ConformanceTest, AWindowedFaultIsAnOutageThatEndsByItself) {
  StartServer(testing::FastServerOptions(), /*fake_timers=*/true);
  FaultSpec outage;
  outage.count = -1;
  outage.status = 503;
  outage.window = absl::Seconds(2);
  auto client = testing::MakeClient(server_->url(), nullptr, 1);
  server_->AddFault(outage);
  // Answered within the window (of the server's clock): 503.
  EXPECT_EQ(client->ListNodes().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client->ListPods({}).status().code(), absl::StatusCode::kUnavailable);
  Advance(outage.window - absl::Milliseconds(1));
  EXPECT_EQ(client->ListNodes().status().code(), absl::StatusCode::kUnavailable);
  // Nobody clears it: the window ends it.
  Advance(absl::Milliseconds(1));
  EXPECT_TRUE(client->ListNodes().ok());

  auto parsed = FaultSpecFromJson(Object::parse(R"({"count":-1,"windowMs":2500})"));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->window, absl::Milliseconds(2500));
}

// Stop() cannot wake an idle keep-alive connection (httplib 0.11): it waits at most the
// keep_alive_timeout (1 s here) for it instead of shutting descriptors down behind the workers'
// backs, and the client connects anew to the restarted server.
TEST_F(ConformanceTest, StopOutwaitsAnIdleKeepAliveConnectionAndTheClientReconnects) {
  auto client = testing::MakeClient(server_->url(), nullptr, 1);
  ASSERT_TRUE(client->ListNodes().ok());  // its connection stays open, idle
  InMemoryApiServerOptions options = testing::FastServerOptions();
  options.port = server_->port();
  options.shared_store = server_->shared_store();
  const absl::Time start = absl::Now();
  server_->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "Stop() must not hang on idle connections";
  EXPECT_EQ(client->ListNodes().status().code(), absl::StatusCode::kUnavailable);
  auto restarted = InMemoryApiServer::Start(options);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  server_ = std::move(*restarted);
  EXPECT_TRUE(client->ListNodes().ok());
}

TEST_F(ConformanceTest, DiscoveryAndStatusBodies) {
  httplib::Client http("127.0.0.1", server_->port());
  auto api = http.Get("/api/v1");
  ASSERT_TRUE(api);
  const Object resources = Object::parse(api->body);
  EXPECT_EQ(resources["kind"], "APIResourceList");
  bool has_binding = false;
  for (const auto& r : resources["resources"]) has_binding |= r["name"] == "pods/binding";
  EXPECT_TRUE(has_binding);
  auto groups = http.Get("/apis");
  ASSERT_TRUE(groups);
  // In the real server's order: apps before coordination.k8s.io and policy.
  const Object group_list = Object::parse(groups->body);
  ASSERT_EQ(group_list["groups"].size(), 3u);
  EXPECT_EQ(group_list["groups"][0]["name"], "apps");
  EXPECT_EQ(group_list["groups"][1]["name"], "coordination.k8s.io");
  EXPECT_EQ(group_list["groups"][2]["name"], "policy");
  auto missing = http.Get("/api/v1/namespaces/default/widgets");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  const Object status = Object::parse(missing->body);
  EXPECT_EQ(status["kind"], "Status");
  EXPECT_EQ(status["status"], "Failure");
  EXPECT_EQ(status["code"], 404);
  EXPECT_EQ(status["reason"], "NotFound");
  auto bad_patch = http.Patch("/api/v1/nodes/x", "{}", "application/apply-patch+yaml");
  ASSERT_TRUE(bad_patch);
  EXPECT_EQ(bad_patch->status, 415);
}

}  // namespace
}  // namespace dynmig::kube
