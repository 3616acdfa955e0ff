// The tenant runtime behind `laissez run`: it acquires nodes through the
// EconAdapter (over the SDK's gRPC transport), runs the tenant's job on them
// and carries the job through notices, checkpoints and moves. It is an SDK
// client: every market action goes through `sdk::EconAdapter`; this file adds
// only process control and reporting. The contract the job sees (environment,
// notice file, signal, exit codes) is docs/TENANTS.md.
//
// The cycle, step by step:
// 1. The adapter bids for `count` nodes with the chosen strategy.
// 2. When it holds them all and no job runs, the job starts (through the
//    launcher) in its own process group, with the node names, the tenant, the
//    notice file and the resume flag in its environment.
// 3. A notice on a held node writes the notice file (deadline, price, reasons)
//    and sends `signal` to the job's process group. If the contest ends (the
//    strategy raised its limit, or the rival left), the notice file is removed
//    and the job runs on.
// 4. The job exits with `checkpoint_exit_code`: every held node is
//    relinquished at once (a contested node moves to its challenger early),
//    the adapter bids again, and step 2 restarts the job with the resume flag.
// 5. The deadline passes (or a node is lost) while the job runs: SIGTERM to
//    the group, SIGKILL `kill_grace` later, then as in step 4.
// 6. Exit 0: everything is released and RunTenantJob returns. Death by the
//    notice signal itself (the job does not handle it): as step 5. Any other
//    exit: released, returned as a failure with the job's code.
// 7. `*stop` turns true (Ctrl-C): orders cancelled, the job stopped as in
//    step 5, nodes relinquished.
//
// Thread-safety: RunTenantJob blocks its thread; `stop` may be set from
// another thread or a signal handler's flag watcher.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "server/agent.h"

namespace laissez::server {

// The documented "I checkpointed; restart me elsewhere" exit code: 75 is
// EX_TEMPFAIL of sysexits.h ("temporary failure, the user is invited to retry").
inline constexpr int kCheckpointedExitCode = 75;

struct RunOptions {
  // Market and strategy: the same fields (and defaults) as `laissez agent`.
  AgentOptions agent;
  std::vector<std::string> command;  // COMMAND ARGS...; at least one word.
  // "" runs COMMAND locally. Otherwise a /bin/sh command line in which {node}
  // (the first node), {nodes} (comma-separated), {tenant}, {env} (the job's
  // LAISSEZ_* variables as shell assignments) and {command} (COMMAND ARGS,
  // shell-quoted) are replaced, e.g. "ssh {node} env {env} {command}".
  std::string launcher;
  int signal = 10;  // SIGUSR1 on Linux; the CLI parses names.
  int checkpoint_exit_code = kCheckpointedExitCode;
  double kill_grace_seconds = 5;  // SIGTERM -> SIGKILL.
  std::string state_dir;          // Where the notice file lives; "" makes a temporary directory.
  std::string metadata_listen;    // "HOST:PORT" of the metadata endpoint; "" for none.
  int max_restarts = 20;          // Restarts after checkpoints or deadlines before giving up.
  double status_interval_seconds = 10;  // Human progress line period (0: only on changes).
  bool job_stdout_to_stderr = false;    // Keeps stdout for the runner's JSON events.
};

// One thing that happened, for people (`text`) and scripts (`json`, one
// object with "event" and "time" (engine microseconds) keys at least).
struct RunEvent {
  std::string text;
  std::string json;
};

struct RunReport {
  std::string tenant;
  int job_exit_code = -1;  // The last exit code of the job (-1: it never ran).
  int attempts = 0;        // Times the job was started.
  int notices = 0, checkpoints = 0, deadline_stops = 0;
  Money paid = 0;                         // Charges seen on the event stream.
  std::map<std::string, Money> paid_by_node;  // The same, per node name.
  std::vector<std::string> nodes_used;    // Every node the job ran on, in order.
  bool interrupted = false;
};

// Runs the cycle above. Returns the report when the job finished (exit 0),
// failed (report.job_exit_code != 0) or was interrupted; an error status for
// bad options (INVALID_ARGUMENT naming the field), a budget that cannot cover
// one grace window (RESOURCE_EXHAUSTED, "budget: ..."), too many restarts
// (ABORTED) or a lost connection (UNAVAILABLE). `emit` gets every event.
Result<RunReport> RunTenantJob(const RunOptions& o, const std::atomic<bool>* stop,
                               const std::function<void(const RunEvent&)>& emit);

// The launcher command line: `tmpl` with {command} (the words shell-quoted),
// {env} (KEY='value' assignments), {nodes}, {node} and {tenant} (quoted)
// replaced in one pass. Exposed for tests.
std::string ExpandLauncher(const std::string& tmpl, const std::vector<std::string>& command,
                           const std::vector<std::pair<std::string, std::string>>& env, const std::string& nodes,
                           const std::string& node, const std::string& tenant);

// Parses a signal name ("USR1", "SIGUSR1", "TERM", ...) or number.
// INVALID_ARGUMENT naming `field` otherwise.
Result<int> ParseSignal(const std::string& text, std::string_view field);

}  // namespace laissez::server
