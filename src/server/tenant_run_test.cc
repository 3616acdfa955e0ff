// Unit tests of `laissez run`'s option parsing and launcher expansion. The
// runtime itself (processes, notices, moves) is tested end to end against a
// live server in tests/tenant/test_run.py.
#include "server/tenant_run.h"

#include <gtest/gtest.h>
#include <signal.h>

namespace laissez::server {
namespace {

TEST(TenantRunTest, ParsesSignalNamesAndNumbers) {
  EXPECT_EQ(*ParseSignal("USR1", "signal"), SIGUSR1);
  EXPECT_EQ(*ParseSignal("sigusr2", "signal"), SIGUSR2);
  EXPECT_EQ(*ParseSignal("TERM", "signal"), SIGTERM);
  EXPECT_EQ(*ParseSignal("15", "signal"), 15);
  for (const char* bad : {"", "NOPE", "0", "65", "999", "-1", "USR"}) {
    auto r = ParseSignal(bad, "signal");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(r.status().message().rfind("signal:", 0), 0u) << r.status().message();
  }
}

TEST(TenantRunTest, LauncherQuotesEveryFieldInOnePass) {
  std::string line = ExpandLauncher("ssh {node} env {env} {command} # {nodes} {tenant}",
                                    {"python3", "it's {node}; rm -rf /"}, {{"LAISSEZ_RESUME", "1"}},
                                    "gpu-a,gpu-b", "gpu-a", "acme");
  EXPECT_EQ(line,
            "ssh 'gpu-a' env LAISSEZ_RESUME='1' 'python3' 'it'\\''s {node}; rm -rf /' # 'gpu-a,gpu-b' 'acme'");
}

TEST(TenantRunTest, CheckpointExitCodeIsExTempfail) { EXPECT_EQ(kCheckpointedExitCode, 75); }

}  // namespace
}  // namespace laissez::server
