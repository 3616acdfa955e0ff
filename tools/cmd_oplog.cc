// `laissez replay`, `laissez explain` and `laissez gen-log`: the operation log's commands
// (docs/OPLOG.md). Outputs depend only on the log, so the same log always gives
// byte-identical files; timings go to stderr.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "oplog/explain.h"
#include "oplog/random_log.h"
#include "oplog/replay.h"
#include "tools/commands.h"

namespace laissez::cli {
namespace {

struct ReplayArgs {
  std::string oplog;
  std::string events_out;
  std::string state_out;
  bool skip_invalid = false;
  bool no_price_events = false;
  bool verbose = false;
  bool json = false;
  bool one_thread = false;
};

std::FILE* OpenOut(const std::string& path) {
  if (path == "-") return stdout;
  return std::fopen(path.c_str(), "wb");
}

int RunReplay(const ReplayArgs& a) {
  auto text = oplog::ReadLogFile(a.oplog);
  if (!text.ok()) {
    std::cerr << "replay: " << text.status().message() << "\n";
    return 1;
  }
  std::FILE* events = OpenOut(a.events_out);
  if (events == nullptr) {
    std::cerr << "replay: --events-out: cannot open " << a.events_out << " (" << std::strerror(errno) << ")\n";
    return 1;
  }
  if (a.json && events == stdout) {
    std::cerr << "replay: --events-out -: stdout is taken by --json\n";
    return 1;
  }
  // The lines are parsed, and the events formatted and written, on threads of their own
  // (issue 12): the engine's thread only applies. --one-thread does all on one.
  oplog::EventFileWriter sink(events, 16384, /*own_thread=*/!a.one_thread);
  oplog::ReplayOptions opts;
  opts.skip_invalid = a.skip_invalid;
  opts.price_events = !a.no_price_events;
  opts.record_rejections = a.verbose;
  opts.parse_ahead = !a.one_thread;
  oplog::Replayer replayer(opts, &sink);

  // The time includes writing the last events (the writer's drain).
  auto start = std::chrono::steady_clock::now();
  Status st = replayer.ReplayText(text->text(), /*padded=*/true);
  if (st.ok()) st = replayer.Finish();
  bool wrote = sink.Finish();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (events != stdout) wrote = (std::fclose(events) == 0) && wrote;

  for (const std::string& d : replayer.diagnostics()) std::cerr << "replay: " << d << "\n";
  const oplog::ReplayStats& s = replayer.stats();
  if (!st.ok()) {
    std::cerr << "replay: " << a.oplog << ": " << st.message() << "\n";
    std::cerr << "replay: stopped after " << s.operations << " operations; events up to that point are in "
              << a.events_out << "\n";
    return 1;
  }
  if (!wrote) {
    std::cerr << "replay: --events-out: write to " << a.events_out << " failed\n";
    return 1;
  }
  if (!a.state_out.empty()) {
    std::string state = oplog::StateJson(replayer.engine(), s);
    std::FILE* f = OpenOut(a.state_out);
    if (f == nullptr || (a.json && f == stdout)) {
      std::cerr << "replay: --state-out: cannot write " << a.state_out << "\n";
      return 1;
    }
    bool ok = std::fwrite(state.data(), 1, state.size(), f) == state.size();
    if (f != stdout) ok = (std::fclose(f) == 0) && ok;
    if (!ok) {
      std::cerr << "replay: --state-out: write to " << a.state_out << " failed\n";
      return 1;
    }
  }
  double rate = seconds > 0 ? static_cast<double>(s.operations) / seconds : 0;
  std::fprintf(stderr,
               "replay: %llu lines, %llu operations (%llu rejected by the engine, %llu invalid skipped, %llu blank or "
               "comment), %llu events, engine time %lld; %.3f s, %.0f operations/s\n",
               static_cast<unsigned long long>(s.lines), static_cast<unsigned long long>(s.operations),
               static_cast<unsigned long long>(s.rejected), static_cast<unsigned long long>(s.invalid),
               static_cast<unsigned long long>(s.blank), static_cast<unsigned long long>(s.events),
               static_cast<long long>(replayer.engine().now()), seconds, rate);
  if (a.json) {
    nlohmann::ordered_json j;
    j["lines"] = s.lines;
    j["operations"] = s.operations;
    j["rejected"] = s.rejected;
    j["invalid_skipped"] = s.invalid;
    j["blank"] = s.blank;
    j["events"] = s.events;
    j["now"] = replayer.engine().now();
    j["seconds"] = seconds;
    j["operations_per_sec"] = rate;
    std::cout << j.dump() << "\n";
  }
  return 0;
}

struct ExplainArgs {
  std::string oplog;
  std::string node, tenant, as, at;
  bool json = false;
};

int RunExplain(const ExplainArgs& a) {
  oplog::ExplainQuery q;
  q.node = a.node;
  q.tenant = a.tenant;
  q.as = a.as;
  if (!a.at.empty()) {
    auto at = oplog::ParseTimeArg(a.at, "--at");
    if (!at.ok()) {
      std::cerr << "explain: " << at.status().message() << "\n";
      return 2;
    }
    q.at = *at;
  }
  auto text = oplog::ReadLogFile(a.oplog);
  if (!text.ok()) {
    std::cerr << "explain: " << text.status().message() << "\n";
    return 1;
  }
  auto out = oplog::Explain(text->text(), /*padded=*/true, q);
  if (!out.ok()) {
    std::cerr << "explain: " << a.oplog << ": " << out.status().message() << "\n";
    return out.status().code() == StatusCode::kInvalidArgument && out.status().message().rfind("line ", 0) != 0 ? 2 : 1;
  }
  std::cout << (a.json ? out->json : out->text);
  return 0;
}

void RandomLogOptionsCli(CLI::App* cmd, oplog::RandomLogOptions* o) {
  cmd->add_option("--seed", o->seed, "Seed: the same seed and options give the same log")->capture_default_str();
  cmd->add_option("--operations", o->operations,
                  "Calls after the setup (nodes and tenants); the log is built in memory, about 100 B a call")
      ->capture_default_str()
      ->check(CLI::Range(size_t{0}, size_t{10000000}));
  cmd->add_option("--nodes", o->nodes, "Nodes added at the start")->capture_default_str()->check(CLI::Range(1, 1000000));
  cmd->add_option("--tenants", o->tenants, "Tenants created at the start")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--operator-permille", o->operator_permille,
                  "Operator calls (floors, maintenance, power caps, carbon, parameters), per mille of all calls")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--bad-permille", o->bad_permille, "Calls the engine must reject, per mille of all calls")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  cmd->add_flag("--adaptive-caps", o->adaptive_caps,
                "Every other power cap and carbon policy adaptive, and live caps changed in place");
}

struct GenLogArgs {
  oplog::RandomLogOptions options;
  std::string out = "-";
};

// Writes the seeded generator's log (src/oplog/random_log.h): the logs the replay tests and
// docs/PERFORMANCE.md's replay figures use, reproducible from the command line.
// The output is opened before the log is generated, so a bad --out fails at once rather
// than after the generation (seconds for a large log).
int RunGenLog(const GenLogArgs& a) {
  std::FILE* f = OpenOut(a.out);
  if (f == nullptr) {
    std::cerr << "gen-log: --out: cannot open " << a.out << " (" << std::strerror(errno) << ")\n";
    return 1;
  }
  std::string text = oplog::RandomLogText(a.options);
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = (f == stdout ? std::fflush(f) == 0 : std::fclose(f) == 0) && ok;
  if (!ok) {
    std::cerr << "gen-log: --out: write to " << a.out << " failed\n";
    return 1;
  }
  return 0;
}

}  // namespace

void RegisterOplogCommands(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ReplayArgs>();
  CLI::App* replay = app.add_subcommand(
      "replay", "Apply an operation log to a fresh engine and write its event stream (docs/OPLOG.md)");
  replay->add_option("oplog", args->oplog, "Operation log (JSON lines)")->required();
  replay->add_option("--events-out", args->events_out, "Write the event stream here as JSON lines ('-': stdout)")
      ->required();
  replay->add_option("--state-out", args->state_out, "Write the final state (nodes, orders, tenants, ledger) as JSON");
  replay->add_flag("--skip-invalid", args->skip_invalid,
                   "Report invalid lines on stderr and go on (default: stop at the first one)");
  replay->add_flag("--no-price-events", args->no_price_events,
                   "Do not emit price_changed events (to compare with an engine run without them)");
  replay->add_flag("--verbose", args->verbose, "List every call the engine rejected on stderr");
  replay->add_flag("--json", args->json, "Print the replay summary as one JSON document on stdout");
  replay->add_flag("--one-thread", args->one_thread,
                   "Parse, apply and write on one thread (default: parsing and the event file on threads of "
                   "their own; the output is the same)");
  replay->callback([args, exit_code] { *exit_code = RunReplay(*args); });

  auto ex = std::make_shared<ExplainArgs>();
  CLI::App* explain = app.add_subcommand(
      "explain", "Tell in plain words a node's history or a tenant's evictions, from an operation log");
  explain->add_option("oplog", ex->oplog, "Operation log (JSON lines)")->required();
  CLI::Option* node = explain->add_option("--node", ex->node, "Node id or name: who held it when, contests, payments");
  CLI::Option* tenant = explain->add_option("--tenant", ex->tenant, "Tenant id or name: its evictions and payments");
  node->excludes(tenant);
  tenant->excludes(node);
  explain->add_option("--at", ex->at,
                      "Account up to this time: engine microseconds or ISO-8601 (2026-11-30T05:00:00Z)");
  explain->add_option("--as", ex->as, "Show only what this tenant (id or name) may see; rivals stay anonymous");
  explain->add_flag("--json", ex->json, "Print the account as one JSON document");
  explain->callback([ex, exit_code] { *exit_code = RunExplain(*ex); });

  auto gen = std::make_shared<GenLogArgs>();
  CLI::App* gen_log = app.add_subcommand(
      "gen-log", "Write a seeded random operation log (bids, limits, operator calls, rejected calls) for replay");
  RandomLogOptionsCli(gen_log, &gen->options);
  gen_log->add_option("--out", gen->out, "Write the log here ('-': stdout)")->capture_default_str();
  gen_log->callback([gen, exit_code] { *exit_code = RunGenLog(*gen); });
}

}  // namespace laissez::cli
