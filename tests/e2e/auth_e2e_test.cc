// Issue 18 against the local mode: a plain pod of another scheduler and one unauthenticated
// POST /bind naming node-b. The local mode runs the extender with client authentication on (its
// kube-scheduler stand-in presents a client certificate), so the call is refused at the door;
// kube-scheduler's own certificate does not bind the pod either (the extender binds only what it
// reserved), and MIG pods keep being scheduled.
#include <gtest/gtest.h>
#include <httplib.h>

#include <utility>

#include "common/http_result.h"
#include "e2e/e2e_test_util.h"
#include "nlohmann/json.hpp"

namespace dynmig::e2e {
namespace {

using Answer = dynmig::testing::HttpResult;

// POST to the local scheduler, verifying it with the run's CA; `cert` = client certificate and
// key (empty: none).
Answer PostToScheduler(const local::LocalCluster& cluster, const std::string& path,
                       const json& body, const std::pair<std::string, std::string>& cert = {}) {
  const std::string url = cluster.scheduler_url();
  httplib::Client client =
      cert.first.empty() ? httplib::Client(url) : httplib::Client(url, cert.first, cert.second);
  client.set_ca_cert_path(cluster.tls().ca_file);
  client.enable_server_certificate_verification(true);
  return dynmig::testing::ToHttpResult(client.Post(path, body.dump(), "application/json"));
}

TEST_F(E2eTest, NobodyButKubeSchedulerBindsAndOnlyWhatTheExtenderReserved) {
  Scenario("issue 18 (an unauthenticated bind of another scheduler's pod)");
  StartCluster("node-a=A100-SXM4-40GBx1,node-b=A100-SXM4-40GBx1");
  Step("a plain pod of another scheduler, no GPU");
  json plain = {{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata", {{"name", "victim"}, {"namespace", "default"}}},
                {"spec",
                 {{"schedulerName", "some-other-scheduler"},
                  {"containers", json::array({{{"name", "main"}, {"image", "busybox"}}})}}}};
  Create(plain);
  const json victim = Get("victim");
  ASSERT_FALSE(victim.is_null()) << Where();
  EXPECT_EQ(victim["spec"].value("schedulerName", ""), "some-other-scheduler") << Where();
  EXPECT_EQ(cluster_->scheduler_url().rfind("https://", 0), 0u)
      << Where() << cluster_->scheduler_url();
  const json bind = {{"PodName", "victim"},
                     {"PodNamespace", "default"},
                     {"PodUID", kube::Uid(victim)},
                     {"Node", "node-b"}};

  Step("POST /bind without a client certificate");
  Answer a = PostToScheduler(*cluster_, "/bind", bind);
  EXPECT_EQ(a.status, 401) << Where() << a.text;
  EXPECT_NE(a.body.value("Error", "").find("no client certificate"), std::string::npos)
      << Where() << a.text;
  a = PostToScheduler(*cluster_, "/filter", {{"Pod", victim}, {"NodeNames", {"node-b"}}});
  EXPECT_EQ(a.status, 401) << Where() << a.text;

  Step("POST /bind with kube-scheduler's client certificate");
  const auto& tls = cluster_->tls();
  a = PostToScheduler(*cluster_, "/bind", bind, {tls.client_cert_file, tls.client_key_file});
  EXPECT_EQ(a.status, 200) << Where() << a.text;
  EXPECT_NE(a.body.value("Error", "").find("is not scheduled by dynmig-scheduler"),
            std::string::npos)
      << Where() << a.text;
  EXPECT_EQ(kube::NodeName(Get("victim")), "") << Where() << "the pod was bound";
  EXPECT_TRUE(WaitUntil([&] {
    auto events = kube_->List(kube::Resource::kEvents, {});
    if (!events.ok()) return false;
    for (const auto& e : events->items) {
      if (kube::StringAt(e, "/involvedObject/name") == "victim" &&
          e.value("reason", "") == "MigBindRefused") {
        return true;
      }
    }
    return false;
  })) << Where()
      << "no MigBindRefused event";

  Step("the kube-scheduler stand-in still schedules MIG pods");
  auto alloc = RunPod(MigPod("train", 4000));
  EXPECT_EQ(alloc.profile, "1g.5gb") << Where();
  EXPECT_EQ(kube::NodeName(Get("victim")), "") << Where();
}

}  // namespace
}  // namespace dynmig::e2e
