// RestKubeClient TLS settings against the in-memory server over HTTPS (mutual TLS): CA and
// client certificate as PEM data (kubeconfig *-data) and as files, insecure-skip-tls-verify, and
// the failures a wrong CA or a missing client certificate cause.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "kube/rest_config.h"
#include "kube_test_certs.h"
#include "kube_test_util.h"

namespace dynmig::kube {
namespace {

using ::testing::HasSubstr;
using testing::KeyAndCert;
using testing::MakeCert;

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / fmt::format("dynmig-tls-{}", getpid());
    std::filesystem::create_directories(dir_);
    ca_ = MakeCert("dynmig-test-ca", nullptr, true, nullptr, nullptr, 1);
    server_cert_ =
        MakeCert("apiserver", &ca_, false, "IP:127.0.0.1,DNS:localhost", "serverAuth", 2);
    client_cert_ = MakeCert("dynmig-client", &ca_, false, nullptr, "clientAuth", 3);
    other_ca_ = MakeCert("someone-else", nullptr, true, nullptr, nullptr, 4);
    InMemoryApiServerOptions options = testing::FastServerOptions();
    options.tls_cert_file = Write("server.crt", server_cert_.cert_pem);
    options.tls_key_file = Write("server.key", server_cert_.key_pem);
    options.tls_client_ca_file = Write("ca.crt", ca_.cert_pem);
    auto server = InMemoryApiServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string Write(const std::string& name, const std::string& text) {
    const auto path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }
  RestConfig Base() {
    RestConfig config;
    config.server = server_->url();
    config.retry.max_attempts = 1;
    return config;
  }
  absl::Status ListWith(const RestConfig& config) {
    auto client = RestKubeClient::Create(config);
    if (!client.ok()) return client.status();
    return (*client)->ListNodes().status();
  }

  std::filesystem::path dir_;
  KeyAndCert ca_, server_cert_, client_cert_, other_ca_;
  std::unique_ptr<InMemoryApiServer> server_;
};

TEST_F(TlsTest, MutualTlsWithInlineData) {
  ASSERT_THAT(server_->url(), ::testing::StartsWith("https://127.0.0.1:"));
  RestConfig config = Base();
  config.ca_data = ca_.cert_pem;
  config.client_cert_data = client_cert_.cert_pem;
  config.client_key_data = client_cert_.key_pem;
  auto client = RestKubeClient::Create(config);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateNode(testing::MakeNode("n1")).ok());
  // Watches use the same TLS settings.
  testing::Recorder<std::string> seen;
  auto watch = (*client)->WatchNodes({}, [&](const WatchEvent& e) { seen.Add(Name(e.object)); });
  ASSERT_TRUE(watch.ok()) << watch.status();
  ASSERT_TRUE(seen.WaitForSize(1));
  EXPECT_EQ(seen.Get()[0], "n1");
}

TEST_F(TlsTest, MutualTlsWithFilesFromAKubeconfig) {
  const std::string kubeconfig = Write("config", fmt::format(R"(apiVersion: v1
kind: Config
current-context: tls
contexts: [{{name: tls, context: {{cluster: c, user: u}}}}]
clusters: [{{name: c, cluster: {{server: "{}", certificate-authority: ca.crt}}}}]
users: [{{name: u, user: {{client-certificate: client.crt, client-key: client.key}}}}]
)",
                                                             server_->url()));
  Write("client.crt", client_cert_.cert_pem);
  Write("client.key", client_cert_.key_pem);
  auto config = LoadKubeconfig(kubeconfig);
  ASSERT_TRUE(config.ok()) << config.status();
  config->retry.max_attempts = 1;
  EXPECT_TRUE(ListWith(*config).ok()) << ListWith(*config);
}

TEST_F(TlsTest, InsecureSkipVerifyStillSendsTheClientCertificate) {
  RestConfig config = Base();
  config.insecure_skip_tls_verify = true;
  config.client_cert_data = client_cert_.cert_pem;
  config.client_key_data = client_cert_.key_pem;
  EXPECT_TRUE(ListWith(config).ok()) << ListWith(config);
}

TEST_F(TlsTest, WrongCaOrMissingClientCertificateFailsClearly) {
  RestConfig wrong_ca = Base();
  wrong_ca.ca_data = other_ca_.cert_pem;
  wrong_ca.client_cert_data = client_cert_.cert_pem;
  wrong_ca.client_key_data = client_cert_.key_pem;
  absl::Status st = ListWith(wrong_ca);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("TLS"));

  RestConfig no_client_cert = Base();
  no_client_cert.ca_data = ca_.cert_pem;
  absl::Status refused = ListWith(no_client_cert);
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(refused.code(), ::testing::AnyOf(absl::StatusCode::kUnavailable,
                                               absl::StatusCode::kFailedPrecondition))
      << refused;

  RestConfig plain = Base();
  plain.server = "http://127.0.0.1:" + std::to_string(server_->port());
  EXPECT_EQ(ListWith(plain).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace dynmig::kube
