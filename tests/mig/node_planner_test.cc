#include "mig/node_planner.h"

#include <gtest/gtest.h>

#include "fmt/format.h"
#include "test_util.h"

namespace dynmig::mig {
namespace {

using testing::MakePlanner;
using testing::UsageOf;

const std::vector<std::string> kA100BaseNo4g = {"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"};

GpuView Gpu(const std::string& uuid, uint32_t index,
            const std::vector<std::pair<std::string, uint32_t>>& reserved = {},
            const std::string& model = "A100-SXM4-40GB") {
  GpuView g;
  g.uuid = uuid;
  g.index = index;
  g.planner =
      MakePlanner(model, model == "A100-SXM4-40GB" ? kA100BaseNo4g : std::vector<std::string>{});
  g.model = g.planner->capability().model;
  g.usage = UsageOf(*g.planner, reserved);
  return g;
}

PodRequest OneContainer(uint32_t count, uint64_t mib) {
  PodRequest r;
  r.containers.push_back({"main", false, count, {mib, 0}});
  return r;
}

TEST(NodePlannerTest, BinpackFillsTheFullestGpuSpreadTheEmptiest) {
  NodeView node{"node-a", true, "", {Gpu("GPU-0", 0), Gpu("GPU-1", 1, {{"3g.20gb", 4}})}};
  auto req = OneContainer(1, 4000);
  req.gpu_policy = GpuPolicy::kBinpack;
  auto binpack = PlanPodOnNode(node, req);
  ASSERT_TRUE(binpack.fits());
  EXPECT_EQ(binpack.assignments[0].gpu, 1u);
  req.gpu_policy = GpuPolicy::kSpread;
  auto spread = PlanPodOnNode(node, req);
  ASSERT_TRUE(spread.fits());
  EXPECT_EQ(spread.assignments[0].gpu, 0u);
}

TEST(NodePlannerTest, InstancesOfOneContainerStayOnOneGpuWhenTheyFit) {
  NodeView node{"node-a", true, "", {Gpu("GPU-0", 0), Gpu("GPU-1", 1)}};
  auto plan = PlanPodOnNode(node, OneContainer(3, 4000));
  ASSERT_TRUE(plan.fits());
  ASSERT_EQ(plan.assignments.size(), 3u);
  for (const auto& a : plan.assignments) EXPECT_EQ(a.gpu, plan.assignments[0].gpu);
  EXPECT_EQ(plan.assignments[2].device_index, 2u);
}

TEST(NodePlannerTest, InstancesSpreadOverGpusWhenOneGpuCannotHoldThemAll) {
  NodeView node{"node-a", true, "", {Gpu("GPU-0", 0, {{"3g.20gb", 0}}), Gpu("GPU-1", 1)}};
  auto plan = PlanPodOnNode(node, OneContainer(3, 19000));
  ASSERT_TRUE(plan.fits()) << plan.Reason(node);
  int on0 = 0, on1 = 0;
  for (const auto& a : plan.assignments) (a.gpu == 0 ? on0 : on1)++;
  EXPECT_EQ(on0, 1);
  EXPECT_EQ(on1, 2);
}

TEST(NodePlannerTest, ContainersSeeEachOthersReservations) {
  NodeView node{"node-a", true, "", {Gpu("GPU-0", 0)}};
  PodRequest r;
  r.containers.push_back({"init", true, 1, {19000, 0}});
  r.containers.push_back({"a", false, 1, {19000, 0}});
  auto plan = PlanPodOnNode(node, r);
  ASSERT_TRUE(plan.fits());
  ASSERT_EQ(plan.assignments.size(), 2u);
  EXPECT_FALSE(plan.assignments[0].placement.Overlaps(plan.assignments[1].placement));
  r.containers.push_back({"b", false, 1, {4000, 0}});
  auto full = PlanPodOnNode(node, r);
  EXPECT_FALSE(full.fits());
  EXPECT_EQ(full.verdict, Verdict::kCapacityExhausted);
}

TEST(NodePlannerTest, SelectionHintsFilterGpus) {
  NodeView node{"node-a", true, "", {Gpu("GPU-0", 0), Gpu("GPU-1", 1, {}, "H100 80GB")}};
  auto r = OneContainer(1, 4000);
  r.filter.use_uuids = {"GPU-1"};
  EXPECT_EQ(PlanPodOnNode(node, r).assignments.at(0).gpu, 1u);
  r.filter = {};
  r.filter.nouse_uuids = {"GPU-0"};
  EXPECT_EQ(PlanPodOnNode(node, r).assignments.at(0).gpu, 1u);
  r.filter = {};
  r.filter.use_types = {"H100"};
  EXPECT_EQ(PlanPodOnNode(node, r).assignments.at(0).gpu, 1u);
  r.filter = {};
  r.filter.nouse_types = {"A100", "H100"};
  auto none = PlanPodOnNode(node, r);
  EXPECT_EQ(none.verdict, Verdict::kFiltered);
  EXPECT_NE(none.Reason(node).find("nouse-gputype"), std::string::npos) << none.Reason(node);
  r.filter = {};
  r.filter.vgpu_mode = "hami-core";
  EXPECT_EQ(PlanPodOnNode(node, r).verdict, Verdict::kFiltered);
  r.filter.vgpu_mode = "mig";
  EXPECT_TRUE(PlanPodOnNode(node, r).fits());
}

TEST(NodePlannerTest, UnhealthyGpusAndNodesAreSkippedWithReasons) {
  NodeView node{"node-a", true, "", {Gpu("GPU-0", 0), Gpu("GPU-1", 1)}};
  node.gpus[0].healthy = false;
  node.gpus[0].unhealthy_reason = "pod ns/p has no readable MIG reservation";
  auto plan = PlanPodOnNode(node, OneContainer(1, 4000));
  ASSERT_TRUE(plan.fits());
  EXPECT_EQ(plan.assignments[0].gpu, 1u);
  node.gpus[1].healthy = false;
  auto none = PlanPodOnNode(node, OneContainer(1, 4000));
  EXPECT_EQ(none.verdict, Verdict::kGpuUnhealthy);
  EXPECT_NE(none.Reason(node).find("no readable MIG reservation"), std::string::npos);
  node.healthy = false;
  node.unhealthy_reason = "device plugin stopped reporting";
  auto down = PlanPodOnNode(node, OneContainer(1, 4000));
  EXPECT_EQ(down.verdict, Verdict::kNodeUnhealthy);
  EXPECT_NE(down.Reason(node).find("stopped reporting"), std::string::npos);
  NodeView empty{"node-b", true, "", {}};
  EXPECT_EQ(PlanPodOnNode(empty, OneContainer(1, 4000)).verdict, Verdict::kNoMigGpu);
}

TEST(NodePlannerTest, NodeVerdictIsTheClosestToFitting) {
  NodeView node{"node-a",
                true,
                "",
                {Gpu("GPU-0", 0, {{"1g.5gb", 1}, {"1g.5gb", 5}}),
                 Gpu("GPU-1", 1, {{"3g.20gb", 0}, {"3g.20gb", 4}})}};
  auto plan = PlanPodOnNode(node, OneContainer(1, 19000));
  EXPECT_EQ(plan.verdict, Verdict::kFragmented);
  const auto reason = plan.Reason(node);
  EXPECT_NE(reason.find("GPU-0"), std::string::npos);
  EXPECT_NE(reason.find("capacity exhausted"), std::string::npos) << reason;
}

TEST(NodePlannerTest, PodGoesToTheFullestNodeUnderBinpackAndTheEmptiestUnderSpread) {
  std::vector<NodeView> nodes{{"empty", true, "", {Gpu("GPU-0", 0)}},
                              {"busy", true, "", {Gpu("GPU-1", 0, {{"3g.20gb", 4}})}},
                              {"full", true, "", {Gpu("GPU-2", 0, {{"7g.40gb", 0}})}}};
  auto r = OneContainer(1, 4000);
  r.node_policy = NodePolicy::kBinpack;
  auto binpack = PlanPod(nodes, r);
  EXPECT_EQ(binpack.chosen, 1);
  EXPECT_FALSE(binpack.nodes[2].fits());
  r.node_policy = NodePolicy::kSpread;
  EXPECT_EQ(PlanPod(nodes, r).chosen, 0);
  auto big = OneContainer(1, 30000);
  EXPECT_EQ(PlanPod(nodes, big).chosen, 0);
  auto huge = OneContainer(1, 90000);
  EXPECT_EQ(PlanPod(nodes, huge).chosen, -1);
}

TEST(NodePlannerTest, ANodeWithABindInFlightIsChosenLastAmongEquallyGoodNodes) {
  // Three equal nodes: the first two have a bind in flight, so the third is chosen.
  std::vector<NodeView> nodes;
  for (const char* name : {"node-a", "node-b", "node-c"}) {
    nodes.push_back({name, true, "", {Gpu(std::string("GPU-") + name, 0, {{"3g.20gb", 4}})}});
  }
  nodes[0].bind_in_flight = nodes[1].bind_in_flight = true;
  const auto req = OneContainer(1, 4000);
  EXPECT_EQ(PlanPod(nodes, req).chosen, 2);
  // Never at the cost of packing: a fuller node wins even with a bind in flight.
  nodes[0].gpus[0] = Gpu("GPU-node-a", 0, {{"3g.20gb", 4}, {"2g.10gb", 0}});
  EXPECT_EQ(PlanPod(nodes, req).chosen, 0);
  // With none in flight, node order decides among equals as before.
  for (auto& n : nodes) n.bind_in_flight = false;
  nodes[0].gpus[0] = Gpu("GPU-node-a", 0, {{"3g.20gb", 4}});
  EXPECT_EQ(PlanPod(nodes, req).chosen, 0);
}

TEST(NodePlannerTest, SummariesRuleOutOnlyNodesThatCannotFit) {
  NodeView node{
      "node-a", true, "", {Gpu("GPU-0", 0, {{"7g.40gb", 0}}), Gpu("GPU-1", 1, {{"3g.20gb", 4}})}};
  NodeSummary s = Summarize(node);
  const GpuView x = Gpu("x", 0);  // kept alive: p3g refers into its planner
  const ProfileSpec& p3g = x.planner->capability().profiles[x.planner->ProfileIndex("3g.20gb")];
  // In sizing memory: 3g.20gb takes up to 20 GiB nominal, although NVML reports 19968 MiB.
  EXPECT_EQ(s.max_placeable_mib, p3g.SizingMib());
  EXPECT_GT(p3g.SizingMib(), p3g.memory_mib);
  EXPECT_TRUE(MayFit(s, OneContainer(1, 19000)));
  // The spec's 20000 MiB (examples/mig-mixed.yaml's large-3g) fits the free 3g.20gb: the summary
  // must not rule out what the planner places (found on the real cluster: the extender answered
  // FailedNodes {"node": ""} while `dynmig explain` said it fits).
  EXPECT_TRUE(PlanPodOnNode(node, OneContainer(1, 20000)).fits());
  EXPECT_TRUE(MayFit(s, OneContainer(1, 20000)));
  EXPECT_FALSE(MayFit(s, OneContainer(1, 30000)));
  EXPECT_TRUE(MayEverFit(s, OneContainer(1, 30000)));   // a 7g.40gb exists, just not free
  EXPECT_FALSE(MayEverFit(s, OneContainer(1, 50000)));  // no profile is that big
  EXPECT_FALSE(PlanPodOnNode(node, OneContainer(1, 30000)).fits());
  // Sized by percentage: never ruled out by the summary.
  PodRequest pct;
  pct.containers.push_back({"main", false, 1, {0, 100}});
  EXPECT_TRUE(MayFit(s, pct));
  // An unhealthy GPU offers nothing.
  node.gpus[1].healthy = false;
  EXPECT_EQ(Summarize(node).max_placeable_mib, 0u);
  EXPECT_FALSE(MayFit(Summarize(node), OneContainer(1, 4000)));
}

TEST(NodePlannerTest, PercentageResolvesPerGpuModel) {
  NodeView node{"node-a", true, "", {Gpu("GPU-0", 0, {}, "H100 80GB")}};
  PodRequest r;
  r.containers.push_back({"main", false, 1, {0, 45}});
  auto plan = PlanPodOnNode(node, r);
  ASSERT_TRUE(plan.fits());
  EXPECT_EQ(node.gpus[0].planner->capability().profiles[plan.assignments[0].profile_index].name,
            "3g.40gb");
}

// Warm instances: among placements that are otherwise equally good, the one of an idle instance of
// the chosen profile; never one with a worse fragmentation score. Every state of 1g reservations,
// every request size, an idle instance at every free placement of the chosen profile.
TEST(NodePlannerTest, AnIdleInstancePlacementWinsOnlyAmongEquals) {
  int ties = 0, checked = 0;
  for (uint32_t bits = 0; bits < 128; ++bits) {
    std::vector<std::pair<std::string, uint32_t>> reserved;
    for (uint32_t u = 0; u < 7; ++u) {
      if (bits & (1u << u)) reserved.push_back({"1g.5gb", u});
    }
    const GpuView plain = Gpu("GPU-0", 0, reserved);
    const auto& planner = *plain.planner;
    const SliceMask full = FullMask(planner.units());
    for (uint64_t mib : {4000, 9000, 19000}) {
      const auto req = OneContainer(1, mib);
      auto base = PlanPodOnNode(NodeView{"node-a", true, "", {plain}}, req);
      if (!base.fits()) continue;
      const Assignment& chosen = base.assignments[0];
      auto score = [&](const Placement& pl) {
        return planner.FragmentationScore(full & ~(plain.usage.occupied | pl.Mask()));
      };
      for (const auto& pl : planner.capability().profiles[chosen.profile_index].placements) {
        if (pl.Mask() & plain.usage.occupied) continue;
        GpuView warm = plain;
        warm.idle.push_back({chosen.profile_index, pl});
        auto plan = PlanPodOnNode(NodeView{"node-a", true, "", {warm}}, req);
        ASSERT_TRUE(plan.fits());
        ++checked;
        if (score(pl) == score(chosen.placement)) {
          EXPECT_EQ(plan.assignments[0].placement, pl)
              << "state " << bits << ", idle at " << pl.start << ", " << mib << " MiB";
          EXPECT_EQ(plan.idle_reused, 1u);
          ties += pl != chosen.placement ? 1 : 0;
        } else {
          EXPECT_EQ(plan.assignments[0].placement, chosen.placement)
              << "state " << bits << ", idle at " << pl.start << ": must not cost fragmentation";
          EXPECT_EQ(plan.idle_reused, 0u);
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
  EXPECT_GT(ties, 0) << "no state had two equally good placements: the test proves nothing";
}

TEST(NodePlannerTest, AnIdleInstanceOfAnotherProfileIsNotPreferred) {
  GpuView plain = Gpu("GPU-0", 0);
  const NodeView without{"node-a", true, "", {plain}};
  auto base = PlanPodOnNode(without, OneContainer(1, 4000));
  ASSERT_TRUE(base.fits());
  GpuView warm = plain;
  // A 2g.10gb idle at 0: a 1g request does not land on it (it would not be reused).
  warm.idle.push_back({static_cast<uint32_t>(plain.planner->ProfileIndex("2g.10gb")), {0, 2}});
  auto plan = PlanPodOnNode(NodeView{"node-a", true, "", {warm}}, OneContainer(1, 4000));
  ASSERT_TRUE(plan.fits());
  EXPECT_EQ(plan.assignments[0].placement, base.assignments[0].placement);
  EXPECT_EQ(plan.idle_reused, 0u);
}

TEST(NodePlannerTest, SeveralInstancesLandOnIdleInstancesWhenEquallyGood) {
  GpuView plain = Gpu("GPU-0", 0);
  const auto req = OneContainer(2, 4000);
  auto base = PlanPodOnNode(NodeView{"node-a", true, "", {plain}}, req);
  ASSERT_TRUE(base.fits());
  // Idle instances exactly where the plan goes anyway: both reused, same plan.
  GpuView warm = plain;
  const uint32_t one_g = static_cast<uint32_t>(plain.planner->ProfileIndex("1g.5gb"));
  for (const auto& a : base.assignments) warm.idle.push_back({one_g, a.placement});
  auto plan = PlanPodOnNode(NodeView{"node-a", true, "", {warm}}, req);
  ASSERT_TRUE(plan.fits());
  EXPECT_EQ(plan.idle_reused, 2u);
  for (size_t i = 0; i < plan.assignments.size(); ++i) {
    EXPECT_EQ(plan.assignments[i].placement, base.assignments[i].placement);
  }
}

// Between nodes that are otherwise equal, the one where the pod reuses an idle instance.
TEST(NodePlannerTest, TheNodeWithTheIdleInstanceWinsATie) {
  GpuView a = Gpu("GPU-a", 0);
  GpuView b = Gpu("GPU-b", 0);
  const auto req = OneContainer(1, 4000);
  auto base = PlanPodOnNode(NodeView{"node-a", true, "", {a}}, req);
  ASSERT_TRUE(base.fits());
  b.idle.push_back(
      {static_cast<uint32_t>(b.planner->ProfileIndex("1g.5gb")), base.assignments[0].placement});
  std::vector<NodeView> nodes = {NodeView{"node-a", true, "", {a}},
                                 NodeView{"node-b", true, "", {b}}};
  auto pick = PlanPod(nodes, req);
  EXPECT_EQ(pick.chosen, 1);
  EXPECT_EQ(pick.nodes[1].idle_reused, 1u);
  // Without idle instances: node order, as before.
  nodes[1].gpus[0].idle.clear();
  EXPECT_EQ(PlanPod(nodes, req).chosen, 0);
}

// Attack (issue 27): a pod asking for 50,000 instances of 1000 MiB. The work once grew with the
// count squared per GPU; the node refuses it before any per-GPU plan, with a reason that says
// what the node holds. A count of 2^32-1 would take ages (and 32 GiB) by any O(count) path.
TEST(NodePlannerTest, MoreInstancesThanTheNodeHoldsAreRefusedWithoutPlanning) {
  NodeView node{"node-a", true, "", {Gpu("GPU-0", 0), Gpu("GPU-1", 1)}};
  for (uint32_t count : {50000u, UINT32_MAX, 15u}) {
    const NodePlan plan = PlanPodOnNode(node, OneContainer(count, 1000));
    EXPECT_EQ(plan.verdict, Verdict::kCapacityExhausted) << count;
    EXPECT_EQ(plan.gpu_plans, 0u) << count;  // refused before any GpuPlanner::Plan
    EXPECT_EQ(plan.Reason(node),
              fmt::format("capacity-exhausted: the pod asks for {} MIG instances; the 2 GPU(s) "
                          "of this node it may use hold at most 14",
                          count));
  }
  // Spread over many containers: the total counts.
  PodRequest many;
  for (int c = 0; c < 15; ++c) many.containers.push_back({"c", false, 1, {1000, 0}});
  EXPECT_EQ(PlanPodOnNode(node, many).gpu_plans, 0u);
  EXPECT_FALSE(PlanPodOnNode(node, many).fits());
  // Over a cluster: no node is planned, none fits.
  const std::vector<NodeView> nodes(3, node);
  const PodPlan cluster = PlanPod(nodes, OneContainer(50000, 1000));
  EXPECT_EQ(cluster.chosen, -1);
  for (const auto& p : cluster.nodes) EXPECT_EQ(p.gpu_plans, 0u);
  // The summaries rule such a pod out before any per-GPU work too.
  const RequestSummary huge = SummarizeRequest(OneContainer(50000, 1000));
  EXPECT_EQ(huge.instances, 50000u);
  EXPECT_FALSE(MayFit(Summarize(node), huge));
  EXPECT_FALSE(MayEverFit(Summarize(node), huge));
}

// What the node holds exactly still plans as before, and the work stays bounded by its size.
TEST(NodePlannerTest, AsManyInstancesAsTheNodeHoldsStillFit) {
  NodeView node{"node-a", true, "", {Gpu("GPU-0", 0), Gpu("GPU-1", 1)}};
  const NodeSummary s = Summarize(node);
  EXPECT_EQ(s.max_instances, 14u);
  EXPECT_EQ(s.free_instances, 14u);
  const NodePlan plan = PlanPodOnNode(node, OneContainer(14, 1000));
  ASSERT_TRUE(plan.fits()) << plan.Reason(node);
  EXPECT_EQ(plan.assignments.size(), 14u);
  // One plan of all 14 on each GPU, then the spread: at most 7 + 1 tries per GPU.
  EXPECT_LE(plan.gpu_plans, 2u + 2u * 8u);
  EXPECT_TRUE(MayFit(s, SummarizeRequest(OneContainer(14, 1000))));
  // 13 free instances now: a pod of 14 cannot fit until something is released.
  node.gpus[0] = Gpu("GPU-0", 0, {{"1g.5gb", 0}});
  EXPECT_EQ(Summarize(node).free_instances, 13u);
  EXPECT_FALSE(MayFit(Summarize(node), SummarizeRequest(OneContainer(14, 1000))));
  EXPECT_TRUE(MayEverFit(Summarize(node), SummarizeRequest(OneContainer(14, 1000))));
  EXPECT_FALSE(PlanPodOnNode(node, OneContainer(14, 1000)).fits());
}

}  // namespace
}  // namespace dynmig::mig
