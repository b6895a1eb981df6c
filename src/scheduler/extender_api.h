// The kube-scheduler extender wire types (k8s.io/kube-scheduler/extender/v1). The Go structs have
// no json tags, so their keys are the Go field names in PascalCase ("Pod", "NodeNames",
// "FailedNodes", "Error"); Go decodes them case-insensitively, and so do we. The embedded Pod and
// NodeList are ordinary API JSON. Pure; thread-compatible.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "nlohmann/json.hpp"

namespace dynmig::scheduler {

// POST <prefix>/filter.
struct ExtenderArgs {
  nlohmann::json pod;  // "Pod"
  // The candidate nodes: "NodeNames" (nodeCacheCapable: true), else the names of the "Nodes"
  // items.
  std::vector<std::string> node_names;
  // "Nodes" (nodeCacheCapable: false): the NodeList as sent, when it was not null.
  std::optional<nlohmann::json> nodes;
  // "NodeNames" shared with a NodeNamesCache (then node_names is empty).
  std::shared_ptr<const std::vector<std::string>> shared_node_names;

  const std::vector<std::string>& Candidates() const {
    return shared_node_names ? *shared_node_names : node_names;
  }
};

// kube-scheduler sends the same NodeNames filter after filter (every node that passed its own
// filters): the last list's text and its parsed names, so an identical list is recognised by one
// comparison of bytes instead of being parsed again. Thread-safe.
class NodeNamesCache {
 public:
  std::shared_ptr<const std::vector<std::string>> Find(std::string_view raw) const
      ABSL_LOCKS_EXCLUDED(mu_);
  void Store(std::string_view raw, std::shared_ptr<const std::vector<std::string>> names)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable dynmig::Mutex mu_;
  std::string raw_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const std::vector<std::string>> names_ ABSL_GUARDED_BY(mu_);
};

// Parses the request body. kInvalidArgument for a body beyond kExtenderArgsJsonLimits (16 MiB, 64
// levels of nesting; the message names the limit), text that is not JSON, a body that is not an
// object, a missing or non-object Pod, NodeNames that is not a list of strings, Nodes that is not
// a NodeList. With a cache, the members are located first and only Pod (and NodeNames when it
// differs from the cached list) are parsed; any doubt falls back to parsing the whole body.
absl::StatusOr<ExtenderArgs> ParseExtenderArgs(std::string_view body,
                                               NodeNamesCache* cache = nullptr);

struct ExtenderFilterResult {
  std::vector<std::string> node_names;
  // Answer in the form of the request: when the request carried Nodes, the result carries the
  // passing Nodes items instead of NodeNames.
  std::optional<nlohmann::json> nodes;
  std::map<std::string, std::string> failed_nodes;
  std::map<std::string, std::string> failed_and_unresolvable_nodes;
  std::string error;
};

// {"NodeNames":[...]|null,"Nodes":{...}|null,"FailedNodes":{...},
//  "FailedAndUnresolvableNodes":{...},"Error":""}
nlohmann::json ToJson(const ExtenderFilterResult& result);
// The same text as ToJson(result).dump(), written directly (a filter over thousands of nodes
// answers as many FailedNodes entries).
std::string ToJsonText(const ExtenderFilterResult& result);

// POST <prefix>/bind.
struct ExtenderBindingArgs {
  std::string pod_name;       // "PodName"
  std::string pod_namespace;  // "PodNamespace"
  std::string pod_uid;        // "PodUID"
  std::string node;           // "Node"
};

// kInvalidArgument for bad JSON, a body beyond kExtenderBindingJsonLimits (64 KiB, 8 levels) or
// a missing PodName, PodNamespace or Node.
absl::StatusOr<ExtenderBindingArgs> ParseExtenderBindingArgs(std::string_view body);

// {"Error":"..."}: the ExtenderBindingResult (and the error form of every extender answer).
nlohmann::json ErrorResult(std::string_view error);

// The member of `obj` named `key`, compared case-insensitively as Go's encoding/json does (an
// exact match wins). nullptr when absent or when `obj` is not an object.
const nlohmann::json* FieldCaseInsensitive(const nlohmann::json& obj, std::string_view key);

}  // namespace dynmig::scheduler
