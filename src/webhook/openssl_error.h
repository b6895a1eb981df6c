// Internal to dynmig_webhook: OpenSSL's last error queue entry as text.
#pragma once

#include <openssl/err.h>

#include <string>

namespace dynmig::webhook::internal {

// The oldest error of this thread's OpenSSL queue (the queue is cleared), or a placeholder.
inline std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof(buf));
  return buf;
}

}  // namespace dynmig::webhook::internal
