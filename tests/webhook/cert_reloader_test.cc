// The reloading serving certificate: an httplib SSLServer on 127.0.0.1 with CertReloader
// installed; the files are swapped and the next handshake serves the new certificate.
#include "webhook/cert_reloader.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "common/clock.h"
#include "fmt/format.h"
#include "webhook/test_certs.h"

namespace dynmig::webhook {
namespace {

using ::testing::HasSubstr;

// The serial number of the certificate the server at 127.0.0.1:port presents ("" on failure).
std::string ServedSerial(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  std::string serial;
  if (SSL_connect(ssl) == 1) {
    X509* cert = SSL_get1_peer_certificate(ssl);
    if (cert != nullptr) {
      serial = std::to_string(ASN1_INTEGER_get(X509_get_serialNumber(cert)));
      X509_free(cert);
    }
    SSL_shutdown(ssl);
  }
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  close(fd);
  return serial;
}

class CertReloaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / fmt::format("dynmig-certs-{}", getpid());
    std::filesystem::create_directories(dir_);
    cert_ = (dir_ / "tls.crt").string();
    key_ = (dir_ / "tls.key").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // Replaces a file the way a secret volume does: write aside, rename over.
  void Put(const std::string& path, const std::string& text) {
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp) << text;
    std::filesystem::rename(tmp, path);
  }
  void PutPair(const testing::TestCert& c) {
    Put(cert_, c.cert_pem);
    Put(key_, c.key_pem);
  }
  std::filesystem::path dir_;
  std::string cert_, key_;
};

TEST_F(CertReloaderTest, SwappedFilesAreServedOnTheNextHandshake) {
  const auto first = testing::MakeTestCert("dynmig-scheduler", 1001);
  const auto second = testing::MakeTestCert("dynmig-scheduler", 2002);
  PutPair(first);
  auto reloader = CertReloader::Create(cert_, key_);
  ASSERT_TRUE(reloader.ok()) << reloader.status();
  CertReloader* r = reloader->get();
  httplib::SSLServer server([r](SSL_CTX& ctx) { return r->Install(ctx); });
  ASSERT_TRUE(server.is_valid());
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok", "text/plain");
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread listener([&] { server.listen_after_bind(); });
  // The listener thread runs on real time: poll for it, with a deadline.
  const Clock& real = RealClock();
  const absl::Duration deadline = real.Monotonic() + absl::Seconds(10);
  while (!server.is_running() && real.Monotonic() < deadline) real.SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(server.is_running());

  EXPECT_EQ(ServedSerial(port), "1001");
  // An HTTPS client that trusts the first certificate gets through.
  {
    httplib::SSLClient client("127.0.0.1", port);
    client.set_ca_cert_path(cert_.c_str());
    client.enable_server_certificate_verification(true);
    auto res = client.Get("/healthz");
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    EXPECT_EQ(res->body, "ok");
  }
  PutPair(second);
  EXPECT_EQ(ServedSerial(port), "2002");
  EXPECT_EQ(r->reloads(), 1);

  // A broken pair (key of another certificate) is refused: the second one stays.
  Put(key_, first.key_pem);
  EXPECT_EQ(ServedSerial(port), "2002");
  EXPECT_EQ(r->failures(), 1);
  EXPECT_TRUE(r->MaybeReload().ok());  // nothing changed since the refused attempt

  server.stop();
  listener.join();
}

TEST_F(CertReloaderTest, UnusableFilesAreRefusedAtStart) {
  auto missing = CertReloader::Create(cert_, key_);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("cannot open the file"));
  Put(cert_, "not a certificate");
  Put(key_, testing::MakeTestCert("x", 1).key_pem);
  auto garbage = CertReloader::Create(cert_, key_);
  EXPECT_THAT(std::string(garbage.status().message()), HasSubstr("no PEM certificate"));
  const auto a = testing::MakeTestCert("a", 1);
  const auto b = testing::MakeTestCert("b", 2);
  Put(cert_, a.cert_pem);
  Put(key_, b.key_pem);
  auto mismatch = CertReloader::Create(cert_, key_);
  EXPECT_THAT(std::string(mismatch.status().message()), HasSubstr("does not match"));
}

}  // namespace
}  // namespace dynmig::webhook
