// ClientCertAuth: client-certificate authentication of the extender's callers (kube-scheduler's
// extender tlsConfig certFile/keyFile) on the scheduler's one HTTPS listener.
//
// Installed on the server's SSL_CTX next to the serving-certificate reloader: every handshake
// requests, but does not require, a client certificate from the CAs in ca_file (their names travel
// in the CertificateRequest, so Go clients pick the matching certificate), and never fails because
// of one: the webhooks (called by the API server without a client certificate), /metrics and the
// probes keep working unchanged. The handlers of /filter and /bind then call Authenticate(), which
// accepts only a certificate that chained to one of those CAs with the TLS client purpose
// (extendedKeyUsage clientAuth or none; a serving-only certificate of the same CA is refused).
//
// The CA file is re-read when it changes (inode, size or mtime), as CertReloader does for the
// serving pair: a bundle that does not load is refused and the previous CAs stay. Thread-safe.
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
typedef struct x509_store_st X509_STORE;
typedef struct stack_st_X509_NAME STACK_OF_X509_NAME;

namespace dynmig::scheduler {

class ClientCertAuth {
 public:
  // Loads the CA bundle once. kInvalidArgument naming the file when it cannot be read or holds no
  // PEM certificate.
  static absl::StatusOr<std::unique_ptr<ClientCertAuth>> Create(std::string ca_file);
  ~ClientCertAuth();
  ClientCertAuth(const ClientCertAuth&) = delete;
  ClientCertAuth& operator=(const ClientCertAuth&) = delete;

  // Configures `ctx` (request a client certificate, keep the handshake whatever it is, the CAs per
  // handshake, no session resumption). Returns false only on OpenSSL failure. Must outlive every
  // connection of `ctx`.
  bool Install(SSL_CTX& ctx);

  // OK when the connection `ssl` presented a client certificate that verified; else
  // kUnauthenticated saying what is missing or wrong (null `ssl`: a plain HTTP connection).
  absl::Status Authenticate(const SSL* ssl) const;

  // Re-reads the CA file when it changed. OK when unchanged or reloaded.
  absl::Status MaybeReload() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& ca_file() const { return ca_file_; }
  int64_t reloads() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t failures() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit ClientCertAuth(std::string ca_file);
  absl::Status Load() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static int ClientHelloCallback(SSL* ssl, int* alert, void* arg);

  const std::string ca_file_;
  mutable dynmig::Mutex mu_;
  X509_STORE* store_ ABSL_GUARDED_BY(mu_) = nullptr;
  STACK_OF_X509_NAME* names_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string identity_ ABSL_GUARDED_BY(mu_);
  int64_t reloads_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failures_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dynmig::scheduler
