#include "scheduler/client_auth.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <sys/stat.h>

#include <cstdio>

#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace dynmig::scheduler {
namespace {

std::string FileIdentity(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return path + ":missing";
  return fmt::format("{}:{}:{}:{}.{}", path, static_cast<uint64_t>(st.st_ino),
                     static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec),
                     static_cast<int64_t>(st.st_mtim.tv_nsec));
}

// The handshake goes on whatever the client certificate is; Authenticate() reads the verdict
// (SSL_get_verify_result keeps the first error) and the handlers answer with a clear error.
int KeepHandshake(int /*preverify_ok*/, X509_STORE_CTX* /*ctx*/) { return 1; }

std::string Subject(X509* cert) {
  char buf[256] = {};
  X509_NAME_oneline(X509_get_subject_name(cert), buf, sizeof(buf) - 1);
  return buf;
}

}  // namespace

ClientCertAuth::ClientCertAuth(std::string ca_file) : ca_file_(std::move(ca_file)) {}

ClientCertAuth::~ClientCertAuth() {
  X509_STORE_free(store_);
  if (names_ != nullptr) {
    sk_X509_NAME_pop_free(reinterpret_cast<STACK_OF(X509_NAME)*>(names_), X509_NAME_free);
  }
}

absl::StatusOr<std::unique_ptr<ClientCertAuth>> ClientCertAuth::Create(std::string ca_file) {
  std::unique_ptr<ClientCertAuth> a(new ClientCertAuth(std::move(ca_file)));
  dynmig::MutexLock lock(&a->mu_);
  if (absl::Status st = a->Load(); !st.ok()) return st;
  return a;
}

absl::Status ClientCertAuth::Load() {
  identity_ = FileIdentity(ca_file_);
  FILE* f = fopen(ca_file_.c_str(), "r");
  if (f == nullptr) {
    return absl::InvalidArgumentError(
        fmt::format("extender client CA {}: cannot open the file", ca_file_));
  }
  X509_STORE* store = X509_STORE_new();
  STACK_OF(X509_NAME)* names = sk_X509_NAME_new_null();
  int count = 0;
  while (X509* cert = PEM_read_X509(f, nullptr, nullptr, nullptr)) {
    X509_STORE_add_cert(store, cert);
    sk_X509_NAME_push(names, X509_NAME_dup(X509_get_subject_name(cert)));
    X509_free(cert);
    ++count;
  }
  fclose(f);
  ERR_clear_error();  // the end of the file reads as an error
  if (count == 0) {
    X509_STORE_free(store);
    sk_X509_NAME_pop_free(names, X509_NAME_free);
    return absl::InvalidArgumentError(
        fmt::format("extender client CA {}: no PEM certificate in the file", ca_file_));
  }
  X509_STORE_free(store_);
  if (names_ != nullptr) {
    sk_X509_NAME_pop_free(reinterpret_cast<STACK_OF(X509_NAME)*>(names_), X509_NAME_free);
  }
  store_ = store;
  names_ = reinterpret_cast<STACK_OF_X509_NAME*>(names);
  return absl::OkStatus();
}

absl::Status ClientCertAuth::MaybeReload() {
  dynmig::MutexLock lock(&mu_);
  if (FileIdentity(ca_file_) == identity_) return absl::OkStatus();
  absl::Status st = Load();
  if (st.ok()) {
    ++reloads_;
    spdlog::info("TLS: reloaded the extender client CA from {}", ca_file_);
  } else {
    ++failures_;
    spdlog::warn("TLS: keeping the previous extender client CA: {}", std::string(st.message()));
  }
  return st;
}

int ClientCertAuth::ClientHelloCallback(SSL* ssl, int* /*alert*/, void* arg) {
  auto* self = static_cast<ClientCertAuth*>(arg);
  (void)self->MaybeReload();
  dynmig::MutexLock lock(&self->mu_);
  // This handshake verifies against the CAs loaded now (a reload does not touch live ones).
  SSL_set1_verify_cert_store(ssl, self->store_);
  SSL_set_client_CA_list(ssl,
                         SSL_dup_CA_list(reinterpret_cast<STACK_OF(X509_NAME)*>(self->names_)));
  SSL_set_verify(ssl, SSL_VERIFY_PEER, &KeepHandshake);
  return SSL_CLIENT_HELLO_SUCCESS;
}

bool ClientCertAuth::Install(SSL_CTX& ctx) {
  SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER, &KeepHandshake);
  SSL_CTX_set_client_hello_cb(&ctx, &ClientCertAuth::ClientHelloCallback, this);
  // No session resumption: every connection is a full handshake whose client certificate is
  // verified against the CAs loaded then (a resumed session would carry an old verdict across a CA
  // rotation). Without this a client that resumes (browsers open a second connection with the
  // first one's ticket) got an internal-error alert: OpenSSL refuses to resume a session under
  // SSL_VERIFY_PEER without a session id context.
  SSL_CTX_set_session_cache_mode(&ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(&ctx, SSL_OP_NO_TICKET);
  return SSL_CTX_set_num_tickets(&ctx, 0) == 1;
}

absl::Status ClientCertAuth::Authenticate(const SSL* ssl) const {
  constexpr std::string_view kWho =
      "/filter and /bind accept only kube-scheduler, which presents a client certificate signed "
      "by the extender client CA";
  if (ssl == nullptr) {
    return absl::UnauthenticatedError(fmt::format("not a TLS connection; {}", kWho));
  }
  X509* peer = SSL_get0_peer_certificate(ssl);
  if (peer == nullptr) {
    return absl::UnauthenticatedError(fmt::format("no client certificate; {}", kWho));
  }
  const long verdict = SSL_get_verify_result(ssl);
  if (verdict != X509_V_OK) {
    return absl::UnauthenticatedError(
        fmt::format("the client certificate \"{}\" is not accepted ({}); {}", Subject(peer),
                    X509_verify_cert_error_string(verdict), kWho));
  }
  return absl::OkStatus();
}

int64_t ClientCertAuth::reloads() const {
  dynmig::MutexLock lock(&mu_);
  return reloads_;
}

int64_t ClientCertAuth::failures() const {
  dynmig::MutexLock lock(&mu_);
  return failures_;
}

}  // namespace dynmig::scheduler
