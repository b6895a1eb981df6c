// The scheduler's live page (ops/live_page.h): its structure, escaping of everything a user or
// tenant can write, and its bounds. The page in a real browser: tests/browser/live_page_test.py.
#include "ops/live_page.h"

#include <gmock/gmock.h>

#include <regex>

#include "common/strings.h"
#include "fmt/format.h"

namespace dynmig::ops::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

size_t LiveCount(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

scheduler::GpuReport LiveA30(const std::string& uuid) {
  scheduler::GpuReport g;
  g.uuid = uuid;
  g.model = "NVIDIA A30";
  g.units = 4;
  g.allowlisted = true;
  return g;
}

scheduler::LiveSnapshot LiveSnapshotForTest() {
  scheduler::LiveSnapshot s;
  s.now = absl::FromUnixSeconds(1000);
  scheduler::NodeReport n;
  n.name = "node-a";
  scheduler::GpuReport g = LiveA30("GPU-1");
  g.reservations.push_back(
      {"default/train", "2g.12gb", {2, 2}, false, protocol::RuntimeIdentity{"MIG-t", 1, 0}});
  g.reservations.push_back({"team/infer", "1g.6gb", {0, 1}, true, std::nullopt});
  n.gpus.push_back(g);
  n.gpus.push_back(LiveA30("GPU-2"));
  s.nodes.push_back(n);
  s.pending.push_back({"default/big", "capacity-exhausted", "pending: no candidate node fits",
                       absl::FromUnixSeconds(1000 - 75)});
  s.pending_total = 1;
  s.events.push_back(
      {absl::FromUnixSeconds(990), "Normal", "MigReserved", "default/train", "reserved 2g.12gb"});
  return s;
}

TEST(LivePageTest, OneElementPerGpuWithItsSlicesAndOwners) {
  const std::string body = RenderLiveBody(LiveSnapshotForTest());
  EXPECT_EQ(LiveCount(body, "<div class=\"gpu\""), 2u);
  EXPECT_THAT(body, HasSubstr("data-gpu=\"GPU-1\" data-index=\"0\" data-model=\"NVIDIA A30\" "
                              "data-units=\"4\" data-free=\"1\""));
  EXPECT_THAT(body, HasSubstr("data-gpu=\"GPU-2\" data-index=\"0\" data-model=\"NVIDIA A30\" "
                              "data-units=\"4\" data-free=\"4\""));
  // GPU-1: infer at 0, a free unit 1, train at 2-3; GPU-2: four free units.
  EXPECT_THAT(body, HasSubstr("colspan=\"1\" data-pod=\"team/infer\" data-profile=\"1g.6gb\" "
                              "data-start=\"0\" data-size=\"1\""));
  EXPECT_THAT(body, HasSubstr("<td class=\"free\" data-unit=\"1\"></td><td class=\"slice"));
  EXPECT_THAT(body, HasSubstr("colspan=\"2\" data-pod=\"default/train\" data-profile=\"2g.12gb\" "
                              "data-start=\"2\" data-size=\"2\""));
  EXPECT_EQ(LiveCount(body, "<td class=\"free\""), 1u + 4u);
  EXPECT_THAT(body, HasSubstr("class=\"slice c"));
  EXPECT_THAT(body, HasSubstr(" unrealized\" colspan=\"1\" data-pod=\"team/infer\""));
  EXPECT_THAT(body,
              HasSubstr("<li class=\"owner\" data-pod=\"default/train\" data-profile=\"2g.12gb\" "
                        "data-start=\"2\" data-size=\"2\" data-mig=\"MIG-t\">"));
  EXPECT_THAT(body, HasSubstr("2g.12gb at slices 2-3: MIG-t (GI 1, CI 0)"));
  EXPECT_THAT(body, HasSubstr("1g.6gb at slices 0: reserved, not written yet"));
  // Pending pods with the scheduler's reason and how long they wait; events newest first.
  EXPECT_THAT(body, HasSubstr("<tr class=\"pending\" data-pod=\"default/big\" "
                              "data-reason=\"capacity-exhausted\">"));
  EXPECT_THAT(body, HasSubstr("<td class=\"detail\">pending: no candidate node fits</td>"));
  EXPECT_THAT(body, HasSubstr("<td class=\"waiting\">1m15s</td>"));
  EXPECT_THAT(body,
              HasSubstr("<tr class=\"event\" data-type=\"Normal\" data-reason=\"MigReserved\" "
                        "data-pod=\"default/train\"><td class=\"time\">00:16:30</td>"));
  EXPECT_THAT(body, HasSubstr("<p id=\"snapshot\" data-time=\"1000\">"));
  EXPECT_THAT(body, HasSubstr("1 nodes, 2 GPUs, 2 reservations, 1 pending pods"));
}

TEST(LivePageTest, WholeGpusAreDrawnWithTheirPod) {
  scheduler::LiveSnapshot s = LiveSnapshotForTest();
  scheduler::WholeGpuReport w;
  w.uuid = "GPU-w";
  w.index = 2;
  w.model = "H100 <b>";
  w.memory_mib = 81559;
  w.holder = "default/<train>";
  s.nodes[0].whole_gpus.push_back(w);
  scheduler::WholeGpuReport sick = w;
  sick.uuid = "GPU-s";
  sick.holder.clear();
  sick.healthy = false;
  sick.unhealthy_reason = "GPU GPU-s is switching to mig";
  s.nodes[0].whole_gpus.push_back(sick);
  const std::string body = RenderLiveBody(s);
  EXPECT_EQ(LiveCount(body, "<div class=\"gpu whole"), 2u);
  EXPECT_THAT(body, HasSubstr("whole GPU (MIG off, 81559 MiB): held by default/&lt;train&gt;"));
  EXPECT_THAT(body, HasSubstr("<div class=\"gpu whole unhealthy\""));
  EXPECT_THAT(body, HasSubstr("no new pod: GPU GPU-s is switching to mig"));
  EXPECT_THAT(body, Not(HasSubstr("H100 <b>")));
  EXPECT_THAT(body, Not(HasSubstr("<train>")));
  EXPECT_THAT(body, HasSubstr("1 nodes, 4 GPUs, 3 reservations"));
}

TEST(LivePageTest, PageLoadsItsOwnScriptAndStyleAndHasNoInlineOnes) {
  const std::string page = RenderLivePage(LiveSnapshotForTest());
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_THAT(page, HasSubstr("<main id=\"live\" data-refresh-ms=\"2000\">\n<p id=\"snapshot\""));
  EXPECT_THAT(page, HasSubstr("<link rel=\"stylesheet\" href=\"live/style.css\">"));
  EXPECT_THAT(page, HasSubstr("<noscript><meta http-equiv=\"refresh\" content=\"10\"></noscript>"));
  EXPECT_EQ(LiveCount(page, "<script"), 1u);
  EXPECT_THAT(page, HasSubstr("<script src=\"live/script.js\"></script>"));
  EXPECT_THAT(page, Not(HasSubstr("<style")));
  EXPECT_THAT(page, Not(HasSubstr("style=")));
  EXPECT_THAT(page, Not(HasSubstr("http://")));
  EXPECT_THAT(page, Not(HasSubstr("https://")));
  // The script fetches only its own body, relative to the page, and parses it inertly.
  EXPECT_THAT(std::string(LivePageScript()), HasSubstr("fetch(\"live/body\""));
  EXPECT_THAT(std::string(LivePageScript()), HasSubstr("DOMParser"));
  EXPECT_THAT(std::string(LivePageScript()), Not(HasSubstr("innerHTML")));
  EXPECT_THAT(std::string(LivePageScript()), Not(HasSubstr("http")));
  EXPECT_THAT(std::string(LivePageStyle()), Not(HasSubstr("url(")));
  const scheduler::LivePageRenderer r = LivePageRenderer();
  EXPECT_EQ(r.page(LiveSnapshotForTest()), page);
  EXPECT_EQ(r.body(LiveSnapshotForTest()), RenderLiveBody(LiveSnapshotForTest()));
  EXPECT_EQ(r.script, LivePageScript());
  EXPECT_EQ(r.style, LivePageStyle());
}

// Pod names, reasons, event messages and node names are written by users or tenants: none of
// them reaches the page as markup.
TEST(LivePageTest, EveryTextIsEscaped) {
  const std::string evil = "<script>alert('x')</script>\"><img src=x onerror=alert(1)>&amp;";
  scheduler::LiveSnapshot s;
  s.now = absl::FromUnixSeconds(0);
  scheduler::NodeReport n;
  n.name = evil;
  n.healthy = false;
  n.unhealthy_reason = evil;
  scheduler::GpuReport g = LiveA30(evil);
  g.model = evil;
  g.healthy = false;
  g.unhealthy_reason = evil;
  g.reservations.push_back({evil, evil, {0, 1}, false, protocol::RuntimeIdentity{evil, 1, 0}});
  g.idle.push_back({evil, {1, 1}, 0});
  n.gpus.push_back(g);
  s.nodes.push_back(n);
  s.pending.push_back({evil, evil, evil, absl::FromUnixSeconds(0)});
  s.pending_total = 1;
  s.events.push_back({absl::FromUnixSeconds(0), evil, evil, evil, evil});
  const std::string page = RenderLivePage(s);
  EXPECT_EQ(LiveCount(page, "<script"), 1u) << page;  // the page's own, nothing else
  EXPECT_THAT(page, Not(HasSubstr("<img")));
  EXPECT_THAT(page, Not(HasSubstr("'x'")));
  const std::string escaped =
      "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;&gt;&lt;img src=x "
      "onerror=alert(1)&gt;&amp;amp;";
  EXPECT_EQ(HtmlEscape(evil), escaped);
  // In text and in every attribute (data-node, data-gpu, data-pod, data-reason, data-type, ...).
  EXPECT_GE(LiveCount(page, escaped), 20u) << page;
  // Every attribute value is quoted and holds no raw quote: the tags stay as written.
  const std::regex attr_breakout("=\"[^\"]*\"[^ >/]");
  EXPECT_FALSE(std::regex_search(page, attr_breakout)) << page;
}

TEST(LivePageTest, BoundedInGpusOwnersAndPendingPods) {
  scheduler::LiveSnapshot s;
  s.now = absl::FromUnixSeconds(0);
  for (int i = 0; i < 70; ++i) {
    scheduler::NodeReport n;
    n.name = fmt::format("node-{}", i);
    for (int j = 0; j < 8; ++j) n.gpus.push_back(LiveA30(fmt::format("GPU-{}-{}", i, j)));
    s.nodes.push_back(n);
  }
  // Conflicting reservations (a GPU failed closed): each listed (up to the cap), drawn once.
  for (int k = 0; k < 40; ++k) {
    s.nodes[0].gpus[0].reservations.push_back(
        {fmt::format("ns/p{}", k), "1g.6gb", {0, 1}, false, std::nullopt});
  }
  s.pending_total = 5000;
  s.pending.push_back({"ns/w", "fragmented", "", absl::FromUnixSeconds(0)});
  const std::string body = RenderLiveBody(s);
  EXPECT_EQ(LiveCount(body, "class=\"gpu"), kLiveMaxGpus);
  EXPECT_THAT(body, HasSubstr(fmt::format("{} more GPUs not drawn", 70 * 8 - kLiveMaxGpus)));
  EXPECT_EQ(LiveCount(body, "<li class=\"owner\""), kLiveMaxOwners);
  EXPECT_THAT(body, HasSubstr(fmt::format("{} more reservations not listed", 40 - kLiveMaxOwners)));
  EXPECT_EQ(LiveCount(body, "<td class=\"slice"), 1u);
  EXPECT_THAT(body, HasSubstr("4999 more pending pods not listed"));
  EXPECT_THAT(body, HasSubstr("Pending pods (5000)"));
  EXPECT_LT(body.size(), 2u << 20);
}

TEST(LivePageTest, EmptyClusterSaysSo) {
  scheduler::LiveSnapshot s;
  s.now = absl::FromUnixSeconds(0);
  scheduler::NodeReport n;
  n.name = "cpu-only";
  s.nodes.push_back(n);
  const std::string body = RenderLiveBody(s);
  EXPECT_THAT(body, HasSubstr("no MIG GPU registered"));
  EXPECT_THAT(body, HasSubstr("none: the scheduler left no MIG pod pending"));
  EXPECT_THAT(body, HasSubstr("none recorded since the scheduler started"));
  EXPECT_THAT(body, Not(HasSubstr("class=\"gpu")));
}

}  // namespace
}  // namespace dynmig::ops::testing
