// A node's NVML view, as its device plugin serves it (`GET http://<node>:9400/nvml`, JSON), for
// inventory backups and for validate's comparisons of the registered capability and of the MIG
// instances with what NVML reports.
//
// The document (the device plugin's PluginCore::NvmlView; fields read here, others ignored):
//   {"node":"node-a","gpus":[{"index":0,"uuid":"GPU-...","name":"NVIDIA A100-SXM4-40GB",
//     "memoryMiB":40960,"migMode":{"current":true},"exposed":true,
//     "profiles":[{"name":"1g.5gb","memoryMiB":4864,"sliceCount":1,"instanceCount":7,
//                  "placements":[{"start":0,"size":1},...]}],
//     "instances":[{"gpuInstanceID":3,"profile":"1g.5gb","placement":{"start":0,"size":1},
//                   "computeInstances":[{"id":0,"migUUID":"MIG-..."}]}]}]}
// Also accepted: `memoryMB` for profile memory, `migEnabled` for the mode, `gpuInstances` with
// `id` for the instances (the shapes `dynmig nvml profiles|instances -o json` print).
//
// The attribution of instances dynmig did not create (issue 29's handover), when the device plugin
// publishes it:
//   top level: "evidence": {"podResources": {"ok": true} | {"ok": false, "error": "..."},
//                           "runtime": {"ok": true} | {"ok": false, "error": "..."} |
//                                      {"configured": false}}
//   an instance: "managed": true, "origin": "legacy", "owner": {"podUID","namespace","name"},
//                "idle": true, "holders": [{"podUID","namespace","name","container","resource",
//                "deviceID","source": "pod-resources"|"runtime"}]
//             or "managed": false with "unproven": "<reason>" or "free": true.
// The document is bounded (kMaxNvmlViewGpus GPUs, kMaxNvmlViewItems profiles or instances per GPU,
// kMaxNvmlViewHolders holders per instance, kMaxNvmlViewString bytes per string): a hostile
// endpoint gets a clear error, never unbounded work.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kube/object.h"
#include "mig/placement.h"
#include "nlohmann/json.hpp"

namespace dynmig::ops {

struct NvmlProfileView {
  std::string name;
  uint64_t memory_mib = 0;
  uint32_t slice_count = 0;
  std::optional<uint32_t> instance_count;
  std::vector<mig::Placement> placements;
};

struct NvmlComputeInstanceView {
  uint32_t id = 0;
  std::string mig_uuid;
};

inline constexpr size_t kMaxNvmlViewGpus = 64;
inline constexpr size_t kMaxNvmlViewItems = 256;
inline constexpr size_t kMaxNvmlViewHolders = 256;
inline constexpr size_t kMaxNvmlViewString = 4096;

// A container the node says was given an instance (the device plugin's attribution).
struct NvmlHolder {
  std::string pod_uid;
  std::string ns;
  std::string name;
  std::string container;
  std::string resource;   // the kubelet resource it was given through ("" when the runtime said)
  std::string device_id;  // the device ID the container got (a MIG UUID, GPU-uuid[t-s], ...)
  std::string source;     // "pod-resources" or "runtime"
};

struct NvmlInstanceView {
  uint32_t gpu_instance_id = 0;
  std::string profile;
  mig::Placement placement;
  std::vector<NvmlComputeInstanceView> compute_instances;

  bool managed = false;                         // the device plugin tracks it
  std::string origin;                           // managed: "legacy" for an adopted legacy instance
  std::string owner_uid, owner_ns, owner_name;  // managed: the owning pod
  bool idle = false;                            // managed: kept idle (a warm instance)
  std::vector<NvmlHolder> holders;              // managed legacy: who holds it
  std::optional<std::string> unproven;          // unmanaged: kept, never destroyed (the reason)
  bool free = false;                            // unmanaged: no holder, evidence complete

  bool legacy() const { return managed && origin == "legacy"; }
  // The first compute instance's MIG UUID, or "".
  std::string mig_uuid() const {
    return compute_instances.empty() ? std::string() : compute_instances.front().mig_uuid;
  }
};

struct NvmlGpuView {
  uint32_t index = 0;
  std::string uuid;
  std::string name;
  uint64_t memory_mib = 0;
  std::optional<bool> mig_enabled;
  std::vector<NvmlProfileView> profiles;
  std::vector<NvmlInstanceView> instances;

  const NvmlProfileView* FindProfile(std::string_view name) const;
};

// What the device plugin's attribution rests on: each source answered (ok), or why not.
struct NvmlEvidenceSource {
  bool configured = true;  // runtime: false when the plugin has no --cri-socket
  bool ok = false;
  std::string error;
};
struct NvmlEvidence {
  NvmlEvidenceSource pod_resources;
  NvmlEvidenceSource runtime;
};

struct NvmlView {
  std::string node;  // "node", "" when absent
  std::vector<NvmlGpuView> gpus;
  // Absent: a device plugin that predates the attribution of legacy instances.
  std::optional<NvmlEvidence> evidence;

  const NvmlGpuView* FindGpu(std::string_view uuid) const;
  // The instance holding this MIG UUID (and its GPU), or nullptr.
  const NvmlInstanceView* FindMigUuid(std::string_view mig_uuid,
                                      const NvmlGpuView** gpu = nullptr) const;
};

// Parses the document. kInvalidArgument when it is not an object with a "gpus" array, a field
// has the wrong type, or a list or string is over its limit (the message names the field).
absl::StatusOr<NvmlView> ParseNvmlView(const nlohmann::json& doc);

// Where NVML views come from. Implementations are thread-safe.
class NvmlSource {
 public:
  virtual ~NvmlSource() = default;
  // The node's document. Errors: kUnavailable (unreachable, HTTP error), kDeadlineExceeded,
  // kDataLoss (not JSON).
  virtual absl::StatusOr<nlohmann::json> Fetch(const kube::Object& node) = 0;
  // Where Fetch looks for this node (the URL), for reports.
  virtual std::string Describe(const kube::Object& node) const = 0;
};

// GET over HTTP(S) with libcurl. The URL template's `{node}` is the node's address (InternalIP,
// else Hostname, else name) and `{name}` the node name, e.g. "http://{node}:9400/nvml".
class HttpNvmlSource : public NvmlSource {
 public:
  explicit HttpNvmlSource(std::string url_template, absl::Duration timeout = absl::Seconds(5));
  absl::StatusOr<nlohmann::json> Fetch(const kube::Object& node) override;
  std::string Describe(const kube::Object& node) const override;

 private:
  const std::string template_;
  const absl::Duration timeout_;
};

// Fetch + parse; the error says the URL and why ("unreachable: ...").
struct NvmlResult {
  std::string url;
  absl::StatusOr<nlohmann::json> document = nlohmann::json();
  absl::StatusOr<NvmlView> view = NvmlView{};
};
NvmlResult FetchNvmlView(NvmlSource& source, const kube::Object& node);

}  // namespace dynmig::ops
