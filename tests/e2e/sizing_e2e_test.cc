// The migration guide's sizing examples, applied unchanged with the real kubectl to the local
// mode: quantities travel in the API server's canonical form ("8k", "20k"), requests are sized by
// the profiles' nominal memory (or NVML's with nvidia.migMemoryMatch: nvml), and kubectl prints
// the admission webhook's sizing warning.
#include <gmock/gmock.h>

#include <cstdlib>

#include "e2e/e2e_test_util.h"
#include "fmt/format.h"

namespace dynmig::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class SizingE2eTest : public E2eTest {
 protected:
  void SetUp() override {
    if (std::system("kubectl version --client >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "kubectl is not installed (tools/install-deps.sh installs it)";
    }
    const char* src = std::getenv("DYNMIG_SOURCE_DIR");
    ASSERT_NE(src, nullptr);
    src_ = src;
  }

  // kubectl with the local mode's kubeconfig: exit code and combined output.
  std::pair<int, std::string> Kubectl(const std::string& args) {
    return RunCommand(fmt::format("kubectl --kubeconfig {} {}", cluster_->kubeconfig_path(), args));
  }

  std::string src_;
};

TEST_F(SizingE2eTest, TheGuidesPodsGetTheGuidesProfiles) {
  Scenario("sizing: nominal");
  StartCluster();
  Step("kubectl apply -f examples/mig-canary.yaml (gpumem: 8000)");
  auto [rc, out] = Kubectl(fmt::format("apply -f {}/examples/mig-canary.yaml", src_));
  ASSERT_EQ(rc, 0) << Where() << out;
  EXPECT_THAT(out, Not(HasSubstr("Warning"))) << Where();
  auto canary = WaitRunning("mig-canary");
  EXPECT_EQ(canary.profile, "2g.10gb") << Where();
  ExpectRealized("mig-canary", canary);
  // The API server serves the quantity canonically; everything downstream read it.
  EXPECT_EQ(Get("mig-canary")["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"],
            "8k")
      << Where();

  // 4g.20gb has one placement on an A100-40GB (slices 0-3), which a 2g.10gb may take; the guide
  // applies the two pods one after the other.
  DeletePod("mig-canary");
  Step("kubectl apply -f examples/mig-prefer-4g.yaml (gpumem: 20000, preference 4g)");
  auto [rc2, out2] = Kubectl(fmt::format("apply -f {}/examples/mig-prefer-4g.yaml", src_));
  ASSERT_EQ(rc2, 0) << Where() << out2;
  EXPECT_THAT(out2, HasSubstr("Warning: 4g.20gb has 19968 MiB on A100-SXM4-40GB, 32 MiB less "
                              "than nvidia.com/gpumem 20000"))
      << Where();
  auto preferred = WaitRunning("mig-prefer-4g");
  EXPECT_EQ(preferred.profile, "4g.20gb") << Where();
  ExpectRealized("mig-prefer-4g", preferred);
  EXPECT_EQ(kube::Annotation(Get("mig-prefer-4g"), "nvidia.com/mig-profile-preference"), "4g");

  Step("the same request without the preference: 3g.20gb");
  DeletePod("mig-prefer-4g");
  auto plain = RunPod(MigPod("plain-20000", 20000));
  EXPECT_EQ(plain.profile, "3g.20gb") << Where();

  Step("dynmig explain shows the profile's NVML memory next to the request");
  const auto [rc3, out3] = RunCommand(fmt::format("{} explain plain-20000 --kubeconfig {}",
                                                  DYNMIG_BIN, cluster_->kubeconfig_path()));
  EXPECT_EQ(rc3, 0) << Where() << out3;
  EXPECT_THAT(out3, HasSubstr("1 x 20000 MiB")) << Where() << out3;
  EXPECT_THAT(out3, HasSubstr("3g.20gb (19968 MiB in NVML) at slices")) << Where() << out3;
}

TEST_F(SizingE2eTest, NvmlMatchingNeverGivesLessAndSaysWhy) {
  Scenario("sizing: nvml");
  StartCluster("node-a=A100-SXM4-40GBx1", R"(nvidia:
  migMemoryMatch: nvml
  migProfileAllowlist:
    - models: ["A100-SXM4-40GB"]
      profiles: ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
)");
  Step("kubectl apply -f examples/mig-prefer-4g.yaml");
  auto [rc, out] = Kubectl(fmt::format("apply -f {}/examples/mig-prefer-4g.yaml", src_));
  ASSERT_EQ(rc, 0) << Where() << out;
  EXPECT_THAT(out,
              HasSubstr("Warning: 20000 MiB needs 7g.40gb on A100-SXM4-40GB; 4g.20gb has 19968"))
      << Where();
  auto a = WaitRunning("mig-prefer-4g");
  EXPECT_EQ(a.profile, "7g.40gb") << Where();
  ExpectRealized("mig-prefer-4g", a);
}

TEST_F(SizingE2eTest, BadQuantitiesAreRefusedWithWhatToWrite) {
  Scenario("sizing: quantities");
  StartCluster();
  Step("gpumem: 8Gi");
  auto pod = MigPod("bytes", 0);
  pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "8Gi";
  auto refused = kube_->CreatePod(pod);
  ASSERT_FALSE(refused.ok()) << Where();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("nvidia.com/gpumem: \"8Gi\" has a binary suffix; it counts MiB: write "
                        "8192 for 8Gi"))
      << Where();
  Step("gpumem: 7999.5");
  pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "7999.5";
  refused = kube_->CreatePod(pod);
  ASSERT_FALSE(refused.ok()) << Where();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("\"7999500m\" is not a whole number: write a whole number such as 8000"))
      << Where();
  Step("gpumem: 8e3 runs as 8000");
  pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "8e3";
  auto a = RunPod(pod);
  EXPECT_EQ(a.profile, "2g.10gb") << Where();
}

}  // namespace
}  // namespace dynmig::e2e
