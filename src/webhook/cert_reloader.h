// CertReloader: a serving certificate and key read from PEM files and re-read when the files
// change (cert-manager and kubelet secret volumes replace them in place), so that the HTTPS server
// never needs a restart for a rotation. Installed on an OpenSSL SSL_CTX as a certificate callback
// (httplib 0.11's SSLServer(std::function<bool(SSL_CTX&)>) hook): on every TLS handshake the files'
// identity (inode, size, mtime) is checked and, when it changed, the new pair is loaded. A new pair
// that does not load or whose key does not match the certificate is refused (the previous one keeps
// being served, the error is logged and counted). Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;
typedef struct x509_st X509;
typedef struct evp_pkey_st EVP_PKEY;
typedef struct stack_st_X509 STACK_OF_X509;

namespace dynmig::webhook {

class CertReloader {
 public:
  // Loads the pair once. kInvalidArgument naming the file when it cannot be read or parsed, or
  // when the key does not match the certificate.
  static absl::StatusOr<std::unique_ptr<CertReloader>> Create(std::string cert_file,
                                                              std::string key_file);
  ~CertReloader();
  CertReloader(const CertReloader&) = delete;
  CertReloader& operator=(const CertReloader&) = delete;

  // Configures `ctx` (TLS 1.2+, the certificate callback). Returns false only on OpenSSL failure.
  // The reloader must outlive every connection of `ctx`.
  bool Install(SSL_CTX& ctx);

  // Re-reads the files when they changed. OK when unchanged or reloaded; the load error otherwise
  // (the previous pair stays).
  absl::Status MaybeReload() ABSL_LOCKS_EXCLUDED(mu_);

  int64_t reloads() const ABSL_LOCKS_EXCLUDED(mu_);   // successful reloads after the first load
  int64_t failures() const ABSL_LOCKS_EXCLUDED(mu_);  // refused reloads

 private:
  CertReloader(std::string cert_file, std::string key_file);
  absl::Status Load() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static int CertCallback(SSL* ssl, void* arg);

  const std::string cert_file_;
  const std::string key_file_;
  mutable dynmig::Mutex mu_;
  X509* cert_ ABSL_GUARDED_BY(mu_) = nullptr;
  STACK_OF_X509* chain_ ABSL_GUARDED_BY(mu_) = nullptr;
  EVP_PKEY* key_ ABSL_GUARDED_BY(mu_) = nullptr;
  // inode/size/mtime of both files at the last load attempt
  std::string identity_ ABSL_GUARDED_BY(mu_);
  int64_t reloads_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dynmig::webhook
