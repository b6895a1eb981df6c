#include "nvml/sim_nvml.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "nvml/sim_state.h"

namespace dynmig::nvml {
namespace {

absl::Status ErrnoError(std::string_view what, const std::string& path, int err) {
  return absl::InternalError(fmt::format("{} {}: {}", what, path, std::strerror(err)));
}

// Holds an exclusive flock for its lifetime.
class FileLock {
 public:
  FileLock() = default;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock() {
    if (fd_ >= 0) flock(fd_, LOCK_UN);
  }
  absl::Status Lock(int fd, const std::string& path) {
    while (flock(fd, LOCK_EX) != 0) {
      if (errno != EINTR) return ErrnoError("cannot lock", path, errno);
    }
    fd_ = fd;
    return absl::OkStatus();
  }

 private:
  int fd_ = -1;
};

absl::Status WriteAll(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot write", path, errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadAll(int fd, const std::string& path) {
  std::string out;
  char buf[8192];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot read", path, errno);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

uint64_t ReadGeneration(int fd) {
  uint64_t gen = 0;
  if (pread(fd, &gen, sizeof(gen), 0) != static_cast<ssize_t>(sizeof(gen))) return 0;
  return gen;
}

absl::Duration LatencyOf(const sim::State& s, std::string_view op) {
  auto it = s.latency_ms.find(op);
  return it == s.latency_ms.end() ? absl::ZeroDuration() : absl::Milliseconds(it->second);
}

bool HasFaultFor(const sim::State& s, std::string_view op) {
  for (const auto& f : s.faults) {
    if (f.op == op) return true;
  }
  return false;
}

// The MIG reconfiguration an operation is, for the latency model.
std::optional<mig::NvmlOp> ReconfigurationOf(std::string_view op) {
  if (op == "CreateGpuInstance") return mig::NvmlOp::kCreateGpuInstance;
  if (op == "DestroyGpuInstance") return mig::NvmlOp::kDestroyGpuInstance;
  if (op == "CreateComputeInstance") return mig::NvmlOp::kCreateComputeInstance;
  if (op == "DestroyComputeInstance") return mig::NvmlOp::kDestroyComputeInstance;
  if (op == "SetMigMode") return mig::NvmlOp::kSetMigMode;
  if (op == "ResetGpu") return mig::NvmlOp::kResetGpu;
  return std::nullopt;
}

absl::Status CheckOperation(std::string_view op) {
  if (sim::IsKnownOperation(op)) return absl::OkStatus();
  return absl::InvalidArgumentError(fmt::format("unknown simulator operation \"{}\"; known: {}", op,
                                                fmt::join(kSimOperations, ", ")));
}

}  // namespace

SimNvml::SimNvml(SimNvmlOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : RealClock()) {}

SimNvml::~SimNvml() {
  if (lock_fd_ >= 0) close(lock_fd_);
}

absl::StatusOr<std::unique_ptr<SimNvml>> SimNvml::Create(SimNvmlOptions options) {
  std::unique_ptr<SimNvml> sim(new SimNvml(std::move(options)));
  if (auto st = sim->Init(); !st.ok()) return st;
  return sim;
}

namespace {

absl::Status MarkRebootRequired(sim::State& s, const std::vector<uint32_t>& gpus) {
  for (uint32_t i : gpus) {
    if (i >= s.gpus.size()) {
      return absl::InvalidArgumentError(
          fmt::format("reboot-required GPU {} does not exist (the spec \"{}\" has {} GPUs)", i,
                      s.spec, s.gpus.size()));
    }
    s.gpus[i].reboot_required = true;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SimNvml::Init() {
  dynmig::MutexLock lock(&mu_);
  const std::string& path = options_.state_file;
  if (path.empty()) {
    if (options_.spec.empty()) {
      return absl::InvalidArgumentError("the simulator needs a spec (e.g. \"A100-SXM4-40GBx2\")");
    }
    auto s = sim::NewState(options_.spec, options_.seed, options_.swapped_halves_gpus);
    if (!s.ok()) return s.status();
    if (auto marked = MarkRebootRequired(*s, options_.reboot_required_gpus); !marked.ok()) {
      return marked;
    }
    state_ = std::make_unique<sim::State>(std::move(*s));
    return absl::OkStatus();
  }
  // The state file's directory: made when the state is to be created from the spec (a device plugin
  // pointed at a fresh directory); without a spec there is nothing to create, so nothing is made.
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(parent, ec)) {
      if (options_.spec.empty()) {
        return absl::InvalidArgumentError(
            fmt::format("simulator state file {} does not exist (its directory {} is missing) and "
                        "no spec was given to create it",
                        path, parent.string()));
      }
      std::filesystem::create_directories(parent, ec);
      if (ec) {
        return absl::InternalError(
            fmt::format("cannot create the directory {} of simulator state file {}: {}",
                        parent.string(), path, ec.message()));
      }
    }
  }
  const std::string lock_path = path + ".lock";
  lock_fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) return ErrnoError("cannot open simulator lock file", lock_path, errno);
  FileLock file_lock;
  if (auto st = file_lock.Lock(lock_fd_, lock_path); !st.ok()) return st;
  struct stat st_buf {};
  if (stat(path.c_str(), &st_buf) != 0) {
    if (errno != ENOENT) return ErrnoError("cannot stat simulator state file", path, errno);
    if (options_.spec.empty()) {
      return absl::InvalidArgumentError(fmt::format(
          "simulator state file {} does not exist and no spec was given to create it", path));
    }
    auto s = sim::NewState(options_.spec, options_.seed, options_.swapped_halves_gpus);
    if (!s.ok()) return s.status();
    if (auto marked = MarkRebootRequired(*s, options_.reboot_required_gpus); !marked.ok()) {
      return marked;
    }
    if (auto saved = Save(*s); !saved.ok()) return saved;
    state_ = std::make_unique<sim::State>(std::move(*s));
    return absl::OkStatus();
  }
  if (auto refreshed = Refresh(/*force=*/true); !refreshed.ok()) return refreshed;
  if (!options_.spec.empty()) {
    auto want = ParseSimSpec(options_.spec);
    if (!want.ok()) return want.status();
    std::vector<std::string> have_names;
    std::vector<std::string> want_names;
    for (const auto& g : state_->gpus) have_names.push_back(g.model->capability.model);
    for (const auto* m : *want) want_names.push_back(m->capability.model);
    if (have_names != want_names) {
      return absl::FailedPreconditionError(fmt::format(
          "simulator state file {} holds GPUs [{}] (spec \"{}\"), not the requested spec \"{}\" "
          "[{}]; remove the file or pass the same spec",
          path, fmt::join(have_names, ", "), state_->spec, options_.spec,
          fmt::join(want_names, ", ")));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SimNvml::FileStamp> SimNvml::CurrentStamp() {
  const std::string& path = options_.state_file;
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return absl::FailedPreconditionError(
          fmt::format("simulator state file {} disappeared", path));
    }
    return ErrnoError("cannot stat simulator state file", path, errno);
  }
  FileStamp stamp;
  stamp.generation = ReadGeneration(lock_fd_);
  stamp.inode = st.st_ino;
  stamp.size = st.st_size;
  stamp.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  stamp.ctime_ns = int64_t{st.st_ctim.tv_sec} * 1000000000 + st.st_ctim.tv_nsec;
  return stamp;
}

absl::Status SimNvml::Refresh(bool force) {
  const std::string& path = options_.state_file;
  if (path.empty()) return absl::OkStatus();
  auto before = CurrentStamp();
  if (!before.ok()) return before.status();
  if (!force && state_ != nullptr && *before == stamp_) return absl::OkStatus();
  // The file is only ever replaced by rename, so whatever we open is a complete state.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open simulator state file", path, errno);
  struct stat st {};
  fstat(fd, &st);
  auto text = ReadAll(fd, path);
  close(fd);
  if (!text.ok()) return text.status();
  auto parsed = sim::FromJson(*text, path);
  if (!parsed.ok()) return parsed.status();
  state_ = std::make_unique<sim::State>(std::move(*parsed));
  stamp_ = *before;
  // Stamp what was read: the inode opened may be newer than the one stat'ed before.
  stamp_.inode = st.st_ino;
  stamp_.size = st.st_size;
  stamp_.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  stamp_.ctime_ns = int64_t{st.st_ctim.tv_sec} * 1000000000 + st.st_ctim.tv_nsec;
  return absl::OkStatus();
}

absl::Status SimNvml::Save(const sim::State& state) {
  const std::string& path = options_.state_file;
  if (path.empty()) return absl::OkStatus();
  const std::string tmp = fmt::format("{}.tmp.{}", path, getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", tmp, errno);
  absl::Status written = WriteAll(fd, sim::ToJson(state), tmp);
  if (written.ok() && options_.fsync && fsync(fd) != 0) {
    written = ErrnoError("cannot fsync", tmp, errno);
  }
  close(fd);
  if (written.ok() && rename(tmp.c_str(), path.c_str()) != 0) {
    written = ErrnoError("cannot rename onto", path, errno);
  }
  if (!written.ok()) {
    unlink(tmp.c_str());
    stamp_ = FileStamp{};  // force a reload: memory and file may now differ
    return written;
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  const int dir_fd = options_.fsync ? open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
  if (dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
  const uint64_t generation = ReadGeneration(lock_fd_) + 1;
  if (pwrite(lock_fd_, &generation, sizeof(generation), 0) !=
      static_cast<ssize_t>(sizeof(generation))) {
    stamp_ = FileStamp{};
    return ErrnoError("cannot write generation to", path + ".lock", errno);
  }
  auto stamp = CurrentStamp();
  if (!stamp.ok()) return stamp.status();
  stamp_ = *stamp;
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<T> SimNvml::Call(std::string_view op, std::optional<uint32_t> gpu, bool mutating,
                                std::string_view context,
                                const std::function<absl::StatusOr<T>(sim::State&)>& fn) {
  absl::Duration latency = absl::ZeroDuration();
  absl::Duration modelled = absl::ZeroDuration();
  {
    dynmig::MutexLock lock(&mu_);
    if (auto st = Refresh(false); !st.ok()) return st;
    latency = LatencyOf(*state_, op);
    const std::optional<mig::NvmlOp> reconfig = ReconfigurationOf(op);
    if (reconfig && gpu && *gpu < state_->gpus.size() && !options_.latency.IsZero()) {
      modelled = options_.latency.Of(*reconfig, state_->gpus[*gpu].model->capability.model);
    }
  }
  // The latency model: one reconfiguration of a GPU at a time, held until it is applied.
  if (modelled > absl::ZeroDuration() && *gpu < gpu_mu_.size()) {
    dynmig::MutexLock gpu_lock(&gpu_mu_[*gpu]);
    clock_.SleepFor(latency + modelled);
    return Apply<T>(op, gpu, mutating, context, fn);
  }
  if (latency > absl::ZeroDuration()) clock_.SleepFor(latency);
  return Apply<T>(op, gpu, mutating, context, fn);
}

std::optional<NvmlReturn> SimNvml::CountFaults(std::string_view op, std::optional<uint32_t> gpu,
                                               bool counted, bool& changed) {
  std::optional<NvmlReturn> injected;
  for (auto it = state_->faults.begin(); it != state_->faults.end();) {
    if (it->op != op || (it->gpu.has_value() && it->gpu != gpu) || !counted) {
      ++it;
      continue;
    }
    changed = true;
    ++it->calls;
    const bool fires = it->calls >= it->nth && (it->times == 0 || it->calls < it->nth + it->times);
    if (fires && !injected.has_value()) injected = it->code;
    if (it->times != 0 && it->calls >= it->nth + it->times - 1) {
      it = state_->faults.erase(it);
    } else {
      ++it;
    }
  }
  return injected;
}

template <typename T>
absl::StatusOr<T> SimNvml::Apply(std::string_view op, std::optional<uint32_t> gpu, bool mutating,
                                 std::string_view context,
                                 const std::function<absl::StatusOr<T>(sim::State&)>& fn) {
  dynmig::MutexLock lock(&mu_);
  if (auto st = Refresh(false); !st.ok()) return st;
  const bool file_backed = !options_.state_file.empty();
  FileLock file_lock;
  bool locked = false;
  if (file_backed && (mutating || HasFaultFor(*state_, op))) {
    if (auto st = file_lock.Lock(lock_fd_, options_.state_file + ".lock"); !st.ok()) return st;
    if (auto st = Refresh(false); !st.ok()) return st;
    locked = true;
  }
  // Faults first: an injected failure changes nothing but the fault counters. (A fault another
  // process injected between our check and now counts from the next call.)
  bool faults_changed = false;
  const std::optional<NvmlReturn> injected =
      CountFaults(op, gpu, /*counted=*/!file_backed || locked, faults_changed);
  if (injected.has_value()) {
    if (faults_changed && file_backed) {
      if (auto st = Save(*state_); !st.ok()) return st;
    }
    return NvmlStatus(*injected, fmt::format("{} (injected fault)", context));
  }
  if (!mutating) {
    if (faults_changed && file_backed) {
      if (auto st = Save(*state_); !st.ok()) return st;
    }
    return fn(*state_);
  }
  sim::State next = *state_;
  absl::StatusOr<T> result = fn(next);
  if (!result.ok()) {
    if (faults_changed && file_backed) {
      if (auto st = Save(*state_); !st.ok()) return st;
    }
    return result;
  }
  if (file_backed) {
    if (auto st = Save(next); !st.ok()) return st;
  }
  *state_ = std::move(next);
  return result;
}

absl::Status SimNvml::CallStatus(std::string_view op, std::optional<uint32_t> gpu,
                                 std::string_view context,
                                 const std::function<absl::Status(sim::State&)>& fn) {
  auto r =
      Call<bool>(op, gpu, /*mutating=*/true, context, [&](sim::State& s) -> absl::StatusOr<bool> {
        absl::Status st = fn(s);
        if (!st.ok()) return st;
        return true;
      });
  return r.status();
}

std::string SimNvml::Description() const {
  return fmt::format("simulator {} ({})", spec(),
                     options_.state_file.empty() ? "in memory" : "state " + options_.state_file);
}

std::string SimNvml::spec() const {
  dynmig::MutexLock lock(&mu_);
  return state_->spec;
}

absl::StatusOr<uint32_t> SimNvml::DeviceCount() {
  return Call<uint32_t>("DeviceCount", std::nullopt, false, "get device count",
                        [](sim::State& s) -> absl::StatusOr<uint32_t> {
                          return static_cast<uint32_t>(s.gpus.size());
                        });
}

absl::StatusOr<GpuInfo> SimNvml::GetGpu(uint32_t gpu) {
  return Call<GpuInfo>("GetGpu", gpu, false, fmt::format("get GPU {} info", gpu),
                       [&](sim::State& s) { return sim::GetGpu(s, gpu); });
}

absl::StatusOr<GpuInstanceProfileInfo> SimNvml::GetGpuInstanceProfileInfo(uint32_t gpu,
                                                                          uint32_t profile_index) {
  return Call<GpuInstanceProfileInfo>(
      "GetGpuInstanceProfileInfo", gpu, false,
      fmt::format("get GPU instance profile info for profile index {} on GPU {}", profile_index,
                  gpu),
      [&](sim::State& s) { return sim::GetProfileInfo(s, gpu, profile_index); });
}

absl::StatusOr<std::vector<mig::Placement>> SimNvml::GetGpuInstancePossiblePlacements(
    uint32_t gpu, uint32_t profile_id) {
  return Call<std::vector<mig::Placement>>(
      "GetGpuInstancePossiblePlacements", gpu, false,
      fmt::format("get possible placements of GPU instance profile {} on GPU {}", profile_id, gpu),
      [&](sim::State& s) { return sim::GetPlacements(s, gpu, profile_id); });
}

absl::StatusOr<GpuInstanceInfo> SimNvml::CreateGpuInstance(uint32_t gpu, uint32_t profile_id,
                                                           const mig::Placement& placement) {
  return Call<GpuInstanceInfo>(
      "CreateGpuInstance", gpu, true,
      fmt::format("create GPU instance of profile id {} at placement {}:{} on GPU {}", profile_id,
                  placement.start, placement.size, gpu),
      [&](sim::State& s) { return sim::CreateGi(s, gpu, profile_id, placement); });
}

absl::StatusOr<std::vector<GpuInstanceInfo>> SimNvml::ListGpuInstances(uint32_t gpu) {
  return Call<std::vector<GpuInstanceInfo>>("ListGpuInstances", gpu, false,
                                            fmt::format("list GPU instances on GPU {}", gpu),
                                            [&](sim::State& s) { return sim::ListGis(s, gpu); });
}

absl::Status SimNvml::DestroyGpuInstance(uint32_t gpu, uint32_t gi_id) {
  return CallStatus("DestroyGpuInstance", gpu,
                    fmt::format("destroy GPU instance {} on GPU {}", gi_id, gpu),
                    [&](sim::State& s) { return sim::DestroyGi(s, gpu, gi_id); });
}

absl::StatusOr<ComputeInstanceInfo> SimNvml::CreateComputeInstance(uint32_t gpu, uint32_t gi_id) {
  return CreateComputeInstanceWithSlices(gpu, gi_id, 0);
}

absl::StatusOr<ComputeInstanceInfo> SimNvml::CreateComputeInstanceWithSlices(uint32_t gpu,
                                                                             uint32_t gi_id,
                                                                             uint32_t slices) {
  return Call<ComputeInstanceInfo>(
      "CreateComputeInstance", gpu, true,
      fmt::format("create compute instance in GPU instance {} on GPU {}", gi_id, gpu),
      [&](sim::State& s) { return sim::CreateCi(s, gpu, gi_id, slices); });
}

absl::StatusOr<std::vector<ComputeInstanceInfo>> SimNvml::ListComputeInstances(uint32_t gpu,
                                                                               uint32_t gi_id) {
  return Call<std::vector<ComputeInstanceInfo>>(
      "ListComputeInstances", gpu, false,
      fmt::format("list compute instances of GPU instance {} on GPU {}", gi_id, gpu),
      [&](sim::State& s) { return sim::ListCis(s, gpu, gi_id); });
}

absl::StatusOr<std::string> SimNvml::GetMigDeviceUuid(uint32_t gpu, uint32_t gi_id,
                                                      uint32_t ci_id) {
  return Call<std::string>(
      "GetMigDeviceUuid", gpu, false,
      fmt::format("get MIG device UUID of GPU {} GI {} CI {}", gpu, gi_id, ci_id),
      [&](sim::State& s) { return sim::MigUuid(s, gpu, gi_id, ci_id); });
}

absl::Status SimNvml::DestroyComputeInstance(uint32_t gpu, uint32_t gi_id, uint32_t ci_id) {
  return CallStatus(
      "DestroyComputeInstance", gpu,
      fmt::format("destroy compute instance {} of GPU instance {} on GPU {}", ci_id, gi_id, gpu),
      [&](sim::State& s) { return sim::DestroyCi(s, gpu, gi_id, ci_id); });
}

absl::StatusOr<std::vector<ProcessInfo>> SimNvml::GetComputeProcesses(uint32_t gpu) {
  return Call<std::vector<ProcessInfo>>(
      "GetComputeProcesses", gpu, false, fmt::format("get compute processes of GPU {}", gpu),
      [&](sim::State& s) { return sim::Processes(s, gpu, std::nullopt, std::nullopt); });
}

absl::StatusOr<std::vector<ProcessInfo>> SimNvml::GetMigDeviceProcesses(uint32_t gpu,
                                                                        uint32_t gi_id,
                                                                        uint32_t ci_id) {
  return Call<std::vector<ProcessInfo>>(
      "GetMigDeviceProcesses", gpu, false,
      fmt::format("get compute processes of GPU {} GI {} CI {}", gpu, gi_id, ci_id),
      [&](sim::State& s) { return sim::Processes(s, gpu, gi_id, ci_id); });
}

absl::StatusOr<MigMinors> SimNvml::GetMigMinors() {
  static const MigMinors* const kMinors = [] {
    auto parsed = MigMinors::Parse(MigMinors::Generate());
    return new MigMinors(parsed.ok() ? *std::move(parsed) : MigMinors());
  }();
  return Call<MigMinors>("GetMigMinors", std::nullopt, false, "read mig-minors",
                         [](sim::State&) -> absl::StatusOr<MigMinors> { return *kMinors; });
}

absl::StatusOr<MigModeState> SimNvml::GetMigMode(uint32_t gpu) {
  return Call<MigModeState>("GetMigMode", gpu, false, fmt::format("get MIG mode of GPU {}", gpu),
                            [&](sim::State& s) { return sim::GetMigMode(s, gpu); });
}

absl::StatusOr<MigModeChange> SimNvml::SetMigMode(uint32_t gpu, bool enabled) {
  return Call<MigModeChange>("SetMigMode", gpu, true, fmt::format("set MIG mode on GPU {}", gpu),
                             [&](sim::State& s) { return sim::SetMigMode(s, gpu, enabled); });
}

absl::Status SimNvml::ResetGpu(uint32_t gpu) {
  return CallStatus("ResetGpu", gpu, fmt::format("reset GPU {}", gpu),
                    [&](sim::State& s) { return sim::ResetGpu(s, gpu); });
}

absl::Status SimNvml::RebootHost() {
  return CallStatus("RebootHost", std::nullopt, "reboot the host",
                    [&](sim::State& s) { return sim::RebootHost(s); });
}

absl::Status SimNvml::SetRebootRequired(uint32_t gpu, bool required) {
  return CallStatus("SetRebootRequired", gpu, fmt::format("mark GPU {} reboot-required", gpu),
                    [&](sim::State& s) { return sim::SetRebootRequired(s, gpu, required); });
}

absl::Status SimNvml::AttachProcess(std::string_view uuid, uint32_t pid, uint64_t used_memory_mib) {
  return CallStatus("AttachProcess", std::nullopt, "attach process",
                    [&](sim::State& s) { return sim::Attach(s, uuid, pid, used_memory_mib); });
}

absl::Status SimNvml::DetachProcess(std::string_view uuid, uint32_t pid) {
  return CallStatus("DetachProcess", std::nullopt, "detach process",
                    [&](sim::State& s) { return sim::Detach(s, uuid, pid); });
}

absl::Status SimNvml::HoldGpuInstance(uint32_t gpu, uint32_t gi, std::string_view holder) {
  return CallStatus("HoldGpuInstance", gpu, "hold GPU instance",
                    [&](sim::State& s) { return sim::Hold(s, gpu, gi, holder); });
}

absl::Status SimNvml::ReleaseGpuInstance(uint32_t gpu, uint32_t gi, std::string_view holder) {
  return CallStatus("ReleaseGpuInstance", gpu, "release GPU instance",
                    [&](sim::State& s) { return sim::Release(s, gpu, gi, holder); });
}

absl::StatusOr<std::vector<SimHolder>> SimNvml::Holders() {
  return Call<std::vector<SimHolder>>("Holders", std::nullopt, false, "list holders",
                                      [](sim::State& s) -> absl::StatusOr<std::vector<SimHolder>> {
                                        std::vector<SimHolder> out;
                                        for (uint32_t g = 0; g < s.gpus.size(); ++g) {
                                          for (const auto& h : s.gpus[g].holders)
                                            out.push_back({g, h.gi, h.name});
                                        }
                                        return out;
                                      });
}

absl::Status SimNvml::InjectFault(SimFault fault) {
  if (auto st = CheckOperation(fault.op); !st.ok()) return st;
  if (fault.nth == 0) {
    return absl::InvalidArgumentError(
        fmt::format("fault on {}: nth counts calls from 1, not 0", fault.op));
  }
  if (fault.code == NvmlReturn::kSuccess) {
    return absl::InvalidArgumentError(
        fmt::format("fault on {}: the code must be an error, not NVML_SUCCESS", fault.op));
  }
  fault.calls = 0;
  return CallStatus("InjectFault", std::nullopt, "inject fault", [&](sim::State& s) {
    s.faults.push_back(fault);
    return absl::OkStatus();
  });
}

absl::Status SimNvml::SetLatency(std::string_view op, std::chrono::milliseconds latency) {
  if (auto st = CheckOperation(op); !st.ok()) return st;
  if (latency.count() < 0) {
    return absl::InvalidArgumentError(fmt::format("latency of {} must not be negative", op));
  }
  return CallStatus("SetLatency", std::nullopt, "set latency", [&](sim::State& s) {
    if (latency.count() == 0) {
      s.latency_ms.erase(std::string(op));
    } else {
      s.latency_ms[std::string(op)] = latency.count();
    }
    return absl::OkStatus();
  });
}

absl::Status SimNvml::ClearFaults() {
  return CallStatus("ClearFaults", std::nullopt, "clear faults", [](sim::State& s) {
    s.faults.clear();
    s.latency_ms.clear();
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<SimFault>> SimNvml::Faults() {
  return Call<std::vector<SimFault>>(
      "Faults", std::nullopt, false, "list faults",
      [](sim::State& s) -> absl::StatusOr<std::vector<SimFault>> { return s.faults; });
}

}  // namespace dynmig::nvml
