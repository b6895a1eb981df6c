// What the scheduler's live page (server.h GET /live) shows, taken at one instant: every node's
// GPUs with their reservations (ClusterState::Report), the pods the last filter left pending with
// its reason (SchedulerMetrics::PendingPods), and the latest events the scheduler recorded
// (EventRecorder::Recent). Bounded: at most kMaxPending pending pods and kMaxEvents events are
// taken; the renderer caps GPUs and owners itself. The page is rendered by injected functions
// (ops::LivePageRenderer), as /layout is, because the page lives in src/ops.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "scheduler/cluster_state.h"
#include "scheduler/events.h"
#include "scheduler/metrics.h"

namespace dynmig::scheduler {

struct LiveSnapshot {
  static constexpr size_t kMaxPending = 100;
  static constexpr size_t kMaxEvents = 50;
  absl::Time now;
  std::vector<NodeReport> nodes;
  std::vector<PendingPod> pending;  // longest waiting first
  size_t pending_total = 0;         // pending pods in all (pending holds at most kMaxPending)
  std::vector<RecentEvent> events;  // newest first
};

// The live page's parts (served under /live): the document, the body the page's own script fetches
// every few seconds and swaps in, the script and the style sheet (same origin: the page's
// Content-Security-Policy allows nothing else).
struct LivePageRenderer {
  std::function<std::string(const LiveSnapshot&)> page;
  std::function<std::string(const LiveSnapshot&)> body;
  std::string script;
  std::string style;
};

}  // namespace dynmig::scheduler
