#include "webhook/cert_reloader.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cstdio>

#include "fmt/format.h"
#include "spdlog/spdlog.h"
#include "webhook/openssl_error.h"

namespace dynmig::webhook {
namespace {

std::string FileIdentity(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return path + ":missing";
  return fmt::format("{}:{}:{}:{}.{}", path, static_cast<uint64_t>(st.st_ino),
                     static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec),
                     static_cast<int64_t>(st.st_mtim.tv_nsec));
}

using internal::OpenSslError;

struct FileCloser {
  void operator()(FILE* f) const {
    if (f != nullptr) fclose(f);
  }
};

}  // namespace

CertReloader::CertReloader(std::string cert_file, std::string key_file)
    : cert_file_(std::move(cert_file)), key_file_(std::move(key_file)) {}

CertReloader::~CertReloader() {
  X509_free(cert_);
  EVP_PKEY_free(key_);
  if (chain_ != nullptr) sk_X509_pop_free(reinterpret_cast<STACK_OF(X509)*>(chain_), X509_free);
}

absl::StatusOr<std::unique_ptr<CertReloader>> CertReloader::Create(std::string cert_file,
                                                                   std::string key_file) {
  std::unique_ptr<CertReloader> r(new CertReloader(std::move(cert_file), std::move(key_file)));
  dynmig::MutexLock lock(&r->mu_);
  absl::Status st = r->Load();
  if (!st.ok()) return st;
  return r;
}

absl::Status CertReloader::Load() {
  identity_ = FileIdentity(cert_file_) + "|" + FileIdentity(key_file_);
  std::unique_ptr<FILE, FileCloser> cf(fopen(cert_file_.c_str(), "r"));
  if (!cf) {
    return absl::InvalidArgumentError(
        fmt::format("TLS certificate {}: cannot open the file", cert_file_));
  }
  X509* cert = PEM_read_X509(cf.get(), nullptr, nullptr, nullptr);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        fmt::format("TLS certificate {}: no PEM certificate: {}", cert_file_, OpenSslError()));
  }
  STACK_OF(X509)* chain = sk_X509_new_null();
  while (X509* extra = PEM_read_X509(cf.get(), nullptr, nullptr, nullptr)) {
    sk_X509_push(chain, extra);
  }
  ERR_clear_error();  // the end of the file reads as an error
  std::unique_ptr<FILE, FileCloser> kf(fopen(key_file_.c_str(), "r"));
  EVP_PKEY* key = kf ? PEM_read_PrivateKey(kf.get(), nullptr, nullptr, nullptr) : nullptr;
  auto drop = [&] {
    X509_free(cert);
    EVP_PKEY_free(key);
    sk_X509_pop_free(chain, X509_free);
  };
  if (key == nullptr) {
    const std::string why = kf ? OpenSslError() : "cannot open the file";
    drop();
    return absl::InvalidArgumentError(fmt::format("TLS key {}: {}", key_file_, why));
  }
  if (X509_check_private_key(cert, key) != 1) {
    ERR_clear_error();
    drop();
    return absl::InvalidArgumentError(
        fmt::format("TLS key {} does not match the certificate {}", key_file_, cert_file_));
  }
  X509_free(cert_);
  EVP_PKEY_free(key_);
  if (chain_ != nullptr) sk_X509_pop_free(reinterpret_cast<STACK_OF(X509)*>(chain_), X509_free);
  cert_ = cert;
  key_ = key;
  chain_ = reinterpret_cast<STACK_OF_X509*>(chain);
  return absl::OkStatus();
}

absl::Status CertReloader::MaybeReload() {
  dynmig::MutexLock lock(&mu_);
  const std::string now = FileIdentity(cert_file_) + "|" + FileIdentity(key_file_);
  if (now == identity_) return absl::OkStatus();
  absl::Status st = Load();
  if (st.ok()) {
    ++reloads_;
    spdlog::info("TLS: reloaded the serving certificate from {}", cert_file_);
  } else {
    ++failures_;
    spdlog::warn("TLS: keeping the previous serving certificate: {}", std::string(st.message()));
  }
  return st;
}

int CertReloader::CertCallback(SSL* ssl, void* arg) {
  auto* self = static_cast<CertReloader*>(arg);
  (void)self->MaybeReload();
  dynmig::MutexLock lock(&self->mu_);
  if (self->cert_ == nullptr || self->key_ == nullptr) return 0;
  if (SSL_use_cert_and_key(ssl, self->cert_, self->key_,
                           reinterpret_cast<STACK_OF(X509)*>(self->chain_), 1) != 1) {
    ERR_clear_error();
    return 0;
  }
  return 1;
}

bool CertReloader::Install(SSL_CTX& ctx) {
  SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(&ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_SESSION_RESUMPTION_ON_RENEGOTIATION);
  SSL_CTX_set_cert_cb(&ctx, &CertReloader::CertCallback, this);
  return true;
}

int64_t CertReloader::reloads() const {
  dynmig::MutexLock lock(&mu_);
  return reloads_;
}

int64_t CertReloader::failures() const {
  dynmig::MutexLock lock(&mu_);
  return failures_;
}

}  // namespace dynmig::webhook
