#include "scheduler/cluster_state.h"

#include <algorithm>
#include <limits>

#include "common/strings.h"
#include "fmt/format.h"
#include "kube/object.h"
#include "protocol/annotations.h"
#include "protocol/device_cordon.h"
#include "protocol/devices.h"
#include "protocol/node_register.h"
#include "scheduler/node_lock.h"
#include "spdlog/spdlog.h"

namespace dynmig::scheduler {
namespace {

using nlohmann::json;

std::string Str(const json& obj, std::initializer_list<const char*> path) {
  const json* cur = &obj;
  for (const char* key : path) {
    if (!cur->is_object()) return "";
    auto it = cur->find(key);
    if (it == cur->end()) return "";
    cur = &*it;
  }
  return cur->is_string() ? cur->get<std::string>() : "";
}

std::string Annotation(const json& obj, std::string_view key) {
  const auto meta = obj.find("metadata");
  if (meta == obj.end() || !meta->is_object()) return "";
  const auto ann = meta->find("annotations");
  if (ann == meta->end() || !ann->is_object()) return "";
  const auto it = ann->find(std::string(key));
  return (it != ann->end() && it->is_string()) ? it->get<std::string>() : "";
}

bool HasAnnotation(const json& obj, std::string_view key) {
  const auto meta = obj.find("metadata");
  if (meta == obj.end() || !meta->is_object()) return false;
  const auto ann = meta->find("annotations");
  return ann != meta->end() && ann->is_object() && ann->contains(std::string(key));
}

std::string CapabilityKey(const mig::GpuCapability& cap, const std::vector<std::string>& allowed) {
  std::string key = cap.model + "|" + std::to_string(cap.total_memory_mib) + "|" +
                    std::to_string(cap.placement_units);
  for (const auto& p : cap.profiles) {
    key += fmt::format("|{}:{}:{}:{}:{}:{}", p.name, p.memory_mib, p.SizingMib(), p.compute_slices,
                       p.instance_count, p.memory_slices);
    for (const auto& pl : p.placements) key += fmt::format(",{}", pl.start);
  }
  for (const auto& a : allowed) key += "#" + a;
  return key;
}

}  // namespace

void ClusterState::AddUnreadable(PodEntry& entry, std::string_view key, std::string_view value,
                                 const absl::Status& error) {
  if (!entry.unreadable.empty()) entry.unreadable += "; ";
  entry.unreadable += fmt::format("an unreadable {}: {}", key, std::string(error.message()));
  for (auto& uuid : protocol::GpuUuidsNamedIn(value)) {
    if (std::find(entry.unreadable_gpus.begin(), entry.unreadable_gpus.end(), uuid) ==
        entry.unreadable_gpus.end()) {
      entry.unreadable_gpus.push_back(std::move(uuid));
    }
  }
}

void ClusterState::ReadDeviceEvidence(const json& pod, PodEntry& entry) {
  for (std::string_view key :
       {protocol::kDevicesAllocatedAnnotation, protocol::kDevicesToAllocateAnnotation}) {
    if (!HasAnnotation(pod, key)) continue;
    const std::string value = Annotation(pod, key);
    auto devices = protocol::DecodePodDevices(value);
    if (!devices.ok()) {
      AddUnreadable(entry, key, value, devices.status());
      continue;
    }
    std::vector<std::string>& per_key = key == protocol::kDevicesAllocatedAnnotation
                                            ? entry.allocated_gpus
                                            : entry.to_allocate_gpus;
    for (const auto& ctr : *devices) {
      for (const auto& dev : ctr) {
        if (std::find(entry.device_gpus.begin(), entry.device_gpus.end(), dev.uuid) ==
            entry.device_gpus.end()) {
          entry.device_gpus.push_back(dev.uuid);
        }
        if (std::find(per_key.begin(), per_key.end(), dev.uuid) == per_key.end()) {
          per_key.push_back(dev.uuid);
        }
      }
    }
  }
}

std::optional<absl::Time> ParseHandshakeReported(const std::string& value) {
  constexpr std::string_view kPrefix = "Reported_";
  if (!value.starts_with(kPrefix)) return std::nullopt;
  const std::string rest = value.substr(kPrefix.size());
  absl::Time t;
  std::string err;
  if (absl::ParseTime(absl::RFC3339_full, rest, &t, &err)) return t;
  if (absl::ParseTime("%Y-%m-%d %H:%M:%S", rest, absl::UTCTimeZone(), &t, &err)) return t;
  return std::nullopt;
}

ClusterState::ClusterState(ClusterStateOptions options, const Clock* clock)
    : options_(std::move(options)),
      clock_(clock),
      tombstones_(clock != nullptr ? options_.report_timeout : absl::ZeroDuration()) {}

std::shared_ptr<const mig::GpuPlanner> ClusterState::PlannerFor(const protocol::DeviceInfo& info) {
  if (info.mode.find("mig") == std::string::npos || info.mig_profiles.empty()) return nullptr;
  const mig::AllowlistEntry* entry = options_.allowlist.Match(info.type);
  if (entry == nullptr) return nullptr;
  mig::GpuCapability cap = protocol::ToCapability(info);
  mig::ApplyMemoryMatch(cap, options_.memory_match);
  std::vector<std::string> allowed;
  for (const auto& p : cap.profiles) {
    if (std::find(entry->profiles.begin(), entry->profiles.end(), p.name) !=
        entry->profiles.end()) {
      allowed.push_back(p.name);
    }
  }
  if (allowed.empty()) return nullptr;
  const std::string key = CapabilityKey(cap, allowed);
  auto it = planners_.find(key);
  if (it != planners_.end()) return it->second;
  auto planner = mig::GpuPlanner::Create(std::move(cap), allowed);
  if (!planner.ok()) return nullptr;
  planners_.emplace(key, *planner);
  return *planner;
}

ClusterState::NodeEntry& ClusterState::NodeFor(const std::string& name) {
  auto [it, inserted] = nodes_.try_emplace(name);
  if (inserted) {
    it->second.name = name;
    index_[name] = &it->second;
    ++nodes_generation_;
    // A node that comes back finds the assumptions made on it before it went.
    for (const auto& [key, a] : assumed_) {
      if (a.reservation.node == name) it->second.assumed.insert(key);
    }
  }
  return it->second;
}

std::shared_ptr<const std::vector<ClusterState::NodeEntry*>> ClusterState::Resolve(
    const std::vector<std::string>& candidates) const {
  dynmig::MutexLock memo(&resolve_mu_);
  if (resolved_generation_ == nodes_generation_ && candidates == resolved_names_) {
    return resolved_entries_;
  }
  auto entries = std::make_shared<std::vector<NodeEntry*>>();
  entries->reserve(candidates.size());
  for (const auto& name : candidates) entries->push_back(FindNode(name));
  resolved_names_ = candidates;
  resolved_generation_ = nodes_generation_;
  resolved_entries_ = entries;
  return entries;
}

ClusterState::NodeEntry* ClusterState::FindNode(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

void ClusterState::MarkDirty(const std::string& node) {
  if (NodeEntry* entry = FindNode(node)) Touch(*entry);
}

void ClusterState::DropAssumed(std::map<std::string, AssumedEntry>::iterator it) {
  if (NodeEntry* entry = FindNode(it->second.reservation.node)) {
    entry->assumed.erase(it->first);
    Touch(*entry);
  }
  assumed_.erase(it);
}

void ClusterState::ReadModeSwitch(const json& node, NodeEntry& entry) {
  entry.mode_requests.clear();
  entry.mode_statuses.clear();
  entry.mode_error.clear();
  entry.mode_requests_unreadable = false;
  // A node whose device plugin publishes no dynmig.io/gpu-mode carries out no request (switching
  // is not configured there, or was turned off): a request left on it holds nothing.
  if (Annotation(node, protocol::kGpuModeStatusAnnotation).empty()) return;
  if (auto requests =
          protocol::DecodeGpuModeRequests(Annotation(node, protocol::kGpuModeRequestAnnotation));
      requests.ok()) {
    for (auto& r : *requests) entry.mode_requests[r.gpu_uuid] = std::move(r);
  } else {
    entry.mode_requests_unreadable = true;  // fails closed: every GPU held
    entry.mode_error = std::string(requests.status().message());
  }
  if (auto statuses =
          protocol::DecodeGpuModeStatuses(Annotation(node, protocol::kGpuModeStatusAnnotation));
      statuses.ok()) {
    for (auto& s : *statuses) entry.mode_statuses[s.gpu_uuid] = std::move(s);
  } else if (entry.mode_error.empty()) {
    entry.mode_error = std::string(statuses.status().message());
  }
}

void ClusterState::SwitchFault(const NodeEntry& node, const std::string& uuid, GpuReport& gr,
                               GpuFault& fault) {
  auto status = node.mode_statuses.find(uuid);
  if (status != node.mode_statuses.end()) {
    gr.mode_status = std::make_shared<const protocol::GpuModeStatus>(status->second);
  }
  if (node.mode_requests_unreadable) {
    fault.Set("switching", "held for a mode switch: unreadable " + node.mode_error);
    return;
  }
  auto request = node.mode_requests.find(uuid);
  if (request == node.mode_requests.end()) return;
  gr.mode_request = std::make_shared<const protocol::GpuModeRequest>(request->second);
  if (protocol::HeldForSwitch(request->second, gr.mode_status.get())) {
    fault.Set("switching", fmt::format("GPU {} is switching to {}", uuid,
                                       protocol::GpuModeName(request->second.to)));
  }
}

void ClusterState::UpsertNode(const json& node) {
  const std::string name = Str(node, {"metadata", "name"});
  if (name.empty()) return;
  dynmig::MutexLock lock(&mu_);
  NodeEntry& entry = NodeFor(name);
  Touch(entry);
  entry.locked_at.reset();
  if (const std::string held = Annotation(node, protocol::kNodeLockAnnotation); !held.empty()) {
    if (auto lock_value = protocol::ParseNodeLock(held); lock_value.ok())
      entry.locked_at = lock_value->time;
  }
  for (const auto& gpu : entry.gpus) Uncount(gpu.info.type);
  entry.gpus.clear();
  entry.whole.clear();
  entry.register_error.clear();
  entry.handshake = Annotation(node, protocol::kNodeHandshakeAnnotation);
  entry.reported_at = ParseHandshakeReported(entry.handshake);
  entry.cordoned.clear();
  entry.cordon_error.clear();
  entry.cordon_reasons.clear();
  if (auto cordon =
          protocol::ParseDeviceCordon(Annotation(node, protocol::kDeviceCordonAnnotation));
      cordon.ok()) {
    entry.cordoned = std::move(*cordon);
  } else {
    entry.cordon_error = std::string(cordon.status().message());  // fails closed: all cordoned
  }
  if (HasAnnotation(node, protocol::kDeviceCordonReasonsAnnotation)) {
    // Only words for people: an unreadable value is left out.
    auto reasons =
        protocol::ParseCordonReasons(Annotation(node, protocol::kDeviceCordonReasonsAnnotation));
    if (reasons.ok()) entry.cordon_reasons = std::move(*reasons);
  }
  ReadModeSwitch(node, entry);
  entry.held.clear();
  entry.held_error.clear();
  if (HasAnnotation(node, protocol::kNodeHeldSlicesAnnotation)) {
    auto held = protocol::DecodeHeldSlices(Annotation(node, protocol::kNodeHeldSlicesAnnotation));
    if (held.ok()) {
      entry.held = std::move(*held);
    } else {
      entry.held_error = std::string(held.status().message());
    }
  }
  if (clock_ != nullptr) tombstones_.Reported(name, entry.reported_at, entry.held, clock_->Now());
  std::erase_if(defrag_holds_, [&](const auto& h) { return h.second == name; });
  entry.defrag.clear();
  entry.defrag_error.clear();
  if (HasAnnotation(node, protocol::kNodeDefragReservationAnnotation)) {
    auto holds = protocol::DecodeDefragReservations(
        Annotation(node, protocol::kNodeDefragReservationAnnotation));
    if (holds.ok()) {
      entry.defrag = std::move(*holds);
      for (const auto& h : entry.defrag) defrag_holds_[h.pod] = name;
    } else {
      entry.defrag_error = std::string(holds.status().message());
    }
  }
  entry.idle.clear();
  entry.idle_error.clear();
  if (HasAnnotation(node, protocol::kNodeIdleInstancesAnnotation)) {
    auto idle =
        protocol::DecodeIdleInstances(Annotation(node, protocol::kNodeIdleInstancesAnnotation));
    if (idle.ok()) {
      entry.idle = std::move(*idle);
    } else {
      entry.idle_error = std::string(idle.status().message());
    }
  }
  const std::string value = Annotation(node, protocol::kNodeRegisterAnnotation);
  if (value.empty()) return;
  auto devices = protocol::DecodeNodeRegister(value);
  if (!devices.ok()) {
    entry.register_error = std::string(devices.status().message());
    return;
  }
  for (auto& info : *devices) {
    if (protocol::DeviceGpuMode(info) == protocol::GpuMode::kWholeGpu) {
      // A whole GPU: placed apart from the MIG GPUs (no MIG pod goes there, and the reverse).
      entry.whole.push_back(std::move(info));
      continue;
    }
    if (info.mode.find("mig") == std::string::npos || info.mig_profiles.empty()) continue;
    GpuEntry gpu;
    gpu.planner = PlannerFor(info);
    gpu.info = std::move(info);
    // The capability lives in the (shared) planner now; the profile list is not needed again.
    gpu.info.mig_profiles.clear();
    gpu.info.mig_profiles.shrink_to_fit();
    ++model_count_[gpu.info.type];
    entry.gpus.push_back(std::move(gpu));
  }
}

void ClusterState::Uncount(const std::string& model) {
  auto it = model_count_.find(model);
  if (it != model_count_.end() && --it->second <= 0) model_count_.erase(it);
}

std::vector<std::string> ClusterState::Models() const {
  dynmig::ReaderMutexLock lock(&mu_);
  std::vector<std::string> out;
  out.reserve(model_count_.size());
  for (const auto& [model, count] : model_count_) out.push_back(model);
  return out;
}

void ClusterState::RemoveNode(const std::string& name) {
  dynmig::MutexLock lock(&mu_);
  if (NodeEntry* entry = FindNode(name)) {
    for (const auto& gpu : entry->gpus) Uncount(gpu.info.type);
  }
  std::erase_if(defrag_holds_, [&](const auto& h) { return h.second == name; });
  tombstones_.ForgetNode(name);
  index_.erase(name);
  if (nodes_.erase(name) > 0) ++nodes_generation_;
}

void ClusterState::Unlink(const std::string& pod_key) {
  auto it = pods_.find(pod_key);
  if (it == pods_.end()) return;
  if (NodeEntry* node = FindNode(it->second.node)) {
    node->pods.erase(pod_key);
    Touch(*node);
  }
  pods_.erase(it);
}

void ClusterState::UpsertPod(const json& pod) {
  const std::string ns = Str(pod, {"metadata", "namespace"});
  const std::string name = Str(pod, {"metadata", "name"});
  const std::string key = ns + "/" + name;
  dynmig::MutexLock lock(&mu_);
  if (kube::IsTerminated(pod)) Bury(key);
  Unlink(key);
  if (kube::IsTerminated(pod)) {
    // A terminated pod releases its reservation; so does its assumption.
    released_.erase(key);
    if (auto a = assumed_.find(key); a != assumed_.end()) DropAssumed(a);
    return;
  }
  PodEntry entry;
  entry.key = key;
  entry.node = Annotation(pod, protocol::kVgpuNodeAnnotation);
  if (entry.node.empty()) entry.node = Str(pod, {"spec", "nodeName"});
  entry.mig = protocol::IsMigPod(pod, options_.resources);
  entry.whole = protocol::IsWholeGpuPod(pod, options_.resources);
  entry.has_annotation = HasAnnotation(pod, protocol::kMigAllocationsAnnotation);
  if (entry.has_annotation) {
    const std::string value = Annotation(pod, protocol::kMigAllocationsAnnotation);
    entry.allocations = protocol::DecodeMigAllocations(value);
    if (!entry.allocations.ok()) {
      AddUnreadable(entry, protocol::kMigAllocationsAnnotation, value, entry.allocations.status());
    }
  }
  ReadDeviceEvidence(pod, entry);
  const std::string t = Annotation(pod, protocol::kVgpuTimeAnnotation);
  if (!t.empty()) entry.reserved_at = std::atoll(t.c_str());
  // The pod's own annotation supersedes an assumption once it carries the reservation (a
  // whole-GPU pod's is its device list: it has no MIG allocations).
  const bool whole_reserved = entry.whole && !entry.has_annotation && !entry.allocated_gpus.empty();
  if (auto a = assumed_.find(key);
      a != assumed_.end() &&
      ((entry.has_annotation && entry.allocations.ok() && !entry.allocations->empty()) ||
       (whole_reserved && !entry.node.empty()))) {
    DropAssumed(a);
  }
  // A whole-GPU pod counts where dynmig's annotations say it holds devices.
  const bool whole_evidence =
      entry.whole && (!entry.device_gpus.empty() || !entry.unreadable.empty());
  if (entry.node.empty() || (!entry.mig && !entry.has_annotation && !whole_evidence)) {
    return;  // not ours to count
  }
  // A node that is not registered (yet) gets an entry: the pod counts when the node appears.
  NodeEntry& node = NodeFor(entry.node);
  node.pods.insert(key);
  Touch(node);
  pods_.emplace(key, std::move(entry));
}

void ClusterState::RemovePod(const std::string& ns, const std::string& name) {
  const std::string key = ns + "/" + name;
  dynmig::MutexLock lock(&mu_);
  Bury(key);
  Unlink(key);
  released_.erase(key);
  if (auto a = assumed_.find(key); a != assumed_.end()) DropAssumed(a);
}

void ClusterState::Bury(const std::string& pod_key) {
  if (clock_ == nullptr) return;
  auto it = pods_.find(pod_key);
  if (it == pods_.end() || !it->second.allocations.ok()) return;
  const NodeEntry* node = FindNode(it->second.node);
  if (node == nullptr) return;
  // Only slices of the node's registered GPUs, within their axis.
  std::vector<protocol::MigAllocation> realized;
  for (const auto& a : *it->second.allocations) {
    for (const auto& g : node->gpus) {
      if (g.info.id == a.gpu_uuid && g.planner != nullptr && a.runtime.has_value() &&
          a.placement.end() <= g.planner->units()) {
        realized.push_back(a);
      }
    }
  }
  tombstones_.Bury(node->name, pod_key, realized, clock_->Now());
}

void ClusterState::FailClosedOnEvidence(const NodeEntry& node, const PodEntry& pod,
                                        std::vector<GpuFault>& unhealthy) const {
  auto mark = [&](const std::string& uuid, std::string_view code, const std::string& why) {
    for (size_t g = 0; g < node.gpus.size(); ++g) {
      if (node.gpus[g].info.id != uuid) continue;
      unhealthy[g].Set(code, why);
      return true;
    }
    return false;
  };
  // An unreadable annotation is the reason on every GPU named (by its text or by the readable
  // device annotations); otherwise the devices held without a reservation are.
  bool marked = false;
  const bool unreadable = !pod.unreadable.empty();
  const std::string code = unreadable ? "unreadable-reservation" : "devices-without-reservation";
  const std::string why = unreadable ? fmt::format("pod {} has {}", pod.key, pod.unreadable)
                                     : fmt::format(
                                           "pod {} holds devices of this GPU without a MIG "
                                           "reservation (its {} or {} names it)",
                                           pod.key, protocol::kDevicesAllocatedAnnotation,
                                           protocol::kDevicesToAllocateAnnotation);
  for (const auto& uuid : pod.unreadable_gpus) marked = mark(uuid, code, why) || marked;
  for (const auto& uuid : pod.device_gpus) marked = mark(uuid, code, why) || marked;
  if (marked) return;
  if (!pod.unreadable.empty()) {
    // Only dynmig writes these annotations, so an unreadable one means something of this node is
    // reserved or allocated, and nothing says which GPU: the whole node fails closed.
    const std::string all =
        fmt::format("pod {} has {}, naming none of this node's GPUs", pod.key, pod.unreadable);
    for (auto& u : unhealthy) u.Set("unreadable-reservation", all);
    return;
  }
  // No evidence: the pod asks for GPUs (or says mig) but holds none of this node's devices
  // according to anything dynmig wrote. What its owner may write alone never blocks a GPU.
  spdlog::debug("pod {} on {} holds no MIG reservation and no dynmig device annotation: ignored",
                pod.key, node.name);
}

// What Rebuild gathers of one node before it writes the view: per GPU the reservations counted
// there, why it is unschedulable (if so), and the slices the node holds without a reservation.
struct ClusterState::RebuildState {
  const NodeEntry& node;
  NodeReport& report;
  std::vector<std::vector<mig::Reservation>> reserved;
  std::vector<GpuFault> unhealthy;
  std::vector<mig::SliceMask> held_mask;
  std::vector<std::vector<int>> held_profiles;
  // Active defragmentation reservations: per GPU their slices and profiles, and (index into
  // report.defrag, GPU) of each.
  std::vector<mig::SliceMask> hold_mask;
  std::vector<std::vector<int>> hold_profiles;
  std::vector<std::pair<size_t, size_t>> holds;
  absl::Time next_expiry = absl::InfiniteFuture();

  RebuildState(const NodeEntry& n, NodeReport& r)
      : node(n),
        report(r),
        reserved(n.gpus.size()),
        unhealthy(n.gpus.size()),
        held_mask(n.gpus.size(), 0),
        held_profiles(n.gpus.size()),
        hold_mask(n.gpus.size(), 0),
        hold_profiles(n.gpus.size()) {
    report.gpus.resize(n.gpus.size());
  }
  int GpuIndex(const std::string& uuid) const {
    for (size_t i = 0; i < node.gpus.size(); ++i) {
      if (node.gpus[i].info.id == uuid) return static_cast<int>(i);
    }
    return -1;
  }
  void FailAll(std::string_view code, const std::string& why) {
    for (auto& u : unhealthy) u.Set(code, why);
  }
  // The pod's reservations, each on its GPU (one on a GPU the node lacks fails the node).
  void Add(const std::string& pod, const std::vector<protocol::MigAllocation>& allocs,
           bool assumed) {
    for (const auto& a : allocs) {
      const int g = GpuIndex(a.gpu_uuid);
      if (g < 0) {
        FailAll("unregistered-gpu",
                fmt::format("pod {} holds a reservation on {}, which this node does not register",
                            pod, a.gpu_uuid));
        continue;
      }
      reserved[g].push_back({a.profile, a.placement, pod});
      report.gpus[g].reservations.push_back({pod, a.profile, a.placement, assumed, a.runtime});
    }
  }
};

void ClusterState::CollectReservations(RebuildState& st) const {
  const NodeEntry& node = st.node;
  for (const auto& key : node.pods) {
    auto it = pods_.find(key);
    if (it == pods_.end()) continue;
    const PodEntry& pod = it->second;
    if (assumed_.count(key)) continue;  // counted below from the assumption
    if (pod.has_annotation && pod.allocations.ok() && !pod.allocations->empty()) {
      if (released_.count(key)) {
        std::vector<protocol::MigAllocation> realized;
        for (const auto& a : *pod.allocations) {
          if (a.runtime.has_value()) realized.push_back(a);
        }
        st.Add(key, realized, false);
      } else {
        st.Add(key, *pod.allocations, false);
      }
      continue;
    }
    if (pod.whole && NamesWholeGpu(node, pod)) continue;  // CollectWholeGpus counts it
    FailClosedOnEvidence(node, pod, st.unhealthy);
  }
  for (const auto& key : node.assumed) {
    if (auto a = assumed_.find(key); a != assumed_.end()) {
      st.Add(key, a->second.reservation.allocations, true);
    }
  }
}

void ClusterState::CollectHeldSlices(RebuildState& st) {
  const NodeEntry& node = st.node;
  // Slices the node's live instances hold without an active reservation: occupied as well.
  if (!node.held_error.empty()) {
    st.FailAll(
        "unreadable-held-slices",
        fmt::format("unreadable {}: {}", protocol::kNodeHeldSlicesAnnotation, node.held_error));
  }
  for (const auto& h : node.held) {
    const int g = st.GpuIndex(h.gpu_uuid);
    if (g < 0 || node.gpus[g].planner == nullptr) continue;
    const mig::GpuPlanner& planner = *node.gpus[g].planner;
    if (h.placement.end() > planner.units()) {
      st.unhealthy[g].Set("held-slices-beyond-gpu",
                          fmt::format("{} names slices {} beyond the GPU's {} units",
                                      protocol::kNodeHeldSlicesAnnotation, h.placement.ToString(),
                                      planner.units()));
      continue;
    }
    st.held_mask[g] |= h.placement.Mask();
    st.held_profiles[g].push_back(h.profile.empty() ? -1 : planner.ProfileIndex(h.profile));
    st.report.gpus[g].reservations.push_back({"(held by the node)",
                                              h.profile.empty() ? "held" : h.profile, h.placement,
                                              false, std::nullopt});
  }
}

void ClusterState::CollectTombstones(RebuildState& st, absl::Time now) const {
  const NodeEntry& node = st.node;
  for (const auto& t : tombstones_.Alive(node.name, now)) {
    const int g = st.GpuIndex(t.gpu_uuid);
    if (g < 0 || node.gpus[g].planner == nullptr) continue;
    const mig::GpuPlanner& planner = *node.gpus[g].planner;
    if (t.placement.end() > planner.units()) continue;
    st.held_mask[g] |= t.placement.Mask();
    st.held_profiles[g].push_back(planner.ProfileIndex(t.profile));
    st.report.gpus[g].reservations.push_back(
        {fmt::format("(left by {}, until the node reports)", t.pod), t.profile, t.placement, false,
         std::nullopt});
  }
  st.next_expiry = std::min(st.next_expiry, tombstones_.NextExpiry(node.name, now));
}

void ClusterState::CollectDefragHolds(RebuildState& st, absl::Time now) const {
  const NodeEntry& node = st.node;
  if (!node.defrag_error.empty()) {
    st.FailAll("unreadable-defrag-reservation",
               fmt::format("unreadable {}: {}", protocol::kNodeDefragReservationAnnotation,
                           node.defrag_error));
    st.report.defrag_error = node.defrag_error;
  }
  for (const auto& r : node.defrag) {
    NodeReport::DefragHold h{r, false, false};
    bool own = node.assumed.count(r.pod) > 0;
    if (auto p = pods_.find(r.pod); !own && p != pods_.end() && node.pods.count(r.pod)) {
      own =
          p->second.has_annotation && p->second.allocations.ok() && !p->second.allocations->empty();
    }
    const absl::Time expires = absl::FromUnixSeconds(r.expires);
    h.active = !own && now < expires;
    const int g = st.GpuIndex(r.gpu_uuid);
    if (h.active && g >= 0 && node.gpus[g].planner != nullptr &&
        r.placement.end() <= node.gpus[g].planner->units()) {
      st.next_expiry = std::min(st.next_expiry, expires);
      st.hold_mask[g] |= r.placement.Mask();
      st.hold_profiles[g].push_back(node.gpus[g].planner->ProfileIndex(r.profile));
      st.holds.emplace_back(st.report.defrag.size(), static_cast<size_t>(g));
      st.report.gpus[g].reservations.push_back(
          {"(defrag reservation for " + r.pod + ")", r.profile, r.placement, false, std::nullopt});
    } else {
      h.active = false;
    }
    st.report.defrag.push_back(std::move(h));
  }
}

mig::GpuView ClusterState::BuildGpuView(RebuildState& st, size_t i) {
  const NodeEntry& node = st.node;
  const GpuEntry& gpu = node.gpus[i];
  GpuFault& fault = st.unhealthy[i];
  mig::GpuView gv;
  gv.uuid = gpu.info.id;
  gv.index = gpu.info.index;
  gv.model = gpu.info.type;
  gv.mode = gpu.info.mode;
  gv.planner = gpu.planner;
  GpuReport& gr = st.report.gpus[i];
  gr.uuid = gv.uuid;
  gr.index = gv.index;
  gr.model = gv.model;
  gr.allowlisted = gpu.planner != nullptr;
  if (gpu.planner != nullptr) {
    gr.units = gpu.planner->units();
    for (uint32_t idx : gpu.planner->allowed()) {
      gr.allowed_profiles.push_back(gpu.planner->capability().profiles[idx].name);
    }
  }
  if (!gpu.info.health)
    fault = {"device-unhealthy", "the device plugin reports this GPU unhealthy"};
  if (!node.cordon_error.empty()) {
    fault = {"cordoned", "cordoned: unreadable " + node.cordon_error};
  } else if (node.cordoned.count(gv.uuid)) {
    auto why = node.cordon_reasons.find(gv.uuid);
    fault = {"cordoned", why == node.cordon_reasons.end()
                             ? std::string("cordoned (hami.io/device-cordon)")
                             : fmt::format("cordoned (hami.io/device-cordon): {}", why->second)};
  }
  SwitchFault(node, gv.uuid, gr, fault);
  if (gpu.planner != nullptr && fault.empty()) {
    auto usage = gpu.planner->UsageOf(st.reserved[i]);
    if (usage.ok()) {
      gv.usage = *usage;
      gv.usage.occupied |= st.held_mask[i];
      for (int idx : st.held_profiles[i]) {
        if (idx >= 0 && static_cast<size_t>(idx) < gv.usage.counts.size()) ++gv.usage.counts[idx];
      }
      // Defragmentation reservations: blocked while anything else still overlaps them.
      for (const auto& [h, g] : st.holds) {
        if (g != i) continue;
        auto& hold = st.report.defrag[h];
        hold.blocked = (gv.usage.occupied & hold.reservation.placement.Mask()) != 0;
      }
      gv.usage.occupied |= st.hold_mask[i];
      for (int idx : st.hold_profiles[i]) {
        if (idx >= 0 && static_cast<size_t>(idx) < gv.usage.counts.size()) ++gv.usage.counts[idx];
      }
    } else {
      fault = {"conflicting-reservations",
               "conflicting reservations: " + std::string(usage.status().message())};
    }
  }
  if (!fault.empty()) {
    gv.healthy = false;
    gv.unhealthy_reason = fault.reason;
    gr.healthy = false;
    gr.unhealthy_reason = std::move(fault.reason);
    gr.unhealthy_code = std::move(fault.code);
  }
  if (gpu.planner != nullptr && gv.healthy) AddIdleInstances(node, gv, gr);
  return gv;
}

void ClusterState::AddIdleInstances(const NodeEntry& node, mig::GpuView& gv, GpuReport& gr) {
  // Idle (warm) instances on slices nothing reserves or holds: preferred placements. One that a
  // reservation overlaps is destroyed by the device plugin when that pod is allocated.
  const mig::GpuPlanner& planner = *gv.planner;
  for (const auto& idle : node.idle) {
    if (idle.gpu_uuid != gv.uuid) continue;
    const int idx = planner.ProfileIndex(idle.profile);
    if (idx < 0 || !planner.IsAllowed(static_cast<uint32_t>(idx)) ||
        !planner.capability().profiles[idx].IsLegal(idle.placement) ||
        (idle.placement.Mask() & gv.usage.occupied) != 0) {
      continue;
    }
    gv.idle.push_back({static_cast<uint32_t>(idx), idle.placement});
    gr.idle.push_back({idle.profile, idle.placement, idle.idle_since});
  }
}

void ClusterState::Rebuild(NodeEntry& node, absl::Time now) const {
  mig::NodeView& view = node.view;
  view = mig::NodeView{};
  node.report = NodeReport{};
  view.name = node.report.name = node.name;
  if (!node.register_error.empty()) {
    view.healthy = false;
    view.unhealthy_reason = "unreadable hami.io/node-nvidia-register: " + node.register_error;
  }
  RebuildState st(node, node.report);
  CollectReservations(st);
  CollectHeldSlices(st);
  CollectTombstones(st, now);
  CollectDefragHolds(st, now);
  node.next_defrag_expiry = st.next_expiry;
  view.gpus.reserve(node.gpus.size());
  for (size_t i = 0; i < node.gpus.size(); ++i) view.gpus.push_back(BuildGpuView(st, i));
  CollectWholeGpus(node, node.report);
  node.summary = mig::Summarize(view);
  node.dirty = false;
}

namespace {

// The node-level health from the device plugin's reports alone (the register error is handled
// by Rebuild): nullopt when healthy, else the reason.
std::optional<std::string> ReportHealth(const std::string& handshake,
                                        const std::optional<absl::Time>& reported_at,
                                        absl::Duration timeout, absl::Time now, bool explain) {
  if (handshake.empty()) return std::nullopt;
  if (handshake == "Deleted" || handshake.starts_with("Deleted_")) {
    return std::string("the device plugin deregistered (hami.io/node-handshake Deleted)");
  }
  if (reported_at.has_value() && now - *reported_at > timeout) {
    // Stated as a time, not an age: the text stays the same while the node stays stale.
    if (!explain) return std::string();
    return fmt::format("the device plugin stopped reporting: last report at {} (more than {} ago)",
                       absl::FormatTime(absl::RFC3339_sec, *reported_at, absl::UTCTimeZone()),
                       absl::FormatDuration(timeout));
  }
  return std::nullopt;
}

}  // namespace

bool ClusterState::Stale(const NodeEntry& node, absl::Time now) const {
  // Every filter asks this of every candidate: three fields, no string read.
  return node.dirty || now >= node.stale_at || now < node.viewed_at;
}

const mig::NodeView& ClusterState::ViewOf(NodeEntry& node, absl::Time now) const {
  if (!node.dirty && !Stale(node, now)) return node.view;
  // Defragmentation reservations expire with time alone (and come back when the clock is set
  // back): rebuilt then too.
  if (node.dirty || now >= node.next_defrag_expiry ||
      (!node.defrag.empty() && now < node.viewed_at)) {
    Rebuild(node, now);
  }
  // Health from the last report and the bind lock change with time alone: decided here, and
  // every reader checks them (Stale) before it trusts the cached view.
  std::string reason, code;
  bool healthy = true;
  if (!node.register_error.empty()) {
    healthy = false;
    code = "unreadable-register";
    reason = "unreadable hami.io/node-nvidia-register: " + node.register_error;
  } else if (auto why = ReportHealth(node.handshake, node.reported_at, options_.report_timeout, now,
                                     true)) {
    healthy = false;
    code = node.handshake.starts_with("Deleted") ? "deregistered" : "stopped-reporting";
    reason = std::move(*why);
  }
  node.view.healthy = node.report.healthy = healthy;
  node.view.unhealthy_reason = reason;
  node.report.unhealthy_reason = std::move(reason);
  node.report.unhealthy_code = std::move(code);
  node.view.bind_in_flight =
      node.locked_at.has_value() && now - *node.locked_at < kDefaultNodeLockExpiry;
  node.report.locked_at = node.locked_at;
  node.report.mode_error = node.mode_error;
  // The next instant at which time alone flips either: a report older than the timeout makes
  // the node unhealthy (strictly after reported_at + timeout); the lock expires at locked_at +
  // expiry. An instant already past changes nothing more; a clock set back (now < viewed_at)
  // makes the view stale too.
  node.viewed_at = now;
  node.stale_at = absl::InfiniteFuture();
  if (healthy && node.reported_at.has_value()) {
    const absl::Time t = *node.reported_at + options_.report_timeout + absl::Nanoseconds(1);
    if (t > now) node.stale_at = std::min(node.stale_at, t);
  }
  if (node.view.bind_in_flight) {
    node.stale_at = std::min(node.stale_at, *node.locked_at + kDefaultNodeLockExpiry);
  }
  node.stale_at = std::min(node.stale_at, node.next_defrag_expiry);
  ++node.version;
  // What a waiting pod could use now, against the last view's (FreedSince).
  Occupancy occ;
  occ.healthy = node.report.healthy;
  for (const auto& h : node.report.defrag) occ.blocked_holds += h.blocked ? 1 : 0;
  occ.gpus.reserve(node.report.gpus.size());
  for (const auto& g : node.report.gpus) {
    Occupancy::Gpu og{g.uuid, g.healthy && g.allowlisted, 0};
    for (const auto& r : g.reservations) og.occupied |= r.placement.Mask();
    occ.gpus.push_back(std::move(og));
  }
  for (const auto& w : node.report.whole_gpus) {
    occ.gpus.push_back({w.uuid, w.healthy, w.holder.empty() ? mig::SliceMask{0} : 1, true});
  }
  if (node.occupancy_seen ? CapacityGrew(node.occupancy, occ) : occ.healthy) {
    node.freed_seq = ++freed_counter_;
  }
  node.occupancy = std::move(occ);
  node.occupancy_seen = true;
  return node.view;
}

void ClusterState::CachePlans(const Planned& p) {
  const std::vector<NodeEntry*>& entries = *p.entries;
  for (uint32_t i : p.fresh) {
    NodeEntry* e = entries[i];
    if (e == nullptr || e->version != p.versions[i]) continue;
    CachedPlan* slot = nullptr;
    for (auto& c : e->plans) {
      if (c.request == p.request_key) slot = &c;
    }
    if (slot == nullptr) {
      slot = &e->plans[e->next_plan_slot];
      e->next_plan_slot = (e->next_plan_slot + 1) % kCachedShapes;
      slot->request = p.request_key;
    }
    slot->version = p.versions[i];
    // Verdict and scores only, as PlanPod's verdict-only plans were: the reasons a pass wrote (per
    // GPU texts, while no node fitted) would be copied by every later filter that reuses the plan,
    // and Explain writes them again (the same text) for the few losers a decision reports.
    const mig::NodePlan& plan = p.session->plan(i);
    slot->plan.verdict = plan.verdict;
    slot->plan.assignments.clear();  // the node changes when a pod is reserved there
    slot->plan.gpus.clear();
    slot->plan.used_fraction = plan.used_fraction;
    slot->plan.score = plan.score;
    slot->plan.leftover = plan.leftover;
    slot->plan.bind_in_flight = plan.bind_in_flight;
    slot->plan.idle_reused = plan.idle_reused;
    slot->plan.reason.clear();
    slot->plan.gpu_plans = plan.gpu_plans;
    slot->plan.explained = false;
  }
}

void ClusterState::PlanCandidates(Planned& out, const std::vector<std::string>& candidates) const {
  const std::vector<NodeEntry*>& entries = *out.entries;
  mig::PlanSession& session = *out.session;
  const mig::RequestSummary& shape = session.shape();
  for (size_t i = 0; i < entries.size(); ++i) {
    const NodeEntry* e = entries[i];
    if (e == nullptr) {
      out.decision.failed[candidates[i]] = "no-mig-gpu: the node registers no GPU with dynmig";
      session.Skip(i, nullptr);
      continue;
    }
    out.versions[i] = e->version;
    if (!mig::MayFit(e->summary, shape)) {
      session.Skip(i, &e->view);  // ruled out by its summary, no per-GPU search
      continue;
    }
    const CachedPlan* cached = nullptr;
    for (const auto& c : e->plans) {
      if (c.version == e->version && c.request == out.request_key) cached = &c;
    }
    if (cached != nullptr) {
      session.Reuse(i, e->view, cached->plan);
      continue;
    }
    session.Plan(i, e->view);
    out.fresh.push_back(static_cast<uint32_t>(i));
  }
}

void ClusterState::ExplainLosers(Planned& out) const {
  const std::vector<NodeEntry*>& entries = *out.entries;
  mig::PlanSession& session = *out.session;
  const mig::RequestSummary& shape = session.shape();
  FilterDecision& decision = out.decision;
  if (session.chosen() >= 0) {
    // A node was chosen: only the nodes that can never run the pod get an entry.
    for (size_t i = 0; i < entries.size(); ++i) {
      const NodeEntry* e = entries[i];
      const mig::NodePlan& plan = session.plan(i);
      if (e == nullptr || plan.fits()) continue;
      const bool planned = mig::MayFit(e->summary, shape);
      if (planned ? !mig::NeverFits(plan.verdict) : mig::MayEverFit(e->summary, shape)) continue;
      auto [verdict, reason] = session.Explain(i);
      if (mig::NeverFits(verdict)) decision.failed[e->name] = std::move(reason);
    }
    return;
  }
  // Nothing fits: every candidate gets its reason (they make the pod's Pending message).
  decision.verdict = mig::Verdict::kNodeUnhealthy;
  bool any = false;
  for (size_t i = 0; i < entries.size(); ++i) {
    const NodeEntry* e = entries[i];
    if (e == nullptr) continue;
    any = true;
    auto [verdict, reason] = session.Explain(i);
    decision.failed[e->name] = std::move(reason);
    if (static_cast<int>(verdict) < static_cast<int>(decision.verdict)) decision.verdict = verdict;
  }
  if (!any) decision.verdict = mig::Verdict::kNoMigGpu;
}

ClusterState::Planned ClusterState::PlanLocked(
    std::shared_ptr<const std::vector<NodeEntry*>> entries_ptr,
    const std::vector<std::string>& candidates, const mig::PodRequest& request) const {
  Planned out;
  out.entries = std::move(entries_ptr);
  out.generation = nodes_generation_;
  const size_t n = out.entries->size();
  out.versions.resize(n);
  out.request_key = mig::PlanKey(request);
  // One pass: verdicts, the winner with its assignments, and the reasons written on the way.
  out.session.emplace(request, n, mig::PlanSession::Reasons::kForLosers);
  PlanCandidates(out, candidates);
  out.session->Winner();
  ExplainLosers(out);
  return out;
}

bool ClusterState::Repair(Planned& p, absl::Time now) {
  if (nodes_generation_ != p.generation) return false;
  const std::vector<NodeEntry*>& entries = *p.entries;
  mig::PlanSession& session = *p.session;
  const mig::RequestSummary& shape = session.shape();
  bool changed = false;
  for (size_t i = 0; i < entries.size(); ++i) {
    NodeEntry* e = entries[i];
    if (e == nullptr || (e->version == p.versions[i] && !Stale(*e, now))) continue;
    // Changed since the pass (another filter reserved there, a pod ended, its plugin reported):
    // plan this node again on its current state.
    changed = true;
    ViewOf(*e, now);
    p.versions[i] = e->version;
    p.decision.failed.erase(e->name);
    if (!mig::MayFit(e->summary, shape)) {
      session.Skip(i, &e->view);
      if (!mig::MayEverFit(e->summary, shape)) {
        auto [verdict, reason] = session.Explain(i);
        if (mig::NeverFits(verdict)) p.decision.failed[e->name] = std::move(reason);
      }
      continue;
    }
    const mig::NodePlan& plan = session.Replan(i, e->view);
    p.fresh.push_back(static_cast<uint32_t>(i));
    if (!plan.fits() && mig::NeverFits(plan.verdict)) {
      p.decision.failed[e->name] = session.Explain(i).second;
    }
  }
  if (!changed) return true;
  session.Choose();                        // the first best in candidate order, as the pass chose
  if (session.chosen() < 0) return false;  // nothing fits any more: plan afresh for the reasons
  session.Winner();
  return true;
}

Reservation ClusterState::MakeReservation(const std::string& node_name, const mig::NodeView& node,
                                          const mig::NodePlan& plan,
                                          const mig::PodRequest& request) {
  Reservation r;
  r.node = node_name;
  r.devices.resize(request.containers.size());
  std::vector<std::string> parts;
  for (const auto& a : plan.assignments) {
    const mig::GpuView& gpu = node.gpus[a.gpu];
    const auto& cap = gpu.planner->capability();
    const auto& spec = cap.profiles[a.profile_index];
    protocol::MigAllocation alloc;
    alloc.container_index = static_cast<int>(a.container);
    alloc.device_index = static_cast<int>(a.device_index);
    alloc.gpu_uuid = gpu.uuid;
    alloc.profile = spec.name;
    alloc.placement = a.placement;
    r.allocations.push_back(std::move(alloc));
    r.devices[a.container].push_back({gpu.uuid, gpu.model.empty() ? "NVIDIA" : gpu.model,
                                      static_cast<int32_t>(spec.memory_mib),
                                      static_cast<int32_t>(protocol::ProfileCore(cap, spec))});
    // The profile's real memory next to what was asked (nominal sizing may give a little less).
    const auto& ctr = request.containers[a.container];
    parts.push_back(fmt::format("{} ({} MiB in NVML for {} MiB asked) at slices {} of {}",
                                spec.name, spec.memory_mib,
                                mig::ResolveMemory(ctr.memory.mib, ctr.memory.percent, cap),
                                a.placement.ToString(), gpu.uuid));
  }
  r.summary = fmt::format("{} on {}", fmt::join(parts, ", "), r.node);
  return r;
}

void ClusterState::Finish(Planned& p, const mig::PodRequest& request) const {
  const NodeEntry& chosen = *(*p.entries)[p.session->chosen()];
  p.decision.verdict = mig::Verdict::kFits;
  p.decision.reservation = MakeReservation(chosen.name, chosen.view, *p.session->Winner(), request);
}

std::optional<FilterDecision> ClusterState::ReserveInDefragHold(
    const std::string& pod_key, const mig::PodRequest& request,
    const std::vector<std::string>& candidates, absl::Time now, const std::string& pod_uid) {
  auto where = defrag_holds_.find(pod_key);
  if (where == defrag_holds_.end() || assumed_.count(pod_key)) return std::nullopt;
  NodeEntry* node = FindNode(where->second);
  if (node == nullptr) return std::nullopt;
  if (!candidates.empty() &&
      std::find(candidates.begin(), candidates.end(), node->name) == candidates.end()) {
    return std::nullopt;
  }
  const mig::NodeView& view = ViewOf(*node, now);
  if (!view.healthy) return std::nullopt;
  const NodeReport::DefragHold* hold = nullptr;
  for (const auto& h : node->report.defrag) {
    if (h.reservation.pod != pod_key || !h.active || h.blocked) continue;
    if (!h.reservation.pod_uid.empty() && !pod_uid.empty() && h.reservation.pod_uid != pod_uid) {
      continue;
    }
    hold = &h;
  }
  if (hold == nullptr) return std::nullopt;
  // The node with only the reserved slices free: the planner decides whether the request fits.
  mig::NodeView only = view;
  bool found = false;
  for (auto& g : only.gpus) {
    if (g.uuid != hold->reservation.gpu_uuid || g.planner == nullptr || !g.healthy) {
      g.healthy = false;
      g.unhealthy_reason = "not the GPU of the defragmentation reservation";
      continue;
    }
    found = true;
    const mig::SliceMask mask = hold->reservation.placement.Mask();
    g.usage.occupied = mig::FullMask(g.planner->units()) & ~mask;
    const int idx = g.planner->ProfileIndex(hold->reservation.profile);
    if (idx >= 0 && static_cast<size_t>(idx) < g.usage.counts.size() && g.usage.counts[idx] > 0) {
      --g.usage.counts[idx];
    }
    g.idle.clear();
  }
  if (!found) return std::nullopt;
  const mig::NodePlan plan = mig::PlanPodOnNode(only, request);
  if (!plan.fits()) return std::nullopt;
  FilterDecision decision;
  decision.reservation = MakeReservation(node->name, only, plan, request);
  decision.reservation->summary += " (slices reserved by defragmentation)";
  assumed_[pod_key] = {*decision.reservation, absl::ToUnixSeconds(now), pod_uid, false};
  node->assumed.insert(pod_key);
  Touch(*node);
  ViewOf(*node, now);
  return decision;
}

std::optional<std::string> ClusterState::DefragHoldNode(const std::string& pod_key) const {
  dynmig::ReaderMutexLock lock(&mu_);
  auto it = defrag_holds_.find(pod_key);
  if (it == defrag_holds_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<FilterDecision> ClusterState::PlanAndReserve(
    const std::string& pod_key, const mig::PodRequest& request,
    const std::vector<std::string>& candidates, absl::Time now, const std::string& pod_uid) {
  auto already = [&] {
    return absl::InvalidArgumentError(
        fmt::format("pod {} already holds a reservation made by this scheduler", pod_key));
  };
  // The candidates' entries (every node when there are none).
  auto entries_of = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    if (!candidates.empty()) return Resolve(candidates);
    auto all = std::make_shared<std::vector<NodeEntry*>>();
    all->reserve(nodes_.size());
    for (auto& [name, n] : nodes_) all->push_back(&n);
    return std::shared_ptr<const std::vector<NodeEntry*>>(std::move(all));
  };
  auto commit = [&](Planned& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    CachePlans(p);
    Finish(p, request);
    NodeEntry& chosen = *(*p.entries)[p.session->chosen()];
    assumed_[pod_key] = {*p.decision.reservation, absl::ToUnixSeconds(now), pod_uid, false};
    chosen.assumed.insert(pod_key);
    Touch(chosen);
    ViewOf(chosen, now);  // rebuilt now, so the next filter finds every node up to date
    return std::move(p.decision);
  };
  // A pod with a defragmentation reservation goes there first, once nothing else overlaps it.
  {
    bool has_hold = false;
    {
      dynmig::ReaderMutexLock lock(&mu_);
      has_hold = defrag_holds_.count(pod_key) > 0;
    }
    if (has_hold) {
      dynmig::MutexLock lock(&mu_);
      if (auto d = ReserveInDefragHold(pod_key, request, candidates, now, pod_uid)) return *d;
    }
  }
  // Optimistic: plan under the shared lock (filters plan in parallel), then, under the exclusive
  // lock, re-plan only the nodes that changed meanwhile and record the choice. After a few lost
  // races the whole decision runs under the exclusive lock, so a filter always finishes.
  constexpr int kOptimisticAttempts = 8;
  for (int attempt = 0;; ++attempt) {
    if (attempt >= kOptimisticAttempts) {
      dynmig::MutexLock lock(&mu_);
      if (assumed_.count(pod_key)) return already();
      auto entries = entries_of();
      for (NodeEntry* n : *entries) {
        if (n != nullptr) ViewOf(*n, now);
      }
      Planned p = PlanLocked(std::move(entries), candidates, request);
      if (p.session->chosen() < 0) return std::move(p.decision);
      return commit(p);
    }
    Planned p;
    bool stale = false;
    {
      dynmig::ReaderMutexLock lock(&mu_);
      if (assumed_.count(pod_key)) return already();
      auto entries = entries_of();
      for (NodeEntry* n : *entries) {
        if (n != nullptr && Stale(*n, now)) {
          stale = true;
          break;
        }
      }
      if (!stale) {
        p = PlanLocked(std::move(entries), candidates, request);
        if (p.session->chosen() < 0) return std::move(p.decision);
      }
    }
    dynmig::MutexLock lock(&mu_);
    if (stale) {
      // Bring the changed nodes up to date (usually none: a reservation rebuilds its node at
      // once), then plan again under the shared lock.
      const auto entries = entries_of();  // held: a range over a temporary's target dangles
      for (NodeEntry* n : *entries) {
        if (n != nullptr) ViewOf(*n, now);
      }
      continue;
    }
    if (assumed_.count(pod_key)) return already();
    if (Repair(p, now)) return commit(p);
  }
}

std::optional<ClusterState::AssumedInfo> ClusterState::Assumed(const std::string& pod_key) const {
  dynmig::ReaderMutexLock lock(&mu_);
  auto it = assumed_.find(pod_key);
  if (it == assumed_.end()) return std::nullopt;
  return AssumedInfo{.reservation = it->second.reservation,
                     .binding = it->second.binding,
                     .uid = it->second.uid,
                     .made = absl::FromUnixSeconds(it->second.reserved_at)};
}

absl::StatusOr<Reservation> ClusterState::ClaimForBind(const std::string& pod_key,
                                                       const std::string& pod_uid,
                                                       const std::string& node, absl::Time now) {
  dynmig::MutexLock lock(&mu_);
  auto it = assumed_.find(pod_key);
  if (it == assumed_.end()) {
    return absl::NotFoundError(
        fmt::format("this scheduler holds no MIG reservation for pod {}", pod_key));
  }
  AssumedEntry& a = it->second;
  if (!pod_uid.empty() && !a.uid.empty() && a.uid != pod_uid) {
    // Made for an earlier pod of that name.
    DropAssumed(it);
    return absl::NotFoundError(fmt::format(
        "the MIG reservation held for pod {} belonged to uid {}, not {}", pod_key, a.uid, pod_uid));
  }
  if (a.reservation.node != node) {
    return absl::FailedPreconditionError(
        fmt::format("the pod's MIG reservation is on node {}, not {}", a.reservation.node, node));
  }
  a.binding = true;
  a.reserved_at = absl::ToUnixSeconds(now);
  return a.reservation;
}

void ClusterState::EndBind(const std::string& pod_key) {
  dynmig::MutexLock lock(&mu_);
  if (auto it = assumed_.find(pod_key); it != assumed_.end()) it->second.binding = false;
}

void ClusterState::Forget(const std::string& pod_key) {
  dynmig::MutexLock lock(&mu_);
  auto it = assumed_.find(pod_key);
  if (it == assumed_.end()) return;
  DropAssumed(it);
}

std::vector<NodeReport> ClusterState::Report(absl::Time now) const {
  dynmig::MutexLock lock(&mu_);
  std::vector<NodeReport> out;
  for (auto& [name, n] : nodes_) {
    ViewOf(n, now);
    out.push_back(n.report);
  }
  return out;
}

std::vector<std::string> ClusterState::FreedSince(uint64_t* seq, absl::Time now) const {
  dynmig::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (auto& [name, n] : nodes_) {
    ViewOf(n, now);  // rebuilds only what is dirty or stale
    if (n.freed_seq > *seq) out.push_back(name);
  }
  *seq = freed_counter_;
  return out;
}

bool CapacityGrew(const ClusterState::Occupancy& before, const ClusterState::Occupancy& after) {
  if (!after.healthy) return false;  // nothing can be placed there now
  if (!before.healthy) return true;
  if (after.blocked_holds < before.blocked_holds) return true;
  for (const auto& g : after.gpus) {
    if (!g.schedulable) continue;
    const ClusterState::Occupancy::Gpu* old = nullptr;
    for (const auto& b : before.gpus) {
      if (b.uuid == g.uuid && b.whole == g.whole) {
        old = &b;
        break;
      }
    }
    if (old == nullptr || !old->schedulable) return true;  // a GPU appeared or became usable
    if ((old->occupied & ~g.occupied) != 0) return true;   // a slice it occupied is free now
  }
  return false;
}

std::optional<mig::NodeView> ClusterState::View(const std::string& node, absl::Time now) const {
  dynmig::MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return std::nullopt;
  return ViewOf(it->second, now);
}

std::vector<std::string> ClusterState::UnrealizedBefore(absl::Time deadline) const {
  dynmig::ReaderMutexLock lock(&mu_);
  const int64_t cutoff = absl::ToUnixSeconds(deadline);
  std::vector<std::string> out;
  for (const auto& [key, pod] : pods_) {
    if (!pod.has_annotation || !pod.allocations.ok() || pod.allocations->empty()) continue;
    const bool realized = std::all_of(pod.allocations->begin(), pod.allocations->end(),
                                      [](const auto& a) { return a.runtime.has_value(); });
    if (!realized && pod.reserved_at > 0 && pod.reserved_at < cutoff && !released_.count(key)) {
      out.push_back(key);
    }
  }
  // Whole-GPU pods: unrealized while a GPU is still to be allocated (the device plugin erases a
  // container's entry from hami.io/vgpu-devices-to-allocate when it serves it).
  for (const auto& [key, pod] : pods_) {
    if (!pod.whole || pod.has_annotation || pod.allocated_gpus.empty()) continue;
    if (!pod.to_allocate_gpus.empty() && pod.reserved_at > 0 && pod.reserved_at < cutoff &&
        !released_.count(key)) {
      out.push_back(key);
    }
  }
  for (const auto& [key, a] : assumed_) {
    if (a.reserved_at < cutoff && !a.binding && !pods_.count(key)) out.push_back(key);
  }
  return out;
}

std::optional<std::string> ClusterState::ReservedNode(const std::string& pod_key) const {
  dynmig::ReaderMutexLock lock(&mu_);
  if (auto a = assumed_.find(pod_key); a != assumed_.end()) return a->second.reservation.node;
  auto it = pods_.find(pod_key);
  if (it == pods_.end()) return std::nullopt;
  const PodEntry& pod = it->second;
  if (pod.whole && !pod.has_annotation && !pod.allocated_gpus.empty()) return pod.node;
  if (!pod.has_annotation || !pod.allocations.ok() || pod.allocations->empty()) {
    return std::nullopt;
  }
  return pod.node;
}

void ClusterState::ReleaseUnrealized(const std::string& pod_key) {
  dynmig::MutexLock lock(&mu_);
  auto it = pods_.find(pod_key);
  if (it == pods_.end()) return;
  released_.insert(pod_key);
  MarkDirty(it->second.node);
}

// --- GPUs in whole-GPU mode ---------------------------------------------------------------------

bool ClusterState::NamesWholeGpu(const NodeEntry& node, const PodEntry& pod) {
  for (const auto& w : node.whole) {
    for (const auto* list : {&pod.device_gpus, &pod.unreadable_gpus}) {
      if (std::find(list->begin(), list->end(), w.id) != list->end()) return true;
    }
  }
  return false;
}

namespace {

// Marks a whole GPU unschedulable; the first reason stays.
void Fault(WholeGpuReport& w, std::string_view code, const std::string& why) {
  if (!w.healthy) return;
  w.healthy = false;
  w.unhealthy_code = std::string(code);
  w.unhealthy_reason = why;
}

// A registered whole GPU as reported, before any pod: what the register says is taken as the
// device plugin's word, except what would make a reservation ambiguous or unwritable (`duplicate`:
// its UUID is published again); those GPUs take no pod. `cordon`: why it is cordoned, if it is.
WholeGpuReport WholeGpuOf(const protocol::DeviceInfo& d, bool duplicate,
                          const std::optional<std::string>& switching,
                          const std::optional<std::string>& cordon) {
  WholeGpuReport w;
  w.uuid = d.id;
  w.index = d.index;
  w.model = d.type;
  w.memory_mib = d.devmem_mib;
  constexpr std::string_view kSeparators = ",:;";
  if (d.id.empty() || d.id.find_first_of(kSeparators) != std::string::npos ||
      d.type.find_first_of(kSeparators) != std::string::npos) {
    Fault(w, "bad-device",
          fmt::format("the register's whole GPU \"{}\" ({}) has an empty UUID or one of ',:;' in "
                      "its UUID or type",
                      d.id, d.type));
  } else if (duplicate) {
    Fault(w, "bad-device", fmt::format("the register publishes {} more than once", d.id));
  } else if (d.devmem_mib > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    Fault(w, "bad-device",
          fmt::format("the register's devmem {} MiB is out of range", d.devmem_mib));
  }
  if (switching.has_value()) Fault(w, "switching", *switching);
  if (!d.health) Fault(w, "device-unhealthy", "the device plugin reports this GPU unhealthy");
  if (cordon.has_value()) Fault(w, "cordoned", *cordon);
  return w;
}

}  // namespace

void ClusterState::CollectWholeGpus(const NodeEntry& node, NodeReport& report) const {
  report.whole_gpus.clear();
  if (node.whole.empty()) return;
  report.whole_gpus.reserve(node.whole.size());
  std::set<std::string> mig_ids;
  for (const auto& g : node.gpus) mig_ids.insert(g.info.id);
  std::map<std::string, int> seen;
  for (const auto& d : node.whole) ++seen[d.id];
  for (const auto& d : node.whole) {
    std::optional<std::string> cordon;
    if (!node.cordon_error.empty()) {
      cordon = "cordoned: unreadable " + node.cordon_error;
    } else if (node.cordoned.count(d.id)) {
      auto why = node.cordon_reasons.find(d.id);
      cordon = why == node.cordon_reasons.end()
                   ? std::string("cordoned (hami.io/device-cordon)")
                   : fmt::format("cordoned (hami.io/device-cordon): {}", why->second);
    }
    // Held for a mode switch (a request its status does not answer yet): takes no pod, as a MIG
    // GPU in SwitchFault.
    std::optional<std::string> switching;
    if (node.mode_requests_unreadable) {
      switching = "held for a mode switch: unreadable " + node.mode_error;
    } else if (auto request = node.mode_requests.find(d.id); request != node.mode_requests.end()) {
      auto status = node.mode_statuses.find(d.id);
      if (protocol::HeldForSwitch(request->second,
                                  status == node.mode_statuses.end() ? nullptr : &status->second)) {
        switching = fmt::format("GPU {} is switching to {}", d.id,
                                protocol::GpuModeName(request->second.to));
      }
    }
    report.whole_gpus.push_back(
        WholeGpuOf(d, seen[d.id] > 1 || mig_ids.count(d.id) > 0, switching, cordon));
  }
  auto find = [&](const std::string& uuid) -> WholeGpuReport* {
    for (auto& w : report.whole_gpus) {
      if (w.uuid == uuid) return &w;
    }
    return nullptr;
  };
  // One pod per GPU: a second holder is a conflict (fail closed, both stay counted).
  auto hold = [&](WholeGpuReport& w, const std::string& pod, bool assumed) {
    if (w.holder.empty()) {
      w.holder = pod;
      w.assumed = assumed;
    } else if (w.holder != pod) {
      Fault(w, "conflicting-reservations",
            fmt::format("conflicting reservations: given to both {} and {}", w.holder, pod));
    }
  };
  for (const auto& key : node.pods) {
    auto it = pods_.find(key);
    if (it == pods_.end() || assumed_.count(key)) continue;  // assumptions below
    const PodEntry& pod = it->second;
    if (pod.has_annotation && pod.allocations.ok()) {
      for (const auto& a : *pod.allocations) {
        if (WholeGpuReport* w = find(a.gpu_uuid)) {
          Fault(*w, "mig-reservation",
                fmt::format("pod {} holds a MIG reservation on this GPU, which is in whole-GPU "
                            "mode",
                            key));
        }
      }
    }
    bool named = false;
    for (const auto& uuid : pod.unreadable_gpus) {
      if (WholeGpuReport* w = find(uuid)) {
        named = true;
        Fault(*w, "unreadable-reservation", fmt::format("pod {} has {}", key, pod.unreadable));
      }
    }
    // Realized devices only once the pod's unrealized ones were released (bind-phase failed).
    const bool released = released_.count(key) > 0;
    for (const auto& uuid : pod.device_gpus) {
      WholeGpuReport* w = find(uuid);
      if (w == nullptr) continue;
      named = true;
      const bool pending = std::find(pod.to_allocate_gpus.begin(), pod.to_allocate_gpus.end(),
                                     uuid) != pod.to_allocate_gpus.end();
      if (pod.whole && released && pending) continue;
      if (pod.whole && !pod.has_annotation) {
        hold(*w, key, false);
      } else {
        Fault(*w, "devices-without-reservation",
              fmt::format("pod {} holds devices of this GPU without a whole-GPU reservation (it "
                          "is not a whole-GPU pod, or it carries {})",
                          key, protocol::kMigAllocationsAnnotation));
      }
    }
    if (!pod.unreadable.empty() && !named) {
      // Unreadable and naming none of the node's GPUs (FailClosedOnEvidence does the same for the
      // MIG ones): something is reserved here and nothing says which GPU.
      bool names_mig = false;
      for (const auto& uuid : pod.unreadable_gpus) names_mig = names_mig || mig_ids.count(uuid);
      if (!names_mig) {
        for (auto& w : report.whole_gpus) {
          Fault(w, "unreadable-reservation",
                fmt::format("pod {} has {}, naming none of this node's GPUs", key, pod.unreadable));
        }
      }
    }
  }
  for (const auto& key : node.assumed) {
    auto a = assumed_.find(key);
    if (a == assumed_.end() || !a->second.reservation.allocations.empty()) continue;
    for (const auto& ctr : a->second.reservation.devices) {
      for (const auto& dev : ctr) {
        if (WholeGpuReport* w = find(dev.uuid)) hold(*w, key, true);
      }
    }
  }
}

namespace {

// Why a node's whole GPUs cannot take a pod now: "no whole GPU free for the pod (needs 1, 0
// free): 1 GPU in MIG mode, 1 whole GPU in use by ns/p, 1 cordoned"; `verdict` gpu-unhealthy when
// only faults stand in the way, else capacity-exhausted.
std::string WholeBusyReason(const std::vector<WholeGpuReport>& gpus, size_t mig_gpus,
                            uint64_t total, size_t free_count, uint64_t floor,
                            mig::Verdict* verdict) {
  std::vector<std::string> holders;
  std::map<std::string, size_t> faults;
  size_t small = 0;
  for (const auto& g : gpus) {
    if (!g.healthy) {
      ++faults[g.unhealthy_code];
    } else if (!g.holder.empty()) {
      holders.push_back(g.holder);
    } else if (g.memory_mib < floor) {
      ++small;
    }
  }
  std::vector<std::string> parts;
  if (mig_gpus > 0) {
    parts.push_back(fmt::format("{} GPU{} in MIG mode", mig_gpus, mig_gpus == 1 ? "" : "s"));
  }
  if (!holders.empty()) {
    constexpr size_t kShown = 3;
    std::vector<std::string> shown(holders.begin(),
                                   holders.begin() + std::min(holders.size(), kShown));
    parts.push_back(fmt::format("{} whole GPU{} in use by {}{}", holders.size(),
                                holders.size() == 1 ? "" : "s", fmt::join(shown, ", "),
                                holders.size() > kShown ? " and others" : ""));
  }
  for (const auto& [code, n] : faults) parts.push_back(fmt::format("{} {}", n, code));
  if (small > 0) parts.push_back(fmt::format("{} free but smaller than {} MiB", small, floor));
  *verdict = holders.empty() && !faults.empty() ? mig::Verdict::kGpuUnhealthy
                                                : mig::Verdict::kCapacityExhausted;
  return fmt::format("no whole GPU free for {} (needs {}, {} free): {}",
                     total == 1 ? "the pod" : "all the pod's containers", total, free_count,
                     fmt::join(parts, ", "));
}

}  // namespace

ClusterState::WholeFit ClusterState::FitWhole(const NodeEntry& node,
                                              const protocol::WholeGpuRequest& request) {
  WholeFit out;
  const auto& gpus = node.report.whole_gpus;
  if (!node.view.healthy) {
    out.verdict = mig::Verdict::kNodeUnhealthy;
    out.reason = "node unhealthy: " + node.view.unhealthy_reason;
    return out;
  }
  const size_t mig_gpus = node.gpus.size();
  const std::string mig_text =
      mig_gpus == 0 ? ""
                    : fmt::format(", {} GPU{} in MIG mode", mig_gpus, mig_gpus == 1 ? "" : "s");
  const uint64_t total = request.TotalGpus();
  if (gpus.empty()) {
    out.never = true;
    out.verdict = mig::Verdict::kNoMigGpu;
    out.reason =
        fmt::format("no whole GPU: the node publishes no GPU in whole-GPU mode{}", mig_text);
    return out;
  }
  if (total > gpus.size()) {
    out.never = true;
    out.verdict = mig::Verdict::kCapacityExhausted;
    out.reason = fmt::format("the pod asks for {} whole GPUs, the node has {} in whole-GPU mode{}",
                             total, gpus.size(), mig_text);
    return out;
  }
  // Each GPU the containers ask for, largest memory floor first: a GPU that covers a floor covers
  // every smaller one, so taking the smallest GPU that covers each in turn fits whenever any
  // assignment does, and leaves the large GPUs to later pods.
  struct Demand {
    uint64_t floor;
    size_t container;
  };
  std::vector<Demand> demands;
  demands.reserve(total);
  for (size_t c = 0; c < request.containers.size(); ++c) {
    for (uint32_t k = 0; k < request.containers[c].count; ++k) {
      demands.push_back({request.containers[c].min_memory_mib, c});
    }
  }
  std::stable_sort(demands.begin(), demands.end(),
                   [](const Demand& a, const Demand& b) { return a.floor > b.floor; });
  // Could it ever fit (every GPU free)?
  {
    std::vector<uint64_t> sizes;
    for (const auto& g : gpus) sizes.push_back(g.memory_mib);
    std::sort(sizes.begin(), sizes.end(), std::greater<>());
    for (size_t i = 0; i < demands.size(); ++i) {
      if (sizes[i] < demands[i].floor) {
        const auto large = static_cast<size_t>(std::count_if(
            sizes.begin(), sizes.end(), [&](uint64_t m) { return m >= demands[i].floor; }));
        out.never = true;
        out.verdict = mig::Verdict::kNoProfileBigEnough;
        out.reason = fmt::format(
            "too small: the pod needs {} whole GPU{} with at least {} MiB, the node has {} that "
            "large{}",
            i + 1, i == 0 ? "" : "s", demands[i].floor, large, mig_text);
        return out;
      }
    }
  }
  std::vector<bool> taken(gpus.size(), false);
  out.picks.resize(request.containers.size());
  bool fits = true;
  for (const Demand& d : demands) {
    int best = -1;
    for (size_t g = 0; g < gpus.size(); ++g) {
      if (taken[g] || !gpus[g].healthy || !gpus[g].holder.empty() || gpus[g].memory_mib < d.floor) {
        continue;
      }
      if (best < 0 || gpus[g].memory_mib < gpus[best].memory_mib) best = static_cast<int>(g);
    }
    if (best < 0) {
      fits = false;
      break;
    }
    taken[best] = true;
    out.picks[d.container].push_back(static_cast<size_t>(best));
  }
  size_t free_count = 0;
  for (size_t g = 0; g < gpus.size(); ++g) {
    if (gpus[g].healthy && gpus[g].holder.empty()) ++free_count;
  }
  if (fits) {
    out.fits = true;
    out.free_after = free_count - total;
    return out;
  }
  // Why not: what the node's whole GPUs are doing.
  out.reason = WholeBusyReason(gpus, mig_gpus, total, free_count,
                               demands.empty() ? 0 : demands.front().floor, &out.verdict);
  return out;
}

absl::StatusOr<FilterDecision> ClusterState::PlanAndReserveWhole(
    const std::string& pod_key, const protocol::WholeGpuRequest& request,
    const std::vector<std::string>& candidates, absl::Time now, const std::string& pod_uid) {
  dynmig::MutexLock lock(&mu_);
  if (assumed_.count(pod_key)) {
    return absl::InvalidArgumentError(
        fmt::format("pod {} already holds a reservation made by this scheduler", pod_key));
  }
  std::vector<NodeEntry*> entries;
  std::vector<std::string> names;
  if (candidates.empty()) {
    for (auto& [name, n] : nodes_) {
      entries.push_back(&n);
      names.push_back(name);
    }
  } else {
    for (const auto& name : candidates) {
      entries.push_back(FindNode(name));
      names.push_back(name);
    }
  }
  FilterDecision decision;
  std::vector<WholeFit> fits(entries.size());
  std::vector<bool> never(entries.size(), true);
  int chosen = -1;
  decision.verdict = mig::Verdict::kNoMigGpu;
  for (size_t i = 0; i < entries.size(); ++i) {
    NodeEntry* e = entries[i];
    if (e == nullptr) {
      decision.failed[names[i]] = "no whole GPU: the node registers no GPU with dynmig";
      continue;
    }
    ViewOf(*e, now);
    fits[i] = FitWhole(*e, request);
    never[i] = fits[i].never;
    if (!fits[i].fits) {
      decision.failed[names[i]] = fits[i].reason;
      if (static_cast<int>(fits[i].verdict) < static_cast<int>(decision.verdict)) {
        decision.verdict = fits[i].verdict;
      }
      continue;
    }
    if (chosen < 0) {
      chosen = static_cast<int>(i);
      continue;
    }
    const NodeEntry& c = *entries[chosen];
    const auto better = std::make_pair(e->view.bind_in_flight, fits[i].free_after) <
                        std::make_pair(c.view.bind_in_flight, fits[chosen].free_after);
    if (better) chosen = static_cast<int>(i);
  }
  if (chosen < 0) return decision;
  // A node was chosen: only the nodes that can never run the pod keep their reason.
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i] != nullptr && !never[i]) decision.failed.erase(names[i]);
  }
  NodeEntry& node = *entries[chosen];
  const WholeFit& fit = fits[chosen];
  Reservation r;
  r.node = node.name;
  r.devices.resize(request.containers.size());
  std::vector<std::string> parts;
  for (size_t c = 0; c < request.containers.size(); ++c) {
    for (size_t g : fit.picks[c]) {
      const WholeGpuReport& w = node.report.whole_gpus[g];
      r.devices[c].push_back(
          {w.uuid, w.model.empty() ? "NVIDIA" : w.model, static_cast<int32_t>(w.memory_mib), 100});
      parts.push_back(w.uuid);
    }
  }
  r.summary = fmt::format("whole GPU{} {} on {}", parts.size() == 1 ? "" : "s",
                          fmt::join(parts, ", "), node.name);
  decision.verdict = mig::Verdict::kFits;
  decision.reservation = r;
  assumed_[pod_key] = {std::move(r), absl::ToUnixSeconds(now), pod_uid, false};
  node.assumed.insert(pod_key);
  Touch(node);
  ViewOf(node, now);
  return decision;
}

}  // namespace dynmig::scheduler
