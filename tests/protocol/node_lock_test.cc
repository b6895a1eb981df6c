#include "protocol/node_lock.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace dynmig::protocol {
namespace {

using ::testing::HasSubstr;

const absl::Time kT = absl::FromUnixSeconds(1'800'000'000);  // 2027-01-15T08:00:00Z

std::string Error(std::string_view value) {
  auto parsed = ParseNodeLock(value);
  return parsed.ok() ? "" : std::string(parsed.status().message());
}

TEST(NodeLockTest, FormatsWithTheOwnersUidAndParsesEveryForm) {
  EXPECT_EQ(FormatNodeLock({kT, "ns", "pod", "0d6f-11"}), "2027-01-15T08:00:00Z,ns,pod,0d6f-11");
  EXPECT_EQ(FormatNodeLock({kT, "ns", "pod", ""}), "2027-01-15T08:00:00Z,ns,pod");  // HAMi's
  auto v = ParseNodeLock("2027-01-15T08:00:00Z,ns,pod,0d6f-11");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->time, kT);
  EXPECT_EQ(v->ns, "ns");
  EXPECT_EQ(v->pod, "pod");
  EXPECT_EQ(v->uid, "0d6f-11");
  v = ParseNodeLock("2027-01-15T08:00:00Z,ns,pod");  // HAMi's form
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->pod, "pod");
  EXPECT_EQ(v->uid, "");
  v = ParseNodeLock("2027-01-15T10:00:00+02:00");  // HAMi's older time-only form
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->time, kT);
  EXPECT_EQ(v->pod, "");
  EXPECT_EQ(v->Owner(), "?");
}

TEST(NodeLockTest, TheOwnerIsProvenByTheUidWhenTheLockHasOne) {
  const NodeLock with_uid{kT, "team-a", "train", "uid-1"};
  EXPECT_TRUE(with_uid.OwnedBy("team-a", "train", "uid-1"));
  // Deleted and recreated under the same name: another pod.
  EXPECT_FALSE(with_uid.OwnedBy("team-a", "train", "uid-2"));
  EXPECT_FALSE(with_uid.OwnedBy("team-b", "train", "uid-1"));
  EXPECT_EQ(with_uid.Owner(), "team-a/train (uid uid-1)");
  const NodeLock hami{kT, "team-a", "train", ""};
  EXPECT_TRUE(hami.OwnedBy("team-a", "train", "any"));
  EXPECT_FALSE(hami.OwnedBy("team-a", "other", "any"));
  EXPECT_FALSE((NodeLock{kT, "", "", ""}.OwnedBy("", "", "")));  // time-only names nobody
}

TEST(NodeLockTest, MalformedValuesAreRefusedNamingTheAnnotation) {
  EXPECT_THAT(Error("yesterday,ns,pod"), HasSubstr("does not start with an RFC 3339 time"));
  EXPECT_THAT(Error("2027-01-15T08:00:00Z,ns"), HasSubstr("has 2 fields"));
  EXPECT_THAT(Error("2027-01-15T08:00:00Z,,pod"), HasSubstr("empty namespace or pod name"));
  EXPECT_THAT(Error("2027-01-15T08:00:00Z,ns,pod,"), HasSubstr("empty UID"));
  EXPECT_THAT(Error("2027-01-15T08:00:00Z,ns,pod,uid,extra"), HasSubstr("has 5 fields"));
  EXPECT_THAT(Error(""), HasSubstr("hami.io/mutex.lock"));
}

// The lock is a Node annotation (users cannot write Nodes), but the reader still bounds it.
TEST(NodeLockTest, AHugeValueIsRefusedWithoutEchoingItWhole) {
  const std::string huge = "2027-01-15T08:00:00Z,ns,pod," + std::string(1 << 20, 'u');
  const std::string error = Error(huge);
  EXPECT_THAT(error, HasSubstr("more than the 1024 a lock may have"));
  EXPECT_LT(error.size(), 400u);
  EXPECT_THAT(Error(std::string(5000, ',')), HasSubstr("more than the 1024"));
}

}  // namespace
}  // namespace dynmig::protocol
