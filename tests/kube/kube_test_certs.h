// In-process test certificates for the kube tests (OpenSSL 3, no openssl CLI): EC P-256 keys and
// certificates signed by a test CA, as PEM.
#pragma once

#include <gtest/gtest.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <functional>
#include <memory>
#include <string>

#include "webhook/test_certs.h"

namespace dynmig::kube::testing {

struct KeyAndCert {
  std::shared_ptr<EVP_PKEY> key;
  std::shared_ptr<X509> cert;
  std::string key_pem;
  std::string cert_pem;
};

inline void AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  ASSERT_NE(ext, nullptr) << value;
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

// An EC P-256 key and a certificate for `cn`, signed by `issuer` (self-signed when null).
inline KeyAndCert MakeCert(const std::string& cn, const KeyAndCert* issuer, bool is_ca,
                           const char* san, const char* usage, long serial) {
  KeyAndCert out;
  out.key.reset(EVP_EC_gen("P-256"), EVP_PKEY_free);
  out.cert.reset(X509_new(), X509_free);
  X509* cert = out.cert.get();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), serial);
  X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert), 24 * 3600);
  X509_set_pubkey(cert, out.key.get());
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509* issuer_cert = issuer != nullptr ? issuer->cert.get() : cert;
  X509_set_issuer_name(cert, X509_get_subject_name(issuer_cert));
  AddExtension(cert, issuer_cert, NID_basic_constraints, is_ca ? "critical,CA:TRUE" : "CA:FALSE");
  if (is_ca) AddExtension(cert, issuer_cert, NID_key_usage, "critical,keyCertSign,cRLSign");
  if (san != nullptr) AddExtension(cert, issuer_cert, NID_subject_alt_name, san);
  if (usage != nullptr) AddExtension(cert, issuer_cert, NID_ext_key_usage, usage);
  X509_sign(cert, issuer != nullptr ? issuer->key.get() : out.key.get(), EVP_sha256());
  out.cert_pem = dynmig::testing::PemOf([&](BIO* b) { return PEM_write_bio_X509(b, cert); });
  out.key_pem = dynmig::testing::PemOf([&](BIO* b) {
    return PEM_write_bio_PrivateKey(b, out.key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  });
  return out;
}

}  // namespace dynmig::kube::testing
