#include "local/scheduler_config.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>

#include "fmt/format.h"

namespace dynmig::local {
namespace {

std::string Scalar(const YAML::Node& n, const char* key) {
  const YAML::Node v = n[key];
  return v && v.IsScalar() ? v.as<std::string>() : "";
}

double HttpTimeout(const std::string& s) {
  // A Go duration such as "30s", "1m" or "500ms".
  if (s.empty()) return 30;
  try {
    if (s.ends_with("ms")) return std::stod(s.substr(0, s.size() - 2)) / 1000;
    if (s.ends_with("s")) return std::stod(s.substr(0, s.size() - 1));
    if (s.ends_with("m")) return std::stod(s.substr(0, s.size() - 1)) * 60;
    return std::stod(s);
  } catch (const std::exception&) {
    return 30;
  }
}

}  // namespace

absl::StatusOr<SchedulerConfig> ParseSchedulerConfig(std::string_view yaml) {
  try {
    const YAML::Node root = YAML::Load(std::string(yaml));
    const std::string kind = Scalar(root, "kind");
    if (kind != "KubeSchedulerConfiguration") {
      return absl::InvalidArgumentError(
          fmt::format("kind: want KubeSchedulerConfiguration, got \"{}\"", kind));
    }
    SchedulerConfig out;
    const YAML::Node profiles = root["profiles"];
    if (!profiles || !profiles.IsSequence() || profiles.size() == 0 ||
        Scalar(profiles[0], "schedulerName").empty()) {
      return absl::InvalidArgumentError("profiles[0].schedulerName: required");
    }
    out.scheduler_name = Scalar(profiles[0], "schedulerName");
    const YAML::Node extenders = root["extenders"];
    if (!extenders || !extenders.IsSequence() || extenders.size() == 0) {
      return absl::InvalidArgumentError("extenders[0]: required");
    }
    const YAML::Node e = extenders[0];
    ExtenderConfig& x = out.extender;
    x.url_prefix = Scalar(e, "urlPrefix");
    if (x.url_prefix.empty()) return absl::InvalidArgumentError("extenders[0].urlPrefix: required");
    x.filter_verb = Scalar(e, "filterVerb");
    x.bind_verb = Scalar(e, "bindVerb");
    x.node_cache_capable = e["nodeCacheCapable"] && e["nodeCacheCapable"].as<bool>();
    x.enable_https = e["enableHTTPS"] && e["enableHTTPS"].as<bool>();
    x.http_timeout_seconds = HttpTimeout(Scalar(e, "httpTimeout"));
    if (const YAML::Node tls = e["tlsConfig"]; tls && tls.IsMap()) {
      x.tls.insecure = tls["insecure"] && tls["insecure"].as<bool>();
      x.tls.server_name = Scalar(tls, "serverName");
      x.tls.ca_file = Scalar(tls, "caFile");
      x.tls.cert_file = Scalar(tls, "certFile");
      x.tls.key_file = Scalar(tls, "keyFile");
      if (x.tls.cert_file.empty() != x.tls.key_file.empty()) {
        return absl::InvalidArgumentError(
            "extenders[0].tlsConfig: certFile and keyFile go together");
      }
    }
    if (const YAML::Node mr = e["managedResources"]; mr && mr.IsSequence()) {
      for (size_t i = 0; i < mr.size(); ++i) {
        ManagedResource r;
        r.name = Scalar(mr[i], "name");
        if (r.name.empty()) {
          return absl::InvalidArgumentError(
              fmt::format("extenders[0].managedResources[{}].name: required", i));
        }
        r.ignored_by_scheduler =
            mr[i]["ignoredByScheduler"] && mr[i]["ignoredByScheduler"].as<bool>();
        x.managed_resources.push_back(std::move(r));
      }
    }
    return out;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(fmt::format("invalid YAML: {}", e.what()));
  }
}

absl::StatusOr<SchedulerConfig> LoadSchedulerConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(fmt::format("cannot read {}", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto cfg = ParseSchedulerConfig(ss.str());
  if (!cfg.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: {}", path, std::string(cfg.status().message())));
  }
  return cfg;
}

}  // namespace dynmig::local
