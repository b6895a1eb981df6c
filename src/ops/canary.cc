#include "ops/canary.h"

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "ops/checks.h"
#include "ops/cluster.h"
#include "ops/validate.h"
#include "protocol/annotations.h"
#include "protocol/mig_allocations.h"

namespace dynmig::ops {
namespace {

using kube::Object;

std::string Seconds(absl::Duration d) { return fmt::format("{:.1f}s", absl::ToDoubleSeconds(d)); }

// What the pod's status says about why it is not running.
std::vector<std::string> StatusEvidence(const Object& pod) {
  std::vector<std::string> out;
  out.push_back(fmt::format(
      "phase {}{}", kube::Phase(pod).empty() ? "unknown" : kube::Phase(pod),
      kube::NodeName(pod).empty() ? ", not bound to a node" : ", node " + kube::NodeName(pod)));
  const std::string reason = kube::StringAt(pod, "/status/reason");
  const std::string message = kube::StringAt(pod, "/status/message");
  if (!reason.empty() || !message.empty()) out.push_back(fmt::format("{}: {}", reason, message));
  const auto status = pod.find("status");
  if (status != pod.end() && status->is_object()) {
    const auto conds = status->find("conditions");
    if (conds != status->end() && conds->is_array()) {
      for (const auto& c : *conds) {
        if (!c.is_object() || c.value("status", "") == "True") continue;
        out.push_back(fmt::format("condition {}={} {}: {}", c.value("type", ""),
                                  c.value("status", ""), c.value("reason", ""),
                                  c.value("message", "")));
      }
    }
  }
  if (auto phase = kube::Annotation(pod, protocol::kBindPhaseAnnotation)) {
    out.push_back(fmt::format("{}={}", protocol::kBindPhaseAnnotation, *phase));
  }
  return out;
}

}  // namespace

kube::Object CanaryPod(const CanaryOptions& options, const protocol::ResourceNames& resources) {
  Object limits = {{resources.count, "1"}, {resources.memory, std::to_string(options.gpumem_mib)}};
  Object pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata",
       {{"name", options.name},
        {"namespace", options.ns},
        {"labels", {{"app.kubernetes.io/name", "dynmig-canary"}}},
        {"annotations", {{std::string(protocol::kVgpuModeAnnotation), "mig"}}}}},
      {"spec",
       {{"restartPolicy", "Never"},
        {"terminationGracePeriodSeconds", options.delete_grace_seconds},
        {"tolerations", Object::array({{{"key", "node.kubernetes.io/unschedulable"},
                                        {"operator", "Exists"},
                                        {"effect", "NoSchedule"}}})},
        {"containers", Object::array({{{"name", "workload"},
                                       {"image", options.image},
                                       {"command", Object::array({"bash", "-c", "sleep 3600"})},
                                       {"resources", {{"limits", limits}}}}})}}}};
  if (!options.scheduler_name.empty()) pod["spec"]["schedulerName"] = options.scheduler_name;
  if (!options.node.empty()) {
    pod["spec"]["affinity"] = {
        {"nodeAffinity",
         {{"requiredDuringSchedulingIgnoredDuringExecution",
           {{"nodeSelectorTerms",
             Object::array(
                 {{{"matchFields", Object::array({{{"key", "metadata.name"},
                                                   {"operator", "In"},
                                                   {"values", {options.node}}}})}}})}}}}}};
  }
  return pod;
}

namespace {

// One run of the canary's lifecycle: each step appends its items to the report and a line to the
// step log. Every wait polls the API on the injected clock, bounded by options.timeout.
class CanaryRun {
 public:
  CanaryRun(kube::KubeClient& client, NvmlSource* nvml, const CanaryOptions& options,
            const protocol::DeviceConfig& config, const Clock& clock, CheckReport& report)
      : client_(client),
        nvml_(nvml),
        options_(options),
        config_(config),
        clock_(clock),
        report_(report),
        key_(options.ns + "/" + options.name),
        start_(clock.Monotonic()) {}

  void Run() {
    if (!Create()) return;
    std::optional<Object> pod = WaitRunning();
    if (!pod) return;
    const std::string node = PodNode(*pod);
    NodeNvml nv = CheckPod(node, *pod);
    const std::vector<protocol::MigAllocation> allocations = Reservation(*pod);
    log("checked annotation, runtime identity, visible devices and NVML");
    if (!Delete(node)) return;
    Released(node, allocations, nv);
    log("checked release");
  }

 private:
  void log(const std::string& line) {
    const std::string stamped =
        fmt::format("canary [{}] {}", Seconds(clock_.Monotonic() - start_), line);
    report_.notes.push_back(stamped);
    if (options_.progress) options_.progress(stamped);
  }

  bool Create() {
    auto created = client_.CreatePod(CanaryPod(options_, config_.resources));
    if (!created.ok()) {
      if (created.status().code() == absl::StatusCode::kAlreadyExists) {
        report_.AddFor("canary-create", options_.node, key_, CheckStatus::kFail,
                       "a pod with the canary's name already exists; it is not touched (delete "
                       "it, or choose another name with --canary-name)");
      } else {
        report_.AddFor("canary-create", options_.node, key_, CheckStatus::kFail,
                       "cannot create the canary", {std::string(created.status().message())});
      }
      log("create failed");
      return false;
    }
    uid_ = kube::Uid(*created);
    report_.AddFor("canary-create", options_.node, key_, CheckStatus::kPass,
                   fmt::format("created (1 x {}, {} MiB, {} mig{})", config_.resources.count,
                               options_.gpumem_mib, protocol::kVgpuModeAnnotation,
                               options_.node.empty() ? "" : ", pinned to " + options_.node));
    log("created " + key_);
    return true;
  }

  // Polls until the canary is gone (or replaced by someone else's pod of that name); how long it
  // took, or nullopt after `timeout`.
  std::optional<absl::Duration> Gone(absl::Duration timeout) {
    const absl::Duration t0 = clock_.Monotonic();
    while (true) {
      auto got = client_.GetPod(options_.ns, options_.name);
      const bool gone = (!got.ok() && got.status().code() == absl::StatusCode::kNotFound) ||
                        (got.ok() && kube::Uid(*got) != uid_);
      if (gone) return clock_.Monotonic() - t0;
      if (clock_.Monotonic() - t0 >= timeout) return std::nullopt;
      clock_.SleepFor(options_.poll);
    }
  }

  // After a failure: force-delete the canary and wait until it is gone.
  void Cleanup(const std::string& why) {
    kube::DeleteOptions del;
    del.grace_period_seconds = 0;
    del.precondition_uid = uid_;
    auto st = client_.DeletePod(options_.ns, options_.name, del);
    const bool ok = (st.ok() || st.status().code() == absl::StatusCode::kNotFound) &&
                    Gone(options_.timeout).has_value();
    report_.AddFor("canary-cleanup", options_.node, key_,
                   ok ? CheckStatus::kPass : CheckStatus::kFail,
                   ok ? fmt::format("the canary was deleted after the failure ({})", why)
                      : fmt::format("the canary could not be deleted after the failure ({}): "
                                    "delete it by hand",
                                    why),
                   st.ok() ? std::vector<std::string>{}
                           : std::vector<std::string>{std::string(st.status().message())});
    log(ok ? "cleaned up" : "cleanup failed");
  }

  // Polls until Running; the pod, or nullopt once a failure is reported (and cleaned up).
  std::optional<Object> WaitRunning() {
    const std::string& node_label = options_.node;
    Object pod;
    const absl::Duration t0 = clock_.Monotonic();
    while (true) {
      auto got = client_.GetPod(options_.ns, options_.name);
      if (got.ok()) {
        pod = *got;
        if (kube::Phase(pod) == "Running") break;
        if (kube::IsTerminated(pod)) {
          const std::string phase = kube::Phase(pod);
          report_.AddFor("canary-running", node_label, key_, CheckStatus::kFail,
                         fmt::format("the canary ended ({}) instead of running", phase),
                         StatusEvidence(pod));
          log("ended " + phase);
          Cleanup("it did not run");
          return std::nullopt;
        }
      } else if (got.status().code() == absl::StatusCode::kNotFound) {
        report_.AddFor("canary-running", node_label, key_, CheckStatus::kFail,
                       "the canary disappeared before running");
        log("disappeared");
        return std::nullopt;
      }
      if (clock_.Monotonic() - t0 >= options_.timeout) {
        report_.AddFor("canary-running", node_label, key_, CheckStatus::kFail,
                       fmt::format("not Running after {}", absl::FormatDuration(options_.timeout)),
                       StatusEvidence(pod));
        log("timed out waiting for Running");
        Cleanup("it did not run in time");
        return std::nullopt;
      }
      clock_.SleepFor(options_.poll);
    }
    if (!options_.node.empty() && PodNode(pod) != options_.node) {
      // The node affinity was not honoured: what runs says nothing about the node validated.
      report_.AddFor("canary-running", node_label, key_, CheckStatus::kFail,
                     fmt::format("Running on {}, not on {} where it was pinned",
                                 PodNode(pod).empty() ? "no node" : PodNode(pod), options_.node),
                     StatusEvidence(pod));
      log("running on the wrong node " + PodNode(pod));
      Cleanup("it ran elsewhere");
      return std::nullopt;
    }
    report_.AddFor(
        "canary-running", node_label, key_, CheckStatus::kPass,
        fmt::format("Running on {} after {}", PodNode(pod), Seconds(clock_.Monotonic() - t0)));
    log("running on " + PodNode(pod));
    return pod;
  }

  // validate's per-pod checks on the canary (`pod` is refreshed from the snapshot); the node's
  // NVML view they used.
  NodeNvml CheckPod(const std::string& node, Object& pod) {
    auto snap = TakeSnapshot(client_, clock_.Now());
    std::map<std::string, NodeNvml> views;
    NodeNvml& nv = views[node];
    nv.view = absl::UnavailableError("no NVML endpoint configured");
    if (!snap.ok()) {
      report_.AddFor("canary-reservation", node, key_, CheckStatus::kFail,
                     "cannot read the cluster", {std::string(snap.status().message())});
      return nv;
    }
    if (const Object* fresh = snap->FindPod(options_.ns, options_.name)) pod = *fresh;
    const Object* node_obj = snap->FindNode(node);
    if (nvml_ != nullptr && node_obj != nullptr) {
      NvmlResult r = FetchNvmlView(*nvml_, *node_obj);
      nv.url = r.url;
      nv.view = std::move(r.view);
    }
    ValidatePod(*snap, pod, config_, views, report_, "canary-");
    return nv;
  }

  static std::vector<protocol::MigAllocation> Reservation(const Object& pod) {
    if (auto value = kube::Annotation(pod, protocol::kMigAllocationsAnnotation)) {
      if (auto decoded = protocol::DecodeMigAllocations(*value); decoded.ok()) return *decoded;
    }
    return {};
  }

  // Deletes the canary and waits until it is gone; false once a failure is reported.
  bool Delete(const std::string& node) {
    kube::DeleteOptions del;
    del.grace_period_seconds = options_.delete_grace_seconds;
    del.precondition_uid = uid_;
    auto st = client_.DeletePod(options_.ns, options_.name, del);
    std::optional<absl::Duration> took;
    if (st.ok() || st.status().code() == absl::StatusCode::kNotFound) {
      took = Gone(options_.timeout + absl::Seconds(options_.delete_grace_seconds));
    }
    if (!took) {
      report_.AddFor(
          "canary-delete", node, key_, CheckStatus::kFail,
          fmt::format("the canary was not gone after {}", absl::FormatDuration(options_.timeout)),
          st.ok() ? StatusEvidence(*st)
                  : std::vector<std::string>{std::string(st.status().message())});
      log("delete timed out");
      Cleanup("it did not go away");
      return false;
    }
    report_.AddFor("canary-delete", node, key_, CheckStatus::kPass,
                   fmt::format("deleted; gone after {}", Seconds(*took)));
    log("deleted");
    return true;
  }

  // Released: no active pod names the canary's slices as its own; NVML reclaimed the instance.
  void Released(const std::string& node, const std::vector<protocol::MigAllocation>& allocations,
                const NodeNvml& nv) {
    auto after = TakeSnapshot(client_, clock_.Now());
    if (!after.ok()) {
      report_.AddFor("canary-released", node, key_, CheckStatus::kFail, "cannot read the cluster",
                     {std::string(after.status().message())});
    } else {
      ReservationReleased(*after, node, allocations);
    }
    std::vector<std::string> uuids;
    for (const auto& a : allocations) {
      if (a.runtime) uuids.push_back(a.runtime->mig_uuid);
    }
    const Object* node_obj = after.ok() ? after->FindNode(node) : nullptr;
    if (nvml_ == nullptr || node_obj == nullptr || !nv.view.ok()) {
      report_.AddFor("canary-reclaimed", node, key_, CheckStatus::kSkip,
                     nv.view.ok() ? "no NVML view of the node"
                                  : fmt::format("NVML view unavailable ({}): the GI/CI's "
                                                "reclamation was not verified",
                                                std::string(nv.view.status().message())));
    } else if (uuids.empty()) {
      report_.AddFor("canary-reclaimed", node, key_, CheckStatus::kSkip,
                     "the canary never got a MIG instance");
    } else {
      Reclaimed(node, *node_obj, uuids);
    }
  }

  void ReservationReleased(const ClusterSnapshot& after, const std::string& node,
                           const std::vector<protocol::MigAllocation>& allocations) {
    std::vector<std::string> reused;
    bool held = false;
    for (const Object* p : ActivePodsOn(after, node)) {
      auto value = kube::Annotation(*p, protocol::kMigAllocationsAnnotation);
      if (!value) continue;
      auto theirs = protocol::DecodeMigAllocations(*value);
      if (!theirs.ok()) continue;
      for (const auto& a : *theirs) {
        for (const auto& mine : allocations) {
          if (a.gpu_uuid != mine.gpu_uuid || !a.placement.Overlaps(mine.placement)) continue;
          if (PodKey(*p) == key_) {
            held = true;
          } else {
            reused.push_back(fmt::format("slices {} now reserved by {} ({})",
                                         a.placement.ToString(), PodKey(*p), a.profile));
          }
        }
      }
    }
    std::vector<std::string> evidence;
    for (const auto& a : allocations) {
      evidence.push_back(
          fmt::format("{} at {} of {}", a.profile, a.placement.ToString(), a.gpu_uuid));
    }
    evidence.insert(evidence.end(), reused.begin(), reused.end());
    report_.AddFor("canary-released", node, key_, held ? CheckStatus::kFail : CheckStatus::kPass,
                   held ? "a pod of the canary's name still holds its reservation"
                        : "no active pod holds the canary's reservation",
                   evidence);
  }

  // Polls the NVML view until none of `uuids` is there.
  void Reclaimed(const std::string& node, const Object& node_obj,
                 const std::vector<std::string>& uuids) {
    const absl::Duration t0 = clock_.Monotonic();
    std::string last;
    while (true) {
      NvmlResult r = FetchNvmlView(*nvml_, node_obj);
      if (r.view.ok()) {
        std::vector<std::string> left;
        for (const auto& u : uuids) {
          if (r.view->FindMigUuid(u) != nullptr) left.push_back(u);
        }
        if (left.empty()) {
          report_.AddFor("canary-reclaimed", node, key_, CheckStatus::kPass,
                         fmt::format("NVML no longer has {} ({} after the delete)",
                                     fmt::join(uuids, ","), Seconds(clock_.Monotonic() - t0)));
          return;
        }
        last = fmt::format("NVML still has {}", fmt::join(left, ","));
      } else {
        last = std::string(r.view.status().message());
      }
      if (clock_.Monotonic() - t0 >= options_.timeout) {
        report_.AddFor("canary-reclaimed", node, key_, CheckStatus::kFail,
                       fmt::format("the device plugin did not reclaim the instance within {}",
                                   absl::FormatDuration(options_.timeout)),
                       {last});
        return;
      }
      clock_.SleepFor(options_.poll);
    }
  }

  kube::KubeClient& client_;
  NvmlSource* const nvml_;
  const CanaryOptions& options_;
  const protocol::DeviceConfig& config_;
  const Clock& clock_;
  CheckReport& report_;
  const std::string key_;
  const absl::Duration start_;  // monotonic
  std::string uid_;
};

}  // namespace

void RunCanary(kube::KubeClient& client, NvmlSource* nvml, const CanaryOptions& options,
               const protocol::DeviceConfig& config, const Clock& clock, CheckReport& report) {
  CanaryRun(client, nvml, options, config, clock, report).Run();
}

}  // namespace dynmig::ops
