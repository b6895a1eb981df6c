#include "ops/canary.h"

#include "absl/time/clock.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
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

void RunCanary(kube::KubeClient& client, NvmlSource* nvml, const CanaryOptions& options,
               const protocol::DeviceConfig& config, CheckReport& report) {
  const auto sleep = options.sleep ? options.sleep : [](absl::Duration d) { absl::SleepFor(d); };
  const auto clock = options.clock ? options.clock : [] { return absl::Now(); };
  const std::string key = options.ns + "/" + options.name;
  const absl::Time start = clock();
  auto log = [&](const std::string& line) {
    const std::string stamped = fmt::format("canary [{}] {}", Seconds(clock() - start), line);
    report.notes.push_back(stamped);
    if (options.progress) options.progress(stamped);
  };
  const std::string node_label = options.node;

  // Create.
  auto created = client.CreatePod(CanaryPod(options, config.resources));
  if (!created.ok()) {
    if (created.status().code() == absl::StatusCode::kAlreadyExists) {
      report.AddFor("canary-create", node_label, key, CheckStatus::kFail,
                    "a pod with the canary's name already exists; it is not touched (delete it, "
                    "or choose another name with --canary-name)");
    } else {
      report.AddFor("canary-create", node_label, key, CheckStatus::kFail,
                    "cannot create the canary", {std::string(created.status().message())});
    }
    log("create failed");
    return;
  }
  const std::string uid = kube::Uid(*created);
  report.AddFor(
      "canary-create", node_label, key, CheckStatus::kPass,
      fmt::format("created (1 x {}, {} MiB, nvidia.com/vgpu-mode mig{})", config.resources.count,
                  options.gpumem_mib, options.node.empty() ? "" : ", pinned to " + options.node));
  log("created " + key);

  auto gone = [&](absl::Duration timeout, absl::Duration* took) -> bool {
    const absl::Time t0 = clock();
    while (true) {
      auto got = client.GetPod(options.ns, options.name);
      if (!got.ok() && got.status().code() == absl::StatusCode::kNotFound) {
        *took = clock() - t0;
        return true;
      }
      if (got.ok() && kube::Uid(*got) != uid) {  // someone else's pod now
        *took = clock() - t0;
        return true;
      }
      if (clock() - t0 >= timeout) return false;
      sleep(options.poll);
    }
  };
  auto cleanup = [&](const std::string& why) {
    kube::DeleteOptions del;
    del.grace_period_seconds = 0;
    del.precondition_uid = uid;
    auto st = client.DeletePod(options.ns, options.name, del);
    absl::Duration took;
    const bool ok = (st.ok() || st.status().code() == absl::StatusCode::kNotFound) &&
                    gone(options.timeout, &took);
    report.AddFor("canary-cleanup", node_label, key, ok ? CheckStatus::kPass : CheckStatus::kFail,
                  ok ? fmt::format("the canary was deleted after the failure ({})", why)
                     : fmt::format("the canary could not be deleted after the failure ({}): "
                                   "delete it by hand",
                                   why),
                  st.ok() ? std::vector<std::string>{}
                          : std::vector<std::string>{std::string(st.status().message())});
    log(ok ? "cleaned up" : "cleanup failed");
  };

  // Wait until Running.
  Object pod;
  {
    const absl::Time t0 = clock();
    while (true) {
      auto got = client.GetPod(options.ns, options.name);
      if (got.ok()) {
        pod = *got;
        const std::string phase = kube::Phase(pod);
        if (phase == "Running") break;
        if (phase == "Failed" || phase == "Succeeded") {
          report.AddFor("canary-running", node_label, key, CheckStatus::kFail,
                        fmt::format("the canary ended ({}) instead of running", phase),
                        StatusEvidence(pod));
          log("ended " + phase);
          cleanup("it did not run");
          return;
        }
      } else if (got.status().code() == absl::StatusCode::kNotFound) {
        report.AddFor("canary-running", node_label, key, CheckStatus::kFail,
                      "the canary disappeared before running");
        log("disappeared");
        return;
      }
      if (clock() - t0 >= options.timeout) {
        report.AddFor("canary-running", node_label, key, CheckStatus::kFail,
                      fmt::format("not Running after {}", absl::FormatDuration(options.timeout)),
                      StatusEvidence(pod));
        log("timed out waiting for Running");
        cleanup("it did not run in time");
        return;
      }
      sleep(options.poll);
    }
    if (!options.node.empty() && PodNode(pod) != options.node) {
      // The node affinity was not honoured: what runs says nothing about the node validated.
      report.AddFor("canary-running", node_label, key, CheckStatus::kFail,
                    fmt::format("Running on {}, not on {} where it was pinned",
                                PodNode(pod).empty() ? "no node" : PodNode(pod), options.node),
                    StatusEvidence(pod));
      log("running on the wrong node " + PodNode(pod));
      cleanup("it ran elsewhere");
      return;
    }
    report.AddFor("canary-running", node_label, key, CheckStatus::kPass,
                  fmt::format("Running on {} after {}", PodNode(pod), Seconds(clock() - t0)));
    log("running on " + PodNode(pod));
  }

  // The per-pod checks on the canary.
  const std::string node = PodNode(pod);
  auto snap = TakeSnapshot(client, clock());
  std::map<std::string, NodeNvml> views;
  NodeNvml& nv = views[node];
  nv.view = absl::UnavailableError("no NVML endpoint configured");
  if (!snap.ok()) {
    report.AddFor("canary-reservation", node, key, CheckStatus::kFail, "cannot read the cluster",
                  {std::string(snap.status().message())});
  } else {
    if (const Object* fresh = snap->FindPod(options.ns, options.name)) pod = *fresh;
    const Object* node_obj = snap->FindNode(node);
    if (nvml != nullptr && node_obj != nullptr) {
      NvmlResult r = FetchNvmlView(*nvml, *node_obj);
      nv.url = r.url;
      nv.view = std::move(r.view);
    }
    ValidatePod(*snap, pod, config, views, report, "canary-");
  }
  std::vector<protocol::MigAllocation> allocations;
  if (auto value = kube::Annotation(pod, protocol::kMigAllocationsAnnotation)) {
    if (auto decoded = protocol::DecodeMigAllocations(*value); decoded.ok()) {
      allocations = *decoded;
    }
  }
  log("checked annotation, runtime identity, visible devices and NVML");

  // Delete and wait until gone.
  {
    kube::DeleteOptions del;
    del.grace_period_seconds = options.delete_grace_seconds;
    del.precondition_uid = uid;
    auto st = client.DeletePod(options.ns, options.name, del);
    absl::Duration took;
    if ((!st.ok() && st.status().code() != absl::StatusCode::kNotFound) ||
        !gone(options.timeout + absl::Seconds(options.delete_grace_seconds), &took)) {
      report.AddFor(
          "canary-delete", node, key, CheckStatus::kFail,
          fmt::format("the canary was not gone after {}", absl::FormatDuration(options.timeout)),
          st.ok() ? StatusEvidence(*st)
                  : std::vector<std::string>{std::string(st.status().message())});
      log("delete timed out");
      cleanup("it did not go away");
      return;
    }
    report.AddFor("canary-delete", node, key, CheckStatus::kPass,
                  fmt::format("deleted; gone after {}", Seconds(took)));
    log("deleted");
  }

  // Released: no active pod names the canary's slices as its own; NVML reclaimed the instance.
  {
    auto after = TakeSnapshot(client, clock());
    if (!after.ok()) {
      report.AddFor("canary-released", node, key, CheckStatus::kFail, "cannot read the cluster",
                    {std::string(after.status().message())});
    } else {
      std::vector<std::string> reused;
      bool held = false;
      for (const auto& p : after->pods) {
        if (IsTerminated(p) || PodNode(p) != node) continue;
        auto value = kube::Annotation(p, protocol::kMigAllocationsAnnotation);
        if (!value) continue;
        auto theirs = protocol::DecodeMigAllocations(*value);
        if (!theirs.ok()) continue;
        for (const auto& a : *theirs) {
          for (const auto& mine : allocations) {
            if (a.gpu_uuid != mine.gpu_uuid || !a.placement.Overlaps(mine.placement)) continue;
            if (PodKey(p) == key) {
              held = true;
            } else {
              reused.push_back(fmt::format("slices {} now reserved by {} ({})",
                                           a.placement.ToString(), PodKey(p), a.profile));
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
      report.AddFor("canary-released", node, key, held ? CheckStatus::kFail : CheckStatus::kPass,
                    held ? "a pod of the canary's name still holds its reservation"
                         : "no active pod holds the canary's reservation",
                    evidence);
    }
    std::vector<std::string> uuids;
    for (const auto& a : allocations) {
      if (a.runtime) uuids.push_back(a.runtime->mig_uuid);
    }
    const Object* node_obj = after.ok() ? after->FindNode(node) : nullptr;
    if (nvml == nullptr || node_obj == nullptr || !nv.view.ok()) {
      report.AddFor("canary-reclaimed", node, key, CheckStatus::kSkip,
                    nv.view.ok() ? "no NVML view of the node"
                                 : fmt::format("NVML view unavailable ({}): the GI/CI's "
                                               "reclamation was not verified",
                                               std::string(nv.view.status().message())));
    } else if (uuids.empty()) {
      report.AddFor("canary-reclaimed", node, key, CheckStatus::kSkip,
                    "the canary never got a MIG instance");
    } else {
      const absl::Time t0 = clock();
      std::string last;
      while (true) {
        NvmlResult r = FetchNvmlView(*nvml, *node_obj);
        if (r.view.ok()) {
          std::vector<std::string> left;
          for (const auto& u : uuids) {
            if (r.view->FindMigUuid(u) != nullptr) left.push_back(u);
          }
          if (left.empty()) {
            report.AddFor("canary-reclaimed", node, key, CheckStatus::kPass,
                          fmt::format("NVML no longer has {} ({} after the delete)",
                                      fmt::join(uuids, ","), Seconds(clock() - t0)));
            break;
          }
          last = fmt::format("NVML still has {}", fmt::join(left, ","));
        } else {
          last = std::string(r.view.status().message());
        }
        if (clock() - t0 >= options.timeout) {
          report.AddFor("canary-reclaimed", node, key, CheckStatus::kFail,
                        fmt::format("the device plugin did not reclaim the instance within {}",
                                    absl::FormatDuration(options.timeout)),
                        {last});
          break;
        }
        sleep(options.poll);
      }
    }
    log("checked release");
  }
}

}  // namespace dynmig::ops
