#include "webhook/admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/escaping.h"
#include "mig/catalogue.h"
#include "protocol/annotations.h"
#include "protocol/node_register.h"

namespace dynmig::webhook {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kScheduler = "system:serviceaccount:dynmig-system:dynmig-scheduler";

mig::Allowlist TestAllowlist() {
  mig::Allowlist a;
  a.entries.push_back({{"A100-SXM4-40GB"}, {"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}});
  a.entries.push_back({{"H100 80GB"}, {"1g.10gb", "3g.40gb", "7g.80gb"}});
  return a;
}

AdmissionOptions Options() {
  AdmissionOptions o;
  o.allowlist = TestAllowlist();
  o.annotation_writers = {kScheduler, "system:serviceaccount:dynmig-system:dynmig-device-plugin"};
  return o;
}

json GpuPod(json limits = {{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem", 8000}},
            json annotations = json::object()) {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", "p"}, {"namespace", "jobs"}, {"annotations", annotations}}},
          {"spec",
           {{"containers", json::array({{{"name", "workload"},
                                         {"image", "ubuntu"},
                                         {"resources", {{"limits", limits}}}}})}}}};
}

json Review(json object, std::string operation = "CREATE", json old_object = nullptr,
            std::string user = "alice") {
  return {{"apiVersion", "admission.k8s.io/v1"},
          {"kind", "AdmissionReview"},
          {"request",
           {{"uid", "705ab4f5-6393-11e8-b7cc-42010a800002"},
            {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
            {"resource", {{"group", ""}, {"version", "v1"}, {"resource", "pods"}}},
            {"namespace", "jobs"},
            {"name", "p"},
            {"operation", operation},
            {"userInfo", {{"username", user}}},
            {"object", object},
            {"oldObject", old_object}}}};
}

json Patch(const json& response) {
  std::string raw;
  EXPECT_TRUE(absl::Base64Unescape(response.at("patch").get<std::string>(), &raw));
  return json::parse(raw);
}

class AdmissionTest : public ::testing::Test {
 protected:
  AdmissionHandler handler_{Options()};
};

TEST_F(AdmissionTest, GpuPodsGetTheSchedulerNameAsABase64JsonPatch) {
  json out = handler_.ReviewJson(Review(GpuPod()));
  EXPECT_EQ(out["apiVersion"], "admission.k8s.io/v1");
  EXPECT_EQ(out["kind"], "AdmissionReview");
  const json& r = out["response"];
  EXPECT_EQ(r["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
  EXPECT_EQ(r["allowed"], true);
  EXPECT_EQ(r["patchType"], "JSONPatch");
  EXPECT_EQ(Patch(r), json::parse(R"([{"op":"add","path":"/spec/schedulerName",
                                       "value":"dynmig-scheduler"}])"));
  // Another scheduler name is replaced; ours is left alone (no patch at all).
  json pod = GpuPod();
  pod["spec"]["schedulerName"] = "default-scheduler";
  EXPECT_EQ(Patch(handler_.ReviewJson(Review(pod))["response"])[0]["op"], "replace");
  pod["spec"]["schedulerName"] = "dynmig-scheduler";
  const json same = handler_.ReviewJson(Review(pod))["response"];
  EXPECT_EQ(same["allowed"], true);
  EXPECT_FALSE(same.contains("patch"));
  EXPECT_FALSE(same.contains("patchType"));
}

TEST_F(AdmissionTest, AsAValidatingWebhookItNeverPatches) {
  json mutated = GpuPod();
  mutated["spec"]["schedulerName"] = "dynmig-scheduler";  // as the mutating answer left it
  const json r = handler_.ReviewJson(Review(mutated), /*mutate=*/false)["response"];
  EXPECT_EQ(r["allowed"], true);
  EXPECT_FALSE(r.contains("patch"));
  EXPECT_FALSE(r.contains("patchType"));
  json bad = GpuPod({{"nvidia.com/gpu", 1}}, {{"nvidia.com/mig-profile-preference", "9g"}});
  EXPECT_EQ(handler_.ReviewJson(Review(bad), false)["response"]["allowed"], false);
}

TEST_F(AdmissionTest, PodsWithoutManagedResourcesPassUnchanged) {
  json pod = GpuPod({{"cpu", "1"}});
  const json r = handler_.ReviewJson(Review(pod))["response"];
  EXPECT_EQ(r["allowed"], true);
  EXPECT_FALSE(r.contains("patch"));
  // Other kinds and operations too.
  json review = Review(pod, "DELETE");
  EXPECT_EQ(handler_.ReviewJson(review)["response"]["allowed"], true);
  review = Review(pod);
  review["request"]["kind"]["kind"] = "ConfigMap";
  EXPECT_EQ(handler_.ReviewJson(review)["response"]["allowed"], true);
}

TEST_F(AdmissionTest, ATypoInThePreferenceIsRejectedWithTheValidChoices) {
  json pod = GpuPod({{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem", 20000}},
                    {{"nvidia.com/mig-profile-preference", "4g, 3g.20gbb"}});
  const json r = handler_.ReviewJson(Review(pod))["response"];
  EXPECT_EQ(r["allowed"], false);
  EXPECT_EQ(r["status"]["code"], 400);
  // Not "Invalid": kubectl v1.20 (on the real-cluster suite) prints only "The request is invalid"
  // for an Invalid status without details; with BadRequest every kubectl prints the message.
  EXPECT_EQ(r["status"]["reason"], "BadRequest");
  const std::string message = r["status"]["message"];
  EXPECT_THAT(message, HasSubstr("pod jobs/p"));
  EXPECT_THAT(message, HasSubstr("nvidia.com/mig-profile-preference: \"3g.20gbb\" matches no "
                                 "profile"));
  // Only what could run this 20000 MiB pod, and the closest name.
  EXPECT_THAT(message, HasSubstr("did you mean \"3g.20gb\"? valid choices for this pod (20000 MiB "
                                 "per instance): 3g.20gb, 4g.20gb, 7g.40gb, 3g.40gb, 7g.80gb, 3g, "
                                 "4g, 7g"));
  EXPECT_FALSE(r.contains("patch"));
  // Exact names and slice classes of any entry (any model) are fine.
  pod["metadata"]["annotations"]["nvidia.com/mig-profile-preference"] = "4g, 3g.40gb ,7g";
  EXPECT_EQ(handler_.ReviewJson(Review(pod))["response"]["allowed"], true);
  // An empty list is not a preference.
  pod["metadata"]["annotations"]["nvidia.com/mig-profile-preference"] = " , ";
  EXPECT_THAT(handler_.ReviewJson(Review(pod))["response"]["status"]["message"].get<std::string>(),
              HasSubstr("lists no profile"));
}

TEST_F(AdmissionTest, AnUnknownPreferenceListsOnlyWhatCouldRunThePodAndSuggestsTheClosest) {
  auto message = [&](const json& pod) {
    const json r = handler_.ReviewJson(Review(pod))["response"];
    EXPECT_EQ(r["allowed"], false) << pod.dump();
    return r["status"]["message"].get<std::string>();
  };
  // "4gb" is a typo of the slice class "4g".
  std::string m = message(GpuPod({{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem", 20000}},
                                 {{"nvidia.com/mig-profile-preference", "4gb"}}));
  EXPECT_THAT(m, HasSubstr("\"4gb\" matches no profile"));
  EXPECT_THAT(m, HasSubstr("did you mean \"4g\"?"));
  // A pod pinned to one model sees that model's profiles only.
  m = message(GpuPod(
      {{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem", 4000}},
      {{"nvidia.com/mig-profile-preference", "2g.10gbx"}, {"nvidia.com/use-gputype", "A100"}}));
  EXPECT_THAT(m, HasSubstr("did you mean \"2g.10gb\"? valid choices for this pod (4000 MiB per "
                           "instance; models A100-SXM4-40GB): 1g.5gb, 2g.10gb, 3g.20gb, 4g.20gb, "
                           "7g.40gb, 1g, 2g, 3g, 4g, 7g"));
  m = message(
      GpuPod({{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem", 30000}},
             {{"nvidia.com/mig-profile-preference", "9g"}, {"nvidia.com/nouse-gputype", "A100"}}));
  EXPECT_THAT(m, HasSubstr("valid choices for this pod (30000 MiB per instance; models H100 80GB): "
                           "3g.40gb, 7g.80gb, 3g, 7g"));
  // Nothing close: no guess. Nothing covers the request: the whole list.
  m = message(GpuPod({{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem", 200000}},
                     {{"nvidia.com/mig-profile-preference", "turbo"}}));
  EXPECT_THAT(m, Not(HasSubstr("did you mean")));
  EXPECT_THAT(m, HasSubstr("valid choices (no allowlisted model covers this pod's request): "
                           "1g.5gb, 2g.10gb"));
  // Without a memory request or model filter, every choice (as before).
  m = message(GpuPod({{"nvidia.com/gpu", 1}}, {{"nvidia.com/mig-profile-preference", "7g.40"}}));
  EXPECT_THAT(m, HasSubstr("did you mean \"7g.40gb\"? valid choices: 1g.5gb, 2g.10gb, 3g.20gb, "
                           "4g.20gb, 7g.40gb, 1g.10gb, 3g.40gb, 7g.80gb, 1g, 2g, 3g, 4g, 7g"));
}

// Only the models the cluster has: a cluster of A100-40GB nodes is not told about H100 profiles.
TEST_F(AdmissionTest, AnUnknownPreferenceListsOnlyTheProfilesOfTheClustersModels) {
  std::vector<std::string> models = {"NVIDIA A100-SXM4-40GB"};
  AdmissionOptions o = Options();
  o.cluster_models = [&models] { return models; };
  AdmissionHandler handler(o);
  auto message = [&](const json& pod) {
    const json r = handler.ReviewJson(Review(pod))["response"];
    EXPECT_EQ(r["allowed"], false) << pod.dump();
    return r["status"]["message"].get<std::string>();
  };
  const json typo = GpuPod({{"nvidia.com/gpu", 1}}, {{"nvidia.com/mig-profile-preference", "4gg"}});
  std::string m = message(typo);
  EXPECT_THAT(m, HasSubstr("did you mean \"4g\"? valid choices for the GPU models in the cluster "
                           "(NVIDIA A100-SXM4-40GB): 1g.5gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb, "
                           "1g, 2g, 3g, 4g, 7g"));
  EXPECT_THAT(m, Not(HasSubstr("7g.80gb")));
  // With a memory request, both reasons are named.
  m = message(GpuPod({{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem", 20000}},
                     {{"nvidia.com/mig-profile-preference", "3g.20gbb"}}));
  EXPECT_THAT(m, HasSubstr("valid choices for this pod (GPU models in the cluster: NVIDIA "
                           "A100-SXM4-40GB; 20000 MiB per instance): 3g.20gb, 4g.20gb, 7g.40gb, "
                           "3g, 4g, 7g"));
  // A profile of an allowlisted model the cluster lacks is still a valid preference.
  json other = typo;
  other["metadata"]["annotations"]["nvidia.com/mig-profile-preference"] = "3g.40gb";
  EXPECT_EQ(handler.ReviewJson(Review(other))["response"]["allowed"], true);
  // The list follows the cluster: an H100 node joins, and every allowlisted model is present.
  models.push_back("NVIDIA H100 80GB HBM3");
  EXPECT_THAT(message(typo), HasSubstr("valid choices: 1g.5gb, 2g.10gb, 3g.20gb, 4g.20gb, "
                                       "7g.40gb, 1g.10gb, 3g.40gb, 7g.80gb"));
  // No model of the allowlist in the cluster (yet): every choice.
  models = {"Tesla T4"};
  EXPECT_THAT(message(typo), HasSubstr("did you mean \"4g\"? valid choices: 1g.5gb, 2g.10gb"));
}

TEST_F(AdmissionTest, PreferenceIsCheckedOnUpdateOnlyWhenItChanges) {
  json old_pod = GpuPod({{"nvidia.com/gpu", 1}}, {{"nvidia.com/mig-profile-preference", "5g"}});
  json new_pod = old_pod;
  new_pod["metadata"]["labels"] = {{"x", "y"}};
  // Admitted under an older allowlist: unrelated updates still pass.
  EXPECT_EQ(handler_.ReviewJson(Review(new_pod, "UPDATE", old_pod))["response"]["allowed"], true);
  new_pod["metadata"]["annotations"]["nvidia.com/mig-profile-preference"] = "6g";
  EXPECT_EQ(handler_.ReviewJson(Review(new_pod, "UPDATE", old_pod))["response"]["allowed"], false);
}

TEST_F(AdmissionTest, BadRequestsAreRejectedNamingContainerAndResource) {
  json pod = GpuPod({{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem", "8Gi"}});
  const json r = handler_.ReviewJson(Review(pod))["response"];
  EXPECT_EQ(r["allowed"], false);
  EXPECT_THAT(r["status"]["message"].get<std::string>(),
              HasSubstr("container \"workload\" (containers[0]): nvidia.com/gpumem: \"8Gi\" has "
                        "a binary suffix; it counts MiB: write 8192 for 8Gi"));
  // A MIG pod placed by hand would bypass the reservation.
  pod = GpuPod();
  pod["spec"]["nodeName"] = "node-a";
  EXPECT_THAT(handler_.ReviewJson(Review(pod))["response"]["status"]["message"].get<std::string>(),
              HasSubstr("spec.nodeName is set (node-a)"));
}

TEST_F(AdmissionTest, OnlyTheSystemWritesTheReservationAnnotation) {
  const std::string key(protocol::kMigAllocationsAnnotation);
  const std::string value =
      R"([{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":0,"size":1}}])";
  json pod = GpuPod({{"nvidia.com/gpu", 1}}, {{key, value}});
  // CREATE with the annotation by a user: rejected.
  json r = handler_.ReviewJson(Review(pod))["response"];
  EXPECT_EQ(r["allowed"], false);
  EXPECT_EQ(r["status"]["code"], 403);
  EXPECT_THAT(r["status"]["message"].get<std::string>(),
              HasSubstr("hami.io/vgpu-mig-allocations is written only by the dynmig scheduler "
                        "and device plugin"));
  EXPECT_THAT(r["status"]["message"].get<std::string>(), HasSubstr("user \"alice\" may not set"));
  // UPDATE by the scheduler: fine. By a user who changes or removes it: rejected.
  json old_pod = GpuPod({{"nvidia.com/gpu", 1}});
  EXPECT_EQ(handler_.ReviewJson(Review(pod, "UPDATE", old_pod, kScheduler))["response"]["allowed"],
            true);
  json changed = pod;
  changed["metadata"]["annotations"][key] = "[]";
  EXPECT_EQ(handler_.ReviewJson(Review(changed, "UPDATE", pod, "alice"))["response"]["allowed"],
            false);
  json removed = pod;
  removed["metadata"]["annotations"].erase(key);
  r = handler_.ReviewJson(Review(removed, "UPDATE", pod, "alice"))["response"];
  EXPECT_EQ(r["allowed"], false);
  EXPECT_THAT(r["status"]["message"].get<std::string>(), HasSubstr("may not change or remove"));
  // A user's update that leaves it as it is: fine.
  json labelled = pod;
  labelled["metadata"]["labels"] = {{"team", "a"}};
  EXPECT_EQ(handler_.ReviewJson(Review(labelled, "UPDATE", pod, "alice"))["response"]["allowed"],
            true);
}

// Every annotation of the protocol the system writes is guarded like the reservation: create,
// update and remove, by a user (refused) and by each configured identity (allowed).
TEST_F(AdmissionTest, OnlyTheSystemWritesAnyProtocolAnnotation) {
  const std::vector<std::string> writers = Options().annotation_writers;
  ASSERT_EQ(std::size(protocol::kSystemPodAnnotations), 8u);
  for (const std::string_view k : protocol::kSystemPodAnnotations) {
    const std::string key(k);
    SCOPED_TRACE(key);
    const json plain = GpuPod({{"nvidia.com/gpu", 1}});
    json with = GpuPod({{"nvidia.com/gpu", 1}}, {{key, "v1"}});
    json changed = GpuPod({{"nvidia.com/gpu", 1}}, {{key, "v2"}});
    // CREATE with it.
    json r = handler_.ReviewJson(Review(with, "CREATE", json(), "alice"))["response"];
    EXPECT_EQ(r["allowed"], false);
    EXPECT_EQ(r["status"]["code"], 403);
    EXPECT_EQ(r["status"]["reason"], "Forbidden");
    EXPECT_THAT(r["status"]["message"].get<std::string>(),
                HasSubstr(key + " is written only by the dynmig scheduler and device plugin (" +
                          writers[0] + ", " + writers[1] + "); user \"alice\" may not set it"));
    // UPDATE: added, changed, removed.
    for (const auto& [object, old_object] :
         std::vector<std::pair<json, json>>{{with, plain}, {changed, with}, {plain, with}}) {
      r = handler_.ReviewJson(Review(object, "UPDATE", old_object, "alice"))["response"];
      EXPECT_EQ(r["allowed"], false) << object.dump();
      EXPECT_THAT(r["status"]["message"].get<std::string>(),
                  HasSubstr("may not change or remove it"));
      for (const auto& writer : writers) {
        EXPECT_EQ(handler_.ReviewJson(
                      Review(object, "UPDATE", old_object, writer))["response"]["allowed"],
                  true)
            << writer;
      }
    }
    for (const auto& writer : writers) {
      EXPECT_EQ(handler_.ReviewJson(Review(with, "CREATE", json(), writer))["response"]["allowed"],
                true)
          << writer;
    }
    // A user's update that leaves it unchanged, and other annotations: fine.
    json labelled = with;
    labelled["metadata"]["labels"] = {{"team", "a"}};
    labelled["metadata"]["annotations"]["note"] = "mine";
    EXPECT_EQ(handler_.ReviewJson(Review(labelled, "UPDATE", with, "alice"))["response"]["allowed"],
              true);
  }
  // Several at once are named together.
  json forged =
      GpuPod({{"nvidia.com/gpu", 1}}, {{std::string(protocol::kBindPhaseAnnotation), "success"},
                                       {std::string(protocol::kVgpuNodeAnnotation), "n"}});
  auto message = handler_
                     .ReviewJson(Review(forged, "UPDATE", GpuPod({{"nvidia.com/gpu", 1}}),
                                        "alice"))["response"]["status"]["message"]
                     .get<std::string>();
  EXPECT_THAT(message, HasSubstr("hami.io/vgpu-node, hami.io/bind-phase are written only by"));
  EXPECT_THAT(message, HasSubstr("may not change or remove them"));
  // Deleting is not reviewed: users may still delete their pods.
  json del = Review(GpuPod({{"nvidia.com/gpu", 1}},
                           {{std::string(protocol::kBindPhaseAnnotation), "allocating"}}),
                    "DELETE", json(), "alice");
  EXPECT_EQ(handler_.ReviewJson(del)["response"]["allowed"], true);
}

// ---- Issue 27: only dynmig places pods that request the managed resources. ----

std::string Message(const json& response) {
  return response.value("status", json::object()).value("message", "");
}

// Whole-GPU pods (nvidia.com/vgpu-mode: hami-core): with whole_gpu_pods on (migModeSwitching
// enabled), a request that is no whole-GPU request is refused at creation with the parser's
// message; off, the webhook admits them as before (routed to the scheduler, which refuses them).
TEST(WholeGpuAdmissionTest, AMalformedWholeGpuPodIsRefusedOnlyWhenTheyArePlaced) {
  AdmissionOptions on_options = Options();
  on_options.whole_gpu_pods = true;
  const AdmissionHandler on(on_options);
  const AdmissionHandler off(Options());
  const json mode = {{std::string(protocol::kVgpuModeAnnotation), "hami-core"}};
  struct Case {
    json limits;
    std::string message;
  };
  const std::vector<Case> bad = {
      {{{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem-percentage", 50}}, "asks for a share of a GPU"},
      {{{"nvidia.com/gpu", 17}}, "17 whole GPUs; at most 16 per container"},
      {{{"nvidia.com/gpu", 0}}, "no container asks for nvidia.com/gpu"},
  };
  for (const auto& c : bad) {
    SCOPED_TRACE(c.limits.dump());
    const json pod = GpuPod(c.limits, mode);
    const json r = on.ReviewJson(Review(pod))["response"];
    EXPECT_EQ(r["allowed"], false);
    EXPECT_EQ(r["status"]["code"], 400);
    EXPECT_THAT(Message(r), HasSubstr("jobs/p: "));
    EXPECT_THAT(Message(r), HasSubstr(c.message));
    // Default: unchanged (admitted and routed).
    const json d = off.ReviewJson(Review(pod))["response"];
    EXPECT_EQ(d["allowed"], true) << Message(d);
    EXPECT_EQ(Patch(d)[0]["value"], "dynmig-scheduler");
  }
  // A good whole-GPU pod is admitted and routed either way; a MIG pod too.
  for (const AdmissionHandler* h : {&on, &off}) {
    const json r = h->ReviewJson(
        Review(GpuPod({{"nvidia.com/gpu", 2}, {"nvidia.com/gpumem", 40000}}, mode)))["response"];
    EXPECT_EQ(r["allowed"], true) << Message(r);
    EXPECT_EQ(Patch(r)[0]["value"], "dynmig-scheduler");
    EXPECT_EQ(h->ReviewJson(Review(GpuPod()))["response"]["allowed"], true);
  }
}

// A whole-GPU pod may not carry a hand-written reservation (the device lists are the whole
// reservation of such a pod): the guard of every GPU pod, switching on or off.
TEST(WholeGpuAdmissionTest, AWholeGpuPodMayNotCarryAHandWrittenReservation) {
  AdmissionOptions on_options = Options();
  on_options.whole_gpu_pods = true;
  const AdmissionHandler on(on_options);
  const AdmissionHandler off(Options());
  for (const AdmissionHandler* handler : {&on, &off}) {
    const AdmissionHandler& h = *handler;
    for (const std::string_view key :
         {protocol::kDevicesAllocatedAnnotation, protocol::kDevicesToAllocateAnnotation,
          protocol::kVgpuNodeAnnotation, protocol::kMigAllocationsAnnotation}) {
      SCOPED_TRACE(key);
      json annotations = {{std::string(protocol::kVgpuModeAnnotation), "hami-core"},
                          {std::string(key), "GPU-a,NVIDIA H100 80GB HBM3,81559,100:;"}};
      const json pod = GpuPod({{"nvidia.com/gpu", 1}}, annotations);
      const json r = h.ReviewJson(Review(pod))["response"];
      EXPECT_EQ(r["allowed"], false);
      EXPECT_EQ(r["status"]["code"], 403);
      EXPECT_THAT(Message(r), HasSubstr("user \"alice\" may not set"));
      // Added later by a user: refused too; by the scheduler: fine.
      const json plain = GpuPod({{"nvidia.com/gpu", 1}},
                                {{std::string(protocol::kVgpuModeAnnotation), "hami-core"}});
      EXPECT_EQ(h.ReviewJson(Review(pod, "UPDATE", plain, "alice"))["response"]["allowed"], false);
      EXPECT_EQ(h.ReviewJson(Review(pod, "UPDATE", plain, kScheduler))["response"]["allowed"],
                true);
    }
  }
}

// A hami-core (or any other mode) pod with spec.nodeName would reach the node without a
// reservation and be served whichever pod holds the node lock.
TEST_F(AdmissionTest, NodeNameIsRefusedForEveryGpuPodWhateverItsMode) {
  for (const std::string mode : {"hami-core", "mps", "mig", ""}) {
    SCOPED_TRACE(mode);
    json annotations = json::object();
    if (!mode.empty()) annotations[std::string(protocol::kVgpuModeAnnotation)] = mode;
    json pod = GpuPod({{"nvidia.com/gpu", 1}}, annotations);
    EXPECT_EQ(handler_.ReviewJson(Review(pod))["response"]["allowed"], true);
    pod["spec"]["nodeName"] = "node-a";
    for (const bool mutate : {true, false}) {
      const json r = handler_.ReviewJson(Review(pod), mutate)["response"];
      EXPECT_EQ(r["allowed"], false);
      EXPECT_EQ(r["status"]["code"], 400);
      EXPECT_THAT(Message(r), HasSubstr("pod jobs/p: spec.nodeName is set (node-a): a pod that "
                                        "requests nvidia.com/gpu, nvidia.com/gpumem"));
      EXPECT_THAT(Message(r), HasSubstr("must be placed by dynmig-scheduler"));
    }
  }
  // Any managed resource makes the pod dynmig's, a count of 0 included.
  for (const json& limits : {json{{"nvidia.com/gpumem", 4000}}, json{{"nvidia.com/gpucores", 30}},
                             json{{"nvidia.com/gpu", 0}}}) {
    json pod = GpuPod(limits, {{std::string(protocol::kVgpuModeAnnotation), "hami-core"}});
    pod["spec"]["nodeName"] = "node-a";
    EXPECT_EQ(handler_.ReviewJson(Review(pod))["response"]["allowed"], false) << limits.dump();
  }
  // Other pods may name their node.
  json plain = GpuPod({{"cpu", "1"}});
  plain["spec"]["nodeName"] = "node-a";
  EXPECT_EQ(handler_.ReviewJson(Review(plain))["response"]["allowed"], true);
}

// The mutating answer rewrites schedulerName; the validating answer refuses any other name, which
// it sees only when the mutating webhook was bypassed or overridden.
TEST_F(AdmissionTest, TheValidatingAnswerRefusesAForeignSchedulerName) {
  json pod =
      GpuPod({{"nvidia.com/gpu", 1}}, {{std::string(protocol::kVgpuModeAnnotation), "hami-core"}});
  pod["spec"]["schedulerName"] = "default-scheduler";
  json r = handler_.ReviewJson(Review(pod), /*mutate=*/true)["response"];
  EXPECT_EQ(r["allowed"], true);
  EXPECT_EQ(Patch(r)[0]["value"], "dynmig-scheduler");
  r = handler_.ReviewJson(Review(pod), /*mutate=*/false)["response"];
  EXPECT_EQ(r["allowed"], false);
  EXPECT_THAT(Message(r), HasSubstr("pod jobs/p: spec.schedulerName is \"default-scheduler\": a "
                                    "pod that requests nvidia.com/gpu"));
  EXPECT_THAT(Message(r), HasSubstr("is placed only by dynmig-scheduler"));
  pod["spec"]["schedulerName"] = "my-scheduler";
  EXPECT_THAT(Message(handler_.ReviewJson(Review(pod), false)["response"]),
              HasSubstr("spec.schedulerName is \"my-scheduler\""));
  pod["spec"].erase("schedulerName");
  EXPECT_EQ(handler_.ReviewJson(Review(pod), false)["response"]["allowed"], false);
  pod["spec"]["schedulerName"] = "dynmig-scheduler";
  EXPECT_EQ(handler_.ReviewJson(Review(pod), false)["response"]["allowed"], true);
  // Other pods keep their scheduler.
  json plain = GpuPod({{"cpu", "1"}});
  plain["spec"]["schedulerName"] = "my-scheduler";
  EXPECT_EQ(handler_.ReviewJson(Review(plain), false)["response"]["allowed"], true);
}

// Issue 27, behaviour 1: nvidia.com/gpu: 50000 kept the planner busy for minutes.
TEST_F(AdmissionTest, InstanceCountsAboveWhatANodeHoldsAreRefused) {
  int largest_node = 14;
  AdmissionOptions o = Options();
  o.max_instances_per_node = [&] { return largest_node; };
  AdmissionHandler handler(o);
  auto review = [&](const json& pod) { return handler.ReviewJson(Review(pod))["response"]; };
  json r = review(GpuPod({{"nvidia.com/gpu", 50000}, {"nvidia.com/gpumem", 1000}}));
  EXPECT_EQ(r["allowed"], false);
  EXPECT_EQ(r["status"]["code"], 400);
  EXPECT_THAT(Message(r),
              HasSubstr("pod jobs/p: container \"workload\" (containers[0]): nvidia.com/gpu: "
                        "50000 is more than 14, the most MIG instances one node of this cluster "
                        "can hold"));
  EXPECT_EQ(review(GpuPod({{"nvidia.com/gpu", 14}}))["allowed"], true);
  EXPECT_EQ(review(GpuPod({{"nvidia.com/gpu", 15}}))["allowed"], false);
  // All containers together, init containers included.
  json pod = GpuPod({{"nvidia.com/gpu", 8}});
  pod["spec"]["initContainers"] =
      json::array({{{"name", "prepare"}, {"resources", {{"limits", {{"nvidia.com/gpu", 7}}}}}}});
  EXPECT_THAT(Message(review(pod)),
              HasSubstr("pod jobs/p: its containers ask for 15 nvidia.com/gpu in all, more than "
                        "14"));
  pod["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 20;
  EXPECT_THAT(Message(review(pod)),
              HasSubstr("container \"prepare\" (initContainers[0]): nvidia.com/gpu: 20 is more "
                        "than 14"));
  // Unknown capacity (no node registered yet): the ceiling, which a larger figure cannot raise.
  for (const int unknown_or_huge : {0, -1, 5000}) {
    largest_node = unknown_or_huge;
    EXPECT_EQ(review(GpuPod({{"nvidia.com/gpu", kMaxInstancesCeiling}}))["allowed"], true);
    EXPECT_THAT(Message(review(GpuPod({{"nvidia.com/gpu", 50000}}))),
                HasSubstr("nvidia.com/gpu: 50000 is more than 1024, dynmig's ceiling of MIG "
                          "instances per pod"));
  }
  // The handler without the function: the ceiling too.
  EXPECT_EQ(handler_.ReviewJson(Review(GpuPod({{"nvidia.com/gpu", 1025}})))["response"]["allowed"],
            false);
  // Memory per instance above any GPU.
  r = review(GpuPod({{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem", 2000000000}}));
  EXPECT_THAT(Message(r), HasSubstr("container \"workload\" (containers[0]): nvidia.com/gpumem: "
                                    "2000000000 MiB per instance is more than 1048576 MiB"));
  EXPECT_EQ(review(GpuPod({{"nvidia.com/gpu", 1}, {"nvidia.com/gpumem", 1048576}}))["allowed"],
            true);
}

protocol::DeviceInfo MigGpu(std::string_view model, const std::vector<std::string>& profiles) {
  const mig::CatalogueModel* m = mig::FindModelByNvmlName(model);
  EXPECT_NE(m, nullptr) << model;
  std::vector<const mig::ProfileSpec*> allowed;
  for (const auto& name : profiles) allowed.push_back(m->capability.FindProfile(name));
  return protocol::MigDeviceInfo({.uuid = "GPU-1"}, m->capability, allowed);
}

TEST(NodeInstanceCapacityTest, SumsThePlannersBoundOfEachMigGpu) {
  const mig::Allowlist allowlist = TestAllowlist();
  const protocol::DeviceInfo a100 =
      MigGpu("NVIDIA A100-SXM4-40GB", {"1g.5gb", "3g.20gb", "7g.40gb"});
  EXPECT_EQ(NodeInstanceCapacity({a100}, allowlist), 7);
  EXPECT_EQ(NodeInstanceCapacity({a100, a100}, allowlist), 14);
  // Only allowlisted profiles count.
  mig::Allowlist large_only;
  large_only.entries.push_back({{"A100-SXM4-40GB"}, {"3g.20gb", "7g.40gb"}});
  EXPECT_EQ(NodeInstanceCapacity({a100}, large_only), 2);
  // A GPU not in MIG mode, or of a model the allowlist does not name, holds none.
  protocol::DeviceInfo plain = a100;
  plain.mode = "hami-core";
  EXPECT_EQ(NodeInstanceCapacity({plain, a100}, allowlist), 7);
  mig::Allowlist other;
  other.entries.push_back({{"H100"}, {"1g.10gb"}});
  EXPECT_EQ(NodeInstanceCapacity({a100}, other), 0);

  NodeCapacityIndex index(allowlist);
  EXPECT_EQ(index.Max(), 0);
  index.Upsert("n1", protocol::EncodeNodeRegister({a100}));
  index.Upsert("n2", protocol::EncodeNodeRegister({a100, a100}));
  EXPECT_EQ(index.Max(), 14);
  index.Upsert("n2", protocol::EncodeNodeRegister({a100}));
  EXPECT_EQ(index.Max(), 7);
  index.Upsert("n2", "not json");  // holds nothing
  index.Remove("n1");
  EXPECT_EQ(index.Max(), 0);
}

// Issue 27, behaviour 4: a bound pod with nvidia.com/gpu: 0 whose vgpu-mode the user removed made
// the scheduler fail its node closed.
TEST_F(AdmissionTest, RoutingAnnotationsAreFixedAtCreationForGpuPods) {
  ASSERT_EQ(std::size(protocol::kRoutingPodAnnotations), 8u);
  for (const std::string_view k : protocol::kRoutingPodAnnotations) {
    const std::string key(k);
    SCOPED_TRACE(key);
    const json limits = {{"nvidia.com/gpu", 1}};
    const json plain = GpuPod(limits);
    const json with = GpuPod(limits, {{key, "1g"}});
    const json changed = GpuPod(limits, {{key, "2g"}});
    for (const auto& [object, old_object] :
         std::vector<std::pair<json, json>>{{with, plain}, {changed, with}, {plain, with}}) {
      for (const std::string user : {"alice", kScheduler}) {
        const json r = handler_.ReviewJson(Review(object, "UPDATE", old_object, user))["response"];
        EXPECT_EQ(r["allowed"], false) << user << " " << object.dump();
        EXPECT_EQ(r["status"]["code"], 403);
        EXPECT_THAT(Message(r), HasSubstr("pod jobs/p: " + key +
                                          " is fixed at creation for a pod that requests "
                                          "nvidia.com/gpu"));
        EXPECT_THAT(Message(r), HasSubstr("user \"" + user +
                                          "\" may not add, change or remove "
                                          "it"));
      }
    }
    // Unchanged, other edits pass.
    json labelled = with;
    labelled["metadata"]["labels"] = {{"team", "a"}};
    labelled["metadata"]["annotations"]["note"] = "mine";
    EXPECT_EQ(handler_.ReviewJson(Review(labelled, "UPDATE", with))["response"]["allowed"], true);
    // A pod without managed resources cannot gain them, so its annotations decide nothing.
    const json cpu = GpuPod({{"cpu", "1"}});
    const json cpu_with = GpuPod({{"cpu", "1"}}, {{key, "1g"}});
    EXPECT_EQ(handler_.ReviewJson(Review(cpu, "UPDATE", cpu_with))["response"]["allowed"], true);
  }
  // The attack: gpu 0, vgpu-mode removed after the bind.
  json bound = GpuPod({{"nvidia.com/gpu", 0}}, {{"nvidia.com/vgpu-mode", "mig"}});
  bound["spec"]["nodeName"] = "node-a";
  bound["spec"]["schedulerName"] = "dynmig-scheduler";
  json removed = bound;
  removed["metadata"]["annotations"].erase("nvidia.com/vgpu-mode");
  const json r = handler_.ReviewJson(Review(removed, "UPDATE", bound), false)["response"];
  EXPECT_EQ(r["allowed"], false);
  EXPECT_THAT(Message(r), HasSubstr("nvidia.com/vgpu-mode is fixed at creation"));
  // Several at once are named together.
  json two = bound;
  two["metadata"]["annotations"]["nvidia.com/use-gputype"] = "A100";
  two["metadata"]["annotations"]["hami.io/node-scheduler-policy"] = "spread";
  EXPECT_THAT(Message(handler_.ReviewJson(Review(two, "UPDATE", bound))["response"]),
              HasSubstr("nvidia.com/use-gputype, hami.io/node-scheduler-policy are fixed at "
                        "creation"));
}

json BindingReview(const std::string& user, const std::string& pod = "p",
                   json annotations = json::object(), std::string resource = "pods",
                   std::string sub = "binding") {
  json binding = {{"apiVersion", "v1"},
                  {"kind", "Binding"},
                  {"metadata", {{"name", pod}, {"namespace", "jobs"}}},
                  {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", "node-a"}}}};
  if (!annotations.empty()) binding["metadata"]["annotations"] = annotations;
  json request = {{"uid", "b0"},
                  {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Binding"}}},
                  {"resource", {{"group", ""}, {"version", "v1"}, {"resource", resource}}},
                  {"namespace", "jobs"},
                  {"name", pod},
                  {"operation", "CREATE"},
                  {"userInfo", {{"username", user}}},
                  {"object", binding},
                  {"oldObject", nullptr}};
  if (!sub.empty()) request["subResource"] = sub;
  return {{"apiVersion", "admission.k8s.io/v1"}, {"kind", "AdmissionReview"}, {"request", request}};
}

class BindingTest : public ::testing::Test {
 protected:
  BindingTest() {
    AdmissionOptions o = Options();
    o.pod_lookup = [this](const std::string& ns, const std::string& name) -> absl::StatusOr<json> {
      lookups_.push_back(ns + "/" + name);
      auto it = pods_.find(name);
      if (it == pods_.end()) return absl::NotFoundError("pods \"" + name + "\" not found");
      return it->second;
    };
    handler_ = std::make_unique<AdmissionHandler>(o);
  }
  json Answer(const json& review) { return handler_->ReviewJson(review, false)["response"]; }

  std::map<std::string, json> pods_ = {
      {"p", GpuPod({{"nvidia.com/gpu", 1}}, {{"nvidia.com/vgpu-mode", "hami-core"}})},
      {"plain", GpuPod({{"cpu", "1"}})}};
  std::vector<std::string> lookups_;
  std::unique_ptr<AdmissionHandler> handler_;
};

// Issue 27: only the extender binds pods that request the managed resources.
TEST_F(BindingTest, OnlyTheExtenderBindsGpuPods) {
  json r = Answer(BindingReview("alice"));
  EXPECT_EQ(r["allowed"], false);
  EXPECT_EQ(r["status"]["code"], 403);
  EXPECT_THAT(Message(r), HasSubstr("pod jobs/p: only " + std::string(kScheduler) +
                                    " may bind a pod that requests nvidia.com/gpu"));
  EXPECT_THAT(Message(r), HasSubstr("user \"alice\" may not bind it to node node-a"));
  EXPECT_EQ(lookups_, std::vector<std::string>{"jobs/p"});
  // The legacy bindings resource too.
  EXPECT_EQ(Answer(BindingReview("alice", "p", json::object(), "bindings", ""))["allowed"], false);
  // The extender: allowed without reading the pod.
  lookups_.clear();
  EXPECT_EQ(Answer(BindingReview(kScheduler))["allowed"], true);
  EXPECT_TRUE(lookups_.empty());
  // Pods without managed resources: anyone binds them (the default kube-scheduler does).
  EXPECT_EQ(Answer(BindingReview("alice", "plain"))["allowed"], true);
  EXPECT_EQ(Answer(BindingReview("system:kube-scheduler", "plain"))["allowed"], true);
}

TEST_F(BindingTest, ABindingWhosePodCannotBeReadIsRefused) {
  json r = Answer(BindingReview("alice", "gone"));
  EXPECT_EQ(r["allowed"], false);
  EXPECT_THAT(Message(r), HasSubstr("binding of pod jobs/gone to node node-a refused: the pod "
                                    "could not be read to check whether it requests "
                                    "nvidia.com/gpu"));
  EXPECT_THAT(Message(r), HasSubstr("pods \"gone\" not found"));
  // Without a lookup at all.
  AdmissionHandler blind(Options());
  r = blind.ReviewJson(BindingReview("alice", "plain"), false)["response"];
  EXPECT_EQ(r["allowed"], false);
  EXPECT_THAT(Message(r), HasSubstr("could not be read"));
  EXPECT_EQ(blind.ReviewJson(BindingReview(kScheduler), false)["response"]["allowed"], true);
}

// The API server copies a Binding's annotations onto the pod: the system's annotations stay the
// system's, whatever the pod.
TEST_F(BindingTest, ABindingMayNotCarryTheSystemsAnnotations) {
  const json forged = {{std::string(protocol::kMigAllocationsAnnotation), "[]"}};
  json r = Answer(BindingReview("alice", "plain", forged));
  EXPECT_EQ(r["allowed"], false);
  EXPECT_THAT(Message(r), HasSubstr("binding of pod jobs/plain: hami.io/vgpu-mig-allocations is "
                                    "written only by the dynmig scheduler and device plugin"));
  EXPECT_EQ(Answer(BindingReview(kScheduler, "p", forged))["allowed"], true);
  EXPECT_EQ(Answer(BindingReview("alice", "plain", {{"note", "x"}}))["allowed"], true);
}

TEST_F(BindingTest, MalformedBindingsAreRefused) {
  json review = BindingReview("alice");
  review["request"]["object"]["metadata"]["name"] = "other";
  EXPECT_THAT(Message(Answer(review)), HasSubstr("metadata.name must name the pod"));
  review["request"].erase("object");
  EXPECT_THAT(Message(Answer(review)), HasSubstr("binding without request.object"));
  // Only CREATE is a binding.
  review = BindingReview("alice");
  review["request"]["operation"] = "UPDATE";
  EXPECT_EQ(Answer(review)["allowed"], true);
}

TEST_F(AdmissionTest, MalformedReviewsGetAnErrorStatus) {
  json out = json::parse(handler_.Review(std::string_view("{not json")));
  EXPECT_EQ(out["response"]["allowed"], false);
  EXPECT_EQ(out["response"]["status"]["code"], 400);
  EXPECT_THAT(out["response"]["status"]["message"].get<std::string>(), HasSubstr("invalid JSON"));
  out = handler_.ReviewJson(json{{"apiVersion", "v1"}, {"kind", "Pod"}});
  EXPECT_THAT(out["response"]["status"]["message"].get<std::string>(),
              HasSubstr("expected an admission.k8s.io/v1 AdmissionReview"));
  json review = Review(GpuPod());
  review["request"].erase("uid");
  out = handler_.ReviewJson(review);
  EXPECT_THAT(out["response"]["status"]["message"].get<std::string>(),
              HasSubstr("request.uid is missing"));
  // v1beta1 is answered in v1beta1.
  review = Review(GpuPod());
  review["apiVersion"] = "admission.k8s.io/v1beta1";
  EXPECT_EQ(handler_.ReviewJson(review)["apiVersion"], "admission.k8s.io/v1beta1");
}

}  // namespace
}  // namespace dynmig::webhook
