// Informer against the in-memory server over HTTP: sync, handlers, resumption after dropped
// connections and restarts, and exact relist diffs after 410.
#include "kube/informer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kube_test_util.h"

namespace dynmig::kube {
namespace {

using testing::MakeNode;
using testing::MakePod;
using testing::Recorder;

// "add p1", "update p1", "delete p1" in handler order.
struct HandlerLog {
  Recorder<std::string> log;
  InformerHandlers Handlers() {
    return InformerHandlers{
        [this](const Object& o) { log.Add("add " + Name(o)); },
        [this](const Object&, const Object& n) { log.Add("update " + Name(n)); },
        [this](const Object& o) { log.Add("delete " + Name(o)); }};
  }
};

InformerOptions FastInformer() {
  InformerOptions options;
  options.min_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(200);
  options.page_size = 3;
  return options;
}

class InformerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = InMemoryApiServer::Start(testing::FastServerOptions());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    client_ = testing::MakeClient(server_->url());
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
  }

  std::unique_ptr<InMemoryApiServer> server_;
  std::unique_ptr<RestKubeClient> client_;
};

TEST_F(InformerTest, SyncsAndDeliversEventsInOrder) {
  for (const char* name : {"a", "b", "c", "d"}) ASSERT_TRUE(client_->CreatePod(MakePod(name)).ok());
  Informer informer(*client_, Resource::kPods, FastInformer());
  HandlerLog log;
  informer.AddHandlers(log.Handlers());
  EXPECT_FALSE(informer.HasSynced());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(10)));
  EXPECT_EQ(informer.size(), 4u);
  ASSERT_TRUE(log.log.WaitForSize(4));
  ASSERT_NE(informer.Get("default/b"), nullptr);
  EXPECT_EQ(Name(*informer.Get("default", "b")), "b");
  EXPECT_EQ(informer.Get("default/zzz"), nullptr);

  ASSERT_TRUE(client_->PatchPodAnnotations("default", "a", {{"x", "1"}}).ok());
  ASSERT_TRUE(client_->DeletePod("default", "b").ok());
  ASSERT_TRUE(client_->CreatePod(MakePod("e")).ok());
  ASSERT_TRUE(log.log.WaitForSize(7));
  EXPECT_THAT(log.log.Get(), ::testing::ElementsAre("add a", "add b", "add c", "add d", "update a",
                                                    "delete b", "add e"));
  EXPECT_EQ(Annotation(*informer.Get("default/a"), "x"), "1");
  EXPECT_EQ(informer.Get("default/b"), nullptr);
  auto unbound = informer.List([](const Object& o) { return NodeName(o).empty(); });
  EXPECT_EQ(unbound.size(), 4u);
  informer.Stop();
  EXPECT_EQ(informer.stats().lists, 1);
}

TEST_F(InformerTest, HandlersSeeTheUpdatedCache) {
  Informer informer(*client_, Resource::kNodes, FastInformer());
  Recorder<bool> seen;
  informer.AddHandlers(
      {[&](const Object& o) { seen.Add(informer.Get(Name(o)) != nullptr); }, nullptr, nullptr});
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(10)));
  ASSERT_TRUE(client_->CreateNode(MakeNode("n1")).ok());
  ASSERT_TRUE(seen.WaitForSize(1));
  EXPECT_TRUE(seen.Get()[0]);
}

TEST_F(InformerTest, FilteredInformerFollowsSelectorTransitions) {
  InformerOptions options = FastInformer();
  options.filter.field_selector = "spec.nodeName=gpu-1";
  Informer informer(*client_, Resource::kPods, options);
  HandlerLog log;
  informer.AddHandlers(log.Handlers());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(10)));
  ASSERT_TRUE(client_->CreatePod(MakePod("p")).ok());
  ASSERT_TRUE(client_->BindPod("default", "p", "gpu-1", "").ok());
  ASSERT_TRUE(log.log.WaitForSize(1));
  EXPECT_EQ(log.log.Get()[0], "add p");
  EXPECT_EQ(NodeName(*informer.Get("default/p")), "gpu-1");
}

TEST_F(InformerTest, DroppedConnectionsResumeWithoutMissingOrDuplicating) {
  Informer informer(*client_, Resource::kPods, FastInformer());
  HandlerLog log;
  informer.AddHandlers(log.Handlers());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(10)));
  for (int round = 0; round < 5; ++round) {
    ASSERT_TRUE(client_->CreatePod(MakePod(fmt::format("p{}", round))).ok());
    // The informer's (round+1)-th watch is established: cut exactly that one.
    ASSERT_TRUE(testing::Eventually([&] { return informer.stats().watches == round + 1; }));
    server_->CutWatches();
    // Writes while the informer is reconnecting.
    ASSERT_TRUE(client_
                    ->PatchPodAnnotations("default", fmt::format("p{}", round),
                                          {{"round", std::to_string(round)}})
                    .ok());
  }
  ASSERT_TRUE(log.log.WaitForSize(10));
  EXPECT_FALSE(log.log.WaitForSize(11, absl::Milliseconds(300)));
  std::vector<std::string> want;
  for (int round = 0; round < 5; ++round) {
    want.push_back(fmt::format("add p{}", round));
    want.push_back(fmt::format("update p{}", round));
  }
  EXPECT_EQ(log.log.Get(), want);
  EXPECT_EQ(informer.stats().lists, 1);  // resumed from the resourceVersion, never relisted
  EXPECT_TRUE(testing::Eventually([&] { return informer.stats().watches == 6; }));
}

TEST_F(InformerTest, ExpiredHistoryRelistsAndEmitsExactlyTheDiff) {
  for (const char* name : {"keep", "change", "remove"}) {
    ASSERT_TRUE(client_->CreatePod(MakePod(name)).ok());
  }
  Informer informer(*client_, Resource::kPods, FastInformer());
  HandlerLog log;
  informer.AddHandlers(log.Handlers());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(10)));
  ASSERT_TRUE(log.log.WaitForSize(3));
  ASSERT_TRUE(testing::Eventually([&] { return server_->open_watches() == 1; }));

  // Drop the watch first so the changes below are only seen by the relist, then make the
  // informer's resourceVersion too old.
  InMemoryApiServerOptions options = testing::FastServerOptions();
  options.port = server_->port();
  options.shared_store = server_->shared_store();
  auto store = server_->shared_store();
  server_->Stop();
  ASSERT_TRUE(store
                  ->Patch(Resource::kPods, "default", "change",
                          {{"metadata", {{"labels", {{"v", "2"}}}}}}, PatchType::kMerge, "")
                  .ok());
  ASSERT_TRUE(store->Delete(Resource::kPods, "default", "remove", {}).ok());
  ASSERT_TRUE(store->Create(Resource::kPods, "default", MakePod("new")).ok());
  store->CompactHistory();
  auto restarted = InMemoryApiServer::Start(options);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  server_ = std::move(*restarted);

  ASSERT_TRUE(log.log.WaitForSize(6));
  EXPECT_FALSE(log.log.WaitForSize(7, absl::Milliseconds(300)));
  const auto entries = log.log.Get();
  EXPECT_THAT(std::vector<std::string>(entries.begin() + 3, entries.end()),
              ::testing::UnorderedElementsAre("update change", "delete remove", "add new"));
  EXPECT_EQ(informer.size(), 3u);
  EXPECT_EQ(Label(*informer.Get("default/change"), "v"), "2");
  EXPECT_GE(informer.stats().expired, 1);
  EXPECT_EQ(informer.stats().lists, 2);
}

TEST_F(InformerTest, SurvivesApiServerRestartOnTheSameState) {
  Informer informer(*client_, Resource::kNodes, FastInformer());
  HandlerLog log;
  informer.AddHandlers(log.Handlers());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(10)));
  ASSERT_TRUE(client_->CreateNode(MakeNode("n1")).ok());
  ASSERT_TRUE(log.log.WaitForSize(1));

  InMemoryApiServerOptions options = testing::FastServerOptions();
  options.port = server_->port();
  options.shared_store = server_->shared_store();
  auto store = server_->shared_store();
  server_->Stop();
  // While the API server is down: a write (as if through another replica) the informer must see.
  ASSERT_TRUE(store->Create(Resource::kNodes, "", MakeNode("n2")).ok());
  auto restarted = InMemoryApiServer::Start(options);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  server_ = std::move(*restarted);
  ASSERT_TRUE(client_->CreateNode(MakeNode("n3")).ok());
  ASSERT_TRUE(log.log.WaitForSize(3))
      << informer.last_error() << " lists=" << informer.stats().lists
      << " watches=" << informer.stats().watches << " errors=" << informer.stats().errors
      << " log=" << ::testing::PrintToString(log.log.Get());
  EXPECT_FALSE(log.log.WaitForSize(4, absl::Milliseconds(300)));
  EXPECT_THAT(log.log.Get(), ::testing::ElementsAre("add n1", "add n2", "add n3"));
  EXPECT_EQ(informer.stats().lists, 1);
}

TEST_F(InformerTest, FreshApiServerStateForcesARelist) {
  Informer informer(*client_, Resource::kNodes, FastInformer());
  HandlerLog log;
  informer.AddHandlers(log.Handlers());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(10)));
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(client_->CreateNode(MakeNode(fmt::format("n{}", i))).ok());
  ASSERT_TRUE(log.log.WaitForSize(5));
  // A new server with empty state on the same port: its resourceVersions are behind ours.
  InMemoryApiServerOptions options = testing::FastServerOptions();
  options.port = server_->port();
  server_->Stop();
  auto fresh = InMemoryApiServer::Start(options);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  server_ = std::move(*fresh);
  ASSERT_TRUE(log.log.WaitForSize(10));
  EXPECT_EQ(informer.size(), 0u);
  EXPECT_EQ(informer.stats().lists, 2);
}

// With a cache transform: handlers get full objects on add and update, the cache keeps the
// reduced copy, a relist (page by page) emits exactly the diff, and deletes are still delivered.
TEST_F(InformerTest, CacheTransformKeepsReducedCopiesAndExactRelistDiffs) {
  for (const char* name : {"keep", "change", "remove", "gone", "a", "b", "c"}) {
    Object pod = MakePod(name);
    pod["metadata"]["annotations"] = {{"big", std::string(1000, 'x')}};
    ASSERT_TRUE(client_->CreatePod(pod).ok());
  }
  InformerOptions options = FastInformer();  // page_size 3: the relists take several pages
  options.cache_transform = MetadataOnly;
  Informer informer(*client_, Resource::kPods, options);
  Recorder<std::string> log;
  Recorder<std::string> bad;  // handler arguments that were not as documented
  informer.AddHandlers(InformerHandlers{[&](const Object& o) {
                                          log.Add("add " + Name(o));
                                          if (Annotation(o, "big").value_or("").size() != 1000)
                                            bad.Add("add " + Name(o));
                                          // The cache already holds the (reduced) new state.
                                          auto cached = informer.Get(ObjectKey(o));
                                          if (cached == nullptr ||
                                              ResourceVersion(*cached) != ResourceVersion(o)) {
                                            bad.Add("cache " + Name(o));
                                          }
                                        },
                                        [&](const Object& old_obj, const Object& n) {
                                          log.Add("update " + Name(n));
                                          if (Annotation(n, "big").value_or("").size() != 1000)
                                            bad.Add("update " + Name(n));
                                          if (old_obj.contains("spec") || Name(old_obj) != Name(n))
                                            bad.Add("old " + Name(n));
                                        },
                                        [&](const Object& o) {
                                          log.Add("delete " + Name(o));
                                          if (Name(o).empty() || Namespace(o) != "default")
                                            bad.Add("delete " + Name(o));
                                        }});
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(10)));
  // Synced means the first list's adds were delivered.
  EXPECT_EQ(log.Get().size(), 7u);
  ASSERT_TRUE(log.WaitForSize(7));
  ObjectPtr cached = informer.Get("default/keep");
  ASSERT_NE(cached, nullptr);
  EXPECT_EQ(*cached, MetadataOnly(*cached));
  EXPECT_FALSE(cached->contains("spec"));
  EXPECT_FALSE(cached->at("metadata").contains("annotations"));
  EXPECT_FALSE(Uid(*cached).empty());
  EXPECT_FALSE(ResourceVersion(*cached).empty());

  // Watch events: full objects to the handlers, reduced ones in the cache; a watch delete.
  ASSERT_TRUE(client_->PatchPodAnnotations("default", "a", {{"x", "1"}}).ok());
  ASSERT_TRUE(client_->DeletePod("default", "gone").ok());
  ASSERT_TRUE(log.WaitForSize(9));
  EXPECT_FALSE(informer.Get("default/a")->at("metadata").contains("annotations"));
  EXPECT_EQ(informer.Get("default/gone"), nullptr);
  ASSERT_TRUE(testing::Eventually([&] { return server_->open_watches() == 1; }));

  // Changes only a relist sees, then a relist forced by expired history.
  InMemoryApiServerOptions server_options = testing::FastServerOptions();
  server_options.port = server_->port();
  server_options.shared_store = server_->shared_store();
  auto store = server_->shared_store();
  server_->Stop();
  ASSERT_TRUE(store
                  ->Patch(Resource::kPods, "default", "change",
                          {{"metadata", {{"labels", {{"v", "2"}}}}}}, PatchType::kMerge, "")
                  .ok());
  ASSERT_TRUE(store->Delete(Resource::kPods, "default", "remove", {}).ok());
  Object added = MakePod("new");
  added["metadata"]["annotations"] = {{"big", std::string(1000, 'y')}};
  ASSERT_TRUE(store->Create(Resource::kPods, "default", added).ok());
  store->CompactHistory();
  auto restarted = InMemoryApiServer::Start(server_options);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  server_ = std::move(*restarted);

  ASSERT_TRUE(log.WaitForSize(12));
  EXPECT_FALSE(log.WaitForSize(13, absl::Milliseconds(300)));
  const auto entries = log.Get();
  EXPECT_THAT(std::vector<std::string>(entries.begin(), entries.begin() + 7),
              ::testing::ElementsAre("add a", "add b", "add c", "add change", "add gone",
                                     "add keep", "add remove"));
  EXPECT_THAT(std::vector<std::string>(entries.begin() + 7, entries.begin() + 9),
              ::testing::ElementsAre("update a", "delete gone"));
  EXPECT_THAT(std::vector<std::string>(entries.begin() + 9, entries.end()),
              ::testing::UnorderedElementsAre("update change", "delete remove", "add new"));
  EXPECT_THAT(bad.Get(), ::testing::IsEmpty());
  EXPECT_EQ(informer.size(), 6u);
  EXPECT_EQ(informer.Get("default/remove"), nullptr);
  ASSERT_NE(informer.Get("default/new"), nullptr);
  EXPECT_FALSE(informer.Get("default/change")->at("metadata").contains("labels"));
  EXPECT_GE(informer.stats().expired, 1);
  EXPECT_EQ(informer.stats().lists, 2);
}

// Without a transform the cache keeps the objects as received (the default, unchanged).
TEST_F(InformerTest, WithoutATransformTheCacheKeepsFullObjects) {
  Object pod = MakePod("p");
  pod["metadata"]["annotations"] = {{"k", "v"}};
  ASSERT_TRUE(client_->CreatePod(pod).ok());
  Informer informer(*client_, Resource::kPods, FastInformer());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(10)));
  ASSERT_NE(informer.Get("default/p"), nullptr);
  EXPECT_EQ(Annotation(*informer.Get("default/p"), "k"), "v");
  EXPECT_TRUE(informer.Get("default/p")->contains("spec"));
}

TEST(MetadataOnlyTest, KeepsKindAndIdentity) {
  const Object pod = {{"apiVersion", "v1"},
                      {"kind", "Pod"},
                      {"metadata",
                       {{"name", "p"},
                        {"namespace", "ns"},
                        {"uid", "u1"},
                        {"resourceVersion", "7"},
                        {"labels", {{"a", "b"}}}}},
                      {"spec", {{"nodeName", "n"}}}};
  EXPECT_EQ(
      MetadataOnly(pod),
      (Object{{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata",
               {{"name", "p"}, {"namespace", "ns"}, {"uid", "u1"}, {"resourceVersion", "7"}}}}));
  EXPECT_EQ(MetadataOnly(Object{{"metadata", {{"name", "n"}}}}),
            (Object{{"metadata", {{"name", "n"}}}}));
  EXPECT_EQ(MetadataOnly(Object::array()), Object::object());
}

// Failed lists back off on the informer's clock: min_backoff (20 ms) first, then twice as long,
// each retry only once that much of the clock's time has passed.
TEST_F(InformerTest, BackoffWaitsOnTheInjectedClock) {
  server_->AddFault({.method = "GET", .path_prefix = "/api/v1/pods", .count = -1, .status = 403});
  FakeClock clock;
  InformerOptions options = FastInformer();
  options.clock = &clock;
  Informer informer(*client_, Resource::kPods, options);
  informer.Start();
  const auto errors_reach = [&](int64_t n, absl::Duration timeout = absl::Seconds(10)) {
    return testing::Eventually([&] { return informer.stats().errors >= n; }, timeout);
  };
  ASSERT_TRUE(errors_reach(1));
  for (const absl::Duration backoff : {absl::Milliseconds(20), absl::Milliseconds(40)}) {
    const int64_t errors = informer.stats().errors;
    ASSERT_TRUE(clock.AwaitWaiters(1));  // backing off
    clock.Advance(backoff - absl::Milliseconds(1));
    EXPECT_FALSE(errors_reach(errors + 1, absl::Milliseconds(100))) << "retried before " << backoff;
    clock.Advance(absl::Milliseconds(1));
    ASSERT_TRUE(errors_reach(errors + 1)) << "no retry after " << backoff;
  }
  server_->ClearFaults();
  ASSERT_TRUE(clock.AwaitWaiters(1));
  clock.Advance(absl::Milliseconds(80));
  EXPECT_TRUE(testing::Eventually([&] { return informer.HasSynced(); }));
  informer.Stop();
}

TEST_F(InformerTest, StopsPromptlyEvenWhileTheServerIsDown) {
  Informer informer(*client_, Resource::kPods, FastInformer());
  informer.Start();
  ASSERT_TRUE(informer.WaitForSync(absl::Seconds(10)));
  server_->Stop();
  const auto start = std::chrono::steady_clock::now();
  informer.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

}  // namespace
}  // namespace dynmig::kube
