// The admission webhook: any body gets an AdmissionReview answer (JSON with a response), as a
// mutating and as a validating webhook, never a crash.
#include "fuzz/fuzz_util.h"
#include "nlohmann/json.hpp"
#include "webhook/admission.h"

namespace {

dynmig::webhook::AdmissionHandler MakeHandler() {
  dynmig::webhook::AdmissionOptions o;
  o.allowlist.entries.push_back(
      {{"A100-SXM4-40GB"}, {"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}});
  o.allowlist.entries.push_back({{"H100 80GB"}, {"1g.10gb", "3g.40gb", "7g.80gb"}});
  return dynmig::webhook::AdmissionHandler(std::move(o));
}

}  // namespace

namespace dynmig::fuzz {

int FuzzAdmissionReview(const uint8_t* data, size_t size) {
  static const webhook::AdmissionHandler handler = MakeHandler();
  const std::string_view body = AsText(data, size);
  for (bool mutate : {true, false}) {
    const std::string answer = handler.Review(body, mutate);
    const auto parsed = nlohmann::json::parse(answer, nullptr, /*allow_exceptions=*/false);
    Check(parsed.is_object() && parsed.contains("response"),
          "the admission answer is not an AdmissionReview with a response");
    const auto& allowed = parsed["response"]["allowed"];
    Check(allowed.is_boolean(), "the admission answer has no allowed flag");
    Check(mutate || !parsed["response"].contains("patch"), "a validating answer carries a patch");
  }
  return 0;
}

}  // namespace dynmig::fuzz
