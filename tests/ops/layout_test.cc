#include "ops/layout.h"

#include <regex>

#include "ops/ops_test_util.h"
#include "protocol/idle_instances.h"

namespace dynmig::ops::testing {
namespace {

size_t Count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos;
       pos = haystack.find(needle, pos + needle.size())) {
    ++n;
  }
  return n;
}

class LayoutTest : public OpsTest {
 protected:
  void SetUp() override {
    OpsTest::SetUp();
    AddDeviceConfig();
    Add(Node("node-a",
             Register({{"GPU-a0"}, {"GPU-a1"}}, {"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"})));
    Add(Node("node-b", Register({{"GPU-b0"}}, {"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"})));
    Add(PlacedPod("train", "node-a", 19000,
                  {{"GPU-a0", "3g.20gb", 4, 4, Runtime{"MIG-train", 2, 0}}}));
    Add(PlacedPod("infer", "node-a", 4000, {{"GPU-a0", "1g.5gb", 0, 1}}, "Pending"));
    Add(PlacedPod("x", "node-b", 9000, {{"GPU-b0", "2g.10gb", 2, 2, Runtime{"MIG-x", 5, 0}}}));
    // GPU-a1 fails closed: a pod holds its devices (the system's device annotation) without a
    // reservation.
    json rogue = Pod("rogue", "node-a", 4000);
    Annotate(rogue, protocol::kDevicesAllocatedAnnotation,
             "GPU-a1,NVIDIA A100-SXM4-40GB,4864,15:;");
    Add(rogue);
  }
};

TEST_F(LayoutTest, TerminalPictureLabelsEachReservation) {
  auto r = Run({"layout"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("GPU 0  NVIDIA A100-SXM4-40GB  GPU-a0  3 of 8 units free"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\[ +3g\.20gb +\])"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\[ +train +\])"))) << r.out;
  EXPECT_NE(r.out.find("[ infer ]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MIG-train (GI 2, CI 0)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("default/infer"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not realized yet"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("UNHEALTHY: pod default/rogue holds devices of this GPU without a MIG "
                       "reservation"),
            std::string::npos)
      << r.out;
  // --node keeps one node.
  auto b = Run({"layout", "--node", "node-b"});
  EXPECT_EQ(b.out.find("node-a"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("GPU-b0"), std::string::npos);
  EXPECT_EQ(Run({"layout", "--node", "node-z"}).code, 2);
}

TEST_F(LayoutTest, JsonListsGpusAndReservations) {
  const json r = RunJson({"layout"}, 0);
  ASSERT_EQ(r["nodes"].size(), 2u);
  const json& a = r["nodes"][0];
  EXPECT_EQ(a["name"], "node-a");
  ASSERT_EQ(a["gpus"].size(), 2u);
  EXPECT_EQ(a["gpus"][0]["freeUnits"], 3);
  EXPECT_EQ(a["gpus"][0]["reservations"].size(), 2u);
  EXPECT_EQ(a["gpus"][1]["healthy"], false);
  EXPECT_EQ(r["nodes"][1]["gpus"][0]["reservations"][0]["migUUID"], "MIG-x");
}

TEST_F(LayoutTest, IdleInstancesAreShownAsFreeSlicesWithTheirProfile) {
  json c = Node("node-c", Register({{"GPU-c0"}}, {"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"}));
  c["metadata"]["annotations"][std::string(protocol::kNodeIdleInstancesAnnotation)] =
      R"([{"gpuUUID":"GPU-c0","profile":"1g.5gb","placement":{"start":6,"size":1},)"
      R"("idleSince":1800000000}])";
  Add(c);
  auto r = Run({"layout", "--node", "node-c"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("8 of 8 units free"), std::string::npos) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(6 +1g\.5gb +\(idle\) +warm instance)")))
      << r.out;
  const json j = RunJson({"layout", "--node", "node-c"}, 0);
  const json& idle = j["nodes"][0]["gpus"][0]["idle"];
  ASSERT_EQ(idle.size(), 1u);
  EXPECT_EQ(idle[0]["profile"], "1g.5gb");
  EXPECT_EQ(idle[0]["placement"]["start"], 6);
  EXPECT_EQ(idle[0]["idleSince"], 1800000000);
  EXPECT_EQ(j["nodes"][0]["gpus"][0]["freeUnits"], 8);
}

TEST_F(LayoutTest, HtmlPageHasARowPerGpuAndASpanPerReservation) {
  const std::string file = (dir_ / "layout.html").string();
  auto r = Run({"layout", "--html", file});
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(file);
  const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(page.find("<style>"), std::string::npos);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(page.find("http"), std::string::npos);  // nothing fetched from outside
  EXPECT_EQ(Count(page, "<tr class=\"gpu"), 3u);
  EXPECT_NE(page.find("<tr class=\"gpu\" data-node=\"node-a\" data-gpu=\"GPU-a0\">"),
            std::string::npos);
  EXPECT_NE(page.find("<tr class=\"gpu unhealthy\" data-node=\"node-a\" data-gpu=\"GPU-a1\">"),
            std::string::npos);
  EXPECT_NE(page.find("unhealthy: pod default/rogue holds devices of this GPU"), std::string::npos);
  EXPECT_EQ(Count(page, "<span class=\"res"), 3u);
  // A cell per placement unit: 8 unit labels per GPU.
  EXPECT_EQ(Count(page, "<span class=\"unit\""), 24u);
  // Tooltips: pod, profile, placement, MIG UUID.
  EXPECT_NE(page.find("title=\"pod default/train&#10;profile 3g.20gb&#10;placement 4-7 (start 4, "
                      "size 4)&#10;MIG-train (GI 2, CI 0)\""),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("grid-column:5 / span 4"), std::string::npos);
  EXPECT_NE(page.find("class=\"res pending\" data-pod=\"default/infer\""), std::string::npos);
  // '-' prints the page.
  auto dash = Run({"layout", "--html", "-"});
  EXPECT_EQ(dash.out.rfind("<!DOCTYPE html>", 0), 0u);
}

// Whole GPUs (MIG off, one pod each) are drawn among the node's MIG GPUs in index order, with the
// pod that holds them; the register's words are escaped on the page.
TEST_F(OpsTest, LayoutShowsWholeGpusAndWhoHoldsThem) {
  AddDeviceConfig(std::string(kDeviceConfig) + "  migModeSwitching: {enabled: true}\n");
  auto infos = protocol::DecodeNodeRegister(Register({{"GPU-m0"}}));
  ASSERT_TRUE(infos.ok());
  infos->push_back(
      protocol::WholeGpuDeviceInfo({"GPU-w1", 1, 0, true}, "NVIDIA H100 80GB HBM3", 81559));
  infos->push_back(protocol::WholeGpuDeviceInfo({"GPU-w2", 2, 0, true}, "H100 <i>x</i>", 1024));
  Add(Node("node-w", protocol::EncodeNodeRegister(*infos)));
  Add(PlacedWholeGpuPod("holder", "node-w", "GPU-w1,NVIDIA H100 80GB HBM3,81559,100:;"));
  auto text = Run({"layout"});
  ASSERT_EQ(text.code, 0) << text.err;
  const size_t mig = text.out.find("GPU 0  NVIDIA A100");
  const size_t w1 = text.out.find(
      "GPU 1  NVIDIA H100 80GB HBM3  GPU-w1  whole GPU (MIG off, 81559 MiB): held by "
      "default/holder\n");
  const size_t w2 =
      text.out.find("GPU 2  H100 <i>x</i>  GPU-w2  whole GPU (MIG off, 1024 MiB): free");
  ASSERT_NE(mig, std::string::npos) << text.out;
  ASSERT_NE(w1, std::string::npos) << text.out;
  ASSERT_NE(w2, std::string::npos) << text.out;
  EXPECT_LT(mig, w1);
  EXPECT_LT(w1, w2);
  const json j = RunJson({"layout"}, 0);
  ASSERT_EQ(j["nodes"][0]["wholeGpus"].size(), 2u) << j.dump(2);
  EXPECT_EQ(j["nodes"][0]["wholeGpus"][0]["uuid"], "GPU-w1");
  EXPECT_EQ(j["nodes"][0]["wholeGpus"][0]["pod"], "default/holder");
  EXPECT_EQ(j["nodes"][0]["wholeGpus"][0]["assumed"], false);
  EXPECT_EQ(j["nodes"][0]["wholeGpus"][1]["pod"], "");
  EXPECT_EQ(j["nodes"][0]["gpus"].size(), 1u);
  auto page = Run({"layout", "--html", "-"});
  ASSERT_EQ(page.code, 0) << page.err;
  EXPECT_NE(page.out.find("3 GPUs"), std::string::npos) << page.out;
  EXPECT_NE(page.out.find("data-gpu=\"GPU-w1\""), std::string::npos);
  EXPECT_NE(page.out.find("whole GPU &middot; holder</span>"), std::string::npos) << page.out;
  EXPECT_NE(page.out.find("title=\"whole GPU free\">free</span>"), std::string::npos);
  EXPECT_EQ(page.out.find("<i>x</i>"), std::string::npos);  // escaped
  EXPECT_LT(page.out.find("data-gpu=\"GPU-m0\""), page.out.find("data-gpu=\"GPU-w1\""));
}

TEST(LayoutHtmlTest, LibraryFunctionForTheScheduler) {
  scheduler::NodeReport n;
  n.name = "n1";
  scheduler::GpuReport g;
  g.uuid = "GPU-1";
  g.model = "NVIDIA A30";
  g.units = 4;
  g.allowlisted = true;
  g.reservations.push_back(
      {"ns/<b>p</b>", "2g.12gb", {0, 2}, false, protocol::RuntimeIdentity{"MIG-p", 1, 0}});
  n.gpus.push_back(g);
  scheduler::NodeReport down;
  down.name = "n2";
  down.healthy = false;
  down.unhealthy_reason = "the device plugin stopped reporting";
  const std::string page = RenderLayoutHtml({n, down}, absl::FromUnixSeconds(0));
  EXPECT_NE(page.find("snapshot 1970-01-01 00:00:00 UTC"), std::string::npos);
  EXPECT_NE(page.find("repeat(4,minmax(0,1fr))"), std::string::npos);
  EXPECT_NE(page.find("2 of 4 units free"), std::string::npos);
  EXPECT_NE(page.find("unhealthy: the device plugin stopped reporting"), std::string::npos);
  EXPECT_NE(page.find("No MIG GPU registered."), std::string::npos);
  EXPECT_EQ(page.find("<b>p</b>"), std::string::npos);  // escaped
  EXPECT_NE(page.find("2g.12gb &middot; &lt;b&gt;p&lt;/b&gt;"), std::string::npos) << page;
  EXPECT_EQ(page.substr(page.size() - 8), "</html>\n");
}

}  // namespace
}  // namespace dynmig::ops::testing
