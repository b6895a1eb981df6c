#include "local/demo.h"

#include <map>
#include <set>
#include <vector>

#include "deviceplugin/device_plugin.h"
#include "fmt/format.h"
#include "local/node_agent.h"
#include "nlohmann/json.hpp"
#include "protocol/annotations.h"
#include "protocol/mig_allocations.h"

namespace dynmig::local {
namespace {

using nlohmann::json;

json MigPod(const std::string& ns, const std::string& name, int64_t gpumem_mib,
            const std::string& preference = "") {
  json annotations = {
      {std::string(protocol::kVgpuModeAnnotation), std::string(protocol::kVgpuModeMig)}};
  if (!preference.empty()) {
    annotations[std::string(protocol::kMigProfilePreferenceAnnotation)] = preference;
  }
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", ns}, {"annotations", annotations}}},
          {"spec",
           {{"restartPolicy", "Never"},
            {"containers",
             json::array({{{"name", "workload"},
                           {"image", "ubuntu:22.04"},
                           {"command", json::array({"bash", "-c", "sleep 3600"})},
                           {"resources",
                            {{"limits",
                              {{std::string(protocol::kResourceCount), 1},
                               {std::string(protocol::kResourceMemory), gpumem_mib}}}}}}})}}}};
}

class Demo {
 public:
  Demo(LocalCluster& cluster, std::ostream& out, const DemoOptions& options,
       std::unique_ptr<kube::KubeClient> client)
      : cluster_(cluster), out_(out), options_(options), client_(std::move(client)) {}

  absl::Status Run() {
    const std::string ns = options_.ns;
    // 1. The canary.
    Step("1. the canary pod of the migration guide (nvidia.com/gpumem: 8000)");
    if (auto st = Create(MigPod(ns, "mig-canary", 8000)); !st.ok()) return st;
    auto canary = WaitRunning("mig-canary");
    if (!canary.ok()) return canary.status();
    auto identity = CheckIdentity(*canary);
    if (!identity.ok()) return identity.status();
    Layout();

    // 2. Delete it: the exact instance goes away.
    Step("2. delete the canary: its GI/CI is destroyed, the slices are free again");
    if (auto st = Delete("mig-canary"); !st.ok()) return st;
    if (!WaitFor([&] { return !InstanceExists(identity->node, identity->mig_uuid); })) {
      return Failed("the canary's instance " + identity->mig_uuid + " was not reclaimed");
    }
    Ok(fmt::format("{} destroyed on {}", identity->mig_uuid, identity->node));
    Layout();

    // 3. Mixed profiles, side by side.
    Step("3. mixed profiles: 1g (5000 MiB), 2g (10000 MiB) and 3g (20000 MiB) pods");
    for (const auto& [name, mib] : std::vector<std::pair<std::string, int64_t>>{
             {"small-1g", 5000}, {"medium-2g", 10000}, {"large-3g", 20000}}) {
      if (auto st = Create(MigPod(ns, name, mib)); !st.ok()) return st;
    }
    for (const char* name : {"small-1g", "medium-2g", "large-3g"}) {
      auto pod = WaitRunning(name);
      if (!pod.ok()) return pod.status();
      auto id = CheckIdentity(*pod);
      if (!id.ok()) return id.status();
      running_[name] = *id;
    }
    Layout();

    // 4. Preference: honored, and a typo refused at admission.
    Step("4. nvidia.com/mig-profile-preference: \"4g\" on a 20000 MiB pod; then a typo");
    if (auto st = Create(MigPod(ns, "prefer-4g", 20000, "4g")); !st.ok()) return st;
    auto prefer = WaitRunning("prefer-4g");
    if (!prefer.ok()) return prefer.status();
    auto prefer_id = CheckIdentity(*prefer);
    if (!prefer_id.ok()) return prefer_id.status();
    if (prefer_id->profile.rfind("4g.", 0) != 0) {
      Note(fmt::format("no GPU had a free 4g placement: got {} (a preference never blocks)",
                       prefer_id->profile));
    } else {
      Ok("got " + prefer_id->profile + ", not the default smallest profile");
    }
    running_["prefer-4g"] = *prefer_id;
    auto typo = client_->CreatePod(MigPod(ns, "prefer-typo", 20000, "4gg"));
    if (typo.ok()) return Failed("the webhook accepted the preference \"4gg\"");
    Ok(fmt::format("refused at creation: {}", std::string(typo.status().message())));
    Layout();

    // 5. Exhaustion: 1g pods until one stays Pending.
    Step("5. capacity exhausted: 1g pods until one cannot be placed");
    bool pending_seen = false;
    for (int i = 1; i <= 64 && !pending_seen; ++i) {
      const std::string name = fmt::format("filler-{}", i);
      if (auto st = Create(MigPod(ns, name, 4000)); !st.ok()) return st;
      fillers_.push_back(name);
      std::string reason;
      const bool settled = WaitFor([&] {
        auto pod = client_->GetPod(ns, name);
        if (!pod.ok()) return false;
        if (kube::Phase(*pod) == "Running") return true;
        reason = UnschedulableMessage(*pod);
        return !reason.empty();
      });
      if (!settled) return Failed(name + " neither ran nor was reported unschedulable");
      if (!reason.empty()) {
        pending_seen = true;
        Ok(fmt::format("{} stays Pending after {} fillers: {}", name, i - 1, reason));
      }
    }
    if (!pending_seen) return Failed("64 small pods all fit: the cluster never filled up");
    Layout();

    // 6. Device-plugin restart with workloads running.
    const std::string node = running_["large-3g"].node;
    Step(fmt::format("6. restart the device plugin of {} while its workloads run", node));
    std::map<std::string, std::string> before;  // pod -> MIG UUID
    for (const auto& [pod, id] : running_) {
      if (id.node == node) before[pod] = id.mig_uuid;
    }
    if (auto st = cluster_.RestartDevicePlugin(node); !st.ok()) return st;
    // Let the new plugin run its recovery and a reconcile cycle.
    if (auto* plugin = cluster_.device_plugin(node); plugin != nullptr) plugin->RunCycle();
    for (const auto& [pod, uuid] : before) {
      if (!InstanceExists(node, uuid)) {
        return Failed(fmt::format("{}'s instance {} is gone after the restart", pod, uuid));
      }
      auto obj = client_->GetPod(ns, pod);
      if (!obj.ok() || kube::Phase(*obj) != "Running") {
        return Failed(pod + " is not Running after the restart");
      }
    }
    Ok(fmt::format("{} instances kept with the same MIG UUIDs and adopted", before.size()));
    Layout();

    Step("cleanup: the fillers are deleted; the other pods keep running");
    for (const auto& name : fillers_) (void)Delete(name);
    out_ << "\nThe demo is done. The cluster keeps serving; try the commands printed above.\n";
    out_.flush();
    return absl::OkStatus();
  }

 private:
  struct Identity {
    std::string node;
    std::string profile;
    std::string mig_uuid;
  };

  void Step(const std::string& title) {
    out_ << "\n== " << title << "\n";
    out_.flush();
  }
  void Ok(const std::string& what) {
    out_ << "   ok: " << what << "\n";
    out_.flush();
  }
  void Note(const std::string& what) {
    out_ << "   note: " << what << "\n";
    out_.flush();
  }
  absl::Status Failed(const std::string& what) {
    out_ << "   FAILED: " << what << "\n";
    out_.flush();
    return absl::InternalError("demo: " + what);
  }
  void Layout() {
    if (options_.layout) out_ << options_.layout();
    out_.flush();
  }

  absl::Status Create(const json& pod) {
    auto created = client_->CreatePod(pod);
    if (!created.ok()) {
      return Failed(
          fmt::format("creating {}: {}", kube::Name(pod), std::string(created.status().message())));
    }
    return absl::OkStatus();
  }

  absl::Status Delete(const std::string& name) {
    auto deleted = client_->DeletePod(options_.ns, name);
    if (!deleted.ok() && !absl::IsNotFound(deleted.status())) {
      return Failed(fmt::format("deleting {}: {}", name, std::string(deleted.status().message())));
    }
    // Wait until the kubelet confirmed the deletion.
    WaitFor([&] { return absl::IsNotFound(client_->GetPod(options_.ns, name).status()); });
    return absl::OkStatus();
  }

  // Polls `pred` every 50 ms of the cluster's clock until it holds or the step's time is up.
  template <typename F>
  bool WaitFor(F pred) {
    const Clock& clock = cluster_.clock();
    const absl::Duration end = clock.Monotonic() + options_.step_timeout;
    while (clock.Monotonic() < end) {
      if (pred()) return true;
      clock.SleepFor(absl::Milliseconds(50));
    }
    return pred();
  }

  static std::string UnschedulableMessage(const json& pod) {
    const json* conds = nullptr;
    if (pod.contains("status") && pod["status"].contains("conditions")) {
      conds = &pod["status"]["conditions"];
    }
    if (conds == nullptr || !conds->is_array()) return "";
    for (const auto& c : *conds) {
      if (c.value("type", "") == "PodScheduled" && c.value("status", "") == "False") {
        return c.value("message", c.value("reason", "Unschedulable"));
      }
    }
    return "";
  }

  absl::StatusOr<json> WaitRunning(const std::string& name) {
    json last;
    const bool ok = WaitFor([&] {
      auto pod = client_->GetPod(options_.ns, name);
      if (!pod.ok()) return false;
      last = *pod;
      return kube::Phase(*pod) == "Running" || kube::IsTerminated(*pod);
    });
    if (!ok || kube::Phase(last) != "Running") {
      std::string why = UnschedulableMessage(last);
      if (why.empty() && last.contains("status")) why = last["status"].value("message", "");
      return Failed(fmt::format("{} is not Running (phase {}){}", name,
                                kube::Phase(last).empty() ? "none" : kube::Phase(last),
                                why.empty() ? "" : ": " + why));
    }
    return last;
  }

  bool InstanceExists(const std::string& node, const std::string& mig_uuid) {
    auto live = cluster_.Instances(node);
    if (!live.ok()) return true;  // unknown: do not claim it is gone
    for (const auto& li : *live) {
      if (li.mig_uuid == mig_uuid) return true;
    }
    return false;
  }

  // The annotation is complete, and its MIG UUID is the container's and NVML's.
  absl::StatusOr<Identity> CheckIdentity(const json& pod) {
    const std::string name = kube::Name(pod);
    const auto value = kube::Annotation(pod, protocol::kMigAllocationsAnnotation);
    if (!value) return Failed(name + " has no " + std::string(protocol::kMigAllocationsAnnotation));
    auto allocs = protocol::DecodeMigAllocations(*value);
    if (!allocs.ok() || allocs->empty()) return Failed(name + ": unreadable reservation");
    const protocol::MigAllocation& a = allocs->front();
    if (!a.runtime) return Failed(name + ": the reservation has no MIG UUID, GI ID and CI ID");
    Identity id{kube::NodeName(pod), a.profile, a.runtime->mig_uuid};
    const auto visible = kube::Annotation(pod, kVisibleDevicesAnnotation);
    if (!visible || visible->find(a.runtime->mig_uuid) == std::string::npos) {
      return Failed(fmt::format("{}: the container sees {}, the annotation says {}", name,
                                visible.value_or("nothing"), a.runtime->mig_uuid));
    }
    auto live = cluster_.Instances(id.node);
    if (!live.ok())
      return Failed(fmt::format("NVML of {}: {}", id.node, std::string(live.status().message())));
    const LiveInstance* found = nullptr;
    for (const auto& li : *live) {
      if (li.mig_uuid == a.runtime->mig_uuid) found = &li;
    }
    if (found == nullptr) return Failed(name + ": NVML has no instance " + a.runtime->mig_uuid);
    if (found->gi_id != a.runtime->gpu_instance_id ||
        found->ci_id != a.runtime->compute_instance_id || found->placement != a.placement ||
        found->gpu_uuid != a.gpu_uuid) {
      return Failed(
          fmt::format("{}: NVML's instance (GI {} CI {} at {}) differs from the annotation", name,
                      found->gi_id, found->ci_id, found->placement.start));
    }
    Ok(fmt::format(
        "{} Running on {}: {} at slices {}-{} of {}, {} (GI {}, CI {}), seen by the "
        "container and NVML",
        name, id.node, a.profile, a.placement.start, a.placement.start + a.placement.size - 1,
        a.gpu_uuid.substr(0, 12), a.runtime->mig_uuid, a.runtime->gpu_instance_id,
        a.runtime->compute_instance_id));
    return id;
  }

  LocalCluster& cluster_;
  std::ostream& out_;
  const DemoOptions& options_;
  std::unique_ptr<kube::KubeClient> client_;
  std::map<std::string, Identity> running_;
  std::vector<std::string> fillers_;
};

}  // namespace

absl::Status RunDemo(LocalCluster& cluster, std::ostream& out, const DemoOptions& options) {
  auto client = cluster.Client(kAdminUser);
  if (!client.ok()) return client.status();
  Demo demo(cluster, out, options, std::move(*client));
  return demo.Run();
}

}  // namespace dynmig::local
