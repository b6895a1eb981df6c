#include "kube/kube_client.h"

namespace dynmig::kube {

std::string_view WatchEventTypeName(WatchEventType type) {
  switch (type) {
    case WatchEventType::kAdded:
      return "ADDED";
    case WatchEventType::kModified:
      return "MODIFIED";
    case WatchEventType::kDeleted:
      return "DELETED";
    case WatchEventType::kBookmark:
      return "BOOKMARK";
    case WatchEventType::kError:
      return "ERROR";
  }
  return "ERROR";
}

Object MetadataMergePatch(const MetadataPatch& patch) {
  Object metadata = Object::object();
  auto add = [&](const char* field, const KeyPatch& keys) {
    if (keys.empty()) return;
    Object map = Object::object();
    for (const auto& [k, v] : keys) map[k] = v ? Object(*v) : Object(nullptr);
    metadata[field] = std::move(map);
  };
  add("annotations", patch.annotations);
  add("labels", patch.labels);
  if (!patch.resource_version.empty()) metadata["resourceVersion"] = patch.resource_version;
  return Object{{"metadata", std::move(metadata)}};
}

absl::StatusOr<std::string> KubeClient::ListPages(
    Resource resource, const ListOptions& options,
    const std::function<absl::Status(std::vector<Object>& items)>& page) {
  auto list = List(resource, options);
  if (!list.ok()) return list.status();
  if (absl::Status st = page(list->items); !st.ok()) return st;
  return std::move(list->resource_version);
}

absl::StatusOr<Object> KubeClient::GetPod(std::string_view ns, std::string_view name) {
  return Get(Resource::kPods, ns, name);
}
absl::StatusOr<ObjectList> KubeClient::ListPods(const ListOptions& options) {
  return List(Resource::kPods, options);
}
absl::StatusOr<std::unique_ptr<WatchStream>> KubeClient::WatchPods(const ListOptions& options,
                                                                   WatchHandler handler) {
  return Watch(Resource::kPods, options, std::move(handler));
}
absl::StatusOr<Object> KubeClient::CreatePod(const Object& pod) {
  return Create(Resource::kPods, pod);
}
absl::StatusOr<Object> KubeClient::DeletePod(std::string_view ns, std::string_view name,
                                             const DeleteOptions& options) {
  return Delete(Resource::kPods, ns, name, options);
}
absl::StatusOr<Object> KubeClient::PatchPodMetadata(std::string_view ns, std::string_view name,
                                                    const MetadataPatch& patch) {
  return Patch(Resource::kPods, ns, name, MetadataMergePatch(patch), PatchType::kMerge, "");
}
absl::StatusOr<Object> KubeClient::PatchPodAnnotations(std::string_view ns, std::string_view name,
                                                       const KeyPatch& annotations,
                                                       std::string_view resource_version) {
  MetadataPatch patch;
  patch.annotations = annotations;
  patch.resource_version = std::string(resource_version);
  return PatchPodMetadata(ns, name, patch);
}
absl::StatusOr<Object> KubeClient::PatchPodStatus(std::string_view ns, std::string_view name,
                                                  const Object& merge_patch) {
  return Patch(Resource::kPods, ns, name, merge_patch, PatchType::kMerge, "status");
}

absl::StatusOr<Object> KubeClient::GetNode(std::string_view name) {
  return Get(Resource::kNodes, "", name);
}
absl::StatusOr<ObjectList> KubeClient::ListNodes(const ListOptions& options) {
  return List(Resource::kNodes, options);
}
absl::StatusOr<std::unique_ptr<WatchStream>> KubeClient::WatchNodes(const ListOptions& options,
                                                                    WatchHandler handler) {
  return Watch(Resource::kNodes, options, std::move(handler));
}
absl::StatusOr<Object> KubeClient::CreateNode(const Object& node) {
  return Create(Resource::kNodes, node);
}
absl::StatusOr<Object> KubeClient::UpdateNode(const Object& node) {
  return Update(Resource::kNodes, node, "");
}
absl::StatusOr<Object> KubeClient::UpdateNodeStatus(const Object& node) {
  return Update(Resource::kNodes, node, "status");
}
absl::StatusOr<Object> KubeClient::PatchNodeMetadata(std::string_view name,
                                                     const MetadataPatch& patch) {
  return Patch(Resource::kNodes, "", name, MetadataMergePatch(patch), PatchType::kMerge, "");
}
absl::StatusOr<Object> KubeClient::PatchNodeAnnotations(std::string_view name,
                                                        const KeyPatch& annotations,
                                                        std::string_view resource_version) {
  MetadataPatch patch;
  patch.annotations = annotations;
  patch.resource_version = std::string(resource_version);
  return PatchNodeMetadata(name, patch);
}
absl::StatusOr<Object> KubeClient::PatchNodeStatus(std::string_view name,
                                                   const Object& merge_patch) {
  return Patch(Resource::kNodes, "", name, merge_patch, PatchType::kMerge, "status");
}
absl::StatusOr<Object> KubeClient::DeleteNode(std::string_view name) {
  return Delete(Resource::kNodes, "", name, DeleteOptions{});
}

absl::StatusOr<Object> KubeClient::CreateEvent(const Object& event) {
  return Create(Resource::kEvents, event);
}

absl::StatusOr<Object> KubeClient::GetLease(std::string_view ns, std::string_view name) {
  return Get(Resource::kLeases, ns, name);
}
absl::StatusOr<Object> KubeClient::CreateLease(const Object& lease) {
  return Create(Resource::kLeases, lease);
}
absl::StatusOr<Object> KubeClient::UpdateLease(const Object& lease) {
  return Update(Resource::kLeases, lease, "");
}

absl::StatusOr<ObjectList> KubeClient::ListPodDisruptionBudgets(std::string_view ns) {
  ListOptions options{.ns = std::string(ns)};
  auto v1 = List(Resource::kPodDisruptionBudgets, options);
  if (v1.ok() || v1.status().code() != absl::StatusCode::kNotFound) return v1;
  return List(Resource::kPodDisruptionBudgetsV1beta1, options);
}

}  // namespace dynmig::kube
