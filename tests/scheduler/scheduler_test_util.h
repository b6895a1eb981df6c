// Shared fixture for the scheduler tests: the in-memory API server, a RestKubeClient, a FakeClock
// and SchedulerServers on 127.0.0.1:0, plus builders for MIG nodes and pods and HTTP helpers.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/http_result.h"
#include "fmt/format.h"
#include "kube/in_memory_api_server.h"
#include "kube/kube_test_util.h"
#include "kube/object.h"
#include "kube/rest_kube_client.h"
#include "mig/catalogue.h"
#include "protocol/annotations.h"
#include "protocol/mig_allocations.h"
#include "protocol/node_register.h"
#include "scheduler/server.h"

namespace dynmig::scheduler::testing {

using nlohmann::json;

inline mig::Allowlist TestAllowlist() {
  mig::Allowlist a;
  a.entries.push_back({{"A100-SXM4-40GB"}, {"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}});
  return a;
}

// hami.io/node-nvidia-register for A100-SXM4-40GB GPUs with these UUIDs (every base profile).
inline std::string A100Register(const std::vector<std::string>& uuids) {
  const auto& cap = (*mig::FindModel("A100-SXM4-40GB"))->capability;
  std::vector<const mig::ProfileSpec*> base;
  for (const auto& p : cap.profiles) {
    if (p.name.find_first_of("+-") == std::string::npos) base.push_back(&p);
  }
  std::vector<protocol::DeviceInfo> infos;
  uint32_t index = 0;
  for (const auto& uuid : uuids)
    infos.push_back(protocol::MigDeviceInfo({uuid, index++, 0, true}, cap, base));
  return protocol::EncodeNodeRegister(infos);
}

inline kube::Object MigNode(const std::string& name, const std::vector<std::string>& uuids) {
  kube::Object node = kube::testing::MakeNode(name);
  node["metadata"]["annotations"] = {
      {std::string(protocol::kNodeRegisterAnnotation), A100Register(uuids)}};
  return node;
}

struct Ctr {
  std::string name = "workload";
  int count = 1;
  int64_t mem = 0;  // MiB; 0 = not set
};

inline kube::Object MigPod(const std::string& name, std::vector<Ctr> containers,
                           json annotations = json::object(), const std::string& ns = "default") {
  json ctrs = json::array();
  for (const auto& c : containers) {
    json limits = {{"nvidia.com/gpu", std::to_string(c.count)}};
    if (c.mem > 0) limits["nvidia.com/gpumem"] = std::to_string(c.mem);
    ctrs.push_back({{"name", c.name}, {"image", "ubuntu"}, {"resources", {{"limits", limits}}}});
  }
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", ns}, {"annotations", annotations}}},
          {"spec", {{"schedulerName", "dynmig-scheduler"}, {"containers", ctrs}}}};
}

inline kube::Object MigPod(const std::string& name, int64_t mem,
                           json annotations = json::object()) {
  return MigPod(name, std::vector<Ctr>{{"workload", 1, mem}}, std::move(annotations));
}

inline std::string Alloc(const std::string& gpu, const std::string& profile, uint32_t start,
                         uint32_t size) {
  return fmt::format(
      R"([{{"containerIndex":0,"deviceIndex":0,"gpuUUID":"{}","profile":"{}","placement":{{"start":{},"size":{}}}}}])",
      gpu, profile, start, size);
}

// An HTTP client that answers with the parsed JSON body (or null with the status in `status`).
using dynmig::testing::HttpResult;
using dynmig::testing::ToHttpResult;

inline HttpResult Post(int port, const std::string& path, const std::string& body) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(30, 0);
  return ToHttpResult(client.Post(path.c_str(), body, "application/json"));
}

inline HttpResult Get(int port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  auto res = client.Get(path.c_str());
  HttpResult out;
  if (!res) {
    out.status = -1;
    return out;
  }
  out.status = res->status;
  out.text = res->body;
  return out;
}

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto api = kube::InMemoryApiServer::Start(kube::testing::FastServerOptions());
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = std::move(*api);
    client_ = kube::testing::MakeClient(api_->url());
  }
  void TearDown() override {
    servers_.clear();
    client_.reset();
    api_.reset();
  }

  SchedulerServerOptions DefaultOptions() {
    SchedulerServerOptions o;
    o.state.allowlist = TestAllowlist();
    o.admission.allowlist = TestAllowlist();
    o.admission.annotation_writers = {"system:serviceaccount:dynmig-system:dynmig-scheduler",
                                      "system:serviceaccount:dynmig-system:dynmig-device-plugin"};
    o.expiry_interval = absl::ZeroDuration();   // tests expire by hand
    o.requeue.interval = absl::ZeroDuration();  // and requeue by hand
    o.informer.min_backoff = absl::Milliseconds(10);
    o.informer.max_backoff = absl::Milliseconds(100);
    return o;
  }

  // Starts a scheduler and waits for its caches.
  SchedulerServer* StartScheduler(SchedulerServerOptions options, bool wait_ready = true) {
    auto server = SchedulerServer::Start(*client_, clock_, std::move(options));
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return nullptr;
    if (wait_ready) {
      EXPECT_TRUE((*server)->WaitUntilReady(absl::Seconds(10)));
    }
    servers_.push_back(std::move(*server));
    return servers_.back().get();
  }
  SchedulerServer* StartScheduler() { return StartScheduler(DefaultOptions()); }

  kube::Object CreateNode(const kube::Object& node) {
    auto created = client_->CreateNode(node);
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? *created : kube::Object();
  }
  kube::Object CreatePod(const kube::Object& pod) {
    auto created = client_->CreatePod(pod);
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? *created : kube::Object();
  }
  kube::Object GetPod(const std::string& name, const std::string& ns = "default") {
    auto pod = client_->GetPod(ns, name);
    EXPECT_TRUE(pod.ok()) << pod.status();
    return pod.ok() ? *pod : kube::Object();
  }

  // Waits until `server`'s cluster state knows these nodes.
  void WaitForNodes(SchedulerServer* server, const std::vector<std::string>& names) {
    for (const auto& n : names) {
      EXPECT_TRUE(kube::testing::Eventually([&] {
        return server->state().View(n, clock_.Now()).has_value();
      })) << n;
    }
  }
  // Waits until the state sees pod's reservation from its annotation (assumption taken over).
  void WaitForReservationSeen(SchedulerServer* server, const std::string& key) {
    EXPECT_TRUE(kube::testing::Eventually([&] {
      for (const auto& node : server->state().Report(clock_.Now())) {
        for (const auto& gpu : node.gpus) {
          for (const auto& r : gpu.reservations) {
            if (r.pod == key && !r.assumed) return true;
          }
        }
      }
      return false;
    })) << key;
  }

  json FilterBody(const kube::Object& pod, const std::vector<std::string>& nodes) {
    return {{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", nodes}};
  }
  HttpResult Filter(SchedulerServer* server, const kube::Object& pod,
                    const std::vector<std::string>& nodes) {
    return Post(server->port(), "/filter", FilterBody(pod, nodes).dump());
  }
  HttpResult Bind(SchedulerServer* server, const kube::Object& pod, const std::string& node) {
    json args = {{"PodName", kube::Name(pod)},
                 {"PodNamespace", kube::Namespace(pod)},
                 {"PodUID", kube::Uid(pod)},
                 {"Node", node}};
    return Post(server->port(), "/bind", args.dump());
  }

  // The decoded reservation on the pod as the API has it.
  std::vector<protocol::MigAllocation> AllocationsOf(const std::string& name) {
    auto value = kube::Annotation(GetPod(name), protocol::kMigAllocationsAnnotation);
    if (!value.has_value()) return {};
    auto decoded = protocol::DecodeMigAllocations(*value);
    EXPECT_TRUE(decoded.ok()) << decoded.status();
    return decoded.ok() ? *decoded : std::vector<protocol::MigAllocation>{};
  }

  // The reservation `server` holds for the pod: in memory from the filter until the bind writes
  // it (then, once the watch delivered it, as the API has it).
  std::vector<protocol::MigAllocation> ReservedOf(SchedulerServer* server, const std::string& name,
                                                  const std::string& ns = "default") {
    if (auto a = server->state().Assumed(ns + "/" + name)) return a->reservation.allocations;
    return AllocationsOf(name);
  }

  // Events with this reason about pod `name`.
  std::vector<std::string> EventMessages(const std::string& name, const std::string& reason) {
    for (auto& s : servers_) s->events().Flush(absl::Seconds(10));
    std::vector<std::string> out;
    auto list = client_->List(kube::Resource::kEvents, {});
    EXPECT_TRUE(list.ok()) << list.status();
    if (!list.ok()) return out;
    for (const auto& e : list->items) {
      if (kube::StringAt(e, "/involvedObject/name") == name && e.value("reason", "") == reason) {
        out.push_back(e.value("message", ""));
      }
    }
    return out;
  }

  FakeClock clock_;
  std::unique_ptr<kube::InMemoryApiServer> api_;
  std::unique_ptr<kube::RestKubeClient> client_;
  std::vector<std::unique_ptr<SchedulerServer>> servers_;
};

}  // namespace dynmig::scheduler::testing
