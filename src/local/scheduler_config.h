// The parts of a KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) that decide how
// kube-scheduler talks to an extender: the profile's scheduler name and the extender stanza.
// The local mode reads deploy/scheduler/kube-scheduler-config.yaml with this, so it calls the
// extender exactly as the deployed kube-scheduler would.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace dynmig::local {

struct ManagedResource {
  std::string name;
  bool ignored_by_scheduler = false;
};

// extenders[0].tlsConfig (the *Data forms are not read).
struct ExtenderTlsConfig {
  bool insecure = false;
  std::string server_name;
  std::string ca_file;    // verifies the extender's serving certificate
  std::string cert_file;  // the client certificate kube-scheduler presents
  std::string key_file;
};

struct ExtenderConfig {
  std::string url_prefix;
  std::string filter_verb;  // "" = no filter call
  std::string bind_verb;    // "" = kube-scheduler binds itself
  bool node_cache_capable = false;
  bool enable_https = false;
  double http_timeout_seconds = 30;
  ExtenderTlsConfig tls;
  std::vector<ManagedResource> managed_resources;
};

struct SchedulerConfig {
  std::string scheduler_name;  // the first profile's schedulerName
  ExtenderConfig extender;     // the first extender
};

// Parses the YAML text. Errors name the field: a missing profiles[0].schedulerName or
// extenders[0].urlPrefix, a wrong kind/apiVersion, a tlsConfig certFile without keyFile.
absl::StatusOr<SchedulerConfig> ParseSchedulerConfig(std::string_view yaml);
absl::StatusOr<SchedulerConfig> LoadSchedulerConfig(const std::string& path);

}  // namespace dynmig::local
