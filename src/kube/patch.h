// Applying the API's three PATCH formats to an object (used by the in-memory API server).
#pragma once

#include "absl/status/statusor.h"
#include "kube/kube_client.h"
#include "kube/object.h"

namespace dynmig::kube {

// RFC 7386: objects merge recursively, `null` deletes a key, anything else replaces.
absl::StatusOr<Object> ApplyMergePatch(const Object& target, const Object& patch);

// RFC 6902. kInvalidArgument names the failing operation (bad path, failed `test`).
absl::StatusOr<Object> ApplyJsonPatch(const Object& target, const Object& patch);

// The subset of strategic merge patch that kubectl apply/edit send for core objects: a merge patch
// whose lists of objects with a known merge key (containers/initContainers/volumes/env by "name",
// volumeMounts by "mountPath", ports by "containerPort", conditions/addresses by "type", taints by
// "key", ownerReferences by "uid", ...) merge element by element, with the directives `$patch`
// (replace/delete/merge), `$retainKeys`, `$deleteFromPrimitiveList/<field>` and
// `$setElementOrder/<field>` (order is not enforced). `finalizers` merges as a set. Other lists
// are replaced.
absl::StatusOr<Object> ApplyStrategicMergePatch(const Object& target, const Object& patch);

absl::StatusOr<Object> ApplyPatch(const Object& target, const Object& patch, PatchType type);

}  // namespace dynmig::kube
