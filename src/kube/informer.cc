#include "kube/informer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <unordered_set>

namespace dynmig::kube {

Object MetadataOnly(const Object& obj) {
  Object out = Object::object();
  if (!obj.is_object()) return out;
  for (const char* field : {"apiVersion", "kind"}) {
    if (auto it = obj.find(field); it != obj.end()) out[field] = *it;
  }
  Object meta = Object::object();
  if (auto m = obj.find("metadata"); m != obj.end() && m->is_object()) {
    for (const char* field : {"name", "namespace", "uid", "resourceVersion"}) {
      if (auto it = m->find(field); it != m->end()) meta[field] = *it;
    }
  }
  out["metadata"] = std::move(meta);
  return out;
}

Informer::Informer(KubeClient& client, Resource resource, InformerOptions options)
    : client_(client), resource_(resource), options_(std::move(options)) {}

Informer::~Informer() { Stop(); }

void Informer::AddHandlers(InformerHandlers handlers) { handlers_.push_back(std::move(handlers)); }

void Informer::Start() {
  dynmig::MutexLock lock(&mu_);
  if (started_) return;
  started_ = true;
  thread_ = std::thread([this] { Run(); });
}

void Informer::Stop() {
  std::shared_ptr<WatchStream> watch;
  {
    dynmig::MutexLock lock(&mu_);
    stopping_ = true;
    watch = watch_;
    cv_.SignalAll();
  }
  if (watch) watch->Stop();
  if (thread_.joinable()) thread_.join();
}

bool Informer::HasSynced() const {
  dynmig::MutexLock lock(&mu_);
  return synced_;
}

bool Informer::WaitForSync(absl::Duration timeout) const {
  dynmig::MutexLock lock(&mu_);
  return options_.clock->WaitFor(cv_, mu_, timeout,
                                 [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return synced_; });
}

ObjectPtr Informer::Get(std::string_view key) const {
  dynmig::MutexLock lock(&mu_);
  auto it = cache_.find(key);
  return it == cache_.end() ? nullptr : it->second;
}

ObjectPtr Informer::Get(std::string_view ns, std::string_view name) const {
  return Get(ObjectKey(InfoFor(resource_).namespaced ? ns : "", name));
}

std::vector<ObjectPtr> Informer::List() const {
  dynmig::MutexLock lock(&mu_);
  std::vector<ObjectPtr> out;
  out.reserve(cache_.size());
  for (const auto& [key, obj] : cache_) out.push_back(obj);
  return out;
}

std::vector<ObjectPtr> Informer::List(const std::function<bool(const Object&)>& predicate) const {
  dynmig::MutexLock lock(&mu_);
  std::vector<ObjectPtr> out;
  for (const auto& [key, obj] : cache_) {
    if (predicate(*obj)) out.push_back(obj);
  }
  return out;
}

size_t Informer::size() const {
  dynmig::MutexLock lock(&mu_);
  return cache_.size();
}

std::string Informer::resource_version() const {
  dynmig::MutexLock lock(&mu_);
  return rv_;
}

Informer::Stats Informer::stats() const {
  dynmig::MutexLock lock(&mu_);
  return stats_;
}

absl::Status Informer::last_error() const {
  dynmig::MutexLock lock(&mu_);
  return last_error_;
}

bool Informer::SleepBackoff(absl::Duration* backoff) {
  dynmig::MutexLock lock(&mu_);
  options_.clock->WaitFor(cv_, mu_, *backoff,
                          [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; });
  *backoff = std::min(*backoff * 2, options_.max_backoff);
  return !stopping_;
}

ObjectPtr Informer::Cached(const Object& obj) const {
  return std::make_shared<const Object>(options_.cache_transform ? options_.cache_transform(obj)
                                                                 : obj);
}

absl::Status Informer::RelistByPage() {
  ListOptions list = options_.filter;
  list.resource_version.clear();
  list.limit = options_.page_size;
  std::unordered_set<std::string> seen;
  auto rv = client_.ListPages(resource_, list, [&](std::vector<Object>& items) -> absl::Status {
    struct Change {
      const Object* obj;  // the full object, for the handlers
      std::string key;
      ObjectPtr cached;
      ObjectPtr old_obj;
    };
    std::vector<Change> changes;
    changes.reserve(items.size());
    for (const Object& item : items) changes.push_back({&item, ObjectKey(item), nullptr, nullptr});
    {
      dynmig::MutexLock lock(&mu_);
      if (stopping_) return absl::CancelledError("informer stopping");
      for (Change& c : changes) {
        seen.insert(c.key);
        auto it = cache_.find(c.key);
        if (it != cache_.end()) {
          if (ResourceVersion(*it->second) == ResourceVersion(*c.obj)) continue;  // unchanged
          c.old_obj = it->second;
        }
        c.cached = Cached(*c.obj);
        cache_.insert_or_assign(c.key, c.cached);
      }
    }
    for (const Change& c : changes) {
      if (c.cached == nullptr) continue;
      for (const auto& h : handlers_) {
        if (c.old_obj != nullptr) {
          if (h.on_update) h.on_update(*c.old_obj, *c.obj);
        } else if (h.on_add) {
          h.on_add(*c.obj);
        }
      }
    }
    return absl::OkStatus();
  });
  if (!rv.ok()) return rv.status();
  std::vector<ObjectPtr> deleted;
  {
    dynmig::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("informer stopping");
    for (auto it = cache_.begin(); it != cache_.end();) {
      if (seen.count(it->first)) {
        ++it;
        continue;
      }
      deleted.push_back(std::move(it->second));
      it = cache_.erase(it);
    }
    rv_ = std::move(*rv);
    synced_ = true;
    ++stats_.lists;
    cv_.SignalAll();
  }
  for (const ObjectPtr& obj : deleted) {
    for (const auto& h : handlers_) {
      if (h.on_delete) h.on_delete(*obj);
    }
  }
  return absl::OkStatus();
}

absl::Status Informer::Relist() {
  if (options_.cache_transform) return RelistByPage();
  ListOptions list = options_.filter;
  list.resource_version.clear();
  list.limit = options_.page_size;
  auto result = client_.List(resource_, list);
  if (!result.ok()) return result.status();

  std::map<std::string, ObjectPtr, std::less<>> fresh;
  for (auto& item : result->items) {
    std::string key = ObjectKey(item);
    fresh.emplace(std::move(key), std::make_shared<const Object>(std::move(item)));
  }
  struct Change {
    enum { kAdd, kUpdate, kDelete } kind;
    ObjectPtr old_obj;
    ObjectPtr new_obj;
  };
  std::vector<Change> changes;
  {
    dynmig::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("informer stopping");
    for (const auto& [key, obj] : fresh) {
      auto it = cache_.find(key);
      if (it == cache_.end()) {
        changes.push_back({Change::kAdd, nullptr, obj});
      } else if (ResourceVersion(*it->second) != ResourceVersion(*obj)) {
        changes.push_back({Change::kUpdate, it->second, obj});
      }
    }
    for (const auto& [key, obj] : cache_) {
      if (fresh.find(key) == fresh.end()) changes.push_back({Change::kDelete, obj, nullptr});
    }
    cache_ = std::move(fresh);
    rv_ = result->resource_version;
    synced_ = true;
    ++stats_.lists;
    cv_.SignalAll();
  }
  for (const Change& c : changes) {
    for (const auto& h : handlers_) {
      switch (c.kind) {
        case Change::kAdd:
          if (h.on_add) h.on_add(*c.new_obj);
          break;
        case Change::kUpdate:
          if (h.on_update) h.on_update(*c.old_obj, *c.new_obj);
          break;
        case Change::kDelete:
          if (h.on_delete) h.on_delete(*c.old_obj);
          break;
      }
    }
  }
  return absl::OkStatus();
}

void Informer::ApplyEvent(const WatchEvent& event) {
  if (event.type == WatchEventType::kError) return;  // the stream ends with its status
  const std::string rv = ResourceVersion(event.object);
  if (event.type == WatchEventType::kBookmark) {
    dynmig::MutexLock lock(&mu_);
    if (!rv.empty()) rv_ = rv;
    return;
  }
  const std::string key = ObjectKey(event.object);
  ObjectPtr old_obj;
  ObjectPtr new_obj;
  {
    dynmig::MutexLock lock(&mu_);
    if (stopping_) return;
    if (!rv.empty()) rv_ = rv;
    ++stats_.events;
    auto it = cache_.find(key);
    if (event.type == WatchEventType::kDeleted) {
      if (it == cache_.end()) return;  // never seen: nothing to delete
      old_obj = it->second;
      cache_.erase(it);
    } else {
      if (it != cache_.end()) {
        if (ResourceVersion(*it->second) == rv) return;  // already have this version
        old_obj = it->second;
      }
      new_obj = Cached(event.object);
      cache_[key] = new_obj;
    }
  }
  // With a cache transform the handlers get the object as received, not the cached copy.
  const Object& delivered =
      options_.cache_transform || new_obj == nullptr ? event.object : *new_obj;
  for (const auto& h : handlers_) {
    if (event.type == WatchEventType::kDeleted) {
      if (h.on_delete) h.on_delete(event.object);
    } else if (old_obj) {
      if (h.on_update) h.on_update(*old_obj, delivered);
    } else if (h.on_add) {
      h.on_add(delivered);
    }
  }
}

void Informer::Run() {
  bool need_list = true;
  absl::Duration backoff = options_.min_backoff;
  while (true) {
    {
      dynmig::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (need_list) {
      absl::Status st = Relist();
      if (!st.ok()) {
        {
          dynmig::MutexLock lock(&mu_);
          if (stopping_) return;
          ++stats_.errors;
          last_error_ = st;
        }
        spdlog::warn("informer {}: list failed: {}", ResourceName(resource_),
                     std::string(st.message()));
        if (!SleepBackoff(&backoff)) return;
        continue;
      }
      need_list = false;
      backoff = options_.min_backoff;
    }
    ListOptions watch_options = options_.filter;
    watch_options.resource_version = resource_version();
    watch_options.timeout_seconds = options_.watch_timeout_seconds;
    watch_options.allow_bookmarks = true;
    auto stream = client_.Watch(resource_, watch_options,
                                [this](const WatchEvent& event) { ApplyEvent(event); });
    absl::Status end;
    if (stream.ok()) {
      backoff = options_.min_backoff;  // connected: a later failure starts a fresh backoff
      std::shared_ptr<WatchStream> watch = std::move(*stream);
      {
        dynmig::MutexLock lock(&mu_);
        ++stats_.watches;
        watch_ = watch;
        if (stopping_) watch->Stop();
      }
      end = watch->Wait();
      dynmig::MutexLock lock(&mu_);
      watch_.reset();
    } else {
      end = stream.status();
    }
    {
      dynmig::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (end.ok()) {  // server closed the stream normally: re-watch from the last version
      backoff = options_.min_backoff;
      continue;
    }
    const bool relist =
        end.code() == absl::StatusCode::kOutOfRange || end.code() == absl::StatusCode::kDataLoss;
    {
      dynmig::MutexLock lock(&mu_);
      if (end.code() == absl::StatusCode::kOutOfRange) {
        ++stats_.expired;
      } else {
        ++stats_.errors;
      }
      last_error_ = end;
    }
    if (relist) {
      spdlog::info("informer {}: {}; relisting", ResourceName(resource_),
                   std::string(end.message()));
      need_list = true;
      if (end.code() == absl::StatusCode::kOutOfRange) continue;  // relist at once
    } else {
      spdlog::debug("informer {}: watch ended: {}", ResourceName(resource_),
                    std::string(end.message()));
    }
    if (!SleepBackoff(&backoff)) return;
  }
}

}  // namespace dynmig::kube
