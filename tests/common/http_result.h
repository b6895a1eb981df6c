// What a test saw of one HTTP answer (cpp-httplib): status (-1 when none came), body text and the
// body parsed as JSON (discarded when it is not JSON).
#pragma once

#include <httplib.h>

#include <string>

#include "nlohmann/json.hpp"

namespace dynmig::testing {

struct HttpResult {
  int status = 0;
  nlohmann::json body;
  std::string text;
};

inline HttpResult ToHttpResult(const httplib::Result& res) {
  HttpResult out;
  if (!res) {
    out.status = -1;
    out.text = httplib::to_string(res.error());
    return out;
  }
  out.status = res->status;
  out.text = res->body;
  out.body = nlohmann::json::parse(res->body, nullptr, false);
  return out;
}

}  // namespace dynmig::testing
