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

struct NvmlInstanceView {
  uint32_t gpu_instance_id = 0;
  std::string profile;
  mig::Placement placement;
  std::vector<NvmlComputeInstanceView> compute_instances;
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

struct NvmlView {
  std::vector<NvmlGpuView> gpus;

  const NvmlGpuView* FindGpu(std::string_view uuid) const;
  // The instance holding this MIG UUID (and its GPU), or nullptr.
  const NvmlInstanceView* FindMigUuid(std::string_view mig_uuid,
                                      const NvmlGpuView** gpu = nullptr) const;
};

// Parses the document. kInvalidArgument when it is not an object with a "gpus" array, or a field
// has the wrong type (the message names it).
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
