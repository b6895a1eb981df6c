// In-process test certificates (OpenSSL 3, no openssl CLI): an EC P-256 key and a self-signed
// certificate with SAN IP:127.0.0.1, DNS:localhost, written as PEM.
#pragma once

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <functional>
#include <memory>
#include <string>

namespace dynmig::testing {

struct TestCert {
  std::string cert_pem;
  std::string key_pem;
  std::string serial;  // decimal, to tell certificates apart
};

inline std::string PemOf(const std::function<int(BIO*)>& write) {
  BIO* bio = BIO_new(BIO_s_mem());
  write(bio);
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(len));
  BIO_free(bio);
  return out;
}

// A self-signed server certificate for `cn` with the given serial number.
inline TestCert MakeTestCert(const std::string& cn, long serial) {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), EVP_PKEY_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), X509_free);
  X509* c = cert.get();
  X509_set_version(c, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(c), serial);
  X509_gmtime_adj(X509_getm_notBefore(c), -3600);
  X509_gmtime_adj(X509_getm_notAfter(c), 24 * 3600);
  X509_set_pubkey(c, key.get());
  X509_NAME* name = X509_get_subject_name(c);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(c, name);
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, c, c, nullptr, nullptr, 0);
  for (auto [nid, value] : {std::pair{NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost"},
                            std::pair{NID_basic_constraints, "critical,CA:TRUE"},
                            std::pair{NID_ext_key_usage, "serverAuth"}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    X509_add_ext(c, ext, -1);
    X509_EXTENSION_free(ext);
  }
  X509_sign(c, key.get(), EVP_sha256());
  TestCert out;
  out.cert_pem = PemOf([&](BIO* b) { return PEM_write_bio_X509(b, c); });
  out.key_pem = PemOf([&](BIO* b) {
    return PEM_write_bio_PrivateKey(b, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  });
  out.serial = std::to_string(serial);
  return out;
}

}  // namespace dynmig::testing
