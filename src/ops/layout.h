// `dynmig layout`: the slices of every GPU and who holds them, from the scheduler's report
// (scheduler::ClusterState::Report), as a terminal picture, as JSON, and as a self-contained HTML
// page (inline CSS, no scripts) that the scheduler can also serve at /layout. Pure.
#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "ops/picture.h"
#include "scheduler/cluster_state.h"

namespace dynmig::ops {

// The page: per node a heading (with its health), one table row per GPU (class "gpu", with
// data-node and data-gpu attributes; unhealthy GPUs get class "gpu unhealthy" and their reason), a
// cell per placement unit, and each reservation as a colored span (class "res") across its units
// with a tooltip (title) naming the pod, profile, placement and MIG UUID / GI / CI when realized.
// Every text is HTML-escaped. `now` is printed as the time of the snapshot.
std::string RenderLayoutHtml(const std::vector<scheduler::NodeReport>& nodes, absl::Time now);

// The terminal picture: per GPU the unit header, a row of profiles and a row of pod names drawn by
// `painter`, then one line per reservation (placement, profile, pod, runtime identity) and per idle
// (warm) instance (pod "(idle)"; its slices are drawn free).
std::string RenderLayoutText(const std::vector<scheduler::NodeReport>& nodes,
                             const SlicePainter& painter);

// {"nodes":[{"name","healthy","reason","gpus":[{"uuid","index","model","units","allowlisted",
//   "allowedProfiles","healthy","reason","freeUnits","reservations":[{"pod","profile",
//   "placement":{"start","size"},"assumed","migUUID","gpuInstanceID","computeInstanceID"}],
//   "idle":[{"profile","placement":{"start","size"},"idleSince"}]}]}]}   (idle: warm instances)
nlohmann::json LayoutJson(const std::vector<scheduler::NodeReport>& nodes);

// Units drawn for a GPU: its axis, or (not allowlisted: unknown) the end of its reservations, 8 at
// least.
uint32_t DrawnUnits(const scheduler::GpuReport& gpu);

// The short name of a pod key ("default/train-1" -> "train-1").
std::string ShortPodName(const std::string& pod_key);

}  // namespace dynmig::ops
