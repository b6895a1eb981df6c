// Bounded JSON in the kube room (issue 27): the REST client reading over-deep responses and watch
// events, and the in-memory API server refusing over-large and over-deep request bodies the way
// the real apiserver does.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <string>
#include <thread>

#include "common/bounded_json.h"
#include "kube/api_status.h"
#include "kube_test_util.h"

namespace dynmig::kube {
namespace {

using ::testing::HasSubstr;

std::string DeepArrays(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// A pod object whose annotation "a" is `value_json` spliced in as text.
std::string PodText(const std::string& name, const std::string& value_json) {
  return R"({"apiVersion":"v1","kind":"Pod","metadata":{"name":")" + name +
         R"(","namespace":"default","resourceVersion":"1","annotations":{"a":)" + value_json +
         "}}}";
}

// A stand-in API server that answers every GET of a pod with the pod named by its path, built by
// PodText, and every watch with one ADDED event of such a pod.
class DeepResponseServer {
 public:
  explicit DeepResponseServer(std::string value_json) : value_(std::move(value_json)) {
    server_.Get(R"(/api/v1/namespaces/default/pods/([a-z0-9-]+))",
                [this](const httplib::Request& req, httplib::Response& res) {
                  res.set_content(PodText(req.matches[1], value_), "application/json");
                });
    server_.Get("/api/v1/pods", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"type":"ADDED","object":)" + PodText("w", value_) + "}\n",
                      "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    (void)testing::Eventually([this] { return server_.is_running(); });  // the listener serves
  }
  ~DeepResponseServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  std::string value_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

TEST(HostileResponseTest, AnOverDeepObjectIsADataLossErrorNamingTheLimit) {
  DeepResponseServer server(DeepArrays(300000));
  auto client = testing::MakeClient(server.url(), nullptr, /*max_attempts=*/1);
  auto pod = client->GetPod("default", "p");
  ASSERT_FALSE(pod.ok());
  EXPECT_EQ(pod.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(pod.status().message()),
              HasSubstr("response to GET /api/v1/namespaces/default/pods/p: nesting deeper than "
                        "64 levels"));
}

TEST(HostileResponseTest, AnOverDeepWatchEventEndsTheWatchNamingTheLimit) {
  DeepResponseServer server(DeepArrays(300000));
  auto client = testing::MakeClient(server.url(), nullptr, /*max_attempts=*/1);
  testing::Recorder<WatchEvent> events;
  auto watch = client->WatchPods({}, [&](const WatchEvent& e) { events.Add(e); });
  ASSERT_TRUE(watch.ok()) << watch.status();
  const absl::Status end = (*watch)->Wait();
  EXPECT_EQ(end.code(), absl::StatusCode::kDataLoss) << end;
  EXPECT_THAT(std::string(end.message()),
              HasSubstr("malformed watch event: watch event: nesting deeper than 64 levels"));
  EXPECT_EQ(events.size(), 0u);
}

TEST(HostileResponseTest, NestingWithinTheLimitIsReadAsUsual) {
  DeepResponseServer server(DeepArrays(50));
  auto client = testing::MakeClient(server.url(), nullptr, /*max_attempts=*/1);
  auto pod = client->GetPod("default", "p");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(Name(*pod), "p");
  EXPECT_TRUE((*pod)["metadata"]["annotations"]["a"].is_array());
}

class HostileRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = InMemoryApiServer::Start(testing::FastServerOptions());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  httplib::Result Post(const std::string& body) {
    httplib::Client http("127.0.0.1", server_->port());
    return http.Post("/api/v1/namespaces/default/pods", body, "application/json");
  }
  std::unique_ptr<InMemoryApiServer> server_;
};

TEST_F(HostileRequestTest, ABodyOverThreeMiBIs413RequestEntityTooLarge) {
  Object pod = testing::MakePod("big");
  pod["spec"]["containers"][0]["args"] = {std::string(kApiRequestBytes, 'x')};
  auto res = Post(pod.dump());
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 413);
  const Object status = Object::parse(res->body);
  EXPECT_EQ(status["kind"], "Status");
  EXPECT_EQ(status["status"], "Failure");
  EXPECT_EQ(status["reason"], "RequestEntityTooLarge");
  EXPECT_EQ(status["code"], 413);
  EXPECT_EQ(status["message"], "Request entity too large: limit is 3145728");
  // Just under the limit is served.
  pod["metadata"]["name"] = "fits";
  pod["spec"]["containers"][0]["args"] = {std::string(kApiRequestBytes - 1024, 'x')};
  res = Post(pod.dump());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 201) << res->body.substr(0, 300);
}

TEST_F(HostileRequestTest, AnOverDeepBodyIs400BadRequestAndTheServerStaysUp) {
  const std::string deep = PodText("deep", DeepArrays(300000));
  auto res = Post(deep);
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 400);
  const Object status = Object::parse(res->body);
  EXPECT_EQ(status["kind"], "Status");
  EXPECT_EQ(status["reason"], "BadRequest");
  EXPECT_EQ(status["code"], 400);
  EXPECT_THAT(status["message"].get<std::string>(),
              HasSubstr("request body: nesting deeper than 64 levels"));
  // The server is unharmed: an ordinary pod is created.
  res = Post(testing::MakePod("shallow").dump());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 201) << res->body.substr(0, 300);
}

TEST_F(HostileRequestTest, InvalidBytesInABrokenBodyAre400WithAValidStatus) {
  auto res = Post(std::string(R"({"kind":"Pod","metadata":{)") + "\xd5\xff\x01" + "}}");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 400);
  const Object status = Object::parse(res->body);  // valid JSON, valid UTF-8
  EXPECT_EQ(status["reason"], "BadRequest");
  EXPECT_THAT(status["message"].get<std::string>(), HasSubstr("\\xd5\\xff"));
}

}  // namespace
}  // namespace dynmig::kube
