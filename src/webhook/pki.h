// A small certificate authority in process (OpenSSL 3, no openssl CLI): the local mode's TLS
// material (a CA, the scheduler's serving certificate, kube-scheduler's client certificate) and the
// tests'. EC P-256 keys, SHA-256 signatures, PEM text. Not for production PKI: deploy/ uses the
// certgen Job or cert-manager. Thread-compatible.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dynmig::webhook {

struct PemPair {
  std::string cert_pem;
  std::string key_pem;
};

enum class CertUsage { kServer, kClient };

struct CertSpec {
  std::string common_name;
  // subjectAltName entries, "DNS:name" or "IP:addr" (server certificates).
  std::vector<std::string> sans;
  CertUsage usage = CertUsage::kServer;
  absl::Duration valid_for = absl::Hours(24 * 365);
  absl::Duration backdate = absl::Hours(1);  // notBefore = now - backdate
};

// A self-signed CA certificate (basicConstraints CA:TRUE, keyCertSign) named `common_name`.
absl::StatusOr<PemPair> MakeCa(const std::string& common_name,
                               absl::Duration valid_for = absl::Hours(24 * 3650));

// A leaf certificate signed by `ca`: extendedKeyUsage serverAuth or clientAuth, the SANs.
// kInvalidArgument when the CA's PEM does not load or a SAN is malformed.
absl::StatusOr<PemPair> IssueCert(const PemPair& ca, const CertSpec& spec);

// Writes `text` to `path` (mode 0600, replaced atomically through a temporary file).
absl::Status WritePrivateFile(const std::string& path, const std::string& text);

}  // namespace dynmig::webhook
