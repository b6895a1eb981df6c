#include "kube/rest_kube_client.h"

#include <curl/curl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <mutex>  // std::call_once
#include <random>
#include <sstream>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "common/strings.h"
#include "kube/api_status.h"

namespace dynmig::kube {
namespace {

constexpr size_t kMaxErrorBody = 64 * 1024;
constexpr size_t kMaxWatchLine = kKubeObjectJsonLimits.max_bytes;

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string Escape(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

absl::Status CheckName(std::string_view what, std::string_view value) {
  for (char c : value) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_' ||
          c == ':')) {
      return absl::InvalidArgumentError(fmt::format(
          "invalid {} '{}': only letters, digits, '-', '.', '_' and ':' allowed", what, value));
    }
  }
  return absl::OkStatus();
}

void FillKind(Resource resource, Object* obj) {
  if (!obj->is_object()) return;
  const ResourceInfo& info = InfoFor(resource);
  if (!obj->contains("kind")) (*obj)["kind"] = info.kind;
  if (!obj->contains("apiVersion")) (*obj)["apiVersion"] = info.api_version;
}

std::string ListQueryString(const ListOptions& options, bool watch) {
  std::vector<std::string> params;
  if (watch) params.push_back("watch=true");
  if (!options.label_selector.empty()) {
    params.push_back("labelSelector=" + Escape(options.label_selector));
  }
  if (!options.field_selector.empty()) {
    params.push_back("fieldSelector=" + Escape(options.field_selector));
  }
  if (!options.resource_version.empty()) {
    params.push_back("resourceVersion=" + Escape(options.resource_version));
  }
  if (watch) {
    if (options.allow_bookmarks) params.push_back("allowWatchBookmarks=true");
    if (options.timeout_seconds > 0) {
      params.push_back(fmt::format("timeoutSeconds={}", options.timeout_seconds));
    }
  }
  std::string out;
  for (const auto& p : params) {
    out += out.empty() ? "?" : "&";
    out += p;
  }
  return out;
}

absl::Status TransportError(CURLcode code, const char* errbuf, std::string_view context) {
  const std::string detail = errbuf != nullptr && errbuf[0] != '\0'
                                 ? fmt::format("{} ({})", curl_easy_strerror(code), errbuf)
                                 : std::string(curl_easy_strerror(code));
  switch (code) {
    case CURLE_OPERATION_TIMEDOUT:
      return absl::DeadlineExceededError(fmt::format("{}: timed out: {}", context, detail));
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CIPHER:
      return absl::FailedPreconditionError(
          fmt::format("{}: TLS setup failed: {}", context, detail));
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
      return absl::UnavailableError(
          fmt::format("{}: response truncated or connection dropped: {}", context, detail));
    default:
      return absl::UnavailableError(fmt::format("{}: transport error: {}", context, detail));
  }
}

// A response body being received, refused (the transfer aborted) once it would exceed `limit`.
struct BoundedBody {
  std::string* body;
  size_t limit;
  bool exceeded = false;
};

size_t AppendBody(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<BoundedBody*>(user);
  if (sink->body->size() + size * n > sink->limit) {
    sink->exceeded = true;
    return 0;  // CURLE_WRITE_ERROR
  }
  sink->body->append(data, size * n);
  return size * n;
}

// Captures Retry-After.
size_t CaptureHeader(char* data, size_t size, size_t n, void* user) {
  std::string_view line(data, size * n);
  constexpr std::string_view kRetryAfter = "retry-after:";
  if (line.size() > kRetryAfter.size()) {
    std::string lower(line.substr(0, kRetryAfter.size()));
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower == kRetryAfter) {
      *static_cast<std::string*>(user) = std::string(Trim(line.substr(kRetryAfter.size())));
    }
  }
  return size * n;
}

curl_slist* BuildHeaders(const std::vector<std::string>& lines) {
  curl_slist* list = nullptr;
  for (const auto& line : lines) list = curl_slist_append(list, line.c_str());
  return list;
}

// ---------------------------------------------------------------------------------------------
// A watch: its own easy handle in its own multi handle, driven by its own thread.

class RestWatchStream;
// The watch whose thread this is (so Stop() from inside a handler does not join itself).
thread_local const RestWatchStream* tls_running_watch = nullptr;

class RestWatchStream : public WatchStream {
 public:
  RestWatchStream(const Clock& clock, Resource resource, WatchHandler handler, std::string start_rv,
                  std::string context)
      : clock_(clock),
        resource_(resource),
        handler_(std::move(handler)),
        context_(std::move(context)),
        last_rv_(std::move(start_rv)) {
    errbuf_[0] = '\0';
  }

  ~RestWatchStream() override {
    Stop();
    if (multi_ != nullptr) curl_multi_cleanup(multi_);
    if (headers_ != nullptr) curl_slist_free_all(headers_);
  }

  // Takes ownership of `easy` and `headers`; starts the transfer and waits until the response
  // headers arrived (or the transfer failed). Returns the HTTP code (0 on transport failure).
  long Start(CURL* easy, curl_slist* headers, absl::Duration header_timeout) {
    easy_ = easy;
    headers_ = headers;
    multi_ = curl_multi_init();
    curl_easy_setopt(easy_, CURLOPT_HTTPHEADER, headers_);
    curl_easy_setopt(easy_, CURLOPT_WRITEFUNCTION, &RestWatchStream::OnData);
    curl_easy_setopt(easy_, CURLOPT_WRITEDATA, this);
    curl_easy_setopt(easy_, CURLOPT_HEADERFUNCTION, &RestWatchStream::OnHeader);
    curl_easy_setopt(easy_, CURLOPT_HEADERDATA, this);
    curl_easy_setopt(easy_, CURLOPT_ERRORBUFFER, errbuf_);
    curl_multi_add_handle(multi_, easy_);
    thread_ = std::thread([this] { Run(); });
    dynmig::ReleasableMutexLock lock(&mu_);
    if (!clock_.WaitFor(cv_, mu_, header_timeout, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return headers_done_ || finished_;
        })) {
      lock.Release();
      Stop();
      dynmig::MutexLock relock(&mu_);
      result_ = absl::DeadlineExceededError(fmt::format(
          "{}: no response headers within {}", context_, absl::FormatDuration(header_timeout)));
      return 0;
    }
    if (http_code_ != 200) {
      // Wait for the error body so the status carries the API's message.
      while (!finished_) cv_.Wait(&mu_);
    }
    return http_code_;
  }

  const std::string& retry_after() const { return retry_after_; }

  void Stop() override {
    stop_ = true;
    if (multi_ != nullptr) curl_multi_wakeup(multi_);
    if (tls_running_watch == this) return;  // called from the handler
    dynmig::MutexLock lock(&join_mu_);
    if (thread_.joinable()) thread_.join();
  }

  absl::Status Wait() override {
    dynmig::MutexLock lock(&mu_);
    while (!finished_) cv_.Wait(&mu_);
    return result_;
  }

  std::optional<absl::Status> WaitFor(absl::Duration timeout) override {
    dynmig::MutexLock lock(&mu_);
    if (!clock_.WaitFor(cv_, mu_, timeout,
                        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_; })) {
      return std::nullopt;
    }
    return result_;
  }

  std::string last_resource_version() const override {
    dynmig::MutexLock lock(&mu_);
    return last_rv_;
  }

 private:
  static size_t OnHeader(char* data, size_t size, size_t n, void* user) {
    auto* self = static_cast<RestWatchStream*>(user);
    std::string_view line(data, size * n);
    if (line.rfind("HTTP/", 0) == 0) {
      const size_t space = line.find(' ');
      if (space != std::string_view::npos) {
        self->pending_code_ = std::atol(std::string(line.substr(space + 1, 3)).c_str());
      }
    } else if (line == "\r\n" || line == "\n") {
      if (self->pending_code_ >= 200) {  // skip 1xx interim responses
        self->response_code_ = self->pending_code_;
        dynmig::MutexLock lock(&self->mu_);
        self->http_code_ = self->pending_code_;
        self->headers_done_ = true;
        self->cv_.SignalAll();
      }
    } else {
      CaptureHeader(data, size, n, &self->retry_after_);
    }
    return size * n;
  }

  static size_t OnData(char* data, size_t size, size_t n, void* user) {
    auto* self = static_cast<RestWatchStream*>(user);
    const size_t len = size * n;
    if (self->stop_ || self->abort_) return 0;
    if (self->response_code_ != 200) {
      if (self->error_body_.size() < kMaxErrorBody) self->error_body_.append(data, len);
      return len;
    }
    self->pending_.append(data, len);
    size_t start = 0;
    while (true) {
      const size_t nl = self->pending_.find('\n', start);
      if (nl == std::string::npos) break;
      self->ProcessLine(std::string_view(self->pending_).substr(start, nl - start));
      start = nl + 1;
      if (self->abort_ || self->stop_) break;
    }
    self->pending_.erase(0, start);
    if (self->pending_.size() > kMaxWatchLine) {
      self->Abort(
          absl::DataLossError(fmt::format("{}: watch event larger than {} bytes without a newline",
                                          self->context_, kMaxWatchLine)));
    }
    return (self->abort_ || self->stop_) ? 0 : len;
  }

  void Abort(absl::Status status) {
    abort_status_ = std::move(status);
    abort_ = true;
  }

  void ProcessLine(std::string_view line) {
    line = Trim(line);
    if (line.empty()) return;  // heartbeat whitespace between events
    auto read = ParseObject(line, "watch event");
    if (!read.ok() || !read->is_object()) {
      Abort(absl::DataLossError(
          fmt::format("{}: malformed watch event: {}", context_,
                      read.ok() ? "not a JSON object" : std::string(read.status().message()))));
      return;
    }
    Object& parsed = *read;
    const std::string type = parsed.value("type", "");
    auto obj_it = parsed.find("object");
    if (obj_it == parsed.end() || !obj_it->is_object()) {
      Abort(absl::DataLossError(
          fmt::format("{}: watch event of type '{}' without an object", context_, type)));
      return;
    }
    WatchEvent event{WatchEventType::kError, std::move(*obj_it)};
    if (type == "ADDED") {
      event.type = WatchEventType::kAdded;
    } else if (type == "MODIFIED") {
      event.type = WatchEventType::kModified;
    } else if (type == "DELETED") {
      event.type = WatchEventType::kDeleted;
    } else if (type == "BOOKMARK") {
      event.type = WatchEventType::kBookmark;
    } else if (type == "ERROR") {
      event.type = WatchEventType::kError;
    } else {
      Abort(absl::DataLossError(
          fmt::format("{}: watch event with unknown type '{}'", context_, type)));
      return;
    }
    if (event.type != WatchEventType::kError) {
      FillKind(resource_, &event.object);
      dynmig::MutexLock lock(&mu_);
      const std::string rv = ResourceVersion(event.object);
      if (!rv.empty()) last_rv_ = rv;
    }
    if (!stop_) handler_(event);
    if (event.type == WatchEventType::kError) {
      Abort(StatusFromApiStatus(event.object, context_));
    }
  }

  void Run() {
    tls_running_watch = this;
    int running = 1;
    CURLcode transfer = CURLE_OK;
    while (true) {
      const CURLMcode mc = curl_multi_perform(multi_, &running);
      if (mc != CURLM_OK) {
        Abort(absl::UnavailableError(
            fmt::format("{}: curl multi error: {}", context_, curl_multi_strerror(mc))));
        break;
      }
      if (running == 0 || stop_) break;
      curl_multi_poll(multi_, nullptr, 0, 1000, nullptr);
    }
    int queued = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi_, &queued)) {
      if (msg->msg == CURLMSG_DONE) transfer = msg->data.result;
    }
    absl::Status result;
    if (stop_) {
      result = absl::CancelledError(fmt::format("{}: watch stopped", context_));
    } else if (abort_) {
      result = abort_status_;
    } else if (running != 0) {
      result = absl::UnavailableError(fmt::format("{}: watch ended unexpectedly", context_));
    } else if (transfer != CURLE_OK) {
      result = TransportError(transfer, errbuf_, fmt::format("{}: watch stream broken", context_));
      if (!Trim(pending_).empty()) {
        result = absl::Status(result.code(),
                              fmt::format("{} ({} bytes of an unfinished event)",
                                          std::string(result.message()), pending_.size()));
      }
    } else if (response_code_ != 200) {
      result = StatusFromHttp(static_cast<int>(response_code_), error_body_, context_);
    } else if (!Trim(pending_).empty()) {
      result = absl::DataLossError(fmt::format(
          "{}: watch stream ended inside an event ({} bytes unparsed)", context_, pending_.size()));
    }
    curl_multi_remove_handle(multi_, easy_);
    curl_easy_cleanup(easy_);
    easy_ = nullptr;
    dynmig::MutexLock lock(&mu_);
    result_ = std::move(result);
    finished_ = true;
    headers_done_ = true;
    cv_.SignalAll();
  }

  const Clock& clock_;
  const Resource resource_;
  const WatchHandler handler_;
  const std::string context_;
  CURL* easy_ = nullptr;
  CURLM* multi_ = nullptr;
  curl_slist* headers_ = nullptr;
  char errbuf_[CURL_ERROR_SIZE];
  std::thread thread_;  // started by Start(), joined under join_mu_
  dynmig::Mutex join_mu_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> abort_{false};
  absl::Status abort_status_;  // written on the watch thread before abort_ is read there
  // Written by the watch thread only.
  long pending_code_ = 0;
  long response_code_ = 0;  // http_code_ as the watch thread knows it
  std::string pending_;
  std::string error_body_;
  std::string retry_after_;

  mutable dynmig::Mutex mu_;
  dynmig::CondVar cv_;  // signalled when headers_done_ or finished_ becomes true
  long http_code_ ABSL_GUARDED_BY(mu_) = 0;  // set once, before any body data
  bool headers_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status result_ ABSL_GUARDED_BY(mu_);
  std::string last_rv_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

// ---------------------------------------------------------------------------------------------

RestKubeClient::RestKubeClient(RestConfig config, const Clock& clock)
    : config_(std::move(config)), clock_(clock) {}

absl::StatusOr<std::unique_ptr<RestKubeClient>> RestKubeClient::Create(RestConfig config,
                                                                       const Clock& clock) {
  GlobalInit();
  while (!config.server.empty() && config.server.back() == '/') config.server.pop_back();
  if (config.server.rfind("http://", 0) != 0 && config.server.rfind("https://", 0) != 0) {
    return absl::InvalidArgumentError(
        fmt::format("server URL '{}' must start with http:// or https://", config.server));
  }
  if (config.retry.max_attempts < 1) config.retry.max_attempts = 1;
  if (!config.retry.sleep) config.retry.sleep = [&clock](absl::Duration d) { clock.SleepFor(d); };
  return std::unique_ptr<RestKubeClient>(new RestKubeClient(std::move(config), clock));
}

RestKubeClient::~RestKubeClient() {
  dynmig::MutexLock lock(&pool_mu_);
  for (void* h : idle_handles_) curl_easy_cleanup(static_cast<CURL*>(h));
}

std::string RestKubeClient::ResourcePath(Resource resource, std::string_view ns,
                                         std::string_view name, std::string_view subresource) {
  const ResourceInfo& info = InfoFor(resource);
  std::string path(info.prefix);
  if (info.namespaced && !ns.empty()) path += fmt::format("/namespaces/{}", ns);
  path += fmt::format("/{}", info.plural);
  if (!name.empty()) path += fmt::format("/{}", name);
  if (!subresource.empty()) path += fmt::format("/{}", subresource);
  return path;
}

void* RestKubeClient::Acquire() {
  {
    dynmig::MutexLock lock(&pool_mu_);
    if (!idle_handles_.empty()) {
      void* h = idle_handles_.back();
      idle_handles_.pop_back();
      curl_easy_reset(static_cast<CURL*>(h));  // keeps its live connection
      return h;
    }
  }
  return curl_easy_init();
}

void RestKubeClient::Release(void* handle) {
  dynmig::MutexLock lock(&pool_mu_);
  if (idle_handles_.size() < 16) {
    idle_handles_.push_back(handle);
  } else {
    curl_easy_cleanup(static_cast<CURL*>(handle));
  }
}

absl::StatusOr<std::string> RestKubeClient::BearerToken() {
  if (config_.token_file.empty()) return config_.token;
  dynmig::MutexLock lock(&token_mu_);
  std::error_code ec;
  const auto mtime = std::filesystem::last_write_time(config_.token_file, ec);
  const int64_t stamp = ec ? -1 : static_cast<int64_t>(mtime.time_since_epoch().count());
  const auto size = std::filesystem::file_size(config_.token_file, ec);
  const int64_t bytes = ec ? -1 : static_cast<int64_t>(size);
  if (stamp == -1 || bytes == -1) {
    if (!cached_token_.empty()) return cached_token_;  // mid-rotation: keep the last one
    return absl::UnauthenticatedError(
        fmt::format("cannot read bearer token file '{}'", config_.token_file));
  }
  if (stamp != token_mtime_ || bytes != token_size_) {
    std::ifstream in(config_.token_file, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    cached_token_ = std::string(Trim(ss.str()));
    token_mtime_ = stamp;
    token_size_ = bytes;
  }
  return cached_token_;
}

absl::Status RestKubeClient::Configure(void* handle, const std::string& url,
                                       std::vector<std::string>* headers) {
  CURL* curl = static_cast<CURL*>(handle);
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(config_.connect_timeout)));
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPIDLE, 30L);
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPINTVL, 15L);
  curl_easy_setopt(curl, CURLOPT_USERAGENT, config_.user_agent.c_str());
  if (url.rfind("https://", 0) == 0) {
    if (!config_.ca_data.empty()) {
      curl_blob blob{const_cast<char*>(config_.ca_data.data()), config_.ca_data.size(),
                     CURL_BLOB_COPY};
      curl_easy_setopt(curl, CURLOPT_CAINFO_BLOB, &blob);
    } else if (!config_.ca_file.empty()) {
      curl_easy_setopt(curl, CURLOPT_CAINFO, config_.ca_file.c_str());
    }
    if (!config_.client_cert_data.empty()) {
      curl_blob blob{const_cast<char*>(config_.client_cert_data.data()),
                     config_.client_cert_data.size(), CURL_BLOB_COPY};
      curl_easy_setopt(curl, CURLOPT_SSLCERT_BLOB, &blob);
      curl_easy_setopt(curl, CURLOPT_SSLCERTTYPE, "PEM");
    } else if (!config_.client_cert_file.empty()) {
      curl_easy_setopt(curl, CURLOPT_SSLCERT, config_.client_cert_file.c_str());
    }
    if (!config_.client_key_data.empty()) {
      curl_blob blob{const_cast<char*>(config_.client_key_data.data()),
                     config_.client_key_data.size(), CURL_BLOB_COPY};
      curl_easy_setopt(curl, CURLOPT_SSLKEY_BLOB, &blob);
      curl_easy_setopt(curl, CURLOPT_SSLKEYTYPE, "PEM");
    } else if (!config_.client_key_file.empty()) {
      curl_easy_setopt(curl, CURLOPT_SSLKEY, config_.client_key_file.c_str());
    }
    if (config_.insecure_skip_tls_verify) {
      curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 0L);
      curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 0L);
    }
  }
  auto token = BearerToken();
  if (!token.ok()) return token.status();
  if (!token->empty()) headers->push_back(fmt::format("Authorization: Bearer {}", *token));
  headers->push_back("Accept: application/json");
  headers->push_back("Expect:");  // no 100-continue round trip
  return absl::OkStatus();
}

absl::StatusOr<RestKubeClient::HttpResponse> RestKubeClient::SendOnce(
    std::string_view method, const std::string& path_and_query, const std::string* body,
    std::string_view content_type, bool* connect_failed) {
  *connect_failed = false;
  ++attempts_;
  CURL* curl = static_cast<CURL*>(Acquire());
  if (curl == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
  std::vector<std::string> header_lines;
  absl::Status st = Configure(curl, config_.server + path_and_query, &header_lines);
  if (!st.ok()) {
    Release(curl);
    return st;
  }
  if (body != nullptr) header_lines.push_back(fmt::format("Content-Type: {}", content_type));
  curl_slist* headers = BuildHeaders(header_lines);
  HttpResponse response;
  char errbuf[CURL_ERROR_SIZE] = {0};
  const std::string method_str(method);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method_str.c_str());
  if (body != nullptr) {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body->data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body->size()));
  } else if (method == "GET") {
    curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
  }
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(config_.request_timeout)));
  BoundedBody sink{&response.body, kKubeResponseJsonLimits.max_bytes};
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &AppendBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &CaptureHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &response.retry_after);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
  const CURLcode rc = curl_easy_perform(curl);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.code);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, nullptr);
  curl_slist_free_all(headers);
  Release(curl);
  if (sink.exceeded) {
    return absl::DataLossError(fmt::format("{} {}: the response exceeds the {} limit", method,
                                           path_and_query, FormatBytes(sink.limit)));
  }
  if (rc != CURLE_OK) {
    *connect_failed = rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST;
    return TransportError(rc, errbuf, fmt::format("{} {}", method, path_and_query));
  }
  return response;
}

absl::Duration RestKubeClient::Backoff(int attempt) const {
  const RetryPolicy& p = config_.retry;
  absl::Duration d = p.initial_backoff;
  for (int i = 1; i < attempt && d < p.max_backoff; ++i) d *= 2;
  d = std::min(d, p.max_backoff);
  if (p.jitter > 0) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    d *= 1.0 + p.jitter * std::uniform_real_distribution<double>(0, 1)(rng);
  }
  return d;
}

absl::StatusOr<RestKubeClient::HttpResponse> RestKubeClient::Send(std::string_view method,
                                                                  const std::string& path_and_query,
                                                                  const std::string* body,
                                                                  std::string_view content_type,
                                                                  bool retry_bare_429) {
  const bool idempotent = method != "POST";
  const RetryPolicy& policy = config_.retry;
  for (int attempt = 1;; ++attempt) {
    bool connect_failed = false;
    auto response = SendOnce(method, path_and_query, body, content_type, &connect_failed);
    bool retry = false;
    absl::Duration delay = Backoff(attempt);
    if (!response.ok()) {
      const auto code = response.status().code();
      retry =
          (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded) &&
          (idempotent || connect_failed);
    } else if (response->code == 429 && !retry_bare_429 && response->retry_after.empty()) {
      retry = false;
    } else if (response->code == 429 || response->code >= 500) {
      retry = idempotent || response->code == 429 || response->code == 503;
      if (!response->retry_after.empty()) {
        const int seconds = std::atoi(response->retry_after.c_str());
        if (seconds >= 0) delay = std::min(absl::Seconds(seconds), policy.max_retry_after);
      }
    }
    if (!retry || attempt >= policy.max_attempts) return response;
    spdlog::debug("kube: {} {} attempt {} failed ({}); retrying in {}", method, path_and_query,
                  attempt,
                  response.ok() ? fmt::format("HTTP {}", response->code)
                                : std::string(response.status().message()),
                  absl::FormatDuration(delay));
    policy.sleep(delay);
  }
}

absl::StatusOr<Object> RestKubeClient::Call(std::string_view method,
                                            const std::string& path_and_query,
                                            const std::string* body, std::string_view content_type,
                                            Resource resource) {
  auto response = Send(method, path_and_query, body, content_type);
  const std::string context = fmt::format("{} {}", method, path_and_query);
  if (!response.ok()) return response.status();
  if (response->code < 200 || response->code >= 300) {
    return StatusFromHttp(static_cast<int>(response->code), response->body, context);
  }
  auto obj =
      ParseObject(response->body, fmt::format("response to {}", context), kKubeResponseJsonLimits);
  if (!obj.ok()) return obj.status();
  if (!obj->is_object()) {
    return absl::DataLossError(fmt::format("{}: response is not a JSON object", context));
  }
  if (Kind(*obj) != "Status") FillKind(resource, &*obj);
  return obj;
}

absl::StatusOr<Object> RestKubeClient::Get(Resource resource, std::string_view ns,
                                           std::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("Get: empty name");
  DYNMIG_RETURN_IF_ERROR(CheckName("namespace", ns));
  DYNMIG_RETURN_IF_ERROR(CheckName("name", name));
  return Call("GET", ResourcePath(resource, ns, name, ""), nullptr, "", resource);
}

absl::StatusOr<ObjectList> RestKubeClient::List(Resource resource, const ListOptions& options) {
  ObjectList out;
  auto rv = ListPages(resource, options, [&out](std::vector<Object>& items) {
    if (out.items.empty()) {
      out.items = std::move(items);
    } else {
      out.items.reserve(out.items.size() + items.size());
      for (auto& item : items) out.items.push_back(std::move(item));
    }
    return absl::OkStatus();
  });
  if (!rv.ok()) return rv.status();
  out.resource_version = std::move(*rv);
  return out;
}

absl::StatusOr<std::string> RestKubeClient::ListPages(
    Resource resource, const ListOptions& options,
    const std::function<absl::Status(std::vector<Object>& items)>& page) {
  DYNMIG_RETURN_IF_ERROR(CheckName("namespace", options.ns));
  const std::string base =
      ResourcePath(resource, options.ns, "", "") + ListQueryString(options, /*watch=*/false);
  std::string resource_version;
  std::string continue_token;
  bool first = true;
  std::vector<Object> items;
  while (first || !continue_token.empty()) {
    std::string path = base;
    if (options.limit > 0) {
      path += (path.find('?') == std::string::npos ? "?" : "&");
      path += fmt::format("limit={}", options.limit);
      if (!continue_token.empty()) path += "&continue=" + Escape(continue_token);
    }
    auto list = Call("GET", path, nullptr, "", resource);
    if (!list.ok()) return list.status();
    if (first) resource_version = StringAt(*list, "/metadata/resourceVersion");
    first = false;
    continue_token = StringAt(*list, "/metadata/continue");
    auto found = list->find("items");
    items.clear();
    if (found != list->end() && found->is_array()) {
      items.reserve(found->size());
      for (auto& item : *found) {
        FillKind(resource, &item);
        items.push_back(std::move(item));
      }
    } else if (found != list->end() && !found->is_null()) {
      return absl::DataLossError(fmt::format("GET {}: list 'items' is not an array", path));
    }
    *list = Object();  // free the moved-from page before reading the next one
    DYNMIG_RETURN_IF_ERROR(page(items));
    if (options.limit <= 0) break;
  }
  return resource_version;
}

absl::StatusOr<std::unique_ptr<WatchStream>> RestKubeClient::Watch(Resource resource,
                                                                   const ListOptions& options,
                                                                   WatchHandler handler) {
  DYNMIG_RETURN_IF_ERROR(CheckName("namespace", options.ns));
  if (!handler) return absl::InvalidArgumentError("Watch: no handler");
  const std::string path =
      ResourcePath(resource, options.ns, "", "") + ListQueryString(options, /*watch=*/true);
  const std::string context = fmt::format("WATCH {}", path);
  const RetryPolicy& policy = config_.retry;
  for (int attempt = 1;; ++attempt) {
    ++attempts_;
    CURL* curl = curl_easy_init();
    if (curl == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
    std::vector<std::string> header_lines;
    absl::Status st = Configure(curl, config_.server + path, &header_lines);
    if (!st.ok()) {
      curl_easy_cleanup(curl);
      return st;
    }
    curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
    if (options.timeout_seconds > 0) {
      // No bytes at all for this long means the connection is dead.
      curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
      curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                       static_cast<long>(options.timeout_seconds + 30));
    }
    auto stream = std::make_unique<RestWatchStream>(clock_, resource, handler,
                                                    options.resource_version, context);
    const long code = stream->Start(curl, BuildHeaders(header_lines),
                                    config_.connect_timeout + config_.request_timeout);
    if (code == 200) return std::unique_ptr<WatchStream>(std::move(stream));
    absl::Status failure = stream->Wait();
    const bool retryable = code == 429 || code >= 500 ||
                           (code == 0 && (failure.code() == absl::StatusCode::kUnavailable ||
                                          failure.code() == absl::StatusCode::kDeadlineExceeded));
    if (!retryable || attempt >= policy.max_attempts) return failure;
    absl::Duration delay = Backoff(attempt);
    if (!stream->retry_after().empty()) {
      delay =
          std::min(absl::Seconds(std::atoi(stream->retry_after().c_str())), policy.max_retry_after);
    }
    policy.sleep(delay);
  }
}

absl::StatusOr<Object> RestKubeClient::Create(Resource resource, const Object& obj) {
  if (!obj.is_object()) return absl::InvalidArgumentError("Create: object is not a JSON object");
  std::string ns = Namespace(obj);
  if (ns.empty()) ns = config_.ns;
  DYNMIG_RETURN_IF_ERROR(CheckName("namespace", ns));
  Object body = obj;
  FillKind(resource, &body);
  const std::string text = body.dump();
  return Call("POST", ResourcePath(resource, ns, "", ""), &text, "application/json", resource);
}

absl::StatusOr<Object> RestKubeClient::Update(Resource resource, const Object& obj,
                                              std::string_view subresource) {
  if (!obj.is_object()) return absl::InvalidArgumentError("Update: object is not a JSON object");
  const std::string name = Name(obj);
  if (name.empty()) return absl::InvalidArgumentError("Update: object has no metadata.name");
  std::string ns = Namespace(obj);
  if (ns.empty() && InfoFor(resource).namespaced) ns = config_.ns;
  DYNMIG_RETURN_IF_ERROR(CheckName("namespace", ns));
  DYNMIG_RETURN_IF_ERROR(CheckName("name", name));
  DYNMIG_RETURN_IF_ERROR(CheckName("subresource", subresource));
  Object body = obj;
  FillKind(resource, &body);
  const std::string text = body.dump();
  return Call("PUT", ResourcePath(resource, ns, name, subresource), &text, "application/json",
              resource);
}

absl::StatusOr<Object> RestKubeClient::Patch(Resource resource, std::string_view ns,
                                             std::string_view name, const Object& patch,
                                             PatchType type, std::string_view subresource) {
  if (name.empty()) return absl::InvalidArgumentError("Patch: empty name");
  DYNMIG_RETURN_IF_ERROR(CheckName("namespace", ns));
  DYNMIG_RETURN_IF_ERROR(CheckName("name", name));
  DYNMIG_RETURN_IF_ERROR(CheckName("subresource", subresource));
  std::string_view content_type;
  switch (type) {
    case PatchType::kMerge:
      content_type = "application/merge-patch+json";
      break;
    case PatchType::kStrategicMerge:
      content_type = "application/strategic-merge-patch+json";
      break;
    case PatchType::kJson:
      content_type = "application/json-patch+json";
      break;
  }
  const std::string text = patch.dump();
  return Call("PATCH", ResourcePath(resource, ns, name, subresource), &text, content_type,
              resource);
}

absl::StatusOr<Object> RestKubeClient::Delete(Resource resource, std::string_view ns,
                                              std::string_view name, const DeleteOptions& options) {
  if (name.empty()) return absl::InvalidArgumentError("Delete: empty name");
  DYNMIG_RETURN_IF_ERROR(CheckName("namespace", ns));
  DYNMIG_RETURN_IF_ERROR(CheckName("name", name));
  Object body = {{"kind", "DeleteOptions"}, {"apiVersion", "v1"}};
  if (options.grace_period_seconds) body["gracePeriodSeconds"] = *options.grace_period_seconds;
  if (!options.precondition_uid.empty()) {
    body["preconditions"]["uid"] = options.precondition_uid;
  }
  if (!options.precondition_resource_version.empty()) {
    body["preconditions"]["resourceVersion"] = options.precondition_resource_version;
  }
  const std::string text = body.dump();
  return Call("DELETE", ResourcePath(resource, ns, name, ""), &text, "application/json", resource);
}

absl::Status RestKubeClient::BindPod(std::string_view ns, std::string_view pod_name,
                                     std::string_view node_name, std::string_view pod_uid) {
  if (pod_name.empty() || node_name.empty()) {
    return absl::InvalidArgumentError("BindPod: pod and node names must be set");
  }
  DYNMIG_RETURN_IF_ERROR(CheckName("namespace", ns));
  DYNMIG_RETURN_IF_ERROR(CheckName("name", pod_name));
  Object metadata = {{"name", std::string(pod_name)}, {"namespace", std::string(ns)}};
  if (!pod_uid.empty()) metadata["uid"] = std::string(pod_uid);
  const Object binding = {
      {"apiVersion", "v1"},
      {"kind", "Binding"},
      {"metadata", metadata},
      {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", std::string(node_name)}}}};
  const std::string text = binding.dump();
  auto result = Call("POST", ResourcePath(Resource::kPods, ns, pod_name, "binding"), &text,
                     "application/json", Resource::kPods);
  if (result.ok()) return absl::OkStatus();
  const absl::Status& st = result.status();
  if (KubeHttpCode(st) == 409 && st.message().find("already assigned") != absl::string_view::npos) {
    absl::Status already(absl::StatusCode::kAlreadyExists, st.message());
    st.ForEachPayload(
        [&](absl::string_view key, const absl::Cord& value) { already.SetPayload(key, value); });
    return already;
  }
  return st;
}

std::string RestKubeClient::EvictionVersionFromDiscovery(const Object& core_resource_list) {
  constexpr std::string_view kFallback = "policy/v1beta1";
  if (!core_resource_list.is_object()) return std::string(kFallback);
  auto resources = core_resource_list.find("resources");
  if (resources == core_resource_list.end() || !resources->is_array()) {
    return std::string(kFallback);
  }
  for (const Object& entry : *resources) {
    if (!entry.is_object() || entry.value("name", Object()) != "pods/eviction") continue;
    const Object group = entry.value("group", Object());
    const Object version = entry.value("version", Object());
    if (group == "policy" && version == "v1") return "policy/v1";
    return std::string(kFallback);
  }
  return std::string(kFallback);
}

absl::StatusOr<std::string> RestKubeClient::EvictionApiVersion() {
  {
    dynmig::MutexLock lock(&eviction_mu_);
    if (!eviction_version_.empty()) return eviction_version_;
  }
  auto response = Send("GET", "/api/v1", nullptr, "");
  if (!response.ok()) return response.status();
  if (response->code != 200) {
    return StatusFromHttp(static_cast<int>(response->code), response->body,
                          "GET /api/v1 (which Eviction version the server takes)");
  }
  auto list = ParseObject(response->body, "GET /api/v1 resource list", kKubeResponseJsonLimits);
  if (!list.ok()) return list.status();
  std::string version = EvictionVersionFromDiscovery(*list);
  dynmig::MutexLock lock(&eviction_mu_);
  eviction_version_ = version;
  return version;
}

Object RestKubeClient::EvictionBody(std::string_view api_version, std::string_view ns,
                                    std::string_view pod_name, const EvictOptions& options) {
  Object delete_options = {{"kind", "DeleteOptions"}, {"apiVersion", "v1"}};
  if (options.grace_period_seconds) {
    delete_options["gracePeriodSeconds"] = *options.grace_period_seconds;
  }
  if (!options.precondition_uid.empty()) {
    delete_options["preconditions"]["uid"] = options.precondition_uid;
  }
  if (options.dry_run) delete_options["dryRun"] = Object::array({"All"});
  return Object{{"apiVersion", std::string(api_version)},
                {"kind", "Eviction"},
                {"metadata", {{"name", std::string(pod_name)}, {"namespace", std::string(ns)}}},
                {"deleteOptions", std::move(delete_options)}};
}

absl::Status RestKubeClient::EvictPod(std::string_view ns, std::string_view pod_name,
                                      const EvictOptions& options) {
  if (pod_name.empty()) return absl::InvalidArgumentError("EvictPod: empty pod name");
  if (ns.empty()) return absl::InvalidArgumentError("EvictPod: empty namespace");
  DYNMIG_RETURN_IF_ERROR(CheckName("namespace", ns));
  DYNMIG_RETURN_IF_ERROR(CheckName("name", pod_name));
  auto version = EvictionApiVersion();
  if (!version.ok()) return version.status();
  const std::string text = EvictionBody(*version, ns, pod_name, options).dump();
  const std::string path = ResourcePath(Resource::kPods, ns, pod_name, "eviction");
  auto response = Send("POST", path, &text, "application/json", /*retry_bare_429=*/false);
  if (!response.ok()) return response.status();
  if (response->code >= 200 && response->code < 300) return absl::OkStatus();
  absl::Status st = StatusFromHttp(static_cast<int>(response->code), response->body,
                                   fmt::format("POST {} ({})", path, *version));
  absl::StatusCode code = st.code();
  std::string message(st.message());
  // The budget's own words (which budget, how many healthy pods it needs and has) come as
  // details.causes.
  if (auto parsed = ParseObject(response->body, "eviction refusal"); parsed.ok()) {
    const Object causes = parsed->is_object()
                              ? parsed->value("details", Object::object()).value("causes", Object())
                              : Object();
    if (causes.is_array()) {
      for (const Object& cause : causes) {
        const std::string why = StringAt(cause, "/message");
        if (!why.empty()) message += fmt::format(" ({})", why.substr(0, 512));
      }
    }
  }
  if (response->code == 429 && response->retry_after.empty()) {
    code = absl::StatusCode::kResourceExhausted;
  } else if (response->code == 500 &&
             st.message().find("more than one PodDisruptionBudget") != absl::string_view::npos) {
    code = absl::StatusCode::kFailedPrecondition;
  }
  if (code == st.code() && message == st.message()) return st;
  absl::Status mapped(code, message);
  st.ForEachPayload(
      [&](absl::string_view key, const absl::Cord& value) { mapped.SetPayload(key, value); });
  return mapped;
}

}  // namespace dynmig::kube
