#include "deviceplugin/state_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace dynmig::deviceplugin {
namespace {

using Json = nlohmann::json;

Json OwnerJson(const InstanceOwner& o) {
  return Json{{"podUID", o.pod_uid},
              {"namespace", o.ns},
              {"name", o.name},
              {"containerIndex", o.container_index},
              {"deviceIndex", o.device_index}};
}

Json PlacementJson(const mig::Placement& p) { return Json{{"start", p.start}, {"size", p.size}}; }

// Field readers that throw nothing: they record the first error.
class Reader {
 public:
  explicit Reader(std::string* error) : error_(error) {}

  const Json* Field(const Json& obj, const std::string& key, const std::string& path) {
    if (!obj.is_object() || !obj.contains(key)) {
      Fail(fmt::format("{}.{}: missing", path, key));
      return nullptr;
    }
    return &obj.at(key);
  }
  std::string String(const Json& obj, const std::string& key, const std::string& path) {
    const Json* v = Field(obj, key, path);
    if (v == nullptr) return "";
    if (!v->is_string()) {
      Fail(fmt::format("{}.{}: must be a string", path, key));
      return "";
    }
    return v->get<std::string>();
  }
  int64_t Int(const Json& obj, const std::string& key, const std::string& path) {
    const Json* v = Field(obj, key, path);
    if (v == nullptr) return 0;
    if (!v->is_number_integer()) {
      Fail(fmt::format("{}.{}: must be an integer", path, key));
      return 0;
    }
    return v->get<int64_t>();
  }
  uint32_t U32(const Json& obj, const std::string& key, const std::string& path) {
    const int64_t v = Int(obj, key, path);
    if (v < 0 || v > 0xFFFFFFFFLL) {
      Fail(fmt::format("{}.{}: out of range", path, key));
      return 0;
    }
    return static_cast<uint32_t>(v);
  }
  mig::Placement Placement(const Json& obj, const std::string& path) {
    const Json* v = Field(obj, "placement", path);
    if (v == nullptr) return {};
    return {U32(*v, "start", path + ".placement"), U32(*v, "size", path + ".placement")};
  }
  InstanceOwner Owner(const Json& obj, const std::string& path) {
    const Json* v = Field(obj, "owner", path);
    if (v == nullptr) return {};
    const std::string p = path + ".owner";
    return {String(*v, "podUID", p), String(*v, "namespace", p), String(*v, "name", p),
            static_cast<int>(U32(*v, "containerIndex", p)),
            static_cast<int>(U32(*v, "deviceIndex", p))};
  }
  std::vector<std::string> Strings(const Json& obj, const std::string& key,
                                   const std::string& path) {
    const Json* v = Field(obj, key, path);
    std::vector<std::string> out;
    if (v == nullptr) return out;
    if (!v->is_array()) {
      Fail(fmt::format("{}.{}: must be an array of strings", path, key));
      return out;
    }
    for (const auto& e : *v) {
      if (!e.is_string()) {
        Fail(fmt::format("{}.{}: must be an array of strings", path, key));
        return {};
      }
      out.push_back(e.get<std::string>());
    }
    return out;
  }
  std::vector<InstanceHolder> Holders(const Json& v, const std::string& path) {
    std::vector<InstanceHolder> out;
    if (!v.is_array()) {
      Fail(path + ".holders: must be an array");
      return out;
    }
    for (size_t k = 0; k < v.size(); ++k) {
      const std::string p = fmt::format("{}.holders[{}]", path, k);
      out.push_back({String(v[k], "podUID", p), String(v[k], "namespace", p),
                     String(v[k], "name", p), String(v[k], "container", p),
                     String(v[k], "resource", p), String(v[k], "deviceID", p),
                     String(v[k], "source", p)});
    }
    return out;
  }
  void Fail(std::string message) {
    if (error_->empty()) *error_ = std::move(message);
  }

 private:
  std::string* error_;
};

absl::Status ErrnoStatus(int err, const std::string& what) {
  const std::string message = fmt::format("{}: {}", what, std::strerror(err));
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  if (err == ENOENT) return absl::NotFoundError(message);
  return absl::UnavailableError(message);
}

// "ledger" is optional (absent in files written before it existed).
void DecodeLedger(const Json& doc, Reader& r, PluginState& state) {
  if (!doc.contains("ledger")) return;
  const Json& ledger = doc.at("ledger");
  if (!ledger.is_array()) {
    r.Fail("state.ledger: must be an array");
    return;
  }
  for (size_t k = 0; k < ledger.size(); ++k) {
    const Json& j = ledger[k];
    const std::string path = fmt::format("state.ledger[{}]", k);
    LedgerEntry e;
    e.device_ids = r.Strings(j, "deviceIDs", path);
    e.pod_uid = r.String(j, "podUID", path);
    e.ns = r.String(j, "namespace", path);
    e.name = r.String(j, "name", path);
    e.container = r.String(j, "container", path);
    e.container_index = static_cast<int>(r.U32(j, "containerIndex", path));
    const Json* init = r.Field(j, "initContainer", path);
    if (init != nullptr && !init->is_boolean()) r.Fail(path + ".initContainer: must be a boolean");
    e.init_container = init != nullptr && init->is_boolean() && init->get<bool>();
    e.mig_uuids = r.Strings(j, "migUUIDs", path);
    if (j.is_object() && j.contains("gpuUUIDs")) e.gpu_uuids = r.Strings(j, "gpuUUIDs", path);
    e.since = r.Int(j, "since", path);
    state.ledger.push_back(std::move(e));
  }
}

std::string_view ModeName(bool mig) { return mig ? "mig" : "hami-core"; }

bool ReadMode(Reader& r, const Json& j, const std::string& key, const std::string& path) {
  const std::string v = r.String(j, key, path);
  if (v != "mig" && v != "hami-core") {
    r.Fail(fmt::format("{}.{}: must be \"mig\" or \"hami-core\"", path, key));
  }
  return v == "mig";
}

bool ReadBool(Reader& r, const Json& j, const std::string& key, const std::string& path) {
  const Json* v = r.Field(j, key, path);
  if (v != nullptr && !v->is_boolean()) r.Fail(fmt::format("{}.{}: must be a boolean", path, key));
  return v != nullptr && v->is_boolean() && v->get<bool>();
}

// "modeSwitches" and "gpuModes" are optional (absent until a node switched a GPU's mode).
void DecodeModes(const Json& doc, Reader& r, PluginState& state) {
  if (doc.contains("modeSwitches")) {
    const Json& list = doc.at("modeSwitches");
    if (!list.is_array()) {
      r.Fail("state.modeSwitches: must be an array");
      return;
    }
    for (size_t k = 0; k < list.size(); ++k) {
      const Json& j = list[k];
      const std::string path = fmt::format("state.modeSwitches[{}]", k);
      ModeSwitchIntent i;
      i.gpu_uuid = r.String(j, "gpuUUID", path);
      i.from_mig = ReadMode(r, j, "from", path);
      i.to_mig = ReadMode(r, j, "to", path);
      i.request_at_ms = r.Int(j, "requestAt", path);
      i.step = r.String(j, "step", path);
      if (i.step != "set-mode" && i.step != "reset" && i.step != "set-back") {
        r.Fail(fmt::format("{}.step: must be set-mode, reset or set-back", path));
      }
      i.reason = r.String(j, "reason", path);
      i.mark_unswitchable = ReadBool(r, j, "markUnswitchable", path);
      state.mode_switches.push_back(std::move(i));
    }
  }
  if (doc.contains("gpuModes")) {
    const Json& list = doc.at("gpuModes");
    if (!list.is_array()) {
      r.Fail("state.gpuModes: must be an array");
      return;
    }
    for (size_t k = 0; k < list.size(); ++k) {
      const Json& j = list[k];
      const std::string path = fmt::format("state.gpuModes[{}]", k);
      GpuModeRecord m;
      m.gpu_uuid = r.String(j, "gpuUUID", path);
      m.mig = ReadMode(r, j, "mode", path);
      m.since_ms = r.Int(j, "since", path);
      m.phase = r.String(j, "phase", path);
      if (m.phase != "steady" && m.phase != "refused") {
        r.Fail(fmt::format("{}.phase: must be steady or refused", path));
      }
      m.answers_ms = r.Int(j, "answers", path);
      m.reason = r.String(j, "reason", path);
      state.gpu_modes.push_back(std::move(m));
    }
  }
}

}  // namespace

nlohmann::json HoldersJson(const std::vector<InstanceHolder>& holders) {
  Json out = Json::array();
  for (const auto& h : holders) {
    out.push_back(Json{{"podUID", h.pod_uid},
                       {"namespace", h.ns},
                       {"name", h.name},
                       {"container", h.container},
                       {"resource", h.resource},
                       {"deviceID", h.device_id},
                       {"source", h.source}});
  }
  return out;
}

std::string EncodeState(const PluginState& state) {
  Json instances = Json::array();
  for (const auto& i : state.instances) {
    Json entry = Json{{"gpuUUID", i.gpu_uuid},
                      {"profile", i.profile},
                      {"profileId", i.profile_id},
                      {"placement", PlacementJson(i.placement)},
                      {"gpuInstanceID", i.gpu_instance_id},
                      {"computeInstanceID", i.compute_instance_id},
                      {"migUUID", i.mig_uuid},
                      {"origin", i.origin},
                      {"since", i.since},
                      {"owner", OwnerJson(i.owner)}};
    if (i.idle) {
      entry["idle"] = true;
      entry["idleSince"] = i.idle_since;
    }
    if (!i.holders.empty()) entry["holders"] = HoldersJson(i.holders);
    if (i.destroy_pending()) {
      entry["destroyPending"] = Json{{"attempts", i.destroy_attempts},
                                     {"since", i.destroy_since},
                                     {"nextAttemptMs", i.destroy_next_ms},
                                     {"error", i.destroy_error}};
    }
    instances.push_back(std::move(entry));
  }
  Json intents = Json::array();
  for (const auto& i : state.intents) {
    intents.push_back(Json{{"id", i.id},
                           {"gpuUUID", i.gpu_uuid},
                           {"profile", i.profile},
                           {"placement", PlacementJson(i.placement)},
                           {"created", i.created},
                           {"owner", OwnerJson(i.owner)}});
  }
  Json ledger = Json::array();
  for (const auto& e : state.ledger) {
    ledger.push_back(Json{{"deviceIDs", e.device_ids},
                          {"podUID", e.pod_uid},
                          {"namespace", e.ns},
                          {"name", e.name},
                          {"container", e.container},
                          {"containerIndex", e.container_index},
                          {"initContainer", e.init_container},
                          {"migUUIDs", e.mig_uuids},
                          {"since", e.since}});
    if (!e.gpu_uuids.empty()) ledger.back()["gpuUUIDs"] = e.gpu_uuids;
  }
  Json doc = {{"version", 1},
              {"nextIntentId", state.next_intent_id},
              {"instances", instances},
              {"intents", intents},
              {"ledger", ledger}};
  if (!state.mode_switches.empty()) {
    Json list = Json::array();
    for (const auto& i : state.mode_switches) {
      list.push_back(Json{{"gpuUUID", i.gpu_uuid},
                          {"from", ModeName(i.from_mig)},
                          {"to", ModeName(i.to_mig)},
                          {"requestAt", i.request_at_ms},
                          {"step", i.step},
                          {"reason", i.reason},
                          {"markUnswitchable", i.mark_unswitchable}});
    }
    doc["modeSwitches"] = std::move(list);
  }
  if (!state.gpu_modes.empty()) {
    Json list = Json::array();
    for (const auto& m : state.gpu_modes) {
      list.push_back(Json{{"gpuUUID", m.gpu_uuid},
                          {"mode", ModeName(m.mig)},
                          {"since", m.since_ms},
                          {"phase", m.phase},
                          {"answers", m.answers_ms},
                          {"reason", m.reason}});
    }
    doc["gpuModes"] = std::move(list);
  }
  return doc.dump(1) + "\n";
}

absl::StatusOr<PluginState> DecodeState(std::string_view text) {
  Json doc = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::DataLossError("state file: not valid JSON");
  if (!doc.is_object()) return absl::DataLossError("state file: not a JSON object");
  std::string error;
  Reader r(&error);
  PluginState state;
  const int64_t version = r.Int(doc, "version", "state");
  if (error.empty() && version != 1) {
    return absl::DataLossError(fmt::format("state.version: {} is not supported (want 1)", version));
  }
  state.next_intent_id = static_cast<uint64_t>(r.Int(doc, "nextIntentId", "state"));
  const Json* instances = r.Field(doc, "instances", "state");
  if (instances != nullptr && !instances->is_array()) r.Fail("state.instances: must be an array");
  const Json* intents = r.Field(doc, "intents", "state");
  if (intents != nullptr && !intents->is_array()) r.Fail("state.intents: must be an array");
  if (!error.empty()) return absl::DataLossError(error);
  for (size_t k = 0; k < instances->size(); ++k) {
    const Json& j = (*instances)[k];
    const std::string path = fmt::format("state.instances[{}]", k);
    ManagedInstance i;
    i.gpu_uuid = r.String(j, "gpuUUID", path);
    i.profile = r.String(j, "profile", path);
    i.profile_id = r.U32(j, "profileId", path);
    i.placement = r.Placement(j, path);
    i.gpu_instance_id = r.U32(j, "gpuInstanceID", path);
    i.compute_instance_id = r.U32(j, "computeInstanceID", path);
    i.mig_uuid = r.String(j, "migUUID", path);
    i.origin = r.String(j, "origin", path);
    i.since = r.Int(j, "since", path);
    i.owner = r.Owner(j, path);
    if (j.is_object() && j.contains("idle")) {
      if (!j.at("idle").is_boolean()) r.Fail(path + ".idle: must be a boolean");
      i.idle = j.at("idle").is_boolean() && j.at("idle").get<bool>();
      if (i.idle) i.idle_since = r.Int(j, "idleSince", path);
    }
    if (j.is_object() && j.contains("holders")) i.holders = r.Holders(j.at("holders"), path);
    if (j.is_object() && j.contains("destroyPending")) {
      const Json& d = j.at("destroyPending");
      const std::string p = path + ".destroyPending";
      const int64_t attempts = r.Int(d, "attempts", p);
      if (attempts < 1 || attempts > 1'000'000'000) r.Fail(p + ".attempts: out of range");
      i.destroy_attempts = static_cast<int>(std::clamp<int64_t>(attempts, 0, 1'000'000'000));
      i.destroy_since = r.Int(d, "since", p);
      i.destroy_next_ms = r.Int(d, "nextAttemptMs", p);
      i.destroy_error = r.String(d, "error", p);
    }
    state.instances.push_back(std::move(i));
  }
  for (size_t k = 0; k < intents->size(); ++k) {
    const Json& j = (*intents)[k];
    const std::string path = fmt::format("state.intents[{}]", k);
    Intent i;
    i.id = static_cast<uint64_t>(r.Int(j, "id", path));
    i.gpu_uuid = r.String(j, "gpuUUID", path);
    i.profile = r.String(j, "profile", path);
    i.placement = r.Placement(j, path);
    i.created = r.Int(j, "created", path);
    i.owner = r.Owner(j, path);
    state.intents.push_back(std::move(i));
  }
  if (!error.empty()) return absl::DataLossError(error);
  DecodeLedger(doc, r, state);
  if (!error.empty()) return absl::DataLossError(error);
  DecodeModes(doc, r, state);
  if (!error.empty()) return absl::DataLossError(error);
  return state;
}

absl::StatusOr<PluginState> StateStore::Load() const {
  std::ifstream in(path_);
  if (!in) {
    std::error_code ec;
    if (!std::filesystem::exists(path_, ec)) return PluginState{};
    return ErrnoStatus(errno, "cannot read state file " + path_);
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto state = DecodeState(buffer.str());
  if (!state.ok()) {
    return absl::DataLossError(
        fmt::format("state file {}: {}", path_, std::string(state.status().message())));
  }
  return state;
}

absl::Status StateStore::Save(const PluginState& state) const {
  const std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  if (!dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      return absl::UnavailableError(fmt::format("cannot create state directory {}: {}",
                                                dir.string(), std::string(ec.message())));
    }
  }
  return WriteFileAtomically(path_, EncodeState(state), fsync_);
}

absl::StatusOr<std::string> StateStore::MoveAside(int64_t now_unix) const {
  const std::string target = fmt::format("{}.corrupt-{}", path_, now_unix);
  if (::rename(path_.c_str(), target.c_str()) != 0) {
    return ErrnoStatus(errno, fmt::format("cannot move {} to {}", path_, target));
  }
  return target;
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view content, bool fsync) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "cannot create " + tmp);
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoStatus(err, "cannot write " + tmp);
    }
    written += static_cast<size_t>(n);
  }
  if (fsync && ::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, "cannot fsync " + tmp);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, fmt::format("cannot rename {} to {}", tmp, path));
  }
  if (fsync) {
    std::string dir = std::filesystem::path(path).parent_path().string();
    if (dir.empty()) dir = ".";
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
  return absl::OkStatus();
}

}  // namespace dynmig::deviceplugin
