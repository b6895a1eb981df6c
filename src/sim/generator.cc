#include "sim/generator.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numbers>
#include <random>

#include "common/strings.h"
#include "fmt/format.h"
#include "mig/profile.h"

namespace dynmig::sim {
namespace {

struct MixEntry {
  uint32_t count = 1;
  uint32_t percent = 100;
  double weight = 0;
};

// Platform-independent variates over mt19937_64 (std:: distributions differ between libraries).
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double Uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }
  double Exponential(double rate) { return -std::log1p(-Uniform()) / rate; }
  double Normal() {
    const double u1 = 1.0 - Uniform();  // (0, 1]
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  std::mt19937_64 gen_;
};

absl::StatusOr<double> ParseDouble(std::string_view key, std::string_view s) {
  double v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(v)) {
    return absl::InvalidArgumentError(
        fmt::format("--generate: {}: \"{}\" is not a number", key, s));
  }
  return v;
}

absl::StatusOr<std::vector<MixEntry>> ParseMix(std::string_view value, const ModelGroup& g) {
  std::vector<MixEntry> mix;
  for (const auto& item : SplitTrimmed(value, '/')) {
    const size_t colon = item.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(
          fmt::format("--generate: mix: \"{}\" has no weight (expected CLASS:WEIGHT)", item));
    }
    std::string what = item.substr(0, colon);
    MixEntry e;
    auto weight = ParseDouble("mix", std::string_view(item).substr(colon + 1));
    if (!weight.ok()) return weight.status();
    if (*weight < 0) {
      return absl::InvalidArgumentError(
          fmt::format("--generate: mix: negative weight in \"{}\"", item));
    }
    e.weight = *weight;
    const size_t x = what.rfind('x');
    if (x != std::string::npos && x + 1 < what.size() &&
        std::all_of(what.begin() + x + 1, what.end(),
                    [](char c) { return c >= '0' && c <= '9'; })) {
      e.count = static_cast<uint32_t>(std::stoul(what.substr(x + 1)));
      what.resize(x);
      if (e.count == 0 || e.count > kMaxInstancesPerPod) {
        return absl::InvalidArgumentError(fmt::format(
            "--generate: mix: \"{}\": instance count must be 1..{}", item, kMaxInstancesPerPod));
      }
    }
    const mig::ProfileSpec* spec = nullptr;
    for (uint32_t idx : g.planner->allowed()) {
      const auto& p = g.profile(idx);
      if (p.name == what || mig::SliceClass(p.name) == what) {
        spec = &p;
        break;
      }
    }
    if (spec == nullptr) {
      return absl::InvalidArgumentError(fmt::format(
          "--generate: mix: {} has no allowlisted profile \"{}\"", g.cap().model, what));
    }
    // The largest percentage whose memory this profile still covers.
    e.percent = 0;
    for (uint32_t pct = 1; pct <= 100; ++pct) {
      if (mig::ResolveMemory(0, pct, g.cap()) <= spec->SizingMib()) e.percent = pct;
    }
    if (e.percent == 0) e.percent = 1;
    mix.push_back(e);
  }
  double total = 0;
  for (const auto& e : mix) total += e.weight;
  if (mix.empty() || total <= 0) {
    return absl::InvalidArgumentError("--generate: mix: no entry with a positive weight");
  }
  for (auto& e : mix) e.weight /= total;
  return mix;
}

// What SPEC says, with the defaults of what it leaves out.
struct GenSpec {
  uint64_t pods = 5000;
  std::string mix = "1g:0.5/2g:0.2/3g:0.2/7g:0.1";
  std::string arrival = "poisson";
  double rate = 0;  // 0: from load
  double load = 1.0;
  double mu = 6.3, sigma = 1.9;  // lognormal lifetime
  double fixed_life = 0;         // > 0: every pod lives this long
  uint64_t burst = 50;
  double optin = 0, optout = 0;  // shares of pods that opt in to / out of moves
  double whole = 0;              // share of whole-GPU pods
  std::string wholemix = "1:0.7/2:0.15/4:0.1/8:0.05";  // their GPU counts and weights
};

// wholemix=1:0.7/2:0.15/4:0.1/8:0.05: GPU counts (1..kMaxInstancesPerPod) and weights, normalized.
absl::StatusOr<std::vector<MixEntry>> ParseWholeMix(std::string_view value) {
  std::vector<MixEntry> mix;
  double total = 0;
  for (const auto& item : SplitTrimmed(value, '/')) {
    const size_t colon = item.find(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(
          fmt::format("--generate: wholemix: \"{}\" has no weight (expected GPUS:WEIGHT)", item));
    }
    auto gpus = ParseDouble("wholemix", std::string_view(item).substr(0, colon));
    if (!gpus.ok()) return gpus.status();
    if (*gpus < 1 || *gpus > kMaxInstancesPerPod || *gpus != std::floor(*gpus)) {
      return absl::InvalidArgumentError(
          fmt::format("--generate: wholemix: \"{}\": GPUs per pod must be a whole number from 1 "
                      "to {}",
                      item, kMaxInstancesPerPod));
    }
    auto weight = ParseDouble("wholemix", std::string_view(item).substr(colon + 1));
    if (!weight.ok()) return weight.status();
    if (*weight < 0) {
      return absl::InvalidArgumentError(
          fmt::format("--generate: wholemix: negative weight in \"{}\"", item));
    }
    MixEntry e;
    e.count = static_cast<uint32_t>(*gpus);
    e.percent = 100;
    e.weight = *weight;
    total += e.weight;
    mix.push_back(e);
    if (mix.size() > 64) {
      return absl::InvalidArgumentError("--generate: wholemix: more than 64 entries");
    }
  }
  if (mix.empty() || total <= 0) {
    return absl::InvalidArgumentError("--generate: wholemix: no entry with a positive weight");
  }
  for (auto& e : mix) e.weight /= total;
  return mix;
}

// SPEC's key=value pairs. Split on ',' but keep pieces without '=' with the previous value
// (life=lognormal:mu,sigma).
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> SplitSpec(std::string_view spec) {
  std::vector<std::pair<std::string, std::string>> kv;
  for (const auto& piece : SplitTrimmed(spec, ',')) {
    const size_t eq = piece.find('=');
    if (eq == std::string::npos) {
      if (kv.empty()) {
        return absl::InvalidArgumentError(
            fmt::format("--generate: \"{}\" is not key=value", piece));
      }
      kv.back().second += "," + piece;
      continue;
    }
    kv.emplace_back(std::string(Trim(piece.substr(0, eq))),
                    std::string(Trim(piece.substr(eq + 1))));
  }
  return kv;
}

// life=lognormal:MU,SIGMA or life=fixed:SECONDS.
absl::Status ParseLife(const std::string& value, GenSpec& g) {
  if (value.starts_with("lognormal:")) {
    const auto parts = SplitTrimmed(std::string_view(value).substr(10), ',');
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(
          fmt::format("--generate: life \"{}\": expected lognormal:MU,SIGMA", value));
    }
    auto m = ParseDouble("life", parts[0]);
    if (!m.ok()) return m.status();
    auto s = ParseDouble("life", parts[1]);
    if (!s.ok()) return s.status();
    if (*s < 0 || *s > 10) {
      return absl::InvalidArgumentError("--generate: life: sigma must be from 0 to 10");
    }
    g.mu = *m;
    g.sigma = *s;
    g.fixed_life = 0;
    return absl::OkStatus();
  }
  if (value.starts_with("fixed:")) {
    auto v = ParseDouble("life", std::string_view(value).substr(6));
    if (!v.ok()) return v.status();
    if (*v <= 0) return absl::InvalidArgumentError("--generate: life: fixed:S needs S > 0");
    g.fixed_life = *v;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      fmt::format("--generate: life \"{}\": expected lognormal:MU,SIGMA or fixed:SECONDS", value));
}

// One key=value of SPEC into `g`.
absl::Status ApplyKey(const std::string& key, const std::string& value, GenSpec& g) {
  if (key == "pods") {
    auto v = ParseDouble(key, value);
    if (!v.ok()) return v.status();
    if (*v < 1 || *v > 10'000'000 || *v != std::floor(*v)) {
      return absl::InvalidArgumentError(
          "--generate: pods must be a whole number from 1 to 10000000");
    }
    g.pods = static_cast<uint64_t>(*v);
  } else if (key == "mix") {
    g.mix = value;
  } else if (key == "arrival") {
    if (value != "poisson" && value != "daily" && value != "burst") {
      return absl::InvalidArgumentError(
          fmt::format("--generate: arrival \"{}\" is not poisson, daily or burst", value));
    }
    g.arrival = value;
  } else if (key == "rate" || key == "load") {
    auto v = ParseDouble(key, value);
    if (!v.ok()) return v.status();
    if (*v <= 0) return absl::InvalidArgumentError(fmt::format("--generate: {} must be > 0", key));
    (key == "rate" ? g.rate : g.load) = *v;
  } else if (key == "life") {
    return ParseLife(value, g);
  } else if (key == "burst") {
    auto v = ParseDouble(key, value);
    if (!v.ok()) return v.status();
    if (*v < 1 || *v > 1'000'000) {
      return absl::InvalidArgumentError("--generate: burst must be from 1 to 1000000");
    }
    g.burst = static_cast<uint64_t>(*v);
  } else if (key == "optin" || key == "optout") {
    auto v = ParseDouble(key, value);
    if (!v.ok()) return v.status();
    if (!(*v >= 0 && *v <= 1)) {
      return absl::InvalidArgumentError(fmt::format("--generate: {} must be from 0 to 1", key));
    }
    (key == "optin" ? g.optin : g.optout) = *v;
  } else if (key == "whole") {
    auto v = ParseDouble(key, value);
    if (!v.ok()) return v.status();
    if (!(*v >= 0 && *v <= 1)) {
      return absl::InvalidArgumentError("--generate: whole must be a share from 0 to 1");
    }
    g.whole = *v;
  } else if (key == "wholemix") {
    if (value.size() > 1024) {
      return absl::InvalidArgumentError("--generate: wholemix is longer than 1024 characters");
    }
    g.wholemix = value;
  } else {
    return absl::InvalidArgumentError(fmt::format(
        "--generate: unknown key \"{}\" (known: pods, mix, arrival, rate, load, life, burst, "
        "optin, optout, whole, wholemix)",
        key));
  }
  return absl::OkStatus();
}

// Draws g.pods pods at `rate` arrivals per second: arrival times by g.arrival, requests from
// `mix`, lifetimes from g's distribution.
std::vector<TracePod> DrawPods(const GenSpec& g, const std::vector<MixEntry>& mix, double rate,
                               uint64_t seed) {
  Rng rng(seed);
  std::vector<TracePod> pods;
  pods.reserve(g.pods);
  constexpr double kDay = 86400;
  constexpr double kDailyAmplitude = 0.69;
  double t = 0;
  while (pods.size() < g.pods) {
    uint64_t batch = 1;
    if (g.arrival == "poisson") {
      t += rng.Exponential(rate);
    } else if (g.arrival == "daily") {
      // Thinning: candidates at the peak rate, kept with probability rate(t) / peak.
      const double peak = rate * (1 + kDailyAmplitude);
      do {
        t += rng.Exponential(peak);
      } while (rng.Uniform() * (1 + kDailyAmplitude) >
               1 + kDailyAmplitude * std::sin(2 * std::numbers::pi * t / kDay));
    } else {
      t += rng.Exponential(rate / static_cast<double>(g.burst));
      batch = g.burst;
    }
    for (uint64_t b = 0; b < batch && pods.size() < g.pods; ++b) {
      double u = rng.Uniform();
      const MixEntry* e = &mix.back();
      for (const auto& m : mix) {
        if (u < m.weight) {
          e = &m;
          break;
        }
        u -= m.weight;
      }
      const double life = g.fixed_life > 0 ? g.fixed_life : std::exp(g.mu + g.sigma * rng.Normal());
      TracePod pod;
      pod.arrival = t;
      pod.departure = t + life;
      pod.count = e->count;
      pod.percent = e->percent;
      pods.push_back(pod);
    }
  }
  return pods;
}

}  // namespace

absl::StatusOr<Trace> GenerateTrace(std::string_view spec, uint64_t seed, const Cluster& cluster) {
  if (cluster.groups.empty()) return absl::InvalidArgumentError("--generate: empty cluster");
  const ModelGroup& ref = cluster.groups.front();
  auto kv = SplitSpec(spec);
  if (!kv.ok()) return kv.status();
  GenSpec g;
  for (const auto& [key, value] : *kv) {
    if (auto st = ApplyKey(key, value, g); !st.ok()) return st;
  }
  auto mix = ParseMix(g.mix, ref);
  if (!mix.ok()) return mix.status();
  auto wholemix = ParseWholeMix(g.wholemix);
  if (!wholemix.ok()) return wholemix.status();
  if (g.optin + g.optout > 1) {
    return absl::InvalidArgumentError("--generate: optin + optout must be at most 1");
  }

  double rate = g.rate;
  if (rate == 0) {
    const double mean_life =
        g.fixed_life > 0 ? g.fixed_life : std::exp(g.mu + g.sigma * g.sigma / 2);
    double mean_units = 0;
    for (const auto& e : *mix) mean_units += e.weight * cluster.AskedUnits(e.count, e.percent);
    double whole_units = 0;
    for (const auto& e : *wholemix) whole_units += e.weight * cluster.AskedUnits(e.count, 100);
    mean_units = (1 - g.whole) * mean_units + g.whole * whole_units;
    if (mean_units <= 0) return absl::InvalidArgumentError("--generate: the mix asks for nothing");
    rate = g.load * static_cast<double>(cluster.total_units) / (mean_units * mean_life);
  }
  Trace trace;
  trace.source = fmt::format("generated:{} (seed {})", spec, seed);
  trace.pods = DrawPods(g, *mix, rate, seed);
  if (g.optin > 0 || g.optout > 0) {
    // A stream of its own: the same seed draws the same pods with or without these keys.
    Rng choice(seed ^ 0x9e3779b97f4a7c15ULL);
    for (auto& pod : trace.pods) {
      const double u = choice.Uniform();
      pod.defrag = u < g.optin              ? DefragChoice::kOptIn
                   : u < g.optin + g.optout ? DefragChoice::kOptOut
                                            : DefragChoice::kDefault;
    }
  }
  if (g.whole > 0) {
    // A stream of its own: the pods chosen to be whole-GPU pods keep their arrival and lifetime.
    Rng pick(seed ^ 0xd1b54a32d192ed03ULL);
    for (auto& pod : trace.pods) {
      if (pick.Uniform() >= g.whole) continue;
      double u = pick.Uniform();
      const MixEntry* e = &wholemix->back();
      for (const auto& m : *wholemix) {
        if (u < m.weight) {
          e = &m;
          break;
        }
        u -= m.weight;
      }
      pod.whole = true;
      pod.count = e->count;
      pod.percent = 100;
    }
  }
  // The horizon is the last arrival: utilization and waits are measured while pods arrive (a
  // heavy tail of departures would otherwise dilute them).
  trace.end = trace.pods.empty() ? 0 : trace.pods.back().arrival;
  trace.rows = trace.pods.size();
  trace.start = trace.pods.empty() ? 0 : trace.pods.front().arrival;
  return trace;
}

}  // namespace dynmig::sim
