// The extender's answers keep their meaning through its optimisations (reservations in memory
// until bind, trimmed FailedNodes, summaries that skip nodes, optimistic concurrency): a cluster
// shaped like bench_scheduler's is filled pod after pod over HTTP, and every answer is compared
// with a reference planned directly by mig::PlanPod over plain node views (what the extender did
// before): the same node, GPU, profile and placement for every pod, and, once nothing fits, the
// same reason for every node.
#include <gmock/gmock.h>

#include "protocol/pod_request.h"
#include "scheduler_test_util.h"

namespace dynmig::scheduler::testing {
namespace {

using ::testing::IsEmpty;

constexpr int kNodes = 12;
constexpr int kGpus = 8;

std::string NodeName(int n) { return fmt::format("node-{:02d}", n); }
std::string GpuName(int n, int g) { return fmt::format("GPU-{:02d}-{}", n, g); }

// The reference: node views built straight from the register annotation and the reservations.
class Reference {
 public:
  Reference() {
    for (int n = 0; n < kNodes; ++n) {
      std::vector<std::string> uuids;
      for (int g = 0; g < kGpus; ++g) uuids.push_back(GpuName(n, g));
      auto infos = protocol::DecodeNodeRegister(A100Register(uuids));
      EXPECT_TRUE(infos.ok()) << infos.status();
      mig::NodeView node;
      node.name = NodeName(n);
      for (const auto& info : *infos) {
        mig::GpuCapability cap = protocol::ToCapability(info);
        std::vector<std::string> allowed;
        const mig::Allowlist allowlist = TestAllowlist();
        const auto& profiles = allowlist.entries[0].profiles;
        for (const auto& p : cap.profiles) {
          if (std::find(profiles.begin(), profiles.end(), p.name) != profiles.end()) {
            allowed.push_back(p.name);
          }
        }
        mig::GpuView gpu;
        gpu.uuid = info.id;
        gpu.index = info.index;
        gpu.model = info.type;
        gpu.mode = info.mode;
        gpu.planner = *mig::GpuPlanner::Create(std::move(cap), allowed);
        node.gpus.push_back(std::move(gpu));
      }
      nodes_.push_back(std::move(node));
    }
  }
  void Reserve(int node, int gpu, const std::string& profile, mig::Placement placement) {
    mig::GpuView& g = nodes_[node].gpus[gpu];
    g.usage.occupied |= placement.Mask();
    ++g.usage.counts[g.planner->ProfileIndex(profile)];
  }
  int NodeIndex(const std::string& name) const {
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].name == name) return static_cast<int>(i);
    }
    return -1;
  }
  const std::vector<mig::NodeView>& nodes() const { return nodes_; }

 private:
  std::vector<mig::NodeView> nodes_;
};

TEST_F(SchedulerTest, AnswersMatchThePlannerPodForPodUntilTheClusterIsFull) {
  Reference ref;
  std::vector<std::string> names;
  for (int n = 0; n < kNodes; ++n) {
    std::vector<std::string> uuids;
    for (int g = 0; g < kGpus; ++g) uuids.push_back(GpuName(n, g));
    CreateNode(MigNode(NodeName(n), uuids));
    names.push_back(NodeName(n));
    // bench_scheduler's occupancy: GPUs 0-3 hold a 3g.20gb at 4-7, GPUs 4-5 a 7g.40gb; on the
    // later nodes fewer, so the nodes differ.
    for (int g = 0; g < 6 - n % 3; ++g) {
      const bool full = g >= 4;
      const std::string profile = full ? "7g.40gb" : "3g.20gb";
      const mig::Placement placement = full ? mig::Placement{0, 8} : mig::Placement{4, 4};
      kube::Object pod = MigPod(fmt::format("run-{}-{}", n, g), full ? 39000 : 19000,
                                {{"hami.io/vgpu-mig-allocations",
                                  Alloc(GpuName(n, g), profile, placement.start, placement.size)},
                                 {"hami.io/vgpu-node", NodeName(n)}});
      pod["spec"]["nodeName"] = NodeName(n);
      CreatePod(pod);
      ref.Reserve(n, g, profile, placement);
    }
  }
  SchedulerServer* s = StartScheduler();
  WaitForNodes(s, names);
  ASSERT_TRUE(kube::testing::Eventually([&] {
    for (int n = 0; n < kNodes; ++n) {
      auto v = s->state().View(NodeName(n), clock_.Now());
      for (int g = 0; g < kGpus; ++g) {
        if (!v.has_value() || v->gpus[g].usage.occupied != ref.nodes()[n].gpus[g].usage.occupied) {
          return false;
        }
      }
    }
    return true;
  }));

  // bench_scheduler's pods (1g, 2g, 3g in turn), with a two-container pod now and then.
  const int64_t mems[] = {4000, 9000, 19000};
  int reserved = 0, pending = 0;
  for (int i = 0; pending < 3; ++i) {
    ASSERT_LT(i, 2000) << "the cluster never filled";
    const std::string name = fmt::format("p-{:04d}", i);
    const kube::Object pod =
        CreatePod(i % 7 == 6 ? MigPod(name, std::vector<Ctr>{{"a", 2, 4000}, {"b", 1, 9000}})
                             : MigPod(name, mems[i % 3]));
    auto request = protocol::ParsePodRequest(pod, protocol::ResourceNames{});
    ASSERT_TRUE(request.ok()) << request.status();
    const mig::PodPlan expected = mig::PlanPod(std::span(ref.nodes()), *request);
    HttpResult r = Filter(s, pod, names);
    ASSERT_EQ(r.body["Error"], "") << r.text;
    if (expected.chosen < 0) {
      ++pending;
      ASSERT_THAT(r.body["NodeNames"], IsEmpty()) << name;
      // Every node with the reason the planner gives.
      std::map<std::string, std::string> reasons;
      for (const auto& node : ref.nodes()) {
        reasons[node.name] = mig::PlanPodOnNode(node, *request).Reason(node);
      }
      EXPECT_EQ(r.body["FailedNodes"].get<decltype(reasons)>(), reasons) << name;
      continue;
    }
    ++reserved;
    const mig::NodeView& node = ref.nodes()[expected.chosen];
    ASSERT_EQ(r.body["NodeNames"], json::array({node.name})) << name;
    EXPECT_THAT(r.body["FailedNodes"], IsEmpty()) << "nodes that could run it need no entry";
    const auto got = ReservedOf(s, name);
    const auto& want = expected.nodes[expected.chosen].assignments;
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t k = 0; k < want.size(); ++k) {
      const mig::GpuView& gpu = node.gpus[want[k].gpu];
      const std::string profile = gpu.planner->capability().profiles[want[k].profile_index].name;
      EXPECT_EQ(got[k].gpu_uuid, gpu.uuid) << name;
      EXPECT_EQ(got[k].profile, profile) << name;
      EXPECT_EQ(got[k].placement, want[k].placement) << name;
      EXPECT_EQ(got[k].container_index, static_cast<int>(want[k].container)) << name;
      ref.Reserve(expected.chosen, static_cast<int>(want[k].gpu), profile, want[k].placement);
    }
  }
  EXPECT_GT(reserved, 100);
  const auto events = EventMessages("p-0000", "MigReserved");
  EXPECT_EQ(events.size(), 1u);
}

}  // namespace
}  // namespace dynmig::scheduler::testing
