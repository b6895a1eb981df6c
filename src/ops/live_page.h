// The scheduler's live page (GET /live, scheduler/server.h): every GPU with its slices and the pods
// that own them, the pods the scheduler left pending with its reason, and its latest events. Pure.
//
// The page is a document whose <main id="live"> holds the body; its own script (/live/script.js,
// no library, nothing fetched from elsewhere) fetches /live/body every data-refresh-ms and swaps
// it in, so the page follows the cluster without a reload; without script a <noscript> meta
// refresh reloads it. Every text (pod and node names, reasons, event messages) is HTML-escaped, and
// the page has no inline script or style (the server's Content-Security-Policy forbids them).
//
// The body's structure, which tests and users can rely on:
//   #snapshot[data-time]                               the snapshot's time (unix seconds)
//   #gpus .node[data-node] > .gpu[data-node][data-gpu][data-index][data-model][data-units]
//       [data-free]                                   one per GPU (class "gpu unhealthy" with
//                                                     .reason when failed closed)
//     table.slices td.slice[data-pod][data-profile][data-start][data-size] a reservation;
//       td.slice.idle[data-profile] a warm instance; td.free[data-unit] a free unit
//     ul.owners > li.owner[data-pod][data-profile][data-start][data-size][data-mig]  one per
//                                                     reservation
//   #pending tr.pending[data-pod][data-reason] > td.pod, td.reason, td.detail, td.waiting
//   #events tr.event[data-type][data-reason][data-pod] > td.time, td.type, td.reason, td.pod,
//       td.message
// Bounded: at most kMaxGpus GPUs and kMaxOwners owners per GPU are drawn (a line says how many
// were left out), the snapshot's pending pods and events as given (LiveSnapshot caps them).
#pragma once

#include <string>
#include <string_view>

#include "scheduler/live_snapshot.h"

namespace dynmig::ops {

inline constexpr size_t kLiveMaxGpus = 512;
inline constexpr size_t kLiveMaxOwners = 32;
inline constexpr int kLiveRefreshMs = 2000;

std::string RenderLivePage(const scheduler::LiveSnapshot& snapshot);
std::string RenderLiveBody(const scheduler::LiveSnapshot& snapshot);
std::string_view LivePageScript();
std::string_view LivePageStyle();

// The four together, for SchedulerServerOptions::live.
scheduler::LivePageRenderer LivePageRenderer();

}  // namespace dynmig::ops
