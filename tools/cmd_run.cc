// `laissez run`: the tenant runtime (src/server/tenant_run.h). It acquires
// nodes through the EconAdapter, runs COMMAND on them, and carries it through
// notices, checkpoints and moves. The job's contract: docs/TENANTS.md.
//
// Output: progress for people on stderr; with --json, one JSON object per line
// on stdout (JSON Lines: an event stream, the one exception to "one JSON
// document per --json command"), the last one {"event":"summary",...}.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/money.h"
#include "server/agent.h"
#include "server/grpc_client.h"
#include "server/tenant_run.h"
#include "tools/commands.h"

namespace laissez::cli {
namespace {

using nlohmann::json;

volatile sig_atomic_t g_run_stop = 0;
void OnRunSignal(int) { g_run_stop = 1; }

struct RunFlags {
  std::string server, token_file, tls_ca;
  bool json = false;
  std::string value = "10", cap, signal = "USR1";
  double kill_grace = 5;
  server::RunOptions o;
};

int Fail(bool as_json, const Status& s) {
  std::fprintf(stderr, "laissez run: %s\n", s.ToString().c_str());
  if (as_json) {
    std::cout << json{{"event", "error"}, {"code", std::string(StatusCodeName(s.code()))}, {"message", s.message()}}.dump()
              << std::endl;
  }
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

int RunRun(RunFlags& f) {
  server::RunOptions& o = f.o;
  Status st = ParseMoney(f.value, "value").status();
  if (st.ok()) o.agent.value = *ParseMoney(f.value, "value");
  if (st.ok() && !f.cap.empty()) {
    auto c = ParseMoney(f.cap, "cap");
    if (c.ok()) o.agent.cap = *c;
    else st = c.status();
  }
  if (st.ok()) {
    auto sig = server::ParseSignal(f.signal, "signal");
    if (sig.ok()) o.signal = *sig;
    else st = sig.status();
  }
  if (st.ok()) {
    auto tok = server::ReadTokenFile(f.token_file, "token-file");
    if (tok.ok()) o.agent.connect.token = *tok;
    else st = tok.status();
  }
  if (!st.ok()) return Fail(f.json, st);
  o.agent.connect.address = f.server;
  o.agent.connect.tls_ca = f.tls_ca;
  o.kill_grace_seconds = f.kill_grace;
  o.job_stdout_to_stderr = f.json;

  struct sigaction sa {};
  sa.sa_handler = OnRunSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  static std::atomic<bool> stop{false};
  static std::atomic<bool> done{false};
  std::thread watcher([] {
    while (!done) {
      if (g_run_stop) stop = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  const bool as_json = f.json;
  auto r = server::RunTenantJob(o, &stop, [as_json](const server::RunEvent& e) {
    std::fprintf(stderr, "run: %s\n", e.text.c_str());
    if (as_json) std::cout << e.json << std::endl;
  });
  done = true;
  watcher.join();
  if (!r.ok()) return Fail(f.json, r.status());
  json by_node = json::object();
  for (const auto& [n, m] : r->paid_by_node) by_node[n] = m;
  json j = {{"event", "summary"},     {"tenant", r->tenant},           {"job_exit_code", r->job_exit_code},
            {"attempts", r->attempts}, {"notices", r->notices},         {"checkpoints", r->checkpoints},
            {"deadline_stops", r->deadline_stops}, {"paid", r->paid},   {"paid_by_node", by_node},
            {"nodes_used", r->nodes_used}, {"interrupted", r->interrupted}};
  std::string used;
  for (const auto& n : r->nodes_used) used += (used.empty() ? "" : " -> ") + n;
  std::fprintf(stderr, "run: summary: job exit %d after %d attempt(s) on %s; %d notice(s), %d checkpoint(s), %d deadline stop(s); paid %s\n",
               r->job_exit_code, r->attempts, used.empty() ? "(none)" : used.c_str(), r->notices, r->checkpoints,
               r->deadline_stops, FormatMoney(r->paid).c_str());
  for (const auto& [n, m] : r->paid_by_node) std::fprintf(stderr, "run:   paid %s on %s\n", FormatMoney(m).c_str(), n.c_str());
  if (f.json) std::cout << j.dump() << std::endl;
  if (r->interrupted) return 130;
  return r->job_exit_code < 0 ? 1 : r->job_exit_code;
}

}  // namespace

void RegisterRunCommands(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "run",
      "Run a job on market nodes: bid through the EconAdapter, start COMMAND on the nodes, checkpoint and move "
      "on a notice, resume, release at the end (docs/TENANTS.md)");
  cmd->footer(
      "Usage: laissez run [OPTIONS] -- COMMAND [ARGS...]\n"
      "The job gets LAISSEZ_NODES, LAISSEZ_NODE, LAISSEZ_TENANT, LAISSEZ_NOTICE_FILE, LAISSEZ_NOTICE_SIGNAL,\n"
      "LAISSEZ_CHECKPOINT_EXIT_CODE, LAISSEZ_RESUME (1 after a move), LAISSEZ_ATTEMPT and, with\n"
      "--metadata-listen, LAISSEZ_METADATA_URL. On a notice the notice file is written and --signal goes to\n"
      "the job's process group; exit with --checkpoint-exit-code (75) to move at once. At the deadline:\n"
      "SIGTERM, then SIGKILL after --kill-grace. Exit status: the job's (0 when it finished), 130 after\n"
      "Ctrl-C, 1 on market errors or a budget that cannot cover a grace window, 2 on bad options.\n"
      "--json prints JSON Lines on stdout: one event object per line, the last {\"event\":\"summary\"};\n"
      "the job's own stdout then goes to stderr.");
  static RunFlags f;
  const char* env_server = std::getenv("LAISSEZ_SERVER");
  const char* env_token = std::getenv("LAISSEZ_TOKEN_FILE");
  f.server = env_server ? env_server : "127.0.0.1:50051";
  f.token_file = env_token ? env_token : "";
  cmd->add_option("--server", f.server,
                  "Server address HOST:PORT, or the replicas of a replicated market HOST:PORT,HOST:PORT,... "
                  "(calls move to the leader; docs/HA.md) (default $LAISSEZ_SERVER or 127.0.0.1:50051)");
  cmd->add_option("--token-file", f.token_file, "File holding the tenant's bearer token (default $LAISSEZ_TOKEN_FILE)");
  cmd->add_option("--tls-ca", f.tls_ca, "CA certificate (PEM) for a TLS server");
  cmd->add_flag("--json", f.json, "Events as JSON Lines on stdout (one object per line), progress on stderr");
  // Market and strategy: as `laissez agent`.
  cmd->add_option("--strategy", f.o.agent.strategy,
                  "cost-of-delay (the truthful bid, docs/STRATEGIES.md), fixed, on-demand, spot, budget, locality, "
                  "migration")
      ->capture_default_str();
  cmd->add_option("--value", f.value,
                  "What a node-hour is worth to the job, in units; cost-of-delay: what the job finishing in its "
                  "ideal time is worth")
      ->capture_default_str();
  cmd->add_option("--hours", f.o.agent.hours, "cost-of-delay: the job's estimated duration alone on --type")
      ->capture_default_str();
  cmd->add_option("--cap", f.cap, "budget: the most per node per hour, in units");
  cmd->add_option("--type", f.o.agent.node_type, "Hardware type wanted")->capture_default_str();
  cmd->add_option("--location", f.o.agent.location, "Narrow to a location path, e.g. eu/eu-1a");
  cmd->add_option("--count", f.o.agent.count, "Nodes the job needs")->capture_default_str();
  cmd->add_flag("--gang", f.o.agent.gang, "Acquire the nodes all or nothing");
  // The job.
  cmd->add_option("--launcher", f.o.launcher,
                  "Start the job through a /bin/sh template with {node} {nodes} {tenant} {env} {command}, e.g. "
                  "'ssh {node} env {env} {command}' (default: run locally)");
  cmd->add_option("--signal", f.signal, "Signal sent to the job's process group on a notice")->capture_default_str();
  cmd->add_option("--checkpoint-exit-code", f.o.checkpoint_exit_code,
                  "Exit code by which the job says it checkpointed and can move")
      ->capture_default_str();
  cmd->add_option("--kill-grace", f.kill_grace, "Seconds between SIGTERM and SIGKILL at the deadline")
      ->capture_default_str();
  cmd->add_option("--state-dir", f.o.state_dir, "Directory of the notice file (default: a new temporary directory, removed at the end)");
  cmd->add_option("--metadata-listen", f.o.metadata_listen,
                  "Serve GET /laissez/v1/notice (404: no notice) and /laissez/v1/job on HOST:PORT (port 0: any)");
  cmd->add_option("--max-restarts", f.o.max_restarts, "Give up after this many moves")->capture_default_str();
  cmd->add_option("--status-interval", f.o.status_interval_seconds, "Seconds between progress lines (0: on changes only)")
      ->capture_default_str();
  cmd->add_option("command", f.o.command, "COMMAND ARGS... (after --)");
  cmd->callback([exit_code] { *exit_code = RunRun(f); });
}

}  // namespace laissez::cli
