// The helpers every serving command shares.
#include <gtest/gtest.h>

#include "cli/cli.h"

namespace dynmig::cli {
namespace {

TEST(ParseHostPortTest, AcceptsHostAndPortAndTheDefaultHost) {
  std::string host;
  int port = -1;
  ASSERT_TRUE(ParseHostPort("--listen", "127.0.0.1:6443", "", &host, &port).ok());
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 6443);
  ASSERT_TRUE(ParseHostPort("--listen", "[::1]:0", "", &host, &port).ok());
  EXPECT_EQ(host, "[::1]");
  EXPECT_EQ(port, 0);
  ASSERT_TRUE(ParseHostPort("--listen", ":8443", "0.0.0.0", &host, &port).ok());
  EXPECT_EQ(host, "0.0.0.0");
  EXPECT_EQ(port, 8443);
}

TEST(ParseHostPortTest, BadInputNamesTheFlagAndTheValue) {
  std::string host = "unchanged";
  int port = 7;
  EXPECT_EQ(ParseHostPort("--listen", "nowhere", "", &host, &port).message(),
            "--listen must be HOST:PORT, got 'nowhere'");
  EXPECT_EQ(ParseHostPort("--control", ":6444", "", &host, &port).message(),
            "--control must be HOST:PORT, got ':6444'");
  EXPECT_EQ(ParseHostPort("--listen", "h:65536", "", &host, &port).message(),
            "bad port '65536' in --listen");
  EXPECT_EQ(ParseHostPort("--listen", "h:8x", "", &host, &port).message(),
            "bad port '8x' in --listen");
  EXPECT_EQ(ParseHostPort("--listen", "h:", "", &host, &port).message(), "bad port '' in --listen");
  EXPECT_EQ(port, 7) << "a failed parse leaves the port alone";
}

}  // namespace
}  // namespace dynmig::cli
