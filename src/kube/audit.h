// What an authorizer sees of each API request, and a bounded audit table of them.
//
// ParseRequestAttributes is kube-apiserver's RequestInfo (k8s.io/apiserver/pkg/endpoints/request):
// the RBAC verb (get, list, watch, create, update, patch, delete, deletecollection; list vs watch
// from ?watch=, get vs list from whether a name is in the path, delete vs deletecollection the
// same way), the API group, resource, subresource (pods/binding, pods/status, pods/eviction...),
// namespace and name (for list and watch: the name a fieldSelector metadata.name=X pins, as
// kube-apiserver does, so that resourceNames rules apply). Paths outside /api and /apis/<group>
// are non-resource requests (discovery, /version, /openapi): verb = lower-case HTTP method.
//
// AuditTrail keeps one AuditRecord per distinct (user, verb, group, resource, subresource,
// namespace, non-resource path) with request counts and up to max_names distinct object names,
// so memory is bounded by what the callers do, not by how often. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"

namespace dynmig::kube {

struct RequestAttributes {
  bool resource_request = false;
  std::string verb;
  std::string api_group;  // "" = the core group
  std::string api_version;
  std::string resource;  // plural, e.g. "pods"
  std::string subresource;
  std::string ns;    // "" = cluster-scoped (or all namespaces)
  std::string name;  // "" = a collection
  std::string path;  // non-resource requests only
};

// `watch`: the value of the ?watch= query parameter ("" when absent); `field_selector`: the value
// of ?fieldSelector=.
RequestAttributes ParseRequestAttributes(std::string_view method, std::string_view path,
                                         std::string_view watch = "",
                                         std::string_view field_selector = "");

// "resource" or "resource/subresource", as RBAC rules name them.
std::string RbacResource(std::string_view resource, std::string_view subresource);

struct AuditRecord {
  std::string user;
  std::string verb;
  std::string api_group;
  std::string resource;
  std::string subresource;
  std::string ns;
  std::string path;                // non-resource requests
  std::vector<std::string> names;  // distinct names seen (sorted), at most max_names
  bool more_names = false;         // some names were not kept
  bool unnamed = false;            // some requests named no object (collections)
  int64_t count = 0;
  int64_t failures = 0;  // answered with HTTP >= 400

  bool resource_request() const { return path.empty(); }
  // "patch pods/status in default (names: a, b)", "list nodes (cluster)", "get /version".
  std::string Describe() const;
};

class AuditTrail {
 public:
  explicit AuditTrail(size_t max_records = 4096, size_t max_names = 64);

  void Record(std::string_view user, const RequestAttributes& attrs, int http_status);
  // Sorted by user, verb, group, resource, subresource, namespace, path.
  std::vector<AuditRecord> Records() const;
  void Clear();
  // Requests not kept because max_records distinct records existed.
  int64_t dropped() const;

 private:
  using Key = std::tuple<std::string, std::string, std::string, std::string, std::string,
                         std::string, std::string>;
  struct Value {
    std::set<std::string> names;
    bool more_names = false;
    bool unnamed = false;
    int64_t count = 0;
    int64_t failures = 0;
  };

  const size_t max_records_;
  const size_t max_names_;
  mutable dynmig::Mutex mu_;
  std::map<Key, Value> records_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dynmig::kube
