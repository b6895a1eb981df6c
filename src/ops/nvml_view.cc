#include "ops/nvml_view.h"

#include <curl/curl.h>

#include <mutex>  // std::call_once

#include "common/bounded_json.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "ops/cluster.h"

namespace dynmig::ops {
namespace {

using nlohmann::json;

absl::Status FieldError(const std::string& path, std::string_view want) {
  return absl::InvalidArgumentError(fmt::format("NVML view: {}: must be {}", path, want));
}

// Reads an optional unsigned integer field.
absl::Status ReadUint(const json& obj, const char* key, const std::string& path, uint64_t& out,
                      bool* present = nullptr) {
  const auto it = obj.find(key);
  if (present != nullptr) *present = false;
  if (it == obj.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0)) {
    return FieldError(path + "." + key, "a non-negative integer");
  }
  out = it->get<uint64_t>();
  if (present != nullptr) *present = true;
  return absl::OkStatus();
}

absl::Status ReadString(const json& obj, const char* key, const std::string& path,
                        std::string& out) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) return FieldError(path + "." + key, "a string");
  if (it->get_ref<const std::string&>().size() > kMaxNvmlViewString) {
    return FieldError(path + "." + key,
                      fmt::format("a string of at most {} bytes", kMaxNvmlViewString));
  }
  out = it->get<std::string>();
  return absl::OkStatus();
}

absl::Status ReadBool(const json& obj, const char* key, const std::string& path, bool& out) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return FieldError(path + "." + key, "true or false");
  out = it->get<bool>();
  return absl::OkStatus();
}

// The array under `key` (nullptr when absent or null), at most `limit` long.
absl::StatusOr<const json*> ReadArray(const json& obj, const char* key, const std::string& path,
                                      size_t limit) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  if (!it->is_array()) return FieldError(path + "." + key, "an array");
  if (it->size() > limit) {
    return FieldError(path + "." + key, fmt::format("an array of at most {} entries", limit));
  }
  return &*it;
}

absl::StatusOr<mig::Placement> ReadPlacement(const json& v, const std::string& path) {
  if (!v.is_object()) return FieldError(path, "an object {start, size}");
  uint64_t start = 0, size = 0;
  DYNMIG_RETURN_IF_ERROR(ReadUint(v, "start", path, start));
  DYNMIG_RETURN_IF_ERROR(ReadUint(v, "size", path, size));
  if (start + size > mig::kMaxPlacementUnits) {
    return FieldError(path, "a placement inside the 32-unit axis");
  }
  return mig::Placement{static_cast<uint32_t>(start), static_cast<uint32_t>(size)};
}

size_t Append(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

}  // namespace

const NvmlProfileView* NvmlGpuView::FindProfile(std::string_view want) const {
  for (const auto& p : profiles) {
    if (p.name == want) return &p;
  }
  return nullptr;
}

const NvmlGpuView* NvmlView::FindGpu(std::string_view uuid) const {
  for (const auto& g : gpus) {
    if (g.uuid == uuid) return &g;
  }
  return nullptr;
}

const NvmlInstanceView* NvmlView::FindMigUuid(std::string_view mig_uuid,
                                              const NvmlGpuView** gpu) const {
  for (const auto& g : gpus) {
    for (const auto& gi : g.instances) {
      for (const auto& ci : gi.compute_instances) {
        if (ci.mig_uuid == mig_uuid) {
          if (gpu != nullptr) *gpu = &g;
          return &gi;
        }
      }
    }
  }
  return nullptr;
}

namespace {

absl::StatusOr<NvmlProfileView> ParseProfile(const json& p, const std::string& ppath) {
  if (!p.is_object()) return FieldError(ppath, "an object");
  NvmlProfileView prof;
  DYNMIG_RETURN_IF_ERROR(ReadString(p, "name", ppath, prof.name));
  bool has = false;
  DYNMIG_RETURN_IF_ERROR(ReadUint(p, "memoryMiB", ppath, prof.memory_mib, &has));
  if (!has) DYNMIG_RETURN_IF_ERROR(ReadUint(p, "memoryMB", ppath, prof.memory_mib));
  uint64_t slices = 0, count = 0;
  DYNMIG_RETURN_IF_ERROR(ReadUint(p, "sliceCount", ppath, slices));
  prof.slice_count = static_cast<uint32_t>(slices);
  DYNMIG_RETURN_IF_ERROR(ReadUint(p, "instanceCount", ppath, count, &has));
  if (has) prof.instance_count = static_cast<uint32_t>(count);
  DYNMIG_ASSIGN_OR_RETURN(const json* pl,
                          ReadArray(p, "placements", ppath, mig::kMaxPlacementUnits));
  for (size_t k = 0; pl != nullptr && k < pl->size(); ++k) {
    DYNMIG_ASSIGN_OR_RETURN(auto placement,
                            ReadPlacement((*pl)[k], fmt::format("{}.placements[{}]", ppath, k)));
    prof.placements.push_back(placement);
  }
  return prof;
}

absl::StatusOr<NvmlHolder> ParseHolder(const json& h, const std::string& path) {
  if (!h.is_object()) return FieldError(path, "an object");
  NvmlHolder out;
  DYNMIG_RETURN_IF_ERROR(ReadString(h, "podUID", path, out.pod_uid));
  DYNMIG_RETURN_IF_ERROR(ReadString(h, "namespace", path, out.ns));
  DYNMIG_RETURN_IF_ERROR(ReadString(h, "name", path, out.name));
  DYNMIG_RETURN_IF_ERROR(ReadString(h, "container", path, out.container));
  DYNMIG_RETURN_IF_ERROR(ReadString(h, "resource", path, out.resource));
  DYNMIG_RETURN_IF_ERROR(ReadString(h, "deviceID", path, out.device_id));
  DYNMIG_RETURN_IF_ERROR(ReadString(h, "source", path, out.source));
  if (out.name.empty() && out.pod_uid.empty()) {
    return FieldError(path, "a holder naming its pod (podUID or namespace/name)");
  }
  return out;
}

// The device plugin's attribution fields of an instance item (managed, origin, owner, idle,
// holders, unproven, free).
absl::Status ParseAttribution(const json& gi, const std::string& ipath, NvmlInstanceView& inst) {
  DYNMIG_RETURN_IF_ERROR(ReadBool(gi, "managed", ipath, inst.managed));
  DYNMIG_RETURN_IF_ERROR(ReadString(gi, "origin", ipath, inst.origin));
  DYNMIG_RETURN_IF_ERROR(ReadBool(gi, "idle", ipath, inst.idle));
  DYNMIG_RETURN_IF_ERROR(ReadBool(gi, "free", ipath, inst.free));
  if (const auto o = gi.find("owner"); o != gi.end() && !o->is_null()) {
    if (!o->is_object()) return FieldError(ipath + ".owner", "an object");
    DYNMIG_RETURN_IF_ERROR(ReadString(*o, "podUID", ipath + ".owner", inst.owner_uid));
    DYNMIG_RETURN_IF_ERROR(ReadString(*o, "namespace", ipath + ".owner", inst.owner_ns));
    DYNMIG_RETURN_IF_ERROR(ReadString(*o, "name", ipath + ".owner", inst.owner_name));
  }
  if (const auto u = gi.find("unproven"); u != gi.end() && !u->is_null()) {
    std::string reason;
    DYNMIG_RETURN_IF_ERROR(ReadString(gi, "unproven", ipath, reason));
    inst.unproven = reason.empty() ? "no reason given" : reason;
  }
  DYNMIG_ASSIGN_OR_RETURN(const json* hs, ReadArray(gi, "holders", ipath, kMaxNvmlViewHolders));
  for (size_t k = 0; hs != nullptr && k < hs->size(); ++k) {
    DYNMIG_ASSIGN_OR_RETURN(auto h, ParseHolder((*hs)[k], fmt::format("{}.holders[{}]", ipath, k)));
    inst.holders.push_back(std::move(h));
  }
  return absl::OkStatus();
}

absl::StatusOr<NvmlInstanceView> ParseInstance(const json& gi, const std::string& ipath) {
  if (!gi.is_object()) return FieldError(ipath, "an object");
  NvmlInstanceView inst;
  uint64_t id = 0;
  bool has = false;
  DYNMIG_RETURN_IF_ERROR(ReadUint(gi, "gpuInstanceID", ipath, id, &has));
  if (!has) DYNMIG_RETURN_IF_ERROR(ReadUint(gi, "id", ipath, id));
  inst.gpu_instance_id = static_cast<uint32_t>(id);
  DYNMIG_RETURN_IF_ERROR(ReadString(gi, "profile", ipath, inst.profile));
  if (const auto pl = gi.find("placement"); pl != gi.end() && !pl->is_null()) {
    DYNMIG_ASSIGN_OR_RETURN(inst.placement, ReadPlacement(*pl, ipath + ".placement"));
  }
  DYNMIG_ASSIGN_OR_RETURN(const json* cis,
                          ReadArray(gi, "computeInstances", ipath, kMaxNvmlViewItems));
  for (size_t k = 0; cis != nullptr && k < cis->size(); ++k) {
    const json& ci = (*cis)[k];
    const std::string cpath = fmt::format("{}.computeInstances[{}]", ipath, k);
    if (!ci.is_object()) return FieldError(cpath, "an object");
    NvmlComputeInstanceView civ;
    uint64_t ci_id = 0;
    DYNMIG_RETURN_IF_ERROR(ReadUint(ci, "id", cpath, ci_id, &has));
    if (!has) DYNMIG_RETURN_IF_ERROR(ReadUint(ci, "computeInstanceID", cpath, ci_id));
    civ.id = static_cast<uint32_t>(ci_id);
    DYNMIG_RETURN_IF_ERROR(ReadString(ci, "migUUID", cpath, civ.mig_uuid));
    inst.compute_instances.push_back(std::move(civ));
  }
  DYNMIG_RETURN_IF_ERROR(ParseAttribution(gi, ipath, inst));
  return inst;
}

absl::StatusOr<NvmlGpuView> ParseGpu(const json& g, size_t i) {
  const std::string path = fmt::format("gpus[{}]", i);
  if (!g.is_object()) return FieldError(path, "an object");
  NvmlGpuView gpu;
  uint64_t index = i;
  DYNMIG_RETURN_IF_ERROR(ReadUint(g, "index", path, index));
  gpu.index = static_cast<uint32_t>(index);
  DYNMIG_RETURN_IF_ERROR(ReadString(g, "uuid", path, gpu.uuid));
  DYNMIG_RETURN_IF_ERROR(ReadString(g, "name", path, gpu.name));
  DYNMIG_RETURN_IF_ERROR(ReadUint(g, "memoryMiB", path, gpu.memory_mib));
  if (const auto m = g.find("migMode"); m != g.end() && m->is_object()) {
    if (const auto cur = m->find("current"); cur != m->end() && cur->is_boolean()) {
      gpu.mig_enabled = cur->get<bool>();
    }
  } else if (const auto e = g.find("migEnabled"); e != g.end() && e->is_boolean()) {
    gpu.mig_enabled = e->get<bool>();
  } else if (const auto mig = g.find("mig"); mig != g.end() && mig->is_object()) {
    if (const auto cur = mig->find("current"); cur != mig->end() && cur->is_boolean()) {
      gpu.mig_enabled = cur->get<bool>();
    }
  }
  DYNMIG_ASSIGN_OR_RETURN(const json* ps, ReadArray(g, "profiles", path, kMaxNvmlViewItems));
  for (size_t j = 0; ps != nullptr && j < ps->size(); ++j) {
    DYNMIG_ASSIGN_OR_RETURN(auto prof,
                            ParseProfile((*ps)[j], fmt::format("{}.profiles[{}]", path, j)));
    gpu.profiles.push_back(std::move(prof));
  }
  const auto inst = g.find("instances");
  const char* key = inst == g.end() || inst->is_null() ? "gpuInstances" : "instances";
  DYNMIG_ASSIGN_OR_RETURN(const json* is, ReadArray(g, key, path, kMaxNvmlViewItems));
  for (size_t j = 0; is != nullptr && j < is->size(); ++j) {
    DYNMIG_ASSIGN_OR_RETURN(auto gi,
                            ParseInstance((*is)[j], fmt::format("{}.instances[{}]", path, j)));
    gpu.instances.push_back(std::move(gi));
  }
  return gpu;
}

absl::StatusOr<NvmlEvidenceSource> ParseEvidenceSource(const json& e, const std::string& path) {
  if (!e.is_object()) return FieldError(path, "an object");
  NvmlEvidenceSource out;
  DYNMIG_RETURN_IF_ERROR(ReadBool(e, "configured", path, out.configured));
  DYNMIG_RETURN_IF_ERROR(ReadBool(e, "ok", path, out.ok));
  DYNMIG_RETURN_IF_ERROR(ReadString(e, "error", path, out.error));
  if (!out.configured) out.ok = false;
  return out;
}

absl::StatusOr<std::optional<NvmlEvidence>> ParseEvidence(const json& doc) {
  const auto e = doc.find("evidence");
  if (e == doc.end() || e->is_null()) return std::nullopt;
  if (!e->is_object()) return FieldError("evidence", "an object");
  NvmlEvidence out;
  for (const auto& [key, field] :
       {std::pair{"podResources", &out.pod_resources}, std::pair{"runtime", &out.runtime}}) {
    const auto it = e->find(key);
    if (it == e->end() || it->is_null()) {
      *field = NvmlEvidenceSource{true, false, "not reported"};
      continue;
    }
    DYNMIG_ASSIGN_OR_RETURN(*field, ParseEvidenceSource(*it, fmt::format("evidence.{}", key)));
  }
  return out;
}

}  // namespace

absl::StatusOr<NvmlView> ParseNvmlView(const json& doc) {
  if (!doc.is_object()) return FieldError("document", "a JSON object");
  const auto gpus = doc.find("gpus");
  if (gpus == doc.end() || !gpus->is_array()) return FieldError("gpus", "an array");
  if (gpus->size() > kMaxNvmlViewGpus) {
    return FieldError("gpus", fmt::format("an array of at most {} entries", kMaxNvmlViewGpus));
  }
  NvmlView view;
  DYNMIG_RETURN_IF_ERROR(ReadString(doc, "node", "document", view.node));
  for (size_t i = 0; i < gpus->size(); ++i) {
    DYNMIG_ASSIGN_OR_RETURN(auto gpu, ParseGpu((*gpus)[i], i));
    view.gpus.push_back(std::move(gpu));
  }
  DYNMIG_ASSIGN_OR_RETURN(view.evidence, ParseEvidence(doc));
  return view;
}

HttpNvmlSource::HttpNvmlSource(std::string url_template, absl::Duration timeout)
    : template_(std::move(url_template)), timeout_(timeout) {}

std::string HttpNvmlSource::Describe(const kube::Object& node) const {
  std::string url = template_;
  auto replace = [&](std::string_view key, const std::string& value) {
    for (size_t pos = url.find(key); pos != std::string::npos; pos = url.find(key, pos)) {
      url.replace(pos, key.size(), value);
      pos += value.size();
    }
  };
  replace("{node}", NodeAddress(node));
  replace("{name}", kube::Name(node));
  return url;
}

absl::StatusOr<nlohmann::json> HttpNvmlSource::Fetch(const kube::Object& node) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  const std::string url = Describe(node);
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return absl::InternalError("curl_easy_init failed");
  std::string body;
  char error[CURL_ERROR_SIZE] = {0};
  const long ms = static_cast<long>(absl::ToInt64Milliseconds(timeout_));
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, ms);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, std::min(ms, 3000L));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
  const CURLcode rc = curl_easy_perform(curl);
  long code = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_cleanup(curl);
  if (rc == CURLE_OPERATION_TIMEDOUT) {
    return absl::DeadlineExceededError(
        fmt::format("GET {}: timed out after {}", url, absl::FormatDuration(timeout_)));
  }
  if (rc != CURLE_OK) {
    return absl::UnavailableError(
        fmt::format("GET {}: {}", url, error[0] != 0 ? error : curl_easy_strerror(rc)));
  }
  if (code != 200) {
    return absl::UnavailableError(fmt::format("GET {}: HTTP {}", url, code));
  }
  // A node's /nvml document is a few KiB per GPU; 16 MiB and 64 levels bound a hostile endpoint.
  constexpr JsonLimits kNvmlViewLimits{16 * kMiB, kKubeObjectDepth};
  auto doc = ParseBoundedJson(body, kNvmlViewLimits, fmt::format("GET {}", url));
  if (!doc.ok()) return absl::DataLossError(doc.status().message());
  return doc;
}

NvmlResult FetchNvmlView(NvmlSource& source, const kube::Object& node) {
  NvmlResult r;
  r.url = source.Describe(node);
  r.document = source.Fetch(node);
  if (!r.document.ok()) {
    r.view = r.document.status();
    return r;
  }
  r.view = ParseNvmlView(*r.document);
  return r;
}

}  // namespace dynmig::ops
