#include "deviceplugin/handover.h"

#include <algorithm>
#include <charconv>
#include <map>

#include "fmt/format.h"
#include "protocol/devices.h"

namespace dynmig::deviceplugin {
namespace {

// "123" -> 123; nullopt unless the whole text is a decimal number.
std::optional<uint32_t> Index(std::string_view text) {
  uint32_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return v;
}

bool NamesAny(const std::vector<std::string>& ids, const std::vector<LiveInstance>& live) {
  for (const auto& id : ids) {
    for (const auto& i : live) {
      if (DeviceIdNames(id, i)) return true;
    }
  }
  return false;
}

const PodMig* PodByKey(const std::vector<PodMig>& pods, std::string_view ns,
                       std::string_view name) {
  const PodMig* found = nullptr;
  for (const auto& p : pods) {
    // A name may be reused: prefer the pod that is not terminated.
    if (p.ns == ns && p.name == name && (found == nullptr || !p.terminated)) found = &p;
  }
  return found;
}

const PodMig* PodByUid(const std::vector<PodMig>& pods, std::string_view uid) {
  if (uid.empty()) return nullptr;
  for (const auto& p : pods) {
    if (p.uid == uid) return &p;
  }
  return nullptr;
}

std::string RuntimeMissing(const HandoverEvidence& evidence) {
  if (!evidence.runtime.has_value()) return "no container runtime is configured (--cri-socket)";
  return fmt::format("the container runtime cannot be read ({})",
                     std::string(evidence.runtime->status().message()));
}

}  // namespace

std::string_view KindName(AttributionKind kind) {
  switch (kind) {
    case AttributionKind::kHeld:
      return "held";
    case AttributionKind::kFree:
      return "free";
    case AttributionKind::kUnproven:
      break;
  }
  return "unproven";
}

bool DeviceIdNames(std::string_view id, const LiveInstance& instance) {
  if (id.empty()) return false;
  if (id == "all" || id == instance.gpu_uuid) return true;
  for (const auto& ci : instance.cis) {
    if (!ci.mig_uuid.empty() && id == ci.mig_uuid) return true;
    if (id == fmt::format("MIG-{}/{}/{}", instance.gpu_uuid, instance.gi, ci.id)) return true;
  }
  const size_t colon = id.find(':');
  const auto gpu = Index(id.substr(0, colon));
  if (!gpu.has_value() || *gpu != instance.gpu_index) return false;
  return colon == std::string_view::npos || Index(id.substr(colon + 1)).has_value();
}

std::string EvidenceGap(const HandoverEvidence& evidence, const std::vector<PodMig>& pods,
                        const std::vector<LiveInstance>& live) {
  if (!evidence.pod_resources.ok()) {
    return fmt::format("the kubelet's PodResources API cannot be read ({})",
                       std::string(evidence.pod_resources.status().message()));
  }
  if (evidence.runtime.has_value() && evidence.runtime->ok()) {
    for (const auto& c : **evidence.runtime) {
      if (c.state == RuntimeContainerState::kExited || c.error.empty()) continue;
      return fmt::format("the devices of container {} (pod {}, id {}) cannot be read: {}",
                         c.container, c.PodKey(), c.id, c.error);
    }
    return "";
  }
  // No runtime evidence: complete only when no active pod needs it.
  for (const auto& p : pods) {
    if (p.active && p.legacy) {
      return fmt::format(
          "pod {} is a HAMi legacy MIG pod, proven only by the container runtime, "
          "and {}",
          p.key, RuntimeMissing(evidence));
    }
  }
  for (const auto& p : *evidence.pod_resources) {
    const PodMig* api = PodByKey(pods, p.ns, p.name);
    if (api != nullptr && !api->active) continue;
    for (const auto& c : p.containers) {
      for (const auto& [resource, ids] : c.devices) {
        if (resource == evidence.own_resource || ids.empty() || NamesAny(ids, live)) continue;
        return fmt::format(
            "container {} of pod {} holds {} devices that name no MIG instance, "
            "proven only by the container runtime, and {}",
            c.name, p.Key(), resource, RuntimeMissing(evidence));
      }
    }
  }
  return "";
}

Attribution Attribute(const LiveInstance& instance, const HandoverEvidence& evidence,
                      const std::vector<PodMig>& pods, const std::string& gap) {
  Attribution out;
  if (!evidence.pod_resources.ok()) {
    out.kind = AttributionKind::kUnproven;
    out.reason = gap.empty() ? "the kubelet's PodResources API cannot be read" : gap;
    return out;
  }
  for (const auto& p : *evidence.pod_resources) {
    const PodMig* api = PodByKey(pods, p.ns, p.name);
    for (const auto& c : p.containers) {
      for (const auto& [resource, ids] : c.devices) {
        if (resource == evidence.own_resource) continue;
        for (const auto& id : ids) {
          if (!DeviceIdNames(id, instance)) continue;
          out.holders.push_back({api != nullptr ? api->uid : "", p.ns, p.name, c.name, resource, id,
                                 std::string(kHolderSourcePodResources)});
        }
      }
    }
  }
  if (evidence.runtime.has_value() && evidence.runtime->ok()) {
    for (const auto& c : **evidence.runtime) {
      if (c.state == RuntimeContainerState::kExited) continue;
      // The UID from the API, when the API lists the pod under the labels' name.
      const PodMig* api = PodByUid(pods, c.pod_uid);
      const bool same = api != nullptr && api->ns == c.pod_namespace && api->name == c.pod_name;
      for (const auto& id : c.devices) {
        if (!DeviceIdNames(id, instance)) continue;
        out.holders.push_back({same ? api->uid : "", c.pod_namespace, c.pod_name, c.container, "",
                               id, std::string(kHolderSourceRuntime)});
      }
    }
  }
  std::sort(out.holders.begin(), out.holders.end());
  out.holders.erase(std::unique(out.holders.begin(), out.holders.end()), out.holders.end());
  if (out.holders.empty()) {
    out.reason = !gap.empty() ? gap
                 : instance.error.empty()
                     ? ""
                     : fmt::format("its compute instances cannot be listed ({})", instance.error);
    out.kind = out.reason.empty() ? AttributionKind::kFree : AttributionKind::kUnproven;
    return out;
  }
  out.kind = AttributionKind::kHeld;
  const InstanceHolder* owner = nullptr;
  int best = -1;  // 2: an active pod the API lists, 1: a pod the API lists, 0: none
  for (const auto& h : out.holders) {
    const PodMig* api = PodByUid(pods, h.pod_uid);
    const int rank = api == nullptr ? 0 : (api->active ? 2 : 1);
    if (rank > best) {
      best = rank;
      owner = &h;
    }
  }
  out.owner = {owner->pod_uid, owner->ns, owner->name, 0, 0};
  return out;
}

std::string HeldReason(const std::vector<InstanceHolder>& holders, const InstanceOwner& owner) {
  if (holders.empty()) return "legacy instance";
  const InstanceHolder* first = &holders.front();
  for (const auto& h : holders) {
    if (h.ns == owner.ns && h.name == owner.name) {
      first = &h;
      break;
    }
  }
  std::string text = fmt::format(
      "legacy instance of {} (container {}, {})", first->PodKey(), first->container,
      first->resource.empty() ? fmt::format("{} {}", protocol::kVisibleDevicesEnv, first->device_id)
                              : first->resource);
  std::map<std::string, int> others;  // other pods' containers
  for (const auto& h : holders) {
    if (&h != first && (h.PodKey() != first->PodKey() || h.container != first->container)) {
      others[h.PodKey() + "/" + h.container] = 1;
    }
  }
  if (!others.empty()) text += fmt::format(" and {} other holder(s)", others.size());
  return text;
}

}  // namespace dynmig::deviceplugin
