// GrpcCriRuntime against an in-process CRI server, and its parsers against hostile input.
#include "deviceplugin/runtime_source.h"

#include <gtest/gtest.h>

#include "dp_test_util.h"
#include "fake_cri.h"

namespace dynmig::deviceplugin {
namespace {

using testing::FakeContainer;
using testing::FakeCri;
using testing::TempDir;

FakeContainer Running(std::string id, std::string pod, std::vector<std::string> env) {
  FakeContainer c;
  c.id = std::move(id);
  c.pod_uid = "uid-" + pod;
  c.pod_ns = "default";
  c.pod_name = pod;
  c.container = "main";
  c.env = std::move(env);
  return c;
}

TEST(RuntimeSourceTest, ListsContainersWithTheirVisibleDevices) {
  TempDir dir;
  FakeCri cri(dir.path() + "/cri.sock", /*v1=*/true, /*v1alpha2=*/true);
  ASSERT_TRUE(cri.ok());
  FakeContainer exited = Running("c3", "done", {"NVIDIA_VISIBLE_DEVICES=MIG-exited"});
  exited.state = 2;
  cri.Set({Running("c1", "a", {"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=MIG-1, MIG-2 ,,MIG-1"}),
           Running("c2", "b", {"NVIDIA_VISIBLE_DEVICES=none"}), exited});
  GrpcCriRuntime runtime({.socket = dir.path() + "/cri.sock"});
  auto list = runtime.List();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[0].pod_uid, "uid-a");
  EXPECT_EQ((*list)[0].PodKey(), "default/a");
  EXPECT_EQ((*list)[0].container, "main");
  EXPECT_EQ((*list)[0].state, RuntimeContainerState::kRunning);
  EXPECT_EQ((*list)[0].devices, (std::vector<std::string>{"MIG-1", "MIG-2"}));
  EXPECT_TRUE((*list)[1].devices.empty());
  // An exited container holds nothing and is not asked for its status.
  EXPECT_EQ((*list)[2].state, RuntimeContainerState::kExited);
  EXPECT_TRUE((*list)[2].devices.empty());
  EXPECT_EQ(cri.status_calls(), 2);
}

TEST(RuntimeSourceTest, FallsBackToV1alpha2WhenV1IsUnimplemented) {
  TempDir dir;
  FakeCri cri(dir.path() + "/cri.sock", /*v1=*/false, /*v1alpha2=*/true);
  ASSERT_TRUE(cri.ok());
  cri.Set({Running("c1", "a", {"NVIDIA_VISIBLE_DEVICES=GPU-x"})});
  GrpcCriRuntime runtime({.socket = dir.path() + "/cri.sock"});
  for (int i = 0; i < 2; ++i) {  // the second List goes to v1alpha2 at once
    auto list = runtime.List();
    ASSERT_TRUE(list.ok()) << list.status();
    ASSERT_EQ(list->size(), 1u);
    EXPECT_EQ((*list)[0].devices, std::vector<std::string>{"GPU-x"});
  }
}

TEST(RuntimeSourceTest, UnreachableRuntimeIsAnErrorNamingTheSocket) {
  TempDir dir;
  GrpcCriRuntime runtime(
      {.socket = dir.path() + "/none.sock", .call_timeout = absl::Milliseconds(300)});
  auto list = runtime.List();
  ASSERT_FALSE(list.ok());
  EXPECT_NE(list.status().message().find("none.sock"), std::string::npos) << list.status();
}

TEST(RuntimeSourceTest, AttackTooManyContainersIsRefused) {
  TempDir dir;
  FakeCri cri(dir.path() + "/cri.sock", true, false);
  ASSERT_TRUE(cri.ok());
  std::vector<FakeContainer> many;
  for (int i = 0; i < 5; ++i) many.push_back(Running(fmt::format("c{}", i), "p", {}));
  cri.Set(many);
  GrpcCriRuntime runtime({.socket = dir.path() + "/cri.sock", .max_containers = 4});
  auto list = runtime.List();
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(list.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_LE(cri.status_calls(), 4);
}

TEST(RuntimeSourceTest, AttackHostileContainersAreMarkedUnreadable) {
  TempDir dir;
  FakeCri cri(dir.path() + "/cri.sock", true, false);
  ASSERT_TRUE(cri.ok());
  FakeContainer huge = Running("huge", "h", {"NVIDIA_VISIBLE_DEVICES=" + std::string(70000, 'x')});
  FakeContainer garbage = Running("garbage", "g", {});
  garbage.raw_info = "{\"runtimeSpec\": [[[[";
  FakeContainer deep = Running("deep", "d", {});
  deep.raw_info = std::string(100, '[') + std::string(100, ']');
  FakeContainer noinfo = Running("noinfo", "n", {});
  noinfo.no_info = true;
  FakeContainer failing = Running("failing", "f", {});
  failing.status_error = grpc::StatusCode::INTERNAL;
  FakeContainer badenv = Running("badenv", "b", {});
  badenv.raw_info = R"({"runtimeSpec":{"process":{"env":[1,2]}}})";
  cri.Set({huge, garbage, deep, noinfo, failing, badenv});
  GrpcCriRuntime runtime({.socket = dir.path() + "/cri.sock"});
  auto list = runtime.List();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 6u);
  for (const auto& c : *list) {
    EXPECT_FALSE(c.error.empty()) << c.id;
    EXPECT_TRUE(c.devices.empty()) << c.id;
  }
  EXPECT_NE((*list)[0].error.find("limit"), std::string::npos) << (*list)[0].error;
  EXPECT_NE((*list)[2].error.find("nesting"), std::string::npos) << (*list)[2].error;
}

TEST(RuntimeSourceTest, ParseVisibleDevicesOddInput) {
  // Duplicate entries: the union (whichever the runtime honours, the container may hold it).
  auto d = ParseVisibleDevices({"NVIDIA_VISIBLE_DEVICES=MIG-a", "NVIDIA_VISIBLE_DEVICES=MIG-b,void",
                                "NVIDIA_VISIBLE_DEVICES_X=MIG-c", "XNVIDIA_VISIBLE_DEVICES=MIG-d",
                                "NVIDIA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES= ,\t,"});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, (std::vector<std::string>{"MIG-a", "MIG-b"}));
  std::string many = "NVIDIA_VISIBLE_DEVICES=";
  for (int i = 0; i < 300; ++i) many += fmt::format("MIG-{},", i);
  EXPECT_EQ(ParseVisibleDevices({many}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseVisibleDevices({"NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(DevicesFromInfo("{}")->empty());  // no env: nothing
  EXPECT_FALSE(DevicesFromInfo("[]").ok());
  EXPECT_FALSE(DevicesFromInfo(std::string(5 << 20, ' ')).ok());
}

}  // namespace
}  // namespace dynmig::deviceplugin
