#include "kube/rest_config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/strings.h"

namespace dynmig::kube {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(fmt::format("cannot read {} '{}'", what, path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Resolve(const std::string& path, std::string_view base_dir) {
  if (path.empty() || base_dir.empty() || std::filesystem::path(path).is_absolute()) return path;
  return (std::filesystem::path(std::string(base_dir)) / path).string();
}

// Finds the entry named `name` in a kubeconfig list (clusters/contexts/users) and returns its
// `field` map.
absl::StatusOr<YAML::Node> Named(const YAML::Node& root, const char* list, const char* field,
                                 const std::string& name) {
  const YAML::Node entries = root[list];
  if (entries && entries.IsSequence()) {
    for (const auto& entry : entries) {
      if (entry["name"] && entry["name"].as<std::string>() == name) {
        YAML::Node value = entry[field];
        if (!value || value.IsNull()) return YAML::Node(YAML::NodeType::Map);
        return value;
      }
    }
  }
  return absl::InvalidArgumentError(
      fmt::format("kubeconfig: no {} named '{}' in '{}'", field, name, list));
}

std::string Str(const YAML::Node& map, const char* key) {
  const YAML::Node v = map[key];
  if (!v || !v.IsScalar()) return "";
  return v.as<std::string>();
}

}  // namespace

absl::StatusOr<std::string> Base64Decode(std::string_view text) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  bool padding = false;
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) continue;
    if (c == '=') {
      padding = true;
      continue;
    }
    const size_t value = kAlphabet.find(c);
    if (value == std::string_view::npos || padding) {
      return absl::InvalidArgumentError(
          fmt::format("invalid base64: unexpected character '{}'", c));
    }
    buffer = (buffer << 6) | static_cast<uint32_t>(value);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buffer >> bits) & 0xff));
    }
  }
  return out;
}

absl::StatusOr<RestConfig> ParseKubeconfig(std::string_view yaml, std::string_view base_dir,
                                           std::string_view context_name) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(fmt::format("kubeconfig is not valid YAML: {}", e.what()));
  }
  if (!root.IsMap()) return absl::InvalidArgumentError("kubeconfig: top level is not a map");
  try {
    std::string ctx_name(context_name);
    if (ctx_name.empty()) ctx_name = Str(root, "current-context");
    if (ctx_name.empty()) {
      return absl::InvalidArgumentError("kubeconfig: no current-context and no context given");
    }
    auto context = Named(root, "contexts", "context", ctx_name);
    if (!context.ok()) return context.status();
    const std::string cluster_name = Str(*context, "cluster");
    const std::string user_name = Str(*context, "user");
    auto cluster = Named(root, "clusters", "cluster", cluster_name);
    if (!cluster.ok()) return cluster.status();

    RestConfig config;
    config.server = Str(*cluster, "server");
    if (config.server.empty()) {
      return absl::InvalidArgumentError(
          fmt::format("kubeconfig: cluster '{}' has no server", cluster_name));
    }
    while (!config.server.empty() && config.server.back() == '/') config.server.pop_back();
    if (config.server.rfind("http://", 0) != 0 && config.server.rfind("https://", 0) != 0) {
      return absl::InvalidArgumentError(fmt::format(
          "kubeconfig: server '{}' must start with http:// or https://", config.server));
    }
    config.ca_file = Resolve(Str(*cluster, "certificate-authority"), base_dir);
    if (const std::string ca = Str(*cluster, "certificate-authority-data"); !ca.empty()) {
      auto decoded = Base64Decode(ca);
      if (!decoded.ok()) {
        return absl::InvalidArgumentError(
            fmt::format("kubeconfig: cluster '{}' certificate-authority-data: {}", cluster_name,
                        std::string(decoded.status().message())));
      }
      config.ca_data = *decoded;
    }
    config.insecure_skip_tls_verify = Str(*cluster, "insecure-skip-tls-verify") == "true";
    if (const std::string ns = Str(*context, "namespace"); !ns.empty()) config.ns = ns;

    if (!user_name.empty()) {
      auto user = Named(root, "users", "user", user_name);
      if (!user.ok()) return user.status();
      if ((*user)["exec"] || (*user)["auth-provider"]) {
        return absl::InvalidArgumentError(fmt::format(
            "kubeconfig: user '{}' uses exec/auth-provider credentials, which dynmig does not "
            "support; use a token, tokenFile or client certificate",
            user_name));
      }
      config.token = Str(*user, "token");
      config.token_file = Resolve(Str(*user, "tokenFile"), base_dir);
      config.client_cert_file = Resolve(Str(*user, "client-certificate"), base_dir);
      config.client_key_file = Resolve(Str(*user, "client-key"), base_dir);
      for (auto [field, target] : {std::pair{"client-certificate-data", &config.client_cert_data},
                                   std::pair{"client-key-data", &config.client_key_data}}) {
        const std::string data = Str(*user, field);
        if (data.empty()) continue;
        auto decoded = Base64Decode(data);
        if (!decoded.ok()) {
          return absl::InvalidArgumentError(fmt::format("kubeconfig: user '{}' {}: {}", user_name,
                                                        field,
                                                        std::string(decoded.status().message())));
        }
        *target = *decoded;
      }
      if (!Str(*user, "username").empty()) {
        return absl::InvalidArgumentError(fmt::format(
            "kubeconfig: user '{}' uses basic auth (username/password), which dynmig does not "
            "support",
            user_name));
      }
    }
    return config;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(fmt::format("kubeconfig: {}", e.what()));
  }
}

absl::StatusOr<RestConfig> LoadKubeconfig(const std::string& path, std::string_view context) {
  auto text = ReadFile(path, "kubeconfig");
  if (!text.ok()) return text.status();
  auto config = ParseKubeconfig(*text, std::filesystem::path(path).parent_path().string(), context);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        fmt::format("{}: {}", path, std::string(config.status().message())));
  }
  return config;
}

absl::StatusOr<RestConfig> InClusterConfig(const InClusterEnvironment& env) {
  auto get = [&](const std::string& name) -> std::optional<std::string> {
    if (env.getenv) return env.getenv(name);
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
  const auto host = get("KUBERNETES_SERVICE_HOST");
  const auto port = get("KUBERNETES_SERVICE_PORT");
  if (!host || !port || host->empty() || port->empty()) {
    return absl::FailedPreconditionError(
        "not running in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be "
        "set");
  }
  RestConfig config;
  const bool ipv6 = host->find(':') != std::string::npos;
  config.server = ipv6 ? fmt::format("https://[{}]:{}", *host, *port)
                       : fmt::format("https://{}:{}", *host, *port);
  if (!std::filesystem::exists(env.token_path)) {
    return absl::NotFoundError(
        fmt::format("in-cluster: service account token '{}' does not exist", env.token_path));
  }
  config.token_file = env.token_path;
  if (std::filesystem::exists(env.ca_path)) config.ca_file = env.ca_path;
  if (auto ns = ReadFile(env.namespace_path, "namespace file"); ns.ok()) {
    const std::string trimmed(Trim(*ns));
    if (!trimmed.empty()) config.ns = trimmed;
  }
  return config;
}

absl::StatusOr<RestConfig> DefaultConfig(const std::string& kubeconfig_path) {
  if (!kubeconfig_path.empty()) return LoadKubeconfig(kubeconfig_path);
  if (const char* env = std::getenv("KUBECONFIG"); env != nullptr && *env != '\0') {
    std::string first(env);
    first = first.substr(0, first.find(':'));
    return LoadKubeconfig(first);
  }
  auto in_cluster = InClusterConfig();
  if (in_cluster.ok() || in_cluster.status().code() != absl::StatusCode::kFailedPrecondition) {
    return in_cluster;
  }
  const char* home = std::getenv("HOME");
  if (home == nullptr) {
    return absl::NotFoundError("no kubeconfig: KUBECONFIG and HOME unset, not in a cluster");
  }
  return LoadKubeconfig(fmt::format("{}/.kube/config", home));
}

}  // namespace dynmig::kube
