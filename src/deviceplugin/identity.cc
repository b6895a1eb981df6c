#include "deviceplugin/identity.h"

#include <algorithm>
#include <set>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "protocol/annotations.h"

namespace dynmig::deviceplugin {
namespace {

struct Holder {
  const PodResourcesPod* pod = nullptr;
  const PodResourcesContainer* container = nullptr;
  std::string Text() const {
    return fmt::format("pod {} container {}", pod->Key(), container->name);
  }
};

// The containers that hold exactly `key`, and those that hold only some of it.
void FindHolders(const PodResourcesList& kubelet, std::string_view resource,
                 const std::vector<std::string>& key, std::vector<Holder>& exact,
                 std::vector<Holder>& partial) {
  for (const auto& pod : kubelet) {
    for (const auto& c : pod.containers) {
      auto it = c.devices.find(std::string(resource));
      if (it == c.devices.end() || it->second.empty()) continue;
      if (it->second == key) {
        exact.push_back({&pod, &c});
        continue;
      }
      for (const auto& id : it->second) {
        if (std::binary_search(key.begin(), key.end(), id)) {
          partial.push_back({&pod, &c});
          break;
        }
      }
    }
  }
}

std::string Served(const LedgerEntry& e) {
  return fmt::format(
      "pod {} (uid {}) {}container {} ({})", e.PodKey(), e.pod_uid, e.init_container ? "init " : "",
      e.container,
      e.mig_uuids.empty() ? "no MIG device" : fmt::format("{}", fmt::join(e.mig_uuids, ",")));
}

// The kubelet's side: exactly one pod holds the devices, and it is the recorded pod and container.
IdentityVerdict CheckHolder(const std::vector<std::string>& key, const LedgerEntry& e,
                            const PodResourcesList& kubelet, std::string_view resource) {
  const std::string ids = fmt::format("{} {}", resource, fmt::join(key, ","));
  std::vector<Holder> exact, partial;
  FindHolders(kubelet, resource, key, exact, partial);
  IdentityVerdict v;
  v.pods.push_back(e.PodKey());
  if (exact.empty()) {
    std::vector<std::string> some;
    for (const auto& h : partial) some.push_back(h.Text());
    const std::string others =
        some.empty() ? "" : fmt::format("; some of them: {}", fmt::join(some, ", "));
    if (e.init_container && partial.empty() &&
        std::any_of(kubelet.begin(), kubelet.end(),
                    [&](const PodResourcesPod& p) { return p.Key() == e.PodKey(); })) {
      // The kubelet's PodResources API lists no init containers (v1.20 and later), so an init
      // container's devices cannot be matched to it. The weaker proof: the kubelet knows the
      // recorded pod and no container it lists holds any of these devices. The UID is checked
      // next, as for every container.
      return IdentityVerdict{};
    }
    if (e.init_container) {
      v.reason = kIdentityInitContainer;
      v.message = fmt::format(
          "devices {} were served for {}, but the kubelet's PodResources API lists no init "
          "containers, and {}{}",
          ids, Served(e),
          partial.empty() ? "it does not list that pod" : "other containers hold some of them",
          others);
      return v;
    }
    v.reason = kIdentityNoHolder;
    v.message = fmt::format(
        "devices {} were served for {}, but according to the kubelet no container holds exactly "
        "them{}",
        ids, Served(e), others);
    return v;
  }
  std::set<std::string> holder_pods;
  for (const auto& h : exact) holder_pods.insert(h.pod->Key());
  std::vector<std::string> texts;
  for (const auto& h : exact) texts.push_back(h.Text());
  for (const auto& p : holder_pods) {
    if (p != e.PodKey()) v.pods.push_back(p);
  }
  if (holder_pods.size() > 1) {
    v.reason = kIdentityAmbiguous;
    v.message = fmt::format("devices {} were served for {}, but the kubelet lists them for {}", ids,
                            Served(e), fmt::join(texts, " and "));
    return v;
  }
  if (*holder_pods.begin() != e.PodKey()) {
    v.reason = kIdentityOtherPod;
    v.message = fmt::format("devices {} were served for {}, but the kubelet gave them to {}", ids,
                            Served(e), fmt::join(texts, ", "));
    return v;
  }
  for (const auto& h : exact) {
    // The kubelet hands an init container's devices on to the pod's app containers.
    if (h.container->name == e.container || e.init_container) return IdentityVerdict{};
  }
  v.reason = kIdentityOtherContainer;
  v.message = fmt::format("devices {} were served for {}, but the kubelet gave them to {}", ids,
                          Served(e), fmt::join(texts, ", "));
  return v;
}

// The API's side: the recorded pod still exists, active, with the recorded UID.
IdentityVerdict CheckUid(const LedgerEntry& e, const std::vector<PodMig>& pods) {
  IdentityVerdict v;
  v.pods.push_back(e.PodKey());
  const PodMig* same_name = nullptr;
  for (const auto& p : pods) {
    if (p.ns != e.ns || p.name != e.name) continue;
    if (p.uid == e.pod_uid) {
      if (p.active) return IdentityVerdict{};
      v.reason = kIdentityPodGone;
      v.message = fmt::format("pod {} (uid {}) is {}: its containers do not start", e.PodKey(),
                              e.pod_uid, p.deleting ? "being deleted" : "finished");
      return v;
    }
    same_name = &p;
  }
  if (same_name != nullptr) {
    v.reason = kIdentityUidMismatch;
    v.message = fmt::format(
        "the devices were served for pod {} uid {}, but pod {} is now uid {} (another pod under "
        "the same name)",
        e.PodKey(), e.pod_uid, e.PodKey(), same_name->uid);
    return v;
  }
  v.reason = kIdentityPodGone;
  v.message = fmt::format(
      "the devices were served for pod {} (uid {}), which is no longer on this "
      "node according to the API",
      e.PodKey(), e.pod_uid);
  return v;
}

// No ledger entry: devices allocated before this plugin kept a ledger (an upgrade), or never served
// by it. Proven only when the kubelet gives exactly these devices to one container of one pod, and
// that pod, in the API, is active on this node with its whole reservation realized by the device
// plugin (bind-phase success, every entry with its MIG UUID): the allocation this plugin adopts at
// recovery. Returns the pod, or nullptr.
const PodMig* AdoptableHolder(const std::vector<std::string>& key, const PodResourcesList& kubelet,
                              std::string_view resource, const std::vector<PodMig>& pods) {
  std::vector<Holder> exact, partial;
  FindHolders(kubelet, resource, key, exact, partial);
  if (exact.size() != 1 || !partial.empty()) return nullptr;
  for (const auto& p : pods) {
    if (p.key != exact[0].pod->Key() || !p.active) continue;
    if (p.bind_phase != protocol::kBindPhaseSuccess || !p.allocations.ok() ||
        p.allocations->empty())
      return nullptr;
    for (const auto& a : *p.allocations) {
      if (!a.runtime.has_value()) return nullptr;
    }
    return &p;
  }
  return nullptr;
}

}  // namespace

std::vector<std::string> DeviceKey(const std::vector<std::string>& device_ids) {
  std::vector<std::string> key = device_ids;
  std::sort(key.begin(), key.end());
  key.erase(std::unique(key.begin(), key.end()), key.end());
  return key;
}

IdentityVerdict CheckIdentity(const std::vector<std::string>& device_ids, const LedgerEntry* entry,
                              const absl::StatusOr<PodResourcesList>& kubelet,
                              std::string_view resource,
                              const absl::StatusOr<std::vector<PodMig>>& pods) {
  const std::vector<std::string> key = DeviceKey(device_ids);
  IdentityVerdict v;
  if (key.empty()) {
    v.reason = kIdentityNoDevices;
    v.message = "PreStartContainer names no devices";
    return v;
  }
  if (entry == nullptr && kubelet.ok() && pods.ok() &&
      AdoptableHolder(key, *kubelet, resource, *pods) != nullptr) {
    return IdentityVerdict{};
  }
  if (entry == nullptr) {
    v.reason = kIdentityNoRecord;
    v.message = fmt::format(
        "devices {} {} were not served by this device plugin for any pod (no Allocate with exactly "
        "these IDs is recorded, and no pod the kubelet gave them to has a realized reservation)",
        resource, fmt::join(key, ","));
    if (kubelet.ok()) {
      std::vector<Holder> exact, partial;
      FindHolders(*kubelet, resource, key, exact, partial);
      for (const auto& h : exact) v.pods.push_back(h.pod->Key());
    }
    return v;
  }
  if (!kubelet.ok()) {
    v.reason = kIdentityKubeletUnreachable;
    v.pods.push_back(entry->PodKey());
    v.message =
        fmt::format("cannot prove that devices {} {} went to {}: {}", resource, fmt::join(key, ","),
                    Served(*entry), std::string(kubelet.status().message()));
    return v;
  }
  if (v = CheckHolder(key, *entry, *kubelet, resource); !v.ok()) return v;
  if (!pods.ok()) {
    v.reason = kIdentityApiUnreachable;
    v.pods.push_back(entry->PodKey());
    v.message = fmt::format("cannot read the UID of pod {}: {}", entry->PodKey(),
                            std::string(pods.status().message()));
    return v;
  }
  return CheckUid(*entry, *pods);
}

}  // namespace dynmig::deviceplugin
