// Label and field selectors with the API server's syntax and semantics.
//
// Label selector: comma-separated requirements, each one of `k=v`, `k==v`, `k!=v`, `k in (a,b)`,
// `k notin (a,b)`, `k` (exists), `!k` (does not exist), `k>N`, `k<N`. `!=` and `notin` also match
// objects without the label (as the API does). Field selector: `field=v`, `field==v`, `field!=v`
// separated by commas, over a per-resource set of fields (pods: metadata.name, metadata.namespace,
// spec.nodeName, spec.schedulerName, spec.restartPolicy, spec.serviceAccountName, status.phase,
// status.podIP, status.nominatedNodeName; nodes: metadata.name, spec.unschedulable; ...).
// Both are immutable values, safe to share between threads.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kube/object.h"

namespace dynmig::kube {

class LabelSelector {
 public:
  // An empty selector matches everything. kInvalidArgument names the bad requirement.
  static absl::StatusOr<LabelSelector> Parse(std::string_view text);

  // A metav1.LabelSelector object ({"matchLabels":{...},"matchExpressions":[{"key","operator":
  // In|NotIn|Exists|DoesNotExist,"values"}]}), as in a PodDisruptionBudget's spec.selector. `{}`
  // matches everything; a null selector is the caller's to handle. kInvalidArgument names the bad
  // part (keys and values as in Parse; at most kMaxObjectRequirements requirements).
  static absl::StatusOr<LabelSelector> FromObject(const Object& selector);
  static constexpr size_t kMaxObjectRequirements = 256;

  bool Matches(const Object& obj) const;  // against metadata.labels
  bool Matches(const std::map<std::string, std::string>& labels) const;
  bool empty() const { return requirements_.empty(); }

 private:
  enum class Op { kEquals, kNotEquals, kIn, kNotIn, kExists, kDoesNotExist, kGreater, kLess };
  struct Requirement {
    std::string key;
    Op op;
    std::vector<std::string> values;
  };
  bool MatchesLookup(const std::function<const std::string*(const std::string&)>& lookup) const;

  std::vector<Requirement> requirements_;
};

class FieldSelector {
 public:
  // kInvalidArgument for a syntax error or a field the resource does not support (the message
  // says `field label not supported: X`, like the API server).
  static absl::StatusOr<FieldSelector> Parse(std::string_view text, Resource resource);

  bool Matches(const Object& obj) const;
  bool empty() const { return requirements_.empty(); }
  // The value of a `field=value` requirement, if there is one for `field`.
  std::optional<std::string> EqualsValue(std::string_view field) const;

 private:
  struct Requirement {
    std::string field;
    bool negate;
    std::string value;
  };
  std::vector<Requirement> requirements_;
};

// The value a field selector compares against ("" for a missing field; booleans as "true"/"false").
std::string FieldValue(const Object& obj, std::string_view field);

}  // namespace dynmig::kube
