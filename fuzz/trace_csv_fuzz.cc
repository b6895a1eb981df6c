// Alibaba trace CSV (dynmig simulate): parsing never crashes; what parses is sorted by arrival, and
// every pod's count, share and times are in range.
#include "fuzz/fuzz_util.h"
#include "sim/trace.h"

namespace dynmig::fuzz {

int FuzzTraceCsv(const uint8_t* data, size_t size) {
  auto trace = sim::ParseAlibabaCsv(AsText(data, size), "fuzz.csv");
  if (!trace.ok()) return 0;
  for (size_t i = 0; i < trace->pods.size(); ++i) {
    const sim::TracePod& pod = trace->pods[i];
    Check(!(pod.departure < pod.arrival), "a trace pod departs before it arrives");
    Check(pod.count >= 1 && pod.count <= sim::kMaxInstancesPerPod,
          "a trace pod's instance count is out of range");
    Check(pod.percent >= 1 && pod.percent <= 100, "a trace pod's percent is out of range");
    Check(i == 0 || !(pod.arrival < trace->pods[i - 1].arrival),
          "trace pods are not sorted by arrival");
  }
  return 0;
}

}  // namespace dynmig::fuzz
