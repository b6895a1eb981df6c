#include "nvml/sim_state.h"

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <nlohmann/json.hpp>

#include "common/strings.h"
#include "fmt/format.h"
#include "fmt/ranges.h"

namespace dynmig::nvml {

// ---------------------------------------------------------------------------------------------
// Spec and identities

namespace {

mig::CatalogueModel NonMigModel(std::string name, std::string architecture, uint32_t pci_id,
                                uint64_t total_mib) {
  mig::CatalogueModel m;
  m.capability.model = name;
  m.capability.total_memory_mib = total_mib;
  m.architecture = std::move(architecture);
  m.names = {std::move(name)};
  m.pci_device_ids = {pci_id};
  return m;
}

// "t4" for "Tesla T4", "NVIDIA T4" and "T4": the board name without its brand, lower case.
std::string BareBoardName(std::string_view name) {
  std::string out(name);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (std::string_view prefix : {"nvidia ", "tesla "}) {
    if (out.size() > prefix.size() && std::string_view(out).substr(0, prefix.size()) == prefix) {
      out.erase(0, prefix.size());
    }
  }
  return out;
}

}  // namespace

const std::vector<mig::CatalogueModel>& NonMigSimModels() {
  // Names, PCI ids and memory as nvidia-smi reports them on these boards (they are not in the MIG
  // facts table, which lists MIG-capable GPUs only).
  static const auto* models = new std::vector<mig::CatalogueModel>{
      NonMigModel("Tesla T4", "Turing (TU104)", 0x1EB810DE, 15360),
      NonMigModel("NVIDIA L4", "Ada Lovelace (AD104)", 0x27B810DE, 23034),
  };
  return *models;
}

const mig::CatalogueModel* FindNonMigSimModel(std::string_view query) {
  const std::string want = BareBoardName(Trim(query));
  for (const auto& m : NonMigSimModels()) {
    if (BareBoardName(m.capability.model) == want) return &m;
  }
  return nullptr;
}

absl::StatusOr<std::vector<const mig::CatalogueModel*>> ParseSimSpec(std::string_view spec) {
  std::vector<const mig::CatalogueModel*> out;
  const auto pieces = SplitTrimmed(spec, ',');
  if (pieces.empty()) {
    return absl::InvalidArgumentError(fmt::format(
        "simulator spec \"{}\" names no GPU (expected MODELxCOUNT[,MODELxCOUNT...], e.g. "
        "\"A100-SXM4-40GBx2,H100 80GBx1\")",
        spec));
  }
  for (const std::string& piece : pieces) {
    std::string_view model = piece;
    uint32_t count = 1;
    const size_t x = piece.rfind('x');
    if (x != std::string::npos) {
      std::string_view digits = std::string_view(piece).substr(x + 1);
      uint32_t n = 0;
      auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
      const bool numeric =
          !digits.empty() && ec == std::errc() && ptr == digits.data() + digits.size();
      if (!numeric && mig::FindModel(piece).ok()) {
        // A model name with an 'x' of its own ("... Max-Q ...") and no count.
        out.push_back(*mig::FindModel(piece));
        continue;
      }
      if (!numeric || n == 0) {
        return absl::InvalidArgumentError(fmt::format(
            "simulator spec \"{}\": bad GPU count \"{}\" in \"{}\" (expected MODELxCOUNT with "
            "COUNT >= 1, e.g. \"A30x2\")",
            spec, digits, piece));
      }
      count = n;
      model = Trim(std::string_view(piece).substr(0, x));
    }
    auto found = mig::FindModel(model);
    if (const auto* plain = found.ok() ? nullptr : FindNonMigSimModel(model); plain != nullptr) {
      found = plain;
    }
    if (!found.ok()) {
      std::vector<std::string> plain;
      for (const auto& m : NonMigSimModels()) plain.push_back(m.capability.model);
      return absl::Status(
          found.status().code(),
          fmt::format("simulator spec \"{}\": {} (without MIG: {})", spec,
                      std::string(found.status().message()), fmt::join(plain, ", ")));
    }
    if (out.size() + count > kMaxMigMinorGpus) {
      return absl::InvalidArgumentError(
          fmt::format("simulator spec \"{}\" asks for more than {} GPUs", spec, kMaxMigMinorGpus));
    }
    out.insert(out.end(), count, *found);
  }
  if (out.size() > kMaxMigMinorGpus) {
    return absl::InvalidArgumentError(
        fmt::format("simulator spec \"{}\" asks for more than {} GPUs", spec, kMaxMigMinorGpus));
  }
  return out;
}

namespace {

std::array<unsigned char, 20> Sha1(std::string_view data) {
  std::array<unsigned char, 20> md{};
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md.data(), &len, EVP_sha1(), nullptr);
  return md;
}

std::string FormatUuid(const unsigned char* b) {
  return fmt::format(
      "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-"
      "{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
      b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
      b[15]);
}

// The 16 bytes of a "GPU-<uuid>" (or bare) UUID; hex digits only, anything else is skipped.
std::string UuidBytes(std::string_view uuid) {
  if (uuid.starts_with("GPU-")) uuid.remove_prefix(4);
  std::string out;
  int nibble = -1;
  for (char c : uuid) {
    int v = -1;
    if (c >= '0' && c <= '9') v = c - '0';
    if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
    if (v < 0) continue;
    if (nibble < 0) {
      nibble = v;
    } else {
      out.push_back(static_cast<char>(nibble * 16 + v));
      nibble = -1;
    }
  }
  return out;
}

}  // namespace

std::string SimGpuUuid(std::string_view seed, uint32_t index) {
  const auto md = Sha1(fmt::format("dynmig-sim-gpu/{}/{}", seed, index));
  return "GPU-" + FormatUuid(md.data());
}

std::string SimPciBusId(uint32_t index) {
  // The bus numbers of an 8-GPU HGX board, then a plain sequence.
  constexpr uint32_t kBuses[] = {0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD};
  const uint32_t bus = index < 8 ? kBuses[index] : 0xC0 + (index - 8);
  return fmt::format("00000000:{:02X}:00.0", bus);
}

std::string SimMigUuid(std::string_view gpu_uuid, uint32_t gi_id, uint32_t ci_id) {
  // RFC 4122 name-based (SHA-1): namespace = the GPU UUID's bytes, name = "<gi>/<ci>".
  const std::string name = UuidBytes(gpu_uuid) + fmt::format("{}/{}", gi_id, ci_id);
  auto md = Sha1(name);
  md[6] = static_cast<unsigned char>((md[6] & 0x0F) | 0x50);
  md[8] = static_cast<unsigned char>((md[8] & 0x3F) | 0x80);
  return "MIG-" + FormatUuid(md.data());
}

namespace sim {
namespace {

using Json = nlohmann::json;

std::string Pl(const mig::Placement& p) { return fmt::format("{}:{}", p.start, p.size); }

bool IsAmpere(const GpuState& g) { return g.model->architecture.starts_with("Ampere"); }

const mig::ProfileSpec* ProfileById(const GpuState& g, uint32_t id) {
  for (const auto& p : g.model->capability.profiles) {
    if (p.nvml_id == id) return &p;
  }
  return nullptr;
}

const mig::ProfileSpec* ProfileByIndex(const GpuState& g, uint32_t index) {
  for (const auto& p : g.model->capability.profiles) {
    if (p.nvml_index == index) return &p;
  }
  return nullptr;
}

bool IsAllMe(uint32_t index) { return index == 0xF || index == 0x10; }
bool IsNoMe(uint32_t index) { return index == 0xD || index == 0xE; }

// NVML_COMPUTE_INSTANCE_PROFILE_* index (= id) of a CI with this many compute slices.
std::optional<uint32_t> CiProfileForSlices(uint32_t slices) {
  switch (slices) {
    case 1:
      return 0;
    case 2:
      return 1;
    case 3:
      return 2;
    case 4:
      return 3;
    case 7:
      return 4;
    case 8:
      return 5;
    case 6:
      return 6;
    default:
      return std::nullopt;
  }
}

absl::StatusOr<GpuState*> Gpu(State& s, uint32_t gpu, std::string_view context) {
  if (gpu >= s.gpus.size()) {
    return NvmlStatus(
        NvmlReturn::kInvalidArgument,
        fmt::format("{}: no GPU {} (the simulator has {})", context, gpu, s.gpus.size()));
  }
  return &s.gpus[gpu];
}

absl::StatusOr<const GpuState*> Gpu(const State& s, uint32_t gpu, std::string_view context) {
  auto g = Gpu(const_cast<State&>(s), gpu, context);
  if (!g.ok()) return g.status();
  return *g;
}

absl::Status RequireMig(const GpuState& g, uint32_t gpu, std::string_view context) {
  if (g.mig_current) return absl::OkStatus();
  return NvmlStatus(NvmlReturn::kNotSupported,
                    fmt::format("{}: MIG mode is disabled on GPU {}{}", context, gpu,
                                g.mig_pending ? " (enabled after the next GPU reset)" : ""));
}

template <typename G>
auto FindGi(G& g, uint32_t gi_id) -> decltype(&g.gis.front()) {
  for (auto& gi : g.gis) {
    if (gi.id == gi_id) return &gi;
  }
  return nullptr;
}

GpuInstanceInfo GiInfo(uint32_t gpu, const GiState& gi) {
  return GpuInstanceInfo{
      .gpu = gpu, .id = gi.id, .profile_id = gi.profile_id, .placement = gi.placement};
}

ComputeInstanceInfo CiInfo(uint32_t gpu, const GiState& gi, const CiState& ci) {
  return ComputeInstanceInfo{.gpu = gpu,
                             .gpu_instance_id = gi.id,
                             .id = ci.id,
                             .profile_id = ci.profile_id,
                             .placement = ci.placement,
                             .mig_uuid = ci.uuid};
}

// --- JSON ------------------------------------------------------------------------------------

Json PlacementJson(const mig::Placement& p) { return Json{{"start", p.start}, {"size", p.size}}; }

mig::Placement PlacementFrom(const Json& j) {
  return mig::Placement{j.at("start").get<uint32_t>(), j.at("size").get<uint32_t>()};
}

}  // namespace

bool IsKnownOperation(std::string_view op) {
  return std::find(std::begin(kSimOperations), std::end(kSimOperations), op) !=
         std::end(kSimOperations);
}

std::optional<uint32_t> GpuInstanceIdFor(const GpuState& g, const mig::Placement& placement) {
  mig::Placement physical = placement;
  const uint32_t units = g.model->capability.placement_units;
  if (g.swapped_halves && placement.size * 2 <= units) {
    // NVML's slice = the physical slice rotated by half the axis (XOR 4 on 8-slice GPUs).
    physical.start = (placement.start + units / 2) % units;
  }
  for (const auto& [p, id] : g.model->gpu_instance_id_by_placement) {
    if (p == physical) return id;
  }
  // Spans the NVML placement list never shows in the identity layout (slice 7 on its own, the
  // swapped image of 3:1): RM's swizzId ranges, full 0, halves 1-2, quarters 3-6, eighths 7-14.
  if (physical.size == 0 || units % physical.size != 0 || physical.start % physical.size != 0) {
    return std::nullopt;
  }
  switch (units / physical.size) {
    case 1:
      return 0;
    case 2:
      return 1 + physical.start / physical.size;
    case 4:
      return 3 + physical.start / physical.size;
    case 8:
      return 7 + physical.start / physical.size;
    default:
      return std::nullopt;
  }
}

absl::StatusOr<State> NewState(std::string_view spec, std::string_view seed,
                               const std::vector<uint32_t>& swapped_halves_gpus) {
  auto models = ParseSimSpec(spec);
  if (!models.ok()) return models.status();
  State s;
  s.spec = std::string(spec);
  s.seed = std::string(seed);
  for (uint32_t i = 0; i < models->size(); ++i) {
    GpuState g;
    g.model = (*models)[i];
    g.uuid = SimGpuUuid(seed, i);
    g.pci_bus_id = SimPciBusId(i);
    g.minor = i;
    g.mig_current = g.mig_pending = HasMig(g);
    g.swapped_halves = std::find(swapped_halves_gpus.begin(), swapped_halves_gpus.end(), i) !=
                       swapped_halves_gpus.end();
    s.gpus.push_back(std::move(g));
  }
  for (uint32_t i : swapped_halves_gpus) {
    if (i >= s.gpus.size()) {
      return absl::InvalidArgumentError(
          fmt::format("swapped-halves GPU {} does not exist (the spec \"{}\" has {} GPUs)", i, spec,
                      s.gpus.size()));
    }
  }
  return s;
}

std::string ToJson(const State& s) {
  Json gpus = Json::array();
  for (const auto& g : s.gpus) {
    Json gis = Json::array();
    for (const auto& gi : g.gis) {
      Json cis = Json::array();
      for (const auto& ci : gi.cis) {
        cis.push_back({{"id", ci.id},
                       {"profileId", ci.profile_id},
                       {"placement", PlacementJson(ci.placement)},
                       {"uuid", ci.uuid}});
      }
      gis.push_back({{"id", gi.id},
                     {"profileId", gi.profile_id},
                     {"placement", PlacementJson(gi.placement)},
                     {"computeInstances", cis}});
    }
    Json procs = Json::array();
    for (const auto& p : g.processes) {
      Json j = {{"pid", p.pid}, {"usedMemoryMiB", p.used_memory_mib}};
      j["gpuInstanceId"] = p.gi ? Json(*p.gi) : Json(nullptr);
      j["computeInstanceId"] = p.ci ? Json(*p.ci) : Json(nullptr);
      procs.push_back(std::move(j));
    }
    Json holders = Json::array();
    for (const auto& h : g.holders) holders.push_back({{"gpuInstanceId", h.gi}, {"name", h.name}});
    gpus.push_back({{"model", g.model->capability.model},
                    {"uuid", g.uuid},
                    {"pciBusId", g.pci_bus_id},
                    {"minor", g.minor},
                    {"migMode", {{"current", g.mig_current}, {"pending", g.mig_pending}}},
                    {"layout", g.swapped_halves ? "swapped-halves" : "identity"},
                    {"rebootRequired", g.reboot_required},
                    {"gpuInstances", gis},
                    {"processes", procs},
                    {"holders", holders}});
  }
  Json faults = Json::array();
  for (const auto& f : s.faults) {
    Json j = {{"op", f.op},
              {"nth", f.nth},
              {"times", f.times},
              {"code", NvmlReturnName(f.code)},
              {"calls", f.calls}};
    j["gpu"] = f.gpu ? Json(*f.gpu) : Json(nullptr);
    faults.push_back(std::move(j));
  }
  Json latency = Json::object();
  for (const auto& [op, ms] : s.latency_ms) latency[op] = ms;
  Json root = {{"version", kStateVersion}, {"spec", s.spec},      {"seed", s.seed}, {"gpus", gpus},
               {"faults", faults},         {"latencyMs", latency}};
  return root.dump(2) + "\n";
}

absl::StatusOr<State> FromJson(std::string_view text, std::string_view source) {
  auto bad = [&](std::string_view why) {
    return absl::FailedPreconditionError(
        fmt::format("simulator state file {} is not valid: {}", source, why));
  };
  try {
    const Json root = Json::parse(text);
    if (!root.is_object()) return bad("not a JSON object");
    const int version = root.value("version", 0);
    if (version != kStateVersion) {
      return bad(fmt::format("version {} (this dynmig reads version {})", version, kStateVersion));
    }
    State s;
    s.spec = root.at("spec").get<std::string>();
    s.seed = root.value("seed", std::string());
    uint32_t index = 0;
    for (const auto& jg : root.at("gpus")) {
      GpuState g;
      const auto model = jg.at("model").get<std::string>();
      g.model = mig::FindModelByNvmlName(model);
      if (g.model == nullptr) {
        for (const auto& m : NonMigSimModels()) {
          if (m.capability.model == model) g.model = &m;
        }
      }
      if (g.model == nullptr) return bad(fmt::format("GPU {}: unknown model \"{}\"", index, model));
      g.uuid = jg.at("uuid").get<std::string>();
      g.pci_bus_id = jg.at("pciBusId").get<std::string>();
      g.minor = jg.at("minor").get<uint32_t>();
      g.mig_current = jg.at("migMode").at("current").get<bool>();
      g.mig_pending = jg.at("migMode").at("pending").get<bool>();
      g.swapped_halves = jg.value("layout", std::string("identity")) == "swapped-halves";
      g.reboot_required = jg.value("rebootRequired", false);  // absent in older files
      if (!HasMig(g) && (g.mig_current || g.mig_pending)) {
        return bad(fmt::format("GPU {}: {} has no MIG, but its MIG mode is enabled", index, model));
      }
      for (const auto& jgi : jg.at("gpuInstances")) {
        GiState gi;
        gi.id = jgi.at("id").get<uint32_t>();
        gi.profile_id = jgi.at("profileId").get<uint32_t>();
        gi.placement = PlacementFrom(jgi.at("placement"));
        for (const auto& jci : jgi.at("computeInstances")) {
          CiState ci;
          ci.id = jci.at("id").get<uint32_t>();
          ci.profile_id = jci.at("profileId").get<uint32_t>();
          ci.placement = PlacementFrom(jci.at("placement"));
          ci.uuid = jci.at("uuid").get<std::string>();
          gi.cis.push_back(std::move(ci));
        }
        std::sort(gi.cis.begin(), gi.cis.end(),
                  [](const CiState& a, const CiState& b) { return a.id < b.id; });
        g.gis.push_back(std::move(gi));
      }
      std::sort(g.gis.begin(), g.gis.end(),
                [](const GiState& a, const GiState& b) { return a.id < b.id; });
      for (const auto& jp : jg.at("processes")) {
        ProcState p;
        p.pid = jp.at("pid").get<uint32_t>();
        p.used_memory_mib = jp.value("usedMemoryMiB", uint64_t{0});
        if (jp.contains("gpuInstanceId") && !jp["gpuInstanceId"].is_null()) {
          p.gi = jp["gpuInstanceId"].get<uint32_t>();
        }
        if (jp.contains("computeInstanceId") && !jp["computeInstanceId"].is_null()) {
          p.ci = jp["computeInstanceId"].get<uint32_t>();
        }
        g.processes.push_back(p);
      }
      if (jg.contains("holders")) {  // absent in files written before holders existed
        for (const auto& jh : jg.at("holders")) {
          HolderState h;
          h.gi = jh.at("gpuInstanceId").get<uint32_t>();
          h.name = jh.at("name").get<std::string>();
          g.holders.push_back(std::move(h));
        }
        if (g.holders.size() > kMaxHoldersPerGpu) {
          return bad(fmt::format("GPU {}: {} holders (at most {})", index, g.holders.size(),
                                 kMaxHoldersPerGpu));
        }
      }
      s.gpus.push_back(std::move(g));
      ++index;
    }
    if (root.contains("faults")) {
      for (const auto& jf : root.at("faults")) {
        SimFault f;
        f.op = jf.at("op").get<std::string>();
        f.nth = jf.at("nth").get<uint32_t>();
        f.times = jf.value("times", 1u);
        auto code = ParseNvmlReturn(jf.at("code").get<std::string>());
        if (!code.ok()) return bad(std::string(code.status().message()));
        f.code = *code;
        f.calls = jf.value("calls", 0u);
        if (jf.contains("gpu") && !jf["gpu"].is_null()) f.gpu = jf["gpu"].get<uint32_t>();
        s.faults.push_back(std::move(f));
      }
    }
    if (root.contains("latencyMs")) {
      for (const auto& [op, ms] : root.at("latencyMs").items()) {
        s.latency_ms[op] = ms.get<int64_t>();
      }
    }
    return s;
  } catch (const nlohmann::json::exception& e) {
    return bad(e.what());
  }
}

// --- Operations ------------------------------------------------------------------------------

absl::StatusOr<GpuInfo> GetGpu(const State& s, uint32_t gpu) {
  auto g = Gpu(s, gpu, "get GPU info");
  if (!g.ok()) return g.status();
  const GpuState& st = **g;
  GpuInfo info;
  info.index = gpu;
  info.uuid = st.uuid;
  info.name = st.model->capability.model;
  info.pci_bus_id = st.pci_bus_id;
  info.pci_device_id = st.model->pci_device_ids.empty() ? 0 : st.model->pci_device_ids.front();
  info.minor = st.minor;
  info.total_memory_mib = st.model->capability.total_memory_mib;
  info.total_memory_bytes = info.total_memory_mib << 20;
  info.mig =
      MigModeState{.supported = HasMig(st), .current = st.mig_current, .pending = st.mig_pending};
  return info;
}

absl::StatusOr<GpuInstanceProfileInfo> GetProfileInfo(const State& s, uint32_t gpu,
                                                      uint32_t profile_index) {
  const std::string context = fmt::format(
      "get GPU instance profile info for profile index {} on GPU {}", profile_index, gpu);
  auto g = Gpu(s, gpu, context);
  if (!g.ok()) return g.status();
  if (profile_index >= kGpuInstanceProfileCount) {
    return NvmlStatus(NvmlReturn::kInvalidArgument,
                      fmt::format("{}: index beyond NVML_GPU_INSTANCE_PROFILE_COUNT ({})", context,
                                  kGpuInstanceProfileCount));
  }
  const auto* p = ProfileByIndex(**g, profile_index);
  if (p == nullptr) {
    return NvmlStatus(NvmlReturn::kNotSupported, fmt::format("{}: {} has no such profile", context,
                                                             (*g)->model->capability.model));
  }
  return GpuInstanceProfileInfo{.index = profile_index,
                                .id = p->nvml_id,
                                .slice_count = p->compute_slices,
                                .instance_count = p->instance_count,
                                .memory_mib = p->memory_mib,
                                .multiprocessor_count = p->multiprocessor_count,
                                .copy_engines = p->copy_engines,
                                .decoders = p->decoders,
                                .encoders = p->encoders,
                                .jpegs = p->jpegs,
                                .ofas = p->ofas};
}

absl::StatusOr<std::vector<mig::Placement>> GetPlacements(const State& s, uint32_t gpu,
                                                          uint32_t profile_id) {
  const std::string context =
      fmt::format("get possible placements of GPU instance profile {} on GPU {}", profile_id, gpu);
  auto g = Gpu(s, gpu, context);
  if (!g.ok()) return g.status();
  if (!HasMig(**g)) {
    return NvmlStatus(NvmlReturn::kNotSupported,
                      fmt::format("{}: {} has no MIG", context, (*g)->model->capability.model));
  }
  const auto* p = ProfileById(**g, profile_id);
  if (p == nullptr) {
    return NvmlStatus(NvmlReturn::kInvalidArgument,
                      fmt::format("{}: {} has no profile id {}", context,
                                  (*g)->model->capability.model, profile_id));
  }
  return p->placements;
}

absl::StatusOr<GpuInstanceInfo> CreateGi(State& s, uint32_t gpu, uint32_t profile_id,
                                         const mig::Placement& placement) {
  const std::string context =
      fmt::format("create GPU instance of profile id {} at placement {} on GPU {}", profile_id,
                  Pl(placement), gpu);
  auto gp = Gpu(s, gpu, context);
  if (!gp.ok()) return gp.status();
  GpuState& g = **gp;
  if (auto st = RequireMig(g, gpu, context); !st.ok()) return st;
  const auto* p = ProfileById(g, profile_id);
  if (p == nullptr) {
    return NvmlStatus(
        NvmlReturn::kInvalidArgument,
        fmt::format("{}: {} has no profile id {}", context, g.model->capability.model, profile_id));
  }
  if (!p->IsLegal(placement)) {
    std::vector<std::string> legal;
    for (const auto& l : p->placements) legal.push_back(Pl(l));
    return NvmlStatus(
        NvmlReturn::kInvalidArgument,
        fmt::format("{}: {} allows only placements {}", context, p->name, fmt::join(legal, ", ")));
  }
  uint32_t same_profile = 0;
  uint32_t used_compute = 0;
  for (const auto& gi : g.gis) {
    if (gi.profile_id == profile_id) ++same_profile;
    if (gi.placement.Overlaps(placement)) {
      return NvmlStatus(
          NvmlReturn::kInsufficientResources,
          fmt::format("{}: overlaps GPU instance {} at {}", context, gi.id, Pl(gi.placement)));
    }
    const auto* other = ProfileById(g, gi.profile_id);
    if (other != nullptr) {
      used_compute += other->compute_slices;
      if (IsAllMe(other->nvml_index) && !IsNoMe(p->nvml_index)) {
        return NvmlStatus(NvmlReturn::kInsufficientResources,
                          fmt::format("{}: GPU instance {} ({}) holds all media engines; only -me "
                                      "profiles fit beside it",
                                      context, gi.id, other->name));
      }
      if (IsAllMe(p->nvml_index) && !IsNoMe(other->nvml_index)) {
        return NvmlStatus(NvmlReturn::kInsufficientResources,
                          fmt::format("{}: {} needs every media engine, but GPU instance {} ({}) "
                                      "shares them",
                                      context, p->name, gi.id, other->name));
      }
    }
  }
  if (same_profile >= p->instance_count) {
    return NvmlStatus(
        NvmlReturn::kInsufficientResources,
        fmt::format("{}: all {} instances of {} exist", context, p->instance_count, p->name));
  }
  if (used_compute + p->compute_slices > g.model->capability.compute_slices) {
    return NvmlStatus(NvmlReturn::kInsufficientResources,
                      fmt::format("{}: only {} of {} compute slices are free", context,
                                  g.model->capability.compute_slices - used_compute,
                                  g.model->capability.compute_slices));
  }
  const auto id = GpuInstanceIdFor(g, placement);
  if (!id.has_value()) {
    return NvmlStatus(
        NvmlReturn::kUnknown,
        fmt::format("{}: the catalogue has no GPU instance id for this placement", context));
  }
  if (FindGi(g, *id) != nullptr) {
    return NvmlStatus(NvmlReturn::kInsufficientResources,
                      fmt::format("{}: GPU instance id {} is taken", context, *id));
  }
  GiState gi{.id = *id, .profile_id = profile_id, .placement = placement, .cis = {}};
  auto pos = std::lower_bound(g.gis.begin(), g.gis.end(), *id,
                              [](const GiState& a, uint32_t v) { return a.id < v; });
  g.gis.insert(pos, gi);
  return GiInfo(gpu, gi);
}

absl::StatusOr<std::vector<GpuInstanceInfo>> ListGis(const State& s, uint32_t gpu) {
  const std::string context = fmt::format("list GPU instances on GPU {}", gpu);
  auto g = Gpu(s, gpu, context);
  if (!g.ok()) return g.status();
  if (auto st = RequireMig(**g, gpu, context); !st.ok()) return st;
  std::vector<GpuInstanceInfo> out;
  for (const auto& gi : (*g)->gis) out.push_back(GiInfo(gpu, gi));
  return out;
}

absl::Status DestroyGi(State& s, uint32_t gpu, uint32_t gi_id) {
  const std::string context = fmt::format("destroy GPU instance {} on GPU {}", gi_id, gpu);
  auto gp = Gpu(s, gpu, context);
  if (!gp.ok()) return gp.status();
  GpuState& g = **gp;
  if (auto st = RequireMig(g, gpu, context); !st.ok()) return st;
  GiState* gi = FindGi(g, gi_id);
  if (gi == nullptr) {
    return NvmlStatus(NvmlReturn::kNotFound, fmt::format("{}: no such GPU instance", context));
  }
  for (const auto& p : g.processes) {
    if (p.gi == gi_id) {
      return NvmlStatus(NvmlReturn::kInUse,
                        fmt::format("{}: process {} runs on it", context, p.pid));
    }
  }
  for (const auto& h : g.holders) {
    if (h.gi == gi_id) {
      // What nvidia-smi prints for it: the driver does not say who the other client is.
      return NvmlStatus(NvmlReturn::kInUse, fmt::format("{}: in use by another client", context));
    }
  }
  if (!gi->cis.empty()) {
    std::vector<uint32_t> ids;
    for (const auto& ci : gi->cis) ids.push_back(ci.id);
    return NvmlStatus(NvmlReturn::kInUse, fmt::format("{}: compute instances {} still exist",
                                                      context, fmt::join(ids, ", ")));
  }
  g.gis.erase(g.gis.begin() + (gi - g.gis.data()));
  return absl::OkStatus();
}

absl::StatusOr<ComputeInstanceInfo> CreateCi(State& s, uint32_t gpu, uint32_t gi_id,
                                             uint32_t slices) {
  const std::string context =
      slices == 0 ? fmt::format("create compute instance in GPU instance {} on GPU {}", gi_id, gpu)
                  : fmt::format("create {}-slice compute instance in GPU instance {} on GPU {}",
                                slices, gi_id, gpu);
  auto gp = Gpu(s, gpu, context);
  if (!gp.ok()) return gp.status();
  GpuState& g = **gp;
  if (auto st = RequireMig(g, gpu, context); !st.ok()) return st;
  GiState* gi = FindGi(g, gi_id);
  if (gi == nullptr) {
    return NvmlStatus(NvmlReturn::kNotFound, fmt::format("{}: no such GPU instance", context));
  }
  const auto* gp_profile = ProfileById(g, gi->profile_id);
  if (gp_profile == nullptr) {
    return NvmlStatus(
        NvmlReturn::kUnknown,
        fmt::format("{}: GPU instance has unknown profile id {}", context, gi->profile_id));
  }
  const uint32_t total = gp_profile->compute_slices;
  if (slices == 0) slices = total;
  const auto ci_profile = CiProfileForSlices(slices);
  // The CI sizes a GI offers (go-nvlib's rule, matching observed -lcip tables): all of it, or c
  // slices with 2c <= G+1.
  if (!ci_profile.has_value() || slices > total || (slices < total && 2 * slices > total + 1)) {
    return NvmlStatus(NvmlReturn::kNotSupported,
                      fmt::format("{}: a {} GPU instance offers no {}-slice compute instance",
                                  context, gp_profile->name, slices));
  }
  const uint32_t instance_count = slices == total ? 1 : total / slices;
  uint32_t same = 0;
  uint32_t used_mask = 0;
  for (const auto& ci : gi->cis) {
    if (ci.profile_id == *ci_profile) ++same;
    used_mask |= ci.placement.Mask();
  }
  if (same >= instance_count) {
    return NvmlStatus(
        NvmlReturn::kInsufficientResources,
        fmt::format("{}: all {} such compute instances exist", context, instance_count));
  }
  std::optional<mig::Placement> placement;
  for (uint32_t start = 0; start + slices <= total; start += slices) {
    mig::Placement candidate{start, slices};
    if ((candidate.Mask() & used_mask) == 0) {
      placement = candidate;
      break;
    }
  }
  if (!placement.has_value()) {
    return NvmlStatus(NvmlReturn::kInsufficientResources,
                      fmt::format("{}: no {} free compute slices", context, slices));
  }
  std::optional<uint32_t> id;
  for (uint32_t candidate = 0; candidate <= kMaxComputeInstanceId && !id; ++candidate) {
    bool taken = false;
    for (const auto& ci : gi->cis) taken = taken || ci.id == candidate;
    if (!taken) id = candidate;
  }
  if (!id.has_value()) {
    return NvmlStatus(NvmlReturn::kInsufficientResources,
                      fmt::format("{}: no free compute instance id", context));
  }
  CiState ci{.id = *id,
             .profile_id = *ci_profile,
             .placement = *placement,
             .uuid = SimMigUuid(g.uuid, gi_id, *id)};
  auto pos = std::lower_bound(gi->cis.begin(), gi->cis.end(), *id,
                              [](const CiState& a, uint32_t v) { return a.id < v; });
  gi->cis.insert(pos, ci);
  return CiInfo(gpu, *gi, ci);
}

absl::StatusOr<std::vector<ComputeInstanceInfo>> ListCis(const State& s, uint32_t gpu,
                                                         uint32_t gi_id) {
  const std::string context =
      fmt::format("list compute instances of GPU instance {} on GPU {}", gi_id, gpu);
  auto g = Gpu(s, gpu, context);
  if (!g.ok()) return g.status();
  if (auto st = RequireMig(**g, gpu, context); !st.ok()) return st;
  const GiState* gi = FindGi(**g, gi_id);
  if (gi == nullptr) {
    return NvmlStatus(NvmlReturn::kNotFound, fmt::format("{}: no such GPU instance", context));
  }
  std::vector<ComputeInstanceInfo> out;
  for (const auto& ci : gi->cis) out.push_back(CiInfo(gpu, *gi, ci));
  return out;
}

namespace {

absl::StatusOr<std::pair<const GiState*, const CiState*>> FindCi(const State& s, uint32_t gpu,
                                                                 uint32_t gi_id, uint32_t ci_id,
                                                                 std::string_view context) {
  auto g = Gpu(s, gpu, context);
  if (!g.ok()) return g.status();
  if (auto st = RequireMig(**g, gpu, context); !st.ok()) return st;
  const GiState* gi = FindGi(**g, gi_id);
  if (gi == nullptr) {
    return NvmlStatus(NvmlReturn::kNotFound, fmt::format("{}: no GPU instance {}", context, gi_id));
  }
  for (const auto& ci : gi->cis) {
    if (ci.id == ci_id) return std::make_pair(gi, &ci);
  }
  return NvmlStatus(
      NvmlReturn::kNotFound,
      fmt::format("{}: GPU instance {} has no compute instance {}", context, gi_id, ci_id));
}

}  // namespace

absl::StatusOr<std::string> MigUuid(const State& s, uint32_t gpu, uint32_t gi_id, uint32_t ci_id) {
  auto found = FindCi(s, gpu, gi_id, ci_id,
                      fmt::format("get MIG device UUID of GPU {} GI {} CI {}", gpu, gi_id, ci_id));
  if (!found.ok()) return found.status();
  return found->second->uuid;
}

absl::Status DestroyCi(State& s, uint32_t gpu, uint32_t gi_id, uint32_t ci_id) {
  const std::string context =
      fmt::format("destroy compute instance {} of GPU instance {} on GPU {}", ci_id, gi_id, gpu);
  auto found = FindCi(s, gpu, gi_id, ci_id, context);
  if (!found.ok()) return found.status();
  GpuState& g = s.gpus[gpu];
  for (const auto& p : g.processes) {
    if (p.gi == gi_id && p.ci == ci_id) {
      return NvmlStatus(NvmlReturn::kInUse,
                        fmt::format("{}: process {} runs on it", context, p.pid));
    }
  }
  GiState* gi = FindGi(g, gi_id);
  std::erase_if(gi->cis, [&](const CiState& ci) { return ci.id == ci_id; });
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ProcessInfo>> Processes(const State& s, uint32_t gpu,
                                                   std::optional<uint32_t> gi_id,
                                                   std::optional<uint32_t> ci_id) {
  if (gi_id.has_value()) {
    auto found = FindCi(
        s, gpu, *gi_id, ci_id.value_or(0),
        fmt::format("get compute processes of GPU {} GI {} CI {}", gpu, *gi_id, ci_id.value_or(0)));
    if (!found.ok()) return found.status();
  }
  auto g = Gpu(s, gpu, fmt::format("get compute processes of GPU {}", gpu));
  if (!g.ok()) return g.status();
  std::vector<ProcessInfo> out;
  for (const auto& p : (*g)->processes) {
    if (gi_id.has_value() && (p.gi != gi_id || p.ci != ci_id)) continue;
    out.push_back(ProcessInfo{.pid = p.pid,
                              .used_memory_mib = p.used_memory_mib,
                              .gpu_instance_id = p.gi,
                              .compute_instance_id = p.ci});
  }
  return out;
}

bool HasMig(const GpuState& g) { return !g.model->capability.profiles.empty(); }

absl::StatusOr<MigModeState> GetMigMode(const State& s, uint32_t gpu) {
  auto g = Gpu(s, gpu, fmt::format("get MIG mode of GPU {}", gpu));
  if (!g.ok()) return g.status();
  if (!HasMig(**g)) return MigModeState{};
  return MigModeState{
      .supported = true, .current = (*g)->mig_current, .pending = (*g)->mig_pending};
}

absl::StatusOr<MigModeChange> SetMigMode(State& s, uint32_t gpu, bool enabled) {
  const std::string context =
      fmt::format("set MIG mode {} on GPU {}", enabled ? "enabled" : "disabled", gpu);
  auto gp = Gpu(s, gpu, context);
  if (!gp.ok()) return gp.status();
  GpuState& g = **gp;
  if (!HasMig(g)) {
    return NvmlStatus(NvmlReturn::kNotSupported,
                      fmt::format("{}: {} has no MIG", context, g.model->capability.model));
  }
  if (!g.gis.empty()) {
    return NvmlStatus(NvmlReturn::kInUse,
                      fmt::format("{}: {} GPU instances exist", context, g.gis.size()));
  }
  if (!g.processes.empty()) {
    return NvmlStatus(NvmlReturn::kInUse, fmt::format("{}: process {} runs on the GPU", context,
                                                      g.processes.front().pid));
  }
  g.mig_pending = enabled;
  MigModeChange change;
  if (g.mig_current == enabled) {
    change.activation = NvmlReturn::kSuccess;  // already current: nothing left pending
  } else if (g.reboot_required) {
    change.activation = NvmlReturn::kResetRequired;  // no reset on this host: a reboot applies it
  } else if (IsAmpere(g)) {
    change.activation = NvmlReturn::kInUse;  // pending until the GPU is reset
  } else {
    g.mig_current = enabled;  // Hopper and later: applied at once on an idle GPU
    change.activation = NvmlReturn::kSuccess;
  }
  change.mode = MigModeState{.supported = true, .current = g.mig_current, .pending = g.mig_pending};
  return change;
}

absl::Status ResetGpu(State& s, uint32_t gpu) {
  const std::string context = fmt::format("reset GPU {}", gpu);
  auto gp = Gpu(s, gpu, context);
  if (!gp.ok()) return gp.status();
  GpuState& g = **gp;
  if (g.reboot_required) {
    return NvmlStatus(NvmlReturn::kNotSupported,
                      fmt::format("{}: this host exposes no GPU reset (pass-through VM); a reboot "
                                  "applies a pending MIG mode",
                                  context));
  }
  if (!g.processes.empty()) {
    return NvmlStatus(NvmlReturn::kInUse, fmt::format("{}: process {} runs on the GPU", context,
                                                      g.processes.front().pid));
  }
  if (!g.holders.empty()) {
    return NvmlStatus(NvmlReturn::kInUse, fmt::format("{}: in use by another client", context));
  }
  g.gis.clear();
  g.mig_current = g.mig_pending;
  return absl::OkStatus();
}

absl::Status RebootHost(State& s) {
  for (GpuState& g : s.gpus) {
    g.gis.clear();
    g.processes.clear();
    g.holders.clear();
    g.mig_current = g.mig_pending;
  }
  return absl::OkStatus();
}

absl::Status SetRebootRequired(State& s, uint32_t gpu, bool required) {
  auto gp = Gpu(s, gpu, fmt::format("mark GPU {} reboot-required", gpu));
  if (!gp.ok()) return gp.status();
  (*gp)->reboot_required = required;
  return absl::OkStatus();
}

namespace {

// The GPU and, for a MIG UUID, the (gi, ci) a UUID names.
struct UuidTarget {
  uint32_t gpu = 0;
  std::optional<uint32_t> gi;
  std::optional<uint32_t> ci;
};

std::optional<UuidTarget> ResolveUuid(const State& s, std::string_view uuid) {
  for (uint32_t i = 0; i < s.gpus.size(); ++i) {
    const auto& g = s.gpus[i];
    if (g.uuid == uuid) return UuidTarget{i, std::nullopt, std::nullopt};
    for (const auto& gi : g.gis) {
      for (const auto& ci : gi.cis) {
        if (ci.uuid == uuid) return UuidTarget{i, gi.id, ci.id};
      }
    }
  }
  return std::nullopt;
}

}  // namespace

absl::Status Attach(State& s, std::string_view uuid, uint32_t pid, uint64_t used_memory_mib) {
  const std::string context = fmt::format("attach process {} to {}", pid, uuid);
  const auto target = ResolveUuid(s, uuid);
  if (!target.has_value()) {
    return NvmlStatus(NvmlReturn::kNotFound,
                      fmt::format("{}: no GPU or MIG device has this UUID", context));
  }
  auto& procs = s.gpus[target->gpu].processes;
  for (auto& p : procs) {
    if (p.pid == pid && p.gi == target->gi && p.ci == target->ci) {
      p.used_memory_mib = used_memory_mib;
      return absl::OkStatus();
    }
  }
  procs.push_back(ProcState{
      .pid = pid, .used_memory_mib = used_memory_mib, .gi = target->gi, .ci = target->ci});
  return absl::OkStatus();
}

absl::Status Detach(State& s, std::string_view uuid, uint32_t pid) {
  const std::string context = fmt::format("detach process {} from {}", pid, uuid);
  const auto target = ResolveUuid(s, uuid);
  if (!target.has_value()) {
    return NvmlStatus(NvmlReturn::kNotFound,
                      fmt::format("{}: no GPU or MIG device has this UUID", context));
  }
  auto& procs = s.gpus[target->gpu].processes;
  const size_t removed = std::erase_if(procs, [&](const ProcState& p) {
    return p.pid == pid && p.gi == target->gi && p.ci == target->ci;
  });
  if (removed == 0) {
    return NvmlStatus(NvmlReturn::kNotFound,
                      fmt::format("{}: the process is not attached there", context));
  }
  return absl::OkStatus();
}

absl::Status Hold(State& s, uint32_t gpu, uint32_t gi_id, std::string_view name) {
  const std::string context = fmt::format("hold GPU instance {} of GPU {}", gi_id, gpu);
  const bool name_ok =
      !name.empty() && name.size() <= kMaxHolderName &&
      std::all_of(name.begin(), name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
      });
  if (!name_ok) {
    return NvmlStatus(
        NvmlReturn::kInvalidArgument,
        fmt::format("{}: holder name must be 1..{} of [A-Za-z0-9._-]", context, kMaxHolderName));
  }
  auto gp = Gpu(s, gpu, context);
  if (!gp.ok()) return gp.status();
  GpuState& g = **gp;
  if (auto st = RequireMig(g, gpu, context); !st.ok()) return st;
  if (FindGi(g, gi_id) == nullptr) {
    return NvmlStatus(NvmlReturn::kNotFound, fmt::format("{}: no such GPU instance", context));
  }
  const HolderState holder{gi_id, std::string(name)};
  if (std::find(g.holders.begin(), g.holders.end(), holder) != g.holders.end()) {
    return absl::OkStatus();
  }
  if (g.holders.size() >= kMaxHoldersPerGpu) {
    return NvmlStatus(NvmlReturn::kInvalidArgument, fmt::format("{}: GPU {} already has {} holders",
                                                                context, gpu, kMaxHoldersPerGpu));
  }
  g.holders.push_back(holder);
  return absl::OkStatus();
}

absl::Status Release(State& s, uint32_t gpu, uint32_t gi_id, std::string_view name) {
  const std::string context = fmt::format("release GPU instance {} of GPU {}", gi_id, gpu);
  auto gp = Gpu(s, gpu, context);
  if (!gp.ok()) return gp.status();
  const size_t removed = std::erase_if((*gp)->holders, [&](const HolderState& h) {
    return h.gi == gi_id && (name.empty() || h.name == name);
  });
  if (removed == 0) {
    return NvmlStatus(
        NvmlReturn::kNotFound,
        fmt::format("{}: {} holds it", context,
                    name.empty() ? std::string("nobody") : std::string(name) + " never"));
  }
  return absl::OkStatus();
}

}  // namespace sim
}  // namespace dynmig::nvml
