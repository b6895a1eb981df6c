#include "webhook/pki.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "fmt/format.h"
#include "webhook/openssl_error.h"

namespace dynmig::webhook {
namespace {

using KeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using CertPtr = std::unique_ptr<X509, decltype(&X509_free)>;

using internal::OpenSslError;

template <typename Write>
std::string Pem(Write write) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  write(bio.get());
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(len));
}

PemPair ToPem(X509* cert, EVP_PKEY* key) {
  return {Pem([&](BIO* b) { return PEM_write_bio_X509(b, cert); }), Pem([&](BIO* b) {
            return PEM_write_bio_PrivateKey(b, key, nullptr, nullptr, 0, nullptr, nullptr);
          })};
}

// A new certificate with a random serial, the validity window and `key`'s public half.
absl::StatusOr<CertPtr> NewCert(const std::string& cn, EVP_PKEY* key, absl::Duration backdate,
                                absl::Duration valid_for) {
  CertPtr cert(X509_new(), X509_free);
  X509* c = cert.get();
  unsigned char serial[15];
  if (RAND_bytes(serial, sizeof(serial)) != 1) {
    return absl::InternalError("RAND_bytes: " + OpenSslError());
  }
  serial[0] &= 0x7f;  // positive
  std::unique_ptr<BIGNUM, decltype(&BN_free)> bn(BN_bin2bn(serial, sizeof(serial), nullptr),
                                                 BN_free);
  X509_set_version(c, 2);
  BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(c));
  X509_gmtime_adj(X509_getm_notBefore(c), -absl::ToInt64Seconds(backdate));
  X509_gmtime_adj(X509_getm_notAfter(c), absl::ToInt64Seconds(valid_for));
  X509_set_pubkey(c, key);
  X509_NAME_add_entry_by_txt(X509_get_subject_name(c), "CN", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  return cert;
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) {
    return absl::InvalidArgumentError(fmt::format("certificate extension {} = \"{}\": {}",
                                                  OBJ_nid2sn(nid), value, OpenSslError()));
  }
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PemPair> MakeCa(const std::string& common_name, absl::Duration valid_for) {
  KeyPtr key(EVP_EC_gen("P-256"), EVP_PKEY_free);
  if (!key) return absl::InternalError("cannot generate an EC key: " + OpenSslError());
  auto cert = NewCert(common_name, key.get(), absl::Hours(1), valid_for);
  if (!cert.ok()) return cert.status();
  X509* c = cert->get();
  X509_set_issuer_name(c, X509_get_subject_name(c));
  for (auto [nid, value] : {std::pair{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                            std::pair{NID_key_usage, "critical,keyCertSign,cRLSign"},
                            std::pair{NID_subject_key_identifier, "hash"}}) {
    if (absl::Status st = AddExtension(c, c, nid, value); !st.ok()) return st;
  }
  if (X509_sign(c, key.get(), EVP_sha256()) == 0) {
    return absl::InternalError("cannot sign the CA certificate: " + OpenSslError());
  }
  return ToPem(c, key.get());
}

absl::StatusOr<PemPair> IssueCert(const PemPair& ca, const CertSpec& spec) {
  std::unique_ptr<BIO, decltype(&BIO_free)> cbio(
      BIO_new_mem_buf(ca.cert_pem.data(), static_cast<int>(ca.cert_pem.size())), BIO_free);
  CertPtr ca_cert(PEM_read_bio_X509(cbio.get(), nullptr, nullptr, nullptr), X509_free);
  std::unique_ptr<BIO, decltype(&BIO_free)> kbio(
      BIO_new_mem_buf(ca.key_pem.data(), static_cast<int>(ca.key_pem.size())), BIO_free);
  KeyPtr ca_key(PEM_read_bio_PrivateKey(kbio.get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
  if (!ca_cert || !ca_key) {
    return absl::InvalidArgumentError("the CA certificate or key does not load: " + OpenSslError());
  }
  KeyPtr key(EVP_EC_gen("P-256"), EVP_PKEY_free);
  if (!key) return absl::InternalError("cannot generate an EC key: " + OpenSslError());
  auto cert = NewCert(spec.common_name, key.get(), spec.backdate, spec.valid_for);
  if (!cert.ok()) return cert.status();
  X509* c = cert->get();
  X509_set_issuer_name(c, X509_get_subject_name(ca_cert.get()));
  const bool server = spec.usage == CertUsage::kServer;
  std::vector<std::pair<int, std::string>> exts = {
      {NID_basic_constraints, "critical,CA:FALSE"},
      {NID_key_usage,
       server ? "critical,digitalSignature,keyEncipherment" : "critical,digitalSignature"},
      {NID_ext_key_usage, server ? "serverAuth" : "clientAuth"},
      {NID_authority_key_identifier, "keyid"}};
  if (!spec.sans.empty()) {
    std::string san;
    for (const auto& s : spec.sans) san += (san.empty() ? "" : ",") + s;
    exts.push_back({NID_subject_alt_name, san});
  }
  for (const auto& [nid, value] : exts) {
    if (absl::Status st = AddExtension(c, ca_cert.get(), nid, value); !st.ok()) return st;
  }
  if (X509_sign(c, ca_key.get(), EVP_sha256()) == 0) {
    return absl::InternalError("cannot sign the certificate: " + OpenSslError());
  }
  return ToPem(c, key.get());
}

absl::Status WritePrivateFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::PermissionDeniedError(fmt::format("{}: {}", tmp, std::strerror(errno)));
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return absl::InternalError(fmt::format("{}: {}", tmp, std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(fmt::format("rename {}: {}", path, std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace dynmig::webhook
