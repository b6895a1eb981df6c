#include "kube/audit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace dynmig::kube {
namespace {

std::vector<std::string> PathParts(std::string_view path) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string_view::npos) slash = path.size();
    if (slash > start) out.emplace_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return out;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Go's strconv.ParseBool, true side (what ListOptions decoding accepts).
bool GoTrue(std::string_view v) {
  return v == "1" || v == "t" || v == "T" || v == "true" || v == "TRUE" || v == "True";
}

// The value a field selector requires metadata.name to equal ("" = none): a term
// "metadata.name=X" or "metadata.name==X" among the comma-separated terms.
std::string RequiredName(std::string_view selector) {
  size_t start = 0;
  while (start <= selector.size()) {
    size_t comma = selector.find(',', start);
    if (comma == std::string_view::npos) comma = selector.size();
    std::string_view term = selector.substr(start, comma - start);
    start = comma + 1;
    while (!term.empty() && term.front() == ' ') term.remove_prefix(1);
    while (!term.empty() && term.back() == ' ') term.remove_suffix(1);
    const size_t eq = term.find('=');
    if (eq == std::string_view::npos || eq == 0 || term[eq - 1] == '!') continue;
    std::string_view key = term.substr(0, eq);
    std::string_view value = term.substr(eq + 1);
    if (!value.empty() && value.front() == '=') value.remove_prefix(1);
    while (!key.empty() && key.back() == ' ') key.remove_suffix(1);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    // A path segment name: not empty, no '/', not "." or "..".
    if (key == "metadata.name" && !value.empty() && value.find('/') == std::string_view::npos &&
        value != "." && value != "..") {
      return std::string(value);
    }
  }
  return "";
}

RequestAttributes NonResource(std::string_view method, std::string_view path) {
  RequestAttributes out;
  out.resource_request = false;
  out.verb = Lower(method);
  out.path = path.empty() ? "/" : std::string(path);
  return out;
}

}  // namespace

RequestAttributes ParseRequestAttributes(std::string_view method, std::string_view path,
                                         std::string_view watch, std::string_view field_selector) {
  std::vector<std::string> parts = PathParts(path);
  RequestAttributes out;
  size_t i = 0;
  if (parts.size() >= 3 && parts[0] == "api") {
    out.api_version = parts[1];
    i = 2;
  } else if (parts.size() >= 4 && parts[0] == "apis") {
    out.api_group = parts[1];
    out.api_version = parts[2];
    i = 3;
  } else {
    return NonResource(method, path);
  }
  if (method == "POST") {
    out.verb = "create";
  } else if (method == "GET" || method == "HEAD") {
    out.verb = "get";
  } else if (method == "PUT") {
    out.verb = "update";
  } else if (method == "PATCH") {
    out.verb = "patch";
  } else if (method == "DELETE") {
    out.verb = "delete";
  } else {
    out.verb = Lower(method);
  }
  std::vector<std::string> rest(parts.begin() + static_cast<std::ptrdiff_t>(i), parts.end());
  // /api/v1/watch/... and /api/v1/proxy/... (deprecated forms).
  if (rest[0] == "watch" || rest[0] == "proxy") {
    if (rest.size() < 2) return NonResource(method, path);
    out.verb = rest[0];
    rest.erase(rest.begin());
  }
  if (rest[0] == "namespaces") {
    if (rest.size() > 1) {
      out.ns = rest[1];
      // namespaces/<ns>/<resource>/...; namespaces/<ns>/status and /finalize are subresources of
      // the Namespace itself.
      if (rest.size() > 2 && rest[2] != "status" && rest[2] != "finalize") {
        rest.erase(rest.begin(), rest.begin() + 2);
      }
    }
  }
  out.resource_request = true;
  out.resource = rest[0];
  if (rest.size() >= 2) out.name = rest[1];
  if (rest.size() >= 3 && out.verb != "proxy") out.subresource = rest[2];
  if (out.name.empty() && out.verb == "get") {
    out.verb = GoTrue(watch) ? "watch" : "list";
  }
  if (out.name.empty() && (out.verb == "list" || out.verb == "watch")) {
    out.name = RequiredName(field_selector);
  }
  if (out.name.empty() && out.verb == "delete") out.verb = "deletecollection";
  return out;
}

std::string RbacResource(std::string_view resource, std::string_view subresource) {
  if (subresource.empty()) return std::string(resource);
  return fmt::format("{}/{}", resource, subresource);
}

std::string AuditRecord::Describe() const {
  if (!resource_request()) return fmt::format("{} {}", verb, path);
  std::string out = fmt::format("{} {}{} {}", verb, api_group.empty() ? "" : api_group + ":",
                                RbacResource(resource, subresource),
                                ns.empty() ? std::string("(cluster)") : "in " + ns);
  if (!names.empty()) {
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
    if (more_names) list += ", ...";
    if (unnamed) list += ", and unnamed";
    out += fmt::format(" (names: {})", list);
  }
  return out;
}

AuditTrail::AuditTrail(size_t max_records, size_t max_names)
    : max_records_(std::max<size_t>(1, max_records)), max_names_(max_names) {}

void AuditTrail::Record(std::string_view user, const RequestAttributes& attrs, int http_status) {
  Key key{std::string(user),
          attrs.verb,
          attrs.api_group,
          attrs.resource,
          attrs.subresource,
          attrs.ns,
          attrs.resource_request ? std::string() : attrs.path};
  dynmig::MutexLock lock(&mu_);
  auto it = records_.find(key);
  if (it == records_.end()) {
    if (records_.size() >= max_records_) {
      ++dropped_;
      return;
    }
    it = records_.emplace(std::move(key), Value{}).first;
  }
  Value& v = it->second;
  ++v.count;
  if (http_status >= 400) ++v.failures;
  if (attrs.name.empty()) {
    v.unnamed = true;
  } else if (v.names.count(attrs.name) == 0) {
    if (v.names.size() < max_names_) {
      v.names.insert(attrs.name);
    } else {
      v.more_names = true;
    }
  }
}

std::vector<AuditRecord> AuditTrail::Records() const {
  dynmig::MutexLock lock(&mu_);
  std::vector<AuditRecord> out;
  out.reserve(records_.size());
  for (const auto& [key, v] : records_) {
    AuditRecord r;
    std::tie(r.user, r.verb, r.api_group, r.resource, r.subresource, r.ns, r.path) = key;
    r.names.assign(v.names.begin(), v.names.end());
    r.more_names = v.more_names;
    r.unnamed = v.unnamed;
    r.count = v.count;
    r.failures = v.failures;
    out.push_back(std::move(r));
  }
  return out;
}

void AuditTrail::Clear() {
  dynmig::MutexLock lock(&mu_);
  records_.clear();
  dropped_ = 0;
}

int64_t AuditTrail::dropped() const {
  dynmig::MutexLock lock(&mu_);
  return dropped_;
}

}  // namespace dynmig::kube
